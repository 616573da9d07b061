package guest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestTheKubeletsClientCAOutlivesAnEmptiedKubeconfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kubeconfig := func(ca string) string {
		return "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: " + ca + "\n"
	}
	// base64 of "join CA" and "own CA".
	join := write("join", kubeconfig("am9pbiBDQQ=="))
	own := write("own", kubeconfig("b3duIENB"))
	emptied := write("emptied", "")
	missing := filepath.Join(dir, "missing")

	for _, c := range []struct {
		name, kubeconfig, want string
		said                   bool
	}{
		{"joined", own, "own CA", false},
		{"not joined yet", missing, "join CA", false},
		{"emptied by a power cut", emptied, "join CA", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			ca, err := clientCA(&out, c.kubeconfig, join)
			if err != nil {
				t.Fatal(err)
			}
			if string(ca) != c.want {
				t.Errorf("CA %q, want %q", ca, c.want)
			}
			if said := out.Len() > 0; said != c.said {
				t.Errorf("said %q", out.String())
			}
		})
	}
	if _, err := clientCA(&bytes.Buffer{}, emptied, emptied); err == nil {
		t.Error("no CA anywhere gave no error")
	}
}
