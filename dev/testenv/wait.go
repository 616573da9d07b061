package testenv

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PollInterval is how often Poll and WaitFor look again.
const PollInterval = 100 * time.Millisecond

// Condition is what Poll and WaitFor wait on: a func() bool holds once it
// returns true; a func() error holds once it returns nil, and until then
// its error says what is still missing, which a timeout reports.
type Condition interface {
	func() bool | func() error
}

// errNotYet stands for a func() bool that has not held: it has nothing
// more to say.
var errNotYet = errors.New("")

func asError[C Condition](cond C) func() error {
	switch c := any(cond).(type) {
	case func() bool:
		return func() error {
			if c() {
				return nil
			}
			return errNotYet
		}
	case func() error:
		return c
	}
	panic("unreachable: Condition has two types")
}

// Poll checks cond every PollInterval until it holds, and returns nil, or
// an error once timeout has passed: "not within <timeout>", followed by
// the condition's last error if it has one. It is for code that cannot
// fail a test itself, such as a TestMain; tests use WaitFor.
func Poll[C Condition](timeout time.Duration, cond C) error {
	check := asError(cond)
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			if errors.Is(err, errNotYet) {
				return fmt.Errorf("not within %s", timeout)
			}
			return fmt.Errorf("not within %s: %w", timeout, err)
		}
		time.Sleep(PollInterval)
	}
}

// WaitFor waits until cond holds, and returns how long that took. If
// timeout passes first it fails t with what it waited for and, for a
// func() error, the condition's last error. Ginkgo specs pass GinkgoTB().
func WaitFor[C Condition](t testing.TB, timeout time.Duration, what string, cond C) time.Duration {
	t.Helper()
	start := time.Now()
	if err := Poll(timeout, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return time.Since(start)
}

// WaitForObject reads the object of obj's namespace and name through c
// until check accepts it, and leaves that last read in obj. If timeout
// passes first it fails t with what it waited for and check's, or the
// read's, last error.
func WaitForObject[O client.Object](t testing.TB, c client.Reader, timeout time.Duration, what string, obj O, check func(O) error) {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	WaitFor(t, timeout, what, func() error {
		// A fresh object each time: decoding into the last one would keep
		// the fields the server has since dropped.
		got := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(O)
		if err := c.Get(context.Background(), key, got); err != nil {
			return err
		}
		reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(got).Elem())
		return check(obj)
	})
}

// WaitQuiet waits until the object of obj's namespace and name has gone
// unwritten for quiet (the same resourceVersion on every read, one each
// PollInterval), for tests whose next step must come after the writes
// that were still due, leaving the last read in obj. It fails t if no
// such spell came within timeout.
func WaitQuiet[O client.Object](t testing.TB, c client.Reader, timeout, quiet time.Duration, what string, obj O) {
	t.Helper()
	var since time.Time
	version := ""
	WaitForObject(t, c, timeout, what+" unwritten for "+quiet.String(), obj, func(o O) error {
		if o.GetResourceVersion() != version {
			version, since = o.GetResourceVersion(), time.Now()
		}
		if d := time.Since(since); d < quiet {
			return fmt.Errorf("unwritten for %s only", d.Round(time.Millisecond))
		}
		return nil
	})
}
