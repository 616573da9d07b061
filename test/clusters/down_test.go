package clusters

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/nodes"
)

// A workload cluster whose kube-apiserver is killed for a minute (or
// CLUSTERS_OUTAGE: `make outage` runs ten): its
// Machines stay readable and say that their Node side is not seen, at one
// write each; a health check judges none of them and says why; a reboot or
// repair that asks for a drain is refused with 409, one without is carried
// out by the provider, even by a manager started during the outage; a
// deletion and a creation wait for the cluster.
// Once it is back, the rebooted Node shows a new boot ID, the health check
// judges again, and nothing was replaced or remediated.
func TestAClusterDown(t *testing.T) {
	down := outage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := env.NewNamespace(t, "down", testenv.Small)
	w, wc := ownCluster(t, ns, "fading")
	wkube, err := kubernetes.NewForConfig(w.Config)
	if err != nil {
		t.Fatal(err)
	}
	machine := func(name string) *machinistv1.Machine {
		return &machinistv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"pool": "far"}},
			Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}, ClusterName: wc.Name},
		}
	}
	// far is rebooted and mend repaired while the cluster is down, gone
	// deleted; late is made then.
	far, mend, gone := machine("far"), machine("mend"), machine("gone")
	hc := &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "far"},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": "far"}},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: 3 * time.Second}},
			},
			Remediation: machinistv1.Remediation{Ladder: []machinistv1.Rung{{Action: machinistv1.RemediateReplace}}},
		},
	}
	for _, o := range []client.Object{far, mend, gone, hc} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	judged := func(status metav1.ConditionStatus, reason string) func(*machinistv1.Machine) error {
		return func(m *machinistv1.Machine) error {
			c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionHealthCheckSucceeded)
			if m.Status.Phase != machinistv1.MachineRunning || c == nil || c.Status != status || c.Reason != reason {
				return fmt.Errorf("phase %s, %s %+v", m.Status.Phase, machinistv1.ConditionHealthCheckSucceeded, c)
			}
			return nil
		}
	}
	for _, m := range []*machinistv1.Machine{far, mend, gone} {
		testenv.WaitForObject(t, env.Client, 2*time.Minute, m.Name+" Running and judged healthy", m,
			judged(metav1.ConditionTrue, machinistv1.ReasonPassed))
	}
	uids := map[string]types.UID{far.Name: far.UID, mend.Name: mend.UID}
	farBoot, mendBoot := far.Status.BootID, mend.Status.BootID
	machines, err := env.WatchMachines(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}

	if err := w.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	testenv.WaitForObject(t, env.Client, time.Minute, "the WorkloadCluster Unreachable", wc, func(wc *machinistv1.WorkloadCluster) error {
		c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != machinistv1.ReasonUnreachable {
			return fmt.Errorf("Reachable %+v", c)
		}
		return nil
	})
	// Called unreachable only after failing for --cluster-unreachable-after
	// (5s here), and since its first failure, which came after the stop
	// (the condition's time is kept to the second).
	since := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable).LastTransitionTime.Time
	if seen := time.Now(); since.Before(stopped.Truncate(time.Second)) || seen.Sub(since) < 5*time.Second {
		t.Errorf("stopped at %s, the cluster unreachable since %s, seen so at %s: want since after the stop, and seen at least 5s later",
			stopped.Format(time.RFC3339Nano), since.Format(time.RFC3339), seen.Format(time.RFC3339Nano))
	}
	// Found down by the prober (every 5s here), the Machines say that
	// their Node side is not seen, and the health check judges none.
	unseen := "WorkloadCluster fading is not reachable (Unreachable) since "
	for _, m := range []*machinistv1.Machine{far, mend, gone} {
		testenv.WaitForObject(t, env.Client, time.Minute, m.Name+" unjudged, its Node side unknown", m, func(m *machinistv1.Machine) error {
			if err := judged(metav1.ConditionUnknown, machinistv1.ReasonClusterUnreachable)(m); err != nil {
				return err
			}
			for _, ct := range []string{machinistv1.ConditionNodeHealthy, machinistv1.ConditionReady} {
				c := meta.FindStatusCondition(m.Status.Conditions, ct)
				if c == nil || c.Status != metav1.ConditionUnknown || c.Reason != machinistv1.ReasonClusterUnreachable || !strings.Contains(c.Message, unseen) {
					return fmt.Errorf("%s %+v", ct, c)
				}
			}
			return nil
		})
	}
	c := meta.FindStatusCondition(far.Status.Conditions, machinistv1.ConditionHealthCheckSucceeded)
	if !strings.Contains(c.Message, unseen) {
		t.Errorf("the condition's message: %q", c.Message)
	}
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the health check saying why", hc, func(hc *machinistv1.MachineHealthCheck) error {
		c := meta.FindStatusCondition(hc.Status.Conditions, machinistv1.ConditionClustersReachable)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != machinistv1.ReasonClusterUnreachable ||
			!strings.Contains(c.Message, "WorkloadCluster fading (Unreachable): 3") {
			return fmt.Errorf("%s %+v", machinistv1.ConditionClustersReachable, c)
		}
		return nil
	})

	// While the cluster stays down, probed every 5s, nothing is written
	// to its Machines: not one write per Machine per probe.
	drain(machines)
	window := 12 * time.Second
	time.Sleep(window) // a window of writes counted, not a wait for a state
	if writes := drain(machines); len(writes) > 0 {
		for _, e := range writes {
			m := e.Object.(*machinistv1.Machine)
			t.Logf("%s %s: phase %s, conditions %+v", e.Type, m.Name, m.Status.Phase, m.Status.Conditions)
		}
		t.Errorf("the Machines of a cluster that stays down were written %d times in %s", len(writes), window)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(far), far); err != nil {
		t.Fatal(err)
	}
	if far.UID != uids[far.Name] || !far.DeletionTimestamp.IsZero() || far.Status.Remediation != nil || far.Status.Operation != nil {
		t.Fatalf("a Machine of a cluster that is down was remediated: deleting %v, remediation %+v, operation %+v",
			!far.DeletionTimestamp.IsZero(), far.Status.Remediation, far.Status.Operation)
	}

	// A verb that asks for a drain is refused, naming the way without.
	verb := func(m *machinistv1.Machine, name, body string) (int, error) {
		var code int
		err := kube(t, "").CoreV1().RESTClient().Put().
			AbsPath("/apis/subresources.machinist.dev/v1alpha1/namespaces", ns, "machines", m.Name, name).
			Body([]byte(body)).Do(ctx).StatusCode(&code).Error()
		return code, err
	}
	for _, v := range []string{"reboot", "repair"} {
		code, err := verb(far, v, `{}`)
		if code != http.StatusConflict || err == nil || !strings.Contains(err.Error(), unseen) ||
			!strings.Contains(err.Error(), "kubectl machine "+v+" far --no-drain") {
			t.Errorf("%s with a drain of a Machine whose cluster is down: %d %v; want 409 naming --no-drain", v, code, err)
		}
	}
	// Without one, both are carried out by the provider.
	if code, err := verb(far, "reboot", `{"mode":"hard","drain":false}`); code != http.StatusAccepted {
		t.Fatalf("reboot without drain: %d %v", code, err)
	}
	// The reboot completes on the provider's word, which the record says,
	// with the Node's side still unknown.
	testenv.WaitForObject(t, env.Client, 30*time.Second, "far rebooted on its provider's word", far, func(m *machinistv1.Machine) error {
		op := m.Status.Operation
		if m.Status.Phase != machinistv1.MachineRunning || op == nil || op.State != machinistv1.OperationSucceeded {
			return fmt.Errorf("phase %s, operation %+v", m.Status.Phase, op)
		}
		if !strings.Contains(op.Message, "on the provider's word") || !strings.Contains(op.Message, "the Node was not seen: "+unseen) ||
			op.ProviderBootID == "" || op.ProviderBootID == farBoot || m.Status.BootID != op.ProviderBootID {
			return fmt.Errorf("operation %+v, boot ID %s (before %s)", op, m.Status.BootID, farBoot)
		}
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionBootConfirmed)
		if c == nil || c.Status != metav1.ConditionUnknown || c.Reason != machinistv1.ReasonNodeNotSeen {
			return fmt.Errorf("%s %+v", machinistv1.ConditionBootConfirmed, c)
		}
		if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy); c == nil || c.Status != metav1.ConditionUnknown {
			return fmt.Errorf("%s %+v", machinistv1.ConditionNodeHealthy, c)
		}
		return nil
	})
	farProviderBoot := far.Status.Operation.ProviderBootID
	// A manager that starts while the cluster is down has never reached
	// it; it still repairs, giving the machine the address the cluster's
	// kubeconfig names and a token kept until the cluster is back.
	if err := ctrls.RestartManager(); err != nil {
		t.Fatal(err)
	}
	if code, err := verb(mend, "repair", `{"drain":false,"reason":"its cluster is down"}`); code != http.StatusAccepted {
		t.Fatalf("repair without drain: %d %v", code, err)
	}
	testenv.WaitForObject(t, env.Client, 30*time.Second, "mend repaired on its provider's word", mend, func(m *machinistv1.Machine) error {
		op := m.Status.Operation
		if m.Status.Phase != machinistv1.MachineRunning || op == nil || op.Type != machinistv1.OperationRepair ||
			op.State != machinistv1.OperationSucceeded || !strings.Contains(op.Message, "on the provider's word") ||
			op.ProviderBootID == "" || op.ProviderBootID == mendBoot {
			return fmt.Errorf("phase %s, operation %+v, Ready %+v", m.Status.Phase, op,
				meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady))
		}
		return nil
	})
	// The restarted manager says what its predecessor said, since when
	// included: it took the cluster's state from the WorkloadCluster,
	// not from its own failure to connect, and so rewrote no Machine.
	for _, m := range []*machinistv1.Machine{far, mend, gone} {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			t.Fatal(err)
		}
		for _, ct := range []string{machinistv1.ConditionNodeHealthy, machinistv1.ConditionHealthCheckSucceeded} {
			if c := meta.FindStatusCondition(m.Status.Conditions, ct); c == nil || !strings.Contains(c.Message, unseen) {
				t.Errorf("%s after the restart: %s %+v; want its message to begin %q", m.Name, ct, c, unseen)
			}
		}
	}
	// A deletion waits in its drain, a new Machine for the cluster.
	if err := env.Client.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	late := machine("late")
	late.Labels = nil
	if err := env.Client.Create(ctx, late); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the deleted Machine waiting to drain", gone, func(m *machinistv1.Machine) error {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionDrained)
		if m.Status.Phase != machinistv1.MachineDraining || c == nil || c.Reason != machinistv1.ReasonClusterUnreachable || !strings.Contains(c.Message, unseen) {
			return fmt.Errorf("phase %s, Drained %+v", m.Status.Phase, c)
		}
		return nil
	})
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the new Machine waiting to be made", late, func(m *machinistv1.Machine) error {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
		if m.Status.Phase != machinistv1.MachinePending || m.Status.ProviderID != "" || c == nil || c.Reason != machinistv1.ReasonClusterUnreachable {
			return fmt.Errorf("phase %s, providerID %q, Ready %+v", m.Status.Phase, m.Status.ProviderID, c)
		}
		return nil
	})

	// The rest of the outage, however long, writes nothing to the
	// Machines: the restarted manager found them as its predecessor left
	// them, and a cluster that stays down is looked at, not written.
	drain(machines)
	rest := max(time.Until(stopped.Add(down)), 0)
	time.Sleep(rest) // the outage's length, not a wait for a state
	if writes := drain(machines); len(writes) > 0 {
		for _, e := range writes {
			m := e.Object.(*machinistv1.Machine)
			t.Logf("%s %s: phase %s, conditions %+v", e.Type, m.Name, m.Status.Phase, m.Status.Conditions)
		}
		t.Errorf("the Machines were written %d times in the last %s of the outage", len(writes), rest.Round(time.Second))
	}
	t.Logf("the workload kube-apiserver was down for %s; nothing written to its Machines in the last %s", time.Since(stopped).Round(time.Second), rest.Round(time.Second))
	if err := w.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	// The manager restarted during the outage has never reached the
	// cluster, yet looks for it every probe period (5s here), because
	// the cluster answered a manager before: on the backoff of a cluster
	// never reached, it would be 2, 4, 8, 16, 32s between its attempts,
	// and so 15 to 30s late at this point of the outage.
	back := time.Now()
	testenv.WaitForObject(t, env.Client, 20*time.Second, "the WorkloadCluster Reachable again within a probe period or so", wc,
		func(wc *machinistv1.WorkloadCluster) error {
			if c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable); c == nil || c.Status != metav1.ConditionTrue {
				return fmt.Errorf("Reachable %+v", c)
			}
			return nil
		})
	t.Logf("the restarted manager found the cluster back %s after its kube-apiserver answered", time.Since(back).Round(time.Second))
	nodeOf := func(m *machinistv1.Machine) *corev1.Node {
		list, err := wkube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil
		}
		for i := range list.Items {
			if list.Items[i].Spec.ProviderID == m.Status.ProviderID {
				return &list.Items[i]
			}
		}
		return nil
	}
	for _, m := range []*machinistv1.Machine{far, mend} {
		before := map[string]string{far.Name: farBoot, mend.Name: mendBoot}[m.Name]
		testenv.WaitForObject(t, env.Client, 2*time.Minute, m.Name+" judged again once its cluster is back, on a new boot", m, func(m *machinistv1.Machine) error {
			if err := judged(metav1.ConditionTrue, machinistv1.ReasonPassed)(m); err != nil {
				return err
			}
			if op := m.Status.Operation; op == nil || op.State != machinistv1.OperationSucceeded {
				return fmt.Errorf("operation %+v", op)
			}
			if node := nodeOf(m); node == nil || node.Status.NodeInfo.BootID == before || node.Status.NodeInfo.BootID != m.Status.BootID {
				return fmt.Errorf("boot ID before %s, recorded %s, its Node %+v", before, m.Status.BootID, node)
			}
			return nil
		})
		if m.UID != uids[m.Name] || m.Status.Remediation != nil {
			t.Errorf("%s was replaced or remediated: uid %s -> %s, remediation %+v", m.Name, uids[m.Name], m.UID, m.Status.Remediation)
		}
	}
	// mend joined with the token kept for it, which was the cluster's,
	// and is kept no longer.
	kept := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "machinist-join-" + string(mend.UID)}}
	testenv.WaitFor(t, 30*time.Second, "the kept token published and forgotten", func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(kept), kept); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the kept token's Secret is still there (%v)", err)
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mend), mend); err != nil || mend.Status.KeptToken != nil {
			return fmt.Errorf("mend still records a kept token: %+v (%v)", mend.Status.KeptToken, err)
		}
		return nil
	})
	csrs, err := wkube.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var askers []string
	for _, csr := range csrs.Items {
		askers = append(askers, csr.Spec.Username)
	}
	if want := "system:bootstrap:" + nodes.PublishedTokenID(mend.UID); !slices.Contains(askers, want) {
		t.Errorf("no certificate was asked for with the kept token (%s); asked by %v", want, askers)
	}
	// The Node of far came back on the boot its provider reported.
	testenv.WaitForObject(t, env.Client, 30*time.Second, "far's boot confirmed by its Node", far, func(m *machinistv1.Machine) error {
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionBootConfirmed)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != machinistv1.ReasonBootIDMatches || m.Status.BootID != farProviderBoot {
			return fmt.Errorf("%s %+v, boot ID %s, the provider's %s", machinistv1.ConditionBootConfirmed, c, m.Status.BootID, farProviderBoot)
		}
		return nil
	})
	testenv.WaitFor(t, time.Minute, "the deleted Machine gone, with its Node", func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(gone), gone); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v): phase %s", err, gone.Status.Phase)
		}
		if nodeOf(gone) != nil {
			return errors.New("its Node is still there")
		}
		return nil
	})
	testenv.WaitForObject(t, env.Client, 2*time.Minute, "the new Machine Running once its cluster is back", late, func(m *machinistv1.Machine) error {
		if m.Status.Phase != machinistv1.MachineRunning {
			return fmt.Errorf("phase %s", m.Status.Phase)
		}
		return nil
	})
	testenv.WaitForObject(t, env.Client, 30*time.Second, "the health check saying the cluster is back", hc, func(hc *machinistv1.MachineHealthCheck) error {
		c := meta.FindStatusCondition(hc.Status.Conditions, machinistv1.ConditionClustersReachable)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != machinistv1.ReasonReachable {
			return fmt.Errorf("%s %+v", machinistv1.ConditionClustersReachable, c)
		}
		return nil
	})
	// One Event each way for the outage.
	testenv.WaitFor(t, 10*time.Second, "one Event each way", func() error {
		var events corev1.EventList
		if err := env.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return err
		}
		got := map[string]int{}
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == "MachineHealthCheck" && e.InvolvedObject.Name == hc.Name {
				got[e.Reason] += max(int(e.Count), 1)
			}
		}
		if got[machinistv1.ReasonClusterUnreachable] != 1 || got["ClusterReachable"] != 1 {
			return fmt.Errorf("the health check's Events by reason: %v", got)
		}
		return nil
	})
}

// outage is how long TestAClusterDown keeps its cluster down: a minute,
// or CLUSTERS_OUTAGE. A minute is many times every timeout the test's
// manager and health check judge by; a longer outage proves what counts
// in minutes whatever the flags (the operation timeout, a token's life,
// client-go's backoff).
func outage(t *testing.T) time.Duration {
	v := os.Getenv("CLUSTERS_OUTAGE")
	if v == "" {
		return time.Minute
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Minute {
		t.Fatalf("CLUSTERS_OUTAGE=%q: want a duration of a minute or more, such as 10m", v)
	}
	return d
}
