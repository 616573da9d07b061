package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machinist-dev/machinist/controllers/machinedeployment"
	"github.com/machinist-dev/machinist/controllers/machinehealthcheck"
	"github.com/machinist-dev/machinist/lifecycle/phases"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := root()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// machineMoves is how many moves docs/lifecycle.md's Machine table has,
// counted by hand; package phases' table_test.go lists each one.
const machineMoves = 26

func TestFSMPrintsEveryTransition(t *testing.T) {
	for _, format := range []string{"mermaid", "dot"} {
		out, err := run(t, "fsm", "--format", format)
		if err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		// Exactly one line per move: a dropped rule or a duplicate line
		// changes the count even where every line checked below is there.
		arrow := map[string]string{"mermaid": " --> ", "dot": `" -> "`}[format]
		lines := 0
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, arrow) && !strings.Contains(l, "[*]") {
				lines++
			}
		}
		if lines != machineMoves {
			t.Errorf("%s output has %d move lines, want %d", format, lines, machineMoves)
		}
		for _, r := range phases.Table.Rules {
			for _, from := range r.From {
				var want string
				if format == "mermaid" {
					want = string(from) + " --> " + string(r.To) + ": " + string(r.Event)
				} else {
					want = `"` + string(from) + `" -> "` + string(r.To) + `" [ label = "` + string(r.Event) + `" ]`
				}
				if !strings.Contains(out, want) {
					t.Errorf("%s output lacks %q", format, want)
				}
			}
		}
	}
}

func TestFSMRejectsUnknownFormatAndTable(t *testing.T) {
	if _, err := run(t, "fsm", "--format", "png"); err == nil || !strings.Contains(err.Error(), "use mermaid or dot") {
		t.Fatalf("got %v, want an error naming the formats", err)
	}
	if _, err := run(t, "fsm", "--table", "cluster"); err == nil || !strings.Contains(err.Error(), "use machine, rollout or remediation") {
		t.Fatalf("got %v, want an error naming the tables", err)
	}
}

// TestDocsShowTheTables keeps docs/lifecycle.md, docs/rollouts.md and
// docs/healthchecks.md in step with the code: each one's mermaid block must be exactly what
// `machinist fsm` prints, and every state and event must be explained.
func TestDocsShowTheTables(t *testing.T) {
	for _, c := range []struct {
		doc, table     string
		states, events []string
	}{
		{"lifecycle.md", "machine", strs(phases.Table.States()), strs(phases.Table.Events())},
		{"rollouts.md", "rollout", strs(machinedeployment.Rollout.States()), strs(machinedeployment.Rollout.Events())},
		{"healthchecks.md", "remediation", strs(machinehealthcheck.Table.States()), strs(machinehealthcheck.Table.Events())},
	} {
		doc, err := os.ReadFile(filepath.Join("..", "..", "docs", c.doc))
		if err != nil {
			t.Fatal(err)
		}
		want, err := diagrams[c.table]("mermaid")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), "```mermaid\n"+want+"```") {
			t.Errorf("docs/%s's diagram differs from the code; replace it with the output of `go run ./cmd/machinist fsm --table %s`:\n%s", c.doc, c.table, want)
		}
		for _, s := range c.states {
			if !strings.Contains(string(doc), "| "+s+" |") {
				t.Errorf("docs/%s does not explain state %s in its states table", c.doc, s)
			}
		}
		for _, e := range c.events {
			if !strings.Contains(string(doc), "| `"+e+"` |") {
				t.Errorf("docs/%s does not explain event %s in its events table", c.doc, e)
			}
		}
	}
}

func strs[T ~string](in []T) []string {
	out := make([]string, len(in))
	for i, v := range in {
		out[i] = string(v)
	}
	return out
}
