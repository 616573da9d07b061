package apiserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// putOnce is put without client-go's retries, which would sleep through
// a 429's Retry-After.
func putOnce(ctx context.Context, user, ns, name, verb string) (int, metav1.Status) {
	var code int
	res := as(user).Put().AbsPath(verbPath(ns, name, verb)).SetHeader("Content-Type", "application/json").
		Body([]byte("{}")).MaxRetries(0).Do(ctx).StatusCode(&code)
	raw, _ := res.Raw()
	var status metav1.Status
	_ = json.Unmarshal(raw, &status)
	return code, status
}

// TestABudgetRefusesWithTooManyRequests: with a budget of one, a second
// reboot is answered 429 with a Retry-After and a message naming the
// budget, and changes nothing; once the first is over, it is admitted. A
// closed window's Retry-After is the time to its opening.
func TestABudgetRefusesWithTooManyRequests(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	// A reboot that lasts, so that the second request surely finds the
	// first still counted.
	ns := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: `{"rebootLatency":"5s"}`})
	first := running(t, ctx, ns, "first", "small")
	second := running(t, ctx, ns, "second", "small")
	g.Expect(env.Client.Create(ctx, &machinistv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "one"},
		Spec:       machinistv1.MachineDisruptionBudgetSpec{MaxDisrupted: intstr.FromInt32(1), Selector: everyMachine},
	})).To(Succeed())

	code, body := put(ctx, operator, ns, first.Name, "reboot", "{}")
	g.Expect(code).To(Equal(http.StatusAccepted), body)
	code, status := putOnce(ctx, operator, ns, second.Name, "reboot")
	g.Expect(code).To(Equal(http.StatusTooManyRequests), status.Message)
	g.Expect(status.Reason).To(Equal(metav1.StatusReasonTooManyRequests))
	g.Expect(status.Message).To(Equal(fmt.Sprintf(
		"MachineDisruptionBudget one allows no more disruptions: 1 of its 2 Machines are disrupted and it allows 1; the reboot of Machine %s/second waits until one is back", ns)))
	g.Expect(status.Details).NotTo(BeNil())
	g.Expect(status.Details.RetryAfterSeconds).To(Equal(int32(10)))
	g.Expect(status.Details.Causes).To(ConsistOf(metav1.StatusCause{
		Type: machinistv1.CauseDisruptionBudget, Message: status.Message, Field: "machinedisruptionbudget/one",
	}), "a client finds the budget by the cause's type")
	unchanged(g, ctx, second)

	// The header, as the verbs server sends it.
	direct, headers := putDirectHeaders(t, ctx, ns, second.Name, "repair")
	g.Expect(direct).To(Equal(http.StatusTooManyRequests))
	g.Expect(headers.Get("Retry-After")).To(Equal("10"))
	unchanged(g, ctx, second)

	// Once the first reboot is over, the second is admitted.
	g.Eventually(func(g Gomega) {
		op := get(g, ctx, first).Status.Operation
		g.Expect(op).NotTo(BeNil())
		g.Expect(op.State).To(Equal(machinistv1.OperationSucceeded))
	}).WithTimeout(wait).Should(Succeed())
	code, status = putOnce(ctx, operator, ns, second.Name, "reboot")
	g.Expect(code).To(Equal(http.StatusAccepted), status.Message)

	// A window that opens in two hours.
	closedNS := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: ""})
	third := running(t, ctx, closedNS, "third", "small")
	opens := time.Now().UTC().Add(2 * time.Hour).Truncate(time.Minute)
	g.Expect(env.Client.Create(ctx, &machinistv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: closedNS, Name: "nightly"},
		Spec: machinistv1.MachineDisruptionBudgetSpec{MaxDisrupted: intstr.FromInt32(1), Selector: everyMachine, Windows: []machinistv1.DisruptionWindow{{
			Schedule: fmt.Sprintf("%d %d * * *", opens.Minute(), opens.Hour()), Duration: metav1.Duration{Duration: time.Hour},
		}}},
	})).To(Succeed())
	code, status = putOnce(ctx, operator, closedNS, third.Name, "reboot")
	g.Expect(code).To(Equal(http.StatusTooManyRequests), status.Message)
	g.Expect(status.Message).To(ContainSubstring("MachineDisruptionBudget nightly allows no disruption now"))
	g.Expect(status.Message).To(ContainSubstring("opens at " + opens.Format(time.RFC3339)))
	g.Expect(status.Details.RetryAfterSeconds).To(BeNumerically("~", time.Until(opens).Seconds(), 5))
	unchanged(g, ctx, third)
}

// putDirectHeaders sends a verb straight to the verbs server and returns
// the status code and the response headers.
func putDirectHeaders(t *testing.T, ctx context.Context, ns, name, verb string) (int, http.Header) {
	t.Helper()
	c := asFrontProxy(t)
	url := "https://127.0.0.1:" + strconv.Itoa(verbs.Server.Port) + verbPath(ns, name, verb)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Remote-User", operator)
	req.Header.Set("X-Remote-Group", "system:authenticated")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// TestOverridingABudgetNeedsItsOwnPermission: an operator may reboot, but
// overriding a budget needs the verb override on machinedisruptionbudgets;
// granted it, the reboot starts although the budget allows nothing, and is
// recorded in the budget so that the others count it.
func TestOverridingABudgetNeedsItsOwnPermission(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "verbs", testenv.Class{Name: testenv.Small.Name, Spec: `{"rebootLatency":"3s"}`})
	m := running(t, ctx, ns, "urgent", "small")
	budget := &machinistv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "none"},
		Spec:       machinistv1.MachineDisruptionBudgetSpec{MaxDisrupted: intstr.FromInt32(0), Selector: everyMachine},
	}
	g.Expect(env.Client.Create(ctx, budget)).To(Succeed())
	override := `{"kind":"RebootOptions","apiVersion":"subresources.machinist.dev/v1alpha1","overrideDisruptionBudgets":true}`

	code, body := put(ctx, operator, ns, m.Name, "reboot", override)
	g.Expect(code).To(Equal(http.StatusForbidden), body)
	g.Expect(statusMessage(g, body)).To(ContainSubstring(fmt.Sprintf(
		`user %q may not override the MachineDisruptionBudgets of namespace %q: overrideDisruptionBudgets needs the verb override on machinedisruptionbudgets.machinist.dev there`, operator, ns)))
	unchanged(g, ctx, m)

	g.Expect(env.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "budget-override"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"machinist.dev"}, Resources: []string{"machinedisruptionbudgets"}, Verbs: []string{"override"}}},
	})).To(Succeed())
	g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "budget-override"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "budget-override"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: operator}},
	})).To(Succeed())
	// RBAC is read from a cache: the grant shows within a moment.
	g.Eventually(func() int {
		code, _ := put(ctx, operator, ns, m.Name, "reboot", override)
		return code
	}).WithTimeout(wait).Should(Equal(http.StatusAccepted))
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(budget), budget)).To(Succeed())
		g.Expect(budget.Status.Disruptions).To(ContainElement(HaveField("Machine", m.Name)), "the override is counted")
	}).WithTimeout(wait).Should(Succeed())
	g.Eventually(func(g Gomega) {
		op := get(g, ctx, m).Status.Operation
		g.Expect(op).NotTo(BeNil())
		g.Expect(op.Options.OverrideDisruptionBudgets).To(BeTrue())
		g.Expect(op.State).To(Equal(machinistv1.OperationSucceeded), op.Message)
	}).WithTimeout(wait).Should(Succeed())
}

// everyMachine selects every Machine, as v1beta1 asks it to be said: an
// empty selector is refused.
var everyMachine = machinistv1.LabelSelector{MatchExpressions: []machinistv1.LabelSelectorRequirement{{Key: "example.com/nothing", Operator: metav1.LabelSelectorOpDoesNotExist}}}
