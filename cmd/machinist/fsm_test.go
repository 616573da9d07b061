package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machinist-dev/machinist/lifecycle"
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

func TestFSMPrintsEveryTransition(t *testing.T) {
	for _, format := range []string{"mermaid", "dot"} {
		out, err := run(t, "fsm", "--format", format)
		if err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		for _, r := range lifecycle.Table.Rules {
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

func TestFSMRejectsUnknownFormat(t *testing.T) {
	if _, err := run(t, "fsm", "--format", "png"); err == nil || !strings.Contains(err.Error(), "use mermaid or dot") {
		t.Fatalf("got %v, want an error naming the formats", err)
	}
}

// TestLifecycleDocShowsTheTable keeps docs/lifecycle.md in step with the
// code: its mermaid block must be exactly what `machinist fsm` prints, and
// every state and event must be explained.
func TestLifecycleDocShowsTheTable(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "lifecycle.md"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := lifecycle.Diagram("mermaid")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```mermaid\n"+want+"```") {
		t.Errorf("docs/lifecycle.md's diagram differs from the code; replace it with the output of `go run ./cmd/machinist fsm`:\n%s", want)
	}
	for _, s := range lifecycle.States() {
		if !strings.Contains(string(doc), "| "+string(s)+" |") {
			t.Errorf("docs/lifecycle.md does not explain state %s in its states table", s)
		}
	}
	for _, e := range lifecycle.Events() {
		if !strings.Contains(string(doc), "| `"+string(e)+"` |") {
			t.Errorf("docs/lifecycle.md does not explain event %s in its events table", e)
		}
	}
}
