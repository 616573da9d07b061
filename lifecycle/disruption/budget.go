// Package disruption decides whether a Machine may be disrupted on
// purpose now, by the MachineDisruptionBudgets that select it, and keeps
// each budget's status: how many of its Machines are out of service, how
// many more may go, and when its next window opens.
//
// Every voluntary path asks through Admit, the one piece of code they
// share, so that none can forget a budget; an admitted disruption is
// recorded in the budget's status the moment it is decided, so that the
// other paths, and a restarted manager, count it. docs/disruption.md
// explains the model.
package disruption

import (
	"fmt"
	"math"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Pending is how long an admitted disruption counts without showing on
// its Machine (its operation recorded, or its deletion begun): an actor
// that was admitted and then stopped must not hold the budget for ever.
const Pending = 2 * time.Minute

// State is a budget's standing at one moment.
type State struct {
	// Selected counts the Machines the budget selects.
	Selected int32
	// Max is spec.maxDisrupted resolved against Selected.
	Max int32
	// Disrupted counts the selected Machines out of service: admitted
	// disruptions not over, and Machines down on their own.
	Disrupted int32
	// Allowed is how many more may be disrupted now (0 outside windows).
	Allowed int32
	// Open reports whether a window is open (true without windows).
	Open bool
	// Next is when the next window opens, while none is.
	Next time.Time
	// Changes is the next time the state changes by itself: a window
	// opening or closing, an admitted disruption that lapses.
	Changes time.Time
	// Disruptions are the admitted disruptions not over.
	Disruptions []machinistv1.Disruption
	// out lists the Machines counted as disrupted, by name.
	out map[string]bool
}

// Out reports whether the Machine called name is counted as disrupted.
func (s State) Out(name string) bool { return s.out[name] }

// Selects reports whether b selects m.
func Selects(b *machinistv1.MachineDisruptionBudget, m *machinistv1.Machine) (bool, error) {
	sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector.AsMeta())
	if err != nil {
		return false, fmt.Errorf("MachineDisruptionBudget %s: %w", b.Name, err)
	}
	return b.Namespace == m.Namespace && sel.Matches(labels.Set(m.Labels)), nil
}

// Covers reports whether b limits disruptions for reason.
func Covers(b *machinistv1.MachineDisruptionBudget, reason machinistv1.DisruptionReason) bool {
	return len(b.Spec.Reasons) == 0 || slices.Contains(b.Spec.Reasons, reason)
}

// Evaluate works out b's state over the Machines of its namespace at now.
func Evaluate(b *machinistv1.MachineDisruptionBudget, machines []machinistv1.Machine, now time.Time) (State, error) {
	st := State{out: map[string]bool{}}
	open, next, changes, err := Windows(b.Spec.Windows, now)
	if err != nil {
		return st, fmt.Errorf("MachineDisruptionBudget %s: %w", b.Name, err)
	}
	st.Open, st.Next, st.Changes = open, next, changes
	byName := map[string]*machinistv1.Machine{}
	for i := range machines {
		m := &machines[i]
		ok, err := Selects(b, m)
		if err != nil {
			return st, err
		}
		if ok {
			byName[m.Name] = m
			st.Selected++
		}
	}
	st.Max = resolve(b.Spec.MaxDisrupted, st.Selected)
	for _, d := range b.Status.Disruptions {
		m := byName[d.Machine]
		over, lapses := ended(d, m, now)
		if over {
			continue
		}
		st.Disruptions = append(st.Disruptions, d)
		st.out[d.Machine] = true
		st.Changes = earliest(st.Changes, lapses)
	}
	for name, m := range byName {
		if !st.out[name] && down(m) {
			st.out[name] = true
		}
	}
	st.Disrupted = int32(len(st.out))
	if st.Open {
		st.Allowed = max(0, st.Max-st.Disrupted)
	}
	return st, nil
}

// resolve turns maxDisrupted into a count: a percentage of selected,
// rounded up, as a PodDisruptionBudget's maxUnavailable is.
func resolve(v intstr.IntOrString, selected int32) int32 {
	if v.Type == intstr.Int {
		return max(0, v.IntVal)
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, int(selected), true)
	if err != nil || n < 0 {
		// CEL admits only 0%–100%; anything else allows nothing.
		return 0
	}
	return int32(min(n, math.MaxInt32))
}

// ended reports whether the admitted disruption d of m is over, and when
// not, when it lapses if nothing shows of it by then (zero: never).
func ended(d machinistv1.Disruption, m *machinistv1.Machine, now time.Time) (bool, time.Time) {
	if m == nil {
		// Deleted (a replacement), or no longer selected: either way no
		// longer this budget's.
		return true, time.Time{}
	}
	lapse := d.Since.Add(Pending)
	if d.OperationID != "" {
		op := m.Status.Operation
		if op != nil && op.ID == d.OperationID {
			if op.State == machinistv1.OperationSucceeded || op.State == machinistv1.OperationFailed {
				// Over; a Machine the operation left down counts
				// as down on its own.
				return true, time.Time{}
			}
			return false, time.Time{}
		}
		// Not recorded yet (the admitting actor writes it next), or
		// never will be.
		return !now.Before(lapse), lapse
	}
	// A replacement or an expiry: over when the Machine is gone.
	if m.DeletionTimestamp != nil {
		return false, time.Time{}
	}
	return !now.Before(lapse), lapse
}

// down reports whether m, which has run, is out of service on its own:
// Failed, being deleted, busy with an operation, or not Ready. A Machine
// still coming up (Pending, Provisioning) is not part of the pool yet and
// counts for nothing.
func down(m *machinistv1.Machine) bool {
	switch m.Status.Phase {
	case "", machinistv1.MachinePending, machinistv1.MachineProvisioning:
		return m.DeletionTimestamp != nil && m.Status.NodeRef != nil
	case machinistv1.MachineRunning:
		return m.DeletionTimestamp != nil || !meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionReady)
	default:
		return true
	}
}

func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}
