package machinedeployment

import (
	"errors"
	"slices"
	"testing"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/internal/statemachine"
)

const (
	stable      = machinistv1.RolloutStable
	progressing = machinistv1.RolloutProgressing
	paused      = machinistv1.RolloutPaused
	stalled     = machinistv1.RolloutStalled
)

func TestDecideFiresOnlyWhatTheFactsJustify(t *testing.T) {
	for _, c := range []struct {
		name  string
		from  machinistv1.RolloutPhase
		facts Facts
		want  []Event
	}{
		{"a new deployment with Machines to make starts", "", Facts{}, []Event{Start}},
		{"a new deployment of nothing is stable", "", Facts{Complete: true}, nil},
		{"a stable rollout stays", stable, Facts{Complete: true}, nil},
		{"a new template starts a rollout", stable, Facts{}, []Event{Start}},
		{"a stable rollout is paused", stable, Facts{Paused: true, Complete: true}, []Event{Pause}},
		{"a rollout goes on", progressing, Facts{}, nil},
		{"a rollout completes", progressing, Facts{Complete: true}, []Event{Complete}},
		{"a rollout past its deadline stalls", progressing, Facts{DeadlinePassed: true}, []Event{Stall}},
		{"a rollout completing at its deadline completes", progressing, Facts{Complete: true, DeadlinePassed: true}, []Event{Complete}},
		{"a rollout is paused", progressing, Facts{Paused: true, DeadlinePassed: true}, []Event{Pause}},
		{"a stalled rollout stays", stalled, Facts{DeadlinePassed: true}, nil},
		{"a stalled rollout moves again", stalled, Facts{}, []Event{Unstall}},
		{"a stalled rollout completes", stalled, Facts{Complete: true, DeadlinePassed: true}, []Event{Complete}},
		{"a stalled rollout is paused", stalled, Facts{Paused: true, DeadlinePassed: true}, []Event{Pause}},
		{"a paused rollout stays", paused, Facts{Paused: true}, nil},
		{"a paused complete rollout stays", paused, Facts{Paused: true, Complete: true}, nil},
		{"a rollout resumed with Machines to replace progresses", paused, Facts{}, []Event{Resume}},
		{"a rollout resumed with nothing to replace is stable at once", paused, Facts{Complete: true}, []Event{Complete}},
		{"a rollout resumed with nothing to replace is stable at once, deadline or not", paused, Facts{Complete: true, DeadlinePassed: true}, []Event{Complete}},
		// Each condition holds where its event is fired: the rollout has
		// Machines to replace (it progresses) and no progress was seen
		// for the deadline (it is stalled).
		{"an incomplete stable rollout past its deadline starts and stalls", stable, Facts{DeadlinePassed: true}, []Event{Start, Stall}},
		{"a rollout resumed past its deadline progresses and stalls", paused, Facts{DeadlinePassed: true}, []Event{Resume, Stall}},
	} {
		if got := Decide(c.from, c.facts); !slices.Equal(got, c.want) {
			t.Errorf("%s: Decide(%q, %+v) = %v, want %v", c.name, c.from, c.facts, got, c.want)
		}
	}
}

// TestDecideEntersOnlyPhasesTheFactsHold walks every phase and every
// combination of facts: the rollout ends where the facts put it (paused
// over complete over past its deadline), by moves the table allows, and
// every phase it enters on the way, each of which is an Event, is one the
// facts say it holds. Routing a resumed, complete rollout through
// Progressing would announce a rollout that never happened.
func TestDecideEntersOnlyPhasesTheFactsHold(t *testing.T) {
	holds := func(p machinistv1.RolloutPhase, f Facts) bool {
		switch p {
		case paused:
			return f.Paused
		case stable:
			return !f.Paused && f.Complete
		case progressing:
			return !f.Paused && !f.Complete
		case stalled:
			return !f.Paused && !f.Complete && f.DeadlinePassed
		}
		return false
	}
	for _, from := range Rollout.States() {
		for i := range 8 {
			f := Facts{Paused: i&1 != 0, Complete: i&2 != 0, DeadlinePassed: i&4 != 0}
			want := progressing
			switch {
			case f.Paused:
				want = paused
			case f.Complete:
				want = stable
			case f.DeadlinePassed:
				want = stalled
			}
			fsm := Rollout.New(from)
			for _, e := range Decide(from, f) {
				before, to, err := fsm.Fire(e)
				if err != nil {
					t.Fatalf("from %s with %+v: %v", from, f, err)
				}
				if !holds(to, f) {
					t.Errorf("from %s with %+v: %s -> %s (%s) enters a phase the rollout does not hold", from, f, before, to, e)
				}
			}
			if got := fsm.State(); got != want {
				t.Errorf("from %s with %+v: ends in %s, want %s", from, f, got, want)
			}
		}
	}
}

// An event the table does not allow is returned, not skipped, so that
// firing it reports the error instead of a phase being left as it is.
func TestDecideReturnsAnEventTheTableRefuses(t *testing.T) {
	events := Decide("Unknown", Facts{Paused: true})
	if !slices.Equal(events, []Event{Pause}) {
		t.Fatalf("Decide = %v, want [pause]", events)
	}
	if _, _, err := Rollout.New("Unknown").Fire(events[0]); !errors.Is(err, statemachine.ErrNotAllowed) {
		t.Fatalf("Fire = %v, want ErrNotAllowed", err)
	}
}
