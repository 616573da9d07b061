// Package move moves a namespace's Machinist objects from one management
// cluster to another without touching an instance: it pauses them on the
// source, copies them to the target with their status and the Secrets
// they name, owner references remapped to the new UIDs, resumes them
// there, and deletes them from the source with their finalizers released,
// not run. The bootstrap tokens the source's manager keeps for Machines
// repaired while their cluster could not be reached go with them, to the
// target's manager's namespace. Every step can be run again: a move stopped half way is
// finished by running it again.
package move

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/nodes"
)

// MovedFromAnnotation on a copy on the target is the UID of its original
// on the source: a move run again knows its own copies from objects that
// were there before it, which it refuses to overwrite.
const MovedFromAnnotation = "machinist.dev/moved-from"

// pausedByMove is the paused annotation's value a move sets: the copies
// are resumed on the target, and objects paused by a person before the
// move stay paused there.
const pausedByMove = "machinist-move"

// Options say what to move where.
type Options struct {
	// From and To are clients of the source and target management
	// clusters, with Machinist's types and the core ones in their scheme.
	From, To client.Client
	// Namespace is the namespace whose objects move.
	Namespace string
	// ManagerNamespace and ToManagerNamespace are the namespaces of the
	// source's and the target's managers, where each keeps the bootstrap
	// tokens of machines repaired while their cluster could not be
	// reached.
	ManagerNamespace, ToManagerNamespace string
	// DryRun prints the plan and writes nothing.
	DryRun bool
	// Out receives the plan and the progress.
	Out io.Writer
}

// kinds are the kinds moved, in the order they are made on the target:
// what others name or own first.
var kinds = []struct {
	name string
	list client.ObjectList
	// status: the kind has a status subresource, written apart.
	status bool
}{
	{"MachineClass", &machinistv1.MachineClassList{}, false},
	{"MachineDrainRule", &machinistv1.MachineDrainRuleList{}, false},
	{"WorkloadCluster", &machinistv1.WorkloadClusterList{}, true},
	{"MachineDeployment", &machinistv1.MachineDeploymentList{}, true},
	{"MachineSet", &machinistv1.MachineSetList{}, true},
	{"Machine", &machinistv1.MachineList{}, true},
	{"MachineHealthCheck", &machinistv1.MachineHealthCheckList{}, true},
	{"MachineDisruptionBudget", &machinistv1.MachineDisruptionBudgetList{}, true},
}

// item is one object to move.
type item struct {
	kind   string
	obj    client.Object
	status bool
}

// Run moves o.Namespace from o.From to o.To.
func Run(ctx context.Context, o Options) error {
	items, secrets, err := collect(ctx, o.From, o.Namespace)
	if err != nil {
		return err
	}
	for _, it := range items {
		fmt.Fprintf(o.Out, "%s %s/%s\n", it.kind, o.Namespace, it.obj.GetName())
	}
	for _, s := range secrets {
		fmt.Fprintf(o.Out, "Secret %s/%s (copied, and left on the source)\n", o.Namespace, s)
	}
	kept := 0
	for _, it := range items {
		if m, ok := it.obj.(*machinistv1.Machine); ok && m.Status.KeptToken != nil {
			kept++
			fmt.Fprintf(o.Out, "Secret %s/%s (the bootstrap token kept for Machine %s: copied to %s under the copy's UID, and deleted from the source)\n",
				o.ManagerNamespace, nodes.KeptTokenSecretName(m.UID), m.Name, o.ToManagerNamespace)
		}
	}
	if err := refuseStrangers(ctx, o.To, items, secrets, o.Namespace); err != nil {
		return err
	}
	if o.DryRun {
		fmt.Fprintf(o.Out, "dry run: %d objects and %d Secrets would move; nothing was written\n", len(items), len(secrets)+kept)
		return nil
	}
	if len(items) > 0 {
		fmt.Fprintln(o.Out, "pausing them on the source")
		for _, it := range items {
			if err := pauseSource(ctx, o.From, it.obj); err != nil {
				return err
			}
		}
		if err := ensureNamespace(ctx, o.To, o.Namespace); err != nil {
			return err
		}
		for _, s := range secrets {
			if err := copySecret(ctx, o, s); err != nil {
				return err
			}
		}
		fmt.Fprintln(o.Out, "copying them to the target")
		uids := map[types.UID]types.UID{}
		for _, it := range items {
			if err := copyObject(ctx, o, it, uids); err != nil {
				return err
			}
		}
	}
	fmt.Fprintln(o.Out, "resuming them on the target")
	if err := resumeTarget(ctx, o.To, o.Namespace); err != nil {
		return err
	}
	fmt.Fprintln(o.Out, "deleting them from the source, their finalizers released")
	for _, it := range slices.Backward(items) {
		if err := dropKeptToken(ctx, o, it.obj); err != nil {
			return err
		}
		if err := release(ctx, o.From, it.obj); err != nil {
			return err
		}
	}
	fmt.Fprintf(o.Out, "moved %d objects and %d Secrets\n", len(items), len(secrets)+kept)
	return nil
}

// collect reads the namespace's objects from the source, in kinds' order,
// and the kubeconfig Secrets its WorkloadClusters name.
func collect(ctx context.Context, c client.Client, ns string) ([]item, []string, error) {
	var items []item
	var secrets []string
	for _, k := range kinds {
		list := k.list.DeepCopyObject().(client.ObjectList)
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			return nil, nil, fmt.Errorf("listing %ss in %s on the source: %w", k.name, ns, err)
		}
		objs, err := objects(list)
		if err != nil {
			return nil, nil, err
		}
		for _, obj := range objs {
			if obj.GetDeletionTimestamp() != nil {
				return nil, nil, fmt.Errorf("%s %s/%s is being deleted on the source: let its deletion finish (or pause it and release its finalizers) before moving %s", k.name, ns, obj.GetName(), ns)
			}
			items = append(items, item{kind: k.name, obj: obj, status: k.status})
			if wc, ok := obj.(*machinistv1.WorkloadCluster); ok && wc.Spec.Kubeconfig.SecretName != "" && !slices.Contains(secrets, wc.Spec.Kubeconfig.SecretName) {
				secrets = append(secrets, wc.Spec.Kubeconfig.SecretName)
			}
		}
	}
	return items, secrets, nil
}

// refuseStrangers refuses the move, before anything is written, when the
// target holds an object of a moved kind and name that is no copy of this
// move's own.
func refuseStrangers(ctx context.Context, to client.Client, items []item, secrets []string, ns string) error {
	var clashes []string
	for _, it := range items {
		got := it.obj.DeepCopyObject().(client.Object)
		err := to.Get(ctx, client.ObjectKeyFromObject(it.obj), got)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("reading %s %s/%s on the target: %w", it.kind, ns, it.obj.GetName(), err)
		case got.GetAnnotations()[MovedFromAnnotation] != string(it.obj.GetUID()):
			clashes = append(clashes, it.kind+" "+it.obj.GetName())
		}
	}
	for _, name := range secrets {
		s := &corev1.Secret{}
		err := to.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, s)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("reading Secret %s/%s on the target: %w", ns, name, err)
		case s.Annotations[MovedFromAnnotation] == "":
			clashes = append(clashes, "Secret "+name)
		}
	}
	if len(clashes) > 0 {
		return fmt.Errorf("the target already holds, in namespace %s, objects this move did not make: %v; nothing was written: move them away or delete them first", ns, clashes)
	}
	return nil
}

func pauseSource(ctx context.Context, c client.Client, obj client.Object) error {
	if _, ok := obj.GetAnnotations()[machinistv1.PausedAnnotation]; ok {
		return nil // paused already, by this move or by a person
	}
	base := obj.DeepCopyObject().(client.Object)
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[machinistv1.PausedAnnotation] = pausedByMove
	obj.SetAnnotations(ann)
	if err := c.Patch(ctx, obj, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("pausing %s/%s on the source: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

func ensureNamespace(ctx context.Context, c client.Client, ns string) error {
	err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("making namespace %s on the target: %w", ns, err)
	}
	return nil
}

func copySecret(ctx context.Context, o Options, name string) error {
	s := &corev1.Secret{}
	if err := o.From.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // the WorkloadCluster names a Secret that is not there: it says so on the target too
		}
		return fmt.Errorf("reading Secret %s/%s on the source: %w", o.Namespace, name, err)
	}
	out := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: name, Labels: s.Labels,
			Annotations: withMovedFrom(s.Annotations, s.UID)},
		Type: s.Type, Data: s.Data,
	}
	if err := o.To.Create(ctx, out); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("copying Secret %s/%s: %w", o.Namespace, name, err)
	}
	return nil
}

// copyObject makes the copy of it on the target, paused (the paused
// annotation is copied with it), with its owner references remapped
// through uids, then writes its status; a copy made by an earlier run is
// kept. It records the copy's UID in uids.
func copyObject(ctx context.Context, o Options, it item, uids map[types.UID]types.UID) error {
	to := o.To
	src := it.obj
	existing := src.DeepCopyObject().(client.Object)
	err := to.Get(ctx, client.ObjectKeyFromObject(src), existing)
	if err == nil {
		uids[src.GetUID()] = existing.GetUID()
		if m, ok := existing.(*machinistv1.Machine); ok && m.Status.Phase == "" && m.Status.ProviderID == "" {
			// Made by a run stopped before it copied the status: the
			// phase, providerID and any operation in flight go over now,
			// while the copy is still paused.
			if it, err = carryKeptToken(ctx, o, it, existing.GetUID()); err != nil {
				return err
			}
			return copyStatus(ctx, to, it, existing)
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	dst := src.DeepCopyObject().(client.Object)
	dst.SetUID("")
	dst.SetResourceVersion("")
	dst.SetGeneration(0)
	dst.SetCreationTimestamp(metav1.Time{})
	dst.SetManagedFields(nil)
	dst.SetDeletionTimestamp(nil)
	dst.SetAnnotations(withMovedFrom(src.GetAnnotations(), src.GetUID()))
	var refs []metav1.OwnerReference
	for _, ref := range src.GetOwnerReferences() {
		if uid, ok := uids[ref.UID]; ok {
			ref.UID = uid
			refs = append(refs, ref)
		}
		// An owner that is not moved (gone, or of a kind not moved) is
		// dropped: the garbage collector would delete an object whose
		// owner's UID the target does not know.
	}
	dst.SetOwnerReferences(refs)
	if err := to.Create(ctx, dst); err != nil {
		return fmt.Errorf("copying %s %s/%s: %w", it.kind, src.GetNamespace(), src.GetName(), err)
	}
	uids[src.GetUID()] = dst.GetUID()
	if it, err = carryKeptToken(ctx, o, it, dst.GetUID()); err != nil {
		return err
	}
	return copyStatus(ctx, to, it, dst)
}

// carryKeptToken copies the bootstrap token the source's manager keeps
// for the Machine of it, if any, to the target's manager's namespace, in
// the Secret the copy (of UID uid) is kept for there, and returns it with
// its status recording that Secret. The token keeps its ID: the target's
// manager publishes it under that ID once the cluster answers, and the
// machine, given it while the cluster could not be reached, joins with
// it. A record whose Secret is gone, or is not the one it names, goes as
// it is: the target's manager says the token was lost, as the source's
// would have.
func carryKeptToken(ctx context.Context, o Options, it item, uid types.UID) (item, error) {
	m, ok := it.obj.(*machinistv1.Machine)
	if !ok || m.Status.KeptToken == nil {
		return it, nil
	}
	src := &corev1.Secret{}
	err := o.From.Get(ctx, types.NamespacedName{Namespace: o.ManagerNamespace, Name: nodes.KeptTokenSecretName(m.UID)}, src)
	switch {
	case apierrors.IsNotFound(err) || err == nil && string(src.UID) != m.Status.KeptToken.SecretUID:
		fmt.Fprintf(o.Out, "warning: the bootstrap token Machine %s records is not in %s on the source; its machine cannot join until it is repaired again\n", m.Name, o.ManagerNamespace)
		return it, nil
	case err != nil:
		return it, fmt.Errorf("reading the bootstrap token kept for Machine %s/%s on the source: %w", m.Namespace, m.Name, err)
	}
	labels := make(map[string]string, len(src.Labels))
	for k, v := range src.Labels {
		labels[k] = v
	}
	labels[nodes.TokenMachineLabel] = string(uid)
	dst := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: o.ToManagerNamespace, Name: nodes.KeptTokenSecretName(uid), Labels: labels,
			Annotations: withMovedFrom(src.Annotations, src.UID)},
		Type: src.Type, Data: src.Data,
	}
	err = o.To.Create(ctx, dst)
	if apierrors.IsAlreadyExists(err) {
		// Made by a run stopped before it copied the Machine's status.
		err = o.To.Get(ctx, client.ObjectKeyFromObject(dst), dst)
		if err == nil && dst.Annotations[MovedFromAnnotation] != string(src.UID) {
			err = fmt.Errorf("Secret %s/%s on the target is no copy of this move's", dst.Namespace, dst.Name)
		}
	}
	if err != nil {
		return it, fmt.Errorf("copying the bootstrap token kept for Machine %s/%s to the target's manager namespace %s (it must exist: the target's manager runs there): %w", m.Namespace, m.Name, o.ToManagerNamespace, err)
	}
	moved := m.DeepCopy()
	moved.Status.KeptToken.SecretUID = string(dst.UID)
	it.obj = moved
	return it, nil
}

// dropKeptToken deletes from the source the Secret its manager kept a
// Machine's bootstrap token in: the copy is the target's. It goes before
// the Machine, so that a move killed between the two leaves no Secret
// that nothing names.
func dropKeptToken(ctx context.Context, o Options, obj client.Object) error {
	m, ok := obj.(*machinistv1.Machine)
	if !ok || m.Status.KeptToken == nil {
		return nil
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: o.ManagerNamespace, Name: nodes.KeptTokenSecretName(m.UID)}}
	uid := types.UID(m.Status.KeptToken.SecretUID)
	if err := o.From.Delete(ctx, sec, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting the bootstrap token kept for Machine %s/%s from the source: %w", m.Namespace, m.Name, err)
	}
	return nil
}

// copyStatus writes the source's status of it over copy, its copy on
// the target. A status subresource takes the status alone from the body,
// so the source's object goes as it is, under the copy's identity and
// resourceVersion; the target's controller may have written the copy
// (its Paused condition) meanwhile, which a conflict shows.
func copyStatus(ctx context.Context, to client.Client, it item, copy client.Object) error {
	if !it.status {
		return nil
	}
	body := it.obj.DeepCopyObject().(client.Object)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := to.Get(ctx, client.ObjectKeyFromObject(copy), copy); err != nil {
			return err
		}
		body.SetUID(copy.GetUID())
		body.SetResourceVersion(copy.GetResourceVersion())
		return to.Status().Update(ctx, body)
	})
	if err != nil {
		return fmt.Errorf("copying the status of %s %s/%s: %w", it.kind, it.obj.GetNamespace(), it.obj.GetName(), err)
	}
	return nil
}

func withMovedFrom(ann map[string]string, uid types.UID) map[string]string {
	out := make(map[string]string, len(ann)+1)
	for k, v := range ann {
		out[k] = v
	}
	out[MovedFromAnnotation] = string(uid)
	return out
}

// resumeTarget removes the paused annotation this move set from every
// copy of a move in ns, including those of a run that stopped before it
// got here.
func resumeTarget(ctx context.Context, to client.Client, ns string) error {
	var errs []error
	for _, k := range kinds {
		list := k.list.DeepCopyObject().(client.ObjectList)
		if err := to.List(ctx, list, client.InNamespace(ns)); err != nil {
			return fmt.Errorf("listing %ss in %s on the target: %w", k.name, ns, err)
		}
		objs, err := objects(list)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			ann := obj.GetAnnotations()
			if ann[MovedFromAnnotation] == "" || ann[machinistv1.PausedAnnotation] != pausedByMove {
				continue
			}
			patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+machinistv1.PausedAnnotation+`":null}}}`))
			if err := to.Patch(ctx, obj, patch); err != nil {
				errs = append(errs, fmt.Errorf("resuming %s %s/%s on the target: %w", k.name, ns, obj.GetName(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// release deletes obj from the source without its finalizers running:
// the instances are the target's now.
func release(ctx context.Context, from client.Client, obj client.Object) error {
	if len(obj.GetFinalizers()) > 0 {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
		if err := from.Patch(ctx, obj, patch); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("releasing the finalizers of %s/%s on the source: %w", obj.GetNamespace(), obj.GetName(), err)
		}
	}
	uid := obj.GetUID()
	if err := from.Delete(ctx, obj, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting %s/%s from the source: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// objects returns the items of list.
func objects(list client.ObjectList) ([]client.Object, error) {
	items, err := apimeta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, len(items))
	for i, o := range items {
		out[i] = o.(client.Object)
	}
	return out, nil
}
