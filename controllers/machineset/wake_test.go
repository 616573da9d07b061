package machineset

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// A change of a Machine that only alters what its set counts waits for
// the set's status to be writable again; one that may let the set act
// does not.
func TestCountedChangesWaitForTheStatusInterval(t *testing.T) {
	const interval = 400 * time.Millisecond
	r := &Reconciler{StatusInterval: interval, PerMachine: time.Microsecond}
	r.init()
	h := &machineHandler{r: r}
	key := types.NamespacedName{Namespace: "ns", Name: "set"}
	set := &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: "set-uid"}}
	old := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{
		Namespace: key.Namespace, Name: "m", Labels: map[string]string{"pool": "a"},
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(set, machinistv1.GroupVersion.WithKind("MachineSet"))},
	}}
	ready := old.DeepCopy()
	ready.Status.Phase = machinistv1.MachineRunning
	relabelled := old.DeepCopy()
	relabelled.Labels = map[string]string{"pool": "b"}

	queued := func(m *machinistv1.Machine) time.Duration {
		t.Helper()
		q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
		defer q.ShutDown()
		start := time.Now()
		h.Update(context.Background(), event.TypedUpdateEvent[client.Object]{ObjectOld: old, ObjectNew: m}, q)
		item, _ := q.Get()
		q.Done(item)
		return time.Since(start)
	}

	if d := queued(ready); d > interval/2 {
		t.Errorf("a set never written waits %s for a counted change, want no wait", d)
	}
	r.wrote(set, time.Now())
	if d := queued(ready); d < interval*8/10 {
		t.Errorf("a counted change %s after the set's status write woke it, want no sooner than %s", d, interval)
	}
	r.wrote(set, time.Now())
	if d := queued(relabelled); d > interval/2 {
		t.Errorf("a label change waited %s, want no wait: it may release the Machine", d)
	}
}
