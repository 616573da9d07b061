package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/nodeagent"
	"github.com/machinist-dev/machinist/providers/plugin"
)

// toyCloud is the smallest honest provider: its "instances" are entries
// in a map. A real one calls its cloud's API where this touches the map,
// and its instances boot a kubelet that registers a Node with the
// returned provider ID. It shows the idempotency the contract asks for,
// and that an instance belongs to one Machine.
type toyCloud struct {
	mu        sync.Mutex
	byUID     map[types.UID]string // Machine UID -> provider ID
	instances map[string]*toyInstance
}

type toyInstance struct {
	// owner is the Machine the instance belongs to. A real provider
	// records it on the instance itself (a tag, a label), so that it
	// survives the provider's restart.
	owner   providers.Owner
	version string
	lastOp  string // the last operation carried out, for idempotency
	// userData is what the instance boots with: its kubelet's bootstrap
	// kubeconfig. The only copy of the token the cloud keeps is here,
	// on the machine.
	userData []byte
}

func (c *toyCloud) Create(_ context.Context, m *machinistv1.Machine, _ *machinistv1.MachineClass, join providers.Join) (string, error) {
	if err := providers.RequireJoin(join, "creating machine "+m.Name); err != nil {
		return "", err
	}
	userData, err := nodeagent.BootstrapKubeconfig(join)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.Spec.ProviderID != "" { // adopt an existing instance
		in, ok := c.instances[m.Spec.ProviderID]
		if !ok {
			return "", providers.Permanent(fmt.Errorf("no instance %q to adopt", m.Spec.ProviderID))
		}
		// Another Machine's instance is refused before anything touches it.
		if err := providers.Claim(in.owner, m); err != nil {
			return "", err
		}
		if in.owner.IsZero() { // one made outside Machinist: now m's
			in.owner, in.userData = providers.OwnerOf(m), userData
		}
		c.byUID[m.UID] = m.Spec.ProviderID
		return m.Spec.ProviderID, nil
	}
	if id, ok := c.byUID[m.UID]; ok { // a repeated Create: the same instance
		return id, nil
	}
	id := fmt.Sprintf("toy:///%s/%s/%s", m.Namespace, m.Name, m.UID)
	c.byUID[m.UID] = id
	c.instances[id] = &toyInstance{owner: providers.OwnerOf(m), version: m.Spec.Version, userData: userData}
	return id, nil
}

func (c *toyCloud) Exists(_ context.Context, id string) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.instances[id]
	return ok, nil
}

func (c *toyCloud) Delete(_ context.Context, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.instances, id) // deleting what is gone is not an error
	for uid, known := range c.byUID {
		if known == id {
			delete(c.byUID, uid)
		}
	}
	return nil
}

func (c *toyCloud) FindByUID(_ context.Context, uid types.UID) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byUID[uid], nil
}

// restart carries an operation out at most once per operation ID.
func (c *toyCloud) restart(id string, op providers.Operation, apply func(*toyInstance)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	in, ok := c.instances[id]
	if !ok {
		return providers.Permanent(errors.New("no such instance"))
	}
	if in.lastOp == op.ID {
		return nil
	}
	apply(in) // a real provider restarts the instance here
	in.lastOp = op.ID
	return nil
}

func (c *toyCloud) Reboot(_ context.Context, id string, op providers.Operation) error {
	return c.restart(id, op, func(*toyInstance) {})
}

// Repair re-images the instance, which joins again with op.Join: its old
// credentials went with the old image.
func (c *toyCloud) Repair(_ context.Context, id string, op providers.Operation) error {
	if err := providers.RequireJoin(op.Join, "repairing "+id); err != nil {
		return err
	}
	userData, err := nodeagent.BootstrapKubeconfig(op.Join)
	if err != nil {
		return err
	}
	return c.restart(id, op, func(in *toyInstance) { in.userData = userData })
}

func (c *toyCloud) Update(_ context.Context, id string, op providers.Operation) error {
	return c.restart(id, op, func(in *toyInstance) { in.version = op.Version })
}

// InPlace: a new version is applied in place; a new class needs a new
// instance.
func (c *toyCloud) InPlace(change providers.Change) bool { return !change.Class }

// Describe: the toy cloud knows its instances run and whose they are, but
// cannot see inside them, so it reports no boot ID.
func (c *toyCloud) Describe(_ context.Context, id string) (providers.Instance, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in, ok := c.instances[id]
	if !ok {
		return providers.Instance{}, providers.Permanent(errors.New("no such instance"))
	}
	return providers.Instance{Power: providers.PowerOn, Owner: in.owner}, nil
}

// A provider of one's own is an providers.Actuator and one call to Serve.
// The manager reaches it with --provider toy=unix:///run/toy.sock; a
// MachineClass uses it with spec.provider: toy.
func ExampleServe() {
	cloud := &toyCloud{byUID: map[types.UID]string{}, instances: map[string]*toyInstance{}}
	ctx := ctrl.SetupSignalHandler() // stops on SIGTERM, as a Pod's container is stopped
	err := plugin.Serve(ctx, "unix:///run/toy.sock", cloud, plugin.ServeOptions{Name: "toy", VendorVersion: "v0.1.0"})
	if err != nil {
		fmt.Println(err)
	}
}
