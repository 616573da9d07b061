package conformance

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/providers/plugin"
	providerv1 "github.com/machinist-dev/machinist/providers/plugin/v1"
)

// The suite proper runs against a control plane in test/provider; these
// cover what it decides without one.

func TestCoherent(t *testing.T) {
	update := plugin.VerbUpdate
	for _, c := range []struct {
		name string
		caps *providerv1.GetCapabilitiesResponse
		want string // a part of the error; "" for none
	}{
		{"nothing declared", &providerv1.GetCapabilitiesResponse{}, ""},
		{"every verb, version in place", &providerv1.GetCapabilitiesResponse{
			Verbs:   []providerv1.Verb{plugin.VerbReboot, plugin.VerbRepair, update},
			InPlace: []providerv1.Change{providerv1.Change_CHANGE_VERSION, providerv1.Change_CHANGE_CLASS},
		}, ""},
		{"in place without update", &providerv1.GetCapabilitiesResponse{
			Verbs:   []providerv1.Verb{plugin.VerbReboot},
			InPlace: []providerv1.Change{providerv1.Change_CHANGE_VERSION},
		}, "lack VERB_UPDATE"},
		{"unspecified verb", &providerv1.GetCapabilitiesResponse{
			Verbs: []providerv1.Verb{providerv1.Verb_VERB_UNSPECIFIED},
		}, "VERB_UNSPECIFIED"},
		{"unknown verb", &providerv1.GetCapabilitiesResponse{
			Verbs: []providerv1.Verb{42},
		}, "no verb of the protocol"},
		{"verb twice", &providerv1.GetCapabilitiesResponse{
			Verbs: []providerv1.Verb{update, update},
		}, "twice"},
		{"unspecified change", &providerv1.GetCapabilitiesResponse{
			Verbs:   []providerv1.Verb{update},
			InPlace: []providerv1.Change{providerv1.Change_CHANGE_UNSPECIFIED},
		}, "CHANGE_UNSPECIFIED"},
		{"unknown change", &providerv1.GetCapabilitiesResponse{
			Verbs:   []providerv1.Verb{update},
			InPlace: []providerv1.Change{9},
		}, "no change of the protocol"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := coherent(c.caps)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("want coherent, got %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("want an error saying %q, got %v", c.want, err)
			}
		})
	}
}

func TestRunRefusesAnIncompleteConfig(t *testing.T) {
	var kube kubernetes.Interface = kubernetes.New(nil)
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no endpoint", Config{Kube: kube}, "no endpoint"},
		{"no Kubernetes client", Config{Endpoint: "unix:///nowhere.sock"}, "no Kubernetes client"},
		{"no API server for the join data", Config{Endpoint: "unix:///nowhere.sock", Kube: kube}, "no API server URL"},
		{"providerSpec not JSON", Config{Endpoint: "unix:///nowhere.sock", Kube: kube, ProviderSpec: []byte("{")}, "not JSON"},
		{"update to the same version", Config{Endpoint: "unix:///nowhere.sock", Kube: kube, Version: "v1.38.0"}, "changes nothing"},
		{"a token group kube-apiserver would refuse", Config{Endpoint: "unix:///nowhere.sock", Kube: kube, Server: "https://127.0.0.1:6443", TokenGroups: []string{"system:nodes"}}, "token group"},
		{"TCP without TLS", Config{Endpoint: "tcp://127.0.0.1:1", Kube: kube, Server: "https://127.0.0.1:6443"}, "mutual TLS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			results, err := Run(context.Background(), c.cfg, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error saying %q, got %v (results %v)", c.want, err, results)
			}
		})
	}
}

func TestNodeHistory(t *testing.T) {
	node := func(boot string, ready corev1.ConditionStatus) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{ProviderID: "p://1"}}
		n.Status.NodeInfo.BootID = boot
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}
		return n
	}
	w := &nodeWatch{byID: map[string]*nodeHistory{}, changed: make(chan struct{})}
	if h := w.history("p://1"); h.ready() || h.boot() != "" {
		t.Fatalf("no Node seen, yet %s", describe(h))
	}
	w.seen(node("a", corev1.ConditionFalse))
	if h := w.history("p://1"); h.ready() {
		t.Fatalf("a Node that is not Ready: %s", describe(h))
	}
	w.seen(node("a", corev1.ConditionTrue))
	w.seen(node("b", corev1.ConditionTrue))
	// An earlier boot seen again is no new restart.
	w.seen(node("a", corev1.ConditionTrue))
	h := w.history("p://1")
	if !h.ready() || len(h.boots) != 2 || len(h.since(1)) != 1 || h.since(1)[0] != "b" || h.since(2) != nil {
		t.Fatalf("after boots a, b, a: %s", describe(h))
	}
	w.gone(node("b", corev1.ConditionTrue))
	if h := w.history("p://1"); h.node != nil || len(h.boots) != 2 {
		t.Fatalf("after the Node was deleted: %s", describe(h))
	}
}

func TestLeaksFindsEveryFormOfASecretAndShowsNone(t *testing.T) {
	k := token{Token: bootstrap.Token{ID: "abcdef", Secret: "0123456789abcdef"}, check: "create"}
	other := token{Token: bootstrap.Token{ID: "ghijkl", Secret: "fedcba9876543210"}, check: "repair"}
	tokens := []token{k, other}
	for _, c := range []struct {
		name string
		log  string
		want []string // parts of the error; none for no leak
	}{
		{"nothing", "I0101 serving provider\nI0101 created machine abcdef\n", nil},
		{"the public ID alone", "joining with token abcdef.<redacted>\n", nil},
		{"the whole token", "I0101 join token=abcdef.0123456789abcdef server=x\n", []string{"bootstrap token abcdef", "create check", `token=abcdef.<secret> server=x`}},
		{"base64", "data: " + base64.StdEncoding.EncodeToString([]byte("abcdef.0123456789abcdef")) + "\n", []string{"base64-encoded secret of bootstrap token abcdef"}},
		{"two tokens on one line", "a fedcba9876543210 b 0123456789abcdef\n", []string{"token abcdef", "token ghijkl", `"a <secret> b <secret>"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := leaks([]byte(c.log), tokens)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("want no leak, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want a leak found in %q", c.log)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q: %v", w, err)
				}
			}
			for _, s := range []string{k.Secret, other.Secret} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("the error shows a secret: %v", err)
				}
			}
		})
	}
}
