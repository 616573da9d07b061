package machine

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/internal/wake"
	"github.com/machinist-dev/machinist/lifecycle/disruption"
	"github.com/machinist-dev/machinist/lifecycle/operation"
	"github.com/machinist-dev/machinist/lifecycle/pause"
	"github.com/machinist-dev/machinist/nodes"
)

// SetupWithManager registers the controller, its cache indexes and watches.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts controller.Options) error {
	if r.Metrics != nil {
		r.Metrics.byPhase.deadline = r.deadline
	}
	idx := mgr.GetFieldIndexer()
	if err := index.Register(ctx, idx); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &machinistv1.Machine{}, machineByClass, func(o client.Object) []string {
		return []string{o.(*machinistv1.Machine).Spec.ClassRef.Name}
	}); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&machinistv1.Machine{}, builder.WithPredicates(machineChanged())).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.machinesForNode),
			builder.WithPredicates(nodeChanged())).
		Watches(&coordinationv1.Lease{}, r.leaseExpiry(mgr.GetClient())).
		Watches(&machinistv1.MachineClass{}, handler.EnqueueRequestsFromMapFunc(r.machinesForClass),
			builder.WithPredicates(classChanged())).
		Watches(&machinistv1.MachineSet{}, r.templateChanged()).
		Watches(&machinistv1.MachineDisruptionBudget{}, handler.EnqueueRequestsFromMapFunc(r.heldMachines),
			builder.WithPredicates(disruption.Freed())).
		Watches(&machinistv1.MachineDeployment{}, r.templateChanged()).
		Watches(&machinistv1.WorkloadCluster{}, handler.EnqueueRequestsFromMapFunc(r.machinesOfCluster),
			builder.WithPredicates(predicate.Or[client.Object](wake.OnReachabilityChange(), wake.OnJoinableChange(), pause.Toggled()))).
		WithOptions(opts).
		Named("machine")
	if r.OwnCluster {
		b = b.Watches(&machinistv1.ManagementCluster{}, handler.EnqueueRequestsFromMapFunc(r.waitingOwnMachines),
			builder.WithPredicates(wake.OnJoinableChange()))
	}
	c, err := b.Build(r)
	if err != nil {
		return err
	}
	if r.Connections != nil {
		// Each workload cluster's Nodes and Leases wake their Machines as
		// the manager's own do.
		r.Connections.OnConnect(func(_ context.Context, _ types.NamespacedName, nodeCache cache.Cache) error {
			if err := c.Watch(source.Kind[client.Object](nodeCache, &corev1.Node{},
				handler.EnqueueRequestsFromMapFunc(r.machinesForNode), nodeChanged())); err != nil {
				return err
			}
			return c.Watch(source.Kind[client.Object](nodeCache, &coordinationv1.Lease{}, r.leaseExpiry(nodeCache)))
		})
	}
	return nil
}

// connectingPoll is how often a Machine whose cluster is being connected
// for the first time looks again, should the WorkloadCluster's change be
// missed.
const connectingPoll = 5 * time.Second

// waitingOwnMachines maps the ManagementCluster to the Machines of the
// manager's own cluster waiting for their Nodes: whether they can join
// is what its Joinable condition says.
func (r *Reconciler) waitingOwnMachines(ctx context.Context, _ client.Object) []reconcile.Request {
	var list machinistv1.MachineList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "mapping to Machines", "from", "ManagementCluster")
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		m := &list.Items[i]
		if m.Spec.ClusterName == "" && m.Status.Phase == machinistv1.MachineProvisioning {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(m)})
		}
	}
	return reqs
}

func (r *Reconciler) machinesOfCluster(ctx context.Context, o client.Object) []reconcile.Request {
	return r.machinesMatching(ctx, "WorkloadCluster "+o.GetName(), client.InNamespace(o.GetNamespace()),
		client.MatchingFields{index.MachineByCluster: o.GetName()})
}

// nodeChanged passes Node events that can change a Machine's conclusions;
// kubelet heartbeats that change nothing else are dropped.
func nodeChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		or, nr := nodes.Condition(o, corev1.NodeReady), nodes.Condition(n, corev1.NodeReady)
		sameReady := (or == nil) == (nr == nil) && (or == nil || or.Status == nr.Status)
		return !sameReady ||
			o.Status.NodeInfo.BootID != n.Status.NodeInfo.BootID ||
			o.Spec.ProviderID != n.Spec.ProviderID ||
			o.Spec.Unschedulable != n.Spec.Unschedulable ||
			!equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
			!equality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints) ||
			namingChanged(o, n)
	}}
}

// namingChanged reports whether the annotations that name a Node's
// Machine changed: the Machine controller puts them back. Others'
// annotations change often and tell a Machine nothing.
func namingChanged(o, n *corev1.Node) bool {
	for _, k := range []string{machinistv1.NodeMachineAnnotation, machinistv1.NodeClusterNamespaceAnnotation, machinistv1.NodeClusterNameAnnotation} {
		if o.Annotations[k] != n.Annotations[k] {
			return true
		}
	}
	return false
}

func (r *Reconciler) machinesForNode(ctx context.Context, o client.Object) []reconcile.Request {
	node := o.(*corev1.Node)
	if node.Spec.ProviderID == "" {
		return nil
	}
	return r.machinesMatching(ctx, "Node "+node.Name, client.MatchingFields{index.MachineByProviderID: node.Spec.ProviderID})
}

// machinesMatching maps a watched object (what) to the Machines that opts
// select in the cache.
func (r *Reconciler) machinesMatching(ctx context.Context, what string, opts ...client.ListOption) []reconcile.Request {
	var list machinistv1.MachineList
	if err := r.Client.List(ctx, &list, opts...); err != nil {
		log.FromContext(ctx).Error(err, "mapping to Machines", "from", what)
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// heldMachines maps a budget that freed room to the Machines it selects
// whose pending operation a budget holds.
func (r *Reconciler) heldMachines(ctx context.Context, o client.Object) []reconcile.Request {
	b, ok := o.(*machinistv1.MachineDisruptionBudget)
	if !ok {
		return nil
	}
	var list machinistv1.MachineList
	if err := r.Client.List(ctx, &list, client.InNamespace(b.Namespace)); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		m := &list.Items[i]
		if !operation.Held(m.Status.Operation) {
			continue
		}
		if selected, err := disruption.Selects(b, m); err == nil && selected {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(m)})
		}
	}
	return reqs
}
