package image_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/machinist-dev/machinist/dev/testenv"
)

// The tests run the image's containers as a kubelet's runtime would: in a
// mount and PID namespace of their own, on the image's filesystem
// (read-only when the container asks), with the pod's volumes and its
// ServiceAccount's token and CA mounted where a pod has them, as the
// image's or the pod's non-root user, with no new privileges. The network
// is the host's: the test control plane has no pod network, so the
// containers' ports are moved to free ones, and kube-apiserver reaches the
// verbs server through a Service of type ExternalName, as in test/deploy.
// A runtime does this between fork and exec, which Go cannot; the test
// binary runs itself as that step (containerInit), before the entrypoint
// replaces it.

// initSpec is what containerInit is told, as JSON in $IMAGE_TEST_INIT.
type initSpec struct {
	Rootfs   string   `json:"rootfs"`
	Mounts   []mount  `json:"mounts"`
	ReadOnly bool     `json:"readOnly"`
	UID      int      `json:"uid"`
	GID      int      `json:"gid"`
	Dir      string   `json:"dir"`
	Argv     []string `json:"argv"`
	Env      []string `json:"env"`
}

type mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly"`
}

const initVar = "IMAGE_TEST_INIT"

// containerInit sets the container up and execs its entrypoint; it
// returns only to report a failure.
func containerInit(raw string) error {
	var s initSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return err
	}
	// Nothing mounted here may leak to the host's mount namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := unix.Mount(s.Rootfs, s.Rootfs, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding the rootfs: %w", err)
	}
	if err := unix.Mount("proc", filepath.Join(s.Rootfs, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	dev := filepath.Join(s.Rootfs, "dev")
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID, "mode=755,size=64k"); err != nil {
		return fmt.Errorf("mounting /dev: %w", err)
	}
	for _, d := range []string{"null", "zero", "random", "urandom"} {
		target := filepath.Join(dev, d)
		if err := os.WriteFile(target, nil, 0o666); err != nil {
			return err
		}
		if err := unix.Mount("/dev/"+d, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", d, err)
		}
	}
	for _, m := range s.Mounts {
		target := filepath.Join(s.Rootfs, m.Target)
		if err := unix.Mount(m.Source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("mounting %s at %s: %w", m.Source, m.Target, err)
		}
		if m.ReadOnly {
			if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("making %s read-only: %w", m.Target, err)
			}
		}
	}
	if s.ReadOnly {
		if err := unix.Mount("", s.Rootfs, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("making the rootfs read-only: %w", err)
		}
	}
	if err := unix.Chroot(s.Rootfs); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir(s.Dir); err != nil {
		return err
	}
	// allowPrivilegeEscalation: false.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	// Leaving UID 0 drops every capability (capabilities: drop: ALL).
	if err := syscall.Setgroups(nil); err != nil {
		return err
	}
	if err := syscall.Setgid(s.GID); err != nil {
		return err
	}
	if err := syscall.Setuid(s.UID); err != nil {
		return err
	}
	return syscall.Exec(s.Argv[0], s.Argv, s.Env)
}

// container is how one container of a pod is run.
type container struct {
	pod  corev1.PodSpec
	name string
	// rootfs is the image's extracted filesystem, config its entrypoint,
	// user and environment.
	rootfs string
	image  imageConfig
	// volumes are host directories standing for the pod's volumes, by
	// name (an emptyDir shared by two containers is one directory).
	volumes map[string]string
	// serviceAccount holds token, ca.crt and namespace.
	serviceAccount string
	// env is added to the container's (KUBERNETES_SERVICE_HOST, say), and
	// fieldRefs resolves the downward API's fields.
	env       map[string]string
	fieldRefs map[string]string
	// args rewrites the container's arguments after expansion (the ports
	// the host network needs moved).
	args func([]string) []string
}

type imageConfig struct {
	Entrypoint, Cmd, Env []string
	User, WorkingDir     string
}

// start runs the container and returns the command, not waited for.
func (c container) start(t *testing.T) (*exec.Cmd, *testenv.LockedBuffer) {
	t.Helper()
	var spec *corev1.Container
	for i := range c.pod.Containers {
		if c.pod.Containers[i].Name == c.name {
			spec = &c.pod.Containers[i]
		}
	}
	if spec == nil {
		t.Fatalf("the pod has no container %s", c.name)
	}
	env := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	for _, kv := range c.image.Env {
		k, v, _ := strings.Cut(kv, "=")
		set(k, v)
	}
	for k, v := range c.env {
		set(k, v)
	}
	for _, e := range spec.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			v, ok := c.fieldRefs[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("container %s: env %s wants field %s, which the test does not provide", c.name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			set(e.Name, v)
		case e.ValueFrom != nil:
			t.Fatalf("container %s: env %s comes from a source the test does not provide", c.name, e.Name)
		default:
			set(e.Name, expand(e.Value, env))
		}
	}
	// The kubelet's rules: the container's command replaces the image's
	// entrypoint, its args the image's cmd; $(VAR) expands in both.
	argv := c.image.Entrypoint
	if len(spec.Command) > 0 {
		argv = spec.Command
	}
	args := c.image.Cmd
	if len(spec.Command) > 0 || len(spec.Args) > 0 {
		args = spec.Args
	}
	var expanded []string
	for _, a := range append(append([]string{}, argv...), args...) {
		expanded = append(expanded, expand(a, env))
	}
	if c.args != nil {
		expanded = append(expanded[:1], c.args(expanded[1:])...)
	}

	uid, gid := user(t, c.image.User)
	readOnly := false
	for _, sc := range []*corev1.SecurityContext{spec.SecurityContext} {
		if sc != nil && sc.ReadOnlyRootFilesystem != nil {
			readOnly = *sc.ReadOnlyRootFilesystem
		}
	}
	if psc := c.pod.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			uid = int(*psc.RunAsUser)
		}
		if psc.RunAsGroup != nil {
			gid = int(*psc.RunAsGroup)
		}
	}
	if sc := spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = int(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			gid = int(*sc.RunAsGroup)
		}
		if sc.RunAsNonRoot != nil && *sc.RunAsNonRoot && uid == 0 {
			t.Fatalf("container %s: runAsNonRoot, but it would run as root", c.name)
		}
	}

	mounts := []mount{{Source: c.serviceAccount, Target: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	for _, vm := range spec.VolumeMounts {
		src, ok := c.volumes[vm.Name]
		if !ok {
			t.Fatalf("container %s mounts volume %s, which the test does not provide", c.name, vm.Name)
		}
		mounts = append(mounts, mount{Source: src, Target: vm.MountPath, ReadOnly: vm.ReadOnly})
	}
	// A runtime makes the mount points it needs, before the rootfs is
	// made read-only.
	for _, d := range append([]string{"proc", "dev"}, targets(mounts)...) {
		if err := os.MkdirAll(filepath.Join(c.rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var envList []string
	for _, k := range order {
		envList = append(envList, k+"="+env[k])
	}
	dir := c.image.WorkingDir
	if spec.WorkingDir != "" {
		dir = spec.WorkingDir
	}
	if dir == "" {
		dir = "/"
	}
	raw, err := json.Marshal(initSpec{Rootfs: c.rootfs, Mounts: mounts, ReadOnly: readOnly, UID: uid, GID: gid, Dir: dir, Argv: expanded, Env: envList})
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = []string{initVar + "=" + string(raw)}
	out := &testenv.LockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting container %s: %v", c.name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("container %s:\n%s", c.name, out.String())
		}
	})
	return cmd, out
}

func targets(ms []mount) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Target)
	}
	return out
}

// user resolves the image's USER, numeric as this image's is.
func user(t *testing.T, u string) (int, int) {
	t.Helper()
	us, gs, ok := strings.Cut(u, ":")
	uid, err := strconv.Atoi(us)
	if err != nil {
		t.Fatalf("the image's user %q is not numeric", u)
	}
	gid := uid
	if ok {
		if gid, err = strconv.Atoi(gs); err != nil {
			t.Fatalf("the image's group %q is not numeric", u)
		}
	}
	return uid, gid
}

var reference = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand replaces $(VAR) with VAR's value where VAR is defined, as the
// kubelet does, and leaves it as it is otherwise.
func expand(s string, env map[string]string) string {
	return reference.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := env[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}
