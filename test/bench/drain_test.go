package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// drainApps are the apps whose pods each Machine's Node holds, podsPerApp
// of each.
var drainApps = []string{"proxy", "web", "db"}

const podsPerApp = 2

// BenchmarkDrain reboots N Machines at once by the request annotation,
// each Node holding six pods, and times how long until every reboot has
// Succeeded: once with no drain rule (one group, order 0), once with two
// MachineDrainRules that put the proxies first (-10) and the databases last
// (10), three groups drained one after the other. It counts the Machine
// writes and the evictions per reboot, and the writes of the drain rules'
// namespace lookups (none: reads only).
func BenchmarkDrain(b *testing.B) {
	const n = 100
	for _, rules := range []bool{false, true} {
		groups := 1
		if rules {
			groups = 3
		}
		b.Run(fmt.Sprintf("machines=%d/groups=%d", n, groups), func(b *testing.B) {
			for range b.N {
				drainAll(b, n, rules)
			}
		})
	}
}

func drainAll(b *testing.B, n int, rules bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube, ctrls, ns := setUp(ctx, b, "drain")
	defer func() { _ = ctrls.Stop() }()

	running, err := watchRunning(ctx, ns, n)
	if err != nil {
		b.Fatal(err)
	}
	createSet(ctx, b, ns, n)
	wait(b, running, timeout(n), "every Machine Running")
	if rules {
		for name, order := range map[string]int32{"proxies-first": -10, "databases-last": 10} {
			app := "proxy"
			if order > 0 {
				app = "db"
			}
			if err := env.Client.Create(ctx, &machinistv1.MachineDrainRule{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: machinistv1.MachineDrainRuleSpec{
					Behavior: machinistv1.DrainBehaviorDrain, Order: ptr.To(order),
					Pods: []machinistv1.MachineDrainRulePodSelector{{
						Selector: &machinistv1.LabelSelector{MatchLabels: map[string]string{"app": app}},
					}},
				},
			}); err != nil {
				b.Fatal(err)
			}
		}
	}
	var list machinistv1.MachineList
	if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	for _, m := range list.Items {
		for _, app := range drainApps {
			for i := range podsPerApp {
				pod := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%s-%d", m.Name, app, i), Labels: map[string]string{"app": app}},
					Spec: corev1.PodSpec{
						NodeName:                      m.Status.NodeRef.Name,
						TerminationGracePeriodSeconds: ptr.To(int64(0)),
						Containers:                    []corev1.Container{{Name: app, Image: "registry.invalid/" + app + ":1"}},
					},
				}
				if err := env.Client.Create(ctx, pod); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	rebooted, err := watchRebooted(ctx, ns, n)
	if err != nil {
		b.Fatal(err)
	}
	// The agents mark their pods Running meanwhile; their writes are not
	// the drain's.
	if err := testenv.Poll(time.Minute, func() error {
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning {
				return fmt.Errorf("pod %s is %s", p.Name, p.Status.Phase)
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second)
	before, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	start := time.Now()
	for _, m := range list.Items {
		patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"machinist.dev/request":"reboot"}}}`))
		if err := env.Client.Patch(ctx, &m, patch); err != nil {
			b.Fatal(err)
		}
	}
	wait(b, rebooted, timeout(n), "every reboot Succeeded")
	total := time.Since(start)
	after := finalWrites(ctx, b, kube)
	w := after.Done.Since(before.Done)
	b.ReportMetric(total.Seconds(), "s-to-rebooted")
	// The request annotation is one Machine write of the test's, and its
	// removal one of the controller's.
	b.ReportMetric(w.Sum("machines", "machines/status")/float64(n), "machine-writes/reboot")
	b.ReportMetric(w.Sum("pods/eviction")/float64(n), "evictions/reboot")
	b.ReportMetric(w.Sum("events")/float64(n), "events/reboot")
	b.Logf("N=%d rules=%v: successful writes by resource %v; refused writes %v", n, rules, w, after.Refused.Since(before.Refused))
}
