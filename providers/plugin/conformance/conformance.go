// Package conformance checks a provider served over the provider protocol
// (proto/machinist/provider/v1) against the contract the Machine
// controller relies on: idempotent Create on the Machine's UID, one
// Machine's instance never handed to another, reboots, repairs and
// updates carried out once per operation ID, idempotent Delete, and
// errors marked permanent only when retrying cannot help.
//
// The checks act on real instances and judge them by what their Nodes
// report, so the provider must register its instances' Nodes with the
// cluster Config.Kube reaches. No Machine or MachineClass is written to the
// cluster: the suite fabricates them, as the controller would send them.
// Every check deletes the instances it made, and their Nodes and Leases,
// as the Machine controller does after Delete.
//
// Provider authors run it with `machinist provider conformance`, or from
// a Go test with Test.
package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"

	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/plugin"
	providerv1 "github.com/machinist-dev/machinist/providers/plugin/v1"
)

// Config says which provider to check and how.
type Config struct {
	// Endpoint is where the provider listens: unix:///path/to.sock, or
	// tcp://host:port with TLS. Required.
	Endpoint string
	// TLS names the client's certificate and key and the CA that signed
	// the provider's; required for a TCP endpoint.
	TLS plugin.TLSFiles
	// Kube reaches the cluster the provider registers its Nodes with.
	// Required: the contract is about what the Nodes report (a boot ID
	// that changes once per reboot, the version after an update). The
	// suite reads every Node, and deletes the Nodes and Leases of the
	// instances it deleted. It makes a bootstrap token (a Secret in
	// kube-system) for each Machine and each repair, deleted when its
	// check ends, and reads CertificateSigningRequests to see which token
	// a machine joined with.
	Kube kubernetes.Interface
	// Server is the API server's URL as the machines reach it, and CAData
	// the PEM bundle that verifies it: the join data handed to the
	// provider carries them. Server is required.
	Server string
	CAData []byte
	// TokenGroups are the groups (auth-extra-groups) the suite's
	// bootstrap tokens authenticate in besides system:bootstrappers.
	// None means bootstrap.NodeGroup, the group a cluster Machinist set
	// up lets ask for node certificates; a cluster bootstrapped otherwise
	// grants that to groups of its own, such as kubeadm's
	// system:bootstrappers:kubeadm:default-node-token, and needs them
	// here. Each must be system:bootstrappers:<something>.
	TokenGroups []string
	// Logs, when set, returns what the provider has logged so far, such
	// as its process's standard error; a check then proves that no
	// bootstrap token handed to it shows there.
	Logs func() ([]byte, error)
	// Namespace is written into the fabricated Machines (default
	// "conformance"); no Machine is created in the cluster.
	Namespace string
	// Version is the Machines' spec.version (default "v1.37.2").
	Version string
	// UpdateVersion is what the in-place update check updates to
	// (default "v1.38.0").
	UpdateVersion string
	// ProviderSpec is the fabricated MachineClass's providerSpec, as
	// JSON; empty leaves it out.
	ProviderSpec []byte
	// TransientProviderSpec, when set, is a providerSpec with which
	// Create fails transiently, so that a check can prove the failure is
	// not reported as permanent.
	TransientProviderSpec []byte
	// Timeout bounds each call to the provider and how long a Node has to
	// show an effect, such as a new boot ID (default 90s).
	Timeout time.Duration
	// Settle is how long the suite watches that a repeated call has no
	// second effect (default 5s).
	Settle time.Duration
}

// Result is the outcome of one check.
type Result struct {
	// Name says what the check proves, in plain words.
	Name string
	// Err is why the check failed; nil when it passed.
	Err error
	// Duration is how long the check took, cleaning up included.
	Duration time.Duration
}

// Names of the checks, as Results and subtests carry them.
const (
	CheckIdentity     = "identifies itself and is ready"
	CheckCapabilities = "declares coherent capabilities"
	CheckCreateOnce   = "creates one instance per Machine UID under concurrent calls"
	CheckDistinct     = "gives distinct Machines distinct instances"
	CheckList         = "lists each instance once, with its Machine"
	CheckSameName     = "gives a Machine re-created under a new UID its instance"
	CheckAdoptMissing = "refuses permanently to adopt a missing instance"
	CheckTaken        = "refuses to hand one Machine's instance to another"
	CheckInvalid      = "refuses invalid requests permanently"
	CheckDelete       = "deletes idempotently"
	CheckReboot       = "reboots once per operation ID"
	CheckRepair       = "repairs once per operation ID"
	CheckUpdate       = "updates in place once per operation ID"
	CheckUndeclared   = "refuses undeclared verbs"
	CheckCancelled    = "creates one instance after a cancelled create"
	CheckDeadline     = "fails an expired call transiently"
	CheckTransient    = "reports a transient failure as transient"
	CheckJoin         = "joins its machines with the join data it is given"
	CheckNoTokenLog   = "never logs a bootstrap token"
	CheckDescribe     = "describes its instances as their Nodes do"
)

// Run runs every check that applies to the provider, one after another,
// calling report (when not nil) as each ends, and returns the results in
// order. A check for a verb the provider does not declare is left out, as
// is the check of undeclared verbs when it declares them all. The error
// is for a suite that cannot start: a Config that is incomplete, a
// provider that does not say who it is, Nodes that cannot be listed.
func Run(ctx context.Context, cfg Config, report func(Result)) ([]Result, error) {
	s, err := start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer s.close()
	results := make([]Result, 0, len(s.checks))
	for _, c := range s.checks {
		r := s.run(ctx, c)
		results = append(results, r)
		if report != nil {
			report(r)
		}
	}
	return results, nil
}

// Test runs the suite as subtests of t, one per check, each failing on
// its own; t fails at once when the suite cannot start.
func Test(t *testing.T, cfg Config) {
	t.Helper()
	ctx := t.Context()
	s, err := start(ctx, cfg)
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	defer s.close()
	t.Logf("provider %q (%s): verbs %v, in place %v", s.name, s.info.GetVendorVersion(), s.caps.GetVerbs(), s.caps.GetInPlace())
	for _, c := range s.checks {
		t.Run(c.name, func(t *testing.T) {
			if r := s.run(ctx, c); r.Err != nil {
				t.Error(r.Err)
			}
		})
	}
}

// suite is one run against one provider.
type suite struct {
	cfg      Config
	name     string
	info     *providerv1.GetInfoResponse
	caps     *providerv1.GetCapabilitiesResponse
	client   *plugin.Client
	identity providerv1.IdentityServiceClient
	machines providerv1.MachineServiceClient
	nodes    *nodeWatch
	checks   []check

	// handed is every token handed to the provider, for the log check.
	mu     sync.Mutex
	handed []token
}

// handedOver records that k was handed to the provider.
func (s *suite) handedOver(k token) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handed = append(s.handed, k)
}

// check is one property of the contract. Machine names it fabricates
// start with conformance-<slug>-.
type check struct {
	name string
	slug string
	run  func(context.Context, *trial) error
}

func (c *Config) setDefaults() {
	if c.Namespace == "" {
		c.Namespace = "conformance"
	}
	if c.Version == "" {
		c.Version = "v1.37.2"
	}
	if c.UpdateVersion == "" {
		c.UpdateVersion = "v1.38.0"
	}
	if c.Timeout <= 0 {
		c.Timeout = 90 * time.Second
	}
	if c.Settle <= 0 {
		c.Settle = 5 * time.Second
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.Endpoint == "" {
		errs = append(errs, errors.New("no endpoint"))
	}
	if c.Kube == nil {
		errs = append(errs, errors.New("no Kubernetes client: the checks read the instances' Nodes"))
	}
	if c.Server == "" {
		errs = append(errs, errors.New("no API server URL: the join data handed to the provider needs one"))
	}
	for what, raw := range map[string][]byte{"providerSpec": c.ProviderSpec, "transient providerSpec": c.TransientProviderSpec} {
		if len(raw) > 0 && !json.Valid(raw) {
			errs = append(errs, fmt.Errorf("the %s is not JSON: %s", what, raw))
		}
	}
	for _, g := range c.TokenGroups {
		// kube-apiserver refuses a token with a malformed group
		// outright, which would fail every join check with a message
		// that points at the provider.
		if err := bootstraputil.ValidateBootstrapGroupName(g); err != nil {
			errs = append(errs, fmt.Errorf("token group: %w", err))
		}
	}
	if c.UpdateVersion == c.Version {
		errs = append(errs, fmt.Errorf("the update version is the Machines' version %s: an update to it changes nothing", c.Version))
	}
	return errors.Join(errs...)
}

// start dials the provider, learns its name and capabilities, and starts
// watching Nodes.
func start(ctx context.Context, cfg Config) (*suite, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// Dialled without a name: the suite checks whichever provider the
	// endpoint serves, and learns its name first.
	client, err := plugin.Dial("", cfg.Endpoint, plugin.DialOptions{TLS: cfg.TLS, Timeout: cfg.Timeout})
	if err != nil {
		return nil, err
	}
	// Some checks send requests the Client never would (no machine_uid,
	// an undeclared verb) and read the status code, which the Client
	// folds into permanent or not: they use its connection directly.
	s := &suite{
		cfg:      cfg,
		client:   client,
		identity: providerv1.NewIdentityServiceClient(client.Conn()),
		machines: providerv1.NewMachineServiceClient(client.Conn()),
	}
	fail := func(err error) (*suite, error) {
		s.close()
		return nil, err
	}
	callCtx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if s.info, err = s.identity.GetInfo(callCtx, &providerv1.GetInfoRequest{}); err != nil {
		return fail(fmt.Errorf("asking %s who it is: %w", cfg.Endpoint, err))
	}
	s.name = s.info.GetName()
	if s.caps, err = s.identity.GetCapabilities(callCtx, &providerv1.GetCapabilitiesRequest{}); err != nil {
		return fail(fmt.Errorf("asking provider %q at %s for its capabilities: %w", s.name, cfg.Endpoint, err))
	}
	if s.nodes, err = watchNodes(ctx, cfg.Kube, cfg.Timeout); err != nil {
		return fail(err)
	}
	s.checks = s.plan()
	return s, nil
}

func (s *suite) close() {
	if s.nodes != nil {
		s.nodes.close()
	}
	_ = s.client.Close()
}

// plan lists the checks that apply to the provider's capabilities.
func (s *suite) plan() []check {
	checks := []check{
		{CheckIdentity, "identity", checkIdentity},
		{CheckCapabilities, "capabilities", checkCapabilities},
		{CheckCreateOnce, "create", checkCreateOnce},
		{CheckJoin, "join", checkJoin},
		{CheckDistinct, "distinct", checkDistinct},
		{CheckAdoptMissing, "adopt", checkAdoptMissing},
		{CheckTaken, "taken", checkTaken},
		{CheckInvalid, "invalid", checkInvalid},
		{CheckDelete, "delete", checkDelete},
		{CheckDescribe, "describe", checkDescribe},
		{CheckList, "list", checkList},
		{CheckSameName, "samename", checkSameName},
	}
	if s.declares(plugin.VerbReboot) {
		checks = append(checks, check{CheckReboot, "reboot", func(ctx context.Context, t *trial) error {
			return checkOncePerOperation(ctx, t, plugin.VerbReboot)
		}})
	}
	if s.declares(plugin.VerbRepair) {
		checks = append(checks, check{CheckRepair, "repair", func(ctx context.Context, t *trial) error {
			return checkOncePerOperation(ctx, t, plugin.VerbRepair)
		}})
	}
	if s.declares(plugin.VerbUpdate) && slices.Contains(s.caps.GetInPlace(), providerv1.Change_CHANGE_VERSION) {
		checks = append(checks, check{CheckUpdate, "update", checkUpdate})
	}
	if len(s.undeclared()) > 0 {
		checks = append(checks, check{CheckUndeclared, "undeclared", checkUndeclared})
	}
	checks = append(checks,
		check{CheckCancelled, "cancelled", checkCancelled},
		check{CheckDeadline, "deadline", checkDeadline},
	)
	if len(s.cfg.TransientProviderSpec) > 0 {
		checks = append(checks, check{CheckTransient, "transient", checkTransient})
	}
	if s.cfg.Logs != nil {
		// Last, to search what the provider logged through every check.
		checks = append(checks, check{CheckNoTokenLog, "log", checkNoTokenLog})
	}
	return checks
}

// verbs are the protocol's verbs beyond create, exists, delete and find.
var verbs = []providerv1.Verb{plugin.VerbReboot, plugin.VerbRepair, plugin.VerbUpdate}

func (s *suite) declares(v providerv1.Verb) bool { return slices.Contains(s.caps.GetVerbs(), v) }

func (s *suite) undeclared() []providerv1.Verb {
	var out []providerv1.Verb
	for _, v := range verbs {
		if !s.declares(v) {
			out = append(out, v)
		}
	}
	return out
}

// run runs one check and cleans up after it; a failed clean-up fails the
// check, for an instance left behind is one the controller would leak.
func (s *suite) run(ctx context.Context, c check) Result {
	began := time.Now()
	t := &trial{s: s, slug: c.slug, joins: map[string]providers.Join{}}
	err := c.run(ctx, t)
	if cerr := t.cleanUp(ctx); cerr != nil {
		err = errors.Join(err, fmt.Errorf("cleaning up: %w", cerr))
	}
	return Result{Name: c.name, Err: err, Duration: time.Since(began)}
}

// suffix is a random suffix for names that must not meet earlier runs'.
func suffix() string { return rand.String(6) }

// scheme is what comes before :// in a provider ID.
func scheme(providerID string) string {
	s, _, ok := strings.Cut(providerID, "://")
	if !ok {
		return ""
	}
	return s
}
