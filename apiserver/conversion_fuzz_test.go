package apiserver_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/machinist-dev/machinist/apiserver"
)

// countedBody is a request body that counts what is read of it.
type countedBody struct {
	r io.Reader
	n int
}

func (c *countedBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// FuzzConversion posts whatever body to the conversion webhook, as
// anyone who reaches the path may. It never panics and never reads more
// than its limit; it answers 400 or 413, or 200 with a ConversionReview
// for the request's UID that either failed, saying why, or converted
// every object to the version asked for, kind and identity unchanged, as
// kube-apiserver requires of it; and what it writes stays within a
// multiple of what it read.
func FuzzConversion(f *testing.F) {
	h := apiserver.Conversion()
	f.Fuzz(func(t *testing.T, body []byte) {
		in := &countedBody{r: bytes.NewReader(body)}
		req := httptest.NewRequest(http.MethodPost, apiserver.ConversionPath, in)
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if in.n > apiserver.MaxConversionBody+1 {
			t.Fatalf("read %d bytes, past the limit of %d", in.n, apiserver.MaxConversionBody)
		}
		if most := 16*len(body) + 1024; w.Body.Len() > most {
			t.Fatalf("%q: answered %d bytes, more than %d", body, w.Body.Len(), most)
		}
		switch w.Code {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return
		case http.StatusOK:
		default:
			t.Fatalf("%q: answered %d: %s", body, w.Code, w.Body)
		}
		// Read as the handler reads it: its first JSON value.
		var review apiextensionsv1.ConversionReview
		if err := json.NewDecoder(bytes.NewReader(body)).Decode(&review); err != nil || review.Request == nil {
			t.Fatalf("%q, not a ConversionReview (%v), answered 200: %s", body, err, w.Body)
		}
		var answer apiextensionsv1.ConversionReview
		if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil || answer.Response == nil {
			t.Fatalf("%q: the answer %s is not a ConversionReview with a response (%v)", body, w.Body, err)
		}
		resp := answer.Response
		if resp.UID != review.Request.UID {
			t.Fatalf("%q: answered for UID %q, not %q", body, resp.UID, review.Request.UID)
		}
		if resp.Result.Status != metav1.StatusSuccess {
			if resp.Result.Status != metav1.StatusFailure || resp.Result.Message == "" {
				t.Fatalf("%q: neither converted nor said why: %+v", body, resp.Result)
			}
			return
		}
		if len(resp.ConvertedObjects) != len(review.Request.Objects) {
			t.Fatalf("%q: %d objects converted of %d", body, len(resp.ConvertedObjects), len(review.Request.Objects))
		}
		for i, raw := range resp.ConvertedObjects {
			var from, to unstructured.Unstructured
			if err := from.UnmarshalJSON(review.Request.Objects[i].Raw); err != nil {
				t.Fatalf("%q: object %d, %s, is not an object (%v) but was converted", body, i, review.Request.Objects[i].Raw, err)
			}
			if err := to.UnmarshalJSON(raw.Raw); err != nil {
				t.Fatalf("%q: converted object %d, %s, is not an object: %v", body, i, raw.Raw, err)
			}
			if to.GetAPIVersion() != review.Request.DesiredAPIVersion || to.GetKind() != from.GetKind() {
				t.Fatalf("%q: a %s %s was converted to a %s %s, asked for %s", body, from.GetAPIVersion(), from.GetKind(), to.GetAPIVersion(), to.GetKind(), review.Request.DesiredAPIVersion)
			}
			if to.GetName() != from.GetName() || to.GetNamespace() != from.GetNamespace() || to.GetUID() != from.GetUID() ||
				to.GetResourceVersion() != from.GetResourceVersion() || to.GetGeneration() != from.GetGeneration() {
				t.Fatalf("%q: object %d changed identity: %s became %s", body, i, review.Request.Objects[i].Raw, raw.Raw)
			}
		}
	})
}
