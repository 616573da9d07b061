// Package image_test builds Machinist's container image as make image
// does and runs its containers as a kubelet would: the manager with its
// provider sidecar (config/provider-sidecar) and the verbs server
// (config/apiservice), against the test control plane, as their own
// ServiceAccounts with the RBAC config/default grants.
package image_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/apiserver"
	"github.com/machinist-dev/machinist/dev/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	if spec := os.Getenv(initVar); spec != "" {
		err := containerInit(spec)
		fmt.Fprintln(os.Stderr, "container init:", err)
		os.Exit(127)
	}
	os.Exit(testenv.Run(m, func(e *testenv.Env) { env = e }))
}

const (
	namespace = "machinist-system"
	tag       = "machinist:dev"
)

// TestTheImageRunsAsAPodWould builds the image, checks what make image
// promises of it, and runs the manager, its provider sidecar and the verbs
// server from it: the manager makes a Machine Running through the
// sidecar, and a reboot asked through kube-apiserver's aggregation layer
// reaches the verbs server and is carried out.
func TestTheImageRunsAsAPodWould(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs containers as a kubelet's runtime does (mount and PID namespaces, chroot, a non-root user): it needs root, as make test's package installs do")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	img, cfg := buildImage(t)
	rootfs := extract(t, img)

	objects := render(t, "config/provider-sidecar")
	apply(t, ctx, objects, "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
	managerPod := deployment(t, objects, "machinist-manager").Spec.Template.Spec
	verbsPod := deployment(t, objects, "machinist-verbs").Spec.Template.Spec
	for _, pod := range []corev1.PodSpec{managerPod, verbsPod} {
		for _, c := range pod.Containers {
			if c.Image != tag {
				t.Errorf("container %s runs image %q, not the %q make image tags", c.Name, c.Image, tag)
			}
		}
	}

	apiHost, apiPort, err := net.SplitHostPort(strings.TrimPrefix(env.Config.Host, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	inCluster := map[string]string{"KUBERNETES_SERVICE_HOST": apiHost, "KUBERNETES_SERVICE_PORT": apiPort}
	fields := map[string]string{"metadata.namespace": namespace}

	// The manager and its sidecar share the pod's emptyDir.
	socket := hostDir(t)
	metrics, health := testenv.FreePort(t), testenv.FreePort(t)
	pod := container{
		pod: managerPod, rootfs: rootfs, image: cfg,
		volumes:        map[string]string{"provider-socket": socket},
		serviceAccount: serviceAccount(t, ctx, managerPod.ServiceAccountName),
		env:            inCluster, fieldRefs: fields,
		args: replaceFlags(map[string]string{
			"--metrics-bind-address":      fmt.Sprintf("127.0.0.1:%d", metrics),
			"--health-probe-bind-address": fmt.Sprintf("127.0.0.1:%d", health),
		}),
	}
	sidecar := pod
	sidecar.name, sidecar.args = "provider", nil
	_, sidecarOut := sidecar.start(t)
	manager := pod
	manager.name = "manager"
	_, managerOut := manager.start(t)

	verbsPort := testenv.FreePort(t)
	verbs := container{
		pod: verbsPod, name: "verbs", rootfs: rootfs, image: cfg,
		volumes:        map[string]string{"certs": hostDir(t)},
		serviceAccount: serviceAccount(t, ctx, verbsPod.ServiceAccountName),
		env:            inCluster, fieldRefs: fields,
		args: replaceFlags(map[string]string{"--secure-port": fmt.Sprint(verbsPort)}),
	}
	svc := types.NamespacedName{Namespace: namespace, Name: "machinist-verbs"}
	if err := env.Client.Patch(ctx, apiserver.LocalService(svc, int32(verbsPort)), client.Apply, client.FieldOwner("test"), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Patch(ctx, apiserver.APIService(svc, int32(verbsPort), nil), client.Apply, client.FieldOwner("test"), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	_, verbsOut := verbs.start(t)

	testenv.WaitFor(t, time.Minute, "the manager from the image ready", func() error {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", health))
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz answered %d\n%s", resp.StatusCode, managerOut.String())
		}
		return nil
	})

	ns := env.NewNamespace(t, "image", testenv.Small)
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "from-the-image"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}, Version: "v1.37.2"},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitForObject(t, env.Client, 2*time.Minute, "the Machine Running", m, func(m *machinistv1.Machine) error {
		if m.Status.Phase != machinistv1.MachineRunning {
			return fmt.Errorf("phase %q\nmanager:\n%s\nsidecar:\n%s", m.Status.Phase, managerOut.String(), sidecarOut.String())
		}
		return nil
	})

	if err := apiserver.WaitAvailable(ctx, env.Client, time.Minute); err != nil {
		t.Fatalf("the verbs server from the image never became Available: %v\n%s", err, verbsOut.String())
	}
	kube := kubernetes.NewForConfigOrDie(env.Config)
	var code int
	err = kube.CoreV1().RESTClient().Put().
		AbsPath("/apis/subresources.machinist.dev/v1alpha1/namespaces", ns, "machines", m.Name, "reboot").
		Body([]byte(`{}`)).Do(ctx).StatusCode(&code).Error()
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("reboot answered %d: %v\n%s", code, err, verbsOut.String())
	}
	testenv.WaitForObject(t, env.Client, 2*time.Minute, "the reboot done", m, func(m *machinistv1.Machine) error {
		if op := m.Status.Operation; op == nil || op.State != machinistv1.OperationSucceeded {
			return fmt.Errorf("operation %+v", m.Status.Operation)
		}
		return nil
	})

	// Nothing the containers did needed a writable root: the manager and
	// the verbs server wrote only into their volumes.
	for _, c := range []struct {
		name string
		out  *testenv.LockedBuffer
	}{{"manager", managerOut}, {"provider", sidecarOut}, {"verbs", verbsOut}} {
		if strings.Contains(c.out.String(), "read-only file system") {
			t.Errorf("container %s tried to write to its read-only root:\n%s", c.name, c.out.String())
		}
	}
}

// buildImage runs the image's build as make image does, with the binary
// the tests build (see docs/operations.md: a -trimpath build of its own
// would compile every package again), and checks the layout, the tarball
// and the config.
func buildImage(t *testing.T) (v1.Image, imageConfig) {
	t.Helper()
	binary, err := testenv.Machinist()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command("go", "run", "./hack/image", "--out", out, "--binary", binary, "--tag", tag)
	cmd.Dir = env.Root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./hack/image: %v\n%s", err, b)
	}
	index, err := layout.ImageIndexFromPath(filepath.Join(out, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest.Manifests) != 1 || manifest.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != tag {
		t.Fatalf("the OCI layout holds %+v, not one image named %s", manifest.Manifests, tag)
	}
	img, err := index.Image(manifest.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := tarball.ImageFromPath(filepath.Join(out, "machinist.tar"), &ref)
	if err != nil {
		t.Fatalf("the tarball has no image %s: %v", tag, err)
	}
	// docker load's format keeps no manifest: the image is its config
	// (the image ID docker and podman show) and its layers.
	want, _ := img.ConfigName()
	if got, _ := loaded.ConfigName(); got != want {
		t.Errorf("the tarball's image is %s, the layout's %s", got, want)
	}
	digest, _ := img.Digest()
	if b, _ := os.ReadFile(filepath.Join(out, "digest")); strings.TrimSpace(string(b)) != digest.String() {
		t.Errorf("digest file says %q, the image is %s", b, digest)
	}
	file, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := file.Config
	if c.User != "65532:65532" {
		t.Errorf("the image runs as %q, not 65532:65532", c.User)
	}
	head, err := exec.Command("git", "-C", env.Root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"org.opencontainers.image.source":   "https://github.com/machinist-dev/machinist",
		"org.opencontainers.image.revision": strings.TrimSpace(string(head)),
	} {
		if c.Labels[k] != v {
			t.Errorf("label %s is %q, want %q", k, c.Labels[k], v)
		}
	}
	if c.Labels["org.opencontainers.image.version"] == "" {
		t.Error("no org.opencontainers.image.version label")
	}
	return img, imageConfig{Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, User: c.User, WorkingDir: c.WorkingDir}
}

// extract unpacks the image's filesystem, owners and modes kept.
func extract(t *testing.T, img v1.Image) string {
	t.Helper()
	root := t.TempDir()
	// The container's / is this directory: its user must be able to
	// enter it, as a runtime's rootfs allows.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(root, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unexpected %q in the image: type %c", h.Name, h.Typeflag)
		}
		if err := os.Chown(path, h.Uid, h.Gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, h.FileInfo().Mode()); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// render is kubectl kustomize of dir, split into objects.
func render(t *testing.T, dir string) []map[string]any {
	t.Helper()
	out, err := env.Kubectl(context.Background(), "kustomize", filepath.Join(env.Root, dir))
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
	}
	var objects []map[string]any
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	for {
		var o map[string]any
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if o != nil {
			objects = append(objects, o)
		}
	}
	return objects
}

// apply creates the objects of the kinds given, as kubectl apply would.
func apply(t *testing.T, ctx context.Context, objects []map[string]any, kinds ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, k := range kinds {
		want[k] = true
	}
	var docs []string
	for _, o := range objects {
		if want[fmt.Sprint(o["kind"])] {
			b, err := yamlOf(o)
			if err != nil {
				t.Fatal(err)
			}
			docs = append(docs, b)
		}
	}
	file := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "\n---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(ctx, "apply", "--server-side", "-f", file); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

func deployment(t *testing.T, objects []map[string]any, name string) *appsv1.Deployment {
	t.Helper()
	for _, o := range objects {
		meta, _ := o["metadata"].(map[string]any)
		if o["kind"] == "Deployment" && meta["name"] == name {
			d := &appsv1.Deployment{}
			if err := fromMap(o, d); err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	t.Fatalf("no Deployment %s in the manifests", name)
	return nil
}

// serviceAccount writes what a pod of the ServiceAccount has mounted at
// /var/run/secrets/kubernetes.io/serviceaccount: a token kube-apiserver
// issued for it, the cluster's CA and the namespace.
func serviceAccount(t *testing.T, ctx context.Context, sa string) string {
	t.Helper()
	kube := kubernetes.NewForConfigOrDie(env.Config)
	expiry := int64(3600)
	tr, err := kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token for ServiceAccount %s: %v", sa, err)
	}
	dir := hostDir(t)
	for file, content := range map[string][]byte{
		"token": []byte(tr.Status.Token), "ca.crt": env.Config.CAData, "namespace": []byte(namespace),
	} {
		if err := os.WriteFile(filepath.Join(dir, file), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// hostDir is a directory the containers' user may use, as a volume.
func hostDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// replaceFlags returns an args rewrite that sets each --flag=value given.
func replaceFlags(flags map[string]string) func([]string) []string {
	return func(args []string) []string {
		out := make([]string, 0, len(args))
		for _, a := range args {
			k, _, _ := strings.Cut(a, "=")
			if v, ok := flags[k]; ok {
				a = k + "=" + v
			}
			out = append(out, a)
		}
		return out
	}
}

func yamlOf(o map[string]any) (string, error) {
	b, err := sigsyaml.Marshal(o)
	return string(b), err
}

func fromMap(o map[string]any, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(o, into)
}
