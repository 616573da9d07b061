// Package outofprocess tests a provider that runs in a process of its own
// and goes away: the Machines it serves wait, saying why, and carry on
// when it is back.
package outofprocess

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/grpclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/internal/orphans"
	"github.com/machinist-dev/machinist/manager"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/plugin"
	"github.com/machinist-dev/machinist/providers/process"
)

var (
	env    *testenv.Env
	served *testenv.ServedProvider
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	// The provider is killed on purpose; gRPC's warnings about it are
	// what the test expects, not news.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
	os.Exit(testenv.RunWith(m, func(e *testenv.Env) (func(), error) {
		env = e
		bin, err := testenv.Machinist()
		if err != nil {
			return nil, err
		}
		// The agents outlive the provider on purpose; they must not
		// outlive this test.
		if err := orphans.GuardExecutable(bin); err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp("", "outofprocess-")
		if err != nil {
			return nil, err
		}
		served, err = e.ServeProvider(process.Name, "--process-state-dir", dir,
			"--lease-duration-seconds", "10", "--renew-interval", "2s")
		if err != nil {
			return nil, err
		}
		c, err := served.Dial(plugin.DialOptions{Timeout: 10 * time.Second})
		if err != nil {
			return nil, err
		}
		reg := providers.NewRegistry()
		if err := reg.Register(process.Name, c); err != nil {
			return nil, err
		}
		controllers, err := e.StartControllers(manager.Options{Actuators: reg, MachineWorkers: 4}, testenv.Leases{})
		if err != nil {
			return nil, err
		}
		return func() {
			_ = controllers.Stop()
			_ = c.Close()
			_ = served.Stop()
			// The agents outlived the provider; left running, their
			// watches hold kube-apiserver's shutdown for a minute.
			_ = exec.Command("pkill", "-KILL", "-f", "^"+bin+" agent ").Run()
			_ = os.RemoveAll(dir)
		}, nil
	}))
}

func reason(m *machinistv1.Machine) string {
	if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// TestAProviderThatGoesAwayMakesMachinesWait kills the provider's process
// (its machines, agent processes, keep running), then asks for a new
// Machine and a reboot: both wait with the reason ProviderUnavailable and
// nothing is failed; once the provider is back, both complete.
func TestAProviderThatGoesAwayMakesMachinesWait(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "outage")
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "local"},
		Spec:       machinistv1.MachineClassSpec{Provider: process.Name},
	}
	if err := env.Client.Create(ctx, class); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"pool": "a"}
	set := &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To[int32](2),
			Selector: machinistv1.LabelSelector{MatchLabels: labels},
			Template: machinistv1.MachineTemplateSpec{
				Metadata: machinistv1.TemplateMetadata{Labels: labels},
				Spec:     machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "local"}, Version: "v1.37.2"},
			},
		},
	}
	if err := env.Client.Create(ctx, set); err != nil {
		t.Fatal(err)
	}
	running := func(n int) func() error {
		return func() error {
			got := 0
			for _, m := range env.Machines(t, ns) {
				if m.Status.Phase == machinistv1.MachineRunning && meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionReady) {
					got++
				}
			}
			if got != n {
				return fmt.Errorf("%d of %d Running and Ready", got, n)
			}
			return nil
		}
	}
	testenv.WaitFor(t, 2*time.Minute, "two Machines Running", running(2))
	first := env.Machines(t, ns)[0]
	if first.Status.NodeInfo == nil {
		t.Fatalf("Machine %s is Running with no Node info", first.Name)
	}
	bootBefore := first.Status.NodeInfo.BootID

	if err := served.Kill(); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(set.DeepCopy())
	set.Spec.Replicas = ptr.To[int32](3)
	if err := env.Client.Patch(ctx, set, patch); err != nil {
		t.Fatal(err)
	}
	rebooted := first.DeepCopy()
	rebooted.Annotations = map[string]string{machinistv1.RequestAnnotation: "reboot"}
	if err := env.Client.Patch(ctx, rebooted, client.MergeFrom(&first)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the new Machine and the reboot wait for the provider", func() error {
		ms := env.Machines(t, ns)
		if len(ms) != 3 {
			return fmt.Errorf("%d Machines", len(ms))
		}
		for _, m := range ms {
			waiting := m.Status.ProviderID == "" || m.Name == first.Name
			if waiting && reason(&m) != machinistv1.ReasonProviderUnavailable {
				return fmt.Errorf("Machine %s (%s) waits with reason %q", m.Name, m.Status.Phase, reason(&m))
			}
		}
		return nil
	})
	for _, m := range env.Machines(t, ns) {
		if c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady); c != nil && c.Reason == machinistv1.ReasonProviderUnavailable {
			t.Logf("Machine %s (%s): %s", m.Name, m.Status.Phase, c.Message)
		}
	}
	// However long it lasts, an outage fails nothing: nothing is to fail
	// in these ten seconds, looked at twice a second.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range env.Machines(t, ns) {
			if m.Status.Phase == machinistv1.MachineFailed {
				_, message := m.Status.Failure()
				t.Fatalf("Machine %s Failed while its provider was away: %s", m.Name, message)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}

	if err := served.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, "three Machines Running once the provider is back", running(3))
	testenv.WaitFor(t, time.Minute, "the reboot done", func() error {
		var m machinistv1.Machine
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&first), &m); err != nil {
			return err
		}
		op := m.Status.Operation
		if op == nil || op.State != machinistv1.OperationSucceeded {
			return fmt.Errorf("operation %+v", op)
		}
		if m.Status.NodeInfo == nil || m.Status.NodeInfo.BootID == bootBefore {
			return fmt.Errorf("boot ID still %s", bootBefore)
		}
		return nil
	})
}

// TestAServedProviderBootsItsMachinesAsItStarts stops a provider whose
// machines end with it (--process-exit-with-parent, as in `machinist
// run`) and starts it again over the same state: the machine boots again
// with no call from anyone, since over a settled fleet none may come.
func TestAServedProviderBootsItsMachinesAsItStarts(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "takeover")
	own, err := env.ServeProvider(process.Name, "--process-state-dir", t.TempDir(), "--process-exit-with-parent",
		"--lease-duration-seconds", "10", "--renew-interval", "2s")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = own.Stop() }()
	c, err := own.Dial(plugin.DialOptions{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settled", UID: uuid.NewUUID()}}
	class := &machinistv1.MachineClass{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "local"}, Spec: machinistv1.MachineClassSpec{Provider: process.Name}}
	join, err := env.Join(ctx, bootstrap.TokenOptions{Description: "takeover test"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		k, _ := bootstrap.ParseToken(join.Token)
		_ = kubernetes.NewForConfigOrDie(env.Config).CoreV1().Secrets(metav1.NamespaceSystem).Delete(context.Background(), k.SecretName(), metav1.DeleteOptions{})
	}()
	id, err := c.Create(ctx, m, class, join)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Delete(ctx, id) }()
	// The boot ID of the Ready Node with the machine's provider ID.
	booted := func() (string, error) {
		var nodes corev1.NodeList
		if err := env.Client.List(ctx, &nodes); err != nil {
			return "", err
		}
		for _, n := range nodes.Items {
			if n.Spec.ProviderID != id {
				continue
			}
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return n.Status.NodeInfo.BootID, nil
				}
			}
			return "", fmt.Errorf("Node %s is not Ready", n.Name)
		}
		return "", fmt.Errorf("no Node with providerID %s", id)
	}
	var first string
	testenv.WaitFor(t, time.Minute, "the machine's Node Ready", func() (err error) {
		first, err = booted()
		return err
	})

	// Stopped, the provider stops its machine; started again, it is only
	// probed until ready, as `machinist run` does.
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := own.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the machine booted again with no call", func() error {
		boot, err := booted()
		if err == nil && boot == first {
			err = fmt.Errorf("boot ID still %s", first)
		}
		return err
	})
}
