package testenv

import (
	"context"
	"errors"
	"fmt"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// HoldDrains puts one pod on each of nodes (named name-<node>, labelled
// app=name) and protects them with a PodDisruptionBudget named name that
// allows no eviction, so that a drain of any of those Nodes waits.
// kube-controller-manager runs no disruption controller here, so the
// budget's status is published by this call, and changed by
// AllowDisruptions.
func (e *Env) HoldDrains(ctx context.Context, ns, name string, nodes ...string) error {
	labels := map[string]string{"app": name}
	for _, node := range nodes {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-" + node, Labels: labels},
			Spec: corev1.PodSpec{
				NodeName:   node,
				Containers: []corev1.Container{{Name: name, Image: "registry.invalid/" + name + ":1"}},
			},
		}
		if err := e.Client.Create(ctx, pod); err != nil {
			return err
		}
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(0)),
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
		},
	}
	if err := e.Client.Create(ctx, pdb); err != nil {
		return err
	}
	return e.AllowDisruptions(ctx, ns, name, 0)
}

// AllowDisruptions publishes the status of the PodDisruptionBudget that
// HoldDrains made: allowed more evictions (each eviction takes one).
func (e *Env) AllowDisruptions(ctx context.Context, ns, name string, allowed int32) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		pdb := &policyv1.PodDisruptionBudget{}
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pdb); err != nil {
			return err
		}
		pods := &corev1.PodList{}
		if err := e.Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{"app": name}); err != nil {
			return err
		}
		healthy := int32(len(pods.Items))
		pdb.Status = policyv1.PodDisruptionBudgetStatus{
			ObservedGeneration: pdb.Generation, DisruptionsAllowed: allowed,
			CurrentHealthy: healthy, DesiredHealthy: max(healthy-allowed, 0), ExpectedPods: healthy,
		}
		return e.Client.Status().Update(ctx, pdb)
	})
}

// AttachVolume makes a VolumeAttachment named name that names node, as a
// CSI attacher's controller would for a volume in use there; no attacher
// runs here, so it stays until deleted.
func (e *Env) AttachVolume(ctx context.Context, name, node string) (*storagev1.VolumeAttachment, error) {
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: "csi.example.com", NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("pv-" + name)},
		},
	}
	return va, e.Client.Create(ctx, va)
}

// RefuseNodeDeletion makes kube-apiserver refuse to delete every Node
// labelled key=value, through a ValidatingAdmissionPolicy (and its
// binding) named name, and waits until it refuses to delete node, which
// carries that label. The returned function removes the policy and waits
// until node can be deleted again.
func (e *Env) RefuseNodeDeletion(ctx context.Context, name, key, value, node string) (func(context.Context) error, error) {
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}},
					},
				}},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: fmt.Sprintf("!has(oldObject.metadata.labels) || !(%q in oldObject.metadata.labels) || oldObject.metadata.labels[%q] != %q", key, key, value),
				Message:    "this Node is kept: refused by policy",
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	remove := func(ctx context.Context) error {
		return errors.Join(client.IgnoreNotFound(e.Client.Delete(ctx, binding)), client.IgnoreNotFound(e.Client.Delete(ctx, policy)))
	}
	if err := e.Client.Create(ctx, policy); err != nil {
		return nil, err
	}
	if err := e.Client.Create(ctx, binding); err != nil {
		return nil, errors.Join(err, remove(ctx))
	}
	// In force once kube-apiserver has compiled it, which a dry run of
	// the deletion shows.
	probe := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	refused := func() error {
		if err := e.Client.Delete(ctx, probe, client.DryRunAll); !apierrors.IsInvalid(err) {
			return fmt.Errorf("deleting node %s is not refused (%v)", node, err)
		}
		return nil
	}
	if err := Poll(30*time.Second, refused); err != nil {
		return nil, errors.Join(err, remove(ctx))
	}
	return func(ctx context.Context) error {
		if err := remove(ctx); err != nil {
			return err
		}
		return Poll(30*time.Second, func() error {
			if refused() == nil {
				return fmt.Errorf("deleting node %s is still refused", node)
			}
			return nil
		})
	}, nil
}
