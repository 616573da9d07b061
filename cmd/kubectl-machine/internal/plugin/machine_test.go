package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// TestMachine makes a Machine Running with the real controllers, then
// stops them and plays the Machine controller's part itself, writing
// status.operation: that drives the wait loop through outcomes (Failed, a
// superseding operation, a timeout) the controller gives on no one's
// demand, and a running controller would act on the made-up operations.
// TestVerbs runs the real verbs server and controllers end to end.
func TestMachine(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "kubectl-machine", testenv.Small, testenv.Sick)
	stop := startControllers(t)
	key := client.ObjectKey{Namespace: ns, Name: "m1"}
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}, Version: "v1.37.1"},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the Machine Running with a Node", func() error {
		if err := env.Client.Get(ctx, key, m); err != nil {
			return err
		}
		if m.Status.Phase != machinistv1.MachineRunning || m.Status.BootID == "" || m.Status.NodeRef == nil {
			return fmt.Errorf("machine is %q with boot ID %q", m.Status.Phase, m.Status.BootID)
		}
		return nil
	})
	stop()
	bootID := m.Status.BootID

	t.Run("status shows phase, node, conditions, operation and remediation", func(t *testing.T) {
		// Half an hour ago: below ten minutes the age is printed to the
		// second, and a stored time drops its fraction, so "5m" could read
		// "5m1s".
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Operation = &machinistv1.Operation{
				Type: machinistv1.OperationReboot, ID: "op-status", State: machinistv1.OperationRunning,
				RequestedBy: "alice", RequestedAt: &metav1.Time{Time: time.Now().Add(-30 * time.Minute)}, StartedAt: &metav1.Time{Time: time.Now()},
				Message: "draining the node", Source: machinistv1.SourceAPI, BootID: bootID,
				Options: &machinistv1.OperationOptions{Mode: machinistv1.RebootHard, SkipDrain: ptr.To(true), GracePeriodSeconds: ptr.To(int64(30))},
			}
		})
		r := plugin(ns, "status", "m1")
		if r.code != ExitOK {
			t.Fatal(r)
		}
		for _, want := range []string{
			`(?m)^Phase:\s+Running$`,
			`(?m)^Node:\s+` + regexp.QuoteMeta(m.Status.NodeRef.Name) + `$`,
			`(?m)^Provider ID:\s+` + regexp.QuoteMeta(m.Status.ProviderID) + `$`,
			`(?m)^Boot ID:\s+` + regexp.QuoteMeta(bootID) + `$`,
			`(?m)^Last transition:\s+Provisioning -> Running \(\w+\) \S+ \(.* ago\)$`,
			`(?m)^\s+Ready\s+True\s`,
			`(?m)^Operation:$`,
			`(?m)^\s+Type:\s+Reboot$`,
			`(?m)^\s+ID:\s+op-status$`,
			`(?m)^\s+State:\s+Running$`,
			`(?m)^\s+Requested by:\s+alice$`,
			`(?m)^\s+Source:\s+API$`,
			`(?m)^\s+Requested at:\s+\S+ \(30m ago\)$`,
			`(?m)^\s+Completed:\s+<none>$`,
			`(?m)^\s+Boot ID at request:\s+` + regexp.QuoteMeta(bootID) + `$`,
			`(?m)^\s+Message:\s+draining the node$`,
			`(?m)^\s+Options:\s+mode=Hard skipDrain=true gracePeriodSeconds=30$`,
		} {
			if !regexp.MustCompile(want).MatchString(r.stdout) {
				t.Errorf("status output does not match %s:\n%s", want, r.stdout)
			}
		}
		if strings.Contains(r.stdout, "Remediation") {
			t.Errorf("status of a Machine no health check judged shows a remediation:\n%s", r.stdout)
		}
		if strings.Contains(r.stdout, "Request:") {
			t.Errorf("status of a Machine with no request annotation shows one:\n%s", r.stdout)
		}

		// A request annotation the controller has not taken yet (they
		// are stopped), and who made it.
		annotateMachine(t, key, `{"metadata":{"annotations":{"machinist.dev/request":"repair","machinist.dev/requested-by":"olga"}}}`)
		r = plugin(ns, "status", "m1")
		if want := `(?m)^Request:\s+"repair", requested by olga \(annotation machinist.dev/request, not taken yet\)$`; !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("status output does not match %s:\n%s", want, r.stdout)
		}
		annotateMachine(t, key, `{"metadata":{"annotations":{"machinist.dev/request":null,"machinist.dev/requested-by":null}}}`)

		r = plugin(ns, "status", "machine/m1", "-o", "json")
		var got machinistv1.Machine
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != ExitOK {
			t.Fatalf("-o json: %v\n%s", err, r)
		}
		if got.Kind != "Machine" || got.Status.Operation == nil || got.Status.Operation.ID != "op-status" {
			t.Errorf("-o json printed kind %q, operation %+v", got.Kind, got.Status.Operation)
		}
		r = plugin(ns, "status", "m1", "-o", "yaml")
		if r.code != ExitOK || !strings.Contains(r.stdout, "kind: Machine\n") || !strings.Contains(r.stdout, "id: op-status\n") {
			t.Errorf("-o yaml:\n%s", r)
		}

		if r := plugin(ns, "status", "m1", "-o", "wide"); r.code != ExitError {
			t.Errorf("-o wide should be a usage error:\n%s", r)
		}

		// An update shows the versions it goes between.
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Operation = &machinistv1.Operation{
				Type: machinistv1.OperationUpdate, ID: "update-1", State: machinistv1.OperationRunning, Source: machinistv1.SourceSpec,
				FromVersion: "v1.37.2", ToVersion: "v1.38.0",
			}
		})
		r = plugin(ns, "status", "m1")
		for _, want := range []string{`(?m)^\s+Type:\s+Update$`, `(?m)^\s+Source:\s+Spec$`, `(?m)^\s+Version:\s+v1\.37\.2 -> v1\.38\.0$`} {
			if !regexp.MustCompile(want).MatchString(r.stdout) {
				t.Errorf("status output does not match %s:\n%s", want, r.stdout)
			}
		}

		// A drain in progress: what it waits for, in one line and in
		// the conditions.
		const waiting = "group order 0 (1 more group(s) after it): eviction refused for 1 pod(s): apps/db-0: Cannot evict pod as it would violate the pod's disruption budget."
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Phase = machinistv1.MachineDraining
			for _, typ := range []string{machinistv1.ConditionReady, machinistv1.ConditionDrained} {
				meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionFalse, Reason: machinistv1.ReasonPodDisruptionBudget, Message: waiting})
			}
		})
		r = plugin(ns, "status", "m1")
		for _, want := range []string{
			`(?m)^Waiting for:\s+DisruptionBudget: ` + regexp.QuoteMeta(waiting) + `$`,
			`(?m)^\s+Drained\s+False\s+DisruptionBudget\s+\S+\s+` + regexp.QuoteMeta(waiting) + `$`,
		} {
			if !regexp.MustCompile(want).MatchString(r.stdout) {
				t.Errorf("status output does not match %s:\n%s", want, r.stdout)
			}
		}
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Phase = machinistv1.MachineRunning
			meta.RemoveStatusCondition(&st.Conditions, machinistv1.ConditionDrained)
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: machinistv1.ConditionReady, Status: metav1.ConditionTrue, Reason: machinistv1.ReasonNodeReady})
		})

		if r := plugin(ns, "status", "nosuch"); r.code != ExitRefused || !strings.Contains(r.stderr, `"nosuch" not found`) {
			t.Errorf("status of a missing Machine should exit %d saying so:\n%s", ExitRefused, r)
		}

		// A health check's rung in progress, after an earlier recovery
		// within the cooldown; the times are more than ten minutes ago
		// for the reason above.
		now := time.Now()
		unhealthy := now.Add(-40 * time.Minute).UTC().Truncate(time.Second)
		started := now.Add(-20 * time.Minute).UTC().Truncate(time.Second)
		recovered := now.Add(-3 * time.Hour).UTC().Truncate(time.Second)
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Operation = &machinistv1.Operation{
				Type: machinistv1.OperationRepair, ID: "op-remedy", State: machinistv1.OperationRunning,
				RequestedBy: "machinehealthcheck/workers", RequestedAt: &metav1.Time{Time: started}, StartedAt: &metav1.Time{Time: started},
				Source: machinistv1.SourceHealthCheck, BootID: bootID,
				Options: &machinistv1.OperationOptions{TimeoutSeconds: ptr.To(int64(900)), Reason: "machinehealthcheck workers: Node n is Ready=False"},
			}
			st.Remediation = &machinistv1.MachineRemediation{
				HealthCheck: "workers", Phase: machinistv1.RemediationRepairing,
				Rung: 1, Action: machinistv1.RemediateRepair, OperationID: "op-remedy",
				UnhealthySince: &metav1.Time{Time: unhealthy}, RungStartedAt: &metav1.Time{Time: started}, RecoveredAt: &metav1.Time{Time: recovered},
				Message: "rung 2 of 3: repair op-remedy",
			}
		})
		r = plugin(ns, "status", "m1")
		if r.code != ExitOK {
			t.Fatal(r)
		}
		at := func(t time.Time) string { return regexp.QuoteMeta(t.Format(time.RFC3339)) }
		for _, want := range []string{
			`(?m)^\s+Requested by:\s+machinehealthcheck/workers$`,
			`(?m)^\s+Source:\s+HealthCheck$`,
			`(?m)^\s+Options:\s+timeoutSeconds=900 reason="machinehealthcheck workers: Node n is Ready=False"$`,
			// The whole section, in order, and the last thing printed.
			`(?m)^Remediation:\n` +
				`\s+Health check:\s+workers\n` +
				`\s+Phase:\s+Repairing\n` +
				`\s+Rung:\s+2 \(Repair\)\n` +
				`\s+Operation ID:\s+op-remedy\n` +
				`\s+Unhealthy since:\s+` + at(unhealthy) + ` \(40m ago\)\n` +
				`\s+Rung started:\s+` + at(started) + ` \(20m ago\)\n` +
				`\s+Recovered at:\s+` + at(recovered) + ` \(3h ago\)\n` +
				`\s+Message:\s+rung 2 of 3: repair op-remedy\n\z`,
		} {
			if !regexp.MustCompile(want).MatchString(r.stdout) {
				t.Errorf("status output does not match %s:\n%s", want, r.stdout)
			}
		}

		// Found unhealthy, waiting for a slot: no rung yet, so no rung
		// number, and the unset times say so.
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Remediation = &machinistv1.MachineRemediation{
				HealthCheck: "workers", Phase: machinistv1.RemediationUnhealthy, UnhealthySince: &metav1.Time{Time: unhealthy},
				Message: "waiting for a free slot: maxInFlight (1) remediations are in flight",
			}
		})
		r = plugin(ns, "status", "m1")
		for _, want := range []string{
			`(?m)^\s+Phase:\s+Unhealthy$`,
			`(?m)^\s+Rung:\s+<none>$`,
			`(?m)^\s+Rung started:\s+<none>$`,
			`(?m)^\s+Recovered at:\s+<none>$`,
			`(?m)^\s+Message:\s+waiting for a free slot: maxInFlight \(1\) remediations are in flight$`,
		} {
			if !regexp.MustCompile(want).MatchString(r.stdout) {
				t.Errorf("status output does not match %s:\n%s", want, r.stdout)
			}
		}
		setStatus(t, key, func(st *machinistv1.MachineStatus) { st.Remediation = nil })
	})

	t.Run("wait reports progress and succeeds", func(t *testing.T) {
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Operation = &machinistv1.Operation{Type: machinistv1.OperationReboot, ID: "op-ok", State: machinistv1.OperationPending}
		})
		out, done := startWait(t, key, "op-ok", bootID, time.Minute)
		out.await(t, "machine/m1: Running, reboot Pending")
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Phase = machinistv1.MachineRebooting
			st.Operation.State = machinistv1.OperationRunning
			st.Operation.Message = "restarting"
		})
		out.await(t, "machine/m1: Rebooting, reboot Running: restarting")
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Phase = machinistv1.MachineRunning
			st.BootID = "boot-2"
			st.Operation.State = machinistv1.OperationSucceeded
			st.Operation.Message = ""
		})
		if err := <-done; err != nil {
			t.Fatalf("wait: %v\n%s", err, out)
		}
		want := fmt.Sprintf("machine/m1: Running (boot ID %s -> boot-2), reboot Succeeded\nmachine/m1 rebooted (boot ID %[1]s -> boot-2)\n", bootID)
		if !strings.HasSuffix(out.String(), want) {
			t.Errorf("wait printed\n%s\nwant it to end with\n%s", out, want)
		}
	})

	t.Run("a Failed operation exits 2", func(t *testing.T) {
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Operation = &machinistv1.Operation{Type: machinistv1.OperationReboot, ID: "op-bad", State: machinistv1.OperationRunning}
		})
		out, done := startWait(t, key, "op-bad", "", time.Minute)
		out.await(t, "reboot Running")
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Operation.State = machinistv1.OperationFailed
			st.Operation.Message = "the provider refused the reboot"
		})
		err := <-done
		if ExitCode(err) != ExitFailed || !strings.Contains(fmt.Sprint(err), "the provider refused the reboot") {
			t.Errorf("wait returned %v (exit code %d), want exit code %d with the operation's message", err, ExitCode(err), ExitFailed)
		}
	})

	t.Run("a wait past its timeout exits 4", func(t *testing.T) {
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Operation = &machinistv1.Operation{Type: machinistv1.OperationReboot, ID: "op-slow", State: machinistv1.OperationRunning, Message: "still draining"}
		})
		out, done := startWait(t, key, "op-slow", "", time.Second)
		err := <-done
		if ExitCode(err) != ExitTimeout || !strings.Contains(fmt.Sprint(err), "still draining") {
			t.Errorf("wait returned %v (exit code %d), want exit code %d naming the last state\n%s", err, ExitCode(err), ExitTimeout, out)
		}
	})

	t.Run("another operation replacing ours ends the wait", func(t *testing.T) {
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Operation = &machinistv1.Operation{Type: machinistv1.OperationReboot, ID: "op-first", State: machinistv1.OperationRunning}
		})
		out, done := startWait(t, key, "op-first", "", time.Minute)
		out.await(t, "reboot Running")
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Operation = &machinistv1.Operation{Type: machinistv1.OperationRepair, ID: "op-second", State: machinistv1.OperationPending}
		})
		err := <-done
		if ExitCode(err) != ExitError || !strings.Contains(fmt.Sprint(err), "op-second") {
			t.Errorf("wait returned %v (exit code %d), want exit code %d naming op-second", err, ExitCode(err), ExitError)
		}
	})

	t.Run("deleting the Machine ends the wait", func(t *testing.T) {
		setStatus(t, key, func(st *machinistv1.MachineStatus) {
			st.Operation = &machinistv1.Operation{Type: machinistv1.OperationReboot, ID: "op-gone", State: machinistv1.OperationRunning}
		})
		out, done := startWait(t, key, "op-gone", "", time.Minute)
		out.await(t, "reboot Running")
		// No controller runs to remove the finalizer.
		if err := env.Client.Patch(ctx, &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}},
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}}); err != nil {
			t.Fatal(err)
		}
		err := <-done
		if ExitCode(err) != ExitError || !strings.Contains(fmt.Sprint(err), "deleted") {
			t.Errorf("wait returned %v (exit code %d), want exit code %d saying the Machine was deleted", err, ExitCode(err), ExitError)
		}
	})
}

// setStatus changes the Machine's status as a controller would.
func setStatus(t *testing.T, key client.ObjectKey, change func(*machinistv1.MachineStatus)) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &machinistv1.Machine{}
		if err := env.Client.Get(ctx, key, m); err != nil {
			return err
		}
		change(&m.Status)
		return env.Client.Status().Update(ctx, m)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// annotateMachine merge-patches the Machine's metadata with patch.
func annotateMachine(t *testing.T, key client.ObjectKey, patch string) {
	t.Helper()
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	if err := env.Client.Patch(context.Background(), m, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// startWait runs the reboot --wait loop for operation id in the background.
func startWait(t *testing.T, key client.ObjectKey, id, bootID string, timeout time.Duration) (*lineWriter, <-chan error) {
	t.Helper()
	c := watchClient(t)
	out := &lineWriter{lines: make(chan string, 100)}
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	go func() {
		defer cancel()
		done <- waitOperation(ctx, c, key.Namespace, key.Name, reboot, id, bootID, out)
	}()
	return out, done
}

// lineWriter hands each line written to it to a channel, so that a test
// can change the Machine once the wait has seen the previous change.
type lineWriter struct {
	mu      sync.Mutex
	all     bytes.Buffer
	partial []byte
	lines   chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all.Write(p)
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.lines <- string(w.partial[:i])
		w.partial = w.partial[i+1:]
	}
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}

// await waits for a line containing want.
func (w *lineWriter) await(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line := <-w.lines:
			if strings.Contains(line, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no line with %q; printed:\n%s", want, w)
		}
	}
}
