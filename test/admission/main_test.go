// Package admission_test proves that the admission policies of
// config/admission govern the machinist.dev/request annotation exactly like
// the verbs: a real kube-apiserver runs them against impersonated users,
// while the controllers run as the manager's ServiceAccount with the
// machinist-manager ClusterRole and nothing more.
package admission_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/admission"
	"github.com/machinist-dev/machinist/manager"
)

// The people and the controllers of these tests. pat may edit Machines
// (get and patch) and nothing more; olga may edit them too and is bound to
// machinist-machine-operator, which grants the verbs.
const (
	pat       = "pat"
	olga      = "olga"
	mallory   = "mallory"
	managerSA = "system:serviceaccount:machinist-system:machinist-manager"
	// editor is the Role that lets pat and olga patch Machines.
	editor = "machine-editor"
	class  = "small"
)

var (
	env         *testenv.Env
	controllers *testenv.Controllers
	// probe is a Machine the policies are probed on with dry runs; its
	// class does not exist, so it stays Pending and nothing acts on it.
	probe types.NamespacedName
)

func TestMain(m *testing.M) {
	// Errors only: a controller's error is worth reading when a test fails.
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	os.Exit(testenv.RunWith(m, func(e *testenv.Env) (func(), error) {
		env = e
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := setup(ctx); err != nil {
			if controllers != nil {
				err = errors.Join(err, controllers.Stop())
			}
			return nil, err
		}
		return func() { _ = controllers.Stop() }, nil
	}))
}

// setup installs the ClusterRoles and the policies as config/default does,
// binds the manager's ServiceAccount to its role, starts the controllers
// as that ServiceAccount and waits until kube-apiserver enforces the
// policies.
func setup(ctx context.Context) error {
	if err := env.CreateClusterRoles(ctx, "role.yaml", "operator.yaml"); err != nil {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "machinist-manager"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "machinist-manager"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "machinist-system", Name: "machinist-manager"}},
	}
	if err := env.Client.Create(ctx, binding); err != nil {
		return err
	}
	if err := admission.Install(ctx, env.Client); err != nil {
		return err
	}
	var err error
	controllers, err = env.StartControllersAs(rest.ImpersonationConfig{
		UserName: managerSA,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:machinist-system", "system:authenticated"},
	}, manager.Options{
		MachineWorkers:   4,
		Backoff:          machine.Backoff{Base: 100 * time.Millisecond, Cap: 2 * time.Second},
		DrainPoll:        200 * time.Millisecond,
		OperationTimeout: 20 * time.Second,
	}, testenv.Leases{DurationSeconds: 3, RenewInterval: 500 * time.Millisecond})
	if err != nil {
		return err
	}

	ns, err := env.Namespace(ctx, "admission")
	if err != nil {
		return err
	}
	if err := grant(ctx, ns); err != nil {
		return err
	}
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "nosuch"}, Version: "v1.37.2"},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		return err
	}
	probe = client.ObjectKeyFromObject(m)
	return awaitPolicies(ctx, true)
}

// peoplesNamespace creates a namespace for one test, with what grant
// gives in it.
func peoplesNamespace(t *testing.T) string {
	t.Helper()
	ns := env.NewNamespace(t, "admission")
	if err := grant(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

// grant lets pat and olga edit the Machines of ns, makes olga an operator
// there, and creates the MachineClass class.
func grant(ctx context.Context, ns string) error {
	objs := []client.Object{
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: editor},
			Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{machinistv1.GroupVersion.Group}, Resources: []string{"machines"},
				Verbs: []string{"get", "list", "watch", "patch"},
			}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: editor},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: editor},
			Subjects: []rbacv1.Subject{
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: pat},
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: olga},
			},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "operators"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "machinist-machine-operator"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: olga}},
		},
	}
	for _, o := range objs {
		if err := env.Client.Create(ctx, o); err != nil {
			return err
		}
	}
	if err := env.InmemoryClass(ctx, ns, class, ""); err != nil {
		return err
	}
	return nil
}

// as is a client that acts as user.
func as(user string) client.Client {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		panic(err)
	}
	return c
}

// annotate sets (a value) or removes (nil) annotations of the Machine key
// as user with a merge patch, as kubectl annotate does, and returns the
// Machine kube-apiserver answered with.
func annotate(ctx context.Context, user string, key types.NamespacedName, annotations map[string]*string, opts ...client.PatchOption) (*machinistv1.Machine, error) {
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return nil, err
	}
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	err = as(user).Patch(ctx, m, client.RawPatch(types.MergePatchType, data), opts...)
	return m, err
}

// request is the annotations of a request of verb, with a requester if by
// is not empty.
func request(verb, by string) map[string]*string {
	a := map[string]*string{machinistv1.RequestAnnotation: &verb}
	if by != "" {
		a[machinistv1.RequestedByAnnotation] = &by
	}
	return a
}

// awaitPolicies waits until kube-apiserver enforces the validating policy
// and, if stamping, also the mutating one (or, if not, no longer runs it),
// probing with server dry runs: they are admitted or refused as the real
// request would be, and store nothing.
func awaitPolicies(ctx context.Context, stamping bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		last = probePolicies(ctx, stamping)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the admission policies are not in effect after a minute: %w", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func probePolicies(ctx context.Context, stamping bool) error {
	dry := client.DryRunAll
	if _, err := annotate(ctx, pat, probe, request("reboot", ""), dry); !apierrors.IsForbidden(err) {
		return fmt.Errorf("a request of pat, who may only patch, is answered %v, want Forbidden", err)
	}
	m, err := annotate(ctx, olga, probe, request("reboot", mallory), dry)
	switch {
	case stamping && err != nil:
		return fmt.Errorf("olga's request naming mallory: %w, want it admitted with olga's name", err)
	case stamping && m.Annotations[machinistv1.RequestedByAnnotation] != olga:
		return fmt.Errorf("olga's request naming mallory is admitted with %s=%q", machinistv1.RequestedByAnnotation, m.Annotations[machinistv1.RequestedByAnnotation])
	case !stamping && !apierrors.IsForbidden(err):
		return fmt.Errorf("without the mutating policy, olga's request naming mallory is answered %v, want Forbidden", err)
	}
	return nil
}

// runningMachine creates a Machine of the inmemory class in ns and waits
// until it is Running.
func runningMachine(t *testing.T, ctx context.Context, ns, name string) *machinistv1.Machine {
	t.Helper()
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class}, Version: "v1.37.2"},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	return await(t, ctx, m, "Running", func(m *machinistv1.Machine) bool { return m.Status.Phase == machinistv1.MachineRunning })
}

// await polls the Machine until done says so, for at most 30s.
func await(t *testing.T, ctx context.Context, m *machinistv1.Machine, what string, done func(*machinistv1.Machine) bool) *machinistv1.Machine {
	t.Helper()
	got := &machinistv1.Machine{}
	got.Namespace, got.Name = m.Namespace, m.Name
	testenv.WaitForObject(t, env.Client, 30*time.Second, fmt.Sprintf("Machine %s/%s %s", m.Namespace, m.Name, what), got,
		func(got *machinistv1.Machine) error {
			if !done(got) {
				return fmt.Errorf("phase %s, annotations %v, operation %+v", got.Status.Phase, got.Annotations, got.Status.Operation)
			}
			return nil
		})
	return got
}

// events lists the messages of the Events about the Machine with reason.
//
// A controller's Events are written by a broadcaster after the change
// they explain, so they are waited for: up to ten seconds for the first.
func events(ctx context.Context, m *machinistv1.Machine, reason string) ([]string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var list eventsv1.EventList
		if err := env.Client.List(ctx, &list, client.InNamespace(m.Namespace)); err != nil {
			return nil, err
		}
		var out []string
		for _, e := range list.Items {
			if e.Regarding.Name == m.Name && e.Reason == reason {
				out = append(out, e.Note)
			}
		}
		if len(out) > 0 || time.Now().After(deadline) {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return out, nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// statusOf is the API status of a refusal, for messages.
func statusOf(err error) metav1.Status {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return s.Status()
	}
	return metav1.Status{Message: fmt.Sprint(err)}
}
