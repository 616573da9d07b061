package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// instance is what the process provider holds for one Machine: its
// directory and state file.
type instance struct {
	ProviderID string `json:"providerID"`
	Restarts   int    `json:"restarts"`
	uid        types.UID
}

// books is the provider's side of a run: instances by Machine UID, and the
// agent processes running, by providerID.
type books struct {
	dirs   map[types.UID]instance
	agents map[string][]int
}

// books reads the provider's state directory and /proc. Only this run's
// namespace counts.
func (r *run) books() books {
	b := books{dirs: map[types.UID]instance{}, agents: agents(r.ns)}
	entries, _ := os.ReadDir(r.machines)
	for _, e := range entries {
		parts := strings.Split(e.Name(), "_")
		if !e.IsDir() || len(parts) != 3 || parts[0] != r.ns {
			continue
		}
		in := instance{uid: types.UID(parts[2])}
		raw, err := os.ReadFile(filepath.Join(r.machines, e.Name(), "state.json"))
		if err == nil {
			_ = json.Unmarshal(raw, &in)
		}
		b.dirs[in.uid] = in
	}
	return b
}

// agents lists the running agent processes of namespace ns's Machines by
// providerID, from their command lines.
func agents(ns string) map[string][]int {
	out := map[string][]int{}
	prefix := "--provider-id=process:///" + ns + "/"
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, path := range dirs {
		raw, err := os.ReadFile(path)
		if err != nil || len(raw) == 0 {
			continue
		}
		args := bytes.Split(bytes.TrimRight(raw, "\x00"), []byte{0})
		if len(args) < 2 || string(args[1]) != "agent" {
			continue
		}
		for _, a := range args {
			if id, ok := strings.CutPrefix(string(a), "--provider-id="); ok && strings.HasPrefix(string(a), prefix) {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
				out[id] = append(out[id], pid)
			}
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
