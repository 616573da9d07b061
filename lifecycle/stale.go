package lifecycle

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

// staleRecheck is how soon a reconcile that found the cache behind this
// controller's own last write looks again.
const staleRecheck = 50 * time.Millisecond

// lastWrites remembers the resourceVersion of this controller's last write
// to each Machine, so that a reconcile woken by something else (a Node
// event, often one of its own side effects) does not act on a cached
// Machine older than what it wrote: it would cordon, evict or call the
// provider again for a step that is already decided and stored. It is only
// a cache; after a restart nothing is remembered and the first reconcile of
// each Machine trusts what it reads, as before.
type lastWrites struct{ m sync.Map } // types.NamespacedName -> resourceVersion

func (w *lastWrites) wrote(m *machinistv1.Machine) {
	if m.ResourceVersion != "" {
		w.m.Store(client.ObjectKeyFromObject(m), m.ResourceVersion)
	}
}

func (w *lastWrites) forget(key types.NamespacedName) { w.m.Delete(key) }

// stale reports whether the cached m is older than this controller's last
// write to it. Once the cache has caught up the entry is dropped.
func (w *lastWrites) stale(m *machinistv1.Machine) bool {
	key := client.ObjectKeyFromObject(m)
	v, ok := w.m.Load(key)
	if !ok {
		return false
	}
	c, err := resourceversion.CompareResourceVersion(m.ResourceVersion, v.(string))
	if err != nil || c >= 0 {
		w.m.CompareAndDelete(key, v)
		return false
	}
	return true
}
