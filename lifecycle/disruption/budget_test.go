package disruption

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// machine is a Machine of pool "a" in namespace ns: Running and Ready
// unless changed.
func machine(name string, change ...func(*machinistv1.Machine)) machinistv1.Machine {
	m := machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"pool": "a"}}}
	m.Status.Phase = machinistv1.MachineRunning
	m.Status.NodeRef = &machinistv1.NodeReference{Name: name}
	m.Status.Conditions = []metav1.Condition{{Type: machinistv1.ConditionReady, Status: metav1.ConditionTrue}}
	for _, c := range change {
		c(&m)
	}
	return m
}

func fleet(n int, change map[int]func(*machinistv1.Machine)) []machinistv1.Machine {
	var ms []machinistv1.Machine
	for i := range n {
		if c, ok := change[i]; ok {
			ms = append(ms, machine(fmt.Sprintf("m%d", i), c))
		} else {
			ms = append(ms, machine(fmt.Sprintf("m%d", i)))
		}
	}
	return ms
}

func budget(max intstr.IntOrString, ledger ...machinistv1.Disruption) *machinistv1.MachineDisruptionBudget {
	return &machinistv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pool"},
		Spec: machinistv1.MachineDisruptionBudgetSpec{
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}, MaxDisrupted: max,
		},
		Status: machinistv1.MachineDisruptionBudgetStatus{Disruptions: ledger},
	}
}

var now = at("2026-12-01T12:00:00Z")

func admitted(name, op string, ago time.Duration) machinistv1.Disruption {
	return machinistv1.Disruption{Machine: name, Reason: machinistv1.DisruptionReboot, OperationID: op, Since: metav1.NewTime(now.Add(-ago))}
}

func operation(id string, state machinistv1.OperationState) func(*machinistv1.Machine) {
	return func(m *machinistv1.Machine) {
		m.Status.Operation = &machinistv1.Operation{ID: id, State: state}
	}
}

func TestEvaluate(t *testing.T) {
	notReady := func(m *machinistv1.Machine) { m.Status.Conditions[0].Status = metav1.ConditionFalse }
	phase := func(p machinistv1.MachinePhase) func(*machinistv1.Machine) {
		return func(m *machinistv1.Machine) { m.Status.Phase = p }
	}
	other := func(m *machinistv1.Machine) { m.Labels = map[string]string{"pool": "b"} }
	cases := []struct {
		name                              string
		budget                            *machinistv1.MachineDisruptionBudget
		machines                          []machinistv1.Machine
		selected, max, disrupted, allowed int32
		ledger                            int
	}{
		{name: "all up", budget: budget(intstr.FromInt32(2)), machines: fleet(10, nil),
			selected: 10, max: 2, allowed: 2},
		{name: "a percentage rounds up", budget: budget(intstr.FromString("15%")), machines: fleet(10, nil),
			selected: 10, max: 2, allowed: 2},
		{name: "0% allows nothing", budget: budget(intstr.FromString("0%")), machines: fleet(10, nil),
			selected: 10, max: 0, allowed: 0},
		{name: "only selected Machines count", budget: budget(intstr.FromInt32(2)), machines: fleet(10, map[int]func(*machinistv1.Machine){0: other, 1: other}),
			selected: 8, max: 2, allowed: 2},
		{name: "Machines down on their own count: not Ready, Failed, draining",
			budget:   budget(intstr.FromInt32(2)),
			machines: fleet(10, map[int]func(*machinistv1.Machine){0: notReady, 1: phase(machinistv1.MachineFailed), 2: phase(machinistv1.MachineDraining)}),
			selected: 10, max: 2, disrupted: 3, allowed: 0},
		{name: "Machines still coming up count for nothing",
			budget:   budget(intstr.FromInt32(2)),
			machines: fleet(10, map[int]func(*machinistv1.Machine){0: phase(machinistv1.MachinePending), 1: phase(machinistv1.MachineProvisioning)}),
			selected: 10, max: 2, allowed: 2},
		{name: "an admitted disruption counts before it shows",
			budget: budget(intstr.FromInt32(2), admitted("m3", "op3", time.Second)), machines: fleet(10, nil),
			selected: 10, max: 2, disrupted: 1, allowed: 1, ledger: 1},
		{name: "an admitted disruption that never showed lapses",
			budget: budget(intstr.FromInt32(2), admitted("m3", "op3", Pending)), machines: fleet(10, nil),
			selected: 10, max: 2, allowed: 2},
		{name: "an operation in flight keeps its disruption",
			budget:   budget(intstr.FromInt32(2), admitted("m3", "op3", time.Hour)),
			machines: fleet(10, map[int]func(*machinistv1.Machine){3: operation("op3", machinistv1.OperationRunning)}),
			selected: 10, max: 2, disrupted: 1, allowed: 1, ledger: 1},
		{name: "an operation that ended ends it",
			budget:   budget(intstr.FromInt32(2), admitted("m3", "op3", time.Minute)),
			machines: fleet(10, map[int]func(*machinistv1.Machine){3: operation("op3", machinistv1.OperationSucceeded)}),
			selected: 10, max: 2, allowed: 2},
		{name: "a failed operation that left the Machine down: counted as down, not twice",
			budget: budget(intstr.FromInt32(2), admitted("m3", "op3", time.Minute)),
			machines: fleet(10, map[int]func(*machinistv1.Machine){3: func(m *machinistv1.Machine) {
				operation("op3", machinistv1.OperationFailed)(m)
				m.Status.Phase = machinistv1.MachineFailed
			}}),
			selected: 10, max: 2, disrupted: 1, allowed: 1},
		{name: "a replaced Machine that is gone ends its disruption",
			budget:   budget(intstr.FromInt32(2), machinistv1.Disruption{Machine: "gone", Reason: machinistv1.DisruptionRollout, Since: metav1.NewTime(now)}),
			machines: fleet(10, nil), selected: 10, max: 2, allowed: 2},
		{name: "a Machine admitted and down counts once",
			budget:   budget(intstr.FromInt32(2), admitted("m0", "op0", time.Second)),
			machines: fleet(10, map[int]func(*machinistv1.Machine){0: operation("op0", machinistv1.OperationRunning), 1: notReady}),
			selected: 10, max: 2, disrupted: 2, allowed: 0, ledger: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := Evaluate(tc.budget, tc.machines, now)
			if err != nil {
				t.Fatal(err)
			}
			got := [4]int32{st.Selected, st.Max, st.Disrupted, st.Allowed}
			if want := [4]int32{tc.selected, tc.max, tc.disrupted, tc.allowed}; got != want {
				t.Errorf("selected, max, disrupted, allowed = %v, want %v", got, want)
			}
			if len(st.Disruptions) != tc.ledger {
				t.Errorf("%d disruptions kept, want %d: %+v", len(st.Disruptions), tc.ledger, st.Disruptions)
			}
		})
	}
}

func TestAClosedWindowAllowsNothing(t *testing.T) {
	b := budget(intstr.FromInt32(2))
	b.Spec.Windows = []machinistv1.DisruptionWindow{win("0 2 * * *", time.Hour, "")}
	st, err := Evaluate(b, fleet(10, nil), now)
	if err != nil {
		t.Fatal(err)
	}
	if st.Open || st.Allowed != 0 || !st.Next.Equal(at("2026-12-02T02:00:00Z")) {
		t.Errorf("open %v, allowed %d, next %s; want closed, 0, 2026-12-02T02:00:00Z", st.Open, st.Allowed, st.Next)
	}
	req := Request{Machine: &[]machinistv1.Machine{machine("m1")}[0], Reason: machinistv1.DisruptionReboot}
	r := refuse(b, st, req, now)
	if r == nil || r.RetryAfter != 14*time.Hour {
		t.Fatalf("refusal %+v, want one retrying after 14h", r)
	}
	// A Machine already down is not a new disruption: admitted anyway.
	down := machine("m1", func(m *machinistv1.Machine) { m.Status.Phase = machinistv1.MachineFailed })
	st, _ = Evaluate(b, []machinistv1.Machine{down}, now)
	if r := refuse(b, st, Request{Machine: &down, Reason: machinistv1.DisruptionRemediation}, now); r != nil {
		t.Errorf("a Failed Machine's remediation was refused: %s", r.Message)
	}
}

// The condition says which of the three holds, in the API's words.
func TestConditionSaysWhy(t *testing.T) {
	next := metav1.NewTime(at("2026-12-02T02:00:00Z"))
	for _, tc := range []struct {
		name   string
		status machinistv1.MachineDisruptionBudgetStatus
		want   metav1.ConditionStatus
		reason string
		says   string
	}{
		{"allowed", machinistv1.MachineDisruptionBudgetStatus{WindowOpen: true, DisruptionsAllowed: 2, SelectedMachines: 10},
			metav1.ConditionTrue, machinistv1.ReasonDisruptionAllowed, "2 more of 10 Machines may be disrupted"},
		{"spent", machinistv1.MachineDisruptionBudgetStatus{WindowOpen: true, SelectedMachines: 10, Disrupted: 2, MaxDisrupted: 2},
			metav1.ConditionFalse, machinistv1.ReasonBudgetSpent, "2 of 10 Machines are disrupted and 2 may be"},
		{"closed", machinistv1.MachineDisruptionBudgetStatus{DisruptionsAllowed: 0, SelectedMachines: 10, NextWindow: &next},
			metav1.ConditionFalse, machinistv1.ReasonWindowClosed, "no window is open; the next opens at 2026-12-02T02:00:00Z"},
	} {
		b := budget(intstr.FromInt32(2))
		b.Status = tc.status
		setCondition(b, now)
		c := meta.FindStatusCondition(b.Status.Conditions, machinistv1.ConditionDisruptionAllowed)
		if c == nil || c.Status != tc.want || c.Reason != tc.reason || c.Message != tc.says {
			t.Errorf("%s: condition %+v, want %s %s %q", tc.name, c, tc.want, tc.reason, tc.says)
		}
	}
}
