package inmemory_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/machinist-dev/machinist/providers/inmemory"
)

// FuzzParseProviderSpec: a class's providerSpec is whatever its author
// wrote. ParseProviderSpec never panics; what it accepts is nothing, null
// or one JSON object and nothing after it, with every value in range; and
// what it accepts reads back the same once written again.
func FuzzParseProviderSpec(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		spec, err := inmemory.ParseProviderSpec(raw)
		if err != nil {
			if spec != (inmemory.ProviderSpec{}) {
				t.Fatalf("%q: refused (%v) but returned %+v", raw, err, spec)
			}
			return
		}
		trimmed := bytes.TrimSpace(raw)
		if len(trimmed) > 0 && (!json.Valid(trimmed) || (trimmed[0] != '{' && string(trimmed) != "null")) {
			t.Fatalf("accepted %q, which is not one JSON object", raw)
		}
		if !(spec.ErrorRate >= 0 && spec.ErrorRate <= 1) {
			t.Fatalf("%q: accepted errorRate %v", raw, spec.ErrorRate)
		}
		if spec.CreateLatency.Duration < 0 || spec.RebootLatency.Duration < 0 {
			t.Fatalf("%q: accepted a negative latency: %+v", raw, spec)
		}
		again, err := json.Marshal(spec)
		if err != nil {
			t.Fatalf("%+v: %v", spec, err)
		}
		back, err := inmemory.ParseProviderSpec(again)
		if err != nil {
			t.Fatalf("%q, accepted, is written again as %s, which is refused: %v", raw, again, err)
		}
		if back != spec {
			t.Fatalf("%q reads as %+v, written again as %s reads as %+v", raw, spec, again, back)
		}
	})
}
