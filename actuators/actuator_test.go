package actuators

import (
	"errors"
	"fmt"
	"strings"
	"testing"
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
	if err == nil || !strings.Contains(err.Error(), `no provider "two"`) || !strings.Contains(err.Error(), "[one]") {
		t.Fatalf("unknown provider: got %v, want an error naming it and the registered ones", err)
	}
	if got := r.Names(); len(got) != 1 || got[0] != "one" {
		t.Fatalf("Names() = %v", got)
	}
}
