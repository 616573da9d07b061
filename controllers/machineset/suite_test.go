package machineset_test

import (
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers/inmemory"
)

var (
	env      *testenv.Env
	k8s      client.Client
	provider testenv.Provider
)

func TestMachineSets(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "MachineSet controller")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	var controllers *testenv.Controllers
	var stop func() error
	var err error
	env, controllers, stop, err = testenv.StartWithServedControllers(manager.Options{ProvisionTimeout: 20 * time.Second,
		// Long enough that the pacing spec can count its looks; the
		// other specs' sets are a few Machines, paced a few tens of ms.
		PerMachine: 25 * time.Millisecond},
		testenv.Leases{DurationSeconds: 10, RenewInterval: 2 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(stop)
	k8s, provider = env.Client, controllers.Provider
})

var (
	noFaults           = inmemory.ProviderSpec{}
	inmemoryFailCreate = inmemory.ProviderSpec{FailCreate: "out of capacity"}
)
