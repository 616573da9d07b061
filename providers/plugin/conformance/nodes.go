package conformance

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// nodeWatch keeps, for every provider ID seen on a Node since the suite
// started, the boot IDs its Nodes reported in order. Every Node is
// watched, not only those the suite knows by name: the name is the
// provider's choice, and a repair may register the Node afresh.
type nodeWatch struct {
	factory informers.SharedInformerFactory
	stop    context.CancelFunc

	mu      sync.Mutex
	byID    map[string]*nodeHistory
	changed chan struct{} // closed and replaced on every change
}

// nodeHistory is what the Nodes of one provider ID have shown.
type nodeHistory struct {
	// boots are the distinct boot IDs reported, in the order first seen.
	boots []string
	// node is the Node as last seen, nil while there is none.
	node *corev1.Node
}

func (h nodeHistory) copy() nodeHistory {
	return nodeHistory{boots: slices.Clone(h.boots), node: h.node}
}

// boot is the boot ID the Node reports now, "" without a Node.
func (h nodeHistory) boot() string {
	if h.node == nil {
		return ""
	}
	return h.node.Status.NodeInfo.BootID
}

// ready reports whether the Node exists, has booted and is Ready.
func (h nodeHistory) ready() bool {
	if h.boot() == "" {
		return false
	}
	for _, c := range h.node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// since returns the boot IDs first seen after the first n.
func (h nodeHistory) since(n int) []string {
	if n >= len(h.boots) {
		return nil
	}
	return h.boots[n:]
}

// watchNodes starts watching and returns once the first list is in, or
// fails when it cannot be had within timeout.
func watchNodes(ctx context.Context, kube kubernetes.Interface, timeout time.Duration) (*nodeWatch, error) {
	ctx, stop := context.WithCancel(ctx)
	w := &nodeWatch{
		factory: informers.NewSharedInformerFactory(kube, 0),
		stop:    stop,
		byID:    map[string]*nodeHistory{},
		changed: make(chan struct{}),
	}
	_, err := w.factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.seen(obj) },
		UpdateFunc: func(_, obj any) { w.seen(obj) },
		DeleteFunc: w.gone,
	})
	if err != nil {
		stop()
		return nil, err
	}
	w.factory.StartWithContext(ctx)
	syncCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := w.factory.WaitForCacheSyncWithContext(syncCtx).AsError(); err != nil {
		w.close()
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	return w, nil
}

func (w *nodeWatch) close() {
	w.stop()
	w.factory.Shutdown()
}

func (w *nodeWatch) seen(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok || n.Spec.ProviderID == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.byID[n.Spec.ProviderID]
	if h == nil {
		h = &nodeHistory{}
		w.byID[n.Spec.ProviderID] = h
	}
	if b := n.Status.NodeInfo.BootID; b != "" && !slices.Contains(h.boots, b) {
		h.boots = append(h.boots, b)
	}
	h.node = n
	w.notify()
}

func (w *nodeWatch) gone(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// A Node registered afresh under another name may already stand for
	// the provider ID; only the one deleted goes.
	if h := w.byID[n.Spec.ProviderID]; h != nil && h.node != nil && h.node.Name == n.Name {
		h.node = nil
		w.notify()
	}
}

// notify wakes every waiter. Callers hold w.mu.
func (w *nodeWatch) notify() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// history returns what the Nodes of providerID have shown so far.
func (w *nodeWatch) history(providerID string) nodeHistory {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h := w.byID[providerID]; h != nil {
		return h.copy()
	}
	return nodeHistory{}
}

// await waits up to timeout for the Nodes of providerID to satisfy cond,
// and returns their history then; on timeout the error says what was
// awaited and what was last seen.
func (w *nodeWatch) await(ctx context.Context, timeout time.Duration, providerID, what string, cond func(nodeHistory) bool) (nodeHistory, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		w.mu.Lock()
		var h nodeHistory
		if p := w.byID[providerID]; p != nil {
			h = p.copy()
		}
		changed := w.changed
		w.mu.Unlock()
		if cond(h) {
			return h, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return h, fmt.Errorf("%s: not within %s (%s)", what, timeout, describe(h))
		case <-ctx.Done():
			return h, fmt.Errorf("%s: %w (%s)", what, ctx.Err(), describe(h))
		}
	}
}

// describe says what a history shows, for failure messages.
func describe(h nodeHistory) string {
	if h.node == nil {
		return fmt.Sprintf("no Node now; boot IDs seen: %v", h.boots)
	}
	ready := "unknown"
	for _, c := range h.node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = string(c.Status)
		}
	}
	return fmt.Sprintf("Node %s: Ready=%s, boot ID %q, version %q; boot IDs seen: %v",
		h.node.Name, ready, h.boot(), h.node.Status.NodeInfo.KubeletVersion, h.boots)
}
