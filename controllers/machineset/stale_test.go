package machineset_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machineset"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// blindReader is a cache that has not yet seen any Machine: the worst lag
// an informer can have. Everything else it reads fresh.
type blindReader struct{ client.Reader }

func (b blindReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*machinistv1.MachineList); ok {
		return nil
	}
	return b.Reader.List(ctx, list, opts...)
}

// TestStaleCacheNeverCreatesTwice reconciles one MachineSet twice while its
// cache shows none of the Machines the first reconcile created. Without
// expectations the second reconcile would create them all again.
func TestStaleCacheNeverCreatesTwice(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "stale"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	ms := newSet("stale", "blind", 5, machinistv1.DeleteRandom)
	if err := env.Client.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	stale, err := client.New(env.Config, client.Options{
		Scheme: env.Scheme,
		Cache:  &client.CacheOptions{Reader: blindReader{env.Client}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &machineset.Reconciler{Client: stale}
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(ms)}
	for i := range 3 {
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatalf("reconcile %d: %v", i+1, err)
		}
		var list machinistv1.MachineList
		if err := env.Client.List(ctx, &list, client.InNamespace("stale")); err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 5 {
			t.Fatalf("after reconcile %d with a blind cache there are %d Machines, want 5", i+1, len(list.Items))
		}
	}
}
