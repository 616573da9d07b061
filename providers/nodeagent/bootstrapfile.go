package nodeagent

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/machinist-dev/machinist/internal/bootstrap"
)

// BootstrapKubeconfig is j as the kubeconfig a kubelet's
// --bootstrap-kubeconfig names: the cluster, and the bootstrap token as
// the user's token. It holds a credential: keep it readable by the
// machine alone.
func BootstrapKubeconfig(j bootstrap.Join) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = &clientcmdapi.Cluster{Server: j.Server, CertificateAuthorityData: j.CAData, TLSServerName: j.TLSServerName}
	cfg.AuthInfos["bootstrap"] = &clientcmdapi.AuthInfo{Token: j.Token}
	cfg.Contexts["bootstrap"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "bootstrap"}
	cfg.CurrentContext = "bootstrap"
	return clientcmd.Write(*cfg)
}

// JoinFromBootstrapKubeconfig reads what BootstrapKubeconfig wrote, or a
// kubelet's bootstrap kubeconfig.
func JoinFromBootstrapKubeconfig(data []byte) (bootstrap.Join, error) {
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return bootstrap.Join{}, err
	}
	kctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return bootstrap.Join{}, fmt.Errorf("bootstrap kubeconfig has no current context %q", cfg.CurrentContext)
	}
	cluster, auth := cfg.Clusters[kctx.Cluster], cfg.AuthInfos[kctx.AuthInfo]
	if cluster == nil || auth == nil || cluster.Server == "" || auth.Token == "" {
		return bootstrap.Join{}, errors.New("bootstrap kubeconfig holds no server and token")
	}
	return bootstrap.Join{Server: cluster.Server, CAData: cluster.CertificateAuthorityData, TLSServerName: cluster.TLSServerName, Token: auth.Token}, nil
}

// Bootstrap is a kubelet's start with --bootstrap-kubeconfig and
// --kubeconfig: the credentials kept in kubeconfigPath by an earlier boot
// when they are for nodeName and still valid, else new ones got with the
// join data in bootstrapPath (Join, retried until ctx ends) and kept in
// kubeconfigPath, readable by the machine alone, for the boots to come.
// Why a join fails is told to progress (when not nil) at each failure
// after JoinGrace.
//
// A machine that kept no credentials at all is new, or re-imaged: before
// keeping its new ones it forgets its previous life (Forget, with
// providerID), so that its Node registers afresh. One whose kept
// credentials expired or are another node's joins again but keeps its
// Node, as a kubelet whose certificate lapsed does: its disk, and so its
// life, is the same.
func Bootstrap(ctx context.Context, bootstrapPath, kubeconfigPath, nodeName, providerID string, progress Progress) (Credentials, error) {
	kept, err := os.ReadFile(kubeconfigPath)
	afresh := errors.Is(err, fs.ErrNotExist)
	switch {
	case err == nil:
		creds, err := CredentialsFromKubeconfig(kept)
		if err == nil {
			err = creds.validFor(nodeName, time.Now())
		}
		if err == nil {
			return creds, nil
		}
		ctrllog.FromContext(ctx).Info("Joining again: the kept credentials will not do", "kubeconfig", kubeconfigPath, "reason", err.Error())
	case !errors.Is(err, fs.ErrNotExist):
		return Credentials{}, err
	}
	data, err := os.ReadFile(bootstrapPath)
	if err != nil {
		return Credentials{}, fmt.Errorf("no credentials and no join data: %w", err)
	}
	join, err := JoinFromBootstrapKubeconfig(data)
	if err != nil {
		return Credentials{}, fmt.Errorf("%s: %w", bootstrapPath, err)
	}
	delay := 100 * time.Millisecond
	progress = progress.Patient()
	for {
		creds, err := Join(ctx, join, nodeName, progress)
		if err == nil {
			if afresh {
				if err := Forget(ctx, creds.Config(), nodeName, providerID); err != nil {
					return Credentials{}, err
				}
			}
			out, err := creds.Kubeconfig()
			if err != nil {
				return Credentials{}, err
			}
			if err := writePrivate(kubeconfigPath, out); err != nil {
				return Credentials{}, fmt.Errorf("keeping the credentials: %w", err)
			}
			return creds, nil
		}
		if ctx.Err() != nil {
			return Credentials{}, ctx.Err()
		}
		ctrllog.FromContext(ctx).Error(err, "Joining the cluster failed; retrying", "after", delay)
		if progress != nil {
			progress(ExplainJoin(err))
		}
		if !sleep(ctx, delay) {
			return Credentials{}, ctx.Err()
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// validFor says why c will not do for nodeName at now: a certificate of
// another node, or one that has expired or will within a minute.
func (c Credentials) validFor(nodeName string, now time.Time) error {
	block, _ := pem.Decode(c.CertPEM)
	if block == nil {
		return errors.New("the client certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err
	}
	if want := "system:node:" + nodeName; cert.Subject.CommonName != want {
		return fmt.Errorf("the certificate is for %s, not %s", cert.Subject.CommonName, want)
	}
	if now.Add(time.Minute).After(cert.NotAfter) {
		return fmt.Errorf("the certificate expires at %s", cert.NotAfter.Format(time.RFC3339))
	}
	return nil
}

// writePrivate replaces path with data, readable by its owner alone, by
// renaming, so that a reader never sees half a file.
func writePrivate(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600 already; said again so that no
	// change there widens it.
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	// On the disk before it counts: a machine that loses power right
	// after joining (a VM's QEMU killed) must not come back with half a
	// file, or none, in its place.
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// WriteBootstrapKubeconfig writes j to path as BootstrapKubeconfig does,
// readable by its owner alone, replacing it by renaming.
func WriteBootstrapKubeconfig(path string, j bootstrap.Join) error {
	data, err := BootstrapKubeconfig(j)
	if err != nil {
		return err
	}
	return writePrivate(path, data)
}
