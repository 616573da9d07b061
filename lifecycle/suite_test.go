package lifecycle_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/machinist-dev/machinist/actuators"
	"github.com/machinist-dev/machinist/actuators/inmemory"
	"github.com/machinist-dev/machinist/internal/testenv"
	"github.com/machinist-dev/machinist/lifecycle"
)

var (
	env      *testenv.Env
	k8s      client.Client
	kube     kubernetes.Interface
	provider *inmemory.Provider
	metrics  *lifecycle.Metrics
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
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(env.Stop)
	k8s = env.Client
	kube, err = kubernetes.NewForConfig(env.Config)
	Expect(err).NotTo(HaveOccurred())

	provider, err = inmemory.New(inmemory.Options{
		Config: env.Config, LeaseDurationSeconds: leaseSeconds, RenewInterval: 500 * time.Millisecond,
	})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(provider.Stop)
	registry := actuators.NewRegistry()
	Expect(registry.Register("inmemory", provider)).To(Succeed())

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:  env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	Expect(err).NotTo(HaveOccurred())
	metrics = lifecycle.NewMetrics(mgr.GetClient())
	Expect(metrics.Register(prometheus.NewRegistry())).To(Succeed())
	r := &lifecycle.Reconciler{
		Client:           mgr.GetClient(),
		Kube:             kube,
		Recorder:         mgr.GetEventRecorder("machinist-machine"),
		Actuators:        registry,
		Metrics:          metrics,
		ProvisionTimeout: provisionTimeout,
		Backoff:          lifecycle.Backoff{Base: 50 * time.Millisecond, Cap: time.Second},
		DrainPoll:        200 * time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	Expect(r.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 4})).To(Succeed())
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	DeferCleanup(cancel)
})

// newNamespace creates a namespace for one spec and deletes it afterwards.
func newNamespace(ctx context.Context) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "lifecycle-"}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, ns))).To(Succeed())
	})
	return ns.Name
}

// metricsCollector returns the machines-by-phase gauge for inspection.
func metricsCollector() prometheus.Collector {
	return metrics.ByPhase()
}
