package apifaults

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// A reboot whose operation was stored although the verbs server's write
// lost its reply has been accepted: the caller gets 202, not an error for
// a reboot that then happens anyway, and the reboot happens once.
func TestAVerbWhoseWriteLostItsReplyIsAccepted(t *testing.T) {
	c := start(t, 51)
	kubeconfig, err := proxy.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	verbs, err := env.StartVerbsVia(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = verbs.Stop() })
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ctx := context.Background()
	m := running(t, ns, "m1")
	testenv.WaitFor(t, 30*time.Second, "m1 Ready", func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(m), m) == nil &&
			meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionReady)
	})
	testenv.WaitQuiet(t, env.Client, 30*time.Second, time.Second, "m1", m)
	arm(t, 51, faults.Rule{Name: "lost-operation", Fault: faults.LoseReply, Verbs: []string{"update"}, Resources: []string{"machines/status"},
		Names: []string{m.Name}, Rate: 1, Limit: 1})
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	var code int
	err = kube.CoreV1().RESTClient().Put().AbsPath("/apis/subresources.machinist.dev/v1alpha1/namespaces", ns, "machines", m.Name, "reboot").
		Body([]byte(`{}`)).Do(ctx).StatusCode(&code).Error()
	t.Logf("the reboot was answered %d (%v); %d writes lost their reply", code, err, proxy.Struck("lost-operation"))
	if proxy.Struck("lost-operation") != 1 {
		t.Fatal("no write of the verbs server lost its reply: the test proved nothing")
	}
	if err != nil || code != 202 {
		t.Fatalf("a reboot that was stored was answered %d: %v", code, err)
	}
	testenv.WaitFor(t, time.Minute, "the reboot done", func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(m), m) == nil && m.Status.Operation != nil &&
			m.Status.Operation.State == machinistv1.OperationSucceeded
	})
	if n, err := c.Provider.Restarts(m.Status.ProviderID); err != nil || n != 1 {
		t.Fatalf("rebooted %d times (%v), want once", n, err)
	}
}
