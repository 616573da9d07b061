package local

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, func(e *testenv.Env) { env = e }))
}

// clean deletes the samples, as a fresh cluster would have none.
func clean(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, list := range []client.ObjectList{&machinistv1.WorkloadClusterList{}, &machinistv1.MachineClassList{},
		&machinistv1.MachineDeploymentList{}, &machinistv1.MachineSetList{}, &machinistv1.MachineHealthCheckList{},
		&machinistv1.MachineDisruptionBudgetList{}} {
		if err := env.Client.List(ctx, list, client.InNamespace(SampleNamespace)); err != nil {
			t.Fatal(err)
		}
		items, _ := meta.ExtractList(list)
		for _, o := range items {
			if err := client.IgnoreNotFound(env.Client.Delete(ctx, o.(client.Object))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestSamplesAreMadeOnceEachAndLaterOnesOnAnOlderState(t *testing.T) {
	ctx := context.Background()
	marker := filepath.Join(t.TempDir(), samplesMarker)
	all := []string{"WorkloadCluster/workload", "MachineClass/local", "MachineDeployment/workers", "MachineSet/spare",
		"MachineClass/vm", "MachineSet/vms", "MachineClass/real-node", "MachineSet/real-nodes",
		"MachineHealthCheck/workers", "MachineDisruptionBudget/workers"}

	// The first start makes them all.
	clean(t)
	created, err := samples(ctx, env.Client, marker)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(created, all) {
		t.Fatalf("the first start made %v, want %v", created, all)
	}
	// One the user deleted stays deleted.
	if err := env.Client.Delete(ctx, emptySet(SampleVMSet, SampleVMClass)); err != nil {
		t.Fatal(err)
	}
	if created, err = samples(ctx, env.Client, marker); err != nil || len(created) != 0 {
		t.Fatalf("a restart made %v (%v), want none", created, err)
	}

	// A state made before the VMs' samples, whose marker lists nothing,
	// gets those, and only those.
	clean(t)
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	created, err = samples(ctx, env.Client, marker)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(created, laterSamples) {
		t.Fatalf("an older state got %v, want %v", created, laterSamples)
	}
	b, _ := os.ReadFile(marker)
	if got := strings.Fields(string(b)); !slices.Equal(got, all) {
		t.Fatalf("the marker lists %v, want %v", got, all)
	}

	// A state made before the real nodes' samples, whose marker lists
	// what was made then, gets those, and only those.
	clean(t)
	before := slices.DeleteFunc(slices.Clone(all), func(s string) bool { return strings.Contains(s, "real-node") })
	if err := os.WriteFile(marker, []byte(strings.Join(before, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if created, err = samples(ctx, env.Client, marker); err != nil {
		t.Fatal(err)
	}
	if want := []string{"MachineClass/real-node", "MachineSet/real-nodes"}; !slices.Equal(created, want) {
		t.Fatalf("a state made before the real nodes got %v, want %v", created, want)
	}
	set := &machinistv1.MachineSet{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: SampleNamespace, Name: SampleNodeSet}, set); err != nil {
		t.Fatal(err)
	}
	if *set.Spec.Replicas != 0 || set.Spec.Template.Spec.Version != RealNodeVersion {
		t.Fatalf("the real nodes' set asks for %d replicas of %s, want 0 of %s", *set.Spec.Replicas, set.Spec.Template.Spec.Version, RealNodeVersion)
	}
}
