package apiserver_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/apiserver"
)

// convertClient posts to the verbs server as kube-apiserver does: over
// HTTP/2, trusting the server's CA, without credentials.
func convertClient(t *testing.T) (*http.Client, string) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(verbs.Server.CABundle) {
		t.Fatal("the verbs server's CA bundle holds no certificate")
	}
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true,
	}}
	return hc, fmt.Sprintf("https://localhost:%d%s", verbs.Server.Port, apiserver.ConversionPath)
}

// reviewOf is a ConversionReview of objects to v1beta1, as kube-apiserver
// writes one, padded with spaces after its last object to size bytes
// (none when size is 0).
func reviewOf(t *testing.T, size int, objects ...string) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteString(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"1","desiredAPIVersion":"machinist.dev/v1beta1","objects":[`)
	b.WriteString(strings.Join(objects, ","))
	const end = `]}}`
	if pad := size - b.Len() - len(end); size > 0 {
		if pad < 0 {
			t.Fatalf("the objects take %d bytes, more than %d", b.Len()+len(end), size)
		}
		b.WriteString(strings.Repeat(" ", pad))
	}
	b.WriteString(end)
	return b.Bytes()
}

// alphaClass is a v1alpha1 MachineClass whose providerSpec carries pad,
// as a provider's image, network and user data would.
func alphaClass(name, pad string) string {
	return `{"apiVersion":"machinist.dev/v1alpha1","kind":"MachineClass","metadata":{"name":"` + name + `","namespace":"big"},` +
		`"spec":{"provider":"inmemory","providerSpec":{"userData":"` + pad + `"}}}`
}

// countingReader hands out n bytes of a valid ConversionReview, one
// object after another, counting what was read.
type countingReader struct {
	head, each, tail []byte
	n, read          int64
	mu               sync.Mutex
}

func (r *countingReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.read >= r.n {
		return 0, io.EOF
	}
	i := 0
	for i < len(p) && r.read < r.n {
		var src []byte
		switch {
		case r.read < int64(len(r.head)):
			src = r.head[r.read:]
		case r.read >= r.n-int64(len(r.tail)):
			src = r.tail[r.read-(r.n-int64(len(r.tail))):]
		default:
			off := (r.read - int64(len(r.head))) % int64(len(r.each))
			src = r.each[off:]
			if left := r.n - int64(len(r.tail)) - r.read; int64(len(src)) > left {
				src = src[:left]
			}
		}
		c := copy(p[i:], src)
		i += c
		r.read += int64(c)
	}
	return i, nil
}

func (r *countingReader) sent() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.read
}

// TestTheConversionPathRefusesABodyOverItsLimit posts ConversionReviews
// to the verbs server as kube-apiserver would, anonymously: one of 100
// MiB is answered 413 once the server has read its limit, without the
// server reading the rest, and whether or not it says its length first;
// one of exactly the limit converts, one byte more is refused.
func TestTheConversionPathRefusesABodyOverItsLimit(t *testing.T) {
	hc, url := convertClient(t)

	// 100 MiB of well-formed review: without a limit, all of it would be
	// read and decoded.
	huge := func() *countingReader {
		r := &countingReader{
			head: []byte(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"1","desiredAPIVersion":"machinist.dev/v1beta1","objects":[`),
			each: []byte(alphaClass("c", "x") + ","),
			tail: []byte(alphaClass("c", "x") + `]}}`),
		}
		objects := (100<<20 - len(r.head) - len(r.tail)) / len(r.each)
		r.n = int64(len(r.head) + objects*len(r.each) + len(r.tail))
		return r
	}
	for _, known := range []bool{false, true} {
		body := huge()
		req, err := http.NewRequest(http.MethodPost, url, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.ContentLength = -1 // streamed: the server cannot know the size before it reads
		if known {
			req.ContentLength = body.n
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("length known %v: %v (after %d bytes sent)", known, err, body.sent())
		}
		msg, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("length known %v: a body of 100 MiB got %s after %d bytes sent: %.300s", known, resp.Status, body.sent(), msg)
		}
		if !strings.Contains(string(msg), fmt.Sprint(apiserver.MaxConversionBody)) {
			t.Errorf("the refusal does not say the limit: %s", msg)
		}
		// The server stops reading at the limit; what the client had in
		// flight by then is HTTP/2's window, 256 KiB, and buffers.
		if sent, most := body.sent(), int64(apiserver.MaxConversionBody+4<<20); sent > most {
			t.Errorf("length known %v: the client sent %d bytes before the refusal, more than %d", known, sent, most)
		}
		t.Logf("length known %v: 413 after %d bytes sent", known, body.sent())
	}

	// At the limit exactly: converted. One byte more: refused.
	at := reviewOf(t, apiserver.MaxConversionBody, alphaClass("edge", strings.Repeat("x", 64<<10)))
	if len(at) != apiserver.MaxConversionBody {
		t.Fatalf("the review is %d bytes, want %d", len(at), apiserver.MaxConversionBody)
	}
	resp, err := hc.Post(url, "application/json", bytes.NewReader(at))
	if err != nil {
		t.Fatal(err)
	}
	var answer apiextensionsv1.ConversionReview
	err = json.NewDecoder(resp.Body).Decode(&answer)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a review of exactly the limit: %s, %v", resp.Status, err)
	}
	if answer.Response == nil || answer.Response.Result.Status != metav1.StatusSuccess || len(answer.Response.ConvertedObjects) != 1 {
		t.Fatalf("a review of exactly the limit was not converted: %+v", answer.Response)
	}
	over := append(at[:len(at)-3:len(at)-3], []byte(" ]}}")...)
	resp, err = hc.Post(url, "application/json", bytes.NewReader(over))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a review of the limit and one byte: %s, want 413", resp.Status)
	}
}

// TestLargeListsAndObjectsStillConvert: kube-apiserver asks the webhook
// one object at a time, so a list far larger than the limit converts at
// v1alpha1, and so does the largest object kube-apiserver can store,
// written and read at v1alpha1. Had kube-apiserver sent a list in one
// review, the list here (over 4 MiB) would be refused.
func TestLargeListsAndObjectsStillConvert(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.NewNamespace(t, "biglist")
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 200, 400
	beta, err := client.New(cfg, client.Options{Scheme: betaScheme(t)})
	g.Expect(err).NotTo(HaveOccurred())

	// 1,000 classes of 4 KiB of providerSpec each, written at v1beta1.
	const n = 1000
	userData := strings.Repeat("#cloud-config ", 4096/14)
	var wg sync.WaitGroup
	var failed atomic.Value
	work := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				class := &v1beta1.MachineClass{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("class-%d", i)},
					Spec: v1beta1.MachineClassSpec{Provider: "inmemory",
						ProviderSpec: runtime.RawExtension{Raw: []byte(`{"userData":"` + userData + `"}`)}},
				}
				if err := beta.Create(ctx, class); err != nil {
					failed.Store(err)
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}

	list := &machinistv1.MachineClassList{}
	g.Expect(env.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	g.Expect(list.Items).To(HaveLen(n))
	raw, err := json.Marshal(list)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(len(raw)).To(BeNumerically(">", apiserver.MaxConversionBody), "the list must be larger than the limit to show anything")
	for _, c := range list.Items {
		g.Expect(string(c.Spec.ProviderSpec.Raw)).To(ContainSubstring(userData))
	}

	// The largest object kube-apiserver stores is under etcd's bound on
	// a request, 1.5 MiB unless etcd is told otherwise (and under 2 MiB,
	// its etcd client's, whatever etcd allows): one of 1.4 MiB is written
	// and read at v1alpha1.
	big := &machinistv1.MachineClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "big"},
		Spec: machinistv1.MachineClassSpec{Provider: "inmemory",
			ProviderSpec: runtime.RawExtension{Raw: []byte(`{"userData":"` + strings.Repeat("x", 1400<<10) + `"}`)}},
	}
	g.Expect(env.Client.Create(ctx, big)).To(Succeed())
	back := &machinistv1.MachineClass{}
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(big), back)).To(Succeed())
	g.Expect(back.Spec.ProviderSpec.Raw).To(HaveLen(len(big.Spec.ProviderSpec.Raw)))
}

// betaScheme knows v1beta1 alone, so that its client writes at v1beta1.
func betaScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1beta1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}
