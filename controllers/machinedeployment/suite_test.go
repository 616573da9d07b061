package machinedeployment_test

import (
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

var (
	env *testenv.Env
	k8s client.Client
	// provider counts each machine's restarts: an update carried out once
	// is one.
	provider testenv.Provider
	// controllers are the manager and the provider, for restarts.
	controllers *testenv.Controllers
	// calendar is the budgets' clock: real time, shifted by a test that
	// needs a window to open in a few seconds.
	calendar shiftedClock
)

// shiftedClock runs at the real pace from wherever a test set it.
type shiftedClock struct {
	mu sync.Mutex
	by time.Duration
}

func (c *shiftedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.by)
}

// Set makes it read at now; the zero time puts it back on real time.
func (c *shiftedClock) Set(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.by = 0
	if !at.IsZero() {
		c.by = time.Until(at)
	}
}

func TestMachineDeployments(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "MachineDeployment controller")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	var stop func() error
	var err error
	env, controllers, stop, err = testenv.StartWithServedControllers(manager.Options{ProvisionTimeout: 5 * time.Minute, Now: calendar.Now, DriftDelay: 2 * time.Second,
		// Long enough that the pacing spec can count its looks.
		PerMachine: 10 * time.Millisecond},
		testenv.Leases{DurationSeconds: 20, RenewInterval: 5 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(stop)
	k8s, provider = env.Client, controllers.Provider
})
