package machinedeployment

import (
	"context"
	"fmt"
	"maps"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/patch"
	"github.com/machinist-dev/machinist/nodes/template"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// nameSets gives each of md's sets the deployment's name and the set's
// revision under Cluster API's keys (DeploymentNameLabel,
// DeploymentRevisionAnnotation), which the Kubernetes cluster-autoscaler
// reads to keep from scaling a MachineDeployment down in the middle of a
// rollout, and the cluster of its Machines (template.ClusterNameLabel),
// without which its auto-discovery by cluster finds no set between a
// Node's Machine and its deployment. Sets made by this release carry them
// from their creation, and a rollback moves the revision; a set made
// before is written once.
func (r *Reconciler) nameSets(ctx context.Context, md *machinistv1.MachineDeployment, sets []*machinistv1.MachineSet) error {
	for _, ms := range sets {
		rev, ok := ms.Annotations[machinistv1.RevisionAnnotation]
		labels := setLabels(md, ms)
		if len(labels) == 0 && (!ok || ms.Annotations[machinistv1.DeploymentRevisionAnnotation] == rev) {
			continue
		}
		var p patch.JSON
		if len(ms.Labels) == 0 {
			p.Test("/metadata/labels", nil)
			p.Set("/metadata/labels", labels)
		} else {
			for k, v := range labels {
				p.Set("/metadata/labels/"+patch.Key(k), v)
			}
		}
		if ok {
			// The revision is tested: a rollback that renumbered the set
			// since it was read must not be mirrored from before it.
			p.Test("/metadata/annotations/"+patch.Key(machinistv1.RevisionAnnotation), rev)
			p.Set("/metadata/annotations/"+patch.Key(machinistv1.DeploymentRevisionAnnotation), rev)
		}
		if err := r.Client.Patch(ctx, ms, p.Patch()); err != nil {
			return fmt.Errorf("naming MachineSet %s for the cluster-autoscaler: %w", ms.Name, patch.Conflict(err))
		}
		r.setWrites.Wrote(ms)
	}
	return nil
}

// publish keeps on md what a Node of its template will be, for the
// cluster-autoscaler to scale it up from zero (template.Publication).
func (r *Reconciler) publish(ctx context.Context, md *machinistv1.MachineDeployment) error {
	p, err := template.Publication(ctx, r.Client, md, &md.Spec.Template)
	if err != nil || p.Empty() {
		return err
	}
	if err := r.Client.Patch(ctx, md, p.Patch()); err != nil {
		return fmt.Errorf("publishing its Nodes' capacity: %w", patch.Conflict(err))
	}
	r.writes.Wrote(md)
	return nil
}

// deploymentsOfClass are the MachineDeployments of the class's namespace
// whose template names it.
func (r *Reconciler) deploymentsOfClass(ctx context.Context, o client.Object) []reconcile.Request {
	var list machinistv1.MachineDeploymentList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if list.Items[i].Spec.Template.Spec.ClassRef.Name == o.GetName() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

// setLabels are the labels ms lacks of those nameSets gives it.
func setLabels(md *machinistv1.MachineDeployment, ms *machinistv1.MachineSet) map[string]string {
	out := map[string]string{}
	if ms.Labels[machinistv1.DeploymentNameLabel] != md.Name {
		out[machinistv1.DeploymentNameLabel] = md.Name
	}
	if name := ms.Spec.Template.Spec.ClusterName; name != "" {
		if _, set := ms.Labels[template.ClusterNameLabel]; !set {
			out[template.ClusterNameLabel] = name
		}
	}
	return out
}

// setLabelsAtCreation are the labels of md's set of the template with
// this hash: the template's, its hash, and those nameSets gives a set.
func setLabelsAtCreation(md *machinistv1.MachineDeployment, hash string) map[string]string {
	labels := withLabel(withLabel(maps.Clone(md.Spec.Template.Metadata.Labels), machinistv1.TemplateHashLabel, hash),
		machinistv1.DeploymentNameLabel, md.Name)
	if _, set := labels[template.ClusterNameLabel]; !set && md.Spec.Template.Spec.ClusterName != "" {
		labels[template.ClusterNameLabel] = md.Spec.Template.Spec.ClusterName
	}
	return labels
}
