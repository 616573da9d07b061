package machine

import (
	"context"
	"fmt"
	"net/url"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/lifecycle/phases"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
)

// What more than one phase does lives here, so that each handler's file
// holds what its own phase does: picking a Machine's provider, calling it
// for an operation, making the join data a machine boots with, and
// aborting a drain.

// unavailable is why no provider can act for a Machine now: a reason for
// its Ready condition and a message for people.
type unavailable struct {
	reason string
	err    error
}

// actuatorFor picks the provider for a Machine: by its class while it has
// no instance, then by its providerID's scheme, so a Machine can still be
// deleted after its class is gone.
func (r *Reconciler) actuatorFor(m *machinistv1.Machine, class *machinistv1.MachineClass) (providers.Actuator, *unavailable) {
	if id := m.Status.ProviderID; id != "" {
		u, err := url.Parse(id)
		if err != nil || u.Scheme == "" {
			return nil, &unavailable{machinistv1.ReasonInvalidProviderID, fmt.Errorf("providerID %q does not start with <provider>://", id)}
		}
		act, err := r.Actuators.Get(u.Scheme)
		if err != nil {
			return nil, &unavailable{machinistv1.ReasonProviderNotFound, fmt.Errorf("providerID %q: %w", id, err)}
		}
		return act, nil
	}
	if class == nil {
		return nil, &unavailable{machinistv1.ReasonMachineClassNotFound, fmt.Errorf(
			"MachineClass %q does not exist in namespace %q; create it, or fix spec.classRef.name",
			m.Spec.ClassRef.Name, m.Namespace)}
	}
	act, err := r.Actuators.Get(class.Spec.Provider)
	if err != nil {
		return nil, &unavailable{machinistv1.ReasonProviderNotFound, fmt.Errorf("MachineClass %q names provider %q: %w",
			class.Name, class.Spec.Provider, err)}
	}
	return act, nil
}

// join makes what m's instance joins its cluster with: a bootstrap token
// of its own in that cluster, which lives long enough for the slowest
// boot the controller waits for, and goes once the machine has joined.
func (r *Reconciler) join(ctx context.Context, s *step) (bootstrap.Join, error) {
	j, err := s.nodes.Join(ctx, s.m, max(r.provisionTimeout(), r.operationTimeout())+joinSlack)
	if err != nil {
		return bootstrap.Join{}, fmt.Errorf("making the join data for machine %s/%s: %w", s.m.Namespace, s.m.Name, err)
	}
	return j, nil
}

// joinFailed retries a Machine whose join data could not be made: under
// ClusterUnreachable when its cluster did not answer (the cluster's fault,
// which the Machine waits out), under reason otherwise.
func (r *Reconciler) joinFailed(s *step, reason string, err error) outcome {
	if nodes.Unreachable(err) {
		reason = machinistv1.ReasonClusterUnreachable
	}
	return r.retry(s, reason, err)
}

// callProvider asks the provider to reboot, repair or update the drained
// (or, for a reboot without drain, running) Machine and moves it on. The
// provider is idempotent on the operation ID, so a controller that stopped
// before storing the move calls it again harmlessly.
func (r *Reconciler) callProvider(ctx context.Context, s *step) outcome {
	m := s.m
	op := m.Status.Operation
	act, why := r.actuatorFor(m, s.class)
	if why != nil {
		return r.retry(s, why.reason, why.err)
	}
	req := providers.Operation{ID: op.ID, Hard: op.Options != nil && op.Options.Mode == machinistv1.RebootHard}
	// Judged before the reboot: a machine that boots fast could renew
	// its Lease before the provider even answers.
	var dead *deadNode
	if !operation.Drains(op.Type, op.Options) && req.Hard && s.down == nil {
		var err error
		if dead, err = r.unreachable(ctx, s); err != nil {
			return fail(err)
		}
	}
	var err error
	event, doing := phases.Reboot, "rebooting"
	switch op.Type {
	case machinistv1.OperationRepair:
		event, doing = phases.Repair, "repairing"
		if s.down != nil {
			// The re-imaged machine re-joins once the cluster is back,
			// with a token kept for it until then.
			setUnseenHealth(s)
			if req.Join, err = r.deferJoin(ctx, s); err != nil {
				return s.unseen(machinistv1.ConditionReady, metav1.ConditionFalse,
					fmt.Sprintf("the repair waits for the cluster: %v", err))
			}
		} else if req.Join, err = r.join(ctx, s); err != nil {
			return r.joinFailed(s, machinistv1.ReasonProviderError, err)
		}
		err = act.Repair(ctx, m.Status.ProviderID, req)
	case machinistv1.OperationUpdate:
		event, doing = phases.Update, "updating"
		req.Version = op.ToVersion
		err = act.Update(ctx, m.Status.ProviderID, req)
	default:
		err = act.Reboot(ctx, m.Status.ProviderID, req)
	}
	if providers.IsPermanent(err) {
		msg := fmt.Sprintf("the provider refused: %v", err)
		if s.fsm.State() == machinistv1.MachineDraining {
			return r.abort(ctx, s, msg)
		}
		endOperation(s, machinistv1.OperationFailed, msg)
		return s.wait("the provider refused", 0)
	}
	if err != nil {
		return r.retry(s, machinistv1.ReasonProviderError, err)
	}
	if dead != nil {
		if err := r.forgetDeadBoot(ctx, s, dead); err != nil {
			return fail(err)
		}
	}
	op.Message = fmt.Sprintf("the provider is %s the instance; waiting for its Node to report a new boot ID and Ready", doing)
	if op.Type == machinistv1.OperationUpdate {
		op.Message = fmt.Sprintf("the provider is updating the instance to %s; waiting for its Node to report it, a new boot ID and Ready", op.ToVersion)
	}
	s.after(r.operationTimeout())
	if d := operation.Deadline(op); !d.IsZero() {
		s.after(d.Sub(s.now))
	}
	// The Node may have booted anew already: a fast machine, or an
	// earlier call that took effect though its reply was lost or its move
	// not stored. Its Node's event was then spent while the Machine was
	// not yet Rebooting, and this reconcile's own write wakes nothing:
	// the new phase's handler looks now, not at the deadline.
	return advance(event)
}

// abort gives the operation up and returns a drained Machine to service.
func (r *Reconciler) abort(ctx context.Context, s *step, why string) outcome {
	node, err := s.nodes.Node(ctx, s.m.Status.ProviderID)
	if err != nil {
		return fail(err)
	}
	if node != nil {
		// Not applyNodeSpec: the drain may have cordoned the Node in
		// this very reconcile, and the cached Node, not showing it yet,
		// would make uncordoning look needless. A patch that changes
		// nothing writes nothing. It comes before the move, so that a
		// Node that could not be uncordoned is tried again, not left
		// cordoned under a Running Machine.
		if err := s.nodes.Patch(ctx, node, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"unschedulable":null}}`))); err != nil {
			return fail(err)
		}
	}
	if operation.InFlight(s.m.Status.Operation) {
		endOperation(s, machinistv1.OperationFailed, why)
	}
	meta.RemoveStatusCondition(&s.m.Status.Conditions, machinistv1.ConditionDrained)
	return settle(phases.Abort)
}
