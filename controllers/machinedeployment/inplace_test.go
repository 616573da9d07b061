package machinedeployment

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func TestResolveInPlace(t *testing.T) {
	for _, tc := range []struct {
		v        *intstr.IntOrString
		replicas int32
		want     int32
	}{
		{nil, 10, 1},
		{ptr.To(intstr.FromInt32(3)), 10, 3},
		{ptr.To(intstr.FromString("25%")), 10, 2},
		{ptr.To(intstr.FromString("5%")), 10, 1},
		{ptr.To(intstr.FromString("100%")), 7, 7},
	} {
		s := machinistv1.MachineDeploymentStrategy{Type: machinistv1.InPlaceStrategy}
		if tc.v != nil {
			s.InPlace = &machinistv1.InPlaceUpdate{MaxUnavailable: tc.v}
		}
		got, err := ResolveInPlace(s, tc.replicas)
		if err != nil || got != tc.want {
			t.Errorf("maxUnavailable %v of %d: %d, %v; want %d", tc.v, tc.replicas, got, err, tc.want)
		}
	}
}

func TestNextInPlace(t *testing.T) {
	up := func(name string, set int) Member {
		return Member{Name: name, Set: set, Running: true, Available: true}
	}
	for _, tc := range []struct {
		name           string
		replicas, max  int32
		members        []Member
		update, moving []string
	}{
		{
			name:     "starts as many as maxUnavailable allows, oldest set first",
			replicas: 4, max: 2,
			members: []Member{up("b1", 1), up("a2", 0), up("a1", 0), up("b2", 1)},
			update:  []string{"a1", "a2"},
		},
		{
			name:     "counts Machines asked to update that are still up",
			replicas: 4, max: 2,
			members: []Member{{Name: "a1", Current: true, Running: true, Available: true}, up("a2", 0), up("a3", 0), up("a4", 0)},
			update:  []string{"a2"},
		},
		{
			name:     "counts Machines down as unavailable",
			replicas: 4, max: 2,
			members: []Member{{Name: "a1", Current: true}, {Name: "a2", Current: true}, up("a3", 0), up("a4", 0)},
		},
		{
			name:     "updates Machines that are down anyway at no cost",
			replicas: 3, max: 1,
			members: []Member{{Name: "a1", Running: true}, up("a2", 0), {Name: "a3", Current: true}},
			update:  []string{"a1"},
		},
		{
			name:     "moves updated available Machines to the newest set",
			replicas: 3, max: 1,
			members: []Member{
				{Name: "a1", Current: true, Updated: true, Running: true, Available: true},
				{Name: "a2", Current: true, Updated: true, Running: true},
				up("a3", 0),
			},
			update: nil, moving: []string{"a1"},
		},
		{
			name:     "leaves the newest set's Machines and deleting ones alone",
			replicas: 2, max: 2,
			members: []Member{{Name: "n1", Set: 1, Running: true, Available: true}, {Name: "a1", Running: true, Available: true, Deleting: true}},
			update:  nil,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NextInPlace(tc.replicas, tc.max, 1, tc.members)
			if !equal(got.Update, tc.update) || !equal(got.Move, tc.moving) {
				t.Errorf("update %v, move %v; want update %v, move %v", got.Update, got.Move, tc.update, tc.moving)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
