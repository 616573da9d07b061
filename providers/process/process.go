// Package process is a provider whose machines are OS processes: each
// Machine's instance is a `machinist agent` process registering a real Node
// with the apiserver. Killing one (kill -9) is a machine crash its Lease
// reveals; the machines outlive a restart of the provider, which finds them
// again in its state directory:
//
//	<StateDir>/<namespace>_<name>_<uid>/   one per Machine
//	    state.json   the provider's record: providerID, the Machine the
//	                 machine belongs to, Node name, agent PID, the operation
//	                 under way and the last one done, restarts (kept by a
//	                 repair)
//	    agent.log    the agent's stdout and stderr
//	    boot-id      the running agent's boot ID
//	    bootstrap-kubeconfig  the join data (0600): server, CA, bootstrap token
//	    kubeconfig   the machine's own credentials (0600), which its agent
//	                 got with the bootstrap token and keeps across reboots
//	    bootstrap-kubeconfig.next  a repair's join data, until its wipe
//
// The directory is the machine's disk: the join data of Create is written
// there and nowhere else, and the agent joins the cluster with it as a
// kubelet does (`machinist agent --bootstrap-kubeconfig`), so that no
// machine holds the provider's credentials. A repair wipes the directory
// but for the state file and the repair's join data, so the machine joins
// afresh.
//
// A Provider takes the machines in its StateDir over lazily, on the first
// call of any of its methods (Stop aside), not when it is made: in a manager
// with leader election the controllers call the provider only once they
// lead, so only the leader takes machines over, and a standby replica over
// the same StateDir leaves the leader's agents alone. Taking over finds a
// machine's agents by their command lines in /proc, not by the recorded PID
// alone, so that an agent started by a provider killed before it recorded
// the PID is adopted rather than started twice; and it finishes a reboot or
// repair that such a provider left halfway (see restart).
//
// Process liveness is read from /proc, so the provider runs on Linux.
package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/providers"
)

// Name is the provider name MachineClasses use for this provider.
const Name = "process"

// DefaultStopTimeout is how long an agent is given to exit after SIGTERM
// before it is killed.
const DefaultStopTimeout = 5 * time.Second

// Options configure a Provider. It holds no credentials for any cluster:
// each agent joins its own with the join data it is given, and a repaired
// one deletes its old Node itself (nodeagent.Forget).
type Options struct {
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
	// Hardware is what each boot runs as; nil means an agent process
	// (AgentBinary, LeaseDurationSeconds and RenewInterval are its).
	Hardware Hardware
}

// Provider is the process providers.Actuator. Machines run until deleted or
// until Stop; a new Provider over the same StateDir takes them over on its
// first call.
type Provider struct {
	opts Options
	hw   Hardware

	// loadMu makes concurrent first calls take over once; loaded is set
	// once a takeover has succeeded.
	loadMu sync.Mutex
	loaded atomic.Bool

	mu       sync.Mutex
	machines map[string]*machine // by providerID; deleted ones stay, not live
	stopped  bool
}

var _ providers.Actuator = (*Provider)(nil)

// state is a machine's state file: what a new Provider needs to take the
// machine over.
type state struct {
	ProviderID string `json:"providerID"`
	// Owner is the Machine the machine belongs to. A state file written
	// before owners were recorded has none: its owner is the Machine its
	// providerID was made for (see owner), so that no machine of an
	// earlier version becomes another Machine's to adopt.
	Owner    *owner              `json:"owner,omitempty"`
	NodeName string              `json:"nodeName"`
	Version  string              `json:"version,omitempty"`
	Capacity corev1.ResourceList `json:"capacity,omitempty"`
	// Spec is the class's provider spec when the machine was created.
	Spec json.RawMessage `json:"spec,omitempty"`
	// PID is the agent's process ID, zero when it is not running.
	PID int `json:"pid,omitempty"`
	// LastOperation is the ID of the last reboot or repair carried out,
	// so that a repeated call does not restart the machine twice.
	LastOperation string `json:"lastOperation,omitempty"`
	Restarts      int    `json:"restarts"`
	// Pending is the reboot or repair under way: written before the agent
	// is halted, and cleared in the write that records the new agent's PID
	// with LastOperation and Restarts, so that a provider killed halfway
	// leaves what the next one needs to finish it once (see restart).
	Pending *pendingOp `json:"pending,omitempty"`
	// Deleting is written before Delete halts the agent: a provider killed
	// before the directory is gone leaves a machine the next one must not
	// boot again.
	Deleting bool `json:"deleting,omitempty"`
}

// owner is providers.Owner as a state file records it.
type owner struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
}

// recorded is o as a state file records it.
func recorded(o providers.Owner) *owner {
	return &owner{Namespace: o.Namespace, Name: o.Name, UID: o.UID}
}

// owner is the Machine the machine of st belongs to: the one recorded, or,
// in a state file from before owners were recorded, the one its
// providerID was made for (<provider>:///<namespace>/<name>/<uid>).
func (st state) owner() providers.Owner {
	if o := st.Owner; o != nil {
		return providers.Owner{Namespace: o.Namespace, Name: o.Name, UID: o.UID}
	}
	return madeFor(st.ProviderID)
}

// madeFor is the Machine a providerID was made for, zero for one that is
// not of the form providers.ProviderID makes, whatever its provider.
func madeFor(providerID string) providers.Owner {
	scheme, _, ok := strings.Cut(providerID, ":///")
	if !ok {
		return providers.Owner{}
	}
	ns, name, uid, err := providers.ParseProviderID(scheme, providerID)
	if err != nil {
		return providers.Owner{}
	}
	return providers.Owner{Namespace: ns, Name: name, UID: uid}
}

// pendingOp is a reboot or repair begun and not yet finished.
type pendingOp struct {
	// ID is the operation's ID, empty if the caller gave none.
	ID string `json:"id"`
	// Repair is set for a repair, which wipes the machine; else a reboot.
	Repair bool `json:"repair,omitempty"`
	// Hard is set when the agent is killed (SIGKILL), not stopped.
	Hard bool `json:"hard,omitempty"`
	// Version is set for an update: the agent boots with it, and the
	// state records it once the operation is done.
	Version string `json:"version,omitempty"`
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
	// takenOver is set once load has taken the machine over; a machine
	// whose takeover failed is tried again by the next load.
	takenOver bool
}

// New makes a Provider over opts.StateDir. It takes over no machine: the
// machines already there (left by a previous Provider, which may have died
// without Stop, or may still run in another replica) are taken over on the
// first call of any method but Stop, once; a takeover that fails fails that
// call and is tried again on the next. Taking over adopts an agent still
// running, killing any duplicate, boots a machine whose agent is not
// running, and finishes a reboot or repair left halfway. Call Stop to end
// the machines taken over or created.
func New(opts Options) (*Provider, error) {
	if opts.StateDir == "" {
		return nil, errors.New("process: Options needs a StateDir")
	}
	var err error
	// Agents may not share our working directory's meaning of a relative path.
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
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("process: %w", err)
	}
	hw := opts.Hardware
	if hw == nil {
		hw = agents{opts: opts}
	}
	return &Provider{opts: opts, hw: hw, machines: map[string]*machine{}}, nil
}

// TakeOver takes the machines in StateDir over now rather than on the
// first call, for a provider that is the only one over its StateDir and
// must bring its machines back as it starts, as `machinist provider serve`
// does: nothing may call it for a long time over a settled fleet. It is a
// no-op once a takeover succeeded; a failed one is tried again by the next
// call of TakeOver or of any method but Stop.
func (p *Provider) TakeOver(ctx context.Context) error { return p.takeOver(ctx) }

// takeOver takes the machines in StateDir over unless that was done: every
// method but Stop calls it first. Concurrent calls wait for one takeover;
// a failed one is tried again by the next call.
func (p *Provider) takeOver(ctx context.Context) error {
	if p.loaded.Load() {
		return nil
	}
	p.loadMu.Lock()
	defer p.loadMu.Unlock()
	if p.loaded.Load() {
		return nil
	}
	if err := p.load(ctx); err != nil {
		return err
	}
	p.loaded.Store(true)
	return nil
}

// load takes over every machine in StateDir not taken over yet. It goes on
// past a machine it fails to take over, so that one broken machine does not
// leave the others down, and returns the errors. Callers hold p.loadMu.
func (p *Provider) load(ctx context.Context) error {
	if p.isStopped() {
		return errStopped
	}
	entries, err := os.ReadDir(p.opts.StateDir)
	if err != nil {
		return p.errorf("%w", err)
	}
	// One scan for all machines: the agents found are started by no one
	// else meanwhile (a provider that might is dead or not leading), and
	// adopt checks each again.
	running, err := p.scan()
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(p.opts.StateDir, e.Name())
		st, err := p.readState(dir)
		if errors.Is(err, fs.ErrNotExist) {
			// A Create that died before writing the state: the Machine has
			// no providerID yet, nor an agent (started only after the
			// state is written), and its next Create starts over.
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := p.loadMachine(ctx, dir, st, running[st.ProviderID]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// loadMachine takes over the machine in dir, whose agents pids are.
func (p *Provider) loadMachine(ctx context.Context, dir string, st state, pids []int) error {
	p.mu.Lock()
	m, ok := p.machines[st.ProviderID]
	p.mu.Unlock()
	if !ok {
		m = &machine{dir: dir}
	}
	// Locked before it is registered, under p.mu where Stop marks the
	// Provider stopped before it takes each machine's lock: a machine
	// registered here is one Stop stops, after its takeover.
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.takenOver {
		return nil
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return errStopped
	}
	p.machines[st.ProviderID] = m
	p.mu.Unlock()
	// What an earlier, failed attempt left is on disk and in /proc too.
	m.st, m.live, m.proc, m.exit = st, true, nil, nil
	if err := p.adoptOrBoot(ctx, m, pids); err != nil && !providers.IsPermanent(err) {
		return err
	}
	// A machine that cannot boot for good (its hardware refuses what it
	// was made with) stays off, taken over: retrying the takeover would
	// fail every call for every machine. A reboot or repair asked of it
	// gets the same permanent error.
	m.takenOver = true
	return nil
}

// adoptOrBoot takes over one machine, whose agents (from /proc) are pids:
// it adopts one (the recorded PID if it is among them), kills the others,
// and records the adopted PID; if none runs, it boots the machine. A
// pending operation is finished here if the previous provider had halted
// the agent (the recorded PID is 0 or no longer an agent): a repair's wipe
// is redone if no agent runs, the machine booted or the agent started
// after the halt adopted, and the operation recorded done. If the recorded
// PID is still a running agent, the halt never happened, and the operation
// stays pending for the caller's retry. Callers hold m.mu.
func (p *Provider) adoptOrBoot(ctx context.Context, m *machine, pids []int) error {
	id := m.st.ProviderID
	recorded := m.st.PID != 0 && slices.Contains(pids, m.st.PID)
	candidates := slices.Clone(pids)
	if recorded {
		// First choice.
		candidates = slices.DeleteFunc(candidates, func(pid int) bool { return pid == m.st.PID })
		candidates = slices.Insert(candidates, 0, m.st.PID)
	}
	kept := 0
	var errs []error
	for _, pid := range candidates {
		if kept == 0 && p.adopt(m, pid) {
			kept = pid
			continue
		}
		// A duplicate: one machine, one agent.
		if err := p.kill(pid, id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if kept == 0 {
		switch {
		case m.st.Deleting:
			// Its Delete was under way; the retry finishes it.
			return nil
		case m.st.Pending != nil:
			// A pending operation's halt happened, so this boot finishes it.
		case m.st.PID != 0 && !p.opts.ExitWithParent:
			// Its agent died by itself, or was killed: the machine
			// crashed. A controller restarting does not power machines
			// on; a reboot or a repair will. (Agents that die with their
			// provider, ExitWithParent, died of its death, not a crash.)
			return nil
		}
		// Stopped by a provider's Stop, or halted by one killed before it
		// booted the agent again.
		return p.boot(ctx, m)
	}
	next := m.st
	next.PID = kept
	// Still a running agent of the recorded PID, the halt never happened.
	if m.st.Pending != nil && !(recorded && kept == m.st.PID) {
		// The agent kept was started after the halt, and so finishes it.
		finish(&next)
	}
	if next.PID == m.st.PID && next.Pending == m.st.Pending {
		return nil
	}
	if err := p.writeState(m.dir, next); err != nil {
		return err
	}
	m.st = next
	return nil
}

// Stop terminates every agent it took over or started (SIGTERM, then
// SIGKILL after StopTimeout or once ctx ends) and waits until they are
// gone; it takes nothing over, so a Provider never called (a standby
// replica's) leaves every agent alone. Machines and their Nodes stay; a new
// Provider over the StateDir boots them again on its first call. After
// Stop, calls that would take machines over or start an agent fail.
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
	if err := p.takeOver(context.Background()); err != nil {
		return "", err
	}
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
	if err := p.takeOver(context.Background()); err != nil {
		return 0, err
	}
	m, err := p.lookup(providerID)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.running() {
		return 0, p.errorf("the agent of %q is not running", providerID)
	}
	return m.proc.Pid, nil
}

// BootID returns the boot ID the instance's current or last agent chose,
// empty if it has not chosen one yet.
func (p *Provider) BootID(providerID string) (string, error) {
	if err := p.takeOver(context.Background()); err != nil {
		return "", err
	}
	m, err := p.lookup(providerID)
	if err != nil {
		return "", err
	}
	id, err := p.hw.BootID(m.dir)
	if err != nil {
		return "", p.errorf("reading the boot ID of %s: %w", providerID, err)
	}
	return id, nil
}

// Describe implements providers.Actuator: an instance is on while its
// agent process runs, and its boot ID is the one that process chose as it
// started, before joining. A process just started may not have written
// its own yet, and the last boot's is reported until it has: never a boot
// that has not happened. Its owner is the one its state file records, and
// its join's failure the one its output last reported.
func (p *Provider) Describe(ctx context.Context, providerID string) (providers.Instance, error) {
	if err := p.takeOver(ctx); err != nil {
		return providers.Instance{}, err
	}
	m, err := p.lookup(providerID)
	if err != nil {
		return providers.Instance{}, err
	}
	m.mu.Lock()
	running, owner := m.running(), m.st.owner()
	m.mu.Unlock()
	if !running {
		return providers.Instance{Power: providers.PowerOff, Owner: owner}, nil
	}
	boot, err := p.BootID(providerID)
	if err != nil {
		return providers.Instance{}, err
	}
	failure, err := p.hw.JoinFailure(m.dir)
	if err != nil {
		return providers.Instance{}, p.errorf("reading how %s's join goes: %w", providerID, err)
	}
	in := providers.Instance{Power: providers.PowerOn, BootID: boot, Owner: owner, JoinFailure: failure}
	if a, ok := p.hw.(Addresser); ok {
		if in.Addresses, err = a.Addresses(m.dir); err != nil {
			return providers.Instance{}, p.errorf("reading where %s is reached: %w", providerID, err)
		}
	}
	return in, nil
}

// Restarts reports how many reboots and repairs the instance has done;
// tests use it to prove an operation ran exactly once.
func (p *Provider) Restarts(providerID string) (int, error) {
	if err := p.takeOver(context.Background()); err != nil {
		return 0, err
	}
	m, err := p.lookup(providerID)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Restarts, nil
}

// Create implements providers.Actuator. The providerID follows from the
// Machine alone, so a repeated call finds the same directory and starts the
// agent only if it is not running. The state file records the Machine as
// the machine's owner.
func (p *Provider) Create(ctx context.Context, mach *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	if err := providers.RequireJoin(join, fmt.Sprintf(p.hw.Name()+": creating an instance for machine %s/%s", mach.Namespace, mach.Name)); err != nil {
		return "", err
	}
	if err := p.takeOver(ctx); err != nil {
		return "", err
	}
	if id := mach.Spec.ProviderID; id != "" {
		return p.claim(mach, id)
	}
	if mach.UID == "" {
		return "", providers.Permanent(fmt.Errorf("machine %s/%s has no UID", mach.Namespace, mach.Name))
	}
	if id, ok, err := p.sameName(ctx, mach); ok || err != nil {
		return id, err
	}
	var spec json.RawMessage
	if class != nil && len(class.Spec.ProviderSpec.Raw) > 0 {
		spec = slices.Clone(class.Spec.ProviderSpec.Raw)
	}
	var capacity corev1.ResourceList
	if class != nil && class.Spec.NodeTemplate != nil {
		capacity = class.Spec.NodeTemplate.Capacity
	}
	// Before anything is made: a machine that could never boot leaves
	// nothing behind to take over.
	if err := p.hw.Check(spec, capacity, mach.Spec.Version); err != nil {
		return "", providers.Permanent(err)
	}
	id := providers.ProviderID(p.hw.Name(), mach)
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return "", errStopped
	}
	m, ok := p.machines[id]
	if !ok {
		m = &machine{dir: p.dir(mach.Namespace, mach.Name, mach.UID)}
		p.machines[id] = m
	}
	p.mu.Unlock()

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live {
		// Named after mach, yet it may have been handed to another.
		if err := providers.Claim(m.st.owner(), mach); err != nil {
			return "", err
		}
	}
	if !m.live {
		st := state{ProviderID: id, Owner: recorded(providers.OwnerOf(mach)), NodeName: providers.NodeName(mach.Name, mach.UID), Version: mach.Spec.Version}
		st.Capacity, st.Spec = capacity.DeepCopy(), spec
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			return "", p.errorf("creating %s: %w", id, err)
		}
		// The join data first: a machine with a state file is one the
		// takeover boots.
		if err := p.hw.Provision(m.dir, join); err != nil {
			return "", p.errorf("creating %s: %w", id, err)
		}
		if err := p.writeState(m.dir, st); err != nil {
			return "", err
		}
		m.st, m.live = st, true
	} else if !p.hw.Joined(m.dir) {
		// Not joined yet, perhaps for a token that expired: the next boot
		// tries the newer one.
		if err := p.hw.Provision(m.dir, join); err != nil {
			return "", p.errorf("creating %s: %w", id, err)
		}
	}
	if m.running() {
		return id, nil
	}
	if err := p.boot(ctx, m); err != nil {
		return "", err
	}
	return id, nil
}

// sameName takes, for mach, a machine recorded for another Machine of its
// namespace and name (providers.SameName): mach re-created under a new
// UID. The machine is kept as it runs (started if it is not), and mach is
// recorded as its owner. It reports false when mach has a machine of its
// own UID, or there is none of its name.
func (p *Provider) sameName(ctx context.Context, mach *machinistv1.Machine) (string, bool, error) {
	own := providers.ProviderID(p.hw.Name(), mach)
	p.mu.Lock()
	if _, ok := p.machines[own]; ok {
		p.mu.Unlock()
		return "", false, nil
	}
	all := make([]*machine, 0, len(p.machines))
	for _, m := range p.machines {
		all = append(all, m)
	}
	p.mu.Unlock()
	for _, m := range all {
		m.mu.Lock()
		if !m.live || !providers.SameName(m.st.owner(), mach) {
			m.mu.Unlock()
			continue
		}
		err := p.reown(m, mach)
		if err == nil && !m.running() {
			err = p.boot(ctx, m)
		}
		id := m.st.ProviderID
		m.mu.Unlock()
		return id, true, err
	}
	return "", false, nil
}

// reown records mach as m's owner in its state file. Called with m.mu
// held.
func (p *Provider) reown(m *machine, mach *machinistv1.Machine) error {
	next := m.st
	next.Owner = recorded(providers.OwnerOf(mach))
	if err := p.writeState(m.dir, next); err != nil {
		return err
	}
	m.st = next
	return nil
}

// claim returns providerID for mach if the machine it names belongs to
// mach already, or to a Machine of its name that is gone
// (providers.SameName), which it then records mach for. Every machine of
// this provider was made for a Machine, which owns it: there is none of
// no Machine's to hand over. The machine of another is refused before
// anything of it is touched, and so is the directory of another's Create
// under way, which becomes that Machine's machine once its state file is
// written.
func (p *Provider) claim(mach *machinistv1.Machine, providerID string) (string, error) {
	ns, name, uid, err := p.parse(providerID)
	if err != nil {
		return "", providers.Permanent(fmt.Errorf("cannot adopt %q: %w", providerID, err))
	}
	p.mu.Lock()
	m, ok := p.machines[providerID]
	p.mu.Unlock()
	if ok {
		m.mu.Lock()
		live, o := m.live, m.st.owner()
		m.mu.Unlock()
		if live {
			if err := providers.Claim(o, mach); err != nil {
				return "", err
			}
			if providers.SameName(o, mach) {
				m.mu.Lock()
				defer m.mu.Unlock()
				if err := p.reown(m, mach); err != nil {
					return "", err
				}
			}
			return providerID, nil
		}
	}
	if exists(p.dir(ns, name, uid)) {
		if err := providers.Claim(providers.Owner{Namespace: ns, Name: name, UID: uid}, mach); err != nil {
			return "", err
		}
	}
	return "", providers.Permanent(fmt.Errorf("cannot adopt %q: no such instance", providerID))
}

// Exists implements providers.Actuator: the machine's directory exists. A
// crashed machine exists; only Delete ends one.
func (p *Provider) Exists(ctx context.Context, providerID string) (bool, error) {
	if err := p.takeOver(ctx); err != nil {
		return false, err
	}
	ns, name, uid, err := p.parse(providerID)
	if err != nil {
		return false, providers.Permanent(err)
	}
	_, err = os.Stat(p.dir(ns, name, uid))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// FindByUID implements providers.Actuator: the machine whose state file
// records the Machine as its owner. The machine's directory is named
// after the Machine it was made for, its owner unless it was handed to
// another, so that is looked for first, and finds a Create that died
// before writing its state file too; only when none is found are the
// owners of every machine read.
func (p *Provider) FindByUID(ctx context.Context, uid types.UID) (string, error) {
	if err := p.takeOver(ctx); err != nil {
		return "", err
	}
	if uid == "" {
		return "", nil
	}
	if !strings.ContainsAny(string(uid), "/_*?[\\") {
		dirs, err := filepath.Glob(filepath.Join(p.opts.StateDir, "*_"+string(uid)))
		if err != nil {
			return "", err
		}
		for _, dir := range dirs {
			parts := strings.Split(filepath.Base(dir), "_")
			if len(parts) != 3 {
				return "", p.errorf("%s is not named <namespace>_<name>_<uid>", dir)
			}
			st, err := p.readState(dir)
			switch {
			case errors.Is(err, fs.ErrNotExist):
			case err != nil:
				return "", err
			case st.owner().UID != uid:
				continue
			}
			return providers.ProviderID(p.hw.Name(), &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{
				Namespace: parts[0], Name: parts[1], UID: uid}}), nil
		}
	}
	entries, err := os.ReadDir(p.opts.StateDir)
	if err != nil {
		return "", p.errorf("%w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		st, err := p.readState(filepath.Join(p.opts.StateDir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		if st.owner().UID == uid {
			return st.ProviderID, nil
		}
	}
	return "", nil
}

// List implements providers.Lister: every machine directory in StateDir,
// with the owner its state file records. A directory without a state file
// (a Create that stopped before writing it) is listed too, under the
// providerID its name makes and the Machine it was made for: it is
// something Delete still has to remove.
func (p *Provider) List(ctx context.Context) ([]providers.Listed, error) {
	if err := p.takeOver(ctx); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(p.opts.StateDir)
	if err != nil {
		return nil, p.errorf("%w", err)
	}
	var out []providers.Listed
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		st, err := p.readState(filepath.Join(p.opts.StateDir, e.Name()))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			parts := strings.Split(e.Name(), "_")
			if len(parts) != 3 {
				continue // not a machine's directory
			}
			m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: parts[0], Name: parts[1], UID: types.UID(parts[2])}}
			id := providers.ProviderID(p.hw.Name(), m)
			out = append(out, providers.Listed{ProviderID: id, Owner: madeFor(id)})
		case err != nil:
			return nil, err
		default:
			out = append(out, providers.Listed{ProviderID: st.ProviderID, Owner: st.owner()})
		}
	}
	return out, nil
}

// Delete implements providers.Actuator: it stops the agent and removes the
// machine's directory. The Node is the controller's to delete.
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	if err := p.takeOver(ctx); err != nil {
		return err
	}
	ns, name, uid, err := p.parse(providerID)
	if err != nil {
		return providers.Permanent(err)
	}
	p.mu.Lock()
	m, ok := p.machines[providerID]
	p.mu.Unlock()
	if !ok {
		// Not ours to stop (a directory without a state file), but still
		// ours to remove.
		return p.removeDir(p.dir(ns, name, uid))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live && !m.st.Deleting {
		next := m.st
		next.Deleting = true
		if err := p.writeState(m.dir, next); err != nil {
			return err
		}
		m.st = next
	}
	if err := p.halt(ctx, m, false); err != nil {
		return err
	}
	if err := p.removeDir(m.dir); err != nil {
		return err
	}
	m.live = false
	return nil
}

// Reboot implements providers.Actuator: the agent is stopped (SIGTERM, or
// SIGKILL for a hard reboot) and started again, and the new process boots
// with a new boot ID; the Node keeps what others put on it. A crashed
// machine comes back. A second call with the same op.ID does nothing.
func (p *Provider) Reboot(ctx context.Context, providerID string, op providers.Operation) error {
	return p.restart(ctx, providerID, op, false)
}

// Update implements providers.Actuator: like Reboot, but the new agent
// runs op.Version, so the same Node reports the new kubelet version. It
// is written ahead like every restart: a provider killed halfway leaves a
// machine the next one boots with the new version, once.
func (p *Provider) Update(ctx context.Context, providerID string, op providers.Operation) error {
	if op.Version == "" {
		return providers.Permanent(p.errorf("updating %s: no version to update to", providerID))
	}
	return p.restart(ctx, providerID, op, false)
}

// InPlace implements providers.Actuator: an agent can be restarted with
// another version; another class is another machine.
func (p *Provider) InPlace(change providers.Change) bool { return !change.Class }

// Repair implements providers.Actuator: like Reboot, but everything in the
// machine's directory except the provider's state file is wiped, the
// machine's credentials with it, and its Node and Lease are deleted, so
// the machine joins again with op.Join and its Node registers afresh
// without the labels and taints others had put on it.
func (p *Provider) Repair(ctx context.Context, providerID string, op providers.Operation) error {
	if err := providers.RequireJoin(op.Join, p.hw.Name()+": repairing "+providerID); err != nil {
		return err
	}
	return p.restart(ctx, providerID, op, true)
}

// restart carries out a reboot or a repair (wipe) once per op.ID. It is
// written ahead: the operation is recorded pending before it acts, and
// recorded done (LastOperation, Restarts+1, pending cleared) in the state
// write that records the new agent's PID. A call whose op.ID is the last
// done does nothing; one whose op.ID is pending carries it out, for it was
// not finished. Where a provider killed (SIGKILL) at any point leaves the
// machine, its next takeover (adoptOrBoot) and the caller's retry with the
// same op.ID restart it exactly once:
//
//   - before the pending write: nothing happened; the agent is adopted and
//     the retry restarts it.
//   - after it, before the agent exits (halt's signal sent or not): the
//     recorded PID is still an agent, which is adopted with the operation
//     left pending; the retry halts it and boots a new one. An agent that
//     exits before the takeover looks at it counts as halted, below.
//   - after the agent exited, before or after halt's write of PID 0, or
//     during the wipe: the recorded PID is 0 or no longer an agent and none
//     runs, so the takeover redoes a repair's wipe, boots the machine and
//     records the operation done; the retry does nothing.
//   - in start, after cmd.Start, before its state write: an agent runs
//     that the state does not name; the takeover finds it in /proc, adopts
//     it (it was started after the halt) and records the operation done;
//     the retry does nothing.
//   - after start's state write: done; the retry does nothing.
func (p *Provider) restart(ctx context.Context, providerID string, op providers.Operation, wipe bool) error {
	if err := p.takeOver(ctx); err != nil {
		return err
	}
	m, err := p.lookup(providerID)
	if err != nil {
		return providers.Permanent(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.live {
		return providers.Permanent(p.errorf("no instance %q", providerID))
	}
	if op.ID != "" && m.st.LastOperation == op.ID {
		return nil
	}
	// Before the halt: a machine that could not boot again (an update's
	// version whose files the hardware lacks, or its own version's files
	// gone since it booted) is left running, not off.
	verb, version := "rebooting", m.st.Version
	if wipe {
		verb = "repairing"
	}
	if op.Version != "" {
		verb, version = "updating", op.Version
	}
	if err := p.hw.Check(m.st.Spec, m.st.Capacity, version); err != nil {
		return providers.Permanent(fmt.Errorf("%s %s: %w", verb, providerID, err))
	}
	if wipe {
		// Before the repair is pending: whoever finishes it finds the join
		// data the wipe keeps.
		if err := p.hw.PrepareReimage(m.dir, op.Join); err != nil {
			return p.errorf("repairing %s: %w", providerID, err)
		}
	}
	// Write-ahead. A pending operation of another ID was abandoned by its
	// caller: this one replaces it.
	pending := &pendingOp{ID: op.ID, Repair: wipe, Hard: op.Hard, Version: op.Version}
	if m.st.Pending == nil || *m.st.Pending != *pending {
		next := m.st
		next.Pending = pending
		if err := p.writeState(m.dir, next); err != nil {
			return err
		}
		m.st = next
	}
	if err := p.halt(ctx, m, op.Hard); err != nil {
		return err
	}
	return p.boot(ctx, m)
}

// wipe re-images a stopped machine: its files but the state file and the
// join data go, its credentials with them, and the repair's join data
// takes the place of the old. Its next agent, finding no credentials,
// joins and deletes the old Node and Lease itself (nodeagent.Forget).
// Done again after a provider was killed halfway, it finds the repair's
// join data in place already and keeps it. Callers hold m.mu.
func (p *Provider) wipe(m *machine) error {
	if err := p.hw.Reimage(m.dir); err != nil {
		return p.errorf("repairing %s: %w", m.st.ProviderID, err)
	}
	return nil
}

// boot starts the agent of a machine whose agent is not running, and with
// it finishes a pending operation, whose halt is thereby done: a repair's
// wipe first, and the operation recorded done in the state write that
// records the agent's PID. Callers hold m.mu.
func (p *Provider) boot(ctx context.Context, m *machine) error {
	op := m.st.Pending
	if op == nil {
		return p.start(m, nil)
	}
	if op.Repair {
		if err := p.wipe(m); err != nil {
			// Off, not re-imaged: come back as before, the repair not
			// pending, and let the caller retry the whole repair.
			return errors.Join(err, p.start(m, func(st *state) { st.Pending = nil }))
		}
	}
	return p.start(m, finish)
}

// finish records st's pending operation done.
func finish(st *state) {
	if st.Pending.ID != "" {
		st.LastOperation = st.Pending.ID
	}
	if st.Pending.Version != "" {
		st.Version = st.Pending.Version
	}
	st.Restarts++
	st.Pending = nil
}

// start boots the machine's agent and records its PID, with what commit,
// unless nil, changes in the state, in one write. Callers hold m.mu, with no
// agent running.
func (p *Provider) start(m *machine, commit func(*state)) error {
	// Checked under p.mu, where Stop marks the Provider stopped before it
	// takes each machine's lock: an agent started here is one Stop stops.
	if p.isStopped() {
		return errStopped
	}
	// The state as it will be recorded: an update's agent boots its new
	// version.
	next := m.st
	if commit != nil {
		commit(&next)
	}
	cmd, err := p.hw.Command(Boot{Dir: m.dir, ProviderID: next.ProviderID, NodeName: next.NodeName,
		Version: next.Version, Capacity: next.Capacity, Spec: next.Spec})
	if err != nil {
		if providers.IsPermanent(err) {
			return err
		}
		return p.errorf("starting %s: %w", m.st.ProviderID, err)
	}
	// The process has its own descriptors.
	defer closeOutput(cmd)
	// Its own process group: a Ctrl-C meant for the provider's terminal is
	// not a machine crash, and Stop then ends the agents in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if p.opts.ExitWithParent {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := cmd.Start(); err != nil {
		return p.errorf("starting %s: %w", m.st.ProviderID, err)
	}
	exit := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exit)
	}()
	m.proc, m.exit = cmd.Process, exit
	next.PID = cmd.Process.Pid
	if err := p.writeState(m.dir, next); err != nil {
		// Not recorded, the agent is not started: the state stays as it
		// was, naming no running agent.
		return errors.Join(err, p.halt(context.Background(), m, true))
	}
	m.st = next
	return nil
}

// halt stops the machine's agent, if one runs, and waits until it is gone:
// SIGTERM first (SIGKILL at once when hard), SIGKILL after StopTimeout or
// when ctx ends. Callers hold m.mu.
func (p *Provider) halt(ctx context.Context, m *machine, hard bool) error {
	if m.running() {
		if err := p.hw.Halt(m.dir, m.proc, hard); err != nil {
			_ = m.proc.Kill()
		}
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
	next := m.st
	next.PID = 0
	if err := p.writeState(m.dir, next); err != nil {
		return err
	}
	m.st = next
	return nil
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

// adopt takes over pid, if it is a running agent of the machine, and
// reports whether it did. It is not our child, so nothing tells us when it
// exits: that is polled. Callers hold m.mu.
func (p *Provider) adopt(m *machine, pid int) bool {
	id := m.st.ProviderID
	if pid == 0 || !p.isBoot(pid, id) {
		return false
	}
	proc, err := os.FindProcess(pid)
	// Checked again now that proc pins the process: it may have exited,
	// and its PID been reused, in between.
	if err != nil || !p.isBoot(pid, id) {
		return false
	}
	exit := make(chan struct{})
	go func() {
		for p.isBoot(pid, id) {
			time.Sleep(100 * time.Millisecond)
		}
		close(exit)
	}()
	m.proc, m.exit = proc, exit
	return true
}

// kill ends pid (SIGKILL), if it is an agent of providerID, and waits until
// it is gone.
func (p *Provider) kill(pid int, providerID string) error {
	proc, err := os.FindProcess(pid)
	if err != nil || !p.isBoot(pid, providerID) {
		return nil // gone
	}
	defer proc.Release()
	_ = proc.Kill()
	deadline := time.Now().Add(p.opts.StopTimeout)
	for p.isBoot(pid, providerID) {
		if time.Now().After(deadline) {
			return p.errorf("a duplicate boot of %s, PID %d, survives SIGKILL", providerID, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// scan finds the live boots in /proc, by providerID, as isBoot checks
// for one PID.
func (p *Provider) scan() (map[string][]int, error) {
	found, err := processes(p.hw.Owner)
	if err != nil {
		return nil, p.errorf("finding the machines' processes: %w", err)
	}
	return found, nil
}

// processes finds this host's processes that owner recognises, by the
// providerID it says they serve.
func processes(owner func(argv []string) string) (map[string][]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	found := map[string][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if id := owner(argv(pid)); id != "" {
			found[id] = append(found[id], pid)
		}
	}
	return found, nil
}

// Agents finds the agent processes running on this host, by the
// providerID each serves, as a provider taking its machines over finds
// them: for whoever looks at the machines from outside, such as a test
// that checks none was restarted.
func Agents() (map[string][]int, error) { return processes(agents{}.Owner) }

// Instance is what a state directory records of one machine.
type Instance struct {
	// Namespace, Name and UID are those of the Machine the machine was
	// made for, which its directory is named after.
	Namespace, Name string
	UID             types.UID
	ProviderID      string
	// Owner is the Machine the machine belongs to: the one it was made
	// for, unless its state file records another.
	Owner providers.Owner
	// Restarts counts the reboots and repairs carried out.
	Restarts int
}

// Instances reads the machines a state directory holds, of every
// namespace. A directory whose state file was never written (a Create
// that died first) is listed with no providerID: it is still something
// the provider holds, until that Create runs again or the Machine goes.
func Instances(stateDir string) ([]Instance, error) {
	entries, err := os.ReadDir(stateDir)
	if err != nil {
		return nil, err
	}
	var out []Instance
	for _, e := range entries {
		// <namespace>_<name>_<uid>: Kubernetes names hold no '_'.
		parts := strings.Split(e.Name(), "_")
		if !e.IsDir() || len(parts) != 3 {
			continue
		}
		var st state
		raw, err := os.ReadFile(filepath.Join(stateDir, e.Name(), StateFile))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, err
		default:
			if err := json.Unmarshal(raw, &st); err != nil {
				return nil, fmt.Errorf("%s: %w", filepath.Join(stateDir, e.Name(), StateFile), err)
			}
		}
		in := Instance{Namespace: parts[0], Name: parts[1], UID: types.UID(parts[2]), ProviderID: st.ProviderID, Restarts: st.Restarts}
		in.Owner = providers.Owner{Namespace: in.Namespace, Name: in.Name, UID: in.UID}
		if st.ProviderID != "" {
			in.Owner = st.owner()
		}
		out = append(out, in)
	}
	return out, nil
}

// isBoot reports whether pid is a live boot of providerID. A PID alone
// could by now be any process's; the command line tells ours apart, and a
// zombie has none.
func (p *Provider) isBoot(pid int, providerID string) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	return p.hw.Owner(argv(pid)) == providerID
}

// errorf makes an error that names the provider.
func (p *Provider) errorf(format string, args ...any) error {
	return fmt.Errorf(p.hw.Name()+": "+format, args...)
}

var errStopped = errors.New("the provider is stopped")

func (p *Provider) isStopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
}

// lookup returns the live machine providerID names.
func (p *Provider) lookup(providerID string) (*machine, error) {
	if _, _, _, err := p.parse(providerID); err != nil {
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
		return nil, p.errorf("no instance %q", providerID)
	}
	return m, nil
}

// dir is a machine's directory. Namespaces and names cannot hold "_", so
// the name is unambiguous.
func (p *Provider) dir(namespace, name string, uid types.UID) string {
	return filepath.Join(p.opts.StateDir, namespace+"_"+name+"_"+string(uid))
}

func (p *Provider) readState(dir string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, p.errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	if _, _, _, err := p.parse(st.ProviderID); err != nil {
		return st, p.errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	return st, nil
}

// writeState replaces the state file by renaming, so a crash never leaves
// half of one.
func (p *Provider) writeState(dir string, st state) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, StateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return p.errorf("writing state of %s: %w", st.ProviderID, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, StateFile)); err != nil {
		return p.errorf("writing state of %s: %w", st.ProviderID, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func (p *Provider) removeDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return p.errorf("%w", err)
	}
	return nil
}

// parse splits one of this provider's providerIDs
// (providers.ProviderID) into its Machine's namespace, name and UID.
func (p *Provider) parse(providerID string) (namespace, name string, uid types.UID, err error) {
	return providers.ParseProviderID(p.hw.Name(), providerID)
}
