// Package deploy_test proves that the kustomize manifests in config/ deploy
// Machinist: config/default renders the expected objects, kube-apiserver
// accepts every one of them (server-side dry run), and the RBAC they carry
// lets the controllers and the verbs server do their work. It runs the real
// kubectl against a real kube-apiserver; nothing runs the containers.
package deploy_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	"github.com/machinist-dev/machinist/apiserver"
	"github.com/machinist-dev/machinist/dev/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, func(e *testenv.Env) { env = e }))
}

const (
	namespace = "machinist-system"
	image     = "machinist:dev"
	nameLabel = "app.kubernetes.io/name"
	managerSA = "system:serviceaccount:machinist-system:machinist-manager"
	verbsSA   = "system:serviceaccount:machinist-system:machinist-verbs"
)

// verbsService is where the APIService sends kube-apiserver.
var verbsService = types.NamespacedName{Namespace: namespace, Name: "machinist-verbs"}

// wantObjects is everything config/default deploys, as id() names them.
var wantObjects = []string{
	"APIService v1alpha1.subresources.machinist.dev",
	"ClusterRole machinist-editor",
	"ClusterRole machinist-machine-operator",
	"ClusterRole machinist-manager",
	"ClusterRole machinist-metrics-reader",
	"ClusterRole machinist-verbs",
	"ClusterRole machinist-verbs-apiservice",
	"ClusterRole machinist-viewer",
	"ClusterRoleBinding machinist-manager",
	"ClusterRoleBinding machinist-verbs",
	"ClusterRoleBinding machinist-verbs-apiservice",
	"ClusterRoleBinding machinist-verbs-auth-delegator",
	"CustomResourceDefinition machineclasses.machinist.dev",
	"CustomResourceDefinition machinedeployments.machinist.dev",
	"CustomResourceDefinition machinedisruptionbudgets.machinist.dev",
	"CustomResourceDefinition machinedrainrules.machinist.dev",
	"CustomResourceDefinition machinehealthchecks.machinist.dev",
	"CustomResourceDefinition machines.machinist.dev",
	"CustomResourceDefinition machinesets.machinist.dev",
	"CustomResourceDefinition managementclusters.machinist.dev",
	"CustomResourceDefinition workloadclusters.machinist.dev",
	"Deployment machinist-system/machinist-manager",
	"Deployment machinist-system/machinist-verbs",
	"MutatingAdmissionPolicy machinist-request-requester",
	"MutatingAdmissionPolicy machinist-version-requester",
	"MutatingAdmissionPolicyBinding machinist-request-requester",
	"MutatingAdmissionPolicyBinding machinist-version-requester",
	"Namespace machinist-system",
	"RoleBinding kube-system/machinist-verbs-auth-reader",
	"Service machinist-system/machinist-manager-metrics",
	"Service machinist-system/machinist-verbs",
	"ServiceAccount machinist-system/machinist-manager",
	"ServiceAccount machinist-system/machinist-verbs",
	"ValidatingAdmissionPolicy machinist-adopt",
	"ValidatingAdmissionPolicy machinist-request",
	"ValidatingAdmissionPolicy machinist-version-requester",
	"ValidatingAdmissionPolicyBinding machinist-adopt",
	"ValidatingAdmissionPolicyBinding machinist-request",
	"ValidatingAdmissionPolicyBinding machinist-version-requester",
}

// wantArgs are the containers' arguments: the contract with the machinist
// command's flags.
var wantArgs = map[string][]string{
	"machinist-manager": {
		"manager",
		"--leader-elect",
		"--leader-election-namespace=$(POD_NAMESPACE)",
		"--metrics-bind-address=:8443",
		"--metrics-secure",
		"--health-probe-bind-address=:8081",
		"--machine-workers=16",
		"--set-workers=4",
		"--kube-api-qps=200",
		"--kube-api-burst=400",
		"--log-format=json",
	},
	"machinist-verbs": {
		"apiserver",
		"--secure-port=8443",
		"--cert-dir=/var/run/machinist/certs",
		"--apiservice=" + apiserver.APIServiceName,
		"--service=$(POD_NAMESPACE)/" + verbsService.Name,
		"--log-format=json",
	},
}

// render is `kubectl kustomize config/default`, run once.
var render = sync.OnceValues(func() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return env.Kubectl(ctx, "kustomize", filepath.Join(env.Root, "config", "default"))
})

// objects decodes the rendered manifests.
func objects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	out, err := render()
	if err != nil {
		t.Fatalf("kubectl kustomize config/default: %v", err)
	}
	return decode(t, out)
}

func decode(t *testing.T, stream string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(stream), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decoding the rendered manifests: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// id names an object by kind, namespace (if any) and name.
func id(u *unstructured.Unstructured) string {
	if u.GetNamespace() == "" {
		return u.GetKind() + " " + u.GetName()
	}
	return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
}

// find returns the rendered object with this id, failing the test if there
// is none.
func find(t *testing.T, objs []*unstructured.Unstructured, want string) *unstructured.Unstructured {
	t.Helper()
	for _, u := range objs {
		if id(u) == want {
			return u
		}
	}
	t.Fatalf("config/default renders no %s", want)
	return nil
}

// typed converts a rendered object to its Go type, refusing unknown fields.
func typed[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	obj := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, obj, true); err != nil {
		t.Fatalf("%s: %v", id(u), err)
	}
	return obj
}

func TestKustomizeRendersExactlyTheExpectedObjects(t *testing.T) {
	objs := objects(t)
	var got []string
	for _, u := range objs {
		got = append(got, id(u))
	}
	sort.Strings(got)
	want := slices.Sorted(slices.Values(wantObjects))
	if !slices.Equal(got, want) {
		t.Errorf("config/default renders\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	inNamespace(t, objs, namespace)
	for _, u := range objs {
		if u.GetLabels()[nameLabel] != "machinist" {
			t.Errorf("%s has labels %v, want %s=machinist", id(u), u.GetLabels(), nameLabel)
		}
	}

	// Every CRD that controller-gen generates is deployed.
	files, err := filepath.Glob(filepath.Join(env.Root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in config/crd/bases: %v", err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, crd := range decode(t, string(data)) {
			find(t, objs, id(crd))
		}
	}
}

// inNamespace checks that every namespaced object is in ns, except the
// RoleBinding that must sit in kube-system beside the Role it binds, that
// every ServiceAccount a binding names is in ns, and that the APIService
// sends kube-apiserver to ns.
func inNamespace(t *testing.T, objs []*unstructured.Unstructured, ns string) {
	t.Helper()
	mapper := env.Client.RESTMapper()
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Errorf("%s: kube-apiserver does not serve %s: %v", id(u), gvk, err)
			continue
		}
		switch {
		case mapping.Scope.Name() == meta.RESTScopeNameRoot && u.GetNamespace() != "":
			t.Errorf("%s is cluster-scoped but has namespace %q", id(u), u.GetNamespace())
		case mapping.Scope.Name() == meta.RESTScopeNameNamespace && u.GetKind() == "RoleBinding" && u.GetName() == "machinist-verbs-auth-reader":
			if u.GetNamespace() != "kube-system" {
				t.Errorf("%s is in namespace %q, want kube-system", id(u), u.GetNamespace())
			}
		case mapping.Scope.Name() == meta.RESTScopeNameNamespace && u.GetNamespace() != ns:
			t.Errorf("%s is in namespace %q, want %s", id(u), u.GetNamespace(), ns)
		}
		subjects, _, _ := unstructured.NestedSlice(u.Object, "subjects")
		for _, s := range subjects {
			if s, _ := s.(map[string]any); s["kind"] == rbacv1.ServiceAccountKind && s["namespace"] != ns {
				t.Errorf("%s binds ServiceAccount %v/%v, want it in %s", id(u), s["namespace"], s["name"], ns)
			}
		}
		if u.GetKind() == "APIService" {
			if got, _, _ := unstructured.NestedString(u.Object, "spec", "service", "namespace"); got != ns {
				t.Errorf("%s sends kube-apiserver to namespace %q, want %s", id(u), got, ns)
			}
		}
	}
}

// TestAnotherNamespace changes config/default's namespace in a copy of
// config/: everything follows, and the kube-system binding names the
// ServiceAccount in its new namespace.
func TestAnotherNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	for _, sub := range []string{"crd", "crd/bases", "rbac", "manager", "apiservice", "admission", "default"} {
		files, err := filepath.Glob(filepath.Join(env.Root, "config", sub, "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no YAML in config/%s: %v", sub, err)
		}
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if sub == "default" && filepath.Base(file) == "kustomization.yaml" {
				line := "\nnamespace: " + namespace + "\n"
				if !strings.Contains(string(data), line) {
					t.Fatalf("config/default/kustomization.yaml does not set%s", line)
				}
				data = []byte(strings.Replace(string(data), line, "\nnamespace: machines-elsewhere\n", 1))
			}
			if err := os.WriteFile(filepath.Join(dir, sub, filepath.Base(file)), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	out, err := env.Kubectl(ctx, "kustomize", filepath.Join(dir, "default"))
	if err != nil {
		t.Fatal(err)
	}
	objs := decode(t, out)
	if len(objs) != len(wantObjects) {
		t.Errorf("%d objects, want %d", len(objs), len(wantObjects))
	}
	inNamespace(t, objs, "machines-elsewhere")
	// The CRDs' webhook follows the verbs Service.
	for _, name := range apiserver.CRDs {
		crd := typed[apiextensionsv1.CustomResourceDefinition](t, find(t, objs, "CustomResourceDefinition "+name))
		if svc := crd.Spec.Conversion.Webhook.ClientConfig.Service; svc == nil || svc.Namespace != "machines-elsewhere" {
			t.Errorf("CRD %s converts through Service %+v, want one in machines-elsewhere", name, svc)
		}
	}
}

func TestDeployments(t *testing.T) {
	objs := objects(t)
	for _, tc := range []struct {
		name, serviceAccount, probePort string
		probeScheme                     corev1.URIScheme
		probeContainerPort              int32
	}{
		{name: "machinist-manager", serviceAccount: "machinist-manager", probePort: "health", probeScheme: corev1.URISchemeHTTP, probeContainerPort: 8081},
		{name: "machinist-verbs", serviceAccount: "machinist-verbs", probePort: "https", probeScheme: corev1.URISchemeHTTPS, probeContainerPort: 8443},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := typed[appsv1.Deployment](t, find(t, objs, "Deployment "+namespace+"/"+tc.name))
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
				t.Errorf("replicas %v, want 1", d.Spec.Replicas)
			}
			selector, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
			if err != nil || selector.Empty() || !selector.Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("selector %v does not select the pod template's labels %v (%v)", d.Spec.Selector, d.Spec.Template.Labels, err)
			}
			pod := d.Spec.Template.Spec
			if pod.ServiceAccountName != tc.serviceAccount {
				t.Errorf("serviceAccountName %q, want %q", pod.ServiceAccountName, tc.serviceAccount)
			}
			find(t, objs, "ServiceAccount "+namespace+"/"+pod.ServiceAccountName)
			if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
				psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("pod securityContext %+v, want runAsNonRoot and seccomp RuntimeDefault", psc)
			}
			if len(pod.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(pod.Containers))
			}
			c := pod.Containers[0]
			if c.Image != image {
				t.Errorf("image %q, want %q", c.Image, image)
			}
			if !slices.Equal(c.Args, wantArgs[tc.name]) {
				t.Errorf("args\n  %q\nwant\n  %q", c.Args, wantArgs[tc.name])
			}
			if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
				return e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
			}) {
				t.Errorf("env %+v has no POD_NAMESPACE from metadata.namespace", c.Env)
			}
			sc := c.SecurityContext
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("container securityContext %+v, want a read-only root, no privilege escalation, all capabilities dropped", sc)
			}
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				req, hasReq := c.Resources.Requests[r]
				limit, hasLimit := c.Resources.Limits[r]
				if !hasReq || !hasLimit || req.Cmp(limit) > 0 {
					t.Errorf("%s request %v and limit %v: want both, request <= limit", r, c.Resources.Requests, c.Resources.Limits)
				}
			}
			for path, probe := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
				if probe == nil || probe.HTTPGet == nil {
					t.Errorf("no HTTP probe for %s: %+v", path, probe)
					continue
				}
				get := probe.HTTPGet
				scheme := cmp.Or(get.Scheme, corev1.URISchemeHTTP) // the API's default
				if get.Path != path || scheme != tc.probeScheme || containerPort(c, get.Port) != tc.probeContainerPort {
					t.Errorf("probe for %s is %s %s on port %s, want %s on port %d", path, scheme, get.Path, get.Port.String(), tc.probeScheme, tc.probeContainerPort)
				}
			}
		})
	}

	t.Run("the verbs server keeps its certificates in an emptyDir", func(t *testing.T) {
		d := typed[appsv1.Deployment](t, find(t, objs, "Deployment "+namespace+"/machinist-verbs"))
		// Two pods would each patch their own CA into the APIService.
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("strategy %q, want Recreate", d.Spec.Strategy.Type)
		}
		const certDir = "/var/run/machinist/certs"
		c := d.Spec.Template.Spec.Containers[0]
		i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == certDir })
		if i < 0 || c.VolumeMounts[i].ReadOnly {
			t.Fatalf("no writable volume at %s: %+v", certDir, c.VolumeMounts)
		}
		j := slices.IndexFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })
		if j < 0 || d.Spec.Template.Spec.Volumes[j].EmptyDir == nil {
			t.Errorf("the volume at %s is not an emptyDir: %+v", certDir, d.Spec.Template.Spec.Volumes)
		}
	})
}

// containerPort resolves a probe's or a Service's target port against a
// container's ports; 0 if it names none.
func containerPort(c corev1.Container, port intstr.IntOrString) int32 {
	for _, p := range c.Ports {
		if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
			return p.ContainerPort
		}
	}
	return 0
}

func TestServicesReachTheirPods(t *testing.T) {
	objs := objects(t)
	deployments := map[string]*appsv1.Deployment{}
	for _, name := range []string{"machinist-manager", "machinist-verbs"} {
		deployments[name] = typed[appsv1.Deployment](t, find(t, objs, "Deployment "+namespace+"/"+name))
	}
	for _, tc := range []struct {
		service, deployment string
		port, containerPort int32
	}{
		{service: "machinist-manager-metrics", deployment: "machinist-manager", port: 8443, containerPort: 8443},
		{service: verbsService.Name, deployment: "machinist-verbs", port: 443, containerPort: 8443},
	} {
		svc := typed[corev1.Service](t, find(t, objs, "Service "+namespace+"/"+tc.service))
		for name, d := range deployments {
			selected := len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels))
			if selected != (name == tc.deployment) {
				t.Errorf("Service %s selects %s's pods: %v, want %v", tc.service, name, selected, name == tc.deployment)
			}
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != tc.port ||
			containerPort(deployments[tc.deployment].Spec.Template.Spec.Containers[0], svc.Spec.Ports[0].TargetPort) != tc.containerPort {
			t.Errorf("Service %s ports %+v, want %d to container port %d", tc.service, svc.Spec.Ports, tc.port, tc.containerPort)
		}
	}
}

func TestAPIServiceMatchesTheVerbsServer(t *testing.T) {
	objs := objects(t)
	got := typed[apiregv1.APIService](t, find(t, objs, "APIService "+apiserver.APIServiceName))
	// The server patches its CA in at start; the manifest carries none.
	want := apiserver.APIService(verbsService, 443, nil)
	if !equality.Semantic.DeepEqual(got.Spec, want.Spec) {
		t.Errorf("APIService spec\n  %s\nwant (apiserver.APIService)\n  %s", yamlOf(got.Spec), yamlOf(want.Spec))
	}
	for k, v := range want.Labels {
		if got.Labels[k] != v {
			t.Errorf("APIService labels %v, want %s=%s", got.Labels, k, v)
		}
	}
	// The Service it names exists and serves the port it names.
	svc := typed[corev1.Service](t, find(t, objs, "Service "+got.Spec.Service.Namespace+"/"+got.Spec.Service.Name))
	if got.Spec.Service.Port == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == *got.Spec.Service.Port }) {
		t.Errorf("Service %s has ports %+v, the APIService wants %v", svc.Name, svc.Spec.Ports, got.Spec.Service.Port)
	}
}

// TestCRDsConvertThroughTheVerbsServer: every CRD converts between its
// versions through the verbs server's /convert, behind the Service the
// APIService names, and the verbs server may set each one's caBundle.
func TestCRDsConvertThroughTheVerbsServer(t *testing.T) {
	objs := objects(t)
	want := apiserver.WebhookConversion("", verbsService, nil)
	for _, name := range apiserver.CRDs {
		crd := typed[apiextensionsv1.CustomResourceDefinition](t, find(t, objs, "CustomResourceDefinition "+name))
		if len(crd.Spec.Versions) < 2 {
			t.Errorf("CRD %s serves %d versions", name, len(crd.Spec.Versions))
		}
		if !equality.Semantic.DeepEqual(crd.Spec.Conversion, want) {
			t.Errorf("CRD %s conversion\n  %s\nwant (apiserver.WebhookConversion)\n  %s", name, yamlOf(crd.Spec.Conversion), yamlOf(want))
		}
	}
	svc := typed[corev1.Service](t, find(t, objs, "Service "+verbsService.String()))
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == 443 }) {
		t.Errorf("Service %s has ports %+v, the CRDs' webhook wants 443", svc.Name, svc.Spec.Ports)
	}
	role := typed[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole machinist-verbs-apiservice"))
	allowed := map[string]bool{}
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, "apiextensions.k8s.io") && slices.Contains(r.Resources, "customresourcedefinitions") &&
			slices.Contains(r.Verbs, "get") && slices.Contains(r.Verbs, "patch") {
			for _, n := range r.ResourceNames {
				allowed[n] = true
			}
		}
	}
	for _, name := range apiserver.CRDs {
		if !allowed[name] {
			t.Errorf("ClusterRole machinist-verbs-apiservice does not let the verbs server get and patch CRD %s", name)
		}
	}
}

func yamlOf(v any) string {
	out, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", "\n  ")
}

// builtinRoles are the roles the bindings may name that Kubernetes itself
// provides.
var builtinRoles = map[string]bool{
	"ClusterRole system:auth-delegator":                          true,
	"Role kube-system/extension-apiserver-authentication-reader": true,
}

func TestBindingsNameRenderedRolesAndServiceAccounts(t *testing.T) {
	objs := objects(t)
	has := map[string]bool{}
	for _, u := range objs {
		has[id(u)] = true
	}
	for _, u := range objs {
		var ref rbacv1.RoleRef
		var subjects []rbacv1.Subject
		switch u.GetKind() {
		case "ClusterRoleBinding":
			b := typed[rbacv1.ClusterRoleBinding](t, u)
			ref, subjects = b.RoleRef, b.Subjects
		case "RoleBinding":
			b := typed[rbacv1.RoleBinding](t, u)
			ref, subjects = b.RoleRef, b.Subjects
		default:
			continue
		}
		role := ref.Kind + " " + ref.Name
		if ref.Kind == "Role" {
			role = ref.Kind + " " + u.GetNamespace() + "/" + ref.Name
		}
		if !has[role] && !builtinRoles[role] {
			t.Errorf("%s binds %s, which is neither rendered nor built in", id(u), role)
		}
		if len(subjects) == 0 {
			t.Errorf("%s has no subjects", id(u))
		}
		for _, s := range subjects {
			if sa := "ServiceAccount " + s.Namespace + "/" + s.Name; s.Kind != rbacv1.ServiceAccountKind || !has[sa] {
				t.Errorf("%s binds %s %s/%s, not a rendered ServiceAccount", id(u), s.Kind, s.Namespace, s.Name)
			}
		}
	}
}

// apply runs kubectl apply --server-side on the rendered objects of the
// given kinds (all if none), with extra flags, and returns its output.
func apply(t *testing.T, ctx context.Context, flags []string, kinds ...string) (string, []*unstructured.Unstructured) {
	t.Helper()
	var docs []string
	var applied []*unstructured.Unstructured
	for _, u := range objects(t) {
		if len(kinds) > 0 && !slices.Contains(kinds, u.GetKind()) {
			continue
		}
		if u.GetKind() == "CustomResourceDefinition" {
			// The test control plane's CRDs convert through the tests'
			// own webhook, named by URL; applying the Service that a
			// cluster's webhook is behind would leave both.
			// TestCRDsConvertThroughTheVerbsServer checks the manifests'.
			u = u.DeepCopy()
			unstructured.RemoveNestedField(u.Object, "spec", "conversion")
		}
		doc, err := yaml.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(doc))
		applied = append(applied, u)
	}
	file := filepath.Join(t.TempDir(), "machinist.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"apply", "--server-side", "-f", file}, flags...)
	out, err := env.Kubectl(ctx, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return out, applied
}

// applied is how kubectl apply names an object in its output:
// kind.group/name, lower case.
func applied(u *unstructured.Unstructured) string {
	gvk := u.GroupVersionKind()
	kind := strings.ToLower(gvk.Kind)
	if gvk.Group != "" {
		kind += "." + gvk.Group
	}
	return kind + "/" + u.GetName()
}

func TestServerDryRunAcceptsEveryObject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A server dry run of a namespaced object needs its namespace to
	// exist: create it for real first.
	apply(t, ctx, nil, "Namespace")

	out, objs := apply(t, ctx, []string{"--dry-run=server"})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, u := range objs {
		want := applied(u) + " serverside-applied (server dry run)"
		if !slices.Contains(lines, want) {
			t.Errorf("kubectl apply --server-side --dry-run=server does not report %q:\n%s", want, out)
		}
	}
	if len(lines) != len(objs) {
		t.Errorf("kubectl apply reported %d objects, want %d:\n%s", len(lines), len(objs), out)
	}

	// The documented command, kubectl apply -k (client-side apply), too,
	// as it is run first: on a cluster without Machinist (this one's CRDs
	// convert through the tests' webhook, named by URL, and a client-side
	// apply would add the manifests' Service beside it).
	fresh, err := testenv.StartWorkload()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fresh.Stop() }()
	if err := fresh.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	out, err = fresh.Kubectl(ctx, "apply", "-k", filepath.Join(env.Root, "config", "default"), "--dry-run=server")
	if err != nil {
		t.Fatalf("kubectl apply -k config/default --dry-run=server: %v\n%s", err, out)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	for _, u := range objs {
		if !slices.ContainsFunc(lines, func(line string) bool {
			return strings.HasPrefix(line, applied(u)+" ") && strings.HasSuffix(line, " (server dry run)")
		}) {
			t.Errorf("kubectl apply -k config/default --dry-run=server does not report %s:\n%s", applied(u), out)
		}
	}

	// Dry runs: nothing but the namespace exists.
	for _, obj := range []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "machinist-manager"}},
		&apiregv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: apiserver.APIServiceName}},
	} {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s after a dry run: %v, want NotFound", obj, obj.GetName(), err)
		}
	}
}

// canI asks kubectl auth can-i, as user, whether it may do what args say.
func canI(t *testing.T, ctx context.Context, user string, args ...string) bool {
	t.Helper()
	out, err := env.Kubectl(ctx, append([]string{"auth", "can-i", "--as=" + user}, args...)...)
	switch answer := strings.Fields(out); {
	case len(answer) > 0 && answer[0] == "yes" && err == nil:
		return true
	case len(answer) > 0 && answer[0] == "no":
		return false
	default:
		t.Fatalf("kubectl auth can-i %v as %s: %q, %v", args, user, out, err)
		return false
	}
}

func TestServiceAccountsMayDoWhatTheyNeed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// For real: can-i asks the authorizer, which reads stored RBAC.
	apply(t, ctx, nil, "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")

	const operator, viewer, stranger = "deploy-test-operator", "deploy-test-viewer", "deploy-test-stranger"
	const scraper, tenant = "deploy-test-scraper", "deploy-test-tenant"
	for user, role := range map[string]string{operator: "machinist-machine-operator", viewer: "machinist-viewer", scraper: "machinist-metrics-reader", tenant: "machinist-editor"} {
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		if err := env.Client.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}

	const (
		verbsAPIService = "apiservices.apiregistration.k8s.io/" + "v1alpha1.subresources.machinist.dev"
		authConfigMap   = "configmaps/extension-apiserver-authentication"
	)
	for _, tc := range []struct {
		user string
		args []string
		want bool
	}{
		// The verbs server: delegated authentication and authorization,
		// Machines, its own APIService's caBundle, the front-proxy CA.
		{verbsSA, []string{"create", "tokenreviews.authentication.k8s.io"}, true},
		{verbsSA, []string{"create", "subjectaccessreviews.authorization.k8s.io"}, true},
		{verbsSA, []string{"get", "machines.machinist.dev", "-A"}, true},
		{verbsSA, []string{"update", "machines.machinist.dev", "--subresource=status", "-A"}, true},
		{verbsSA, []string{"get", verbsAPIService}, true},
		{verbsSA, []string{"patch", verbsAPIService}, true},
		{verbsSA, []string{"get", authConfigMap, "-n", "kube-system"}, true},
		{verbsSA, []string{"list", authConfigMap, "-n", "kube-system"}, true},
		{verbsSA, []string{"watch", authConfigMap, "-n", "kube-system"}, true},
		// The disruption budgets: asked, and an admitted disruption
		// recorded in their status.
		{verbsSA, []string{"list", "machinedisruptionbudgets.machinist.dev", "-A"}, true},
		{verbsSA, []string{"list", "machines.machinist.dev", "-A"}, true},
		{verbsSA, []string{"update", "machinedisruptionbudgets.machinist.dev", "--subresource=status", "-A"}, true},
		// ... and no more than that.
		{verbsSA, []string{"update", "machinedisruptionbudgets.machinist.dev", "-A"}, false},
		{verbsSA, []string{"delete", "machinedisruptionbudgets.machinist.dev", "-A"}, false},
		{verbsSA, []string{"patch", "apiservices.apiregistration.k8s.io/v1.apps"}, false},
		{verbsSA, []string{"delete", verbsAPIService}, false},
		{verbsSA, []string{"get", "configmaps/kube-proxy", "-n", "kube-system"}, false},
		{verbsSA, []string{"get", "secrets", "-n", "kube-system"}, false},

		// The controllers, including leader election in their namespace.
		{managerSA, []string{"update", "machines.machinist.dev", "--subresource=status", "-A"}, true},
		{managerSA, []string{"create", "pods", "--subresource=eviction", "-A"}, true},
		{managerSA, []string{"create", "leases.coordination.k8s.io", "-n", namespace}, true},
		{managerSA, []string{"update", "leases.coordination.k8s.io", "-n", namespace}, true},
		{managerSA, []string{"create", "events", "-n", namespace}, true},
		{managerSA, []string{"create", "events.events.k8s.io", "-n", namespace}, true},
		{managerSA, []string{"watch", "machinedisruptionbudgets.machinist.dev", "-A"}, true},
		{managerSA, []string{"watch", "machinedrainrules.machinist.dev", "-A"}, true},
		{managerSA, []string{"update", "machinedrainrules.machinist.dev", "-A"}, false},
		{managerSA, []string{"list", "volumeattachments.storage.k8s.io"}, true},
		{managerSA, []string{"get", "namespaces"}, true},
		{managerSA, []string{"update", "machinedisruptionbudgets.machinist.dev", "--subresource=status", "-A"}, true},
		{managerSA, []string{"patch", verbsAPIService}, false},
		// Who scrapes its secure /metrics, and whether they may.
		{managerSA, []string{"create", "tokenreviews.authentication.k8s.io"}, true},
		{managerSA, []string{"create", "subjectaccessreviews.authorization.k8s.io"}, true},
		{managerSA, []string{"get", "/metrics"}, false},
		// Whether the request annotation's policy is in force, and no more.
		{managerSA, []string{"get", "validatingadmissionpolicies.admissionregistration.k8s.io/machinist-request"}, true},
		{managerSA, []string{"get", "validatingadmissionpolicybindings.admissionregistration.k8s.io/machinist-request"}, true},
		{managerSA, []string{"update", "validatingadmissionpolicybindings.admissionregistration.k8s.io/machinist-request"}, false},

		// WorkloadClusters: their status and finalizer are the manager's,
		// and it reads each one's kubeconfig Secret by name, never
		// listing or watching Secrets. It creates and deletes bootstrap
		// tokens in kube-system.
		{managerSA, []string{"watch", "workloadclusters.machinist.dev", "-A"}, true},
		{managerSA, []string{"patch", "workloadclusters.machinist.dev", "-A"}, true},
		{managerSA, []string{"update", "workloadclusters.machinist.dev", "--subresource=status", "-A"}, true},
		{managerSA, []string{"update", "workloadclusters.machinist.dev", "--subresource=finalizers", "-A"}, true},
		{managerSA, []string{"create", "workloadclusters.machinist.dev", "-A"}, false},
		{managerSA, []string{"delete", "workloadclusters.machinist.dev", "-A"}, false},
		{managerSA, []string{"get", "secrets/prod-kubeconfig", "-n", "fleet"}, true},
		{managerSA, []string{"create", "secrets", "-n", "kube-system"}, true},
		{managerSA, []string{"delete", "secrets", "-n", "kube-system"}, true},
		{managerSA, []string{"deletecollection", "secrets", "-n", "kube-system"}, false},
		{managerSA, []string{"list", "secrets", "-A"}, false},
		{managerSA, []string{"watch", "secrets", "-A"}, false},
		{managerSA, []string{"update", "secrets", "-n", "kube-system"}, false},
		// The ManagementCluster is the manager's to make and keep; its
		// join checks read and delete their own certificate request. A
		// tenant may not touch the cluster-scoped object.
		{managerSA, []string{"create", "managementclusters.machinist.dev"}, true},
		{managerSA, []string{"update", "managementclusters.machinist.dev", "--subresource=status"}, true},
		{managerSA, []string{"delete", "managementclusters.machinist.dev"}, false},
		{managerSA, []string{"delete", "certificatesigningrequests.certificates.k8s.io"}, true},
		{managerSA, []string{"update", "certificatesigningrequests.certificates.k8s.io", "--subresource=approval"}, false},
		{tenant, []string{"create", "managementclusters.machinist.dev"}, false},
		{tenant, []string{"patch", "managementclusters.machinist.dev", "--subresource=status"}, false},

		// People: patch on Machines is not the operator's; what lets them
		// reboot is the verbs (below), on either path.
		{operator, []string{"get", "machines.machinist.dev", "-A"}, true},
		{operator, []string{"patch", "machines.machinist.dev", "-A"}, false},
		{operator, []string{"patch", "machinedeployments.machinist.dev", "-A"}, true},
		{operator, []string{"list", "workloadclusters.machinist.dev", "-A"}, true},
		{operator, []string{"get", "secrets", "-A"}, false},
		// Adopting an instance that exists is the operator's, not the
		// tenant's (the admission policy machinist-adopt asks this).
		{operator, []string{"adopt", "machines.machinist.dev", "-n", "fleet"}, true},
		{tenant, []string{"adopt", "machines.machinist.dev", "-n", "fleet"}, false},
		// A tenant makes and changes Machinist's objects and scales sets,
		// but writes no status (an instance, a kept token, a phase), no
		// verbs and no Secrets.
		{tenant, []string{"create", "machines.machinist.dev", "-n", "fleet"}, true},
		{tenant, []string{"create", "workloadclusters.machinist.dev", "-n", "fleet"}, true},
		{tenant, []string{"update", "machinesets.machinist.dev", "--subresource=scale", "-n", "fleet"}, true},
		{tenant, []string{"update", "machines.machinist.dev", "--subresource=status", "-n", "fleet"}, false},
		{tenant, []string{"patch", "workloadclusters.machinist.dev", "--subresource=status", "-n", "fleet"}, false},
		{tenant, []string{"get", "secrets", "-n", "fleet"}, false},
		{tenant, []string{"get", "/metrics"}, false},
		// The manager keeps a repaired machine's token in its own
		// namespace.
		{managerSA, []string{"create", "secrets", "-n", namespace}, true},
		// A viewer sees WorkloadClusters and never the Secrets that hold
		// their credentials.
		{viewer, []string{"list", "workloadclusters.machinist.dev", "-A"}, true},
		{viewer, []string{"get", "workloadclusters.machinist.dev", "--subresource=status", "-A"}, true},
		{viewer, []string{"update", "workloadclusters.machinist.dev", "-A"}, false},
		{viewer, []string{"get", "secrets", "-A"}, false},
		{viewer, []string{"list", "secrets", "-A"}, false},
		// A scraper bound to the metrics reader gets /metrics and nothing
		// else; people bound to the other roles do not get it with them.
		{scraper, []string{"get", "/metrics"}, true},
		{scraper, []string{"get", "/logs"}, false},
		{scraper, []string{"list", "machines.machinist.dev", "-A"}, false},
		{scraper, []string{"get", "secrets", "-A"}, false},
		{viewer, []string{"get", "/metrics"}, false},
		{operator, []string{"get", "/metrics"}, false},
		{stranger, []string{"get", "/metrics"}, false},
	} {
		if got := canI(t, ctx, tc.user, tc.args...); got != tc.want {
			t.Errorf("kubectl auth can-i %s --as=%s: %v, want %v", strings.Join(tc.args, " "), tc.user, got, tc.want)
		}
	}

	// People: the operator role grants the verbs. kubectl auth can-i
	// cannot ask this: it resolves a resource through discovery, and
	// subresources.machinist.dev is discovered only while the verbs server
	// runs. Ask the question the verbs server itself asks kube-apiserver.
	for _, tc := range []struct {
		user, verb string
		want       bool
	}{
		{operator, subresourcesv1.Reboot, true},
		{operator, subresourcesv1.Repair, true},
		{stranger, subresourcesv1.Reboot, false},
		// The controllers remove the request annotation but never
		// request: the admission policy lets them through without it.
		{managerSA, subresourcesv1.Reboot, false},
	} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   tc.user,
			Groups: []string{"system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace:   "default",
				Verb:        "update",
				Group:       subresourcesv1.GroupName,
				Resource:    subresourcesv1.Machines,
				Subresource: tc.verb,
				Name:        "m1",
			},
		}}
		if err := env.Client.Create(ctx, review); err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != tc.want {
			t.Errorf("may %s update %s/%s in %s: %v (%s), want %v", tc.user, subresourcesv1.Machines, tc.verb, subresourcesv1.GroupName,
				review.Status.Allowed, review.Status.Reason, tc.want)
		}
	}
}
