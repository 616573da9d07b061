package nodeagent_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/providers/nodeagent"
)

func TestJoinLinesTellTheLastState(t *testing.T) {
	var out bytes.Buffer
	report := nodeagent.ReportJoin(&out)
	refused := &nodeagent.JoinError{Reason: machinistv1.ReasonBootstrapTokenRefused, Message: "refused (401):\nset the flag"}
	report(refused)
	report(refused)
	if n := strings.Count(out.String(), nodeagent.JoinFailedLine); n != 1 {
		t.Fatalf("the same failure twice wrote %d lines, want 1:\n%s", n, out.String())
	}
	got := nodeagent.LastJoinFailure(out.Bytes())
	if got == nil || got.Reason != machinistv1.ReasonBootstrapTokenRefused || got.Message != "refused (401): set the flag" {
		t.Fatalf("read back %+v", got)
	}
	out.WriteString("some log line\n")
	report(&nodeagent.JoinError{Reason: machinistv1.ReasonJoinCertificateNotApproved, Message: "not approved"})
	if got := nodeagent.LastJoinFailure(out.Bytes()); got == nil || got.Reason != machinistv1.ReasonJoinCertificateNotApproved {
		t.Fatalf("after a second failure, read %+v", got)
	}
	nodeagent.ReportJoined(&out)
	if got := nodeagent.LastJoinFailure(out.Bytes()); got != nil {
		t.Fatalf("after joining, read %+v, want none", got)
	}
}

func TestJoinLinesFromAMachineAreHeldToKnownReasons(t *testing.T) {
	for name, output := range map[string]string{
		"an unknown reason":   nodeagent.JoinFailedLine + "Anything you like\n",
		"no reason":           nodeagent.JoinFailedLine + "\n",
		"a line not finished": nodeagent.JoinFailedLine + machinistv1.ReasonJoinFailed + " half",
		"nothing":             "",
	} {
		if got := nodeagent.LastJoinFailure([]byte(output)); got != nil {
			t.Errorf("%s: read %+v, want none", name, got)
		}
	}
	// A VM's serial console ends its lines with CR LF.
	console := nodeagent.JoinFailedLine + machinistv1.ReasonJoinForbidden + " forbidden\r\n"
	if got := nodeagent.LastJoinFailure([]byte(console)); got == nil || got.Message != "forbidden" {
		t.Errorf("a console's line read as %+v", got)
	}
	if got := nodeagent.LastJoinFailure([]byte(console + nodeagent.JoinedLine + "\r\n")); got != nil {
		t.Errorf("a console's joined line was missed: %+v", got)
	}
	long := nodeagent.JoinFailedLine + machinistv1.ReasonJoinFailed + " \x1b[31m" + strings.Repeat("é", 2000) + "\n"
	got := nodeagent.LastJoinFailure([]byte(long))
	if got == nil || len(got.Message) > 520 || strings.ContainsRune(got.Message, '\x1b') || !strings.HasSuffix(got.Message, "…") {
		t.Fatalf("a long message with control characters came back as %q", got)
	}
}

func TestReadJoinFailureReadsTheEndOfALog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	if got, err := nodeagent.ReadJoinFailure(path); got != nil || err != nil {
		t.Fatalf("no log: %+v, %v", got, err)
	}
	var out bytes.Buffer
	nodeagent.ReportJoin(&out)(&nodeagent.JoinError{Reason: machinistv1.ReasonJoinForbidden, Message: "forbidden"})
	out.WriteString(strings.Repeat("noise\n", 100000))
	nodeagent.ReportJoin(&out)(&nodeagent.JoinError{Reason: machinistv1.ReasonJoinServerUnreachable, Message: "unreachable"})
	if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := nodeagent.ReadJoinFailure(path)
	if err != nil || got == nil || got.Reason != machinistv1.ReasonJoinServerUnreachable {
		t.Fatalf("read %+v, %v", got, err)
	}
}
