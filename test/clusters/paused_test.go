package clusters

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// TestAPausedWorkloadClusterPausesItsMachines: the annotation on a
// WorkloadCluster keeps every controller off its Machines. A machine
// killed meanwhile is not even noticed (its Machine is not written, where
// it would show its Lease expired within the Lease's duration) until the
// cluster is resumed; then it is, at once.
func TestAPausedWorkloadClusterPausesItsMachines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "paused", testenv.Small)
	serve(t, ns)
	m := &runPool(t, ns, "paused", blue, 1)[0]
	wc := &machinistv1.WorkloadCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: blue}}

	annotatePaused(t, wc, "")
	pausedIs(t, wc, metav1.ConditionTrue, machinistv1.ReasonPaused)
	pausedIs(t, m, metav1.ConditionTrue, machinistv1.ReasonClusterPaused)
	if err := ctrls.Provider.Crash(m.Status.ProviderID); err != nil {
		t.Fatal(err)
	}
	held := &machinistv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), held); err != nil {
		t.Fatal(err)
	}
	// Unpaused, the Lease's expiry shows within its duration and 5 s
	// (TestAKilledMachineOfAWorkloadClusterShowsItsLeaseExpired).
	time.Sleep(time.Duration(leases.DurationSeconds)*time.Second + 5*time.Second)
	now := &machinistv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), now); err != nil {
		t.Fatal(err)
	}
	if now.ResourceVersion != held.ResourceVersion {
		t.Fatalf("a Machine of a paused cluster was written: %+v", now.Status.Conditions)
	}

	annotatePaused(t, wc, nil)
	resumed := time.Now()
	testenv.WaitForObject(t, env.Client, 15*time.Second, m.Name+" resumed and showing its Lease expired", m, func(m *machinistv1.Machine) error {
		p := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionPaused)
		h := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy)
		if p == nil || p.Status != metav1.ConditionFalse || p.Reason != machinistv1.ReasonNotPaused {
			return fmt.Errorf("Paused %+v", p)
		}
		if h == nil || h.Reason != machinistv1.ReasonNodeLeaseExpired {
			return fmt.Errorf("NodeHealthy %+v", h)
		}
		return nil
	})
	t.Logf("the killed machine was seen %s after its cluster was resumed", time.Since(resumed).Round(100*time.Millisecond))
	pausedIs(t, wc, metav1.ConditionFalse, machinistv1.ReasonNotPaused)
}

// annotatePaused sets the paused annotation on obj to value, or removes
// it when value is nil.
func annotatePaused(t *testing.T, obj client.Object, value any) {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{machinistv1.PausedAnnotation: value}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Patch(context.Background(), obj, client.RawPatch(types.MergePatchType, raw)); err != nil {
		t.Fatal(err)
	}
}

// pausedIs waits until obj's Paused condition has status and reason.
func pausedIs[O interface {
	client.Object
	*machinistv1.Machine | *machinistv1.WorkloadCluster
}](t *testing.T, obj O, status metav1.ConditionStatus, reason string) {
	t.Helper()
	testenv.WaitForObject(t, env.Client, 15*time.Second, fmt.Sprintf("%s Paused=%s (%s)", obj.GetName(), status, reason), obj, func(o O) error {
		var conds []metav1.Condition
		switch o := any(o).(type) {
		case *machinistv1.Machine:
			conds = o.Status.Conditions
		case *machinistv1.WorkloadCluster:
			conds = o.Status.Conditions
		}
		c := meta.FindStatusCondition(conds, machinistv1.ConditionPaused)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("Paused %+v", c)
		}
		return nil
	})
}
