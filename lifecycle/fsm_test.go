package lifecycle

import (
	"errors"
	"slices"
	"testing"

	machinistv1 "github.com/machinist-dev/machinist/api/v1alpha1"
)

func allowed(p machinistv1.MachinePhase, e Event) (machinistv1.MachinePhase, bool) {
	return Table.Allowed(p, e)
}

func TestEveryDeclaredTransitionWorks(t *testing.T) {
	n := 0
	for _, r := range Table.Rules {
		for _, from := range r.From {
			m := New(from)
			gotFrom, to, err := m.Fire(r.Event)
			if err != nil {
				t.Errorf("%s --%s--> %s: %v", from, r.Event, r.To, err)
				continue
			}
			if gotFrom != from || to != r.To || m.State() != r.To {
				t.Errorf("%s --%s-->: got %s -> %s (phase %s), want %s", from, r.Event, gotFrom, to, m.State(), r.To)
			}
			n++
		}
	}
	if n < 19 {
		t.Fatalf("only %d transitions checked", n)
	}
}

func TestEveryUndeclaredPairIsAnError(t *testing.T) {
	for _, p := range States() {
		for _, e := range Events() {
			if _, ok := allowed(p, e); ok {
				continue
			}
			m := New(p)
			if m.Can(e) {
				t.Errorf("Can(%s) in %s is true but the table does not allow it", e, p)
			}
			_, to, err := m.Fire(e)
			if !errors.Is(err, ErrNotAllowed) {
				t.Errorf("%s in %s: got err %v, want ErrNotAllowed", e, p, err)
			}
			if to != p || m.State() != p {
				t.Errorf("%s in %s changed the phase to %s", e, p, m.State())
			}
		}
	}
	if _, _, err := New(machinistv1.MachineRunning).Fire("explode"); !errors.Is(err, ErrNotAllowed) {
		t.Errorf("unknown event: got %v, want ErrNotAllowed", err)
	}
}

func TestEmptyPhaseIsInitial(t *testing.T) {
	if got := New("").State(); got != Initial {
		t.Fatalf("New(\"\").State() = %s, want %s", got, Initial)
	}
}

func TestEveryAPIPhaseIsAState(t *testing.T) {
	for _, p := range []machinistv1.MachinePhase{
		machinistv1.MachinePending, machinistv1.MachineProvisioning, machinistv1.MachineRunning,
		machinistv1.MachineDraining, machinistv1.MachineRebooting, machinistv1.MachineRepairing,
		machinistv1.MachineDeleting, machinistv1.MachineFailed,
	} {
		if !slices.Contains(States(), p) {
			t.Errorf("phase %s is in the API but not in the table", p)
		}
	}
}

// FuzzEventSequences fires arbitrary event sequences and checks that the
// state machine only ever stands in a declared state and moves exactly as
// the table says. Its seed corpus runs with every go test.
func FuzzEventSequences(f *testing.F) {
	f.Add([]byte{0, 1, 2, 7, 8})       // provision, provisioned, drain, delete, deleted
	f.Add([]byte{0, 1, 3, 4, 2, 5, 6}) // a reboot without drain, then a repair
	f.Add([]byte{9, 7, 8, 0, 1})       // fail, delete, deleted, then events on Gone
	f.Add([]byte{255, 3, 17, 42})
	events := Events()
	states := States()
	f.Fuzz(func(t *testing.T, seq []byte) {
		m := New(Initial)
		for _, b := range seq {
			e := events[int(b)%len(events)]
			before := m.State()
			want, ok := allowed(before, e)
			_, to, err := m.Fire(e)
			switch {
			case ok && err != nil:
				t.Fatalf("%s in %s: declared, but got %v", e, before, err)
			case ok && to != want:
				t.Fatalf("%s in %s: went to %s, want %s", e, before, to, want)
			case !ok && err == nil:
				t.Fatalf("%s in %s: undeclared, but it moved to %s", e, before, to)
			case !ok && m.State() != before:
				t.Fatalf("%s in %s: refused, but the phase changed to %s", e, before, m.State())
			}
			if !slices.Contains(states, m.State()) {
				t.Fatalf("reached undeclared state %s", m.State())
			}
		}
	})
}
