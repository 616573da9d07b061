package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/providers"
)

// className is the fabricated MachineClass's name.
const className = "conformance"

// trial is one check's run: it keeps the books of what the check made, so
// that cleaning up finds every instance, even one the check never saw a
// provider ID for.
type trial struct {
	s    *suite
	slug string

	mu     sync.Mutex
	uids   []types.UID
	ids    []string
	tokens []token
	joins  map[string]providers.Join // by Machine UID
	// joinMu makes concurrent Creates for one Machine wait for one token.
	joinMu sync.Mutex
}

// machine fabricates a Machine as kube-apiserver would serve it, with a
// fresh UID.
func (t *trial) machine() *machinistv1.Machine {
	m := &machinistv1.Machine{
		TypeMeta: metav1.TypeMeta{APIVersion: machinistv1.GroupVersion.String(), Kind: "Machine"},
		ObjectMeta: metav1.ObjectMeta{
			Name:              "conformance-" + t.slug + "-" + suffix(),
			Namespace:         t.s.cfg.Namespace,
			UID:               uuid.NewUUID(),
			CreationTimestamp: metav1.Now(),
			Finalizers:        []string{machinistv1.MachineFinalizer},
		},
		Spec: machinistv1.MachineSpec{
			ClassRef: machinistv1.ClassReference{Name: className},
			Version:  t.s.cfg.Version,
		},
	}
	t.mu.Lock()
	t.uids = append(t.uids, m.UID)
	t.mu.Unlock()
	return m
}

// class fabricates the MachineClass, with providerSpec when not empty.
func (t *trial) class(providerSpec []byte) *machinistv1.MachineClass {
	c := &machinistv1.MachineClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: machinistv1.GroupVersion.String(), Kind: "MachineClass"},
		ObjectMeta: metav1.ObjectMeta{Name: className, Namespace: t.s.cfg.Namespace, UID: uuid.NewUUID()},
		Spec:       machinistv1.MachineClassSpec{Provider: t.s.name},
	}
	if len(providerSpec) > 0 {
		c.Spec.ProviderSpec = runtime.RawExtension{Raw: providerSpec}
	}
	return c
}

// create asks for m's instance with the configured class, through the
// provider.Client as the Machine controller would.
func (t *trial) create(ctx context.Context, m *machinistv1.Machine) (string, error) {
	return t.createWith(ctx, m, t.class(t.s.cfg.ProviderSpec))
}

func (t *trial) createWith(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass) (string, error) {
	join, err := t.joinFor(ctx, string(m.UID))
	if err != nil {
		return "", err
	}
	id, err := t.s.client.Create(ctx, m.DeepCopy(), class, join)
	if id != "" {
		t.mu.Lock()
		t.ids = append(t.ids, id)
		t.mu.Unlock()
	}
	return id, err
}

// launch creates an instance and waits until its Node is Ready.
func (t *trial) launch(ctx context.Context) (*machinistv1.Machine, string, nodeHistory, error) {
	m := t.machine()
	id, err := t.create(ctx, m)
	if err != nil {
		return nil, "", nodeHistory{}, fmt.Errorf("Create: %w", err)
	}
	h, err := t.s.nodes.await(ctx, t.s.cfg.Timeout, id, "the Node of "+id+" to be Ready", nodeHistory.ready)
	return m, id, h, err
}

// asJSON is obj as a request sent without the Client carries it.
func asJSON(obj any) []byte {
	raw, err := json.Marshal(obj)
	if err != nil {
		// Machines and MachineClasses hold nothing json cannot encode.
		panic(fmt.Sprintf("conformance: encoding %T: %v", obj, err))
	}
	return raw
}

// cleanUp deletes every instance the check made, asking the provider for
// those of its Machines too, then their Nodes and Leases, as the Machine
// controller does after Delete. It runs on after the caller's context
// ends, so that an interrupted run leaks nothing.
func (t *trial) cleanUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.cfg.Timeout)
	defer cancel()
	t.mu.Lock()
	uids, ids := slices.Clone(t.uids), slices.Clone(t.ids)
	t.mu.Unlock()
	var errs []error
	for _, uid := range uids {
		id, err := t.s.client.FindByUID(ctx, uid)
		if err != nil {
			errs = append(errs, fmt.Errorf("FindByUID %s: %w", uid, err))
		}
		if id != "" {
			ids = append(ids, id)
		}
	}
	tried, deleted := map[string]bool{}, map[string]bool{}
	for _, id := range ids {
		if tried[id] {
			continue
		}
		tried[id] = true
		if err := t.s.client.Delete(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("Delete %s: %w", id, err))
			continue
		}
		deleted[id] = true
	}
	if len(deleted) > 0 {
		errs = append(errs, t.forgetNodes(ctx, deleted))
	}
	// Last: an instance still being deleted may have been joining.
	errs = append(errs, t.deleteTokens(ctx))
	return errors.Join(errs...)
}

// forgetNodes deletes the Nodes, and their Leases, of the instances
// deleted. It lists Nodes afresh rather than trust the watch: a Node
// registered just before its instance was deleted may not have reached
// it yet.
func (t *trial) forgetNodes(ctx context.Context, deleted map[string]bool) error {
	nodes, err := t.s.cfg.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	var errs []error
	for _, n := range nodes.Items {
		if deleted[n.Spec.ProviderID] {
			errs = append(errs, providers.ForgetNode(ctx, t.s.cfg.Kube, n.Name))
		}
	}
	return errors.Join(errs...)
}

// settle waits d, or less when ctx ends.
func settle(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
