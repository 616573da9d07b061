package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/manager"
)

var (
	env *testenv.Env
	// built is closed when the kubectl-machine binary is in pluginDir, or
	// building it failed with buildErr.
	built     = make(chan struct{})
	pluginDir string
	buildErr  error
)

func TestMain(m *testing.M) {
	// The controllers' logs would drown a failure's output.
	ctrl.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "kubectl-machine-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		// Build the real plugin while the control plane starts.
		go func() {
			defer close(built)
			pluginDir = dir
			buildErr = testenv.Build("./cmd/kubectl-machine", filepath.Join(dir, "kubectl-machine"))
		}()
		code := testenv.Run(m, func(e *testenv.Env) { env = e })
		<-built
		return code
	}())
}

// result is what one run of the plugin did.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit code %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// plugin runs the plugin in-process against the test control plane, in
// namespace ns.
func plugin(ns string, args ...string) result {
	streams, _, out, errOut := genericiooptions.NewTestIOStreams()
	code := Main(append(args, "--kubeconfig", env.Kubeconfig, "--namespace", ns), streams)
	return result{stdout: out.String(), stderr: errOut.String(), code: code}
}

// kubectl runs `kubectl machine args...` with the real kubectl, which must
// find the built plugin on PATH, in namespace ns.
func kubectl(t *testing.T, ns string, args ...string) result {
	t.Helper()
	<-built
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(testenv.BinDir(), "kubectl"), append([]string{"machine"}, append(args, "--namespace", ns)...)...)
	cmd.Env = append(os.Environ(), "PATH="+pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+env.Kubeconfig)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("running kubectl machine %v: %v", args, err)
	}
	return r
}

// startControllers runs Machinist's controllers until the returned stop is
// called or the test ends.
func startControllers(t *testing.T) (stop func()) {
	t.Helper()
	c, err := env.StartControllers(manager.Options{ProvisionTimeout: time.Minute, Repeatable: true},
		testenv.Leases{DurationSeconds: 20, RenewInterval: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := c.Stop(); err != nil {
				t.Errorf("stopping the controllers: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// watchClient is a client that can watch, as the plugin's is.
func watchClient(t *testing.T) client.WithWatch {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
