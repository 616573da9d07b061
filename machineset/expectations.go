package machineset

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// expectationsTTL bounds how long a MachineSet waits for watch events it
// expects; past it, a lost event cannot stall the set forever.
const expectationsTTL = 5 * time.Minute

// expectations remembers, per MachineSet, the Machine creations and
// deletions it has asked for and not yet seen in the cache, as Kubernetes'
// ReplicaSet controller does. While any are outstanding the set does not
// scale again, so a cache that lags behind its own writes can never make it
// create or delete twice.
type expectations struct {
	mu  sync.Mutex
	now func() time.Time
	by  map[types.NamespacedName]*expected
}

type expected struct {
	adds    int
	deletes map[types.UID]bool
	at      time.Time
}

func newExpectations(now func() time.Time) *expectations {
	return &expectations{now: now, by: map[types.NamespacedName]*expected{}}
}

// satisfied reports whether every expected event for key has been seen, or
// the expectations are too old to trust.
func (e *expectations) satisfied(key types.NamespacedName) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.by[key]
	if !ok {
		return true
	}
	if (x.adds <= 0 && len(x.deletes) == 0) || e.now().Sub(x.at) > expectationsTTL {
		delete(e.by, key)
		return true
	}
	return false
}

// expect records that n creations and the deletions of uids are under way.
func (e *expectations) expect(key types.NamespacedName, n int, uids []types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := &expected{adds: n, deletes: map[types.UID]bool{}, at: e.now()}
	for _, u := range uids {
		x.deletes[u] = true
	}
	e.by[key] = x
}

// created records that one expected creation happened (or will never
// happen because the request failed).
func (e *expectations) created(key types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.by[key]; ok {
		x.adds--
	}
}

// deleted records that the deletion of uid was seen (or failed).
func (e *expectations) deleted(key types.NamespacedName, uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.by[key]; ok {
		delete(x.deletes, uid)
	}
}

// forget drops every expectation of a MachineSet that is gone.
func (e *expectations) forget(key types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.by, key)
}
