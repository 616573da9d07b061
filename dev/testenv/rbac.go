package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// CreateClusterRoles creates the ClusterRoles of config/rbac's files, as
// config/default installs them, for tests that act as the people and the
// manager those roles are for.
func (e *Env) CreateClusterRoles(ctx context.Context, files ...string) error {
	for _, file := range files {
		path := filepath.Join(e.Root, "config", "rbac", file)
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		role := &rbacv1.ClusterRole{}
		if err := utilyaml.Unmarshal(raw, role); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := e.Client.Create(ctx, role); err != nil {
			return err
		}
	}
	return nil
}
