package apiserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// FuzzVerbOptions: the body of PUT .../reboot or .../repair is whatever
// the caller sent. Decoding it never panics; a refusal is a Kubernetes
// status of 400, 413 (only past maxBody) or 422; what is accepted is no
// body, null or one JSON object and nothing after it; and the options it
// gives, sent again as the verb's own options, give the same.
func FuzzVerbOptions(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte, repair bool) {
		s := &verbStorage{typ: machinistv1.OperationReboot}
		if repair {
			s.typ = machinistv1.OperationRepair
		}
		decode := func(body []byte) (*machinistv1.OperationOptions, error) {
			return s.decode(httptest.NewRequest(http.MethodPut, "/", bytes.NewReader(body)), "m")
		}
		opts, err := decode(body)
		if err != nil {
			var status apierrors.APIStatus
			if !errors.As(err, &status) {
				t.Fatalf("%q: refused with %v, not a Kubernetes status", body, err)
			}
			code := status.Status().Code
			switch {
			case len(body) > maxBody && code != http.StatusRequestEntityTooLarge:
				t.Fatalf("a body of %d bytes is refused with %d, want 413", len(body), code)
			case len(body) <= maxBody && code != http.StatusBadRequest && code != http.StatusUnprocessableEntity:
				t.Fatalf("%q: refused with %d (%v), want 400 or 422", body, code, err)
			}
			return
		}
		if len(body) > maxBody {
			t.Fatalf("a body of %d bytes, over %d, is accepted", len(body), maxBody)
		}
		trimmed := bytes.TrimSpace(body)
		if len(trimmed) > 0 && (!json.Valid(trimmed) || (trimmed[0] != '{' && string(trimmed) != "null")) {
			t.Fatalf("accepted %q, which is not one JSON object", body)
		}
		var again any
		if repair {
			again = subresourcesv1.RepairOptions{Drain: drainOf(opts.SkipDrain), Reason: opts.Reason,
				GracePeriodSeconds: opts.GracePeriodSeconds, OverrideDisruptionBudgets: opts.OverrideDisruptionBudgets}
		} else {
			mode := subresourcesv1.RebootSoft
			if opts.Mode == machinistv1.RebootHard {
				mode = subresourcesv1.RebootHard
			}
			again = subresourcesv1.RebootOptions{Mode: mode, Drain: drainOf(opts.SkipDrain),
				GracePeriodSeconds: opts.GracePeriodSeconds, OverrideDisruptionBudgets: opts.OverrideDisruptionBudgets}
		}
		raw, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		back, err := decode(raw)
		if err != nil {
			t.Fatalf("%q gives %+v, which sent again as %s is refused: %v", body, opts, raw, err)
		}
		if !reflect.DeepEqual(back, opts) {
			t.Fatalf("%q gives %+v, sent again as %s gives %+v", body, opts, raw, back)
		}
	})
}

// drainOf is the verbs' drain option for the Machine's skipDrain.
func drainOf(skip *bool) *bool {
	if skip == nil {
		return nil
	}
	return new(!*skip)
}
