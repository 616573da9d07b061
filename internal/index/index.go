// Package index declares the cache indexes that more than one controller
// looks objects up by. A manager's cache refuses a second index of the
// same name, so each is registered once per cache, whichever controller
// asks first.
package index

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Index names, for client.MatchingFields.
const (
	// NodeByProviderID finds the Node of a providerID.
	NodeByProviderID = "spec.providerID"
	// MachineByProviderID finds the Machine of a providerID.
	MachineByProviderID = "status.providerID"
	// MachineByController finds the Machines a set controls, by the
	// set's UID, and a namespace's orphans, by Orphan.
	MachineByController = "metadata.controller"
	// Orphan is the MachineByController value of a Machine no set
	// controls.
	Orphan = "-"
	// MachineByCluster finds the Machines of a WorkloadCluster, by its
	// name (they share its namespace); a self-managed Machine has none.
	MachineByCluster = "spec.clusterName"
)

var registered sync.Map // client.FieldIndexer -> *sync.Once result

type once struct {
	sync.Once
	err error
}

// Register adds the indexes to the cache behind idx, once.
func Register(ctx context.Context, idx client.FieldIndexer) error {
	v, _ := registered.LoadOrStore(idx, &once{})
	o := v.(*once)
	o.Do(func() {
		if o.err = RegisterNodes(ctx, idx); o.err != nil {
			return
		}
		if o.err = idx.IndexField(ctx, &machinistv1.Machine{}, MachineByCluster, func(obj client.Object) []string {
			if name := obj.(*machinistv1.Machine).Spec.ClusterName; name != "" {
				return []string{name}
			}
			return nil
		}); o.err != nil {
			return
		}
		if o.err = idx.IndexField(ctx, &machinistv1.Machine{}, MachineByProviderID, func(obj client.Object) []string {
			if id := obj.(*machinistv1.Machine).Status.ProviderID; id != "" {
				return []string{id}
			}
			return nil
		}); o.err != nil {
			return
		}
		o.err = idx.IndexField(ctx, &machinistv1.Machine{}, MachineByController, func(obj client.Object) []string {
			return []string{controller(obj)}
		})
	})
	return o.err
}

// RegisterNodes adds the Node index alone, to the cache of a workload
// cluster, which holds no Machines. Each such cache is new, so nothing
// needs remembering.
func RegisterNodes(ctx context.Context, idx client.FieldIndexer) error {
	return idx.IndexField(ctx, &corev1.Node{}, NodeByProviderID, func(obj client.Object) []string {
		if id := obj.(*corev1.Node).Spec.ProviderID; id != "" {
			return []string{id}
		}
		return nil
	})
}

// Machines returns the Machines of namespace ns whose MachineByController
// value is value (a set's UID, or Orphan). A set of thousands is looked
// up on each of its reconciles, so when store is the manager's cache they
// are read from the cache's own index, neither listed nor copied: callers
// must not modify them. Otherwise (or if the cache cannot be read that
// way) the namespace is listed through c and filtered.
func Machines(ctx context.Context, c client.Reader, store cache.Cache, ns, value string) ([]*machinistv1.Machine, error) {
	if store != nil {
		if out, ok := fromIndexer(ctx, store, ns, value); ok {
			return out, nil
		}
	}
	// Any reader, even one without the index: the namespace, filtered.
	var list machinistv1.MachineList
	if err := c.List(ctx, &list, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var out []*machinistv1.Machine
	for i := range list.Items {
		if controller(&list.Items[i]) == value {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// controller is a Machine's MachineByController value.
func controller(m client.Object) string {
	if ref := metav1.GetControllerOfNoCopy(m); ref != nil {
		return string(ref.UID)
	}
	return Orphan
}

// fromIndexer reads the Machines straight from the informer's index.
// controller-runtime keeps a field index under "field:<name>", keyed by
// "<namespace>/<value>"; if that ever changes, the lookup fails and
// Machines lists instead.
func fromIndexer(ctx context.Context, store cache.Cache, ns, value string) ([]*machinistv1.Machine, bool) {
	inf, err := store.GetInformer(ctx, &machinistv1.Machine{}, cache.BlockUntilSynced(true))
	if err != nil {
		return nil, false
	}
	indexed, ok := inf.(interface{ GetIndexer() toolscache.Indexer })
	if !ok {
		return nil, false
	}
	objs, err := indexed.GetIndexer().ByIndex("field:"+MachineByController, ns+"/"+value)
	if err != nil {
		return nil, false
	}
	out := make([]*machinistv1.Machine, 0, len(objs))
	for _, o := range objs {
		m, ok := o.(*machinistv1.Machine)
		if !ok {
			return nil, false
		}
		out = append(out, m)
	}
	return out, true
}
