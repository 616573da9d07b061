package guest

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PodShutdownGrace bounds the termination grace a real node's pods get
// when it is shut down in order (a soft reboot, a delete), as the
// kubelet's shutdownGracePeriod does: each pod gets its own
// terminationGracePeriodSeconds up to this. It leaves the rest of the
// provider's stop timeout (30 s) to the daemons and the disk.
const PodShutdownGrace = 20 * time.Second

// gracePeriodAnnotation is the annotation the kubelet gives each
// container: its pod's terminationGracePeriodSeconds.
const gracePeriodAnnotation = "io.kubernetes.pod.terminationGracePeriod"

// stopPods stops, once the kubelet has stopped, every container
// containerd runs for it through the CRI, as the kubelet's graceful node
// shutdown would: each gets its stop signal (SIGTERM unless its image
// says otherwise), its pod's grace up to PodShutdownGrace, then SIGKILL,
// all at once; then the pods' sandboxes are stopped. The kubelet is
// stopped first, so that it starts none of them again; it finds them
// exited at its next start, with the termination messages they wrote,
// and runs the pods again as their restart policy says. preStop hooks are
// the kubelet's to run and are not run.
func stopPods(out io.Writer, socket string) {
	ctx, cancel := context.WithTimeout(context.Background(), PodShutdownGrace+5*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(out, "machinist: init: stopping the pods:", err)
		return
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	running, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	if err != nil {
		fmt.Fprintln(out, "machinist: init: stopping the pods: listing their containers:", err)
		return
	}
	var wg sync.WaitGroup
	for _, c := range running.GetContainers() {
		grace := containerGrace(c.GetAnnotations())
		fmt.Fprintf(out, "machinist: init: stopping container %s of pod %s/%s, with %s of grace\n",
			c.GetMetadata().GetName(), c.GetLabels()["io.kubernetes.pod.namespace"], c.GetLabels()["io.kubernetes.pod.name"], grace)
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: int64(grace / time.Second)}); err != nil {
				fmt.Fprintf(out, "machinist: init: stopping container %s: %v\n", id, err)
			}
		}(c.GetId())
	}
	wg.Wait()
	sandboxes, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil {
		fmt.Fprintln(out, "machinist: init: stopping the pods: listing their sandboxes:", err)
		return
	}
	for _, s := range sandboxes.GetItems() {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.GetId()}); err != nil {
			fmt.Fprintf(out, "machinist: init: stopping pod sandbox %s: %v\n", s.GetId(), err)
		}
	}
}

// containerGrace is the grace of a container with annotations: its pod's
// terminationGracePeriodSeconds, at most PodShutdownGrace; that when it
// is missing or unreadable.
func containerGrace(annotations map[string]string) time.Duration {
	s, err := strconv.ParseInt(annotations[gracePeriodAnnotation], 10, 64)
	if err != nil || s < 0 || time.Duration(s)*time.Second > PodShutdownGrace {
		return PodShutdownGrace
	}
	return time.Duration(s) * time.Second
}
