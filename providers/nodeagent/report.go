package nodeagent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/machinist-dev/machinist/providers"
)

// A machine that is not the manager's own process (an agent process, a
// VM) tells its provider how its join goes in lines of its output, which
// the provider keeps in a log it can read: the last such line is the
// join's state.
const (
	// JoinFailedLine starts the line of a failing join: the reason, a
	// space, and the message.
	JoinFailedLine = "machinist: join-failed "
	// JoinedLine is the line of a join that succeeded, or of a machine
	// that needed none.
	JoinedLine = "machinist: joined"
)

// ReportJoin is a Progress that writes each report as a JoinFailedLine to
// w, once per change: a machine that fails the same way for an hour
// writes one line.
func ReportJoin(w io.Writer) Progress {
	var last string
	return func(e *JoinError) {
		line := JoinFailedLine + e.Reason + " " + oneLine(e.Message)
		if line == last {
			return
		}
		last = line
		fmt.Fprintln(w, line)
	}
}

// ReportJoined writes JoinedLine to w.
func ReportJoined(w io.Writer) { fmt.Fprintln(w, JoinedLine) }

// LastJoinFailure reads the join's state from a machine's output: the
// failure its last join line reports, or nil when that line says it
// joined or there is none. The output is the machine's, so it is held to
// what providers.ReportedJoinFailure lets a Machine show.
func LastJoinFailure(output []byte) *providers.JoinFailure {
	failed := bytes.LastIndex(output, []byte(JoinFailedLine))
	joined := bytes.LastIndex(output, []byte(JoinedLine))
	if failed < 0 || joined > failed {
		return nil
	}
	line, _, complete := strings.Cut(string(output[failed+len(JoinFailedLine):]), "\n")
	if !complete {
		return nil
	}
	reason, message, _ := strings.Cut(line, " ")
	return providers.ReportedJoinFailure(reason, message)
}

// joinTail is how much of a machine's output ReadJoinFailure reads: the
// join's lines are its last.
const joinTail = 64 << 10

// ReadJoinFailure is LastJoinFailure of the end of the file at path; a
// file that is not there holds none.
func ReadJoinFailure(path string) (*providers.JoinFailure, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(info.Size()-joinTail, 0)
	buf := make([]byte, info.Size()-off)
	n, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return LastJoinFailure(buf[:n]), nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
