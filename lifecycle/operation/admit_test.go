package operation

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/phases"
)

func TestAdmitAsksTheStateMachine(t *testing.T) {
	noDrain := &machinistv1.OperationOptions{SkipDrain: ptr.To(true)}
	for _, tc := range []struct {
		phase machinistv1.MachinePhase
		typ   machinistv1.OperationType
		opts  *machinistv1.OperationOptions
		ok    bool
	}{
		{machinistv1.MachineRunning, machinistv1.OperationReboot, nil, true},
		{machinistv1.MachineRunning, machinistv1.OperationReboot, noDrain, true},
		{machinistv1.MachineRunning, machinistv1.OperationRepair, nil, true},
		// Drain=false re-images a Running machine at once.
		{machinistv1.MachineRunning, machinistv1.OperationRepair, noDrain, true},
		{machinistv1.MachineFailed, machinistv1.OperationRepair, noDrain, true},
		{"", machinistv1.OperationReboot, nil, false},
		{machinistv1.MachinePending, machinistv1.OperationReboot, nil, false},
		{machinistv1.MachineProvisioning, machinistv1.OperationReboot, nil, false},
		{machinistv1.MachineProvisioning, machinistv1.OperationReboot, noDrain, false},
		{machinistv1.MachineDraining, machinistv1.OperationRepair, nil, false},
		{machinistv1.MachineRebooting, machinistv1.OperationReboot, nil, false},
		{machinistv1.MachineRepairing, machinistv1.OperationReboot, nil, false},
		{machinistv1.MachineDeleting, machinistv1.OperationReboot, nil, false},
		// A Failed Machine that has an instance can be repaired, and only
		// repaired: a reboot (drained or not) does not bring it back.
		{machinistv1.MachineFailed, machinistv1.OperationRepair, nil, true},
		{machinistv1.MachineFailed, machinistv1.OperationReboot, nil, false},
		{machinistv1.MachineFailed, machinistv1.OperationReboot, noDrain, false},
		{machinistv1.MachineFailed, machinistv1.OperationReboot, &machinistv1.OperationOptions{Mode: machinistv1.RebootHard, SkipDrain: ptr.To(true)}, false},
	} {
		// Every Machine here has an instance, so that only the phase decides.
		m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Status: machinistv1.MachineStatus{
			Phase: tc.phase, ProviderID: "inmemory://ns/m/uid"}}
		err := Admit(m, tc.typ, tc.opts)
		if tc.ok != (err == nil) {
			t.Errorf("%s in %q: got %v, want allowed=%v", tc.typ, tc.phase, err, tc.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrRefused) {
				t.Errorf("%s in %q: %v does not wrap ErrRefused", tc.typ, tc.phase, err)
			}
			phase := string(tc.phase)
			if phase == "" {
				phase = "Pending"
			}
			if !strings.Contains(err.Error(), "is "+phase+";") {
				t.Errorf("%s in %q: %q does not name the phase", tc.typ, tc.phase, err)
			}
		}
	}
}

func TestAdmitRefusesASecondOperationAndADeletingMachine(t *testing.T) {
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Status: machinistv1.MachineStatus{Phase: machinistv1.MachineRunning}}
	op, err := Request(m, machinistv1.OperationReboot, nil, machinistv1.SourceAPI, "alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if op.State != machinistv1.OperationPending || !strings.HasPrefix(op.ID, "reboot-") || m.Status.Operation != op {
		t.Fatalf("recorded %+v", op)
	}
	err = Admit(m, machinistv1.OperationRepair, nil)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), op.ID) {
		t.Errorf("second operation: got %v, want a refusal naming %s", err, op.ID)
	}
	op.State = machinistv1.OperationSucceeded
	if err := Admit(m, machinistv1.OperationRepair, nil); err != nil {
		t.Errorf("after the first finished: %v", err)
	}
	m.DeletionTimestamp = ptr.To(metav1.Now())
	if err := Admit(m, machinistv1.OperationRepair, nil); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "being deleted") {
		t.Errorf("deleting: got %v", err)
	}
}

// TestAdmitNamesThePhasesARepairNeeds: a repair is refused outside Running
// and Failed, and the refusal says so, whichever event it would start with.
func TestAdmitNamesThePhasesARepairNeeds(t *testing.T) {
	for _, phase := range []machinistv1.MachinePhase{
		machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineDraining,
		machinistv1.MachineRebooting, machinistv1.MachineRepairing, machinistv1.MachineDeleting,
	} {
		m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Status: machinistv1.MachineStatus{
			Phase: phase, ProviderID: "inmemory://ns/m/uid"}}
		err := Admit(m, machinistv1.OperationRepair, nil)
		want := fmt.Sprintf(`machine "m" is %s; a repair can start only when it is Running or Failed`, phase)
		if !errors.Is(err, ErrRefused) || err.Error() != want {
			t.Errorf("repair in %s: got %v, want %q", phase, err, want)
		}
	}
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Status: machinistv1.MachineStatus{
		Phase: machinistv1.MachineFailed, ProviderID: "inmemory://ns/m/uid"}}
	err := Admit(m, machinistv1.OperationReboot, nil)
	if want := `machine "m" is Failed; a reboot can start only when it is Running`; !errors.Is(err, ErrRefused) || err.Error() != want {
		t.Errorf("reboot in Failed: got %v, want %q", err, want)
	}
}

// TestAdmitRefusesToRepairAMachineThatNeverHadAnInstance: a Machine that
// failed before the provider made anything has nothing to re-image; the
// refusal says so and what to do instead.
func TestAdmitRefusesToRepairAMachineThatNeverHadAnInstance(t *testing.T) {
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Status: machinistv1.MachineStatus{
		Phase: machinistv1.MachineFailed, Conditions: []metav1.Condition{{Type: machinistv1.ConditionReady, Status: metav1.ConditionFalse,
			Reason: "CreateFailed", Message: "quota exceeded"}}}}
	err := Admit(m, machinistv1.OperationRepair, nil)
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("got %v, want a refusal", err)
	}
	for _, want := range []string{`machine "m" is Failed before it had an instance`, "CreateFailed", "nothing to repair", "delete it"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if _, err := Request(m, machinistv1.OperationRepair, nil, machinistv1.SourceAPI, "alice", time.Now()); !errors.Is(err, ErrRefused) {
		t.Errorf("Request: got %v, want the same refusal", err)
	}
	if m.Status.Operation != nil {
		t.Errorf("a refused request recorded %+v", m.Status.Operation)
	}

	m.Status.ProviderID = "inmemory://ns/m/uid"
	op, err := Request(m, machinistv1.OperationRepair, nil, machinistv1.SourceAPI, "alice", time.Now())
	if err != nil {
		t.Fatalf("with an instance: %v", err)
	}
	if op.State != machinistv1.OperationPending || m.Status.Operation != op {
		t.Errorf("with an instance: recorded %+v", op)
	}
}

// TestARepairStartsAFailedMachineWithoutADrain: the event that starts an
// operation depends on the phase; only a Failed Machine's repair skips the
// drain, and the table must allow that event there.
func TestARepairStartsAFailedMachineWithoutADrain(t *testing.T) {
	noDrain := &machinistv1.OperationOptions{SkipDrain: ptr.To(true)}
	for _, tc := range []struct {
		typ   machinistv1.OperationType
		opts  *machinistv1.OperationOptions
		phase machinistv1.MachinePhase
		want  phases.Event
	}{
		{machinistv1.OperationRepair, nil, machinistv1.MachineFailed, phases.Repair},
		{machinistv1.OperationRepair, nil, machinistv1.MachineRunning, phases.Drain},
		{machinistv1.OperationReboot, nil, machinistv1.MachineRunning, phases.Drain},
		{machinistv1.OperationReboot, noDrain, machinistv1.MachineRunning, phases.Reboot},
		{machinistv1.OperationReboot, nil, machinistv1.MachineFailed, phases.Drain},
		{machinistv1.OperationReboot, noDrain, machinistv1.MachineFailed, phases.Reboot},
	} {
		if got := FirstEvent(tc.typ, tc.opts, tc.phase); got != tc.want {
			t.Errorf("%s in %s: first event %s, want %s", tc.typ, tc.phase, got, tc.want)
		}
	}
	if to, ok := phases.Table.Allowed(machinistv1.MachineFailed, phases.Repair); !ok || to != machinistv1.MachineRepairing {
		t.Errorf("repair in Failed: table says (%s, %v), want Repairing", to, ok)
	}
}

func TestFirstEventOfARepairWithoutDrain(t *testing.T) {
	noDrain := &machinistv1.OperationOptions{SkipDrain: ptr.To(true)}
	for _, tc := range []struct {
		typ   machinistv1.OperationType
		opts  *machinistv1.OperationOptions
		phase machinistv1.MachinePhase
		want  phases.Event
	}{
		{machinistv1.OperationRepair, nil, machinistv1.MachineRunning, phases.Drain},
		{machinistv1.OperationRepair, noDrain, machinistv1.MachineRunning, phases.Repair},
		{machinistv1.OperationRepair, nil, machinistv1.MachineFailed, phases.Repair},
		{machinistv1.OperationReboot, noDrain, machinistv1.MachineRunning, phases.Reboot},
		{machinistv1.OperationReboot, nil, machinistv1.MachineRunning, phases.Drain},
		// An update drains whatever its options say.
		{machinistv1.OperationUpdate, noDrain, machinistv1.MachineRunning, phases.Drain},
	} {
		if got := FirstEvent(tc.typ, tc.opts, tc.phase); got != tc.want {
			t.Errorf("%s (drain %v) in %s: first event %q, want %q", tc.typ, tc.opts != nil, tc.phase, got, tc.want)
		}
	}
}

func TestAdmitUnseenRefusesOnlyADrain(t *testing.T) {
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m1"}}
	noDrain := &machinistv1.OperationOptions{SkipDrain: ptr.To(true)}
	const unseen = "WorkloadCluster far is not reachable (Unreachable) since 2026-12-03T04:00:00Z"
	for _, typ := range []machinistv1.OperationType{machinistv1.OperationReboot, machinistv1.OperationRepair} {
		if err := AdmitUnseen(m, typ, nil, ""); err != nil {
			t.Errorf("%s of a Machine whose cluster is reachable: %v", typ, err)
		}
		if err := AdmitUnseen(m, typ, noDrain, unseen); err != nil {
			t.Errorf("%s without a drain of a Machine whose cluster is down: %v", typ, err)
		}
		err := AdmitUnseen(m, typ, nil, unseen)
		if !errors.Is(err, ErrRefused) {
			t.Fatalf("%s with a drain of a Machine whose cluster is down: got %v, want a refusal", typ, err)
		}
		verb := Verb(typ)
		for _, want := range []string{unseen, "drain: false", "kubectl machine " + verb + " m1 --no-drain"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s refused with %q, which does not say %q", typ, err, want)
			}
		}
	}
	if err := AdmitUnseen(m, machinistv1.OperationUpdate, noDrain, unseen); !errors.Is(err, ErrRefused) {
		t.Errorf("an update of a Machine whose cluster is down: got %v, want a refusal", err)
	}
}
