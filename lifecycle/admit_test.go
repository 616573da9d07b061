package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

func TestAdmitAsksTheStateMachine(t *testing.T) {
	noDrain := &machinistv1.OperationOptions{Drain: ptr.To(false)}
	for _, tc := range []struct {
		phase machinistv1.MachinePhase
		typ   machinistv1.OperationType
		opts  *machinistv1.OperationOptions
		ok    bool
	}{
		{machinistv1.MachineRunning, machinistv1.OperationReboot, nil, true},
		{machinistv1.MachineRunning, machinistv1.OperationReboot, noDrain, true},
		{machinistv1.MachineRunning, machinistv1.OperationRepair, nil, true},
		// Drain=false means nothing to a repair: it always drains.
		{machinistv1.MachineRunning, machinistv1.OperationRepair, noDrain, true},
		{"", machinistv1.OperationReboot, nil, false},
		{machinistv1.MachinePending, machinistv1.OperationReboot, nil, false},
		{machinistv1.MachineProvisioning, machinistv1.OperationReboot, nil, false},
		{machinistv1.MachineProvisioning, machinistv1.OperationReboot, noDrain, false},
		{machinistv1.MachineDraining, machinistv1.OperationRepair, nil, false},
		{machinistv1.MachineRebooting, machinistv1.OperationReboot, nil, false},
		{machinistv1.MachineRepairing, machinistv1.OperationReboot, nil, false},
		{machinistv1.MachineDeleting, machinistv1.OperationReboot, nil, false},
		{machinistv1.MachineFailed, machinistv1.OperationRepair, nil, false},
	} {
		m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Status: machinistv1.MachineStatus{Phase: tc.phase}}
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
