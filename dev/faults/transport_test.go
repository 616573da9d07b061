package faults

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

type answer struct{ calls int }

func (a *answer) RoundTrip(req *http.Request) (*http.Response, error) {
	a.calls++
	return &http.Response{StatusCode: 201, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

// struckBy sends n Machine creates through a Transport of c and returns the
// indices it struck.
func struckBy(t *testing.T, c Config, n int) []int {
	t.Helper()
	tr, err := NewTransport(&answer{}, c)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for i := range n {
		req, _ := http.NewRequest(http.MethodPost, "https://x/apis/machinist.dev/v1alpha1/namespaces/a/machines", strings.NewReader("{}"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			out = append(out, i)
			continue
		}
		_ = resp.Body.Close()
	}
	return out
}

func TestTheSameSeedStrikesTheSameRequests(t *testing.T) {
	c := Config{Seed: 42, Rules: []Rule{{Fault: LoseReply, Verbs: []string{"create"}, Resources: []string{"machines"}, Rate: 0.3}}}
	a, b := struckBy(t, c, 1000), struckBy(t, c, 1000)
	if !slices.Equal(a, b) {
		t.Fatal("one seed struck different requests")
	}
	if len(a) < 230 || len(a) > 370 {
		t.Fatalf("a rate of 0.3 struck %d of 1000", len(a))
	}
	c.Seed = 43
	if slices.Equal(a, struckBy(t, c, 1000)) {
		t.Fatal("another seed struck the same requests")
	}
}

func TestRulesMatchVerbResourceAndNamespace(t *testing.T) {
	for _, tc := range []struct {
		rule   Rule
		method string
		path   string
		want   bool
	}{
		{Rule{Fault: LoseReply, Verbs: []string{"create"}, Resources: []string{"machines"}}, "POST", "/apis/machinist.dev/v1alpha1/namespaces/a/machines", true},
		{Rule{Fault: LoseReply, Verbs: []string{"create"}, Resources: []string{"machines"}}, "PUT", "/apis/machinist.dev/v1alpha1/namespaces/a/machines/m", false},
		{Rule{Fault: LoseReply, Resources: []string{"machines"}}, "PATCH", "/apis/machinist.dev/v1alpha1/namespaces/a/machines/m/status", false},
		{Rule{Fault: LoseReply, Resources: []string{"machines/status"}}, "PATCH", "/apis/machinist.dev/v1alpha1/namespaces/a/machines/m/status", true},
		{Rule{Fault: LoseReply, Resources: []string{"pods/eviction"}}, "POST", "/api/v1/namespaces/a/pods/p/eviction", true},
		{Rule{Fault: LoseReply, Namespaces: []string{"b"}}, "DELETE", "/api/v1/namespaces/a/pods/p", false},
		{Rule{Fault: LoseReply}, "GET", "/api/v1/namespaces/a/pods?watch=true", false},
		{Rule{Fault: CutWatch}, "GET", "/api/v1/namespaces/a/pods?watch=true", true},
		{Rule{Fault: CutWatch}, "GET", "/api/v1/namespaces/a/pods", false},
		{Rule{Fault: Unavailable, Resources: []string{"pods"}}, "GET", "/healthz", false},
	} {
		req, _ := http.NewRequest(tc.method, "https://x"+tc.path, nil)
		tc.rule.Rate = 1
		tc.rule.Delay.Duration = 1
		tr, err := NewTransport(&answer{}, Config{Rules: []Rule{tc.rule}})
		if err != nil {
			t.Fatal(err)
		}
		d, _ := tr.decide(req)
		if got := d.rule == 0; got != tc.want {
			t.Errorf("%+v on %s %s: struck %v, want %v", tc.rule, tc.method, tc.path, got, tc.want)
		}
	}
}

func TestOffPassesEverythingAndKeepsCounts(t *testing.T) {
	next := &answer{}
	tr, err := NewTransport(next, Config{Rules: []Rule{{Name: "u", Fault: Unavailable, Rate: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	send := func() int {
		req, _ := http.NewRequest(http.MethodGet, "https://x/api/v1/pods", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := send(); code != 503 {
		t.Fatalf("on: got %d, want 503", code)
	}
	tr.Enable(false)
	if code := send(); code != 201 || next.calls != 1 {
		t.Fatalf("off: got %d after %d forwarded, want 201 after 1", code, next.calls)
	}
	if n := tr.Struck("u"); n != 1 {
		t.Fatalf("counted %d, want 1", n)
	}
}
