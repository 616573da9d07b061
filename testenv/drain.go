package testenv

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
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
