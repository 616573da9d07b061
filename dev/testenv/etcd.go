package testenv

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
)

// Stored reads what etcd holds under the key prefix, bypassing
// kube-apiserver: each key's value as stored, for tests of which version
// of an object is on disk (a custom resource is stored as JSON, in the
// storage version it was last written at). kube-apiserver's keys start
// with /registry/, as /registry/machinist.dev/machines/<namespace>/<name>.
func (e *Env) Stored(ctx context.Context, prefix string) (map[string][]byte, error) {
	// etcd's JSON gateway to its gRPC API, on the client port envtest
	// serves without TLS: no etcd client library needed.
	end := []byte(prefix)
	end[len(end)-1]++
	body, err := json.Marshal(map[string]string{
		"key":       base64.StdEncoding.EncodeToString([]byte(prefix)),
		"range_end": base64.StdEncoding.EncodeToString(end),
	})
	if err != nil {
		return nil, err
	}
	url := e.env.ControlPlane.Etcd.URL.String() + "/v3/kv/range"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading etcd under %s: %w", prefix, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading etcd under %s: %s: %s", prefix, resp.Status, raw)
	}
	var out struct {
		KVs []struct {
			Key   []byte `json:"key"`
			Value []byte `json:"value"`
		} `json:"kvs"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("reading etcd under %s: %w", prefix, err)
	}
	kvs := make(map[string][]byte, len(out.KVs))
	for _, kv := range out.KVs {
		kvs[string(kv.Key)] = kv.Value
	}
	return kvs, nil
}

// SnapshotEtcd saves a snapshot of the control plane's etcd to path with
// etcd's own client (etcdctl snapshot save), as an operator backs up a
// cluster.
func (e *Env) SnapshotEtcd(ctx context.Context, path string) error {
	out, err := exec.CommandContext(ctx, filepath.Join(BinDir(), "etcdctl"),
		"--endpoints", e.env.ControlPlane.Etcd.URL.String(), "snapshot", "save", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("etcdctl snapshot save: %w: %s", err, out)
	}
	return nil
}

// RestoreEtcd restores the snapshot at path as an operator restores a
// cluster: kube-apiserver and etcd are stopped (SIGKILL), the snapshot is
// restored with etcd's own tool (etcdutl snapshot restore) in place of
// etcd's data, with its revision bumped and marked compacted so that
// every watcher lists again rather than resume from a revision the
// snapshot never had, and etcd and kube-apiserver start again with the
// same flags and ports. Whatever was written after the snapshot is gone.
func (e *Env) RestoreEtcd(ctx context.Context, path string) error {
	if err := e.StopAPIServer(); err != nil {
		return err
	}
	args, err := e.stopEtcd()
	if err != nil {
		return err
	}
	dataDir := e.env.ControlPlane.Etcd.DataDir
	restored := dataDir + ".restored"
	_ = os.RemoveAll(restored)
	// The member's name and peer URL are etcd's defaults, as envtest
	// starts it with neither.
	out, err := exec.CommandContext(ctx, filepath.Join(BinDir(), "etcdutl"), "snapshot", "restore", path,
		"--data-dir", restored, "--bump-revision", "1000000", "--mark-compacted").CombinedOutput()
	if err != nil {
		return fmt.Errorf("etcdutl snapshot restore: %w: %s", err, out)
	}
	if err := os.RemoveAll(filepath.Join(dataDir, "member")); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(restored, "member"), filepath.Join(dataDir, "member")); err != nil {
		return err
	}
	_ = os.RemoveAll(restored)
	if err := e.startEtcd(ctx, args); err != nil {
		return err
	}
	return e.StartAPIServer(ctx)
}

// stopEtcd kills this control plane's etcd and returns its command line.
func (e *Env) stopEtcd() ([]string, error) {
	if e.etcd != nil {
		e.etcd.kill()
		args := e.etcd.cmd.Args
		e.etcd = nil
		return args, nil
	}
	return killOwn("etcd", "--data-dir="+e.env.ControlPlane.Etcd.DataDir)
}

// startEtcd starts etcd with args and waits until it is healthy.
func (e *Env) startEtcd(ctx context.Context, args []string) error {
	health := e.env.ControlPlane.Etcd.URL.String() + "/health"
	var err error
	e.etcd, err = e.startAgain(ctx, "etcd", args, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, health, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"health":"true"`)) {
			return fmt.Errorf("%s: %s", resp.Status, body)
		}
		return nil
	})
	return err
}
