package chaos_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/machinist-dev/machinist/dev/testenv"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// scenario is work the manager is doing when a fault strikes.
type scenario struct {
	name string
	// setup makes what the work starts from and waits until it is settled,
	// with no fault.
	setup func(r *run)
	// act starts the work and returns how long it takes unfaulted, about:
	// the window in which faults strike.
	act func(r *run) time.Duration
	// want reports whether the run reached its desired state.
	want func(r *run) error
	// versions is about how many Machine versions the work stores
	// unfaulted: faults strike after a random number of them. Zero means
	// by the clock, within act's window.
	versions int
}

// The pool names.
const (
	setName = "pool"
	mdName  = "fleet"
	pdbName = "db"
)

var scenarios = []scenario{
	{
		name:  "scale-up 0→30",
		setup: func(r *run) { r.createSet(0, nil) },
		act: func(r *run) time.Duration {
			r.scaleSet(30)
			return 6 * time.Second
		},
		want:     func(r *run) error { return r.setSettled(30) },
		versions: 90,
	},
	{
		name: "scale-down 30→5",
		setup: func(r *run) {
			r.createSet(30, nil)
			r.wait("30 Machines Running", func() error { return r.setSettled(30) })
		},
		act: func(r *run) time.Duration {
			r.scaleSet(5)
			return 4 * time.Second
		},
		want:     func(r *run) error { return r.setSettled(5) },
		versions: 50,
	},
	{
		name: "rolling upgrade of 20, maxSurge 3",
		setup: func(r *run) {
			r.createDeployment(20, rolling(3, 0), "v1.37.1")
			r.wait("20 Machines Running", func() error { return r.deploymentSettled("v1.37.1") })
		},
		act: func(r *run) time.Duration {
			r.setVersion("v1.37.2")
			return 15 * time.Second
		},
		want:     func(r *run) error { return r.deploymentSettled("v1.37.2") },
		versions: 100,
	},
	{
		name: "in-place rollout of 10, maxUnavailable 2",
		setup: func(r *run) {
			r.createDeployment(10, inPlace(2), "v1.37.1")
			r.wait("10 Machines Running", func() error { return r.deploymentSettled("v1.37.1") })
		},
		act: func(r *run) time.Duration {
			r.setVersion("v1.37.2")
			return 10 * time.Second
		},
		want:     func(r *run) error { return r.deploymentSettled("v1.37.2") },
		versions: 60,
	},
	{
		name: "Recreate rollout of 10",
		setup: func(r *run) {
			r.createDeployment(10, machinistv1.MachineDeploymentStrategy{Type: machinistv1.RecreateStrategy}, "v1.37.1")
			r.wait("10 Machines Running", func() error { return r.deploymentSettled("v1.37.1") })
		},
		act: func(r *run) time.Duration {
			r.setVersion("v1.37.2")
			return 5 * time.Second
		},
		want:     func(r *run) error { return r.deploymentSettled("v1.37.2") },
		versions: 50,
	},
	{
		name: "10 reboots through the verbs server",
		setup: func(r *run) {
			r.createSet(10, nil)
			r.wait("10 Machines Running", func() error { return r.setSettled(10) })
		},
		act: func(r *run) time.Duration {
			r.requestAll("reboot", `{"apiVersion":"subresources.machinist.dev/v1alpha1","kind":"RebootOptions"}`)
			return 6 * time.Second
		},
		want:     func(r *run) error { return errors.Join(r.setSettled(10), r.opsSucceeded()) },
		versions: 30,
	},
	{
		name: "5 repairs through the verbs server",
		setup: func(r *run) {
			r.createSet(5, nil)
			r.wait("5 Machines Running", func() error { return r.setSettled(5) })
		},
		act: func(r *run) time.Duration {
			r.requestAll("repair", `{"apiVersion":"subresources.machinist.dev/v1alpha1","kind":"RepairOptions","reason":"chaos"}`)
			return 6 * time.Second
		},
		want:     func(r *run) error { return errors.Join(r.setSettled(5), r.opsSucceeded()) },
		versions: 15,
	},
	{
		name: "scale-down 6→2 with drains held by a PodDisruptionBudget, then relaxed",
		setup: func(r *run) {
			r.createSet(6, nil)
			r.wait("6 Machines Running", func() error { return r.setSettled(6) })
			r.holdDrains()
		},
		act: func(r *run) time.Duration {
			r.scaleSet(2)
			window := r.between(2*time.Second, 10*time.Second)
			go func() {
				// On purpose: the fault lasts this random window.
				time.Sleep(window)
				r.relaxDrains()
			}()
			return window + 4*time.Second
		},
		want: func(r *run) error { return r.setSettled(2) },
	},
}

func rolling(surge, unavailable int32) machinistv1.MachineDeploymentStrategy {
	return machinistv1.MachineDeploymentStrategy{
		Type: machinistv1.RollingUpdateStrategy,
		RollingUpdate: &machinistv1.RollingUpdate{
			MaxSurge: ptr.To(intstr.FromInt32(surge)), MaxUnavailable: ptr.To(intstr.FromInt32(unavailable)),
		},
	}
}

// inPlace updates Machines where they stand, maxUnavailable at a time,
// never replacing one.
func inPlace(maxUnavailable int32) machinistv1.MachineDeploymentStrategy {
	return machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy, InPlace: &machinistv1.InPlaceUpdate{
		MaxUnavailable: ptr.To(intstr.FromInt32(maxUnavailable)), Fallback: machinistv1.FallbackNever}}
}

// template is every Machine's the suite makes: of the run's class, its
// Node in the workload cluster.
func template(labels map[string]string, version string) machinistv1.MachineTemplateSpec {
	return machinistv1.MachineTemplateSpec{
		Metadata: machinistv1.TemplateMetadata{Labels: labels},
		Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: class}, ClusterName: cluster, Version: version},
	}
}

func (r *run) createSet(replicas int32, extra map[string]string) {
	labels := map[string]string{"pool": setName}
	for k, v := range extra {
		labels[k] = v
	}
	r.must(env.Client.Create(context.Background(), &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: setName},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To(replicas),
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": setName}},
			Template: template(labels, "v1.37.2"),
		},
	}))
}

// scaleSet scales the MachineSet as `kubectl scale machineset` does.
func (r *run) scaleSet(replicas int32) {
	_, err := env.Kubectl(context.Background(), "scale", "machineset", setName, "-n", r.ns, fmt.Sprintf("--replicas=%d", replicas))
	r.must(err)
}

func (r *run) createDeployment(replicas int32, strategy machinistv1.MachineDeploymentStrategy, version string) {
	labels := map[string]string{"pool": mdName}
	r.must(env.Client.Create(context.Background(), &machinistv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: mdName},
		Spec: machinistv1.MachineDeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Strategy: strategy,
			Template: template(labels, version),
		},
	}))
}

func (r *run) setVersion(version string) {
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"version":%q}}}}`, version)
	_, err := env.Kubectl(context.Background(), "patch", "machinedeployment", mdName, "-n", r.ns, "--type=merge", "-p", patch)
	r.must(err)
}

func (r *run) must(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
}

// wait polls until f returns nil, failing the run after convergeLimit
// with what the sets and deployments say.
func (r *run) wait(what string, f func() error) {
	r.t.Helper()
	if err := testenv.Poll(convergeLimit, f); err != nil {
		r.t.Fatalf("waiting for %s: %v%s", what, err, r.sets())
	}
}

// sets describes the run's MachineDeployments and MachineSets as stored,
// for a failure message.
func (r *run) sets() string {
	ctx := context.Background()
	var b strings.Builder
	var mds machinistv1.MachineDeploymentList
	if err := env.Client.List(ctx, &mds, client.InNamespace(r.ns)); err == nil {
		for _, md := range mds.Items {
			fmt.Fprintf(&b, "\n  MachineDeployment %s: replicas %d, generation %d observed %d, phase %s, %d replicas, %d updated, %d available",
				md.Name, ptr.Deref(md.Spec.Replicas, 1), md.Generation, md.Status.ObservedGeneration, md.Status.Phase,
				md.Status.Replicas, md.Status.UpdatedReplicas, md.Status.AvailableReplicas)
			for _, c := range md.Status.Conditions {
				fmt.Fprintf(&b, "\n    %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
			}
		}
	}
	var sets machinistv1.MachineSetList
	if err := env.Client.List(ctx, &sets, client.InNamespace(r.ns)); err == nil {
		for _, s := range sets.Items {
			fmt.Fprintf(&b, "\n  MachineSet %s: replicas %d, generation %d observed %d, status %d/%d ready, annotations %v",
				s.Name, ptr.Deref(s.Spec.Replicas, 1), s.Generation, s.Status.ObservedGeneration, s.Status.ReadyReplicas, s.Status.Replicas, s.Annotations)
		}
	}
	for _, rep := range r.replicas {
		b.WriteString(rep.queues())
	}
	return b.String() + testenv.DescribeMachines(r.machineList())
}

func (r *run) machineList() []machinistv1.Machine {
	ms := &machinistv1.MachineList{}
	if err := env.Client.List(context.Background(), ms, client.InNamespace(r.ns)); err != nil {
		return nil
	}
	return ms.Items
}

// setSettled reports whether the MachineSet has exactly replicas Machines,
// all Running, none being deleted, and says so in its status.
func (r *run) setSettled(replicas int32) error {
	s := &machinistv1.MachineSet{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: r.ns, Name: setName}, s); err != nil {
		return err
	}
	ms := r.machineList()
	if err := allRunning(ms, int(replicas)); err != nil {
		return err
	}
	if s.Status.Replicas != replicas || s.Status.ReadyReplicas != replicas || s.Status.ObservedGeneration != s.Generation {
		return fmt.Errorf("MachineSet status: %d replicas, %d ready, generation %d observed of %d", s.Status.Replicas, s.Status.ReadyReplicas, s.Status.ObservedGeneration, s.Generation)
	}
	return nil
}

func allRunning(ms []machinistv1.Machine, want int) error {
	if len(ms) != want {
		return fmt.Errorf("%d Machines, want %d:%s", len(ms), want, testenv.DescribeMachines(ms))
	}
	for _, m := range ms {
		if m.Status.Phase != machinistv1.MachineRunning || m.DeletionTimestamp != nil {
			return fmt.Errorf("not all Running:%s", testenv.DescribeMachines(ms))
		}
	}
	return nil
}

// deploymentSettled reports whether the MachineDeployment has rolled out
// version to all its replicas, with no Machine of an older MachineSet left.
func (r *run) deploymentSettled(version string) error {
	md := &machinistv1.MachineDeployment{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: r.ns, Name: mdName}, md); err != nil {
		return err
	}
	ms := r.machineList()
	if err := allRunning(ms, int(*md.Spec.Replicas)); err != nil {
		return err
	}
	for _, m := range ms {
		if m.Spec.Version != version {
			return fmt.Errorf("Machine %s asks for %s, want %s", m.Name, m.Spec.Version, version)
		}
		if info := m.Status.NodeInfo; info == nil || info.KubeletVersion != version {
			return fmt.Errorf("Machine %s's Node does not run %s yet", m.Name, version)
		}
	}
	st := md.Status
	if st.ObservedGeneration != md.Generation || st.UpdatedReplicas != *md.Spec.Replicas || st.AvailableReplicas != *md.Spec.Replicas || st.Replicas != *md.Spec.Replicas {
		return fmt.Errorf("MachineDeployment status: generation %d observed of %d, %d replicas, %d updated, %d available, phase %s",
			st.ObservedGeneration, md.Generation, st.Replicas, st.UpdatedReplicas, st.AvailableReplicas, st.Phase)
	}
	return nil
}

// requestAll asks the verbs server, through kube-apiserver, for verb on
// every Machine, and remembers the operation IDs.
func (r *run) requestAll(verb, body string) {
	kube := kubernetes.NewForConfigOrDie(env.Config)
	for _, m := range r.machineList() {
		path := fmt.Sprintf("/apis/%s/namespaces/%s/machines/%s/%s", subresourcesv1.SchemeGroupVersion, r.ns, m.Name, verb)
		var code int
		res := kube.CoreV1().RESTClient().Put().AbsPath(path).SetHeader("Content-Type", "application/json").
			Body([]byte(body)).Do(context.Background()).StatusCode(&code)
		raw, _ := res.Raw()
		if code != http.StatusAccepted {
			r.t.Fatalf("%s %s: %d %s", verb, m.Name, code, raw)
		}
		var op subresourcesv1.MachineOperation
		r.must(json.Unmarshal(raw, &op))
		r.ops[m.Name] = append(r.ops[m.Name], op.ID)
	}
}

// opsSucceeded reports whether every requested operation is the one its
// Machine last carried out, and succeeded.
func (r *run) opsSucceeded() error {
	byName := map[string]machinistv1.Machine{}
	for _, m := range r.machineList() {
		byName[m.Name] = m
	}
	for name, ids := range r.ops {
		m, ok := byName[name]
		if !ok {
			return fmt.Errorf("Machine %s, which had operations requested, is gone", name)
		}
		op := m.Status.Operation
		if op == nil || op.ID != ids[len(ids)-1] || op.State != machinistv1.OperationSucceeded {
			return fmt.Errorf("Machine %s: operation %+v, want %s Succeeded", name, op, ids[len(ids)-1])
		}
	}
	return nil
}

// holdDrains puts a pod on every Node of the run, protected by a
// PodDisruptionBudget that allows no eviction: in the workload cluster,
// where the Nodes are and the manager drains them.
func (r *run) holdDrains() {
	var nodes []string
	for _, m := range r.machineList() {
		nodes = append(nodes, m.Status.NodeRef.Name)
	}
	r.must(workload.HoldDrains(context.Background(), r.ns, pdbName, nodes...))
}

// relaxDrains lets every pod go.
func (r *run) relaxDrains() {
	if err := workload.AllowDisruptions(context.Background(), r.ns, pdbName, 100); err != nil {
		r.t.Errorf("relaxing the PodDisruptionBudget: %v", err)
	}
}

// crashAgent kills one Machine's agent, as a machine crashes.
func (r *run) crashAgent(m machinistv1.Machine) {
	pids := agents(r.ns)[m.Status.ProviderID]
	if len(pids) != 1 {
		r.t.Fatalf("Machine %s has agents %v, want one", m.Name, pids)
	}
	r.must(syscall.Kill(pids[0], syscall.SIGKILL))
}

// checkOnce checks that each Machine's instance restarted exactly as many
// times as the Machine carried out reboots and repairs, and its Node
// reported that many new boot IDs: no operation lost, none repeated.
func (r *run) checkOnce() error {
	done := map[types.UID]map[string]bool{} // Machine UID -> operation IDs that succeeded
	node := map[types.UID]string{}          // Machine UID -> Node name
	names := map[types.UID]string{}
	ids := map[types.UID]string{} // Machine UID -> providerID
	for _, e := range r.monitor.ordered() {
		m, ok := e.obj.(*machinistv1.Machine)
		if !ok {
			continue
		}
		names[m.UID] = m.Name
		if m.Status.NodeRef != nil {
			node[m.UID] = m.Status.NodeRef.Name
		}
		if m.Status.ProviderID != "" {
			ids[m.UID] = m.Status.ProviderID
		}
		if op := m.Status.Operation; op != nil && op.State == machinistv1.OperationSucceeded {
			if done[m.UID] == nil {
				done[m.UID] = map[string]bool{}
			}
			done[m.UID][op.ID] = true
		}
	}
	boots := r.monitor.bootIDs()
	var problems []string
	for uid, name := range names {
		ops := len(done[uid])
		if n, ok := node[uid]; ok && len(boots[n]) > 0 {
			if changes := len(boots[n]) - 1; changes != ops {
				problems = append(problems, fmt.Sprintf("Machine %s carried out %d operations, its Node %s booted %d times after the first", name, ops, n, changes))
			}
		}
		if restarts, ok := r.restarts(uid, ids[uid]); ok && restarts != ops {
			problems = append(problems, fmt.Sprintf("Machine %s carried out %d operations, its instance restarted %d times", name, ops, restarts))
		}
	}
	slices.Sort(problems)
	if len(problems) > 0 {
		return fmt.Errorf("exactly once: %s", strings.Join(problems, "; "))
	}
	return nil
}
