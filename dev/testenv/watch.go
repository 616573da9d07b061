package testenv

import (
	"context"
	"fmt"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// WatchMachines streams every change to the Machines of a namespace from
// now on, in order; see Watch.
func (e *Env) WatchMachines(ctx context.Context, ns string) (<-chan watch.Event, error) {
	return e.Watch(ctx, ns, func() client.ObjectList { return &machinistv1.MachineList{} })
}

// Watch streams every change to the objects of one kind (newList makes an
// empty list of it) in a namespace from now on, in order. The API server
// closes watches it thinks too slow (as a busy test machine can be), so a
// plain watch would silently end; this one resumes from the last resource
// version it delivered and so misses nothing. It stops when ctx ends.
func (e *Env) Watch(ctx context.Context, ns string, newList func() client.ObjectList) (<-chan watch.Event, error) {
	wc, err := client.NewWithWatch(e.Config, client.Options{Scheme: e.Scheme})
	if err != nil {
		return nil, err
	}
	list := newList()
	if err := wc.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		return wc.Watch(ctx, newList(), client.InNamespace(ns), &client.ListOptions{Raw: &opts})
	}}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, list.GetResourceVersion(), lw)
	if err != nil {
		return nil, err
	}
	go func() {
		<-ctx.Done()
		rw.Stop()
	}()
	return rw.ResultChan(), nil
}

// Watches feeds watches to a test's own bookkeeping, one event at a time
// under Mu, and remembers each watch that delivered an error or ended
// before the test did: a check of what a broken watch never delivered
// would pass on nothing.
type Watches struct {
	// Mu guards what the take functions write; hold it to read that, and
	// to call Broken.
	Mu sync.Mutex
	// Recover, when set, is deferred in each watch's goroutine (Ginkgo's
	// GinkgoRecover, so that a failed assertion in take fails the spec).
	Recover func()
	broken  []string
}

// Follow feeds ch to take, under w.Mu, until ch closes; an event take
// refuses (returns false for), or ch closing before ctx ends, breaks w.
func (w *Watches) Follow(ctx context.Context, what string, ch <-chan watch.Event, take func(watch.Event) bool) {
	go func() {
		if w.Recover != nil {
			defer w.Recover()
		}
		for ev := range ch {
			w.Mu.Lock()
			if !take(ev) {
				w.broken = append(w.broken, fmt.Sprintf("the %s watch delivered %s %#v", what, ev.Type, ev.Object))
			}
			w.Mu.Unlock()
		}
		if ctx.Err() == nil {
			w.Mu.Lock()
			w.broken = append(w.broken, fmt.Sprintf("the %s watch ended before the test did", what))
			w.Mu.Unlock()
		}
	}()
}

// Broken says why watches broke, if any did; call it holding w.Mu.
func (w *Watches) Broken() []string { return slices.Clone(w.broken) }
