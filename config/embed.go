// Package config holds Machinist's manifests: generated CRDs and
// ClusterRoles, samples, and the kustomizations that deploy it. The
// generated ones are embedded so that `machinist run` installs exactly
// what this build was generated with.
package config

import (
	"bufio"
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Manifests are the CRDs (crd/bases) and ClusterRoles (rbac) as generated,
// the admission policies (admission), and what a cluster needs for
// machines to join it (join).
//
//go:embed crd/bases/*.yaml rbac/role.yaml rbac/verbs.yaml rbac/operator.yaml rbac/viewer.yaml rbac/editor.yaml admission/request.yaml admission/adopt.yaml join/rbac.yaml
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

// JoinRBAC decodes join/rbac.yaml: the ClusterRoles and
// ClusterRoleBindings that let Machinist's machines join a cluster with a
// bootstrap token. The file is what a person applies by hand too, so it,
// not Go code, is where they are written down.
func JoinRBAC() ([]*rbacv1.ClusterRole, []*rbacv1.ClusterRoleBinding, error) {
	const path = "join/rbac.yaml"
	raw, err := Manifests.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var (
		roles    []*rbacv1.ClusterRole
		bindings []*rbacv1.ClusterRoleBinding
	)
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return roles, bindings, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		var kind struct{ Kind string }
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		switch kind.Kind {
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			err = yaml.UnmarshalStrict(doc, r)
			roles = append(roles, r)
		case "ClusterRoleBinding":
			b := &rbacv1.ClusterRoleBinding{}
			err = yaml.UnmarshalStrict(doc, b)
			bindings = append(bindings, b)
		default:
			err = fmt.Errorf("unexpected kind %q", kind.Kind)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
	}
}
