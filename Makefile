# Machinist. `make test` is the one test command; `make help` lists targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

CONTROLLER_GEN := go tool controller-gen
OPENAPI_GEN := go tool openapi-gen
CONVERSION_GEN := go tool conversion-gen
# buf and its protoc plugins are pinned in a module of their own, so that
# their dependencies stay out of Machinist's.
BUF := go tool -modfile=hack/tools/go.mod buf
# Everything is built without cgo, static. kubectl's drain library links
# Go's plugin package (through kustomize), and with cgo that makes a
# dynamically linked binary exporting every symbol, whose symbol tables
# alone are 20 MB that the loader reads at each start; static, the
# manager's resident set is tens of MiB smaller (docs/benchmarks.md). The
# tests are built the same way, so that the binaries they build
# (testenv, also without cgo) come from the same build cache.
export CGO_ENABLED := 0
# Without symbol tables (-s -w): a panic's trace still names functions,
# and the binary is a third smaller, which a qemu provider's VM holds in
# its initramfs, in memory.
GO_LDFLAGS := -s -w
# How long one package's tests may run before go test stops them with a
# stack dump: a guard against a hang, not a budget. test/chaos takes about
# 17 minutes on two cores beside another package, too close to 20.
TEST_TIMEOUT ?= 30m

.PHONY: help
help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: build
build: ## Compile every package.
	go build ./...

.PHONY: generate
generate: ## Generate deepcopy code and v1alpha1's conversions for the API types, OpenAPI definitions for the verbs server, and the provider protocol's Go code.
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONVERSION_GEN) --output-file zz_generated.conversion.go --go-header-file /dev/null github.com/machinist-dev/machinist/api/v1alpha1
	$(BUF) generate
	$(OPENAPI_GEN) --output-dir apiserver/openapi --output-pkg github.com/machinist-dev/machinist/apiserver/openapi \
		--output-file zz_generated.openapi.go --go-header-file /dev/null --report-filename apiserver/openapi/violations.report \
		k8s.io/apimachinery/pkg/apis/meta/v1 k8s.io/apimachinery/pkg/runtime k8s.io/apimachinery/pkg/version \
		github.com/machinist-dev/machinist/api/subresources/v1alpha1

.PHONY: manifests
manifests: ## Generate the CRDs (config/crd/bases) and the ClusterRoles (config/rbac): manager, verbs server, machine operator, viewer, editor, metrics reader.
	$(CONTROLLER_GEN) crd paths="./api/v1alpha1/...;./api/v1beta1/..." output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=machinist-manager paths=./internal/rbac output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=machinist-machine-operator,fileName=operator.yaml paths=./internal/rbac/operator output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=machinist-viewer,fileName=viewer.yaml paths=./internal/rbac/viewer output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=machinist-editor,fileName=editor.yaml paths=./internal/rbac/editor output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=machinist-verbs,fileName=verbs.yaml paths=./internal/rbac/verbs output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=machinist-metrics-reader,fileName=metrics_reader.yaml paths=./internal/rbac/metrics output:rbac:artifacts:config=config/rbac

.PHONY: binaries
binaries: ## Build bin/machinist, bin/machinist-manager (the manager alone) and bin/kubectl-machine (the kubectl plugin).
	go build -ldflags='$(GO_LDFLAGS)' -o bin/machinist ./cmd/machinist
	go build -ldflags='$(GO_LDFLAGS)' -o bin/machinist-manager ./cmd/machinist-manager
	go build -ldflags='$(GO_LDFLAGS)' -o bin/kubectl-machine ./cmd/kubectl-machine

# The image make image builds and make bundle deploys: a name and a tag.
IMAGE ?= machinist:dev

.PHONY: image
image: ## Build the container image without Docker: bin/image/machinist.tar (docker load, podman load) and bin/image/oci (an OCI layout), tagged $(IMAGE); reproducible.
	go run ./hack/image --out bin/image --tag '$(IMAGE)'

.PHONY: bundle
bundle: controlplane ## Render config/default with its image set to $(IMAGE) into bin/machinist.yaml, for kubectl apply --server-side -f.
	@mkdir -p bin/bundle
	@ref='$(IMAGE)'; name="$${ref%:*}"; tag="$${ref##*:}"; \
	case "$$tag" in */*) name="$$ref"; tag=latest;; esac; \
	printf '%s\n' 'apiVersion: kustomize.config.k8s.io/v1beta1' 'kind: Kustomization' 'resources:' '- ../../config/default' \
	  'images:' '- name: machinist' "  newName: $$name" "  newTag: \"$$tag\"" > bin/bundle/kustomization.yaml
	bin/kubectl kustomize bin/bundle > bin/machinist.yaml
	@echo "bin/machinist.yaml: config/default with image $(IMAGE)"

.PHONY: run
run: controlplane qemu node binaries ## Run everything on this host, ready for kubectl (state in .machinist/; Ctrl-C stops it).
	bin/machinist run --state-dir .machinist --bin-dir bin

.PHONY: controlplane
controlplane: ## Build the pinned etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl into bin/ (skipped when already built).
	bash hack/controlplane/build.sh

.PHONY: node
node: controlplane ## Build what a real node's VM holds into bin/node/: the pinned kubelet (and the minor before it, in kubelets/), containerd, runc, the CNI plugins and the images it imports (skipped when already built).
	bash hack/node/build.sh

.PHONY: qemu
qemu: ## Install QEMU, a packaged kernel and e2fsprogs for the qemu provider's VMs, when missing (Debian packages).
	bash hack/qemu.sh

.PHONY: lint
lint: ## Check formatting (gofmt), run go vet, and lint the provider protocol (buf lint).
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go vet ./...
	$(BUF) lint

.PHONY: test
test: controlplane qemu node lint ## Run every test against a real etcd and kube-apiserver.
	go test -count=1 -timeout $(TEST_TIMEOUT) ./...

# make chaos: CHAOS_RUNS seeds per scenario of each chaos test, from
# CHAOS_SEED (the clock unless set); CHAOS_TESTS is a go test -run pattern
# choosing the tests, CHAOS_SCENARIO a part of the names of the scenarios
# to run (all when empty).
CHAOS_RUNS ?= 50
CHAOS_SEED ?= $(shell date +%s)
CHAOS_TESTS ?= .
CHAOS_SCENARIO ?=

.PHONY: chaos
chaos: controlplane ## Kill, fail over, starve and fault the manager over many seeds (CHAOS_RUNS, CHAOS_SEED, CHAOS_TESTS, CHAOS_SCENARIO); see docs/reliability.md.
	CHAOS_RUNS=$(CHAOS_RUNS) CHAOS_SEED=$(CHAOS_SEED) CHAOS_SCENARIO='$(CHAOS_SCENARIO)' go test -count=1 -timeout 0 -v -run '$(CHAOS_TESTS)' ./test/chaos/ | tee chaos.out

# make outage: the workload-cluster outage test with its cluster down for
# OUTAGE (ten minutes) instead of one; see docs/reliability.md.
OUTAGE ?= 10m

.PHONY: outage
outage: controlplane ## Keep a workload cluster down for OUTAGE (10m) under TestAClusterDown; see docs/reliability.md.
	CLUSTERS_OUTAGE=$(OUTAGE) go test -count=1 -timeout 0 -v -run '^TestAClusterDown$$' ./test/clusters/ | tee outage.out

.PHONY: bench
bench: controlplane ## Run the benchmarks against the real control plane (not part of make test).
	go test -run '^$$' -bench . -benchtime 1x -timeout 180m ./test/bench/ | tee bench.out

# make fuzz: each fuzz target of the module (a func FuzzXxx in a _test.go
# file, found anew at each run) for FUZZTIME, one after the other, so
# that each has the host's cores. go test already runs their seed corpora
# (testdata/fuzz/FuzzXxx) as tests; this looks for new inputs, and writes
# one that fails into the target's testdata/fuzz, where it stays a seed.
# No test runs beside (-run '^$$'), so no control plane is started.
FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Run every fuzz target (each func FuzzXxx in the module) for FUZZTIME (30s), one at a time; see docs/development.md.
	@targets=$$(git ls-files -co --exclude-standard '*_test.go' | { xargs grep -Ho '^func Fuzz[A-Za-z0-9_]*(' /dev/null || true; } | \
		sed -E 's#^(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\($$#\1 \2#; s#^[^/ ]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\($$#. \1#' | sort -u); \
	if [ -z "$$targets" ]; then echo "no fuzz targets"; exit 1; fi; \
	echo "$$targets" | while read -r dir name; do \
		echo "== $$name in ./$$dir for $(FUZZTIME)"; \
		go test -run '^$$' -fuzz "^$$name\$$" -fuzztime '$(FUZZTIME)' -timeout 0 "./$$dir" || exit 1; \
	done
