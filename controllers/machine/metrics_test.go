package machine

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/metricstest"
)

// listed serves a fixed list of Machines: the collector's only read.
type listed []machinistv1.Machine

func (l listed) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return nil
}

func (l listed) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	list.(*machinistv1.MachineList).Items = l
	return nil
}

// TestOverdueCountsMachinesPastTheirPhaseTimeout: the gauge the stuck-phase
// alert reads counts a Machine only once its phase's own timeout has
// passed, by the timeouts the controller enforces.
func TestOverdueCountsMachinesPastTheirPhaseTimeout(t *testing.T) {
	now := time.Now()
	in := func(name string, p machinistv1.MachinePhase, since time.Duration) machinistv1.Machine {
		m := machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))}}
		m.Status.Phase = p
		m.Status.LastTransition = &machinistv1.Transition{To: p, Time: metav1.NewTime(now.Add(-since))}
		return m
	}
	gone := in("deleted", machinistv1.MachineRebooting, time.Hour)
	gone.DeletionTimestamp = &metav1.Time{Time: now}
	gone.Finalizers = []string{machinistv1.MachineFinalizer}
	r := &Reconciler{ProvisionTimeout: 10 * time.Minute, OperationTimeout: 5 * time.Minute}
	m := NewMetrics(listed{
		in("slow", machinistv1.MachineProvisioning, 11*time.Minute),
		in("young", machinistv1.MachineProvisioning, 9*time.Minute),
		in("stuck", machinistv1.MachineRebooting, 6*time.Minute),
		in("rebooting", machinistv1.MachineRebooting, 4*time.Minute),
		in("long-running", machinistv1.MachineRunning, 48*time.Hour),
		gone,
	})
	m.byPhase.deadline = r.deadline
	got := metricstest.Gauges(t, m.Register, "phase")["machinist_machines_overdue"]
	want := map[string]float64{"Provisioning": 1, "Rebooting": 1, "Running": 0, "Pending": 0, "Draining": 0}
	for p, n := range want {
		if got[p] != n {
			t.Errorf("machinist_machines_overdue{phase=%q} = %v, want %v (all: %v)", p, got[p], n, got)
		}
	}
}
