package wake

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
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
		// An etcd restored to an older snapshot under a running manager:
		// the informer's relist brings the snapshot's version, whose
		// status is not the controller's last write.
		{"an older version (etcd restored)", func(s *machinistv1.MachineSet) { s.Status.ReadyReplicas = 3; s.ResourceVersion = "9" }, true},
		{"a resourceVersion that is no number", func(s *machinistv1.MachineSet) { s.Status.ReadyReplicas = 3; s.ResourceVersion = "x" }, false},
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

func TestOnReachabilityChange(t *testing.T) {
	reachable := func(status metav1.ConditionStatus, reason string) *machinistv1.WorkloadCluster {
		wc := &machinistv1.WorkloadCluster{ObjectMeta: metav1.ObjectMeta{Name: "w"}}
		if status != "" {
			wc.Status.Conditions = []metav1.Condition{{Type: machinistv1.WorkloadClusterReachable, Status: status, Reason: reason}}
		}
		return wc
	}
	up := reachable(metav1.ConditionTrue, machinistv1.ReasonClusterConnected)
	counted := up.DeepCopy()
	counted.Status.Nodes = ptr.To[int32](7)
	cases := []struct {
		name     string
		old, new *machinistv1.WorkloadCluster
		wake     bool
	}{
		{"a probe's count", up, counted, false},
		{"first said", reachable("", ""), up, true},
		{"went away", up, reachable(metav1.ConditionFalse, machinistv1.ReasonUnreachable), true},
		{"another reason", reachable(metav1.ConditionFalse, machinistv1.ReasonUnreachable), reachable(metav1.ConditionFalse, machinistv1.ReasonKubeconfigInvalid), true},
		{"came back", reachable(metav1.ConditionFalse, machinistv1.ReasonUnreachable), up, true},
	}
	p := OnReachabilityChange()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := p.Update(event.UpdateEvent{ObjectOld: c.old, ObjectNew: c.new}); got != c.wake {
				t.Errorf("wakes = %v, want %v", got, c.wake)
			}
		})
	}
}

func TestOnJoinableChange(t *testing.T) {
	joinable := func(status metav1.ConditionStatus, reason, message string) *machinistv1.WorkloadCluster {
		wc := &machinistv1.WorkloadCluster{ObjectMeta: metav1.ObjectMeta{Name: "w"}}
		wc.Status.Conditions = []metav1.Condition{{Type: machinistv1.WorkloadClusterReachable, Status: metav1.ConditionTrue, Reason: machinistv1.ReasonClusterConnected}}
		if status != "" {
			wc.Status.Conditions = append(wc.Status.Conditions, metav1.Condition{Type: machinistv1.WorkloadClusterJoinable, Status: status, Reason: reason, Message: message})
		}
		return wc
	}
	refused := joinable(metav1.ConditionFalse, "BootstrapTokensRefused", "refused")
	cases := []struct {
		name     string
		old, new *machinistv1.WorkloadCluster
		wake     bool
	}{
		{"first said", joinable("", "", ""), refused, true},
		{"fixed", refused, joinable(metav1.ConditionTrue, "Joinable", "ok"), true},
		{"another reason", refused, joinable(metav1.ConditionFalse, "JoinBindingsMissing", "missing"), true},
		{"another message alone", refused, joinable(metav1.ConditionFalse, "BootstrapTokensRefused", "refused again"), false},
		{"nothing new", refused, refused.DeepCopy(), false},
	}
	p := OnJoinableChange()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := p.Update(event.UpdateEvent{ObjectOld: c.old, ObjectNew: c.new}); got != c.wake {
				t.Errorf("wakes = %v, want %v", got, c.wake)
			}
		})
	}
}
