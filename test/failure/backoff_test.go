package failure

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// The default backoff retries at 0, 1, 3, 7, 15 and 31 s: within 30 s a
// failing Machine may be written at most 6 times, and at least 4 writes
// show that it really is retrying.
const (
	window       = 30 * time.Second
	maxWrites    = 6
	minWrites    = 4
	provisionsIn = 5 * time.Second
)

// A MachineSet of one whose class names a provider that does not run: the
// Machine says so, retries on the backoff's schedule and not faster, and a
// fixed class makes it provision at once rather than at its next step.
func TestUnknownProviderBacksOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := env.Client
	ns := env.NewNamespace(t, "unknown-provider")
	mc := class(t, c, ns, "bogus", "nosuchcloud", "")
	writes := countWrites(t, env, ns, testenv.NewMachineList)
	ms := &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bogus"},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To(int32(1)),
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"set": "bogus"}},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: map[string]string{"set": "bogus"}},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "bogus"}, Version: "v1.37.2"},
			},
		},
	}
	if err := c.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	var m *machinistv1.Machine
	testenv.WaitFor(t, 10*time.Second, "the MachineSet's Machine", func() bool {
		var list machinistv1.MachineList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if len(list.Items) == 1 {
			m = &list.Items[0]
		}
		return m != nil
	})
	created := m.CreationTimestamp.Time
	// A measurement: the writes in the window from the Machine's creation.
	time.Sleep(time.Until(created.Add(window)))

	n := writes.of(m.Name)
	m = get(t, c, m)
	t.Logf("%d writes to the Machine in %s; errorCount %d", n, window, m.Status.ErrorCount)
	if n > maxWrites {
		t.Errorf("%d writes to a Machine with an unknown provider in %s; want at most %d (one per backoff step)", n, window, maxWrites)
	}
	if m.Status.ErrorCount < minWrites {
		t.Errorf("errorCount %d after %s; want at least %d: the Machine must keep retrying", m.Status.ErrorCount, window, minWrites)
	}
	if m.Status.Phase != machinistv1.MachinePending {
		t.Errorf("phase %q; want Pending, not blank", m.Status.Phase)
	}
	cond := ready(m)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != machinistv1.ReasonProviderNotFound ||
		!strings.Contains(cond.Message, `provider "nosuchcloud"`) || !strings.Contains(cond.Message, "inmemory") {
		t.Errorf("Ready condition %+v; want False, %s, naming the provider asked for and those that run", cond, machinistv1.ReasonProviderNotFound)
	}
	oneWarning(t, c, ns, m.Name, machinistv1.ReasonProviderNotFound)

	out, err := env.Kubectl(ctx, "get", "machines", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME PHASE READY REASON NODE CLUSTER VERSION AGE" {
		t.Fatalf("kubectl get machines:\n%s", out)
	}
	if f := strings.Fields(lines[1]); len(f) < 5 || f[1] != "Pending" || f[2] != "False" || f[3] != machinistv1.ReasonProviderNotFound {
		t.Errorf("kubectl get machines shows %q; want Pending False %s", lines[1], machinistv1.ReasonProviderNotFound)
	}

	// Fixed just after a retry, the next is 32 s away: provisioning within
	// a few seconds proves the fix woke the Machine, not the backoff.
	count := m.Status.ErrorCount
	testenv.WaitFor(t, 40*time.Second, "the next retry", func() bool { return get(t, c, m).Status.ErrorCount > count })
	mc.Spec.Provider = "inmemory"
	if err := c.Update(ctx, mc); err != nil {
		t.Fatal(err)
	}
	took := testenv.WaitFor(t, provisionsIn, "provisioning once the class names a provider that runs", func() bool {
		p := get(t, c, m).Status.Phase
		return p == machinistv1.MachineProvisioning || p == machinistv1.MachineRunning
	})
	t.Logf("provisioning began %s after the class was fixed", took)
}

// A Machine whose class does not exist yet provisions as soon as the class
// is created, not when its backoff next comes round.
func TestMissingClassAppears(t *testing.T) {
	t.Parallel()
	c := env.Client
	ns := env.NewNamespace(t, "missing-class")
	m := machine(t, c, ns, "early", "later")
	// After the fifth attempt (15 s), the next is 16 s away.
	testenv.WaitFor(t, 30*time.Second, "five attempts", func() bool { return get(t, c, m).Status.ErrorCount >= 5 })
	got := get(t, c, m)
	cond := ready(got)
	if got.Status.Phase != machinistv1.MachinePending || cond == nil || cond.Reason != machinistv1.ReasonMachineClassNotFound ||
		!strings.Contains(cond.Message, `MachineClass "later" does not exist in namespace "`+ns+`"`) {
		t.Fatalf("phase %q, Ready %+v; want Pending and %s naming the class", got.Status.Phase, cond, machinistv1.ReasonMachineClassNotFound)
	}
	oneWarning(t, c, ns, m.Name, machinistv1.ReasonMachineClassNotFound)
	class(t, c, ns, "later", "inmemory", "")
	took := testenv.WaitFor(t, provisionsIn, "provisioning once the class exists", func() bool {
		return get(t, c, m).Status.Phase == machinistv1.MachineRunning
	})
	t.Logf("Running %s after the class was created", took)
}

// A provider whose Create keeps failing transiently costs one write per
// backoff step too.
func TestFailingCreateBacksOff(t *testing.T) {
	t.Parallel()
	c := env.Client
	ns := env.NewNamespace(t, "failing-create")
	class(t, c, ns, "flaky", "inmemory", `{"errorRate": 1}`)
	writes := countWrites(t, env, ns, testenv.NewMachineList)
	m := machine(t, c, ns, "flaky", "flaky")
	const window = 15 * time.Second // attempts at 0, 1, 3, 7, 15 s
	// A measurement: the writes in the window.
	time.Sleep(window)
	n := writes.of(m.Name)
	got := get(t, c, m)
	t.Logf("%d writes in %s; errorCount %d", n, window, got.Status.ErrorCount)
	if n > 5 || got.Status.ErrorCount < 3 {
		t.Errorf("%d writes and errorCount %d in %s; want at most 5 writes and at least 3 attempts", n, got.Status.ErrorCount, window)
	}
	if cond := ready(got); cond == nil || cond.Reason != "CreateError" {
		t.Errorf("Ready %+v; want reason CreateError", cond)
	}
	oneWarning(t, c, ns, m.Name, "CreateError")
}

// A Delete that keeps failing backs off as well, and a change a person
// makes (here an annotation) wakes the Machine at once. It runs before the
// parallel tests because the fault it injects is the provider's, not one
// Machine's.
func TestFailingDeleteBacksOff(t *testing.T) {
	ctx := context.Background()
	c := env.Client
	ns := env.NewNamespace(t, "failing-delete")
	class(t, c, ns, "small", "inmemory", "")
	m := machine(t, c, ns, "doomed", "small")
	testenv.WaitFor(t, 30*time.Second, "Running", func() bool { return get(t, c, m).Status.Phase == machinistv1.MachineRunning })
	writes := countWrites(t, env, ns, testenv.NewMachineList)
	controllers.Provider.FailNext(1 << 30)
	defer controllers.Provider.FailNext(0)
	if err := c.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	const window = 15 * time.Second
	// A measurement: the writes in the window.
	time.Sleep(window)
	got := get(t, c, m)
	n := writes.of(m.Name)
	t.Logf("%d writes in %s of a failing deletion; errorCount %d", n, window, got.Status.ErrorCount)
	// The deletion mark, Deleting, then one per retry at 1, 3, 7 and 15 s.
	if n > 6 || got.Status.ErrorCount < 3 {
		t.Errorf("%d writes and errorCount %d; want at most 6 writes and at least 3 attempts", n, got.Status.ErrorCount)
	}
	if got.Status.Phase != machinistv1.MachineDeleting {
		t.Errorf("phase %s; want Deleting", got.Status.Phase)
	}
	oneWarning(t, c, ns, m.Name, "DeleteError")

	controllers.Provider.FailNext(0)
	got.Annotations = map[string]string{"example.com/nudge": "now"}
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	took := testenv.WaitFor(t, provisionsIn, "the Machine gone after a person's change", func() bool {
		err := c.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{})
		return err != nil
	})
	t.Logf("gone %s after the annotation", took)
}
