package inventory_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/inventory"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/providers"
)

// TestARestoreThatChangesEveryUIDLosesAndLeaksNothing: a MachineSet and
// its Machines are re-created from a backup without their status, as
// Velero restores them, after the originals were lost with their
// finalizers unrun. Every UID is new; the instances still record the old
// ones. Each Machine finds its own instance again, by its namespace and
// name: the same providerID and boot, no instance made, none left over,
// nothing deleted.
func TestARestoreThatChangesEveryUIDLosesAndLeaksNothing(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "restore", testenv.Small)
	set := testenv.MachineSet(ns, "pool", 3)
	if err := env.Client.Create(ctx, set); err != nil {
		t.Fatal(err)
	}
	before := running(t, env, ns, 3)
	held := instances(t, ctrls.Provider, ns)
	if len(held) != 3 {
		t.Fatalf("the provider holds %d instances in %s, want 3", len(held), ns)
	}

	// The backup: spec and metadata, as a restore re-creates them.
	backup := make([]*machinistv1.Machine, len(before))
	for i := range before {
		backup[i] = &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: before[i].Name,
			Labels: before[i].Labels, Annotations: before[i].Annotations, Finalizers: before[i].Finalizers}, Spec: before[i].Spec}
	}
	// One backup keeps the providerID in spec, as a Cluster API one
	// does: its Machine adopts its former self's instance by it.
	backup[0].Spec.ProviderID = before[0].Status.ProviderID
	setBackup := &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: set.Name}, Spec: *set.Spec.DeepCopy()}

	// The loss: the set paused first, so that it replaces nothing, then
	// every object gone without its finalizers run.
	key := client.ObjectKeyFromObject(set)
	annotatePaused(t, key)
	testenv.WaitFor(t, 10*time.Second, "the set paused", func() error {
		ms := &machinistv1.MachineSet{}
		if err := env.Client.Get(ctx, key, ms); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(ms.Status.Conditions, machinistv1.ConditionPaused) {
			return errNotYet
		}
		return nil
	})
	for i := range before {
		m := &before[i]
		if err := env.Client.Patch(ctx, m, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Delete(ctx, set); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "every object gone", func() error {
		ms, err := testenv.ListMachines(ctx, env.Client, ns)
		if err != nil {
			return err
		}
		if len(ms) > 0 || env.Client.Get(ctx, key, &machinistv1.MachineSet{}) == nil {
			return errNotYet
		}
		return nil
	})

	// The restore: the Machines, then their set.
	restored := time.Now()
	for _, m := range backup {
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, setBackup); err != nil {
		t.Fatal(err)
	}
	after := running(t, env, ns, 3)
	t.Logf("the restored Machines were Running %s after they were re-created", time.Since(restored).Round(100*time.Millisecond))
	for _, m := range after {
		i := slices.IndexFunc(before, func(b machinistv1.Machine) bool { return b.Name == m.Name })
		switch {
		case i < 0:
			t.Errorf("Machine %s is new: the set replaced one", m.Name)
		case m.UID == before[i].UID:
			t.Errorf("Machine %s kept its UID: not a restore that changes UIDs", m.Name)
		case m.Status.ProviderID != before[i].Status.ProviderID:
			t.Errorf("Machine %s has instance %s, want its own %s", m.Name, m.Status.ProviderID, before[i].Status.ProviderID)
		case m.Status.BootID != before[i].Status.BootID:
			t.Errorf("Machine %s's machine booted again (%s, was %s)", m.Name, m.Status.BootID, before[i].Status.BootID)
		}
	}
	// A few inventory passes later: the same three instances, each
	// owned by its restored Machine, and none deleted.
	time.Sleep(3 * time.Second)
	now := instances(t, ctrls.Provider, ns)
	if len(now) != 3 {
		t.Errorf("the provider holds %d instances in %s, want the same 3", len(now), ns)
	}
	for _, m := range after {
		if owner, ok := now[m.Status.ProviderID]; !ok || owner.UID != m.UID {
			t.Errorf("instance %s is recorded for %+v, want Machine %s (UID %s)", m.Status.ProviderID, owner, m.Name, m.UID)
		}
		if slices.Contains(eventReasons(t, env, ns, m.Name), inventory.ReasonOrphanDeleted) {
			t.Errorf("the instance of %s was deleted as an orphan", m.Name)
		}
	}
}

// instances maps the provider's instances recorded for Machines of ns to
// their owners.
func instances(t *testing.T, p providers.Actuator, ns string) map[string]providers.Owner {
	t.Helper()
	listed, err := providers.List(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]providers.Owner{}
	for _, l := range listed {
		if l.Owner.Namespace == ns {
			out[l.ProviderID] = l.Owner
		}
	}
	return out
}

func annotatePaused(t *testing.T, key types.NamespacedName) {
	t.Helper()
	ms := &machinistv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+machinistv1.PausedAnnotation+`":"true"}}}`))
	if err := env.Client.Patch(context.Background(), ms, patch); err != nil {
		t.Fatal(err)
	}
}

type notYet struct{}

func (notYet) Error() string { return "not yet" }

var errNotYet error = notYet{}
