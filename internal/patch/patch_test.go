package patch_test

import (
	"context"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/patch"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, func(e *testenv.Env) { env = e }))
}

func TestATestedPatchWritesOnlyOverWhatItRead(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "patched"}}
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	read := node.DeepCopy()
	// Someone taints the Node after it was read.
	theirs := corev1.Taint{Key: "theirs", Effect: corev1.TaintEffectNoSchedule}
	node.Spec.Taints = []corev1.Taint{theirs}
	if err := env.Client.Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	mine := corev1.Taint{Key: "mine", Effect: corev1.TaintEffectNoSchedule}
	var p patch.JSON
	p.Test("/spec/taints", read.Spec.Taints) // none: null
	p.Set("/spec/taints", []corev1.Taint{mine})
	p.Set("/metadata/labels", map[string]string{"a/b": "c"})
	err := patch.Conflict(env.Client.Patch(ctx, read, p.Patch()))
	if !apierrors.IsConflict(err) {
		t.Fatalf("a patch from before their taint: got %v, want a Conflict", err)
	}
	// From what is there now, it applies.
	var q patch.JSON
	q.Test("/spec/taints", node.Spec.Taints)
	q.Set("/spec/taints", []corev1.Taint{theirs, mine})
	q.Set("/metadata/labels", map[string]string{})
	q.Set("/metadata/labels/"+patch.Key("machinist.dev/pool"), "blue")
	if err := env.Client.Patch(ctx, node, q.Patch()); err != nil {
		t.Fatal(err)
	}
	if len(node.Spec.Taints) != 2 || node.Labels["machinist.dev/pool"] != "blue" {
		t.Fatalf("patched to %v, %v", node.Spec.Taints, node.Labels)
	}
	if !(patch.JSON{}).Empty() || q.Empty() {
		t.Fatal("Empty is wrong")
	}
	// Other errors pass as they are, a validation failure among them.
	if err := patch.Conflict(apierrors.NewBadRequest("x")); !apierrors.IsBadRequest(err) {
		t.Fatalf("got %v", err)
	}
	var bad patch.JSON
	bad.Set("/spec/taints", []corev1.Taint{{Key: "no effect"}})
	if err := patch.Conflict(env.Client.Patch(ctx, node, bad.Patch())); !apierrors.IsInvalid(err) {
		t.Fatalf("an invalid taint: got %v, want Invalid", err)
	}
}
