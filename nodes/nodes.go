// Package nodes is the one way the controllers reach the Node side of a
// Machine: its Node, its kubelet's Lease, the pods bound to the Node, their
// eviction and the drain. Every such read and write goes through a Cluster,
// obtained per Machine from Clusters, so that where a Machine's Node lives
// is decided in one place: the manager's own cluster for a Machine without
// spec.clusterName, its WorkloadCluster's otherwise.
package nodes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/nodes/drain"
)

// Clusters finds the cluster that holds a Machine's Node.
type Clusters interface {
	// For returns the cluster of m's Node, or a *NotConnectedError when
	// the manager has no working connection to it (yet).
	For(ctx context.Context, m *machinistv1.Machine) (Cluster, error)
}

// Connections announces each workload cluster's cache as it starts, so that
// controllers can watch the Nodes there as they watch their own cluster's.
type Connections interface {
	// OnConnect has fn called for every cluster connected from now on
	// (and for those connected already); cluster is the WorkloadCluster.
	OnConnect(fn func(ctx context.Context, cluster types.NamespacedName, c cache.Cache) error)
}

// NotConnectedError says that the Machine's cluster cannot be reached
// through the manager now, and why.
type NotConnectedError struct {
	// Cluster is the WorkloadCluster.
	Cluster types.NamespacedName
	// Reason is one of the WorkloadCluster's Reachable reasons, such as
	// machinistv1.ReasonClusterConnecting.
	Reason string
	// Err is what went wrong; nil while connecting.
	Err error
	// Since is when the cluster was last found to change between
	// reachable and not, when the WorkloadCluster's condition says so;
	// zero otherwise.
	Since time.Time
	// Server and CAData are the API server's address and the PEM that
	// verifies it, as the cluster's kubeconfig names them, when it could
	// be read: what a machine repaired meanwhile is told to join, though
	// the manager has not reached the cluster since it started.
	Server string
	CAData []byte
}

func (e *NotConnectedError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("workload cluster %s: %s", e.Cluster.Name, e.Reason)
	}
	return fmt.Sprintf("workload cluster %s is not reachable (%s): %v", e.Cluster.Name, e.Reason, e.Err)
}

func (e *NotConnectedError) Unwrap() error { return e.Err }

// NotConnected returns the *NotConnectedError in err's chain, if any.
func NotConnected(err error) (*NotConnectedError, bool) {
	var nc *NotConnectedError
	ok := errors.As(err, &nc)
	return nc, ok
}

// Reach is what the manager's cache says of whether a Machine's Node side
// can be seen.
type Reach struct {
	// Down says why it cannot; nil when it can, for a Machine of the
	// manager's own cluster, and while a first connection is being made.
	Down *NotConnectedError
	// Back is when the cluster was last found reachable (its Reachable
	// condition's last turn to True); zero while it is not, and for the
	// manager's own cluster. What its kubelets reported while it was down
	// is judged from then on, not from before.
	Back time.Time
}

// Reachability reads, from r (the manager's cache), whether the
// WorkloadCluster of m can be reached. The controllers decide on this
// rather than on their own failed requests: one answer for every Machine
// of the cluster, from the prober, kept in the API across a restart.
func Reachability(ctx context.Context, r client.Reader, m *machinistv1.Machine) (Reach, error) {
	if m.Spec.ClusterName == "" {
		return Reach{}, nil
	}
	wc := &machinistv1.WorkloadCluster{}
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}
	if err := r.Get(ctx, key, wc); err != nil {
		return Reach{}, client.IgnoreNotFound(err)
	}
	c := meta.FindStatusCondition(wc.Status.Conditions, machinistv1.WorkloadClusterReachable)
	switch {
	case c == nil:
		return Reach{}, nil
	case c.Status == metav1.ConditionTrue:
		return Reach{Back: c.LastTransitionTime.Time}, nil
	case c.Status == metav1.ConditionFalse && c.Reason != machinistv1.ReasonClusterConnecting:
		return Reach{Down: &NotConnectedError{Cluster: key, Reason: c.Reason, Err: errors.New(c.Message), Since: c.LastTransitionTime.Time}}, nil
	}
	return Reach{}, nil
}

// Unseen says, for a condition's message, that the Node side of a Machine
// of the cluster is not seen. It names the cluster, its reason and since
// when, and not the error: that changes from one probe to the next, and a
// Machine's status must not.
func (e *NotConnectedError) Unseen() string {
	since := ""
	if !e.Since.IsZero() {
		since = " since " + e.Since.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("WorkloadCluster %s is not reachable (%s)%s", e.Cluster.Name, e.Reason, since)
}

// Unreachable reports whether err says that a cluster did not answer, or
// answered that it cannot serve now (503, a server timeout), rather than
// refusing the request: the connection's fault, not the request's. A
// Machine whose cluster stopped answering after it was connected meets
// this before the next probe marks the cluster Unreachable.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err)
}

// Cluster is what the controllers do on the Node side of a Machine.
type Cluster interface {
	// Node returns the Node whose spec.providerID is providerID, or nil
	// when there is none (or providerID is empty).
	Node(ctx context.Context, providerID string) (*corev1.Node, error)
	// Lease returns the kubelet Lease of the Node named node, or nil when
	// it has none.
	Lease(ctx context.Context, node string) (*coordinationv1.Lease, error)
	// Patch applies p to node, which it updates with the reply.
	Patch(ctx context.Context, node *corev1.Node, p client.Patch) error
	// Delete deletes node and its kubelet's Lease; either already gone is
	// no error.
	Delete(ctx context.Context, node *corev1.Node) error
	// Drain does one round of draining node without waiting
	// (drain.Round), by rules.
	Drain(ctx context.Context, node *corev1.Node, settings machinistv1.DrainSettings, healthy bool, rules drain.Rules) (drain.Outcome, error)
	// VolumeAttachments returns the names of the VolumeAttachments whose
	// spec.nodeName is node, sorted.
	VolumeAttachments(ctx context.Context, node string) ([]string, error)
	// DeletePods deletes at once every pod bound to node but its mirror
	// pods, and returns how many it deleted.
	DeletePods(ctx context.Context, node *corev1.Node) (int, error)
	// Join returns what m's machine joins this cluster with: its API
	// server, CA and a bootstrap token made for m, valid for ttl (made
	// unless a live one is there).
	Join(ctx context.Context, m *machinistv1.Machine, ttl time.Duration) (bootstrap.Join, error)
	// Joined deletes m's bootstrap token: its machine has joined, or
	// never will.
	Joined(ctx context.Context, m *machinistv1.Machine) error
	// Address is how a machine reaches this cluster's API server: its
	// URL and CA bundle. Known from the connection, whether or not the
	// cluster answers now.
	Address() (server string, caData []byte)
	// Publish makes t m's bootstrap token in this cluster, valid for ttl
	// from now: a token handed to m's machine while the cluster could
	// not be reached. Publishing one that is there already is no error.
	Publish(ctx context.Context, m *machinistv1.Machine, t bootstrap.Token, ttl time.Duration) error
}

// API is one cluster reached through its API server: reads come from a
// cache (whose Node index by providerID package index registers), writes
// go to the API server, and the drain speaks client-go.
type API struct {
	Client client.Client
	Kube   kubernetes.Interface
	// Server and CAData are how a new machine reaches this API server:
	// what goes into the Join its bootstrap token is handed out with.
	Server string
	CAData []byte
}

// For returns l itself: every Machine's Node lives in this one cluster, as
// for a self-managed cluster. (A pointer, so that asking costs no
// allocation per reconcile.)
func (l *API) For(context.Context, *machinistv1.Machine) (Cluster, error) { return l, nil }

// Node implements Cluster.
func (l *API) Node(ctx context.Context, providerID string) (*corev1.Node, error) {
	return index.NodeFor(ctx, l.Client, providerID)
}

// Lease implements Cluster.
func (l *API) Lease(ctx context.Context, node string) (*coordinationv1.Lease, error) {
	var lease coordinationv1.Lease
	err := l.Client.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: node}, &lease)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &lease, nil
}

// Patch implements Cluster.
func (l *API) Patch(ctx context.Context, node *corev1.Node, p client.Patch) error {
	return l.Client.Patch(ctx, node, p)
}

// Delete implements Cluster.
func (l *API) Delete(ctx context.Context, node *corev1.Node) error {
	if err := l.Client.Delete(ctx, node); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting node %s: %w", node.Name, err)
	}
	// Drop the kubelet's Lease with it, as the node lifecycle would by
	// garbage collection through its owner reference.
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: node.Name}}
	return client.IgnoreNotFound(l.Client.Delete(ctx, lease))
}

// Drain implements Cluster.
func (l *API) Drain(ctx context.Context, node *corev1.Node, settings machinistv1.DrainSettings, healthy bool, rules drain.Rules) (drain.Outcome, error) {
	return drain.Round(ctx, l.Kube, node, settings, healthy, rules)
}

// VolumeAttachments implements Cluster. It lists from the API server, not
// a cache: it is asked only while a Machine waits to be deleted or
// repaired, and a cache of a kind the cluster's credentials may not grant
// would wait for its first sync for ever rather than fail.
func (l *API) VolumeAttachments(ctx context.Context, node string) ([]string, error) {
	list, err := l.Kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing VolumeAttachments: %w", err)
	}
	var out []string
	for _, va := range list.Items {
		if va.Spec.NodeName == node {
			out = append(out, va.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// DeletePods implements Cluster.
func (l *API) DeletePods(ctx context.Context, node *corev1.Node) (int, error) {
	pods, err := l.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		return 0, fmt.Errorf("listing the pods of node %s: %w", node.Name, err)
	}
	gone := 0
	for i := range pods.Items {
		pod := &pods.Items[i]
		if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			continue
		}
		err := l.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To(int64(0)),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		switch {
		case err == nil:
			gone++
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone already, or a new pod of the same name: not ours.
		default:
			return gone, fmt.Errorf("deleting pod %s/%s of node %s: %w", pod.Namespace, pod.Name, node.Name, err)
		}
	}
	return gone, nil
}

// Offline is the Cluster of a Machine whose cluster the manager holds no
// connection to: every call returns Err. The Machine's handlers, told that
// the Node side is not seen, call none of it; were one to, it would fail
// rather than act on a cluster it cannot see.
type Offline struct{ Err *NotConnectedError }

// Node implements Cluster.
func (o Offline) Node(context.Context, string) (*corev1.Node, error) { return nil, o.Err }

// Lease implements Cluster.
func (o Offline) Lease(context.Context, string) (*coordinationv1.Lease, error) { return nil, o.Err }

// Patch implements Cluster.
func (o Offline) Patch(context.Context, *corev1.Node, client.Patch) error { return o.Err }

// Delete implements Cluster.
func (o Offline) Delete(context.Context, *corev1.Node) error { return o.Err }

// Drain implements Cluster.
func (o Offline) Drain(context.Context, *corev1.Node, machinistv1.DrainSettings, bool, drain.Rules) (drain.Outcome, error) {
	return drain.Outcome{}, o.Err
}

// VolumeAttachments implements Cluster.
func (o Offline) VolumeAttachments(context.Context, string) ([]string, error) { return nil, o.Err }

// DeletePods implements Cluster.
func (o Offline) DeletePods(context.Context, *corev1.Node) (int, error) { return 0, o.Err }

// Join implements Cluster.
func (o Offline) Join(context.Context, *machinistv1.Machine, time.Duration) (bootstrap.Join, error) {
	return bootstrap.Join{}, o.Err
}

// Joined implements Cluster.
func (o Offline) Joined(context.Context, *machinistv1.Machine) error { return o.Err }

// Address implements Cluster: the address the cluster's kubeconfig names,
// or none when it could not be read.
func (o Offline) Address() (string, []byte) { return o.Err.Server, o.Err.CAData }

// Publish implements Cluster.
func (o Offline) Publish(context.Context, *machinistv1.Machine, bootstrap.Token, time.Duration) error {
	return o.Err
}
