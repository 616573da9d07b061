package migration_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/migration"
)

var env *testenv.Env

// The control plane runs kube-controller-manager with its storage version
// migrator, as `machinist run` does.
func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithOptions(m, testenv.Options{ControllerManager: true}, func(e *testenv.Env) (func(), error) {
		env = e
		return nil, nil
	}))
}

// twoVersions installs a CRD of its own group, served at v1 and v2 (the
// same schema, so no conversion is needed) and stored at v1, with n
// objects made at v1; then makes v2 the storage version, as an upgrade
// does. storedVersions lists both after.
func twoVersions(t *testing.T, ctx context.Context, env *testenv.Env, group string, n int) (*apiextensionsv1.CustomResourceDefinition, dynamic.NamespaceableResourceInterface) {
	t.Helper()
	return twoVersionsOf(t, ctx, env, group, "Widget", n)
}

// twoVersionsOf is twoVersions of a kind of another name, for a group of
// several CRDs.
func twoVersionsOf(t *testing.T, ctx context.Context, env *testenv.Env, group, kind string, n int) (*apiextensionsv1.CustomResourceDefinition, dynamic.NamespaceableResourceInterface) {
	t.Helper()
	singular := strings.ToLower(kind)
	plural := singular + "s"
	ext := apiextensions.NewForConfigOrDie(env.Config)
	schemaOf := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"spec": {Type: "object", XPreserveUnknownFields: ptr.To(true)},
		},
	}}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Singular: singular, Kind: kind, ListKind: kind + "List"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1", Served: true, Storage: true, Schema: schemaOf},
				{Name: "v2", Served: true, Storage: false, Schema: schemaOf},
			},
		},
	}
	crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ext.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), crd.Name, metav1.DeleteOptions{})
	})
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("the CRD is not established: %v", err)
	}
	dyn := dynamic.NewForConfigOrDie(env.Config)
	r := dyn.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: plural})
	ns, err := env.Namespace(ctx, "migrate")
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		w := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": group + "/v1", "kind": kind,
			"metadata": map[string]any{"name": fmt.Sprintf("w%d", i), "namespace": ns},
			"spec":     map[string]any{"size": int64(i)},
		}}
		// Kept over a create until the new version is served: right after
		// the CRD is established its resource may still be missing.
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := r.Namespace(ns).Create(ctx, w, metav1.CreateOptions{})
			return err == nil, nil
		}); err != nil {
			t.Fatalf("creating widget %d: %v", i, err)
		}
	}
	// The upgrade: v2 becomes the storage version.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got.Spec.Versions[0].Storage, got.Spec.Versions[1].Storage = false, true
		crd, err = ext.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, got, metav1.UpdateOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := crd.Status.StoredVersions; !slices.Equal(got, []string{"v1", "v2"}) {
		t.Fatalf("storedVersions after the storage version changed: %v, want [v1 v2]", got)
	}
	return crd, dyn.Resource(schema.GroupVersionResource{Group: group, Version: "v2", Resource: plural})
}

// rewrites counts, per object, the writes a watch sees while run runs.
// kube-apiserver skips a write whose encoding equals what is stored, so
// an object written back unchanged is seen modified only if it was stored
// at another version.
func rewrites(t *testing.T, ctx context.Context, r dynamic.NamespaceableResourceInterface, run func()) map[string]int {
	t.Helper()
	list, err := r.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := r.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	run()
	// A write is seen within moments of its reply; each object was
	// written before run returned.
	out := map[string]int{}
	for _, o := range list.Items {
		out[o.GetName()] = 0
	}
	quiet := time.After(2 * time.Second)
	for {
		select {
		case e := <-w.ResultChan():
			if e.Type == watch.Modified {
				out[e.Object.(*unstructured.Unstructured).GetName()]++
			}
		case <-quiet:
			return out
		}
	}
}

// statusWriters names the managers of the CRD's status.
func statusWriters(t *testing.T, ctx context.Context, name string) []string {
	t.Helper()
	crd, err := apiextensions.NewForConfigOrDie(env.Config).ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range crd.ManagedFields {
		if f.Subresource == "status" {
			out = append(out, f.Manager)
		}
	}
	return out
}

func storedVersions(t *testing.T, ctx context.Context, name string) []string {
	t.Helper()
	crd, err := apiextensions.NewForConfigOrDie(env.Config).ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return crd.Status.StoredVersions
}

// migrate makes a CRD of group with n objects stored at v1, moves its
// storage version to v2, and runs the migration with opts on cfg. It
// checks what holds whichever way the objects were written back: one
// result, from [v1 v2] to v2, and storedVersions [v2] after. It returns
// the result and each object's writes seen meanwhile.
func migrate(t *testing.T, ctx context.Context, cfg *rest.Config, group string, n int, opts migration.Options) (string, migration.Result, map[string]int) {
	t.Helper()
	crd, r := twoVersions(t, ctx, env, group, n)
	opts.Group, opts.Poll, opts.Log = group, 200*time.Millisecond, t.Logf
	var results []migration.Result
	written := rewrites(t, ctx, r, func() {
		var err error
		if results, err = migration.Run(ctx, cfg, opts); err != nil {
			t.Fatal(err)
		}
	})
	if len(results) != 1 || results[0].CRD != crd.Name || results[0].Storage != "v2" || !slices.Equal(results[0].Before, []string{"v1", "v2"}) {
		t.Fatalf("results %+v, want one for %s from [v1 v2] to v2", results, crd.Name)
	}
	if got := storedVersions(t, ctx, crd.Name); !slices.Equal(got, []string{"v2"}) {
		t.Errorf("storedVersions after the migration: %v, want [v2]", got)
	}
	if len(written) != n {
		t.Fatalf("%d objects, want %d", len(written), n)
	}
	return crd.Name, results[0], written
}

func writtenOnce(t *testing.T, written map[string]int, except ...string) {
	t.Helper()
	for name, times := range written {
		if times != 1 && !slices.Contains(except, name) {
			t.Errorf("%s was written %d times by the migration, want once", name, times)
		}
	}
}

func TestMigratedByKubeControllerManager(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const group = "svm.tests.machinist.dev"
	crd, res, written := migrate(t, ctx, env.Config, group, 25, migration.Options{})
	if res.Migration == "" || res.Rewritten != 0 {
		t.Errorf("result %+v, want a StorageVersionMigration and nothing written by the command", res)
	}
	writtenOnce(t, written)
	if by := statusWriters(t, ctx, crd); slices.Contains(by, migration.FieldManager) {
		t.Errorf("storedVersions was set by %v; want kube-controller-manager's migrator to have set it", by)
	}
	// Run again: nothing to do, nothing asked for.
	again, err := migration.Run(ctx, env.Config, migration.Options{Group: group})
	if err != nil || len(again) != 1 || again[0].Needed() || again[0].Migration != "" {
		t.Errorf("a second run: %+v, %v; want nothing needed and nothing done", again, err)
	}
}

func TestMigratedByClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 25
	crd, res, written := migrate(t, ctx, env.Config, "client.tests.machinist.dev", n, migration.Options{ByClient: true})
	if res.Migration != "" || res.Rewritten != n {
		t.Errorf("result %+v, want %d objects written back by the command", res, n)
	}
	writtenOnce(t, written)
	if by := statusWriters(t, ctx, crd); !slices.Contains(by, migration.FieldManager) {
		t.Errorf("storedVersions was set by %v; want %s", by, migration.FieldManager)
	}
}

// meanwhile is a transport that, just before the command writes back w3
// and w4, has someone else change w3 and delete w4: the command's writes
// then conflict and find nothing.
type meanwhile struct {
	next http.RoundTripper
	do   map[string]func(ns string) // by object name
}

func (m meanwhile) RoundTrip(req *http.Request) (*http.Response, error) {
	// .../namespaces/<ns>/widgets/<name>
	parts := strings.Split(req.URL.Path, "/")
	if n := len(parts); req.Method == http.MethodPut && n >= 4 && parts[n-4] == "namespaces" {
		if f := m.do[parts[n-1]]; f != nil {
			f(parts[n-3])
		}
	}
	return m.next.RoundTrip(req)
}

// An object written or deleted by someone else while the command rewrites
// the objects is left as that writer left it: written at the storage
// version by them, or gone; the command neither fails nor writes it again.
func TestWrittenMeanwhileIsLeftAsItIs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const group, n = "meanwhile.tests.machinist.dev", 10
	other := dynamic.NewForConfigOrDie(env.Config).Resource(schema.GroupVersionResource{Group: group, Version: "v2", Resource: "widgets"})
	var ns string
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return meanwhile{next: rt, do: map[string]func(string){
			"w3": func(in string) {
				ns = in
				patch := []byte(`{"spec":{"size":100}}`)
				if _, err := other.Namespace(ns).Patch(ctx, "w3", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
					t.Errorf("changing w3 meanwhile: %v", err)
				}
			},
			"w4": func(ns string) {
				if err := other.Namespace(ns).Delete(ctx, "w4", metav1.DeleteOptions{}); err != nil {
					t.Errorf("deleting w4 meanwhile: %v", err)
				}
			},
		}}
	})
	_, res, written := migrate(t, ctx, cfg, group, n, migration.Options{ByClient: true})
	if res.Rewritten != n-2 {
		t.Errorf("rewritten %d, want %d: all but the one changed and the one deleted meanwhile", res.Rewritten, n-2)
	}
	writtenOnce(t, written, "w4")
	if written["w4"] != 0 {
		t.Errorf("w4, deleted meanwhile, was written %d times", written["w4"])
	}
	w3, err := other.Namespace(ns).Get(ctx, "w3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if size, _, _ := unstructured.NestedInt64(w3.Object, "spec", "size"); size != 100 {
		t.Errorf("w3's size is %d, want 100: the other writer's change was overwritten", size)
	}
}

// Where the StorageVersionMigration API is served but no controller
// carries it out, the command says what to do instead of waiting in
// silence, and the CRDs still list both versions. It asked for both CRDs'
// migrations before it waited for either: one after the other, it would
// never have asked for the second.
func TestWithoutTheMigratorItSaysSo(t *testing.T) {
	alone, err := testenv.StartWith(testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = alone.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const group = "alone.tests.machinist.dev"
	gadgets, _ := twoVersionsOf(t, ctx, alone, group, "Gadget", 2)
	widgets, _ := twoVersions(t, ctx, alone, group, 3)
	short, stop := context.WithTimeout(ctx, 5*time.Second)
	defer stop()
	results, err := migration.Run(short, alone.Config, migration.Options{Group: group, Poll: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "storage-version-migrator-controller") || !strings.Contains(err.Error(), "--by-client") {
		t.Fatalf("Run without a migrator: %v; want an error naming the controller and --by-client", err)
	}
	for _, crd := range []*apiextensionsv1.CustomResourceDefinition{gadgets, widgets} {
		if !strings.Contains(err.Error(), crd.Name) {
			t.Errorf("the error does not name %s: %v", crd.Name, err)
		}
	}
	if len(results) != 2 || results[0].Migration == "" || results[1].Migration == "" {
		t.Errorf("results %+v, want both migrations asked for and named", results)
	}
	asked, err := kubernetes.NewForConfigOrDie(alone.Config).StoragemigrationV1().StorageVersionMigrations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(asked.Items) != 2 {
		t.Errorf("%d StorageVersionMigrations asked for, want 2 (one per CRD)", len(asked.Items))
	}
	for _, crd := range []*apiextensionsv1.CustomResourceDefinition{gadgets, widgets} {
		got, err := apiextensions.NewForConfigOrDie(alone.Config).ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Status.StoredVersions, []string{"v1", "v2"}) {
			t.Errorf("%s: storedVersions %v after a migration that did not run, want [v1 v2]", crd.Name, got.Status.StoredVersions)
		}
	}
}

// Machinist's own CRDs, each stored at its only version, need nothing.
func TestMachinistNeedsNothingYet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	results, err := migration.Run(ctx, env.Config, migration.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) < 8 {
		t.Fatalf("%d Machinist CRDs found, want every one: %+v", len(results), results)
	}
	for _, r := range results {
		if r.Needed() || r.Migration != "" || r.Rewritten != 0 {
			t.Errorf("%s: %+v, want nothing needed and nothing done", r.CRD, r)
		}
	}
}
