// Package e2e holds Machinist's end-to-end specs. One real etcd and
// kube-apiserver serve the whole suite; every spec works in a namespace of
// its own so specs never see each other's objects.
package e2e

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/machinist-dev/machinist/dev/testenv"
)

var (
	env *testenv.Env
	k8s client.Client
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Machinist end-to-end")
}

var _ = BeforeSuite(func() {
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s = env.Client
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})
