package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/providers"
)

// inPlaceMode is how this reconcile rolls an InPlace deployment out.
type inPlaceMode struct {
	// blocked says why nothing can be updated in place, with fallback
	// Never; empty otherwise.
	blocked string
	// replace: a change cannot be applied in place and the fallback is
	// Replace, so the Machines are replaced as a RollingUpdate would.
	replace bool
}

// change is what differs between two Machine specs, as a provider sees
// it. Labels, taints and drain settings are the Machine controller's to
// apply to the Node, so they change in place whatever the provider.
func change(from, to machinistv1.MachineSpec) providers.Change {
	return providers.Change{
		Version: from.Version != to.Version,
		Class:   from.ClassRef != to.ClassRef,
	}
}

// clusterOrOwn names a Machine's cluster for a message.
func clusterOrOwn(name string) string {
	if name == "" {
		return "the manager's own cluster"
	}
	return "cluster " + name
}

// mode decides whether the old sets' Machines can be updated in place to
// md's template.
func (r *Reconciler) mode(ctx context.Context, md *machinistv1.MachineDeployment, old []*machinistv1.MachineSet) (inPlaceMode, error) {
	fallback := machinistv1.FallbackNever
	if p := md.Spec.Strategy.InPlace; p != nil && p.Fallback != "" {
		fallback = p.Fallback
	}
	for _, ms := range old {
		if ptrOr(ms.Spec.Replicas) == 0 && ms.Status.Replicas == 0 {
			continue
		}
		c := change(ms.Spec.Template.Spec, md.Spec.Template.Spec)
		from, to := ms.Spec.Template.Spec.ClusterName, md.Spec.Template.Spec.ClusterName
		ok, why := true, ""
		switch {
		case from != to:
			// A Machine serves one cluster for life: nothing moves in
			// place, whatever the provider.
			ok, why = false, fmt.Sprintf("moves them from %s to %s, and a Machine never changes cluster", clusterOrOwn(from), clusterOrOwn(to))
			c = providers.Change{}
		case c.Empty():
			continue
		default:
			var err error
			if ok, why, err = r.inPlaceable(ctx, ms, c); err != nil {
				return inPlaceMode{}, err
			}
		}
		if ok {
			continue
		}
		if fallback == machinistv1.FallbackReplace {
			return inPlaceMode{replace: true}, nil
		}
		what := "a change of " + c.String() + " that " + why
		if c.Empty() {
			what = "a change that " + why
		}
		return inPlaceMode{blocked: fmt.Sprintf("the Machines of MachineSet %s need %s; nothing is replaced with fallback Never (set strategy.inPlace.fallback to Replace to replace them)",
			ms.Name, what)}, nil
	}
	return inPlaceMode{}, nil
}

// inPlaceable asks the provider of ms's class whether it can apply c.
func (r *Reconciler) inPlaceable(ctx context.Context, ms *machinistv1.MachineSet, c providers.Change) (bool, string, error) {
	class := &machinistv1.MachineClass{}
	key := client.ObjectKey{Namespace: ms.Namespace, Name: ms.Spec.Template.Spec.ClassRef.Name}
	if err := r.Client.Get(ctx, key, class); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return false, fmt.Sprintf("cannot be judged: MachineClass %s is not found", key.Name), nil
		}
		return false, "", err
	}
	if r.Actuators == nil {
		return false, "cannot be judged: no provider runs here", nil
	}
	act, err := r.Actuators.Get(class.Spec.Provider)
	if err != nil {
		return false, "cannot be judged: " + err.Error(), nil
	}
	if !act.InPlace(c) {
		return false, fmt.Sprintf("provider %q cannot apply in place", class.Spec.Provider), nil
	}
	return true, "", nil
}

// inPlace takes one step of an in-place rollout: it asks the Machine
// controller to update old Machines, within maxUnavailable, by giving them
// the current template's spec, and hands the updated ones over to newSet
// (old set, new set, then the Machine, each write leaving both sets
// satisfied: see the MachineSet's releasing and receiving annotations).
func (r *Reconciler) inPlace(ctx context.Context, md *machinistv1.MachineDeployment, newSet *machinistv1.MachineSet, old []*machinistv1.MachineSet) (held string, err error) {
	maxUnavailable, err := ResolveInPlace(md.Spec.Strategy, replicasOf(md))
	if err != nil {
		return "", err
	}
	sets := append(slices.Clone(old), newSet)
	index := map[string]int{}
	for i, ms := range sets {
		index[string(ms.UID)] = i
	}
	// The cache's own objects, as counts lists them: this runs on every
	// reconcile of the deployment, and whatever is written below is
	// written from a copy.
	var list machinistv1.MachineList
	if err := r.Client.List(ctx, &list, client.InNamespace(md.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return "", err
	}
	now := r.now()
	minReady := time.Duration(md.Spec.MinReadySeconds) * time.Second
	target := md.Spec.Template.Spec
	byName := map[string]*machinistv1.Machine{}
	var members []Member
	for i := range list.Items {
		m := &list.Items[i]
		ref := metav1.GetControllerOf(m)
		if ref == nil {
			continue
		}
		set, ok := index[string(ref.UID)]
		if !ok {
			continue
		}
		byName[m.Name] = m
		if op := m.Status.Operation; held == "" && op != nil && op.Type == machinistv1.OperationUpdate && operation.Held(op) {
			// The Machine controller holds the update for a budget.
			held = fmt.Sprintf("Machine %s's update is %s", m.Name, op.Message)
		}
		c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
		running := m.Status.Phase == machinistv1.MachineRunning && !operation.InFlight(m.Status.Operation)
		members = append(members, Member{
			Name:      m.Name,
			Set:       set,
			Current:   sameSpec(m.Spec, target),
			Running:   running,
			Updated:   target.Version == "" || (m.Status.NodeInfo != nil && m.Status.NodeInfo.KubeletVersion == target.Version),
			Available: m.DeletionTimestamp.IsZero() && m.Status.Phase == machinistv1.MachineRunning && c != nil && c.Status == metav1.ConditionTrue && !now.Before(c.LastTransitionTime.Add(minReady)),
			Deleting:  !m.DeletionTimestamp.IsZero(),
		})
	}
	step := NextInPlace(replicasOf(md), maxUnavailable, len(old), members)

	var errs []error
	for _, name := range step.Update {
		m := byName[name]
		patched := m.DeepCopy()
		providerID := patched.Spec.ProviderID
		patched.Spec = *target.DeepCopy()
		patched.Spec.ProviderID = providerID
		if err := r.Client.Patch(ctx, patched, client.MergeFromWithOptions(m, client.MergeFromWithOptimisticLock{})); err != nil {
			errs = append(errs, fmt.Errorf("updating Machine %s in place: %w", name, client.IgnoreNotFound(err)))
			continue
		}
		r.event(md, corev1.EventTypeNormal, "UpdatingInPlace", "RollOut", "updating Machine %s in place to revision %d", name, revision(newSet))
	}
	if len(step.Move) > 0 {
		errs = append(errs, r.handOver(ctx, md, newSet, old, byName, step.Move))
	} else {
		// Between hand-overs, the lists shed the names of Machines that
		// have arrived (or are gone), so they stay as short as one step.
		for _, ms := range sets {
			errs = append(errs, r.prune(ctx, ms, byName))
		}
	}
	return held, errors.Join(errs...)
}

// prune drops from a set's releasing list the Machines it no longer owns,
// and from its receiving list those it owns or that are gone, in one
// write, and only if there is any to drop.
func (r *Reconciler) prune(ctx context.Context, ms *machinistv1.MachineSet, byName map[string]*machinistv1.Machine) error {
	owns := func(name string) bool {
		m, ok := byName[name]
		if !ok {
			return false
		}
		ref := metav1.GetControllerOf(m)
		return ref != nil && ref.UID == ms.UID
	}
	patched := ms.DeepCopy()
	changed := false
	for key, keep := range map[string]func(string) bool{
		machinistv1.ReleasingAnnotation: owns,
		machinistv1.ReceivingAnnotation: func(n string) bool { _, ok := byName[n]; return ok && !owns(n) },
	} {
		names := splitNames(ms.Annotations[key])
		kept := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !keep(n) })
		if len(kept) == len(names) {
			continue
		}
		changed = true
		if len(kept) == 0 {
			delete(patched.Annotations, key)
		} else {
			patched.Annotations[key] = strings.Join(kept, ",")
		}
	}
	if !changed {
		return nil
	}
	if err := r.Client.Patch(ctx, patched, client.MergeFromWithOptions(ms, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("pruning the hand-over lists of MachineSet %s: %w", ms.Name, err)
	}
	r.setWrites.Wrote(patched)
	*ms = *patched
	return nil
}

// sameSpec reports whether a Machine's spec is the template's; the
// Machine's own providerID does not count.
func sameSpec(m, template machinistv1.MachineSpec) bool {
	m.ProviderID = template.ProviderID
	return equality.Semantic.DeepEqual(m, template)
}

// handOver moves the updated Machines named to newSet: each old set lists
// the ones leaving it and lowers its replicas in one write, newSet lists
// them and raises its replicas in one write, and then each Machine takes
// the new template's labels and newSet as its controller. Every write
// leaves both sets satisfied, so a step cut short anywhere is finished by
// the next reconcile, which finds the names already listed.
//
// The Machines move only once the cache shows both lists: a set reads
// itself and its Machines from two watches, which need not deliver in
// the order written. A set that saw a Machine leave before it saw the
// list that lowered its replicas would count itself one short and create
// a Machine (and the receiving set, seeing it arrive unlisted, one too
// many); the set controllers share this controller's cache, so once it
// shows the lists, theirs does too.
func (r *Reconciler) handOver(ctx context.Context, md *machinistv1.MachineDeployment, newSet *machinistv1.MachineSet, old []*machinistv1.MachineSet,
	byName map[string]*machinistv1.Machine, moving []string) error {
	var listed []string
	wrote := false
	for _, ms := range old {
		var leaving []string
		for _, name := range moving {
			if ref := metav1.GetControllerOf(byName[name]); ref != nil && ref.UID == ms.UID {
				leaving = append(leaving, name)
			}
		}
		if len(leaving) == 0 {
			continue
		}
		w, err := r.list(ctx, ms, machinistv1.ReleasingAnnotation, leaving, -1)
		if err != nil {
			return err
		}
		wrote = wrote || w
		listed = append(listed, leaving...)
	}
	w, err := r.list(ctx, newSet, machinistv1.ReceivingAnnotation, listed, +1)
	if err != nil {
		return err
	}
	if wrote || w {
		// The lists' events wake this controller; until the cache shows
		// them, setWrites holds it back.
		return nil
	}
	labels := withLabel(md.Spec.Template.Metadata.Labels, machinistv1.TemplateHashLabel, newSet.Labels[machinistv1.TemplateHashLabel])
	var errs []error
	for _, name := range listed {
		m := byName[name]
		patched := m.DeepCopy()
		patched.Labels = maps.Clone(m.Labels)
		maps.Copy(patched.Labels, labels)
		var refs []metav1.OwnerReference
		for _, ref := range m.OwnerReferences {
			if ref.Controller == nil || !*ref.Controller {
				refs = append(refs, ref)
			}
		}
		patched.OwnerReferences = append(refs, *metav1.NewControllerRef(newSet, machinistv1.GroupVersion.WithKind("MachineSet")))
		if err := r.Client.Patch(ctx, patched, client.MergeFromWithOptions(m, client.MergeFromWithOptimisticLock{})); err != nil {
			errs = append(errs, fmt.Errorf("handing Machine %s over to MachineSet %s: %w", name, newSet.Name, client.IgnoreNotFound(err)))
			continue
		}
	}
	if len(listed) > 0 {
		r.event(md, corev1.EventTypeNormal, "HandedOver", "RollOut", "%d Machine(s) updated in place joined MachineSet %s: %s",
			len(listed), newSet.Name, strings.Join(listed, ", "))
	}
	return errors.Join(errs...)
}

// list adds names to the set's list annotation key and moves its replicas
// by sign for each name not listed before, in one write, and reports
// whether it wrote; names listed before were counted by an earlier step.
// The same write drops the names from the set's other list: a Machine
// that left a set in one rollout may come back to it in the next (an
// undo), and must not stay listed as leaving it.
func (r *Reconciler) list(ctx context.Context, ms *machinistv1.MachineSet, key string, names []string, sign int32) (bool, error) {
	other := machinistv1.ReceivingAnnotation
	if key == machinistv1.ReceivingAnnotation {
		other = machinistv1.ReleasingAnnotation
	}
	have := splitNames(ms.Annotations[key])
	var added int32
	for _, n := range names {
		if !slices.Contains(have, n) {
			have = append(have, n)
			added++
		}
	}
	if added == 0 {
		return false, nil
	}
	slices.Sort(have)
	patched := ms.DeepCopy()
	if patched.Annotations == nil {
		patched.Annotations = map[string]string{}
	}
	patched.Annotations[key] = strings.Join(have, ",")
	if rest := slices.DeleteFunc(splitNames(ms.Annotations[other]), func(n string) bool { return slices.Contains(names, n) }); len(rest) > 0 {
		patched.Annotations[other] = strings.Join(rest, ",")
	} else {
		delete(patched.Annotations, other)
	}
	n := max(ptrOr(ms.Spec.Replicas)+sign*added, 0)
	patched.Spec.Replicas = &n
	// The optimistic lock: the replicas written must follow from the list
	// read, or a second writer could count a name twice.
	if err := r.Client.Patch(ctx, patched, client.MergeFromWithOptions(ms, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, fmt.Errorf("listing %s on MachineSet %s: %w", key, ms.Name, err)
	}
	r.setWrites.Wrote(patched)
	*ms = *patched
	return true, nil
}

func splitNames(s string) []string {
	var out []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}
