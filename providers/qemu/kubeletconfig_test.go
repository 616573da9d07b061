package qemu

import (
	"testing"

	"sigs.k8s.io/yaml"
)

func TestARealNodesKubeletTakesTheProvidersLease(t *testing.T) {
	for _, c := range []struct {
		lease int32
		want  any
	}{
		{0, nil},
		{15, float64(15)},
	} {
		var cfg map[string]any
		if err := yaml.Unmarshal([]byte(kubeletConfigWith(c.lease)), &cfg); err != nil {
			t.Fatalf("lease %d: %v", c.lease, err)
		}
		if cfg["kind"] != "KubeletConfiguration" {
			t.Errorf("lease %d: kind %v", c.lease, cfg["kind"])
		}
		if got := cfg["nodeLeaseDurationSeconds"]; got != c.want {
			t.Errorf("lease %d: nodeLeaseDurationSeconds %v, want %v", c.lease, got, c.want)
		}
	}
	// The provider hands its Lease to the node files it was given,
	// without changing the caller's.
	given := NodeDir(t.TempDir())
	got := Options{Node: given, LeaseDurationSeconds: 15}.nodeFiles()
	if got.leaseSeconds != 15 || got.Bin != given.Bin {
		t.Errorf("node files %+v", got)
	}
	if given.leaseSeconds != 0 {
		t.Error("the caller's NodeFiles changed")
	}
	if (Options{}).nodeFiles() != nil {
		t.Error("node files without any given")
	}
}
