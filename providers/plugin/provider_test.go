package plugin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/pki"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/plugin"
	providerv1 "github.com/machinist-dev/machinist/providers/plugin/v1"
)

// recorder is an Actuator that records what reached it and answers what
// the test sets.
type recorder struct {
	mu      sync.Mutex
	calls   []string
	machine *machinistv1.Machine
	class   *machinistv1.MachineClass
	join    providers.Join
	op      providers.Operation
	err     error
	block   bool
	inPlace bool
	blocked chan error
}

func (r *recorder) record(call string) error {
	r.mu.Lock()
	r.calls = append(r.calls, call)
	err := r.err
	r.mu.Unlock()
	return err
}

func (r *recorder) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func (r *recorder) Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	r.mu.Lock()
	r.machine, r.class, r.join = m, class, join
	r.mu.Unlock()
	if r.block {
		<-ctx.Done()
		r.blocked <- ctx.Err()
		return "", ctx.Err()
	}
	return "test://" + string(m.UID), r.record("Create")
}

func (r *recorder) Exists(_ context.Context, id string) (bool, error) {
	return id == "test://there", r.record("Exists " + id)
}

func (r *recorder) Delete(_ context.Context, id string) error { return r.record("Delete " + id) }

func (r *recorder) FindByUID(_ context.Context, uid types.UID) (string, error) {
	return "test://" + string(uid), r.record("FindByUID " + string(uid))
}

func (r *recorder) operation(call, id string, op providers.Operation) error {
	r.mu.Lock()
	r.op = op
	r.mu.Unlock()
	return r.record(call + " " + id)
}

func (r *recorder) Reboot(_ context.Context, id string, op providers.Operation) error {
	return r.operation("Reboot", id, op)
}

func (r *recorder) Repair(_ context.Context, id string, op providers.Operation) error {
	return r.operation("Repair", id, op)
}

func (r *recorder) Update(_ context.Context, id string, op providers.Operation) error {
	return r.operation("Update", id, op)
}

func (r *recorder) InPlace(c providers.Change) bool { return r.inPlace && !c.Class }

// owner is the Machine test://on and test://off belong to.
var owner = providers.Owner{Namespace: "ns", Name: "m1", UID: "uid-1"}

// Describe reports test://on running boot-1 and test://off off, both
// owner's; any other instance the recorder cannot tell.
func (r *recorder) Describe(_ context.Context, id string) (providers.Instance, error) {
	in := map[string]providers.Instance{
		"test://on":  {Power: providers.PowerOn, BootID: "boot-1", Owner: owner},
		"test://off": {Power: providers.PowerOff, Owner: owner},
		"test://joining": {Power: providers.PowerOn, BootID: "boot-2", Owner: owner,
			JoinFailure: &providers.JoinFailure{Reason: machinistv1.ReasonJoinForbidden, Message: "forbidden (403):\trun prepare"}},
		"test://lying": {Power: providers.PowerOn, BootID: "boot-3", Owner: owner,
			JoinFailure: &providers.JoinFailure{Reason: "Anything", Message: "a reason the manager does not know"}},
		"test://addressed": {Power: providers.PowerOn, BootID: "boot-4", Owner: owner,
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: "m1"}}},
		"test://misaddressed": {Power: providers.PowerOn, BootID: "boot-5", Owner: owner,
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "m1.example.com"}}},
		"test://untyped": {Power: providers.PowerOn, BootID: "boot-6", Owner: owner,
			Addresses: []corev1.NodeAddress{{Type: "Anywhere", Address: "127.0.0.1"}}},
	}[id]
	return in, r.record("Describe " + id)
}

// serve offers a on a socket in a temporary directory until the test ends.
func serve(t *testing.T, a providers.Actuator, opts plugin.ServeOptions) string {
	t.Helper()
	endpoint := "unix://" + filepath.Join(t.TempDir(), "p.sock")
	serveAt(t, endpoint, a, opts)
	return endpoint
}

// serveAt listens before it returns, so that the first call finds the
// provider.
func serveAt(t *testing.T, endpoint string, a providers.Actuator, opts plugin.ServeOptions) {
	t.Helper()
	e, err := plugin.ParseEndpoint(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := plugin.Listen(e)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := plugin.NewServer(a, opts)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
}

func dial(t *testing.T, name, endpoint string, opts plugin.DialOptions) *plugin.Client {
	t.Helper()
	c, err := plugin.Dial(name, endpoint, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func testMachine() (*machinistv1.Machine, *machinistv1.MachineClass) {
	m := &machinistv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "m1", Namespace: "ns", UID: "uid-1", Labels: map[string]string{"pool": "a"}},
		Spec:       machinistv1.MachineSpec{Version: "v1.37.2", ClassRef: machinistv1.ClassReference{Name: "small"}},
	}
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: "ns"},
		Spec:       machinistv1.MachineClassSpec{Provider: "test", ProviderSpec: runtime.RawExtension{Raw: []byte(`{"size":"xl"}`)}},
	}
	return m, class
}

func TestEveryCallReachesTheActuatorWithWhatItNeeds(t *testing.T) {
	rec := &recorder{inPlace: true}
	c := dial(t, "test", serve(t, rec, plugin.ServeOptions{Name: "test"}), plugin.DialOptions{})
	ctx := context.Background()
	m, class := testMachine()

	join := testJoin("abcdef.0123456789abcdef")
	id, err := c.Create(ctx, m, class, join)
	if err != nil || id != "test://uid-1" {
		t.Fatalf("Create = %q, %v", id, err)
	}
	if !sameJoin(rec.join, join) {
		t.Errorf("the provider got %v (CA %q), want %v", rec.join, rec.join.CAData, join)
	}
	if rec.machine.Name != "m1" || rec.machine.Namespace != "ns" || rec.machine.UID != "uid-1" ||
		rec.machine.Spec.Version != "v1.37.2" || rec.machine.Labels["pool"] != "a" || rec.machine.Kind != "Machine" {
		t.Errorf("the provider got machine %+v", rec.machine)
	}
	if rec.class.Spec.Provider != "test" || string(rec.class.Spec.ProviderSpec.Raw) != `{"size":"xl"}` || rec.class.Kind != "MachineClass" {
		t.Errorf("the provider got class %+v", rec.class)
	}
	if ok, err := c.Exists(ctx, "test://there"); !ok || err != nil {
		t.Errorf("Exists = %v, %v", ok, err)
	}
	if ok, err := c.Exists(ctx, "test://gone"); ok || err != nil {
		t.Errorf("Exists(gone) = %v, %v", ok, err)
	}
	if id, err := c.FindByUID(ctx, "uid-9"); id != "test://uid-9" || err != nil {
		t.Errorf("FindByUID = %q, %v", id, err)
	}
	if err := c.Reboot(ctx, "test://a", providers.Operation{ID: "op1", Hard: true}); err != nil || !sameOp(rec.op, providers.Operation{ID: "op1", Hard: true}) {
		t.Errorf("Reboot: %v, op %+v", err, rec.op)
	}
	again := testJoin("ghijkl.fedcba9876543210")
	if err := c.Repair(ctx, "test://a", providers.Operation{ID: "op2", Join: again}); err != nil || !sameOp(rec.op, providers.Operation{ID: "op2", Join: again}) {
		t.Errorf("Repair: %v, op %+v", err, rec.op)
	}
	if err := c.Update(ctx, "test://a", providers.Operation{ID: "op3", Version: "v1.38.0"}); err != nil || !sameOp(rec.op, providers.Operation{ID: "op3", Version: "v1.38.0"}) {
		t.Errorf("Update: %v, op %+v", err, rec.op)
	}
	for _, d := range []struct {
		id   string
		want providers.Instance
	}{
		{"test://a", providers.Instance{}},
		{"test://off", providers.Instance{Power: providers.PowerOff, Owner: owner}},
		{"test://on", providers.Instance{Power: providers.PowerOn, BootID: "boot-1", Owner: owner}},
		// A join's failure crosses, held to one line; one of a reason the
		// manager does not know does not.
		{"test://joining", providers.Instance{Power: providers.PowerOn, BootID: "boot-2", Owner: owner,
			JoinFailure: &providers.JoinFailure{Reason: machinistv1.ReasonJoinForbidden, Message: "forbidden (403): run prepare"}}},
		{"test://lying", providers.Instance{Power: providers.PowerOn, BootID: "boot-3", Owner: owner}},
	} {
		if in, err := c.Describe(ctx, d.id); !reflect.DeepEqual(in, d.want) || err != nil {
			t.Errorf("Describe(%s) = %+v, %v; want %+v", d.id, in, err, d.want)
		}
	}
	if err := c.Delete(ctx, "test://a"); err != nil {
		t.Errorf("Delete: %v", err)
	}
	want := []string{"Create", "Exists test://there", "Exists test://gone", "FindByUID uid-9", "Reboot test://a", "Repair test://a", "Update test://a",
		"Describe test://a", "Describe test://off", "Describe test://on", "Describe test://joining", "Describe test://lying", "Delete test://a"}
	if got := rec.Calls(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("calls = %q, want %q", got, want)
	}
	if !c.InPlace(providers.Change{Version: true}) || c.InPlace(providers.Change{Class: true}) || c.InPlace(providers.Change{Version: true, Class: true}) {
		t.Error("InPlace does not follow the declared changes (version only)")
	}
}

func TestErrorsKeepTheirMeaningAcrossTheWire(t *testing.T) {
	takenStatus, err := status.New(codes.FailedPrecondition, "that one is not yours").
		WithDetails(&providerv1.Failure{Permanent: true, Reason: plugin.ReasonInstanceTaken})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name                          string
		err                           error
		permanent, unavailable, taken bool
	}{
		{"permanent", providers.Permanent(errors.New("no such image")), true, false, false},
		{"transient", errors.New("out of capacity, try later"), false, false, false},
		{"a status code that means permanent", status.Error(codes.NotFound, "no instance"), true, false, false},
		{"a status code that means transient", status.Error(codes.Internal, "boom"), false, false, false},
		{"the provider's own unavailability is not the client's", status.Error(codes.ResourceExhausted, "quota"), false, false, false},
		{"taken", providers.Permanent(fmt.Errorf("cannot adopt: %w", providers.ErrTaken)), true, false, true},
		{"taken, though not marked permanent", fmt.Errorf("cannot adopt: %w", providers.ErrTaken), true, false, true},
		{"taken, as a provider in another language says it", takenStatus.Err(), true, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{err: tc.err}
			c := dial(t, "test", serve(t, rec, plugin.ServeOptions{Name: "test"}), plugin.DialOptions{})
			err := c.Delete(context.Background(), "test://a")
			if err == nil {
				t.Fatal("no error")
			}
			if providers.IsPermanent(err) != tc.permanent || providers.IsUnavailable(err) != tc.unavailable || providers.IsTaken(err) != tc.taken {
				t.Errorf("%v: permanent %v, unavailable %v, taken %v; want %v, %v, %v", err, providers.IsPermanent(err), providers.IsUnavailable(err), providers.IsTaken(err), tc.permanent, tc.unavailable, tc.taken)
			}
			if !strings.Contains(err.Error(), status.Convert(tc.err).Message()) {
				t.Errorf("the error lost the provider's message: %v", err)
			}
			if !strings.Contains(err.Error(), "provider test") || !strings.Contains(err.Error(), "Delete") {
				t.Errorf("the error does not say who failed at what: %v", err)
			}
		})
	}
}

func TestAnUndeclaredVerbIsRefusedWithoutReachingTheActuator(t *testing.T) {
	rec := &recorder{inPlace: true}
	endpoint := serve(t, rec, plugin.ServeOptions{Name: "test", Verbs: []providerv1.Verb{plugin.VerbReboot}})
	c := dial(t, "test", endpoint, plugin.DialOptions{})
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"repair": func() error { return c.Repair(ctx, "test://a", providers.Operation{ID: "x"}) },
		"update": func() error { return c.Update(ctx, "test://a", providers.Operation{ID: "x", Version: "v1.38.0"}) },
	} {
		err := call()
		if !providers.IsPermanent(err) || !errors.Is(err, plugin.ErrNotDeclared) {
			t.Errorf("%s: %v, want a permanent refusal", name, err)
		}
	}
	if c.InPlace(providers.Change{Version: true}) {
		t.Error("InPlace is true though update is not declared")
	}
	// A client that does not check first is refused by the server.
	conn, err := grpc.NewClient(strings.Replace(endpoint, "unix://", "unix:", 1), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, err = providerv1.NewMachineServiceClient(conn).Repair(ctx, &providerv1.RepairRequest{ProviderId: "test://a", OperationId: "x"})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("raw Repair: %v, want Unimplemented", err)
	}
	if err := c.Reboot(ctx, "test://a", providers.Operation{ID: "y"}); err != nil {
		t.Errorf("a declared verb: %v", err)
	}
	if got := rec.Calls(); len(got) != 1 || got[0] != "Reboot test://a" {
		t.Errorf("the actuator saw %q; only the declared reboot should reach it", got)
	}
}

func TestBadRequestsAreRefusedAsInvalid(t *testing.T) {
	rec := &recorder{inPlace: true}
	endpoint := serve(t, rec, plugin.ServeOptions{Name: "test"})
	conn, err := grpc.NewClient(strings.Replace(endpoint, "unix://", "unix:", 1), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	machines := providerv1.NewMachineServiceClient(conn)
	ctx := context.Background()
	checks := map[string]error{}
	_, checks["create without a UID"] = machines.Create(ctx, &providerv1.CreateRequest{Machine: []byte(`{}`)})
	_, checks["create with a UID the machine does not have"] = machines.Create(ctx, &providerv1.CreateRequest{MachineUid: "a", Machine: []byte(`{"metadata":{"uid":"b"}}`)})
	_, checks["create with a machine that is not JSON"] = machines.Create(ctx, &providerv1.CreateRequest{MachineUid: "a", Machine: []byte(`{`)})
	_, checks["reboot without an operation ID"] = machines.Reboot(ctx, &providerv1.RebootRequest{ProviderId: "test://a"})
	_, checks["update without a version"] = machines.Update(ctx, &providerv1.UpdateRequest{ProviderId: "test://a", OperationId: "x"})
	_, checks["delete without a provider ID"] = machines.Delete(ctx, &providerv1.DeleteRequest{})
	for name, err := range checks {
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if got := rec.Calls(); len(got) != 0 {
		t.Errorf("bad requests reached the actuator: %q", got)
	}
}

func TestAProviderThatIsNotThereIsUnavailableUntilItComes(t *testing.T) {
	endpoint := "unix://" + filepath.Join(t.TempDir(), "later.sock")
	c := dial(t, "test", endpoint, plugin.DialOptions{Timeout: 2 * time.Second})
	m, class := testMachine()
	_, err := c.Create(context.Background(), m, class, testJoin("abcdef.0123456789abcdef"))
	if !providers.IsUnavailable(err) || providers.IsPermanent(err) {
		t.Fatalf("Create with no provider: %v, want Unavailable", err)
	}
	serveAt(t, endpoint, &recorder{}, plugin.ServeOptions{Name: "test"})
	testenv.WaitFor(t, 10*time.Second, "Create to succeed once the provider came", func() error {
		id, err := c.Create(context.Background(), m, class, testJoin("abcdef.0123456789abcdef"))
		if err == nil && id != "test://uid-1" {
			err = fmt.Errorf("Create returned %q", id)
		}
		return err
	})
}

func TestAnEndpointServingAnotherProviderIsNotUsed(t *testing.T) {
	rec := &recorder{}
	c := dial(t, "cloud", serve(t, rec, plugin.ServeOptions{Name: "other"}), plugin.DialOptions{})
	m, class := testMachine()
	_, err := c.Create(context.Background(), m, class, testJoin("abcdef.0123456789abcdef"))
	if !providers.IsUnavailable(err) || !strings.Contains(err.Error(), `serves provider "other"`) {
		t.Errorf("Create: %v, want Unavailable naming the provider found", err)
	}
	if len(rec.Calls()) != 0 {
		t.Errorf("the wrong provider was asked: %q", rec.Calls())
	}
}

func TestACallIsBoundedByTheTimeoutAndCancelsTheProvidersWork(t *testing.T) {
	rec := &recorder{block: true, blocked: make(chan error, 1)}
	c := dial(t, "test", serve(t, rec, plugin.ServeOptions{Name: "test"}), plugin.DialOptions{Timeout: 300 * time.Millisecond})
	m, class := testMachine()
	start := time.Now()
	_, err := c.Create(context.Background(), m, class, testJoin("abcdef.0123456789abcdef"))
	if err == nil || providers.IsPermanent(err) || providers.IsUnavailable(err) {
		t.Fatalf("Create past its deadline: %v, want a transient error", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Create took %s with a 300ms timeout", took)
	}
	select {
	case err := <-rec.blocked:
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Errorf("the provider's context ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the provider's context did not end with the call")
	}
}

func TestServeStopsWithItsContextAndRemovesTheSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.sock")
	// A socket file left by a killed provider does not stop a new one.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- plugin.Serve(ctx, "unix://"+path, &recorder{}, plugin.ServeOptions{Name: "test"}) }()
	c := dial(t, "test", "unix://"+path, plugin.DialOptions{})
	testenv.WaitFor(t, 5*time.Second, "the provider serving", func() error {
		_, err := c.Info(context.Background())
		return err
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

func TestTCPNeedsMutualTLS(t *testing.T) {
	dir := t.TempDir()
	files := func(ca *pki.CA, name string, req pki.Request) plugin.TLSFiles {
		kp, err := ca.Issue(req)
		if err != nil {
			t.Fatal(err)
		}
		f := plugin.TLSFiles{CA: filepath.Join(dir, name+"-ca.crt"), Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
		for path, data := range map[string][]byte{f.CA: ca.CertPEM(), f.Cert: kp.CertPEM, f.Key: kp.KeyPEM} {
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return f
	}
	ca, err := pki.NewCA("providers")
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("someone else")
	if err != nil {
		t.Fatal(err)
	}
	serverFiles := files(ca, "server", pki.Request{CommonName: "provider", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	clientFiles := files(ca, "client", pki.Request{CommonName: "manager", Client: true})
	strangerFiles := files(other, "stranger", pki.Request{CommonName: "stranger", Client: true})
	// The stranger trusts the right CA but presents a certificate it did
	// not sign.
	strangerFiles.CA = clientFiles.CA

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Served on this listener, so that no other process can take the
	// port between finding it and listening on it.
	srv, err := plugin.NewServer(&recorder{}, plugin.ServeOptions{Name: "test", TLS: serverFiles})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	endpoint := fmt.Sprintf("tcp://%s", l.Addr())

	if _, err := plugin.Dial("test", endpoint, plugin.DialOptions{}); err == nil {
		t.Error("Dial over TCP without TLS was allowed")
	}
	if err := plugin.Serve(context.Background(), "tcp://127.0.0.1:0", &recorder{}, plugin.ServeOptions{Name: "test"}); err == nil {
		t.Error("Serve over TCP without TLS was allowed")
	}
	c := dial(t, "test", endpoint, plugin.DialOptions{TLS: clientFiles, Timeout: 5 * time.Second})
	if ok, err := c.Exists(context.Background(), "test://there"); err != nil || !ok {
		t.Errorf("Exists over mutual TLS: %v, %v", ok, err)
	}
	stranger := dial(t, "test", endpoint, plugin.DialOptions{TLS: strangerFiles, Timeout: 5 * time.Second})
	if _, err := stranger.Exists(context.Background(), "test://there"); err == nil {
		t.Error("a client whose certificate the CA did not sign was served")
	}
}

func TestDialledWithoutANameTheClientLearnsIt(t *testing.T) {
	c := dial(t, "", serve(t, &recorder{}, plugin.ServeOptions{Name: "test"}), plugin.DialOptions{})
	m, class := testMachine()
	if _, err := c.Create(context.Background(), m, class, testJoin("abcdef.0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
	if c.Name() != "test" {
		t.Errorf("Name() = %q, want the provider's own, test", c.Name())
	}
}

func TestTLSIsRefusedOnAUnixSocket(t *testing.T) {
	files := plugin.TLSFiles{CA: "ca.crt", Cert: "tls.crt", Key: "tls.key"}
	endpoint := "unix://" + filepath.Join(t.TempDir(), "p.sock")
	if _, err := plugin.Dial("test", endpoint, plugin.DialOptions{TLS: files}); err == nil || !strings.Contains(err.Error(), "TLS is for tcp://") {
		t.Errorf("Dial: %v", err)
	}
	if err := plugin.Serve(context.Background(), endpoint, &recorder{}, plugin.ServeOptions{Name: "test", TLS: files}); err == nil || !strings.Contains(err.Error(), "TLS is for tcp://") {
		t.Errorf("Serve: %v", err)
	}
}

func TestInPlaceKeepsTheLastAnswerWhileTheProviderIsAway(t *testing.T) {
	endpoint := "unix://" + filepath.Join(t.TempDir(), "p.sock")
	e, err := plugin.ParseEndpoint(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := plugin.Listen(e)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := plugin.NewServer(&recorder{inPlace: true}, plugin.ServeOptions{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	c := dial(t, "test", endpoint, plugin.DialOptions{Timeout: time.Second, Refresh: time.Millisecond})
	if !c.InPlace(providers.Change{Version: true}) {
		t.Fatal("InPlace(version) is false with the provider there")
	}
	srv.Stop()
	// Nothing is to change now: past the refresh interval, a client that
	// forgot what it learnt would say false.
	time.Sleep(10 * time.Millisecond)
	if !c.InPlace(providers.Change{Version: true}) {
		t.Error("InPlace(version) turned false while the provider was away")
	}
	never := dial(t, "test", "unix://"+filepath.Join(t.TempDir(), "never.sock"), plugin.DialOptions{Timeout: time.Second})
	if never.InPlace(providers.Change{Version: true}) {
		t.Error("InPlace(version) is true for a provider never reached")
	}
}

func testJoin(token string) providers.Join {
	return providers.Join{Server: "https://cluster.example:6443", CAData: []byte("-----BEGIN CERTIFICATE-----\n" + token + "\n"), Token: token}
}

func sameJoin(a, b providers.Join) bool {
	return a.Server == b.Server && bytes.Equal(a.CAData, b.CAData) && a.Token == b.Token
}

func sameOp(a, b providers.Operation) bool {
	return a.ID == b.ID && a.Hard == b.Hard && a.Version == b.Version && sameJoin(a.Join, b.Join)
}

func TestCreateAndRepairWithoutJoinDataAreRefusedBeforeTheActuator(t *testing.T) {
	rec := &recorder{}
	c := dial(t, "test", serve(t, rec, plugin.ServeOptions{Name: "test"}), plugin.DialOptions{})
	ctx := context.Background()
	m, class := testMachine()
	for name, join := range map[string]providers.Join{
		"none":      {},
		"no token":  {Server: "https://cluster.example:6443"},
		"no server": {Token: "abcdef.0123456789abcdef"},
	} {
		_, err := c.Create(ctx, m, class, join)
		if !providers.IsPermanent(err) || !strings.Contains(err.Error(), providers.ErrNoJoin.Error()) {
			t.Errorf("Create with join data %s: %v, want a permanent error saying %q", name, err, providers.ErrNoJoin)
		}
		if strings.Contains(fmt.Sprint(err), "0123456789abcdef") {
			t.Errorf("Create with join data %s: the error shows the token's secret: %v", name, err)
		}
		err = c.Repair(ctx, "test://a", providers.Operation{ID: "op", Join: join})
		if !providers.IsPermanent(err) || !strings.Contains(err.Error(), providers.ErrNoJoin.Error()) {
			t.Errorf("Repair with join data %s: %v, want a permanent error saying %q", name, err, providers.ErrNoJoin)
		}
	}
	if calls := rec.Calls(); len(calls) > 0 {
		t.Errorf("the Actuator was called: %v", calls)
	}
}

// TestPingSaysWhetherTheProviderAnswers: what machinist_provider_up reports
// at each scrape, over the real wire: down while nothing serves the
// endpoint, up once the provider serves it, and down again for an
// endpoint that serves another provider.
func TestPingSaysWhetherTheProviderAnswers(t *testing.T) {
	endpoint := "unix://" + filepath.Join(t.TempDir(), "ping.sock")
	c := dial(t, "test", endpoint, plugin.DialOptions{Timeout: 2 * time.Second})
	if err := c.Ping(context.Background()); err == nil {
		t.Fatal("Ping answered with no provider at the endpoint")
	}
	serveAt(t, endpoint, &recorder{}, plugin.ServeOptions{Name: "test"})
	testenv.WaitFor(t, 10*time.Second, "Ping to answer once the provider came", func() error {
		return c.Ping(context.Background())
	})
	other := dial(t, "cloud", serve(t, &recorder{}, plugin.ServeOptions{Name: "other"}), plugin.DialOptions{})
	if err := other.Ping(context.Background()); err == nil || !strings.Contains(err.Error(), `"other"`) {
		t.Errorf("Ping of an endpoint serving another provider: %v, want an error naming it", err)
	}
}

// TestAnInstancesAddressesCrossTheWireChecked: the addresses a provider
// gives an instance reach the manager as it gave them; one that could not
// be a Node's (an IP type without an IP, a type Kubernetes does not know)
// fails the call, naming it, rather than reach a Node.
func TestAnInstancesAddressesCrossTheWireChecked(t *testing.T) {
	c := dial(t, "test", serve(t, &recorder{}, plugin.ServeOptions{Name: "test"}), plugin.DialOptions{})
	in, err := c.Describe(context.Background(), "test://addressed")
	if err != nil {
		t.Fatal(err)
	}
	want := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: "m1"}}
	if !slices.Equal(in.Addresses, want) {
		t.Errorf("got addresses %v, want %v", in.Addresses, want)
	}
	for id, why := range map[string]string{
		"test://misaddressed": `type InternalIP must be an IP address, not "m1.example.com"`,
		"test://untyped":      `type "Anywhere"`,
	} {
		if _, err := c.Describe(context.Background(), id); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("Describe(%s): got %v, want an error saying %s", id, err, why)
		}
	}
}
