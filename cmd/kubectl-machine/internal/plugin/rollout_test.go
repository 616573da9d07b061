package plugin

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

func newDeployment(ns, name, class string, replicas int32) *machinistv1.MachineDeployment {
	labels := map[string]string{"pool": name}
	surge, unavailable := intstr.FromInt32(replicas), intstr.FromInt32(0)
	return &machinistv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: machinistv1.MachineDeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			// Replacing every Machine at once keeps the test short.
			Strategy: machinistv1.MachineDeploymentStrategy{
				Type:          machinistv1.RollingUpdateStrategy,
				RollingUpdate: &machinistv1.RollingUpdate{MaxSurge: &surge, MaxUnavailable: &unavailable},
			},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class}, Version: "v1.37.1"},
			},
		},
	}
}

func TestRollout(t *testing.T) {
	startControllers(t)

	t.Run("undo restores the previous template", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		ns := env.NewNamespace(t, "kubectl-machine", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "pool", "small", 2)
		if err := env.Client.Create(ctx, md); err != nil {
			t.Fatal(err)
		}
		// Through the real kubectl, to prove it finds the plugin.
		r := kubectl(t, ns, "rollout", "status", "md/pool", "--timeout", "60s")
		if r.code != ExitOK || !strings.HasSuffix(r.stdout, "machinedeployment \"pool\" successfully rolled out\n") {
			t.Fatalf("kubectl machine rollout status:\n%s", r)
		}
		first := getDeployment(t, md).Spec.Template

		patch(t, md, `{"metadata":{"annotations":{"kubernetes.io/change-cause":"upgrade to v1.37.2"}},"spec":{"template":{"spec":{"version":"v1.37.2"}}}}`)
		r = plugin(ns, "rollout", "status", "machinedeployment.machinist.dev/pool", "--timeout", "60s")
		if r.code != ExitOK || !strings.Contains(r.stdout, `Waiting for machinedeployment "pool" rollout to finish: `) ||
			!strings.HasSuffix(r.stdout, "machinedeployment \"pool\" successfully rolled out\n") {
			t.Fatalf("rollout status after an upgrade:\n%s", r)
		}

		// The controller copied the change-cause to the new set.
		r = plugin(ns, "rollout", "history", "md/pool")
		if r.code != ExitOK || !regexp.MustCompile(`^machinedeployment.machinist.dev/pool\nREVISION\s+CHANGE-CAUSE\n1\s+<none>\n2\s+upgrade to v1.37.2\n$`).MatchString(r.stdout) {
			t.Errorf("rollout history:\n%s", r)
		}
		r = plugin(ns, "rollout", "history", "md", "pool", "--revision", "1")
		if r.code != ExitOK || !strings.HasPrefix(r.stdout, "machinedeployment.machinist.dev/pool with revision #1\nMachine Template:\n") ||
			!strings.Contains(r.stdout, "    version: v1.37.1\n") || strings.Contains(r.stdout, machinistv1.TemplateHashLabel) {
			t.Errorf("rollout history --revision 1:\n%s", r)
		}
		if r := plugin(ns, "rollout", "history", "pool", "--revision", "7"); r.code != ExitError || !strings.Contains(r.stderr, "unable to find the specified revision 7") {
			t.Errorf("history of a missing revision:\n%s", r)
		}

		r = plugin(ns, "rollout", "undo", "md/pool")
		if r.code != ExitOK || r.stdout != "machinedeployment.machinist.dev/pool rolled back\n" {
			t.Fatalf("rollout undo:\n%s", r)
		}
		if got := getDeployment(t, md).Spec.Template; !equality.Semantic.DeepEqual(got, first) {
			t.Fatalf("after undo the template is %+v, want the first one, %+v", got, first)
		}
		r = plugin(ns, "rollout", "status", "md/pool", "--timeout", "60s")
		if r.code != ExitOK || !strings.HasSuffix(r.stdout, "machinedeployment \"pool\" successfully rolled out\n") {
			t.Fatalf("rollout status after undo:\n%s", r)
		}
		for _, m := range env.Machines(t, ns) {
			if m.DeletionTimestamp.IsZero() && m.Spec.Version != "v1.37.1" {
				t.Errorf("machine %s runs %s after the undo", m.Name, m.Spec.Version)
			}
		}
		// The controller reused the first set, which is revision 3 now.
		r = plugin(ns, "rollout", "history", "md/pool")
		if !regexp.MustCompile(`\n2\s+upgrade to v1.37.2\n3\s+<none>\n$`).MatchString(r.stdout) {
			t.Errorf("rollout history after undo:\n%s", r)
		}
		r = plugin(ns, "rollout", "undo", "md/pool", "--to-revision", "3")
		if r.code != ExitOK || r.stdout != "machinedeployment.machinist.dev/pool skipped rollback (current template already matches revision 3)\n" {
			t.Errorf("undo to the current revision:\n%s", r)
		}
		if r := plugin(ns, "rollout", "undo", "md/pool", "--to-revision", "1"); r.code != ExitError || !strings.Contains(r.stderr, "unable to find specified revision 1") {
			t.Errorf("undo to a revision no longer kept:\n%s", r)
		}
	})

	t.Run("pause and resume flip spec.paused", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		ns := env.NewNamespace(t, "kubectl-machine", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "frozen", "small", 1)
		if err := env.Client.Create(ctx, md); err != nil {
			t.Fatal(err)
		}
		for _, step := range []struct {
			args   []string
			paused bool
			out    string
		}{
			{[]string{"rollout", "pause", "md/frozen"}, true, "machinedeployment.machinist.dev/frozen paused\n"},
			{[]string{"rollout", "pause", "frozen"}, true, "machinedeployment.machinist.dev/frozen already paused\n"},
			{[]string{"rollout", "resume", "machinedeployments/frozen"}, false, "machinedeployment.machinist.dev/frozen resumed\n"},
			{[]string{"rollout", "resume", "md/frozen"}, false, "machinedeployment.machinist.dev/frozen already resumed\n"},
		} {
			r := plugin(ns, step.args...)
			if r.code != ExitOK || r.stdout != step.out {
				t.Errorf("%v: want %q:\n%s", step.args, step.out, r)
			}
			if got := getDeployment(t, md).Spec.Paused; got != step.paused {
				t.Errorf("after %v spec.paused is %v", step.args, got)
			}
		}
		plugin(ns, "rollout", "pause", "md/frozen")
		patch(t, md, `{"metadata":{"annotations":{"kubernetes.io/change-cause":"upgrade to v1.37.2"}},"spec":{"template":{"spec":{"version":"v1.37.2"}}}}`)
		testenv.WaitFor(t, 30*time.Second, "the paused rollout's status", func() error {
			r := plugin(ns, "rollout", "status", "md/frozen", "--watch=false")
			want := `Waiting for machinedeployment "frozen" rollout to finish: 0 out of 1 new machines have been updated... (the rollout is paused: 'kubectl machine rollout resume md/frozen' lets it finish)` + "\n"
			if r.code != ExitOK || r.stdout != want {
				return fmt.Errorf("rollout status --watch=false of a paused rollout: want %q:\n%s", want, r)
			}
			return nil
		})
		if r := plugin(ns, "rollout", "undo", "md/frozen"); r.code != ExitError || !strings.Contains(r.stderr, "cannot roll back a paused machinedeployment") {
			t.Errorf("undo of a paused MachineDeployment:\n%s", r)
		}
		if r := plugin(ns, "rollout", "pause", "md/nosuch"); r.code != ExitRefused {
			t.Errorf("pause of a missing MachineDeployment should exit %d:\n%s", ExitRefused, r)
		}
		if r := plugin(ns, "rollout", "pause", "deployment/frozen"); r.code != ExitError || !strings.Contains(r.stderr, `"deployment" is not a machinedeployment`) {
			t.Errorf("a Deployment is not a MachineDeployment:\n%s", r)
		}
	})

	t.Run("status fails when the rollout exceeds its progress deadline", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		ns := env.NewNamespace(t, "kubectl-machine", testenv.Small, testenv.Sick)
		md := newDeployment(ns, "stuck", "sick", 1)
		md.Spec.ProgressDeadlineSeconds = ptr.To(int32(5))
		if err := env.Client.Create(ctx, md); err != nil {
			t.Fatal(err)
		}
		// A Machine whose Node never becomes Ready: first the wait times out...
		if r := plugin(ns, "rollout", "status", "md/stuck", "--timeout", "1s"); r.code != ExitTimeout || !strings.Contains(r.stderr, "timed out") {
			t.Errorf("want exit code %d:\n%s", ExitTimeout, r)
		}
		// ...then the controller gives up on it.
		r := plugin(ns, "rollout", "status", "md/stuck", "--timeout", "60s")
		if r.code != ExitFailed || !strings.Contains(r.stderr, `error: machinedeployment "stuck" exceeded its progress deadline`) {
			t.Errorf("want exit code %d:\n%s", ExitFailed, r)
		}
		if r := plugin(ns, "rollout", "status", "md/stuck", "--watch=false"); r.code != ExitFailed {
			t.Errorf("--watch=false of a stalled rollout: want exit code %d:\n%s", ExitFailed, r)
		}
	})
}

func getDeployment(t *testing.T, md *machinistv1.MachineDeployment) *machinistv1.MachineDeployment {
	t.Helper()
	out := &machinistv1.MachineDeployment{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(md), out); err != nil {
		t.Fatal(err)
	}
	return out
}

func patch(t *testing.T, md *machinistv1.MachineDeployment, patch string) {
	t.Helper()
	if err := env.Client.Patch(context.Background(), md.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// TestRolloutStatusSaysWhatHoldsIt: a rollout a disruption budget holds
// back says so, with the budget's words, and is not done.
func TestRolloutStatusSaysWhatHoldsIt(t *testing.T) {
	md := &machinistv1.MachineDeployment{}
	md.Name, md.Generation = "workers", 2
	md.Spec.Replicas = ptr.To[int32](4)
	md.Status.ObservedGeneration, md.Status.Replicas, md.Status.UpdatedReplicas, md.Status.AvailableReplicas = 2, 8, 4, 8
	md.Status.Conditions = []metav1.Condition{{Type: machinistv1.ConditionProgressing, Status: metav1.ConditionTrue,
		Reason: machinistv1.ReasonDisruptionHeld, Message: "MachineSet workers-1 is scaling from 4 to 0 Machines, waiting: MachineDisruptionBudget b allows no more disruptions"}}
	msg, done, err := rolloutStatus(md)
	want := `Waiting for machinedeployment "workers" rollout to finish: 4 old machines are pending termination... (held by a disruption budget: MachineSet workers-1 is scaling from 4 to 0 Machines, waiting: MachineDisruptionBudget b allows no more disruptions)`
	if err != nil || done || msg != want {
		t.Errorf("rolloutStatus = %q, %v, %v; want %q, not done", msg, done, err, want)
	}
}
