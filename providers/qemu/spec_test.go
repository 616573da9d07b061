package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/process"
)

func TestProviderSpecs(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want Spec
		err  string
	}{
		{"", Spec{CPUs: 1, Memory: "256Mi", Guest: GuestAgent}, ""},
		{`{}`, Spec{CPUs: 1, Memory: "256Mi", Guest: GuestAgent}, ""},
		{`{"cpus":2,"memory":"1Gi"}`, Spec{CPUs: 2, Memory: "1Gi", Guest: GuestAgent}, ""},
		{`{"memory":"1Gi","guest":"kubelet"}`, Spec{CPUs: 1, Memory: "1Gi", Guest: GuestKubelet}, ""},
		{`{"guest":"kubelet"}`, Spec{}, "a kubelet guest needs at least 1Gi"},
		{`{"guest":"systemd"}`, Spec{}, `guest "systemd": want agent`},
		{`{"cpu":2}`, Spec{}, `unknown field "cpu"`},
		{`{"cpus":0.5}`, Spec{}, "cannot unmarshal"},
		{`{"cpus":65}`, Spec{}, "cpus 65: want 1 to 64"},
		{`{"memory":"lots"}`, Spec{}, `memory "lots"`},
		{`{"memory":"128Mi"}`, Spec{}, "memory 128Mi: want 256Mi to 64Gi"},
		{`[1]`, Spec{}, "cannot unmarshal"},
	} {
		got, err := parseSpec([]byte(c.raw))
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.raw, err)
		case c.err == "" && got != c.want:
			t.Errorf("%s: got %+v, want %+v", c.raw, got, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: got error %v, want one saying %q", c.raw, err, c.err)
		}
	}
}

// A bad provider spec, or a guest binary too big for the VM, fails the
// boot permanently: no retry brings a VM that boots.
func TestCommandRefusesWhatCannotBoot(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "machinist")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(121 << 20); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	// Settled already, so that no initramfs is built.
	h := &vms{opts: Options{GuestBinary: big}, initrd: map[string]string{GuestAgent: "initrd"}, accel: AccelTCG}
	for spec, want := range map[string]string{
		`{"memory":"256Mi"}`: "does not fit a VM of 256Mi",
		`{"cpus":-1}`:        "cpus -1",
	} {
		_, err := h.Command(process.Boot{Dir: dir, Spec: []byte(spec)})
		if err == nil || !strings.Contains(err.Error(), want) || !providers.IsPermanent(err) {
			t.Errorf("%s: got %v, want a permanent error saying %q", spec, err, want)
		}
	}
	if err := h.fits(Spec{CPUs: 1, Memory: "512Mi"}); err != nil {
		t.Errorf("512Mi: %v", err)
	}

	// A real node's files count too, the images a user added among them.
	node := NodeDir(filepath.Join(dir, "node"))
	for _, f := range append(append([]string{}, nodeBinaries...), "cni/bridge", "cni/host-local", "cni/loopback", "cni/portmap", "images/huge.tar") {
		path := filepath.Join(node.Bin, f)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Truncate(filepath.Join(node.Images, "huge.tar"), 400<<20); err != nil {
		t.Fatal(err)
	}
	h.opts.Node = node
	_, err = h.Command(process.Boot{Dir: dir, Spec: []byte(`{"memory":"1Gi","guest":"kubelet"}`)})
	if err == nil || !strings.Contains(err.Error(), "a real node's initramfs (529 MiB") || !providers.IsPermanent(err) {
		t.Errorf("a real node too small for its images: got %v", err)
	}
	if err := h.fits(Spec{CPUs: 1, Memory: "2Gi", Guest: GuestKubelet}); err != nil {
		t.Errorf("2Gi: %v", err)
	}
}

func TestOwnerKnowsItsVMsByTheirCommandLine(t *testing.T) {
	h := &vms{opts: Options{}}
	id := "qemu:///ns/m/0b5c"
	args, err := h.args(process.Boot{ProviderID: id, NodeName: "n", Version: "v1"}, Spec{CPUs: 1, Memory: "256Mi"}, "initrd", AccelTCG)
	if err != nil {
		t.Fatal(err)
	}
	argv := append([]string{"/usr/bin/qemu-system-x86_64"}, args...)
	if got := h.Owner(argv); got != id {
		t.Errorf("Owner = %q, want %q", got, id)
	}
	for _, other := range [][]string{
		{"/usr/bin/machinist", "agent", "--provider-id=" + id},
		{"/usr/bin/qemu-system-x86_64", "-append", "console=ttyS0"},
		{},
	} {
		if got := h.Owner(other); got != "" {
			t.Errorf("Owner(%q) = %q, want none", other, got)
		}
	}
}

func TestTheNewestKernelIsTheHighestVersion(t *testing.T) {
	for _, c := range []struct{ older, newer string }{
		{"6.1.0-9-cloud-amd64", "6.1.0-48-cloud-amd64"},
		{"6.1.0-48-cloud-amd64", "6.12.0-1-cloud-amd64"},
		{"5.10.0-30-amd64", "6.1.0-1-amd64"},
		{"6.1.0", "6.1.0-1"},
	} {
		if !olderVersion(c.older, c.newer) || olderVersion(c.newer, c.older) {
			t.Errorf("%s should be older than %s", c.older, c.newer)
		}
	}
}

// A file among the kubelets that never answers its --version is given
// up on, with the file named, rather than holding every real node's boot.
func TestAKubeletThatNeverAnswersIsGivenUpOn(t *testing.T) {
	defer func(d time.Duration) { kubeletVersionTimeout = d }(kubeletVersionTimeout)
	kubeletVersionTimeout = 500 * time.Millisecond
	path := filepath.Join(t.TempDir(), "stuck")
	if err := os.WriteFile(path, []byte("#!/bin/sh\nsleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err := kubeletVersion(path)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("got %v, want an error naming %s", err, path)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("gave up after %v, want about the timeout and the wait for its output", took)
	}
}

// fakeKubelet writes an executable at path that prints what a kubelet
// of version prints for --version, and adds a line to runs each time.
func fakeKubelet(t *testing.T, runs, path, version string) {
	t.Helper()
	script := "#!/bin/sh\necho >> " + runs + "\necho Kubernetes " + version + "\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// The kubelets are found by what they print, Bin's first; a version none
// is of is refused naming those there are, the files that are no
// kubelet, and where to add one; the files are run again only once they
// changed, so that asking for versions that are not there runs nothing,
// and a kubelet added or replaced later is found.
func TestKubeletsAreFoundByTheirVersion(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(t.TempDir(), "runs")
	ran := func() int {
		b, _ := os.ReadFile(runs)
		return strings.Count(string(b), "\n")
	}
	node := NodeDir(dir)
	if err := os.Mkdir(node.Kubelets, 0o755); err != nil {
		t.Fatal(err)
	}
	fakeKubelet(t, runs, filepath.Join(dir, "kubelet"), "v1.37.2")
	fakeKubelet(t, runs, filepath.Join(node.Kubelets, "old"), "v1.36.3")
	// Of the same version as Bin's: Bin's is kept.
	fakeKubelet(t, runs, filepath.Join(node.Kubelets, "same"), "v1.37.2")
	// No kubelet, and a long answer: only its start is said.
	if err := os.WriteFile(filepath.Join(node.Kubelets, "junk"), []byte("#!/bin/sh\necho hello; yes | head -c 100000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := &vms{opts: Options{Node: node}}
	for version, want := range map[string]string{
		"v1.37.2": filepath.Join(dir, "kubelet"),
		"v1.36.3": filepath.Join(node.Kubelets, "old"),
	} {
		if got, err := h.kubeletFor(version); err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", version, got, err, want)
		}
	}
	if n := ran(); n != 3 {
		t.Errorf("the three kubelets ran %d times for two lookups, want once each", n)
	}
	for range 5 {
		_, err := h.kubeletFor("v1.38.0")
		for _, want := range []string{`(it holds v1.36.3, v1.37.2), and the Machine asks for "v1.38.0"`, "in " + node.Kubelets,
			filepath.Join(node.Kubelets, "junk") + ` --version printed "hello\ny\ny`} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("v1.38.0: got %v, want an error saying %q", err, want)
			}
		}
		if err != nil && len(err.Error()) > 1000 {
			t.Errorf("v1.38.0: an error of %d bytes: %.200s...", len(err.Error()), err)
		}
	}
	if n := ran(); n != 3 {
		t.Errorf("the kubelets ran %d times, want 3: a version that is not there ran them again though none changed", n)
	}
	fakeKubelet(t, runs, filepath.Join(node.Kubelets, "new"), "v1.38.0")
	if got, err := h.kubeletFor("v1.38.0"); err != nil || got != filepath.Join(node.Kubelets, "new") {
		t.Errorf("v1.38.0 once added: got %q, %v", got, err)
	}
	// Bin's kubelet replaced by another version: the new one is what it
	// is, though the version asked for was known.
	fakeKubelet(t, runs, filepath.Join(dir, "kubelet"), "v1.39.0")
	if got, err := h.kubeletFor("v1.37.2"); err != nil || got != filepath.Join(node.Kubelets, "same") {
		t.Errorf("v1.37.2 once Bin's kubelet is v1.39.0: got %q, %v; want the other of v1.37.2", got, err)
	}
	// Without a directory of other kubelets, Bin's alone, and the error
	// says what to give.
	h = &vms{opts: Options{Node: &NodeFiles{Bin: dir}}}
	if _, err := h.kubeletFor("v1.36.3"); err == nil || !strings.Contains(err.Error(), "(it holds v1.39.0)") || !strings.Contains(err.Error(), "NodeFiles.Kubelets") {
		t.Errorf("no kubelets directory: got %v", err)
	}
}
