package guest

import "testing"

// A container's entrypoint is PID 1 as well: only the kernel's /init is a
// machine's init.
func TestIsInit(t *testing.T) {
	for _, tc := range []struct {
		pid   int
		argv0 string
		want  bool
	}{
		{1, InitPath, true},
		{1, "/machinist", false},
		{1, "machinist", false},
		{42, InitPath, false},
	} {
		if got := isInit(tc.pid, tc.argv0); got != tc.want {
			t.Errorf("isInit(%d, %q) = %v, want %v", tc.pid, tc.argv0, got, tc.want)
		}
	}
}
