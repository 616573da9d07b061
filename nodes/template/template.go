// Package template publishes what a Node of a MachineSet's or
// MachineDeployment's template will be (nodes.TemplateFor: the labels and
// taints the Machine controller puts on it, the capacity its class
// declares) under the Kubernetes cluster-autoscaler's capacity
// annotations, on the set or deployment, so that a node group at zero can
// be scaled up for pods that need it.
package template

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/patch"
	"github.com/machinist-dev/machinist/nodes"
)

// The cluster-autoscaler's annotations that describe the Nodes of a node
// group it may scale up from zero. Their prefix is fixed, whatever the API
// group of the node group. A group at zero is considered only when it says
// both its cpu and its memory.
const (
	CPUAnnotation           = "capacity.cluster-autoscaler.kubernetes.io/cpu"
	MemoryAnnotation        = "capacity.cluster-autoscaler.kubernetes.io/memory"
	EphemeralDiskAnnotation = "capacity.cluster-autoscaler.kubernetes.io/ephemeral-disk"
	MaxPodsAnnotation       = "capacity.cluster-autoscaler.kubernetes.io/maxPods"
	GPUTypeAnnotation       = "capacity.cluster-autoscaler.kubernetes.io/gpu-type"
	GPUCountAnnotation      = "capacity.cluster-autoscaler.kubernetes.io/gpu-count"
	LabelsAnnotation        = "capacity.cluster-autoscaler.kubernetes.io/labels"
	TaintsAnnotation        = "capacity.cluster-autoscaler.kubernetes.io/taints"
)

// PublishedAnnotation records, on a MachineDeployment or MachineSet,
// the capacity annotations its controller wrote and their values, as a
// JSON object: an annotation whose value is no longer the one recorded
// is a person's, and is left alone.
const PublishedAnnotation = "machinist.dev/published-capacity"

// Annotations are the cluster-autoscaler's annotations for n: cpu,
// memory, ephemeral storage and pods from its capacity, one extended
// resource whose name ends in "gpu" as the GPU type and count, and its
// labels and taints. What n does not say is left out.
func Annotations(n nodes.Template) map[string]string {
	out := map[string]string{}
	for name, key := range map[corev1.ResourceName]string{
		corev1.ResourceCPU: CPUAnnotation, corev1.ResourceMemory: MemoryAnnotation,
		corev1.ResourceEphemeralStorage: EphemeralDiskAnnotation, corev1.ResourcePods: MaxPodsAnnotation,
	} {
		if q, ok := n.Capacity[name]; ok && !q.IsZero() {
			out[key] = q.String()
		}
	}
	var gpus []corev1.ResourceName
	for name, q := range n.Capacity {
		if strings.HasSuffix(string(name), "gpu") && strings.Contains(string(name), "/") && !q.IsZero() {
			gpus = append(gpus, name)
		}
	}
	if len(gpus) == 1 {
		// The autoscaler knows one GPU resource per group; with more, it
		// would be told the wrong one.
		out[GPUTypeAnnotation] = string(gpus[0])
		count := n.Capacity[gpus[0]]
		out[GPUCountAnnotation] = fmt.Sprint(count.Value())
	}
	if len(n.Labels) > 0 {
		pairs := make([]string, 0, len(n.Labels))
		for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
			pairs = append(pairs, k+"="+n.Labels[k])
		}
		out[LabelsAnnotation] = strings.Join(pairs, ",")
	}
	if len(n.Taints) > 0 {
		taints := make([]string, 0, len(n.Taints))
		for _, t := range n.Taints {
			s := t.Key
			if t.Value != "" {
				s += "=" + t.Value
			}
			taints = append(taints, s+":"+string(t.Effect))
		}
		slices.Sort(taints)
		out[TaintsAnnotation] = strings.Join(taints, ",")
	}
	return out
}

// Publish says how to make annotations (an object's, as read) carry
// want: the keys to set, the keys to remove, and the value of
// PublishedAnnotation afterwards ("" to remove it). A key whose value is
// not the one recorded as published is a person's and stays as it is;
// a key published before that want no longer has is removed, unless a
// person has changed it since.
func Publish(annotations, want map[string]string) (set map[string]string, remove []string, record string) {
	published := map[string]string{}
	if rec, ok := annotations[PublishedAnnotation]; ok {
		// A record that is not one is a person's edit, and publishes
		// nothing: every key present is then taken as theirs.
		_ = json.Unmarshal([]byte(rec), &published)
	}
	set = map[string]string{}
	now := map[string]string{}
	for k, v := range want {
		have, present := annotations[k]
		if present && published[k] != have {
			continue // theirs
		}
		now[k] = v
		if !present || have != v {
			set[k] = v
		}
	}
	for k, v := range published {
		if _, still := want[k]; !still && annotations[k] == v {
			remove = append(remove, k)
		}
	}
	slices.Sort(remove)
	if len(now) > 0 {
		b, _ := json.Marshal(now)
		record = string(b)
	}
	return set, remove, record
}

// PublishPatch adds to p what makes an object whose annotations are
// annotations (as read) carry want, as Publish says. Each key it removes
// or changes is tested to hold the value read, so that what a person
// writes in between is never written over.
func PublishPatch(p *patch.JSON, annotations, want map[string]string) {
	set, remove, record := Publish(annotations, want)
	if record == annotations[PublishedAnnotation] {
		record = "" // unchanged: nothing to write for it
	} else if record == "" {
		remove = append(remove, PublishedAnnotation)
	} else {
		set[PublishedAnnotation] = record
	}
	if len(annotations) == 0 {
		if len(set) > 0 {
			p.Test("/metadata/annotations", nil)
			p.Set("/metadata/annotations", set)
		}
		return
	}
	for _, k := range slices.Sorted(maps.Keys(set)) {
		path := "/metadata/annotations/" + patch.Key(k)
		if have, ok := annotations[k]; ok {
			p.Test(path, have)
		} else {
			p.Test(path, nil)
		}
		p.Set(path, set[k])
	}
	for _, k := range remove {
		path := "/metadata/annotations/" + patch.Key(k)
		p.Test(path, annotations[k])
		p.Remove(path)
	}
}

// ClusterNameLabel on a MachineDeployment or MachineSet names the
// WorkloadCluster of its Machines (their template's spec.clusterName),
// as Cluster API's cluster-name label does: the cluster-autoscaler's
// auto-discovery by clusterName= reads it.
const ClusterNameLabel = "machinist.dev/cluster-name"

// Publication is the patch that makes o, a MachineDeployment or a
// MachineSet that none owns, whose Machines are made from t, say what
// their Nodes will be for the cluster-autoscaler: the annotations of
// Annotations (kept as Publish says) and ClusterNameLabel, unless a
// person set it. Its class is read through c; a class that does not
// exist says nothing. The patch is empty when o says it already.
func Publication(ctx context.Context, c client.Reader, o metav1.Object, t *machinistv1.MachineTemplateSpec) (patch.JSON, error) {
	class := &machinistv1.MachineClass{}
	err := c.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: t.Spec.ClassRef.Name}, class)
	switch {
	case apierrors.IsNotFound(err):
		class = nil
	case err != nil:
		return nil, fmt.Errorf("reading MachineClass %s: %w", t.Spec.ClassRef.Name, err)
	}
	var p patch.JSON
	PublishPatch(&p, o.GetAnnotations(), Annotations(nodes.TemplateFor(class, &t.Spec)))
	if name := t.Spec.ClusterName; name != "" {
		labels := o.GetLabels()
		if _, set := labels[ClusterNameLabel]; !set {
			if len(labels) == 0 {
				p.Test("/metadata/labels", nil)
				p.Set("/metadata/labels", map[string]string{ClusterNameLabel: name})
			} else {
				p.Test("/metadata/labels/"+patch.Key(ClusterNameLabel), nil)
				p.Set("/metadata/labels/"+patch.Key(ClusterNameLabel), name)
			}
		}
	}
	return p, nil
}
