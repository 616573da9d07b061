package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// ErrReplyLost is what a client of a Transport (not of a Proxy, whose
// clients see a broken stream) gets for a reply lost on purpose.
var ErrReplyLost = errors.New("faults: the reply was lost on purpose after the server handled the request")

// ErrWatchCut ends a watch's stream cut on purpose.
var ErrWatchCut = errors.New("faults: the watch was cut on purpose")

// Strike describes one fault injected, for logs and metrics.
type Strike struct {
	// Rule is the rule's name.
	Rule  string
	Fault Kind
	// Verb, Resource (with its subresource after a slash), Namespace and
	// Name say which request it struck.
	Verb, Resource, Namespace, Name string
}

// Count is how many requests one rule struck.
type Count struct {
	Rule   string
	Fault  Kind
	Struck int
}

// Transport is an http.RoundTripper that injects the faults of a Config
// into the requests it carries to next.
type Transport struct {
	next  http.RoundTripper
	rules []Rule
	names []string
	info  *request.RequestInfoFactory
	// OnStrike, when set, is told of every fault as it is injected.
	OnStrike func(Strike)

	enabled atomic.Bool
	mu      sync.Mutex
	rng     *rand.Rand
	struck  []int

	late                    sync.WaitGroup
	lateStored, lateRefused atomic.Int64
}

// NewTransport wraps next with the faults of c. It starts enabled.
func NewTransport(next http.RoundTripper, c Config) (*Transport, error) {
	t := &Transport{
		next: next,
		info: &request.RequestInfoFactory{
			APIPrefixes:          sets.NewString("api", "apis"),
			GrouplessAPIPrefixes: sets.NewString("api"),
		},
	}
	if err := t.Reset(c); err != nil {
		return nil, err
	}
	t.enabled.Store(true)
	return t, nil
}

// Reset replaces the seed and rules with c's and starts the counts again,
// so that one proxy can serve test after test, each with its own faults.
func (t *Transport) Reset(c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	seed := c.Seed
	if seed == 0 {
		seed = 1
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rules = slices.Clone(c.Rules)
	t.names = t.names[:0]
	for i, r := range t.rules {
		t.names = append(t.names, r.name(i))
	}
	t.rng = rand.New(rand.NewPCG(seed, 0x6661756c7473))
	t.struck = make([]int, len(c.Rules))
	t.lateStored.Store(0)
	t.lateRefused.Store(0)
	return nil
}

// Enable turns the faults on or off; off, every request passes as it is.
// Counts are kept.
func (t *Transport) Enable(on bool) { t.enabled.Store(on) }

// Counts returns, per rule in order, how many requests it struck.
func (t *Transport) Counts() []Count {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Count, len(t.rules))
	for i, r := range t.rules {
		out[i] = Count{Rule: t.names[i], Fault: r.Fault, Struck: t.struck[i]}
	}
	return out
}

// Struck returns how many requests the named rule struck.
func (t *Transport) Struck(rule string) int {
	for _, c := range t.Counts() {
		if c.Rule == rule {
			return c.Struck
		}
	}
	return 0
}

// Late returns, of the requests answered 504 by a LateCommit rule and
// forwarded since, how many kube-apiserver accepted and how many it
// refused (an object that already existed, a conflict).
func (t *Transport) Late() (stored, refused int) {
	return int(t.lateStored.Load()), int(t.lateRefused.Load())
}

// Settle waits until every request a LateCommit rule holds back has been
// forwarded, or ctx ends.
func (t *Transport) Settle(ctx context.Context) error {
	done := make(chan struct{})
	go func() { t.late.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// decision is what befalls one request.
type decision struct {
	rule       int
	name       string
	fault      Kind
	delay      time.Duration
	retryAfter int
}

// decide draws the request's fate: the first rule that matches it and
// whose draw strikes, or none (rule -1).
func (t *Transport) decide(req *http.Request) (decision, *request.RequestInfo) {
	none := decision{rule: -1}
	if !t.enabled.Load() {
		return none, nil
	}
	info, err := t.info.NewRequestInfo(req)
	if err != nil {
		return none, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, r := range t.rules {
		if !matches(r, info) || (r.Limit > 0 && t.struck[i] >= r.Limit) {
			continue
		}
		if t.rng.Float64() >= r.Rate {
			continue
		}
		t.struck[i]++
		d := decision{rule: i, name: t.names[i], fault: r.Fault, delay: r.Delay.Duration, retryAfter: r.retryAfter()}
		if r.Fault == CutWatch {
			// Somewhere within the rule's delay, never at once.
			d.delay = time.Duration(1 + t.rng.Int64N(int64(r.Delay.Duration)))
		}
		return d, info
	}
	return none, info
}

func matches(r Rule, info *request.RequestInfo) bool {
	if !info.IsResourceRequest && len(r.Resources) > 0 {
		return false
	}
	watch := info.Verb == "watch"
	switch r.Fault {
	case CutWatch:
		if !watch {
			return false
		}
	case LoseReply, LateCommit:
		// A watch's reply never ends, so it cannot be read and dropped.
		if watch {
			return false
		}
	}
	if len(r.Verbs) > 0 && !slices.Contains(r.Verbs, info.Verb) {
		return false
	}
	if len(r.Resources) > 0 && !slices.Contains(r.Resources, resourceOf(info)) {
		return false
	}
	if len(r.Namespaces) > 0 && !slices.Contains(r.Namespaces, info.Namespace) {
		return false
	}
	if len(r.Names) > 0 && !slices.Contains(r.Names, info.Name) {
		return false
	}
	return true
}

func resourceOf(info *request.RequestInfo) string {
	if info.Subresource != "" {
		return info.Resource + "/" + info.Subresource
	}
	return info.Resource
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	d, info := t.decide(req)
	if d.rule < 0 {
		return t.next.RoundTrip(req)
	}
	if t.OnStrike != nil {
		t.OnStrike(Strike{Rule: d.name, Fault: d.fault, Verb: info.Verb, Resource: resourceOf(info), Namespace: info.Namespace, Name: info.Name})
	}
	switch d.fault {
	case LoseReply:
		resp, err := t.next.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		// Read to the end: the server has handled the request and said
		// so; only the client never hears it, and with a delay hears of
		// the failure late: after its watch has shown the write.
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if d.delay > 0 {
			select {
			case <-time.After(d.delay):
			case <-req.Context().Done():
			}
		}
		return nil, ErrReplyLost

	case LateCommit:
		late, err := detach(req)
		if err != nil {
			return nil, err
		}
		t.late.Add(1)
		go t.commitLate(late, d.delay)
		// kube-apiserver's own answer when a request outlives its
		// timeout while its handler goes on.
		return status(req, http.StatusGatewayTimeout, metav1.StatusReasonTimeout,
			"Timeout: request did not complete within requested timeout - context deadline exceeded", 0), nil

	case Unavailable:
		closeBody(req)
		return status(req, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			"the server is currently unable to handle the request", 0), nil

	case Throttle:
		closeBody(req)
		return status(req, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
			"Too many requests, please try again later.", d.retryAfter), nil

	case Conflict:
		closeBody(req)
		return status(req, http.StatusConflict, metav1.StatusReasonConflict,
			"Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again", 0), nil

	case Latency:
		if info.Verb == "watch" {
			resp, err := t.next.RoundTrip(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				return resp, err
			}
			resp.Body = lag(resp.Body, d.delay)
			return resp, nil
		}
		select {
		case <-time.After(d.delay):
		case <-req.Context().Done():
			closeBody(req)
			return nil, req.Context().Err()
		}
		return t.next.RoundTrip(req)

	case CutWatch:
		resp, err := t.next.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			return resp, err
		}
		resp.Body = cutAfter(resp.Body, d.delay)
		return resp, nil
	}
	return t.next.RoundTrip(req)
}

// detach copies req, body and all, so that it can be sent after the
// client has had its answer and gone.
func detach(req *http.Request) (*http.Request, error) {
	var body []byte
	if req.Body != nil {
		var err error
		body, err = io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	late := req.Clone(context.WithoutCancel(req.Context()))
	late.Body = io.NopCloser(bytes.NewReader(body))
	late.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	late.ContentLength = int64(len(body))
	return late, nil
}

func (t *Transport) commitLate(req *http.Request, after time.Duration) {
	defer t.late.Done()
	time.Sleep(after)
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		t.lateRefused.Add(1)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		t.lateStored.Add(1)
	} else {
		t.lateRefused.Add(1)
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// status is an answer kube-apiserver could have given: a Status object.
func status(req *http.Request, code int, reason metav1.StatusReason, message string, retryAfter int) *http.Response {
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: message, Reason: reason, Code: int32(code),
	}
	h := http.Header{"Content-Type": {"application/json"}}
	if retryAfter > 0 {
		st.Details = &metav1.StatusDetails{RetryAfterSeconds: int32(retryAfter)}
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	body, _ := json.Marshal(st)
	return &http.Response{
		Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		Request: req,
	}
}

// cutBody is a watch's stream that breaks at a set moment.
type cutBody struct {
	io.ReadCloser
	cut   atomic.Bool
	timer *time.Timer
}

func cutAfter(body io.ReadCloser, after time.Duration) io.ReadCloser {
	c := &cutBody{ReadCloser: body}
	c.timer = time.AfterFunc(after, func() {
		c.cut.Store(true)
		_ = body.Close() // wakes a Read blocked on the stream
	})
	return c
}

func (c *cutBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if c.cut.Load() {
		return n, ErrWatchCut
	}
	return n, err
}

func (c *cutBody) Close() error {
	c.timer.Stop()
	return c.ReadCloser.Close()
}

// laggedBody hands each part of a watch's stream on Delay after it
// arrived: a client whose cache runs that far behind the API server.
type laggedBody struct {
	body  io.ReadCloser
	delay time.Duration
	parts chan part
	done  chan struct{}
	once  sync.Once
	rest  []byte
	err   error
}

type part struct {
	data []byte
	at   time.Time
	err  error
}

func lag(body io.ReadCloser, delay time.Duration) io.ReadCloser {
	l := &laggedBody{body: body, delay: delay, parts: make(chan part, 1024), done: make(chan struct{})}
	go l.pump()
	return l
}

func (l *laggedBody) pump() {
	defer close(l.parts)
	for {
		buf := make([]byte, 32<<10)
		n, err := l.body.Read(buf)
		select {
		case l.parts <- part{data: buf[:n], at: time.Now(), err: err}:
		case <-l.done:
			return
		}
		if err != nil {
			return
		}
	}
}

func (l *laggedBody) Read(p []byte) (int, error) {
	for len(l.rest) == 0 {
		if l.err != nil {
			return 0, l.err
		}
		next, ok := <-l.parts
		if !ok {
			return 0, io.ErrUnexpectedEOF
		}
		if wait := time.Until(next.at.Add(l.delay)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-l.done:
				return 0, io.ErrClosedPipe
			}
		}
		l.rest, l.err = next.data, next.err
	}
	n := copy(p, l.rest)
	l.rest = l.rest[n:]
	return n, nil
}

func (l *laggedBody) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.body.Close()
}
