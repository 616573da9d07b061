package monitoring_test

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/machinist-dev/machinist/dev/testenv"
)

// TestServiceMonitorScrapesTheManager renders config/prometheus and
// config/default with the real kubectl and follows the ServiceMonitor to
// the manager: its port names a port of the one Service it selects in its
// namespace, which sends it to the container port the manager's
// --metrics-bind-address listens on, and it scrapes /metrics with the
// scheme the manager serves (HTTPS with a bearer token when the manager
// runs with --metrics-secure).
func TestServiceMonitorScrapesTheManager(t *testing.T) {
	monitors := kustomize(t, "prometheus")
	deployed := kustomize(t, "default")

	var sm *unstructured.Unstructured
	for _, u := range monitors {
		if u.GetKind() == "ServiceMonitor" {
			if sm != nil {
				t.Fatalf("config/prometheus renders ServiceMonitors %s and %s, want one", sm.GetName(), u.GetName())
			}
			sm = u
		}
	}
	if sm == nil {
		t.Fatal("config/prometheus renders no ServiceMonitor")
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("ServiceMonitor %s has %d endpoints, want 1", sm.GetName(), len(endpoints))
	}
	endpoint, _ := endpoints[0].(map[string]any)
	str := func(fields ...string) string {
		v, _, _ := unstructured.NestedString(endpoint, fields...)
		return v
	}
	matchLabels, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if len(matchLabels) == 0 {
		t.Fatalf("ServiceMonitor %s selects every Service", sm.GetName())
	}

	var services []*corev1.Service
	var manager *appsv1.Deployment
	for _, u := range deployed {
		switch {
		case u.GetKind() == "Service" && u.GetNamespace() == sm.GetNamespace() && labels.SelectorFromSet(matchLabels).Matches(labels.Set(u.GetLabels())):
			services = append(services, typed[corev1.Service](t, u))
		case u.GetKind() == "Deployment" && u.GetName() == "machinist-manager":
			manager = typed[appsv1.Deployment](t, u)
		}
	}
	if len(services) != 1 {
		t.Fatalf("ServiceMonitor %s selects %d Services in %s, want the manager's metrics Service", sm.GetName(), len(services), sm.GetNamespace())
	}
	if manager == nil {
		t.Fatal("config/default renders no Deployment machinist-manager")
	}
	svc := services[0]
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(manager.Spec.Template.Labels)) {
		t.Fatalf("Service %s does not select the manager's pods", svc.Name)
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == str("port") })
	if i < 0 {
		t.Fatalf("ServiceMonitor %s scrapes port %q, which Service %s does not name: %+v", sm.GetName(), str("port"), svc.Name, svc.Spec.Ports)
	}
	target := svc.Spec.Ports[i].TargetPort
	c := manager.Spec.Template.Spec.Containers[0]
	j := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == target.String() || p.ContainerPort == target.IntVal
	})
	if j < 0 {
		t.Fatalf("Service %s sends port %s to %s, which the manager's container does not name: %+v", svc.Name, str("port"), target.String(), c.Ports)
	}
	var bind string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--metrics-bind-address="); ok {
			bind = v
		}
	}
	if want := ":" + strconv.Itoa(int(c.Ports[j].ContainerPort)); !strings.HasSuffix(bind, want) {
		t.Errorf("the manager serves /metrics on %q, the Service sends scrapes to container port %d", bind, c.Ports[j].ContainerPort)
	}

	if str("path") != "/metrics" {
		t.Errorf("ServiceMonitor %s scrapes path %q, want /metrics", sm.GetName(), str("path"))
	}
	if !slices.Contains(c.Args, "--metrics-secure") {
		t.Fatalf("the manager's args %q lack --metrics-secure: config/default must serve /metrics to authorized scrapers only", c.Args)
	}
	if str("scheme") != "https" {
		t.Errorf("ServiceMonitor %s scrapes with scheme %q, the manager serves https", sm.GetName(), str("scheme"))
	}
	_, hasAuthorization := endpoint["authorization"]
	if str("bearerTokenFile") == "" && !hasAuthorization {
		t.Errorf("ServiceMonitor %s sends no bearer token, which the manager's secure /metrics refuses (401)", sm.GetName())
	}
}

// kustomize renders config/<dir> with the real kubectl.
func kustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := env.Kubectl(ctx, "kustomize", filepath.Join(testenv.Root(), "config", dir))
	if err != nil {
		t.Fatalf("kubectl kustomize config/%s: %v", dir, err)
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decoding config/%s: %v", dir, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// typed converts a rendered object to its Go type, refusing unknown fields.
func typed[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	obj := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, obj, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return obj
}
