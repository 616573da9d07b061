// Package machinedeployment rolls MachineDeployments out through MachineSets.
//
// This file holds the rollout planner: pure arithmetic over the sets'
// counts, with no API access, so that its invariants can be checked over
// many simulated rollouts (plan_sim_test.go).
package machinedeployment

import (
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/util/intstr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Set is what the planner knows of one MachineSet of a deployment.
type Set struct {
	// Name identifies the set in a Plan.
	Name string
	// Replicas is the set's spec.replicas.
	Replicas int32
	// Machines counts every Machine the set owns, including those being
	// deleted: they still exist, so they count against maxSurge.
	Machines int32
	// Live counts the Machines the set owns that are not being deleted.
	Live int32
	// Available counts Machines Ready for at least minReadySeconds.
	Available int32
}

// Strategy is a deployment's rollout strategy with its bounds resolved.
type Strategy struct {
	Type           machinistv1.StrategyType
	MaxSurge       int32
	MaxUnavailable int32
}

// Resolve turns a deployment's strategy into numbers for replicas: a
// percentage of maxSurge rounds up and of maxUnavailable rounds down, as
// Kubernetes Deployments do; if both come to zero, maxUnavailable becomes
// one so that a rollout can always move.
func Resolve(s machinistv1.MachineDeploymentStrategy, replicas int32) (Strategy, error) {
	out := Strategy{Type: s.Type}
	if out.Type == "" {
		out.Type = machinistv1.RollingUpdateStrategy
	}
	if out.Type == machinistv1.InPlaceStrategy {
		// Machines are updated, not added: nothing surges.
		n, err := ResolveInPlace(s, replicas)
		if err != nil {
			return out, fmt.Errorf("inPlace.maxUnavailable: %w", err)
		}
		out.MaxUnavailable = n
		return out, nil
	}
	if out.Type != machinistv1.RollingUpdateStrategy {
		return out, nil
	}
	surge, unavailable := intstr.FromInt32(1), intstr.FromInt32(0)
	if ru := s.RollingUpdate; ru != nil {
		if ru.MaxSurge != nil {
			surge = *ru.MaxSurge
		}
		if ru.MaxUnavailable != nil {
			unavailable = *ru.MaxUnavailable
		}
	}
	sv, err := intstr.GetScaledValueFromIntOrPercent(&surge, int(replicas), true)
	if err != nil {
		return out, fmt.Errorf("maxSurge: %w", err)
	}
	uv, err := intstr.GetScaledValueFromIntOrPercent(&unavailable, int(replicas), false)
	if err != nil {
		return out, fmt.Errorf("maxUnavailable: %w", err)
	}
	if sv == 0 && uv == 0 {
		uv = 1
	}
	out.MaxSurge, out.MaxUnavailable = int32(sv), int32(uv)
	return out, nil
}

// Plan is the spec.replicas each set should have next, by name. Sets it
// does not name keep what they have.
type Plan map[string]int32

// Next plans one step of a rollout toward replicas Machines of the newest
// template. newSet is the set of the current template; old are the others,
// oldest first. A step never makes the deployment hold more than replicas +
// maxSurge Machines (counting those being deleted) and never takes
// available Machines below replicas - maxUnavailable by scaling down; the
// caller applies the plan and calls Next again when counts change.
func Next(replicas int32, s Strategy, newSet Set, old []Set) Plan {
	switch s.Type {
	case machinistv1.RecreateStrategy:
		return recreate(replicas, newSet, old)
	case machinistv1.OnDeleteStrategy:
		return onDelete(replicas, newSet, old)
	case machinistv1.InPlaceStrategy:
		return inPlaceSizes(replicas, newSet, old)
	}
	return rolling(replicas, s, newSet, old)
}

func rolling(replicas int32, s Strategy, newSet Set, old []Set) Plan {
	plan := Plan{}
	// Scale up the new set while the deployment is under its surge bound.
	// What exists counts, not what is asked for: an old set scaled down
	// still holds its Machines until they are drained and gone.
	total := footprint(newSet)
	for _, o := range old {
		total += footprint(o)
	}
	all := append(slices.Clone(old), newSet)
	if up := min(replicas+s.MaxSurge-total, replicas-newSet.Replicas); up > 0 {
		plan[newSet.Name] = newSet.Replicas + up
	} else if newSet.Replicas > replicas {
		// replicas was lowered: shrink the new set as far as availability
		// allows.
		maps.Copy(plan, shrink(replicas, s, all, []Set{newSet}, newSet.Replicas-replicas))
		if n, ok := plan[newSet.Name]; ok {
			newSet.Replicas = n
		}
	}

	// Scale old sets down, oldest first, as far as availability allows. A
	// set removes Machines that are not Ready first, so unhealthy old
	// Machines go before healthy ones without the planner choosing them.
	minAvailable := replicas - s.MaxUnavailable
	available := worstAvailable(newSet)
	for _, o := range old {
		available += worstAvailable(o)
	}
	budget := available - minAvailable
	for _, o := range old {
		if budget <= 0 {
			break
		}
		if down := min(budget, o.Replicas); down > 0 {
			plan[o.Name] = o.Replicas - down
			budget -= down
		}
	}
	return plan
}

// worstAvailable is how many of a set's available Machines are sure to
// survive its spec.replicas. A set above its spec removes Machines that are
// not Ready first, but one of those may become Ready before it acts, so any
// Machine it removes may be an available one. Counting only survivors keeps
// a planner that runs again before the set has acted from spending the same
// availability twice.
func worstAvailable(s Set) int32 {
	return max(0, s.Available-max(0, s.Live-s.Replicas))
}

// footprint is how many Machines a set holds or is about to create.
func footprint(s Set) int32 { return max(s.Replicas, s.Machines) }

func recreate(replicas int32, newSet Set, old []Set) Plan {
	plan := Plan{}
	gone := true
	for _, o := range old {
		if o.Replicas != 0 {
			plan[o.Name] = 0
		}
		if o.Machines > 0 || o.Replicas > 0 {
			gone = false
		}
	}
	if gone && newSet.Replicas != replicas {
		plan[newSet.Name] = replicas
	}
	return plan
}

// onDelete replaces an old Machine only once someone deleted it: each old
// set is held at the Machines it still has alive, so it never replaces
// one, and the new set fills the rest.
func onDelete(replicas int32, newSet Set, old []Set) Plan {
	plan := Plan{}
	remaining := replicas
	for _, o := range old {
		keep := min(o.Live, o.Replicas, max(remaining, 0))
		if keep != o.Replicas {
			plan[o.Name] = keep
		}
		remaining -= keep
	}
	if want := max(remaining, 0); want != newSet.Replicas {
		plan[newSet.Name] = want
	}
	return plan
}

// Proportional spreads a change of replicas over every set that still has
// Machines. Scaling up, the new total (replicas + maxSurge) is shared in
// proportion to the sets' sizes, as Kubernetes Deployments do, so a
// deployment scaled in the middle of a rollout keeps its ratio of old to new;
// what rounding leaves over goes to the newest set. Scaling down, Machines
// that are not available go first, newest set first, then available ones,
// largest set first, but only as far as replicas - maxUnavailable allows: a
// proportional cut could remove the available Machines of an old set while
// the new set's Machines are not up. The rest follows through the rollout
// planner as Machines become available. sets are oldest first, the newest
// last. It returns nil when at most one set has Machines: the planner sizes
// a single set itself.
func Proportional(replicas int32, s Strategy, sets []Set) Plan {
	var active []Set
	var total, held int32
	for _, set := range sets {
		held += footprint(set)
		if set.Replicas > 0 {
			active = append(active, set)
			total += set.Replicas
		}
	}
	if len(active) <= 1 {
		return nil
	}
	switch {
	case replicas+s.MaxSurge > total:
		// Machines still being deleted hold their place: grow only into
		// what they leave free.
		diff := replicas + s.MaxSurge - held
		if diff <= 0 {
			return nil
		}
		plan := Plan{}
		left := diff
		for _, set := range active {
			share := set.Replicas * diff / total
			plan[set.Name] = set.Replicas + share
			left -= share
		}
		plan[active[len(active)-1].Name] += left
		return plan
	case replicas+s.MaxSurge < total:
		return shrink(replicas, s, active, active, total-replicas-s.MaxSurge)
	}
	return nil
}

// shrink takes need Machines away from the candidate sets without taking
// availability below replicas - maxUnavailable, counted as worstAvailable
// counts it: a set may remove an available Machine where one that is not
// yet available was meant. Sets with Machines that are not available go
// first (the set removes those first, so usually nothing is lost), newest
// first, then the largest.
func shrink(replicas int32, s Strategy, active, candidates []Set, need int32) Plan {
	size := map[string]int32{}
	for _, set := range active {
		size[set.Name] = set.Replicas
	}
	worst := func() int32 {
		var n int32
		for _, set := range active {
			n += max(0, set.Available-max(0, set.Live-size[set.Name]))
		}
		return n
	}
	floor := replicas - s.MaxUnavailable
	order := slices.Clone(candidates)
	slices.Reverse(order)
	slices.SortStableFunc(order, func(a, b Set) int {
		ua, ub := a.Replicas > a.Available, b.Replicas > b.Available
		switch {
		case ua && !ub:
			return -1
		case ub && !ua:
			return 1
		case ua && ub:
			return 0 // both have Machines not up: newest first, as reversed
		}
		return int(b.Replicas - a.Replicas)
	})
	for _, set := range order {
		for need > 0 && size[set.Name] > 0 {
			size[set.Name]--
			if worst() < floor {
				size[set.Name]++
				break
			}
			need--
		}
	}
	plan := Plan{}
	for _, set := range active {
		if size[set.Name] != set.Replicas {
			plan[set.Name] = size[set.Name]
		}
	}
	return plan
}
