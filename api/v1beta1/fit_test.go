package v1beta1

import (
	"strings"
	"testing"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestFitCutsFreeTextToTheSchemasBounds(t *testing.T) {
	long := strings.Repeat("é", MaxMessageLength) // two bytes each: a cut can fall inside one
	s := MachineStatus{
		Conditions: []metav1.Condition{{Type: ConditionReady, Message: long}, {Type: "Short", Message: "fine"}},
		Operation:  &Operation{Message: long, RequestedBy: strings.Repeat("u", MaxRequestedByLength+1)},
	}
	s.Fit()
	for _, got := range []struct {
		what, s string
		max     int
	}{
		{"the Ready condition's message", s.Conditions[0].Message, MaxMessageLength},
		{"the operation's message", s.Operation.Message, MaxMessageLength},
		{"requestedBy", s.Operation.RequestedBy, MaxRequestedByLength},
	} {
		if len(got.s) > got.max || len(got.s) < got.max-4 || !strings.HasSuffix(got.s, "...") || !utf8.ValidString(got.s) {
			t.Errorf("%s: %d bytes, ends %q, valid UTF-8 %v; want at most %d, ending in ..., valid", got.what, len(got.s), got.s[len(got.s)-5:], utf8.ValidString(got.s), got.max)
		}
	}
	if s.Conditions[1].Message != "fine" {
		t.Errorf("a short message was changed to %q", s.Conditions[1].Message)
	}
	exact := strings.Repeat("x", MaxMessageLength)
	s = MachineStatus{Operation: &Operation{Message: exact}}
	s.Fit()
	if s.Operation.Message != exact {
		t.Error("a message of exactly the bound was cut")
	}
	(&MachineStatus{}).Fit() // no operation, no conditions: nothing to do, no panic
}
