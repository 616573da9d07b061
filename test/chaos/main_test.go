// Package chaos_test kills, fails over and starves Machinist's manager
// while it works, and then checks that nothing was lost or repeated. It runs
// the real `machinist manager` binary as separate processes (leader
// election on) against a real etcd, kube-apiserver and
// kube-controller-manager, with Machines of the process provider, whose
// agents outlive the manager as real machines outlive a controller. The
// Machines live in that management cluster and serve a workload cluster,
// a second control plane that their Nodes join, as a fleet's do.
//
// Every run is seeded: the seed picks the scenario, the moments of the
// faults and the Machines they hit, and is printed with every failure.
// `make test` runs one fixed seed of each test; `make chaos` runs many:
//
//	CHAOS_SEED=1234 CHAOS_RUNS=50 make chaos CHAOS_TESTS=TestKill
//
// docs/reliability.md describes the fault points and the books kept.
package chaos_test

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"go.uber.org/zap/zapcore"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/orphans"
)

var (
	seedFlag = flag.Uint64("chaos.seed", 0, "first seed (default $CHAOS_SEED, else 1; make chaos defaults it to the clock)")
	runsFlag = flag.Int("chaos.runs", 0, "seeds to run per scenario of each test (default $CHAOS_RUNS, else 1)")
	keepFlag = flag.Bool("chaos.keep", false, "keep every run's logs and state, not only a failed run's")
)

var (
	// env is the management cluster: Machinist's kinds, the managers'
	// leader Lease, the verbs server. workload is the cluster every
	// run's Machines serve: their Nodes, kubelet Leases and pods.
	env, workload *testenv.Env
	// binary is the machinist binary the managers and agents run.
	binary string
	// verbs is the verbs server, registered with kube-apiserver.
	verbs *testenv.Verbs
)

// nodeGrace is how long kube-controller-manager waits for a silent
// kubelet; the agents renew well inside it (agentRenew), so that only a
// crashed machine, or an outage, turns a Node Unknown.
const (
	nodeGrace     = 20 * time.Second
	agentLease    = 15
	agentRenew    = 2 * time.Second
	restartDelay  = time.Second
	convergeLimit = 4 * time.Minute
)

// Leader election is timed shorter than client-go's 15s/10s/2s so that a
// run does not spend most of its time waiting for a dead leader's Lease;
// CHAOS_LEASE_DURATION, CHAOS_RENEW_DEADLINE and CHAOS_RETRY_PERIOD set
// other timings (docs/reliability.md measures failover with both).
var (
	leaseDuration = envDuration("CHAOS_LEASE_DURATION", 8*time.Second)
	renewDeadline = envDuration("CHAOS_RENEW_DEADLINE", 6*time.Second)
	retryPeriod   = envDuration("CHAOS_RETRY_PERIOD", time.Second)
)

func envDuration(name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		fmt.Fprintf(os.Stderr, "%s=%q: want a positive duration such as 15s\n", name, v)
		os.Exit(2)
	}
	return d
}

func TestMain(m *testing.M) {
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	// The verbs server in this process logs through klog; its lines would
	// bury the runs' own under -v.
	klog.SetLogger(logr.Discard())
	os.Exit(testenv.RunWithOptions(m, testenv.Options{ControllerManager: true, NodeMonitorGracePeriod: nodeGrace},
		func(e *testenv.Env) (func(), error) {
			env = e
			dir, err := os.MkdirTemp("", "machinist-chaos-bin-")
			if err != nil {
				return nil, err
			}
			stop := func() {
				if verbs != nil {
					_ = verbs.Stop()
				}
				if workload != nil {
					_ = workload.Stop()
				}
				_ = os.RemoveAll(dir)
			}
			// The workload cluster starts while the binary builds. Its
			// kube-controller-manager marks a silent kubelet's Node Unknown
			// after the same grace as the management cluster's did when
			// the Nodes lived there.
			var wg sync.WaitGroup
			var werr error
			wg.Go(func() {
				workload, werr = testenv.StartWith(testenv.Options{Workload: true, ControllerManager: true, NodeMonitorGracePeriod: nodeGrace})
			})
			binary = filepath.Join(dir, "machinist")
			err = testenv.Build("./cmd/machinist", binary)
			wg.Wait()
			if err := errors.Join(err, werr); err != nil {
				return stop, err
			}
			// The managers and, above all, the agents, which outlive a
			// manager on purpose and so would outlive the tests.
			if err := orphans.GuardExecutable(binary); err != nil {
				return stop, err
			}
			verbs, err = e.StartVerbs()
			return stop, err
		}))
}

// runsPerScenario is CHAOS_RUNS: how many seeds each scenario of a test
// runs (default 1, so that `make test` runs every scenario once).
func runsPerScenario(t *testing.T) int {
	if *runsFlag > 0 {
		return *runsFlag
	}
	return int(envUint(t, "CHAOS_RUNS", 1))
}

// firstSeed is CHAOS_SEED, or 1.
func firstSeed(t *testing.T) uint64 {
	if *seedFlag > 0 {
		return *seedFlag
	}
	return envUint(t, "CHAOS_SEED", 1)
}

func envUint(t *testing.T, name string, def uint64) uint64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// forEachSeed runs one subtest per seed, and stops at the first failure: a
// failed run may leave Machines behind that would confuse the next.
func forEachSeed(t *testing.T, body func(t *testing.T, r *run)) {
	t.Helper()
	forEachScenario(t, []string{""}, func(t *testing.T, r *run, _ int) { body(t, r) })
}

// forEachScenario runs CHAOS_RUNS seeds of each of the named scenarios
// (those whose name contains CHAOS_SCENARIO, when it is set), from
// CHAOS_SEED on: seed s runs scenario s mod len(names), so that a seed
// names its scenario wherever a run of seeds starts. It stops at the
// first failure.
func forEachScenario(t *testing.T, names []string, body func(t *testing.T, r *run, scenario int)) {
	t.Helper()
	runs, first := runsPerScenario(t), firstSeed(t)
	filter := os.Getenv("CHAOS_SCENARIO")
	want := map[int]int{}
	for i, name := range names {
		if filter == "" || strings.Contains(name, filter) {
			want[i] = runs
		}
	}
	if len(want) == 0 {
		t.Skipf("no scenario of %s matches CHAOS_SCENARIO=%q", t.Name(), filter)
	}
	passed, total := 0, runs*len(want)
	seed := first
	for ; passed < total; seed++ {
		i := int(seed % uint64(len(names)))
		if want[i] == 0 {
			continue
		}
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			if names[i] != "" {
				t.Logf("scenario: %s", names[i])
			}
			body(t, newRun(t, seed), i)
		})
		if !ok {
			t.Logf("seed %d failed; reproduce with: CHAOS_SEED=%d CHAOS_RUNS=1 make chaos CHAOS_TESTS='^%s$' CHAOS_SCENARIO='%s'", seed, seed, t.Name(), names[i])
			break
		}
		want[i]--
		passed++
	}
	t.Logf("%s: %d of %d runs passed (%d per scenario, seeds %d..%d)", t.Name(), passed, total, runs, first, seed-1)
}
