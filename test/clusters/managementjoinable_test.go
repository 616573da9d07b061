package clusters

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/clusters/joinable"
	"github.com/machinist-dev/machinist/clusters/joinprobe"
	"github.com/machinist-dev/machinist/config"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// The manager's own cluster has its Joinable condition, on the
// ManagementCluster the manager makes: True as prepared; False, naming
// the bindings, once they are gone, its waiting Machines saying so with
// one write; True again after machinist cluster prepare, and the Machine
// joins. The ManagementCluster comes back if deleted, and no other name
// is admitted.
//
// Not parallel: it takes the join bindings from the cluster every other
// test's own Machines join, and Go runs the parallel tests only after
// the others have ended. It puts them back whatever happens.
func TestTheManagementClusterSaysWhetherMachinesCanJoinIt(t *testing.T) {
	ctx := context.Background()
	mc := &machinistv1.ManagementCluster{ObjectMeta: metav1.ObjectMeta{Name: machinistv1.ManagementClusterName}}
	joinableIs(t, mc, metav1.ConditionTrue, joinprobe.ReasonJoinable, 2*joinablePeriod+joinable.DefaultWait)

	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := joinable.Install(ctx, kube, false); err != nil {
			t.Errorf("putting the join bindings back: %v", err)
		}
	})
	_, bindings, err := config.JoinRBAC()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bindings {
		if err := kube.RbacV1().ClusterRoleBindings().Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	removed := time.Now()
	joinableIs(t, mc, metav1.ConditionFalse, joinable.ReasonBindingsMissing, 2*joinablePeriod+joinable.DefaultWait)
	t.Logf("Joinable=False %s after the join bindings were deleted", time.Since(removed).Round(100*time.Millisecond))
	if c := meta.FindStatusCondition(mc.Status.Conditions, machinistv1.ManagementClusterJoinable); !strings.Contains(c.Message, "machinist cluster prepare") {
		t.Errorf("the message does not say how to fix it: %s", c.Message)
	}

	ns := env.NewNamespace(t, "ownjoin", testenv.Small)
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "own"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, time.Minute, "the Machine waits, saying why", m, func(m *machinistv1.Machine) error {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
		if c == nil || c.Reason != joinable.ReasonBindingsMissing || !strings.HasPrefix(c.Message, "the management cluster is not joinable: ") {
			return fmt.Errorf("phase %s, Ready %+v", m.Status.Phase, c)
		}
		return nil
	})
	// Checks and looks go on; the Machine and the ManagementCluster,
	// saying the same, are not written again.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mc), mc); err != nil {
		t.Fatal(err)
	}
	seen, seenCluster := m.ResourceVersion, mc.ResourceVersion
	time.Sleep(2*joinablePeriod + 5*time.Second)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
		t.Fatal(err)
	}
	if m.ResourceVersion != seen {
		t.Errorf("the waiting Machine was written again with nothing new: Ready %+v", meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady))
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mc), mc); err != nil {
		t.Fatal(err)
	}
	if mc.ResourceVersion != seenCluster {
		t.Errorf("the ManagementCluster was written again with nothing new: %+v", mc.Status.Conditions)
	}

	if out, code := prepare(t, env); code != 0 {
		t.Fatalf("machinist cluster prepare on the management cluster: exit code %d\n%s", code, out)
	}
	prepared := time.Now()
	joinableIs(t, mc, metav1.ConditionTrue, joinprobe.ReasonJoinable, 2*joinablePeriod+joinable.DefaultWait)
	t.Logf("Joinable %s after machinist cluster prepare", time.Since(prepared).Round(100*time.Millisecond))
	running(t, ns, 1, 2*time.Minute)

	// Deleted, it is made again, saying what the last check found.
	if err := env.Client.Delete(ctx, mc); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the ManagementCluster made again, Joinable", func() error {
		again := &machinistv1.ManagementCluster{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mc), again); err != nil {
			return err
		}
		if again.UID == mc.UID {
			return fmt.Errorf("still the deleted one")
		}
		if c := meta.FindStatusCondition(again.Status.Conditions, machinistv1.ManagementClusterJoinable); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("Joinable %+v", c)
		}
		return nil
	})

	other := &machinistv1.ManagementCluster{ObjectMeta: metav1.ObjectMeta{Name: "other"}}
	if err := env.Client.Create(ctx, other); err == nil || !strings.Contains(err.Error(), "there is one ManagementCluster, named cluster") {
		_ = env.Client.Delete(ctx, other)
		t.Errorf("a ManagementCluster named other: %v, want refused as the only one", err)
	}
}
