package machinehealthcheck

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func TestJudge(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }
	c := checks{startup: 10 * time.Minute, conditions: []machinistv1.UnhealthyNodeCondition{
		{Type: "Ready", Status: "Unknown", Timeout: metav1.Duration{Duration: time.Minute}},
		{Type: "Ready", Status: "False", Timeout: metav1.Duration{Duration: 2 * time.Minute}},
		{Type: "KernelDeadlock", Status: "True", Timeout: metav1.Duration{Duration: 0}},
	}}
	old := trust{Since: now.Add(-time.Hour), Grace: 40 * time.Second}
	machine := func(phase machinistv1.MachinePhase, entered time.Duration) *machinistv1.Machine {
		m := &machinistv1.Machine{}
		m.CreationTimestamp = ago(time.Hour)
		m.Status.Phase = phase
		m.Status.NodeRef = &machinistv1.NodeReference{Name: "n1"}
		m.Status.LastTransition = &machinistv1.Transition{To: phase, Time: ago(entered)}
		return m
	}
	node := func(conds ...corev1.NodeCondition) *corev1.Node {
		n := &corev1.Node{}
		n.Name = "n1"
		n.Status.Conditions = conds
		return n
	}
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, since time.Duration) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, LastTransitionTime: ago(since)}
	}
	ready := cond(corev1.NodeReady, corev1.ConditionTrue, time.Hour)
	// unconfirmed is a Running Machine whose reboot completed on its
	// provider's word, booted ago, with no Node reporting it since.
	unconfirmed := func(ago time.Duration) *machinistv1.Machine {
		m := machine(machinistv1.MachineRunning, ago)
		m.Status.Conditions = []metav1.Condition{{Type: machinistv1.ConditionBootConfirmed, Status: metav1.ConditionUnknown,
			Reason: machinistv1.ReasonNodeNotSeen, LastTransitionTime: metav1.NewTime(now.Add(-ago))}}
		return m
	}

	for _, tc := range []struct {
		name        string
		m           *machinistv1.Machine
		node        *corev1.Node
		trust       trust
		known       bool
		healthy     bool
		reason      string
		unreachable bool
		recheck     time.Time
		message     string
	}{
		{name: "ready node", m: machine(machinistv1.MachineRunning, time.Hour), node: node(ready), trust: old,
			known: true, healthy: true},
		{name: "failed machine", m: func() *machinistv1.Machine {
			m := machine(machinistv1.MachineFailed, time.Minute)
			m.Status.Conditions = []metav1.Condition{{Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: "RebootTimeout", Message: "no Ready Node"}}
			return m
		}(), trust: old, known: true, reason: machinistv1.ReasonMachineFailed, message: "Failed (RebootTimeout): no Ready Node"},
		{name: "provisioning within the startup timeout", m: machine(machinistv1.MachineProvisioning, 4*time.Minute), trust: old,
			known: true, healthy: true, recheck: now.Add(6 * time.Minute)},
		{name: "provisioning past the startup timeout", m: machine(machinistv1.MachineProvisioning, 11*time.Minute), trust: old,
			known: true, reason: machinistv1.ReasonNodeStartupTimeout},
		{name: "pending counts from creation", m: func() *machinistv1.Machine {
			m := machine(machinistv1.MachinePending, time.Minute)
			m.Status.LastTransition = nil
			return m
		}(), trust: old, known: true, reason: machinistv1.ReasonNodeStartupTimeout},
		{name: "running without its node", m: machine(machinistv1.MachineRunning, time.Hour), trust: old,
			known: true, reason: machinistv1.ReasonNodeNotFound, message: "Node n1 is gone"},
		{name: "rebooting is not judged", m: machine(machinistv1.MachineRebooting, time.Second), node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, time.Hour)), trust: old},
		{name: "unknown not yet long enough", m: machine(machinistv1.MachineRunning, time.Hour),
			node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, 20*time.Second)), trust: old,
			known: true, healthy: true, unreachable: true, recheck: now.Add(40 * time.Second)},
		{name: "unknown long enough is unreachable", m: machine(machinistv1.MachineRunning, time.Hour),
			node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, 61*time.Second)), trust: old,
			known: true, reason: machinistv1.ReasonUnhealthyNodeCondition, unreachable: true, message: "Ready=Unknown"},
		{name: "not ready has its own timeout", m: machine(machinistv1.MachineRunning, time.Hour),
			node: node(cond(corev1.NodeReady, corev1.ConditionFalse, 90*time.Second)), trust: old,
			known: true, healthy: true, recheck: now.Add(30 * time.Second)},
		{name: "any condition type", m: machine(machinistv1.MachineRunning, time.Hour),
			node: node(ready, cond("KernelDeadlock", corev1.ConditionTrue, time.Second)), trust: old,
			known: true, reason: machinistv1.ReasonUnhealthyNodeCondition, message: "KernelDeadlock=True"},
		{name: "just started: stale conditions are not held against it", m: machine(machinistv1.MachineRunning, time.Hour),
			node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, time.Hour)), trust: trust{Since: now.Add(-10 * time.Second), Grace: 40 * time.Second},
			recheck: now.Add(30 * time.Second)},
		{name: "after the grace the clock starts at the start", m: machine(machinistv1.MachineRunning, time.Hour),
			node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, time.Hour)), trust: trust{Since: now.Add(-50 * time.Second), Grace: 40 * time.Second},
			known: true, healthy: true, unreachable: true, recheck: now.Add(10 * time.Second)},
		{name: "the grace does not hide a healthy node", m: machine(machinistv1.MachineRunning, time.Hour),
			node: node(ready), trust: trust{Since: now, Grace: 40 * time.Second}, known: true, healthy: true},
		{name: "just started: a node not listed yet is not held against it", m: machine(machinistv1.MachineRunning, time.Hour),
			trust: trust{Since: now.Add(-10 * time.Second), Grace: 40 * time.Second}, recheck: now.Add(30 * time.Second)},
		{name: "booted on its provider's word: waits for its node", m: unconfirmed(2 * time.Minute), trust: old,
			known: true, healthy: true, recheck: now.Add(8 * time.Minute), message: "waiting for its Node to report that boot"},
		{name: "booted on its provider's word: a stale node is not judged", m: unconfirmed(2 * time.Minute),
			node: node(cond(corev1.NodeReady, corev1.ConditionUnknown, time.Hour)), trust: old,
			known: true, healthy: true, recheck: now.Add(8 * time.Minute)},
		{name: "booted on its provider's word: the timeout counts from the return", m: unconfirmed(time.Hour),
			trust: trust{Since: now.Add(-time.Minute), Grace: 40 * time.Second}, known: true, healthy: true, recheck: now.Add(9 * time.Minute)},
		{name: "booted on its provider's word: no node past the startup timeout", m: unconfirmed(11 * time.Minute), trust: old,
			known: true, reason: machinistv1.ReasonNodeStartupTimeout, message: "no Node reported the boot its provider did"},
		{name: "a confirmed boot is judged as ever", m: func() *machinistv1.Machine {
			m := unconfirmed(time.Minute)
			m.Status.Conditions[0].Status, m.Status.Conditions[0].Reason = metav1.ConditionTrue, machinistv1.ReasonBootIDMatches
			return m
		}(), trust: old, known: true, reason: machinistv1.ReasonNodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judge(c, tc.m, tc.node, now, tc.trust)
			if v.known != tc.known || v.healthy != tc.healthy || v.unreachable != tc.unreachable || !v.recheck.Equal(tc.recheck) {
				t.Errorf("got known=%v healthy=%v unreachable=%v recheck=%v, want %v %v %v %v (%s)",
					v.known, v.healthy, v.unreachable, v.recheck, tc.known, tc.healthy, tc.unreachable, tc.recheck, v.message)
			}
			if tc.reason != "" && v.reason != tc.reason {
				t.Errorf("reason %q, want %q", v.reason, tc.reason)
			}
			if !strings.Contains(v.message, tc.message) {
				t.Errorf("message %q lacks %q", v.message, tc.message)
			}
		})
	}
}

func TestScaled(t *testing.T) {
	for _, tc := range []struct {
		v       string
		total   int
		roundUp bool
		want    int
	}{
		{"40%", 5, false, 2}, {"40%", 3, false, 1}, {"40%", 1, false, 0},
		{"20%", 1000, true, 200}, {"20%", 4, true, 1}, {"3", 10, true, 3}, {"100%", 7, false, 7},
	} {
		v := parse(tc.v)
		if got := scaled(&v, "", tc.total, tc.roundUp); got != tc.want {
			t.Errorf("%s of %d (round up %v) = %d, want %d", tc.v, tc.total, tc.roundUp, got, tc.want)
		}
	}
	if got := scaled(nil, "1", 50, true); got != 1 {
		t.Errorf("the default is used when unset: got %d", got)
	}
}

func TestWatchErrorRestartsTheGrace(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Now: func() time.Time { return now }, NodeGrace: 5 * time.Second}
	r.sawAPI(now.Add(-time.Hour))
	rf := toolscache.NewReflector(&toolscache.ListWatch{}, &corev1.Node{}, toolscache.NewStore(toolscache.MetaNamespaceKeyFunc), 0)

	r.WatchError(context.Background(), rf, apierrors.NewResourceExpired("too old resource version"))
	if got := r.trust(); !got.Since.Equal(now.Add(-time.Hour)) {
		t.Errorf("an expired resource version is routine, not an outage: trust since %v", got.Since)
	}
	r.WatchError(context.Background(), rf, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"))
	if got := r.trust(); !got.Since.Equal(now) || got.Grace != 5*time.Second {
		t.Errorf("a failed watch restarts the grace: trust %+v", got)
	}
}
