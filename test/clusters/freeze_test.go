package clusters

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// A workload kube-apiserver frozen with SIGSTOP: connections to it hang
// rather than fail. The manager's requests time out instead of holding
// its workers, the cluster is found unreachable as one that is down is,
// and a reboot without drain is carried out on the provider's word. Meanwhile
// a rollout in another cluster goes on; its time is logged beside that of
// the same rollout with nothing frozen.
func TestAFrozenClusterHoldsNoWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "frozen", testenv.Small)
	serve(t, ns)
	w, wc := ownCluster(t, ns, "stiff")
	stiff := testenv.MachineDeployment(ns, "stiff", 2)
	stiff.Spec.Template.Spec.ClusterName = wc.Name
	pool := testenv.MachineDeployment(ns, "rolling", 3)
	pool.Spec.Template.Spec.ClusterName = blue
	for _, o := range []client.Object{stiff, pool} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	frozen := running(t, ns, 2, 2*time.Minute, client.MatchingLabels{"pool": "stiff"})
	running(t, ns, 3, 2*time.Minute, client.MatchingLabels{"pool": "rolling"})
	uids := map[types.UID]bool{}
	for i := range frozen {
		uids[frozen[i].UID] = true
	}
	roll := func(version string) time.Duration {
		t.Helper()
		start := time.Now()
		patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"version":%q}}}}`, version)
		if err := env.Client.Patch(ctx, pool, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 3*time.Minute, "the pool in cluster blue rolled to "+version, func() error {
			ms, err := testenv.ListMachines(ctx, env.Client, ns, client.MatchingLabels{"pool": "rolling"})
			if err != nil {
				return err
			}
			rolled := 0
			for i := range ms {
				if ms[i].Spec.Version == version && ms[i].Status.Phase == machinistv1.MachineRunning && ms[i].DeletionTimestamp.IsZero() {
					if node := nodeOf(t, blue, ms[i].Status.ProviderID); node == nil || node.Status.NodeInfo.KubeletVersion != version {
						return fmt.Errorf("Machine %s Running at %s, its Node %v", ms[i].Name, version, node)
					}
					rolled++
				}
			}
			if len(ms) != 3 || rolled != 3 {
				return fmt.Errorf("%d Machines, %d rolled and Running", len(ms), rolled)
			}
			return nil
		})
		return time.Since(start)
	}
	quiet := roll("v1.37.3")

	if err := w.FreezeAPIServer(); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	during := roll("v1.37.4")
	t.Logf("a rolling update of 3 Machines in cluster blue: %s with nothing frozen, %s with cluster stiff frozen", quiet.Round(100*time.Millisecond), during.Round(100*time.Millisecond))

	// A frozen cluster is found unreachable as a dead one is: its probes
	// time out.
	testenv.WaitForObject(t, env.Client, 2*time.Minute, "the frozen WorkloadCluster Unreachable", wc, func(wc *machinistv1.WorkloadCluster) error {
		c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != machinistv1.ReasonUnreachable {
			return fmt.Errorf("Reachable %+v", c)
		}
		return nil
	})
	t.Logf("cluster stiff found unreachable %s after it was frozen", time.Since(frozenAt).Round(time.Second))
	m := &frozen[0]
	testenv.WaitForObject(t, env.Client, time.Minute, m.Name+"'s Node side unknown", m, func(m *machinistv1.Machine) error {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy)
		if c == nil || c.Status != metav1.ConditionUnknown || c.Reason != machinistv1.ReasonClusterUnreachable {
			return fmt.Errorf("%s %+v", machinistv1.ConditionNodeHealthy, c)
		}
		return nil
	})
	var code int
	err := kube(t, "").CoreV1().RESTClient().Put().
		AbsPath("/apis/subresources.machinist.dev/v1alpha1/namespaces", ns, "machines", m.Name, "reboot").
		Body([]byte(`{"drain":false}`)).Do(ctx).StatusCode(&code).Error()
	if code != http.StatusAccepted {
		t.Fatalf("reboot without drain of a Machine of a frozen cluster: %d %v", code, err)
	}
	testenv.WaitForObject(t, env.Client, time.Minute, m.Name+" rebooted on its provider's word", m, func(m *machinistv1.Machine) error {
		op := m.Status.Operation
		if op == nil || op.State != machinistv1.OperationSucceeded || !strings.Contains(op.Message, "on the provider's word") {
			return fmt.Errorf("phase %s, operation %+v", m.Status.Phase, op)
		}
		return nil
	})

	if err := w.ThawAPIServer(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 2*time.Minute, m.Name+"'s boot confirmed once its cluster is back", m, func(m *machinistv1.Machine) error {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionBootConfirmed)
		h := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy)
		if c == nil || c.Status != metav1.ConditionTrue || h == nil || h.Status != metav1.ConditionTrue {
			return fmt.Errorf("%s %+v, %s %+v", machinistv1.ConditionBootConfirmed, c, machinistv1.ConditionNodeHealthy, h)
		}
		return nil
	})
	for _, m := range running(t, ns, 2, time.Minute, client.MatchingLabels{"pool": "stiff"}) {
		if !uids[m.UID] {
			t.Errorf("Machine %s of the frozen cluster is new: one was replaced", m.Name)
		}
	}
}
