package bootstrap

import (
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/machinist-dev/machinist/config"
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

// RBAC is what a cluster needs for Machinist's machines to join it with
// a bootstrap token, as config/join/rbac.yaml writes it down: the
// ClusterRoles kube-apiserver does not make itself (RoleNodeRegisterAfresh),
// and the ClusterRoleBindings by which holders of a token (NodeGroup) may
// ask for a node client certificate and have it approved automatically,
// and nodes may have the renewal of their own approved and may delete
// their own Node. Beyond that, the Node authorizer and NodeRestriction,
// not these, say what a node may do.
func RBAC() ([]*rbacv1.ClusterRole, []*rbacv1.ClusterRoleBinding, error) {
	roles, bindings, err := config.JoinRBAC()
	if err != nil {
		return nil, nil, fmt.Errorf("bootstrap: %w", err)
	}
	return roles, bindings, nil
}
