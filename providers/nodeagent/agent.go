// Package nodeagent stands in for a kubelet: for one machine it registers a
// Node with the real kube-apiserver, keeps the Node's Lease renewed, and runs
// the pods bound to the Node as far as the API can tell (Running and Ready,
// and removed once deleted).
//
// Agents are cheap so that thousands can run as goroutines in one process.
// Each acts as its own Node alone, as a kubelet does: it watches only the
// pods bound to its Node, which is all the Node authorizer lets a node's
// own credentials (Join) watch, and writes nothing after registering
// except Lease renewals and its pods' changes, and its status again when
// the API shows it an older one (after a late renewal, or a Lease someone
// else wrote, as a restore of etcd does).
//
// An agent marks nothing about its own death: a dead machine shows first
// as a Lease whose renewTime plus leaseDurationSeconds has passed, and as
// Ready=Unknown only where a kube-controller-manager's node lifecycle
// controller runs, as in a real cluster.
package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Defaults for the fields of Config left zero; they are the kubelet's.
const (
	DefaultLeaseDurationSeconds int32 = 40
	DefaultRenewInterval              = 10 * time.Second
)

// LabelHostname is the one label the agent owns on its Node.
const LabelHostname = corev1.LabelHostname

// Reasons on the Node's Ready condition, as a kubelet reports them.
const (
	ReasonReady    = "KubeletReady"
	ReasonNotReady = "KubeletNotReady"
)

// DefaultCapacity returns what a Node offers when Config.Capacity does not
// say otherwise: a small machine, so schedulers have something to fit.
func DefaultCapacity() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("2"),
		corev1.ResourceMemory:           resource.MustParse("4Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("20Gi"),
	}
}

// Config describes one machine's kubelet.
type Config struct {
	// Client reaches the apiserver.
	Client kubernetes.Interface
	// NodeName is the Node to register; it must be unique in the cluster.
	NodeName string
	// ProviderID is written to the Node's spec.providerID.
	ProviderID string
	// Version is reported as status.nodeInfo.kubeletVersion.
	Version string
	// Capacity overrides DefaultCapacity resource by resource; allocatable
	// equals capacity.
	Capacity corev1.ResourceList
	// LeaseDurationSeconds is written to the Lease; zero means
	// DefaultLeaseDurationSeconds.
	LeaseDurationSeconds int32
	// RenewInterval is how often the Lease is renewed; zero means
	// DefaultRenewInterval.
	RenewInterval time.Duration
	// NeverReady registers the Node with Ready=False, like a kubelet whose
	// container runtime never comes up. It still renews its Lease.
	NeverReady bool
	// BootID is the boot's ID as the machine knows it from the moment it
	// boots, before it has joined (a kernel's
	// /proc/sys/kernel/random/boot_id): every Run reports it, so an agent
	// given one runs for one boot. Empty, each Run picks a new one.
	BootID string
	// KernelVersion and OSImage are reported in status.nodeInfo; empty,
	// the agent says it is a simulated machine.
	KernelVersion string
	OSImage       string
	// MachineID is reported as status.nodeInfo.machineID; empty means
	// the Node's name.
	MachineID string
}

// Agent is one machine's kubelet. Run it, cancel it (a crash or power-off),
// and Run it again (a boot); each Run has a new boot ID.
type Agent struct {
	cfg Config

	mu      sync.Mutex
	running bool
	bootID  string
}

// New returns an agent for cfg; nothing happens until Run.
func New(cfg Config) *Agent {
	if cfg.LeaseDurationSeconds <= 0 {
		cfg.LeaseDurationSeconds = DefaultLeaseDurationSeconds
	}
	if cfg.RenewInterval <= 0 {
		cfg.RenewInterval = DefaultRenewInterval
	}
	capacity := DefaultCapacity()
	for name, q := range cfg.Capacity {
		capacity[name] = q.DeepCopy()
	}
	cfg.Capacity = capacity
	if cfg.KernelVersion == "" {
		cfg.KernelVersion = "inmemory"
	}
	if cfg.MachineID == "" {
		cfg.MachineID = cfg.NodeName
	}
	if cfg.OSImage == "" {
		cfg.OSImage = "Machinist in-memory machine"
	}
	return &Agent{cfg: cfg}
}

// NodeName is the Node this agent registers.
func (a *Agent) NodeName() string { return a.cfg.NodeName }

// BootID is the boot ID of the current or most recent Run, empty before the
// first.
func (a *Agent) BootID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bootID
}

// Run boots the machine: it registers the Node (updating it if it already
// exists), creates or takes over the Lease, then renews the Lease and runs
// the Node's pods until ctx is cancelled. Cancelling ctx is a crash: Run
// returns only once every write of this boot has stopped and makes no
// farewell writes, so the Lease simply expires.
//
// Run returns nil when ctx is cancelled and an error only when the Node
// cannot be registered at all (for example an invalid name). An agent runs
// once at a time.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.running {
		a.mu.Unlock()
		return fmt.Errorf("nodeagent: agent for node %q is already running", a.cfg.NodeName)
	}
	a.running = true
	a.bootID = a.cfg.BootID
	if a.bootID == "" {
		a.bootID = string(uuid.NewUUID())
	}
	bootID := a.bootID
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.running = false
		a.mu.Unlock()
	}()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	log := ctrllog.FromContext(ctx).WithValues("node", a.cfg.NodeName, "bootID", bootID)

	node, err := a.registerWithRetry(ctx, log, bootID)
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return err
	}

	pods := newPods(a.cfg.Client, a.cfg.NodeName, nodeIP(a.cfg.NodeName))
	var podsDone sync.WaitGroup
	podsDone.Go(func() { pods.run(ctx) })
	a.heartbeat(ctx, log, node)
	// Waiting here is what makes cancellation a clean crash: no pod write of
	// this boot can land after Run has returned.
	podsDone.Wait()
	return nil
}

// registerWithRetry registers the Node, retrying what a kubelet retries (an
// unreachable or overloaded apiserver) until ctx ends.
func (a *Agent) registerWithRetry(ctx context.Context, log logr.Logger, bootID string) (*corev1.Node, error) {
	delay := 100 * time.Millisecond
	for {
		wctx, cancel := writeContext(ctx)
		node, err := a.register(wctx, bootID)
		cancel()
		if err == nil {
			return node, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if permanentAPIError(err) {
			return nil, fmt.Errorf("nodeagent: registering node %q: %w", a.cfg.NodeName, err)
		}
		log.Error(err, "Registering node failed; retrying", "after", delay)
		if !sleep(ctx, delay) {
			return nil, ctx.Err()
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func permanentAPIError(err error) bool {
	var mismatch providerIDMismatchError
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsForbidden(err) ||
		apierrors.IsUnauthorized(err) || errors.As(err, &mismatch)
}

type providerIDMismatchError struct{ node, have, want string }

func (e providerIDMismatchError) Error() string {
	return fmt.Sprintf("node %q already exists with providerID %q, not %q", e.node, e.have, e.want)
}

// register creates the Node with its status in one request (the apiserver
// keeps status on a Node create, as kubelets rely on). A Node that already
// exists is an earlier boot's: its labels, taints and unschedulable belong
// to others and are kept; only status and the hostname label are ours.
func (a *Agent) register(ctx context.Context, bootID string) (*corev1.Node, error) {
	nodes := a.cfg.Client.CoreV1().Nodes()
	now := metav1.Now()
	desired := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   a.cfg.NodeName,
			Labels: map[string]string{LabelHostname: a.cfg.NodeName},
		},
		Spec: corev1.NodeSpec{ProviderID: a.cfg.ProviderID},
	}
	a.setStatus(&desired.Status, bootID, now)
	created, err := nodes.Create(ctx, desired, metav1.CreateOptions{})
	if err == nil {
		if readyCondition(created) != nil {
			return created, nil
		}
		// Should a future apiserver drop status on create, write it the
		// ordinary way rather than leave the Node without conditions.
		a.setStatus(&created.Status, bootID, now)
		return nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, err
	}

	var node *corev1.Node
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := nodes.Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if current.Spec.ProviderID != "" && current.Spec.ProviderID != a.cfg.ProviderID {
			return providerIDMismatchError{a.cfg.NodeName, current.Spec.ProviderID, a.cfg.ProviderID}
		}
		if current.Labels[LabelHostname] != a.cfg.NodeName || current.Spec.ProviderID == "" {
			if current.Labels == nil {
				current.Labels = map[string]string{}
			}
			current.Labels[LabelHostname] = a.cfg.NodeName
			current.Spec.ProviderID = a.cfg.ProviderID
			if current, err = nodes.Update(ctx, current, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		a.setStatus(&current.Status, bootID, now)
		// A patch of the status alone, as a kubelet sends: a whole Node
		// sent back would carry the spec as this Get saw it, and were its
		// taints changed meanwhile (a cordon), NodeRestriction would
		// refuse a node that seems to modify its own taints.
		patch, err := json.Marshal(map[string]any{"status": current.Status})
		if err != nil {
			return err
		}
		node, err = nodes.PatchStatus(ctx, a.cfg.NodeName, patch)
		return err
	})
	return node, err
}

// setStatus writes the fields of a Node's status that a kubelet owns and
// leaves the rest, such as conditions other components added.
func (a *Agent) setStatus(s *corev1.NodeStatus, bootID string, now metav1.Time) {
	s.Capacity = a.cfg.Capacity.DeepCopy()
	s.Allocatable = a.cfg.Capacity.DeepCopy()
	s.Phase = ""
	s.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: nodeIP(a.cfg.NodeName)},
		{Type: corev1.NodeHostName, Address: a.cfg.NodeName},
	}
	s.DaemonEndpoints = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}}
	s.NodeInfo = corev1.NodeSystemInfo{
		MachineID:               a.cfg.MachineID,
		SystemUUID:              a.cfg.NodeName,
		BootID:                  bootID,
		KernelVersion:           a.cfg.KernelVersion,
		OSImage:                 a.cfg.OSImage,
		ContainerRuntimeVersion: "inmemory://1.0.0",
		KubeletVersion:          a.cfg.Version,
		OperatingSystem:         "linux",
		Architecture:            "amd64",
	}

	ready := corev1.NodeCondition{
		Type:               corev1.NodeReady,
		Status:             corev1.ConditionTrue,
		Reason:             ReasonReady,
		Message:            "kubelet is posting ready status",
		LastHeartbeatTime:  now,
		LastTransitionTime: now,
	}
	if a.cfg.NeverReady {
		ready.Status = corev1.ConditionFalse
		ready.Reason = ReasonNotReady
		ready.Message = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady (fault injected)"
	}
	conditions := []corev1.NodeCondition{
		pressure(corev1.NodeMemoryPressure, "KubeletHasSufficientMemory", "kubelet has sufficient memory available", now),
		pressure(corev1.NodeDiskPressure, "KubeletHasNoDiskPressure", "kubelet has no disk pressure", now),
		pressure(corev1.NodePIDPressure, "KubeletHasSufficientPID", "kubelet has sufficient PID available", now),
		ready,
	}
	for _, c := range conditions {
		setNodeCondition(s, c)
	}
}

func pressure(t corev1.NodeConditionType, reason, message string, now metav1.Time) corev1.NodeCondition {
	return corev1.NodeCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason, Message: message,
		LastHeartbeatTime: now, LastTransitionTime: now}
}

// setNodeCondition replaces c's type in s, keeping the transition time when
// the status did not change so the Node's history stays truthful.
func setNodeCondition(s *corev1.NodeStatus, c corev1.NodeCondition) {
	for i := range s.Conditions {
		if s.Conditions[i].Type != c.Type {
			continue
		}
		if s.Conditions[i].Status == c.Status {
			c.LastTransitionTime = s.Conditions[i].LastTransitionTime
		}
		s.Conditions[i] = c
		return
	}
	s.Conditions = append(s.Conditions, c)
}

func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// heartbeat keeps the Lease fresh until ctx ends. It writes the Lease and
// nothing else: the Node's status does not change while the machine runs.
func (a *Agent) heartbeat(ctx context.Context, log logr.Logger, node *corev1.Node) {
	leases := a.cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	var lease *coordinationv1.Lease
	delay := 100 * time.Millisecond
	for lease == nil {
		if ctx.Err() != nil {
			return
		}
		wctx, cancel := writeContext(ctx)
		created, err := a.ensureLease(wctx, node)
		cancel()
		if err == nil {
			lease = created
		} else {
			if ctx.Err() != nil {
				return
			}
			log.Error(err, "Creating the node lease failed; retrying", "after", delay)
			if !sleep(ctx, delay) {
				return
			}
			delay = min(2*delay, a.cfg.RenewInterval)
		}
	}

	ticker := time.NewTicker(a.cfg.RenewInterval)
	defer ticker.Stop()
	// Until then, after a renewal came too late, each renewal also reads
	// the Node and posts its status again if it is not Ready=True: the
	// node lifecycle controller, catching up on its own after an outage,
	// may mark it Unknown after the first post, as a kubelet's periodic
	// status check would notice.
	var recheckUntil time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		// Select picks at random when both are ready; a dead kubelet must
		// not get one last renewal in.
		if ctx.Err() != nil {
			return
		}
		next := lease.DeepCopy()
		next.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		wctx, cancel := writeContext(ctx)
		updated, err := leases.Update(wctx, next, metav1.UpdateOptions{})
		cancel()
		if err == nil {
			late := expired(lease, next.Spec.RenewTime.Time)
			if late {
				recheckUntil = time.Now().Add(3 * time.Duration(ptr.Deref(lease.Spec.LeaseDurationSeconds, 40)) * time.Second)
			}
			if late || time.Now().Before(recheckUntil) {
				// Renewed too late: the Node may have been marked
				// Ready=Unknown meanwhile, and the status is posted only at
				// boot. Post it again, as a kubelet whose status differs
				// from the apiserver's does.
				wctx, cancel := writeContext(ctx)
				if err := a.repost(wctx, node.Status.NodeInfo.BootID, late); err != nil {
					log.Error(err, "Posting the node status after a late lease renewal failed")
				}
				cancel()
			}
			lease = updated
			continue
		}
		if ctx.Err() != nil {
			return
		}
		// Someone else wrote the Lease (or deleted it): take it back over on
		// the next tick, which is what a kubelet does too.
		log.Error(err, "Renewing the node lease failed")
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			wctx, cancel := writeContext(ctx)
			if fresh, err := a.ensureLease(wctx, node); err == nil {
				lease = fresh
			}
			// So may the Node have been: an etcd restored from an older
			// snapshot brings back both as they were, with an older boot
			// ID. A kubelet's periodic status check posts its status
			// again; this one checks when its Lease shows it.
			if err := a.repost(wctx, node.Status.NodeInfo.BootID, false); err != nil {
				log.Error(err, "Checking the node status after the lease was written by another failed")
			}
			cancel()
		}
	}
}

// repost posts the Node's status again: always when force, else only if
// the Node does not show Ready=True and this boot. A Node that is gone is
// not registered again (a kubelet registers once per start).
func (a *Agent) repost(ctx context.Context, bootID string, force bool) error {
	if !force {
		node, err := a.cfg.Client.CoreV1().Nodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := readyCondition(node); c != nil && c.Status == corev1.ConditionTrue && node.Status.NodeInfo.BootID == bootID {
			return nil
		}
	}
	_, err := a.register(ctx, bootID)
	return err
}

// expired reports whether lease had run out by now.
func expired(lease *coordinationv1.Lease, now time.Time) bool {
	if lease.Spec.RenewTime == nil || lease.Spec.LeaseDurationSeconds == nil {
		return false
	}
	return now.After(lease.Spec.RenewTime.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second))
}

// ensureLease creates the Node's Lease, or takes over the one an earlier
// boot left, owned by the Node as a kubelet's is.
func (a *Agent) ensureLease(ctx context.Context, node *corev1.Node) (*coordinationv1.Lease, error) {
	leases := a.cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	fill := func(l *coordinationv1.Lease) {
		l.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "v1",
			Kind:       "Node",
			Name:       node.Name,
			UID:        node.UID,
		}}
		holder := a.cfg.NodeName
		duration := a.cfg.LeaseDurationSeconds
		l.Spec.HolderIdentity = &holder
		l.Spec.LeaseDurationSeconds = &duration
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: a.cfg.NodeName, Namespace: corev1.NamespaceNodeLease}}
	fill(lease)
	created, err := leases.Create(ctx, lease, metav1.CreateOptions{})
	if err == nil {
		return created, nil
	}
	// client-go answers an error with an empty object, not nil: a caller
	// that kept it would renew a Lease without a name forever.
	if !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	existing, err := leases.Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	fill(existing)
	updated, err := leases.Update(ctx, existing, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	return updated, nil
}

// requestTimeout bounds one write, and so how long a crash can wait for a
// write already sent.
const requestTimeout = 15 * time.Second

// writeContext is for a write about to be sent while ctx is live. It is not
// cancelled with ctx: a request cut off on the client may still land on the
// server after Run has returned, so a crash instead waits for writes in
// flight and sends no new ones.
func writeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
}

// sleep waits for d and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// nodeIP gives every Node a stable address in 10.0.0.0/10 so that pods get a
// hostIP; nothing routes to it.
func nodeIP(nodeName string) string {
	h := hash32(nodeName)
	return fmt.Sprintf("10.%d.%d.%d", (h>>16)&63, (h>>8)&255, 1+(h&255)%254)
}

// podIP gives every pod a stable address in 10.64.0.0/10, apart from nodes.
func podIP(uid string) string {
	h := hash32(uid)
	return fmt.Sprintf("10.%d.%d.%d", 64+(h>>16)&63, (h>>8)&255, 1+(h&255)%254)
}

func hash32(s string) uint32 {
	f := fnv.New32a()
	_, _ = f.Write([]byte(s))
	return f.Sum32()
}
