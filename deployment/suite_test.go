package deployment_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/machinist-dev/machinist/actuators/inmemory"
	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/internal/manager"
	"github.com/machinist-dev/machinist/internal/testenv"
)

var (
	env *testenv.Env
	k8s client.Client
)

func TestMachineDeployments(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "MachineDeployment controller")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(env.Stop)
	k8s = env.Client
	controllers, err := env.StartControllers(manager.Options{ProvisionTimeout: 5 * time.Minute},
		testenv.Leases{DurationSeconds: 20, RenewInterval: 5 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(controllers.Stop)
})

// newNamespace creates a namespace with two MachineClasses: "small", and
// "sick", whose Nodes never become Ready.
func newNamespace(ctx context.Context) string {
	ns, err := env.Namespace(ctx, "deployment")
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Create(ctx, &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "small"},
		Spec:       machinistv1.MachineClassSpec{Provider: inmemory.Name},
	})).To(Succeed())
	Expect(k8s.Create(ctx, &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sick"},
		Spec: machinistv1.MachineClassSpec{Provider: inmemory.Name,
			ProviderSpec: runtime.RawExtension{Raw: []byte(`{"neverReady":true}`)}},
	})).To(Succeed())
	return ns
}
