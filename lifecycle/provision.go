package lifecycle

import (
	"context"
	"fmt"
	"net/url"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/machinist-dev/machinist/actuators"
	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/phases"
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
	join, err := r.join(ctx, m)
	if err != nil {
		return r.retry(s, machinistv1.ReasonCreateError, err)
	}
	id, err := act.Create(ctx, m, s.class, join)
	if actuators.IsPermanent(err) {
		return s.failMachine(machinistv1.FailureCreate, err.Error())
	}
	if err != nil {
		return r.retry(s, machinistv1.ReasonCreateError, err)
	}
	m.Status.ProviderID = id
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: machinistv1.ReasonProvisioning,
		Message: "waiting for the Node with providerID " + id + " to become Ready", ObservedGeneration: m.Generation,
	})
	return advance(phases.Provision)
}

// join makes what m's instance joins its cluster with; see Reconciler.Join.
func (r *Reconciler) join(ctx context.Context, m *machinistv1.Machine) (bootstrap.Join, error) {
	if r.Join == nil {
		return bootstrap.Join{}, nil
	}
	j, err := r.Join(ctx, m)
	if err != nil {
		return bootstrap.Join{}, fmt.Errorf("making the join data for machine %s/%s: %w", m.Namespace, m.Name, err)
	}
	return j, nil
}

// awaitNode is Provisioning's handler: the Machine runs once its Node is
// Ready, and fails if none is by the deadline.
func (r *Reconciler) awaitNode(ctx context.Context, s *step) outcome {
	m := s.m
	node, err := s.nodes.Node(ctx, m.Status.ProviderID)
	if err != nil {
		return fail(err)
	}
	if node == nil || !nodes.Ready(node) {
		deadline := s.enteredAt().Add(r.provisionTimeout())
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
		return s.wait("no Ready Node yet", deadline.Sub(s.now))
	}
	observeNode(m, node)
	return advance(phases.Provisioned)
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

// unavailable is why no provider can act for a Machine now: a reason for
// its Ready condition and a message for people.
type unavailable struct {
	reason string
	err    error
}

// actuatorFor picks the provider for a Machine: by its class while it has
// no instance, then by its providerID's scheme, so a Machine can still be
// deleted after its class is gone.
func (r *Reconciler) actuatorFor(m *machinistv1.Machine, class *machinistv1.MachineClass) (actuators.Actuator, *unavailable) {
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
