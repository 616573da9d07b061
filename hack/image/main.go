// Command image builds Machinist's container image without a container
// engine: the static machinist binary on an otherwise empty filesystem,
// written as an OCI image layout and as a tarball that `docker load` and
// `podman load` accept.
//
// The image is reproducible: the binary is built with -trimpath and no
// build ID or VCS stamp, so it depends only on the source and the Go
// toolchain, and every timestamp in the image is the commit's time. The
// same commit gives the same digest, in any directory and on any day.
//
//	go run ./hack/image --out bin/image --tag machinist:dev
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Source is where the image's source lives, its OCI source label.
const Source = "https://github.com/machinist-dev/machinist"

// User is the image's user: not root, and the UID and GID the manifests
// in config/ run as (distroless' "nonroot").
const User = 65532

func main() {
	var o options
	flag.StringVar(&o.out, "out", "bin/image", "the directory to write the OCI layout (out/oci), the tarball (out/machinist.tar) and the digest (out/digest) to")
	flag.Var(&o.tags, "tag", "a name the image is tagged with in the tarball and the layout, such as machinist:dev or registry.example.com/machinist:v0.1.0 (repeatable; default machinist:dev)")
	flag.StringVar(&o.version, "version", "", "the version stamped on the binary and the image's labels (default: git describe)")
	flag.StringVar(&o.revision, "revision", "", "the commit the image is built from (default: git rev-parse HEAD)")
	flag.StringVar(&o.created, "created", "", "the image's time, as Unix seconds (default: the commit's time; SOURCE_DATE_EPOCH wins when set)")
	flag.StringVar(&o.binary, "binary", "", "put this machinist binary in the image instead of building one (for tests of the image's assembly)")
	flag.Parse()
	digest, err := build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s\n", digest, filepath.Join(o.out, "machinist.tar"))
}

type options struct {
	out, version, revision, created, binary string
	tags                                    tags
}

type tags []string

func (t *tags) String() string     { return strings.Join(*t, ",") }
func (t *tags) Set(v string) error { *t = append(*t, v); return nil }

func build(o options) (v1.Hash, error) {
	if len(o.tags) == 0 {
		o.tags = tags{"machinist:dev"}
	}
	var err error
	if o.revision == "" {
		if o.revision, err = git("rev-parse", "HEAD"); err != nil {
			return v1.Hash{}, err
		}
	}
	if o.version == "" {
		if o.version, err = git("describe", "--tags", "--always", "--dirty"); err != nil {
			return v1.Hash{}, err
		}
	}
	if e := os.Getenv("SOURCE_DATE_EPOCH"); e != "" {
		o.created = e
	}
	if o.created == "" {
		if o.created, err = git("log", "-1", "--format=%ct", o.revision); err != nil {
			return v1.Hash{}, err
		}
	}
	secs, err := strconv.ParseInt(o.created, 10, 64)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("--created %q: want Unix seconds", o.created)
	}
	created := time.Unix(secs, 0).UTC()
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return v1.Hash{}, err
	}
	binary := o.binary
	if binary == "" {
		binary = filepath.Join(o.out, "machinist")
		if err := compile(binary, o.version); err != nil {
			return v1.Hash{}, err
		}
	}
	img, err := Image(binary, Labels{Version: o.version, Revision: o.revision}, created)
	if err != nil {
		return v1.Hash{}, err
	}
	return write(img, o.out, o.tags)
}

// compile builds the static binary so that it depends on nothing but the
// source and the toolchain: no paths of this checkout (-trimpath), no
// build ID, no VCS stamp (whose "modified" flag an untracked file sets).
func compile(out, version string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w -buildid= -X main.release="+version, "-o", out, "./cmd/machinist")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build: %w", err)
	}
	return nil
}

// Labels are the image's OCI annotations of where it comes from.
type Labels struct {
	Version, Revision string
}

// Image assembles the image around the binary: one layer with /machinist,
// /etc/passwd and /etc/group naming the non-root user, its home, and
// /tmp; every file's time is created, so the layer's digest depends only
// on the binary's bytes.
func Image(binary string, l Labels, created time.Time) (v1.Image, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	fs, err := filesystem(data, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(fs)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "hack/image: machinist " + l.Version, Comment: "the static machinist binary"},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: created}
	cfg.Config = v1.Config{
		Entrypoint: []string{"/machinist"},
		User:       fmt.Sprintf("%d:%d", User, User),
		WorkingDir: "/",
		Env:        []string{"PATH=/", "HOME=/home/nonroot"},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "machinist",
			"org.opencontainers.image.description": "Declarative machine lifecycle for Kubernetes: the manager, the verbs server, the built-in providers and the agent",
			"org.opencontainers.image.source":      Source,
			"org.opencontainers.image.revision":    l.Revision,
			"org.opencontainers.image.version":     l.Version,
			"org.opencontainers.image.created":     created.Format(time.RFC3339),
		},
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, cfg.Config.Labels).(v1.Image), nil
}

// filesystem is the layer's tar stream.
func filesystem(binary []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entry := func(h *tar.Header, body []byte) error {
		h.ModTime, h.Format = mtime, tar.FormatPAX
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", User, User)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", User)
	err := errors.Join(
		entry(&tar.Header{Typeflag: tar.TypeDir, Name: "etc/", Mode: 0o755}, nil),
		entry(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/passwd", Mode: 0o644}, []byte(passwd)),
		entry(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/group", Mode: 0o644}, []byte(group)),
		entry(&tar.Header{Typeflag: tar.TypeDir, Name: "home/", Mode: 0o755}, nil),
		entry(&tar.Header{Typeflag: tar.TypeDir, Name: "home/nonroot/", Mode: 0o700, Uid: User, Gid: User}, nil),
		entry(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777}, nil),
		// The binary links controller-runtime's envtest (machinist run
		// starts a control plane with it), whose package initialisation
		// makes a cache directory under $HOME/.cache, else $TMPDIR, and
		// panics when it cannot: on a read-only root it would end every
		// command before it began. Both are here already, so it writes
		// nothing.
		entry(&tar.Header{Typeflag: tar.TypeDir, Name: "home/nonroot/.cache/", Mode: 0o700, Uid: User, Gid: User}, nil),
		entry(&tar.Header{Typeflag: tar.TypeDir, Name: "home/nonroot/.cache/kubebuilder-envtest/", Mode: 0o750, Uid: User, Gid: User}, nil),
		entry(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/kubebuilder-envtest/", Mode: 0o750, Uid: User, Gid: User}, nil),
		entry(&tar.Header{Typeflag: tar.TypeReg, Name: "machinist", Mode: 0o755}, binary),
		tw.Close(),
	)
	return buf.Bytes(), err
}

// write puts img in out/oci (an OCI image layout, each tag in its
// ref.name annotation) and out/machinist.tar (docker load's format), and
// its digest in out/digest.
func write(img v1.Image, out string, names []string) (v1.Hash, error) {
	refs := map[name.Reference]v1.Image{}
	for _, n := range names {
		ref, err := name.NewTag(n)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("--tag %q: %w", n, err)
		}
		refs[ref] = img
	}
	dir := filepath.Join(out, "oci")
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	for _, n := range names {
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": n})); err != nil {
			return v1.Hash{}, err
		}
	}
	if err := tarball.MultiRefWriteToFile(filepath.Join(out, "machinist.tar"), refs); err != nil {
		return v1.Hash{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	return digest, os.WriteFile(filepath.Join(out, "digest"), []byte(digest.String()+"\n"), 0o644)
}

func git(args ...string) (string, error) {
	out, err := exec.Command("git", args...).Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}
