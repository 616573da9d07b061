package machineset

import (
	"math/rand/v2"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// deleteRank orders Machines for removal: lower goes first. unsure tells
// a Machine whose deletion may already have been stored.
func deleteRank(m *machinistv1.Machine, unsure func(*machinistv1.Machine) bool) int {
	switch {
	case !m.DeletionTimestamp.IsZero(), unsure != nil && unsure(m):
		return 0
	case hasAnnotation(m, machinistv1.DeleteMachineAnnotation):
		return 1
	case m.Status.Phase == machinistv1.MachineFailed:
		return 2
	case m.Status.Phase != machinistv1.MachineRunning || !meta.IsStatusConditionTrue(m.Status.Conditions, machinistv1.ConditionReady):
		return 3
	default:
		return 4
	}
}

func hasAnnotation(m *machinistv1.Machine, key string) bool {
	_, ok := m.Annotations[key]
	return ok
}

// pickForDeletion returns the n Machines to remove: those already
// deleting (or, by unsure, perhaps deleting), then those marked with machinistv1.DeleteMachineAnnotation, then Failed
// ones, then those not Running and Ready, and among equals the order the
// policy gives. rnd shuffles for the Random policy.
func pickForDeletion(machines []*machinistv1.Machine, n int, policy machinistv1.DeletePolicy, rnd *rand.Rand, unsure func(*machinistv1.Machine) bool) []*machinistv1.Machine {
	if n <= 0 {
		return nil
	}
	ordered := slices.Clone(machines)
	if policy == machinistv1.DeleteRandom || policy == "" {
		rnd.Shuffle(len(ordered), func(i, j int) { ordered[i], ordered[j] = ordered[j], ordered[i] })
	}
	slices.SortStableFunc(ordered, func(a, b *machinistv1.Machine) int {
		if ra, rb := deleteRank(a, unsure), deleteRank(b, unsure); ra != rb {
			return ra - rb
		}
		switch policy {
		case machinistv1.DeleteNewest:
			return compareTime(b.CreationTimestamp, a.CreationTimestamp, b.Name, a.Name)
		case machinistv1.DeleteOldest:
			return compareTime(a.CreationTimestamp, b.CreationTimestamp, a.Name, b.Name)
		}
		return 0
	})
	return ordered[:min(n, len(ordered))]
}

// compareTime orders by time, then name, so that Machines created in the
// same second still have one order.
func compareTime(a, b metav1.Time, an, bn string) int {
	switch {
	case a.Before(&b):
		return -1
	case b.Before(&a):
		return 1
	case an < bn:
		return -1
	case an > bn:
		return 1
	}
	return 0
}
