package machinehealthcheck_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/nodes"
)

const (
	reboot  = machinistv1.RemediateReboot
	repair  = machinistv1.RemediateRepair
	replace = machinistv1.RemediateReplace
)

// A Machine whose hardware broke stays NotReady through a reboot and a
// repair; the third rung replaces it, and its MachineSet makes a new one.
func TestLadderClimbsFromRebootToReplace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := setup(t, "ladder", "")
	h := record(t, ns)
	create(t, testenv.MachineSet(ns, "workers", 1))
	old := running(t, ns, 1)[0]
	create(t, healthCheck(ns, "workers", rung(reboot, 4*time.Second), rung(repair, 4*time.Second), rung(replace, 0)))
	if err := controllers.Provider.Break(old.Status.ProviderID); err != nil {
		t.Fatal(err)
	}

	var fresh machinistv1.Machine
	testenv.WaitFor(t, wait, "a new Machine replacing the broken one", func() bool {
		ms := env.Machines(t, ns)
		if len(ms) != 1 || ms[0].Name == old.Name || ms[0].Status.Phase != machinistv1.MachineRunning {
			return false
		}
		fresh = ms[0]
		return true
	})
	h.caughtUp(t, old.Name, "", 0)
	// Found unhealthy and started on the first rung in one write: with a
	// free slot, Unhealthy is never stored on its own.
	want := []machinistv1.RemediationPhase{
		machinistv1.RemediationRebooting, machinistv1.RemediationRepairing, machinistv1.RemediationReplacing,
	}
	if got := h.ladder(old.Name); !slices.Equal(got, want) {
		t.Errorf("the broken Machine went through %v on the ladder, want %v", got, want)
	}
	phases := h.phases(old.Name)
	for _, p := range []machinistv1.MachinePhase{machinistv1.MachineRebooting, machinistv1.MachineRepairing, machinistv1.MachineFailed} {
		if !slices.Contains(phases, p) {
			t.Errorf("the broken Machine's phases %v lack %s", phases, p)
		}
	}
	if !h.deleted(old.Name) {
		t.Error("no watch event showed the broken Machine deleted")
	}
	if exists, err := controllers.Provider.Exists(ctx, old.Status.ProviderID); err != nil || exists {
		t.Errorf("the broken Machine's instance still exists (%v)", err)
	}
	if fresh.Status.Remediation != nil && fresh.Status.Remediation.Phase != machinistv1.RemediationHealthy {
		t.Errorf("the new Machine starts with remediation %+v", fresh.Status.Remediation)
	}
	for _, reason := range []string{"MachineUnhealthy", "RemediationStarted", "RemediationFailed"} {
		if len(events(t, ns, reason, 1)) == 0 {
			t.Errorf("no %s Event", reason)
		}
	}
}

// A Machine no MachineSet owns is never replaced: the rung is skipped and
// the ladder runs out, visibly.
func TestMachineWithoutSetIsNeverReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := setup(t, "bare", "")
	m := &machinistv1.Machine{}
	m.Namespace, m.Name, m.Labels = ns, "bare", map[string]string{"pool": "bare"}
	m.Spec.ClassRef.Name, m.Spec.Version = "small", "v1.37.2"
	create(t, m)
	running(t, ns, 1)
	get(t, m)
	create(t, healthCheck(ns, "bare", rung(replace, 0)))
	if err := controllers.Provider.Break(m.Status.ProviderID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, wait, "the ladder exhausted", func() bool {
		get(t, m)
		return m.Status.Remediation != nil && m.Status.Remediation.Phase == machinistv1.RemediationExhausted
	})
	skipped := events(t, ns, "RemediationSkipped", 1)
	if len(skipped) == 0 || !strings.Contains(skipped[0].Note, "never replaced") {
		t.Errorf("want a RemediationSkipped Event saying the Machine is never replaced, got %+v", skipped)
	}
	if len(events(t, ns, "RemediationExhausted", 1)) == 0 {
		t.Error("no RemediationExhausted Event")
	}
	// Nothing is to happen now: two seconds in which a deletion would show.
	time.Sleep(2 * time.Second)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil || !m.DeletionTimestamp.IsZero() {
		t.Errorf("the Machine was deleted (%v)", err)
	}
}

// crash stops the Machines' agents: their Leases lapse and the node
// lifecycle controller marks their Nodes Ready=Unknown.
func crash(t *testing.T, ms ...machinistv1.Machine) {
	t.Helper()
	for _, m := range ms {
		if err := controllers.Provider.Crash(m.Status.ProviderID); err != nil {
			t.Fatal(err)
		}
	}
}

// unreachableFor waits until the Nodes of ms have all been Ready=Unknown
// for longer than d, by their Ready conditions' transition times: those
// (at a second's resolution) are what a health check judges by.
func unreachableFor(t *testing.T, d time.Duration, ms ...machinistv1.Machine) {
	t.Helper()
	testenv.WaitFor(t, wait, fmt.Sprintf("%d Nodes unreachable for %s", len(ms), d), func() error {
		for _, m := range ms {
			var node corev1.Node
			if err := env.Client.Get(context.Background(), client.ObjectKey{Name: m.Status.NodeRef.Name}, &node); err != nil {
				return err
			}
			c := nodes.Condition(&node, corev1.NodeReady)
			if c == nil {
				return fmt.Errorf("Node %s has no Ready condition", node.Name)
			}
			if c.Status != corev1.ConditionUnknown {
				return fmt.Errorf("Node %s is Ready=%s", node.Name, c.Status)
			}
			if since := time.Since(c.LastTransitionTime.Time); since <= d {
				return fmt.Errorf("Node %s is unreachable for %s only", node.Name, since.Round(time.Millisecond))
			}
		}
		return nil
	})
}

// An unreachable Node is rebooted hard, without a drain, and comes back:
// the same Machine, a new boot ID.
func TestUnreachableMachineIsRebootedHard(t *testing.T) {
	t.Parallel()
	ns := setup(t, "unreachable", "")
	h := record(t, ns)
	create(t, testenv.MachineSet(ns, "workers", 1))
	m := running(t, ns, 1)[0]
	create(t, healthCheck(ns, "workers", rung(reboot, 30*time.Second), rung(replace, 0)))
	crash(t, m)
	testenv.WaitFor(t, wait, "the Machine recovered", func() bool {
		get(t, &m)
		return m.Status.Remediation != nil && m.Status.Remediation.Phase == machinistv1.RemediationRecovered && healthy(&m)
	})
	h.caughtUp(t, m.Name, machinistv1.RemediationRecovered, 0)
	op := m.Status.Operation
	if op == nil || op.Source != machinistv1.SourceHealthCheck || op.RequestedBy != "machinehealthcheck/workers" ||
		op.Options == nil || op.Options.Mode != machinistv1.RebootHard || op.Options.SkipDrain == nil || !*op.Options.SkipDrain {
		t.Errorf("want a hard reboot without drain requested by machinehealthcheck/workers, got %+v", op)
	}
	if b := h.boots(m.Name); b != 2 {
		t.Errorf("the Machine reported %d boot IDs, want 2: one reboot", b)
	}
	if got := h.ladder(m.Name); !slices.Equal(got, []machinistv1.RemediationPhase{
		machinistv1.RemediationRebooting, machinistv1.RemediationRecovered}) {
		t.Errorf("ladder %v", got)
	}
	c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionHealthCheckSucceeded)
	if c == nil || c.Status != "True" {
		t.Errorf("HealthCheckSucceeded is %+v, want True", c)
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionRemediating); c == nil || c.Status != "False" || c.Reason != "Recovered" {
		t.Errorf("Remediating is %+v, want False, Recovered", c)
	}
	sawRung := false
	for _, s := range h.all() {
		sawRung = sawRung || (s.name == m.Name && s.remediating == "True/Reboot")
	}
	if !sawRung {
		t.Error("no watch event showed the Remediating condition True with reason Reboot")
	}
	// Other tests remediate too, in parallel: at least this one counts.
	// The controller records metrics right after its write, which this
	// test may read first.
	rungs := controllers.Manager.Remediations.Rungs
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(controllers.Manager.Remediations.Recovery)
	recoveries := func() uint64 {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 {
			t.Fatalf("gathering the recovery histogram: %v", err)
		}
		return mfs[0].Metric[0].GetHistogram().GetSampleCount()
	}
	testenv.WaitFor(t, 5*time.Second, "a succeeded Reboot rung counted", func() error {
		if n, r := testutil.ToFloat64(rungs.WithLabelValues("Reboot", "succeeded")), recoveries(); n < 1 || r < 1 {
			return fmt.Errorf("machinist_remediations_total{action=Reboot,outcome=succeeded} is %v and the recovery histogram has %d samples", n, r)
		}
		return nil
	})
	if n := testutil.ToFloat64(rungs.WithLabelValues("Reboot", "started")); n < 1 {
		t.Errorf("machinist_remediations_total{action=Reboot,outcome=started} is %v", n)
	}
}

// With maxUnhealthy 40%, 3 of 5 unhealthy is too many: nothing is
// remediated, and the health check says why. Once one is back, the other
// two are remediated.
func TestShortCircuit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := setup(t, "short", "")
	h := record(t, ns)
	create(t, testenv.MachineSet(ns, "workers", 5))
	ms := running(t, ns, 5)
	// Three at once, as a zone outage would: the check is created once all
	// three Nodes are unreachable, so that none is judged alone first.
	crash(t, ms[:3]...)
	testenv.WaitFor(t, wait, "three Nodes unreachable", func() bool {
		n := 0
		for _, m := range env.Machines(t, ns) {
			var node corev1.Node
			if err := env.Client.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, &node); err == nil {
				for _, c := range node.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status == corev1.ConditionUnknown {
						n++
					}
				}
			}
		}
		return n == 3
	})
	// And for longer than the check's timeout, so that the first pass
	// finds all three unhealthy.
	unreachableFor(t, 1500*time.Millisecond, ms[:3]...)
	hc := healthCheck(ns, "workers", rung(reboot, 30*time.Second))
	hc.Spec.MaxUnhealthy = percent("40%")
	hc.Spec.Remediation.MaxInFlight = percent("100%")
	create(t, hc)
	testenv.WaitFor(t, wait, "the health check short-circuited", func() bool {
		get(t, hc)
		c := meta.FindStatusCondition(hc.Status.Conditions, machinistv1.ConditionRemediationAllowed)
		return hc.Status.UnhealthyMachines == 3 && c != nil && c.Status == "False" && c.Reason == "TooManyUnhealthy"
	})
	if hc.Status.RemediationsAllowed != 0 || hc.Status.ExpectedMachines != 5 {
		t.Errorf("status %+v", hc.Status)
	}
	// Nothing is to happen now: three seconds in which a remediation
	// would show in the watch.
	time.Sleep(3 * time.Second)
	for _, s := range h.all() {
		if s.ladder == machinistv1.RemediationRebooting {
			t.Fatalf("Machine %s was remediated while 3 of 5 were unhealthy", s.name)
		}
	}
	if len(events(t, ns, "RemediationShortCircuited", 1)) == 0 {
		t.Error("no RemediationShortCircuited Event")
	}

	// A person brings one back.
	if err := controllers.Provider.Reboot(ctx, ms[0].Status.ProviderID, actuatorOp("by-hand")); err != nil {
		t.Fatal(err)
	}
	running(t, ns, 5)
	for _, m := range ms[1:3] {
		h.caughtUp(t, m.Name, machinistv1.RemediationRecovered, 0)
	}
	for _, m := range ms[1:3] {
		if got := h.ladder(m.Name); !slices.Contains(got, machinistv1.RemediationRebooting) {
			t.Errorf("Machine %s went through %v, want a Reboot rung", m.Name, got)
		}
	}
	if got := h.ladder(ms[0].Name); slices.Contains(got, machinistv1.RemediationRebooting) {
		t.Errorf("Machine %s, healed by hand, was remediated too: %v", ms[0].Name, got)
	}
}

// maxInFlight 1 with 4 unhealthy: they are remediated one at a time, as
// every watch event shows.
func TestMaxInFlight(t *testing.T) {
	t.Parallel()
	ns := setup(t, "inflight", "")
	h := record(t, ns)
	create(t, testenv.MachineSet(ns, "workers", 4))
	ms := running(t, ns, 4)
	hc := healthCheck(ns, "workers", rung(reboot, 30*time.Second))
	hc.Spec.Remediation.MaxInFlight = &intstr.IntOrString{IntVal: 1}
	create(t, hc)
	crash(t, ms...)
	testenv.WaitFor(t, wait, "all four recovered", func() bool {
		n := 0
		for _, m := range env.Machines(t, ns) {
			if m.Status.Remediation != nil && m.Status.Remediation.Phase == machinistv1.RemediationRecovered && healthy(&m) {
				n++
			}
		}
		return n == 4
	})
	now := map[string]machinistv1.RemediationPhase{}
	most := 0
	for _, s := range h.all() {
		now[s.name] = s.ladder
		n := 0
		for _, p := range now {
			if p == machinistv1.RemediationRebooting || p == machinistv1.RemediationRepairing || p == machinistv1.RemediationReplacing {
				n++
			}
		}
		most = max(most, n)
	}
	if most != 1 {
		t.Errorf("at most %d remediations were in flight at once, want exactly 1", most)
	}
}

// A Machine unhealthy again within the cooldown starts on the next rung.
func TestCooldownStartsOnTheNextRung(t *testing.T) {
	t.Parallel()
	ns := setup(t, "cooldown", "")
	h := record(t, ns)
	create(t, testenv.MachineSet(ns, "workers", 1))
	m := running(t, ns, 1)[0]
	hc := healthCheck(ns, "workers", rung(reboot, 30*time.Second), rung(repair, 30*time.Second))
	hc.Spec.Remediation.Cooldown = duration(10 * time.Minute)
	create(t, hc)
	recovered := func(rung int32) func() bool {
		return func() bool {
			get(t, &m)
			r := m.Status.Remediation
			return r != nil && r.Phase == machinistv1.RemediationRecovered && r.Rung == rung && healthy(&m)
		}
	}
	crash(t, m)
	testenv.WaitFor(t, wait, "recovered by the Reboot rung", recovered(0))
	crash(t, m)
	testenv.WaitFor(t, wait, "recovered by the Repair rung", recovered(1))
	h.caughtUp(t, m.Name, machinistv1.RemediationRecovered, 1)
	want := []machinistv1.RemediationPhase{
		machinistv1.RemediationRebooting, machinistv1.RemediationRecovered,
		machinistv1.RemediationRepairing, machinistv1.RemediationRecovered,
	}
	if got := h.ladder(m.Name); !slices.Equal(got, want) {
		t.Errorf("ladder %v, want %v", got, want)
	}
}

// A healthy fleet costs the health check nothing at rest.
func TestSettledFleetWritesNothing(t *testing.T) {
	t.Parallel()
	ns := setup(t, "settled", "")
	create(t, testenv.MachineSet(ns, "workers", 3))
	running(t, ns, 3)
	hc := healthCheck(ns, "workers", rung(reboot, 30*time.Second))
	create(t, hc)
	testenv.WaitFor(t, wait, "the health check counted three healthy", func() bool {
		get(t, hc)
		return hc.Status.HealthyMachines == 3
	})
	testenv.WaitFor(t, wait, "every Machine's HealthCheckSucceeded set", func() bool {
		for _, m := range env.Machines(t, ns) {
			if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionHealthCheckSucceeded); c == nil || c.Status != "True" {
				return false
			}
		}
		return true
	})
	rvs := map[string]string{}
	for _, m := range env.Machines(t, ns) {
		rvs[m.Name] = m.ResourceVersion
	}
	get(t, hc)
	hcRV := hc.ResourceVersion
	// Nothing is to happen now: five seconds in which a write would show.
	time.Sleep(5 * time.Second)
	for _, m := range env.Machines(t, ns) {
		if rvs[m.Name] != m.ResourceVersion {
			t.Errorf("Machine %s was written at rest", m.Name)
		}
	}
	get(t, hc)
	if hc.ResourceVersion != hcRV {
		t.Errorf("the health check was written at rest: %+v", hc.Status)
	}
}

// A manager restarted while a Machine is on a rung resumes on the same
// rung: it waits for the operation it had requested, which the provider
// carries out once. Not parallel: the restart stops every controller.
func TestRestartMidLadderKeepsTheRung(t *testing.T) {
	ns := setup(t, "restart", `{"rebootLatency": "4s"}`)
	h := record(t, ns)
	create(t, testenv.MachineSet(ns, "workers", 1))
	m := running(t, ns, 1)[0]
	create(t, healthCheck(ns, "workers", rung(reboot, time.Minute), rung(replace, 0)))
	crash(t, m)
	testenv.WaitFor(t, wait, "the Reboot rung started", func() bool {
		get(t, &m)
		return m.Status.Remediation != nil && m.Status.Remediation.Phase == machinistv1.RemediationRebooting
	})
	opID := m.Status.Remediation.OperationID
	if err := controllers.RestartManager(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, wait, "the Machine recovered", func() bool {
		get(t, &m)
		return m.Status.Remediation.Phase == machinistv1.RemediationRecovered && healthy(&m)
	})
	h.caughtUp(t, m.Name, machinistv1.RemediationRecovered, 0)
	if m.Status.Remediation.OperationID != opID || m.Status.Remediation.Rung != 0 {
		t.Errorf("after the restart the Machine is on rung %d with operation %s, want rung 0 with %s",
			m.Status.Remediation.Rung, m.Status.Remediation.OperationID, opID)
	}
	restarts, err := controllers.Provider.Restarts(m.Status.ProviderID)
	if err != nil || restarts != 1 {
		t.Errorf("the provider restarted the machine %d times (%v), want once", restarts, err)
	}
	if b := h.boots(m.Name); b != 2 {
		t.Errorf("the Machine reported %d boot IDs, want 2: one reboot", b)
	}
	ops := map[string]bool{}
	for _, s := range h.all() {
		if s.operation != "" {
			ops[strings.Fields(s.operation)[0]] = true
		}
	}
	if len(ops) != 1 {
		t.Errorf("operations requested: %v, want only %s", ops, opID)
	}
}

// A rung the Machine's phase cannot take is skipped, visibly: a Failed
// Machine cannot reboot, but it can be repaired.
func TestFailedMachineSkipsRebootButIsRepaired(t *testing.T) {
	t.Parallel()
	ns := setup(t, "skip", "")
	h := record(t, ns)
	m := &machinistv1.Machine{}
	m.Namespace, m.Name, m.Labels = ns, "broken", map[string]string{"pool": "broken"}
	m.Spec.ClassRef.Name, m.Spec.Version = "small", "v1.37.2"
	create(t, m)
	running(t, ns, 1)
	get(t, m)
	create(t, healthCheck(ns, "broken", rung(reboot, 2*time.Second), rung(reboot, 2*time.Second), rung(repair, 2*time.Second), rung(replace, 0)))
	if err := controllers.Provider.Break(m.Status.ProviderID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, wait, "the ladder exhausted", func() bool {
		get(t, m)
		return m.Status.Remediation != nil && m.Status.Remediation.Phase == machinistv1.RemediationExhausted
	})
	h.caughtUp(t, m.Name, machinistv1.RemediationExhausted, m.Status.Remediation.Rung)
	if got, want := h.ladder(m.Name), []machinistv1.RemediationPhase{
		machinistv1.RemediationRebooting, machinistv1.RemediationRepairing, machinistv1.RemediationExhausted,
	}; !slices.Equal(got, want) {
		t.Errorf("ladder %v, want %v", got, want)
	}
	var notes []string
	for _, e := range events(t, ns, "RemediationSkipped", 2) {
		notes = append(notes, e.Note)
	}
	if len(notes) != 2 || !strings.Contains(strings.Join(notes, "\n"), "rung 2 of 4 (Reboot) skipped") ||
		!strings.Contains(strings.Join(notes, "\n"), "is Failed") || !strings.Contains(strings.Join(notes, "\n"), "rung 4 of 4 (Replace) skipped") {
		t.Errorf("want the second Reboot and the Replace skipped, saying why, got %q", notes)
	}
	if restarts, err := controllers.Provider.Restarts(m.Status.ProviderID); err != nil || restarts != 2 {
		t.Errorf("the machine restarted %d times (%v), want 2: one reboot, one repair", restarts, err)
	}
}

// A Failed Machine's message, as long as a condition's may be, is quoted
// in the health check's own condition on it, cut to fit: whole, it would
// have the health check's every write of the Machine refused.
func TestAFailureAsLongAsAMessageMayBeIsQuotedCut(t *testing.T) {
	t.Parallel()
	ns := setup(t, "longfail", `{"failCreate": "quota exceeded: `+strings.Repeat("x", machinistv1.MaxMessageLength)+`"}`)
	m := &machinistv1.Machine{}
	m.Namespace, m.Name, m.Labels = ns, "doomed", map[string]string{"pool": "doomed"}
	m.Spec.ClassRef.Name, m.Spec.Version = "small", "v1.37.2"
	create(t, m)
	create(t, healthCheck(ns, "doomed", rung(repair, 2*time.Second)))
	testenv.WaitFor(t, wait, "the health check's verdict on the Failed Machine", func() error {
		get(t, m)
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionHealthCheckSucceeded)
		if c == nil || c.Reason != machinistv1.ReasonMachineFailed {
			return fmt.Errorf("phase %s, condition %v", m.Status.Phase, c)
		}
		if len(c.Message) != machinistv1.MaxMessageLength || !strings.HasPrefix(c.Message, "the Machine is Failed (CreateFailed): ") || !strings.Contains(c.Message, "quota exceeded: xxx") || !strings.HasSuffix(c.Message, "...") {
			return fmt.Errorf("a message of %d bytes: %.80q...%q", len(c.Message), c.Message, c.Message[max(0, len(c.Message)-20):])
		}
		return nil
	})
}

// A provider that refuses the reboot fails the rung's operation at once;
// the next rung, a repair, brings the Machine back.
func TestRefusedRebootHandsOverToRepair(t *testing.T) {
	t.Parallel()
	ns := setup(t, "refused", `{"failReboot": "host locked"}`)
	h := record(t, ns)
	create(t, testenv.MachineSet(ns, "workers", 1))
	m := running(t, ns, 1)[0]
	create(t, healthCheck(ns, "workers", rung(reboot, time.Minute), rung(repair, time.Minute), rung(replace, 0)))
	crash(t, m)
	testenv.WaitFor(t, wait, "recovered by the Repair rung", func() bool {
		get(t, &m)
		r := m.Status.Remediation
		return r != nil && r.Phase == machinistv1.RemediationRecovered && r.Rung == 1 && healthy(&m)
	})
	h.caughtUp(t, m.Name, machinistv1.RemediationRecovered, 1)
	if got, want := h.ladder(m.Name), []machinistv1.RemediationPhase{
		machinistv1.RemediationRebooting, machinistv1.RemediationRepairing, machinistv1.RemediationRecovered,
	}; !slices.Equal(got, want) {
		t.Errorf("ladder %v, want %v", got, want)
	}
	failed := events(t, ns, "RemediationFailed", 1)
	if len(failed) == 0 || !strings.Contains(failed[0].Note, "host locked") {
		t.Errorf("want a RemediationFailed Event with the provider's refusal, got %+v", failed)
	}
	if restarts, err := controllers.Provider.Restarts(m.Status.ProviderID); err != nil || restarts != 1 {
		t.Errorf("the machine restarted %d times (%v), want once: the repair", restarts, err)
	}
}

// A Machine whose Node never becomes Ready fails nodeStartupTimeout; it
// cannot be rebooted while Provisioning, so that rung is skipped and it is
// replaced.
func TestNodeStartupTimeoutReplaces(t *testing.T) {
	t.Parallel()
	ns := setup(t, "startup", `{"neverReady": true}`)
	h := record(t, ns)
	hc := healthCheck(ns, "workers", rung(reboot, time.Minute), rung(replace, 0))
	hc.Spec.NodeStartupTimeout = duration(2 * time.Second)
	create(t, hc)
	set := testenv.MachineSet(ns, "workers", 1)
	create(t, set)
	// Every new Machine fails the same way: stop the churn, which would
	// load the tests running beside this one.
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), hc)
		_ = env.Client.Delete(context.Background(), set)
	})
	var first machinistv1.Machine
	testenv.WaitFor(t, wait, "the first Machine", func() bool {
		ms := env.Machines(t, ns)
		if len(ms) == 0 {
			return false
		}
		first = ms[0]
		return true
	})
	h.caughtUp(t, first.Name, "", 0)
	if got := h.ladder(first.Name); !slices.Equal(got, []machinistv1.RemediationPhase{machinistv1.RemediationReplacing}) {
		t.Errorf("ladder %v, want [Replacing]", got)
	}
	var notes []string
	for _, e := range events(t, ns, "RemediationSkipped", 1) {
		notes = append(notes, e.Note)
	}
	if !strings.Contains(strings.Join(notes, "\n"), "rung 1 of 2 (Reboot) skipped") {
		t.Errorf("want the Reboot rung skipped for a Provisioning Machine, got %q", notes)
	}
	unhealthy := events(t, ns, "MachineUnhealthy", 1)
	if len(unhealthy) == 0 || !strings.Contains(unhealthy[0].Note, "nodeStartupTimeout") {
		t.Errorf("want a MachineUnhealthy Event naming nodeStartupTimeout, got %+v", unhealthy)
	}
	testenv.WaitFor(t, wait, "a new Machine made in its place", func() bool {
		for _, m := range env.Machines(t, ns) {
			if m.Name != first.Name {
				return true
			}
		}
		return false
	})
}

// A Machine with someone else's operation in flight is left alone until it
// ends: here a person's reboot, held in Draining by a pre-drain hook, of a
// Machine whose Node is unreachable. The reboot brings it back; the health
// check never starts a rung.
func TestPersonsOperationIsLeftAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := setup(t, "person", "")
	h := record(t, ns)
	create(t, testenv.MachineSet(ns, "workers", 1))
	m := running(t, ns, 1)[0]
	hook := machinistv1.PreDrainHookPrefix + "person"
	if err := env.Client.Patch(ctx, &m, client.RawPatch(types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+hook+`":""}}}`))); err != nil {
		t.Fatal(err)
	}
	get(t, &m)
	op, err := operation.Request(&m, machinistv1.OperationReboot, nil, machinistv1.SourceAPI, "alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Status().Update(ctx, &m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, wait, "the reboot held in Draining", func() bool {
		get(t, &m)
		return m.Status.Phase == machinistv1.MachineDraining
	})
	crash(t, m)
	create(t, healthCheck(ns, "workers", rung(reboot, time.Minute), rung(replace, 0)))
	// Long enough for the check to have acted, were it going to: its
	// timeout of 1s, the second by which its recheck comes late, and a
	// second's margin.
	unreachableFor(t, 3*time.Second, m)
	get(t, &m)
	if r := m.Status.Remediation; r != nil && r.Phase != machinistv1.RemediationHealthy {
		t.Fatalf("the health check acted while alice's reboot was in flight: %+v", r)
	}
	if err := env.Client.Patch(ctx, &m, client.RawPatch(types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+hook+`":null}}}`))); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, wait, "alice's reboot done and the Machine healthy", func() bool {
		get(t, &m)
		return m.Status.Operation.ID == op.ID && m.Status.Operation.State == machinistv1.OperationSucceeded && healthy(&m)
	})
	// Nothing is to happen now: two seconds in which a rung would show in
	// the watch.
	time.Sleep(2 * time.Second)
	for _, s := range h.all() {
		if s.name == m.Name && (s.ladder == machinistv1.RemediationRebooting || s.ladder == machinistv1.RemediationReplacing) {
			t.Fatalf("the health check started a rung on %s: %+v", m.Name, s)
		}
		if s.name == m.Name && s.operation != "" && !strings.HasPrefix(s.operation, op.ID) {
			t.Fatalf("another operation was requested: %s", s.operation)
		}
	}
}
