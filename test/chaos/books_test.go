package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/providers/process"
)

// books is the provider's side of a run: instances by Machine UID, and the
// agent processes running, by providerID.
type books struct {
	dirs   map[types.UID]process.Instance
	agents map[string][]int
}

// books reads the provider's state directory and /proc. Only this run's
// namespace counts.
func (r *run) books() books {
	b := books{dirs: map[types.UID]process.Instance{}, agents: agents(r.ns)}
	instances, err := process.Instances(r.machines)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.t.Fatalf("reading the provider's state directory: %v", err)
	}
	for _, in := range instances {
		if in.Namespace == r.ns {
			b.dirs[in.UID] = in
		}
	}
	return b
}

// agents lists the running agent processes of namespace ns's Machines by
// providerID.
func agents(ns string) map[string][]int {
	all, err := process.Agents()
	if err != nil {
		panic(err) // /proc is always there on Linux
	}
	out := map[string][]int{}
	for id, pids := range all {
		if strings.HasPrefix(id, "process:///"+ns+"/") {
			out[id] = pids
		}
	}
	return out
}

// killAgents ends every agent of namespace ns: a failed run's machines must
// not outlive it.
func killAgents(ns string) {
	for _, pids := range agents(ns) {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// checkBooks compares the provider's instances and agents with the live
// Machines: each live Machine has exactly one instance and one agent, and
// the provider holds nothing else.
func (r *run) checkBooks() error {
	ctx := context.Background()
	ms := &machinistv1.MachineList{}
	if err := env.Client.List(ctx, ms, client.InNamespace(r.ns)); err != nil {
		return err
	}
	b := r.books()
	var problems []string
	live := map[string]bool{}
	for _, m := range ms.Items {
		in, ok := b.dirs[m.UID]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("Machine %s has no instance (missing)", m.Name))
			continue
		case m.Status.ProviderID != "" && m.Status.ProviderID != in.ProviderID:
			problems = append(problems, fmt.Sprintf("Machine %s has providerID %q, its instance %q", m.Name, m.Status.ProviderID, in.ProviderID))
		}
		live[in.ProviderID] = true
		if n := len(b.agents[in.ProviderID]); n != 1 {
			problems = append(problems, fmt.Sprintf("Machine %s has %d agents running, want 1: %v", m.Name, n, b.agents[in.ProviderID]))
		}
	}
	uids := map[types.UID]bool{}
	for _, m := range ms.Items {
		uids[m.UID] = true
	}
	for uid, in := range b.dirs {
		if !uids[uid] {
			problems = append(problems, fmt.Sprintf("instance %q (Machine UID %s) has no Machine (leaked)", in.ProviderID, uid))
		}
	}
	for id, pids := range b.agents {
		if !live[id] {
			problems = append(problems, fmt.Sprintf("agent %v runs for %q, which no live Machine has (leaked)", pids, id))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("books: %s", strings.Join(problems, "; "))
	}
	return nil
}
