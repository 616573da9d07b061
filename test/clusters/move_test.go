package clusters

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
)

// TestMoveToAnotherManagementCluster: a MachineDeployment of a workload
// cluster, with a health check and a budget, moves to a second management
// cluster whose manager runs the same provider. A dry run writes nothing;
// a move stopped by its timeout while copying, then one killed while
// deleting the originals, is finished by running it again; the move
// creates, deletes and restarts no instance; the same Nodes keep their
// boots; the source holds nothing after; the target drives the fleet (a
// scale-up there makes a Machine); and the move run again does nothing
// more.
func TestMoveToAnotherManagementCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const shared = "shared"
	if err := ctrls.Register(shared, ctrls.Provider); err != nil {
		t.Fatal(err)
	}
	// A management cluster (Machinist's CRDs, no workload), not one of
	// startCluster's.
	target, err := testenv.StartWith(testenv.Options{ControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Stop() })
	targetCtrls, err := target.StartControllers(manager.Options{NodeGrace: 2 * time.Second, ClusterProbePeriod: 5 * time.Second}, leases)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = targetCtrls.Stop() })
	if err := targetCtrls.Register(shared, ctrls.Provider); err != nil {
		t.Fatal(err)
	}

	ns := env.NewNamespace(t, "move")
	serve(t, ns)
	class := &machinistv1.MachineClass{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "small"},
		Spec: machinistv1.MachineClassSpec{Provider: shared}}
	md := testenv.MachineDeployment(ns, "pool", 3)
	md.Spec.Template.Spec.ClusterName = blue
	hc := &machinistv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"},
		Spec: machinistv1.MachineHealthCheckSpec{Selector: md.Spec.Selector}}
	budget := &machinistv1.MachineDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"},
		Spec: machinistv1.MachineDisruptionBudgetSpec{Selector: md.Spec.Selector, MaxDisrupted: intstr.FromInt32(1)}}
	for _, obj := range []client.Object{class, md, hc, budget} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	before := running(t, ns, 3, 2*time.Minute)
	held := nsInstances(t, ns)
	restarts := map[string]int{}
	for _, m := range before {
		n, err := ctrls.Provider.Restarts(m.Status.ProviderID)
		if err != nil {
			t.Fatal(err)
		}
		restarts[m.Status.ProviderID] = n
	}

	bin, err := testenv.Machinist()
	if err != nil {
		t.Fatal(err)
	}
	runMove := func(extra ...string) string {
		t.Helper()
		args := append([]string{"move", "--kubeconfig", env.Kubeconfig, "--to-kubeconfig", target.Kubeconfig, "-n", ns}, extra...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("machinist %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	plan := runMove("--dry-run")
	t.Logf("dry run:\n%s", plan)
	for _, want := range []string{"Machine " + ns + "/" + before[0].Name, "MachineDeployment " + ns + "/pool", "WorkloadCluster " + ns + "/" + blue, "Secret " + ns + "/" + blue + "-kubeconfig", "nothing was written"} {
		if !strings.Contains(plan, want) {
			t.Errorf("the dry run does not say %q", want)
		}
	}
	if err := target.Client.Get(ctx, client.ObjectKeyFromObject(md), &machinistv1.MachineDeployment{}); err == nil {
		t.Fatal("the dry run wrote to the target")
	}

	// A target that holds an object of the same name the move did not
	// make is refused, before anything is written.
	stranger := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: blue + "-kubeconfig"}}
	if err := target.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := target.Client.Create(ctx, stranger); err != nil {
		t.Fatal(err)
	}
	refused, err := exec.Command(bin, "move", "--kubeconfig", env.Kubeconfig, "--to-kubeconfig", target.Kubeconfig, "-n", ns).CombinedOutput()
	if err == nil || !strings.Contains(string(refused), "objects this move did not make: [Secret "+blue+"-kubeconfig]") {
		t.Fatalf("a move onto a stranger: %v\n%s", err, refused)
	}
	if err := target.Client.Get(ctx, client.ObjectKeyFromObject(md), &machinistv1.MachineDeployment{}); err == nil {
		t.Fatal("the refused move wrote to the target")
	}
	if m := (&machinistv1.Machine{}); env.Client.Get(ctx, client.ObjectKeyFromObject(&before[0]), m) != nil || m.Annotations[machinistv1.PausedAnnotation] != "" {
		t.Fatal("the refused move paused the source")
	}
	if err := target.Client.Delete(ctx, stranger); err != nil {
		t.Fatal(err)
	}

	// Stopped half way, as a kill or a lost connection would stop it: its
	// requests slowed to 2 a second, it runs out of time in its copy.
	stopped, err := exec.Command(bin, "move", "--kubeconfig", env.Kubeconfig, "--to-kubeconfig", target.Kubeconfig, "-n", ns,
		"--qps", "2", "--timeout", "8s").CombinedOutput()
	if err == nil {
		t.Fatalf("the slowed move was not stopped:\n%s", stopped)
	}
	lines := strings.Split(strings.TrimSpace(string(stopped)), "\n")
	t.Logf("the first move stopped at: %s", lines[len(lines)-1])

	// Then killed (SIGKILL) at another point, as a node or a terminal
	// lost: once it has resumed the copies and is deleting the originals.
	killed := exec.Command(bin, "move", "--kubeconfig", env.Kubeconfig, "--to-kubeconfig", target.Kubeconfig, "-n", ns, "--qps", "4")
	pr, pw := io.Pipe()
	killed.Stdout, killed.Stderr = pw, pw
	if err := killed.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		err := killed.Wait()
		_ = pw.Close()
		exited <- err
	}()
	var said []string
	scan := bufio.NewScanner(pr)
	for scan.Scan() {
		said = append(said, scan.Text())
		if strings.HasPrefix(scan.Text(), "deleting them from the source") {
			// Killed once the first original is gone.
			for deadline := time.Now().Add(30 * time.Second); sourceObjects(t, ns) == 10 && time.Now().Before(deadline); {
			}
			_ = killed.Process.Kill()
		}
	}
	if err := <-exited; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the move was not killed while deleting (%v):\n%s", err, strings.Join(said, "\n"))
	}
	left, err := testenv.ListMachines(ctx, env.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the second move was killed while deleting: %d of 3 Machines, %d of 10 objects left on the source", len(left), sourceObjects(t, ns))

	start := time.Now()
	t.Logf("move, run again:\n%s", runMove())
	took := time.Since(start)

	// The source holds nothing of the namespace.
	if left, err := testenv.ListMachines(ctx, env.Client, ns); err != nil || len(left) > 0 {
		t.Errorf("the source still holds %d Machines (%v)", len(left), err)
	}
	for _, list := range []client.ObjectList{&machinistv1.MachineDeploymentList{}, &machinistv1.WorkloadClusterList{}, &machinistv1.MachineClassList{}} {
		if err := env.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if n := apimeta.LenList(list); n > 0 {
			t.Errorf("the source still holds %d %T", n, list)
		}
	}

	// The target drives the same instances, and the same boots.
	var after []machinistv1.Machine
	testenv.WaitFor(t, time.Minute, "the moved Machines Running and resumed on the target", func() error {
		var err error
		if after, err = testenv.ListMachines(ctx, target.Client, ns); err != nil {
			return err
		}
		if len(after) != 3 || slices.ContainsFunc(after, func(m machinistv1.Machine) bool {
			_, paused := m.Annotations[machinistv1.PausedAnnotation]
			return m.Status.Phase != machinistv1.MachineRunning || paused
		}) {
			return errNotYet("not all Running and resumed")
		}
		return nil
	})
	for _, m := range after {
		i := slices.IndexFunc(before, func(b machinistv1.Machine) bool { return b.Name == m.Name })
		switch {
		case i < 0:
			t.Errorf("Machine %s is new on the target", m.Name)
		case m.Status.ProviderID != before[i].Status.ProviderID || m.Status.BootID != before[i].Status.BootID:
			t.Errorf("Machine %s: instance %s boot %s, was %s boot %s", m.Name, m.Status.ProviderID, m.Status.BootID, before[i].Status.ProviderID, before[i].Status.BootID)
		}
		if n, err := ctrls.Provider.Restarts(m.Status.ProviderID); err != nil || n != restarts[m.Status.ProviderID] {
			t.Errorf("instance %s restarted: %d restarts, was %d (%v)", m.Status.ProviderID, n, restarts[m.Status.ProviderID], err)
		}
	}
	if now := nsInstances(t, ns); !slices.Equal(now, held) {
		t.Errorf("the provider holds %v in %s after the move, want the same %v", now, ns, held)
	}
	t.Logf("moved 3 Machines and their objects in %s", took.Round(100*time.Millisecond))

	// Run again: nothing more to do.
	if out := runMove(); !strings.Contains(out, "moved 0 objects") {
		t.Errorf("the move run again did something:\n%s", out)
	}

	// The target drives the fleet.
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":4}}`))
	if err := target.Client.Patch(ctx, &machinistv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"}}, patch); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, "4 Machines Running on the target", func() error {
		ms, err := testenv.ListMachines(ctx, target.Client, ns)
		if err != nil {
			return err
		}
		if len(ms) != 4 || slices.ContainsFunc(ms, func(m machinistv1.Machine) bool { return m.Status.Phase != machinistv1.MachineRunning }) {
			return errNotYet("scaling")
		}
		return nil
	})
}

// sourceObjects counts the Machinist objects of ns in the source
// management cluster.
func sourceObjects(t *testing.T, ns string) int {
	t.Helper()
	n := 0
	for _, list := range []client.ObjectList{&machinistv1.MachineList{}, &machinistv1.MachineSetList{}, &machinistv1.MachineDeploymentList{}, &machinistv1.WorkloadClusterList{},
		&machinistv1.MachineClassList{}, &machinistv1.MachineHealthCheckList{}, &machinistv1.MachineDisruptionBudgetList{}} {
		if err := env.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		n += apimeta.LenList(list)
	}
	return n
}

// nsInstances lists, sorted, the provider IDs the shared provider holds for
// Machines of ns.
func nsInstances(t *testing.T, ns string) []string {
	t.Helper()
	listed, err := providers.List(context.Background(), ctrls.Provider)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range listed {
		if strings.Contains(l.ProviderID, ":///"+ns+"/") {
			out = append(out, l.ProviderID)
		}
	}
	slices.Sort(out)
	return out
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) }
