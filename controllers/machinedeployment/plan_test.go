package machinedeployment

import (
	"math/rand/v2"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func randomBound(rnd *rand.Rand) intstr.IntOrString {
	if rnd.IntN(2) == 0 {
		return intstr.FromInt32(int32(rnd.IntN(4)))
	}
	return intstr.FromString([]string{"0%", "10%", "25%", "50%", "100%"}[rnd.IntN(5)])
}

func TestResolveRoundsAsDeploymentsDo(t *testing.T) {
	for _, c := range []struct {
		surge, unavailable intstr.IntOrString
		replicas           int32
		wantSurge, wantUn  int32
	}{
		{intstr.FromString("10%"), intstr.FromString("10%"), 6, 1, 0},   // surge rounds up, unavailable down
		{intstr.FromString("25%"), intstr.FromString("25%"), 10, 3, 2},  // 2.5 -> 3 and 2
		{intstr.FromInt32(0), intstr.FromString("0%"), 5, 0, 1},         // both zero: one may be unavailable
		{intstr.FromString("100%"), intstr.FromString("100%"), 4, 4, 4}, //
		{intstr.FromInt32(2), intstr.FromInt32(1), 3, 2, 1},
	} {
		s, err := Resolve(machinistv1.MachineDeploymentStrategy{
			Type:          machinistv1.RollingUpdateStrategy,
			RollingUpdate: &machinistv1.RollingUpdate{MaxSurge: &c.surge, MaxUnavailable: &c.unavailable},
		}, c.replicas)
		if err != nil {
			t.Fatal(err)
		}
		if s.MaxSurge != c.wantSurge || s.MaxUnavailable != c.wantUn {
			t.Errorf("%v/%v of %d: got surge %d unavailable %d, want %d %d",
				c.surge.String(), c.unavailable.String(), c.replicas, s.MaxSurge, s.MaxUnavailable, c.wantSurge, c.wantUn)
		}
	}
	s, err := Resolve(machinistv1.MachineDeploymentStrategy{}, 3)
	if err != nil || s.Type != machinistv1.RollingUpdateStrategy || s.MaxSurge != 1 || s.MaxUnavailable != 0 {
		t.Errorf("defaults: got %+v, %v; want RollingUpdate with maxSurge 1, maxUnavailable 0", s, err)
	}
}

func TestRollingSurgesThenScalesDown(t *testing.T) {
	s := Strategy{Type: machinistv1.RollingUpdateStrategy, MaxSurge: 1, MaxUnavailable: 0}
	old := []Set{{Name: "old", Replicas: 6, Machines: 6, Live: 6, Available: 6}}
	if got := Next(6, s, Set{Name: "new"}, old); got["new"] != 1 || len(got) != 1 {
		t.Fatalf("first step: %v, want only new=1", got)
	}
	// The new Machine is available: one old one may go, and no more new
	// ones until it has.
	got := Next(6, s, Set{Name: "new", Replicas: 1, Machines: 1, Live: 1, Available: 1}, old)
	if got["old"] != 5 || len(got) != 1 {
		t.Fatalf("second step: %v, want old=5 only", got)
	}
	// The old Machine is still draining: it counts against the surge.
	old[0] = Set{Name: "old", Replicas: 5, Machines: 6, Live: 5, Available: 5}
	if got := Next(6, s, Set{Name: "new", Replicas: 1, Machines: 1, Live: 1, Available: 1}, old); len(got) != 0 {
		t.Fatalf("while an old Machine drains: %v, want nothing", got)
	}
}

func TestRecreateWaitsForOldMachinesToGo(t *testing.T) {
	s := Strategy{Type: machinistv1.RecreateStrategy}
	old := []Set{{Name: "old", Replicas: 3, Machines: 3, Live: 3}}
	if got := Next(3, s, Set{Name: "new"}, old); got["old"] != 0 || len(got) != 1 {
		t.Fatalf("%v, want old=0 only", got)
	}
	old[0] = Set{Name: "old", Replicas: 0, Machines: 1}
	if got := Next(3, s, Set{Name: "new"}, old); len(got) != 0 {
		t.Fatalf("%v while an old Machine remains, want nothing", got)
	}
	old[0] = Set{Name: "old"}
	if got := Next(3, s, Set{Name: "new"}, old); got["new"] != 3 {
		t.Fatalf("%v, want new=3", got)
	}
}

func TestOnDeleteReplacesOnlyDeletedMachines(t *testing.T) {
	s := Strategy{Type: machinistv1.OnDeleteStrategy}
	old := []Set{{Name: "old", Replicas: 3, Machines: 3, Live: 3}}
	if got := Next(3, s, Set{Name: "new"}, old); len(got) != 0 {
		t.Fatalf("%v before any deletion, want nothing", got)
	}
	old[0].Live = 2 // someone deleted one
	if got := Next(3, s, Set{Name: "new"}, old); got["old"] != 2 || got["new"] != 1 {
		t.Fatalf("%v, want old=2 new=1", got)
	}
}

func TestProportionalKeepsTheRolloutRatio(t *testing.T) {
	s := Strategy{Type: machinistv1.RollingUpdateStrategy, MaxSurge: 1}
	// 6 -> 9 in the middle of a rollout: old 5, new 2 (7 = 6 + surge).
	got := Proportional(9, s, []Set{{Name: "old", Replicas: 5, Machines: 5}, {Name: "new", Replicas: 2, Machines: 2}})
	if got["old"]+got["new"] != 10 || got["old"] <= 5 || got["new"] <= 2 {
		t.Fatalf("%v: want both sets to grow to 10 in all", got)
	}
	// 6 -> 3 (4 with the surge): the new set's two Machines are not up
	// yet, so they go first, then one old one.
	got = Proportional(3, s, []Set{{Name: "old", Replicas: 5, Machines: 5, Available: 5, Live: 5}, {Name: "new", Replicas: 2, Machines: 2, Live: 2}})
	if got["new"] != 0 || got["old"] != 4 {
		t.Fatalf("%v: want new=0 old=4", got)
	}
	// With the new Machines available, the cut stops at the floor.
	sets := []Set{{Name: "old", Replicas: 5, Machines: 5, Available: 5, Live: 5}, {Name: "new", Replicas: 2, Machines: 2, Available: 2, Live: 2}}
	got = Proportional(2, Strategy{Type: machinistv1.RollingUpdateStrategy}, sets)
	var sum int32
	for _, set := range sets {
		if n, ok := got[set.Name]; ok {
			sum += n
		} else {
			sum += set.Replicas
		}
	}
	if sum != 2 {
		t.Fatalf("%v: want 2 in all", got)
	}
	if got := Proportional(9, s, []Set{{Name: "old"}, {Name: "new", Replicas: 6}}); got != nil {
		t.Fatalf("%v: one set with Machines is the planner's job", got)
	}
}
