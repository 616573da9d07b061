// Package autoscaling tests, against a real etcd and kube-apiserver and
// the controllers, the contract the Kubernetes cluster-autoscaler's
// clusterapi provider relies on when it is pointed at Machinist
// (CAPI_GROUP=machinist.dev). The autoscaler itself cannot be built here;
// the reader in reader_test.go reads and writes Machinist's objects as
// that provider does (unstructured objects of the group's preferred
// version, Node annotations, owner references by kind, the /scale
// subresource), and docs/autoscaling.md says which of its steps each test
// stands for.
package autoscaling

import (
	"os"
	"testing"
	"time"

	"github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

var (
	env         *testenv.Env
	controllers *testenv.Controllers
)

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithControllers(m, testenv.Options{Scheduler: true}, manager.Options{
		Backoff:   machine.Backoff{Base: 100 * time.Millisecond, Cap: 2 * time.Second},
		DrainPoll: 200 * time.Millisecond,
	}, testenv.Leases{}, func(e *testenv.Env, c *testenv.Controllers) { env, controllers = e, c }))
}
