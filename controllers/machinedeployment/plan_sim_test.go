package machinedeployment

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

var simSeeds = flag.Int("sim.seeds", 300, "how many seeded rollouts TestSimulatedRollouts runs")

// simMachine is a modelled Machine.
type simMachine struct {
	set       int
	ready     bool
	readyAt   int // the time it became Ready
	deleting  bool
	neverUp   bool
	createdAt int
}

// sim is a modelled deployment: its MachineSets behave as the MachineSet
// controller does (Machines being deleted count; on scale-down, Machines
// already deleting go first, then those not Ready, then any), Machines
// become Ready and disappear at random moments, and the planner runs at
// random moments too.
type sim struct {
	rnd      *rand.Rand
	replicas int32
	strategy Strategy
	minReady int
	now      int
	sets     []int32 // spec.replicas by set; the last is the newest
	machines []*simMachine
	broken   bool  // new Machines never become Ready
	desired  int32 // replicas when the sets were last sized, as the annotation records
	spec     machinistv1.MachineDeploymentStrategy
}

func (s *sim) counts(set int) Set {
	c := Set{Name: fmt.Sprint(set), Replicas: s.sets[set]}
	for _, m := range s.machines {
		if m.set != set {
			continue
		}
		c.Machines++
		if m.deleting {
			continue
		}
		c.Live++
		if m.ready && s.now-m.readyAt >= s.minReady {
			c.Available++
		}
	}
	return c
}

func (s *sim) plan() {
	newest := len(s.sets) - 1
	var all []Set
	for i := range s.sets {
		all = append(all, s.counts(i))
	}
	var plan Plan
	if s.desired != s.replicas {
		plan = Proportional(s.replicas, s.strategy, all)
		s.desired = s.replicas
	}
	if plan == nil {
		plan = Next(s.replicas, s.strategy, all[newest], all[:newest])
	}
	for name, n := range plan {
		var i int
		fmt.Sscan(name, &i)
		s.sets[i] = n
	}
}

// syncSet is the MachineSet controller for one set.
func (s *sim) syncSet(set int) {
	var owned []*simMachine
	for _, m := range s.machines {
		if m.set == set {
			owned = append(owned, m)
		}
	}
	diff := len(owned) - int(s.sets[set])
	for ; diff < 0; diff++ {
		s.machines = append(s.machines, &simMachine{set: set, neverUp: s.broken && set == len(s.sets)-1, createdAt: s.now})
	}
	if diff > 0 {
		rank := func(m *simMachine) int {
			switch {
			case m.deleting:
				return 0
			case !m.ready:
				return 1
			}
			return 2
		}
		s.rnd.Shuffle(len(owned), func(i, j int) { owned[i], owned[j] = owned[j], owned[i] })
		slices.SortStableFunc(owned, func(a, b *simMachine) int { return rank(a) - rank(b) })
		for _, m := range owned[:diff] {
			m.deleting = true
		}
	}
}

func (s *sim) totals() (machines, available int32) {
	for i := range s.sets {
		c := s.counts(i)
		machines += c.Machines
		available += c.Available
	}
	return machines, available
}

func (s *sim) done() bool {
	newest := s.counts(len(s.sets) - 1)
	machines, _ := s.totals()
	return newest.Available == s.replicas && machines == s.replicas
}

// step does one random thing.
func (s *sim) step() {
	switch s.rnd.IntN(5) {
	case 0: // a provisioning Machine becomes Ready
		var waiting []*simMachine
		for _, m := range s.machines {
			if !m.ready && !m.deleting && !m.neverUp {
				waiting = append(waiting, m)
			}
		}
		if len(waiting) > 0 {
			m := waiting[s.rnd.IntN(len(waiting))]
			m.ready, m.readyAt = true, s.now
		}
	case 1: // a deleting Machine is gone
		var deleting []int
		for i, m := range s.machines {
			if m.deleting {
				deleting = append(deleting, i)
			}
		}
		if len(deleting) > 0 {
			i := deleting[s.rnd.IntN(len(deleting))]
			s.machines = slices.Delete(s.machines, i, i+1)
		}
	case 2:
		s.now++
	case 3:
		s.syncSet(s.rnd.IntN(len(s.sets)))
	case 4:
		s.plan()
	}
}

// TestSimulatedRollouts runs rollouts over many seeded random orders of
// events and checks, after every event, that the deployment never holds
// more than replicas + maxSurge Machines and never has fewer than replicas
// - maxUnavailable available; and that a rollout with a healthy provider
// finishes. Run more with -sim.seeds=N.
func TestSimulatedRollouts(t *testing.T) {
	for seed := range *simSeeds {
		rnd := rand.New(rand.NewPCG(uint64(seed), 42))
		replicas := int32(1 + rnd.IntN(12))
		spec := machinistv1.MachineDeploymentStrategy{Type: machinistv1.RollingUpdateStrategy, RollingUpdate: &machinistv1.RollingUpdate{}}
		surge, unavailable := randomBound(rnd), randomBound(rnd)
		spec.RollingUpdate.MaxSurge, spec.RollingUpdate.MaxUnavailable = &surge, &unavailable
		strategy, err := Resolve(spec, replicas)
		if err != nil {
			t.Fatal(err)
		}
		s := &sim{rnd: rnd, replicas: replicas, desired: replicas, strategy: strategy, spec: spec, minReady: rnd.IntN(3), sets: []int32{replicas}}
		for range replicas {
			s.machines = append(s.machines, &simMachine{set: 0, ready: true, readyAt: -100})
		}
		s.broken = rnd.IntN(10) == 0
		s.sets = append(s.sets, 0) // a template change
		secondChange := rnd.IntN(3) == 0
		rescale := rnd.IntN(3) == 0
		// While a change of replicas settles, the bounds are those of the
		// larger count for Machines and of the smaller for availability.
		hi, lo := s.strategy, s.strategy
		hiReplicas, loReplicas := replicas, replicas
		where := fmt.Sprintf("seed %d: replicas %d, maxSurge %v (%d), maxUnavailable %v (%d), minReady %d, broken %v",
			seed, replicas, surge.String(), strategy.MaxSurge, unavailable.String(), strategy.MaxUnavailable, s.minReady, s.broken)
		for i := 0; i < 20000 && !(s.done() && !s.broken); i++ {
			if secondChange && i == 200 {
				s.sets = append(s.sets, 0)
			}
			if rescale && i == 100 {
				s.replicas = int32(1 + rnd.IntN(12))
				if s.strategy, err = Resolve(s.spec, s.replicas); err != nil {
					t.Fatal(err)
				}
				where += fmt.Sprintf(", rescaled to %d at step 100", s.replicas)
				if s.replicas > hiReplicas {
					hi, hiReplicas = s.strategy, s.replicas
				}
				if s.replicas < loReplicas {
					lo, loReplicas = s.strategy, s.replicas
				}
			}
			s.step()
			machines, available := s.totals()
			if machines > hiReplicas+hi.MaxSurge {
				t.Fatalf("%s: step %d: %d Machines, more than replicas + maxSurge = %d", where, i, machines, hiReplicas+hi.MaxSurge)
			}
			if available < loReplicas-lo.MaxUnavailable {
				t.Fatalf("%s: step %d: %d available, fewer than replicas - maxUnavailable = %d", where, i, available, loReplicas-lo.MaxUnavailable)
			}
		}
		if !s.broken && !s.done() {
			_ = replicas
			t.Fatalf("%s: the rollout did not finish in 20000 events", where)
		}
	}
}
