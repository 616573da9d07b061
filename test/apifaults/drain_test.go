package apifaults

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/faults"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// reconcileErrors is how many reconciles of the Machine controller have
// ended in an error in this process so far.
func reconcileErrors(t *testing.T) float64 {
	t.Helper()
	n, err := testenv.ControllerCounter("controller_runtime_reconcile_errors_total", "machine")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// An eviction whose reply is lost may have been carried out: the drain
// looks again rather than failing, and finishes.
func TestLostEvictionRepliesAreNoDrainError(t *testing.T) {
	const pods = 4
	start(t, 31)
	ns := env.NewNamespace(t, "apifaults", testenv.Small)
	ctx := context.Background()
	m := running(t, ns, "m1")
	for i := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%d", i)},
			Spec: corev1.PodSpec{
				NodeName: m.Status.NodeRef.Name, TerminationGracePeriodSeconds: ptr.To(int64(1)),
				Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}},
			},
		}
		if err := env.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	arm(t, 31, faults.Rule{Name: "lost-evictions", Fault: faults.LoseReply, Verbs: []string{"create"}, Resources: []string{"pods/eviction"}, Rate: 1, Limit: 3})
	before := reconcileErrors(t)
	if err := env.Client.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the Machine drained and deleted", func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(m), &machinistv1.Machine{}))
	})
	var left corev1.PodList
	if err := env.Client.List(ctx, &left, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	errs := reconcileErrors(t) - before
	t.Logf("%d evictions lost their reply; the drain ended with %d pods left and %v reconcile errors", proxy.Struck("lost-evictions"), len(left.Items), errs)
	if proxy.Struck("lost-evictions") != 3 {
		t.Fatal("no eviction lost its reply: the test proved nothing")
	}
	if errs != 0 {
		t.Fatalf("lost eviction replies made %v reconcile errors (each logged at ERROR and retried with backoff)", errs)
	}
}
