package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	userinfo "k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/outcome"
	"github.com/machinist-dev/machinist/internal/strictjson"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/lifecycle/pause"
	"github.com/machinist-dev/machinist/nodes"
)

// machinesResource is how errors name Machines: the CRD's resource, the
// object a caller knows.
var machinesResource = schema.GroupResource{Group: machinistv1.GroupVersion.Group, Resource: "machines"}

// maxBody bounds an options body; real ones are a few dozen bytes.
const maxBody = 64 << 10

// attempts bounds how often a request is retried when the Machine changed
// between reading it and recording the operation.
const attempts = 5

// machineStorage is the parent of the verbs: the installer requires one.
// GET on it answers with the Machine's current or last operation.
type machineStorage struct {
	client client.Client
}

var (
	_ rest.Getter = &machineStorage{}
	_ rest.Scoper = &machineStorage{}
)

func (s *machineStorage) New() runtime.Object     { return &subresourcesv1.MachineOperation{} }
func (s *machineStorage) Destroy()                {}
func (s *machineStorage) NamespaceScoped() bool   { return true }
func (s *machineStorage) GetSingularName() string { return "machine" }

// Get implements rest.Getter.
func (s *machineStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	m := &machinistv1.Machine{}
	if err := s.client.Get(ctx, client.ObjectKey{Namespace: request.NamespaceValue(ctx), Name: name}, m); err != nil {
		return nil, translate(err, name)
	}
	if m.Status.Operation == nil {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: subresourcesv1.GroupName, Resource: "machines"}, name)
	}
	return answer(m), nil
}

// verbStorage serves one verb as a subresource that accepts PUT.
type verbStorage struct {
	client client.Client
	typ    machinistv1.OperationType
}

var _ rest.Connecter = &verbStorage{}

// New returns the verb's options type, which discovery and OpenAPI show.
func (s *verbStorage) New() runtime.Object {
	if s.typ == machinistv1.OperationRepair {
		return &subresourcesv1.RepairOptions{}
	}
	return &subresourcesv1.RebootOptions{}
}

func (s *verbStorage) Destroy() {}

// ConnectMethods implements rest.Connecter. PUT makes RBAC's verb "update"
// on machines/reboot, the rule an operator role grants.
func (s *verbStorage) ConnectMethods() []string { return []string{http.MethodPut} }

// NewConnectOptions implements rest.Connecter: options come in the body,
// not the query.
func (s *verbStorage) NewConnectOptions() (runtime.Object, bool, string) { return nil, false, "" }

// Connect implements rest.Connecter. Authentication and authorization have
// run by now; ctx carries the user and the namespace.
func (s *verbStorage) Connect(ctx context.Context, name string, _ runtime.Object, _ rest.Responder) (http.Handler, error) {
	user, ok := request.UserFrom(ctx)
	if !ok {
		return nil, apierrors.NewUnauthorized("no user")
	}
	namespace := request.NamespaceValue(ctx)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		opts, err := s.decode(req, name)
		if err == nil {
			var m *machinistv1.Machine
			if m, err = s.record(req.Context(), namespace, name, opts, user); err == nil {
				responsewriters.WriteObjectNegotiated(codecs, negotiation.DefaultEndpointRestrictions,
					subresourcesv1.SchemeGroupVersion, w, req, http.StatusAccepted, answer(m), false)
				return
			}
		}
		responsewriters.ErrorNegotiated(err, codecs, subresourcesv1.SchemeGroupVersion, w, req)
	}), nil
}

// record admits the request and stores it as the Machine's operation,
// retrying from a fresh read when the Machine changed meanwhile so that
// two requests never both win.
func (s *verbStorage) record(ctx context.Context, namespace, name string, opts *machinistv1.OperationOptions, user userinfo.Info) (*machinistv1.Machine, error) {
	if opts.OverrideDisruptionBudgets {
		if err := s.mayOverride(ctx, namespace, user); err != nil {
			return nil, err
		}
	}
	for i := 0; ; i++ {
		m := &machinistv1.Machine{}
		if err := s.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, m); err != nil {
			return nil, translate(err, name)
		}
		// A paused Machine's operation would be stored and then wait,
		// unseen, for the resume: the caller is told now instead.
		if p, err := pause.Machine(ctx, s.client, m); err != nil {
			return nil, translate(fmt.Errorf("reading the WorkloadCluster of machine %q: %w", m.Name, err), name)
		} else if p.Paused() {
			return nil, apierrors.NewConflict(machinesResource, name, fmt.Errorf("the Machine is paused: %s", p.Message))
		}
		now := time.Now()
		if _, err := operation.Request(m, s.typ, opts, machinistv1.SourceAPI, user.GetName(), now); err != nil {
			return nil, translate(err, name)
		}
		if err := s.admitUnseen(ctx, m, opts); err != nil {
			return nil, translate(err, name)
		}
		// Asked after the state machine, which refuses what is not
		// possible at all, and before the operation is stored: what a
		// budget refuses must not start.
		disrupt := disruption.Request{Machine: m, Reason: reasonOf(s.typ), OperationID: m.Status.Operation.ID, By: user.GetName(),
			Override: opts.OverrideDisruptionBudgets}
		if err := disruption.Direct(s.client).Admit(ctx, disrupt, now); err != nil {
			return nil, translateRefusal(err, name)
		}
		// A user name past requestedBy's bound is cut, not refused.
		m.Status.Fit()
		err := s.client.Status().Update(ctx, m)
		if err == nil {
			return m, nil
		}
		if outcome.Unknown(err) {
			// The reply was lost, or kube-apiserver gave up waiting:
			// the operation may be stored all the same. If it is, it
			// is carried out, and the request succeeded.
			if stored, ok := s.stored(ctx, m); ok {
				return stored, nil
			}
		}
		// The budgets counted an operation that was not stored.
		_ = disruption.Direct(s.client).Release(ctx, disrupt)
		if !apierrors.IsConflict(err) || i+1 == attempts {
			return nil, translate(err, name)
		}
	}
}

// admitUnseen refuses, with 409, a drain of a Machine whose cluster cannot
// be reached, as the WorkloadCluster's status says.
func (s *verbStorage) admitUnseen(ctx context.Context, m *machinistv1.Machine, opts *machinistv1.OperationOptions) error {
	if !operation.Drains(s.typ, opts) {
		return nil
	}
	reach, err := nodes.Reachability(ctx, s.client, m)
	if err != nil {
		return fmt.Errorf("reading the WorkloadCluster of machine %q: %w", m.Name, err)
	}
	unseen := ""
	if reach.Down != nil {
		unseen = reach.Down.Unseen()
	}
	return operation.AdmitUnseen(m, s.typ, opts, unseen)
}

// stored reads m back and reports whether it holds the operation this
// request wrote.
func (s *verbStorage) stored(ctx context.Context, m *machinistv1.Machine) (*machinistv1.Machine, bool) {
	back := &machinistv1.Machine{}
	if err := s.client.Get(ctx, client.ObjectKeyFromObject(m), back); err != nil {
		return nil, false
	}
	op := back.Status.Operation
	return back, op != nil && op.ID == m.Status.Operation.ID
}

// decode reads the options body strictly: malformed JSON is 400, an
// unknown field or a bad value 422, naming the field.
func (s *verbStorage) decode(req *http.Request, name string) (*machinistv1.OperationOptions, error) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxBody+1))
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("reading the request body: %v", err))
	}
	if len(body) > maxBody {
		return nil, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("options bodies are at most %d bytes", maxBody))
	}
	kind := "RebootOptions"
	var target any = &subresourcesv1.RebootOptions{}
	if s.typ == machinistv1.OperationRepair {
		kind, target = "RepairOptions", &subresourcesv1.RepairOptions{}
	}
	gk := schema.GroupKind{Group: subresourcesv1.GroupName, Kind: kind}
	if len(bytes.TrimSpace(body)) > 0 {
		if err := strictjson.Unmarshal(body, target); err != nil {
			var syntax *json.SyntaxError
			var typeErr *json.UnmarshalTypeError
			switch {
			case errors.Is(err, strictjson.ErrTrailingData):
				return nil, apierrors.NewBadRequest("the body holds more than one JSON object, or something after it")
			case errors.As(err, &syntax), errors.Is(err, io.ErrUnexpectedEOF):
				return nil, apierrors.NewBadRequest(fmt.Sprintf("the body is not a JSON %s: %v", kind, err))
			case errors.As(err, &typeErr):
				return nil, apierrors.NewInvalid(gk, name, field.ErrorList{
					field.Invalid(field.NewPath(typeErr.Field), string(body), fmt.Sprintf("must be a %s", typeErr.Type))})
			default:
				// encoding/json says `json: unknown field "x"`.
				return nil, apierrors.NewInvalid(gk, name, field.ErrorList{field.Invalid(field.NewPath(""), string(body), err.Error())})
			}
		}
	}
	var errs field.ErrorList
	opts := &machinistv1.OperationOptions{}
	switch o := target.(type) {
	case *subresourcesv1.RebootOptions:
		errs = append(errs, checkTypeMeta(o.TypeMeta, kind)...)
		switch o.Mode {
		case "", subresourcesv1.RebootSoft, subresourcesv1.RebootHard:
		default:
			errs = append(errs, field.NotSupported(field.NewPath("mode"), o.Mode, []string{string(subresourcesv1.RebootSoft), string(subresourcesv1.RebootHard)}))
		}
		errs = append(errs, checkGrace(o.GracePeriodSeconds)...)
		opts.Mode, opts.SkipDrain, opts.GracePeriodSeconds = machinistv1.RebootSoft, skipDrain(o.Drain), o.GracePeriodSeconds
		if o.Mode == subresourcesv1.RebootHard {
			opts.Mode = machinistv1.RebootHard
		}
		opts.OverrideDisruptionBudgets = o.OverrideDisruptionBudgets
	case *subresourcesv1.RepairOptions:
		errs = append(errs, checkTypeMeta(o.TypeMeta, kind)...)
		if len(o.Reason) > 256 {
			errs = append(errs, field.TooLong(field.NewPath("reason"), "", 256))
		}
		errs = append(errs, checkGrace(o.GracePeriodSeconds)...)
		opts.Reason, opts.SkipDrain, opts.GracePeriodSeconds = o.Reason, skipDrain(o.Drain), o.GracePeriodSeconds
		opts.OverrideDisruptionBudgets = o.OverrideDisruptionBudgets
	}
	if len(errs) > 0 {
		return nil, apierrors.NewInvalid(gk, name, errs)
	}
	return opts, nil
}

// checkTypeMeta accepts a body without apiVersion and kind, or with this
// group's and the verb's own.
func checkTypeMeta(tm metav1.TypeMeta, kind string) field.ErrorList {
	var errs field.ErrorList
	if tm.APIVersion != "" && tm.APIVersion != subresourcesv1.SchemeGroupVersion.String() {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), tm.APIVersion, []string{subresourcesv1.SchemeGroupVersion.String()}))
	}
	if tm.Kind != "" && tm.Kind != kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), tm.Kind, []string{kind}))
	}
	return errs
}

func checkGrace(g *int64) field.ErrorList {
	if g != nil && *g < 0 {
		return field.ErrorList{field.Invalid(field.NewPath("gracePeriodSeconds"), *g, "must not be negative")}
	}
	return nil
}

// translate turns what went wrong into the status a client should see: a
// refusal by the state machine is 409 Conflict with its reason, and errors
// from kube-apiserver keep their own status.
func translate(err error, name string) error {
	if errors.Is(err, operation.ErrRefused) {
		return apierrors.NewConflict(machinesResource, name, err)
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return err
	}
	return apierrors.NewInternalError(err)
}

// mayOverride asks kube-apiserver whether user may override the
// disruption budgets of namespace: the verb "override" on
// machinedisruptionbudgets, a permission of its own that no built-in role
// grants, so that the right to reboot is not the right to ignore budgets.
func (s *verbStorage) mayOverride(ctx context.Context, namespace string, user userinfo.Info) error {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range user.GetExtra() {
		extra[k] = v
	}
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.GetName(), UID: user.GetUID(), Groups: user.GetGroups(), Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: "override", Group: machinistv1.GroupVersion.Group, Resource: "machinedisruptionbudgets",
		},
	}}
	if err := s.client.Create(ctx, review); err != nil {
		return apierrors.NewInternalError(fmt.Errorf("asking whether %q may override disruption budgets: %w", user.GetName(), err))
	}
	if !review.Status.Allowed {
		return apierrors.NewForbidden(schema.GroupResource{Group: machinistv1.GroupVersion.Group, Resource: "machinedisruptionbudgets"}, "",
			fmt.Errorf("user %q may not override the MachineDisruptionBudgets of namespace %q: overrideDisruptionBudgets needs the verb override on machinedisruptionbudgets.machinist.dev there", user.GetName(), namespace))
	}
	return nil
}

// reasonOf is the disruption a verb is.
func reasonOf(typ machinistv1.OperationType) machinistv1.DisruptionReason {
	if typ == machinistv1.OperationRepair {
		return machinistv1.DisruptionRepair
	}
	return machinistv1.DisruptionReboot
}

// translateRefusal answers a budget's refusal as the Eviction API answers
// a PodDisruptionBudget's: 429 Too Many Requests with a Retry-After.
func translateRefusal(err error, name string) error {
	r, ok := disruption.AsRefusal(err)
	if !ok {
		return translate(err, name)
	}
	seconds := int(math.Ceil(r.RetryAfter.Seconds()))
	tooMany := apierrors.NewTooManyRequests(r.Message, seconds)
	tooMany.ErrStatus.Details.Name = name
	tooMany.ErrStatus.Details.Group = machinesResource.Group
	tooMany.ErrStatus.Details.Kind = machinesResource.Resource
	if r.Budget != "" {
		// None when the budgets were only too busy to decide.
		tooMany.ErrStatus.Details.Causes = []metav1.StatusCause{{
			Type: machinistv1.CauseDisruptionBudget, Message: r.Message, Field: "machinedisruptionbudget/" + r.Budget,
		}}
	}
	return tooMany
}

// answer is the MachineOperation for m's operation.
func answer(m *machinistv1.Machine) *subresourcesv1.MachineOperation {
	op := m.Status.Operation
	out := &subresourcesv1.MachineOperation{
		TypeMeta:    metav1.TypeMeta{APIVersion: subresourcesv1.SchemeGroupVersion.String(), Kind: "MachineOperation"},
		ObjectMeta:  metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace},
		Type:        string(op.Type),
		ID:          op.ID,
		State:       string(op.State),
		RequestedBy: op.RequestedBy,
	}
	if op.RequestedAt != nil {
		out.RequestedAt = *op.RequestedAt
	}
	return out
}

// skipDrain is the verbs' drain option (false: do not drain) in the
// Machine's words.
func skipDrain(drain *bool) *bool {
	if drain == nil {
		return nil
	}
	return new(!*drain)
}
