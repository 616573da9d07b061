package stale

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
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

func TestARemovedObjectIsStaleUntilForgotten(t *testing.T) {
	with := func(uid, rv string) *machinistv1.Machine {
		return &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", UID: types.UID(uid), ResourceVersion: rv}}
	}
	var w Writes
	w.Removed(with("a", "10"))
	if !w.Stale(with("a", "10")) || !w.Stale(with("a", "999")) {
		t.Fatal("a removed object the cache still holds is stale, whatever its resourceVersion")
	}
	if w.Stale(with("b", "5")) {
		t.Fatal("a new object of the same name is not the removed one")
	}
	if w.Stale(with("a", "10")) {
		t.Fatal("once a newer object was seen the removal is forgotten")
	}
	w.Removed(with("a", "10"))
	w.Forget(types.NamespacedName{Namespace: "ns", Name: "m"})
	if w.Stale(with("a", "10")) {
		t.Fatal("Forget drops the removal")
	}
}
