package clusters

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// The management cluster's kube-apiserver killed for 30 seconds: the
// workload cluster does not notice. Its machines need nothing from the
// management cluster, so their kubelets renew their Leases and keep their
// Nodes Ready, and nothing is cordoned or drained; once the API is back
// the manager resumes with no Machine replaced and no write storm.
func TestTheManagementClusterDown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := env.NewNamespace(t, "mgmt", testenv.Small)
	serve(t, ns)
	md := testenv.MachineDeployment(ns, "steady", 3)
	md.Spec.Template.Spec.ClusterName = blue
	hc := &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "steady"},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": "steady"}},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: 3 * time.Second}},
				{Type: "Ready", Status: "False", Timeout: metav1.Duration{Duration: 3 * time.Second}},
			},
			Remediation: machinistv1.Remediation{Ladder: []machinistv1.Rung{{Action: machinistv1.RemediateReplace}}},
		},
	}
	for _, o := range []client.Object{md, hc} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	ms := running(t, ns, 3, 2*time.Minute, client.MatchingLabels{"pool": "steady"})
	uids := map[types.UID]bool{}
	nodeNames := map[string]bool{}
	for i := range ms {
		uids[ms[i].UID] = true
		nodeNames[joinedOnlyTo(t, &ms[i], blue).Name] = true
	}

	// Watched from the workload cluster throughout: every Node Ready and
	// schedulable, every Lease renewed.
	var (
		mu      sync.Mutex
		trouble []string
		renewed = map[string]time.Time{}
	)
	watching, stopWatching := context.WithCancel(ctx)
	var watched sync.WaitGroup
	watched.Go(func() {
		k := kube(t, blue)
		for watching.Err() == nil {
			nodes, err := k.CoreV1().Nodes().List(watching, metav1.ListOptions{})
			leases, lerr := k.CoordinationV1().Leases(corev1.NamespaceNodeLease).List(watching, metav1.ListOptions{})
			mu.Lock()
			if err == nil && lerr == nil {
				for _, n := range nodes.Items {
					if !nodeNames[n.Name] {
						continue
					}
					ready := false
					for _, c := range n.Status.Conditions {
						if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
							ready = true
						}
					}
					if !ready || n.Spec.Unschedulable {
						trouble = append(trouble, fmt.Sprintf("%s: Node %s ready=%v unschedulable=%v", time.Now().Format(time.RFC3339), n.Name, ready, n.Spec.Unschedulable))
					}
				}
				for _, l := range leases.Items {
					if nodeNames[l.Name] && l.Spec.RenewTime != nil {
						renewed[l.Name] = l.Spec.RenewTime.Time
					}
				}
			}
			mu.Unlock()
			select {
			case <-watching.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	})

	// A Machine written from here on, the outage's return included, has
	// another resourceVersion after.
	// Settled: Running, and judged by their health check, whose first
	// condition write would otherwise be in flight as the outage starts
	// and land after it.
	var settled []machinistv1.Machine
	testenv.WaitFor(t, time.Minute, "the steady Machines Running and judged by their health check", func() error {
		settled = running(t, ns, 3, time.Minute, client.MatchingLabels{"pool": "steady"})
		for _, m := range settled {
			if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionHealthCheckSucceeded); c == nil || c.Status != metav1.ConditionTrue {
				return fmt.Errorf("%s: %s %+v", m.Name, machinistv1.ConditionHealthCheckSucceeded, c)
			}
		}
		return nil
	})
	// And quiet: a write decided before the outage (a judgement, a
	// status the lifecycle still owed) lands after it, and is not the
	// outage's doing.
	before := map[string]machinistv1.Machine{}
	quiet := time.Now()
	testenv.WaitFor(t, time.Minute, "the steady Machines unwritten for 5s", func() error {
		now := running(t, ns, 3, time.Minute, client.MatchingLabels{"pool": "steady"})
		for _, m := range now {
			if b, ok := before[m.Name]; !ok || b.ResourceVersion != m.ResourceVersion {
				quiet = time.Now()
			}
		}
		before = map[string]machinistv1.Machine{}
		for _, m := range now {
			before[m.Name] = m
		}
		if wait := 5*time.Second - time.Since(quiet); wait > 0 {
			return fmt.Errorf("written %s ago", time.Since(quiet).Round(time.Second))
		}
		return nil
	})
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	time.Sleep(30 * time.Second) // the outage's length, not a wait for a state
	startCtx, cancelStart := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelStart()
	if err := env.StartAPIServer(startCtx); err != nil {
		t.Fatal(err)
	}
	t.Logf("the management kube-apiserver was down %s", time.Since(stopped).Round(time.Second))
	back := time.Now()
	time.Sleep(20 * time.Second) // a window of writes counted, not a wait for a state
	stopWatching()
	watched.Wait()

	for _, line := range trouble {
		t.Error(line)
	}
	for name := range nodeNames {
		if at := renewed[name]; !at.After(stopped.Add(20 * time.Second)) {
			t.Errorf("the Lease of Node %s was last seen renewed at %s, the management cluster down from %s to %s", name, at, stopped, back)
		}
	}
	ms = running(t, ns, 3, time.Minute, client.MatchingLabels{"pool": "steady"})
	for _, m := range ms {
		if b := before[m.Name]; m.ResourceVersion != b.ResourceVersion {
			t.Errorf("Machine %s was written across the outage and the 20s after it (resourceVersion %s -> %s): %s",
				m.Name, b.ResourceVersion, m.ResourceVersion, changes(&b, &m))
		}
		if !uids[m.UID] || m.Status.Operation != nil || m.Status.Remediation != nil && m.Status.Remediation.Phase != machinistv1.RemediationHealthy {
			t.Errorf("Machine %s: new %v, operation %+v, remediation %+v", m.Name, !uids[m.UID], m.Status.Operation, m.Status.Remediation)
		}
	}
	// And it acts again: its caches, whose watches failed for the outage,
	// are back, and a scale-up is carried out.
	if err := env.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":4}}`))); err != nil {
		t.Fatal(err)
	}
	running(t, ns, 4, 3*time.Minute, client.MatchingLabels{"pool": "steady"})
	t.Logf("a scale-up carried out %s after the management cluster returned", time.Since(back).Round(time.Second))
	// So does the WorkloadCluster controller, whose watch failed too.
	later := &machinistv1.WorkloadCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "later"},
		Spec:       machinistv1.WorkloadClusterSpec{Kubeconfig: machinistv1.KubeconfigReference{SecretName: "later-kubeconfig"}},
	}
	if err := env.Client.Create(ctx, later); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 3*time.Minute, "a new WorkloadCluster given its status", later, func(wc *machinistv1.WorkloadCluster) error {
		if c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable); c == nil {
			return errors.New("no Reachable condition")
		}
		return nil
	})
	t.Logf("a new WorkloadCluster given its status %s after the management cluster returned", time.Since(back).Round(time.Second))
}

// changes says what differs between two versions of a Machine, field by
// field of its metadata and status, and who wrote them when: what a
// failure needs to name the writer.
func changes(a, b *machinistv1.Machine) string {
	fields := func(m *machinistv1.Machine) map[string]any {
		c := m.DeepCopy()
		c.ResourceVersion, c.ManagedFields = "", nil
		out := map[string]any{}
		for part, v := range map[string]any{"metadata": c.ObjectMeta, "spec": c.Spec, "status": c.Status} {
			raw, _ := json.Marshal(v)
			var f map[string]any
			_ = json.Unmarshal(raw, &f)
			for k, x := range f {
				out[part+"."+k] = x
			}
		}
		return out
	}
	fa, fb := fields(a), fields(b)
	var diffs []string
	for k := range fb {
		if _, ok := fa[k]; !ok {
			fa[k] = nil
		}
	}
	for k, x := range fa {
		if y := fb[k]; !reflect.DeepEqual(x, y) {
			diffs = append(diffs, fmt.Sprintf("%s: %v -> %v", k, x, y))
		}
	}
	sort.Strings(diffs)
	var writers []string
	for _, f := range b.ManagedFields {
		writers = append(writers, fmt.Sprintf("%s %s %s at %s", f.Manager, f.Operation, f.Subresource, f.Time))
	}
	return fmt.Sprintf("changed %s; managed by %s", strings.Join(diffs, "; "), strings.Join(writers, ", "))
}
