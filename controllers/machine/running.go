package machine

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/admission"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/lifecycle/phases"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
)

// serve is Running's handler: it keeps the Machine's conditions and its
// Node's labels and taints up to date, and starts the operation it is
// asked for (or that a changed spec.version needs) once the budgets allow:
// by draining first, or by calling the provider at once for a reboot
// without drain.
func (r *Reconciler) serve(ctx context.Context, s *step) outcome {
	m := s.m
	if s.down != nil {
		return r.serveUnseen(ctx, s)
	}
	node, err := s.nodes.Node(ctx, m.Status.ProviderID)
	if err != nil {
		return fail(err)
	}
	h, err := nodes.Judge(ctx, s.nodes, node, s.now)
	if err != nil {
		return fail(err)
	}
	if until := s.back.Add(returnGrace); !h.Healthy && s.now.Before(until) && unseenHealth(m) {
		// Back from an outage in which its kubelet could not report:
		// what the cache shows of its Node and Lease is from before, and
		// is not taken as the Node's health until the kubelet has had a
		// lease period to speak.
		s.after(until.Sub(s.now))
	} else {
		setHealth(m, h)
	}
	stale, err := r.confirmBoot(ctx, s, node)
	if err != nil {
		return fail(err)
	}
	if node != nil {
		if !stale {
			observeNode(m, node)
		}
		initialized, err := r.initializeNode(ctx, s, node)
		if err != nil {
			return fail(err)
		}
		if err := r.applyNodeSpec(ctx, s, node, false, initialized); err != nil {
			return fail(err)
		}
	}
	op := m.Status.Operation
	if !operation.InFlight(op) {
		if op = r.updateFor(ctx, s, node); op == nil {
			return s.wait("", 0)
		}
	}
	return r.carryOut(ctx, s, op)
}

// serveUnseen is serve for a Machine whose cluster cannot be reached: its
// Node's health is Unknown, nothing is done to the Node, and no update is
// started (the version the Node runs is not known). An operation that
// needs no drain is carried out all the same, by the provider; one that
// drains waits in Draining for the cluster, since pods cannot be evicted
// through an API that does not answer.
func (r *Reconciler) serveUnseen(ctx context.Context, s *step) outcome {
	setUnseenHealth(s)
	op := s.m.Status.Operation
	if !operation.InFlight(op) {
		return s.wait("its cluster cannot be reached", downPoll)
	}
	return r.carryOut(ctx, s, op)
}

// carryOut starts the operation in flight once it is stored and the
// budgets allow: by draining first, or by calling the provider at once for
// an operation without drain.
func (r *Reconciler) carryOut(ctx context.Context, s *step, op *machinistv1.Operation) outcome {
	if s.unstored(op) {
		return s.wait("the operation is not stored yet", 0)
	}
	if op.State == machinistv1.OperationPending {
		if held, err := r.holdForBudget(ctx, s, op); err != nil || held {
			return outcome{reason: "a disruption budget holds the operation", err: err}
		}
		startOperation(s)
	}
	if !operation.Drains(op.Type, op.Options) {
		return r.callProvider(ctx, s)
	}
	return advance(phases.Drain)
}

// returnGrace is how long after its cluster is back a Machine's Node is
// not judged unhealthy from what was cached before: a kubelet's Lease
// duration, the time it has to renew once it can.
const returnGrace = 40 * time.Second

// unseenHealth reports whether m's NodeHealthy condition says its cluster
// could not be reached.
func unseenHealth(m *machinistv1.Machine) bool {
	c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionNodeHealthy)
	return c != nil && c.Reason == machinistv1.ReasonClusterUnreachable
}

// updateFor records an Update when the Machine's spec.version is not the
// version its Node runs, and returns it; nil when there is none to carry
// out. An Update to this version that failed is not tried again: the
// Machine keeps running what it runs until someone changes the version
// again (or replaces it). A provider that cannot change the version in
// place gets the Update recorded Failed at once, saying so.
func (r *Reconciler) updateFor(ctx context.Context, s *step, node *corev1.Node) *machinistv1.Operation {
	m := s.m
	want := m.Spec.Version
	if want == "" || node == nil {
		return nil
	}
	have := node.Status.NodeInfo.KubeletVersion
	if have == "" || have == want {
		return nil
	}
	if last := m.Status.Operation; last != nil && last.Type == machinistv1.OperationUpdate &&
		last.ToVersion == want && last.State == machinistv1.OperationFailed {
		return nil
	}
	act, why := r.actuatorFor(m, s.class)
	if why != nil {
		// The class or its provider is missing: nothing can be updated
		// until it is back, and the Running Machine goes on as it is.
		return nil
	}
	by := r.updater(ctx, m)
	if by == "" {
		by = r.versionRequester(ctx, m)
	}
	op, err := operation.Request(m, machinistv1.OperationUpdate, nil, machinistv1.SourceSpec, by, s.now)
	if err != nil {
		return nil
	}
	op.FromVersion, op.ToVersion = have, want
	if !act.InPlace(providers.Change{Version: true}) {
		startOperation(s)
		endOperation(s, machinistv1.OperationFailed, fmt.Sprintf(
			"provider %q cannot change the version of an instance in place: replace the Machine to run %s", s.class.Spec.Provider, want))
		return nil
	}
	s.note(corev1.EventTypeNormal, reasonRequested, "Update", "update %s requested: version %s -> %s", op.ID, have, want)
	s.requested = op.ID
	return op
}

// updater names the MachineDeployment whose rollout asked for an update,
// when the Machine's MachineSet belongs to one whose template asks for
// exactly the Machine's spec; "" otherwise (a change by hand).
func (r *Reconciler) updater(ctx context.Context, m *machinistv1.Machine) string {
	ref := metav1.GetControllerOf(m)
	if ref == nil || ref.Kind != "MachineSet" {
		return ""
	}
	ms := &machinistv1.MachineSet{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: ref.Name}, ms); err != nil {
		return ""
	}
	ref = metav1.GetControllerOf(ms)
	if ref == nil || ref.Kind != "MachineDeployment" {
		return ""
	}
	md := &machinistv1.MachineDeployment{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: ref.Name}, md); err != nil {
		return ""
	}
	want := md.Spec.Template.Spec
	want.ProviderID = m.Spec.ProviderID
	if !equality.Semantic.DeepEqual(m.Spec, want) {
		return ""
	}
	return "machinedeployment/" + md.Name
}

// versionRequester is who changed the Machine's spec.version, as the
// admission policies record it, and only while they are enforced.
func (r *Reconciler) versionRequester(ctx context.Context, m *machinistv1.Machine) string {
	by := m.Annotations[machinistv1.VersionRequestedByAnnotation]
	if by == "" || r.APIReader == nil {
		return ""
	}
	if ok, err := admission.VouchesForVersion(ctx, r.APIReader); err != nil || !ok {
		return ""
	}
	return by
}

// waiting begins the message of a pending operation a disruption budget
// holds back; what follows is the budget's refusal.
const waiting = "waiting: "

// holdForBudget asks the MachineDisruptionBudgets before a pending
// operation starts, whoever asked for it (the verbs, the annotation, a
// health check, a changed version): this is where every operation of a
// Running Machine passes, so none can slip by a budget. A refusal keeps
// the operation pending with the reason DisruptionHeld, says why in its
// message, with one Event per change of message, and looks again when the
// budget says it may allow it.
func (r *Reconciler) holdForBudget(ctx context.Context, s *step, op *machinistv1.Operation) (bool, error) {
	if r.APIReader == nil {
		return false, nil
	}
	store := disruption.Cached(r.APIReader, r.Client)
	req := disruption.Request{Machine: s.m, Reason: disruptionReason(op), OperationID: op.ID, By: op.RequestedBy,
		Override: op.Options != nil && op.Options.OverrideDisruptionBudgets}
	err := store.Admit(ctx, req, disruption.At(r.Calendar))
	refusal, refused := disruption.AsRefusal(err)
	if !refused {
		return false, err
	}
	op.Reason = machinistv1.ReasonDisruptionHeld
	if msg := waiting + refusal.Message; op.Message != msg {
		op.Message = msg
		verb := operation.Verb(op.Type)
		s.note(corev1.EventTypeWarning, machinistv1.ReasonDisruptionHeld, verb, "%s %s waits: %s", verb, op.ID, refusal.Message)
	}
	s.after(refusal.RetryAfter)
	return true, nil
}

// disruptionReason is the budget reason an operation counts under.
func disruptionReason(op *machinistv1.Operation) machinistv1.DisruptionReason {
	switch {
	case op.Source == machinistv1.SourceHealthCheck:
		return machinistv1.DisruptionRemediation
	case op.Type == machinistv1.OperationUpdate:
		return machinistv1.DisruptionUpdate
	case op.Type == machinistv1.OperationRepair:
		return machinistv1.DisruptionRepair
	}
	return machinistv1.DisruptionReboot
}
