package clusters

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/machinist-dev/machinist/clusters/joinable"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/bootstrap"
)

var (
	machinistOnce sync.Once
	machinistBin  string
	machinistErr  error
)

// prepare runs `machinist cluster prepare` on w with args, as a user
// does, and returns what it printed and its exit code.
func prepare(t *testing.T, w *testenv.Env, args ...string) (string, int) {
	t.Helper()
	machinistOnce.Do(func() {
		dir, err := os.MkdirTemp("", "machinist-prepare-")
		if err != nil {
			machinistErr = err
			return
		}
		atEnd(func() { _ = os.RemoveAll(dir) })
		machinistBin = filepath.Join(dir, "machinist")
		machinistErr = testenv.Build("./cmd/machinist", machinistBin)
	})
	if machinistErr != nil {
		t.Fatal(machinistErr)
	}
	cmd := exec.Command(machinistBin, append([]string{"cluster", "prepare", "--kubeconfig", w.Kubeconfig}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	case err != nil:
		t.Fatalf("machinist cluster prepare: %v\n%s", err, out.String())
	}
	return out.String(), 0
}

// check runs the checks on w, waiting wait for kube-controller-manager.
func check(t *testing.T, w *testenv.Env, wait time.Duration) joinable.Report {
	t.Helper()
	r, err := joinable.Check(context.Background(), w.Config, joinable.Options{Wait: wait})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// expect fails t unless r's findings come out as want says, by check;
// checks want leaves out must pass.
func expect(t *testing.T, r joinable.Report, want map[string]string) {
	t.Helper()
	for _, f := range r {
		reason, named := want[f.Check]
		switch {
		case !named && f.Result != joinable.Passed:
			t.Errorf("%s: %s (%s), want ok", f.Check, f.Result, f.Detail)
		case named && reason == "" && f.Result != joinable.Skipped:
			t.Errorf("%s: %s (%s), want it not checked", f.Check, f.Result, f.Detail)
		case named && reason != "" && (f.Result != joinable.Failed || f.Reason != reason):
			t.Errorf("%s: %s %s (%s), want it missing with reason %s", f.Check, f.Result, f.Reason, f.Detail, reason)
		}
	}
	if len(r) != 7 {
		t.Errorf("%d findings, want one for each of the 7 checks: %+v", len(r), r)
	}
}

// noProbesLeft fails t if the checks left a token or a certificate
// request behind in w.
func noProbesLeft(t *testing.T, w *testenv.Env) {
	t.Helper()
	kube, err := kubernetes.NewForConfig(w.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	secrets, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: joinable.ProbeLabel})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(secrets.Items); n > 0 {
		t.Errorf("the checks left %d bootstrap tokens", n)
	}
	csrs, err := kube.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range csrs.Items {
		if strings.HasPrefix(c.Spec.Username, "system:bootstrap:") {
			t.Errorf("the checks left certificate request %s of %s", c.Name, c.Spec.Username)
		}
	}
}

// A cluster whose kube-apiserver takes no bootstrap tokens, and does not
// authorize nodes with the Node authorizer: the command says so, with
// the flags, and fails.
func TestPrepareNamesTheFlagsAClusterLacks(t *testing.T) {
	t.Parallel()
	w := startCluster(t, testenv.Options{Unprepared: true, Lacks: testenv.Lacks{BootstrapTokens: true, NodeAuthorizer: true}})
	out, code := prepare(t, w)
	if code != 1 {
		t.Errorf("exit code %d, want 1:\n%s", code, out)
	}
	for _, want := range []string{"--enable-bootstrap-token-auth", "--authorization-mode=Node,RBAC", joinable.ReasonBootstrapTokensRefused, joinable.ReasonNodeAuthorizerOff, "2 of 7 checks failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output does not say %q:\n%s", want, out)
		}
	}
	expect(t, check(t, w, 5*time.Second), map[string]string{
		joinable.CheckBootstrapTokens: joinable.ReasonBootstrapTokensRefused,
		joinable.CheckNodeAuthorizer:  joinable.ReasonNodeAuthorizerOff,
		joinable.CheckApprover:        "",
		joinable.CheckSigner:          "",
		joinable.CheckNodeRestriction: "",
	})
	noProbesLeft(t, w)
}

// A cluster whose kube-controller-manager neither approves node
// certificates nor cleans expired tokens, and without NodeRestriction.
func TestPrepareNamesTheControllersAClusterLacks(t *testing.T) {
	t.Parallel()
	w := startCluster(t, testenv.Options{Lacks: testenv.Lacks{Approver: true, TokenCleaner: true}})
	out, code := prepare(t, w, "--wait", "5s")
	if code != 1 {
		t.Errorf("exit code %d, want 1:\n%s", code, out)
	}
	for _, want := range []string{"certificatesigningrequest-approving-controller", "tokencleaner", joinable.ReasonCertificateNotApproved, joinable.ReasonTokenCleanerOff} {
		if !strings.Contains(out, want) {
			t.Errorf("the output does not say %q:\n%s", want, out)
		}
	}
	expect(t, check(t, w, 5*time.Second), map[string]string{
		joinable.CheckApprover:        joinable.ReasonCertificateNotApproved,
		joinable.CheckSigner:          "",
		joinable.CheckNodeRestriction: "",
		joinable.CheckTokenCleaner:    joinable.ReasonTokenCleanerOff,
	})
	noProbesLeft(t, w)

	open := startCluster(t, testenv.Options{Lacks: testenv.Lacks{NodeRestriction: true}})
	expect(t, check(t, open, 10*time.Second), map[string]string{
		joinable.CheckNodeRestriction: joinable.ReasonNodeRestrictionOff,
	})
}

// A cluster set up as kubeadm sets one up, without Machinist's bindings:
// the dry run changes nothing and names them; prepare installs them, the
// cluster is joinable, a second prepare changes nothing, and a
// MachineSet's machines join it.
func TestPrepareMakesAKubeadmStyleClusterJoinable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := startCluster(t, testenv.Options{Unprepared: true})
	kube, err := kubernetes.NewForConfig(w.Config)
	if err != nil {
		t.Fatal(err)
	}
	_, bindings, err := bootstrap.RBAC()
	if err != nil {
		t.Fatal(err)
	}

	out, code := prepare(t, w, "--dry-run")
	if code != 1 || !strings.Contains(out, joinable.ReasonBindingsMissing) || !strings.Contains(out, "created (server dry run)") {
		t.Errorf("dry run: exit code %d, want 1, naming %s:\n%s", code, joinable.ReasonBindingsMissing, out)
	}
	for _, b := range bindings {
		if !strings.Contains(out, b.Name) {
			t.Errorf("the dry run does not name binding %s:\n%s", b.Name, out)
		}
		if _, err := kube.RbacV1().ClusterRoleBindings().Get(ctx, b.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("after a dry run, ClusterRoleBinding %s: %v, want not found", b.Name, err)
		}
	}

	out, code = prepare(t, w)
	if code != 0 || strings.Count(out, " created\n") != len(bindings)+1 {
		t.Fatalf("prepare: exit code %d, want 0, with %d objects created:\n%s", code, len(bindings)+1, out)
	}
	expect(t, check(t, w, 10*time.Second), nil)
	out, code = prepare(t, w)
	if code != 0 || strings.Count(out, " unchanged\n") != len(bindings)+1 || strings.Contains(out, " created") {
		t.Errorf("prepare again: exit code %d, want 0, with nothing changed:\n%s", code, out)
	}
	noProbesLeft(t, w)

	// A binding someone changed is put back; one whose role differs,
	// which cannot change in place, is named, not deleted.
	grant := bindings[0].DeepCopy()
	changed, err := kube.RbacV1().ClusterRoleBindings().Get(ctx, grant.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	changed.Subjects[0].Name = "system:bootstrappers:someone-else"
	if _, err := kube.RbacV1().ClusterRoleBindings().Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, code = prepare(t, w)
	if code != 0 || !strings.Contains(out, "clusterrolebinding.rbac.authorization.k8s.io/"+grant.Name+" configured\n") {
		t.Errorf("prepare after a binding changed: exit code %d, want 0, with %s configured:\n%s", code, grant.Name, out)
	}
	if err := kube.RbacV1().ClusterRoleBindings().Delete(ctx, grant.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	other := grant.DeepCopy()
	other.ResourceVersion, other.RoleRef.Name = "", "view"
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, code = prepare(t, w)
	if code != 1 || !strings.Contains(out, "delete it, and run this again") {
		t.Errorf("prepare with a binding of another role: exit code %d, want 1, saying to delete it:\n%s", code, out)
	}
	if err := kube.RbacV1().ClusterRoleBindings().Delete(ctx, grant.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, code = prepare(t, w); code != 0 {
		t.Fatalf("prepare once the binding was deleted: exit code %d:\n%s", code, out)
	}

	ns := env.NewNamespace(t, "prepared", testenv.Small)
	register(t, w, ns, "kubeadm")
	ms := testenv.MachineSet(ns, "workers", 3)
	ms.Spec.Template.Spec.ClusterName = "kubeadm"
	if err := env.Client.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	machines := running(t, ns, 3, 2*time.Minute, client.MatchingLabels{"pool": "workers"})
	testenv.WaitFor(t, 30*time.Second, "the 3 Machines' Nodes in the prepared cluster", func() error {
		nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		byID := map[string]bool{}
		for _, n := range nodes.Items {
			byID[n.Spec.ProviderID] = true
		}
		for _, m := range machines {
			if m.Spec.ClusterName != "kubeadm" || m.Status.ProviderID == "" || !byID[m.Status.ProviderID] {
				return fmt.Errorf("Machine %s (cluster %q) has no Node %q there", m.Name, m.Spec.ClusterName, m.Status.ProviderID)
			}
		}
		return nil
	})
}

// The management cluster, whose own Nodes Machines become, is prepared
// the same way: already prepared, prepare changes nothing and passes.
func TestPrepareTheManagementCluster(t *testing.T) {
	t.Parallel()
	out, code := prepare(t, env)
	if code != 0 || strings.Contains(out, " created") || strings.Contains(out, " configured") {
		t.Errorf("exit code %d, want 0, changing nothing:\n%s", code, out)
	}
}
