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

// RoleNodeRegisterAfresh may delete Nodes. Bound to NodesGroup, it lets a
// re-imaged machine delete the Node its previous life left, so that it
// registers afresh with nothing others put on the old one: kube-apiserver's
// bootstrap policy gives nodes no delete, and NodeRestriction forbids a
// node to remove its own taints or ownerReferences, so no other write of
// its own would do. NodeRestriction confines the delete to the node's own
// Node. What a node gains is no more than a fresh registration gives it:
// its Node without the taints others put there.
const RoleNodeRegisterAfresh = "machinist:node-register-afresh"

// ClusterRoles are the roles ClusterRoleBindings grant that kube-apiserver
// does not make itself.
func ClusterRoles() []*rbacv1.ClusterRole {
	return []*rbacv1.ClusterRole{{
		ObjectMeta: metav1.ObjectMeta{Name: RoleNodeRegisterAfresh},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"delete"}}},
	}}
}

// ClusterRoleBindings are what a cluster needs for Machinist's machines to
// join it with a bootstrap token: holders of a token (NodeGroup) may ask
// for a node client certificate and have it approved automatically, and
// nodes may have the renewal of their own approved and may delete their
// own Node (RoleNodeRegisterAfresh). Beyond that, the Node authorizer and
// NodeRestriction, not these, say what a node may do.
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
		bind(RoleNodeRegisterAfresh, RoleNodeRegisterAfresh, NodesGroup),
	}
}

// InstallRBAC creates ClusterRoles and ClusterRoleBindings in c's
// cluster. Those that already exist are left as they are, so it may run
// at every start.
func InstallRBAC(ctx context.Context, c client.Client) error {
	for _, r := range ClusterRoles() {
		if err := c.Create(ctx, r); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("bootstrap: creating ClusterRole %s: %w", r.Name, err)
		}
	}
	for _, b := range ClusterRoleBindings() {
		if err := c.Create(ctx, b); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("bootstrap: creating ClusterRoleBinding %s: %w", b.Name, err)
		}
	}
	return nil
}
