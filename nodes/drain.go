package nodes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/drain"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/internal/outcome"
)

// DrainOutcome is where one drain round left the Node: done, or why not,
// as a reason of the Drained condition and a message.
type DrainOutcome struct {
	Done    bool
	Reason  string
	Message string
}

// DrainRound does one non-blocking round of a drain: cordon, then evict
// every pod that is not yet terminating, through the Eviction API so that
// PodDisruptionBudgets hold. It never waits; the caller requeues until the
// Node holds only pods that drains skip (DaemonSet and mirror pods).
func DrainRound(ctx context.Context, kube kubernetes.Interface, node *corev1.Node, settings machinistv1.DrainSettings, nodeHealthy bool) (DrainOutcome, error) {
	helper := &drain.Helper{
		Ctx:                 ctx,
		Client:              kube,
		Force:               true, // pods without a controller go too: the machine is going away
		IgnoreAllDaemonSets: true,
		DeleteEmptyDirData:  true,
		GracePeriodSeconds:  -1,
		Out:                 io.Discard,
		ErrOut:              io.Discard,
	}
	if settings.GracePeriodSeconds != nil {
		helper.GracePeriodSeconds = int(*settings.GracePeriodSeconds)
	}
	if !nodeHealthy {
		// No kubelet will finish terminating pods on a dead Node; once
		// evicted they are as good as gone.
		helper.SkipWaitForDeleteTimeoutSeconds = 1
	}
	if !node.Spec.Unschedulable {
		if err := drain.RunCordonOrUncordon(helper, node, true); err != nil {
			return DrainOutcome{}, fmt.Errorf("cordoning node %s: %w", node.Name, err)
		}
	}
	list, errs := helper.GetPodsForDeletion(node.Name)
	if len(errs) > 0 {
		return DrainOutcome{}, fmt.Errorf("listing pods to evict from node %s: %w", node.Name, errors.Join(errs...))
	}
	pods := list.Pods()
	if len(pods) == 0 {
		return DrainOutcome{Done: true, Reason: machinistv1.ReasonDrained, Message: "every pod that a drain evicts is gone"}, nil
	}
	var blocked []string
	terminating := 0
	for _, pod := range pods {
		if pod.DeletionTimestamp != nil {
			terminating++
			continue
		}
		err := helper.EvictPod(pod, policyv1.SchemeGroupVersion)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			terminating++
		case outcome.Unknown(err):
			// Perhaps evicted, perhaps not: the next round sees the pod
			// terminating, or asks again. Not an error: an eviction is
			// safe to ask twice.
			terminating++
		case apierrors.IsTooManyRequests(err):
			blocked = append(blocked, fmt.Sprintf("%s/%s: %s", pod.Namespace, pod.Name, budgetMessage(err)))
		default:
			return DrainOutcome{}, fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	if len(blocked) > 0 {
		return DrainOutcome{Reason: machinistv1.ReasonDrainBlocked, Message: fmt.Sprintf(
			"eviction refused for %d pod(s): %s", len(blocked), strings.Join(blocked, "; "))}, nil
	}
	return DrainOutcome{Reason: machinistv1.ReasonDraining, Message: fmt.Sprintf("waiting for %d evicted pod(s) to terminate", terminating)}, nil
}

// budgetMessage names the PodDisruptionBudget behind a refused eviction.
func budgetMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil {
		for _, c := range status.Status().Details.Causes {
			if c.Type == policyv1.DisruptionBudgetCause {
				return c.Message
			}
		}
	}
	return err.Error()
}
