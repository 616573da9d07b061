// Package stale tells a controller when its cache is behind its own
// writes. The cache catches up with a write some milliseconds after the API
// server answers it; a reconcile woken meanwhile (by another object's
// event, often one of its own side effects) would act on an object older
// than what it already decided and stored: count a slot as free that it
// just took, or call a provider again for a step already recorded.
package stale

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Recheck is how soon a reconcile that found the cache behind the
// controller's own last write should look again.
const Recheck = 50 * time.Millisecond

// Writes remembers the resourceVersion of a controller's last write to
// each object. It is only a cache: after a restart nothing is remembered
// and the first reconcile of each object trusts what it reads, as it must.
type Writes struct{ m sync.Map } // types.NamespacedName -> resourceVersion or removed

// Wrote records o, as the API server returned it from a write.
func (w *Writes) Wrote(o client.Object) {
	if v := o.GetResourceVersion(); v != "" {
		w.m.Store(client.ObjectKeyFromObject(o), v)
	}
}

// Removed records that o, whose last finalizer the controller has just
// removed, is gone from the API server, although the cache may still hold
// it for a while. Until the cache drops it, Stale reports that object (by
// UID) as stale: acting on it would repeat a deletion already done, each
// write refused as NotFound.
func (w *Writes) Removed(o client.Object) {
	w.m.Store(client.ObjectKeyFromObject(o), removed(o.GetUID()))
}

// removed marks an object whose deletion is complete.
type removed types.UID

// Forget drops what is remembered of an object that is gone.
func (w *Writes) Forget(key types.NamespacedName) { w.m.Delete(key) }

// Stale reports whether the cached o is older than the last write to it.
// Once the cache has caught up the entry is dropped.
func (w *Writes) Stale(o client.Object) bool {
	key := client.ObjectKeyFromObject(o)
	v, ok := w.m.Load(key)
	if !ok {
		return false
	}
	if uid, gone := v.(removed); gone {
		if types.UID(uid) == o.GetUID() {
			return true
		}
		// Another object of the same name: the one removed is past.
		w.m.CompareAndDelete(key, v)
		return false
	}
	c, err := resourceversion.CompareResourceVersion(o.GetResourceVersion(), v.(string))
	if err != nil || c >= 0 {
		w.m.CompareAndDelete(key, v)
		return false
	}
	return true
}
