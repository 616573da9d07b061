package apiserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// TestAPausedMachineRefusesVerbsAndWaits: a verb on a paused Machine is
// 409 and says why; a request by annotation waits, untaken, for the
// resume; the Paused condition is written once each way; and once
// resumed, the Machine does what it was asked.
func TestAPausedMachineRefusesVerbsAndWaits(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env.NewNamespace(t, "paused", testenv.Small)
	m := running(t, ctx, ns, "m", "small")
	boot := m.Status.BootID

	annotate(g, ctx, m, map[string]any{machinistv1.PausedAnnotation: ""})
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(get(g, ctx, m).Status.Conditions, machinistv1.ConditionPaused)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(machinistv1.ReasonPaused))
	}).WithTimeout(wait).Should(Succeed())

	code, body := put(ctx, operator, ns, "m", "reboot", "{}")
	g.Expect(code).To(Equal(http.StatusConflict), body)
	var status metav1.Status
	g.Expect(json.Unmarshal([]byte(body), &status)).To(Succeed(), body)
	g.Expect(status.Message).To(ContainSubstring("the Machine is paused: the Machine has the annotation machinist.dev/paused"))
	g.Expect(status.Message).To(ContainSubstring("kubectl annotate machine m machinist.dev/paused-"))

	// The annotation's way to ask waits too, and nothing is written.
	annotate(g, ctx, m, map[string]any{machinistv1.RequestAnnotation: "reboot"})
	paused := get(g, ctx, m)
	g.Consistently(func(g Gomega) {
		now := get(g, ctx, m)
		g.Expect(now.ResourceVersion).To(Equal(paused.ResourceVersion), "a paused Machine was written")
		g.Expect(now.Status.Operation).To(BeNil())
	}).WithTimeout(3 * time.Second).Should(Succeed())

	annotate(g, ctx, m, map[string]any{machinistv1.PausedAnnotation: nil})
	g.Eventually(func(g Gomega) {
		now := get(g, ctx, m)
		c := meta.FindStatusCondition(now.Status.Conditions, machinistv1.ConditionPaused)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(machinistv1.ReasonNotPaused))
		g.Expect(now.Status.Phase).To(Equal(machinistv1.MachineRunning))
		g.Expect(now.Status.BootID).NotTo(Equal(boot), "the request made while paused is carried out")
		g.Expect(now.Annotations).NotTo(HaveKey(machinistv1.RequestAnnotation))
	}).WithTimeout(wait).Should(Succeed())
	code, body = put(ctx, operator, ns, "m", "reboot", "{}")
	g.Expect(code).To(Equal(http.StatusAccepted), body)
}

// annotate merges annotations into m's (nil removes one).
func annotate(g Gomega, ctx context.Context, m *machinistv1.Machine, annotations map[string]any) {
	raw, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(env.Client.Patch(ctx, m.DeepCopy(), client.RawPatch("application/merge-patch+json", raw))).To(Succeed())
}
