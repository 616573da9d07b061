package machine

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/phases"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
)

// While a Machine has just entered Provisioning, it is looked at every
// provisionPoll for provisionPollFor; after that only Node events and the
// deadline wake it.
const (
	provisionPoll    = time.Second
	provisionPollFor = 10 * time.Second
)

// create is Pending's handler: it asks the provider for an instance.
func (r *Reconciler) create(ctx context.Context, s *step) outcome {
	m := s.m
	act, why := r.actuatorFor(m, s.class)
	if why != nil {
		return r.retry(s, why.reason, why.err)
	}
	if s.down != nil {
		// The machine could not join: its bootstrap token is made in
		// its cluster.
		return s.unseen(machinistv1.ConditionReady, metav1.ConditionFalse,
			"the instance is made once the cluster answers, since the machine joins it with a bootstrap token made there")
	}
	if m.Spec.ProviderID != "" {
		// Asked before any token is made for it: an instance that is
		// another Machine's is not touched at all.
		if out, taken := r.adoptable(ctx, s, act); taken {
			return out
		}
	}
	join, err := r.join(ctx, s)
	if err != nil {
		return r.joinFailed(s, machinistv1.ReasonCreateError, err)
	}
	id, err := act.Create(ctx, m, s.class, join)
	if providers.IsTaken(err) {
		return s.failMachine(machinistv1.FailureInstanceTaken, instanceTaken)
	}
	if providers.IsPermanent(err) {
		return s.failMachine(machinistv1.FailureCreate, err.Error())
	}
	if err != nil {
		return r.retry(s, machinistv1.ReasonCreateError, err)
	}
	m.Status.ProviderID = id
	setProvisioning(m)
	return advance(phases.Provision)
}

// instanceTaken is a Machine's failure when the instance it names belongs
// to another Machine. It names neither that Machine nor the instance:
// whoever made this Machine may not even read the other's namespace, and
// must not learn from a failure whose instance they guessed.
const instanceTaken = "the instance spec.providerID names belongs to another Machine, so this Machine does not adopt it, and the instance is left as it is: delete this Machine, and name an instance that belongs to no Machine, or leave spec.providerID out"

// adoptable asks the provider whom the instance m.Spec.ProviderID names
// belongs to, and fails m if another Machine: the provider refuses that
// adoption too (providers.ErrTaken), but one that does not record owners,
// or does not check, is not trusted to. A provider that cannot say is
// left to Create.
func (r *Reconciler) adoptable(ctx context.Context, s *step, act providers.Actuator) (outcome, bool) {
	m := s.m
	in, err := act.Describe(ctx, m.Spec.ProviderID)
	switch {
	case providers.IsTaken(err):
		return s.failMachine(machinistv1.FailureInstanceTaken, instanceTaken), true
	case providers.IsPermanent(err):
		// Create says why, as for an instance that does not exist.
		return outcome{}, false
	case err != nil:
		return r.retry(s, machinistv1.ReasonCreateError, fmt.Errorf("asking the provider whom the instance to adopt belongs to: %w", err)), true
	case !in.Owner.IsZero() && in.Owner.UID != m.UID && !providers.SameName(in.Owner, m):
		// Its former self's (re-created under a new UID) is m's to take.
		return s.failMachine(machinistv1.FailureInstanceTaken, instanceTaken), true
	}
	return outcome{}, false
}

// setProvisioning says that the Machine waits for its Node.
func setProvisioning(m *machinistv1.Machine) {
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: machinistv1.ReasonProvisioning,
		Message: "waiting for the Node with providerID " + m.Status.ProviderID + " to become Ready", ObservedGeneration: m.Generation,
	})
}

// joinSlack outlives a token beyond the deadline it serves, so that a
// machine that joins just in time is not refused.
const joinSlack = 5 * time.Minute

// awaitNode is Provisioning's handler: the Machine runs once its Node is
// Ready, and fails if none is by the deadline.
func (r *Reconciler) awaitNode(ctx context.Context, s *step) outcome {
	m := s.m
	if s.down != nil {
		return s.unseen(machinistv1.ConditionReady, metav1.ConditionFalse, fmt.Sprintf(
			"its Node is looked for once the cluster answers, and the provisioning timeout of %s counts from then", r.provisionTimeout()))
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady); c != nil && c.Reason == machinistv1.ReasonClusterUnreachable {
		setProvisioning(m)
	}
	node, err := s.nodes.Node(ctx, m.Status.ProviderID)
	if err != nil {
		return fail(err)
	}
	if node == nil || !nodes.Ready(node) {
		deadline := s.since(s.enteredAt()).Add(r.provisionTimeout())
		if !s.now.Before(deadline) {
			return s.failMachine(machinistv1.FailureProvisioningTimeout, fmt.Sprintf(
				"no Ready Node with providerID %s after %s", m.Status.ProviderID, r.provisionTimeout()))
		}
		if s.now.Sub(s.enteredAt()) < provisionPollFor {
			// A Node that turned Ready before the cache held this
			// Machine's providerID mapped to no Machine, and the
			// controller's own write wakes nothing: look again.
			s.after(provisionPoll)
		}
		if node == nil && s.now.Sub(s.enteredAt()) >= provisionPollFor {
			// Not while it polls: a machine takes some seconds to join,
			// and its provider is asked once a look, not once a second.
			r.showJoin(ctx, s)
		}
		return s.wait("no Ready Node yet", deadline.Sub(s.now))
	}
	// Joined: its bootstrap token has done its work, and no one else
	// may join with it.
	if err := s.nodes.Joined(ctx, m); err != nil {
		return fail(err)
	}
	observeNode(m, node)
	return advance(phases.Provisioned)
}

// joinLook is how often a Machine whose Node has not come asks why: its
// cluster's Joinable condition (a WorkloadCluster's or the
// ManagementCluster's change wakes it too)
// and its provider's word on the machine's join.
const joinLook = 15 * time.Second

// showJoin says on the Ready condition of a Machine whose Node has not
// come why its machine cannot join, when that is known: its
// WorkloadCluster, or the ManagementCluster for a Machine with no
// clusterName, is not Joinable, or the machine reports a failing join
// through its provider. The condition changes, and so is written, only
// when the reason or its words do.
func (r *Reconciler) showJoin(ctx context.Context, s *step) {
	s.after(joinLook)
	m := s.m
	reason, message := r.joinTrouble(ctx, s)
	if reason == "" {
		if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady); c != nil && c.Reason != machinistv1.ReasonProvisioning {
			setProvisioning(m)
		}
		return
	}
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason,
		Message: message, ObservedGeneration: m.Generation,
	})
}

// joinTrouble is why the Machine's machine cannot join, or "".
func (r *Reconciler) joinTrouble(ctx context.Context, s *step) (reason, message string) {
	m := s.m
	switch {
	case m.Spec.ClusterName != "":
		wc := &machinistv1.WorkloadCluster{}
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.ClusterName}, wc)
		if err == nil {
			c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterJoinable)
			if c != nil && c.Status == metav1.ConditionFalse {
				return c.Reason, "WorkloadCluster " + wc.Name + " is not joinable: " + c.Message
			}
		}
	case r.OwnCluster:
		mc := &machinistv1.ManagementCluster{}
		err := r.Client.Get(ctx, client.ObjectKey{Name: machinistv1.ManagementClusterName}, mc)
		if err == nil {
			c := meta.FindStatusCondition(mc.Status.Conditions, machinistv1.ManagementClusterJoinable)
			if c != nil && c.Status == metav1.ConditionFalse {
				return c.Reason, "the management cluster is not joinable: " + c.Message
			}
		}
	}
	act, why := r.actuatorFor(m, s.class)
	if why != nil {
		return "", ""
	}
	in, err := act.Describe(ctx, m.Status.ProviderID)
	if err != nil || in.JoinFailure == nil {
		// A provider that cannot say now leaves the Machine waiting as
		// it was told last: a flicker of its answer would be a write.
		if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady); err != nil && c != nil && c.Reason != machinistv1.ReasonProvisioning {
			return c.Reason, c.Message
		}
		return "", ""
	}
	return in.JoinFailure.Reason, "the machine cannot join its cluster: " + in.JoinFailure.Message
}

// class returns the Machine's MachineClass, or nil if it does not exist.
func (r *Reconciler) class(ctx context.Context, m *machinistv1.Machine) (*machinistv1.MachineClass, error) {
	c := &machinistv1.MachineClass{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.ClassRef.Name}, c)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return c, err
}
