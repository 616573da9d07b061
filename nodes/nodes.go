// Package nodes is the one way the controllers reach the Node side of a
// Machine: its Node, its kubelet's Lease, the pods bound to the Node, their
// eviction and the drain. Every such read and write goes through a Cluster,
// obtained per Machine from Clusters, so that where a Machine's Node lives
// is decided in one place: the manager's own cluster for a Machine without
// spec.clusterName, its WorkloadCluster's otherwise.
package nodes

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/internal/patch"
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
	// verifies it, as the WorkloadCluster's joinEndpoint or else its
	// kubeconfig names them, when they are known: what a machine repaired
	// meanwhile is told to join, though the manager has not reached the
	// cluster since it started.
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
	// Nodes lists the cluster's Nodes (from the cache).
	Nodes(ctx context.Context) ([]corev1.Node, error)
	// Patch applies p to node, which it updates with the reply. A JSON
	// patch whose test failed, because a value it tested changed since it
	// was read, is a Conflict, as an update of a stale object is.
	Patch(ctx context.Context, node *corev1.Node, p client.Patch) error
	// PatchStatus applies p to node's status, as Patch does to the rest.
	PatchStatus(ctx context.Context, node *corev1.Node, p client.Patch) error
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
	return nodeFor(ctx, l.Client, providerID)
}

// Nodes implements Cluster.
func (l *API) Nodes(ctx context.Context) ([]corev1.Node, error) {
	var list corev1.NodeList
	if err := l.Client.List(ctx, &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// nodeFor returns the Node whose spec.providerID is providerID, from the
// cache behind c, or nil when there is none. Two or more are a
// *DuplicateNodesError: a Node's providerID is whatever the credential
// that registered it wrote, and a machine may register a Node of any new
// name with a bootstrap token, so a second Node claiming a Machine's
// instance is not taken for its Node, whichever comes first.
func nodeFor(ctx context.Context, c client.Reader, providerID string) (*corev1.Node, error) {
	if providerID == "" {
		return nil, nil
	}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes, client.MatchingFields{index.NodeByProviderID: providerID}); err != nil {
		return nil, err
	}
	switch len(nodes.Items) {
	case 0:
		return nil, nil
	case 1:
		return &nodes.Items[0], nil
	}
	names := make([]string, len(nodes.Items))
	for i := range nodes.Items {
		names[i] = nodes.Items[i].Name
	}
	slices.Sort(names)
	return nil, &DuplicateNodesError{ProviderID: providerID, Nodes: names}
}

// DuplicateNodesError is nodeFor's answer when several Nodes claim one
// providerID.
type DuplicateNodesError struct {
	ProviderID string
	// Nodes are their names, sorted.
	Nodes []string
}

func (e *DuplicateNodesError) Error() string {
	return fmt.Sprintf("Nodes %s all claim providerID %s: none is taken for the Machine's until only one does (delete the Node its machine did not register)",
		strings.Join(e.Nodes, ", "), e.ProviderID)
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
	return patch.Conflict(l.Client.Patch(ctx, node, p))
}

// PatchStatus implements Cluster.
func (l *API) PatchStatus(ctx context.Context, node *corev1.Node, p client.Patch) error {
	return patch.Conflict(l.Client.Status().Patch(ctx, node, p))
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

// Nodes implements Cluster.
func (o Offline) Nodes(context.Context) ([]corev1.Node, error) { return nil, o.Err }

// Patch implements Cluster.
func (o Offline) Patch(context.Context, *corev1.Node, client.Patch) error { return o.Err }

// PatchStatus implements Cluster.
func (o Offline) PatchStatus(context.Context, *corev1.Node, client.Patch) error { return o.Err }

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

// Health: what a Node says of the machine behind it.

// Health is what the Machine controller concludes about a Node.
type Health struct {
	Healthy bool
	// Reason is one of the NodeHealthy condition's reasons
	// (machinistv1.ReasonNode*); Message says it for people.
	Reason  string
	Message string
}

// Judge judges node as Kubernetes' node lifecycle controller would: Ready,
// and a kubelet Lease renewed within its duration. The Lease matters
// because a dead kubelet cannot report itself NotReady. A nil node has no
// health.
func Judge(ctx context.Context, c Cluster, node *corev1.Node, now time.Time) (Health, error) {
	if node == nil {
		return Health{Reason: machinistv1.ReasonNodeNotFound, Message: "no Node has this Machine's providerID"}, nil
	}
	ready := Condition(node, corev1.NodeReady)
	if ready != nil && ready.Status == corev1.ConditionUnknown {
		// Unknown is how Kubernetes' node lifecycle controller marks a
		// dead kubelet's Node; the Lease says why better than the
		// condition does.
		if h, err := leaseHealth(ctx, c, node, now); err != nil || !h.Healthy {
			return h, err
		}
	}
	if ready == nil || ready.Status != corev1.ConditionTrue {
		msg := "the Node has not reported Ready"
		if ready != nil {
			msg = fmt.Sprintf("Node %s is Ready=%s: %s", node.Name, ready.Status, ready.Message)
		}
		return Health{Reason: machinistv1.ReasonNodeNotReady, Message: msg}, nil
	}
	return leaseHealth(ctx, c, node, now)
}

// leaseHealth judges a Node by its kubelet's Lease alone.
func leaseHealth(ctx context.Context, c Cluster, node *corev1.Node, now time.Time) (Health, error) {
	healthy := Health{Healthy: true, Reason: machinistv1.ReasonNodeReady, Message: fmt.Sprintf("Node %s is Ready", node.Name)}
	lease, err := c.Lease(ctx, node.Name)
	if err != nil || lease == nil {
		return healthy, err
	}
	if expiry, ok := LeaseExpiry(lease); ok && now.After(expiry) {
		return Health{Reason: machinistv1.ReasonNodeLeaseExpired, Message: fmt.Sprintf(
			"Node %s's kubelet has not renewed its Lease since %s (lease duration %ds)",
			node.Name, lease.Spec.RenewTime.UTC().Format(time.RFC3339), *lease.Spec.LeaseDurationSeconds)}, nil
	}
	return healthy, nil
}

// LeaseExpiry is when a kubelet's lease expires unless renewed; false when
// it says neither when it was renewed nor for how long.
func LeaseExpiry(lease *coordinationv1.Lease) (time.Time, bool) {
	if lease.Spec.RenewTime == nil || lease.Spec.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	return lease.Spec.RenewTime.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second), true
}

// Condition returns node's condition of type t, or nil.
func Condition(node *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == t {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// Ready reports whether node reports Ready=True.
func Ready(node *corev1.Node) bool {
	c := Condition(node, corev1.NodeReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

// Joining: what a machine joins its cluster with, and the bootstrap token
// that becomes its Node's credentials.

// TokenMachineLabel marks a bootstrap token's Secret with the UID of the
// Machine it was made for, so that it is found again, and deleted once the
// Machine's machine has joined.
const TokenMachineLabel = "machinist.dev/machine-uid"

// KeptTokenSecretType is the type of the Secret, in the manager's own
// namespace of the management cluster, that keeps the bootstrap token of
// a machine repaired while its cluster could not be reached. The type alone proves nothing
// (anyone who may create Secrets may give one any type); the Machine's
// status records the Secret the manager made.
const KeptTokenSecretType corev1.SecretType = "machinist.dev/kept-bootstrap-token"

// KeptTokenSecretName names the Secret that keeps the token of the
// Machine with this UID: the UID makes it unique, whatever the Machine's
// name and namespace. A Machine moved to another management cluster has a
// new UID, and its kept token a Secret of the new name there.
func KeptTokenSecretName(uid types.UID) string { return "machinist-join-" + string(uid) }

// KeptForAnnotation names, on a kept token's Secret, the Machine it is
// kept for, as namespace/name: for people, since an owner reference
// cannot name a Machine of another namespace.
const KeptForAnnotation = "machinist.dev/kept-for"

// tokenIDs is how many token IDs a Machine may try: its ID is derived from
// its UID, so that a reconcile that lost its reply finds the token it
// made, and a collision with another Machine's moves to the next.
const tokenIDs = 4

// Join returns what m's machine joins its cluster with, making m's
// bootstrap token (valid for ttl) unless a live one is there.
func (l *API) Join(ctx context.Context, m *machinistv1.Machine, ttl time.Duration) (bootstrap.Join, error) {
	secrets := l.Kube.CoreV1().Secrets(metav1.NamespaceSystem)
	for i := range tokenIDs {
		id := tokenID(m.UID, i)
		s, err := secrets.Get(ctx, bootstrap.Token{ID: id}.SecretName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			t, err := bootstrap.NewToken()
			if err != nil {
				return bootstrap.Join{}, err
			}
			t.ID = id
			_, err = secrets.Create(ctx, bootstrap.TokenSecret(t, bootstrap.TokenOptions{
				Expiration:  time.Now().Add(ttl),
				Description: fmt.Sprintf("joins the machine of Machine %s/%s", m.Namespace, m.Name),
				Labels:      map[string]string{TokenMachineLabel: string(m.UID)},
			}), metav1.CreateOptions{})
			if err != nil {
				// AlreadyExists included: a reconcile of the same
				// Machine raced this one; the next look finds its token.
				return bootstrap.Join{}, fmt.Errorf("making the bootstrap token of Machine %s: %w", m.Name, err)
			}
			return l.join(t), nil
		case err != nil:
			return bootstrap.Join{}, fmt.Errorf("reading the bootstrap token of Machine %s: %w", m.Name, err)
		case s.Labels[TokenMachineLabel] != string(m.UID):
			continue // another Machine's, or a person's
		}
		t, err := bootstrap.TokenFromSecret(s)
		if err != nil {
			return bootstrap.Join{}, err
		}
		if expired(s, time.Now().Add(time.Minute)) {
			// Too late to join with: the token cleaner deletes it soon.
			// A new one is made on the next look.
			err := secrets.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return bootstrap.Join{}, err
			}
			return bootstrap.Join{}, fmt.Errorf("the bootstrap token of Machine %s had expired; a new one is made", m.Name)
		}
		return l.join(t), nil
	}
	return bootstrap.Join{}, fmt.Errorf("the %d bootstrap token IDs of Machine %s are all taken by other tokens", tokenIDs, m.Name)
}

// Joined deletes m's bootstrap tokens: its machine has joined, or never
// will. None being there is no error.
//
// Each token ID m may hold is read by name and its Secret deleted if it is
// m's. A deletecollection by m's label would be one request, but
// kube-apiserver serves it by reading every Secret of kube-system, and
// while thousands of machines join at once that is thousands of tokens
// read per Machine: a ninth of kube-apiserver's CPU in a scale-up of
// 10,000. The reads are consistent, not from kube-apiserver's watch
// cache: a Machine deleted as it starts provisioning reads its token
// milliseconds after making it.
func (l *API) Joined(ctx context.Context, m *machinistv1.Machine) error {
	secrets := l.Kube.CoreV1().Secrets(metav1.NamespaceSystem)
	ids := make([]string, 0, tokenIDs+2)
	for i := range tokenIDs + 1 {
		ids = append(ids, tokenID(m.UID, i))
	}
	if rec := m.Status.KeptToken; rec != nil && !slices.Contains(ids, rec.TokenID) {
		// A token kept for the Machine before it was moved here keeps the
		// ID its first UID gave it. Published here, it carries this UID's
		// label, which the label check below asks for as of any other.
		ids = append(ids, rec.TokenID)
	}
	for _, id := range ids {
		name := bootstrap.Token{ID: id}.SecretName()
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("reading the bootstrap token of Machine %s: %w", m.Name, err)
		case s.Labels[TokenMachineLabel] != string(m.UID):
			continue // another Machine's, or a person's
		}
		err = secrets.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting the bootstrap token of Machine %s: %w", m.Name, err)
		}
	}
	return nil
}

// PublishedTokenID is the ID of the token kept for m's machine while its
// cluster could not be reached, then published (Publish): a slot of its
// own after those Join tries, so that Joined finds it by name too.
func PublishedTokenID(uid types.UID) string { return tokenID(uid, tokenIDs) }

// Address implements Cluster.
func (l *API) Address() (string, []byte) { return l.Server, l.CAData }

// Publish implements Cluster.
func (l *API) Publish(ctx context.Context, m *machinistv1.Machine, t bootstrap.Token, ttl time.Duration) error {
	secrets := l.Kube.CoreV1().Secrets(metav1.NamespaceSystem)
	_, err := secrets.Create(ctx, bootstrap.TokenSecret(t, bootstrap.TokenOptions{
		Expiration:  time.Now().Add(ttl),
		Description: fmt.Sprintf("joins the machine of Machine %s/%s, given while the cluster could not be reached", m.Namespace, m.Name),
		Labels:      map[string]string{TokenMachineLabel: string(m.UID)},
	}), metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("making the bootstrap token of Machine %s: %w", m.Name, err)
		}
		return nil
	}
	// Made by an earlier attempt whose reply was lost, or another's.
	s, err := secrets.Get(ctx, t.SecretName(), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the bootstrap token of Machine %s: %w", m.Name, err)
	}
	if have, err := bootstrap.TokenFromSecret(s); err != nil || have != t || s.Labels[TokenMachineLabel] != string(m.UID) {
		return fmt.Errorf("the bootstrap token ID %s of Machine %s is taken by another token", t.ID, m.Name)
	}
	return nil
}

func (l *API) join(t bootstrap.Token) bootstrap.Join {
	return bootstrap.Join{Server: l.Server, CAData: l.CAData, Token: t.Value()}
}

// tokenID is the i-th token ID of the Machine with this UID: six
// characters of [a-z0-9].
func tokenID(uid types.UID, i int) string {
	sum := sha256.Sum256([]byte(string(uid) + "/" + strconv.Itoa(i)))
	id := strconv.FormatUint(binary.BigEndian.Uint64(sum[:8]), 36)
	return strings.Repeat("0", max(0, 6-len(id))) + id[:min(6, len(id))]
}

// expired reports whether the token Secret's expiration is before t.
func expired(s *corev1.Secret, t time.Time) bool {
	at, err := time.Parse(time.RFC3339, string(s.Data[bootstrapapi.BootstrapTokenExpirationKey]))
	return err == nil && at.Before(t)
}

// Template is what a Node of a Machine spec will hold, before any
// Machine exists: the Machine controller applies its labels and taints to
// the Node, and the MachineSet and MachineDeployment controllers publish
// it for the cluster-autoscaler (package nodes/template).
type Template struct {
	Labels   map[string]string
	Taints   []corev1.Taint
	Capacity corev1.ResourceList
}

// TemplateFor is what the Node of a Machine of spec, of class (nil when it
// does not exist), holds: the class's labels and taints, then the
// Machine's own, which win over the class's with the same key (and, for
// taints, effect), and the capacity the class declares.
func TemplateFor(class *machinistv1.MachineClass, spec *machinistv1.MachineSpec) Template {
	n := Template{Labels: map[string]string{}}
	if class != nil && class.Spec.NodeTemplate != nil {
		t := class.Spec.NodeTemplate
		maps.Copy(n.Labels, t.NodeLabels)
		for _, taint := range t.NodeTaints {
			n.Taints = append(n.Taints, taint.AsCore())
		}
		n.Capacity = t.Capacity.DeepCopy()
	}
	maps.Copy(n.Labels, spec.NodeLabels)
	for _, t := range spec.NodeTaints {
		n.Taints = SetTaint(n.Taints, t.AsCore())
	}
	return n
}

// Uninitialized is the taint a kubelet run with --cloud-provider=external
// registers its Node with, until a cloud provider has given the Node its
// addresses (k8s.io/cloud-provider's TaintExternalCloudProvider).
const Uninitialized = "node.cloudprovider.kubernetes.io/uninitialized"

// HasTaint reports whether taints hold one with key, of any effect.
func HasTaint(taints []corev1.Taint, key string) bool {
	return slices.ContainsFunc(taints, func(t corev1.Taint) bool { return t.Key == key })
}

// RemoveTaint is taints without those with key, or taints itself when it
// holds none.
func RemoveTaint(taints []corev1.Taint, key string) []corev1.Taint {
	if !HasTaint(taints, key) {
		return taints
	}
	return slices.DeleteFunc(slices.Clone(taints), func(t corev1.Taint) bool { return t.Key == key })
}

// SetTaint adds t to taints, or gives the taint with its key and effect
// its value. A taint that is there already is kept as it is (with the
// time the Node's controller added it), and taints itself is returned
// unchanged when nothing changes, so that comparing says whether to write.
func SetTaint(taints []corev1.Taint, t corev1.Taint) []corev1.Taint {
	for i := range taints {
		if taints[i].Key == t.Key && taints[i].Effect == t.Effect {
			if taints[i].Value != t.Value {
				out := slices.Clone(taints)
				out[i].Value = t.Value
				return out
			}
			return taints
		}
	}
	return append(slices.Clone(taints), t)
}
