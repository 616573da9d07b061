package bench

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machinedeployment"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/lifecycle/operation"
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
	unavailable := intstr.FromString("10%")
	md := benchDeployment(ns, n, machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy,
		InPlace: &machinistv1.InPlaceUpdate{MaxUnavailable: &unavailable}})
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
	upgraded, churn, err := watchInPlace(ctx, ns, n, "v1.37.2", machinedeployment.TemplateHash(*next))
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
	return watchUntil(ctx, ns, n, func(m *machinistv1.Machine) bool {
		return m.Status.Phase == machinistv1.MachineRunning && !operation.InFlight(m.Status.Operation) &&
			m.Status.NodeInfo != nil && m.Status.NodeInfo.KubeletVersion == version &&
			m.Labels[machinistv1.TemplateHashLabel] == hash
	})
}
