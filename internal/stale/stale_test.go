package stale

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func TestWritesTellAStaleCache(t *testing.T) {
	at := func(rv string) *machinistv1.Machine {
		return &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", ResourceVersion: rv}}
	}
	ctx := context.Background()
	var w Writes
	if w.Stale(ctx, nil, at("5")) {
		t.Fatal("a Machine never written is never stale")
	}
	w.Wrote(at("100"))
	if !w.Stale(ctx, nil, at("99")) || !w.Stale(ctx, nil, at("9")) {
		t.Fatal("a cached Machine older than the last write is stale")
	}
	if w.Stale(ctx, nil, at("100")) {
		t.Fatal("the cache holding the last write is not stale")
	}
	if w.Stale(ctx, nil, at("99")) {
		t.Fatal("once the cache caught up the write is forgotten")
	}
	w.Wrote(at("200"))
	if !w.Stale(ctx, nil, at("150")) {
		t.Fatal("a later write is remembered anew")
	}
	if w.Stale(ctx, nil, at("not-a-number")) || w.Stale(ctx, nil, at("150")) {
		t.Fatal("a resourceVersion that does not compare drops what was remembered")
	}
}

func TestARemovedObjectIsStaleUntilForgotten(t *testing.T) {
	with := func(uid, rv string) *machinistv1.Machine {
		return &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", UID: types.UID(uid), ResourceVersion: rv}}
	}
	ctx := context.Background()
	var w Writes
	w.Removed(with("a", "10"))
	if !w.Stale(ctx, nil, with("a", "10")) || !w.Stale(ctx, nil, with("a", "999")) {
		t.Fatal("a removed object the cache still holds is stale, whatever its resourceVersion")
	}
	if w.Stale(ctx, nil, with("b", "5")) {
		t.Fatal("a new object of the same name is not the removed one")
	}
	if w.Stale(ctx, nil, with("a", "10")) {
		t.Fatal("once a newer object was seen the removal is forgotten")
	}
	w.Removed(with("a", "10"))
	w.Forget(types.NamespacedName{Namespace: "ns", Name: "m"})
	if w.Stale(ctx, nil, with("a", "10")) {
		t.Fatal("Forget drops the removal")
	}
}

// api is the API server as a reader: the object it holds, or none.
type api struct {
	obj   *machinistv1.Machine
	reads int
}

func (a *api) Get(_ context.Context, key client.ObjectKey, out client.Object, _ ...client.GetOption) error {
	a.reads++
	if a.obj == nil {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "machines"}, key.Name)
	}
	a.obj.DeepCopyInto(out.(*machinistv1.Machine))
	return nil
}

func (a *api) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// TestAWriteUndoneByARestoreIsForgotten: the management cluster's etcd
// restored to a snapshot older than a controller's last write brings the
// object back as it was, older than the write, in the API server and, once
// the informer lists again, in the cache. A cache behind the write for
// more than Patience makes Stale ask the API server; when the object
// there is older than the write too, or a removed object is there again,
// the write was undone and Stale stops saying so: otherwise the
// controller would requeue that object for ever. A cache that only lags
// (the API server has the write) stays stale.
func TestAWriteUndoneByARestoreIsForgotten(t *testing.T) {
	ctx := context.Background()
	clock := time.Unix(1000, 0)
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = time.Now })
	at := func(uid, rv string) *machinistv1.Machine {
		return &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", UID: types.UID(uid), ResourceVersion: rv}}
	}

	var w Writes
	w.Wrote(at("a", "100"))
	server := &api{obj: at("a", "100")}
	clock = clock.Add(2 * Patience)
	if !w.Stale(ctx, server, at("a", "90")) {
		t.Fatal("a cache behind a write the API server has is stale, however long it lags")
	}
	if !w.Stale(ctx, server, at("a", "90")) || server.reads != 1 {
		t.Fatalf("the API server read %d times within one Patience, want once", server.reads)
	}

	server.obj = at("a", "40") // the snapshot's version
	clock = clock.Add(Patience / 2)
	if !w.Stale(ctx, server, at("a", "40")) {
		t.Fatal("within Patience of the last read the API server is not asked again")
	}
	clock = clock.Add(Patience)
	if w.Stale(ctx, server, at("a", "40")) {
		t.Fatal("a write the API server no longer has (an older version there) keeps the object stale for ever")
	}
	if w.Stale(ctx, server, at("a", "40")) {
		t.Fatal("a write found undone is forgotten")
	}

	// A Machine whose finalizer was removed, back from the snapshot.
	w.Removed(at("b", "70"))
	server.obj = nil
	clock = clock.Add(2 * Patience)
	if !w.Stale(ctx, server, at("b", "60")) {
		t.Fatal("a removed object the API server has not either is stale until the cache drops it")
	}
	server.obj = at("b", "60")
	clock = clock.Add(2 * Patience)
	if w.Stale(ctx, server, at("b", "60")) {
		t.Fatal("a removed object there again in the API server keeps it stale for ever")
	}
}
