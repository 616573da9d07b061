package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"

	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// machineResource is the resource of Machines, for errors about them.
var machineResource = machinistv1.GroupVersion.WithResource("machines").GroupResource()

// waitOperation follows Machine name until its operation id has Succeeded
// (nil) or Failed (exit code 2), printing a line whenever the phase or the
// operation's state or message changes. bootID is the Machine's boot ID
// before the request, or empty if unknown.
func waitOperation(ctx context.Context, c client.WithWatch, ns, name string, v verb, id, bootID string, out io.Writer) error {
	t := &tracker{name: name, verb: v, id: id, bootID: bootID}
	err := follow(ctx, c, machineResource, ns, name, &machinistv1.Machine{},
		func() client.ObjectList { return &machinistv1.MachineList{} },
		func(m *machinistv1.Machine) (bool, error) {
			line, done, err := t.observe(m)
			if line != "" {
				fmt.Fprintln(out, line)
			}
			return done, err
		})
	switch {
	case err == nil:
		fmt.Fprintf(out, "machine/%s %s%s\n", name, v.past, t.bootChange(true))
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return timedOut(fmt.Errorf("timed out waiting for the %s of machine %q (operation %s) to finish; last seen: %s", v.name, name, id, t.state()))
	case errors.Is(err, errDeleted):
		return fmt.Errorf("machine %q was deleted while waiting for its %s (operation %s)", name, v.name, id)
	}
	return err
}

// tracker turns successive states of a Machine into progress lines and the
// outcome of one operation.
type tracker struct {
	name string
	verb verb
	id   string
	// bootID is the boot ID before the operation.
	bootID string
	// last is the Machine as last seen; printed the last line printed.
	last    *machinistv1.Machine
	printed string
}

// observe takes the Machine's latest state. It returns the progress line
// to print (empty when nothing a person cares about changed) and whether
// the operation is over; a Failed operation is over with an error.
func (t *tracker) observe(m *machinistv1.Machine) (line string, done bool, err error) {
	t.last = m
	if t.bootID == "" {
		t.bootID = m.Status.BootID
	}
	if s := "machine/" + t.name + ": " + t.state(); s != t.printed {
		t.printed, line = s, s
	}
	op := m.Status.Operation
	switch {
	case op == nil:
		// Not after an accepted request, as the server records the
		// operation before answering; waiting, bounded by --timeout, is
		// safer than guessing.
		return line, false, nil
	case op.ID != t.id:
		// The server records the operation before it answers, so another
		// ID can only mean a later request replaced ours.
		return line, false, fmt.Errorf("the %s of machine %q (operation %s) was superseded by %s operation %s",
			t.verb.name, t.name, t.id, op.Type, op.ID)
	case op.State == machinistv1.OperationSucceeded:
		return line, true, nil
	case op.State == machinistv1.OperationFailed:
		msg := op.Message
		if msg == "" {
			msg = "the controller gave no reason"
		}
		return line, true, failed(fmt.Errorf("the %s of machine %q failed: %s", t.verb.name, t.name, msg))
	}
	return line, false, nil
}

// state is the Machine's phase and our operation's state, as last seen.
func (t *tracker) state() string {
	if t.last == nil {
		return "nothing yet"
	}
	phase := string(t.last.Status.Phase)
	if phase == "" {
		phase = "no phase yet"
	}
	s := phase + t.bootChange(false)
	if op := t.last.Status.Operation; op != nil && op.ID == t.id {
		s += ", " + t.verb.name + " " + string(op.State)
		if op.Message != "" {
			s += ": " + op.Message
		}
	}
	return s
}

// bootChange shows how the boot ID changed, if it did; always shows it
// even if it did not.
func (t *tracker) bootChange(always bool) string {
	now := ""
	if t.last != nil {
		now = t.last.Status.BootID
	}
	switch {
	case now == "":
		return ""
	case t.bootID != "" && t.bootID != now:
		return fmt.Sprintf(" (boot ID %s -> %s)", t.bootID, now)
	case always:
		return fmt.Sprintf(" (boot ID %s)", now)
	}
	return ""
}
