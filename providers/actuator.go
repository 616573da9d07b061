// Package providers defines what a provider must do for Machinist (the
// Actuator interface) and a registry that picks one by
// MachineClass.spec.provider. Providers live in subpackages.
package providers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
)

// Actuator creates, inspects, reboots, repairs and destroys the instance
// behind a Machine. The Machine controller is its only caller; it calls from
// many goroutines at once, so implementations must be safe for concurrent use.
//
// Errors are transient (the controller retries with backoff) unless wrapped
// with Permanent, which moves the Machine to Failed.
//
// Machines join their cluster as kubelets do: Create, and Repair through
// Operation.Join, carry a bootstrap.Join that the provider passes to the
// machine, whose agent trades its bootstrap token for a certificate of its
// own (system:node:<node name>). The provider gives its machines no
// credentials of its own. The token is a credential: a provider never
// logs it, and keeps it nowhere but on the machine itself (its disk, its
// user data), not in its own records, events or errors. A zero Join is
// refused with RequireJoin's permanent error: no retry of the same
// request brings join data.
//
// One instance, one Machine. A provider records on the instance itself
// the Machine it belongs to, OwnerOf(m), as Create makes it for m or m
// adopts it, reports it in Describe, and never hands one Machine's
// instance to another: a Machine of one namespace that names, in
// spec.providerID, the instance of a Machine in another would otherwise
// reach it with every delete, reboot and repair of its own.
type Actuator interface {
	// Create makes the instance for m and returns its providerID; the
	// instance joins its cluster with join, and records OwnerOf(m) as its
	// owner. It is idempotent on m.UID: calling it again for the same
	// Machine returns the same instance (a machine that has not joined
	// yet may be given the newer join). Failing an instance of m's UID, it
	// takes one recorded for m's namespace and name under another UID
	// (SameName), records m as its owner and returns it, as it runs.
	//
	// When m.Spec.ProviderID is set, Create adopts that instance instead,
	// and fails permanently if it does not exist. It adopts an instance
	// that belongs to no Machine (one made outside Machinist), recording
	// m as its owner and giving it join, or one that belongs to m already
	// (the same UID: a repeated call), and no other: the instance of
	// another Machine is refused with a Permanent error wrapping
	// ErrTaken, and left untouched, no join data written to it, no
	// restart, nothing. The error's message names neither the other
	// Machine nor its namespace or UID (nor, then, a providerID that
	// carries them), which m's author may not know.
	Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join Join) (providerID string, err error)

	// Exists reports whether the instance named by providerID still exists.
	Exists(ctx context.Context, providerID string) (bool, error)

	// Delete destroys the instance. Deleting one that is gone is not an error.
	Delete(ctx context.Context, providerID string) error

	// FindByUID returns the providerID of the instance that belongs to
	// the Machine with this UID, made for it or adopted by it, or "" when
	// there is none. The controller asks it when a Machine is deleted with
	// no providerID stored (Create succeeded but the status write that
	// recorded it did not), so that no instance outlives its Machine.
	FindByUID(ctx context.Context, uid types.UID) (providerID string, err error)

	// Reboot restarts the instance; its Node reports a new boot ID after.
	// It is idempotent on op.ID: a second call for the same operation
	// (a controller that crashed before recording the first) must not
	// reboot again. A Machine has one operation at a time and a finished
	// one is never repeated, so remembering the last ID is enough.
	Reboot(ctx context.Context, providerID string, op Operation) error

	// Repair re-images the instance: fresh state, a new boot ID, a Node
	// registered afresh. The re-imaged machine has lost its credentials
	// and joins again with op.Join; as a kubelet joining anew, it deletes
	// the Node and Lease of its previous life itself (nodeagent.Forget),
	// so the provider needs no credentials for the Machine's cluster,
	// which it may not even know. It is idempotent on op.ID, like Reboot.
	Repair(ctx context.Context, providerID string, op Operation) error

	// Update changes the instance in place to run op.Version: it
	// restarts, and its Node, under the same name and keeping what others
	// put on it, reports the new version and a new boot ID. It is
	// idempotent on op.ID, like Reboot. The controller calls it only for a
	// change InPlace accepts.
	Update(ctx context.Context, providerID string, op Operation) error

	// InPlace reports whether Update can apply change to an instance of
	// this provider; a change it cannot apply needs a new instance.
	InPlace(change Change) bool

	// Describe reports what the provider itself knows of the instance
	// now: whether it is powered on, the boot ID of its running boot, the
	// Machine it belongs to, as recorded on the instance, and why its
	// join is failing, when the machine has said. The
	// controller asks it while the Machine's cluster cannot be reached,
	// to complete a reboot on the provider's word, and checks the word
	// against the Node's boot ID once the cluster answers. A provider that
	// cannot tell returns a zero Instance, not an error.
	Describe(ctx context.Context, providerID string) (Instance, error)
}

// Instance is what a provider knows of an instance without its cluster.
type Instance struct {
	// Power is whether the instance runs; PowerUnknown when the provider
	// cannot tell.
	Power Power
	// BootID is the boot ID of the instance's running boot, the one its
	// kernel gives (/proc/sys/kernel/random/boot_id) and its Node reports
	// in nodeInfo.bootID; "" when the provider cannot tell, or the
	// instance is off.
	BootID string
	// Owner is the Machine the instance belongs to, whether it is on or
	// off; zero when it belongs to none, or the provider records none or
	// cannot tell.
	Owner Owner
	// JoinFailure is why the machine's join is failing, as the machine
	// last reported it (nodeagent.JoinError); nil while it has not
	// reported a failure, once it has joined, or when the provider cannot
	// tell. The controller shows it on a Machine whose Node has not come.
	JoinFailure *JoinFailure
	// Addresses are where the instance's Node is reached, as a cloud
	// provider gives them; none when the provider gives none. The
	// controller puts them on a Node whose kubelet runs with
	// --cloud-provider=external, in place of the kubelet's own, and then
	// lifts its uninitialized taint (nodes.Uninitialized), as a cloud
	// controller manager's node controller would.
	Addresses []corev1.NodeAddress
}

// JoinFailure is a machine's report of a failing join.
type JoinFailure struct {
	// Reason is one of machinistv1.JoinFailureReasons.
	Reason string
	// Message says what was seen and what to change on the cluster.
	Message string
}

// maxJoinMessage bounds a reported message, in bytes.
const maxJoinMessage = 512

// ReportedJoinFailure is what a Machine may be shown of a join failure a
// machine or a provider reported: both are outside the manager, so the
// reason must be one of machinistv1.JoinFailureReasons (nil otherwise),
// and the message is held to one short line of printable text.
func ReportedJoinFailure(reason, message string) *JoinFailure {
	if !slices.Contains(machinistv1.JoinFailureReasons, reason) {
		return nil
	}
	message = strings.Join(strings.FieldsFunc(message, func(r rune) bool {
		return unicode.IsSpace(r) || !unicode.IsPrint(r)
	}), " ")
	if len(message) > maxJoinMessage {
		message = strings.ToValidUTF8(message[:maxJoinMessage], "") + "…"
	}
	return &JoinFailure{Reason: reason, Message: message}
}

// Owner is the Machine an instance belongs to, as its provider records it
// on the instance. The UID is what tells Machines apart: a Machine deleted
// and made again under the same name is another Machine.
type Owner struct {
	Namespace, Name string
	UID             types.UID
}

// OwnerOf is m as the owner of an instance.
func OwnerOf(m *machinistv1.Machine) Owner {
	return Owner{Namespace: m.Namespace, Name: m.Name, UID: m.UID}
}

// IsZero reports whether o names no Machine.
func (o Owner) IsZero() bool { return o == Owner{} }

// ErrTaken is wrapped by the permanent error of a Create whose
// spec.providerID names an instance that belongs to another Machine.
var ErrTaken = errors.New("the instance belongs to another Machine")

// IsTaken reports whether err, or an error it wraps, is ErrTaken.
func IsTaken(err error) bool { return errors.Is(err, ErrTaken) }

// Claim is the adoption rule every provider applies, for one that keeps
// owners as Owner: m may adopt an instance that belongs to owner when
// owner is zero (it belongs to no Machine), has m's UID (a repeated call),
// or has m's namespace and name under another UID (SameName: a Machine
// re-created from a backup, or moved). Otherwise it returns the permanent
// error that wraps ErrTaken, which names no Machine: call it before
// touching the instance.
func Claim(owner Owner, m *machinistv1.Machine) error {
	if owner.IsZero() || owner.UID == m.UID || SameName(owner, m) {
		return nil
	}
	return Permanent(fmt.Errorf("cannot adopt the instance spec.providerID names: %w", ErrTaken))
}

// SameName reports whether owner is another Machine of m's namespace and
// name: one that is gone, since names are unique in a namespace, whose
// instance is then m's. This is how a Machine finds its instance again
// after it was re-created under a new UID (objects restored from a backup
// without their status, or moved to another management cluster): Create,
// finding no instance recorded for m's UID, takes the one recorded for
// its name, as it is, without a restart, and records m as its owner. Its
// finalizer would have deleted that instance had the Machine gone the
// normal way; so this instance is one that would otherwise be leaked.
func SameName(owner Owner, m *machinistv1.Machine) bool {
	return owner.Namespace == m.Namespace && owner.Name == m.Name && owner.UID != m.UID && owner.UID != "" && m.UID != ""
}

// Power is an instance's power state.
type Power string

// Power states.
const (
	PowerUnknown Power = ""
	PowerOn      Power = "On"
	PowerOff     Power = "Off"
)

// Operation identifies one reboot, repair or update request, so that
// providers can carry each out at most once.
type Operation struct {
	// ID is the operation's ID from the Machine's status.operation.
	ID string
	// Hard asks for a power cycle instead of an orderly restart.
	Hard bool
	// Version is the version an Update brings the instance to.
	Version string
	// Join is what a repaired instance joins its cluster with: a repair
	// wipes the machine's credentials with the rest of its state. Set for
	// Repair only.
	Join Join
}

// Join is bootstrap.Join under a name a provider outside this module can
// write: its Create method must name the type.
type Join = bootstrap.Join

// RequireJoin refuses, with a permanent error wrapping ErrNoJoin, join
// data a machine could not join with: no server or no token. what names
// the call in the message, such as "creating machine default/m1"; the
// token is never in it.
func RequireJoin(j Join, what string) error {
	var missing []string
	if j.Server == "" {
		missing = append(missing, "server")
	}
	if j.Token == "" {
		missing = append(missing, "bootstrap token")
	}
	if len(missing) == 0 {
		return nil
	}
	return Permanent(fmt.Errorf("%s: %w (no %s)", what, ErrNoJoin, strings.Join(missing, ", no ")))
}

// ErrNoJoin is wrapped by RequireJoin's errors.
var ErrNoJoin = errors.New("the provider needs join data for the machine to join its cluster")

// Change is what differs between what an instance runs and what its
// Machine asks for; each field set is a kind of change.
type Change struct {
	// Version: spec.version, the node (kubelet) version.
	Version bool
	// Class: the MachineClass, or what it says (provider, providerSpec).
	Class bool
}

// Empty reports whether c changes nothing.
func (c Change) Empty() bool { return c == Change{} }

// String names the kinds of change, for messages.
func (c Change) String() string {
	var kinds []string
	if c.Version {
		kinds = append(kinds, "version")
	}
	if c.Class {
		kinds = append(kinds, "machine class")
	}
	if len(kinds) == 0 {
		return "nothing"
	}
	return strings.Join(kinds, " and ")
}

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that retrying cannot fix, such as a request the
// provider rejects outright.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, was marked Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// Registry maps provider names to actuators.
type Registry struct {
	mu        sync.RWMutex
	actuators map[string]Actuator
	metrics   *Metrics
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{actuators: map[string]Actuator{}}
}

// Register makes a available under name; a name can be registered once.
func (r *Registry) Register(name string, a Actuator) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.actuators[name]; ok {
		return fmt.Errorf("provider %q is already registered", name)
	}
	r.actuators[name] = a
	return nil
}

// Get returns the actuator registered under name.
func (r *Registry) Get(name string) (Actuator, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if a, ok := r.actuators[name]; ok {
		if r.metrics != nil {
			return metered{name: name, a: a, metrics: r.metrics}, nil
		}
		return a, nil
	}
	return nil, fmt.Errorf("no provider %q runs in this manager (it runs: %s)", name, strings.Join(r.namesLocked(), ", "))
}

// Meter has every actuator Get returns from now on count and time its
// calls in m.
func (r *Registry) Meter(m *Metrics) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.metrics = m
}

// Names lists the registered providers in order.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.namesLocked()
}

func (r *Registry) namesLocked() []string {
	names := make([]string, 0, len(r.actuators))
	for n := range r.actuators {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

type unavailableError struct{ err error }

func (e unavailableError) Error() string { return e.err.Error() }
func (e unavailableError) Unwrap() error { return e.err }

// Unavailable marks err as the provider itself being out of reach (a
// remote provider that does not answer), as opposed to the provider
// answering with an error. It is transient: the Machine waits, with the
// reason ProviderUnavailable, and is never failed for it.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return unavailableError{err}
}

// IsUnavailable reports whether err, or an error it wraps, was marked
// Unavailable.
func IsUnavailable(err error) bool {
	var u unavailableError
	return errors.As(err, &u)
}

// Lister is implemented by a provider that can list the instances it
// holds. The manager compares the list with its Machines to find orphans
// (instances no Machine claims, which a restore of an older backup
// leaves) and Machines whose instance is gone. A provider that does not
// implement it is not checked.
type Lister interface {
	// List returns every instance the provider holds, on or off, each
	// once, with the Machine it belongs to as recorded on the instance
	// (zero for one that belongs to none).
	List(ctx context.Context) ([]Listed, error)
}

// Listed is one instance a provider holds.
type Listed struct {
	ProviderID string
	Owner      Owner
}

// ErrNoList is returned by List for a provider that cannot list.
var ErrNoList = errors.New("the provider cannot list its instances")

// List lists a's instances, or returns ErrNoList when a cannot.
func List(ctx context.Context, a Actuator) ([]Listed, error) {
	l, ok := a.(Lister)
	if !ok {
		return nil, ErrNoList
	}
	return l.List(ctx)
}
