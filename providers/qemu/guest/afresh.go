package guest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/machinist-dev/machinist/providers/nodeagent"
)

// joinAfresh is a real node's first join from a disk without the
// kubelet's credentials: a new machine's, or one a repair wiped. The
// kubelet registers into a Node it finds under its name, keeping what
// others put on the old machine's (taints, labels, its uninitialized
// taint long lifted), where the provider's contract wants the machine to
// register afresh. So the kubelet first runs with --register-node=false
// until its own TLS bootstrap has given it a certificate; it is stopped
// with any pod it started, and the old Node and Lease are deleted with
// that certificate (nodeagent.Forget, as the node agent does), before
// init runs the kubelet for good. A kubelet that ends before it has its
// credentials leaves the join to the kubelet init runs next.
//
// It reports whether stop came meanwhile: init is then to end.
func joinAfresh(out io.Writer, kubeletArgs []string, stop <-chan os.Signal) (stopped bool, err error) {
	if _, err := os.Stat(KubeletKubeconfig); err == nil {
		return false, nil
	}
	nodeName, providerID := flagValue(kubeletArgs, "--hostname-override"), flagValue(kubeletArgs, "--provider-id")
	if nodeName == "" {
		return false, nil
	}
	exits := make(chan *service, 1)
	first := &service{
		name: "the kubelet, until it has its credentials",
		argv: append(append([]string{filepath.Join(BinDir, "kubelet")}, kubeletArgs...), "--register-node=false"),
		then: func(out io.Writer) { stopPods(out, ContainerdSocket) },
	}
	if err := first.start(out, exits); err != nil {
		return false, err
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var cfg *rest.Config
	for cfg == nil {
		select {
		case <-stop:
			first.stop(out)
			return true, nil
		case dead := <-exits:
			fmt.Fprintf(out, "machinist: init: %s exited (%v)\n", dead.name, dead.err)
			dead.stopped(out)
			return false, nil
		case <-tick.C:
			cfg = kubeletCredentials()
		}
	}
	first.stop(out)
	// The kubelet writes its kubeconfig and certificate without a sync,
	// and ext4 writes them out up to 30 s later: a power cut before that
	// (a hard reboot, a kill -9 of QEMU) would leave the node a disk with
	// an empty kubeconfig. They are synced before the node is used.
	unix.Sync()

	ctx, cancel := context.WithCancel(ctrllog.IntoContext(context.Background(), zap.New(zap.WriteTo(out))))
	defer cancel()
	forgotten, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-stop:
			cancel()
		case <-forgotten:
		}
	}()
	err = nodeagent.Forget(ctx, cfg, nodeName, providerID)
	close(forgotten)
	<-watched
	if ctx.Err() != nil {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	fmt.Fprintf(out, "machinist: init: node %s registers afresh\n", nodeName)
	return false, nil
}

// kubeletCredentials is the kubelet's own kubeconfig once its TLS
// bootstrap has written it and the certificate it names, else nil.
func kubeletCredentials() *rest.Config {
	cfg, err := clientcmd.LoadFromFile(KubeletKubeconfig)
	if err != nil {
		return nil
	}
	for _, a := range cfg.AuthInfos {
		if a.ClientCertificate == "" {
			continue
		}
		if st, err := os.Stat(a.ClientCertificate); err != nil || st.Size() == 0 {
			return nil
		}
	}
	rc, err := clientcmd.NewDefaultClientConfig(*cfg, nil).ClientConfig()
	if err != nil {
		return nil
	}
	return rc
}

// flagValue is the value of the last --name=value among args, or "".
func flagValue(args []string, name string) string {
	v := ""
	for _, a := range args {
		if rest, ok := strings.CutPrefix(a, name+"="); ok {
			v = rest
		}
	}
	return v
}
