// Package faults puts faults on purpose between a client and kube-apiserver:
// replies lost after the write was stored, requests timed out and stored
// later, 503s and 429s, latency and watches cut mid-stream. It is how
// Machinist proves that what it promises (a MachineSet holds exactly its
// replicas, an operation runs once, a budget slot is neither counted twice
// nor leaked) holds when the network and the API server misbehave, as they
// do under load.
//
// A Transport injects the faults into any HTTP client; a Proxy serves it
// over TLS and HTTP/2 in front of kube-apiserver, so that unmodified
// clients (a manager, kubectl, informers) can be pointed at it with a
// kubeconfig. Every decision is drawn from one seeded generator and every
// fault injected is counted, per rule.
package faults

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Kind is what a rule does to a request it strikes.
type Kind string

// The faults a rule can inject.
const (
	// LoseReply forwards the request, lets kube-apiserver handle it and
	// read its whole answer, then breaks the stream, Delay later if set:
	// the write is stored, the client sees a broken connection (perhaps
	// after its watch has shown the write) and cannot know it was.
	LoseReply Kind = "LoseReply"
	// LateCommit answers 504 at once, as kube-apiserver does when a
	// request outlives its timeout ("may still be processing the
	// request"), and forwards the request Delay later, so that it is
	// stored after the client has given up on it.
	LateCommit Kind = "LateCommit"
	// Unavailable answers 503 without forwarding: nothing is stored, and
	// the client cannot tell that from a 503 that was.
	Unavailable Kind = "Unavailable"
	// Throttle answers 429 with Retry-After (Delay, at least a second)
	// without forwarding, as API Priority and Fairness does; client-go
	// waits and retries such an answer by itself.
	Throttle Kind = "Throttle"
	// Conflict answers 409 without forwarding, as kube-apiserver does
	// when another writer stored a newer version first: a second writer
	// without the second writer.
	Conflict Kind = "Conflict"
	// Latency forwards the request after Delay; a watch it strikes is
	// delivered Delay behind kube-apiserver, every event of it, as to a
	// client whose cache lags.
	Latency Kind = "Latency"
	// CutWatch forwards a watch and breaks its stream at a random moment
	// within Delay; the client must watch again from where it was.
	CutWatch Kind = "CutWatch"
)

var kinds = []Kind{LoseReply, LateCommit, Unavailable, Throttle, Conflict, Latency, CutWatch}

// Rule says which requests to strike, how often and with what.
type Rule struct {
	// Name names the rule in counts and logs; empty means its fault and
	// position ("LoseReply#0").
	Name string `json:"name,omitempty"`
	// Fault is what the rule does.
	Fault Kind `json:"fault"`
	// Verbs are Kubernetes verbs (create, update, patch, delete,
	// deletecollection, get, list, watch); empty matches every verb.
	Verbs []string `json:"verbs,omitempty"`
	// Resources are resources, with their subresource after a slash
	// (machines, machines/status, pods/eviction, machinedisruptionbudgets/status);
	// empty matches every resource, and "machines" does not match
	// "machines/status".
	Resources []string `json:"resources,omitempty"`
	// Namespaces limit the rule to requests in these namespaces; empty
	// matches every namespace and cluster-scoped requests.
	Namespaces []string `json:"namespaces,omitempty"`
	// Names limit the rule to requests for objects of these names (a
	// create names its object only when the client chose the name);
	// empty matches every request.
	Names []string `json:"names,omitempty"`
	// Rate is the chance, from 0 to 1, that a matching request is struck.
	Rate float64 `json:"rate"`
	// Delay is the added latency (Latency; for a watch, how far behind
	// its events arrive), how long after the reply was read the stream
	// breaks (LoseReply), how long after its 504 a
	// request is stored (LateCommit), the Retry-After (Throttle), or the
	// longest a watch runs before it is cut (CutWatch).
	Delay metav1.Duration `json:"delay,omitempty"`
	// Limit caps how many requests the rule strikes; zero means no cap.
	Limit int `json:"limit,omitempty"`
}

// Config is a seed and the rules, tried in order: the first rule that
// matches a request and whose draw strikes decides the request's fate.
type Config struct {
	// Seed seeds the one generator every decision is drawn from; zero
	// means 1.
	Seed uint64 `json:"seed,omitempty"`
	// Rules are tried in order.
	Rules []Rule `json:"rules"`
}

// Load reads a Config from a YAML or JSON file.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Validate says what is wrong with c, naming the rule.
func (c Config) Validate() error {
	var errs []error
	for i, r := range c.Rules {
		where := fmt.Sprintf("rules[%d]", i)
		if r.Name != "" {
			where += " (" + r.Name + ")"
		}
		known := false
		for _, k := range kinds {
			known = known || r.Fault == k
		}
		if !known {
			errs = append(errs, fmt.Errorf("%s: fault %q is not one of %v", where, r.Fault, kinds))
		}
		if r.Rate <= 0 || r.Rate > 1 {
			errs = append(errs, fmt.Errorf("%s: rate %v must be above 0 and at most 1", where, r.Rate))
		}
		if r.Limit < 0 {
			errs = append(errs, fmt.Errorf("%s: limit %d must not be negative", where, r.Limit))
		}
		switch {
		case r.Delay.Duration < 0:
			errs = append(errs, fmt.Errorf("%s: delay %v must not be negative", where, r.Delay.Duration))
		case r.Delay.Duration == 0 && (r.Fault == Latency || r.Fault == LateCommit || r.Fault == CutWatch):
			errs = append(errs, fmt.Errorf("%s: fault %s needs a delay", where, r.Fault))
		}
		if r.Fault == CutWatch && len(r.Verbs) > 0 && !(len(r.Verbs) == 1 && r.Verbs[0] == "watch") {
			errs = append(errs, fmt.Errorf("%s: fault CutWatch strikes only watches; leave verbs empty or [watch]", where))
		}
		for _, v := range r.Verbs {
			if v != strings.ToLower(v) || v == "" {
				errs = append(errs, fmt.Errorf("%s: verb %q must be a lower-case Kubernetes verb such as create", where, v))
			}
		}
	}
	return errors.Join(errs...)
}

func (r Rule) name(i int) string {
	if r.Name != "" {
		return r.Name
	}
	return fmt.Sprintf("%s#%d", r.Fault, i)
}

// retryAfter is the Retry-After a Throttle rule answers, in whole seconds.
func (r Rule) retryAfter() int {
	return max(1, int((r.Delay.Duration+time.Second-1)/time.Second))
}
