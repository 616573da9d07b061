package disruption

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func win(schedule string, d time.Duration, tz string) machinistv1.DisruptionWindow {
	return machinistv1.DisruptionWindow{Schedule: schedule, Duration: metav1.Duration{Duration: d}, TimeZone: tz}
}

func TestWindows(t *testing.T) {
	nightly := win("0 2 * * *", 4*time.Hour, "")
	cases := []struct {
		name          string
		windows       []machinistv1.DisruptionWindow
		now           string
		open          bool
		next, changes string // RFC 3339; empty: zero
	}{
		{name: "no windows: always open", now: "2026-12-01T12:00:00Z", open: true},
		{name: "inside a nightly window", windows: []machinistv1.DisruptionWindow{nightly}, now: "2026-12-01T03:00:00Z",
			open: true, changes: "2026-12-01T06:00:00Z"},
		{name: "at the very opening", windows: []machinistv1.DisruptionWindow{nightly}, now: "2026-12-01T02:00:00Z",
			open: true, changes: "2026-12-01T06:00:00Z"},
		{name: "at the very closing: closed", windows: []machinistv1.DisruptionWindow{nightly}, now: "2026-12-01T06:00:00Z",
			next: "2026-12-02T02:00:00Z", changes: "2026-12-02T02:00:00Z"},
		{name: "after it: the next night", windows: []machinistv1.DisruptionWindow{nightly}, now: "2026-12-01T12:00:00Z",
			next: "2026-12-02T02:00:00Z", changes: "2026-12-02T02:00:00Z"},
		{name: "in a time zone: 02:00 in Berlin is 01:00 UTC in winter",
			windows: []machinistv1.DisruptionWindow{win("0 2 * * *", time.Hour, "Europe/Berlin")}, now: "2026-12-01T01:30:00Z",
			open: true, changes: "2026-12-01T02:00:00Z"},
		{name: "weekdays only: Saturday waits for Monday",
			windows: []machinistv1.DisruptionWindow{win("0 9 * * 1-5", 8*time.Hour, "")}, now: "2026-12-05T10:00:00Z",
			next: "2026-12-07T09:00:00Z", changes: "2026-12-07T09:00:00Z"},
		{name: "a descriptor", windows: []machinistv1.DisruptionWindow{win("@daily", time.Hour, "")}, now: "2026-12-01T00:30:00Z",
			open: true, changes: "2026-12-01T01:00:00Z"},
		{name: "two windows: the open one counts, the other's opening is a change",
			windows: []machinistv1.DisruptionWindow{nightly, win("0 12 * * *", time.Hour, "")}, now: "2026-12-01T12:30:00Z",
			open: true, changes: "2026-12-01T13:00:00Z"},
		{name: "two windows closed: the sooner opening is next",
			windows: []machinistv1.DisruptionWindow{nightly, win("0 12 * * *", time.Hour, "")}, now: "2026-12-01T07:00:00Z",
			next: "2026-12-01T12:00:00Z", changes: "2026-12-01T12:00:00Z"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			open, next, changes, err := Windows(tc.windows, at(tc.now))
			if err != nil {
				t.Fatal(err)
			}
			if open != tc.open {
				t.Errorf("open = %v, want %v", open, tc.open)
			}
			check := func(what string, got time.Time, want string) {
				if want == "" {
					if !got.IsZero() {
						t.Errorf("%s = %s, want none", what, got)
					}
					return
				}
				if !got.Equal(at(want)) {
					t.Errorf("%s = %s, want %s", what, got.UTC().Format(time.RFC3339), want)
				}
			}
			check("next", next, tc.next)
			check("changes", changes, tc.changes)
		})
	}
}

func TestWindowsThatCannotBeReadAreErrors(t *testing.T) {
	for name, w := range map[string]machinistv1.DisruptionWindow{
		"unknown time zone": win("0 2 * * *", time.Hour, "Mars/Olympus"),
		"bad schedule":      win("0 25 * * *", time.Hour, ""),
		"no duration":       win("0 2 * * *", 0, ""),
	} {
		if _, _, _, err := Windows([]machinistv1.DisruptionWindow{w}, at("2026-12-01T00:00:00Z")); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
