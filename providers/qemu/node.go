package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/machinist-dev/machinist/internal/freeport"
	"github.com/machinist-dev/machinist/providers/qemu/guest"
)

// nodeModules are the modules a real node loads besides the virtual
// hardware's: overlayfs for containerd's snapshots, and the bridge and
// veth pairs of the pods' network.
var nodeModules = []string{"overlay", "bridge", "veth"}

// nodeBinaries are the files of NodeFiles.Bin, and cniPlugins of
// NodeFiles.CNIBin, that a real node's initramfs holds.
var (
	nodeBinaries = []string{"kubelet", "containerd", "containerd-shim-runc-v2", "runc", "ctr"}
	cniPlugins   = []string{"bridge", "host-local", "loopback", "portmap"}
)

// SandboxImage is the pod sandbox (pause) image every real node imports
// at boot and containerd is told to use, so that it is never pulled.
const SandboxImage = "machinist.dev/pause:1"

// containerdConfig keeps containerd to what the guest holds: its CNI
// plugins and network, the sandbox image imported at boot, overlayfs
// snapshots on the machine's disk.
var containerdConfig = fmt.Sprintf(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %q

# The guest's root is its initramfs, which pivot_root cannot leave.
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  NoPivotRoot = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [%q]
  conf_dir = %q
`, guest.ContainerdSocket, SandboxImage, guest.CNIBinDir, guest.CNIConfDir)

// kubeletConfig is the kubelet's configuration file. It authenticates
// every request to its port by a client certificate of its cluster's CA
// or a token kube-apiserver vouches for, and authorizes it through
// kube-apiserver, as kubeadm's nodes do, rotates its client certificate, and runs its pods
// in cgroup v2 with the cgroupfs driver: the guest has no systemd.
var kubeletConfig = fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
failSwapOn: false
rotateCertificates: true
resolvConf: /etc/resolv.conf
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
`, guest.ContainerdSocket, guest.KubeletClientCA)

// kubeletConfigWith is kubeletConfig with the Node's Lease duration,
// when set: the kubelet renews its Lease every quarter of it, so that
// the node lifecycle controller's grace, set for the provider's Lease
// (make run's is 20 s), is not outlasted by one late renewal of
// Kubernetes' default 10 s.
func kubeletConfigWith(leaseSeconds int32) string {
	if leaseSeconds <= 0 {
		return kubeletConfig
	}
	return kubeletConfig + fmt.Sprintf("nodeLeaseDurationSeconds: %d\n", leaseSeconds)
}

// cniConfig is the pods' network: a bridge on the node with its own
// addresses. Pods reach each other on their node; the VM's user-mode net
// reaches no further.
const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "machinist",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.88.0.0/16"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// NodeDir is the NodeFiles of a directory as make node fills it: the
// binaries in it, the CNI plugins in cni/, the images in images/, the
// kubelets of other versions in kubelets/. Empty means none.
func NodeDir(dir string) *NodeFiles {
	if dir == "" {
		return nil
	}
	return &NodeFiles{Bin: dir, CNIBin: filepath.Join(dir, "cni"), Images: filepath.Join(dir, "images"),
		Kubelets: filepath.Join(dir, "kubelets")}
}

// withKubelet is a copy of n whose initramfs holds the kubelet at path.
func (n *NodeFiles) withKubelet(path string) *NodeFiles {
	c := *n
	c.kubelet = path
	return &c
}

// kubelets are n's kubelets by the version each one's --version prints:
// Bin's, then those in Kubelets (a missing directory holds none). Of two
// of one version, the first is kept. A file in Kubelets that is no
// kubelet is left out and said why in skipped, so that it costs the
// Machines that ask for another version nothing.
func (n *NodeFiles) kubelets() (found map[string]string, skipped []error, err error) {
	v, err := kubeletVersion(filepath.Join(n.Bin, "kubelet"))
	if err != nil {
		return nil, nil, err
	}
	found = map[string]string{v: filepath.Join(n.Bin, "kubelet")}
	if n.Kubelets == "" {
		return found, nil, nil
	}
	entries, err := os.ReadDir(n.Kubelets)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("qemu: the real node's kubelets: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(n.Kubelets, e.Name())
		// Links followed: a user may link a kubelet kept elsewhere.
		if info, err := os.Stat(p); err != nil || !info.Mode().IsRegular() {
			continue
		}
		v, err := kubeletVersion(p)
		if err != nil {
			skipped = append(skipped, err)
			continue
		}
		if _, ok := found[v]; !ok {
			found[v] = p
		}
	}
	return found, skipped, nil
}

// kubeletsStamp is what n's kubelets are on disk, read without running
// them: each file's path, size, modification time and inode, links
// followed. Files that have not changed have the same stamp.
func (n *NodeFiles) kubeletsStamp() string {
	var b strings.Builder
	add := func(path string) {
		info, err := os.Stat(path)
		if err != nil {
			fmt.Fprintf(&b, "%s\x00%v\n", path, err)
			return
		}
		var ino uint64
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			ino = st.Ino
		}
		fmt.Fprintf(&b, "%s\x00%d\x00%d\x00%d\n", path, info.Size(), info.ModTime().UnixNano(), ino)
	}
	add(filepath.Join(n.Bin, "kubelet"))
	if n.Kubelets != "" {
		entries, err := os.ReadDir(n.Kubelets)
		if err != nil {
			fmt.Fprintf(&b, "%s\x00%v\n", n.Kubelets, err)
		}
		for _, e := range entries {
			add(filepath.Join(n.Kubelets, e.Name()))
		}
	}
	return b.String()
}

// kubeletVersionTimeout bounds a kubelet's --version: a file that never
// answers must not hold every real node's boot. A variable for tests.
var kubeletVersionTimeout = 30 * time.Second

// kubeletVersion is the version a kubelet binary is, as its --version
// prints it.
func kubeletVersion(path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), kubeletVersionTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	// A child the file left behind may hold its output open.
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("qemu: a real node's kubelet, %s --version: %w", path, err)
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "Kubernetes ")
	if !ok || !strings.HasPrefix(v, "v") || strings.ContainsAny(v, " \n") {
		// Only its start: the error reaches Machines' status, and a file
		// that is no kubelet may print anything.
		if len(out) > 64 {
			out = append(out[:64:64], "..."...)
		}
		return "", fmt.Errorf("qemu: a real node's kubelet, %s --version printed %q, not Kubernetes vX.Y.Z", path, out)
	}
	return v, nil
}

// nodeFile is one file of a real node's initramfs: its path there, and
// the host file it is copied from or its contents.
type nodeFile struct {
	path string
	src  string
	data []byte
	mode int
}

// files lists what a real node's initramfs holds besides the agent's:
// the binaries, the configuration and the images, in a fixed order so
// that the same files give the same image.
func (n *NodeFiles) files() ([]nodeFile, error) {
	var out []nodeFile
	for _, b := range nodeBinaries {
		src := filepath.Join(n.Bin, b)
		if b == "kubelet" && n.kubelet != "" {
			src = n.kubelet
		}
		out = append(out, nodeFile{path: filepath.Join(guest.BinDir, b), src: src, mode: 0o755})
	}
	for _, p := range cniPlugins {
		out = append(out, nodeFile{path: filepath.Join(guest.CNIBinDir, p), src: filepath.Join(n.CNIBin, p), mode: 0o755})
	}
	images, err := filepath.Glob(filepath.Join(n.Images, "*.tar"))
	if err != nil {
		return nil, err
	}
	sort.Strings(images)
	for _, img := range images {
		out = append(out, nodeFile{path: filepath.Join(guest.ImageDir, filepath.Base(img)), src: img, mode: 0o644})
	}
	for _, f := range out {
		if _, err := os.Stat(f.src); err != nil {
			return nil, fmt.Errorf("a real node's file: %w", err)
		}
	}
	return append(out,
		nodeFile{path: guest.ContainerdConfig, data: []byte(containerdConfig), mode: 0o644},
		nodeFile{path: guest.KubeletConfig, data: []byte(kubeletConfigWith(n.leaseSeconds)), mode: 0o644},
		nodeFile{path: filepath.Join(guest.CNIConfDir, "10-machinist.conflist"), data: []byte(cniConfig), mode: 0o644},
		// The user-mode net's DNS; nothing answers beyond it.
		nodeFile{path: "/etc/resolv.conf", data: []byte("nameserver 10.0.2.3\n"), mode: 0o644},
		nodeFile{path: "/etc/hosts", data: []byte("127.0.0.1 localhost\n"), mode: 0o644},
		// The kubelet reads its user's entry; the guest has root alone.
		nodeFile{path: "/etc/passwd", data: []byte("root:x:0:0:root:/root:/sbin/nologin\n"), mode: 0o644},
		nodeFile{path: "/etc/group", data: []byte("root:x:0:\n"), mode: 0o644},
	), nil
}

// kubeletPortFile, in a real node's directory, is the port its kubelet
// serves on, on the guest's address and on the host's loopback, where
// QEMU forwards it to the guest: kube-apiserver reaches the kubelet there
// for logs, exec and port-forward. Kept, so that the Node's address stays
// the same across boots while the port is free.
const kubeletPortFile = "kubelet-port"

// kubeletPort is the port of the real node in dir: the one it had, while
// that is free on the host's loopback; else a free one, kept.
func kubeletPort(dir string) (int, error) {
	path := filepath.Join(dir, kubeletPortFile)
	if raw, err := os.ReadFile(path); err == nil {
		if port, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && port > 0 && port < 65536 {
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				return port, l.Close()
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	port, err := freeport.Loopback()
	if err != nil {
		return 0, err
	}
	return port, os.WriteFile(path, []byte(strconv.Itoa(port)+"\n"), 0o644)
}

// keptKubeletPort is the port kubeletPort kept in dir; 0 when none is.
func keptKubeletPort(dir string) (int, error) {
	raw, err := os.ReadFile(filepath.Join(dir, kubeletPortFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || port <= 0 || port >= 65536 {
		return 0, fmt.Errorf("%s: no port: %q", kubeletPortFile, raw)
	}
	return port, nil
}

// Addresses implements process.Addresser: a real node is reached on the
// host's loopback, where QEMU forwards its kubelet's port (kubeletPort).
// Its kubelet runs with --cloud-provider=external and leaves its Node's
// addresses to the controller, which puts these there; the guest's own
// address is the same in every VM, and no host reaches it.
func (*vms) Addresses(dir string) ([]corev1.NodeAddress, error) {
	port, err := keptKubeletPort(dir)
	if err != nil || port == 0 {
		return nil, err
	}
	return []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}, nil
}
