package apiserver_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// asFrontProxy returns a client that presents the front-proxy client
// certificate, as kube-apiserver's aggregator does, so that the verbs
// server believes whatever X-Remote-User it is sent. testenv keeps that
// certificate in front-proxy/ beside the kubeconfig it writes.
func asFrontProxy(t *testing.T) *http.Client {
	t.Helper()
	dir := filepath.Join(filepath.Dir(env.Kubeconfig), "front-proxy")
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
	if err != nil {
		t.Fatalf("the front-proxy client certificate testenv makes: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(verbs.Server.CABundle) {
		t.Fatal("the verbs server's CA bundle holds no certificate")
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{cert},
	}}}
}

// putDirect sends a verb straight to the verbs server, bypassing
// kube-apiserver and its authorization, in the name of user.
func putDirect(ctx context.Context, c *http.Client, user, ns, name, verb, body string) (int, string, error) {
	url := fmt.Sprintf("https://127.0.0.1:%d%s", verbs.Server.Port, verbPath(ns, name, verb))
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Remote-User", user)
	req.Header.Set("X-Remote-Group", "system:authenticated")
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw), err
}

func statusMessage(g Gomega, body string) string {
	var status metav1.Status
	g.Expect(json.Unmarshal([]byte(body), &status)).To(Succeed(), body)
	g.Expect(status.Kind).To(Equal("Status"), body)
	return status.Message
}

// unchanged checks that nothing was written to the Machine since before.
func unchanged(g Gomega, ctx context.Context, before *machinistv1.Machine) {
	now := get(g, ctx, before)
	g.Expect(now.ResourceVersion).To(Equal(before.ResourceVersion), "the Machine was written")
	g.Expect(now.Status.Operation).To(BeNil())
}

// TestTheVerbsServerAuthorizesEachRequest reaches the verbs server's own
// SubjectAccessReview: through kube-apiserver, the same RBAC refuses a
// request before it is proxied, so only a caller holding the front-proxy
// certificate can bring the server a user RBAC does not allow.
func TestTheVerbsServerAuthorizesEachRequest(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: "{}"})
	m := running(t, ctx, ns, "m0", "small")
	const repairer = "carol" // may repair in ns, not reboot
	g.Expect(env.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "repairer"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{subresourcesv1.GroupName}, Resources: []string{"machines/repair"}, Verbs: []string{"update"},
		}},
	})).To(Succeed())
	g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "repairer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "repairer"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: repairer}},
	})).To(Succeed())
	c := asFrontProxy(t)

	for _, user := range []string{stranger, repairer} {
		code, body, err := putDirect(ctx, c, user, ns, "m0", "reboot", "{}")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(code).To(Equal(http.StatusForbidden), body)
		g.Expect(statusMessage(g, body)).To(ContainSubstring(
			`User %q cannot update resource "machines/reboot" in API group %q in the namespace %q`, user, subresourcesv1.GroupName, ns))
		unchanged(g, ctx, m)
	}

	// The same certificate and user get through for the verb RBAC grants,
	// so the refusals above were the authorizer's, not the authenticator's.
	// RBAC's cache in kube-apiserver takes a moment to see the binding.
	var body string
	g.Eventually(func() int {
		var code int
		var err error
		code, body, err = putDirect(ctx, c, repairer, ns, "m0", "repair", "{}")
		g.Expect(err).NotTo(HaveOccurred())
		return code
	}).WithTimeout(wait).Should(Equal(http.StatusAccepted), func() string { return body })
	g.Expect(get(g, ctx, m).Status.Operation).To(And(
		HaveField("Type", machinistv1.OperationRepair), HaveField("RequestedBy", repairer)))
}

// TestRacingRequestsHaveOneWinner releases several reboots of one Machine
// at once: exactly one is recorded, and every other is refused with 409.
func TestRacingRequestsHaveOneWinner(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: `{"rebootLatency":"1m"}`})
	running(t, ctx, ns, "m0", "small")

	const racers = 8
	type answer struct {
		code int
		body string
	}
	answers := make([]answer, racers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			<-start
			code, body := put(ctx, operator, ns, "m0", "reboot", `{"drain":false}`)
			answers[i] = answer{code, body}
		})
	}
	close(start)
	wg.Wait()

	var winners []subresourcesv1.MachineOperation
	conflicts := 0
	for _, a := range answers {
		switch a.code {
		case http.StatusAccepted:
			var op subresourcesv1.MachineOperation
			g.Expect(json.Unmarshal([]byte(a.body), &op)).To(Succeed(), a.body)
			winners = append(winners, op)
		case http.StatusConflict:
			conflicts++
			g.Expect(statusMessage(g, a.body)).To(Or(ContainSubstring("already has reboot operation"), ContainSubstring("is Rebooting")), a.body)
		default:
			t.Errorf("got %d: %s", a.code, a.body)
		}
	}
	g.Expect(winners).To(HaveLen(1), "answers: %v", answers)
	g.Expect(conflicts).To(Equal(racers - 1))
	op := get(g, ctx, &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m0"}}).Status.Operation
	g.Expect(op).NotTo(BeNil())
	g.Expect(op.ID).To(Equal(winners[0].ID), "the stored operation is the one answered 202")
	g.Expect(op.RequestedAt.Time).To(BeTemporally("==", winners[0].RequestedAt.Time))
}

// TestBodiesRefusedBeforeTheMachine sends bodies the server must refuse
// before it looks at the Machine: too large (413) and two JSON objects
// (400). Neither may write anything, and the Machine does accept a
// request afterwards, so the refusals were the bodies' doing.
func TestBodiesRefusedBeforeTheMachine(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: `{"rebootLatency":"1m"}`})
	m := running(t, ctx, ns, "m0", "small")

	for _, tc := range []struct {
		name, verb, body string
		code             int
		says             string
	}{
		{"oversized", "repair", `{"reason":"` + strings.Repeat("x", 64<<10) + `"}`, http.StatusRequestEntityTooLarge, "options bodies are at most 65536 bytes"},
		{"two objects", "reboot", `{"mode":"hard"} {"mode":"soft"}`, http.StatusBadRequest, "the body holds more than one JSON object"},
		// A decoder's More is false before a closing bracket: the body
		// was taken as {"mode":"hard"}.
		{"a bracket after the object", "reboot", `{"mode":"hard"}]`, http.StatusBadRequest, "or something after it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			code, body := put(ctx, operator, ns, "m0", tc.verb, tc.body)
			g.Expect(code).To(Equal(tc.code), body)
			g.Expect(statusMessage(g, body)).To(ContainSubstring(tc.says))
			unchanged(g, ctx, m)
		})
	}

	g := NewWithT(t)
	code, body := put(ctx, operator, ns, "m0", "reboot", `{"mode":"hard"}`)
	g.Expect(code).To(Equal(http.StatusAccepted), body)
}
