package machinedeployment

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// ipMachine is a modelled Machine of an in-place rollout.
type ipMachine struct {
	name     string
	set      int  // the owning set
	current  bool // its spec is the new template's
	updated  bool // it runs the new version
	updating bool // an update is in flight: it is down
	failed   bool // its update was refused: it runs on, and is not retried
	ready    bool
}

// ipSim is a modelled in-place rollout: two sets (the old revision, 0, and
// the new, 1) behaving as the MachineSet controller does with its
// releasing and receiving lists; a Machine controller that updates Machines
// whose spec changed, at random moments, sometimes refusing; and the
// deployment's in-place step, whose hand-over writes land one at a time so
// that a reconcile can be cut short between any two.
type ipSim struct {
	rnd            *rand.Rand
	replicas       int32
	maxUnavailable int32
	refuse         bool // the provider refuses every update
	sets           [2]int32
	releasing      [2]map[string]bool
	receiving      [2]map[string]bool
	machines       []*ipMachine
	// pending are the hand-over writes not made yet, in order.
	pending []func()
	created int
	deleted int
}

func (s *ipSim) members() []Member {
	var out []Member
	for _, m := range s.machines {
		out = append(out, Member{Name: m.name, Set: m.set, Current: m.current, Updated: m.updated,
			Running: !m.updating, Available: m.ready && !m.updating})
	}
	return out
}

func (s *ipSim) byName(name string) *ipMachine {
	for _, m := range s.machines {
		if m.name == name {
			return m
		}
	}
	return nil
}

// syncSet is the MachineSet controller for one set.
func (s *ipSim) syncSet(set int) {
	var owned, counted []*ipMachine
	for _, m := range s.machines {
		if m.set == set {
			owned = append(owned, m)
			if !s.releasing[set][m.name] {
				counted = append(counted, m)
			}
		}
	}
	count := len(counted)
	for name := range s.receiving[set] {
		if m := s.byName(name); m != nil && m.set != set {
			count++
		}
	}
	for diff := count - int(s.sets[set]); diff < 0; diff++ {
		s.created++
		s.machines = append(s.machines, &ipMachine{name: fmt.Sprintf("new-%d", s.created), set: set, current: set == 1, updated: set == 1})
	}
	if diff := count - int(s.sets[set]); diff > 0 {
		for _, m := range counted[:min(diff, len(counted))] {
			s.deleted++
			s.machines = slices.DeleteFunc(s.machines, func(x *ipMachine) bool { return x == m })
		}
	}
}

// reconcile is the deployment's in-place step: the planner's updates at
// once, its hand-overs queued as separate writes.
func (s *ipSim) reconcile() {
	if len(s.pending) > 0 {
		return // the earlier reconcile's writes are still landing
	}
	step := NextInPlace(s.replicas, s.maxUnavailable, 1, s.members())
	for _, name := range step.Update {
		s.byName(name).current = true
	}
	if len(step.Move) == 0 {
		return
	}
	moving := slices.Clone(step.Move)
	s.pending = append(s.pending,
		func() { // the old set: lower replicas and list, in one write
			for _, n := range moving {
				if !s.releasing[0][n] {
					s.releasing[0][n] = true
					s.sets[0]--
				}
			}
		},
		func() { // the new set: raise replicas and list, in one write
			for _, n := range moving {
				if !s.receiving[1][n] {
					s.receiving[1][n] = true
					s.sets[1]++
				}
			}
		},
	)
	for _, n := range moving {
		s.pending = append(s.pending, func() { // each Machine moves
			if m := s.byName(n); m != nil {
				m.set = 1
			}
		})
	}
}

// step does one random thing.
func (s *ipSim) step() {
	switch s.rnd.IntN(6) {
	case 0: // the Machine controller starts an update
		var todo []*ipMachine
		for _, m := range s.machines {
			if m.current && !m.updated && !m.updating && !m.failed {
				todo = append(todo, m)
			}
		}
		if len(todo) > 0 {
			m := todo[s.rnd.IntN(len(todo))]
			if s.refuse {
				m.failed = true
			} else {
				m.updating = true
			}
		}
	case 1: // an update finishes
		var busy []*ipMachine
		for _, m := range s.machines {
			if m.updating {
				busy = append(busy, m)
			}
		}
		if len(busy) > 0 {
			m := busy[s.rnd.IntN(len(busy))]
			m.updating, m.updated = false, true
		}
	case 2: // a new Machine becomes Ready
		for _, m := range s.machines {
			if !m.ready {
				m.ready = true
				break
			}
		}
	case 3:
		s.syncSet(s.rnd.IntN(2))
	case 4:
		s.reconcile()
	case 5: // the next hand-over write lands, or the reconcile is cut short
		if len(s.pending) > 0 {
			if s.rnd.IntN(8) == 0 {
				s.pending = nil // a crash: the next reconcile finishes it
			} else {
				s.pending[0]()
				s.pending = s.pending[1:]
			}
		}
	}
}

func (s *ipSim) done() bool {
	if s.sets[0] != 0 || s.sets[1] != s.replicas || len(s.machines) != int(s.replicas) {
		return false
	}
	for _, m := range s.machines {
		if m.set != 1 || !m.updated || !m.ready || m.updating {
			return false
		}
	}
	return true
}

// TestSimulatedInPlaceRollouts runs in-place rollouts over many seeded
// random orders of events and checks after every event that no more than
// maxUnavailable Machines are down and that no Machine was created or
// deleted; and that a rollout whose provider accepts the updates finishes
// with every Machine updated and owned by the new set. Run more with
// -sim.seeds=N.
func TestSimulatedInPlaceRollouts(t *testing.T) {
	for seed := range *simSeeds {
		rnd := rand.New(rand.NewPCG(uint64(seed), 7))
		replicas := int32(1 + rnd.IntN(12))
		bound := intstr.FromInt32(int32(1 + rnd.IntN(4)))
		if rnd.IntN(2) == 0 {
			bound = intstr.FromString(fmt.Sprintf("%d%%", 1+rnd.IntN(100)))
		}
		spec := machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy, InPlace: &machinistv1.InPlaceUpdate{MaxUnavailable: &bound}}
		maxUnavailable, err := ResolveInPlace(spec, replicas)
		if err != nil {
			t.Fatal(err)
		}
		s := &ipSim{rnd: rnd, replicas: replicas, maxUnavailable: maxUnavailable, refuse: rnd.IntN(10) == 0,
			sets:      [2]int32{replicas, 0},
			releasing: [2]map[string]bool{{}, {}}, receiving: [2]map[string]bool{{}, {}}}
		for i := range replicas {
			s.machines = append(s.machines, &ipMachine{name: fmt.Sprintf("m%d", i), ready: true})
		}
		where := fmt.Sprintf("seed %d: replicas %d, maxUnavailable %s (%d), provider refuses %v", seed, replicas, bound.String(), maxUnavailable, s.refuse)
		for i := 0; i < 20000 && !s.done(); i++ {
			s.step()
			down := int32(0)
			for _, m := range s.machines {
				if !m.ready || m.updating {
					down++
				}
			}
			if down > maxUnavailable {
				t.Fatalf("%s: step %d: %d Machines down, more than maxUnavailable", where, i, down)
			}
			if s.created > 0 || s.deleted > 0 {
				t.Fatalf("%s: step %d: a set created %d and deleted %d Machines during the hand-over", where, i, s.created, s.deleted)
			}
		}
		if !s.refuse && !s.done() {
			t.Fatalf("%s: the rollout did not finish in 20000 events: sets %v, releasing %v, receiving %v", where, s.sets, s.releasing, s.receiving)
		}
	}
}
