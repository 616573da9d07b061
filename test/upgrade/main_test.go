// Package upgrade_test upgrades a running fleet from the last release that
// stored machinist.dev/v1alpha1 to this one, as docs/operations.md tells
// an operator to, and checks that nothing is lost or repeated: no Machine
// replaced or rebooted, no operation run again, every stored object
// rewritten once at v1beta1, and v1alpha1 still served with a warning.
//
// The earlier release is built from this repository's history (commit
// before), its CRDs read from the same commit; a shallow clone fetches
// that commit from its origin, and says so when it cannot.
package upgrade_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/orphans"
)

// before is the last commit whose CRDs stored machinist.dev/v1alpha1 and
// whose manager spoke it: the release an operator upgrades from.
const before = "5e547a7d178ebb2c76c348d5fd5b10592e5135d6"

var (
	env *testenv.Env
	// previous and current are the machinist binaries of commit before
	// and of this tree; plugins is the directory of this tree's kubectl
	// plugin, kubectl-machine.
	previous, current, plugins string
	// kubectlCache is kubectl's --cache-dir: the test's own, not the
	// user's, whose entries for another control plane on the same port
	// would mislead it.
	kubectlCache string
)

func TestMain(m *testing.M) {
	// The verbs server in this process logs through klog, the clients'
	// deprecation warnings through controller-runtime's logger.
	klog.SetLogger(logr.Discard())
	log.SetLogger(logr.Discard())
	dir, err := os.MkdirTemp("", "machinist-upgrade-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		kubectlCache = filepath.Join(dir, "kubectl-cache")
		src := filepath.Join(dir, "src")
		if err := checkout(before, src); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		crds, err := readCRDs(filepath.Join(src, "config", "crd", "bases"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return testenv.RunWithOptions(m, testenv.Options{ControllerManager: true, NodeMonitorGracePeriod: nodeGrace, CRDs: crds},
			func(e *testenv.Env) (func(), error) {
				env = e
				previous, current = filepath.Join(dir, "previous", "machinist"), filepath.Join(dir, "current", "machinist")
				// One after the other: two builds at once on two cores
				// take as long and each holds its memory meanwhile.
				plugins = filepath.Join(dir, "current")
				err := errors.Join(testenv.BuildIn(src, "./cmd/machinist", previous), testenv.Build("./cmd/machinist", current),
					testenv.Build("./cmd/kubectl-machine", filepath.Join(plugins, "kubectl-machine")))
				if err != nil {
					return nil, err
				}
				// The agents outlive the managers on purpose, and so would
				// outlive the test.
				return nil, errors.Join(orphans.GuardExecutable(previous), orphans.GuardExecutable(current))
			})
	}()
	os.Exit(code)
}

// checkout writes the tree of commit into dir, from the repository's own
// history.
func checkout(commit, dir string) error {
	root := testenv.Root()
	if exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run() != nil {
		// A shallow clone, as many CI systems make: that one commit is
		// fetched from where the clone came from.
		out, err := exec.Command("git", "-C", root, "fetch", "--quiet", "--depth", "1", "origin", commit).CombinedOutput()
		if err != nil {
			return fmt.Errorf("the upgrade test builds Machinist as of commit %s from this repository's history, which %s does not have, and fetching it from origin failed (git fetch --unshallow, then run it again): %w: %s", commit, root, err, out)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.Command("tar", "-x", "-C", dir)
	var stderr bytes.Buffer
	archive.Stderr, untar.Stderr = &stderr, &stderr
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return fmt.Errorf("git archive %s: %w: %s", commit, err, stderr.String())
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("unpacking commit %s: %w: %s", commit, err, stderr.String())
	}
	return nil
}

// readCRDs reads the CRDs of a config/crd/bases directory.
func readCRDs(dir string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no CRDs in %s: %v", dir, err)
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(raw, crd); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, crd)
	}
	return out, nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
