package disruption

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/outcome"
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
	// Budget is the refusing MachineDisruptionBudget's name; empty when
	// the budgets were too busy with other writers to decide.
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

// contention is how Admit retries when another process wrote a budget
// between its read and its write (actors in one process take turns, see
// take): spread out, as the Eviction API retries a PodDisruptionBudget,
// and bounded, a little over 2 s in all.
var contention = wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Jitter: 1, Steps: 9, Cap: 500 * time.Millisecond}

// busyRetry is the Retry-After of a request that lost every retry to
// other writers of its budgets.
const busyRetry = time.Second

// turns holds, per namespace, the turn of this process's actors to decide
// and record a disruption there: without it, actors of one process
// deciding at once would all read the same budget and all but one lose
// the conditional write, again and again (a hundred reboots at once lost
// three in four). Across processes the conditional write still decides.
var turns sync.Map // namespace -> chan struct{}, holding one token when taken

// take waits for the turn of namespace ns, and returns its release.
func take(ctx context.Context, ns string) (func(), error) {
	v, _ := turns.LoadOrStore(ns, make(chan struct{}, 1))
	turn := v.(chan struct{})
	select {
	case turn <- struct{}{}:
		return func() { <-turn }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

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
	// Cache, when set, is a cache of the budgets looked at first: when it
	// holds none that applies, the request is admitted without a read of
	// the API server, which otherwise every disruption pays, budgets or
	// not. A budget created a moment ago and not yet in the cache does not
	// hold that disruption, as if it had been created a moment later.
	Cache client.Reader
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

// Cached is a controller's Store: c, its cache-backed client, reads the
// Machines and writes the budgets' status, and is looked at first for
// budgets, which api, reading past the cache, then lists when one applies.
func Cached(api client.Reader, c client.Client) Store {
	return Store{Budgets: api, Machines: c, Status: c, Cache: c}
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
//
// Contention is not an error: a request that keeps losing the write of
// its budgets to other processes is refused for busyRetry, so that the
// verbs answer 429 and a controller looks again soon.
func (s Store) Admit(ctx context.Context, req Request, now time.Time) error {
	var err error
	backoff := contention
	for backoff.Steps > 0 {
		release, terr := take(ctx, req.Machine.Namespace)
		if terr != nil {
			return terr
		}
		err = s.admit(ctx, req, now)
		release()
		if !apierrors.IsConflict(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff.Step()):
		}
	}
	return &Refusal{RetryAfter: busyRetry, Message: fmt.Sprintf(
		"the disruption budgets of namespace %s are busy: the %s of Machine %s/%s lost %d writes in a row to other writers; try again",
		req.Machine.Namespace, strings.ToLower(string(req.Reason)), req.Machine.Namespace, req.Machine.Name, contention.Steps)}
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
			rerr := release(ctx, s.Status, reserved, m.Name)
			if outcome.Unknown(err) {
				// The record may be stored although the caller hears
				// a failure and will not carry the disruption out:
				// take it back wherever it is, or it would hold a slot
				// (for as long as a pending operation of this ID is
				// held, which may be long). A record stored later
				// still (a 504's) lapses after Pending.
				rerr = errors.Join(rerr, s.Release(ctx, req))
			}
			return errors.Join(err, rerr)
		}
		reserved = append(reserved, b)
	}
	return nil
}

// decide reads the budgets that apply to req and their states at now, and
// returns the refusal of the one that holds out longest, if any refuses.
func (s Store) decide(ctx context.Context, req Request, now time.Time) ([]*machinistv1.MachineDisruptionBudget, []State, error) {
	m := req.Machine
	if s.Cache != nil {
		cached, err := applying(ctx, s.Cache, req)
		if err != nil || len(cached) == 0 {
			return nil, nil, err
		}
	}
	applicable, err := applying(ctx, s.Budgets, req)
	if err != nil || len(applicable) == 0 {
		return nil, nil, err
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

// applying lists through r the budgets of req's namespace that select its
// Machine and cover its reason.
func applying(ctx context.Context, r client.Reader, req Request) ([]*machinistv1.MachineDisruptionBudget, error) {
	var budgets machinistv1.MachineDisruptionBudgetList
	if err := r.List(ctx, &budgets, client.InNamespace(req.Machine.Namespace)); err != nil {
		return nil, err
	}
	var out []*machinistv1.MachineDisruptionBudget
	for i := range budgets.Items {
		b := &budgets.Items[i]
		ok, err := Selects(b, req.Machine)
		if err != nil {
			return nil, err
		}
		if ok && Covers(b, req.Reason) {
			out = append(out, b)
		}
	}
	return out, nil
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
	if req.Reason == machinistv1.DisruptionUpdate {
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
	Fill(b, st, ledger, disrupted, now)
}

// Fill writes a state into b's status: the counts, the window, the
// ledger of disruptions sorted by Machine, and DisruptionAllowed.
func Fill(b *machinistv1.MachineDisruptionBudget, st State, ledger []machinistv1.Disruption, disrupted int32, now time.Time) {
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
