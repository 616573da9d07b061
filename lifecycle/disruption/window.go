package disruption

import (
	"fmt"
	"time"

	"github.com/robfig/cron/v3"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Windows reports whether any of windows is open at now (always, without
// windows), when the next one opens while none is, and when that answer
// next changes by itself (a window opening or closing; zero: never).
func Windows(windows []machinistv1.DisruptionWindow, now time.Time) (open bool, next, changes time.Time, err error) {
	if len(windows) == 0 {
		return true, time.Time{}, time.Time{}, nil
	}
	for i, w := range windows {
		o, opens, closes, err := window(w, now)
		if err != nil {
			return false, time.Time{}, time.Time{}, fmt.Errorf("window %d: %w", i, err)
		}
		if o {
			open = true
			changes = earliest(changes, closes)
		} else {
			next = earliest(next, opens)
		}
		changes = earliest(changes, opens)
	}
	if open {
		next = time.Time{}
	}
	return open, next, changes, nil
}

// window reports whether w is open at now, when it next opens after now,
// and, when open, when the opening that covers now closes.
func window(w machinistv1.DisruptionWindow, now time.Time) (open bool, opens, closes time.Time, err error) {
	tz := w.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return false, time.Time{}, time.Time{}, fmt.Errorf("time zone %q: %w", tz, err)
	}
	sched, err := cron.ParseStandard(w.Schedule)
	if err != nil {
		return false, time.Time{}, time.Time{}, fmt.Errorf("schedule %q: %w", w.Schedule, err)
	}
	d := w.Duration.Duration
	if d <= 0 {
		return false, time.Time{}, time.Time{}, fmt.Errorf("duration %s is not positive", d)
	}
	local := now.In(loc)
	// The first opening after now-d is the only one that can cover now.
	if t := sched.Next(local.Add(-d)); !t.After(local) {
		open, closes = true, t.Add(d)
	}
	return open, sched.Next(local), closes, nil
}
