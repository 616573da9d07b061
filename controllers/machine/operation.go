package machine

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/controller-runtime/pkg/log"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/lifecycle/phases"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
)

// Event reasons of operations.
const (
	reasonRequested = "OperationRequested"
	reasonRefused   = "OperationRefused"
	reasonStarted   = "OperationStarted"
	reasonSucceeded = "OperationSucceeded"
	reasonFailed    = "OperationFailed"
	reasonDeadBoot  = "PodsOfDeadBootDeleted"
)

// repairFailed is Failed's handler: only a repair moves a Failed Machine,
// and operation.Admit let no other in.
func (r *Reconciler) repairFailed(ctx context.Context, s *step) outcome {
	op := s.m.Status.Operation
	if !operation.InFlight(op) || s.unstored(op) {
		return s.wait("", 0)
	}
	if op.State == machinistv1.OperationPending {
		startOperation(s)
	}
	return r.callProvider(ctx, s)
}

// awaitBoot is the handler of Rebooting, Repairing and Updating: the
// Machine runs again once its Node reports a boot ID other than the one
// recorded before (and, for an update, the version asked for) and is
// healthy; it fails if that does not happen by the deadline.
func (r *Reconciler) awaitBoot(ctx context.Context, s *step) outcome {
	m := s.m
	event, verb, failure := phases.Rebooted, "reboot", machinistv1.FailureRebootTimeout
	switch s.fsm.State() {
	case machinistv1.MachineRepairing:
		event, verb, failure = phases.Repaired, "repair", machinistv1.FailureRepairTimeout
	case machinistv1.MachineUpdating:
		event, verb, failure = phases.Updated, "update", machinistv1.FailureUpdateTimeout
	}
	op := m.Status.Operation
	// An update is done only once the Node runs the version it asked for.
	version := ""
	if operation.InFlight(op) && op.Type == machinistv1.OperationUpdate {
		version = op.ToVersion
	}
	if s.down != nil {
		setUnseenHealth(s)
		return r.awaitBootUnseen(ctx, s, event, verb)
	}
	node, err := s.nodes.Node(ctx, m.Status.ProviderID)
	if err != nil {
		return fail(err)
	}
	// The boot the operation found; status.bootID may already hold the new
	// one, if the reconcile that called the provider could not store it.
	before := m.Status.BootID
	if operation.InFlight(op) && op.BootID != "" {
		before = op.BootID
	}
	if node != nil {
		boot := node.Status.NodeInfo.BootID
		if boot != "" && boot != before && (version == "" || node.Status.NodeInfo.KubeletVersion == version) {
			h, err := nodes.Judge(ctx, s.nodes, node, s.now)
			if err != nil {
				return fail(err)
			}
			if h.Healthy {
				if event == phases.Repaired {
					// The machine re-joined with a token of its own.
					if err := r.spent(ctx, s); err != nil {
						return fail(err)
					}
				}
				// Only what this operation cordoned is uncordoned. The
				// Node comes first: were it left cordoned, the Machine
				// would stay here and try again rather than run on a Node
				// no pod can be scheduled to.
				if err := r.applyNodeSpec(ctx, s, node, op == nil || operation.Drains(op.Type, op.Options), false); err != nil {
					return fail(err)
				}
				observeNode(m, node)
				setHealth(m, h)
				meta.RemoveStatusCondition(&m.Status.Conditions, machinistv1.ConditionDrained)
				if operation.InFlight(op) {
					done := fmt.Sprintf("%s: boot ID %s -> %s", operation.PastTense(verb), before, boot)
					if version != "" {
						done = fmt.Sprintf("updated: version %s -> %s, boot ID %s -> %s", op.FromVersion, version, before, boot)
					}
					endOperation(s, machinistv1.OperationSucceeded, done)
				}
				return settle(event)
			}
			// Booted, but not judged healthy yet: its Node's Ready and its
			// Lease's renewal or deletion wake it (leaseExpiry).
		}
	}
	deadline := s.since(s.enteredAt()).Add(r.operationTimeout())
	want := "a new boot ID"
	if version != "" {
		want = "version " + version + " and a new boot ID"
	}
	msg := fmt.Sprintf("no Ready Node with %s %s after the provider began the %s", want, r.operationTimeout(), verb)
	if d := operation.Deadline(op); !d.IsZero() && d.Before(deadline) {
		deadline = d
		msg = fmt.Sprintf("no Ready Node with %s %s after the %s began", want, d.Sub(op.StartedAt.Time), verb)
	}
	if !s.now.Before(deadline) {
		if operation.InFlight(op) {
			endOperation(s, machinistv1.OperationFailed, msg)
		}
		return s.failMachine(failure, msg)
	}
	return s.wait("waiting for the Node to boot anew", deadline.Sub(s.now))
}

// unseenBootPoll is how often the provider is asked about the new boot of
// a Machine whose cluster cannot be reached: a call, and no write, per
// look.
const unseenBootPoll = 5 * time.Second

// awaitBootUnseen is awaitBoot while the Machine's cluster cannot be
// reached: the operation completes on the provider's word, once it reports
// the instance on with a boot other than the one the operation began
// from. The record says so, and that the Node was not seen; BootConfirmed
// is Unknown until the Node is (confirmBoot). An update waits for the
// Node, the only one to say which version runs; so does an operation whose
// provider cannot tell. No deadline runs meanwhile: it counts from the
// cluster's return.
func (r *Reconciler) awaitBootUnseen(ctx context.Context, s *step, event phases.Event, verb string) outcome {
	m := s.m
	op := m.Status.Operation
	if !operation.InFlight(op) || op.Type == machinistv1.OperationUpdate {
		return s.wait("its cluster cannot be reached", downPoll)
	}
	act, why := r.actuatorFor(m, s.class)
	if why != nil {
		return s.wait("no provider to ask", downPoll)
	}
	in, err := act.Describe(ctx, m.Status.ProviderID)
	if err != nil {
		log.FromContext(ctx).V(1).Info("asking the provider about the new boot", "error", err.Error())
		return s.wait("the provider did not answer", unseenBootPoll)
	}
	before := op.BootID
	if before == "" {
		before = m.Status.BootID
	}
	if in.Power != providers.PowerOn || in.BootID == "" || in.BootID == before {
		return s.wait("waiting for the provider to report a new boot", unseenBootPoll)
	}
	m.Status.BootID, op.ProviderBootID = in.BootID, in.BootID
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionBootConfirmed, Status: metav1.ConditionUnknown, Reason: machinistv1.ReasonNodeNotSeen,
		Message: fmt.Sprintf("the provider reported boot ID %s after %s %s; the Node's is checked once its cluster answers",
			in.BootID, verb, op.ID),
		ObservedGeneration: m.Generation,
	})
	endOperation(s, machinistv1.OperationSucceeded, fmt.Sprintf("%s on the provider's word: boot ID %s -> %s; the Node was not seen: %s",
		operation.PastTense(verb), before, in.BootID, s.down.Unseen()))
	return settle(event)
}
