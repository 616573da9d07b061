package process

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/nodeagent"
)

// Hardware is what a machine's boots run as. The Provider keeps the books
// of every machine (its state file, the write-ahead record of reboots and
// repairs, the takeover of machines a previous provider left) the same
// way whatever the machine is; a Hardware says what the process of one
// boot is, how to tell it apart in /proc, how to ask it to end, and keeps
// the rest of the machine's directory: its disk. By default a boot is an
// agent process (this package's own provider); package qemu's boots are
// VMs.
//
// Every boot is one OS process: a reboot ends it and starts another. The
// Provider calls a Hardware with the machine's lock held, one call per
// machine at a time.
type Hardware interface {
	// Name is the provider's name: MachineClasses name it, and it is the
	// scheme of its providerIDs.
	Name() string
	// Check says why a machine of the class's provider spec (JSON, empty
	// for none), Node capacity and node version could never boot, nil if
	// it can: Create asks before it makes anything, and Update before it
	// halts the machine, and each fails permanently.
	Check(spec json.RawMessage, capacity corev1.ResourceList, version string) error
	// Command is the process of one boot of b. Output it sets is closed
	// by the Provider once the process has started. An error wrapped with
	// providers.Permanent is a machine that cannot boot as asked, such as
	// a provider spec it refuses.
	Command(b Boot) (*exec.Cmd, error)
	// Owner is the providerID of the machine whose boot runs with the
	// command line argv, "" when the process is none of ours.
	Owner(argv []string) string
	// Halt asks proc, the running boot of the machine in dir, to end: in
	// order, or at once when hard. It returns once asked; the Provider
	// waits for the exit, and kills the process after StopTimeout or when
	// Halt fails.
	Halt(dir string, proc *os.Process, hard bool) error
	// Provision writes join, the data a machine joins its cluster with,
	// in dir: a new machine's, or newer data for one not joined yet.
	Provision(dir string, join providers.Join) error
	// Joined reports whether the machine in dir has credentials of its
	// own, after which the join data it was given is not used.
	Joined(dir string) bool
	// PrepareReimage writes a repair's join data in dir, aside, before
	// the repair is recorded pending: whoever finishes the repair, this
	// provider or the next, finds it there.
	PrepareReimage(dir string, join providers.Join) error
	// Reimage wipes the stopped machine in dir: its disk, its credentials
	// with it, and what PrepareReimage put aside takes the old join
	// data's place. It keeps the Provider's state file (StateFile), and
	// done again after a provider was killed halfway it finishes the
	// same wipe.
	Reimage(dir string) error
	// BootID is the ID of the machine's current or last boot, as the
	// boot itself told it, "" if none has yet. A boot just started may
	// not have told its own: never report one that has not happened.
	BootID(dir string) (string, error)
	// JoinFailure is why the machine in dir is failing to join, as it
	// last said (nodeagent's join lines); nil when it has not said, or
	// has joined since.
	JoinFailure(dir string) (*providers.JoinFailure, error)
}

// Addresser is Hardware whose machines are reached at addresses of its
// own, which Describe reports (providers.Instance.Addresses).
type Addresser interface {
	// Addresses are where the machine in dir is reached while it runs;
	// none when at the addresses its kubelet reports itself.
	Addresses(dir string) ([]corev1.NodeAddress, error)
}

// Boot is what one boot of a machine runs with.
type Boot struct {
	// Dir is the machine's directory.
	Dir        string
	ProviderID string
	NodeName   string
	// Version is the node version the boot runs.
	Version  string
	Capacity corev1.ResourceList
	// Spec is the provider spec of the machine's class, as created: JSON,
	// empty for none.
	Spec json.RawMessage
}

// StateFile is the Provider's record in each machine's directory, which a
// Hardware leaves alone.
const StateFile = "state.json"

// Files in an agent machine's directory.
const (
	logFile    = "agent.log"
	bootIDFile = "boot-id"
	// bootstrapFile holds the join data the agent joins with; its own
	// credentials go to nodeKubeconfigFile.
	bootstrapFile      = "bootstrap-kubeconfig"
	nodeKubeconfigFile = "kubeconfig"
	// nextBootstrapFile is a repair's join data, written before the repair
	// is recorded pending and put in bootstrapFile's place by its wipe, so
	// that a provider killed halfway through leaves it for the next one.
	nextBootstrapFile = bootstrapFile + ".next"
)

// agents is the default Hardware: each boot is a `machinist agent`
// process, and the machine's directory is its disk.
type agents struct {
	opts Options
}

var _ Hardware = agents{}

func (agents) Name() string { return Name }

// Check accepts every spec, which an agent does not read, every version,
// which it reports as told, and a capacity CapacityFlag can write.
func (agents) Check(_ json.RawMessage, capacity corev1.ResourceList, _ string) error {
	_, err := CapacityFlag(capacity)
	return err
}

func (h agents) Command(b Boot) (*exec.Cmd, error) {
	// Checked at Create; checked again for a machine created before
	// capacities were.
	if _, err := CapacityFlag(b.Capacity); err != nil {
		return nil, providers.Permanent(err)
	}
	log, err := os.OpenFile(filepath.Join(b.Dir, logFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(h.opts.AgentBinary, h.args(b)...)
	cmd.Dir = b.Dir
	cmd.Stdout, cmd.Stderr = log, log
	return cmd, nil
}

// args are the agent's flags, each one argument so that Owner can
// recognise the process by its command line.
func (h agents) args(b Boot) []string {
	args := []string{"agent",
		"--bootstrap-kubeconfig=" + filepath.Join(b.Dir, bootstrapFile),
		"--kubeconfig=" + filepath.Join(b.Dir, nodeKubeconfigFile),
		"--node-name=" + b.NodeName,
		"--provider-id=" + b.ProviderID,
		"--version=" + b.Version,
		"--boot-id-file=" + filepath.Join(b.Dir, bootIDFile),
	}
	if h.opts.LeaseDurationSeconds > 0 {
		args = append(args, "--lease-duration-seconds="+strconv.Itoa(int(h.opts.LeaseDurationSeconds)))
	}
	if h.opts.RenewInterval > 0 {
		args = append(args, "--renew-interval="+h.opts.RenewInterval.String())
	}
	if len(b.Capacity) > 0 {
		// Command refuses a capacity CapacityFlag cannot write.
		capacity, _ := CapacityFlag(b.Capacity)
		args = append(args, "--capacity="+capacity)
	}
	return args
}

// CapacityFlag is the value of an agent's --capacity flag for c:
// name=quantity pairs, sorted, so that a machine's command line is the
// same at every boot. Only a fixed vocabulary is written: each name a
// resource name as Kubernetes checks one (a qualified name: at most 63
// letters, digits, '-', '_' and '.' after an optional DNS subdomain
// prefix and '/') and each quantity non-negative, in its canonical form.
// Anything else is an error: a name with a ',' or '=' would say other
// resources than it seems to, and one with a space, on a command line
// split at spaces (a VM's kernel's), other flags.
func CapacityFlag(c corev1.ResourceList) (string, error) {
	pairs := make([]string, 0, len(c))
	for name, q := range c {
		if errs := validation.IsQualifiedName(string(name)); len(errs) > 0 {
			return "", fmt.Errorf("the class's capacity: %q is not a resource name: %s", name, strings.Join(errs, "; "))
		}
		if q.Sign() < 0 {
			return "", fmt.Errorf("the class's capacity: %s is %s: a Node offers no negative amount", name, q.String())
		}
		number, suffix := q.CanonicalizeBytes(nil)
		pairs = append(pairs, string(name)+"="+string(number)+string(suffix))
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ","), nil
}

// Owner recognises an agent by its argv[1], "agent", and its
// --provider-id argument.
func (agents) Owner(argv []string) string {
	if len(argv) < 2 || argv[1] != "agent" {
		return ""
	}
	for _, a := range argv[2:] {
		if id, ok := strings.CutPrefix(a, "--provider-id="); ok {
			return id
		}
	}
	return ""
}

// Halt sends SIGTERM, which the agent ends on in order, or SIGKILL.
func (agents) Halt(_ string, proc *os.Process, hard bool) error {
	if hard {
		return proc.Signal(syscall.SIGKILL)
	}
	return proc.Signal(syscall.SIGTERM)
}

func (agents) Provision(dir string, join providers.Join) error {
	return nodeagent.WriteBootstrapKubeconfig(filepath.Join(dir, bootstrapFile), join)
}

func (agents) Joined(dir string) bool { return exists(filepath.Join(dir, nodeKubeconfigFile)) }

func (agents) PrepareReimage(dir string, join providers.Join) error {
	return nodeagent.WriteBootstrapKubeconfig(filepath.Join(dir, nextBootstrapFile), join)
}

// Reimage removes everything but the state file and the join data, and
// puts the repair's join data in place of the old.
func (agents) Reimage(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		switch e.Name() {
		case StateFile, bootstrapFile, nextBootstrapFile:
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	next := filepath.Join(dir, nextBootstrapFile)
	if exists(next) {
		return os.Rename(next, filepath.Join(dir, bootstrapFile))
	}
	return nil
}

// BootID reads the file each agent writes as it starts, before joining.
func (agents) BootID(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, bootIDFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return strings.TrimSpace(string(b)), err
}

// JoinFailure reads the join's lines of the agent's log.
func (agents) JoinFailure(dir string) (*providers.JoinFailure, error) {
	return nodeagent.ReadJoinFailure(filepath.Join(dir, logFile))
}

// argv is pid's command line, nil once it has exited (even a zombie has
// none).
func argv(pid int) []string {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(cmdline) == 0 {
		return nil
	}
	parts := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	args := make([]string, len(parts))
	for i, p := range parts {
		args[i] = string(p)
	}
	return args
}

// closeOutput closes the files Command opened for the process's output,
// which the started process holds its own descriptors of.
func closeOutput(cmd *exec.Cmd) {
	if c, ok := cmd.Stdout.(io.Closer); ok {
		_ = c.Close()
	}
	if c, ok := cmd.Stderr.(io.Closer); ok && cmd.Stderr != cmd.Stdout {
		_ = c.Close()
	}
}
