// Package qemu is a provider whose machines are QEMU VMs booting a real
// Linux kernel: the host's packaged one (Debian's linux-image-cloud-amd64
// here), with an initramfs the provider builds around the static
// machinist binary, which runs as the VM's init (package guest) and
// starts the node agent. The Node reports the guest kernel's version and
// boot ID. Each Machine is one directory of the state directory:
//
//	<StateDir>/<namespace>_<name>_<uid>/
//	    state.json     the provider's record (package process keeps it)
//	    disk.img       the machine's own disk (ext4): its Node credentials
//	                   and whatever else must survive a reboot
//	    join           the join data (0600), given to the guest through
//	                   QEMU's fw_cfg as a cloud gives user data
//	    qmp.sock       the VM's QMP socket
//	    console.log    the serial console of the running boot, and
//	    console.log.1  of the boot before
//	    qemu.log       QEMU's own messages
//	    disk.img.next, join.next  a repair's fresh disk and join data,
//	                   until its wipe puts them in place
//	<StateDir>/boot/   the initramfs images, one per guest binary
//
// Every boot is one QEMU process, run with -no-reboot: a reboot ends it
// and the provider starts the next, so that the books package process
// keeps for its agent processes (write-ahead operations, adoption of the
// VMs a previous provider left, at most one boot per machine) hold for
// VMs unchanged. A soft reboot is Ctrl-Alt-Del through QMP, on which the
// guest's init stops the agent, unmounts the disk and restarts; a hard one
// is QMP system_reset. kill -9 of a QEMU process is a power loss.
//
// A class may instead ask for a real node (providerSpec guest: kubelet):
// the initramfs then also holds Kubernetes' kubelet, containerd, runc,
// the CNI plugins and the images the node imports at boot (NodeFiles,
// built by make node), and the guest's init runs containerd and the
// kubelet instead of the agent. The kubelet joins by its own TLS
// bootstrap from the same join data.
//
// The guest reaches kube-apiserver through QEMU's user-mode network, where
// 10.0.2.2 is the host's loopback: a join data's server on the host's
// loopback is reached there, and TLS still verifies the name the server's
// certificate was issued for (the kubeconfig's tls-server-name).
package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/machinist-dev/machinist/internal/strictjson"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/nodeagent"
	"github.com/machinist-dev/machinist/providers/process"
	"github.com/machinist-dev/machinist/providers/qemu/guest"
)

// Name is the provider name MachineClasses use for this provider.
const Name = "qemu"

// Files in a machine's directory.
const (
	diskFile    = "disk.img"
	joinFile    = "join"
	qmpSocket   = "qmp.sock"
	consoleFile = "console.log"
	qemuLog     = "qemu.log"
	nextSuffix  = ".next"
)

// Defaults of a machine's provider spec.
const (
	DefaultCPUs   = 1
	DefaultMemory = "256Mi"
	// diskSize is each machine's disk: a sparse file, mostly empty.
	diskSize = "4G"
)

// DefaultStopTimeout is how long a VM has to end after it was asked to:
// an orderly restart under TCG takes a few seconds.
const DefaultStopTimeout = 30 * time.Second

// Accelerators QEMU can run the VMs with.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// Options configure a Provider. Like the process provider's, it holds no
// credentials for any cluster.
type Options struct {
	// StateDir holds one directory per machine (see the package doc).
	// Required; created if missing.
	StateDir string
	// GuestBinary is the static machinist binary each VM runs as its
	// init; empty means this process's own executable.
	GuestBinary string
	// QEMU is the qemu-system-x86_64 binary; empty means the one on PATH.
	QEMU string
	// Kernel is what the VMs boot; zero means FindKernel's.
	Kernel Kernel
	// Accel is AccelKVM or AccelTCG; empty means KVM if a probe boot
	// under KVM reaches the guest's init within ProbeTimeout, else TCG.
	Accel string
	// ProbeTimeout bounds the KVM probe boot; zero means 15 s.
	ProbeTimeout time.Duration
	// LeaseDurationSeconds and RenewInterval are the Nodes' Lease
	// duration and renewal period; zero means the agent's defaults. A
	// real node's kubelet takes LeaseDurationSeconds (zero: Kubernetes'
	// 40) and renews at a quarter of it, as kubelets do.
	LeaseDurationSeconds int32
	RenewInterval        time.Duration
	// StopTimeout is how long a VM has to end once asked before its QEMU
	// process is killed; zero means DefaultStopTimeout.
	StopTimeout time.Duration
	// ExitWithParent kills the VMs when this process dies (machinist
	// run, whose control plane dies with it); off, they outlive it and a
	// new Provider adopts them.
	ExitWithParent bool
	// Log says which accelerator was chosen and why.
	Log logr.Logger
	// Node is what a real node's guest holds besides the machinist
	// binary; nil means a class may not ask for that guest.
	Node *NodeFiles
}

// nodeFiles is a copy of o.Node (the caller's may serve another
// provider) whose kubelet takes o's Lease duration, or nil.
func (o Options) nodeFiles() *NodeFiles {
	if o.Node == nil {
		return nil
	}
	node := *o.Node
	node.leaseSeconds = o.LeaseDurationSeconds
	return &node
}

// NodeFiles are the files of a real node's guest (Spec.Guest
// GuestKubelet), built from the project's pinned modules.
type NodeFiles struct {
	// Bin holds kubelet, containerd, containerd-shim-runc-v2, runc and
	// ctr, and CNIBin the CNI plugins (bridge, host-local, loopback).
	Bin, CNIBin string
	// Images holds OCI image archives (*.tar) imported into each VM's
	// containerd at boot: the pod sandbox's and any a user adds.
	Images string
	// Kubelets, when set, holds kubelets of other versions than Bin's,
	// each a static binary (any name): a Machine of one of their
	// versions boots it, and an update in place boots the new one.
	Kubelets string

	// kubelet, when set, is the kubelet an initramfs holds instead of
	// Bin's (withKubelet).
	kubelet string

	// leaseSeconds is the kubelet's nodeLeaseDurationSeconds: the
	// provider's LeaseDurationSeconds, set by New.
	leaseSeconds int32
}

// The guests a class may boot (Spec.Guest).
const (
	// GuestAgent runs the node agent, Machinist's stand-in for the
	// kubelet: small and quick under TCG.
	GuestAgent = "agent"
	// GuestKubelet runs containerd and Kubernetes' own kubelet.
	GuestKubelet = "kubelet"
)

// Spec is a MachineClass's providerSpec for this provider.
type Spec struct {
	// CPUs is the VM's vCPU count; zero means DefaultCPUs.
	CPUs int `json:"cpus,omitempty"`
	// Memory is the VM's memory, a quantity such as 512Mi; empty means
	// DefaultMemory.
	Memory string `json:"memory,omitempty"`
	// Guest is GuestAgent (empty means it) or GuestKubelet.
	Guest string `json:"guest,omitempty"`
}

// New makes a Provider: the process provider's books over VMs. It finds
// the kernel and QEMU now, so that a host missing either fails at once
// with what to install; the initramfs and the accelerator are settled on
// the first boot.
func New(opts Options) (*process.Provider, error) {
	if opts.StateDir == "" {
		return nil, errors.New("qemu: Options needs a StateDir")
	}
	var err error
	if opts.StateDir, err = filepath.Abs(opts.StateDir); err != nil {
		return nil, err
	}
	if opts.QEMU == "" {
		if opts.QEMU, err = exec.LookPath("qemu-system-x86_64"); err != nil {
			return nil, errors.New("qemu: no qemu-system-x86_64 on PATH: install QEMU (Debian: apt-get install qemu-system-x86)")
		}
	}
	mkfs, err := findMkfs()
	if err != nil {
		return nil, err
	}
	if opts.Kernel == (Kernel{}) {
		if opts.Kernel, err = FindKernel(); err != nil {
			return nil, fmt.Errorf("qemu: %w", err)
		}
	}
	if opts.GuestBinary == "" {
		if opts.GuestBinary, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("qemu: finding the guest binary: %w", err)
		}
	}
	switch opts.Accel {
	case "", AccelKVM, AccelTCG:
	default:
		return nil, fmt.Errorf("qemu: accelerator %q: want %s, %s or empty to probe", opts.Accel, AccelKVM, AccelTCG)
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = 15 * time.Second
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	opts.Node = opts.nodeFiles()
	return process.New(process.Options{
		StateDir:       opts.StateDir,
		StopTimeout:    opts.StopTimeout,
		ExitWithParent: opts.ExitWithParent,
		Hardware:       &vms{opts: opts, mkfs: mkfs},
	})
}

// vms is the process.Hardware of VMs.
type vms struct {
	opts Options
	// mkfs is mkfs.ext4, which makes the disks.
	mkfs string

	// mu guards what every boot needs, settled by the first boot that
	// succeeds in settling it and kept for the Provider's life: the
	// initramfs and the accelerator.
	mu     sync.Mutex
	initrd map[string]string // by Spec.Guest and a real node's kubelet
	accel  string
	// kubelets are the real node's kubelets by version, as last read,
	// with the files that were none (skipped) and what the files were
	// then (stamp, NodeFiles.kubeletsStamp).
	kubelets map[string]string
	skipped  []error
	stamp    string
}

var _ process.Hardware = (*vms)(nil)

func (*vms) Name() string { return Name }

// Check refuses a provider spec it does not know, a capacity the kernel
// command line cannot carry (capacityArg), a VM too small for its guest
// binary, or a real node of a version whose kubelet it was not given.
func (h *vms) Check(raw json.RawMessage, capacity corev1.ResourceList, version string) error {
	_, _, err := h.check(raw, capacity, version)
	return err
}

// check is Check, which also says the spec and, for a real node, the
// path of the kubelet of version it boots.
func (h *vms) check(raw json.RawMessage, capacity corev1.ResourceList, version string) (spec Spec, kubelet string, err error) {
	if spec, err = parseSpec(raw); err != nil {
		return spec, "", err
	}
	if _, err := capacityArg(capacity, spec); err != nil {
		return spec, "", fmt.Errorf("qemu: %w", err)
	}
	if spec.Guest == GuestKubelet && h.opts.Node == nil {
		return spec, "", fmt.Errorf("qemu: the class asks for a %s guest, and this provider was started without its files: give it --qemu-node-dir with what make node builds", GuestKubelet)
	}
	if err := h.fits(spec); err != nil {
		return spec, "", err
	}
	if spec.Guest == GuestKubelet {
		// A real node runs the kubelet of its version, whatever the
		// Machine asks: a Node that never reports the Machine's version
		// would hold its create or its update for good.
		if kubelet, err = h.kubeletFor(version); err != nil {
			return spec, "", err
		}
	}
	return spec, kubelet, nil
}

// prepare builds the initramfs of the guest kind (and, for a real node,
// of the kubelet at path kubelet) and picks the accelerator, once they
// are built and picked; a failure (a full disk, say) is the caller's to
// retry.
func (h *vms) prepare(kind, kubelet string) (initrd, accel string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.initrd == nil {
		h.initrd = map[string]string{}
	}
	key := kind
	if kubelet != "" {
		key += "\x00" + kubelet
	}
	// Built again if its file went: another provider's build over the
	// same state directory prunes the images of other binaries.
	if _, err := os.Stat(h.initrd[key]); h.initrd[key] == "" || err != nil {
		r := initramfs{kernel: h.opts.Kernel, binary: h.opts.GuestBinary,
			osImage: "Machinist guest (Linux " + h.opts.Kernel.Version + ")"}
		if kind == GuestKubelet {
			r.node = h.opts.Node.withKubelet(kubelet)
		}
		path, err := r.build(filepath.Join(h.opts.StateDir, "boot"))
		if err != nil {
			return "", "", fmt.Errorf("building the initramfs: %w", err)
		}
		h.initrd[key] = path
	}
	if h.accel == "" {
		h.accel = h.chooseAccel(h.initrd[key])
	}
	return h.initrd[key], h.accel, nil
}

func (h *vms) Command(b process.Boot) (*exec.Cmd, error) {
	// Checked at Create; checked again, for the guest binary may have
	// been replaced by one that does not fit since, and a machine made
	// before capacities were checked may have one that is not written.
	spec, kubelet, err := h.check(b.Spec, b.Capacity, b.Version)
	if err != nil {
		return nil, providers.Permanent(err)
	}
	initrd, accel, err := h.prepare(spec.Guest, kubelet)
	if err != nil {
		return nil, err
	}
	// One console log per boot, and the one before it: a crash's last
	// words survive the next boot.
	console := filepath.Join(b.Dir, consoleFile)
	if err := os.Rename(console, console+".1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	log, err := os.OpenFile(filepath.Join(b.Dir, qemuLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	if spec.Guest == GuestKubelet {
		if _, err := kubeletPort(b.Dir); err != nil {
			_ = log.Close()
			return nil, fmt.Errorf("qemu: a port for the kubelet: %w", err)
		}
	}
	args, err := h.args(b, spec, initrd, accel)
	if err != nil {
		_ = log.Close()
		return nil, providers.Permanent(err)
	}
	cmd := exec.Command(h.opts.QEMU, args...)
	cmd.Dir = b.Dir
	cmd.Stdout, cmd.Stderr = log, log
	return cmd, nil
}

// args are QEMU's arguments for one boot. The machine's files are named
// relative to its directory, QEMU's working directory, so that a deep
// state directory cannot make the QMP socket's path too long.
//
// The agent's flags go on the kernel command line, which the guest's
// kernel splits at spaces (and quotes) into its init's arguments: a word
// that holds one would be more than one flag. Each word is built from a
// fixed vocabulary (capacityArg), and one that still holds a space, a
// quote or a control character is refused rather than written.
func (h *vms) args(b process.Boot, spec Spec, initrd, accel string) ([]string, error) {
	mem, err := resource.ParseQuantity(spec.Memory)
	if err != nil {
		return nil, fmt.Errorf("qemu: memory %q: %w", spec.Memory, err)
	}
	capacity, err := capacityArg(b.Capacity, spec)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	agent := []string{"agent",
		"--bootstrap-kubeconfig=" + guest.BootstrapKubeconfig,
		"--kubeconfig=" + guest.Kubeconfig,
		"--node-name=" + b.NodeName,
		"--provider-id=" + b.ProviderID,
		"--version=" + b.Version,
		"--host-info",
		"--capacity=" + capacity,
	}
	if h.opts.LeaseDurationSeconds > 0 {
		agent = append(agent, "--lease-duration-seconds="+strconv.Itoa(int(h.opts.LeaseDurationSeconds)))
	}
	if h.opts.RenewInterval > 0 {
		agent = append(agent, "--renew-interval="+h.opts.RenewInterval.String())
	}
	netdev := "user,id=net0"
	if spec.Guest == GuestKubelet {
		port, err := keptKubeletPort(b.Dir)
		if err != nil {
			return nil, fmt.Errorf("qemu: %w", err)
		}
		if port == 0 {
			return nil, errors.New("qemu: a real node's boot without a kubelet port")
		}
		agent = kubeletArgs(b, port)
		// On the host's loopback alone: nothing beyond this host reaches
		// the kubelet.
		netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", port, port)
	}
	for _, w := range agent {
		if !kernelWord(w) {
			return nil, fmt.Errorf("qemu: the guest's agent cannot be given %q: its kernel command line would split it", w)
		}
	}
	accelArg, cpu := "kvm", "host"
	if accel == AccelTCG {
		// A bounded translation cache: QEMU's default reserves 1 GiB.
		accelArg, cpu = "tcg,tb-size=64", "max"
	}
	return []string{
		"-name", "machinist",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-machine", "pc", "-accel", accelArg, "-cpu", cpu,
		"-smp", strconv.Itoa(spec.CPUs), "-m", strconv.FormatInt(mem.Value()>>20, 10),
		"-kernel", h.opts.Kernel.Image, "-initrd", initrd,
		// After "--", the kernel hands the words to init as arguments.
		"-append", "console=ttyS0 panic=-1 quiet -- " + strings.Join(agent, " "),
		"-drive", "file=" + diskFile + ",format=raw,if=virtio",
		"-netdev", netdev, "-device", "virtio-net-pci,netdev=net0,romfile=",
		// The guest hands the pages it frees back to the host: the
		// initramfs's archive, once unpacked, and what the agent frees.
		"-device", "virtio-balloon-pci,free-page-reporting=on",
		"-fw_cfg", "name=" + guest.JoinName + ",file=" + joinFile,
		"-qmp", "unix:" + qmpSocket + ",server=on,wait=off",
		"-serial", "file:" + consoleFile,
		"-no-reboot",
	}, nil
}

// kubeletFor is the path of the real node's kubelet of version: the one
// in NodeFiles.Bin or one in NodeFiles.Kubelets, as each one's
// `kubelet --version` says. The files are run again only once they have
// changed (a kubelet added, replaced or removed): a Machine of any
// version, which anyone who may create one can ask for, costs a look at
// the files, never a process. They are run outside h.mu: a file slow to
// answer holds no other boot.
func (h *vms) kubeletFor(version string) (string, error) {
	// Taken before the files are run: one changed meanwhile is run
	// again next time.
	stamp := h.opts.Node.kubeletsStamp()
	h.mu.Lock()
	found, skipped, read := h.kubelets, h.skipped, h.kubelets != nil && h.stamp == stamp
	h.mu.Unlock()
	if !read {
		var err error
		if found, skipped, err = h.opts.Node.kubelets(); err != nil {
			return "", err
		}
		h.mu.Lock()
		h.kubelets, h.skipped, h.stamp = found, skipped, stamp
		h.mu.Unlock()
	}
	if path, ok := found[version]; ok {
		return path, nil
	}
	where := "a directory of kubelets given to the provider (NodeFiles.Kubelets)"
	if h.opts.Node.Kubelets != "" {
		where = h.opts.Node.Kubelets
	}
	have := slices.Sorted(maps.Keys(found))
	err := fmt.Errorf("qemu: a real node runs a kubelet of --qemu-node-dir (it holds %s), and the Machine asks for %q: "+
		"give the Machine (or its set's template) one of those versions, or put a static kubelet of %[2]q in %s",
		strings.Join(have, ", "), version, where)
	return "", errors.Join(append([]error{err}, skipped...)...)
}

// kubeletArgs are a real node's init arguments: the kubelet's flags. It
// joins with its own TLS bootstrap from the join data, keeps its
// credentials on the machine's disk, registers the Node under the
// Machine's name and providerID, and serves on port, which QEMU forwards
// from the host's loopback. Its Node's addresses are the controller's to
// give (--cloud-provider=external, Addresses): the guest's own is the
// same in every VM.
func kubeletArgs(b process.Boot, port int) []string {
	return []string{guest.Kubelet,
		"--bootstrap-kubeconfig=" + guest.BootstrapKubeconfig,
		"--kubeconfig=" + guest.KubeletKubeconfig,
		"--config=" + guest.KubeletConfig,
		"--hostname-override=" + b.NodeName,
		"--provider-id=" + b.ProviderID,
		"--node-ip=" + strings.Split(guest.Address, "/")[0],
		"--cloud-provider=external",
		"--port=" + strconv.Itoa(port),
	}
}

// kernelWord reports whether w stays one word on a kernel command line:
// printable ASCII without a space or a double quote.
func kernelWord(w string) bool {
	for i := 0; i < len(w); i++ {
		if c := w[i]; c <= ' ' || c > '~' || c == '"' {
			return false
		}
	}
	return w != ""
}

// fits refuses a VM too small for its initramfs: the kernel unpacks it
// into a file system that may hold half the VM's memory, and a guest
// binary that does not fit would panic the kernel at every boot.
func (h *vms) fits(spec Spec) error {
	fi, err := os.Stat(h.opts.GuestBinary)
	if err != nil {
		return fmt.Errorf("the guest binary: %w", err)
	}
	mem := resource.MustParse(spec.Memory)
	// The modules and the rest take a few MiB more.
	need := fi.Size() + 8<<20
	if need > mem.Value()/2 {
		return fmt.Errorf("qemu: the guest binary %s (%d MiB) does not fit a VM of %s, which unpacks its initramfs into half its memory: "+
			"give the class more memory, or build machinist without symbol tables (go build -ldflags='-s -w', as make binaries does)",
			h.opts.GuestBinary, fi.Size()>>20, spec.Memory)
	}
	if spec.Guest != GuestKubelet || h.opts.Node == nil {
		return nil
	}
	// A real node's files, the images a user added among them.
	files, err := h.opts.Node.files()
	if err != nil {
		return err
	}
	for _, f := range files {
		if f.src == "" {
			continue
		}
		fi, err := os.Stat(f.src)
		if err != nil {
			return fmt.Errorf("a real node's file: %w", err)
		}
		need += fi.Size()
	}
	if need > mem.Value()/2 {
		return fmt.Errorf("qemu: a real node's initramfs (%d MiB: the guest binary, the kubelet, containerd, runc, the CNI plugins and the images of %s) does not fit a VM of %s, which unpacks it into half its memory: "+
			"give the class more memory, or fewer images", need>>20, h.opts.Node.Images, spec.Memory)
	}
	return nil
}

// capacityArg is the agent's --capacity: what the Node offers, the VM's
// CPUs and memory unless the class's node template says otherwise, in
// process.CapacityFlag's vocabulary: resource names and canonical
// quantities, anything else refused.
func capacityArg(capacity corev1.ResourceList, spec Spec) (string, error) {
	mem, err := resource.ParseQuantity(spec.Memory)
	if err != nil {
		return "", fmt.Errorf("memory %q: %w", spec.Memory, err)
	}
	all := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(spec.CPUs), resource.DecimalSI),
		corev1.ResourceMemory: mem,
	}
	maps.Copy(all, capacity)
	return process.CapacityFlag(all)
}

// parseSpec reads a provider spec, refusing what it does not know.
func parseSpec(raw json.RawMessage) (Spec, error) {
	var s Spec
	if len(raw) > 0 {
		err := strictjson.Unmarshal(raw, &s)
		switch {
		case errors.Is(err, strictjson.ErrTrailingData):
			return s, fmt.Errorf("qemu: the class's providerSpec: %w", err)
		case err != nil:
			return s, fmt.Errorf("qemu: the class's providerSpec: %w (it takes cpus, memory and guest)", err)
		}
	}
	if s.CPUs == 0 {
		s.CPUs = DefaultCPUs
	}
	if s.Memory == "" {
		s.Memory = DefaultMemory
	}
	if s.CPUs < 1 || s.CPUs > 64 {
		return s, fmt.Errorf("qemu: the class's providerSpec: cpus %d: want 1 to 64", s.CPUs)
	}
	q, err := resource.ParseQuantity(s.Memory)
	if err != nil {
		return s, fmt.Errorf("qemu: the class's providerSpec: memory %q: %w", s.Memory, err)
	}
	// The guest holds its initramfs, the machinist binary included, in
	// memory: less than this does not boot.
	if q.Value() < 256<<20 || q.Value() > 64<<30 {
		return s, fmt.Errorf("qemu: the class's providerSpec: memory %s: want 256Mi to 64Gi", s.Memory)
	}
	switch s.Guest {
	case "":
		s.Guest = GuestAgent
	case GuestAgent:
	case GuestKubelet:
		// The kubelet, containerd and their pods: less than this is
		// not enough.
		if q.Value() < 1<<30 {
			return s, fmt.Errorf("qemu: the class's providerSpec: memory %s: a %s guest needs at least 1Gi", s.Memory, GuestKubelet)
		}
	default:
		return s, fmt.Errorf("qemu: the class's providerSpec: guest %q: want %s (the node agent, the default) or %s (containerd and the kubelet)", s.Guest, GuestAgent, GuestKubelet)
	}
	return s, nil
}

// Owner recognises a VM by its QEMU binary and the --provider-id its
// guest's agent is given on the kernel command line.
func (*vms) Owner(argv []string) string {
	if len(argv) == 0 || !strings.HasPrefix(filepath.Base(argv[0]), "qemu-system") {
		return ""
	}
	for i, a := range argv {
		if a != "-append" || i+1 == len(argv) {
			continue
		}
		for _, f := range strings.Fields(argv[i+1]) {
			if id, ok := strings.CutPrefix(f, "--provider-id="); ok {
				return id
			}
		}
	}
	return ""
}

// Halt presses Ctrl-Alt-Del, on which the guest restarts in order, or
// resets the VM at once; with -no-reboot either ends the QEMU process.
func (h *vms) Halt(dir string, _ *os.Process, hard bool) error {
	cmd := `{"execute":"send-key","arguments":{"keys":[{"type":"qcode","data":"ctrl"},{"type":"qcode","data":"alt"},{"type":"qcode","data":"delete"}]}}`
	if hard {
		cmd = `{"execute":"system_reset"}`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return runQMP(ctx, dir, cmd)
}

// Provision writes the join data the guest reads through fw_cfg. The
// guest uses it only while its disk holds no credentials, so writing
// newer data for a machine that has joined changes nothing.
func (h *vms) Provision(dir string, join providers.Join) error {
	if err := writeJoin(filepath.Join(dir, joinFile), join); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, diskFile)); err == nil {
		return nil
	}
	return h.makeDisk(filepath.Join(dir, diskFile))
}

// Joined is false: the join data is the guest's to ignore once it has
// credentials (see Provision), so it is always kept current.
func (*vms) Joined(string) bool { return false }

// PrepareReimage makes the repair's fresh disk and writes its join data,
// both aside.
func (h *vms) PrepareReimage(dir string, join providers.Join) error {
	if err := writeJoin(filepath.Join(dir, joinFile+nextSuffix), join); err != nil {
		return err
	}
	return h.makeDisk(filepath.Join(dir, diskFile+nextSuffix))
}

// Reimage puts the fresh disk and join data in place of the old. Done
// again after a provider was killed halfway, it finds one or both in
// place already.
func (*vms) Reimage(dir string) error {
	for _, f := range []string{diskFile, joinFile} {
		err := os.Rename(filepath.Join(dir, f+nextSuffix), filepath.Join(dir, f))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// BootID is the last boot ID the guest's init printed on the console:
// this boot's, else the boot before's.
func (*vms) BootID(dir string) (string, error) {
	for _, name := range []string{consoleFile, consoleFile + ".1"} {
		id, err := lastBootID(filepath.Join(dir, name))
		if err != nil || id != "" {
			return id, err
		}
	}
	return "", nil
}

// JoinFailure reads the join's lines the guest's agent printed on its
// console.
func (*vms) JoinFailure(dir string) (*providers.JoinFailure, error) {
	return nodeagent.ReadJoinFailure(filepath.Join(dir, consoleFile))
}

func lastBootID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	i := strings.LastIndex(string(b), guest.BootLine)
	if i < 0 {
		return "", nil
	}
	line, _, complete := strings.Cut(string(b[i+len(guest.BootLine):]), "\n")
	if !complete {
		return "", nil
	}
	return strings.TrimSpace(line), nil
}

// writeJoin writes the join data as the guest's bootstrap kubeconfig. A
// server on the host's loopback is the user-mode net's gateway to the
// guest; TLS verifies the name the server was given as.
func writeJoin(path string, j providers.Join) error {
	u, err := url.Parse(j.Server)
	if err != nil {
		return fmt.Errorf("the join data's server %q: %w", j.Server, err)
	}
	if isLoopback(u.Hostname()) {
		if j.TLSServerName == "" {
			j.TLSServerName = u.Hostname()
		}
		u.Host = net.JoinHostPort(guest.Gateway, u.Port())
		j.Server = u.String()
	}
	return nodeagent.WriteBootstrapKubeconfig(path, j)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// makeDisk makes an empty ext4 disk image at path.
func (h *vms) makeDisk(path string) error {
	_ = os.Remove(path)
	out, err := exec.Command(h.mkfs, "-q", "-F", "-L", "machinist", "-J", "size=16", path, diskSize).CombinedOutput()
	if err != nil {
		return fmt.Errorf("making the disk: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// findMkfs finds mkfs.ext4 on PATH or where Debian puts it, in the
// administrator's sbin, which a user's PATH may lack.
func findMkfs() (string, error) {
	if path, err := exec.LookPath("mkfs.ext4"); err == nil {
		return path, nil
	}
	for _, path := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	return "", errors.New("qemu: no mkfs.ext4, which makes the machines' disks: install e2fsprogs")
}
