package testenv

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
