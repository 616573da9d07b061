package upgrade_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/machinist-dev/machinist/api/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/apiserver"
	"github.com/machinist-dev/machinist/config"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/providers/process"
)

// resources are Machinist's kinds, by resource name.
var resources = []string{
	"machines", "machinesets", "machinedeployments", "machineclasses",
	"machinehealthchecks", "machinedisruptionbudgets", "machinedrainrules", "workloadclusters",
}

// fleet is what a platform team declared with the earlier release: a
// MachineDeployment of ten, its health check, its budget and a drain
// rule, at v1alpha1, with values whose names v1beta1 changed (a soft
// rung, the InPlaceUpdate reason, the class's labels and taints, the drain
// rule's spec.drain) and a value v1beta1 has no field for (a taint's
// timeAdded, in the class and in the template: the template's makes its
// hash differ between the versions).
const fleet = `
apiVersion: machinist.dev/v1alpha1
kind: MachineClass
metadata:
  name: proc
spec:
  provider: process
  nodeTemplate:
    labels:
      node.kubernetes.io/instance-type: proc
    taints:
    - key: dedicated
      value: web
      effect: PreferNoSchedule
      timeAdded: "2026-01-01T00:00:00Z"
---
apiVersion: machinist.dev/v1alpha1
kind: MachineDeployment
metadata:
  name: web
spec:
  replicas: 10
  selector:
    matchLabels:
      pool: web
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 2
      maxUnavailable: 0
  template:
    metadata:
      labels:
        pool: web
    spec:
      classRef:
        name: proc
      version: v1.37.2
      nodeTaints:
      - key: example.com/pool
        value: web
        effect: NoSchedule
        timeAdded: "2026-01-01T00:00:00Z"
---
apiVersion: machinist.dev/v1alpha1
kind: MachineHealthCheck
metadata:
  name: web
spec:
  selector:
    matchLabels:
      pool: web
  unhealthyNodeConditions:
  - type: Ready
    status: Unknown
    timeout: 30s
  - type: Ready
    status: "False"
    timeout: 30s
  maxUnhealthy: 40%
  remediation:
    maxInFlight: 1
    ladder:
    - action: Reboot
      mode: soft
      timeout: 2m
    - action: Replace
---
apiVersion: machinist.dev/v1alpha1
kind: MachineDisruptionBudget
metadata:
  name: web
spec:
  selector:
    matchLabels:
      pool: web
  maxDisrupted: 1
  reasons:
  - Reboot
  - Repair
  - InPlaceUpdate
---
apiVersion: machinist.dev/v1alpha1
kind: MachineDrainRule
metadata:
  name: databases-last
spec:
  drain:
    behavior: Drain
    order: 10
  machines:
  - selector:
      matchLabels:
        pool: web
  pods:
  - selector:
      matchLabels:
        app: postgres
`

// deprecation is what kube-apiserver warns of on every request at
// v1alpha1, from the CRDs' deprecationWarning.
const deprecation = "Warning: machinist.dev/v1alpha1 is deprecated; use machinist.dev/v1beta1"

// TestAnUpgradeFromV1alpha1LosesNothing runs a fleet under the earlier
// release, upgrades it as docs/operations.md says (new CRDs and the verbs
// server that converts, the manager replaced, `machinist migrate`), and
// checks that the upgrade changed nothing a user would notice.
func TestAnUpgradeFromV1alpha1LosesNothing(t *testing.T) {
	ctx := context.Background()
	ns, err := env.Namespace(ctx, "upgrade")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: leaseNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	state := t.TempDir()
	// The agents outlive the managers, as machines do; they end with the
	// test (registered after TempDir, so run before it is removed).
	t.Cleanup(func() { killAgents(t, ns) })

	// The earlier release's manager runs the fleet, and reboots a Machine.
	previousManager := startManager(t, "previous", previous, state)
	if _, stderr, err := kubectl(ctx, fleet, "apply", "-n", ns, "-f", "-"); err != nil {
		t.Fatalf("applying the fleet at v1alpha1: %v\n%s", err, stderr)
	}
	waitForFleet(t, ns, 10, previousManager)
	rebooted := machinesAtV1alpha1(t, ns)[0].Name
	if _, stderr, err := kubectl(ctx, "", "annotate", "-n", ns, "machines.v1alpha1.machinist.dev/"+rebooted, v1alpha1.RequestAnnotation+"=reboot"); err != nil {
		t.Fatalf("asking for a reboot at v1alpha1: %v\n%s", err, stderr)
	}
	waitRebooted(t, ns, rebooted, "v1alpha1")
	waitForFleet(t, ns, 10, previousManager)
	start := snapshot(t, ns, state, "v1alpha1")
	if got := start.restarts[start.machines[rebooted].UID]; got != 1 {
		t.Fatalf("the rebooted Machine's instance restarted %d times, want 1", got)
	}
	before := storedAt(t, ns)
	for key, version := range before {
		if version != "machinist.dev/v1alpha1" {
			t.Fatalf("before the upgrade %s is stored at %s", key, version)
		}
	}
	t.Logf("the earlier release runs %d Machines; %d objects stored at v1alpha1", len(start.machines), len(before))

	// Step 1 of the upgrade: the new CRDs and the verbs server that
	// converts for them, while the earlier manager still runs (kubectl
	// apply does not wait for one before the other).
	verbs, err := env.StartVerbs()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = verbs.Stop() })
	crds, err := config.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	webhook := fmt.Sprintf("https://localhost:%d%s", verbs.Server.Port, apiserver.ConversionPath)
	if err := apiserver.InstallCRDs(ctx, env.Client, crds, webhook, verbs.Server.CABundle); err != nil {
		t.Fatal(err)
	}
	// Then the manager's Deployment rolls: the old pod stops, the new
	// one takes the Lease.
	testenv.WaitFor(t, time.Minute, "v1beta1 served and converting", func() error {
		return env.Client.List(ctx, &machinistv1.MachineList{}, client.InNamespace(ns))
	})
	previousManager.stop(t)
	quiet := versions(t, ns)
	sets := objects(t, ns)
	currentManager := startManager(t, "current", current, state)
	testenv.WaitFor(t, time.Minute, "the current manager to lead", func() error { return leads(ctx, currentManager) })
	settled := waitQuiet(t, ns, 10*time.Second, currentManager)
	after := objects(t, ns)
	var takeover []string
	for key, rv := range settled {
		if quiet[key] != rv {
			if why := autoscalerKeysOnly(sets[key], after[key]); why != "" {
				takeover = append(takeover, key+" ("+why+")")
			}
		}
	}
	sort.Strings(takeover)
	if len(takeover) > 0 || len(settled) != len(quiet) {
		t.Errorf("the current manager's first pass over the settled fleet wrote %v (%d objects before, %d after); a settled fleet is written nothing but the cluster-autoscaler's keys this release adds to a deployment and its sets", takeover, len(quiet), len(settled))
	}

	// The plugin reads the objects still stored at v1alpha1 through
	// v1beta1: the reboot the earlier release did, and the rollout.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"machine", "status", rebooted}, "Reboot"},
		{[]string{"machine", "rollout", "status", "md/web"}, `machinedeployment "web" successfully rolled out`},
		{[]string{"machine", "rollout", "history", "md/web", "--revision", "1"}, "example.com/pool"},
	} {
		stdout, stderr, err := kubectl(ctx, "", append(c.args, "-n", ns)...)
		if err != nil || !strings.Contains(stdout, c.want) {
			t.Errorf("kubectl %s before the migration: %v; want %q in its output:\n%s\nstderr:\n%s", strings.Join(c.args, " "), err, c.want, stdout, stderr)
		}
	}

	// Step 2: `machinist migrate` rewrites each object once. Those still
	// stored at v1alpha1 now are what it has to do: all of them, unless
	// the earlier manager wrote one after the new CRDs came (stored at
	// v1beta1 by that write).
	stored := map[string]string{}
	for key, version := range storedAt(t, ns) {
		if version == "machinist.dev/v1alpha1" {
			stored[key] = version
		}
	}
	if len(stored) != len(before) {
		t.Logf("%d of the %d objects are still stored at v1alpha1 when the migration starts", len(stored), len(before))
	}
	written := writes(t, ns, func() {
		// kube-controller-manager starts a migration only once its cache
		// of the resource has caught up, which for a quiet resource may
		// take a watch bookmark's minute and its retries' backoff.
		cmd := exec.CommandContext(ctx, current, "migrate", "--kubeconfig="+env.Kubeconfig, "--timeout=5m")
		began := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("machinist migrate, %.1f s:\n%s", time.Since(began).Seconds(), out)
		if err != nil {
			svm, _, _ := kubectl(ctx, "", "get", "storageversionmigrations", "-o", "yaml")
			t.Fatalf("machinist migrate: %v\nthe StorageVersionMigrations:\n%s", err, svm)
		}
	})
	for key := range stored {
		if written[key] != 1 {
			t.Errorf("%s was written %d times by the migration, want once", key, written[key])
		}
	}
	for key := range written {
		if _, ok := stored[key]; !ok {
			t.Errorf("%s, which was not stored at v1alpha1, was written %d times by the migration", key, written[key])
		}
	}
	for key, version := range storedAt(t, ns) {
		if version != "machinist.dev/v1beta1" {
			t.Errorf("after the migration %s is stored at %s", key, version)
		}
	}
	for _, crd := range crds {
		got := &apiextensionsv1.CustomResourceDefinition{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(crd), got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Status.StoredVersions, []string{"v1beta1"}) {
			t.Errorf("CRD %s: storedVersions %v after the migration, want [v1beta1]", crd.Name, got.Status.StoredVersions)
		}
	}

	// Nothing replaced, rebooted or done again: the same Machines on the
	// same instances, whose agents never restarted, the same sets, the
	// same operations.
	end := snapshot(t, ns, state, "v1beta1")
	end.compare(t, start)

	// v1alpha1 is still served, and says it is deprecated.
	stdout, stderr, err := kubectl(ctx, "", "get", "-n", ns, "machines.v1alpha1.machinist.dev", "-o", "name")
	if err != nil {
		t.Fatalf("kubectl get machines.v1alpha1.machinist.dev: %v\n%s", err, stderr)
	}
	if got := strings.Fields(stdout); len(got) != len(start.machines) {
		t.Errorf("kubectl get machines.v1alpha1.machinist.dev listed %d Machines, want %d:\n%s", len(got), len(start.machines), stdout)
	}
	if !strings.Contains(stderr, deprecation) {
		t.Errorf("kubectl get machines.v1alpha1.machinist.dev printed no deprecation warning; stderr:\n%s", stderr)
	}
	// A bare `kubectl get machines` picks the version its discovery cache
	// prefers: a cache from before the upgrade, which knew v1alpha1 alone,
	// is trusted for six hours. Refreshed, as docs/operations.md says, it
	// is v1beta1's, without a warning.
	_, stderr, _ = kubectl(ctx, "", "get", "-n", ns, "machines", "-o", "name")
	t.Logf("kubectl get machines with the discovery cache of before the upgrade warned: %v", strings.Contains(stderr, deprecation))
	if _, stderr, err := kubectl(ctx, "", "api-resources", "--api-group=machinist.dev"); err != nil {
		t.Fatalf("kubectl api-resources: %v\n%s", err, stderr)
	}
	stdout, stderr, err = kubectl(ctx, "", "get", "-n", ns, "machines", "-o", "name")
	if err != nil || strings.Contains(stderr, "deprecated") || len(strings.Fields(stdout)) != len(start.machines) {
		t.Errorf("kubectl get machines after its discovery cache was refreshed: %v\n%s\nstderr:\n%s", err, stdout, stderr)
	}

	// The current manager drives the earlier release's machines: a reboot
	// asked for through the verbs server, and a scale-up whose new Machine runs this
	// release's agent beside them.
	again := machinistv1.MachineList{}
	if err := env.Client.List(ctx, &again, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	other := ""
	for _, m := range again.Items {
		if m.Name != rebooted {
			other = m.Name
			break
		}
	}
	if stdout, stderr, err := kubectl(ctx, "", "machine", "reboot", other, "-n", ns); err != nil {
		t.Fatalf("kubectl machine reboot %s: %v\n%s%s", other, err, stdout, stderr)
	}
	waitRebooted(t, ns, other, "v1beta1")
	if _, stderr, err := kubectl(ctx, "", "scale", "-n", ns, "machinedeployment/web", "--replicas=11"); err != nil {
		t.Fatalf("kubectl scale: %v\n%s", err, stderr)
	}
	waitForFleet(t, ns, 11, currentManager)
	last := snapshot(t, ns, state, "v1beta1")
	for name, m := range start.machines {
		want := 0
		switch name {
		case rebooted:
			want = 1
		case other:
			want = 1
		}
		if got := last.restarts[m.UID]; got != want {
			t.Errorf("Machine %s's instance restarted %d times, want %d", name, got, want)
		}
	}
	if len(last.machines) != 11 || len(last.sets) != 1 {
		t.Errorf("after the scale-up: %d Machines in %d sets, want 11 in the one set", len(last.machines), len(last.sets))
	}
}

// machine is what the test keeps of a Machine to tell it apart from a
// replacement and to tell whether an operation ran again.
type machine struct {
	UID        types.UID
	ProviderID string
	Operation  string // type, ID and state
}

// books is the fleet at one moment: its Machines and MachineSets, each
// instance's restarts, and each Machine's agent process.
type books struct {
	machines map[string]machine
	sets     map[string]types.UID
	restarts map[types.UID]int
	agents   map[string][]int // by providerID
}

// snapshot reads the fleet at version (v1alpha1 before the upgrade,
// v1beta1 after it) and the process provider's state directory.
func snapshot(t *testing.T, ns, state, version string) books {
	t.Helper()
	b := books{machines: map[string]machine{}, sets: map[string]types.UID{}, restarts: map[types.UID]int{}, agents: agents(t, ns)}
	for _, m := range list(t, ns, "machines", version) {
		op, _, _ := unstructured.NestedMap(m.Object, "status", "operation")
		providerID, _, _ := unstructured.NestedString(m.Object, "status", "providerID")
		b.machines[m.GetName()] = machine{UID: m.GetUID(), ProviderID: providerID,
			Operation: fmt.Sprintf("%v %v %v", op["type"], op["id"], op["state"])}
	}
	for _, ms := range list(t, ns, "machinesets", version) {
		b.sets[ms.GetName()] = ms.GetUID()
	}
	instances, err := process.Instances(state)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range instances {
		if in.Namespace == ns {
			b.restarts[in.UID] = in.Restarts
		}
	}
	return b
}

// compare reports every difference from an earlier snapshot.
func (b books) compare(t *testing.T, earlier books) {
	t.Helper()
	for name, was := range earlier.machines {
		now, ok := b.machines[name]
		switch {
		case !ok:
			t.Errorf("Machine %s is gone", name)
		case now != was:
			t.Errorf("Machine %s was %+v, is %+v", name, was, now)
		}
		if b.restarts[was.UID] != earlier.restarts[was.UID] {
			t.Errorf("Machine %s's instance restarted: %d restarts before, %d after", name, earlier.restarts[was.UID], b.restarts[was.UID])
		}
		if !slices.Equal(b.agents[was.ProviderID], earlier.agents[was.ProviderID]) {
			t.Errorf("Machine %s's agent was process %v, is %v", name, earlier.agents[was.ProviderID], b.agents[was.ProviderID])
		}
	}
	for name := range b.machines {
		if _, ok := earlier.machines[name]; !ok {
			t.Errorf("Machine %s is new", name)
		}
	}
	if !maps.Equal(b.sets, earlier.sets) {
		t.Errorf("MachineSets were %v, are %v", earlier.sets, b.sets)
	}
}

// list lists ns's objects of resource at version.
func list(t *testing.T, ns, resource, version string) []unstructured.Unstructured {
	t.Helper()
	l, err := dynamicClient(t).Resource(schema.GroupVersionResource{Group: "machinist.dev", Version: version, Resource: resource}).
		Namespace(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing %s at %s: %v", resource, version, err)
	}
	return l.Items
}

func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// versions are the resourceVersions of every Machinist object of ns, at
// v1beta1, by resource/name.
func versions(t *testing.T, ns string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range resources {
		for _, o := range list(t, ns, r, "v1beta1") {
			out[r+"/"+o.GetName()] = o.GetResourceVersion()
		}
	}
	return out
}

// waitQuiet waits until no Machinist object of ns has changed for quiet,
// and returns their resourceVersions then.
func waitQuiet(t *testing.T, ns string, quiet time.Duration, m *manager) map[string]string {
	t.Helper()
	last, since := versions(t, ns), time.Now()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Since(since) < quiet {
		if time.Now().After(deadline) {
			t.Fatalf("the fleet did not settle for %s within 2 minutes", quiet)
		}
		if ended, err := m.exited(); ended {
			t.Fatalf("the %s manager exited: %v", m.name, err)
		}
		time.Sleep(time.Second)
		if now := versions(t, ns); !maps.Equal(now, last) {
			last, since = now, time.Now()
		}
	}
	return last
}

// writes counts, by resource/name, the changes to ns's Machinist objects
// that happen while do runs (and until they have been quiet for two
// seconds after it).
func writes(t *testing.T, ns string, do func()) map[string]int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan string, 1024)
	for _, r := range resources {
		ri := dynamicClient(t).Resource(schema.GroupVersionResource{Group: "machinist.dev", Version: "v1beta1", Resource: r}).Namespace(ns)
		l, err := ri.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w, err := ri.Watch(ctx, metav1.ListOptions{ResourceVersion: l.GetResourceVersion()})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer w.Stop()
			for e := range w.ResultChan() {
				if o, ok := e.Object.(*unstructured.Unstructured); ok && e.Type != watch.Bookmark {
					events <- r + "/" + o.GetName()
				}
			}
		}()
	}
	do()
	out := map[string]int{}
	for {
		select {
		case key := <-events:
			out[key]++
		case <-time.After(2 * time.Second):
			return out
		}
	}
}

// storedAt reads etcd: the apiVersion each Machinist object of ns is
// stored at, by resource/name.
func storedAt(t *testing.T, ns string) map[string]string {
	t.Helper()
	kvs, err := env.Stored(context.Background(), "/registry/machinist.dev/")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for key, value := range kvs {
		// /registry/machinist.dev/<resource>/<namespace>/<name>
		parts := strings.Split(strings.TrimPrefix(key, "/registry/machinist.dev/"), "/")
		if len(parts) != 3 || parts[1] != ns {
			continue
		}
		var o struct {
			APIVersion string `json:"apiVersion"`
		}
		if err := json.Unmarshal(value, &o); err != nil {
			t.Fatalf("etcd key %s: %v", key, err)
		}
		out[parts[0]+"/"+parts[2]] = o.APIVersion
	}
	return out
}

// waitForFleet waits until the MachineDeployment web of ns has replicas
// Machines Running, each with a Ready Node, and its status says so.
func waitForFleet(t *testing.T, ns string, replicas int, m *manager) {
	t.Helper()
	ctx := context.Background()
	testenv.WaitFor(t, 3*time.Minute, fmt.Sprintf("%d Machines Running with Ready Nodes", replicas), func() error {
		if ended, err := m.exited(); ended {
			t.Fatalf("the %s manager exited: %v\n%s", m.name, err, tail(m.out.String(), 30))
		}
		ms := list(t, ns, "machines", "v1alpha1")
		if len(ms) != replicas {
			return fmt.Errorf("%d Machines", len(ms))
		}
		for _, o := range ms {
			phase, _, _ := unstructured.NestedString(o.Object, "status", "phase")
			node, _, _ := unstructured.NestedString(o.Object, "status", "nodeRef", "name")
			if phase != "Running" || node == "" {
				return fmt.Errorf("Machine %s is %q with Node %q", o.GetName(), phase, node)
			}
			n := &corev1.Node{}
			if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
				return err
			}
			ready := false
			for _, c := range n.Status.Conditions {
				ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
			}
			if !ready {
				return fmt.Errorf("Node %s is not Ready", node)
			}
		}
		md := &v1alpha1.MachineDeployment{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, md); err != nil {
			return err
		}
		if md.Status.AvailableReplicas != int32(replicas) || md.Status.UpdatedReplicas != int32(replicas) {
			return fmt.Errorf("the MachineDeployment counts %d available, %d updated", md.Status.AvailableReplicas, md.Status.UpdatedReplicas)
		}
		return nil
	})
}

// waitRebooted waits until Machine name of ns, read at version, is
// Running again after a reboot that Succeeded.
func waitRebooted(t *testing.T, ns, name, version string) {
	t.Helper()
	testenv.WaitFor(t, 2*time.Minute, "the reboot of "+name+", read at "+version, func() error {
		m, err := dynamicClient(t).Resource(schema.GroupVersionResource{Group: "machinist.dev", Version: version, Resource: "machines"}).
			Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		phase, _, _ := unstructured.NestedString(m.Object, "status", "phase")
		typ, _, _ := unstructured.NestedString(m.Object, "status", "operation", "type")
		state, _, _ := unstructured.NestedString(m.Object, "status", "operation", "state")
		if typ != "Reboot" || state != "Succeeded" || phase != "Running" {
			return fmt.Errorf("phase %s, operation %s %s", phase, typ, state)
		}
		return nil
	})
}

// machinesAtV1alpha1 lists ns's Machines through the earlier release's
// version, sorted by name.
func machinesAtV1alpha1(t *testing.T, ns string) []v1alpha1.Machine {
	t.Helper()
	l := &v1alpha1.MachineList{}
	if err := env.Client.List(context.Background(), l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items
}

// leads says whether m holds the managers' leader Lease: the Lease names
// the holder by host name and a UUID, so m is recognised by its metrics.
func leads(ctx context.Context, m *manager) error {
	if ended, err := m.exited(); ended {
		return fmt.Errorf("the %s manager exited: %v", m.name, err)
	}
	lease := &coordinationv1.Lease{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: leaseNamespace, Name: "machinist-manager"}, lease); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.metrics+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("scraping the %s manager's metrics: %w", m.name, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if !bytes.Contains(out, []byte(`leader_election_master_status{name="machinist-manager"} 1`)) {
		return fmt.Errorf("the %s manager does not lead (the Lease is %s's)", m.name, ptrString(lease.Spec.HolderIdentity))
	}
	return nil
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// kubectl runs the real kubectl with stdin, returning what it printed on
// each stream. Its discovery cache is the test's own (kubectlCache), kept
// across the upgrade as a user's is.
func kubectl(ctx context.Context, stdin string, args ...string) (string, string, error) {
	if len(args) == 0 || args[0] != "machine" {
		// kubectl refuses flags before a plugin's name.
		args = append([]string{"--cache-dir", kubectlCache}, args...)
	}
	cmd := env.KubectlCommand(ctx, args...)
	cmd.Stdin = strings.NewReader(stdin)
	// The plugin, kubectl-machine, is found on PATH.
	cmd.Env = append(cmd.Env, "PATH="+plugins+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// agents finds the running agent processes of ns's Machines, by
// providerID.
func agents(t *testing.T, ns string) map[string][]int {
	all, err := process.Agents()
	if err != nil {
		t.Fatal(err)
	}
	maps.DeleteFunc(all, func(id string, _ []int) bool { return !strings.HasPrefix(id, "process:///"+ns+"/") })
	return all
}

// killAgents ends every agent of ns's Machines.
func killAgents(t *testing.T, ns string) {
	for _, pids := range agents(t, ns) {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// objects are the MachineDeployments and MachineSets of ns, at v1beta1,
// by resource/name.
func objects(t *testing.T, ns string) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	for _, r := range []string{"machinedeployments", "machinesets"} {
		for _, o := range list(t, ns, r, "v1beta1") {
			out[r+"/"+o.GetName()] = &o
		}
	}
	return out
}

// autoscalerKeys are what this release adds, once, to a deployment and
// its sets made by an earlier one, for the cluster-autoscaler
// (docs/autoscaling.md): its one write to a settled fleet.
var autoscalerKeys = []string{
	machinistv1.DeploymentNameLabel, machinistv1.DeploymentRevisionAnnotation,
	"machinist.dev/cluster-name", "machinist.dev/published-capacity", "capacity.cluster-autoscaler.kubernetes.io/",
}

// autoscalerKeysOnly says how b differs from a beyond adding
// autoscalerKeys to its labels and annotations, or "" if it does not.
func autoscalerKeysOnly(a, b *unstructured.Unstructured) string {
	if a == nil || b == nil {
		return "not a deployment or a set"
	}
	if a.GetGeneration() != b.GetGeneration() {
		return "its spec"
	}
	for _, m := range [][2]map[string]string{{a.GetLabels(), b.GetLabels()}, {a.GetAnnotations(), b.GetAnnotations()}} {
		for k, v := range m[1] {
			if have, ok := m[0][k]; ok && have == v {
				continue
			}
			if !slices.ContainsFunc(autoscalerKeys, func(p string) bool { return k == p || strings.HasSuffix(p, "/") && strings.HasPrefix(k, p) }) {
				return "its " + k
			}
		}
		for k := range m[0] {
			if _, ok := m[1][k]; !ok {
				return "removed " + k
			}
		}
	}
	if !equality.Semantic.DeepEqual(a.Object["status"], b.Object["status"]) {
		return "its status"
	}
	return ""
}
