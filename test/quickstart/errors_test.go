package quickstart

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// The line a verbs server logged in a run beside other tests' control
// planes: a certificate from a CA the run does not have.
const refused = "2026-12-02T17:21:41Z\tERROR\tUnable to authenticate the request\t" +
	`{"error": "verifying certificate SN=1498286991705789235, SKID=, AKID=61:86:00:12:5E:91:9C:61:DD:88:F9:4C:E3:39:9E:1D:F0:1E:1E:B7 failed: x509: certificate signed by unknown authority (from 127.0.0.1:41234, client certificate \"CN=front-proxy-client\" issued by \"CN=front-proxy-ca\")"}`

func TestErrorLinesTellStrangersFromTheRun(t *testing.T) {
	g := NewWithT(t)
	reconcile := "2026-12-02T17:21:42Z\tERROR\tReconciler error\t{\"controller\": \"machine\"}"
	out := "2026-12-02T17:21:40Z\tINFO\tstarting\n" + refused + "\n" + reconcile + "\n"

	own, foreign := errorLines(out, map[string]bool{"0A:0B": true})
	g.Expect(own).To(Equal([]string{reconcile}))
	g.Expect(foreign).To(Equal([]string{refused}))

	// The same refusal of a certificate one of the run's CAs issued is
	// the run's own error.
	own, foreign = errorLines(out, map[string]bool{"61:86:00:12:5E:91:9C:61:DD:88:F9:4C:E3:39:9E:1D:F0:1E:1E:B7": true})
	g.Expect(own).To(Equal([]string{refused, reconcile}))
	g.Expect(foreign).To(BeEmpty())

	g.Expect(keyID([]byte{0x61, 0x86, 0x0a})).To(Equal("61:86:0A"))
}

func TestOutageLinesAreTheFrozenClustersAlone(t *testing.T) {
	g := NewWithT(t)
	from, to := time.Date(2026, 12, 3, 9, 26, 0, 0, time.UTC), time.Date(2026, 12, 3, 9, 28, 0, 0, time.UTC)
	watch := "2026-12-03T09:26:30Z\tERROR\tFailed to watch\t{\"error\": \"Get \\\"https://127.0.0.1:4443/api/v1/nodes\\\": dial tcp\"}"
	probe := "2026-12-03T09:27:00Z\tERROR\tUnexpected error when reading response body\t" +
		`{"controller": "workloadcluster", "name": "workload", "error": "context deadline exceeded"}`
	otherHost := "2026-12-03T09:26:40Z\tERROR\tFailed to watch\t{\"error\": \"Get \\\"https://127.0.0.1:5555/api/v1/nodes\\\"\"}"
	otherController := "2026-12-03T09:27:10Z\tERROR\tUnexpected error when reading response body\t" +
		`{"controller": "machine", "error": "context deadline exceeded"}`
	late := "2026-12-03T09:29:00Z\tERROR\tFailed to watch\t{\"error\": \"Get \\\"https://127.0.0.1:4443/api/v1/nodes\\\"\"}"
	out := strings.Join([]string{watch, probe, otherHost, otherController, late}, "\n")

	kept, outage := outageLines(out, "127.0.0.1:4443", from, to)
	g.Expect(outage).To(Equal([]string{watch, probe}))
	g.Expect(strings.Split(kept, "\n")).To(Equal([]string{otherHost, otherController, late}))
}
