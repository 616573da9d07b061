package machine_test

import (
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

var (
	env      *testenv.Env
	k8s      client.Client
	provider testenv.Provider
	metrics  *machine.Metrics
	// controllers can be restarted, as a crash would.
	controllers *testenv.Controllers
)

// Short leases and timeouts keep the specs fast; they are the only thing
// that differs from a production setup.
const (
	leaseSeconds     = 3
	provisionTimeout = 4 * time.Second
)

func TestController(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Machine controller")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	var stop func() error
	var err error
	env, controllers, stop, err = testenv.StartWithServedControllers(manager.Options{
		MachineWorkers:   4,
		ProvisionTimeout: provisionTimeout,
		Backoff:          machine.Backoff{Base: 50 * time.Millisecond, Cap: time.Second},
		DrainPoll:        200 * time.Millisecond,
		OperationTimeout: 5 * time.Second,
	}, testenv.Leases{DurationSeconds: leaseSeconds, RenewInterval: 500 * time.Millisecond})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(stop)
	k8s = env.Client
	provider = controllers.Provider
	metrics = controllers.Manager.Metrics
})

// metricsCollector returns the machines-by-phase gauge for inspection.
func metricsCollector() prometheus.Collector {
	return metrics.ByPhase()
}
