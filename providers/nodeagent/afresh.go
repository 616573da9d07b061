package nodeagent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/machinist-dev/machinist/internal/bootstrap"
)

// Forget deletes what the machine's previous life left in its cluster
// under nodeName, with the machine's new credentials, so that its Node
// registers afresh: the Node (unless it has a providerID other than
// providerID, which makes it another machine's, for Run to refuse) and
// its kubelet Lease. Call it once a machine without credentials of its
// own (a first boot, or a re-imaged one) has joined, before it keeps the
// credentials: a machine that stops in between joins and forgets again.
//
// It is the machine's to do, not its provider's, because only the machine
// is sure to reach its cluster: a provider need not know which cluster
// that is, nor hold credentials for it. Deleting the Node is the only way
// a node itself can shed what others put on its old Node: NodeRestriction
// forbids a node to change its own taints, ownerReferences or most
// kubernetes.io labels, but lets it create its Node with none of them.
// Kubernetes' own policy gives nodes no delete; the join RBAC's
// machinist:node-register-afresh (config/join) grants it, and NodeRestriction confines
// it to the node's own Node. Where that role is not granted the delete is
// refused: the machine then boots on its old Node, keeping what others
// put there (logged, not fatal: a machine that will not boot helps no
// one, and kept taints keep pods away, never bring them).
//
// The Lease is deleted too, although the garbage collector would follow
// the Node: a Lease still owned by the old Node could be collected after
// the new boot took it over.
//
// Failures other than a refusal are retried, as a kubelet retries, until
// ctx ends; Forget returns an error only then.
//
// cfg acts as the node: the machine's new credentials.
func Forget(ctx context.Context, cfg *rest.Config, nodeName, providerID string) error {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	log := ctrllog.FromContext(ctx).WithValues("node", nodeName)
	delay := 100 * time.Millisecond
	for {
		wctx, cancel := writeContext(ctx)
		err := forget(wctx, kube, nodeName, providerID)
		cancel()
		switch {
		case err == nil:
			return nil
		case apierrors.IsForbidden(err):
			log.Error(err, "Booting on the Node of the machine's previous life, keeping what others put on it: this cluster does not let nodes delete their own Node",
				"grant", "ClusterRole "+bootstrap.RoleNodeRegisterAfresh+" to group "+bootstrap.NodesGroup)
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		}
		log.Error(err, "Deleting the Node of the machine's previous life failed; retrying", "after", delay)
		if !sleep(ctx, delay) {
			return ctx.Err()
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func forget(ctx context.Context, kube kubernetes.Interface, nodeName, providerID string) error {
	// Read before deleting: a first boot has no Lease, and a delete
	// answered 404 would be a refused write per new machine, which a
	// rollout of thousands counts.
	leases := kube.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	_, err := leases.Get(ctx, nodeName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading the Lease of node %s: %w", nodeName, err)
	default:
		err := leases.Delete(ctx, nodeName, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting the Lease of node %s: %w", nodeName, err)
		}
	}
	nodes := kube.CoreV1().Nodes()
	old, err := nodes.Get(ctx, nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if old.Spec.ProviderID != "" && old.Spec.ProviderID != providerID {
		return nil
	}
	// The UID it was judged by: a Node made since is not the old life's.
	err = nodes.Delete(ctx, nodeName, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(old.UID))})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting node %s: %w", nodeName, err)
	}
	return nil
}
