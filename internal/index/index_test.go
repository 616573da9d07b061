package index_test

import (
	"context"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/index"
)

// Machines finds a set's Machines and a namespace's orphans in the
// cache's own index (the same objects the cache holds, not copies), and
// the same ones by listing when there is no cache.
func TestMachinesByController(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ns, err := e.Namespace(ctx, "index")
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.Namespace(ctx, "index-other")
	if err != nil {
		t.Fatal(err)
	}
	set := types.UID("4d6c1b8e-0000-4000-8000-000000000001")
	create := func(ns, name string, owner types.UID) {
		m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: "small"}}}
		if owner != "" {
			m.OwnerReferences = []metav1.OwnerReference{{APIVersion: machinistv1.GroupVersion.String(), Kind: "MachineSet",
				Name: "set", UID: owner, Controller: ptr.To(true)}}
		}
		if err := e.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	create(ns, "a", set)
	create(ns, "b", set)
	create(ns, "c", "4d6c1b8e-0000-4000-8000-000000000002")
	create(ns, "orphan", "")
	create(other, "elsewhere", set)
	create(other, "orphan-elsewhere", "")

	c, err := cache.New(e.Config, cache.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := index.Register(ctx, c); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache not synced")
	}
	names := func(ms []*machinistv1.Machine) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Name)
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		value string
		want  []string
	}{
		{string(set), []string{"a", "b"}},
		{index.Orphan, []string{"orphan"}},
	} {
		fromCache, err := index.Machines(ctx, c, c, ns, tc.value)
		if err != nil {
			t.Fatal(err)
		}
		listed, err := index.Machines(ctx, e.Client, nil, ns, tc.value)
		if err != nil {
			t.Fatal(err)
		}
		if got := names(fromCache); !slices.Equal(got, tc.want) {
			t.Errorf("%s from the cache: %v, want %v", tc.value, got, tc.want)
		}
		if got := names(listed); !slices.Equal(got, tc.want) {
			t.Errorf("%s listed: %v, want %v", tc.value, got, tc.want)
		}
	}
	// The cache's own objects: a second lookup returns the same pointers,
	// which a copy (the fallback's list) would not.
	first, _ := index.Machines(ctx, c, c, ns, string(set))
	again, _ := index.Machines(ctx, c, c, ns, string(set))
	for _, m := range first {
		if !slices.Contains(again, m) {
			t.Fatalf("Machine %s was copied: the cache's index was not read", m.Name)
		}
	}
}
