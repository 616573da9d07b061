package quickstart

import (
	"testing"

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
