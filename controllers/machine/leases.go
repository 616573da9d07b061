package machine

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/nodes"
)

// leaseExpiry wakes a Machine when what its Node's kubelet Lease says of
// its health changes, and never for a renewal that changes nothing. A
// kubelet renews every 10 s, a thousand Leases a second at 10,000 Nodes:
// each renewal only moves its Lease's timer. What wakes a Machine:
//   - its Lease's expiry, by the timer;
//   - a renewal of an expired Lease (its kubelet is back);
//   - the deletion of an expired Lease (a Node without a Lease is judged
//     by its Ready condition alone), as when a repaired machine forgets
//     its earlier life.
//
// An expired Lease stays expired until renewed or deleted, so a Machine
// that judged it expired is woken by whichever comes. (A Machine that
// instead asked to be looked at as its Lease would expire was reconciled
// every 30 to 40 s for nothing: at rest, a quarter of the manager's CPU.)
//
// Timers are memory only: after a restart every Lease is listed again,
// which sets them all, and every Machine is reconciled once anyway. When
// a workload cluster is disconnected its cache stops, so its timers are
// moved no more: each fires once, waking a Machine that then finds its
// cluster unreachable, and none is set again.
type leaseExpiry struct {
	r *Reconciler
	// nodes reads the Nodes of the cluster whose Leases these are.
	nodes client.Reader

	mu     sync.Mutex
	timers map[string]*time.Timer
}

var _ handler.EventHandler = (*leaseExpiry)(nil)

// expiryMargin is how long after a Lease's expiry its Machine is looked
// at: a renewal made at the last moment has reached the cache by then.
const expiryMargin = time.Second

func (r *Reconciler) leaseExpiry(nodes client.Reader) *leaseExpiry {
	return &leaseExpiry{r: r, nodes: nodes, timers: map[string]*time.Timer{}}
}

// Create implements handler.EventHandler.
func (l *leaseExpiry) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	l.schedule(ctx, e.Object, q)
}

// Update implements handler.EventHandler.
func (l *leaseExpiry) Update(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if old, ok := expiry(e.ObjectOld); ok && old.Before(l.r.now()) {
		if renewed, ok := expiry(e.ObjectNew); ok && renewed.After(old) {
			l.wake(ctx, e.ObjectNew.GetName(), q)
		}
	}
	l.schedule(ctx, e.ObjectNew, q)
}

// Delete implements handler.EventHandler.
func (l *leaseExpiry) Delete(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	l.mu.Lock()
	if t, ok := l.timers[e.Object.GetName()]; ok {
		t.Stop()
		delete(l.timers, e.Object.GetName())
	}
	l.mu.Unlock()
	if at, ok := expiry(e.Object); ok && at.Before(l.r.now()) {
		l.wake(ctx, e.Object.GetName(), q)
	}
}

// Generic implements handler.EventHandler.
func (l *leaseExpiry) Generic(context.Context, event.GenericEvent, workqueue.TypedRateLimitingInterface[reconcile.Request]) {
}

// schedule sets the timer of o's Lease to its expiry.
func (l *leaseExpiry) schedule(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	at, ok := expiry(o)
	if !ok {
		return
	}
	d := at.Add(expiryMargin).Sub(l.r.now())
	name := o.GetName()
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.timers[name]; ok {
		t.Reset(d)
		return
	}
	// The handler's ctx ends as it returns; the timer keeps its values
	// (the logger) but not its end. A stopped controller's queue is shut
	// down, and wake asks it.
	wctx := context.WithoutCancel(ctx)
	l.timers[name] = time.AfterFunc(d, func() { l.wake(wctx, name, q) })
}

// wake queues the Machines of the Node named node.
func (l *leaseExpiry) wake(ctx context.Context, node string, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if q.ShuttingDown() {
		return
	}
	var n corev1.Node
	if err := l.nodes.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		// No Node, no Machine to tell: a Machine waits for its Node by
		// the Node watch.
		if client.IgnoreNotFound(err) != nil {
			log.FromContext(ctx).Error(err, "reading the Node of an expired Lease", "node", node)
		}
		return
	}
	if n.Spec.ProviderID == "" {
		return
	}
	for _, req := range l.r.machinesMatching(ctx, "the Lease of Node "+node,
		client.MatchingFields{index.MachineByProviderID: n.Spec.ProviderID}) {
		q.Add(req)
	}
}

// expiry is when o expires unless renewed; false unless o is a kubelet's
// Lease that says it (the manager's own cluster's cache holds every
// namespace's Leases, leader elections among them).
func expiry(o client.Object) (time.Time, bool) {
	lease, ok := o.(*coordinationv1.Lease)
	if !ok || lease.Namespace != corev1.NamespaceNodeLease {
		return time.Time{}, false
	}
	return nodes.LeaseExpiry(lease)
}
