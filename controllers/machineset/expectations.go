package machineset

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// expectationsTTL bounds how long a MachineSet waits for watch events it
// expects; past it, a lost event cannot stall the set forever.
const expectationsTTL = 5 * time.Minute

// expectations remembers, per MachineSet, the Machine creations and
// deletions it has made and not yet seen in the cache, as Kubernetes'
// ReplicaSet controller does. While any are outstanding the set does not
// scale again, so a cache that lags behind its own writes can never make it
// create or delete twice.
//
// A write whose outcome is unknown (its reply lost, or answered 504 and
// perhaps stored later) is neither awaited nor forgotten: it is kept as
// unsure and repeated, the same Machine name created again or the same
// Machine deleted again, before anything new is done. Either the repeat
// or the first request is stored, never both, so a slot is filled once
// whatever the timing. Creations are keyed by name for that reason: the
// set names its Machines itself rather than through generateName.
type expectations struct {
	mu  sync.Mutex
	now func() time.Time
	by  map[types.NamespacedName]*expected
}

type expected struct {
	// adds and deletes are acknowledged writes not yet seen in the cache.
	adds    map[string]bool
	deletes map[types.UID]bool
	at      time.Time
	// unsureAdds and unsureDeletes are writes whose outcome is unknown,
	// to be repeated.
	unsureAdds    map[string]time.Time
	unsureDeletes map[types.UID]time.Time
}

func newExpectations(now func() time.Time) *expectations {
	return &expectations{now: now, by: map[types.NamespacedName]*expected{}}
}

func (e *expectations) of(key types.NamespacedName) *expected {
	x, ok := e.by[key]
	if !ok {
		x = &expected{
			adds: map[string]bool{}, deletes: map[types.UID]bool{},
			unsureAdds: map[string]time.Time{}, unsureDeletes: map[types.UID]time.Time{},
		}
		e.by[key] = x
	}
	return x
}

// satisfied reports whether every acknowledged write for key has been seen
// in the cache, or the oldest is too old to trust. Unsure writes do not
// hold the set back: they are repeated.
func (e *expectations) satisfied(key types.NamespacedName) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.by[key]
	if !ok {
		return true
	}
	now := e.now()
	if now.Sub(x.at) > expectationsTTL {
		clear(x.adds)
		clear(x.deletes)
	}
	for name, at := range x.unsureAdds {
		if now.Sub(at) > expectationsTTL {
			delete(x.unsureAdds, name)
		}
	}
	for uid, at := range x.unsureDeletes {
		if now.Sub(at) > expectationsTTL {
			delete(x.unsureDeletes, uid)
		}
	}
	if len(x.adds) > 0 || len(x.deletes) > 0 {
		return false
	}
	if len(x.unsureAdds) == 0 && len(x.unsureDeletes) == 0 {
		delete(e.by, key)
	}
	return true
}

// awaiting reports whether key still awaits a creation or deletion it
// made, without satisfied's expiry: a wake-up that ends no wait need not
// come at once.
func (e *expectations) awaiting(key types.NamespacedName) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.by[key]
	return ok && (len(x.adds) > 0 || len(x.deletes) > 0)
}

// expectCreates records that Machines of these names are being created.
func (e *expectations) expectCreates(key types.NamespacedName, names []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.of(key)
	x.at = e.now()
	for _, n := range names {
		x.adds[n] = true
	}
}

// expectDeletes records that the Machines of these UIDs are being deleted.
func (e *expectations) expectDeletes(key types.NamespacedName, uids []types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.of(key)
	x.at = e.now()
	for _, u := range uids {
		x.deletes[u] = true
	}
}

// created records that the Machine name was seen in the cache.
func (e *expectations) created(key types.NamespacedName, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.by[key]; ok {
		delete(x.adds, name)
		delete(x.unsureAdds, name)
	}
}

// createRefused records that creating name failed for certain: it is not
// coming.
func (e *expectations) createRefused(key types.NamespacedName, name string) { e.created(key, name) }

// notAttempted records that name, expected, was not asked for after all
// (an earlier batch failed). It is not coming from this attempt; if an
// earlier attempt's outcome is unknown, that one still may, so the name
// stays unsure.
func (e *expectations) notAttempted(key types.NamespacedName, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.by[key]; ok {
		delete(x.adds, name)
	}
}

// createUnsure records that creating name may or may not have worked: it
// is repeated, under the same name, when the set next needs a Machine.
func (e *expectations) createUnsure(key types.NamespacedName, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.of(key)
	delete(x.adds, name)
	x.unsureAdds[name] = e.now()
}

// unsureCreates lists, oldest name first, the creations to repeat.
func (e *expectations) unsureCreates(key types.NamespacedName) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.by[key]
	if !ok {
		return nil
	}
	out := make([]string, 0, len(x.unsureAdds))
	for n := range x.unsureAdds {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b string) int {
		if c := x.unsureAdds[a].Compare(x.unsureAdds[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return out
}

// deleted records that the deletion of uid was seen in the cache, or
// that the Machine is gone.
func (e *expectations) deleted(key types.NamespacedName, uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.by[key]; ok {
		delete(x.deletes, uid)
		delete(x.unsureDeletes, uid)
	}
}

// deleteUnsure records that deleting uid may or may not have worked: the
// Machine is deleted again before any other is chosen.
func (e *expectations) deleteUnsure(key types.NamespacedName, uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.of(key)
	delete(x.deletes, uid)
	x.unsureDeletes[uid] = e.now()
}

// unsureDelete reports whether the deletion of uid is to be repeated.
func (e *expectations) unsureDelete(key types.NamespacedName, uid types.UID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.by[key]
	if !ok {
		return false
	}
	_, unsure := x.unsureDeletes[uid]
	return unsure
}

// forget drops every expectation of a MachineSet that is gone.
func (e *expectations) forget(key types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.by, key)
}
