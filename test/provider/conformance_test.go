package provider_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
	"github.com/machinist-dev/machinist/providers/plugin"
	"github.com/machinist-dev/machinist/providers/plugin/conformance"
	providerv1 "github.com/machinist-dev/machinist/providers/plugin/v1"
)

func TestInmemoryConforms(t *testing.T) {
	t.Parallel()
	p := serveOutOfProcess(t, inmemory.Name, leaseFlags...)
	cfg := config(p.Endpoint, "conformance-inmemory")
	cfg.Logs = func() ([]byte, error) { return []byte(p.Output()), nil }
	conformance.Test(t, cfg)
	noNodesLeft(t, "conformance-inmemory")
}

func TestProcessConforms(t *testing.T) {
	t.Parallel()
	flags := append([]string{"--process-state-dir", t.TempDir(), "--process-exit-with-parent"}, leaseFlags...)
	p := serveOutOfProcess(t, "process", flags...)
	cfg := config(p.Endpoint, "conformance-process")
	cfg.Logs = func() ([]byte, error) { return []byte(p.Output()), nil }
	// The process provider reads no providerSpec: nothing makes it fail.
	cfg.TransientProviderSpec = nil
	conformance.Test(t, cfg)
	noNodesLeft(t, "conformance-process")
}

// TestQEMUConforms runs the suite against VMs: every reboot, repair and
// update is judged by the boot IDs of a real guest kernel.
func TestQEMUConforms(t *testing.T) {
	t.Parallel()
	flags := append([]string{"--qemu-state-dir", t.TempDir(), "--qemu-exit-with-parent"}, leaseFlags...)
	p := serveOutOfProcess(t, "qemu", flags...)
	cfg := config(p.Endpoint, "conformance-qemu")
	cfg.Logs = func() ([]byte, error) { return []byte(p.Output()), nil }
	cfg.ProviderSpec = []byte(`{"cpus":1,"memory":"256Mi"}`)
	// A providerSpec the qemu provider refuses is refused for good: none
	// fails only for now.
	cfg.TransientProviderSpec = nil
	// Boots under TCG emulation, several at once on a small host.
	cfg.Timeout = 4 * time.Minute
	conformance.Test(t, cfg)
	noNodesLeft(t, "conformance-qemu")
}

// TestQEMURealNodesConform runs the suite against real nodes: VMs that
// boot Kubernetes' kubelet with containerd, of the minor before the
// control plane's. Their joins are the kubelet's own CSRs, and the update
// check boots the control plane's kubelet in place of the old one.
func TestQEMURealNodesConform(t *testing.T) {
	t.Parallel()
	nodeDir, err := testenv.EnsureNode()
	if err != nil {
		t.Fatal(err)
	}
	flags := append([]string{"--qemu-state-dir", t.TempDir(), "--qemu-exit-with-parent", "--qemu-node-dir", nodeDir}, leaseFlags...)
	p := serveOutOfProcess(t, "qemu", flags...)
	cfg := config(p.Endpoint, "conformance-real")
	cfg.Logs = func() ([]byte, error) { return []byte(p.Output()), nil }
	cfg.ProviderSpec = []byte(`{"cpus":1,"memory":"1Gi","guest":"kubelet"}`)
	cfg.TransientProviderSpec = nil
	cfg.Version, cfg.UpdateVersion = testenv.PreviousVersion, testenv.Version
	cfg.Timeout = 4 * time.Minute
	conformance.Test(t, cfg)
	noNodesLeft(t, "conformance-real")
}

func TestCommandPassesForInmemory(t *testing.T) {
	t.Parallel()
	p := serveOutOfProcess(t, inmemory.Name, leaseFlags...)
	out, code, err := conformanceCommand(t.Context(), p.Endpoint, "conformance-cli")
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("exit status %d, want 0:\n%s", code, out)
	}
	for _, name := range allChecks {
		if !strings.Contains(out, "PASS  "+name+" (") {
			t.Errorf("no PASS line for %q", name)
		}
	}
	if summary := fmt.Sprintf("%d checks: %[1]d passed, 0 failed", len(allChecks)); !strings.Contains(out, summary) {
		t.Errorf("no summary %q", summary)
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// forgetfulReboot reboots on every call, whatever the operation ID: it
// hands the provider a fresh ID each time, as a provider that ignores the
// ID behaves.
type forgetfulReboot struct{ *inmemory.Provider }

func (f forgetfulReboot) Reboot(ctx context.Context, providerID string, op providers.Operation) error {
	op.ID = string(uuid.NewUUID())
	return f.Provider.Reboot(ctx, providerID, op)
}

func TestSuiteFailsARebootThatIgnoresTheOperationID(t *testing.T) {
	t.Parallel()
	p := newInmemory(t)
	endpoint := serveInProcess(t, forgetfulReboot{p}, plugin.ServeOptions{})
	var (
		wg     sync.WaitGroup
		out    string
		code   int
		cmdErr error
	)
	// The command and the API judge the same provider at once, each with
	// Machines of its own.
	wg.Go(func() { out, code, cmdErr = conformanceCommand(t.Context(), endpoint, "conformance-reboot-cli") })
	results := run(t, config(endpoint, "conformance-reboot"))
	wg.Wait()
	onlyFailed(t, results, allChecks, conformance.CheckReboot)
	if cmdErr != nil {
		t.Fatal(cmdErr)
	}
	if code != 1 || !strings.Contains(out, "FAIL  "+conformance.CheckReboot+": ") || !strings.Contains(out, "1 failed") {
		t.Errorf("the command exited %d, want 1, with a FAIL line for the reboot check:\n%s", code, out)
	}
	nothingLeft(t, p, "conformance-reboot")
	noNodesLeft(t, "conformance-reboot-cli")
}

// racyCreate looks for the Machine's instance, then creates one if there
// was none, without holding anything in between: the classic race. It
// stands in for a provider whose instances are not named after their
// Machines (each takes a name and UID of its own), so that nothing
// downstream folds the duplicates together. It keeps the rest of the
// contract itself: owners as the Machine, and a Machine re-created under
// its name takes its instance.
type racyCreate struct {
	*inmemory.Provider

	mu   sync.Mutex
	made map[types.UID]made // Machine UID → its instance
}

// made is an instance racyCreate made and the Machine it was made for.
type made struct {
	providerID string
	owner      providers.Owner
}

func (r *racyCreate) Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	if m.Spec.ProviderID != "" {
		// The provider knows its own instances by the UIDs made up.
		if id, err := r.FindByUID(ctx, m.UID); err != nil || id == m.Spec.ProviderID {
			return id, err
		}
		return r.Provider.Create(ctx, m, class, join)
	}
	if id, err := r.FindByUID(ctx, m.UID); err != nil || id != "" {
		return id, err
	}
	if id := r.takeSameName(m); id != "" {
		return id, nil
	}
	// The cloud takes a while to answer "none", which is the window.
	select {
	case <-time.After(200 * time.Millisecond):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	instance := m.DeepCopy()
	instance.UID = uuid.NewUUID()
	instance.Name = m.Name + "-" + string(instance.UID)[:8]
	id, err := r.Provider.Create(ctx, instance, class, join)
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	r.made[m.UID] = made{providerID: id, owner: providers.OwnerOf(m)}
	r.mu.Unlock()
	return id, nil
}

// takeSameName hands m the instance made for a Machine of its namespace
// and name under another UID, if there is one.
func (r *racyCreate) takeSameName(m *machinistv1.Machine) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, in := range r.made {
		if providers.SameName(in.owner, m) {
			delete(r.made, uid)
			r.made[m.UID] = made{providerID: in.providerID, owner: providers.OwnerOf(m)}
			return in.providerID
		}
	}
	return ""
}

func (r *racyCreate) FindByUID(ctx context.Context, uid types.UID) (string, error) {
	r.mu.Lock()
	in := r.made[uid]
	r.mu.Unlock()
	if in.providerID != "" {
		return in.providerID, nil
	}
	// Adopted instances are the provider's to remember.
	return r.Provider.FindByUID(ctx, uid)
}

// ownerOf is the Machine racyCreate made providerID for, if it made it.
func (r *racyCreate) ownerOf(providerID string) (providers.Owner, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, in := range r.made {
		if in.providerID == providerID {
			return in.owner, true
		}
	}
	return providers.Owner{}, false
}

// Describe reports the Machine an instance was made for as its owner,
// not the name and UID made up for it.
func (r *racyCreate) Describe(ctx context.Context, providerID string) (providers.Instance, error) {
	in, err := r.Provider.Describe(ctx, providerID)
	if owner, ok := r.ownerOf(providerID); ok {
		in.Owner = owner
	}
	return in, err
}

// List reports owners as Describe does.
func (r *racyCreate) List(ctx context.Context) ([]providers.Listed, error) {
	listed, err := r.Provider.List(ctx)
	for i := range listed {
		if owner, ok := r.ownerOf(listed[i].ProviderID); ok {
			listed[i].Owner = owner
		}
	}
	return listed, err
}

func (r *racyCreate) Delete(ctx context.Context, providerID string) error {
	if err := r.Provider.Delete(ctx, providerID); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, in := range r.made {
		if in.providerID == providerID {
			delete(r.made, uid)
		}
	}
	return nil
}

// staleDescribe answers Describe with what it first found, as a provider
// that caches what it learns of its instances and never looks again.
type staleDescribe struct {
	*inmemory.Provider

	mu   sync.Mutex
	seen map[string]providers.Instance
}

func (s *staleDescribe) Describe(ctx context.Context, providerID string) (providers.Instance, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in, ok := s.seen[providerID]; ok {
		return in, nil
	}
	in, err := s.Provider.Describe(ctx, providerID)
	if err == nil {
		s.seen[providerID] = in
	}
	return in, err
}

func TestSuiteFailsADescribeThatDoesNotFollowTheBoot(t *testing.T) {
	t.Parallel()
	p := newInmemory(t)
	endpoint := serveInProcess(t, &staleDescribe{Provider: p, seen: map[string]providers.Instance{}}, plugin.ServeOptions{})
	results := run(t, config(endpoint, "conformance-describe"))
	onlyFailed(t, results, allChecks, conformance.CheckDescribe)
	for _, r := range results {
		if r.Name == conformance.CheckDescribe && (r.Err == nil || !strings.Contains(r.Err.Error(), "whose Node reports")) {
			t.Errorf("the describe check failed for another reason: %v", r.Err)
		}
	}
	nothingLeft(t, p, "conformance-describe")
}

// ownerless lists its instances without their owners, as a provider
// that does not read back what it recorded on them.
type ownerless struct{ *inmemory.Provider }

func (o ownerless) List(ctx context.Context) ([]providers.Listed, error) {
	listed, err := o.Provider.List(ctx)
	for i := range listed {
		listed[i].Owner = providers.Owner{}
	}
	return listed, err
}

func TestSuiteFailsAListWithoutOwners(t *testing.T) {
	t.Parallel()
	p := newInmemory(t)
	endpoint := serveInProcess(t, ownerless{p}, plugin.ServeOptions{})
	results := run(t, config(endpoint, "conformance-list"))
	onlyFailed(t, results, allChecks, conformance.CheckList)
	for _, r := range results {
		if r.Name == conformance.CheckList && (r.Err == nil || !strings.Contains(r.Err.Error(), "want {Namespace:")) {
			t.Errorf("the list check failed for another reason: %v", r.Err)
		}
	}
	nothingLeft(t, p, "conformance-list")
}

func TestSuiteFailsACreateThatRaces(t *testing.T) {
	t.Parallel()
	p := newInmemory(t)
	endpoint := serveInProcess(t, &racyCreate{Provider: p, made: map[types.UID]made{}}, plugin.ServeOptions{})
	results := run(t, config(endpoint, "conformance-race"))
	onlyFailed(t, results, allChecks, conformance.CheckCreateOnce)
	// The duplicates were cleaned up with the rest.
	nothingLeft(t, p, "conformance-race")
}

// rebootOnlyChecks are the checks for a provider that declares reboot
// alone: those of repair and update are left out, and the check of
// undeclared verbs is in.
var rebootOnlyChecks = []string{
	conformance.CheckIdentity,
	conformance.CheckCapabilities,
	conformance.CheckCreateOnce,
	conformance.CheckJoin,
	conformance.CheckDistinct,
	conformance.CheckAdoptMissing,
	conformance.CheckTaken,
	conformance.CheckInvalid,
	conformance.CheckDelete,
	conformance.CheckDescribe,
	conformance.CheckList,
	conformance.CheckSameName,
	conformance.CheckReboot,
	conformance.CheckUndeclared,
	conformance.CheckCancelled,
	conformance.CheckDeadline,
	conformance.CheckTransient,
}

func TestSuitePassesAProviderDeclaringOnlyReboot(t *testing.T) {
	t.Parallel()
	p := newInmemory(t)
	endpoint := serveInProcess(t, p, plugin.ServeOptions{Verbs: []providerv1.Verb{plugin.VerbReboot}})
	results := run(t, config(endpoint, "conformance-reboot-only"))
	onlyFailed(t, results, rebootOnlyChecks)
	nothingLeft(t, p, "conformance-reboot-only")
}

// understated declares only reboot, yet carries out every verb: it
// stands in front of an honest provider that declares them all and passes
// every MachineService call on.
type understated struct {
	providerv1.UnimplementedIdentityServiceServer
	providerv1.UnimplementedMachineServiceServer
	identity providerv1.IdentityServiceClient
	machines providerv1.MachineServiceClient
}

func (u *understated) GetInfo(ctx context.Context, req *providerv1.GetInfoRequest) (*providerv1.GetInfoResponse, error) {
	return u.identity.GetInfo(ctx, req)
}

func (u *understated) GetCapabilities(context.Context, *providerv1.GetCapabilitiesRequest) (*providerv1.GetCapabilitiesResponse, error) {
	return &providerv1.GetCapabilitiesResponse{Verbs: []providerv1.Verb{plugin.VerbReboot}}, nil
}

func (u *understated) Probe(ctx context.Context, req *providerv1.ProbeRequest) (*providerv1.ProbeResponse, error) {
	return u.identity.Probe(ctx, req)
}

func (u *understated) Create(ctx context.Context, req *providerv1.CreateRequest) (*providerv1.CreateResponse, error) {
	return u.machines.Create(ctx, req)
}

func (u *understated) Exists(ctx context.Context, req *providerv1.ExistsRequest) (*providerv1.ExistsResponse, error) {
	return u.machines.Exists(ctx, req)
}

func (u *understated) Delete(ctx context.Context, req *providerv1.DeleteRequest) (*providerv1.DeleteResponse, error) {
	return u.machines.Delete(ctx, req)
}

func (u *understated) FindByUID(ctx context.Context, req *providerv1.FindByUIDRequest) (*providerv1.FindByUIDResponse, error) {
	return u.machines.FindByUID(ctx, req)
}

func (u *understated) Reboot(ctx context.Context, req *providerv1.RebootRequest) (*providerv1.RebootResponse, error) {
	return u.machines.Reboot(ctx, req)
}

func (u *understated) Repair(ctx context.Context, req *providerv1.RepairRequest) (*providerv1.RepairResponse, error) {
	return u.machines.Repair(ctx, req)
}

func (u *understated) Update(ctx context.Context, req *providerv1.UpdateRequest) (*providerv1.UpdateResponse, error) {
	return u.machines.Update(ctx, req)
}

func (u *understated) Describe(ctx context.Context, req *providerv1.DescribeRequest) (*providerv1.DescribeResponse, error) {
	return u.machines.Describe(ctx, req)
}

func (u *understated) List(ctx context.Context, req *providerv1.ListRequest) (*providerv1.ListResponse, error) {
	return u.machines.List(ctx, req)
}

func TestSuiteFailsAVerbCarriedOutThoughUndeclared(t *testing.T) {
	t.Parallel()
	p := newInmemory(t)
	honest := serveInProcess(t, p, plugin.ServeOptions{})
	e, err := plugin.ParseEndpoint(honest)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+e.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	front := grpc.NewServer()
	u := &understated{identity: providerv1.NewIdentityServiceClient(conn), machines: providerv1.NewMachineServiceClient(conn)}
	providerv1.RegisterIdentityServiceServer(front, u)
	providerv1.RegisterMachineServiceServer(front, u)
	sock := filepath.Join(filepath.Dir(e.Address), "front.sock")
	lis, err := plugin.Listen(plugin.Endpoint{Network: "unix", Address: sock})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = front.Serve(lis) }()
	t.Cleanup(front.Stop)

	results := run(t, config("unix://"+sock, "conformance-understated"))
	onlyFailed(t, results, rebootOnlyChecks, conformance.CheckUndeclared)
	nothingLeft(t, p, "conformance-understated")
}

// leakyJoin logs the join data it is handed, token and all, as a
// provider that prints its requests for debugging would.
type leakyJoin struct {
	*inmemory.Provider
	log *testenv.LockedBuffer
}

func (l leakyJoin) Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	fmt.Fprintf(l.log, "I creating machine %s/%s: server=%s token=%s\n", m.Namespace, m.Name, join.Server, join.Token)
	return l.Provider.Create(ctx, m, class, join)
}

func TestSuiteFailsAProviderThatLogsTheToken(t *testing.T) {
	t.Parallel()
	p := newInmemory(t)
	log := &testenv.LockedBuffer{}
	endpoint := serveInProcess(t, leakyJoin{Provider: p, log: log}, plugin.ServeOptions{})
	cfg := config(endpoint, "conformance-leak")
	cfg.Logs = func() ([]byte, error) { return []byte(log.String()), nil }
	results := run(t, cfg)
	onlyFailed(t, results, append(slices.Clone(allChecks), conformance.CheckNoTokenLog), conformance.CheckNoTokenLog)
	for _, r := range results {
		if r.Name == conformance.CheckNoTokenLog && r.Err != nil && strings.Contains(r.Err.Error(), "token=") && !strings.Contains(r.Err.Error(), "<secret>") {
			t.Errorf("the failure shows the logged line without blanking the secret: %v", r.Err)
		}
	}
	nothingLeft(t, p, "conformance-leak")
}

// trusting adopts whatever instance a Machine names, as a provider that
// keeps no owners does: a Machine of one namespace gets another's.
type trusting struct{ *inmemory.Provider }

func (p trusting) Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	id := m.Spec.ProviderID
	if id == "" {
		return p.Provider.Create(ctx, m, class, join)
	}
	if ok, err := p.Exists(ctx, id); err != nil || !ok {
		return "", providers.Permanent(fmt.Errorf("cannot adopt %q: no such instance", id))
	}
	return id, nil
}

func TestSuiteFailsAProviderThatHandsOneMachinesInstanceToAnother(t *testing.T) {
	t.Parallel()
	p := newInmemory(t)
	endpoint := serveInProcess(t, trusting{p}, plugin.ServeOptions{})
	results := run(t, config(endpoint, "conformance-trusting"))
	onlyFailed(t, results, allChecks, conformance.CheckTaken)
	for _, r := range results {
		if r.Name == conformance.CheckTaken && (r.Err == nil || !strings.Contains(r.Err.Error(), "it was handed another Machine's instance")) {
			t.Errorf("the check of ownership failed for another reason: %v", r.Err)
		}
	}
	nothingLeft(t, p, "conformance-trusting")
}

// telling refuses another Machine's instance, but says whose it is.
type telling struct{ *inmemory.Provider }

func (p telling) Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	id, err := p.Provider.Create(ctx, m, class, join)
	if providers.IsTaken(err) {
		in, _ := p.Describe(ctx, m.Spec.ProviderID)
		return "", providers.Permanent(fmt.Errorf("%s belongs to Machine %s/%s: %w", m.Spec.ProviderID, in.Owner.Namespace, in.Owner.Name, providers.ErrTaken))
	}
	return id, err
}

func TestSuiteFailsARefusalThatTellsWhoseTheInstanceIs(t *testing.T) {
	t.Parallel()
	p := newInmemory(t)
	endpoint := serveInProcess(t, telling{p}, plugin.ServeOptions{})
	results := run(t, config(endpoint, "conformance-telling"))
	onlyFailed(t, results, allChecks, conformance.CheckTaken)
	for _, r := range results {
		if r.Name == conformance.CheckTaken && (r.Err == nil || !strings.Contains(r.Err.Error(), "the refusal names the other Machine's")) {
			t.Errorf("the check of ownership failed for another reason: %v", r.Err)
		}
	}
	nothingLeft(t, p, "conformance-telling")
}
