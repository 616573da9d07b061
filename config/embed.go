// Package config holds Machinist's manifests: generated CRDs and
// ClusterRoles, samples, and the kustomizations that deploy it. The
// generated ones are embedded so that `machinist run` installs exactly
// what this build was generated with.
package config

import (
	"embed"
	"fmt"
	"io/fs"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// Manifests are the CRDs (crd/bases) and ClusterRoles (rbac) as generated,
// and the admission policies (admission).
//
//go:embed crd/bases/*.yaml rbac/role.yaml rbac/verbs.yaml rbac/operator.yaml rbac/viewer.yaml rbac/editor.yaml admission/request.yaml admission/adopt.yaml
var Manifests embed.FS

// CRDs decodes the CRDs this binary was generated with.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	err := fs.WalkDir(Manifests, "crd/bases", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := Manifests.ReadFile(path)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(raw, crd); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, crd)
		return nil
	})
	return out, err
}
