package bench

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// BenchmarkReboot reboots N Running Machines at once through the verbs
// server, by PUT on machines/NAME/reboot through kube-apiserver's
// aggregated path, and times two things: how long until every request is
// accepted (202), and until every Machine is Running again with a new boot
// ID. It counts the Machine writes per reboot; the least possible is three
// (the operation recorded; Rebooting, since a Node without pods drains in
// the reconcile that starts the operation; Running). Its "budget" run
// reboots 100 under a MachineDisruptionBudget that allows them all: every
// request is admitted by the verbs server and again by the Machine
// controller, and recorded in the one budget, which all of them write.
func BenchmarkReboot(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			for range b.N {
				rebootAll(b, n, false)
			}
		})
	}
	b.Run("machines=100/budget", func(b *testing.B) {
		for range b.N {
			rebootAll(b, 100, true)
		}
	})
}

func rebootAll(b *testing.B, n int, budget bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube, ctrls, ns := setUp(ctx, b, "reboot")
	defer func() { _ = ctrls.Stop() }()
	verbs, err := env.StartVerbs()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = verbs.Stop() }()

	running, err := watchRunning(ctx, ns, n)
	if err != nil {
		b.Fatal(err)
	}
	createSet(ctx, b, ns, n)
	wait(b, running, timeout(n), "every Machine Running")
	if budget {
		mdb := &machinistv1.MachineDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench"},
			Spec: machinistv1.MachineDisruptionBudgetSpec{
				Selector:     machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": "bench"}},
				MaxDisrupted: intstr.FromString("100%"),
			},
		}
		if err := env.Client.Create(ctx, mdb); err != nil {
			b.Fatal(err)
		}
	}
	var list machinistv1.MachineList
	if err := env.Client.List(ctx, &list); err != nil {
		b.Fatal(err)
	}
	rebooted, err := watchRebooted(ctx, ns, n)
	if err != nil {
		b.Fatal(err)
	}
	// A quiet spell for trailing writes to land before counting: nothing
	// shows when they are over.
	time.Sleep(time.Second)
	before, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		b.Fatal(err)
	}

	// A client as fast as the engine's, not client-go's default 5 QPS.
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = qps, burst
	users, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	start := time.Now()
	names := make(chan string)
	var refused atomic.Int32
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for name := range names {
				var code int
				users.CoreV1().RESTClient().Put().
					AbsPath(fmt.Sprintf("/apis/%s/namespaces/%s/machines/%s/reboot", subresourcesv1.SchemeGroupVersion, ns, name)).
					SetHeader("Content-Type", "application/json").Body([]byte(`{}`)).Do(ctx).StatusCode(&code)
				if code != http.StatusAccepted {
					refused.Add(1)
				}
			}
		})
	}
	for _, m := range list.Items {
		if m.Namespace == ns {
			names <- m.Name
		}
	}
	close(names)
	wg.Wait()
	accepted := time.Since(start)
	if refused.Load() > 0 {
		b.Fatalf("%d reboot requests were not accepted", refused.Load())
	}
	wait(b, rebooted, timeout(n), "every reboot Succeeded")
	total := time.Since(start)
	after := finalWrites(ctx, b, kube)
	w := after.Done.Since(before.Done)
	b.ReportMetric(accepted.Seconds(), "s-to-accept-all")
	b.ReportMetric(float64(n)/accepted.Seconds(), "requests/s")
	b.ReportMetric(total.Seconds(), "s-to-rebooted")
	b.ReportMetric(w.Sum("machines", "machines/status")/float64(n), "machine-writes/reboot")
	b.ReportMetric(w.Sum("events")/float64(n), "events/reboot")
	b.ReportMetric(w.Sum("nodes", "nodes/status", "leases")/float64(n), "node-writes/reboot")
	lists := after.Lists.Since(before.Lists)
	if budget {
		b.ReportMetric(w.Sum("machinedisruptionbudgets/status")/float64(n), "budget-writes/reboot")
		b.ReportMetric(after.Refused.Since(before.Refused).Sum("machinedisruptionbudgets/status")/float64(n), "refused-budget-writes/reboot")
		b.ReportMetric(lists.Sum("machinedisruptionbudgets")/float64(n), "budget-lists/reboot")
	}
	b.Logf("N=%d: successful writes by resource %v; refused writes %v; lists %v", n, w, after.Refused.Since(before.Refused), lists)
}

// watchRebooted closes its channel once n Machines of ns have a reboot
// operation that Succeeded.
func watchRebooted(ctx context.Context, ns string, n int) (<-chan struct{}, error) {
	events, err := env.WatchMachines(ctx, ns)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		ok := map[string]bool{}
		for ev := range events {
			m, isMachine := ev.Object.(*machinistv1.Machine)
			if !isMachine || ev.Type == watch.Deleted {
				continue
			}
			if op := m.Status.Operation; op != nil && op.Type == machinistv1.OperationReboot &&
				op.State == machinistv1.OperationSucceeded && m.Status.Phase == machinistv1.MachineRunning {
				ok[m.Name] = true
			}
			if len(ok) == n {
				close(done)
				return
			}
		}
	}()
	return done, nil
}
