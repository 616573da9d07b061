package v1alpha1_test

import (
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	serializer "k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/conversion"
	"sigs.k8s.io/randfill"

	"github.com/machinist-dev/machinist/api/v1alpha1"
	"github.com/machinist-dev/machinist/api/v1beta1"
)

// iterations is how many random objects of each kind make each round
// trip. Each conversion is a few microseconds; ten thousand fill every
// optional field, empty and set, many times over.
const iterations = 10000

// spoke is a v1alpha1 kind: it converts to and from the hub.
type spoke interface {
	client.Object
	conversion.Convertible
}

// hub is a v1beta1 kind.
type hub interface {
	client.Object
	conversion.Hub
}

var kinds = []struct {
	name  string
	spoke func() spoke
	hub   func() hub
}{
	{"Machine", func() spoke { return &v1alpha1.Machine{} }, func() hub { return &v1beta1.Machine{} }},
	{"MachineClass", func() spoke { return &v1alpha1.MachineClass{} }, func() hub { return &v1beta1.MachineClass{} }},
	{"MachineSet", func() spoke { return &v1alpha1.MachineSet{} }, func() hub { return &v1beta1.MachineSet{} }},
	{"MachineDeployment", func() spoke { return &v1alpha1.MachineDeployment{} }, func() hub { return &v1beta1.MachineDeployment{} }},
	{"MachineHealthCheck", func() spoke { return &v1alpha1.MachineHealthCheck{} }, func() hub { return &v1beta1.MachineHealthCheck{} }},
	{"MachineDisruptionBudget", func() spoke { return &v1alpha1.MachineDisruptionBudget{} }, func() hub { return &v1beta1.MachineDisruptionBudget{} }},
	{"MachineDrainRule", func() spoke { return &v1alpha1.MachineDrainRule{} }, func() hub { return &v1beta1.MachineDrainRule{} }},
	{"WorkloadCluster", func() spoke { return &v1alpha1.WorkloadCluster{} }, func() hub { return &v1beta1.WorkloadCluster{} }},
}

// hubOnly are the kinds v1beta1 serves alone: newer than v1alpha1's
// deprecation, they have nothing to convert.
var hubOnly = []string{"ManagementCluster"}

// TestEveryKindRoundTrips fills each kind of each version with random
// values (apimachinery's fuzzer, with the rules for metadata, times and
// quantities the API server's own round-trip tests use) and converts it
// to the other version and back: what comes back must equal what went.
func TestEveryKindRoundTrips(t *testing.T) {
	if len(kinds)+len(hubOnly) != len(typesOf(v1beta1.AddToScheme)) {
		t.Fatalf("the test covers %d kinds and %d served at v1beta1 alone, v1beta1 has %d: add the new kind here", len(kinds), len(hubOnly), len(typesOf(v1beta1.AddToScheme)))
	}
	for _, kind := range hubOnly {
		if slices.Contains(typesOf(v1alpha1.AddToScheme), kind) {
			t.Errorf("%s is served at v1beta1 alone, but v1alpha1 has it: add it to kinds", kind)
		}
	}
	// A class's providerSpec is filled with an encoded core object.
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	seed := rand.Int63()
	t.Logf("seed %d", seed)
	fill := fuzzer.FuzzerFor(fuzzer.MergeFuzzerFuncs(metafuzzer.Funcs, enums), rand.NewSource(seed), serializer.NewCodecFactory(scheme))
	for _, k := range kinds {
		t.Run(k.name+"/v1alpha1-v1beta1-v1alpha1", func(t *testing.T) {
			for range iterations {
				start := k.spoke()
				fill.Fill(start)
				forget(start)
				through := k.hub()
				if err := start.ConvertTo(through); err != nil {
					t.Fatalf("to v1beta1: %v", err)
				}
				back := k.spoke()
				if err := back.ConvertFrom(through); err != nil {
					t.Fatalf("back to v1alpha1: %v", err)
				}
				if !apiequality.Semantic.DeepEqual(start, back) {
					t.Fatalf("changed by the round trip (-before +after):\n%s", cmp.Diff(start, back))
				}
			}
		})
		t.Run(k.name+"/v1beta1-v1alpha1-v1beta1", func(t *testing.T) {
			for range iterations {
				start := k.hub()
				fill.Fill(start)
				forget(start)
				through := k.spoke()
				if err := through.ConvertFrom(start); err != nil {
					t.Fatalf("to v1alpha1: %v", err)
				}
				back := k.hub()
				if err := through.ConvertTo(back); err != nil {
					t.Fatalf("back to v1beta1: %v", err)
				}
				if !apiequality.Semantic.DeepEqual(start, back) {
					t.Fatalf("changed by the round trip (-before +after):\n%s", cmp.Diff(start, back))
				}
			}
		})
	}
}

// forget clears what a conversion does not carry: the type (the webhook
// sets it) and the annotation conversions write for themselves, which a
// random object could otherwise start with.
func forget(o client.Object) {
	reflect.ValueOf(o).Elem().FieldByName("TypeMeta").Set(reflect.ValueOf(metav1.TypeMeta{}))
	a := o.GetAnnotations()
	delete(a, v1alpha1.ConversionDataAnnotation)
	o.SetAnnotations(a)
}

// enums fill the fields whose values the schemas restrict to a few words
// with those words (or nothing): a value the API server refuses is never
// stored, so it never needs to convert.
func enums(serializer.CodecFactory) []any {
	modes := []string{"", "soft", "hard"}
	reasons := []v1alpha1.DisruptionReason{v1alpha1.DisruptionRollout, v1alpha1.DisruptionInPlaceUpdate,
		v1alpha1.DisruptionReboot, v1alpha1.DisruptionRepair, v1alpha1.DisruptionRemediation, v1alpha1.DisruptionExpiry}
	return []any{
		// The fuzzer calls a nil *metav1.Time's own filler, which
		// leaves it nil: every optional time would stay unset.
		func(t **metav1.Time, c randfill.Continue) {
			*t = nil
			if c.Bool() {
				*t = &metav1.Time{}
				(*t).RandFill(c.Rand)
			}
		},
		func(o *v1alpha1.OperationOptions, c randfill.Continue) {
			c.FillNoCustom(o)
			o.Mode = modes[c.Intn(len(modes))]
		},
		func(r *v1alpha1.Rung, c randfill.Continue) {
			c.FillNoCustom(r)
			r.Mode = modes[c.Intn(len(modes))]
		},
		func(r *v1alpha1.DisruptionReason, c randfill.Continue) {
			*r = reasons[c.Intn(len(reasons))]
		},
		func(o *v1beta1.OperationOptions, c randfill.Continue) {
			c.FillNoCustom(o)
			o.Mode = []v1beta1.RebootMode{"", v1beta1.RebootSoft, v1beta1.RebootHard}[c.Intn(3)]
		},
		func(r *v1beta1.Rung, c randfill.Continue) {
			c.FillNoCustom(r)
			r.Mode = []v1beta1.RebootMode{"", v1beta1.RebootSoft, v1beta1.RebootHard}[c.Intn(3)]
		},
		func(r *v1beta1.DisruptionReason, c randfill.Continue) {
			var alpha v1alpha1.DisruptionReason
			c.Fill(&alpha)
			*r = v1beta1.DisruptionReason(alpha)
			if alpha == v1alpha1.DisruptionInPlaceUpdate {
				*r = v1beta1.DisruptionUpdate
			}
		},
	}
}

// typesOf lists the object kinds (not their lists) a package registers.
func typesOf(add func(*runtime.Scheme) error) []string {
	s := runtime.NewScheme()
	if err := add(s); err != nil {
		panic(err)
	}
	var kinds []string
	for kind, typ := range s.KnownTypes(v1beta1.GroupVersion) {
		if typ.PkgPath() == reflect.TypeFor[v1beta1.Machine]().PkgPath() && !strings.HasSuffix(kind, "List") {
			kinds = append(kinds, kind)
		}
	}
	return kinds
}

// TestFailedMachineSaysWhyInBothVersions: v1beta1 says why a Machine
// failed once, in its Ready condition; a client of v1alpha1 still reads it
// in failureReason and failureMessage, and one that writes them as the
// controller did leaves no annotation behind.
func TestFailedMachineSaysWhyInBothVersions(t *testing.T) {
	failed := &v1beta1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "m"},
		Status: v1beta1.MachineStatus{Phase: v1beta1.MachineFailed, Conditions: []metav1.Condition{{
			Type: v1beta1.ConditionReady, Status: metav1.ConditionFalse,
			Reason: v1beta1.FailureProvisioningTimeout, Message: "no Node within 10m0s",
		}}},
	}
	var alpha v1alpha1.Machine
	if err := alpha.ConvertFrom(failed); err != nil {
		t.Fatal(err)
	}
	if alpha.Status.FailureReason != v1alpha1.FailureProvisioningTimeout || alpha.Status.FailureMessage != "no Node within 10m0s" {
		t.Fatalf("v1alpha1 reads failureReason %q, failureMessage %q", alpha.Status.FailureReason, alpha.Status.FailureMessage)
	}
	var beta v1beta1.Machine
	if err := alpha.ConvertTo(&beta); err != nil {
		t.Fatal(err)
	}
	if a, ok := beta.Annotations[v1alpha1.ConversionDataAnnotation]; ok {
		t.Fatalf("a v1alpha1 Machine v1beta1 can say whole left an annotation: %s", a)
	}

	// Running again: v1alpha1 had cleared both; nothing is derived.
	failed.Status.Phase = v1beta1.MachineRunning
	if err := alpha.ConvertFrom(failed); err != nil {
		t.Fatal(err)
	}
	if alpha.Status.FailureReason != "" || alpha.Status.FailureMessage != "" {
		t.Fatalf("a Running Machine reads failureReason %q at v1alpha1", alpha.Status.FailureReason)
	}
}

// TestOnlyWhatIsLostIsKept: an annotation is written only for a field
// v1beta1 cannot hold, and the rest of the object's annotations are left
// as they were, in both directions.
func TestOnlyWhatIsLostIsKept(t *testing.T) {
	m := &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Annotations: map[string]string{"a": "b"}}}
	m.Spec.NodeTaints = v1alpha1.NodeTaints{{Key: "k", Effect: "NoSchedule"}}
	var beta v1beta1.Machine
	if err := m.ConvertTo(&beta); err != nil {
		t.Fatal(err)
	}
	if len(beta.Annotations) != 1 || beta.Annotations["a"] != "b" {
		t.Fatalf("annotations at v1beta1: %v", beta.Annotations)
	}
	added := metav1.Unix(1700000000, 0)
	m.Spec.NodeTaints[0].TimeAdded = &added
	if err := m.ConvertTo(&beta); err != nil {
		t.Fatal(err)
	}
	if got := beta.Annotations[v1alpha1.ConversionDataAnnotation]; got != `{"timeAdded":["2023-11-14T22:13:20Z"]}` {
		t.Fatalf("kept %q", got)
	}
	if m.Annotations[v1alpha1.ConversionDataAnnotation] != "" {
		t.Fatal("the conversion wrote into the source object's annotations")
	}
	var back v1alpha1.Machine
	if err := back.ConvertFrom(&beta); err != nil {
		t.Fatal(err)
	}
	if len(back.Annotations) != 1 || !back.Spec.NodeTaints[0].TimeAdded.Equal(&added) {
		t.Fatalf("back at v1alpha1: annotations %v, taint %+v", back.Annotations, back.Spec.NodeTaints[0])
	}
	if beta.Annotations[v1alpha1.ConversionDataAnnotation] == "" {
		t.Fatal("the conversion removed the annotation from the source object")
	}
}

// BenchmarkMachineRoundTrip is the cost, per Machine, of what the webhook
// does for a v1alpha1 reader of a stored v1beta1 Machine and back: a
// list of N Machines at v1alpha1 costs N times this, in the verbs server.
func BenchmarkMachineRoundTrip(b *testing.B) {
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	fill := fuzzer.FuzzerFor(fuzzer.MergeFuzzerFuncs(metafuzzer.Funcs, enums), rand.NewSource(1), serializer.NewCodecFactory(scheme))
	start := &v1beta1.Machine{}
	fill.Fill(start)
	forget(start)
	for b.Loop() {
		var alpha v1alpha1.Machine
		if err := alpha.ConvertFrom(start); err != nil {
			b.Fatal(err)
		}
		var back v1beta1.Machine
		if err := alpha.ConvertTo(&back); err != nil {
			b.Fatal(err)
		}
	}
}
