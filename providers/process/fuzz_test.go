package process

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
)

// FuzzStateFile: a machine's state file carries its class's providerSpec
// and capacity from one provider to the next, which boots the machine
// from it. Whatever the file holds, reading it never panics; a file that
// reads is written and read again to the same machine: the same
// providerSpec (as JSON, whitespace aside), the same capacity, and so the
// same --capacity for its agent at every boot.
func FuzzStateFile(f *testing.F) {
	p := &Provider{hw: agents{}}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, StateFile), data, 0o644); err != nil {
			t.Fatal(err)
		}
		st, err := p.readState(dir)
		if err != nil {
			return
		}
		if _, _, _, err := p.parse(st.ProviderID); err != nil {
			t.Fatalf("%q reads with providerID %q, which does not parse: %v", data, st.ProviderID, err)
		}
		flag, flagErr := CapacityFlag(st.Capacity)
		if err := p.writeState(dir, st); err != nil {
			t.Fatalf("%q reads as %+v, which cannot be written: %v", data, st, err)
		}
		back, err := p.readState(dir)
		if err != nil {
			t.Fatalf("%q, written again, does not read: %v", data, err)
		}
		var was, is bytes.Buffer
		if (len(st.Spec) > 0) != (len(back.Spec) > 0) ||
			(len(st.Spec) > 0 && (json.Compact(&was, st.Spec) != nil || json.Compact(&is, back.Spec) != nil || was.String() != is.String())) {
			t.Fatalf("%q: providerSpec %s is read back as %s", data, st.Spec, back.Spec)
		}
		again, againErr := CapacityFlag(back.Capacity)
		if flag != again || (flagErr == nil) != (againErr == nil) {
			t.Fatalf("%q: capacity %v gives --capacity=%s (%v), read back %v gives --capacity=%s (%v)", data, st.Capacity, flag, flagErr, back.Capacity, again, againErr)
		}
		st.Spec, back.Spec = nil, nil
		if !apiequality.Semantic.DeepEqual(st, back) {
			t.Fatalf("%q reads as %+v, written and read again as %+v", data, st, back)
		}
	})
}
