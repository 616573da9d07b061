package phases

import (
	"errors"
	"slices"
	"testing"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// move is one allowed transition, written out by hand.
type move struct {
	from  machinistv1.MachinePhase
	event Event
	to    machinistv1.MachinePhase
}

// moves is every transition docs/lifecycle.md promises, spelled with
// literal strings rather than the package's constants and written out
// rather than derived from Table, so that a rule dropped, added or
// redirected in the table (or a renamed phase or event) fails here.
var moves = []move{
	{"Pending", "provision", "Provisioning"},
	{"Pending", "delete", "Deleting"},
	{"Pending", "fail", "Failed"},
	{"Provisioning", "provisioned", "Running"},
	{"Provisioning", "delete", "Deleting"},
	{"Provisioning", "fail", "Failed"},
	{"Running", "drain", "Draining"},
	{"Running", "reboot", "Rebooting"},
	{"Running", "repair", "Repairing"},
	{"Draining", "reboot", "Rebooting"},
	{"Draining", "repair", "Repairing"},
	{"Draining", "delete", "Deleting"},
	{"Draining", "abort", "Running"},
	{"Rebooting", "rebooted", "Running"},
	{"Rebooting", "delete", "Deleting"},
	{"Rebooting", "fail", "Failed"},
	{"Repairing", "repaired", "Running"},
	{"Repairing", "delete", "Deleting"},
	{"Repairing", "fail", "Failed"},
	{"Draining", "update", "Updating"},
	{"Updating", "updated", "Running"},
	{"Updating", "delete", "Deleting"},
	{"Updating", "fail", "Failed"},
	{"Failed", "delete", "Deleting"},
	{"Failed", "repair", "Repairing"},
	{"Deleting", "deleted", "Deleted"},
}

// allowed answers from the written-out list, never from Table.
func allowed(p machinistv1.MachinePhase, e Event) (machinistv1.MachinePhase, bool) {
	for _, m := range moves {
		if m.from == p && m.event == e {
			return m.to, true
		}
	}
	return "", false
}

// everyState and everyEvent are the union of what the list and the table
// name, so that a state or event only one of them knows is still checked.
func everyState() []machinistv1.MachinePhase {
	out := slices.Clone(States())
	for _, m := range moves {
		for _, p := range []machinistv1.MachinePhase{m.from, m.to} {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

func everyEvent() []Event {
	out := slices.Clone(Events())
	for _, m := range moves {
		if !slices.Contains(out, m.event) {
			out = append(out, m.event)
		}
	}
	return out
}

// TestTableIsExactlyTheListedMoves compares the table with the list both
// ways: every listed move is allowed and leads where listed, and every
// (state, event) pair the list does not name is refused, both by the
// table's own lookup and by the looplab/fsm machine built from it.
func TestTableIsExactlyTheListedMoves(t *testing.T) {
	if Table.Initial != "Pending" {
		t.Errorf("Initial is %q, want Pending", Table.Initial)
	}
	if got, want := len(everyState()), len(States()); got != want {
		t.Errorf("the list names states the table lacks: list and table together have %d, the table %d", got, want)
	}
	if got, want := len(everyEvent()), len(Events()); got != want {
		t.Errorf("the list names events the table lacks: list and table together have %d, the table %d", got, want)
	}
	declared := 0
	for _, r := range Table.Rules {
		declared += len(r.From)
	}
	if declared != len(moves) {
		t.Errorf("the table declares %d moves (counting each From), the list %d", declared, len(moves))
	}
	for _, p := range everyState() {
		for _, e := range everyEvent() {
			want, ok := allowed(p, e)
			got, tableOK := Table.Allowed(p, e)
			if ok != tableOK || got != want {
				t.Errorf("%s in %s: table says (%q, %v), list says (%q, %v)", e, p, got, tableOK, want, ok)
			}
			m := New(p)
			if m.Can(e) != ok {
				t.Errorf("%s in %s: Can is %v, list says %v", e, p, m.Can(e), ok)
			}
			_, to, err := m.Fire(e)
			switch {
			case ok && (err != nil || to != want || m.State() != want):
				t.Errorf("%s in %s: got %s (phase %s, err %v), want %s", e, p, to, m.State(), err, want)
			case !ok && (!errors.Is(err, ErrNotAllowed) || m.State() != p):
				t.Errorf("%s in %s: got err %v and phase %s, want ErrNotAllowed and no move", e, p, err, m.State())
			}
		}
	}
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
	if n != len(moves) {
		t.Fatalf("%d transitions checked, want the %d listed", n, len(moves))
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
