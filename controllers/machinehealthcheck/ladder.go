package machinehealthcheck

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
	"github.com/machinist-dev/machinist/lifecycle/operation"
)

// Event reasons of remediation, on the Machine.
const (
	reasonUnhealthy = "MachineUnhealthy"
	reasonStarted   = "RemediationStarted"
	reasonSucceeded = "RemediationSucceeded"
	reasonFailed    = "RemediationFailed"
	reasonSkipped   = "RemediationSkipped"
	reasonExhausted = "RemediationExhausted"
	reasonHealed    = "MachineHealthy"
)

// Outcomes of a rung, for the metrics.
const (
	outcomeStarted   = "started"
	outcomeSucceeded = "succeeded"
	outcomeFailed    = "failed"
	outcomeSkipped   = "skipped"
)

// step moves one Machine's remediation by what the verdict and its
// operation say. One handler per phase; an unknown verdict moves nothing.
func (r *Reconciler) step(p *pass, t *target) error {
	if !t.v.known {
		return nil
	}
	switch t.fsm.State() {
	case machinistv1.RemediationHealthy, machinistv1.RemediationRecovered:
		if t.v.healthy {
			return nil
		}
		if err := r.detect(p, t); err != nil {
			return err
		}
		return r.start(p, t)
	case machinistv1.RemediationUnhealthy:
		if t.v.healthy {
			t.note(corev1.EventTypeNormal, reasonHealed, "passes its checks again before any remediation: %s", t.v.message)
			rem := t.m.Status.Remediation
			rem.Message = "healed by itself"
			return t.fire(Heal)
		}
		return r.start(p, t)
	case machinistv1.RemediationRebooting, machinistv1.RemediationRepairing:
		return r.climb(p, t)
	case machinistv1.RemediationExhausted:
		if t.v.healthy {
			return r.recover(p, t, "passes its checks again after the ladder ran out")
		}
	}
	return nil
}

// remediation returns the Machine's remediation record, made this health
// check's.
func (t *target) remediation(hc *machinistv1.MachineHealthCheck) *machinistv1.MachineRemediation {
	rem := t.m.Status.Remediation
	if rem == nil {
		rem = &machinistv1.MachineRemediation{Phase: machinistv1.RemediationHealthy}
		t.m.Status.Remediation = rem
	}
	rem.HealthCheck = hc.Name
	return rem
}

func (t *target) fire(e Event) error {
	_, to, err := t.fsm.Fire(e)
	if err != nil {
		return err
	}
	t.m.Status.Remediation.Phase = to
	return nil
}

// detect records that the Machine fails its checks.
func (r *Reconciler) detect(p *pass, t *target) error {
	rem := t.remediation(p.hc)
	if err := t.fire(Detect); err != nil {
		return err
	}
	rem.UnhealthySince = &metav1.Time{Time: p.now}
	rem.RungStartedAt, rem.OperationID, rem.Action = nil, "", ""
	rem.Message = t.v.message
	t.note(corev1.EventTypeWarning, reasonUnhealthy, "%s", t.v.message)
	return nil
}

// start begins the ladder of an unhealthy Machine when the limits allow:
// on the first rung, or, within the cooldown of an earlier recovery, on
// the rung after the one that healed it then.
func (r *Reconciler) start(p *pass, t *target) error {
	rem := t.m.Status.Remediation
	if p.held != "" {
		rem.Message = "waiting: " + p.held
		return nil
	}
	if op := t.m.Status.Operation; operation.InFlight(op) {
		rem.Message = fmt.Sprintf("waiting for %s %s, requested by %s, to finish", op.Type, op.ID, orSomeone(op.RequestedBy))
		return nil
	}
	if p.slots <= 0 {
		rem.Message = fmt.Sprintf("waiting for a free slot: maxInFlight (%s) remediations are in flight", inFlightLimit(p.hc))
		return nil
	}
	// Asked before a slot is taken: a rung the budgets would only hold
	// must not keep a Machine they would let through (a dead one) waiting.
	refusal, err := p.allows(t.m)
	if err != nil {
		return err
	}
	if refusal != nil {
		msg := "waiting: " + refusal.Message
		if !heldBy(rem.Message, refusal) {
			t.note(corev1.EventTypeNormal, machinistv1.ReasonDisruptionHeld, "not starting the remediation of Machine %s yet: %s", t.m.Name, refusal.Message)
		}
		rem.Message = msg
		p.after(p.now.Add(refusal.RetryAfter))
		return nil
	}
	p.slots--
	first := int32(0)
	if rem.RecoveredAt != nil && rem.UnhealthySince != nil &&
		rem.UnhealthySince.Before(&metav1.Time{Time: rem.RecoveredAt.Add(cooldown(p.hc))}) {
		first = rem.Rung + 1
		t.note(corev1.EventTypeNormal, reasonStarted, "unhealthy again within the cooldown (%s) of the recovery at %s: starting on rung %d",
			cooldown(p.hc), rem.RecoveredAt.UTC().Format(time.RFC3339), first+1)
	}
	return r.rung(p, t, first)
}

// rung starts rung i of the ladder, or the first after it that the
// Machine can take; with none left, the ladder is exhausted.
func (r *Reconciler) rung(p *pass, t *target, i int32) error {
	rem := t.m.Status.Remediation
	for ; int(i) < len(p.ladder); i++ {
		why, err := r.begin(p, t, i)
		if err != nil || why == "" {
			return err
		}
		action := p.ladder[i].Action
		t.note(corev1.EventTypeNormal, reasonSkipped, "rung %d of %d (%s) skipped: %s", i+1, len(p.ladder), action, why)
		t.count(action, outcomeSkipped)
	}
	if err := t.fire(Exhaust); err != nil {
		return err
	}
	rem.RungStartedAt, rem.OperationID = nil, ""
	rem.Message = "every rung was tried or skipped and the Machine still fails its checks; a person must look: " + t.v.message
	t.note(corev1.EventTypeWarning, reasonExhausted, "%s", rem.Message)
	return nil
}

// begin starts rung i, or says why the Machine cannot take it.
func (r *Reconciler) begin(p *pass, t *target, i int32) (skipped string, err error) {
	m, rem, step := t.m, t.m.Status.Remediation, p.ladder[i]
	var what string
	switch step.Action {
	case machinistv1.RemediateReplace:
		owner := metav1.GetControllerOf(m)
		if owner == nil || owner.Kind != "MachineSet" {
			return "no MachineSet owns the Machine, so nothing would make a new one: it is never replaced", nil
		}
		what = fmt.Sprintf("deleting the Machine so that MachineSet %s makes a new one", owner.Name)
	default:
		typ, opts := machinistv1.OperationReboot, &machinistv1.OperationOptions{}
		if step.Action == machinistv1.RemediateRepair {
			typ = machinistv1.OperationRepair
		} else {
			opts.Mode = step.Mode
			if opts.Mode == "" {
				opts.Mode = machinistv1.RebootSoft
			}
			if t.v.unreachable {
				// Nothing on the machine answers: a soft reboot would
				// not be heard, and evictions would never finish.
				opts.Mode, opts.SkipDrain = machinistv1.RebootHard, ptr.To(true)
			}
		}
		if step.Timeout != nil {
			opts.TimeoutSeconds = ptr.To(int64(max(step.Timeout.Duration.Round(time.Second)/time.Second, 1)))
		}
		opts.Reason = machinistv1.Shorten(fmt.Sprintf("machinehealthcheck %s: %s", p.hc.Name, t.v.message), 256)
		op, err := operation.Request(m, typ, opts, machinistv1.SourceHealthCheck, RequestedBy(p.hc.Name), p.now)
		if err != nil {
			return err.Error(), nil
		}
		rem.OperationID = op.ID
		what = fmt.Sprintf("%s %s", op.Type, op.ID)
		if opts.Mode != "" {
			what += fmt.Sprintf(" (%s", opts.Mode)
			if opts.SkipDrain != nil && *opts.SkipDrain {
				what += ", no drain: the Node is unreachable"
			}
			what += ")"
		}
	}
	if err := t.fire(eventOf(step.Action)); err != nil {
		return "", err
	}
	if step.Action == machinistv1.RemediateReplace {
		rem.OperationID = ""
	}
	rem.Rung, rem.Action, rem.RungStartedAt = i, step.Action, &metav1.Time{Time: p.now}
	rem.Message = fmt.Sprintf("rung %d of %d: %s", i+1, len(p.ladder), what)
	t.note(corev1.EventTypeNormal, reasonStarted, "%s, because %s", rem.Message, t.v.message)
	t.count(step.Action, outcomeStarted)
	return "", nil
}

// climb follows a Reboot or Repair rung in progress: it ends when its
// operation has ended and the checks pass again, or hands over to the next
// rung when the operation failed or the timeout passed without them
// passing.
func (r *Reconciler) climb(p *pass, t *target) error {
	rem := t.m.Status.Remediation
	op := t.m.Status.Operation
	if operation.InFlight(op) {
		return nil
	}
	if t.v.healthy {
		return r.recover(p, t, fmt.Sprintf("rung %d (%s) brought the Machine back", rem.Rung+1, rem.Action))
	}
	ours := op != nil && op.ID == rem.OperationID
	var why string
	switch {
	case ours && op.State == machinistv1.OperationSucceeded:
		until := rem.RungStartedAt.Add(rungTimeout(p.ladder, rem.Rung))
		if p.now.Before(until) {
			p.after(until)
			rem.Message = fmt.Sprintf("rung %d of %d: %s %s succeeded; waiting until %s for the Machine to pass its checks",
				rem.Rung+1, len(p.ladder), op.Type, op.ID, until.UTC().Format(time.RFC3339))
			return nil
		}
		why = fmt.Sprintf("%s %s succeeded, but the Machine still fails its checks: %s", op.Type, op.ID, t.v.message)
	case ours:
		why = fmt.Sprintf("%s %s failed: %s", op.Type, op.ID, op.Message)
	default:
		why = "its operation was replaced by another, and the Machine still fails its checks"
	}
	t.note(corev1.EventTypeWarning, reasonFailed, "rung %d of %d (%s) did not bring the Machine back: %s",
		rem.Rung+1, len(p.ladder), rem.Action, why)
	t.count(rem.Action, outcomeFailed)
	return r.rung(p, t, rem.Rung+1)
}

// recover ends the ladder of a Machine that passes its checks again.
func (r *Reconciler) recover(p *pass, t *target, how string) error {
	rem := t.m.Status.Remediation
	if err := t.fire(Recover); err != nil {
		return err
	}
	rem.RecoveredAt = &metav1.Time{Time: p.now}
	rem.Message = how
	took := ""
	if rem.UnhealthySince != nil {
		took = fmt.Sprintf(" %s after it was found unhealthy", p.now.Sub(rem.UnhealthySince.Time).Round(time.Second))
	}
	t.note(corev1.EventTypeNormal, reasonSucceeded, "%s%s: %s", how, took, t.v.message)
	if rem.UnhealthySince != nil {
		t.healed = p.now.Sub(rem.UnhealthySince.Time)
	}
	t.count(rem.Action, outcomeSucceeded)
	return nil
}

// rungTimeout is how long rung i may take; a rung without one (Replace)
// has 10 minutes.
func rungTimeout(ladder []machinistv1.Rung, i int32) time.Duration {
	if int(i) < len(ladder) && ladder[i].Timeout != nil {
		return ladder[i].Timeout.Duration
	}
	return 10 * time.Minute
}

func cooldown(hc *machinistv1.MachineHealthCheck) time.Duration {
	if c := hc.Spec.Remediation.Cooldown; c != nil {
		return c.Duration
	}
	return 30 * time.Minute
}

func inFlightLimit(hc *machinistv1.MachineHealthCheck) string {
	if v := hc.Spec.Remediation.MaxInFlight; v != nil {
		return v.String()
	}
	return "1"
}

func orSomeone(user string) string {
	if user == "" {
		return "an annotation"
	}
	return user
}

// heldBy reports whether a remediation's message already says that the
// budget of refusal holds it: a hold is said by one Event when it begins,
// not again each time the budget's counts in the message change.
func heldBy(message string, refusal *disruption.Refusal) bool {
	return refusal.Budget != "" && strings.Contains(message, "MachineDisruptionBudget "+refusal.Budget+" ")
}
