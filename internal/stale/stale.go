// Package stale tells a controller when its cache is behind its own
// writes. The cache catches up with a write some milliseconds after the API
// server answers it; a reconcile woken meanwhile (by another object's
// event, often one of its own side effects) would act on an object older
// than what it already decided and stored: count a slot as free that it
// just took, or call a provider again for a step already recorded.
package stale

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Recheck is how soon a reconcile that found the cache behind the
// controller's own last write should look again.
const Recheck = 50 * time.Millisecond

// Patience is how long the cache may stay behind a write before the API
// server is asked whether the write is still there. A cache catches up in
// milliseconds; one that has not after this either lags far behind or
// never will, because the write was undone: the management cluster's etcd
// restored to an older snapshot under a running manager brings back each
// object as it was then, older than the write remembered, and without the
// question a controller would wait on it for ever.
const Patience = time.Second

// now is the clock; tests set it.
var now = time.Now

// Writes remembers the resourceVersion of a controller's last write to
// each object. It is only a cache: after a restart nothing is remembered
// and the first reconcile of each object trusts what it reads, as it must.
type Writes struct{ m sync.Map } // types.NamespacedName -> *write

// write is one remembered write: its resourceVersion, or the UID of an
// object it removed; when it was made, or last confirmed by the API
// server.
type write struct {
	rv      string
	removed types.UID

	mu sync.Mutex
	at time.Time
}

// Wrote records o, as the API server returned it from a write.
func (w *Writes) Wrote(o client.Object) {
	if v := o.GetResourceVersion(); v != "" {
		w.m.Store(client.ObjectKeyFromObject(o), &write{rv: v, at: now()})
	}
}

// Removed records that o, whose last finalizer the controller has just
// removed, is gone from the API server, although the cache may still hold
// it for a while. Until the cache drops it, Stale reports that object (by
// UID) as stale: acting on it would repeat a deletion already done, each
// write refused as NotFound.
func (w *Writes) Removed(o client.Object) {
	w.m.Store(client.ObjectKeyFromObject(o), &write{removed: o.GetUID(), at: now()})
}

// Forget drops what is remembered of an object that is gone.
func (w *Writes) Forget(key types.NamespacedName) { w.m.Delete(key) }

// Stale reports whether the cached o is older than the last write to it.
// Once the cache has caught up the entry is dropped. While it is behind
// for more than Patience, api (when not nil) is read, at most once per
// Patience: an object there older than the write, or a removed one there
// again, means the write was undone, and the entry is dropped too.
func (w *Writes) Stale(ctx context.Context, api client.Reader, o client.Object) bool {
	key := client.ObjectKeyFromObject(o)
	v, ok := w.m.Load(key)
	if !ok {
		return false
	}
	wr := v.(*write)
	if wr.removed != "" {
		if wr.removed != o.GetUID() {
			// Another object of the same name: the one removed is past.
			w.m.CompareAndDelete(key, v)
			return false
		}
	} else if c, err := resourceversion.CompareResourceVersion(o.GetResourceVersion(), wr.rv); err != nil || c >= 0 {
		w.m.CompareAndDelete(key, v)
		return false
	}
	if api == nil || !wr.due() {
		return true
	}
	if undone(ctx, api, o, wr) {
		w.m.CompareAndDelete(key, v)
		return false
	}
	return true
}

// due reports whether Patience has passed since the write was made or
// last confirmed, and starts another wait if so.
func (wr *write) due() bool {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if now().Sub(wr.at) < Patience {
		return false
	}
	wr.at = now()
	return true
}

// undone asks the API server whether wr is still there: the object at
// the write's resourceVersion or later, or the removed object gone. A
// failed read, or an object gone that was written, says nothing: the
// cache will catch up with it.
func undone(ctx context.Context, api client.Reader, o client.Object, wr *write) bool {
	live, ok := o.DeepCopyObject().(client.Object)
	if !ok {
		return false
	}
	if err := api.Get(ctx, client.ObjectKeyFromObject(o), live); err != nil {
		return false
	}
	if wr.removed != "" {
		return true // there again, or another of its name
	}
	c, err := resourceversion.CompareResourceVersion(live.GetResourceVersion(), wr.rv)
	return err == nil && c < 0
}
