package pace

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestDelay(t *testing.T) {
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	p := &Pacer{PerObject: time.Millisecond, Now: func() time.Time { return now }}
	key := types.NamespacedName{Namespace: "ns", Name: "set"}
	if d := p.Delay(key); d != 0 {
		t.Fatalf("a key never looked at waits %s, want 0", d)
	}
	p.Looked(key, 100)
	for _, c := range []struct {
		after, want time.Duration
	}{{0, 100 * time.Millisecond}, {40 * time.Millisecond, 60 * time.Millisecond}, {100 * time.Millisecond, 0}, {time.Hour, 0}} {
		now = now.Add(c.after)
		if d := p.Delay(key); d != c.want {
			t.Errorf("%s after the look: waits %s, want %s", c.after, d, c.want)
		}
		now = now.Add(-c.after)
	}
	p.Looked(key, 1_000_000)
	if d := p.Delay(key); d != MaxSpacing {
		t.Errorf("a huge look waits %s, want the bound %s", d, MaxSpacing)
	}
	p.Forget(key)
	if d := p.Delay(key); d != 0 {
		t.Errorf("a forgotten key waits %s, want 0", d)
	}
	var zero Pacer
	zero.Looked(key, 10_000)
	if d := zero.Delay(key); d <= 150*time.Millisecond || d > 200*time.Millisecond {
		t.Errorf("the default spacing of 10,000 objects: waits %s, want about 200ms", d)
	}
}

// A burst of wake-ups during the spacing is one reconcile, after it.
func TestAddCoalesces(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	p := &Pacer{PerObject: time.Millisecond}
	key := types.NamespacedName{Namespace: "ns", Name: "set"}
	p.Add(q, key)
	if q.Len() != 1 {
		t.Fatalf("a first wake-up is queued at once: queue holds %d", q.Len())
	}
	item, _ := q.Get()
	p.Looked(key, 200)
	q.Done(item)
	start := time.Now()
	for range 1000 {
		p.Add(q, key)
	}
	if q.Len() != 0 {
		t.Fatalf("wake-ups during the spacing are queued at once: queue holds %d", q.Len())
	}
	item, _ = q.Get()
	if waited := time.Since(start); waited < 150*time.Millisecond {
		t.Errorf("the paced wake-up came after %s, want about 200ms", waited)
	}
	q.Done(item)
	time.Sleep(300 * time.Millisecond)
	if q.Len() != 0 {
		t.Errorf("a burst of 1000 wake-ups gave %d more reconciles, want none", q.Len())
	}
}

// A wake-up that cannot act before a wait is queued after it, even for a
// key never looked at; a longer spacing still wins.
func TestAddNoSooner(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	p := &Pacer{PerObject: time.Millisecond}
	key := types.NamespacedName{Namespace: "ns", Name: "set"}
	start := time.Now()
	p.AddNoSooner(q, key, 150*time.Millisecond)
	if q.Len() != 0 {
		t.Fatalf("a wake-up with a wait is queued at once: queue holds %d", q.Len())
	}
	item, _ := q.Get()
	if waited := time.Since(start); waited < 140*time.Millisecond {
		t.Errorf("the wake-up came after %s, want about 150ms", waited)
	}
	p.Looked(key, 300)
	q.Done(item)
	start = time.Now()
	p.AddNoSooner(q, key, 50*time.Millisecond)
	item, _ = q.Get()
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Errorf("with a spacing of 300ms and a wait of 50ms the wake-up came after %s, want about 300ms", waited)
	}
	q.Done(item)
}
