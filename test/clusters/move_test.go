package clusters

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/nodes"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/process"
)

// TestMoveToAnotherManagementCluster: a MachineDeployment of 10 Machines
// of the process provider (an agent process each, its Node in a workload
// cluster), with a health check, a budget and a drain rule, moves to a
// second management cluster whose manager runs the same provider, while
// its rollout is paused half way. A dry run writes nothing; a Machine
// holding a kept bootstrap token, or a stranger on the target, is refused
// before anything is written; a move stopped by its timeout while copying,
// then one killed while deleting the originals, is finished by running it
// again; the move creates, deletes and restarts no instance; the same
// Nodes keep their boots; the source holds nothing after; the rollout,
// resumed on the target, finishes there; and the move run again does
// nothing more.
func TestMoveToAnotherManagementCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const moving = process.Name // its providerIDs name it
	bin, err := testenv.Machinist()
	if err != nil {
		t.Fatal(err)
	}
	// Real machines outlive the manager that made them: the agents are
	// processes of their own, which both managers reach through the
	// same provider's books.
	// The shared manager holds the provider after the test: its books
	// stay until every test is done, so that its lists still answer.
	books, err := os.MkdirTemp("", "machinist-move-")
	if err != nil {
		t.Fatal(err)
	}
	atEnd(func() { _ = os.RemoveAll(books) })
	machines, err := process.New(process.Options{AgentBinary: bin, StateDir: books,
		LeaseDurationSeconds: leases.DurationSeconds, RenewInterval: leases.RenewInterval})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = machines.Stop(context.Background()) })
	if err := ctrls.Register(moving, machines); err != nil {
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
	if err := targetCtrls.Register(moving, machines); err != nil {
		t.Fatal(err)
	}

	ns := env.NewNamespace(t, "move")
	serve(t, ns)
	const (
		replicas = 10
		from, to = "v1.37.1", "v1.37.2"
	)
	class := &machinistv1.MachineClass{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "small"},
		Spec: machinistv1.MachineClassSpec{Provider: moving}}
	md := testenv.MachineDeployment(ns, "pool", replicas)
	md.Spec.Template.Spec.ClusterName = blue
	md.Spec.Template.Spec.Version = from
	md.Spec.Strategy = machinistv1.MachineDeploymentStrategy{Type: machinistv1.RollingUpdateStrategy,
		RollingUpdate: &machinistv1.RollingUpdate{MaxSurge: ptr.To(intstr.FromInt32(2)), MaxUnavailable: ptr.To(intstr.FromInt32(0))}}
	hc := &machinistv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"},
		Spec: machinistv1.MachineHealthCheckSpec{Selector: md.Spec.Selector}}
	budget := &machinistv1.MachineDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"},
		Spec: machinistv1.MachineDisruptionBudgetSpec{Selector: md.Spec.Selector, MaxDisrupted: intstr.FromInt32(2)}}
	rule := &machinistv1.MachineDrainRule{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "keep-daemons"},
		Spec: machinistv1.MachineDrainRuleSpec{Behavior: machinistv1.DrainBehaviorSkip,
			Pods: []machinistv1.MachineDrainRulePodSelector{{Selector: &machinistv1.LabelSelector{MatchLabels: map[string]string{"app": "daemon"}}}}}}
	for _, obj := range []client.Object{class, rule, md, hc, budget} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	running(t, ns, replicas, 3*time.Minute)

	// The rollout to the next version, paused half way: some Machines at
	// each version, in two MachineSets.
	if err := env.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"template":{"spec":{"version":"`+to+`"}}}}`))); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "4 Machines Running at "+to, func() error {
		if n := atVersion(t, env.Client, ns, to); n < 4 {
			return fmt.Errorf("%d at %s:%s", n, to, describe(t, env.Client, ns))
		}
		return nil
	})
	if err := env.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"paused":true}}`))); err != nil {
		t.Fatal(err)
	}
	var before []machinistv1.Machine
	testenv.WaitFor(t, 2*time.Minute, "the paused rollout settled", func() error {
		ms, err := testenv.ListMachines(ctx, env.Client, ns)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(ms, func(m machinistv1.Machine) bool {
			return m.Status.Phase != machinistv1.MachineRunning || !m.DeletionTimestamp.IsZero()
		}) {
			return errNotYet("Machines still changing")
		}
		d := &machinistv1.MachineDeployment{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(md), d); err != nil {
			return err
		}
		if d.Status.Phase != machinistv1.RolloutPaused {
			return fmt.Errorf("the rollout is %s", d.Status.Phase)
		}
		// Unchanged since the last look: nothing in flight.
		same := len(ms) == len(before) && !slices.ContainsFunc(ms, func(m machinistv1.Machine) bool {
			return !slices.ContainsFunc(before, func(b machinistv1.Machine) bool { return b.UID == m.UID })
		})
		before = ms
		if !same {
			return errNotYet("the Machines changed since the last look")
		}
		return nil
	})
	updated := atVersion(t, env.Client, ns, to)
	if updated == 0 || updated >= replicas {
		t.Fatalf("the rollout was not paused half way: %d of %d Machines at %s", updated, len(before), to)
	}
	t.Logf("the rollout paused with %d Machines, %d of them at %s", len(before), updated, to)
	held := nsInstances(t, machines, ns)
	restarts := map[string]int{}
	for _, m := range before {
		n, err := machines.Restarts(m.Status.ProviderID)
		if err != nil {
			t.Fatal(err)
		}
		restarts[m.Status.ProviderID] = n
	}
	objects := sourceObjects(t, ns)

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
	for _, want := range []string{"Machine " + ns + "/" + before[0].Name, "MachineDeployment " + ns + "/pool", "WorkloadCluster " + ns + "/" + blue, "MachineDrainRule " + ns + "/keep-daemons", "MachineSet " + ns + "/", "Secret " + ns + "/" + blue + "-kubeconfig", "nothing was written"} {
		if !strings.Contains(plan, want) {
			t.Errorf("the dry run does not say %q", want)
		}
	}
	if err := target.Client.Get(ctx, client.ObjectKeyFromObject(md), &machinistv1.MachineDeployment{}); err == nil {
		t.Fatal("the dry run wrote to the target")
	}

	// A Machine holding the bootstrap token kept for its machine, as after
	// a repair while its cluster could not be reached: the token lives in
	// the manager's namespace under the Machine's UID, and its status
	// records it. The Machine is paused here, so that the source's manager
	// does not publish the token before the move, as it could not while
	// the cluster is down; it is resumed on the target. An old-version
	// Machine, so that the resumed rollout deletes it at the end.
	keeper := &before[slices.IndexFunc(before, func(m machinistv1.Machine) bool { return m.Spec.Version == from })]
	pause(t, keeper, true)
	token, err := bootstrap.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	token.ID = nodes.PublishedTokenID(keeper.UID)
	keptOnSource := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: testenv.ManagerNamespace, Name: nodes.KeptTokenSecretName(keeper.UID),
			Labels: map[string]string{nodes.TokenMachineLabel: string(keeper.UID)}},
		Type: nodes.KeptTokenSecretType,
		Data: map[string][]byte{"token": []byte(token.Value())},
	}
	if err := env.Client.Create(ctx, keptOnSource); err != nil {
		t.Fatal(err)
	}
	record := fmt.Sprintf(`{"status":{"keptToken":{"secretUID":%q,"tokenID":%q}}}`, keptOnSource.UID, token.ID)
	if err := env.Client.Status().Patch(ctx, keeper, client.RawPatch(types.MergePatchType, []byte(record))); err != nil {
		t.Fatal(err)
	}
	plan = runMove("--dry-run")
	if want := "Secret " + testenv.ManagerNamespace + "/" + keptOnSource.Name + " (the bootstrap token kept for Machine " + keeper.Name; !strings.Contains(plan, want) {
		t.Errorf("the dry run does not say %q:\n%s", want, plan)
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
	bystander := &before[slices.IndexFunc(before, func(m machinistv1.Machine) bool { return m.UID != keeper.UID })]
	if m := (&machinistv1.Machine{}); env.Client.Get(ctx, client.ObjectKeyFromObject(bystander), m) != nil || m.Annotations[machinistv1.PausedAnnotation] != "" {
		t.Fatal("the refused move paused the source")
	}
	if err := target.Client.Delete(ctx, stranger); err != nil {
		t.Fatal(err)
	}

	// Stopped half way, as a kill or a lost connection would stop it: its
	// requests slowed to 3 a second, it runs out of time in its copy.
	stopped, err := exec.Command(bin, "move", "--kubeconfig", env.Kubeconfig, "--to-kubeconfig", target.Kubeconfig, "-n", ns,
		"--qps", "3", "--timeout", "14s").CombinedOutput()
	if err == nil {
		t.Fatalf("the slowed move was not stopped:\n%s", stopped)
	}
	lines := strings.Split(strings.TrimSpace(string(stopped)), "\n")
	step := ""
	for _, l := range lines {
		if strings.HasSuffix(l, "on the source") || strings.HasSuffix(l, "to the target") {
			step = l // the steps it began
		}
	}
	t.Logf("the first move stopped, after %q, with: %s", step, lines[len(lines)-1])

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
			for deadline := time.Now().Add(30 * time.Second); sourceObjects(t, ns) == objects && time.Now().Before(deadline); {
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
	t.Logf("the second move was killed while deleting: %d of %d Machines, %d of %d objects left on the source", len(left), len(before), sourceObjects(t, ns), objects)

	start := time.Now()
	t.Logf("move, run again:\n%s", runMove())
	took := time.Since(start)

	// The source holds nothing of the namespace.
	if n := sourceObjects(t, ns); n > 0 {
		t.Errorf("the source still holds %d of the namespace's objects", n)
	}

	// The kept token moved with its Machine: its Secret is the target
	// manager's, under the copy's UID, and the copy records it; the
	// source's is gone. Resumed on the target, the Machine's manager there
	// publishes the token in its cluster, under the ID the machine was
	// given it with.
	moved := &machinistv1.Machine{}
	if err := target.Client.Get(ctx, client.ObjectKeyFromObject(keeper), moved); err != nil {
		t.Fatal(err)
	}
	keptOnTarget := &corev1.Secret{}
	if err := target.Client.Get(ctx, client.ObjectKey{Namespace: testenv.ManagerNamespace, Name: nodes.KeptTokenSecretName(moved.UID)}, keptOnTarget); err != nil {
		t.Fatalf("the kept token's Secret is not on the target: %v", err)
	}
	if rec := moved.Status.KeptToken; rec == nil || rec.SecretUID != string(keptOnTarget.UID) || rec.TokenID != token.ID || string(keptOnTarget.Data["token"]) != token.Value() ||
		keptOnTarget.Labels[nodes.TokenMachineLabel] != string(moved.UID) {
		t.Errorf("the moved Machine records %+v, the target's Secret %s holds another token or label %v", rec, keptOnTarget.UID, keptOnTarget.Labels)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(keptOnSource), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("the kept token's Secret is still on the source: %v", err)
	}
	if err := target.Client.Patch(ctx, moved, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+machinistv1.PausedAnnotation+`":null}}}`))); err != nil {
		t.Fatal(err)
	}

	// The target drives the same instances, and the same boots.
	var after []machinistv1.Machine
	testenv.WaitFor(t, time.Minute, "the moved Machines Running and resumed on the target", func() error {
		var err error
		if after, err = testenv.ListMachines(ctx, target.Client, ns); err != nil {
			return err
		}
		if len(after) != len(before) || slices.ContainsFunc(after, func(m machinistv1.Machine) bool {
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
		if node := nodeOf(t, blue, m.Status.ProviderID); node == nil || node.Status.NodeInfo.BootID != before[i].Status.BootID {
			t.Errorf("Machine %s: its Node is not the one it had, with boot %s", m.Name, before[i].Status.BootID)
		}
		if n, err := machines.Restarts(m.Status.ProviderID); err != nil || n != restarts[m.Status.ProviderID] {
			t.Errorf("instance %s restarted: %d restarts, was %d (%v)", m.Status.ProviderID, n, restarts[m.Status.ProviderID], err)
		}
	}
	if now := nsInstances(t, machines, ns); !slices.Equal(now, held) {
		t.Errorf("the provider holds %v in %s after the move, want the same %v", now, ns, held)
	}
	t.Logf("moved %d Machines and their objects in %s", len(after), took.Round(100*time.Millisecond))
	if rules := (&machinistv1.MachineDrainRuleList{}); target.Client.List(ctx, rules, client.InNamespace(ns)) != nil || len(rules.Items) != 1 {
		t.Errorf("the drain rule is not on the target: %d", len(rules.Items))
	}

	published := func() (*corev1.Secret, error) {
		return kube(t, blue).CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, token.SecretName(), metav1.GetOptions{})
	}
	testenv.WaitFor(t, time.Minute, "the kept token published in "+blue+" by the target's manager", func() error {
		s, err := published()
		if err != nil {
			return err
		}
		if got, err := bootstrap.TokenFromSecret(s); err != nil || got != token || s.Labels[nodes.TokenMachineLabel] != string(moved.UID) {
			return fmt.Errorf("token %v (%v), labels %v", got, err, s.Labels)
		}
		return nil
	})

	// Run again: nothing more to do.
	if out := runMove(); !strings.Contains(out, "moved 0 objects") {
		t.Errorf("the move run again did something:\n%s", out)
	}

	// The target drives the fleet: the rollout, resumed there, finishes
	// there, and the old Machines' instances go with them.
	if err := target.Client.Patch(ctx, &machinistv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"}},
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"paused":false}}`))); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	var done []machinistv1.Machine
	testenv.WaitFor(t, 4*time.Minute, fmt.Sprintf("%d Machines Running at %s on the target", replicas, to), func() error {
		var err error
		if done, err = testenv.ListMachines(ctx, target.Client, ns); err != nil {
			return err
		}
		if len(done) != replicas || slices.ContainsFunc(done, func(m machinistv1.Machine) bool {
			return m.Status.Phase != machinistv1.MachineRunning || m.Spec.Version != to
		}) {
			return fmt.Errorf("%d Machines, %d at %s:%s", len(done), atVersion(t, target.Client, ns, to), to, describe(t, target.Client, ns))
		}
		return nil
	})
	t.Logf("the rollout finished on the target %s after it was resumed there", time.Since(resumed).Round(100*time.Millisecond))
	var ids []string
	for _, m := range done {
		ids = append(ids, m.Status.ProviderID)
	}
	slices.Sort(ids)
	testenv.WaitFor(t, time.Minute, "the old Machines' instances deleted", func() error {
		if now := nsInstances(t, machines, ns); !slices.Equal(now, ids) {
			return fmt.Errorf("the provider holds %v, the Machines %v", now, ids)
		}
		return nil
	})
	// The Machine that kept a token went with the old version, and took
	// the token and its Secret with it.
	if s, err := published(); !apierrors.IsNotFound(err) {
		t.Errorf("the moved Machine's published token outlived it: %v %v", s.GetName(), err)
	}
	if err := target.Client.Get(ctx, client.ObjectKeyFromObject(keptOnTarget), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("the kept token's Secret on the target outlived its Machine: %v", err)
	}
}

// atVersion counts the Running Machines of ns at version, as c lists them.
func atVersion(t *testing.T, c client.Reader, ns, version string) int {
	t.Helper()
	ms, err := testenv.ListMachines(context.Background(), c, ns)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range ms {
		if m.Spec.Version == version && m.Status.Phase == machinistv1.MachineRunning && m.DeletionTimestamp.IsZero() {
			n++
		}
	}
	return n
}

// describe says, a line each, where the Machines of ns stand, as c lists
// them: for a failure's message.
func describe(t *testing.T, c client.Reader, ns string) string {
	t.Helper()
	ms, err := testenv.ListMachines(context.Background(), c, ns)
	if err != nil {
		return err.Error()
	}
	return testenv.DescribeMachines(ms)
}

// pause sets or removes the paused annotation of m in the source cluster,
// and waits until its Paused condition says so.
func pause(t *testing.T, m *machinistv1.Machine, paused bool) {
	t.Helper()
	value := `"test"`
	if !paused {
		value = "null"
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+machinistv1.PausedAnnotation+`":`+value+`}}}`))
	if err := env.Client.Patch(context.Background(), m, patch); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("Machine %s paused=%v", m.Name, paused), func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		if apimeta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionPaused) != paused {
			return errNotYet("not yet")
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
		&machinistv1.MachineClassList{}, &machinistv1.MachineDrainRuleList{}, &machinistv1.MachineHealthCheckList{}, &machinistv1.MachineDisruptionBudgetList{}} {
		if err := env.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		n += apimeta.LenList(list)
	}
	return n
}

// nsInstances lists, sorted, the provider IDs p holds for Machines of ns.
func nsInstances(t *testing.T, p providers.Actuator, ns string) []string {
	t.Helper()
	listed, err := providers.List(context.Background(), p)
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
