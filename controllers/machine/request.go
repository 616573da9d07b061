package machine

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/admission"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/nodes"
)

// admitLive gives a live Machine its finalizer and turns its request
// annotation, if any, into an operation.
func (r *Reconciler) admitLive(ctx context.Context, s *step) error {
	m := s.m
	// A MachineSet sets the finalizer at creation; only a Machine made by
	// hand costs this extra write.
	if controllerutil.AddFinalizer(m, machinistv1.MachineFinalizer) {
		if err := r.Client.Update(ctx, m); err != nil {
			return err
		}
		r.writes.Wrote(m)
	}
	if v, ok := m.Annotations[machinistv1.RequestAnnotation]; ok {
		return r.takeRequest(ctx, s, v)
	}
	if _, ok := m.Annotations[machinistv1.RequestedByAnnotation]; ok {
		// Someone removed a request before it was taken: its requester
		// must not linger as if a request were waiting.
		return r.ackRequest(ctx, m, "")
	}
	return nil
}

// takeRequest turns the request annotation into an operation. The
// annotation goes in a metadata update after the status that holds the
// operation is stored; LastRequestAnnotation tells a request already taken
// (the controller stopped between the two writes) from a new one.
func (r *Reconciler) takeRequest(ctx context.Context, s *step, value string) error {
	m := s.m
	if op := m.Status.Operation; op != nil && op.Source == machinistv1.SourceAnnotation &&
		op.ID != m.Annotations[machinistv1.LastRequestAnnotation] {
		return r.ackRequest(ctx, m, op.ID)
	}
	var typ machinistv1.OperationType
	switch strings.ToLower(strings.TrimSpace(value)) {
	case "reboot":
		typ = machinistv1.OperationReboot
	case "repair":
		typ = machinistv1.OperationRepair
	default:
		s.note(corev1.EventTypeWarning, reasonRefused, "Request", "annotation %s=%q: the value must be reboot or repair",
			machinistv1.RequestAnnotation, value)
		return r.ackRequest(ctx, m, m.Annotations[machinistv1.LastRequestAnnotation])
	}
	// An annotation asks for a drain, which a Machine whose cluster
	// cannot be reached cannot have.
	unseen, err := r.unseen(ctx, m)
	if err != nil {
		return err // read again, the request kept
	}
	err = operation.AdmitUnseen(m, typ, nil, unseen)
	var op *machinistv1.Operation
	if err == nil {
		op, err = operation.Request(m, typ, nil, machinistv1.SourceAnnotation, r.requester(ctx, m), s.now)
	}
	if err != nil {
		s.note(corev1.EventTypeWarning, reasonRefused, "Request", "annotation %s=%s: %v", machinistv1.RequestAnnotation, value, err)
		return r.ackRequest(ctx, m, m.Annotations[machinistv1.LastRequestAnnotation])
	}
	by := ""
	if op.RequestedBy != "" {
		by = " of " + op.RequestedBy
	}
	s.note(corev1.EventTypeNormal, reasonRequested, "Request", "%s %s requested by annotation%s", operation.Verb(typ), op.ID, by)
	s.ack, s.requested = op.ID, op.ID
	return nil
}

// unseen says why m's cluster cannot be reached; "" when it can.
func (r *Reconciler) unseen(ctx context.Context, m *machinistv1.Machine) (string, error) {
	reach, err := nodes.Reachability(ctx, r.Client, m)
	if err != nil || reach.Down == nil {
		return "", err
	}
	return reach.Down.Unseen(), nil
}

// requester is who set the request annotation, as far as it is known: the
// name in RequestedByAnnotation, which the admission policies of
// config/admission stamp (or, with only the validating one, check), and
// only while they are in force. Without them anyone who may patch the
// Machine could have written any name, so none is believed.
func (r *Reconciler) requester(ctx context.Context, m *machinistv1.Machine) string {
	by := m.Annotations[machinistv1.RequestedByAnnotation]
	if by == "" || r.APIReader == nil {
		return ""
	}
	ok, err := admission.Vouches(ctx, r.APIReader)
	if err != nil {
		log.FromContext(ctx).Info("cannot tell whether the request admission policy is in force; the requester is not recorded",
			"policy", admission.RequestPolicy, "requestedBy", by, "error", err.Error())
		return ""
	}
	if !ok {
		return ""
	}
	return by
}

// ackRequest removes the request annotation, and who set it, and records
// which operation it became (empty: none, it was refused).
func (r *Reconciler) ackRequest(ctx context.Context, m *machinistv1.Machine, opID string) error {
	status := m.Status.DeepCopy()
	delete(m.Annotations, machinistv1.RequestAnnotation)
	delete(m.Annotations, machinistv1.RequestedByAnnotation)
	if opID != "" {
		m.Annotations[machinistv1.LastRequestAnnotation] = opID
	}
	err := r.Client.Update(ctx, m)
	// The update answers with the stored status; keep what this reconcile
	// decided so far.
	m.Status = *status
	return err
}
