// Package statemachine turns a declared table of states and events into
// looplab/fsm state machines. Machinist declares each of its state machines
// (a Machine's lifecycle, a MachineDeployment's rollout) once, as such a
// table; the table is the only place their states and moves are defined.
package statemachine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/looplab/fsm"
)

// Rule is one row of a table: Event moves from any of From to To.
type Rule[S, E ~string] struct {
	Event E
	From  []S
	To    S
}

// Table is a declared state machine.
type Table[S, E ~string] struct {
	// Initial is where a new object starts.
	Initial S
	// Rules are every allowed move.
	Rules []Rule[S, E]
}

// ErrNotAllowed is returned, wrapped, for an event a table does not allow
// in the current state.
var ErrNotAllowed = errors.New("event not allowed")

// States lists every state, Initial first, then in the order the rules
// first mention them.
func (t Table[S, E]) States() []S {
	states := []S{t.Initial}
	add := func(s S) {
		if !slices.Contains(states, s) {
			states = append(states, s)
		}
	}
	for _, r := range t.Rules {
		for _, f := range r.From {
			add(f)
		}
		add(r.To)
	}
	return states
}

// Events lists every event in rule order.
func (t Table[S, E]) Events() []E {
	var events []E
	for _, r := range t.Rules {
		if !slices.Contains(events, r.Event) {
			events = append(events, r.Event)
		}
	}
	return events
}

// From lists the states e may be fired in, in table order.
func (t Table[S, E]) From(e E) []S {
	var out []S
	for _, r := range t.Rules {
		if r.Event == e {
			for _, f := range r.From {
				if !slices.Contains(out, f) {
					out = append(out, f)
				}
			}
		}
	}
	return out
}

// Allowed returns where e leads from s, if the table allows it.
func (t Table[S, E]) Allowed(s S, e E) (S, bool) {
	for _, r := range t.Rules {
		if r.Event == e && slices.Contains(r.From, s) {
			return r.To, true
		}
	}
	return "", false
}

// New returns a state machine standing in current; "" means Initial.
func (t Table[S, E]) New(current S) *Machine[S, E] {
	if current == "" {
		current = t.Initial
	}
	events := make(fsm.Events, 0, len(t.Rules))
	for _, r := range t.Rules {
		src := make([]string, len(r.From))
		for i, f := range r.From {
			src[i] = string(f)
		}
		events = append(events, fsm.EventDesc{Name: string(r.Event), Src: src, Dst: string(r.To)})
	}
	return &Machine[S, E]{fsm: fsm.NewFSM(string(current), events, nil)}
}

// Diagram renders the table as "mermaid" (a state diagram) or "dot"
// (Graphviz), starting from Initial.
func (t Table[S, E]) Diagram(format string) (string, error) {
	f := t.New(t.Initial).fsm
	switch format {
	case "mermaid":
		return fsm.VisualizeWithType(f, fsm.MermaidStateDiagram)
	case "dot":
		return fsm.VisualizeWithType(f, fsm.GRAPHVIZ)
	default:
		return "", fmt.Errorf("unknown format %q: use mermaid or dot", format)
	}
}

// Machine is one object's state machine. looplab/fsm keeps no state across
// processes, so callers rebuild it from the state stored in the API for
// every reconcile.
type Machine[S, E ~string] struct {
	fsm *fsm.FSM
}

// State is the current state.
func (m *Machine[S, E]) State() S { return S(m.fsm.Current()) }

// Can reports whether the table allows e now.
func (m *Machine[S, E]) Can(e E) bool { return m.fsm.Can(string(e)) }

// Fire moves the state machine by e, or returns an error wrapping
// ErrNotAllowed and changes nothing.
func (m *Machine[S, E]) Fire(e E) (from, to S, err error) {
	from = m.State()
	if err := m.fsm.Event(context.Background(), string(e)); err != nil {
		return from, from, fmt.Errorf("%w: %q in %s: %v", ErrNotAllowed, e, from, err)
	}
	return from, m.State(), nil
}

// Path returns the shortest sequence of events that leads from one state to
// another, empty when they are the same, and false when none does.
func (t Table[S, E]) Path(from, to S) ([]E, bool) {
	type step struct {
		state S
		path  []E
	}
	seen := map[S]bool{from: true}
	queue := []step{{state: from}}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur.state == to {
			return cur.path, true
		}
		for _, r := range t.Rules {
			if slices.Contains(r.From, cur.state) && !seen[r.To] {
				seen[r.To] = true
				queue = append(queue, step{state: r.To, path: append(slices.Clone(cur.path), r.Event)})
			}
		}
	}
	return nil, false
}
