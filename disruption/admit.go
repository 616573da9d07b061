package disruption

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

// Request is a voluntary disruption of one Machine that someone wants.
type Request struct {
	// Machine is the Machine to disrupt.
	Machine *machinistv1.Machine
	// Reason is why.
	Reason machinistv1.DisruptionReason
	// OperationID is the reboot, repair or update to be recorded, if the
	// disruption is one; empty for a replacement.
	OperationID string
	// By names who asks, for the budget's record and messages.
	By string
	// Override admits the disruption whatever the budgets say, and still
	// records it, so that the others count it. Only for a requester
	// allowed to override (see the verbs server).
	Override bool
}

// Refusal is a disruption a budget does not allow now. It is an error.
type Refusal struct {
	// Budget is the refusing MachineDisruptionBudget's name.
	Budget string
	// RetryAfter is when asking again may succeed: when its window
	// opens, or a short while when the budget is spent.
	RetryAfter time.Duration
	// Message says why, for people.
	Message string
}

func (r *Refusal) Error() string { return r.Message }

// AsRefusal returns the Refusal in err's chain, if any.
func AsRefusal(err error) (*Refusal, bool) {
	var r *Refusal
	ok := errors.As(err, &r)
	return r, ok
}

// spentRetry is the Retry-After of a spent budget: a disruption ends in
// minutes, and a client asking once in a while is cheap.
const spentRetry = 10 * time.Second

// admitAttempts bounds the retries when another actor wrote a budget
// between reading and writing it.
const admitAttempts = 8

// Store is where Admit reads and writes.
type Store struct {
	// Budgets lists MachineDisruptionBudgets. It must read from the API
	// server, not a cache: the decision rests on each budget's latest
	// record, and the write that records it is conditional on the
	// resourceVersion read, so that two actors deciding at once cannot
	// both take the last allowance.
	Budgets client.Reader
	// Machines lists the Machines of a namespace; a cache will do, as
	// the record in the budgets, not the Machines, is what keeps two
	// actors from both taking the last allowance.
	Machines client.Reader
	// Status writes the budgets' status.
	Status client.StatusClient
}

// At reads calendar, the clock the budgets are asked on (their windows
// open and close on it), or time.Now when calendar is nil. A controller
// keeps its own clock for its own timeouts: only the budgets' calendar is
// moved by tests.
func At(calendar func() time.Time) time.Time {
	if calendar == nil {
		return time.Now()
	}
	return calendar()
}

// Direct is a Store that reads and writes through c alone, for a caller
// without a cache (the verbs server).
func Direct(c client.Client) Store { return Store{Budgets: c, Machines: c, Status: c} }

// Admit decides whether req may happen now, under every budget that
// selects its Machine and covers its reason, and records it in each of
// them. It returns nil when admitted (also when no budget applies), a
// *Refusal when a budget refuses, or another error.
//
// A Machine already out of service (down on its own, or already
// disrupted) is admitted whatever the budget's allowance or windows: a
// dead machine is not a disruption. A request already recorded (the same
// Machine and operation) is admitted again without a write.
func (s Store) Admit(ctx context.Context, req Request, now time.Time) error {
	var err error
	for range admitAttempts {
		if err = s.admit(ctx, req, now); !apierrors.IsConflict(err) {
			return err
		}
	}
	return fmt.Errorf("admitting the %s of Machine %s/%s: budgets kept changing: %w",
		strings.ToLower(string(req.Reason)), req.Machine.Namespace, req.Machine.Name, err)
}

// Allows decides as Admit does, without recording anything: for an actor
// that must not take a slot of its own (a health check's maxInFlight) for
// a disruption the budgets would only hold. The disruption, once begun,
// is admitted and recorded by Admit as any other; between the two another
// actor may take the allowance, and Admit then refuses.
func (s Store) Allows(ctx context.Context, req Request, now time.Time) error {
	_, _, err := s.decide(ctx, req, now)
	return err
}

func (s Store) admit(ctx context.Context, req Request, now time.Time) error {
	applicable, states, err := s.decide(ctx, req, now)
	if err != nil || len(applicable) == 0 {
		return err
	}
	m := req.Machine
	entry := machinistv1.Disruption{
		Machine: m.Name, Reason: req.Reason, Since: metav1.NewTime(now), OperationID: req.OperationID, By: req.By,
	}
	var reserved []*machinistv1.MachineDisruptionBudget
	for i, b := range applicable {
		if recorded(b, entry) {
			continue
		}
		record(b, states[i], entry, now)
		if err := s.Status.Status().Update(ctx, b); err != nil {
			return errors.Join(err, release(ctx, s.Status, reserved, m.Name))
		}
		reserved = append(reserved, b)
	}
	return nil
}

// decide reads the budgets that apply to req and their states at now, and
// returns the refusal of the one that holds out longest, if any refuses.
func (s Store) decide(ctx context.Context, req Request, now time.Time) ([]*machinistv1.MachineDisruptionBudget, []State, error) {
	m := req.Machine
	var budgets machinistv1.MachineDisruptionBudgetList
	if err := s.Budgets.List(ctx, &budgets, client.InNamespace(m.Namespace)); err != nil {
		return nil, nil, err
	}
	var applicable []*machinistv1.MachineDisruptionBudget
	for i := range budgets.Items {
		b := &budgets.Items[i]
		ok, err := Selects(b, m)
		if err != nil {
			return nil, nil, err
		}
		if ok && Covers(b, req.Reason) {
			applicable = append(applicable, b)
		}
	}
	if len(applicable) == 0 {
		return nil, nil, nil
	}
	var machines machinistv1.MachineList
	if err := s.Machines.List(ctx, &machines, client.InNamespace(m.Namespace)); err != nil {
		return nil, nil, err
	}
	// Ordered by name, so that two actors reserving in several budgets
	// take them in the same order.
	slices.SortFunc(applicable, func(a, b *machinistv1.MachineDisruptionBudget) int { return strings.Compare(a.Name, b.Name) })
	states := make([]State, len(applicable))
	var refusals []*Refusal
	for i, b := range applicable {
		st, err := Evaluate(b, machines.Items, now)
		if err != nil {
			return nil, nil, err
		}
		states[i] = st
		if r := refuse(b, st, req, now); r != nil {
			refusals = append(refusals, r)
		}
	}
	if len(refusals) > 0 {
		// The one that holds out longest is the one to name.
		slices.SortStableFunc(refusals, func(a, b *Refusal) int { return int(b.RetryAfter - a.RetryAfter) })
		return nil, nil, refusals[0]
	}
	return applicable, states, nil
}

// recorded reports whether b already holds entry's disruption: the same
// Machine, reason and operation.
func recorded(b *machinistv1.MachineDisruptionBudget, entry machinistv1.Disruption) bool {
	return slices.ContainsFunc(b.Status.Disruptions, func(d machinistv1.Disruption) bool {
		return d.Machine == entry.Machine && d.Reason == entry.Reason && d.OperationID == entry.OperationID
	})
}

// refuse is b's refusal of req, or nil when b allows it.
func refuse(b *machinistv1.MachineDisruptionBudget, st State, req Request, now time.Time) *Refusal {
	m := req.Machine
	if st.Out(m.Name) || req.Override {
		return nil
	}
	what := fmt.Sprintf("the %s of Machine %s/%s", strings.ToLower(string(req.Reason)), m.Namespace, m.Name)
	if req.Reason == machinistv1.DisruptionInPlaceUpdate {
		what = fmt.Sprintf("the in-place update of Machine %s/%s", m.Namespace, m.Name)
	}
	if !st.Open {
		return &Refusal{Budget: b.Name, RetryAfter: max(time.Second, st.Next.Sub(now)), Message: fmt.Sprintf(
			"MachineDisruptionBudget %s allows no disruption now: %s waits for its next window, which opens at %s",
			b.Name, what, st.Next.UTC().Format(time.RFC3339))}
	}
	if st.Allowed < 1 {
		return &Refusal{Budget: b.Name, RetryAfter: spentRetry, Message: fmt.Sprintf(
			"MachineDisruptionBudget %s allows no more disruptions: %d of its %d Machines are disrupted and it allows %d; %s waits until one is back",
			b.Name, st.Disrupted, st.Selected, st.Max, what)}
	}
	return nil
}

// record adds entry to b's status (replacing an earlier one for the same
// Machine) with the counts it makes.
func record(b *machinistv1.MachineDisruptionBudget, st State, entry machinistv1.Disruption, now time.Time) {
	ledger := slices.DeleteFunc(slices.Clone(st.Disruptions), func(d machinistv1.Disruption) bool { return d.Machine == entry.Machine })
	ledger = append(ledger, entry)
	disrupted := st.Disrupted
	if !st.Out(entry.Machine) {
		disrupted++
	}
	fill(b, st, ledger, disrupted, now)
}

// fill writes a state into b's status.
func fill(b *machinistv1.MachineDisruptionBudget, st State, ledger []machinistv1.Disruption, disrupted int32, now time.Time) {
	s := &b.Status
	s.ObservedGeneration = b.Generation
	s.SelectedMachines, s.MaxDisrupted, s.Disrupted = st.Selected, st.Max, disrupted
	s.DisruptionsAllowed = 0
	if st.Open {
		s.DisruptionsAllowed = max(0, st.Max-disrupted)
	}
	s.WindowOpen = st.Open
	s.NextWindow = nil
	if !st.Next.IsZero() {
		t := metav1.NewTime(st.Next.UTC().Truncate(time.Second))
		s.NextWindow = &t
	}
	slices.SortFunc(ledger, func(a, b machinistv1.Disruption) int { return strings.Compare(a.Machine, b.Machine) })
	s.Disruptions = ledger
	setCondition(b, now)
}

// release takes name out of the budgets it was just recorded in, when a
// later budget could not be written: best effort, as a lapsed record ends
// by itself after Pending.
func release(ctx context.Context, c client.StatusClient, budgets []*machinistv1.MachineDisruptionBudget, name string) error {
	var errs []error
	for _, b := range budgets {
		b.Status.Disruptions = slices.DeleteFunc(b.Status.Disruptions, func(d machinistv1.Disruption) bool { return d.Machine == name })
		if err := c.Status().Update(ctx, b); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Release removes the record of req's Machine from every budget, for an
// actor that was admitted and then could not carry the disruption out.
// Best effort: a record nobody releases lapses after Pending.
func (s Store) Release(ctx context.Context, req Request) error {
	var budgets machinistv1.MachineDisruptionBudgetList
	if err := s.Budgets.List(ctx, &budgets, client.InNamespace(req.Machine.Namespace)); err != nil {
		return err
	}
	var holding []*machinistv1.MachineDisruptionBudget
	for i := range budgets.Items {
		b := &budgets.Items[i]
		if slices.ContainsFunc(b.Status.Disruptions, func(d machinistv1.Disruption) bool {
			return d.Machine == req.Machine.Name && d.OperationID == req.OperationID
		}) {
			holding = append(holding, b)
		}
	}
	return release(ctx, s.Status, holding, req.Machine.Name)
}
