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
type Writes struct{ m sync.Map } // types.NamespacedName -> resourceVersion

// Wrote records o, as the API server returned it from a write.
func (w *Writes) Wrote(o client.Object) {
	if v := o.GetResourceVersion(); v != "" {
		w.m.Store(client.ObjectKeyFromObject(o), v)
	}
}

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
	c, err := resourceversion.CompareResourceVersion(o.GetResourceVersion(), v.(string))
	if err != nil || c >= 0 {
		w.m.CompareAndDelete(key, v)
		return false
	}
	return true
}
