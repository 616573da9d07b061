// Package inmemory is a provider whose machines are goroutines: each
// Machine's instance is a nodeagent.Agent in this process, registering a
// real Node with the real apiserver. It exists for tests, demos and scale
// benchmarks, so it can also misbehave on request (see ProviderSpec).
//
// Each machine joins its cluster as a kubelet does: with the join data of
// Create (or of a Repair, which wipes what it had) its agent gets a client
// certificate of its own (nodeagent.Join), keeps it across reboots as a
// kubelet keeps its PKI directory, and acts as system:node:<its Node>
// only, watching only its own pods. The provider itself holds no
// credentials for any cluster: a repaired machine deletes the Node of its
// previous life with its own new ones (nodeagent.Forget).
package inmemory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/strictjson"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/nodeagent"
)

// Name is the provider name MachineClasses use for this provider.
const Name = "inmemory"

// ErrTransient is wrapped by every fault-injected transient error, so tests
// can tell injected failures from real ones.
var ErrTransient = errors.New("inmemory: injected transient failure")

// ErrNotFound is wrapped by the error for a providerID naming no instance.
var ErrNotFound = errors.New("inmemory: no such instance")

// ProviderSpec is MachineClass.spec.providerSpec for this provider. Every
// field injects a fault; the zero value is a well-behaved machine. Unknown
// fields are rejected so that a typo does not silently disable a fault.
//
//	providerSpec:
//	  createLatency: 2s      # Create takes this long (cancellable)
//	  errorRate: 0.5         # fraction of Create and Delete calls failing transiently
//	  neverReady: true       # Nodes register but never become Ready
//	  failCreate: "quota exceeded"  # Create fails permanently with this message
//	  failReboot: "host locked"     # Reboot fails permanently with this message
//	  failUpdate: "image missing"   # Update fails permanently with this message
type ProviderSpec struct {
	// CreateLatency is how long creating a new instance takes.
	CreateLatency metav1.Duration `json:"createLatency,omitempty"`
	// ErrorRate, from 0 to 1, is the fraction of Create and Delete calls
	// that fail with a transient error before doing anything.
	ErrorRate float64 `json:"errorRate,omitempty"`
	// NeverReady makes the instance's Node report Ready=False forever.
	NeverReady bool `json:"neverReady,omitempty"`
	// FailCreate, when set, is the message of a permanent error every
	// Create of a new instance fails with.
	FailCreate string `json:"failCreate,omitempty"`
	// RebootLatency is how long a rebooted, repaired or updated machine
	// stays off before it boots again.
	RebootLatency metav1.Duration `json:"rebootLatency,omitempty"`
	// FailReboot, when set, is the message of a permanent error every
	// Reboot fails with, as a provider that refuses to restart a machine
	// would answer; the machine keeps running. Repair is unaffected.
	FailReboot string `json:"failReboot,omitempty"`
	// FailUpdate, when set, is the message of a permanent error every
	// Update fails with, as a provider that has no image for the version
	// would answer; the machine keeps running the version it has.
	FailUpdate string `json:"failUpdate,omitempty"`
}

// ParseProviderSpec decodes raw strictly: unknown fields, trailing data and
// out-of-range values are errors. Empty raw is the zero ProviderSpec.
func ParseProviderSpec(raw []byte) (ProviderSpec, error) {
	var spec ProviderSpec
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return spec, nil
	}
	err := strictjson.Unmarshal(raw, &spec)
	switch {
	case errors.Is(err, strictjson.ErrTrailingData):
		return ProviderSpec{}, fmt.Errorf("inmemory providerSpec: %w", err)
	case err != nil:
		return ProviderSpec{}, fmt.Errorf("inmemory providerSpec: %w (known fields: createLatency, errorRate, neverReady, failCreate, rebootLatency, failReboot, failUpdate)", err)
	}
	if spec.ErrorRate < 0 || spec.ErrorRate > 1 {
		return ProviderSpec{}, fmt.Errorf("inmemory providerSpec: errorRate %v is not between 0 and 1", spec.ErrorRate)
	}
	if spec.RebootLatency.Duration < 0 {
		return ProviderSpec{}, fmt.Errorf("inmemory providerSpec: rebootLatency %v is negative", spec.RebootLatency.Duration)
	}
	if spec.CreateLatency.Duration < 0 {
		return ProviderSpec{}, fmt.Errorf("inmemory providerSpec: createLatency %v is negative", spec.CreateLatency.Duration)
	}
	return spec, nil
}

// over returns s with every zero field taken from base, so a class can
// strengthen the faults set on the Provider without repeating them.
func (s ProviderSpec) over(base ProviderSpec) ProviderSpec {
	if s.CreateLatency.Duration == 0 {
		s.CreateLatency = base.CreateLatency
	}
	if s.ErrorRate == 0 {
		s.ErrorRate = base.ErrorRate
	}
	s.NeverReady = s.NeverReady || base.NeverReady
	if s.FailCreate == "" {
		s.FailCreate = base.FailCreate
	}
	if s.RebootLatency.Duration == 0 {
		s.RebootLatency = base.RebootLatency
	}
	if s.FailReboot == "" {
		s.FailReboot = base.FailReboot
	}
	if s.FailUpdate == "" {
		s.FailUpdate = base.FailUpdate
	}
	return s
}

// Options configure a Provider. It holds no credentials for any cluster:
// each machine joins its own with the join data it is given, and a
// repaired one deletes its old Node itself (nodeagent.Forget).
type Options struct {
	// LeaseDurationSeconds is each Node's Lease duration; zero means the
	// kubelet's 40.
	LeaseDurationSeconds int32
	// RenewInterval is how often each Node's Lease is renewed; zero means
	// the kubelet's 10s.
	RenewInterval time.Duration
	// Seed makes ErrorRate's choices repeatable.
	Seed uint64
}

// Provider is the in-memory providers.Actuator. Its instances live until
// deleted or until Stop.
type Provider struct {
	opts Options
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu        sync.Mutex
	faults    ProviderSpec
	failNext  int
	loseNext  int
	rand      *rand.Rand
	byID      map[string]*instance
	byUID     map[types.UID]*instance
	creating  map[types.UID]chan struct{}
	isStopped bool
}

var _ providers.Actuator = (*Provider)(nil)

// New returns a Provider; call Stop to end it.
func New(opts Options) (*Provider, error) {
	ctx, stop := context.WithCancel(context.Background())
	p := &Provider{
		opts:     opts,
		ctx:      ctx,
		stop:     stop,
		rand:     rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		byID:     map[string]*instance{},
		byUID:    map[types.UID]*instance{},
		creating: map[types.UID]chan struct{}{},
	}
	return p, nil
}

// Stop powers off every instance and waits for them. The
// Nodes stay, with Leases that expire. Calls after Stop fail.
func (p *Provider) Stop() {
	p.mu.Lock()
	p.isStopped = true
	p.mu.Unlock()
	p.stop()
	p.wg.Wait()
}

// SetFaults sets faults that apply to every Machine; a class's
// providerSpec overrides them field by field where it sets a field.
func (p *Provider) SetFaults(f ProviderSpec) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = f
}

// FailNext makes the next n Create, Delete, Reboot or Repair calls fail
// with a transient error before doing anything. Exists is spared because
// the controller polls it at its own pace, which would make n unpredictable.
func (p *Provider) FailNext(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failNext = max(n, 0)
}

// LoseNextReplies makes the next n Reboot or Repair calls take effect (a
// repeated operation ID: none) and then fail with a transient error, as a
// reply lost on its way back: the caller cannot tell it from a call that
// did nothing, and must not repeat the operation.
func (p *Provider) LoseNextReplies(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.loseNext = max(n, 0)
}

// Instances lists the providerIDs of every instance that exists: created
// and not deleted, running or not. Tests keep their books with it: each
// belongs to a live Machine, or to none yet (MakeUnowned), or it leaked.
func (p *Provider) Instances() []string {
	p.mu.Lock()
	all := make([]*instance, 0, len(p.byID))
	for _, in := range p.byID {
		all = append(all, in)
	}
	p.mu.Unlock()
	var ids []string
	for _, in := range all {
		in.mu.Lock()
		if !in.destroyed {
			ids = append(ids, in.providerID)
		}
		in.mu.Unlock()
	}
	slices.Sort(ids)
	return ids
}

// NodeName returns the Node name of the instance providerID names.
func (p *Provider) NodeName(providerID string) (string, error) {
	in, err := p.lookup(providerID)
	if err != nil {
		return "", err
	}
	return in.nodeName, nil
}

// BootID returns the boot ID of the current or last boot of the instance
// providerID names, empty if it has never booted.
func (p *Provider) BootID(providerID string) (string, error) {
	in, err := p.lookup(providerID)
	if err != nil {
		return "", err
	}
	return in.bootID(), nil
}

// Describe implements providers.Actuator: an instance is on from its
// power-on to its crash or power-off, and its boot ID is the one its
// power-on chose, as a kernel's is: known before the machine joins, so a
// machine repaired while its cluster is down reports its new boot. Its
// owner is the Machine it was made for or adopted by.
func (p *Provider) Describe(_ context.Context, providerID string) (providers.Instance, error) {
	in, err := p.lookup(providerID)
	if err != nil {
		return providers.Instance{}, err
	}
	p.mu.Lock()
	owner := in.owner
	p.mu.Unlock()
	in.mu.Lock()
	on := in.cancel != nil
	in.mu.Unlock()
	if !on {
		return providers.Instance{Power: providers.PowerOff, Owner: owner}, nil
	}
	in.disk.Lock()
	failure := in.joinFailure
	in.disk.Unlock()
	return providers.Instance{Power: providers.PowerOn, BootID: in.bootID(), Owner: owner, JoinFailure: failure}, nil
}

// MakeUnowned makes an instance as one made outside Machinist would be:
// it belongs to no Machine, is powered off and has no join data, and its
// providerID, inmemory:///<namespace>/<name>/<a UID of its own>, names no
// Machine of the cluster. A Machine whose spec.providerID names it adopts
// it: the instance becomes that Machine's, and boots and joins with that
// Machine's join data and version. The provider's faults apply to it; no
// class's do.
func (p *Provider) MakeUnowned(namespace, name string) (string, error) {
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uuid.NewUUID()}}
	providerID := providers.ProviderID(Name, m)
	if _, _, _, err := parseProviderID(providerID); err != nil {
		return "", err
	}
	in := &instance{
		providerID: providerID,
		nodeName:   providers.NodeName(m.Name, m.UID),
		p:          p,
	}
	in.cfg = nodeagent.Config{
		NodeName:             in.nodeName,
		ProviderID:           providerID,
		LeaseDurationSeconds: p.opts.LeaseDurationSeconds,
		RenewInterval:        p.opts.RenewInterval,
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isStopped {
		return "", errors.New("inmemory: provider is stopped")
	}
	p.byID[providerID] = in
	return providerID, nil
}

// Crash kills the instance as a hardware failure would: its agent stops at
// once and its Lease expires, but the instance still exists. Reboot or
// Repair bring it back.
func (p *Provider) Crash(providerID string) error {
	in, err := p.lookup(providerID)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.powerOff()
	return nil
}

// Break fails the instance's hardware for good, as a machine whose
// network card died: it restarts at once, and from then on its Node
// reports Ready=False after every boot, reboot or repair, until the
// instance is deleted. Its Machine can only be healed by replacing it.
func (p *Provider) Break(providerID string) error {
	in, err := p.lookup(providerID)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.powerOff()
	in.faults.NeverReady, in.cfg.NeverReady = true, true
	in.powerOn()
	return nil
}

// Create implements providers.Actuator: the new instance's agent joins
// the cluster with join as it first boots.
func (p *Provider) Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	if err := providers.RequireJoin(join, fmt.Sprintf("inmemory: creating an instance for machine %s/%s", m.Namespace, m.Name)); err != nil {
		return "", err
	}
	if err := p.injectFailure(nil); err != nil {
		return "", err
	}
	spec, err := p.classFaults(class)
	if err != nil {
		return "", err
	}

	if m.Spec.ProviderID != "" {
		return p.adopt(m, class, join)
	}

	for {
		p.mu.Lock()
		if p.isStopped {
			p.mu.Unlock()
			return "", errors.New("inmemory: provider is stopped")
		}
		if in, ok := p.byUID[m.UID]; ok {
			p.mu.Unlock()
			return in.providerID, nil
		}
		if in := p.sameNameLocked(m); in != nil {
			// m re-created under a new UID: its instance, as it runs.
			p.reownLocked(in, m)
			p.mu.Unlock()
			return in.providerID, nil
		}
		if p.roll(spec.ErrorRate) {
			p.mu.Unlock()
			return "", fmt.Errorf("creating instance for machine %s/%s: %w (errorRate %v)", m.Namespace, m.Name, ErrTransient, spec.ErrorRate)
		}
		wait, busy := p.creating[m.UID]
		if !busy {
			p.creating[m.UID] = make(chan struct{})
		}
		p.mu.Unlock()
		if !busy {
			break
		}
		// Another call is creating this Machine's instance: its result is
		// ours too, so wait rather than create a second one.
		select {
		case <-wait:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	in, err := p.create(ctx, m, class, spec, join)
	p.mu.Lock()
	close(p.creating[m.UID])
	delete(p.creating, m.UID)
	if err == nil {
		p.byID[in.providerID] = in
		p.byUID[m.UID] = in
	}
	p.mu.Unlock()
	if err != nil {
		return "", err
	}
	in.mu.Lock()
	in.powerOn()
	in.mu.Unlock()
	return in.providerID, nil
}

// adopt hands m the instance its spec.providerID names, if that belongs
// to no Machine or to m already (providers.Claim), and touches nothing of
// one that belongs to another. An instance that belonged to none becomes
// m's, and boots with m's join data, version and capacity.
func (p *Provider) adopt(m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	in, err := p.lookup(m.Spec.ProviderID)
	if err != nil {
		return "", providers.Permanent(fmt.Errorf("cannot adopt %q: %w", m.Spec.ProviderID, err))
	}
	if m.UID == "" {
		return "", providers.Permanent(fmt.Errorf("machine %s/%s has no UID", m.Namespace, m.Name))
	}
	// The owner is checked and taken under p.mu, so that of two Machines
	// adopting one instance at once, one gets it.
	p.mu.Lock()
	if p.byID[in.providerID] != in {
		// Deleted since the lookup.
		p.mu.Unlock()
		return "", providers.Permanent(fmt.Errorf("cannot adopt %q: %w", in.providerID, ErrNotFound))
	}
	if err := providers.Claim(in.owner, m); err != nil {
		p.mu.Unlock()
		return "", err
	}
	unowned := in.owner.IsZero()
	p.reownLocked(in, m)
	p.mu.Unlock()
	if !unowned {
		return in.providerID, nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.destroyed {
		return "", providers.Permanent(fmt.Errorf("cannot adopt %q: %w", in.providerID, ErrNotFound))
	}
	in.cfg.Version = m.Spec.Version
	if class != nil && class.Spec.NodeTemplate != nil {
		in.cfg.Capacity = class.Spec.NodeTemplate.Capacity.DeepCopy()
	}
	in.disk.Lock()
	in.join = join
	in.disk.Unlock()
	in.powerOn()
	return in.providerID, nil
}

// sameNameLocked is the instance recorded for another Machine of m's
// namespace and name (providers.SameName), or nil. Called with p.mu held.
func (p *Provider) sameNameLocked(m *machinistv1.Machine) *instance {
	for _, in := range p.byID {
		if providers.SameName(in.owner, m) {
			return in
		}
	}
	return nil
}

// reownLocked records m as in's owner, in place of any other. Called with
// p.mu held.
func (p *Provider) reownLocked(in *instance, m *machinistv1.Machine) {
	if !in.owner.IsZero() && in.owner.UID != m.UID {
		delete(p.byUID, in.owner.UID)
	}
	in.owner = providers.OwnerOf(m)
	p.byUID[m.UID] = in
}

func (p *Provider) create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, spec ProviderSpec, join providers.Join) (*instance, error) {
	if spec.FailCreate != "" {
		return nil, providers.Permanent(fmt.Errorf("creating instance for machine %s/%s: %s", m.Namespace, m.Name, spec.FailCreate))
	}
	if m.UID == "" {
		return nil, providers.Permanent(fmt.Errorf("machine %s/%s has no UID", m.Namespace, m.Name))
	}
	if d := spec.CreateLatency.Duration; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	providerID := providers.ProviderID(Name, m)
	cfg := nodeagent.Config{
		NodeName:             providers.NodeName(m.Name, m.UID),
		ProviderID:           providerID,
		Version:              m.Spec.Version,
		LeaseDurationSeconds: p.opts.LeaseDurationSeconds,
		RenewInterval:        p.opts.RenewInterval,
		NeverReady:           spec.NeverReady,
	}
	if class != nil && class.Spec.NodeTemplate != nil {
		cfg.Capacity = class.Spec.NodeTemplate.Capacity.DeepCopy()
	}
	return &instance{
		providerID: providerID,
		nodeName:   cfg.NodeName,
		owner:      providers.OwnerOf(m),
		faults:     spec,
		cfg:        cfg,
		join:       join,
		p:          p,
	}, nil
}

// Exists implements providers.Actuator. A crashed instance exists; only
// Delete ends one.
func (p *Provider) Exists(_ context.Context, providerID string) (bool, error) {
	if _, _, _, err := parseProviderID(providerID); err != nil {
		return false, providers.Permanent(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.byID[providerID]
	return ok, nil
}

// FindByUID implements providers.Actuator: the instance made for the
// Machine, or adopted by it.
func (p *Provider) FindByUID(_ context.Context, uid types.UID) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if in, ok := p.byUID[uid]; ok {
		return in.providerID, nil
	}
	return "", nil
}

// List implements providers.Lister: every instance not deleted, on or
// off, with its owner, in the order of their provider IDs.
func (p *Provider) List(context.Context) ([]providers.Listed, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]providers.Listed, 0, len(p.byID))
	for id, in := range p.byID {
		out = append(out, providers.Listed{ProviderID: id, Owner: in.owner})
	}
	slices.SortFunc(out, func(a, b providers.Listed) int { return strings.Compare(a.ProviderID, b.ProviderID) })
	return out, nil
}

// Delete implements providers.Actuator. It powers the instance off and
// forgets it; the Node is the controller's to delete.
func (p *Provider) Delete(_ context.Context, providerID string) error {
	if _, _, _, err := parseProviderID(providerID); err != nil {
		return providers.Permanent(err)
	}
	p.mu.Lock()
	in, ok := p.byID[providerID]
	p.mu.Unlock()
	var faults *ProviderSpec
	if ok {
		faults = &in.faults
	}
	if err := p.injectFailure(faults); err != nil {
		return err
	}
	if !ok {
		return nil
	}
	in.mu.Lock()
	in.powerOff()
	in.destroyed = true
	in.mu.Unlock()
	p.mu.Lock()
	delete(p.byID, providerID)
	for uid, other := range p.byUID {
		if other == in {
			delete(p.byUID, uid)
		}
	}
	p.mu.Unlock()
	return nil
}

// Reboot implements providers.Actuator: the agent stops and boots again
// with a new boot ID; the Node keeps what others put on it. A crashed
// instance comes back. A second call with the same op.ID does nothing.
func (p *Provider) Reboot(ctx context.Context, providerID string, op providers.Operation) error {
	return p.restart(ctx, providerID, op, reboot)
}

// Repair implements providers.Actuator: like Reboot, but the machine comes
// back from a fresh image, so nothing of its previous agent survives: its
// credentials are gone, and it joins again with op.Join; its Node and
// Lease are deleted and registered again, without the labels and taints
// others had put on them.
func (p *Provider) Repair(ctx context.Context, providerID string, op providers.Operation) error {
	return p.restart(ctx, providerID, op, repair)
}

// Update implements providers.Actuator: like Reboot, but the machine
// boots op.Version; its Node keeps its name and what others put on it, and
// reports the new version. A second call with the same op.ID does nothing.
func (p *Provider) Update(ctx context.Context, providerID string, op providers.Operation) error {
	return p.restart(ctx, providerID, op, update)
}

// InPlace implements providers.Actuator: a new version is a restart of
// the agent, but a machine of another class is another machine.
func (p *Provider) InPlace(change providers.Change) bool { return !change.Class }

// restartKind is what a restart does besides powering the machine off and
// on again.
type restartKind int

const (
	reboot restartKind = iota
	// repair wipes the machine: its Node registers afresh.
	repair
	// update boots the operation's version.
	update
)

func (k restartKind) String() string {
	return [...]string{"reboot", "repair", "update"}[k]
}

func (p *Provider) restart(ctx context.Context, providerID string, op providers.Operation, kind restartKind) error {
	wipe := kind == repair
	if wipe {
		if err := providers.RequireJoin(op.Join, "inmemory: repairing "+providerID); err != nil {
			return err
		}
	}
	if err := p.injectFailure(nil); err != nil {
		return err
	}
	in, err := p.lookup(providerID)
	if err != nil {
		return providers.Permanent(err)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if msg := in.faults.FailReboot; msg != "" && kind == reboot {
		return providers.Permanent(fmt.Errorf("rebooting %s: %s", providerID, msg))
	}
	if msg := in.faults.FailUpdate; msg != "" && kind == update {
		return providers.Permanent(fmt.Errorf("updating %s to %s: %s", providerID, op.Version, msg))
	}
	if kind == update && op.Version == "" {
		return providers.Permanent(fmt.Errorf("updating %s: no version to update to", providerID))
	}
	if op.ID != "" && in.lastOp == op.ID {
		return p.loseReply(kind)
	}
	in.powerOff()
	if wipe {
		in.reimage(op.Join)
	}
	if kind == update {
		in.cfg.Version = op.Version
	}
	if latency := in.faults.RebootLatency.Duration; latency > 0 {
		in.powerOnAfter(latency)
	} else {
		in.powerOn()
	}
	if op.ID != "" {
		in.lastOp = op.ID
	}
	in.restarts++
	return p.loseReply(kind)
}

// loseReply fails a Reboot, Repair or Update that was carried out, if
// LoseNextReplies asked for it.
func (p *Provider) loseReply(kind restartKind) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.loseNext == 0 {
		return nil
	}
	p.loseNext--
	return fmt.Errorf("%w (LoseNextReplies: the %s was carried out)", ErrTransient, kind)
}

// Restarts reports how many reboots, repairs and updates the instance has
// done; tests use it to prove an operation ran exactly once.
func (p *Provider) Restarts(providerID string) (int, error) {
	in, err := p.lookup(providerID)
	if err != nil {
		return 0, err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.restarts, nil
}

// injectFailure consumes one FailNext, or rolls the error rate of faults
// (the Provider's when nil) merged over the Provider's.
func (p *Provider) injectFailure(faults *ProviderSpec) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isStopped {
		return errors.New("inmemory: provider is stopped")
	}
	if p.failNext > 0 {
		p.failNext--
		return fmt.Errorf("%w (FailNext)", ErrTransient)
	}
	if faults == nil {
		return nil
	}
	rate := faults.over(p.faults).ErrorRate
	if p.roll(rate) {
		return fmt.Errorf("%w (errorRate %v)", ErrTransient, rate)
	}
	return nil
}

// roll reports true with probability rate. Callers hold p.mu.
func (p *Provider) roll(rate float64) bool {
	return rate > 0 && p.rand.Float64() < rate
}

// classFaults returns the faults for a Machine of class: its providerSpec
// over the Provider's. A providerSpec that does not parse is permanent: no
// retry makes it valid.
func (p *Provider) classFaults(class *machinistv1.MachineClass) (ProviderSpec, error) {
	var spec ProviderSpec
	if class != nil {
		raw := class.Spec.ProviderSpec.Raw
		if raw == nil && class.Spec.ProviderSpec.Object != nil {
			var err error
			if raw, err = json.Marshal(class.Spec.ProviderSpec.Object); err != nil {
				return ProviderSpec{}, providers.Permanent(fmt.Errorf("inmemory providerSpec: %w", err))
			}
		}
		var err error
		if spec, err = ParseProviderSpec(raw); err != nil {
			return ProviderSpec{}, providers.Permanent(fmt.Errorf("machineclass %s/%s: %w", class.Namespace, class.Name, err))
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return spec.over(p.faults), nil
}

func (p *Provider) lookup(providerID string) (*instance, error) {
	if _, _, _, err := parseProviderID(providerID); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	in, ok := p.byID[providerID]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, providerID)
	}
	return in, nil
}

// instance is one machine. Its mutex orders power changes so that a Reboot
// racing a Crash or Delete leaves one agent running or none.
type instance struct {
	providerID string
	nodeName   string
	// owner is the Machine the instance belongs to, zero for one made by
	// MakeUnowned until a Machine adopts it. Guarded by p.mu, under which
	// byUID changes with it.
	owner  providers.Owner
	faults ProviderSpec
	// cfg is what each boot's agent runs with, but for its client, which
	// comes from the machine's credentials.
	cfg nodeagent.Config
	p   *Provider

	// disk is what survives a power cycle: the join data, and the client
	// made of the credentials got with it (nil until joined). The running
	// boot writes it once joined, while mu may be held by a caller
	// waiting to power off, so it has a lock of its own.
	disk sync.Mutex
	join providers.Join
	kube kubernetes.Interface
	// joinFailure is why the running boot's join is failing, as it last
	// said; nil once it has joined.
	joinFailure *providers.JoinFailure

	// booted guards bootedAs, the ID of the current or last boot, which
	// its power-on chooses.
	booted   sync.Mutex
	bootedAs string

	mu      sync.Mutex
	cancel  context.CancelFunc
	stopped chan struct{}
	// lastOp is the ID of the last reboot or repair carried out, so that a
	// repeated call does not restart the machine twice.
	lastOp    string
	restarts  int
	destroyed bool
}

// powerOnAfter boots the agent once d has passed, unless the Provider
// stopped meanwhile. Callers hold in.mu.
func (in *instance) powerOnAfter(d time.Duration) {
	p := in.p
	p.mu.Lock()
	if p.isStopped {
		p.mu.Unlock()
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		select {
		case <-time.After(d):
		case <-p.ctx.Done():
			return
		}
		in.mu.Lock()
		defer in.mu.Unlock()
		if !in.destroyed {
			in.powerOn()
		}
	}()
}

// bootID is the ID of the current or last boot, empty before the first.
func (in *instance) bootID() string {
	in.booted.Lock()
	defer in.booted.Unlock()
	return in.bootedAs
}

// reimage wipes the machine's credentials and leaves join for its next
// boot to join with; that boot deletes the old Node and Lease itself
// (nodeagent.Forget), so that the Node registers afresh. Callers hold
// in.mu with the agent off.
func (in *instance) reimage(join providers.Join) {
	in.disk.Lock()
	defer in.disk.Unlock()
	in.join, in.kube, in.joinFailure = join, nil, nil
}

// boot joins the cluster unless the machine holds credentials from an
// earlier boot, then runs an agent acting as the machine's Node until ctx
// ends. cfg is the agent's Config as the boot began.
func (in *instance) boot(ctx context.Context, cfg nodeagent.Config) error {
	kube, err := in.credentials(ctx)
	if err != nil {
		return err
	}
	cfg.Client = kube
	return nodeagent.New(cfg).Run(ctx)
}

// credentials returns a client acting as the machine's Node, joining the
// cluster first if the machine has no credentials, and then forgetting
// its previous life; it retries a failed join, as a kubelet does, until
// ctx ends.
func (in *instance) credentials(ctx context.Context) (kubernetes.Interface, error) {
	in.disk.Lock()
	kube, join := in.kube, in.join
	in.disk.Unlock()
	if kube != nil {
		return kube, nil
	}
	log := ctrllog.FromContext(ctx)
	delay := 100 * time.Millisecond
	report := nodeagent.Progress(in.joinFailed).Patient()
	for {
		creds, err := nodeagent.Join(ctx, join, in.nodeName, report)
		if err == nil {
			kube, err := kubernetes.NewForConfig(creds.Config())
			if err != nil {
				// Credentials that make no client will not make one later.
				return nil, fmt.Errorf("inmemory: a client for node %s: %w", in.nodeName, err)
			}
			if err := nodeagent.Forget(ctx, creds.Config(), in.nodeName, in.providerID); err != nil {
				return nil, err
			}
			in.disk.Lock()
			in.kube, in.joinFailure = kube, nil
			in.disk.Unlock()
			return kube, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		report(nodeagent.ExplainJoin(err))
		log.Error(err, "Joining the cluster failed; retrying", "node", in.nodeName, "after", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// joinFailed keeps why the join is failing, for Describe.
func (in *instance) joinFailed(e *nodeagent.JoinError) {
	in.disk.Lock()
	defer in.disk.Unlock()
	in.joinFailure = &providers.JoinFailure{Reason: e.Reason, Message: e.Message}
}

// powerOn boots the agent unless it runs or the Provider has stopped.
// Callers hold in.mu.
func (in *instance) powerOn() {
	if in.cancel != nil {
		return
	}
	p := in.p
	// Counting the goroutine under p.mu, where Stop marks the Provider
	// stopped, keeps Stop's Wait from missing an agent that boots meanwhile.
	p.mu.Lock()
	if p.isStopped {
		p.mu.Unlock()
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	ctx, cancel := context.WithCancel(p.ctx)
	ctx = ctrllog.IntoContext(ctx, ctrllog.FromContext(ctx).WithValues("providerID", in.providerID))
	done := make(chan struct{})
	in.cancel, in.stopped = cancel, done
	cfg := in.cfg
	cfg.BootID = string(uuid.NewUUID())
	in.booted.Lock()
	in.bootedAs = cfg.BootID
	in.booted.Unlock()
	go func() {
		defer p.wg.Done()
		defer close(done)
		if err := in.boot(ctx, cfg); err != nil && ctx.Err() == nil {
			ctrllog.FromContext(ctx).Error(err, "Machine agent stopped")
		}
	}()
}

// powerOff stops the agent and waits until it can write no more. Callers
// hold in.mu.
func (in *instance) powerOff() {
	if in.cancel == nil {
		return
	}
	in.cancel()
	<-in.stopped
	in.cancel, in.stopped = nil, nil
}

// parseProviderID splits one of this provider's providerIDs
// (providers.ProviderID) into its Machine's namespace, name and UID.
func parseProviderID(providerID string) (namespace, name string, uid types.UID, err error) {
	return providers.ParseProviderID(Name, providerID)
}
