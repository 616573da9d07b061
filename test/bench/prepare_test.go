package bench

import (
	"context"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/clusters/joinable"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// BenchmarkPrepare times what `machinist cluster prepare` does on a
// cluster that has everything: installing the join RBAC when it is
// already there (five reads), and the seven checks, of which the
// certificate request waits for kube-controller-manager to approve and
// sign it and the token cleaner for it to delete a token. Each is run
// runs times; the median is reported.
func BenchmarkPrepare(b *testing.B) {
	const runs = 10
	ctx := context.Background()
	e := freshEnv(b, testenv.Options{Workload: true})
	kube, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		b.Fatal(err)
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return d[len(d)/2].Seconds()
	}
	for range b.N {
		var install, check []time.Duration
		for range runs {
			start := time.Now()
			if _, err := joinable.Install(ctx, kube, false); err != nil {
				b.Fatal(err)
			}
			install = append(install, time.Since(start))
			start = time.Now()
			r, err := joinable.Check(ctx, e.Config, joinable.Options{})
			if err != nil {
				b.Fatal(err)
			}
			if !r.Joinable() {
				b.Fatalf("not joinable: %+v", r.Failures())
			}
			check = append(check, time.Since(start))
		}
		b.ReportMetric(median(install)*1000, "ms/install")
		b.ReportMetric(median(check)*1000, "ms/check")
	}
}
