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

// pods is the pod side of one agent: it watches the pods bound to its Node
// alone, by the field selector a kubelet uses, which is all the Node
// authorizer lets a node list or watch.
type pods struct {
	client   kubernetes.Interface
	hostIP   string
	informer cache.SharedInformer
	queue    workqueue.TypedRateLimitingInterface[string]
}

// newPods returns the pod side of node nodeName, whose pods are given
// hostIP. It does nothing until run.
func newPods(client kubernetes.Interface, nodeName, hostIP string) *pods {
	selector := fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
	lw := cache.NewFilteredListWatchFromClient(client.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.FieldSelector = selector })
	informer := cache.NewSharedInformer(lw, &corev1.Pod{}, 0)
	// Thousands of agents in one process each cache their pods; managed
	// fields are most of a pod's bytes and are never read here. Updates
	// sent without them keep the server's copy.
	_ = informer.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return obj, nil
	})
	p := &pods{
		client:   client,
		hostIP:   hostIP,
		informer: informer,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodeagent-pods"}),
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

// run watches the pods and works on them until ctx is cancelled. It
// returns once no write is under way, and sync sends none after ctx ends,
// so that no pod write of a boot lands after the boot has crashed. It does
// not wait for the informer, which only reads: while its API server is
// down, client-go's watch-list backs off for up to 30 s without heeding
// the stop, and a crash must not take that long.
func (p *pods) run(ctx context.Context) {
	go p.informer.Run(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() {
		for p.work(ctx) {
		}
	})
	<-ctx.Done()
	p.queue.ShutDown()
	wg.Wait()
}

func (p *pods) work(ctx context.Context) bool {
	key, shutdown := p.queue.Get()
	if shutdown {
		return false
	}
	defer p.queue.Done(key)
	err := p.sync(ctx, key)
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
func (p *pods) sync(ctx context.Context, key string) error {
	obj, exists, err := p.informer.GetStore().GetByKey(key)
	if err != nil || !exists || ctx.Err() != nil {
		return err
	}
	pod := obj.(*corev1.Pod)

	wctx, cancel := writeContext(ctx)
	defer cancel()
	client := p.client.CoreV1().Pods(pod.Namespace)
	if pod.DeletionTimestamp != nil {
		// The containers "stopped" at once; a kubelet then removes the pod
		// for good with a zero grace period, guarded by UID so a new pod of
		// the same name is never hit.
		err := client.Delete(wctx, pod.Name, metav1.DeleteOptions{
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
	setRunning(next, p.hostIP, metav1.Now())
	_, err = client.UpdateStatus(wctx, next, metav1.UpdateOptions{})
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
