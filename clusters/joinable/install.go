// Package joinable is what a cluster needs before Machinist's machines can
// join it as kubelets do, and whether it has it: Install applies the join
// RBAC (config/join), and Check tries each thing a join relies on (the
// bootstrap token authenticator, the Node authorizer, kube-controller-
// manager's certificate approver and signer, NodeRestriction and the token
// cleaner) and says, for each that is missing, which flag brings it.
package joinable

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/internal/bootstrap"
)

// Change is what Install did, or would do, to one object.
type Change struct {
	// Object is the object as kubectl names it
	// ("clusterrolebinding.rbac.authorization.k8s.io/<name>").
	Object string
	// Action is "created", "configured" or "unchanged", as kubectl apply
	// says it.
	Action string
}

func (c Change) String() string { return c.Object + " " + c.Action }

// Install makes kube's cluster hold the join RBAC exactly: what is
// missing is created, what differs is brought back, and what is right is
// left alone, so that it may run again at no cost. With dryRun the
// server checks each write (admission, RBAC escalation) and keeps none.
// A binding whose role differs cannot be changed in place (roleRef is
// immutable), and is reported rather than deleted.
func Install(ctx context.Context, kube kubernetes.Interface, dryRun bool) ([]Change, error) {
	roles, bindings, err := bootstrap.RBAC()
	if err != nil {
		return nil, err
	}
	var dry []string
	if dryRun {
		dry = []string{metav1.DryRunAll}
	}
	var changes []Change
	for _, want := range roles {
		name := "clusterrole.rbac.authorization.k8s.io/" + want.Name
		api := kube.RbacV1().ClusterRoles()
		have, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, want, metav1.CreateOptions{DryRun: dry})
			changes = append(changes, Change{name, "created"})
		case err != nil:
		case equality.Semantic.DeepEqual(have.Rules, want.Rules):
			changes = append(changes, Change{name, "unchanged"})
		default:
			have.Rules = want.Rules
			_, err = api.Update(ctx, have, metav1.UpdateOptions{DryRun: dry})
			changes = append(changes, Change{name, "configured"})
		}
		if err != nil {
			return changes, fmt.Errorf("%s: %w", name, err)
		}
	}
	for _, want := range bindings {
		name := "clusterrolebinding.rbac.authorization.k8s.io/" + want.Name
		api := kube.RbacV1().ClusterRoleBindings()
		have, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, want, metav1.CreateOptions{DryRun: dry})
			changes = append(changes, Change{name, "created"})
		case err != nil:
		case have.RoleRef != want.RoleRef:
			err = fmt.Errorf("it grants %s %s, not %s %s, and a binding's role cannot change: delete it, and run this again",
				have.RoleRef.Kind, have.RoleRef.Name, want.RoleRef.Kind, want.RoleRef.Name)
		case equality.Semantic.DeepEqual(have.Subjects, want.Subjects):
			changes = append(changes, Change{name, "unchanged"})
		default:
			have.Subjects = want.Subjects
			_, err = api.Update(ctx, have, metav1.UpdateOptions{DryRun: dry})
			changes = append(changes, Change{name, "configured"})
		}
		if err != nil {
			return changes, fmt.Errorf("%s: %w", name, err)
		}
	}
	return changes, nil
}
