package guest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/clientcmd"
)

// Kubelet is the first init argument of a real node's guest: the words
// after it are the kubelet's flags. Such a guest runs containerd, then
// Kubernetes' own kubelet, instead of the node agent.
const Kubelet = "kubelet"

// The files a real node's initramfs holds besides the machinist binary.
const (
	// BinDir holds kubelet, containerd, containerd-shim-runc-v2, runc and
	// ctr.
	BinDir = "/usr/bin"
	// CNIBinDir holds the CNI plugins and CNIConfDir their network.
	CNIBinDir  = "/opt/cni/bin"
	CNIConfDir = "/etc/cni/net.d"
	// ContainerdConfig and KubeletConfig are the two daemons' files.
	ContainerdConfig = "/etc/containerd/config.toml"
	KubeletConfig    = "/etc/kubernetes/kubelet.yaml"
	// ImageDir holds OCI image archives imported into containerd at each
	// boot, so that no image is ever pulled.
	ImageDir = "/usr/share/machinist/images"
	// ContainerdSocket is where the kubelet reaches containerd.
	ContainerdSocket = "/run/containerd/containerd.sock"
	// KubeletClientCA is the CA the kubelet trusts for client
	// certificates, kube-apiserver's among them: its cluster's, from its
	// kubeconfig, as a kubeadm node's kubelet trusts its cluster's CA.
	KubeletClientCA = "/etc/kubernetes/pki/ca.crt"
	// KubeletKubeconfig is the kubelet's own, written by its TLS
	// bootstrap and kept on the disk.
	KubeletKubeconfig = "/var/lib/kubelet/kubeconfig"
)

// nodeDirs are kept on the machine's disk, so that a reboot keeps the
// kubelet's credentials, containerd's images and the containers' logs
// (kubectl logs --previous) and a repair, which gives a fresh disk, loses
// them.
var nodeDirs = []string{"/var/lib/kubelet", "/var/lib/containerd", "/var/log"}

// runNode is run's part for a real node: it mounts cgroup v2, keeps the
// daemons' state on the disk, starts containerd, imports the images and
// runs the kubelet (first for its credentials alone on a disk without
// them: joinAfresh), restarting each as a service manager would, until
// stop; then it stops the kubelet, its pods with their grace (stopPods),
// then containerd.
func runNode(out io.Writer, kubeletArgs []string, stop <-chan os.Signal) error {
	if err := os.MkdirAll("/sys/fs/cgroup", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mounting cgroup v2: %w", err)
	}
	for _, d := range nodeDirs {
		kept := filepath.Join(StateDir, filepath.Base(d))
		if err := os.MkdirAll(kept, 0o700); err != nil {
			return err
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		if err := unix.Mount(kept, d, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("keeping %s on the disk: %w", d, err)
		}
		// Detached, with the containers' mounts beneath it, so that
		// the disk can be unmounted once everything is stopped.
		defer func(d string) { _ = unix.Unmount(d, unix.MNT_DETACH) }(d)
	}
	os.Setenv("PATH", BinDir+":/usr/sbin:/sbin:/bin")
	if _, err := os.Stat(BootstrapKubeconfig); err == nil {
		if err := relayLoopback(out, BootstrapKubeconfig); err != nil {
			return err
		}
	}
	if err := writeClientCA(out); err != nil {
		return err
	}
	exits := make(chan *service, 2)
	containerd := &service{name: "containerd", argv: []string{filepath.Join(BinDir, "containerd"), "--config", ContainerdConfig}}
	if err := containerd.start(out, exits); err != nil {
		return err
	}
	kubelet := &service{name: "the kubelet", argv: append([]string{filepath.Join(BinDir, "kubelet")}, kubeletArgs...),
		then: func(out io.Writer) { stopPods(out, ContainerdSocket) }}
	// Each step only while the ones before went well and no stop came; a
	// stop ends init in order, as supervise's does.
	stopped, err := awaitServing(containerd, ContainerdSocket, exits, stop)
	if err == nil && !stopped {
		err = importImages(out)
	}
	if err == nil && !stopped {
		stopped, err = joinAfresh(out, kubeletArgs, stop)
	}
	if err == nil && !stopped {
		err = kubelet.start(out, exits)
	}
	if err != nil || stopped {
		containerd.stop(out)
		return err
	}
	return supervise(out, stop, exits, containerd, kubelet)
}

// importImages imports every archive of ImageDir into containerd's
// Kubernetes namespace.
func importImages(out io.Writer) error {
	archives, _ := filepath.Glob(filepath.Join(ImageDir, "*.tar"))
	for _, a := range archives {
		cmd := exec.Command(filepath.Join(BinDir, "ctr"), "--address", ContainerdSocket, "-n", "k8s.io", "images", "import", "--local", a)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("importing %s: %w", a, err)
		}
	}
	return nil
}

// writeClientCA writes KubeletClientCA: clientCA of the kubelet's
// kubeconfig and its join data.
func writeClientCA(out io.Writer) error {
	ca, err := clientCA(out, KubeletKubeconfig, BootstrapKubeconfig)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(KubeletClientCA), 0o755); err != nil {
		return err
	}
	return os.WriteFile(KubeletClientCA, ca, 0o644)
}

// clientCA is the cluster CA of the kubelet's kubeconfig once it has
// joined, else of its join data. A kubeconfig that names none (emptied
// by a power cut before it reached the disk: the kubelet then bootstraps
// again) counts as none, and says so on out.
func clientCA(out io.Writer, kubeconfig, join string) ([]byte, error) {
	ca, err := caOf(kubeconfig)
	if err == nil {
		return ca, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(out, "machinist: init: %v; taking the join data's\n", err)
	}
	return caOf(join)
}

// caOf is the cluster CA the kubeconfig at path names.
func caOf(path string) ([]byte, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("the kubelet's cluster CA: %w", err)
	}
	for _, c := range cfg.Clusters {
		ca := c.CertificateAuthorityData
		if len(ca) == 0 && c.CertificateAuthority != "" {
			if ca, err = os.ReadFile(c.CertificateAuthority); err != nil {
				return nil, fmt.Errorf("the kubelet's cluster CA: %w", err)
			}
		}
		if len(ca) != 0 {
			return ca, nil
		}
	}
	return nil, fmt.Errorf("the kubelet's cluster CA: %s names none", path)
}

// isKubelet reports whether init's arguments make a real node.
func isKubelet(args []string) bool { return len(args) > 0 && args[0] == Kubelet }

// relayLoopback lets the kubelet reach a kube-apiserver on the host's
// loopback by the name its certificate was issued for. The provider's
// join data names the user-mode net's gateway and keeps that name as the
// kubeconfig's tls-server-name; the kubelet drops tls-server-name from the
// kubeconfig it writes after its TLS bootstrap, so the join data is
// rewritten to the name itself, and the guest's loopback address of it is
// relayed to the gateway.
func relayLoopback(out io.Writer, path string) error {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return fmt.Errorf("the join data: %w", err)
	}
	var port string
	for _, c := range cfg.Clusters {
		u, err := url.Parse(c.Server)
		if err != nil || u.Hostname() != Gateway || c.TLSServerName == "" {
			continue
		}
		ip := net.ParseIP(c.TLSServerName)
		if c.TLSServerName != "localhost" && (ip == nil || !ip.IsLoopback()) {
			continue
		}
		port = u.Port()
		u.Host = net.JoinHostPort(c.TLSServerName, port)
		c.Server, c.TLSServerName = u.String(), ""
	}
	if port == "" {
		return nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", port))
	if err != nil {
		return fmt.Errorf("relaying kube-apiserver: %w", err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				fmt.Fprintln(out, "machinist: init: relaying kube-apiserver:", err)
				return
			}
			go relay(c, net.JoinHostPort(Gateway, port))
		}
	}()
	return clientcmd.WriteToFile(*cfg, path)
}

// relay copies between c and a connection to addr until either ends.
func relay(c net.Conn, addr string) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}
