package nodeagent

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// DefaultPodWorkers is how many pods a hub works on at once when NewPods is
// given no number.
const DefaultPodWorkers = 8

const nodeNameIndex = "spec.nodeName"

// Pods is the pod side of many agents: one watch of every bound pod, whose
// events it hands to the agent running that pod's Node. Create one per
// process with NewPods, Run it, and give it to every agent's Config.
type Pods struct {
	client   kubernetes.Interface
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	workers  int

	mu     sync.RWMutex
	agents map[string]*podRunner
}

// podRunner is one boot of one agent as the hub sees it. Work for it is
// counted so that the agent can wait for the last write of a boot.
type podRunner struct {
	ctx      context.Context
	hostIP   string
	inflight sync.WaitGroup
}

// NewPods returns a hub that watches every pod bound to a node through
// client and works on at most workers pods at once (DefaultPodWorkers when
// workers is not positive). It does nothing until Run.
func NewPods(client kubernetes.Interface, workers int) *Pods {
	return newPods(client, workers, "")
}

// newPods watches the pods of one node, or of every node when nodeName is
// empty.
func newPods(client kubernetes.Interface, workers int, nodeName string) *Pods {
	if workers <= 0 {
		workers = DefaultPodWorkers
	}
	selector := fields.OneTermNotEqualSelector("spec.nodeName", "").String()
	if nodeName != "" {
		selector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
	}
	lw := cache.NewFilteredListWatchFromClient(client.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.FieldSelector = selector })
	informer := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{
		nodeNameIndex: func(obj any) ([]string, error) {
			return []string{obj.(*corev1.Pod).Spec.NodeName}, nil
		},
	})
	// Thousands of Nodes mean many pods; managed fields are most of a pod's
	// bytes and are never read here. Updates sent without them keep the
	// server's copy.
	_ = informer.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return obj, nil
	})
	p := &Pods{
		client:   client,
		informer: informer,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodeagent-pods"}),
		workers: workers,
		agents:  map[string]*podRunner{},
	}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			p.queue.Add(key)
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})
	return p
}

// Run watches pods and works on them until ctx is cancelled. Run it once.
func (p *Pods) Run(ctx context.Context) error {
	defer p.queue.ShutDown()
	var wg sync.WaitGroup
	wg.Go(func() { p.informer.Run(ctx.Done()) })
	for range p.workers {
		wg.Go(func() {
			for p.work(ctx) {
			}
		})
	}
	<-ctx.Done()
	p.queue.ShutDown()
	wg.Wait()
	return nil
}

// register makes the hub act for nodeName's pods with ctx until the
// returned function is called; that function returns once no more work for
// this registration is under way.
func (p *Pods) register(ctx context.Context, nodeName, hostIP string) (unregister func(), err error) {
	r := &podRunner{ctx: ctx, hostIP: hostIP}
	p.mu.Lock()
	if _, ok := p.agents[nodeName]; ok {
		p.mu.Unlock()
		return nil, fmt.Errorf("nodeagent: another agent is already running node %q", nodeName)
	}
	p.agents[nodeName] = r
	p.mu.Unlock()

	// Events for this node that arrived before registering were dropped;
	// the cache already holds their result, so catch up from it.
	objs, _ := p.informer.GetIndexer().ByIndex(nodeNameIndex, nodeName)
	for _, obj := range objs {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			p.queue.Add(key)
		}
	}
	return func() {
		p.mu.Lock()
		delete(p.agents, nodeName)
		p.mu.Unlock()
		r.inflight.Wait()
	}, nil
}

// acquire returns the running agent of nodeName with one piece of work
// counted, or nil.
func (p *Pods) acquire(nodeName string) *podRunner {
	p.mu.RLock()
	defer p.mu.RUnlock()
	r := p.agents[nodeName]
	if r != nil {
		r.inflight.Add(1)
	}
	return r
}

func (p *Pods) work(ctx context.Context) bool {
	key, shutdown := p.queue.Get()
	if shutdown {
		return false
	}
	defer p.queue.Done(key)
	err := p.sync(key)
	switch {
	case err == nil:
		p.queue.Forget(key)
	case ctx.Err() != nil:
	default:
		ctrllog.FromContext(ctx).V(1).Info("Pod work failed; retrying", "pod", key, "error", err.Error())
		p.queue.AddRateLimited(key)
	}
	return true
}

// sync does what a kubelet would for the pod named key: finish its deletion
// once it is being deleted, or report it running.
func (p *Pods) sync(key string) error {
	obj, exists, err := p.informer.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*corev1.Pod)
	r := p.acquire(pod.Spec.NodeName)
	if r == nil {
		return nil // no agent runs that node: its pods stand still
	}
	defer r.inflight.Done()
	if r.ctx.Err() != nil {
		return nil
	}

	wctx, cancel := writeContext(r.ctx)
	defer cancel()
	pods := p.client.CoreV1().Pods(pod.Namespace)
	if pod.DeletionTimestamp != nil {
		// The containers "stopped" at once; a kubelet then removes the pod
		// for good with a zero grace period, guarded by UID so a new pod of
		// the same name is never hit.
		err := pods.Delete(wctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64(0)),
			Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || running(pod) {
		return nil
	}
	next := pod.DeepCopy()
	setRunning(next, r.hostIP, metav1.Now())
	_, err = pods.UpdateStatus(wctx, next, metav1.UpdateOptions{})
	return err
}

// running reports whether pod already shows what setRunning writes, so that
// a pod is written once, not at every event.
func running(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// setRunning makes pod's status what a kubelet reports once every container
// has started and passed its probes.
func setRunning(pod *corev1.Pod, hostIP string, now metav1.Time) {
	s := &pod.Status
	s.Phase = corev1.PodRunning
	s.HostIP = hostIP
	s.HostIPs = []corev1.HostIP{{IP: hostIP}}
	if s.PodIP == "" {
		ip := podIP(string(pod.UID))
		if pod.Spec.HostNetwork {
			ip = hostIP
		}
		s.PodIP = ip
		s.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	if s.StartTime == nil {
		s.StartTime = &now
	}
	for _, t := range []corev1.PodConditionType{
		corev1.PodReadyToStartContainers, corev1.PodScheduled, corev1.PodInitialized,
		corev1.ContainersReady, corev1.PodReady,
	} {
		setPodCondition(s, t, now)
	}

	started := true
	containerID := func(name string) string { return fmt.Sprintf("inmemory://%s-%s", pod.UID, name) }
	runningState := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
	s.InitContainerStatuses = nil
	for _, c := range pod.Spec.InitContainers {
		st := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "inmemory://" + c.Image,
			ContainerID: containerID(c.Name), Ready: true, Started: &started, State: runningState}
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			// An ordinary init container ran to completion before the rest.
			st.Started = new(false)
			st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now, ContainerID: st.ContainerID}}
		}
		s.InitContainerStatuses = append(s.InitContainerStatuses, st)
	}
	s.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		s.ContainerStatuses = append(s.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "inmemory://" + c.Image, ContainerID: containerID(c.Name),
			Ready: true, Started: &started, State: runningState,
		})
	}
}

func setPodCondition(s *corev1.PodStatus, t corev1.PodConditionType, now metav1.Time) {
	for i := range s.Conditions {
		if s.Conditions[i].Type == t {
			if s.Conditions[i].Status != corev1.ConditionTrue {
				s.Conditions[i].Status = corev1.ConditionTrue
				s.Conditions[i].Reason = ""
				s.Conditions[i].Message = ""
				s.Conditions[i].LastTransitionTime = now
			}
			return
		}
	}
	s.Conditions = append(s.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
}

// HasSynced reports whether the hub has listed every bound pod once, after
// which no existing pod is overlooked.
func (p *Pods) HasSynced() bool { return p.informer.HasSynced() }
