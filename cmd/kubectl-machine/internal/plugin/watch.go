package plugin

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// errDeleted ends a wait whose object went away: a new object of the same
// name would be a different one, which must not be followed silently.
var errDeleted = errors.New("it was deleted")

// follow calls observe with the named object as it is now and after every
// change, until observe is done or fails, the object is deleted, or ctx
// ends (then it returns ctx.Err()). proto is an empty object of the kind
// and newList makes an empty list of it.
//
// It lists and watches through an informer, as kubectl rollout status
// does: the API server closes watches when it pleases and expires old
// resource versions, and the informer resumes or relists after either.
func follow[T client.Object](ctx context.Context, c client.WithWatch, resource schema.GroupResource, ns, name string,
	proto T, newList func() client.ObjectList, observe func(T) (bool, error)) error {
	// The informer retries failed lists for ever; a first read fails fast
	// where retrying cannot help: no server, no such object, no right.
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, proto.DeepCopyObject().(T)); err != nil {
		return err
	}
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			list := newList()
			err := c.List(ctx, list, client.InNamespace(ns), &client.ListOptions{Raw: &opts})
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			return c.Watch(ctx, newList(), client.InNamespace(ns), &client.ListOptions{Raw: &opts})
		},
	}
	exists := func(store cache.Store) (bool, error) {
		_, found, err := store.GetByKey(ns + "/" + name)
		if err == nil && !found {
			err = apierrors.NewNotFound(resource, name)
		}
		return false, err
	}
	_, err := watchtools.UntilWithSync(ctx, lw, proto, exists, func(ev watch.Event) (bool, error) {
		switch ev.Type {
		case watch.Deleted:
			return false, errDeleted
		case watch.Added, watch.Modified:
			obj, ok := ev.Object.(T)
			if !ok {
				return false, fmt.Errorf("unexpected %T in the watch of %s %s", ev.Object, resource, name)
			}
			return observe(obj)
		}
		return false, nil
	})
	if err != nil && ctx.Err() != nil {
		// The watch reports an ended context as an error of its own;
		// callers need to tell a timeout from an interrupt.
		return ctx.Err()
	}
	return err
}
