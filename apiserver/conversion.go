package apiserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/conversion"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/api/v1beta1"
)

// ConversionPath is where the verbs server answers the CRDs' conversion
// webhook: kube-apiserver posts a ConversionReview there whenever a client
// asks for a version other than the one an object is stored at.
const ConversionPath = "/convert"

// CRDs are the names of the CustomResourceDefinitions whose versions the
// conversion webhook converts between.
var CRDs = []string{
	"machines.machinist.dev", "machineclasses.machinist.dev", "machinesets.machinist.dev",
	"machinedeployments.machinist.dev", "machinehealthchecks.machinist.dev",
	"machinedisruptionbudgets.machinist.dev", "machinedrainrules.machinist.dev",
	"workloadclusters.machinist.dev",
}

// Conversion is the conversion webhook: controller-runtime's handler over
// every version of the API, converting through the hub, v1beta1, behind
// a bound on the body (MaxConversionBody).
func Conversion() http.Handler {
	s := runtime.NewScheme()
	if err := machinistv1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1beta1.AddToScheme(s); err != nil {
		panic(err)
	}
	return limitBody(conversion.NewWebhookHandler(s, conversion.NewRegistry()), MaxConversionBody)
}

// MaxConversionBody is the largest ConversionReview /convert reads; a
// larger one is answered 413 Request Entity Too Large, and no more of it
// than this is read. The path takes requests without credentials, and
// controller-runtime's handler bounds nothing: it would read and decode a
// body of any size. (The verbs server's HTTP/2 flow control lets a client
// have only 256 KiB in flight, which paces a long body without ending it.)
//
// It is kube-apiserver's own bound on a request's body, 3 MiB, because
// kube-apiserver sends one object per review, never a list: 3,000
// Machines listed at v1alpha1, with and without its watch cache, in
// kubectl's pages and without a limit, were 3,000 reviews of one object
// each (the largest 3,977 bytes; docs/api.md). An object reaches
// the webhook from storage, where kube-apiserver writes at most 2 MiB
// (its etcd client's bound on a message; etcd's own is 1.5 MiB unless
// raised), or from a client's request of
// at most 3 MiB, which kube-apiserver may make larger (it writes '<', '>'
// and '&' as six bytes each), but then the object is larger in storage
// too, and refused there anyway. 3 MiB refuses no review kube-apiserver
// could have stored the object of.
const MaxConversionBody = 3 << 20

// limitBody reads at most max bytes of a request's body before next sees
// it, and answers 413 for a larger one.
func limitBody(next http.Handler, max int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			tooLarge(w, max)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
		if err != nil {
			http.Error(w, fmt.Sprintf("reading the ConversionReview: %v", err), http.StatusBadRequest)
			return
		}
		if int64(len(body)) > max {
			tooLarge(w, max)
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		next.ServeHTTP(w, r)
	})
}

func tooLarge(w http.ResponseWriter, max int64) {
	http.Error(w, fmt.Sprintf("a ConversionReview is at most %d bytes", max), http.StatusRequestEntityTooLarge)
}

// WebhookConversion is the conversion a Machinist CRD declares: the
// conversion webhook at url (a server on kube-apiserver's own host) or,
// when url is empty, behind service on port 443, trusting caBundle.
func WebhookConversion(url string, service types.NamespacedName, caBundle []byte) *apiextensionsv1.CustomResourceConversion {
	cfg := &apiextensionsv1.WebhookClientConfig{CABundle: caBundle}
	if url != "" {
		cfg.URL = &url
	} else {
		path, port := ConversionPath, int32(443)
		cfg.Service = &apiextensionsv1.ServiceReference{Namespace: service.Namespace, Name: service.Name, Path: &path, Port: &port}
	}
	return &apiextensionsv1.CustomResourceConversion{
		Strategy: apiextensionsv1.WebhookConverter,
		Webhook:  &apiextensionsv1.WebhookConversion{ClientConfig: cfg, ConversionReviewVersions: []string{"v1"}},
	}
}

// ConvertThrough makes every CRD in crds that serves more than one version
// convert through the webhook at url, trusting caBundle. It is for CRDs
// about to be installed: a CRD must never serve two versions without its
// webhook, or kube-apiserver would convert by changing apiVersion alone.
func ConvertThrough(crds []*apiextensionsv1.CustomResourceDefinition, url string, caBundle []byte) {
	for _, crd := range crds {
		if len(crd.Spec.Versions) > 1 {
			crd.Spec.Conversion = WebhookConversion(url, types.NamespacedName{}, caBundle)
		}
	}
}

// SetConversionCABundle writes caBundle into the conversion webhook of
// each of Machinist's CRDs whose webhook is a Service (config/crd declares
// it without a caBundle): a verbs server that made its own CA calls it at
// start, as it sets its APIService's. A CRD that is missing, converts
// otherwise or names its webhook by URL (a server on kube-apiserver's
// host, with a CA of its own) is left alone.
func SetConversionCABundle(ctx context.Context, c client.Client, caBundle []byte) error {
	for _, name := range CRDs {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("reading CRD %s to set its conversion webhook's caBundle: %w", name, err)
		}
		conv := crd.Spec.Conversion
		if conv == nil || conv.Strategy != apiextensionsv1.WebhookConverter || conv.Webhook == nil ||
			conv.Webhook.ClientConfig == nil || conv.Webhook.ClientConfig.Service == nil {
			continue
		}
		if bytes.Equal(conv.Webhook.ClientConfig.CABundle, caBundle) {
			continue // a restart with the same CA sends no request
		}
		patch := client.MergeFrom(crd.DeepCopy())
		conv.Webhook.ClientConfig.CABundle = caBundle
		if err := c.Patch(ctx, crd, patch); err != nil {
			return fmt.Errorf("setting the caBundle of CRD %s's conversion webhook: %w", name, err)
		}
	}
	return nil
}

// InstallCRDs creates or updates crds, converting through the webhook at
// url that trusts caBundle, and waits until each is established. It
// installs them itself because envtest's installation replaces the
// conversion of a CRD whose kinds its scheme cannot convert: the CRD would
// then serve two versions converting by apiVersion alone.
func InstallCRDs(ctx context.Context, c client.Client, crds []*apiextensionsv1.CustomResourceDefinition, url string, caBundle []byte) error {
	ConvertThrough(crds, url, caBundle)
	for _, crd := range crds {
		crd = crd.DeepCopy()
		existing := &apiextensionsv1.CustomResourceDefinition{}
		err := c.Get(ctx, client.ObjectKeyFromObject(crd), existing)
		switch {
		case apierrors.IsNotFound(err):
			err = c.Create(ctx, crd)
		case err == nil:
			crd.ResourceVersion = existing.ResourceVersion
			err = c.Update(ctx, crd)
		}
		if err != nil {
			return fmt.Errorf("installing CRD %s: %w", crd.Name, err)
		}
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, crd := range crds {
			got := &apiextensionsv1.CustomResourceDefinition{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(crd), got); err != nil {
				return false, nil
			}
			established := false
			for _, cond := range got.Status.Conditions {
				established = established || (cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue)
			}
			if !established {
				return false, nil
			}
		}
		return true, nil
	})
}
