package wake

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

func TestOnChangeByOthers(t *testing.T) {
	base := &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{
		Name: "s", Generation: 1, ResourceVersion: "10",
		Labels: map[string]string{"pool": "a"}, Annotations: map[string]string{"note": "x"},
	}}
	now := metav1.Now()
	cases := []struct {
		name   string
		change func(*machinistv1.MachineSet)
		wake   bool
	}{
		{"its own status write", func(s *machinistv1.MachineSet) { s.Status.ReadyReplicas = 3; s.ResourceVersion = "11" }, false},
		{"nothing but the resourceVersion (a resync)", func(s *machinistv1.MachineSet) { s.ResourceVersion = "11" }, false},
		{"the spec", func(s *machinistv1.MachineSet) { s.Generation = 2 }, true},
		{"a label", func(s *machinistv1.MachineSet) { s.Labels = map[string]string{"pool": "b"} }, true},
		{"a new annotation", func(s *machinistv1.MachineSet) { s.Annotations = map[string]string{"note": "x", "y": "z"} }, true},
		{"an annotation removed", func(s *machinistv1.MachineSet) { s.Annotations = nil }, true},
		{"deletion", func(s *machinistv1.MachineSet) { s.DeletionTimestamp = &now }, true},
	}
	p := OnChangeByOthers()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := base.DeepCopy()
			c.change(n)
			if got := p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: n}); got != c.wake {
				t.Errorf("wakes = %v, want %v", got, c.wake)
			}
		})
	}
	if !p.Create(event.CreateEvent{Object: base}) || !p.Delete(event.DeleteEvent{Object: base}) {
		t.Error("creates and deletes must wake the controller")
	}
}
