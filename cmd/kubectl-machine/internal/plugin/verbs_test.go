package plugin

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// TestVerbs sends reboot and repair through the real kubectl and
// kube-apiserver: first while no verbs server is registered, then to the
// real one, with the controllers carrying the operations out.
func TestVerbs(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "kubectl-machine", testenv.Small, testenv.Sick)

	t.Run("without a verbs server kube-apiserver answers 404", func(t *testing.T) {
		r := kubectl(t, ns, "reboot", "m1", "--mode", "hard")
		want := `error: cannot reboot machine "m1": the API server does not serve subresources.machinist.dev/v1alpha1 (is the Machinist verbs server installed and its APIService available?)` + "\n"
		if r.code != ExitRefused || r.stderr != want {
			t.Errorf("want exit code %d and stderr %q:\n%s", ExitRefused, want, r)
		}
	})

	t.Run("RBAC refuses a user without the right", func(t *testing.T) {
		// Authorization comes before routing, so this holds with or
		// without a verbs server.
		r := plugin(ns, "reboot", "m1", "--as", "nobody")
		want := `error: not allowed to reboot machine "m1": machines.subresources.machinist.dev "m1" is forbidden: User "nobody" cannot update resource "machines/reboot"`
		if r.code != ExitRefused || !strings.HasPrefix(r.stderr, want) {
			t.Errorf("want exit code %d and stderr starting %q:\n%s", ExitRefused, want, r)
		}
	})

	t.Run("bad flags are usage errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"reboot", "m1", "--mode", "gentle"},
			{"reboot", "m1", "--grace-period", "-2"},
			{"reboot", "md/m1"},
			{"reboot"},
			{"repair", "m1", "--mode", "hard"},
		} {
			if r := plugin(ns, args...); r.code != ExitError || !strings.HasPrefix(r.stderr, "error: ") {
				t.Errorf("%v should be a usage error (exit code %d):\n%s", args, ExitError, r)
			}
		}
	})

	v, err := env.StartVerbs()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Stop unregisters it too: the tests after this one find the
		// group absent, not unavailable.
		if err := v.Stop(); err != nil {
			t.Error(err)
		}
	})
	startControllers(t)
	// A reboot that takes a while, so that a second request surely finds
	// the first in flight.
	if err := env.InmemoryClass(ctx, ns, "slow", `{"rebootLatency":"2s"}`); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: ns, Name: "m1"}
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "slow"}, Version: "v1.37.1"},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// While the controllers still run, so that they let it go.
		if err := env.Client.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
			t.Error(err)
		}
	})
	testenv.WaitForObject(t, env.Client, time.Minute, "the Machine Running", machineAt(key), func(m *machinistv1.Machine) error {
		if m.Status.Phase != machinistv1.MachineRunning || m.Status.BootID == "" {
			return fmt.Errorf("machine is %q with boot ID %q", m.Status.Phase, m.Status.BootID)
		}
		return nil
	})

	t.Run("reboot --wait follows the operation to the new boot ID", func(t *testing.T) {
		before := get(t, key)
		r := kubectl(t, ns, "reboot", "m1", "--wait", "--timeout", "60s")
		after := get(t, key)
		if r.code != ExitOK {
			t.Fatal(r)
		}
		op := after.Status.Operation
		if op == nil || op.Type != machinistv1.OperationReboot || op.State != machinistv1.OperationSucceeded || op.RequestedBy != "admin" {
			t.Fatalf("the Machine's operation is %+v", op)
		}
		for _, want := range []string{
			`^machine/m1 reboot accepted \(` + regexp.QuoteMeta(op.ID) + `\)\n`,
			`(?m)^machine/m1: Rebooting, reboot Running`,
			`\nmachine/m1 rebooted \(boot ID ` + regexp.QuoteMeta(before.Status.BootID) + ` -> ` + regexp.QuoteMeta(after.Status.BootID) + `\)\n$`,
		} {
			if !regexp.MustCompile(want).MatchString(r.stdout) {
				t.Errorf("output does not match %s:\n%s", want, r)
			}
		}
		if before.Status.BootID == after.Status.BootID {
			t.Errorf("the boot ID stayed %s", after.Status.BootID)
		}
	})

	t.Run("a verb while another is in flight is refused with 409", func(t *testing.T) {
		r := plugin(ns, "reboot", "m1", "--mode", "hard", "--no-drain", "--grace-period", "5")
		if r.code != ExitOK || !strings.HasPrefix(r.stdout, "machine/m1 reboot accepted (") {
			t.Fatal(r)
		}
		opts := get(t, key).Status.Operation.Options
		if opts == nil || opts.Mode != machinistv1.RebootHard || opts.SkipDrain == nil || !*opts.SkipDrain || opts.GracePeriodSeconds == nil || *opts.GracePeriodSeconds != 5 {
			t.Errorf("the operation's options are %+v", opts)
		}
		r = plugin(ns, "repair", "m1")
		if want := `error: machine "m1" cannot be repaired now: `; r.code != ExitRefused || !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, "in flight") {
			t.Errorf("want exit code %d and stderr starting %q, naming the operation in flight:\n%s", ExitRefused, want, r)
		}
		testenv.WaitForObject(t, env.Client, time.Minute, "the reboot done", machineAt(key), func(m *machinistv1.Machine) error {
			if op := m.Status.Operation; op.State != machinistv1.OperationSucceeded {
				return fmt.Errorf("the reboot is %s: %s", op.State, op.Message)
			}
			return nil
		})
	})

	t.Run("bad options are refused with 422", func(t *testing.T) {
		r := plugin(ns, "repair", "m1", "--reason", strings.Repeat("x", 300))
		if want := `error: invalid repair options for machine "m1": `; r.code != ExitRefused || !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, "reason") {
			t.Errorf("want exit code %d and stderr starting %q:\n%s", ExitRefused, want, r)
		}
	})

	t.Run("a missing Machine is refused with 404", func(t *testing.T) {
		for _, args := range [][]string{{"reboot", "nosuch"}, {"repair", "nosuch", "--wait"}} {
			if r := plugin(ns, args...); r.code != ExitRefused || !strings.Contains(r.stderr, `"nosuch" not found`) {
				t.Errorf("%v: want exit code %d saying so:\n%s", args, ExitRefused, r)
			}
		}
	})

	t.Run("a disruption budget's refusal is 429, said with when to try again, at once", func(t *testing.T) {
		budget := &machinistv1.MachineDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "none"},
			Spec: machinistv1.MachineDisruptionBudgetSpec{MaxDisrupted: intstr.FromInt32(0), Selector: machinistv1.LabelSelector{
				MatchExpressions: []machinistv1.LabelSelectorRequirement{{Key: "example.com/nothing", Operator: metav1.LabelSelectorOpDoesNotExist}},
			}},
		}
		if err := env.Client.Create(ctx, budget); err != nil {
			t.Fatal(err)
		}
		before := get(t, key)
		start := time.Now()
		r := plugin(ns, "reboot", "m1")
		want := `error: machine "m1" cannot be rebooted now: MachineDisruptionBudget none allows no more disruptions: 0 of its 1 Machines are disrupted and it allows 0; the reboot of Machine ` +
			ns + `/m1 waits until one is back (try again in 10s)` + "\n"
		if r.code != ExitRefused || r.stderr != want {
			t.Errorf("want exit code %d and stderr %q:\n%s", ExitRefused, want, r)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the refusal took %s: client-go must not sleep through the Retry-After", took)
		}
		if after := get(t, key); after.Status.Operation.ID != before.Status.Operation.ID {
			t.Errorf("a refused reboot was recorded: %+v", after.Status.Operation)
		}
		if err := env.Client.Delete(ctx, budget); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("repair --wait", func(t *testing.T) {
		r := plugin(ns, "repair", "m1", "--reason", "disk errors", "--wait", "--timeout", "60s")
		if r.code != ExitOK || !regexp.MustCompile(`\nmachine/m1 repaired \(boot ID \S+ -> \S+\)\n$`).MatchString(r.stdout) {
			t.Fatal(r)
		}
		if op := get(t, key).Status.Operation; op.Type != machinistv1.OperationRepair || op.Options == nil || op.Options.Reason != "disk errors" {
			t.Errorf("the Machine's operation is %+v", op)
		}
	})
}

// TestConflictReason checks the wording of a 409 made the way the verbs
// server makes it, for any message, not only those the server sends today.
func TestConflictReason(t *testing.T) {
	err := apierrors.NewConflict(machineResource, "m1", errors.New(`reboot operation reboot-x1 is in flight (Running)`))
	got := reboot.refusal("m1", err)
	want := `machine "m1" cannot be rebooted now: reboot operation reboot-x1 is in flight (Running)`
	if got.Error() != want || ExitCode(got) != ExitRefused {
		t.Errorf("got %q (exit code %d), want %q (exit code %d)", got, ExitCode(got), want, ExitRefused)
	}
	if got := conflictReason("the Machine is Draining", "m1"); got != "the Machine is Draining" {
		t.Errorf("a message without the boilerplate changed to %q", got)
	}
}

// machineAt is an empty Machine with key's namespace and name.
func machineAt(key client.ObjectKey) *machinistv1.Machine {
	m := &machinistv1.Machine{}
	m.Namespace, m.Name = key.Namespace, key.Name
	return m
}

func get(t *testing.T, key client.ObjectKey) *machinistv1.Machine {
	t.Helper()
	m := &machinistv1.Machine{}
	if err := env.Client.Get(context.Background(), key, m); err != nil {
		t.Fatal(err)
	}
	return m
}
