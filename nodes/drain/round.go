package drain

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kubedrain "k8s.io/kubectl/pkg/drain"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/outcome"
)

// Outcome is where one drain round left the Node: done, or why not,
// as a reason of the Drained condition and a message.
type Outcome struct {
	Done    bool
	Reason  string
	Message string
	// Plan says, when drain rules or pod labels decided anything, what
	// the drain does with each pod and which rule or label said so; empty
	// when every pod is drained by default.
	Plan string
}

// listed is how many pods a message names before it counts the rest.
const listed = 3

// Round does one non-blocking round of a drain: cordon, then evict,
// through the Eviction API so that PodDisruptionBudgets hold, every pod
// not yet terminating of the lowest order that still has pods. Pods of a
// higher order wait until every pod of the lower ones is gone; pods the
// rules skip are left, and pods they wait for are never evicted. It never
// waits; the caller requeues until the Node holds only pods that drains
// skip (DaemonSet and mirror pods, and those the rules skip) and the pods
// waited for have completed.
func Round(ctx context.Context, kube kubernetes.Interface, node *corev1.Node, settings machinistv1.DrainSettings, nodeHealthy bool, rules Rules) (Outcome, error) {
	helper := &kubedrain.Helper{
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
		if err := kubedrain.RunCordonOrUncordon(helper, node, true); err != nil {
			return Outcome{}, fmt.Errorf("cordoning node %s: %w", node.Name, err)
		}
	}
	list, errs := helper.GetPodsForDeletion(node.Name)
	if len(errs) > 0 {
		return Outcome{}, fmt.Errorf("listing pods to evict from node %s: %w", node.Name, errors.Join(errs...))
	}
	p, err := plan(ctx, kube, list.Pods(), rules, nodeHealthy)
	if err != nil {
		return Outcome{}, fmt.Errorf("planning the drain of node %s: %w", node.Name, err)
	}
	out := Outcome{Plan: p.describe()}
	if len(p.orders) == 0 {
		if len(p.waiting) > 0 {
			out.Reason, out.Message = machinistv1.ReasonWaitCompleted, fmt.Sprintf(
				"every pod to evict is gone; waiting for %d pod(s) to complete (WaitCompleted): %s", len(p.waiting), names(p.waiting))
			return out, nil
		}
		out.Done, out.Reason, out.Message = true, machinistv1.ReasonDrained, "every pod that a drain evicts is gone"
		if p.skipped > 0 {
			out.Message += fmt.Sprintf("; %d pod(s) left in place (Skip)", p.skipped)
		}
		return out, nil
	}
	order := p.orders[0]
	group := p.groups[order]
	var blocked []string
	for _, pod := range group {
		if pod.DeletionTimestamp != nil {
			continue
		}
		err := helper.EvictPod(pod, policyv1.SchemeGroupVersion)
		switch {
		case err == nil, apierrors.IsNotFound(err):
		case outcome.Unknown(err):
			// Perhaps evicted, perhaps not: the next round sees the pod
			// terminating, or asks again. Not an error: an eviction is
			// safe to ask twice.
		case apierrors.IsTooManyRequests(err):
			blocked = append(blocked, fmt.Sprintf("%s/%s: %s", pod.Namespace, pod.Name, budgetMessage(err)))
		default:
			return Outcome{}, fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	where := fmt.Sprintf("group order %d", order)
	if later := len(p.orders) - 1; later > 0 {
		where += fmt.Sprintf(" (%d more group(s) after it)", later)
	}
	also := ""
	if len(p.waiting) > 0 {
		also = fmt.Sprintf("; also waiting for %d pod(s) to complete (WaitCompleted)", len(p.waiting))
	}
	if len(blocked) > 0 {
		shown := strings.Join(blocked[:min(len(blocked), listed)], "; ")
		if n := len(blocked) - listed; n > 0 {
			shown += fmt.Sprintf("; and %d more", n)
		}
		out.Reason, out.Message = machinistv1.ReasonPodDisruptionBudget, fmt.Sprintf(
			"%s: eviction refused for %d pod(s): %s%s", where, len(blocked), shown, also)
		return out, nil
	}
	out.Reason, out.Message = machinistv1.ReasonDraining, fmt.Sprintf(
		"%s: waiting for %d evicted pod(s) to terminate: %s%s", where, len(group), names(group), also)
	return out, nil
}

// drainPlan is what one round found on the Node: the pods to evict by
// order, the pods waited for, and how many are left in place.
type drainPlan struct {
	orders  []int32 // sorted, each with pods
	groups  map[int32][]corev1.Pod
	waiting []corev1.Pod
	skipped int
	// decided describes the pods that rules or labels decided.
	decided map[string][]string
}

func plan(ctx context.Context, kube kubernetes.Interface, pods []corev1.Pod, rules Rules, nodeHealthy bool) (drainPlan, error) {
	p := drainPlan{groups: map[int32][]corev1.Pod{}, decided: map[string][]string{}}
	namespaces := map[string]map[string]string{}
	for _, pod := range pods {
		var nsLabels map[string]string
		if rules.NeedNamespaces() {
			l, ok := namespaces[pod.Namespace]
			if !ok {
				ns, err := kube.CoreV1().Namespaces().Get(ctx, pod.Namespace, metav1.GetOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					return drainPlan{}, fmt.Errorf("reading namespace %s: %w", pod.Namespace, err)
				}
				if err == nil {
					l = ns.Labels
				}
				namespaces[pod.Namespace] = l
			}
			nsLabels = l
		}
		d := rules.Decide(&pod, nsLabels)
		what := ""
		switch d.Behavior {
		case machinistv1.DrainBehaviorSkip:
			p.skipped++
			what = "skip"
		case machinistv1.DrainBehaviorWaitCompleted:
			what = "wait-completed"
			// A completed pod is what was waited for; on a Node no
			// kubelet serves, none will ever complete.
			if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed && nodeHealthy {
				p.waiting = append(p.waiting, pod)
			}
		default:
			if _, ok := p.groups[d.Order]; !ok {
				p.orders = append(p.orders, d.Order)
			}
			p.groups[d.Order] = append(p.groups[d.Order], pod)
			what = fmt.Sprintf("order %d", d.Order)
		}
		if d.Source != "default" {
			why := fmt.Sprintf("%s/%s by %s", pod.Namespace, pod.Name, d.Source)
			if len(d.Overruled) > 0 {
				why += fmt.Sprintf(" over %s", strings.Join(d.Overruled, ", "))
			}
			p.decided[what] = append(p.decided[what], why)
		}
	}
	slices.Sort(p.orders)
	return p, nil
}

// describe says what rules and labels decided, by behavior and order, or
// "" when they decided nothing.
func (p drainPlan) describe() string {
	if len(p.decided) == 0 {
		return ""
	}
	keys := make([]string, 0, len(p.decided))
	for k := range p.decided {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		pods := p.decided[k]
		slices.Sort(pods)
		shown := pods[:min(len(pods), 2*listed)]
		part := fmt.Sprintf("%s: %s", k, strings.Join(shown, "; "))
		if n := len(pods) - len(shown); n > 0 {
			part += fmt.Sprintf("; and %d more", n)
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, " | ")
}

// names lists the first pods by namespace/name, sorted, and counts the
// rest.
func names(pods []corev1.Pod) string {
	all := make([]string, len(pods))
	for i, p := range pods {
		all[i] = p.Namespace + "/" + p.Name
	}
	slices.Sort(all)
	out := strings.Join(all[:min(len(all), listed)], ", ")
	if n := len(all) - listed; n > 0 {
		out += fmt.Sprintf(" and %d more", n)
	}
	return out
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
