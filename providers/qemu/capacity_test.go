package qemu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/process"
	"github.com/machinist-dev/machinist/providers/qemu/guest"
)

// initArgs are the arguments the guest's init gets: the words after "--"
// on the kernel command line in args, split as the kernel splits them.
func initArgs(t testing.TB, args []string) []string {
	t.Helper()
	i := slices.Index(args, "-append")
	if i < 0 || i+1 == len(args) {
		t.Fatalf("no -append in %q", args)
	}
	_, after, ok := strings.Cut(args[i+1], " -- ")
	if !ok {
		t.Fatalf("no -- in the kernel command line %q", args[i+1])
	}
	return strings.Fields(after)
}

// settled is a vms whose initramfs and accelerator are settled, so that
// Command builds and probes nothing, with a guest binary that fits.
func settled(t testing.TB) (*vms, string) {
	t.Helper()
	dir := t.TempDir()
	bin, initrd := filepath.Join(dir, "machinist"), filepath.Join(dir, "initrd")
	for _, f := range []string{bin, initrd} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	machine := filepath.Join(dir, "machine")
	if err := os.Mkdir(machine, 0o755); err != nil {
		t.Fatal(err)
	}
	return &vms{opts: Options{GuestBinary: bin}, initrd: map[string]string{GuestAgent: initrd}, accel: AccelTCG}, machine
}

func quantities(pairs ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(pairs); i += 2 {
		out[corev1.ResourceName(pairs[i])] = resource.MustParse(pairs[i+1])
	}
	return out
}

// A class's capacity reaches the guest's kernel command line, which is
// split at spaces into its init's arguments: a resource name with a space
// in it would be another flag for the agent. Only resource names and
// canonical quantities are written; anything else is refused by Check, and
// by Command, permanently, before anything is made.
func TestOnlyResourceNamesAndQuantitiesReachTheKernelCommandLine(t *testing.T) {
	h, dir := settled(t)
	spec := []byte(`{"cpus":2,"memory":"0.5Gi"}`)
	boot := func(c corev1.ResourceList) process.Boot {
		return process.Boot{Dir: dir, ProviderID: "qemu:///ns/m/0b5c", NodeName: "m-0b5c", Version: "v1.37.2", Capacity: c, Spec: spec}
	}
	for what, c := range map[string]corev1.ResourceList{
		"a name with a space and a flag":        quantities("example.com/gpu --node-name=other", "1"),
		"a name with a tab":                     quantities("gpu\t--provider-id=x", "1"),
		"a name that lists two resources":       quantities("cpu=64,memory", "1"),
		"an empty name":                         quantities("", "1"),
		"a name part of 64 characters":          quantities("example.com/"+strings.Repeat("g", 64), "1"),
		"an upper-case prefix":                  quantities("Example.com/gpu", "1"),
		"two slashes":                           quantities("example.com/a/b", "1"),
		"a name ending in a dot":                quantities("gpu.", "1"),
		"a negative quantity":                   quantities("example.com/gpu", "-1"),
		"a good name beside a bad one":          quantities("cpu", "2", "memory --x", "1Gi"),
		"a quote, which the kernel also splits": quantities(`a"b`, "1"),
	} {
		if err := h.Check(spec, c, ""); err == nil {
			t.Errorf("%s: Check accepted %v", what, c)
		}
		cmd, err := h.Command(boot(c))
		if err == nil || !providers.IsPermanent(err) {
			t.Errorf("%s: Command gave %v and %v, want a permanent error", what, cmd, err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Fatalf("%s: Command made %v before it refused", what, entries)
		}
	}

	c := quantities("cpu", "1.5", "nvidia.com/gpu", "1", "hugepages-2Mi", "1024Mi", "example.com/Fast_NIC.v2", "1e3", "pods", "0")
	if err := h.Check(spec, c, ""); err != nil {
		t.Fatal(err)
	}
	cmd, err := h.Command(boot(c))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"agent",
		"--bootstrap-kubeconfig=" + guest.BootstrapKubeconfig,
		"--kubeconfig=" + guest.Kubeconfig,
		"--node-name=m-0b5c",
		"--provider-id=qemu:///ns/m/0b5c",
		"--version=v1.37.2",
		"--host-info",
		// Sorted, each quantity canonical (1.5 is 1500m, 1024Mi is
		// 1Gi, an exponent stays one); the class's cpu over the VM's,
		// the VM's memory where the class says none.
		"--capacity=cpu=1500m,example.com/Fast_NIC.v2=1e3,hugepages-2Mi=1Gi,memory=512Mi,nvidia.com/gpu=1,pods=0",
	}
	if got := initArgs(t, cmd.Args[1:]); !slices.Equal(got, want) {
		t.Errorf("the guest's init is given\n%q\nwant\n%q", got, want)
	}

	// Without a capacity of the class's, the VM's own.
	cmd, err = h.Command(boot(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := initArgs(t, cmd.Args[1:]); !slices.Contains(got, "--capacity=cpu=2,memory=512Mi") {
		t.Errorf("the guest's init is given %q, want the VM's 2 CPUs and 512Mi", got)
	}
}

// Whatever else the agent is given on the kernel command line stays one
// word, or the boot is refused: a version the schema did not check (a
// machine recorded before it did) cannot add a flag either.
func TestEveryAgentFlagStaysOneWord(t *testing.T) {
	h, dir := settled(t)
	for _, version := range []string{"v1.37.2 --provider-id=qemu:///other/m/1", `v1"`, "v1\n"} {
		_, err := h.Command(process.Boot{Dir: dir, ProviderID: "qemu:///ns/m/0b5c", NodeName: "m", Version: version})
		if err == nil || !providers.IsPermanent(err) {
			t.Errorf("version %q: got %v, want a permanent error", version, err)
		}
	}
	if _, err := h.Command(process.Boot{Dir: dir, ProviderID: "qemu:///ns/m/0b5c", NodeName: "m", Version: "v1.38.0-rc.1+k3s1"}); err != nil {
		t.Errorf("a version of every part: %v", err)
	}
}
