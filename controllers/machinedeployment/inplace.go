package machinedeployment

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/util/intstr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Member is what the in-place planner knows of one Machine of a
// deployment.
type Member struct {
	Name string
	// Set is the position of the owning set, oldest first; the newest,
	// the set of the current template, is the last.
	Set int
	// Current: the Machine's spec is the current template's (its update
	// was asked for, or it is done).
	Current bool
	// Running: the Machine is Running with no operation in flight, so an
	// update can start or has finished.
	Running bool
	// Updated: its Node runs the current template's version.
	Updated bool
	// Available: Ready for minReadySeconds.
	Available bool
	// Deleting: being deleted.
	Deleting bool
}

// InPlaceStep is what an in-place rollout does next.
type InPlaceStep struct {
	// Update names old Machines whose spec becomes the current
	// template's, which makes the Machine controller update them.
	Update []string
	// Move names updated Machines to hand over to the newest set.
	Move []string
}

// ResolveInPlace turns an InPlace strategy's maxUnavailable into a count
// for replicas: a percentage rounds down, but never below one, so that the
// rollout can always move.
func ResolveInPlace(s machinistv1.MachineDeploymentStrategy, replicas int32) (int32, error) {
	v := intstr.FromInt32(1)
	if s.InPlace != nil && s.InPlace.MaxUnavailable != nil {
		v = *s.InPlace.MaxUnavailable
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, int(replicas), false)
	if err != nil {
		return 0, err
	}
	return int32(max(n, 1)), nil
}

// NextInPlace plans one step of an in-place rollout over members, toward
// the newest set (newest is its position). Updated Machines of older sets
// that are available move to the newest set. Old Machines start updating
// only while the deployment's unavailable Machines, counting those asked to
// update that have not gone down yet, stay within maxUnavailable of
// replicas; Machines that are unavailable anyway go first, then the oldest
// sets' Machines, by name.
func NextInPlace(replicas, maxUnavailable int32, newest int, members []Member) InPlaceStep {
	var step InPlaceStep
	var available, pending int32
	var candidates []Member
	for _, m := range members {
		if m.Deleting {
			continue
		}
		if m.Available {
			available++
		}
		if m.Set == newest {
			continue
		}
		switch {
		case m.Current && m.Updated && m.Running && m.Available:
			step.Move = append(step.Move, m.Name)
		case m.Current && m.Available:
			// Asked to update, not down yet: it will be.
			pending++
		case !m.Current && m.Running:
			candidates = append(candidates, m)
		}
	}
	budget := maxUnavailable - (replicas - available) - pending
	slices.SortStableFunc(candidates, func(a, b Member) int {
		if a.Available != b.Available {
			if a.Available {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.Set, b.Set), cmp.Compare(a.Name, b.Name))
	})
	for _, m := range candidates {
		if m.Available {
			if budget <= 0 {
				break
			}
			budget--
		}
		step.Update = append(step.Update, m.Name)
	}
	slices.Sort(step.Move)
	return step
}

// inPlaceSizes keeps the sets of an in-place rollout summing to replicas:
// Machines move between sets through the handover, which keeps the sum,
// so only a change of replicas resizes. More goes to the newest set, whose
// new Machines are made from the current template; fewer comes from the
// oldest sets first, whose Machines are still to be updated.
func inPlaceSizes(replicas int32, newSet Set, old []Set) Plan {
	total := newSet.Replicas
	for _, o := range old {
		total += o.Replicas
	}
	plan := Plan{}
	switch {
	case total < replicas:
		plan[newSet.Name] = newSet.Replicas + replicas - total
	case total > replicas:
		need := total - replicas
		for _, o := range old {
			if take := min(need, o.Replicas); take > 0 {
				plan[o.Name] = o.Replicas - take
				need -= take
			}
		}
		if need > 0 {
			plan[newSet.Name] = newSet.Replicas - need
		}
	}
	return plan
}
