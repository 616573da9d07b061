package security_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// spareInstance is an instance that belongs to no Machine, as one made
// outside Machinist would be.
func spareInstance(context.Context) (string, error) {
	return ctrls.Provider.MakeUnowned("spare", "spare-"+rand.String(5))
}

// awaitAdoptPolicy waits until kube-apiserver enforces machinist-adopt:
// a tenant's dry run of a Machine with spec.providerID is refused by it.
func awaitAdoptPolicy(ctx context.Context) error {
	ns, err := env.Namespace(ctx, "adopt-probe")
	if err != nil {
		return err
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "editors"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "machinist-editor"},
		Subjects:   []rbacv1.Subject{user(tenant)},
	}
	if err := env.Client.Create(ctx, binding); err != nil {
		return err
	}
	probe := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class}, ProviderID: "inmemory:///probe/probe/probe"},
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := as(tenant).Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "verb adopt") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the admission policy machinist-adopt is not in effect after a minute: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
