package admission_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/admission"
)

func succeeded(m *machinistv1.Machine) bool {
	op := m.Status.Operation
	return op != nil && op.State == machinistv1.OperationSucceeded && m.Status.Phase == machinistv1.MachineRunning
}

// TestPatchAloneCannotRequest: pat may patch Machines but not use the
// verbs, so every request pat makes is refused at admission, saying which
// permission is missing, and nothing is stored.
func TestPatchAloneCannotRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := peoplesNamespace(t)
	m := runningMachine(t, ctx, ns, "m1")
	key := client.ObjectKeyFromObject(m)

	for _, tc := range []struct{ value, verb string }{{"reboot", "reboot"}, {"repair", "repair"}, {" Reboot ", "reboot"}} {
		_, err := annotate(ctx, pat, key, request(tc.value, ""))
		want := fmt.Sprintf(`user "pat" may not request a %s of Machine %s/m1: machinist.dev/request=%s needs update on machines/%s in API group subresources.machinist.dev`,
			tc.verb, ns, tc.verb, tc.verb)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("pat's request %q: %v, want Forbidden saying %q", tc.value, err, want)
		}
	}
	// Not a verb at all: invalid, whoever asks.
	for _, user := range []string{pat, olga} {
		_, err := annotate(ctx, user, key, request("explode", ""))
		if want := `machinist.dev/request must be reboot or repair, not "explode"`; !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s's request \"explode\": %v (%+v), want Invalid saying %q", user, err, statusOf(err), want)
		}
	}
	// What a person sees.
	out, err := env.Kubectl(ctx, "annotate", "--as="+pat, "-n", ns, "machine", "m1", machinistv1.RequestAnnotation+"=reboot")
	if err == nil {
		t.Errorf("kubectl annotate as pat succeeded:\n%s", out)
	} else if msg := err.Error(); !strings.Contains(msg, `may not request a reboot of Machine `+ns+`/m1`) || !strings.Contains(msg, "patch on machines is not enough") {
		t.Errorf("kubectl annotate as pat: %v", err)
	}

	got := &machinistv1.Machine{}
	if err := env.Client.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != m.ResourceVersion || got.Status.Operation != nil {
		t.Errorf("refused requests changed the Machine: resourceVersion %s → %s, operation %+v", m.ResourceVersion, got.ResourceVersion, got.Status.Operation)
	}

	// Every other edit is pat's to make.
	if err := as(pat).Patch(ctx, got, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"rack":"r7"},"annotations":{"note":"disk 3 is slow"}}}`))); err != nil {
		t.Errorf("pat's edit of a label and an annotation: %v", err)
	}
	// ... and starts nothing: nothing is to happen in these two seconds.
	time.Sleep(2 * time.Second)
	if err := env.Client.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Operation != nil || got.Status.Phase != machinistv1.MachineRunning {
		t.Errorf("after pat's edits the Machine is %s with operation %+v", got.Status.Phase, got.Status.Operation)
	}
}

// TestOperatorRequestIsCarriedOutAndSigned: olga may use the verbs, so her
// request is admitted, kube-apiserver stamps her name, the reboot happens
// and the operation records her; the controllers, running as the manager's
// ServiceAccount, remove the request as before.
func TestOperatorRequestIsCarriedOutAndSigned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := peoplesNamespace(t)
	m := runningMachine(t, ctx, ns, "m1")

	admitted, err := annotate(ctx, olga, client.ObjectKeyFromObject(m), request("reboot", ""))
	if err != nil {
		t.Fatalf("olga's request: %v", err)
	}
	if by := admitted.Annotations[machinistv1.RequestedByAnnotation]; by != olga {
		t.Errorf("olga's request was stored with %s=%q, want %q", machinistv1.RequestedByAnnotation, by, olga)
	}
	done := await(t, ctx, m, "rebooted", succeeded)
	op := done.Status.Operation
	if op.Type != machinistv1.OperationReboot || op.Source != machinistv1.SourceAnnotation || op.RequestedBy != olga {
		t.Errorf("operation %s %s from %s requested by %q, want a reboot from Annotation requested by %q", op.ID, op.Type, op.Source, op.RequestedBy, olga)
	}
	if done.Status.BootID == m.Status.BootID {
		t.Errorf("boot ID %s did not change", done.Status.BootID)
	}
	for _, gone := range []string{machinistv1.RequestAnnotation, machinistv1.RequestedByAnnotation} {
		if v, ok := done.Annotations[gone]; ok {
			t.Errorf("%s=%q is still on the Machine after the request was taken", gone, v)
		}
	}
	if last := done.Annotations[machinistv1.LastRequestAnnotation]; last != op.ID {
		t.Errorf("%s=%q, want the operation's ID %s", machinistv1.LastRequestAnnotation, last, op.ID)
	}
	notes, err := events(ctx, m, "OperationRequested")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("reboot %s requested by annotation of olga", op.ID); !slices.Contains(notes, want) {
		t.Errorf("OperationRequested Events %q, want %q", notes, want)
	}
}

// TestNoOneRequestsInAnothersName: a requester named by hand is
// overwritten with the real one on a request, refused without one, and a
// waiting request cannot be taken over by someone without the verb.
func TestNoOneRequestsInAnothersName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := peoplesNamespace(t)
	m := runningMachine(t, ctx, ns, "m1")
	key := client.ObjectKeyFromObject(m)

	admitted, err := annotate(ctx, olga, key, request("repair", mallory))
	if err != nil {
		t.Fatalf("olga's request naming mallory: %v", err)
	}
	if by := admitted.Annotations[machinistv1.RequestedByAnnotation]; by != olga {
		t.Errorf("olga's request naming mallory was stored with %s=%q, want %q", machinistv1.RequestedByAnnotation, by, olga)
	}
	repaired := await(t, ctx, m, "repaired", succeeded)
	if op := repaired.Status.Operation; op.Type != machinistv1.OperationRepair || op.RequestedBy != olga {
		t.Errorf("operation %s %s requested by %q, want a repair requested by %q", op.ID, op.Type, op.RequestedBy, olga)
	}

	// A requester alone, naming someone else.
	for _, tc := range []struct{ user, name string }{{pat, olga}, {olga, mallory}} {
		_, err := annotate(ctx, tc.user, key, map[string]*string{machinistv1.RequestedByAnnotation: &tc.name})
		want := fmt.Sprintf(`machinist.dev/requested-by may only hold your own user name ("%s"), not "%s"`, tc.user, tc.name)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s setting %s=%s: %v, want Forbidden saying %q", tc.user, machinistv1.RequestedByAnnotation, tc.name, err, want)
		}
	}

	// A waiting request: the controllers are stopped so that it waits.
	err = controllers.Paused(func() error {
		if _, err := annotate(ctx, olga, key, request("reboot", "")); err != nil {
			return fmt.Errorf("olga's request: %w", err)
		}
		name := pat
		for _, change := range []map[string]*string{
			{machinistv1.RequestedByAnnotation: &name},
			{machinistv1.RequestedByAnnotation: nil},
		} {
			if _, err := annotate(ctx, pat, key, change); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "needs update on machines/reboot") {
				t.Errorf("pat changing the requester of olga's waiting request (%s=%v): %v, want Forbidden", machinistv1.RequestedByAnnotation, change[machinistv1.RequestedByAnnotation], err)
			}
		}
		// Withdrawing it is an edit like any other.
		withdrawn, err := annotate(ctx, pat, key, map[string]*string{machinistv1.RequestAnnotation: nil})
		if err != nil {
			return fmt.Errorf("pat removing olga's waiting request: %w", err)
		}
		if _, ok := withdrawn.Annotations[machinistv1.RequestAnnotation]; ok {
			t.Errorf("the request is still there after pat removed it")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The controllers tidy away the withdrawn request's requester, and
	// start nothing.
	tidy := await(t, ctx, m, "without a requester", func(m *machinistv1.Machine) bool {
		_, ok := m.Annotations[machinistv1.RequestedByAnnotation]
		return !ok
	})
	if op := tidy.Status.Operation; op == nil || op.ID != repaired.Status.Operation.ID {
		t.Errorf("the withdrawn request became operation %+v", op)
	}
}

// TestControllersRemoveRequestsTheyRefuse: a request the state machine
// refuses (the Machine is not Running) is admitted, as RBAC allows it, and
// the controllers remove it. They run as the manager's ServiceAccount,
// which may not use the verbs: its writes pass because removing a request
// is not making one.
func TestControllersRemoveRequestsTheyRefuse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: managerSA, Groups: []string{"system:serviceaccounts", "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: "update", Group: subresourcesv1.GroupName, Resource: subresourcesv1.Machines, Subresource: subresourcesv1.Reboot,
			Namespace: "default", Name: "m1",
		},
	}}
	if err := env.Client.Create(ctx, review); err != nil {
		t.Fatal(err)
	}
	if review.Status.Allowed {
		t.Fatalf("the manager's ServiceAccount may update machines/reboot: this test would prove nothing")
	}

	ns := peoplesNamespace(t)
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "waiting"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "nosuch"}, Version: "v1.37.2"},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	await(t, ctx, m, "Pending", func(m *machinistv1.Machine) bool { return m.Status.Phase == machinistv1.MachinePending })
	if _, err := annotate(ctx, olga, client.ObjectKeyFromObject(m), request("reboot", "")); err != nil {
		t.Fatalf("olga's request: %v", err)
	}
	got := await(t, ctx, m, "without the request", func(m *machinistv1.Machine) bool {
		_, req := m.Annotations[machinistv1.RequestAnnotation]
		_, by := m.Annotations[machinistv1.RequestedByAnnotation]
		return !req && !by
	})
	if got.Status.Operation != nil {
		t.Errorf("a request on a Pending Machine became operation %+v", got.Status.Operation)
	}
	notes, err := events(ctx, m, "OperationRefused")
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) == 0 || !strings.Contains(notes[0], "reboot") {
		t.Errorf("OperationRefused Events %q, want one about the reboot", notes)
	}
}

// TestWithoutTheMutatingPolicy is a cluster without MutatingAdmissionPolicy:
// the validating policy alone still requires the verb, and believes a
// requester only if it is the requester's own name.
func TestWithoutTheMutatingPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "machinist-request-requester"}}
	if err := env.Client.Delete(ctx, binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := admission.Install(ctx, env.Client); err != nil {
			t.Error(err)
		}
		if err := awaitPolicies(ctx, true); err != nil {
			t.Error(err)
		}
	})
	if err := awaitPolicies(ctx, false); err != nil {
		t.Fatal(err)
	}
	ns := peoplesNamespace(t)
	m := runningMachine(t, ctx, ns, "m1")
	key := client.ObjectKeyFromObject(m)

	if _, err := annotate(ctx, pat, key, request("reboot", pat)); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "needs update on machines/reboot") {
		t.Errorf("pat's request: %v, want Forbidden", err)
	}
	if _, err := annotate(ctx, olga, key, request("reboot", mallory)); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), `machinist.dev/requested-by may only hold your own user name ("olga"), not "mallory"`) {
		t.Errorf("olga's request naming mallory: %v, want Forbidden", err)
	}

	if _, err := annotate(ctx, olga, key, request("reboot", olga)); err != nil {
		t.Fatalf("olga's request naming herself: %v", err)
	}
	first := await(t, ctx, m, "rebooted", succeeded)
	if by := first.Status.Operation.RequestedBy; by != olga {
		t.Errorf("olga's request naming herself recorded requestedBy %q", by)
	}
	if _, err := annotate(ctx, olga, key, request("reboot", "")); err != nil {
		t.Fatalf("olga's request naming no one: %v", err)
	}
	second := await(t, ctx, m, "rebooted again", func(m *machinistv1.Machine) bool {
		return succeeded(m) && m.Status.Operation.ID != first.Status.Operation.ID
	})
	if by := second.Status.Operation.RequestedBy; by != "" {
		t.Errorf("a request naming no one recorded requestedBy %q", by)
	}
}

// TestVersionChangeNamesItsRequester: changing a Machine's spec.version
// updates it in place, and kube-apiserver records who changed it; a name
// written by hand is refused.
func TestVersionChangeNamesItsRequester(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := peoplesNamespace(t)
	m := runningMachine(t, ctx, ns, "m1")
	key := client.ObjectKeyFromObject(m)

	name := olga
	_, err := annotate(ctx, pat, key, map[string]*string{machinistv1.VersionRequestedByAnnotation: &name})
	if want := `machinist.dev/version-requested-by may only hold your own user name ("pat"), not "olga"`; !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("pat naming olga as the version's requester: %v, want Forbidden saying %q", err, want)
	}

	patched := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m1"}}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}},"spec":{"version":"v1.38.0"}}`, machinistv1.VersionRequestedByAnnotation, mallory)
	if err := as(pat).Patch(ctx, patched, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
		t.Fatalf("pat's change of the version: %v", err)
	}
	if by := patched.Annotations[machinistv1.VersionRequestedByAnnotation]; by != pat {
		t.Errorf("pat's change of the version, naming mallory, was stored with %s=%q, want %q", machinistv1.VersionRequestedByAnnotation, by, pat)
	}
	done := await(t, ctx, m, "updated", func(m *machinistv1.Machine) bool {
		return succeeded(m) && m.Status.Operation.Type == machinistv1.OperationUpdate
	})
	if op := done.Status.Operation; op.RequestedBy != pat || op.ToVersion != "v1.38.0" {
		t.Errorf("update %s to %s requested by %q, want v1.38.0 requested by %q", op.ID, op.ToVersion, op.RequestedBy, pat)
	}
}
