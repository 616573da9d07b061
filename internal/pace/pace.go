// Package pace spaces out the reconciles of an object that many others
// wake. A MachineSet or MachineDeployment of N Machines is woken by every
// change of any of them and reads all N each time it looks, so woken at
// once it does O(N) work per change: O(N²) over a scale-up, and most of
// the manager's CPU at 10,000 Machines. Paced, it looks at most once per
// N × PerObject, which bounds the share of a core it can use whatever N
// is, while the changes it must answer at once are still queued at once.
//
// Nothing is lost by waiting: a reconcile reads the cache when it runs,
// so the changes of the wait are all in what it reads, and a paced wake-up
// is only ever postponed, never dropped.
package pace

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// DefaultPerObject is the spacing per object read. A look costs well under
// a microsecond per Machine (an index lookup and a condition read), so
// this keeps a paced object's reconciles under about 5% of one core:
// 20 ms apart at 1,000 Machines, 200 ms at 10,000.
const DefaultPerObject = 20 * time.Microsecond

// MaxSpacing bounds the spacing, so that a very large set still answers
// within a second.
const MaxSpacing = time.Second

// Pacer remembers when each object was last looked at, and how much its
// look read. The zero value is ready to use, with DefaultPerObject.
type Pacer struct {
	// PerObject is the spacing per object a look reads; zero means
	// DefaultPerObject.
	PerObject time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu    sync.Mutex
	looks map[types.NamespacedName]look
}

type look struct {
	at      time.Time
	objects int
}

// Looked records that key was looked at now, reading objects objects.
func (p *Pacer) Looked(key types.NamespacedName, objects int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.looks == nil {
		p.looks = map[types.NamespacedName]look{}
	}
	p.looks[key] = look{at: p.now(), objects: objects}
}

// Forget drops what is known of key, an object that is gone.
func (p *Pacer) Forget(key types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.looks, key)
}

// Delay is how long a wake-up of key waits: until its last look is
// Spacing old. Zero for a key never looked at.
func (p *Pacer) Delay(key types.NamespacedName) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.looks[key]
	if !ok {
		return 0
	}
	return max(0, l.at.Add(p.spacing(l.objects)).Sub(p.now()))
}

// Add queues key after Delay. A key already waiting keeps its earlier
// time (the work queue's rule), so a burst of changes costs one look.
func (p *Pacer) Add(q workqueue.TypedRateLimitingInterface[reconcile.Request], key types.NamespacedName) {
	p.AddNoSooner(q, key, 0)
}

// AddNoSooner queues key after the longer of Delay and wait: for a
// wake-up whose only possible outcome cannot happen before wait has
// passed, such as a status written at most so often, a look before then
// would be wasted.
func (p *Pacer) AddNoSooner(q workqueue.TypedRateLimitingInterface[reconcile.Request], key types.NamespacedName, wait time.Duration) {
	req := reconcile.Request{NamespacedName: key}
	if d := max(p.Delay(key), wait); d > 0 {
		q.AddAfter(req, d)
		return
	}
	q.Add(req)
}

func (p *Pacer) spacing(objects int) time.Duration {
	per := p.PerObject
	if per <= 0 {
		per = DefaultPerObject
	}
	return min(MaxSpacing, time.Duration(objects)*per)
}

func (p *Pacer) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}
