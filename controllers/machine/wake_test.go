package machine

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func TestMachineChangedIgnoresTheControllersOwnWrites(t *testing.T) {
	base := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "m", Generation: 1, ResourceVersion: "5"},
		Status: machinistv1.MachineStatus{Phase: machinistv1.MachinePending, ErrorCount: 3,
			Operation: &machinistv1.Operation{ID: "reboot-1", State: machinistv1.OperationSucceeded}},
	}
	cases := []struct {
		name   string
		change func(*machinistv1.Machine)
		wake   bool
	}{
		{"a retry's status write", func(m *machinistv1.Machine) { m.Status.ErrorCount = 4; m.ResourceVersion = "6" }, false},
		{"a move the controller wrote", func(m *machinistv1.Machine) { m.Status.Phase = machinistv1.MachineProvisioning }, false},
		{"the operation's progress", func(m *machinistv1.Machine) { m.Status.Operation.Message = "rebooting" }, false},
		{"a new operation from the verbs server", func(m *machinistv1.Machine) {
			m.Status.Operation = &machinistv1.Operation{ID: "repair-2", State: machinistv1.OperationPending}
		}, true},
		{"an operation record cleared by hand", func(m *machinistv1.Machine) { m.Status.Operation = nil }, true},
		{"the spec", func(m *machinistv1.Machine) { m.Generation = 2 }, true},
		{"a request annotation", func(m *machinistv1.Machine) {
			m.Annotations = map[string]string{machinistv1.RequestAnnotation: "reboot"}
		}, true},
	}
	p := machineChanged()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := base.DeepCopy()
			c.change(n)
			if got := p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: n}); got != c.wake {
				t.Errorf("wakes = %v, want %v", got, c.wake)
			}
		})
	}
}

func TestClassChangedWakesOnANewOrChangedSpec(t *testing.T) {
	old := &machinistv1.MachineClass{ObjectMeta: metav1.ObjectMeta{Name: "c", Generation: 1},
		Spec: machinistv1.MachineClassSpec{Provider: "nosuchcloud"}}
	fixed := old.DeepCopy()
	fixed.Generation, fixed.Spec.Provider = 2, "inmemory"
	relabelled := old.DeepCopy()
	relabelled.Labels = map[string]string{"x": "y"}
	p := classChanged()
	if !p.Create(event.CreateEvent{Object: old}) {
		t.Error("a new class must wake the Machines waiting for it")
	}
	if !p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: fixed}) {
		t.Error("a fixed class must wake its Machines")
	}
	if p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: relabelled}) {
		t.Error("a class's labels change nothing for its Machines")
	}
	if p.Delete(event.DeleteEvent{Object: old}) {
		t.Error("a deleted class gives its Machines nothing new to do")
	}
}
