// Package clusters serves the WorkloadClusters: the clusters, apart from
// the manager's own, whose Nodes its Machines become. It keeps one
// connection per WorkloadCluster (a client, a cache of the Nodes and
// Leases there, and a rate limit of its own, so that one slow cluster
// cannot starve the others), started when the first Machine needs it and
// stopped when the cluster goes, and it decides which kubeconfigs it
// trusts. The WorkloadCluster controller (controllers/workloadcluster)
// says whether each cluster is reachable.
package clusters

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/index"
	"github.com/machinist-dev/machinist/nodes"
)

// Defaults for the fields of Options left zero.
const (
	// DefaultQPS and DefaultBurst bound the requests to each workload
	// cluster: a scale-up of a thousand Machines there writes a few
	// thousand times (tokens, Node labels), and the bound is per cluster.
	DefaultQPS   = 100
	DefaultBurst = 200
	// DefaultConnectTimeout bounds connecting: the first answer and the
	// first sync of the cache.
	DefaultConnectTimeout = 30 * time.Second
	// DefaultRequestTimeout bounds each request to a workload cluster, so
	// that one that stops answering holds a worker no longer than this.
	DefaultRequestTimeout = 30 * time.Second
	// probeTimeout bounds a probe: asking a version is cheap, and a
	// cluster that takes longer to answer it is as good as gone.
	probeTimeout = 10 * time.Second
)

// Options configure a Registry.
type Options struct {
	// Local is the manager's own cluster, for Machines without
	// spec.clusterName.
	Local nodes.Cluster
	// QPS and Burst bound each workload cluster's requests; zero takes
	// DefaultQPS and DefaultBurst.
	QPS   float32
	Burst int
	// ConnectTimeout and RequestTimeout: zero takes the defaults.
	ConnectTimeout, RequestTimeout time.Duration
	// WatchError handles a failed watch of a workload cluster's cache
	// (as the manager's own does for its cache); nil keeps client-go's.
	WatchError toolscache.WatchErrorHandlerWithContext
	// TrimNode is applied to every Node cached; nil keeps them whole.
	TrimNode toolscache.TransformFunc
	// Trust is what a WorkloadCluster's kubeconfig may ask beyond inline
	// data; the zero value allows nothing more.
	Trust Trust
}

// Registry holds the manager's connections to workload clusters. It is
// the nodes.Clusters the controllers ask where a Machine's Node lives.
type Registry struct {
	opts   Options
	scheme *k8sruntime.Scheme

	mu    sync.Mutex
	conns map[types.NamespacedName]*conn
	// failed says why the last connection to a cluster failed, for the
	// Machines that wait on it.
	failed map[types.NamespacedName]*nodes.NotConnectedError
	// addresses are the API server addresses the clusters' kubeconfigs
	// name, kept from the last one read whether or not it connected: a
	// cluster down since the manager started still has an address to
	// give a machine repaired meanwhile.
	addresses map[types.NamespacedName]address
	// joins are the join endpoints the WorkloadClusters name: where set,
	// what a new machine is given instead of the kubeconfig's address.
	joins map[types.NamespacedName]address
	hooks []func(context.Context, types.NamespacedName, cache.Cache) error
	// ctx is the manager's: every connection's cache runs under it.
	ctx context.Context
}

// conn is one workload cluster's connection.
type conn struct {
	digest [sha256.Size]byte // of the kubeconfig it was made from
	host   string            // the API server the kubeconfig names
	// cluster is replaced, never changed, when the address given to new
	// machines changes: a reconcile may hold the one it was handed.
	cluster *nodes.API
	cache   cache.Cache
	kube    kubernetes.Interface
	config  *rest.Config // what kube was made from
	stop    context.CancelFunc
	done    chan struct{} // closed once its cache has stopped
}

// address is an API server's address and the PEM that verifies it.
type address struct {
	server string
	ca     []byte
}

// NewRegistry returns a Registry; Start must run before it connects.
func NewRegistry(opts Options) (*Registry, error) {
	if opts.Local == nil {
		return nil, errors.New("clusters: Options needs the Local cluster")
	}
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return &Registry{
		opts:      opts,
		scheme:    scheme,
		conns:     map[types.NamespacedName]*conn{},
		failed:    map[types.NamespacedName]*nodes.NotConnectedError{},
		addresses: map[types.NamespacedName]address{},
		joins:     map[types.NamespacedName]address{},
	}, nil
}

// Start implements manager.Runnable: connections live as long as the
// manager, and all stop with it.
func (r *Registry) Start(ctx context.Context) error {
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	keys := make([]types.NamespacedName, 0, len(r.conns))
	for k := range r.conns {
		keys = append(keys, k)
	}
	r.mu.Unlock()
	for _, k := range keys {
		r.Disconnect(k)
	}
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the
// leader reconciles, so only the leader connects.
func (r *Registry) NeedLeaderElection() bool { return true }

// For implements nodes.Clusters.
func (r *Registry) For(_ context.Context, m *machinistv1.Machine) (nodes.Cluster, error) {
	if m.Spec.ClusterName == "" {
		return r.opts.Local, nil
	}
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.conns[key]; ok {
		return c.cluster, nil
	}
	if err, ok := r.failed[key]; ok {
		nc := *err
		a := r.joinAddress(key)
		nc.Server, nc.CAData = a.server, a.ca
		return nil, &nc
	}
	return nil, &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonClusterConnecting}
}

// Clusters returns the clusters connected now, by WorkloadCluster, and
// the manager's own under the zero key.
func (r *Registry) Clusters() map[types.NamespacedName]nodes.Cluster {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[types.NamespacedName]nodes.Cluster, len(r.conns)+1)
	out[types.NamespacedName{}] = r.opts.Local
	for key, c := range r.conns {
		out[key] = c.cluster
	}
	return out
}

// OnConnect implements nodes.Connections.
func (r *Registry) OnConnect(fn func(context.Context, types.NamespacedName, cache.Cache) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hooks = append(r.hooks, fn)
	for key, c := range r.conns {
		if err := fn(r.ctx, key, c.cache); err != nil {
			ctrllog.FromContext(r.ctx).Error(err, "watching a workload cluster", "cluster", key)
		}
	}
}

// Has reports whether the registry holds a connection to the cluster,
// whatever kubeconfig it was made from.
func (r *Registry) Has(key types.NamespacedName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.conns[key]
	return ok
}

// Config is the configuration the cluster's connection reaches it with
// (its kubeconfig's, with the registry's limits and timeout), or nil
// when there is none: for what needs clients of its own there, such as
// the join checks. A new connection gives a new Config. It is shared:
// copy it before changing it.
func (r *Registry) Config(key types.NamespacedName) *rest.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.conns[key]; ok {
		return c.config
	}
	return nil
}

// Connected reports whether the registry holds a working connection to
// the cluster made from this kubeconfig.
func (r *Registry) Connected(key types.NamespacedName, kubeconfig []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.conns[key]
	return ok && c.digest == sha256.Sum256(kubeconfig)
}

// Connect makes the connection to the cluster key reached by kubeconfig,
// replacing one made from another kubeconfig (a rotated Secret). It waits
// until the cluster answers and the cache has synced, up to the connect
// timeout. On failure the error is a *nodes.NotConnectedError, which For
// hands to the cluster's Machines until a connection succeeds.
func (r *Registry) Connect(ctx context.Context, key types.NamespacedName, kubeconfig []byte) error {
	if r.Connected(key, kubeconfig) {
		return nil
	}
	c, err := r.connect(ctx, key, kubeconfig)
	r.mu.Lock()
	if err != nil {
		nc, ok := nodes.NotConnected(err)
		if !ok {
			nc = &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonUnreachable, Err: err}
		}
		r.failed[key] = nc
		r.mu.Unlock()
		return nc
	}
	delete(r.failed, key)
	old, replaced := r.conns[key]
	r.conns[key] = c
	r.aim(c, r.joinAddress(key))
	hooks, parent := slices.Clone(r.hooks), r.ctx
	r.mu.Unlock()
	// Outside the lock: every Machine's reconcile asks For, and must not
	// wait while controllers add their watches or an old cache stops.
	if replaced {
		old.close()
	}
	for _, fn := range hooks {
		if err := fn(parent, key, c.cache); err != nil {
			// The connection serves reads and writes; a controller
			// that could not watch it still polls its Machines.
			ctrllog.FromContext(ctx).Error(err, "watching a workload cluster", "cluster", key)
		}
	}
	return nil
}

// Fail records why the cluster cannot be connected, when that is found
// before Connect (its Secret is missing), for its Machines to show.
func (r *Registry) Fail(key types.NamespacedName, reason string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.conns[key]; !ok {
		r.failed[key] = &nodes.NotConnectedError{Cluster: key, Reason: reason, Err: err}
	}
}

// SetJoinEndpoint sets the address, and the PEM that verifies it, that
// the cluster's new machines are given to join it, in place of its
// kubeconfig's: a WorkloadCluster's spec.joinEndpoint. A CA left empty is
// the kubeconfig's. Nil goes back to the kubeconfig's address. It applies
// at once, whether the cluster is connected or not, without reconnecting.
func (r *Registry) SetJoinEndpoint(key types.NamespacedName, e *machinistv1.JoinEndpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e == nil {
		delete(r.joins, key)
	} else {
		r.joins[key] = address{server: e.Server, ca: slices.Clone(e.CertificateAuthorityData)}
	}
	if c, ok := r.conns[key]; ok {
		r.aim(c, r.joinAddress(key))
	}
}

// joinAddress is the address a new machine of the cluster is given: its
// join endpoint, else its kubeconfig's. A join endpoint without a CA of
// its own waits for the kubeconfig's: until it has been read, there is
// no address to give. The caller holds r.mu.
func (r *Registry) joinAddress(key types.NamespacedName) address {
	a, read := r.addresses[key]
	j, ok := r.joins[key]
	switch {
	case !ok:
		return a
	case len(j.ca) > 0:
		return j
	case read:
		return address{server: j.server, ca: a.ca}
	}
	return address{}
}

// aim makes a the address c hands new machines, replacing c.cluster
// when it changes. The caller holds r.mu.
func (r *Registry) aim(c *conn, a address) {
	if c.cluster.Server == a.server && bytes.Equal(c.cluster.CAData, a.ca) {
		return
	}
	api := *c.cluster
	api.Server, api.CAData = a.server, a.ca
	c.cluster = &api
}

// Disconnect stops the cluster's connection and forgets it.
func (r *Registry) Disconnect(key types.NamespacedName) {
	r.mu.Lock()
	c, ok := r.conns[key]
	delete(r.conns, key)
	delete(r.failed, key)
	delete(r.addresses, key)
	delete(r.joins, key)
	r.mu.Unlock()
	if ok {
		c.close()
	}
}

// Probe is what the manager sees of a connected cluster now.
type Probe struct {
	// Server is the API server's address, Version what it reports.
	Server, Version string
	// Nodes counts the Nodes in the cache.
	Nodes int
}

// Probe asks a connected cluster its version and counts its cached Nodes.
func (r *Registry) Probe(ctx context.Context, key types.NamespacedName) (Probe, error) {
	r.mu.Lock()
	c, ok := r.conns[key]
	r.mu.Unlock()
	if !ok {
		return Probe{}, &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonClusterConnecting}
	}
	body, err := serverVersion(ctx, c.kube, probeTimeout)
	if err != nil {
		return Probe{}, &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonUnreachable, Err: withoutBody(err)}
	}
	var v version.Info
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.GitVersion == "" {
		// Not how much of it could be read: that would show the answer.
		return Probe{}, &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonUnreachable,
			Err: errors.New("its /version answered what is not a kube-apiserver's version")}
	}
	var list corev1.NodeList
	if err := c.cache.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return Probe{}, err
	}
	return Probe{Server: c.host, Version: v.GitVersion, Nodes: len(list.Items)}, nil
}

func (r *Registry) connect(ctx context.Context, key types.NamespacedName, kubeconfig []byte) (*conn, error) {
	log := ctrllog.FromContext(ctx).WithValues("cluster", key)
	r.mu.Lock()
	parent := r.ctx
	r.mu.Unlock()
	if parent == nil {
		return nil, &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonClusterConnecting, Err: errors.New("the manager has not started")}
	}
	cfg, err := RESTConfig(kubeconfig, r.opts.Trust)
	if err != nil {
		reason := machinistv1.ReasonKubeconfigInvalid
		if _, ok := errors.AsType[*RefusedError](err); ok {
			reason = machinistv1.ReasonKubeconfigRefused
		}
		return nil, &nodes.NotConnectedError{Cluster: key, Reason: reason, Err: err}
	}
	// A machine is handed the CA that verifies the cluster: only what the
	// kubeconfig holds inline, never a file of the manager's.
	caData := cfg.CAData
	r.mu.Lock()
	r.addresses[key] = address{server: cfg.Host, ca: caData}
	r.mu.Unlock()
	cfg.QPS, cfg.Burst = r.opts.QPS, r.opts.Burst
	if cfg.QPS <= 0 {
		cfg.QPS = DefaultQPS
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	cfg.Timeout = or(r.opts.RequestTimeout, DefaultRequestTimeout)
	cfg.UserAgent = "machinist-manager"
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonKubeconfigInvalid, Err: err}
	}
	connectTimeout := or(r.opts.ConnectTimeout, DefaultConnectTimeout)
	// One cheap question first: a cluster that does not answer, or
	// refuses these credentials, is said so at once instead of after a
	// cache's sync times out.
	if _, err := serverVersion(ctx, kube, connectTimeout); err != nil {
		return nil, &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonUnreachable, Err: withoutBody(err)}
	}
	store, err := cache.New(cfg, cache.Options{
		Scheme:                   r.scheme,
		DefaultTransform:         cache.TransformStripManagedFields(),
		DefaultWatchErrorHandler: r.opts.WatchError,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Node{}: {Transform: r.opts.TrimNode},
			// Only the kubelets' Leases: a cluster's other Leases
			// (leader elections) change every few seconds.
			&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{corev1.NamespaceNodeLease: {}}},
		},
	})
	if err != nil {
		return nil, &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonKubeconfigInvalid, Err: err}
	}
	cctx, stop := context.WithCancel(parent)
	c := &conn{digest: sha256.Sum256(kubeconfig), host: cfg.Host, cache: store, kube: kube, stop: stop, done: make(chan struct{})}
	c.config = cfg
	if err := index.RegisterNodes(cctx, store); err != nil {
		stop()
		return nil, err
	}
	go func() {
		defer close(c.done)
		if err := store.Start(cctx); err != nil {
			log.Error(err, "the cache of a workload cluster stopped")
		}
	}()
	// Both informers now, so that neither the first Lease read of a
	// reconcile nor the first drain waits for a sync.
	wctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	for _, o := range []client.Object{&corev1.Node{}, &coordinationv1.Lease{}} {
		if _, err := store.GetInformer(wctx, o); err != nil {
			c.close()
			return nil, &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonUnreachable, Err: withoutBody(err)}
		}
	}
	if !store.WaitForCacheSync(wctx) {
		c.close()
		return nil, &nodes.NotConnectedError{Cluster: key, Reason: machinistv1.ReasonUnreachable,
			Err: fmt.Errorf("its Nodes and Leases did not sync within %s", connectTimeout)}
	}
	cl, err := client.New(cfg, client.Options{Scheme: r.scheme, Cache: &client.CacheOptions{Reader: store}})
	if err != nil {
		c.close()
		return nil, err
	}
	c.cluster = &nodes.API{Client: cl, Kube: kube, Server: cfg.Host, CAData: caData}
	log.Info("connected to a workload cluster", "server", cfg.Host)
	return c, nil
}

func (c *conn) close() {
	c.stop()
	<-c.done
}

// serverVersion asks the version within timeout: discovery has no
// context of its own.
func serverVersion(ctx context.Context, kube kubernetes.Interface, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, err := kube.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
	return string(body), err
}

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
