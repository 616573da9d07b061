package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/machinist-dev/machinist/actuators"
	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/internal/admission"
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

// drains reports whether the operation empties the Machine first.
func drains(typ machinistv1.OperationType, opts *machinistv1.OperationOptions) bool {
	return typ != machinistv1.OperationReboot || opts == nil || opts.Drain == nil || *opts.Drain
}

// firstEvent is the event that starts an operation on a Machine in phase:
// the state machine, not the caller, decides whether the phase allows it.
// A Failed Machine is repaired without a drain; a drain is how a Running
// one is emptied first.
func firstEvent(typ machinistv1.OperationType, opts *machinistv1.OperationOptions, phase machinistv1.MachinePhase) Event {
	switch {
	case typ == machinistv1.OperationRepair && phase == machinistv1.MachineFailed:
		return Repair
	case drains(typ, opts):
		return Drain
	}
	return Reboot
}

// deadlineOf is when the operation in flight gives up, from its own
// timeoutSeconds; zero when it has none.
func deadlineOf(op *machinistv1.Operation) time.Time {
	if !InFlight(op) {
		return time.Time{}
	}
	if op == nil || op.StartedAt == nil || op.Options == nil || op.Options.TimeoutSeconds == nil {
		return time.Time{}
	}
	return op.StartedAt.Add(time.Duration(*op.Options.TimeoutSeconds) * time.Second)
}

// InFlight reports whether op is still to be carried out.
func InFlight(op *machinistv1.Operation) bool {
	return op != nil && (op.State == machinistv1.OperationPending || op.State == machinistv1.OperationRunning)
}

// Admit reports why an operation of typ cannot start on m now, or nil if it
// can. Every error wraps ErrRefused and says what to wait for.
func Admit(m *machinistv1.Machine, typ machinistv1.OperationType, opts *machinistv1.OperationOptions) error {
	verb := verbOf(typ)
	if !m.DeletionTimestamp.IsZero() {
		return refuse("machine %q is being deleted and cannot be %s", m.Name, pastTense(verb))
	}
	if op := m.Status.Operation; InFlight(op) {
		return refuse("machine %q already has %s operation %s in flight (%s); wait for it to finish",
			m.Name, verbOf(op.Type), op.ID, op.State)
	}
	phase := m.Status.Phase
	if phase == "" {
		phase = Initial
	}
	if e := firstEvent(typ, opts, phase); !New(phase).Can(e) {
		from := Table.From(e)
		if typ == machinistv1.OperationRepair {
			from = append(Table.From(Drain), machinistv1.MachineFailed)
		}
		return refuse("machine %q is %s; a %s can start only when it is %s",
			m.Name, phase, verb, joinPhases(from))
	}
	if phase == machinistv1.MachineFailed && m.Status.ProviderID == "" {
		return refuse("machine %q is Failed before it had an instance (%s); there is nothing to %s: delete it",
			m.Name, m.Status.FailureReason, verb)
	}
	return nil
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
		ID:          newOperationID(typ),
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

// newOperationID is short enough to type and random enough that two
// requests on one Machine never share one.
func newOperationID(typ machinistv1.OperationType) string {
	return verbOf(typ) + "-" + rand.String(10)
}

func verbOf(typ machinistv1.OperationType) string {
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

func pastTense(verb string) string { return strings.TrimSuffix(verb, "e") + "ed" }

func gerund(verb string) string { return strings.TrimSuffix(verb, "e") + "ing" }

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

// Event reasons of operations.
const (
	reasonRequested = "OperationRequested"
	reasonRefused   = "OperationRefused"
	reasonStarted   = "OperationStarted"
	reasonSucceeded = "OperationSucceeded"
	reasonFailed    = "OperationFailed"
	reasonDeadBoot  = "PodsOfDeadBootDeleted"
)

// Failure reasons an operation can leave a Machine with.
const (
	FailureRebootTimeout = "RebootTimeout"
	FailureRepairTimeout = "RepairTimeout"
	FailureUpdateTimeout = "UpdateTimeout"
)

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
	op, err := Request(m, typ, nil, machinistv1.SourceAnnotation, r.requester(ctx, m), s.now)
	if err != nil {
		s.note(corev1.EventTypeWarning, reasonRefused, "Request", "annotation %s=%s: %v", machinistv1.RequestAnnotation, value, err)
		return r.ackRequest(ctx, m, m.Annotations[machinistv1.LastRequestAnnotation])
	}
	by := ""
	if op.RequestedBy != "" {
		by = " of " + op.RequestedBy
	}
	s.note(corev1.EventTypeNormal, reasonRequested, "Request", "%s %s requested by annotation%s", verbOf(typ), op.ID, by)
	s.ack, s.requested = op.ID, op.ID
	return nil
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

// updateFor records an Update when the Machine's spec.version is not the
// version its Node runs, and returns it; nil when there is none to carry
// out. An Update to this version that failed is not tried again: the
// Machine keeps running what it runs until someone changes the version
// again (or replaces it). A provider that cannot change the version in
// place gets the Update recorded Failed at once, saying so.
func (r *Reconciler) updateFor(ctx context.Context, s *step, class *machinistv1.MachineClass, node *corev1.Node) *machinistv1.Operation {
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
	act, why := r.actuatorFor(m, class)
	if why != nil {
		// The class or its provider is missing: nothing can be updated
		// until it is back, and the Running Machine goes on as it is.
		return nil
	}
	by := r.updater(ctx, m)
	if by == "" {
		by = r.versionRequester(ctx, m)
	}
	op, err := Request(m, machinistv1.OperationUpdate, nil, machinistv1.SourceSpec, by, s.now)
	if err != nil {
		return nil
	}
	op.FromVersion, op.ToVersion = have, want
	if !act.InPlace(actuators.Change{Version: true}) {
		startOperation(s)
		endOperation(s, machinistv1.OperationFailed, fmt.Sprintf(
			"provider %q cannot change the version of an instance in place: replace the Machine to run %s", class.Spec.Provider, want))
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

// startOperation marks the Machine's pending operation as started.
func startOperation(s *step) {
	op := s.m.Status.Operation
	at := metav1.NewTime(s.now)
	op.State, op.StartedAt = machinistv1.OperationRunning, &at
	op.Message = "started"
	s.note(corev1.EventTypeNormal, reasonStarted, verbOf(op.Type), "%s %s started", verbOf(op.Type), op.ID)
}

// endOperation records how the operation in flight ended.
func endOperation(s *step, state machinistv1.OperationState, message string) {
	op := s.m.Status.Operation
	at := metav1.NewTime(s.now)
	op.State, op.CompletedAt, op.Message = state, &at, message
	kind, reason := corev1.EventTypeNormal, reasonSucceeded
	if state == machinistv1.OperationFailed {
		kind, reason = corev1.EventTypeWarning, reasonFailed
	}
	s.note(kind, reason, verbOf(op.Type), "%s %s: %s", verbOf(op.Type), op.ID, message)
}

// callProvider asks the provider to reboot or repair the drained (or, for
// a reboot without drain, running) Machine and moves it on. The provider
// is idempotent on the operation ID, so a controller that stopped before
// storing the move calls it again harmlessly.
func (r *Reconciler) callProvider(ctx context.Context, s *step, class *machinistv1.MachineClass) error {
	m := s.m
	op := m.Status.Operation
	act, why := r.actuatorFor(m, class)
	if why != nil {
		r.retry(s, why.reason, why.err)
		return nil
	}
	req := actuators.Operation{ID: op.ID, Hard: op.Options != nil && op.Options.Mode == "hard"}
	// Judged before the reboot: a machine that boots fast could renew
	// its Lease before the provider even answers.
	var dead *deadNode
	if !drains(op.Type, op.Options) && req.Hard {
		var err error
		if dead, err = r.unreachable(ctx, s); err != nil {
			return err
		}
	}
	var err error
	event, doing := Reboot, "rebooting"
	switch op.Type {
	case machinistv1.OperationRepair:
		event, doing = Repair, "repairing"
		err = act.Repair(ctx, m.Status.ProviderID, req)
	case machinistv1.OperationUpdate:
		event, doing = Update, "updating"
		req.Version = op.ToVersion
		err = act.Update(ctx, m.Status.ProviderID, req)
	default:
		err = act.Reboot(ctx, m.Status.ProviderID, req)
	}
	if actuators.IsPermanent(err) {
		msg := fmt.Sprintf("the provider refused: %v", err)
		if s.fsm.State() == machinistv1.MachineDraining {
			if aerr := r.abort(ctx, s, msg); aerr != nil {
				return aerr
			}
			return nil
		}
		endOperation(s, machinistv1.OperationFailed, msg)
		return nil
	}
	if err != nil {
		r.retry(s, "ProviderError", err)
		return nil
	}
	if dead != nil {
		if err := r.forgetDeadBoot(ctx, s, dead); err != nil {
			return err
		}
	}
	wasFailed := s.fsm.State() == machinistv1.MachineFailed
	if err := s.fire(event); err != nil {
		return err
	}
	if wasFailed {
		m.Status.FailureReason, m.Status.FailureMessage = "", ""
	}
	op.Message = fmt.Sprintf("the provider is %s the instance; waiting for its Node to report a new boot ID and Ready", doing)
	if op.Type == machinistv1.OperationUpdate {
		op.Message = fmt.Sprintf("the provider is updating the instance to %s; waiting for its Node to report it, a new boot ID and Ready", op.ToVersion)
	}
	s.after(r.operationTimeout())
	if d := deadlineOf(op); !d.IsZero() {
		s.after(d.Sub(s.now))
	}
	// The Node may have booted anew already: a fast machine, or an
	// earlier call that took effect though its reply was lost or its move
	// not stored. Its Node's event was then spent while the Machine was
	// not yet Rebooting, and this reconcile's own write wakes nothing:
	// look now, not at the deadline.
	return r.awaitBoot(ctx, s, class)
}

// deadNode is a Node found not healthy before a hard reboot.
type deadNode struct {
	node *corev1.Node
	why  string
}

// unreachable returns the Machine's Node if it is not healthy, else nil.
func (r *Reconciler) unreachable(ctx context.Context, s *step) (*deadNode, error) {
	node, err := r.nodeFor(ctx, s.m.Status.ProviderID)
	if err != nil || node == nil {
		return nil, err
	}
	h, err := r.nodeHealth(ctx, node, s.now)
	if err != nil || h.healthy {
		return nil, err
	}
	return &deadNode{node: node, why: h.message}, nil
}

// forgetDeadBoot deletes, at once, the pods bound to the Node of a Machine
// that was just hard-rebooted without a drain while its Node was not
// healthy. Nothing of the old boot runs any more, and no kubelet is left
// to say so: without this, its pods would stay Running on the API, and
// their controllers would not replace them, until the node lifecycle's
// eviction some minutes later. Mirror pods are the kubelet's own to
// recreate. A healthy Node's kubelet reports its pods itself after the
// reboot, so they are left alone.
func (r *Reconciler) forgetDeadBoot(ctx context.Context, s *step, dead *deadNode) error {
	node := dead.node
	pods, err := r.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		return fmt.Errorf("listing the pods of node %s: %w", node.Name, err)
	}
	gone := 0
	for i := range pods.Items {
		pod := &pods.Items[i]
		if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			continue
		}
		err := r.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To(int64(0)),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		switch {
		case err == nil:
			gone++
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone already, or a new pod of the same name: not ours.
		default:
			return fmt.Errorf("deleting pod %s/%s of the dead boot of node %s: %w", pod.Namespace, pod.Name, node.Name, err)
		}
	}
	if gone > 0 {
		s.note(corev1.EventTypeNormal, reasonDeadBoot, "Reboot", "deleted %d pod(s) of node %s that died with its unreachable boot (%s)",
			gone, node.Name, dead.why)
	}
	return nil
}

// abort gives the operation up and returns a drained Machine to service.
func (r *Reconciler) abort(ctx context.Context, s *step, why string) error {
	if err := s.fire(Abort); err != nil {
		return err
	}
	if InFlight(s.m.Status.Operation) {
		endOperation(s, machinistv1.OperationFailed, why)
	}
	meta.RemoveStatusCondition(&s.m.Status.Conditions, machinistv1.ConditionDrained)
	node, err := r.nodeFor(ctx, s.m.Status.ProviderID)
	if err != nil || node == nil {
		return err
	}
	// Not r.uncordon: the drain may have cordoned the Node in this very
	// reconcile, and the cached Node, not showing it yet, would make
	// uncordoning look needless. A patch that changes nothing writes
	// nothing.
	return r.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"unschedulable":null}}`)))
}

// awaitBoot moves a rebooting or repairing Machine back to Running once its
// Node reports a boot ID other than the one recorded before and is healthy.
func (r *Reconciler) awaitBoot(ctx context.Context, s *step, class *machinistv1.MachineClass) error {
	m := s.m
	event, verb, failure := Rebooted, "reboot", FailureRebootTimeout
	switch s.fsm.State() {
	case machinistv1.MachineRepairing:
		event, verb, failure = Repaired, "repair", FailureRepairTimeout
	case machinistv1.MachineUpdating:
		event, verb, failure = Updated, "update", FailureUpdateTimeout
	}
	// An update is done only once the Node runs the version it asked for.
	version := ""
	if op := m.Status.Operation; InFlight(op) && op.Type == machinistv1.OperationUpdate {
		version = op.ToVersion
	}
	node, err := r.nodeFor(ctx, m.Status.ProviderID)
	if err != nil {
		return err
	}
	// The boot the operation found; status.bootID may already hold the new
	// one, if the reconcile that called the provider could not store it.
	before := m.Status.BootID
	if op := m.Status.Operation; InFlight(op) && op.BootID != "" {
		before = op.BootID
	}
	if node != nil {
		boot := node.Status.NodeInfo.BootID
		if boot != "" && boot != before && (version == "" || node.Status.NodeInfo.KubeletVersion == version) {
			h, err := r.nodeHealth(ctx, node, s.now)
			if err != nil {
				return err
			}
			if h.healthy {
				previous := before
				if err := s.fire(event); err != nil {
					return err
				}
				r.observeNode(m, node)
				setHealth(m, h)
				meta.RemoveStatusCondition(&m.Status.Conditions, machinistv1.ConditionDrained)
				op := m.Status.Operation
				if InFlight(op) {
					done := fmt.Sprintf("%s: boot ID %s -> %s", pastTense(verb), previous, boot)
					if version != "" {
						done = fmt.Sprintf("updated: version %s -> %s, boot ID %s -> %s", op.FromVersion, version, previous, boot)
					}
					endOperation(s, machinistv1.OperationSucceeded, done)
				}
				// Only what this operation cordoned is uncordoned.
				return r.applyNodeSpec(ctx, node, m, class, op == nil || drains(op.Type, op.Options))
			}
			// Booted, but its Lease is not renewed yet; renewals wake no
			// reconcile, so look again soon.
			s.after(r.drainPoll())
		}
	}
	deadline := s.enteredAt().Add(r.operationTimeout())
	want := "a new boot ID"
	if version != "" {
		want = "version " + version + " and a new boot ID"
	}
	msg := fmt.Sprintf("no Ready Node with %s %s after the provider began the %s", want, r.operationTimeout(), verb)
	if d := deadlineOf(m.Status.Operation); !d.IsZero() && d.Before(deadline) {
		deadline = d
		msg = fmt.Sprintf("no Ready Node with %s %s after the %s began", want, d.Sub(m.Status.Operation.StartedAt.Time), verb)
	}
	if !s.now.Before(deadline) {
		if err := s.failMachine(failure, msg); err != nil {
			return err
		}
		if InFlight(m.Status.Operation) {
			endOperation(s, machinistv1.OperationFailed, msg)
		}
		return nil
	}
	s.after(deadline.Sub(s.now))
	return nil
}
