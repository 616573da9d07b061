package apiserver_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/apiserver"
)

// betaClient speaks v1beta1 to the test control plane.
func betaClient(t *testing.T) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1beta1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTheVerbsServerConverts points the MachineDrainRule CRD's conversion
// webhook at the running verbs server, as config/crd does in a cluster,
// and reads and writes a rule at both versions through kube-apiserver: the
// server's certificate, its /convert path and its letting kube-apiserver
// in without credentials are what make this work.
func TestTheVerbsServerConverts(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	key := client.ObjectKey{Name: "machinedrainrules.machinist.dev"}
	g.Expect(env.Client.Get(ctx, key, crd)).To(Succeed())
	before := crd.Spec.Conversion.DeepCopy()
	patch := client.MergeFrom(crd.DeepCopy())
	crd.Spec.Conversion = apiserver.WebhookConversion(fmt.Sprintf("https://localhost:%d%s", verbs.Server.Port, apiserver.ConversionPath), types.NamespacedName{}, verbs.Server.CABundle)
	g.Expect(env.Client.Patch(ctx, crd, patch)).To(Succeed())
	t.Cleanup(func() {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := env.Client.Get(ctx, key, crd); err != nil {
			t.Error(err)
			return
		}
		patch := client.MergeFrom(crd.DeepCopy())
		crd.Spec.Conversion = before
		if err := env.Client.Patch(ctx, crd, patch); err != nil {
			t.Error(err)
		}
	})

	ns := env.NewNamespace(t, "convert")
	beta := betaClient(t)
	rule := &v1beta1.MachineDrainRule{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "databases-last"},
		Spec: v1beta1.MachineDrainRuleSpec{
			Behavior: v1beta1.DrainBehaviorDrain, Order: ptr.To[int32](100),
			Machines: []v1beta1.MachineDrainRuleMachineSelector{{Selector: v1beta1.LabelSelector{MatchLabels: map[string]string{"pool": "db"}}}},
		},
	}
	// The CRD's handler is rebuilt after the change; the first requests
	// may still meet the old one.
	g.Eventually(func() error { return beta.Create(ctx, rule) }).WithTimeout(30 * time.Second).Should(Succeed())
	alpha := &machinistv1.MachineDrainRule{}
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(rule), alpha)).To(Succeed())
		g.Expect(alpha.Spec.Drain).To(Equal(machinistv1.MachineDrainRuleDrain{Behavior: machinistv1.DrainBehaviorDrain, Order: ptr.To[int32](100)}))
	}).WithTimeout(30 * time.Second).Should(Succeed())

	// Written at v1alpha1, read at v1beta1 (its storage version): the
	// verbs server converts each way.
	alpha.Spec.Drain.Order = ptr.To[int32](200)
	g.Expect(env.Client.Update(ctx, alpha)).To(Succeed())
	g.Expect(beta.Get(ctx, client.ObjectKeyFromObject(rule), rule)).To(Succeed())
	g.Expect(rule.Spec.Order).To(HaveValue(BeEquivalentTo(200)))
}

// TestAFieldOnlyOneVersionHasSurvivesTheOther: a class written at v1alpha1
// with a taint's timeAdded, which v1beta1 has no field for, is changed by
// a v1beta1 client and read back at v1alpha1 with the time unchanged.
func TestAFieldOnlyOneVersionHasSurvivesTheOther(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "convert")
	added := metav1.Unix(1767225600, 0)
	class := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpu"},
		Spec: machinistv1.MachineClassSpec{Provider: "inmemory", NodeTemplate: &machinistv1.NodeTemplate{
			Labels: map[string]string{"gpu": "a100"},
			Taints: machinistv1.NodeTaints{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule, TimeAdded: &added}},
		}},
	}
	g.Expect(env.Client.Create(ctx, class)).To(Succeed())

	beta := betaClient(t)
	got := &v1beta1.MachineClass{}
	g.Expect(beta.Get(ctx, client.ObjectKeyFromObject(class), got)).To(Succeed())
	g.Expect(got.Spec.NodeTemplate.NodeLabels).To(HaveKeyWithValue("gpu", "a100"))
	g.Expect(got.Spec.NodeTemplate.NodeTaints).To(Equal(v1beta1.NodeTaints{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule}}))
	g.Expect(got.Annotations).To(HaveKey(machinistv1.ConversionDataAnnotation))
	got.Spec.NodeTemplate.NodeLabels["zone"] = "a"
	g.Expect(beta.Update(ctx, got)).To(Succeed())

	back := &machinistv1.MachineClass{}
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(class), back)).To(Succeed())
	g.Expect(back.Spec.NodeTemplate.Labels).To(Equal(map[string]string{"gpu": "a100", "zone": "a"}))
	g.Expect(back.Spec.NodeTemplate.Taints).To(HaveLen(1))
	g.Expect(back.Spec.NodeTemplate.Taints[0].TimeAdded).NotTo(BeNil())
	g.Expect(back.Spec.NodeTemplate.Taints[0].TimeAdded.Equal(&added)).To(BeTrue(), "timeAdded %v", back.Spec.NodeTemplate.Taints[0].TimeAdded)
	g.Expect(back.Annotations).NotTo(HaveKey(machinistv1.ConversionDataAnnotation), "the annotation is the conversion's, not the reader's")
}

// TestWhenTheWebhookIsDown: a request at the version objects are stored
// at, v1beta1, needs no conversion and goes on; one at v1alpha1 fails with
// an error that names the webhook, and works again once it is back.
func TestWhenTheWebhookIsDown(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "convert")
	beta := betaClient(t)
	class := &v1beta1.MachineClass{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "small"}, Spec: v1beta1.MachineClassSpec{Provider: "inmemory"}}
	g.Expect(beta.Create(ctx, class)).To(Succeed())

	g.Expect(env.StopConversion()).To(Succeed())
	t.Cleanup(func() { _ = env.StartConversion() })

	// At v1beta1, the storage version: create, read, list, update, delete.
	other := &v1beta1.MachineClass{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "large"}, Spec: v1beta1.MachineClassSpec{Provider: "inmemory"}}
	g.Expect(beta.Create(ctx, other)).To(Succeed())
	g.Expect(beta.Get(ctx, client.ObjectKeyFromObject(class), class)).To(Succeed())
	list := &v1beta1.MachineClassList{}
	g.Expect(beta.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	g.Expect(list.Items).To(HaveLen(2))
	class.Labels = map[string]string{"tier": "small"}
	g.Expect(beta.Update(ctx, class)).To(Succeed())
	g.Expect(beta.Delete(ctx, other)).To(Succeed())

	// At v1alpha1: refused, saying why.
	err := env.Client.Get(ctx, client.ObjectKeyFromObject(class), &machinistv1.MachineClass{})
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("conversion webhook"))
	err = env.Client.Create(ctx, &machinistv1.MachineClass{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alpha"}, Spec: machinistv1.MachineClassSpec{Provider: "inmemory"}})
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("conversion webhook"))

	g.Expect(env.StartConversion()).To(Succeed())
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(class), &machinistv1.MachineClass{})
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

// TestTheConversionPathNeedsNoCredentials posts a ConversionReview to the
// verbs server as kube-apiserver does, without a client certificate, and
// checks every other path still refuses such a caller.
func TestTheConversionPathNeedsNoCredentials(t *testing.T) {
	g := NewWithT(t)
	pool := x509.NewCertPool()
	g.Expect(pool.AppendCertsFromPEM(verbs.Server.CABundle)).To(BeTrue())
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := fmt.Sprintf("https://localhost:%d", verbs.Server.Port)

	review := apiextensionsv1.ConversionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "ConversionReview"},
		Request: &apiextensionsv1.ConversionRequest{UID: "1", DesiredAPIVersion: "machinist.dev/v1beta1", Objects: []runtime.RawExtension{{
			Raw: []byte(`{"apiVersion":"machinist.dev/v1alpha1","kind":"MachineDisruptionBudget","metadata":{"name":"b"},"spec":{"selector":{"matchLabels":{"a":"b"}},"maxDisrupted":1,"reasons":["InPlaceUpdate"]}}`),
		}}},
	}
	body, err := json.Marshal(review)
	g.Expect(err).NotTo(HaveOccurred())
	resp, err := hc.Post(base+apiserver.ConversionPath, "application/json", bytes.NewReader(body))
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	var answer apiextensionsv1.ConversionReview
	g.Expect(json.NewDecoder(resp.Body).Decode(&answer)).To(Succeed())
	g.Expect(answer.Response.Result.Status).To(Equal(metav1.StatusSuccess), "%+v", answer.Response.Result)
	g.Expect(answer.Response.ConvertedObjects).To(HaveLen(1))
	g.Expect(string(answer.Response.ConvertedObjects[0].Raw)).To(And(ContainSubstring(`"apiVersion":"machinist.dev/v1beta1"`), ContainSubstring(`"reasons":["Update"]`)))

	resp, err = hc.Get(base + "/apis/" + "subresources.machinist.dev/v1alpha1")
	g.Expect(err).NotTo(HaveOccurred())
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), "a caller without credentials outside /convert")
}

// TestTheCABundleGoesIntoServiceWebhooksOnce: a CRD whose webhook is the
// verbs Service (as config/crd declares it) gets the server's CA; a second
// start with the same CA changes nothing stored; a CRD named by URL is left
// alone.
func TestTheCABundleGoesIntoServiceWebhooksOnce(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	key := client.ObjectKey{Name: "machinedrainrules.machinist.dev"}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(env.Client.Get(ctx, key, crd)).To(Succeed())
	before := crd.Spec.Conversion.DeepCopy()
	t.Cleanup(func() {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := env.Client.Get(ctx, key, crd); err != nil {
			t.Error(err)
			return
		}
		crd.Spec.Conversion = before
		if err := env.Client.Update(ctx, crd); err != nil {
			t.Error(err)
		}
	})
	crd.Spec.Conversion = apiserver.WebhookConversion("", types.NamespacedName{Namespace: "machinist-system", Name: "machinist-verbs"}, nil)
	g.Expect(env.Client.Update(ctx, crd)).To(Succeed())

	urlBefore := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "machines.machinist.dev"}, urlBefore)).To(Succeed())

	g.Expect(apiserver.SetConversionCABundle(ctx, env.Client, verbs.Server.CABundle)).To(Succeed())
	g.Expect(env.Client.Get(ctx, key, crd)).To(Succeed())
	g.Expect(crd.Spec.Conversion.Webhook.ClientConfig.CABundle).To(Equal(verbs.Server.CABundle))
	version := crd.ResourceVersion

	g.Expect(apiserver.SetConversionCABundle(ctx, env.Client, verbs.Server.CABundle)).To(Succeed())
	g.Expect(env.Client.Get(ctx, key, crd)).To(Succeed())
	g.Expect(crd.ResourceVersion).To(Equal(version), "the same CA again changes nothing stored")

	urlAfter := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "machines.machinist.dev"}, urlAfter)).To(Succeed())
	g.Expect(urlAfter.ResourceVersion).To(Equal(urlBefore.ResourceVersion), "a webhook named by URL is left alone")
}
