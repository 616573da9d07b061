// Package provider_test runs the provider conformance suite against a
// real etcd and kube-apiserver: it must pass for the built-in providers
// served out of process, by `machinist provider conformance` as by the Go
// API, and it must fail, on the check that matters, for providers broken
// on purpose.
package provider_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
	"github.com/machinist-dev/machinist/providers/plugin"
	"github.com/machinist-dev/machinist/providers/plugin/conformance"
)

var (
	env  *testenv.Env
	kube kubernetes.Interface
)

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, func(e *testenv.Env) (func(), error) {
		env = e
		var err error
		kube, err = kubernetes.NewForConfig(e.Config)
		return nil, err
	}))
}

// Short Leases keep the agents' writes few; a short Settle keeps the
// package quick while still giving a second restart time to show.
var leaseFlags = []string{"--lease-duration-seconds", "10", "--renew-interval", "2s"}

const (
	settle  = 3 * time.Second
	timeout = time.Minute
)

// transientSpec makes every inmemory Create fail with an injected
// transient error.
const transientSpec = `{"errorRate":1}`

// config is the suite's Config for one test. Each test has a namespace
// of its own, which the provider IDs of both built-in providers carry, so
// that it can tell its leftovers from those of the tests beside it.
func config(endpoint, namespace string) conformance.Config {
	return conformance.Config{
		Endpoint:              endpoint,
		Kube:                  kube,
		Server:                env.Config.Host,
		CAData:                env.Config.CAData,
		Namespace:             namespace,
		TransientProviderSpec: []byte(transientSpec),
		Timeout:               timeout,
		Settle:                settle,
	}
}

// serveOutOfProcess runs `machinist provider serve` until the test ends.
func serveOutOfProcess(t *testing.T, name string, flags ...string) *testenv.ServedProvider {
	t.Helper()
	p, err := env.ServeProvider(name, flags...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// serveInProcess offers a under the name inmemory, as its provider IDs
// say, on a socket of its own until the test ends, and returns the
// endpoint once the provider answers.
func serveInProcess(t *testing.T, a providers.Actuator, opts plugin.ServeOptions) string {
	t.Helper()
	opts.Name = inmemory.Name
	// Unix socket paths are short; the test's TempDir may not be.
	dir, err := os.MkdirTemp("", "conformance-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "p.sock")
	endpoint := "unix://" + sock
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- plugin.Serve(ctx, endpoint, a, opts) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serving: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	deadline := time.Now().Add(10 * time.Second)
	// Dialled before the socket is there, gRPC logs every refused attempt.
	testenv.WaitFor(t, time.Until(deadline), "a socket at "+endpoint, func() error {
		_, err := os.Stat(sock)
		return err
	})
	c, err := plugin.Dial(opts.Name, endpoint, plugin.DialOptions{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	testenv.WaitFor(t, time.Until(deadline), "the provider at "+endpoint+" ready", func() error {
		probe, err := c.Probe(context.Background())
		if err == nil && probe.GetReady() {
			return nil
		}
		select {
		case err := <-served:
			served <- err
			t.Fatalf("provider.Serve returned early: %v", err)
		default:
		}
		if err == nil {
			err = errors.New("its probe says not ready")
		}
		return err
	})
	return endpoint
}

// noNodesLeft checks that the suite deleted the Nodes of every instance
// it made for Machines in namespace.
func noNodesLeft(t *testing.T, namespace string) {
	t.Helper()
	nodes, err := kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if strings.Contains(n.Spec.ProviderID, ":///"+namespace+"/") {
			t.Errorf("Node %s of %s is left after the suite", n.Name, n.Spec.ProviderID)
		}
	}
}

// nothingLeft checks that the suite deleted every instance of p, and the
// Nodes of those it made for Machines in namespace.
func nothingLeft(t *testing.T, p *inmemory.Provider, namespace string) {
	t.Helper()
	if left := p.Instances(); len(left) > 0 {
		t.Errorf("instances left after the suite: %v", left)
	}
	noNodesLeft(t, namespace)
}

// newInmemory starts an in-process inmemory provider for one test.
func newInmemory(t *testing.T) *inmemory.Provider {
	t.Helper()
	p, err := inmemory.New(inmemory.Options{LeaseDurationSeconds: 10, RenewInterval: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// run runs the suite and logs each result as it comes.
func run(t *testing.T, cfg conformance.Config) []conformance.Result {
	t.Helper()
	results, err := conformance.Run(t.Context(), cfg, func(r conformance.Result) {
		t.Logf("%s (%.1fs): %v", r.Name, r.Duration.Seconds(), r.Err)
	})
	if err != nil {
		t.Fatal(err)
	}
	return results
}

// onlyFailed checks that exactly the checks named by want failed, and
// that every check in listed ran.
func onlyFailed(t *testing.T, results []conformance.Result, listed []string, want ...string) {
	t.Helper()
	var names []string
	for _, r := range results {
		names = append(names, r.Name)
		switch failed := r.Err != nil; {
		case failed && !slices.Contains(want, r.Name):
			t.Errorf("check %q failed, want it to pass: %v", r.Name, r.Err)
		case !failed && slices.Contains(want, r.Name):
			t.Errorf("check %q passed, want it to fail", r.Name)
		}
	}
	if !slices.Equal(names, listed) {
		t.Errorf("checks run:\n  %s\nwant:\n  %s", strings.Join(names, "\n  "), strings.Join(listed, "\n  "))
	}
}

// allChecks are the checks for a provider that declares every verb and
// updates versions in place, with a transient providerSpec given.
var allChecks = []string{
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
	conformance.CheckRepair,
	conformance.CheckUpdate,
	conformance.CheckCancelled,
	conformance.CheckDeadline,
	conformance.CheckTransient,
}

// conformanceCommand runs `machinist provider conformance` against
// endpoint and returns its output and exit status; the error is for a
// command that could not be run at all.
func conformanceCommand(ctx context.Context, endpoint, namespace string) (string, int, error) {
	bin, err := testenv.Machinist()
	if err != nil {
		return "", 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "provider", "conformance",
		"--endpoint", endpoint, "--kubeconfig", env.Kubeconfig,
		"--namespace", namespace, "--transient-provider-spec", transientSpec,
		"--timeout", timeout.String(), "--settle", settle.String())
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode(), nil
	}
	return string(out), 0, err
}
