package clusters

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/clusters/joinable"
	"github.com/machinist-dev/machinist/clusters/joinprobe"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// joinablePeriod is how often the manager of these tests checks each
// connected cluster (manager.Options.ClusterJoinablePeriod in TestMain).
const joinablePeriod = 5 * time.Second

// reviewsPerCheck is how many SelfSubjectAccessReviews each join check
// begins with: whether the manager may do what the check does.
const reviewsPerCheck = 6

// A cluster whose kube-apiserver takes no bootstrap tokens (and lacks
// Machinist's bindings besides): its WorkloadCluster says Joinable=False
// with the first reason and its flag, counting the rest, within one check
// of its connection; checked again every period, it finds the same and
// is written no more.
func TestJoinableSaysWhatAClusterLacks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := env.NewNamespace(t, "unjoinable", testenv.Small)
	w := startCluster(t, testenv.Options{Unprepared: true, Lacks: testenv.Lacks{BootstrapTokens: true}})
	everywhere, err := env.Watch(ctx, "", func() client.ObjectList { return &machinistv1.WorkloadClusterList{} })
	if err != nil {
		t.Fatal(err)
	}
	wc := registerWithMachine(t, w, ns, "refusing")
	registered := time.Now()
	testenv.WaitForObject(t, env.Client, 2*joinablePeriod+30*time.Second, "the WorkloadCluster not Joinable", wc, func(wc *machinistv1.WorkloadCluster) error {
		c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterJoinable)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != joinable.ReasonBootstrapTokensRefused {
			return fmt.Errorf("Joinable %+v", c)
		}
		return nil
	})
	c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterJoinable)
	t.Logf("Joinable=%s %s after %s: %s", c.Status, c.Reason, time.Since(registered).Round(100*time.Millisecond), c.Message)
	for _, want := range []string{"--enable-bootstrap-token-auth", "(and 1 more: run machinist cluster prepare"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("the message does not say %q: %s", want, c.Message)
		}
	}

	// From here on the checks run every period and find the same: the
	// WorkloadCluster is written at most once or twice (its counts), by
	// kube-apiserver's count of status writes of WorkloadClusters, less
	// the writes the watch of every namespace shows elsewhere.
	drain(everywhere)
	wkube, err := kubernetes.NewForConfig(w.Config)
	if err != nil {
		t.Fatal(err)
	}
	before, err := testenv.ReadWrites(ctx, kube(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	checksBefore, err := testenv.ReadWrites(ctx, wkube)
	if err != nil {
		t.Fatal(err)
	}
	window := 4 * joinablePeriod
	time.Sleep(window) // a window of writes counted, not a wait for a state
	after, err := testenv.ReadWrites(ctx, kube(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	checksAfter, err := testenv.ReadWrites(ctx, wkube)
	if err != nil {
		t.Fatal(err)
	}
	mine, elsewhere := 0, 0
	for _, e := range drain(everywhere) {
		if e.Type == watch.Error {
			t.Fatalf("the watch of WorkloadClusters failed: %+v", e.Object)
		}
		if o, ok := e.Object.(*machinistv1.WorkloadCluster); ok && o.Namespace == ns {
			mine++
			t.Logf("WorkloadCluster %s: %+v", e.Type, o.Status)
		} else {
			elsewhere++
		}
	}
	writes := after.Done.Since(before.Done).Sum("workloadclusters/status")
	checks := checksAfter.Done.Since(checksBefore.Done).Sum("selfsubjectaccessreviews") / reviewsPerCheck
	t.Logf("in %s: %.0f checks; %.0f status writes of WorkloadClusters, %d changes of this one, %d of others", window, checks, writes, mine, elsewhere)
	if checks < 2 {
		t.Errorf("the cluster was checked %.0f times in %s, with a period of %s", checks, window, joinablePeriod)
	}
	if mine > 2 || writes-float64(elsewhere) > 2 {
		t.Errorf("a settled WorkloadCluster was written %d times (kube-apiserver counts %.0f status writes, %d elsewhere) in %s", mine, writes, elsewhere, window)
	}
}

// A cluster set up as kubeadm sets one up, without Machinist's bindings:
// Joinable=False with JoinBindingsMissing, and True once the bindings are
// installed as `machinist cluster prepare` installs them, at the next
// check.
func TestJoinableOnceTheBindingsAreInstalled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "joinable", testenv.Small)
	w := startCluster(t, testenv.Options{Unprepared: true})
	wc := registerWithMachine(t, w, ns, "kubeadm")
	registered := time.Now()
	joinableIs(t, wc, metav1.ConditionFalse, joinable.ReasonBindingsMissing, 2*joinablePeriod+30*time.Second)
	t.Logf("Joinable=False %s after the WorkloadCluster was registered", time.Since(registered).Round(100*time.Millisecond))
	c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterJoinable)
	if !strings.Contains(c.Message, "machinist cluster prepare") {
		t.Errorf("the message does not say how to fix it: %s", c.Message)
	}
	wkube, err := kubernetes.NewForConfig(w.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := joinable.Install(ctx, wkube, false); err != nil {
		t.Fatal(err)
	}
	installed := time.Now()
	joinableIs(t, wc, metav1.ConditionTrue, joinprobe.ReasonJoinable, 2*joinablePeriod+30*time.Second)
	t.Logf("Joinable %s after the bindings were installed", time.Since(installed).Round(100*time.Millisecond))
}

// registerWithMachine serves w in ns as the WorkloadCluster name, with a
// Machine of its own so that the manager connects.
func registerWithMachine(t *testing.T, w *testenv.Env, ns, name string) *machinistv1.WorkloadCluster {
	t.Helper()
	wc := register(t, w, ns, name)
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-machine"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}, ClusterName: name},
	}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return wc
}

// joinableIs waits until the Joinable condition of cluster, a
// WorkloadCluster or the ManagementCluster, has status and reason.
func joinableIs[C *machinistv1.WorkloadCluster | *machinistv1.ManagementCluster](t *testing.T, cluster C, status metav1.ConditionStatus, reason string, timeout time.Duration) {
	t.Helper()
	what := fmt.Sprintf("%s Joinable=%s %s", client.Object(cluster).GetName(), status, reason)
	testenv.WaitForObject(t, env.Client, timeout, what, client.Object(cluster), func(o client.Object) error {
		var conditions []metav1.Condition
		switch o := o.(type) {
		case *machinistv1.WorkloadCluster:
			conditions = o.Status.Conditions
		case *machinistv1.ManagementCluster:
			conditions = o.Status.Conditions
		}
		c := meta.FindStatusCondition(conditions, machinistv1.WorkloadClusterJoinable)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("Joinable %+v", c)
		}
		return nil
	})
}

// A cluster whose kubeconfig's user may read Nodes and Leases but not do
// what the checks do: Joinable=Unknown, naming each right it lacks, and
// the checks are asked again each period, not in a loop.
func TestJoinableNamesTheRightsTheManagerLacks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := env.NewNamespace(t, "limited", testenv.Small)
	w := startCluster(t, testenv.Options{})
	wkube, err := kubernetes.NewForConfig(w.Config)
	if err != nil {
		t.Fatal(err)
	}
	const user = "machinist-limited"
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := wkube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := wkube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The admin's kubeconfig, acting as the limited user.
	kc, err := clientcmd.LoadFromFile(w.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range kc.AuthInfos {
		u.Impersonate = user
	}
	kubeconfig, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	limited := &testenv.Env{Kubeconfig: dir + "/kubeconfig"}
	if err := os.WriteFile(limited.Kubeconfig, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	wc := registerWithMachine(t, limited, ns, "limited")
	joinableIs(t, wc, metav1.ConditionUnknown, joinprobe.ReasonCheckForbidden, 2*joinablePeriod+30*time.Second)
	c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterJoinable)
	t.Logf("Joinable=%s %s: %s", c.Status, c.Reason, c.Message)
	for _, want := range []string{"create secrets in kube-system", "create subjectaccessreviews.authorization.k8s.io", "delete certificatesigningrequests.certificates.k8s.io"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("the message does not name %q: %s", want, c.Message)
		}
	}
	// The window is what lies between the two scrapes, not the sleep: a
	// loaded kube-apiserver takes seconds to serve its metrics, and the
	// checks go on meanwhile.
	start := time.Now()
	before, err := testenv.ReadWrites(ctx, wkube)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * joinablePeriod) // a window of checks counted, not a wait for a state
	after, err := testenv.ReadWrites(ctx, wkube)
	if err != nil {
		t.Fatal(err)
	}
	window := time.Since(start)
	asked := after.Done.Since(before.Done).Sum("selfsubjectaccessreviews")
	t.Logf("in %s: %.0f SelfSubjectAccessReviews", window.Round(100*time.Millisecond), asked)
	// Once a period at most a check starts, and one that
	// started before the window may end in it.
	if limit := float64(reviewsPerCheck * (int(window/joinablePeriod) + 2)); asked > limit {
		t.Errorf("the manager asked its rights %.0f times in %s, more than once a period (%.0f)", asked, window.Round(100*time.Millisecond), limit)
	}
}

// A cluster whose only lack is the token cleaner: machines join it, so
// it is Joinable, and the message says that expired tokens linger.
func TestJoinableWithoutATokenCleaner(t *testing.T) {
	t.Parallel()
	w := startCluster(t, testenv.Options{Lacks: testenv.Lacks{TokenCleaner: true}})
	ns := env.NewNamespace(t, "uncleaned", testenv.Small)
	wc := registerWithMachine(t, w, ns, "uncleaned")
	joinableIs(t, wc, metav1.ConditionTrue, joinprobe.ReasonJoinable, joinable.DefaultWait+time.Minute)
	c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterJoinable)
	if !strings.Contains(c.Message, "expired bootstrap tokens are not deleted") || !strings.Contains(c.Message, "token") {
		t.Errorf("Joinable says nothing of the token cleaner: %s", c.Message)
	}
	running(t, ns, 1, 2*time.Minute)
}
