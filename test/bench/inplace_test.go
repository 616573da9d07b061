package bench

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/deployment"
	"github.com/machinist-dev/machinist/internal/testenv"
	"github.com/machinist-dev/machinist/lifecycle"
)

// BenchmarkInPlaceUpgrade times an in-place node upgrade of 500 Machines
// (strategy InPlace, maxUnavailable 10%, zero-latency provider), beside
// BenchmarkRollingUpgrade's replacement of as many: from the template
// change until every Machine runs the new version on its own Node, is
// Running with its update done and belongs to the new revision's
// MachineSet. It counts writes per updated Machine and checks that none
// was created or deleted.
func BenchmarkInPlaceUpgrade(b *testing.B) {
	for range b.N {
		inPlaceUpgrade(b, 500)
	}
}

func inPlaceUpgrade(b *testing.B, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube, ctrls, ns := setUp(ctx, b, "inplace")
	defer func() { _ = ctrls.Stop() }()
	labels := map[string]string{"pool": "bench"}
	unavailable := intstr.FromString("10%")
	md := &machinistv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench"},
		Spec: machinistv1.MachineDeploymentSpec{
			Replicas: ptr.To(int32(n)),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Strategy: machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy,
				InPlace: &machinistv1.InPlaceUpdate{MaxUnavailable: &unavailable}},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.1"},
			},
		},
	}
	before, err := watchVersion(ctx, ns, n, "v1.37.1")
	if err != nil {
		b.Fatal(err)
	}
	if err := env.Client.Create(ctx, md); err != nil {
		b.Fatal(err)
	}
	wait(b, before, timeout(n), "the first version")

	next := md.Spec.Template.DeepCopy()
	next.Spec.Version = "v1.37.2"
	upgraded, churn, err := watchInPlace(ctx, ns, n, "v1.37.2", deployment.TemplateHash(*next))
	if err != nil {
		b.Fatal(err)
	}
	w0, err := testenv.ReadWrites(ctx, kube)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	patch := []byte(`{"spec":{"template":{"spec":{"version":"v1.37.2"}}}}`)
	if err := env.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, patch)); err != nil {
		b.Fatal(err)
	}
	wait(b, upgraded, 2*timeout(n), "the in-place upgrade")
	engine := time.Since(start)
	w1 := finalWrites(ctx, b, kube)
	if c := churn(); c != 0 {
		b.Fatalf("%d Machines were created or deleted during an in-place upgrade", c)
	}
	w := w1.Done.Since(w0.Done)
	object := w.Sum("machines", "machines/status", "machinesets", "machinesets/status", "machinedeployments", "machinedeployments/status", "nodes")
	b.ReportMetric(engine.Seconds(), "s-to-upgraded")
	b.ReportMetric(object/float64(n), "writes/updated-machine")
	b.ReportMetric(w.Sum("machines", "machines/status")/float64(n), "machine-writes/updated-machine")
	b.ReportMetric(w.Sum("events")/float64(n), "events/updated-machine")
	b.Logf("N=%d: successful writes by resource %v; refused %v", n, w, w1.Refused.Since(w0.Refused))
}

// watchInPlace closes the returned channel once exactly n Machines exist
// in ns, each Running on version with no operation in flight and labelled
// with hash; churn reports how many Machines were added or deleted since
// the watch began.
func watchInPlace(ctx context.Context, ns string, n int, version, hash string) (<-chan struct{}, func() int, error) {
	events, err := env.WatchMachines(ctx, ns)
	if err != nil {
		return nil, nil, err
	}
	// The watch streams changes only: start from what is there. Nothing
	// changes before the template does.
	var list machinistv1.MachineList
	if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, nil, err
	}
	all := map[string]*machinistv1.Machine{}
	seen := map[types.UID]bool{}
	for i := range list.Items {
		all[list.Items[i].Name] = &list.Items[i]
		seen[list.Items[i].UID] = true
	}
	done := make(chan struct{})
	churn := make(chan int, 1)
	churn <- 0
	go func() {
		for ev := range events {
			m, ok := ev.Object.(*machinistv1.Machine)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted {
				delete(all, m.Name)
				churn <- <-churn + 1
				continue
			}
			if !seen[m.UID] {
				seen[m.UID] = true
				churn <- <-churn + 1
			}
			all[m.Name] = m
			if len(all) != n {
				continue
			}
			ok = true
			for _, m := range all {
				if m.Status.Phase != machinistv1.MachineRunning || lifecycle.InFlight(m.Status.Operation) ||
					m.Status.NodeInfo == nil || m.Status.NodeInfo.KubeletVersion != version ||
					m.Labels[machinistv1.TemplateHashLabel] != hash {
					ok = false
					break
				}
			}
			if ok {
				close(done)
				return
			}
		}
	}()
	return done, func() int { c := <-churn; churn <- c; return c }, nil
}
