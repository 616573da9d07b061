// Package operation is the request protocol of a Machine's operations
// (reboot, repair, update): whether one may start now (Admit), how it is
// recorded in the Machine's status for the Machine controller to carry out
// (Request), and whether a recorded one is still to be done (InFlight).
// The verbs server, the health checks, the deployment controller and the
// Machine controller all speak it; it imports no controller, so that none
// of them has to import another to ask.
package operation

import (
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/phases"
)

// ErrRefused matches (errors.Is) every reason an operation cannot start
// now: the Machine's phase does not allow it, it is being deleted, or
// another operation is in flight. The verbs server answers it with 409
// Conflict.
var ErrRefused = errors.New("refused")

// refusal is an error that is ErrRefused without repeating its text.
type refusal struct{ msg string }

func (r refusal) Error() string        { return r.msg }
func (r refusal) Is(target error) bool { return target == ErrRefused }

func refuse(format string, args ...any) error { return refusal{fmt.Sprintf(format, args...)} }

// InFlight reports whether op is still to be carried out.
func InFlight(op *machinistv1.Operation) bool {
	return op != nil && (op.State == machinistv1.OperationPending || op.State == machinistv1.OperationRunning)
}

// Held reports whether op is pending because a disruption budget does not
// allow it yet.
func Held(op *machinistv1.Operation) bool {
	return op != nil && op.State == machinistv1.OperationPending && op.Reason == machinistv1.ReasonDisruptionHeld
}

// Drains reports whether an operation of typ with opts empties the Machine
// first: always for an update, and for a reboot or repair unless asked
// not to.
func Drains(typ machinistv1.OperationType, opts *machinistv1.OperationOptions) bool {
	return typ == machinistv1.OperationUpdate || opts == nil || opts.SkipDrain == nil || !*opts.SkipDrain
}

// FirstEvent is the event that starts an operation on a Machine in phase:
// the state machine, not the caller, decides whether the phase allows it.
// A Failed Machine is repaired without a drain; a drain is how a Running
// one is emptied first.
func FirstEvent(typ machinistv1.OperationType, opts *machinistv1.OperationOptions, phase machinistv1.MachinePhase) phases.Event {
	switch {
	case typ == machinistv1.OperationRepair && phase == machinistv1.MachineFailed:
		return phases.Repair
	case Drains(typ, opts):
		return phases.Drain
	case typ == machinistv1.OperationRepair:
		return phases.Repair
	}
	return phases.Reboot
}

// Deadline is when the operation in flight gives up, from its own
// timeoutSeconds; zero when it has none.
func Deadline(op *machinistv1.Operation) time.Time {
	if !InFlight(op) || op.StartedAt == nil || op.Options == nil || op.Options.TimeoutSeconds == nil {
		return time.Time{}
	}
	return op.StartedAt.Add(time.Duration(*op.Options.TimeoutSeconds) * time.Second)
}

// Admit reports why an operation of typ cannot start on m now, or nil if it
// can. Every error wraps ErrRefused and says what to wait for.
func Admit(m *machinistv1.Machine, typ machinistv1.OperationType, opts *machinistv1.OperationOptions) error {
	verb := Verb(typ)
	if !m.DeletionTimestamp.IsZero() {
		return refuse("machine %q is being deleted and cannot be %s", m.Name, PastTense(verb))
	}
	if op := m.Status.Operation; InFlight(op) {
		return refuse("machine %q already has %s operation %s in flight (%s); wait for it to finish",
			m.Name, Verb(op.Type), op.ID, op.State)
	}
	phase := m.Status.Phase
	if phase == "" {
		phase = phases.Initial
	}
	if e := FirstEvent(typ, opts, phase); !phases.New(phase).Can(e) {
		from := phases.Table.From(e)
		if typ == machinistv1.OperationRepair && Drains(typ, opts) {
			from = append(phases.Table.From(phases.Drain), machinistv1.MachineFailed)
		}
		return refuse("machine %q is %s; a %s can start only when it is %s",
			m.Name, phase, verb, joinPhases(from))
	}
	if phase == machinistv1.MachineFailed && m.Status.ProviderID == "" {
		reason, _ := m.Status.Failure()
		return refuse("machine %q is Failed before it had an instance (%s); there is nothing to %s: delete it",
			m.Name, reason, verb)
	}
	return nil
}

// AdmitUnseen refuses an operation that drains a Machine whose cluster
// cannot be reached; unseen says why ("" when it can be). Pods cannot be
// evicted through an API that does not answer, so going on without a drain
// must be the requester's choice, which the error names.
func AdmitUnseen(m *machinistv1.Machine, typ machinistv1.OperationType, opts *machinistv1.OperationOptions, unseen string) error {
	if unseen == "" || !Drains(typ, opts) {
		return nil
	}
	verb := Verb(typ)
	if typ == machinistv1.OperationUpdate {
		return refuse("machine %q cannot be drained for an update: %s, and pods cannot be evicted through an API that does not answer",
			m.Name, unseen)
	}
	return refuse("machine %q cannot be drained: %s, and pods cannot be evicted through an API that does not answer; "+
		"to %s it without a drain, its pods dying with it, ask with drain: false (kubectl machine %s %s --no-drain)",
		m.Name, unseen, verb, verb, m.Name)
}

// Request records a new operation in m's status as Pending. The caller
// writes the status; the Machine controller carries the operation out.
func Request(m *machinistv1.Machine, typ machinistv1.OperationType, opts *machinistv1.OperationOptions,
	source machinistv1.OperationSource, user string, now time.Time) (*machinistv1.Operation, error) {
	if err := Admit(m, typ, opts); err != nil {
		return nil, err
	}
	at := metav1.NewTime(now)
	op := &machinistv1.Operation{
		Type:        typ,
		ID:          newID(typ),
		State:       machinistv1.OperationPending,
		RequestedBy: user,
		RequestedAt: &at,
		Options:     opts,
		Source:      source,
		BootID:      m.Status.BootID,
		Message:     "waiting for the Machine controller",
	}
	m.Status.Operation = op
	return op, nil
}

// newID is short enough to type and random enough that two requests on
// one Machine never share one.
func newID(typ machinistv1.OperationType) string {
	return Verb(typ) + "-" + rand.String(10)
}

// Verb is the word a person uses for an operation of typ.
func Verb(typ machinistv1.OperationType) string {
	switch typ {
	case machinistv1.OperationReboot:
		return "reboot"
	case machinistv1.OperationRepair:
		return "repair"
	case machinistv1.OperationUpdate:
		return "update"
	}
	return string(typ)
}

// PastTense turns a verb of Verb into its past tense: rebooted, repaired.
func PastTense(verb string) string { return strings.TrimSuffix(verb, "e") + "ed" }

// Gerund turns a verb of Verb into its -ing form: rebooting, updating.
func Gerund(verb string) string { return strings.TrimSuffix(verb, "e") + "ing" }

func joinPhases(ps []machinistv1.MachinePhase) string {
	out := ""
	for i, p := range ps {
		switch {
		case i == 0:
		case i == len(ps)-1:
			out += " or "
		default:
			out += ", "
		}
		out += string(p)
	}
	return out
}
