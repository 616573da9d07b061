package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/plugin"
	providerv1 "github.com/machinist-dev/machinist/providers/plugin/v1"
)

// concurrentCreates is how many Creates race for one Machine: the
// controller's workers, a requeue and a restarted manager can all call at
// once.
const concurrentCreates = 8

func checkIdentity(ctx context.Context, t *trial) error {
	info, err := t.s.client.Info(ctx)
	if err != nil {
		return err
	}
	var errs []error
	if info.GetName() == "" {
		errs = append(errs, errors.New("GetInfo gives no name: MachineClasses could not name the provider"))
	}
	if info.GetProtocol() != plugin.Protocol {
		errs = append(errs, fmt.Errorf("GetInfo says protocol %q, want %q", info.GetProtocol(), plugin.Protocol))
	}
	probe, err := t.s.client.Probe(ctx)
	switch {
	case err != nil:
		errs = append(errs, err)
	case !probe.GetReady():
		errs = append(errs, fmt.Errorf("Probe says not ready: %s", probe.GetMessage()))
	}
	return errors.Join(errs...)
}

func checkCapabilities(_ context.Context, t *trial) error {
	return coherent(t.s.caps)
}

// coherent finds what the controller could not act on in capabilities:
// values it does not know, and changes in place without the verb that
// applies them.
func coherent(caps *providerv1.GetCapabilitiesResponse) error {
	var errs []error
	seen := map[providerv1.Verb]bool{}
	for _, v := range caps.GetVerbs() {
		switch {
		case v == providerv1.Verb_VERB_UNSPECIFIED:
			errs = append(errs, errors.New("verbs lists VERB_UNSPECIFIED"))
		case !slices.Contains(verbs, v):
			errs = append(errs, fmt.Errorf("verbs lists %d, which is no verb of the protocol", v))
		case seen[v]:
			errs = append(errs, fmt.Errorf("verbs lists %s twice", v))
		}
		seen[v] = true
	}
	changes := map[providerv1.Change]bool{}
	for _, c := range caps.GetInPlace() {
		switch {
		case c == providerv1.Change_CHANGE_UNSPECIFIED:
			errs = append(errs, errors.New("in_place lists CHANGE_UNSPECIFIED"))
		case c != providerv1.Change_CHANGE_VERSION && c != providerv1.Change_CHANGE_CLASS:
			errs = append(errs, fmt.Errorf("in_place lists %d, which is no change of the protocol", c))
		case changes[c]:
			errs = append(errs, fmt.Errorf("in_place lists %s twice", c))
		}
		changes[c] = true
	}
	if len(caps.GetInPlace()) > 0 && !seen[plugin.VerbUpdate] {
		errs = append(errs, fmt.Errorf("in_place lists %v but verbs lack VERB_UPDATE, which applies them", caps.GetInPlace()))
	}
	return errors.Join(errs...)
}

func checkCreateOnce(ctx context.Context, t *trial) error {
	m := t.machine()
	ids := make([]string, concurrentCreates)
	errs := make([]error, concurrentCreates)
	var wg sync.WaitGroup
	for i := range concurrentCreates {
		wg.Go(func() { ids[i], errs[i] = t.create(ctx, m) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("Create: %w", err)
	}
	distinct := slices.Compact(slices.Sorted(slices.Values(ids)))
	if len(distinct) != 1 {
		return fmt.Errorf("%d concurrent Creates for one Machine UID returned %d instances, want 1: %v", concurrentCreates, len(distinct), distinct)
	}
	id := distinct[0]
	if got := scheme(id); got != t.s.name {
		return fmt.Errorf("provider ID %q has scheme %q, want the provider's name %q", id, got, t.s.name)
	}
	found, err := t.s.client.FindByUID(ctx, m.UID)
	if err != nil {
		return fmt.Errorf("FindByUID: %w", err)
	}
	if found != id {
		return fmt.Errorf("FindByUID returned %q, want %q, what Create returned", found, id)
	}
	exists, err := t.s.client.Exists(ctx, id)
	if err != nil {
		return fmt.Errorf("Exists: %w", err)
	}
	if !exists {
		return fmt.Errorf("Exists says %s, which Create returned, does not exist", id)
	}
	_, err = t.s.nodes.await(ctx, t.s.cfg.Timeout, id, "a Ready Node with spec.providerID "+id, nodeHistory.ready)
	return err
}

func checkDistinct(ctx context.Context, t *trial) error {
	a, b := t.machine(), t.machine()
	idA, err := t.create(ctx, a)
	if err != nil {
		return fmt.Errorf("Create %s: %w", a.Name, err)
	}
	idB, err := t.create(ctx, b)
	if err != nil {
		return fmt.Errorf("Create %s: %w", b.Name, err)
	}
	if idA == idB {
		return fmt.Errorf("Machines %s and %s (UIDs %s, %s) got the same instance %s", a.Name, b.Name, a.UID, b.UID, idA)
	}
	for _, c := range []struct {
		m    *machinistv1.Machine
		want string
	}{{a, idA}, {b, idB}} {
		found, err := t.s.client.FindByUID(ctx, c.m.UID)
		if err != nil {
			return fmt.Errorf("FindByUID %s: %w", c.m.UID, err)
		}
		if found != c.want {
			return fmt.Errorf("FindByUID %s returned %q, want %q", c.m.UID, found, c.want)
		}
	}
	return nil
}

func checkAdoptMissing(ctx context.Context, t *trial) error {
	m := t.machine()
	m.Spec.ProviderID = t.s.name + "://conformance-missing-" + suffix()
	id, err := t.create(ctx, m)
	switch {
	case err == nil:
		return fmt.Errorf("Create adopting %s, which does not exist, returned %q", m.Spec.ProviderID, id)
	case !providers.IsPermanent(err):
		return fmt.Errorf("Create adopting %s, which does not exist, failed transiently (the controller would retry forever): %w", m.Spec.ProviderID, err)
	}
	return nil
}

// checkTaken proves that one Machine's instance is never handed to
// another: Create for Machine B of another namespace whose
// spec.providerID names Machine A's instance fails permanently with
// providers.ErrTaken, in a message that names neither A nor its
// namespace, and leaves A's instance as it was: still A's, on the same
// boot, and B with no instance. Describe must report A as the owner
// recorded on its instance, before and after; A itself, naming its own
// instance, gets it back.
func checkTaken(ctx context.Context, t *trial) error {
	a, idA, h, err := t.launch(ctx)
	if err != nil {
		return err
	}
	want := providers.OwnerOf(a)
	owned := func(when string) (providers.Instance, error) {
		in, err := t.s.client.Describe(ctx, idA)
		switch {
		case err != nil:
			return in, fmt.Errorf("Describe %s %s: %w", idA, when, err)
		case in.Owner.IsZero():
			return in, fmt.Errorf("Describe reports no owner for %s %s, want Machine %s/%s (UID %s), for which Create made it: a provider records on each instance the Machine it belongs to", idA, when, a.Namespace, a.Name, a.UID)
		case in.Owner != want:
			return in, fmt.Errorf("Describe reports owner %s/%s (UID %s) for %s %s, want Machine %s/%s (UID %s), for which Create made it", in.Owner.Namespace, in.Owner.Name, in.Owner.UID, idA, when, a.Namespace, a.Name, a.UID)
		}
		return in, nil
	}
	before, err := owned("after Create")
	if err != nil {
		return err
	}
	boots := len(h.boots)

	b := t.machine()
	b.Namespace = "other-" + suffix()
	b.Spec.ProviderID = idA
	id, err := t.create(ctx, b)
	switch {
	case err == nil:
		return fmt.Errorf("Create for Machine %s/%s, whose spec.providerID names the instance of Machine %s/%s, returned %q: it was handed another Machine's instance", b.Namespace, b.Name, a.Namespace, a.Name, id)
	case !providers.IsPermanent(err):
		return fmt.Errorf("Create for a Machine whose spec.providerID names another Machine's instance failed transiently (the controller would retry forever), want a permanent error wrapping %q: %w", providers.ErrTaken, err)
	case !providers.IsTaken(err):
		return fmt.Errorf("Create for a Machine whose spec.providerID names another Machine's instance failed without saying the instance is taken (a Failure with reason %s), want a permanent error wrapping %q: %w", plugin.ReasonInstanceTaken, providers.ErrTaken, err)
	}
	// B's own name and namespace may be in the message; A's may not.
	msg := strings.ReplaceAll(strings.ReplaceAll(err.Error(), b.Name, ""), b.Namespace, "")
	for _, leak := range []struct{ what, value string }{{"name", a.Name}, {"namespace", a.Namespace}, {"UID", string(a.UID)}} {
		if strings.Contains(msg, leak.value) {
			return fmt.Errorf("the refusal names the other Machine's %s %q, which its author may not know: %w", leak.what, leak.value, err)
		}
	}

	var errs []error
	if found, err := t.s.client.FindByUID(ctx, b.UID); err != nil {
		errs = append(errs, fmt.Errorf("FindByUID of the refused Machine: %w", err))
	} else if found != "" {
		errs = append(errs, fmt.Errorf("after the refusal, FindByUID of the refused Machine finds %s: its Delete would destroy that", found))
	}
	if exists, err := t.s.client.Exists(ctx, idA); err != nil {
		errs = append(errs, fmt.Errorf("Exists %s after the refusal: %w", idA, err))
	} else if !exists {
		errs = append(errs, fmt.Errorf("after the refusal, %s no longer exists", idA))
	}
	if after, err := owned("after another Machine was refused it"); err != nil {
		errs = append(errs, err)
	} else if after.BootID != before.BootID {
		errs = append(errs, fmt.Errorf("the refusal restarted %s: Describe reports boot ID %s, was %s", idA, after.BootID, before.BootID))
	}
	if err := settle(ctx, t.s.cfg.Settle); err != nil {
		return err
	}
	if got := t.s.nodes.history(idA).since(boots); len(got) > 0 {
		errs = append(errs, fmt.Errorf("the refusal restarted %s: its Node reports new boot IDs %v", idA, got))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}

	// The owner naming its own instance is a repeated call, not a theft.
	self := a.DeepCopy()
	self.Spec.ProviderID = idA
	if id, err := t.create(ctx, self); err != nil {
		return fmt.Errorf("Create for Machine %s/%s whose spec.providerID names its own instance %s: %w", a.Namespace, a.Name, idA, err)
	} else if id != idA {
		return fmt.Errorf("Create for Machine %s/%s whose spec.providerID names its own instance %s returned %q", a.Namespace, a.Name, idA, id)
	}
	return nil
}

func checkInvalid(ctx context.Context, t *trial) error {
	m := t.machine()
	class := t.class(t.s.cfg.ProviderSpec)
	join, err := t.joinFor(ctx, string(m.UID))
	if err != nil {
		return err
	}
	callCtx, cancel := context.WithTimeout(ctx, t.s.cfg.Timeout)
	_, err = t.s.machines.Create(callCtx, &providerv1.CreateRequest{Machine: asJSON(m), MachineClass: asJSON(class), Join: wireJoin(join)})
	cancel()
	if err := wantCode(err, codes.InvalidArgument, "Create without machine_uid"); err != nil {
		return err
	}
	found, err := t.s.client.FindByUID(ctx, m.UID)
	if err != nil {
		return fmt.Errorf("FindByUID: %w", err)
	}
	if found != "" {
		return fmt.Errorf("Create without machine_uid was refused, yet made %s for the Machine", found)
	}

	// Without join data the machine could not join: no retry helps.
	lost := t.machine()
	if id, err := t.s.client.Create(ctx, lost.DeepCopy(), class, providers.Join{}); err == nil {
		t.mu.Lock()
		t.ids = append(t.ids, id)
		t.mu.Unlock()
		return fmt.Errorf("Create without join data returned %s, want a permanent error", id)
	} else if !providers.IsPermanent(err) {
		return fmt.Errorf("Create without join data failed transiently (the controller would retry forever), want a permanent error: %w", err)
	}
	if found, err := t.s.client.FindByUID(ctx, lost.UID); err != nil {
		return fmt.Errorf("FindByUID: %w", err)
	} else if found != "" {
		return fmt.Errorf("Create without join data was refused, yet made %s for the Machine", found)
	}

	declared := slices.DeleteFunc(slices.Clone(verbs), func(v providerv1.Verb) bool { return !t.s.declares(v) })
	if len(declared) == 0 {
		return nil
	}
	// A real instance, so that the missing operation_id is the only
	// thing wrong with the request.
	target := t.machine()
	id, err := t.create(ctx, target)
	if err != nil {
		return fmt.Errorf("Create: %w", err)
	}
	verb := declared[0]
	err = t.rawVerb(ctx, verb, id, "")
	if err := wantCode(err, codes.InvalidArgument, verbWord(verb)+" without operation_id"); err != nil {
		return err
	}
	if !t.s.declares(plugin.VerbRepair) {
		return nil
	}
	op := "conformance-" + suffix()
	if err := t.s.client.Repair(ctx, id, providers.Operation{ID: op}); err == nil {
		return fmt.Errorf("repair %s without join data succeeded, want a permanent error: the repaired machine could not join", op)
	} else if !providers.IsPermanent(err) {
		return fmt.Errorf("repair %s without join data failed transiently (the controller would retry forever), want a permanent error: %w", op, err)
	}
	return nil
}

// checkJoin proves that the provider passes the join data of Create to
// the machine, and that of Repair to the repaired machine: the Node's
// certificate was asked for with the bootstrap token made for that call
// alone. A provider that gives its machines credentials of its own, or
// join data of an earlier call, fails.
func checkJoin(ctx context.Context, t *trial) error {
	m, id, h, err := t.launch(ctx)
	if err != nil {
		return err
	}
	join, err := t.joinFor(ctx, string(m.UID))
	if err != nil {
		return err
	}
	if err := t.s.joinedWith(ctx, tokenOf(join), h.node.Name, "Create"); err != nil {
		return err
	}
	if !t.s.declares(plugin.VerbRepair) {
		return nil
	}
	before := len(h.boots)
	again, err := t.newJoin(ctx)
	if err != nil {
		return err
	}
	op := "conformance-a-" + suffix()
	if err := t.s.client.Repair(ctx, id, providers.Operation{ID: op, Join: again}); err != nil {
		return fmt.Errorf("repair %s: %w", op, err)
	}
	h, err = t.s.nodes.await(ctx, t.s.cfg.Timeout, id, "a Ready Node with a new boot ID after repair "+op, func(h nodeHistory) bool {
		return len(h.since(before)) >= 1 && h.ready()
	})
	if err != nil {
		return err
	}
	return t.s.joinedWith(ctx, tokenOf(again), h.node.Name, "repair "+op)
}

// checkNoTokenLog searches what the provider logged through every check
// for the secret of every bootstrap token handed to it.
func checkNoTokenLog(_ context.Context, t *trial) error {
	t.s.mu.Lock()
	tokens := slices.Clone(t.s.handed)
	t.s.mu.Unlock()
	if len(tokens) == 0 {
		return errors.New("no join data was handed to the provider, so its log proves nothing")
	}
	log, err := t.s.cfg.Logs()
	if err != nil {
		return fmt.Errorf("reading the provider's log: %w", err)
	}
	return leaks(log, tokens)
}

// wireJoin is j as a request sent without the Client carries it.
func wireJoin(j providers.Join) *providerv1.Join {
	return &providerv1.Join{Server: j.Server, CaData: j.CAData, Token: j.Token}
}

func checkDelete(ctx context.Context, t *trial) error {
	m := t.machine()
	id, err := t.create(ctx, m)
	if err != nil {
		return fmt.Errorf("Create: %w", err)
	}
	if err := t.s.client.Delete(ctx, id); err != nil {
		return fmt.Errorf("Delete: %w", err)
	}
	exists, err := t.s.client.Exists(ctx, id)
	if err != nil {
		return fmt.Errorf("Exists after Delete: %w", err)
	}
	if exists {
		return fmt.Errorf("Exists says %s exists after Delete", id)
	}
	if err := t.s.client.Delete(ctx, id); err != nil {
		return fmt.Errorf("Delete of %s, deleted already: %w", id, err)
	}
	found, err := t.s.client.FindByUID(ctx, m.UID)
	if err != nil {
		return fmt.Errorf("FindByUID after Delete: %w", err)
	}
	if found != "" {
		return fmt.Errorf("FindByUID after Delete returned %q, want none", found)
	}

	// An ID of the provider's own form, for an instance never made: one
	// the provider never saw, as after its own restart.
	if uid := string(m.UID); strings.Contains(id, uid) {
		never := strings.ReplaceAll(id, uid, string(uuid.NewUUID()))
		if err := t.s.client.Delete(ctx, never); err != nil {
			return fmt.Errorf("Delete of %s, never made: %w", never, err)
		}
		exists, err := t.s.client.Exists(ctx, never)
		if err != nil {
			return fmt.Errorf("Exists of %s, never made: %w", never, err)
		}
		if exists {
			return fmt.Errorf("Exists says %s, never made, exists", never)
		}
	}

	// An ID of a form the provider may not know. Refusing it for good is
	// as right as calling it gone; what the controller cannot live with
	// is an error it retries forever, or an instance it waits on.
	foreign := t.s.name + "://conformance-never-" + suffix()
	if err := t.s.client.Delete(ctx, foreign); err != nil && !providers.IsPermanent(err) {
		return fmt.Errorf("Delete of %s, never made, failed transiently: %w", foreign, err)
	}
	exists, err = t.s.client.Exists(ctx, foreign)
	if err != nil && !providers.IsPermanent(err) {
		return fmt.Errorf("Exists of %s, never made, failed transiently: %w", foreign, err)
	}
	if err == nil && exists {
		return fmt.Errorf("Exists says %s, never made, exists", foreign)
	}
	return nil
}

// checkList proves that List shows each instance once, with the Machine
// it belongs to, and no longer once it is deleted: what the manager needs
// to tell an orphan (an instance no Machine claims) from an instance in
// use, and a Machine whose instance is gone.
func checkList(ctx context.Context, t *trial) error {
	a, b := t.machine(), t.machine()
	idA, err := t.create(ctx, a)
	if err != nil {
		return fmt.Errorf("Create %s: %w", a.Name, err)
	}
	idB, err := t.create(ctx, b)
	if err != nil {
		return fmt.Errorf("Create %s: %w", b.Name, err)
	}
	listed := func() (map[string][]providers.Owner, error) {
		all, err := t.s.client.List(ctx)
		if errors.Is(err, providers.ErrNoList) {
			return nil, errors.New("List is UNIMPLEMENTED: the manager could not find the instances a restore of an older backup leaves, nor the Machines whose instance is gone")
		}
		if err != nil {
			return nil, fmt.Errorf("List: %w", err)
		}
		by := map[string][]providers.Owner{}
		for _, l := range all {
			by[l.ProviderID] = append(by[l.ProviderID], l.Owner)
		}
		return by, nil
	}
	by, err := listed()
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range []struct {
		m  *machinistv1.Machine
		id string
	}{{a, idA}, {b, idB}} {
		switch owners := by[c.id]; {
		case len(owners) != 1:
			errs = append(errs, fmt.Errorf("List shows %s %d times, want once", c.id, len(owners)))
		case owners[0] != providers.OwnerOf(c.m):
			errs = append(errs, fmt.Errorf("List shows %s owned by %+v, want %+v, the Machine it was made for", c.id, owners[0], providers.OwnerOf(c.m)))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := t.s.client.Delete(ctx, idA); err != nil {
		return fmt.Errorf("Delete %s: %w", idA, err)
	}
	if by, err = listed(); err != nil {
		return err
	}
	if len(by[idA]) != 0 {
		return fmt.Errorf("List still shows %s after Delete", idA)
	}
	if len(by[idB]) != 1 {
		return fmt.Errorf("List shows %s %d times after another instance's Delete, want once", idB, len(by[idB]))
	}
	return nil
}

// checkSameName proves that a Machine re-created under a new UID, as a
// restore from a backup without status or a move to another management
// cluster makes it, finds its instance again: Create for it returns the
// instance recorded for its namespace and name, records it as the owner,
// and does not restart it.
func checkSameName(ctx context.Context, t *trial) error {
	a, id, h, err := t.launch(ctx)
	if err != nil {
		return err
	}
	before := len(h.boots)
	again := a.DeepCopy()
	again.UID = uuid.NewUUID()
	t.mu.Lock()
	t.uids = append(t.uids, again.UID)
	t.mu.Unlock()
	got, err := t.create(ctx, again)
	if err != nil {
		return fmt.Errorf("Create for %s re-created under UID %s: %w", a.Name, again.UID, err)
	}
	if got != id {
		return fmt.Errorf("Create for %s re-created under a new UID returned %q, want %q, the instance recorded for its name: the old one would be leaked and a second one run", a.Name, got, id)
	}
	in, err := t.s.client.Describe(ctx, id)
	if err != nil {
		return fmt.Errorf("Describe: %w", err)
	}
	if in.Owner != providers.OwnerOf(again) {
		return fmt.Errorf("Describe of %s reports owner %+v, want %+v, the re-created Machine", id, in.Owner, providers.OwnerOf(again))
	}
	for uid, want := range map[types.UID]string{a.UID: "", again.UID: id} {
		found, err := t.s.client.FindByUID(ctx, uid)
		if err != nil {
			return fmt.Errorf("FindByUID %s: %w", uid, err)
		}
		if found != want {
			return fmt.Errorf("FindByUID %s returned %q, want %q", uid, found, want)
		}
	}
	if err := settle(ctx, t.s.cfg.Settle); err != nil {
		return err
	}
	if boots := t.s.nodes.history(id).since(before); len(boots) > 0 {
		return fmt.Errorf("the instance was restarted when its re-created Machine took it (new boot IDs %v)", boots)
	}
	return nil
}

// checkOncePerOperation proves that verb (reboot or repair) restarts the
// instance once per operation ID: once for A, not again for A repeated
// (twice, at once), once more for B. A restart is a new boot ID on the
// instance's Node.
func checkOncePerOperation(ctx context.Context, t *trial, verb providerv1.Verb) error {
	_, id, h, err := t.launch(ctx)
	if err != nil {
		return err
	}
	before := len(h.boots)
	opA, opB := "conformance-a-"+suffix(), "conformance-b-"+suffix()
	call := func(op string) error {
		a := providers.Operation{ID: op}
		if verb == plugin.VerbRepair {
			// Fresh join data for every call, as the controller may make.
			var err error
			if a.Join, err = t.newJoin(ctx); err != nil {
				return err
			}
			return t.s.client.Repair(ctx, id, a)
		}
		return t.s.client.Reboot(ctx, id, a)
	}
	word := verbWord(verb)
	if err := call(opA); err != nil {
		return fmt.Errorf("%s %s: %w", word, opA, err)
	}
	if _, err := t.s.nodes.await(ctx, t.s.cfg.Timeout, id, "a new boot ID after "+word+" "+opA, func(h nodeHistory) bool {
		return len(h.since(before)) >= 1
	}); err != nil {
		return err
	}
	if err := t.s.repeat(ctx, call, opA, word); err != nil {
		return err
	}
	if got := t.s.nodes.history(id).since(before); len(got) != 1 {
		return fmt.Errorf("%s %s, then the same operation twice at once: the boot ID changed %d times, want once (new boot IDs %v)", word, opA, len(got), got)
	}
	if err := call(opB); err != nil {
		return fmt.Errorf("%s %s: %w", word, opB, err)
	}
	if _, err := t.s.nodes.await(ctx, t.s.cfg.Timeout, id, "a new boot ID after "+word+" "+opB, func(h nodeHistory) bool {
		return len(h.since(before)) >= 2
	}); err != nil {
		return err
	}
	if err := settle(ctx, t.s.cfg.Settle); err != nil {
		return err
	}
	if got := t.s.nodes.history(id).since(before); len(got) != 2 {
		return fmt.Errorf("%s %s: the boot ID changed %d times since %s, want twice (new boot IDs %v)", word, opB, len(got), opA, got)
	}
	return nil
}

// checkDescribe holds Describe to what the Node of the instance shows: a
// running instance is not said to be off, and a boot ID, when the
// provider gives one, is the one the Node reports, before and after a
// reboot. A provider that cannot tell (no boot ID) passes: the controller
// then waits for the Node.
func checkDescribe(ctx context.Context, t *trial) error {
	_, id, h, err := t.launch(ctx)
	if err != nil {
		return err
	}
	describe := func(node string) (bool, error) {
		in, err := t.s.client.Describe(ctx, id)
		switch {
		case err != nil:
			return false, fmt.Errorf("Describe %s: %w", id, err)
		case in.Power == providers.PowerOff:
			return false, fmt.Errorf("Describe says %s is off, while its Node is Ready with boot ID %s", id, node)
		case in.BootID != "" && in.BootID != node:
			return false, fmt.Errorf("Describe reports boot ID %s for %s, whose Node reports %s", in.BootID, id, node)
		}
		return in.BootID != "", nil
	}
	tells, err := describe(h.boot())
	if err != nil || !tells || !t.s.declares(plugin.VerbReboot) {
		return err
	}
	before := len(h.boots)
	if err := t.s.client.Reboot(ctx, id, providers.Operation{ID: "conformance-describe-" + suffix()}); err != nil {
		return fmt.Errorf("reboot: %w", err)
	}
	h, err = t.s.nodes.await(ctx, t.s.cfg.Timeout, id, "a new boot ID, Ready, after a reboot", func(h nodeHistory) bool {
		return len(h.since(before)) >= 1 && h.ready()
	})
	if err != nil {
		return err
	}
	_, err = describe(h.boot())
	return err
}

// repeat calls op twice at once, as a controller that crashed before it
// recorded the first call and one of its requeues would, and watches the
// Node for Settle.
func (s *suite) repeat(ctx context.Context, call func(string) error, op, word string) error {
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = call(op) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s %s again: %w", word, op, err)
	}
	return settle(ctx, s.cfg.Settle)
}

func checkUpdate(ctx context.Context, t *trial) error {
	_, id, h, err := t.launch(ctx)
	if err != nil {
		return err
	}
	before, name := len(h.boots), h.node.Name
	version := t.s.cfg.UpdateVersion
	op := "conformance-a-" + suffix()
	call := func(op string) error {
		return t.s.client.Update(ctx, id, providers.Operation{ID: op, Version: version})
	}
	if err := call(op); err != nil {
		return fmt.Errorf("update %s to %s: %w", op, version, err)
	}
	h, err = t.s.nodes.await(ctx, t.s.cfg.Timeout, id, "a new boot ID and version "+version+" after update "+op, func(h nodeHistory) bool {
		return len(h.since(before)) >= 1 && h.node != nil && h.node.Status.NodeInfo.KubeletVersion == version
	})
	if err != nil {
		return err
	}
	if h.node.Name != name {
		return fmt.Errorf("after the update the instance's Node is %s, not %s: an update keeps the Node", h.node.Name, name)
	}
	if err := t.s.repeat(ctx, call, op, "update"); err != nil {
		return err
	}
	h = t.s.nodes.history(id)
	if got := h.since(before); len(got) != 1 {
		return fmt.Errorf("update %s, then the same operation twice at once: the boot ID changed %d times, want once (new boot IDs %v)", op, len(got), got)
	}
	if h.node == nil || h.node.Status.NodeInfo.KubeletVersion != version {
		return fmt.Errorf("after update %s was repeated: %s, want version %s", op, describe(h), version)
	}
	return nil
}

func checkUndeclared(ctx context.Context, t *trial) error {
	_, id, h, err := t.launch(ctx)
	if err != nil {
		return err
	}
	before := len(h.boots)
	var errs []error
	for _, verb := range t.s.undeclared() {
		word := verbWord(verb)
		op := "conformance-" + suffix()
		if err := wantCode(t.rawVerb(ctx, verb, id, op), codes.Unimplemented, word+", undeclared,"); err != nil {
			errs = append(errs, err)
		}
		a := providers.Operation{ID: op, Version: t.s.cfg.UpdateVersion}
		var err error
		switch verb {
		case plugin.VerbReboot:
			err = t.s.client.Reboot(ctx, id, a)
		case plugin.VerbRepair:
			err = t.s.client.Repair(ctx, id, a)
		case plugin.VerbUpdate:
			err = t.s.client.Update(ctx, id, a)
		}
		if !providers.IsPermanent(err) || !errors.Is(err, plugin.ErrNotDeclared) {
			errs = append(errs, fmt.Errorf("the client's %s, undeclared: got %v, want a permanent error wrapping %q", word, err, plugin.ErrNotDeclared))
		}
	}
	if err := settle(ctx, t.s.cfg.Settle); err != nil {
		return err
	}
	if got := t.s.nodes.history(id).since(before); len(got) > 0 {
		errs = append(errs, fmt.Errorf("undeclared verbs restarted the instance: new boot IDs %v", got))
	}
	return errors.Join(errs...)
}

func checkCancelled(ctx context.Context, t *trial) error {
	m := t.machine()
	cancelled, cancel := context.WithCancel(ctx)
	stop := time.AfterFunc(time.Millisecond, cancel)
	first, firstErr := t.create(cancelled, m)
	stop.Stop()
	cancel()
	id, err := t.create(ctx, m)
	if err != nil {
		return fmt.Errorf("Create after a cancelled Create: %w", err)
	}
	if firstErr == nil && first != id {
		return fmt.Errorf("the Create that was to be cancelled returned %s, the next one %s, for one Machine UID", first, id)
	}
	found, err := t.s.client.FindByUID(ctx, m.UID)
	if err != nil {
		return fmt.Errorf("FindByUID: %w", err)
	}
	if found != id {
		return fmt.Errorf("FindByUID returned %q, want %q, what Create returned", found, id)
	}
	if err := t.s.client.Delete(ctx, id); err != nil {
		return fmt.Errorf("Delete: %w", err)
	}
	// The cancelled call may still be at work in the provider; finishing
	// after the Delete, it would leave an instance no Machine owns.
	if err := settle(ctx, t.s.cfg.Settle); err != nil {
		return err
	}
	found, err = t.s.client.FindByUID(ctx, m.UID)
	if err != nil {
		return fmt.Errorf("FindByUID after Delete: %w", err)
	}
	if found != "" {
		return fmt.Errorf("after Delete, FindByUID finds %s: the cancelled Create made an instance no Machine owns", found)
	}
	return nil
}

func checkDeadline(ctx context.Context, t *trial) error {
	m := t.machine()
	past, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	var errs []error
	if id, err := t.create(past, m); err == nil {
		errs = append(errs, fmt.Errorf("Create with its deadline passed returned %s", id))
	} else if providers.IsPermanent(err) {
		errs = append(errs, fmt.Errorf("Create with its deadline passed failed permanently (the Machine would fail for a slow call): %w", err))
	}
	if _, err := t.s.client.FindByUID(past, m.UID); err == nil {
		errs = append(errs, errors.New("FindByUID with its deadline passed succeeded"))
	} else if providers.IsPermanent(err) {
		errs = append(errs, fmt.Errorf("FindByUID with its deadline passed failed permanently: %w", err))
	}
	probe, err := t.s.client.Probe(ctx)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("Probe after the expired calls: %w", err))
	case !probe.GetReady():
		errs = append(errs, fmt.Errorf("after the expired calls, Probe says not ready: %s", probe.GetMessage()))
	}
	if _, err := t.s.client.FindByUID(ctx, m.UID); err != nil {
		errs = append(errs, fmt.Errorf("FindByUID after the expired calls: %w", err))
	}
	return errors.Join(errs...)
}

func checkTransient(ctx context.Context, t *trial) error {
	m := t.machine()
	id, err := t.createWith(ctx, m, t.class(t.s.cfg.TransientProviderSpec))
	switch {
	case err == nil:
		return fmt.Errorf("Create with the transient providerSpec %s returned %s instead of failing", t.s.cfg.TransientProviderSpec, id)
	case providers.IsPermanent(err):
		return fmt.Errorf("Create with the transient providerSpec failed permanently (the Machine would fail instead of retrying): %w", err)
	}
	return nil
}

// rawVerb sends verb without the Client, which would refuse an
// undeclared verb itself and never send an empty operation ID. A repair
// carries join data of its own, so that nothing else is amiss.
func (t *trial) rawVerb(ctx context.Context, verb providerv1.Verb, id, op string) error {
	s := t.s
	var join providers.Join
	if verb == plugin.VerbRepair {
		var err error
		if join, err = t.newJoin(ctx); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var err error
	switch verb {
	case plugin.VerbReboot:
		_, err = s.machines.Reboot(ctx, &providerv1.RebootRequest{ProviderId: id, OperationId: op})
	case plugin.VerbRepair:
		_, err = s.machines.Repair(ctx, &providerv1.RepairRequest{ProviderId: id, OperationId: op, Join: wireJoin(join)})
	case plugin.VerbUpdate:
		_, err = s.machines.Update(ctx, &providerv1.UpdateRequest{ProviderId: id, OperationId: op, Version: s.cfg.UpdateVersion})
	default:
		return fmt.Errorf("no verb %v", verb)
	}
	return err
}

// wantCode checks that a raw call failed with code.
func wantCode(err error, code codes.Code, what string) error {
	if err == nil {
		return fmt.Errorf("%s succeeded, want the status %s", what, code)
	}
	if got := status.Code(err); got != code {
		return fmt.Errorf("%s failed with %s, want %s: %w", what, got, code, err)
	}
	return nil
}

// verbWord is the verb as a person says it.
func verbWord(v providerv1.Verb) string {
	switch v {
	case plugin.VerbReboot:
		return "reboot"
	case plugin.VerbRepair:
		return "repair"
	case plugin.VerbUpdate:
		return "update"
	}
	return v.String()
}
