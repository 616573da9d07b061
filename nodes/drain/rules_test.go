package drain_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/nodes/drain"
)

// rule is a DrainRule of no namespace, as Decide is handed it.
func rule(name string, behavior machinistv1.DrainBehavior, order *int32, machines map[string]string, pods ...machinistv1.MachineDrainRulePodSelector) machinistv1.MachineDrainRule {
	return *testenv.DrainRule("", name, behavior, order, machines, pods...)
}

func pod(labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "p", Labels: labels}}
}

func TestDecide(t *testing.T) {
	machine := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Labels: map[string]string{"pool": "db"}}}
	all := []machinistv1.MachineDrainRule{
		// Listed out of name order: precedence is by name, not by list.
		rule("z-everything-late", machinistv1.DrainBehaviorDrain, ptr.To[int32](100), nil),
		rule("b-proxies-first", machinistv1.DrainBehaviorDrain, ptr.To[int32](-10), nil, testenv.PodsLabelled(map[string]string{"app": "proxy"})),
		rule("a-databases-last", machinistv1.DrainBehaviorDrain, ptr.To[int32](10), map[string]string{"pool": "db"}, testenv.PodsLabelled(map[string]string{"app": "db"})),
		rule("c-jobs", machinistv1.DrainBehaviorWaitCompleted, nil, nil, testenv.PodsInNamespacesLabelled(map[string]string{"kind": "batch"})),
		rule("d-other-pool", machinistv1.DrainBehaviorSkip, nil, map[string]string{"pool": "web"}),
	}
	rules, err := drain.For(machine, all)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rules.Names(), []string{"a-databases-last", "b-proxies-first", "c-jobs", "z-everything-late"}; !slices.Equal(got, want) {
		t.Fatalf("rules selecting the Machine: %v, want %v (by name; d-other-pool selects another pool)", got, want)
	}
	if !rules.NeedNamespaces() {
		t.Error("c-jobs selects by namespace, but NeedNamespaces is false")
	}
	cases := []struct {
		name      string
		pod       *corev1.Pod
		ns        map[string]string
		behavior  machinistv1.DrainBehavior
		order     int32
		source    string
		overruled []string
	}{
		{"a database pod, by the first rule by name", pod(map[string]string{"app": "db"}), nil, machinistv1.DrainBehaviorDrain, 10, "MachineDrainRule a-databases-last", []string{"z-everything-late"}},
		{"a proxy", pod(map[string]string{"app": "proxy"}), nil, machinistv1.DrainBehaviorDrain, -10, "MachineDrainRule b-proxies-first", []string{"z-everything-late"}},
		{"a job's pod, by its namespace", pod(nil), map[string]string{"kind": "batch"}, machinistv1.DrainBehaviorWaitCompleted, 0, "MachineDrainRule c-jobs", []string{"z-everything-late"}},
		{"any other pod", pod(nil), nil, machinistv1.DrainBehaviorDrain, 100, "MachineDrainRule z-everything-late", nil},
		{"the label skip over every rule", pod(map[string]string{"app": "db", machinistv1.DrainLabel: "skip"}), nil, machinistv1.DrainBehaviorSkip, 0, "label machinist.dev/drain=skip", []string{"a-databases-last", "z-everything-late"}},
		{"the label order.-5", pod(map[string]string{machinistv1.DrainLabel: "order.-5"}), nil, machinistv1.DrainBehaviorDrain, -5, "label machinist.dev/drain=order.-5", []string{"z-everything-late"}},
		{"the label wait-completed", pod(map[string]string{machinistv1.DrainLabel: "wait-completed"}), nil, machinistv1.DrainBehaviorWaitCompleted, 0, "label machinist.dev/drain=wait-completed", []string{"z-everything-late"}},
		{"a label not understood is said so, and the rules decide", pod(map[string]string{machinistv1.DrainLabel: "later"}), nil, machinistv1.DrainBehaviorDrain, 100,
			`MachineDrainRule z-everything-late (label machinist.dev/drain="later" not understood: want skip, wait-completed or order.<n>)`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := rules.Decide(c.pod, c.ns)
			if d.Behavior != c.behavior || d.Order != c.order || d.Source != c.source || !slices.Equal(d.Overruled, c.overruled) {
				t.Errorf("got %+v, want %s order %d by %q over %v", d, c.behavior, c.order, c.source, c.overruled)
			}
		})
	}
}

func TestNoRulesDrainEveryPodAtOrderZero(t *testing.T) {
	rules, err := drain.For(&machinistv1.Machine{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := rules.Decide(pod(map[string]string{"app": "x"}), nil)
	if d.Behavior != machinistv1.DrainBehaviorDrain || d.Order != 0 || d.Source != "default" {
		t.Fatalf("got %+v", d)
	}
}

func TestARuleWithABadSelectorIsAnErrorNamingIt(t *testing.T) {
	bad := rule("broken", machinistv1.DrainBehaviorSkip, nil, nil, testenv.PodsLabelled(map[string]string{"app": "not a label value"}))
	if _, err := drain.For(&machinistv1.Machine{}, []machinistv1.MachineDrainRule{bad}); err == nil {
		t.Fatal("a selector with an invalid label value was accepted")
	} else if want := "MachineDrainRule broken"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name the rule", err)
	}
}

func TestParseLabel(t *testing.T) {
	for v, want := range map[string]bool{"skip": true, "wait-completed": true, "order.0": true, "order.-10": true, "order.7": true,
		"order=7": false, "order.": false, "order.x": false, "Skip": false, "": false, "order.99999999999": false} {
		if _, _, err := drain.ParseLabel(v); (err == nil) != want {
			t.Errorf("ParseLabel(%q): error %v, want ok=%v", v, err, want)
		}
	}
}
