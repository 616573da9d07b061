// Package index declares the cache indexes that more than one controller
// looks objects up by. A manager's cache refuses a second index of the
// same name, so each is registered once per cache, whichever controller
// asks first.
package index

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

// Index names, for client.MatchingFields.
const (
	// NodeByProviderID finds the Node of a providerID.
	NodeByProviderID = "spec.providerID"
	// MachineByProviderID finds the Machine of a providerID.
	MachineByProviderID = "status.providerID"
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
		if o.err = idx.IndexField(ctx, &corev1.Node{}, NodeByProviderID, func(obj client.Object) []string {
			if id := obj.(*corev1.Node).Spec.ProviderID; id != "" {
				return []string{id}
			}
			return nil
		}); o.err != nil {
			return
		}
		o.err = idx.IndexField(ctx, &machinistv1.Machine{}, MachineByProviderID, func(obj client.Object) []string {
			if id := obj.(*machinistv1.Machine).Status.ProviderID; id != "" {
				return []string{id}
			}
			return nil
		})
	})
	return o.err
}

// NodeFor returns the Node whose spec.providerID is providerID, from the
// cache behind c, or nil when there is none.
func NodeFor(ctx context.Context, c client.Reader, providerID string) (*corev1.Node, error) {
	if providerID == "" {
		return nil, nil
	}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes, client.MatchingFields{NodeByProviderID: providerID}); err != nil {
		return nil, err
	}
	if len(nodes.Items) == 0 {
		return nil, nil
	}
	return &nodes.Items[0], nil
}
