package providers

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func TestPermanentSurvivesWrapping(t *testing.T) {
	base := errors.New("quota exceeded")
	wrapped := fmt.Errorf("creating: %w", Permanent(base))
	if !IsPermanent(wrapped) {
		t.Fatal("a wrapped permanent error is not permanent")
	}
	if !errors.Is(wrapped, base) {
		t.Fatal("Permanent hides the error it marks")
	}
	if IsPermanent(base) || IsPermanent(nil) || Permanent(nil) != nil {
		t.Fatal("only errors marked Permanent are permanent")
	}
}

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	var a Actuator
	if err := r.Register("one", a); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("one", a); err == nil {
		t.Fatal("registering a name twice must fail")
	}
	if _, err := r.Get("one"); err != nil {
		t.Fatal(err)
	}
	_, err := r.Get("two")
	if err == nil || !strings.Contains(err.Error(), `no provider "two"`) || !strings.Contains(err.Error(), "(it runs: one)") {
		t.Fatalf("unknown provider: got %v, want an error naming it and the registered ones", err)
	}
	if got := r.Names(); len(got) != 1 || got[0] != "one" {
		t.Fatalf("Names() = %v", got)
	}
}

func TestProviderIDRoundTripAndNodeNames(t *testing.T) {
	m := &machinistv1.Machine{}
	m.Namespace, m.Name, m.UID = "ns", "worker", "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	id := ProviderID("process", m)
	if id != "process:///ns/worker/0a1b2c3d-4e5f-6789-abcd-ef0123456789" {
		t.Fatalf("ProviderID = %q", id)
	}
	ns, name, uid, err := ParseProviderID("process", id)
	if err != nil || ns != m.Namespace || name != m.Name || uid != m.UID {
		t.Fatalf("ParseProviderID(%q) = %q %q %q %v", id, ns, name, uid, err)
	}
	for _, bad := range []string{"inmemory:///ns/worker/uid", "process:///ns/worker", "process:///ns//uid", "process://ns/worker/uid"} {
		if _, _, _, err := ParseProviderID("process", bad); err == nil {
			t.Errorf("ParseProviderID(%q) accepted it", bad)
		}
	}
	if got := NodeName("worker", m.UID); got != "worker-0a1b2c3d" {
		t.Errorf("NodeName = %q", got)
	}
	long := NodeName(strings.Repeat("a", 80)+"-.", m.UID)
	if len(long) > 63 || !strings.HasSuffix(long, "-0a1b2c3d") {
		t.Errorf("NodeName of a long name = %q (%d characters)", long, len(long))
	}
}

func TestClaimHandsAnInstanceToItsOwnMachineOrItsFormerSelfOrToAnyWhenNone(t *testing.T) {
	m := &machinistv1.Machine{}
	m.Namespace, m.Name, m.UID = "b", "adopter", "uid-b"
	if got := OwnerOf(m); got != (Owner{Namespace: "b", Name: "adopter", UID: "uid-b"}) || got.IsZero() {
		t.Fatalf("OwnerOf = %+v", got)
	}
	if !(Owner{}).IsZero() {
		t.Fatal("the zero Owner names a Machine")
	}
	if err := Claim(Owner{}, m); err != nil {
		t.Errorf("an instance of no Machine is refused: %v", err)
	}
	// The same UID under another name is m itself, as the UID tells.
	if err := Claim(Owner{Namespace: "b", Name: "renamed", UID: "uid-b"}, m); err != nil {
		t.Errorf("m's own instance is refused: %v", err)
	}
	other := Owner{Namespace: "tenant-a", Name: "worker-1", UID: "uid-a"}
	err := Claim(other, m)
	if !IsPermanent(err) || !IsTaken(err) || !errors.Is(fmt.Errorf("creating: %w", err), ErrTaken) {
		t.Fatalf("another Machine's instance: got %v, want a permanent error wrapping ErrTaken", err)
	}
	for _, secret := range []string{other.Namespace, other.Name, string(other.UID)} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the refusal names %q of the other Machine: %v", secret, err)
		}
	}
	// The same name in the same namespace under another UID is m's
	// former self, gone since names are unique: m re-created (restored
	// from a backup, or moved) takes its instance.
	if err := Claim(Owner{Namespace: "b", Name: "adopter", UID: "uid-old"}, m); err != nil {
		t.Errorf("the instance of m's former self is refused: %v", err)
	}
	// The same name in another namespace, or another name in the same
	// one, is another Machine's.
	for _, o := range []Owner{{Namespace: "c", Name: "adopter", UID: "uid-old"}, {Namespace: "b", Name: "other", UID: "uid-old"}} {
		if err := Claim(o, m); !IsTaken(err) {
			t.Errorf("the instance of %+v: got %v, want ErrTaken", o, err)
		}
	}
	if IsTaken(Permanent(errors.New("no such instance"))) || IsTaken(nil) {
		t.Error("only ErrTaken is taken")
	}
}
