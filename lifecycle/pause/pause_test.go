package pause

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func TestAnnotated(t *testing.T) {
	for value, want := range map[string]bool{"": true, "true": true, "yes": true, "false": false, " FALSE ": false} {
		ms := &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Name: "a",
			Annotations: map[string]string{machinistv1.PausedAnnotation: value}}}
		if got := Annotated(ms); got != want {
			t.Errorf("value %q: paused %v, want %v", value, got, want)
		}
	}
	if Annotated(&machinistv1.MachineSet{}) {
		t.Error("an object without the annotation is paused")
	}
}

// TestMarkWritesOnceEachWay: pausing and resuming change the condition
// once each, repeating either changes nothing, and an object never
// paused is never given the condition.
func TestMarkWritesOnceEachWay(t *testing.T) {
	var conds []metav1.Condition
	if Mark(&conds, Pause{}) || len(conds) != 0 {
		t.Fatalf("an object never paused got %v", conds)
	}
	ms := &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Name: "a",
		Annotations: map[string]string{machinistv1.PausedAnnotation: ""}}}
	p := Of(ms, "MachineSet")
	if !Mark(&conds, p) || Mark(&conds, p) {
		t.Fatal("pausing changed the conditions other than once")
	}
	c := meta.FindStatusCondition(conds, machinistv1.ConditionPaused)
	if c.Status != metav1.ConditionTrue || c.Reason != machinistv1.ReasonPaused || c.Message == "" {
		t.Fatalf("paused: %+v", c)
	}
	if !Mark(&conds, Pause{}) || Mark(&conds, Pause{}) {
		t.Fatal("resuming changed the conditions other than once")
	}
	c = meta.FindStatusCondition(conds, machinistv1.ConditionPaused)
	if c.Status != metav1.ConditionFalse || c.Reason != machinistv1.ReasonNotPaused {
		t.Fatalf("resumed: %+v", c)
	}
}
