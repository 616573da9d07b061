package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machinehealthcheck"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
	nodeside "github.com/machinist-dev/machinist/nodes"
)

// A crashed agent's Node goes Ready=Unknown once the node lifecycle
// controller has not seen its Lease renewed for remediateGrace; the Lease
// lasts as long, as a kubelet's does. Renewing every 5s keeps four renewals
// in a grace period, as the kubelet's defaults (10s, 40s) do, at 200 Lease
// writes a second for 1000 Machines: a crash shows in under half a minute
// without the renewals crowding out the engine's writes.
const (
	remediateGrace = 20 * time.Second
	remediateRenew = 5 * time.Second
)

// BenchmarkRemediate crashes 100 of 1000 Running Machines at once under a
// MachineHealthCheck (a Node Ready=Unknown or False for 5s is unhealthy;
// ladder Reboot with a 2m timeout, then Replace; maxInFlight 20%,
// maxUnhealthy 40%) and times until every Machine is Running and passing
// again, the crashed ones Recovered. kube-controller-manager's node
// lifecycle controller marks the silent Nodes Ready=Unknown; the health
// check reboots them hard, without a drain. It counts the writes per
// remediation from after the health check's first pass over the 1000
// Machines was written, and the most remediations in flight a watch saw.
func BenchmarkRemediate(b *testing.B) {
	for range b.N {
		remediate(b, 1000, 100)
	}
}

func remediate(b *testing.B, n, crash int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube, ctrls, ns := setUpRemediation(ctx, b, "remediate")
	defer func() { _ = ctrls.Stop() }()

	machines, err := trackMachines(ctx, ns)
	if err != nil {
		b.Fatal(err)
	}
	checks, err := trackInFlight(ctx, ns)
	if err != nil {
		b.Fatal(err)
	}
	createSet(ctx, b, ns, n)
	wait(b, machines.until(func(t *tracker) bool { return t.allPassing(n, false) }), timeout(n), "every Machine Running")
	createHealthCheck(ctx, b, ns)
	wait(b, machines.until(func(t *tracker) bool { return t.allPassing(n, true) }), timeout(n), "every Machine passing its health check")
	settled := settle(ctx, b, kube)

	crashed := machines.pick(crash)
	started := machines.until(func(t *tracker) bool { return t.allStarted() })
	recovered := machines.until(func(t *tracker) bool { return t.recovered(n) })
	nodes, err := trackNodes(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// Let any trailing status write land before counting.
	// A quiet spell: nothing shows when the trailing writes are over.
	time.Sleep(3 * time.Second)
	before, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		b.Fatal(err)
	}
	rungs0, recovery0 := remediationMetrics(b, ctrls.Manager.Remediations)

	b.ResetTimer()
	start := time.Now()
	machines.setStart(start)
	nodes.setStart(start)
	for _, id := range crashed {
		if err := ctrls.Provider.Crash(id); err != nil {
			b.Fatal(err)
		}
	}
	wait(b, started, 3*time.Minute, "every crashed Machine on a rung")
	onRung := time.Since(start)
	wait(b, recovered, 5*time.Minute, "every crashed Machine Recovered and every Machine passing")
	total := time.Since(start)
	after := finalWrites(ctx, b, kube)
	window := time.Since(start)
	rungs1, recovery1 := remediationMetrics(b, ctrls.Manager.Remediations)
	rss := peakRSS()

	w := after.Done.Since(before.Done)
	k := float64(crash)
	extra, replaced, maxInFlight := machines.outcome()
	rungAt, recoveredAt := machines.times()
	took := durations(rungAt, recoveredAt)
	b.ReportMetric(total.Seconds(), "s-to-healthy")
	b.ReportMetric(onRung.Seconds(), "s-to-all-on-a-rung")
	b.ReportMetric(took[len(took)-1], "slowest-rung-s")
	if c := recovery1.count - recovery0.count; c > 0 {
		b.ReportMetric((recovery1.sum-recovery0.sum)/c, "mean-recovery-s")
	}
	b.ReportMetric(w.Sum("machines", "machines/status")/k, "machine-writes/remediation")
	b.ReportMetric(w.Sum("machinehealthchecks/status"), "mhc-status-writes")
	b.ReportMetric(w.Sum("events")/k, "events/remediation")
	b.ReportMetric(w.Sum("nodes", "nodes/status")/k, "node-writes/remediation")
	b.ReportMetric(float64(maxInFlight), "max-in-flight")
	b.ReportMetric(float64(extra), "healthy-remediated")
	b.ReportMetric(float64(replaced), "replaced")
	b.ReportMetric(float64(rss)/(1<<20), "peak-RSS-MiB")
	// Non-verbose benchmark output keeps only the first lines of the log:
	// the numbers first, the story of the slowest Machine (-v) last.
	b.Logf("N=%d, %d crashed: rungs %v (before: %v); %.0f recoveries; most in flight in the health check's status %d; Nodes and Events settled after %s",
		n, crash, rungs1, rungs0, recovery1.count-recovery0.count, checks.max(), settled.Round(time.Second))
	b.Logf("after the crash: Nodes seen Ready=Unknown %s; crashed Machines seen on a rung %s; seen Recovered %s",
		spread(start, nodes.unknownAt()), spread(start, rungAt), spread(start, recoveredAt))
	slow := 0
	for _, d := range took {
		if d > 10 {
			slow++
		}
	}
	b.Logf("from on a rung to Recovered: median %.1fs, 90th percentile %.1fs, slowest %.1fs; %d took over 10s",
		took[len(took)/2], took[len(took)*9/10], took[len(took)-1], slow)
	b.Logf("successful writes by resource %v; refused writes %v", w, after.Refused.Since(before.Refused))
	b.Logf("Lease writes: %.0f a second", w.Sum("leases")/window.Seconds())
	b.Logf("Events by reporter and reason: %v", eventsSince(ctx, b, start))
	if name := machines.slowest(); name != "" {
		b.Logf("the crashed Machine slowest to recover, %s:\n%s\nits Node:\n%s", name,
			strings.Join(machines.historyOf(name), "\n"), strings.Join(nodes.historyOf(machines.nodeOf(name)), "\n"))
	}
}

// settle waits until neither a Node nor an Event has been written for five
// seconds. kube-controller-manager's client makes 20 requests a second;
// after 1000 Nodes register, its node lifecycle controller takes minutes to
// post their RegisteredNode Events and label and untaint them, writes that
// would otherwise be counted against the remediations. It returns how long
// it waited.
func settle(ctx context.Context, b *testing.B, kube kubernetes.Interface) time.Duration {
	start := time.Now()
	last := -1.0
	for time.Since(start) < 5*time.Minute {
		c, err := testenv.ReadWrites(ctx, kube)
		if err != nil {
			b.Fatal(err)
		}
		n := c.Done.Sum("nodes", "nodes/status", "events") + c.Refused.Sum("nodes", "nodes/status", "events")
		if n == last {
			return time.Since(start)
		}
		last = n
		// A measurement: the writes stopped when five seconds add none.
		time.Sleep(5 * time.Second)
	}
	b.Fatalf("Nodes or Events still written after %s", time.Since(start).Round(time.Second))
	return 0
}

// setUpRemediation is setUp with kube-controller-manager running, so that
// crashed Nodes go Ready=Unknown, and Leases renewed often enough for it.
func setUpRemediation(ctx context.Context, b *testing.B, prefix string) (kubernetes.Interface, *testenv.Controllers, string) {
	e := freshEnv(b, testenv.Options{ControllerManager: true, NodeMonitorGracePeriod: remediateGrace})
	// NodeGrace: the health check may judge Nodes 2s after the manager
	// starts, not a kubelet's 40s.
	return startControllers(ctx, b, e, prefix, manager.Options{NodeGrace: 2 * time.Second},
		testenv.Leases{DurationSeconds: int32(remediateGrace / time.Second), RenewInterval: remediateRenew})
}

// createHealthCheck creates the MachineHealthCheck "bench" over the
// MachineSet "bench".
func createHealthCheck(ctx context.Context, b *testing.B, ns string) {
	inFlight, unhealthy := intstr.FromString("20%"), intstr.FromString("40%")
	hc := &machinistv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench"},
		Spec: machinistv1.MachineHealthCheckSpec{
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": "bench"}},
			UnhealthyNodeConditions: []machinistv1.UnhealthyNodeCondition{
				{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: 5 * time.Second}},
				{Type: "Ready", Status: "False", Timeout: metav1.Duration{Duration: 5 * time.Second}},
			},
			Remediation: machinistv1.Remediation{
				Ladder: []machinistv1.Rung{
					{Action: machinistv1.RemediateReboot, Timeout: &metav1.Duration{Duration: 2 * time.Minute}},
					{Action: machinistv1.RemediateReplace},
				},
				MaxInFlight: &inFlight,
			},
			MaxUnhealthy: &unhealthy,
		},
	}
	if err := env.Client.Create(ctx, hc); err != nil {
		b.Fatal(err)
	}
}

// tracker follows every Machine of a namespace through a watch started
// before any exists, so that it knows each one's latest state.
type tracker struct {
	mu      sync.Mutex
	all     map[string]*machinistv1.Machine
	waiters []waiter

	// From pick on: the crashed Machines, those on a rung now, those on a
	// rung at any time, those deleted, and the most on a rung at once.
	counting bool
	crashed  map[string]bool
	onRung   map[string]bool
	climbed  map[string]bool
	deleted  map[string]bool
	maxRung  int
	// When the watch first showed each crashed Machine on a rung, and
	// Recovered; and each crashed Machine's history, from start.
	rungAt, recoveredAt map[string]time.Time
	start               time.Time
	history             map[string][]string
}

type waiter struct {
	cond func(*tracker) bool
	done chan struct{}
}

func trackMachines(ctx context.Context, ns string) (*tracker, error) {
	events, err := env.WatchMachines(ctx, ns)
	if err != nil {
		return nil, err
	}
	t := &tracker{all: map[string]*machinistv1.Machine{}, crashed: map[string]bool{}, onRung: map[string]bool{},
		climbed: map[string]bool{}, deleted: map[string]bool{}, rungAt: map[string]time.Time{},
		recoveredAt: map[string]time.Time{}, history: map[string][]string{}}
	go func() {
		for ev := range events {
			if m, ok := ev.Object.(*machinistv1.Machine); ok {
				t.see(m, ev.Type == watch.Deleted)
			}
		}
	}()
	return t, nil
}

func (t *tracker) see(m *machinistv1.Machine, deleted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if deleted {
		delete(t.all, m.Name)
		delete(t.onRung, m.Name)
		if t.counting {
			t.deleted[m.Name] = true
		}
	} else {
		t.all[m.Name] = m
		rem := m.Status.Remediation
		if rem != nil && onRung(rem.Phase) && m.DeletionTimestamp.IsZero() {
			t.onRung[m.Name] = true
		} else {
			delete(t.onRung, m.Name)
		}
		if t.counting && t.onRung[m.Name] {
			t.climbed[m.Name] = true
		}
		if t.counting && t.crashed[m.Name] {
			if _, ok := t.rungAt[m.Name]; !ok && t.onRung[m.Name] {
				t.rungAt[m.Name] = now
			}
			if _, ok := t.recoveredAt[m.Name]; !ok && rem != nil && rem.Phase == machinistv1.RemediationRecovered {
				t.recoveredAt[m.Name] = now
			}
			t.history[m.Name] = append(t.history[m.Name], describe(now.Sub(t.start), m))
		}
	}
	t.maxRung = max(t.maxRung, len(t.onRung))
	t.waiters = slices.DeleteFunc(t.waiters, func(w waiter) bool {
		if w.cond(t) {
			close(w.done)
			return true
		}
		return false
	})
}

// until returns a channel closed once cond holds.
func (t *tracker) until(cond func(*tracker) bool) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	done := make(chan struct{})
	if cond(t) {
		close(done)
	} else {
		t.waiters = append(t.waiters, waiter{cond, done})
	}
	return done
}

// pick chooses k Machines spread over the names, marks them crashed and
// starts counting remediations; it returns their provider IDs.
func (t *tracker) pick(k int) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	names := slices.Sorted(maps.Keys(t.all))
	var ids []string
	for i := 0; i < len(names) && len(ids) < k; i += max(len(names)/k, 1) {
		t.crashed[names[i]] = true
		ids = append(ids, t.all[names[i]].Status.ProviderID)
	}
	t.maxRung, t.counting, t.start = len(t.onRung), true, time.Now()
	return ids
}

func (t *tracker) setStart(start time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.start = start
}

// allPassing: exactly n Machines, each Running with a healthy Node and, if
// checked, passing its health check.
func (t *tracker) allPassing(n int, checked bool) bool {
	if len(t.all) != n {
		return false
	}
	for _, m := range t.all {
		if !passing(m, checked) {
			return false
		}
	}
	return true
}

// allStarted: every crashed Machine is, or was, on a rung.
func (t *tracker) allStarted() bool {
	for name := range t.crashed {
		if !t.climbed[name] && !t.deleted[name] {
			return false
		}
	}
	return true
}

// recovered: every Machine passes, and every crashed one Recovered (or
// was replaced).
func (t *tracker) recovered(n int) bool {
	if !t.allPassing(n, true) {
		return false
	}
	for name := range t.crashed {
		if t.deleted[name] {
			continue
		}
		if rem := t.all[name].Status.Remediation; rem == nil || rem.Phase != machinistv1.RemediationRecovered {
			return false
		}
	}
	return true
}

// outcome is how many Machines that were not crashed went on a rung, how
// many crashed ones were deleted, and the most on a rung at once.
func (t *tracker) outcome() (extra, replaced, maxOnRung int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name := range t.climbed {
		if !t.crashed[name] {
			extra++
		}
	}
	return extra, len(t.deleted), t.maxRung
}

// times are when the watch first showed each crashed Machine on a rung and
// Recovered.
func (t *tracker) times() (rungAt, recoveredAt map[string]time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.rungAt), maps.Clone(t.recoveredAt)
}

// slowest names the crashed Machine that took longest from on a rung to
// Recovered.
func (t *tracker) slowest() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var name string
	var longest time.Duration
	for n, at := range t.recoveredAt {
		if d := at.Sub(t.rungAt[n]); d > longest {
			name, longest = n, d
		}
	}
	return name
}

func (t *tracker) historyOf(name string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.history[name])
}

func (t *tracker) nodeOf(name string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.all[name]; m != nil && m.Status.NodeRef != nil {
		return m.Status.NodeRef.Name
	}
	return ""
}

// describe is one line of a Machine's history.
func describe(at time.Duration, m *machinistv1.Machine) string {
	cond := func(t string) string {
		if c := meta.FindStatusCondition(m.Status.Conditions, t); c != nil {
			return string(c.Status) + "/" + c.Reason
		}
		return "-"
	}
	op, rem := "-", "-"
	if o := m.Status.Operation; o != nil {
		op = string(o.State) + ": " + o.Message
	}
	if r := m.Status.Remediation; r != nil {
		rem = string(r.Phase)
	}
	return fmt.Sprintf("  +%.2fs rv=%s phase=%s remediation=%s NodeHealthy=%s HealthCheckSucceeded=%s operation=%s",
		at.Seconds(), m.ResourceVersion, m.Status.Phase, rem, cond(machinistv1.ConditionNodeHealthy),
		cond(machinistv1.ConditionHealthCheckSucceeded), op)
}

func passing(m *machinistv1.Machine, checked bool) bool {
	if m.Status.Phase != machinistv1.MachineRunning || !m.DeletionTimestamp.IsZero() ||
		!meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionNodeHealthy) {
		return false
	}
	return !checked || meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionHealthCheckSucceeded)
}

func onRung(p machinistv1.RemediationPhase) bool {
	return p == machinistv1.RemediationRebooting || p == machinistv1.RemediationRepairing || p == machinistv1.RemediationReplacing
}

// durations are the seconds from rungAt to recoveredAt of each Machine in
// both, sorted; never empty.
func durations(rungAt, recoveredAt map[string]time.Time) []float64 {
	out := []float64{0}
	for name, end := range recoveredAt {
		if begin, ok := rungAt[name]; ok {
			out = append(out, end.Sub(begin).Seconds())
		}
	}
	if len(out) > 1 {
		out = out[1:]
	}
	slices.Sort(out)
	return out
}

// spread is the count, first, median and last of times, in seconds after
// start.
func spread(start time.Time, times map[string]time.Time) string {
	var s []float64
	for _, t := range times {
		s = append(s, t.Sub(start).Seconds())
	}
	if len(s) == 0 {
		return "none"
	}
	slices.Sort(s)
	return fmt.Sprintf("%d: first %.1fs, median %.1fs, last %.1fs", len(s), s[0], s[len(s)/2], s[len(s)-1])
}

// inFlightMax is the highest status.remediationsInFlight a watch of the
// namespace's health checks saw.
type inFlightMax struct {
	mu sync.Mutex
	n  int32
}

func (m *inFlightMax) max() int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

func trackInFlight(ctx context.Context, ns string) (*inFlightMax, error) {
	events, err := env.Watch(ctx, ns, func() client.ObjectList { return &machinistv1.MachineHealthCheckList{} })
	if err != nil {
		return nil, err
	}
	m := &inFlightMax{}
	go func() {
		for ev := range events {
			if hc, ok := ev.Object.(*machinistv1.MachineHealthCheck); ok {
				m.mu.Lock()
				m.n = max(m.n, hc.Status.RemediationsInFlight)
				m.mu.Unlock()
			}
		}
	}()
	return m, nil
}

// nodes records when a watch first showed each Node Ready=Unknown, and
// each Node's history from start.
type nodes struct {
	mu      sync.Mutex
	start   time.Time
	unknown map[string]time.Time
	history map[string][]string
}

func trackNodes(ctx context.Context) (*nodes, error) {
	events, err := env.Watch(ctx, "", func() client.ObjectList { return &corev1.NodeList{} })
	if err != nil {
		return nil, err
	}
	n := &nodes{start: time.Now(), unknown: map[string]time.Time{}, history: map[string][]string{}}
	go func() {
		for ev := range events {
			node, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			ready := "-"
			if c := nodeside.Condition(node, corev1.NodeReady); c != nil {
				ready = string(c.Status)
			}
			var taints []string
			for _, t := range node.Spec.Taints {
				taints = append(taints, t.Key+":"+string(t.Effect))
			}
			n.mu.Lock()
			if _, ok := n.unknown[node.Name]; !ok && ready == string(corev1.ConditionUnknown) {
				n.unknown[node.Name] = time.Now()
			}
			n.history[node.Name] = append(n.history[node.Name], fmt.Sprintf("  +%.2fs %s rv=%s Ready=%s boot=%s taints=%v",
				time.Since(n.start).Seconds(), ev.Type, node.ResourceVersion, ready, node.Status.NodeInfo.BootID, taints))
			n.mu.Unlock()
		}
	}()
	return n, nil
}

func (n *nodes) setStart(start time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.start = start
}

func (n *nodes) unknownAt() map[string]time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.unknown)
}

func (n *nodes) historyOf(name string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.history[name])
}

// eventsSince counts the Events created from start on, by reporting
// controller and reason.
func eventsSince(ctx context.Context, b *testing.B, start time.Time) map[string]int {
	var list eventsv1.EventList
	if err := env.Client.List(ctx, &list); err != nil {
		b.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range list.Items {
		if !e.CreationTimestamp.Time.Before(start.Truncate(time.Second)) {
			out[e.ReportingController+" "+e.Reason] += max(int(e.DeprecatedCount), 1)
		}
	}
	return out
}

type histogram struct{ count, sum float64 }

// remediationMetrics reads the health checks' rung counts, by "action
// outcome", and the recovery-time histogram.
func remediationMetrics(b *testing.B, m *machinehealthcheck.Metrics) (map[string]float64, histogram) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Rungs, m.Recovery)
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	rungs, h := map[string]float64{}, histogram{}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			if hist := s.GetHistogram(); hist != nil {
				h = histogram{float64(hist.GetSampleCount()), hist.GetSampleSum()}
				continue
			}
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetValue())
			}
			rungs[strings.Join(labels, " ")] = s.GetCounter().GetValue()
		}
	}
	return rungs, h
}
