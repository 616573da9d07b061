package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/machinist-dev/machinist/internal/orphans"
	"github.com/machinist-dev/machinist/providers"
	"github.com/machinist-dev/machinist/providers/inmemory"
	"github.com/machinist-dev/machinist/providers/plugin"
)

// The machinist binary tests run as processes: built once while any Env
// lives, and removed with the last one (it weighs 150 MB).
var (
	binMu    sync.Mutex
	binPath  string
	liveEnvs int
)

// Machinist builds cmd/machinist into a temporary directory, once while
// any Env is running, and returns its path; the last Env to stop removes
// it.
func Machinist() (string, error) {
	binMu.Lock()
	defer binMu.Unlock()
	if binPath != "" {
		return binPath, nil
	}
	dir, err := os.MkdirTemp("", "machinist-bin-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "machinist")
	if err := Build("./cmd/machinist", path); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	binPath = path
	return binPath, nil
}

// envStarted and envStopped count the Envs alive, so that the binary goes
// with the last.
func envStarted() {
	binMu.Lock()
	defer binMu.Unlock()
	liveEnvs++
}

func envStopped() {
	binMu.Lock()
	defer binMu.Unlock()
	if liveEnvs--; liveEnvs == 0 && binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
		binPath = ""
	}
}

// ServedProvider is a built-in provider served over the provider protocol
// by `machinist provider serve`, a process of its own.
type ServedProvider struct {
	// Name is the provider's name.
	Name string
	// Endpoint is where it listens (unix:///…).
	Endpoint string
	// Cmd is the running process.
	Cmd *exec.Cmd

	out  *LockedBuffer
	done chan error
}

// ServeProvider starts `machinist provider serve --provider name` on a
// Unix socket in the Env's directory, with extra flags appended, and
// waits until it answers.
func (e *Env) ServeProvider(name string, extra ...string) (*ServedProvider, error) {
	bin, err := Machinist()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(e.dir, "provider-")
	if err != nil {
		return nil, err
	}
	endpoint := "unix://" + filepath.Join(dir, name+".sock")
	args := append([]string{"provider", "serve", "--provider", name, "--endpoint", endpoint, "--log-level", "info"}, extra...)
	cmd := exec.Command(bin, args...)
	out := &LockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := orphans.Guard(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		return nil, err
	}
	p := &ServedProvider{Name: name, Endpoint: endpoint, Cmd: cmd, out: out, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	if err := p.waitReady(30 * time.Second); err != nil {
		_ = p.Kill()
		return nil, err
	}
	return p, nil
}

// Dial returns a client for the served provider.
func (p *ServedProvider) Dial(opts plugin.DialOptions) (*plugin.Client, error) {
	return plugin.Dial(p.Name, p.Endpoint, opts)
}

func (p *ServedProvider) waitReady(timeout time.Duration) error {
	c, err := p.Dial(plugin.DialOptions{Timeout: time.Second})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	deadline := time.Now().Add(timeout)
	// Probed before its socket exists, gRPC would log every refused dial.
	socket := strings.TrimPrefix(p.Endpoint, "unix://")
	for _, err := os.Stat(socket); err != nil && time.Now().Before(deadline); _, err = os.Stat(socket) {
		time.Sleep(20 * time.Millisecond)
	}
	for {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("machinist provider serve exited: %v\n%s", err, p.Output())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := c.Probe(ctx)
		cancel()
		if err == nil && resp.GetReady() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("provider %s not ready after %s: %v\n%s", p.Name, timeout, err, p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Output is what the process printed so far.
func (p *ServedProvider) Output() string { return p.out.String() }

// Stop sends SIGTERM and waits for a clean exit.
func (p *ServedProvider) Stop() error {
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			return fmt.Errorf("machinist provider serve: %w\n%s", err, p.Output())
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = p.Cmd.Process.Kill()
		return errors.New("machinist provider serve still running 30s after SIGTERM")
	}
}

// Kill sends SIGKILL, as a crash would, and waits for the process to go.
func (p *ServedProvider) Kill() error {
	_ = p.Cmd.Process.Kill()
	err := <-p.done
	p.done <- err
	return nil
}

// Restart starts the same command again after Stop or Kill.
func (p *ServedProvider) Restart() error {
	cmd := exec.Command(p.Cmd.Path, p.Cmd.Args[1:]...)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := orphans.Guard(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	p.Cmd, p.done = cmd, make(chan error, 1)
	go func() { p.done <- cmd.Wait() }()
	return p.waitReady(30 * time.Second)
}

// LockedBuffer is a buffer a process's stdout and stderr may both write
// at once, and a test read meanwhile.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is what was written so far.
func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Provider is the inmemory provider as tests reach it, in this process
// (*inmemory.Provider) or served by a process of its own (ServedInmemory):
// its faults and its books.
type Provider interface {
	providers.Actuator
	SetFaults(inmemory.ProviderSpec)
	FailNext(n int)
	LoseNextReplies(n int)
	Crash(providerID string) error
	Break(providerID string) error
	Restarts(providerID string) (int, error)
	NodeName(providerID string) (string, error)
	MakeUnowned(namespace, name string) (string, error)
}

var _ Provider = (*inmemory.Provider)(nil)

// ServedInmemory is the inmemory provider served out of process with its
// control socket: the Provider the controllers reach over the protocol,
// and the faults and books tests reach over HTTP. The setters panic when
// the provider cannot be reached, which fails the test that called them.
type ServedInmemory struct {
	*ServedProvider
	*plugin.Client
	http *http.Client
}

var _ Provider = (*ServedInmemory)(nil)

// ServeInmemory serves the inmemory provider in its own process with the
// Lease settings given and its control socket on.
func (e *Env) ServeInmemory(leases Leases) (*ServedInmemory, error) {
	dir, err := os.MkdirTemp(e.dir, "control-")
	if err != nil {
		return nil, err
	}
	control := filepath.Join(dir, "control.sock")
	args := []string{"--inmemory-control", "unix://" + control}
	if leases.DurationSeconds > 0 {
		args = append(args, "--lease-duration-seconds", strconv.Itoa(int(leases.DurationSeconds)))
	}
	if leases.RenewInterval > 0 {
		args = append(args, "--renew-interval", leases.RenewInterval.String())
	}
	served, err := e.ServeProvider(inmemory.Name, args...)
	if err != nil {
		return nil, err
	}
	c, err := served.Dial(plugin.DialOptions{})
	if err != nil {
		return nil, errors.Join(err, served.Kill())
	}
	return &ServedInmemory{ServedProvider: served, Client: c, http: &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", control)
		}},
	}}, nil
}

// Stop stops the process and closes the client.
func (s *ServedInmemory) Stop() error {
	return errors.Join(s.Client.Close(), s.ServedProvider.Stop())
}

// do sends a control request; out, when not nil, receives the answer.
func (s *ServedInmemory) do(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, "http://inmemory"+path, body)
	if err != nil {
		return err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("inmemory control %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(raw))
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

func (s *ServedInmemory) must(err error) {
	if err != nil {
		panic(err)
	}
}

// SetFaults sets the provider's faults.
func (s *ServedInmemory) SetFaults(f inmemory.ProviderSpec) { s.must(s.do("PUT", "/faults", f, nil)) }

// FailNext fails the provider's next n calls.
func (s *ServedInmemory) FailNext(n int) {
	s.must(s.do("PUT", "/fail-next", map[string]int{"n": n}, nil))
}

// LoseNextReplies loses the replies of the provider's next n operations.
func (s *ServedInmemory) LoseNextReplies(n int) {
	s.must(s.do("PUT", "/lose-next-replies", map[string]int{"n": n}, nil))
}

// Crash powers the instance off as a hardware failure would.
func (s *ServedInmemory) Crash(providerID string) error {
	return s.do("POST", "/crash?id="+url.QueryEscape(providerID), nil, nil)
}

// Break fails the instance's hardware for good.
func (s *ServedInmemory) Break(providerID string) error {
	return s.do("POST", "/break?id="+url.QueryEscape(providerID), nil, nil)
}

// MakeUnowned makes an instance that belongs to no Machine, as one made
// outside Machinist, and returns its providerID.
func (s *ServedInmemory) MakeUnowned(namespace, name string) (string, error) {
	var out inmemory.Unowned
	err := s.do("POST", "/unowned", inmemory.Unowned{Namespace: namespace, Name: name}, &out)
	return out.ProviderID, err
}

func (s *ServedInmemory) books(providerID string) (inmemory.Books, error) {
	var b inmemory.Books
	err := s.do("GET", "/instance?id="+url.QueryEscape(providerID), nil, &b)
	return b, err
}

// Restarts counts the instance's reboots, repairs and updates.
func (s *ServedInmemory) Restarts(providerID string) (int, error) {
	b, err := s.books(providerID)
	return b.Restarts, err
}

// NodeName is the instance's Node name.
func (s *ServedInmemory) NodeName(providerID string) (string, error) {
	b, err := s.books(providerID)
	return b.NodeName, err
}
