package deploy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machinist-dev/machinist/dev/testenv"
)

// TestFaultProxyCommand runs `machinist fault-proxy` as a user would in
// front of their own kube-apiserver: kubectl through the kubeconfig it
// writes, a Create whose reply it loses (stored all the same), its log
// line and metric for the fault, and the counts it prints as it stops.
func TestFaultProxyCommand(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "faults.yaml")
	if err := os.WriteFile(rules, []byte(`seed: 5
rules:
- name: lose-configmap-creates
  fault: LoseReply
  verbs: [create]
  resources: [configmaps]
  rate: 1
  limit: 1
`), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "faulty.kubeconfig")
	metrics := testenv.FreePort(t)
	p := machinist(t, "fault-proxy", "--kubeconfig", env.Kubeconfig, "--listen", "127.0.0.1:0", "--rules", rules,
		"--write-kubeconfig", kubeconfig, fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(kubeconfig); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no kubeconfig written in 30s:\n%s", p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx := context.Background()
	ns := fmt.Sprintf("fault-proxy-%d", time.Now().UnixNano())
	if _, err := env.Kubectl(ctx, "create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	through := func(args ...string) (string, error) {
		return env.Kubectl(ctx, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	}
	if _, err := through("-n", ns, "create", "configmap", "lost"); err == nil {
		t.Fatal("the Create's reply was not lost")
	}
	// Stored although kubectl heard nothing; the next passes.
	if _, err := env.Kubectl(ctx, "-n", ns, "get", "configmap", "lost"); err != nil {
		t.Fatalf("the Create whose reply was lost was not stored: %v", err)
	}
	if _, err := through("-n", ns, "create", "configmap", "next"); err != nil {
		t.Fatal(err)
	}
	code, body, err := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics))
	if err != nil || code != 200 || !strings.Contains(body, `machinist_fault_proxy_struck_total{fault="LoseReply",rule="lose-configmap-creates"} 1`) {
		t.Fatalf("metrics: %d %v\n%s", code, err, body)
	}
	p.terminate(t)
	out := p.output()
	for _, want := range []string{"struck", "lose-configmap-creates (LoseReply): 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output does not say %s:\n%s", want, out)
		}
	}
}
