// Command machinist-manager is `machinist manager` alone: the controllers,
// with the same flags, in a binary that links nothing else. A manager
// deployed to a cluster runs it. The all-in-one binary's other jobs (the
// verbs server, the providers and their machines, `machinist run`) bring
// packages whose initialisation alone keeps about 25 MiB more of the
// executable resident, a quarter of the manager's memory at 1,000 Machines
// (docs/architecture.md, "One binary, and the manager's own").
package main

import (
	"fmt"
	"io"
	"os"

	"google.golang.org/grpc/grpclog"

	"github.com/machinist-dev/machinist/cmd/internal/cli"
)

func main() {
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
	cmd := cli.ManagerCommand()
	cmd.Use = "machinist-manager"
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "machinist-manager:", err)
		os.Exit(1)
	}
}
