// Package process is a provider whose machines are OS processes: each
// Machine's instance is a `machinist agent` process registering a real Node
// with the apiserver. Killing one (kill -9) is a machine crash its Lease
// reveals; the machines outlive a restart of the provider, which finds them
// again in its state directory:
//
//	<StateDir>/<namespace>_<name>_<uid>/   one per Machine
//	    state.json   the provider's record: providerID, Node name, agent PID,
//	                 operations done, restarts (kept by a repair)
//	    agent.log    the agent's stdout and stderr
//	    boot-id      the running agent's boot ID
//
// Process liveness is read from /proc, so the provider runs on Linux.
package process

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/machinist-dev/machinist/actuators"
	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

// Name is the provider name MachineClasses use for this provider.
const Name = "process"

// Files in a machine's directory.
const (
	stateFile  = "state.json"
	logFile    = "agent.log"
	bootIDFile = "boot-id"
)

// DefaultStopTimeout is how long an agent is given to exit after SIGTERM
// before it is killed.
const DefaultStopTimeout = 5 * time.Second

// Options configure a Provider.
type Options struct {
	// Kubeconfig is the kubeconfig file every agent (and the provider, to
	// delete a repaired machine's Node) reaches the apiserver with. Required:
	// agents are separate processes and need a file.
	Kubeconfig string
	// AgentBinary is the machinist binary whose `agent` command each machine
	// runs; empty means this process's own executable.
	AgentBinary string
	// StateDir holds one directory per machine (see the package doc).
	// Required; created if missing.
	StateDir string
	// LeaseDurationSeconds is each Node's Lease duration; zero means the
	// agent's default (the kubelet's 40).
	LeaseDurationSeconds int32
	// RenewInterval is how often each Node's Lease is renewed; zero means
	// the agent's default (the kubelet's 10s).
	RenewInterval time.Duration
	// StopTimeout is how long an agent has to exit after SIGTERM before it
	// gets SIGKILL; zero means DefaultStopTimeout.
	StopTimeout time.Duration
	// ExitWithParent kills the agents when this process dies without
	// stopping them (SIGKILL). Off, they outlive it and a new Provider
	// adopts them; on, as in `machinist run`, whose control plane dies
	// with it too, so that adopted agents would talk to a dead apiserver.
	ExitWithParent bool
}

// Provider is the process actuators.Actuator. Machines run until deleted or
// until Stop; a new Provider over the same StateDir takes them over.
type Provider struct {
	opts   Options
	client kubernetes.Interface

	mu       sync.Mutex
	machines map[string]*machine // by providerID; deleted ones stay, not live
	stopped  bool
}

var _ actuators.Actuator = (*Provider)(nil)

// state is a machine's state file: what a new Provider needs to take the
// machine over.
type state struct {
	ProviderID string              `json:"providerID"`
	NodeName   string              `json:"nodeName"`
	Version    string              `json:"version,omitempty"`
	Capacity   corev1.ResourceList `json:"capacity,omitempty"`
	// PID is the agent's process ID, zero when it is not running.
	PID int `json:"pid,omitempty"`
	// LastOperation is the ID of the last reboot or repair carried out,
	// so that a repeated call does not restart the machine twice.
	LastOperation string `json:"lastOperation,omitempty"`
	Restarts      int    `json:"restarts"`
}

// machine is one instance. Its mutex orders power changes, so that racing
// calls leave one agent running or none.
type machine struct {
	dir string

	mu   sync.Mutex
	live bool // its state file exists: created and not deleted
	st   state
	// proc is the running agent, nil when none is known. Signalling it
	// rather than its PID cannot hit another process that reused the PID:
	// on Linux it holds a pidfd.
	proc *os.Process
	exit chan struct{} // closed once proc has exited
}

// New makes a Provider over opts.StateDir and takes over the machines
// already there: an agent still running (a previous Provider died without
// Stop) is adopted, and a machine whose agent is not running is booted.
// Call Stop to end them all.
func New(opts Options) (*Provider, error) {
	if opts.Kubeconfig == "" || opts.StateDir == "" {
		return nil, errors.New("process: Options needs a Kubeconfig and a StateDir")
	}
	var err error
	// Agents may not share our working directory's meaning of a relative path.
	if opts.Kubeconfig, err = filepath.Abs(opts.Kubeconfig); err != nil {
		return nil, err
	}
	if opts.StateDir, err = filepath.Abs(opts.StateDir); err != nil {
		return nil, err
	}
	if opts.AgentBinary == "" {
		if opts.AgentBinary, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("process: finding the agent binary: %w", err)
		}
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("process: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("process: building a client: %w", err)
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("process: %w", err)
	}
	p := &Provider{opts: opts, client: client, machines: map[string]*machine{}}
	if err := p.load(); err != nil {
		return nil, errors.Join(err, p.Stop(context.Background()))
	}
	return p, nil
}

// load takes over every machine in StateDir.
func (p *Provider) load() error {
	entries, err := os.ReadDir(p.opts.StateDir)
	if err != nil {
		return fmt.Errorf("process: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(p.opts.StateDir, e.Name())
		st, err := readState(dir)
		if errors.Is(err, fs.ErrNotExist) {
			// A Create that died before writing the state: the Machine has
			// no providerID yet, and its next Create starts over.
			continue
		}
		if err != nil {
			return err
		}
		m := &machine{dir: dir, live: true, st: st}
		p.machines[st.ProviderID] = m
		m.mu.Lock()
		if !m.adopt() {
			err = p.start(m)
		}
		m.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// Stop terminates every agent (SIGTERM, then SIGKILL after StopTimeout or
// once ctx ends) and waits until they are gone. Machines and their Nodes
// stay; a new Provider over the StateDir boots them again. Calls after Stop
// fail.
func (p *Provider) Stop(ctx context.Context) error {
	p.mu.Lock()
	p.stopped = true
	all := make([]*machine, 0, len(p.machines))
	for _, m := range p.machines {
		all = append(all, m)
	}
	p.mu.Unlock()
	// In parallel: each agent may take StopTimeout.
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, m := range all {
		wg.Go(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			errs[i] = p.halt(ctx, m, false)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// NodeName returns the Node name of the instance providerID names.
func (p *Provider) NodeName(providerID string) (string, error) {
	m, err := p.lookup(providerID)
	if err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.NodeName, nil
}

// PID returns the process ID of the instance's agent, or an error when it
// is not running; killing it (kill -9) is a machine crash.
func (p *Provider) PID(providerID string) (int, error) {
	m, err := p.lookup(providerID)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.running() {
		return 0, fmt.Errorf("process: the agent of %q is not running", providerID)
	}
	return m.proc.Pid, nil
}

// BootID returns the boot ID the instance's current or last agent chose,
// empty if it has not chosen one yet.
func (p *Provider) BootID(providerID string) (string, error) {
	m, err := p.lookup(providerID)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(m.dir, bootIDFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return strings.TrimSpace(string(b)), err
}

// Restarts reports how many reboots and repairs the instance has done;
// tests use it to prove an operation ran exactly once.
func (p *Provider) Restarts(providerID string) (int, error) {
	m, err := p.lookup(providerID)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Restarts, nil
}

// Create implements actuators.Actuator. The providerID follows from the
// Machine alone, so a repeated call finds the same directory and starts the
// agent only if it is not running.
func (p *Provider) Create(ctx context.Context, mach *machinistv1.Machine, class *machinistv1.MachineClass) (string, error) {
	if id := mach.Spec.ProviderID; id != "" {
		ok, err := p.Exists(ctx, id)
		if err == nil && !ok {
			err = errors.New("no such instance")
		}
		if err != nil {
			return "", actuators.Permanent(fmt.Errorf("cannot adopt %q: %w", id, err))
		}
		return id, nil
	}
	if mach.UID == "" {
		return "", actuators.Permanent(fmt.Errorf("machine %s/%s has no UID", mach.Namespace, mach.Name))
	}
	id := actuators.ProviderID(Name, mach)
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return "", errors.New("process: provider is stopped")
	}
	m, ok := p.machines[id]
	if !ok {
		m = &machine{dir: p.dir(mach.Namespace, mach.Name, mach.UID)}
		p.machines[id] = m
	}
	p.mu.Unlock()

	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.live {
		st := state{ProviderID: id, NodeName: actuators.NodeName(mach.Name, mach.UID), Version: mach.Spec.Version}
		if class != nil && class.Spec.NodeTemplate != nil {
			st.Capacity = class.Spec.NodeTemplate.Capacity.DeepCopy()
		}
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			return "", fmt.Errorf("process: creating %s: %w", id, err)
		}
		if err := writeState(m.dir, st); err != nil {
			return "", err
		}
		m.st, m.live = st, true
	}
	if m.running() {
		return id, nil
	}
	if err := p.start(m); err != nil {
		return "", err
	}
	return id, nil
}

// Exists implements actuators.Actuator: the machine's directory exists. A
// crashed machine exists; only Delete ends one.
func (p *Provider) Exists(_ context.Context, providerID string) (bool, error) {
	ns, name, uid, err := parseProviderID(providerID)
	if err != nil {
		return false, actuators.Permanent(err)
	}
	_, err = os.Stat(p.dir(ns, name, uid))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// FindByUID implements actuators.Actuator. The machine's directory is
// named after its Machine, so a Create that died before writing its state
// file is found too.
func (p *Provider) FindByUID(_ context.Context, uid types.UID) (string, error) {
	if uid == "" || strings.ContainsAny(string(uid), "/_*?[") {
		return "", nil
	}
	dirs, err := filepath.Glob(filepath.Join(p.opts.StateDir, "*_"+string(uid)))
	if err != nil || len(dirs) == 0 {
		return "", err
	}
	parts := strings.Split(filepath.Base(dirs[0]), "_")
	if len(parts) != 3 {
		return "", fmt.Errorf("process: %s is not named <namespace>_<name>_<uid>", dirs[0])
	}
	return actuators.ProviderID(Name, &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{
		Namespace: parts[0], Name: parts[1], UID: uid}}), nil
}

// Delete implements actuators.Actuator: it stops the agent and removes the
// machine's directory. The Node is the controller's to delete.
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	ns, name, uid, err := parseProviderID(providerID)
	if err != nil {
		return actuators.Permanent(err)
	}
	p.mu.Lock()
	m, ok := p.machines[providerID]
	p.mu.Unlock()
	if !ok {
		// Not ours to stop (a directory without a state file), but still
		// ours to remove.
		return removeDir(p.dir(ns, name, uid))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := p.halt(ctx, m, false); err != nil {
		return err
	}
	if err := removeDir(m.dir); err != nil {
		return err
	}
	m.live = false
	return nil
}

// Reboot implements actuators.Actuator: the agent is stopped (SIGTERM, or
// SIGKILL for a hard reboot) and started again, and the new process boots
// with a new boot ID; the Node keeps what others put on it. A crashed
// machine comes back. A second call with the same op.ID does nothing.
func (p *Provider) Reboot(ctx context.Context, providerID string, op actuators.Operation) error {
	return p.restart(ctx, providerID, op, false)
}

// Repair implements actuators.Actuator: like Reboot, but everything in the
// machine's directory except the provider's state file is wiped, and its
// Node and Lease are deleted, so the Node registers afresh without the
// labels and taints others had put on it.
func (p *Provider) Repair(ctx context.Context, providerID string, op actuators.Operation) error {
	return p.restart(ctx, providerID, op, true)
}

func (p *Provider) restart(ctx context.Context, providerID string, op actuators.Operation, wipe bool) error {
	m, err := p.lookup(providerID)
	if err != nil {
		return actuators.Permanent(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.live {
		return actuators.Permanent(fmt.Errorf("process: no instance %q", providerID))
	}
	if op.ID != "" && m.st.LastOperation == op.ID {
		return nil
	}
	if err := p.halt(ctx, m, op.Hard); err != nil {
		return err
	}
	if wipe {
		if err := p.wipe(ctx, m); err != nil {
			// Off, not re-imaged: come back as before and let the caller
			// retry the whole repair.
			return errors.Join(err, p.start(m))
		}
	}
	// Recorded with the new PID in start's one state write, so a
	// successful call is never carried out twice.
	prev := m.st
	if op.ID != "" {
		m.st.LastOperation = op.ID
	}
	m.st.Restarts++
	if err := p.start(m); err != nil {
		m.st = prev
		return err
	}
	return nil
}

// wipe re-images a stopped machine: its files but the state file go, and
// so do its Node and Lease. Callers hold m.mu.
func (p *Provider) wipe(ctx context.Context, m *machine) error {
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return fmt.Errorf("process: repairing %s: %w", m.st.ProviderID, err)
	}
	for _, e := range entries {
		if e.Name() == stateFile {
			continue
		}
		if err := os.RemoveAll(filepath.Join(m.dir, e.Name())); err != nil {
			return fmt.Errorf("process: repairing %s: %w", m.st.ProviderID, err)
		}
	}
	if err := actuators.ForgetNode(ctx, p.client, m.st.NodeName); err != nil {
		return fmt.Errorf("process: repairing %s: %w", m.st.ProviderID, err)
	}
	return nil
}

// start boots the machine's agent and records its PID. Callers hold m.mu,
// with no agent running.
func (p *Provider) start(m *machine) error {
	// Checked under p.mu, where Stop marks the Provider stopped before it
	// takes each machine's lock: an agent started here is one Stop stops.
	p.mu.Lock()
	stopped := p.stopped
	p.mu.Unlock()
	if stopped {
		return errors.New("process: provider is stopped")
	}
	log, err := os.OpenFile(filepath.Join(m.dir, logFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("process: starting %s: %w", m.st.ProviderID, err)
	}
	defer log.Close() // the agent has its own descriptor
	cmd := exec.Command(p.opts.AgentBinary, p.agentArgs(m)...)
	cmd.Dir = m.dir
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a Ctrl-C meant for the provider's terminal is
	// not a machine crash, and Stop then ends the agents in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if p.opts.ExitWithParent {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("process: starting %s: %w", m.st.ProviderID, err)
	}
	exit := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exit)
	}()
	m.proc, m.exit = cmd.Process, exit
	m.st.PID = cmd.Process.Pid
	if err := writeState(m.dir, m.st); err != nil {
		// A PID we cannot record is an agent a new Provider would start
		// twice; better none.
		return errors.Join(err, p.halt(context.Background(), m, true))
	}
	return nil
}

// agentArgs are the agent's flags, each one argument so that isAgent can
// recognise the process by its command line.
func (p *Provider) agentArgs(m *machine) []string {
	args := []string{"agent",
		"--kubeconfig=" + p.opts.Kubeconfig,
		"--node-name=" + m.st.NodeName,
		"--provider-id=" + m.st.ProviderID,
		"--version=" + m.st.Version,
		"--boot-id-file=" + filepath.Join(m.dir, bootIDFile),
	}
	if p.opts.LeaseDurationSeconds > 0 {
		args = append(args, "--lease-duration-seconds="+strconv.Itoa(int(p.opts.LeaseDurationSeconds)))
	}
	if p.opts.RenewInterval > 0 {
		args = append(args, "--renew-interval="+p.opts.RenewInterval.String())
	}
	if len(m.st.Capacity) > 0 {
		pairs := make([]string, 0, len(m.st.Capacity))
		for name, q := range m.st.Capacity {
			pairs = append(pairs, string(name)+"="+q.String())
		}
		sort.Strings(pairs)
		args = append(args, "--capacity="+strings.Join(pairs, ","))
	}
	return args
}

// halt stops the machine's agent, if one runs, and waits until it is gone:
// SIGTERM first (SIGKILL at once when hard), SIGKILL after StopTimeout or
// when ctx ends. Callers hold m.mu.
func (p *Provider) halt(ctx context.Context, m *machine, hard bool) error {
	if m.running() {
		sig := syscall.SIGTERM
		if hard {
			sig = syscall.SIGKILL
		}
		_ = m.proc.Signal(sig)
		timer := time.NewTimer(p.opts.StopTimeout)
		defer timer.Stop()
		select {
		case <-m.exit:
		case <-timer.C:
			_ = m.proc.Kill()
			<-m.exit
		case <-ctx.Done():
			_ = m.proc.Kill()
			<-m.exit
		}
	}
	m.proc, m.exit = nil, nil
	if m.st.PID == 0 || !m.live {
		return nil
	}
	m.st.PID = 0
	return writeState(m.dir, m.st)
}

// running reports whether the machine's agent is alive. Callers hold m.mu.
func (m *machine) running() bool {
	if m.exit == nil {
		return false
	}
	select {
	case <-m.exit:
		return false
	default:
		return true
	}
}

// adopt takes over the agent the state file names, if it still runs (its
// Provider died without Stop), and reports whether it did. It is not our
// child, so nothing tells us when it exits: that is polled. Callers hold
// m.mu.
func (m *machine) adopt() bool {
	pid, id := m.st.PID, m.st.ProviderID
	if pid == 0 || !isAgent(pid, id) {
		return false
	}
	proc, err := os.FindProcess(pid)
	// Checked again now that proc pins the process: it may have exited,
	// and its PID been reused, in between.
	if err != nil || !isAgent(pid, id) {
		return false
	}
	exit := make(chan struct{})
	go func() {
		for isAgent(pid, id) {
			time.Sleep(100 * time.Millisecond)
		}
		close(exit)
	}()
	m.proc, m.exit = proc, exit
	return true
}

// isAgent reports whether pid is a live agent of providerID. A PID alone
// could by now be any process's; the command line tells ours apart, and a
// zombie has none.
func isAgent(pid int, providerID string) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	return len(args) > 1 && string(args[1]) == "agent" &&
		slices.ContainsFunc(args, func(a []byte) bool { return string(a) == "--provider-id="+providerID })
}

// lookup returns the live machine providerID names.
func (p *Provider) lookup(providerID string) (*machine, error) {
	if _, _, _, err := parseProviderID(providerID); err != nil {
		return nil, err
	}
	p.mu.Lock()
	m, ok := p.machines[providerID]
	p.mu.Unlock()
	if ok {
		m.mu.Lock()
		ok = m.live
		m.mu.Unlock()
	}
	if !ok {
		return nil, fmt.Errorf("process: no instance %q", providerID)
	}
	return m, nil
}

// dir is a machine's directory. Namespaces and names cannot hold "_", so
// the name is unambiguous.
func (p *Provider) dir(namespace, name string, uid types.UID) string {
	return filepath.Join(p.opts.StateDir, namespace+"_"+name+"_"+string(uid))
}

func readState(dir string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("process: %s: %w", filepath.Join(dir, stateFile), err)
	}
	if _, _, _, err := parseProviderID(st.ProviderID); err != nil {
		return st, fmt.Errorf("process: %s: %w", filepath.Join(dir, stateFile), err)
	}
	return st, nil
}

// writeState replaces the state file by renaming, so a crash never leaves
// half of one.
func writeState(dir string, st state) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("process: writing state of %s: %w", st.ProviderID, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("process: writing state of %s: %w", st.ProviderID, err)
	}
	return nil
}

func removeDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("process: %w", err)
	}
	return nil
}

// parseProviderID splits one of this provider's providerIDs
// (actuators.ProviderID) into its Machine's namespace, name and UID.
func parseProviderID(providerID string) (namespace, name string, uid types.UID, err error) {
	return actuators.ParseProviderID(Name, providerID)
}
