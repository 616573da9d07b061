package joinprobe

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/clusters/joinable"
)

// The checks of a cluster run one at a time, on its connection, each
// period, and after a failed join no sooner than a minute after the last;
// each end wakes the cluster's reconcile. (The cluster here answers
// nothing: every check ends at once, unable to run.)
func TestChecksAreScheduled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	j := Probes{Object: func(key types.NamespacedName) client.Object {
		return &machinistv1.WorkloadCluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	}}
	j.Source()
	go func() { _ = j.Start(ctx) }()
	for j.started() == nil {
		time.Sleep(time.Millisecond)
	}
	key := types.NamespacedName{Namespace: "ns", Name: "c"}
	cfg := &rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}
	period := 10 * time.Minute
	now := time.Now()

	ended := func() {
		t.Helper()
		select {
		case e := <-j.done:
			if e.Object.GetName() != key.Name || e.Object.GetNamespace() != key.Namespace {
				t.Fatalf("the end of a check woke %s/%s", e.Object.GetNamespace(), e.Object.GetName())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no check ended")
		}
	}
	if o, wait := j.Next(ctx, key, cfg, now, period); o != nil || wait != 0 {
		t.Fatalf("first call: outcome %+v, wait %s; want a check started", o, wait)
	}
	if _, wait := j.Next(ctx, key, cfg, now, period); wait != 0 || j.runningChecks() != 1 {
		t.Fatalf("while a check runs: wait %s, %d running; want it alone", wait, j.runningChecks())
	}
	ended()
	o, wait := j.Next(ctx, key, cfg, now.Add(time.Second), period)
	if o == nil || o.Status != metav1.ConditionUnknown || o.Reason != ReasonCheckFailed || !o.Keep {
		t.Fatalf("outcome of a cluster that does not answer: %+v", o)
	}
	if wait != period-time.Second {
		t.Errorf("wait %s, want the rest of the period", wait)
	}

	// A failed join, ten seconds after the check: the next waits out the
	// minute, however many Machines ask.
	for range 100 {
		j.Recheck(key)
	}
	if _, wait := j.Next(ctx, key, cfg, now.Add(10*time.Second), period); wait != 50*time.Second {
		t.Errorf("after a failed join: wait %s, want 50s", wait)
	}
	if _, wait := j.Next(ctx, key, cfg, now.Add(time.Minute), period); wait != 0 {
		t.Errorf("a minute after the last check: wait %s, want a check started", wait)
	}
	ended()
	if _, wait := j.Next(ctx, key, cfg, now.Add(time.Minute+time.Second), period); wait != period-time.Second {
		t.Errorf("after the recheck: wait %s, want the rest of its period", wait)
	}

	// A new connection is checked at once.
	if _, wait := j.Next(ctx, key, rest.CopyConfig(cfg), now.Add(2*time.Minute), period); wait != 0 {
		t.Errorf("a new connection: wait %s, want a check started", wait)
	}
	ended()
	j.Forget(key)
	if j.runningChecks() != 0 {
		t.Error("a forgotten cluster's check still runs")
	}
}

// A check's outcome is written only when it says something new, and one
// that could not be made leaves what was said.
func TestSet(t *testing.T) {
	wc := &machinistv1.WorkloadCluster{}
	setJoinable := func(wc *machinistv1.WorkloadCluster, o *Outcome) {
		Set(&wc.Status.Conditions, machinistv1.WorkloadClusterJoinable, wc.Generation, o)
	}
	refused := &Outcome{Status: metav1.ConditionFalse, Reason: "BootstrapTokensRefused", Message: "refused: fix"}
	setJoinable(wc, &Outcome{Status: metav1.ConditionUnknown, Reason: ReasonCheckFailed, Message: "no answer", Keep: true})
	if len(wc.Status.Conditions) != 1 || wc.Status.Conditions[0].Status != metav1.ConditionUnknown {
		t.Fatalf("first outcome, one that could not be made: %+v", wc.Status.Conditions)
	}
	setJoinable(wc, refused)
	before := wc.DeepCopy()
	setJoinable(wc, refused)
	setJoinable(wc, &Outcome{Status: metav1.ConditionUnknown, Reason: ReasonCheckFailed, Message: "no answer", Keep: true})
	if c := wc.Status.Conditions[0]; c != before.Status.Conditions[0] {
		t.Errorf("the condition changed with nothing new: %+v, was %+v", c, before.Status.Conditions[0])
	}
}

func (j *Probes) started() context.Context {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.ctx
}

func (j *Probes) runningChecks() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for _, s := range j.clusters {
		if s.cancel != nil {
			n++
		}
	}
	return n
}

func TestFailedJoin(t *testing.T) {
	ready := func(reason string) *machinistv1.Machine {
		m := &machinistv1.Machine{}
		if reason != "" {
			m.Status.Conditions = []metav1.Condition{{Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason}}
		}
		return m
	}
	cases := []struct {
		old, new string
		want     bool
	}{
		{"", machinistv1.ReasonJoinForbidden, true},
		{machinistv1.ReasonProvisioning, machinistv1.ReasonBootstrapTokenRefused, true},
		{machinistv1.ReasonJoinForbidden, machinistv1.ReasonJoinCertificateNotApproved, true},
		{machinistv1.ReasonJoinForbidden, machinistv1.ReasonJoinForbidden, false},
		{machinistv1.ReasonJoinForbidden, machinistv1.ReasonProvisioning, false},
		{"", machinistv1.ReasonProvisioning, false},
	}
	for _, c := range cases {
		if _, got := FailedJoin(ready(c.old), ready(c.new)); got != c.want {
			t.Errorf("Ready reason %q → %q: failed join %v, want %v", c.old, c.new, got, c.want)
		}
	}
}

func TestTheConditionCarriesNothingTheClusterSaid(t *testing.T) {
	said := strings.Repeat("the cluster's own words ", 4000)
	o := outcomeOf(joinable.Report{
		{Check: joinable.CheckBootstrapTokens, Result: joinable.Passed},
		{Check: joinable.CheckApprover, Result: joinable.Failed, Reason: joinable.ReasonCertificateDenied,
			Detail: "a node's certificate request was denied", Fix: "see who denies them", Said: said},
		{Check: joinable.CheckTokenCleaner, Result: joinable.Failed, Reason: joinable.ReasonTokenCleanerOff, Detail: "kept", Fix: "run it", Said: said},
	})
	if o.Status != metav1.ConditionFalse || o.Reason != joinable.ReasonCertificateDenied {
		t.Fatalf("outcome %s %s, want False %s", o.Status, o.Reason, joinable.ReasonCertificateDenied)
	}
	if strings.Contains(o.Message, "own words") || len(o.Message) > 300 {
		t.Errorf("the condition carries what the cluster said (%d bytes): %.200s", len(o.Message), o.Message)
	}
}
