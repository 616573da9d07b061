package machine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machine"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

// cutIn lets another writer act between the manager's read of a Node and
// its write: the first label patch of the Node the manager sends after
// arm waits until before has written, then goes on to kube-apiserver as
// it was. The write is real; only its moment is chosen.
type cutIn struct {
	next http.RoundTripper

	mu     sync.Mutex
	node   string
	before func() error
	// sent is the patch that was held back, once it has been.
	sent []byte
	err  error
}

func (c *cutIn) arm(node string, before func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.node, c.before = node, before
}

func (c *cutIn) held() ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent, c.err
}

func (c *cutIn) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	armed := c.before != nil && req.Method == http.MethodPatch && req.URL.Path == "/api/v1/nodes/"+c.node
	c.mu.Unlock()
	if !armed || req.Body == nil {
		return c.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if !bytes.Contains(body, []byte(`"/metadata/labels`)) {
		return c.next.RoundTrip(out)
	}
	c.mu.Lock()
	before := c.before
	c.before = nil
	c.sent = body
	c.mu.Unlock()
	if err := before(); err != nil {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
	}
	return c.next.RoundTrip(out)
}

// TestLabelsAnotherWriterPutOnALabellessNodeAreKept: the Machine controller
// reads a Node without labels and must add the Machine's; another writer
// labels the Node between that read and the controller's write. The
// controller's write must not replace the other writer's labels with its
// own: it is refused as a conflict and decided again from a fresh look.
func TestLabelsAnotherWriterPutOnALabellessNodeAreKept(t *testing.T) {
	e, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ctx := context.Background()

	cut := &cutIn{}
	cfg := rest.CopyConfig(e.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { cut.next = rt; return cut })
	c, err := e.StartControllersVia(cfg, manager.Options{
		Backoff:   machine.Backoff{Base: 50 * time.Millisecond, Cap: time.Second},
		DrainPoll: 200 * time.Millisecond,
	}, testenv.Leases{DurationSeconds: leaseSeconds, RenewInterval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })

	ns := e.NewNamespace(t, "labels", testenv.Small)
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m"},
		Spec:       machinistv1.MachineSpec{ClassRef: machinistv1.ClassReference{Name: testenv.Small.Name}, Version: "v1.37.2"},
	}
	if err := e.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the Machine Running on its Node", func() bool {
		return e.Client.Get(ctx, client.ObjectKeyFromObject(m), m) == nil &&
			m.Status.Phase == machinistv1.MachineRunning && m.Status.NodeRef != nil
	})
	nodeKey := client.ObjectKey{Name: m.Status.NodeRef.Name}

	// The Node loses every label, its hostname label too; neither the
	// class nor the Machine asks for one yet, so nothing puts one back.
	unlabel := client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/labels"}]`))
	if err := e.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeKey.Name}}, unlabel); err != nil {
		t.Fatal(err)
	}
	// The controller must read it so: the manager's cache shows the Node
	// without labels before the Machine asks for one.
	testenv.WaitFor(t, 30*time.Second, "the manager's cache to show the Node without labels", func() bool {
		var cached corev1.Node
		return c.Manager.GetClient().Get(ctx, nodeKey, &cached) == nil && len(cached.Labels) == 0
	})

	theirs := `{"metadata":{"labels":{"example.com/theirs":"yes"}}}`
	cut.arm(nodeKey.Name, func() error {
		return e.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeKey.Name}},
			client.RawPatch(types.MergePatchType, []byte(theirs)))
	})
	mine := `{"spec":{"nodeLabels":{"machinist.dev/mine":"yes"}}}`
	if err := e.Client.Patch(ctx, m, client.RawPatch(types.MergePatchType, []byte(mine))); err != nil {
		t.Fatal(err)
	}

	var node corev1.Node
	testenv.WaitFor(t, 30*time.Second, "the Machine's label on the Node", func() bool {
		return e.Client.Get(ctx, nodeKey, &node) == nil && node.Labels["machinist.dev/mine"] == "yes"
	})
	sent, err := cut.held()
	if err != nil {
		t.Fatalf("the other writer's label: %v", err)
	}
	// The controller read the Node without labels, so its first write
	// sets the whole map: the write this test is about.
	var ops []struct {
		Op, Path string
	}
	if err := json.Unmarshal(sent, &ops); err != nil {
		t.Fatalf("the controller's label patch %s: %v", sent, err)
	}
	whole := false
	for _, op := range ops {
		whole = whole || (op.Op == "add" && op.Path == "/metadata/labels")
	}
	if !whole {
		t.Fatalf("the controller's first label patch, %s, does not set the whole map: it did not read the Node without labels, so this test proves nothing", sent)
	}
	if node.Labels["example.com/theirs"] != "yes" {
		t.Fatalf("the Node's labels became %v: the label another writer added after the controller read the Node was written over (the patch was %s)",
			node.Labels, strings.TrimSpace(string(sent)))
	}
	// Nothing later undoes it either: a stale write would show within
	// a few reconciles.
	time.Sleep(2 * time.Second)
	if err := e.Client.Get(ctx, nodeKey, &node); err != nil {
		t.Fatal(err)
	}
	if node.Labels["example.com/theirs"] != "yes" || node.Labels["machinist.dev/mine"] != "yes" {
		t.Fatalf("the Node's labels are %v, want both the other writer's and the Machine's", node.Labels)
	}
}
