package qemu

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/machinist-dev/machinist/providers/process"
)

// FuzzParseSpec: a class's providerSpec is whatever its author wrote.
// parseSpec never panics; what it accepts is nothing, null or one JSON
// object and nothing after it, with a VM size in range; the VM's own
// capacity is always one the kernel command line can carry; and what it
// accepts reads back the same once written again.
func FuzzParseSpec(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		spec, err := parseSpec(raw)
		if err != nil {
			return
		}
		trimmed := bytes.TrimSpace(raw)
		if len(trimmed) > 0 && (!json.Valid(trimmed) || (trimmed[0] != '{' && string(trimmed) != "null")) {
			t.Fatalf("accepted %q, which is not one JSON object", raw)
		}
		if spec.CPUs < 1 || spec.CPUs > 64 {
			t.Fatalf("%q: accepted %d CPUs", raw, spec.CPUs)
		}
		mem, err := resource.ParseQuantity(spec.Memory)
		if err != nil || mem.Cmp(resource.MustParse("256Mi")) < 0 || mem.Cmp(resource.MustParse("64Gi")) > 0 {
			t.Fatalf("%q: accepted memory %q (%v)", raw, spec.Memory, err)
		}
		if _, err := capacityArg(nil, spec); err != nil {
			t.Fatalf("%q: the VM's own capacity cannot be written: %v", raw, err)
		}
		again, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		back, err := parseSpec(again)
		if err != nil || back != spec {
			t.Fatalf("%q reads as %+v, written again as %s reads as %+v (%v)", raw, spec, again, back, err)
		}
	})
}

// FuzzCapacity: whatever resource name and quantity a class's capacity
// holds, Check accepts exactly the resource names Kubernetes takes with a
// quantity of zero or more, and what it accepts reaches the guest's agent
// as one --capacity flag, among exactly the flags it is always given,
// that says the same resources and amounts back.
func FuzzCapacity(f *testing.F) {
	h, dir := settled(f)
	spec := Spec{CPUs: 2, Memory: "1Gi"}
	raw, err := json.Marshal(spec)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name, quantity string) {
		q, err := resource.ParseQuantity(quantity)
		if err != nil {
			return
		}
		capacity := corev1.ResourceList{corev1.ResourceName(name): q}
		err = h.Check(raw, capacity, "")
		valid := len(validation.IsQualifiedName(name)) == 0 && q.Sign() >= 0
		if valid != (err == nil) {
			t.Fatalf("capacity %q=%q: a resource name %v, and Check said %v", name, quantity, valid, err)
		}
		if err != nil {
			return
		}
		args, err := h.args(process.Boot{Dir: dir, ProviderID: "qemu:///ns/m/0b5c", NodeName: "m-0b5c", Version: "v1.37.2", Capacity: capacity}, spec, "initrd", AccelTCG)
		if err != nil {
			t.Fatalf("capacity %q=%q, checked, cannot be written: %v", name, quantity, err)
		}
		words := initArgs(t, args)
		if len(words) != 8 || !strings.HasPrefix(words[7], "--capacity=") {
			t.Fatalf("capacity %q=%q gives the guest's init %q", name, quantity, words)
		}
		want := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1Gi")}
		want[corev1.ResourceName(name)] = q
		got := corev1.ResourceList{}
		for _, pair := range strings.Split(strings.TrimPrefix(words[7], "--capacity="), ",") {
			k, v, ok := strings.Cut(pair, "=")
			if !ok {
				t.Fatalf("capacity %q=%q: %q in %s is no name=quantity", name, quantity, pair, words[7])
			}
			parsed, err := resource.ParseQuantity(v)
			if err != nil {
				t.Fatalf("capacity %q=%q: %q in %s: %v", name, quantity, v, words[7], err)
			}
			if _, twice := got[corev1.ResourceName(k)]; twice {
				t.Fatalf("capacity %q=%q: %s says %s twice", name, quantity, words[7], k)
			}
			got[corev1.ResourceName(k)] = parsed
		}
		if len(got) != len(want) {
			t.Fatalf("capacity %q=%q: the agent reads %v, want %v", name, quantity, got, want)
		}
		for k, w := range want {
			if g, ok := got[k]; !ok || g.Cmp(w) != 0 {
				t.Fatalf("capacity %q=%q: the agent reads %s=%v, want %v", name, quantity, k, got[k], w.String())
			}
		}
	})
}
