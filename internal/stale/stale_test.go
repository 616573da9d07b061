package stale

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

func TestWritesTellAStaleCache(t *testing.T) {
	at := func(rv string) *machinistv1.Machine {
		return &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", ResourceVersion: rv}}
	}
	var w Writes
	if w.Stale(at("5")) {
		t.Fatal("a Machine never written is never stale")
	}
	w.Wrote(at("100"))
	if !w.Stale(at("99")) || !w.Stale(at("9")) {
		t.Fatal("a cached Machine older than the last write is stale")
	}
	if w.Stale(at("100")) {
		t.Fatal("the cache holding the last write is not stale")
	}
	if w.Stale(at("99")) {
		t.Fatal("once the cache caught up the write is forgotten")
	}
	w.Wrote(at("200"))
	if !w.Stale(at("150")) {
		t.Fatal("a later write is remembered anew")
	}
	if w.Stale(at("not-a-number")) || w.Stale(at("150")) {
		t.Fatal("a resourceVersion that does not compare drops what was remembered")
	}
}
