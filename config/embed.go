// Package config holds Machinist's manifests: generated CRDs and
// ClusterRoles, samples, and the kustomizations that deploy it. The
// generated ones are embedded so that `machinist run` installs exactly
// what this build was generated with.
package config

import "embed"

// Manifests are the CRDs (crd/bases) and ClusterRoles (rbac) as generated,
// and the admission policies (admission).
//
//go:embed crd/bases/*.yaml rbac/role.yaml rbac/verbs.yaml rbac/operator.yaml rbac/viewer.yaml admission/request.yaml
var Manifests embed.FS
