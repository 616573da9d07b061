package bootstrap

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The ClusterRoles kube-apiserver creates at start for TLS bootstrapping
// (its bootstrap policy); the bindings below grant them as kubeadm does.
const (
	// RoleNodeBootstrapper may create and read CertificateSigningRequests.
	RoleNodeBootstrapper = "system:node-bootstrapper"
	// RoleNodeClient is what kube-controller-manager's approver asks of a
	// CSR's requester before it approves a node's first client certificate.
	RoleNodeClient = "system:certificates.k8s.io:certificatesigningrequests:nodeclient"
	// RoleSelfNodeClient is what it asks of a node that renews its own.
	RoleSelfNodeClient = "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"
)

// NodesGroup is the group every node's client certificate puts it in.
const NodesGroup = "system:nodes"

// ClusterRoleBindings are what a cluster needs for Machinist's machines to
// join it with a bootstrap token: holders of a token (NodeGroup) may ask
// for a node client certificate and have it approved automatically, and
// nodes may have the renewal of their own approved. The Node authorizer
// and NodeRestriction, not these, say what a node may do afterwards.
func ClusterRoleBindings() []*rbacv1.ClusterRoleBinding {
	bind := func(name, role, group string) *rbacv1.ClusterRoleBinding {
		return &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: group}},
		}
	}
	return []*rbacv1.ClusterRoleBinding{
		bind("machinist:node-bootstrapper", RoleNodeBootstrapper, NodeGroup),
		bind("machinist:node-autoapprove-bootstrap", RoleNodeClient, NodeGroup),
		bind("machinist:node-autoapprove-certificate-rotation", RoleSelfNodeClient, NodesGroup),
	}
}

// InstallRBAC creates ClusterRoleBindings in c's cluster. Bindings that
// already exist are left as they are, so it may run at every start.
func InstallRBAC(ctx context.Context, c client.Client) error {
	for _, b := range ClusterRoleBindings() {
		if err := c.Create(ctx, b); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("bootstrap: creating ClusterRoleBinding %s: %w", b.Name, err)
		}
	}
	return nil
}
