# syntax=docker/dockerfile:1
#
# The aip images for a container engine, one target per image:
#
#   docker build --target aip-operator     -t ghcr.io/aip-k8s/aip-operator:0.1.0 .
#   docker build --target aip-sidecar      -t ghcr.io/aip-k8s/aip-sidecar:0.1.0 .
#   docker build --target aip-cni          -t ghcr.io/aip-k8s/aip-cni:0.1.0 .
#   docker build --target aip-fault-server -t ghcr.io/aip-k8s/aip-fault-server:0.1.0 .
#
# Without an engine, `make images` (scripts/images.sh) builds the same images
# as archives in target/images/: the release binary as the entrypoint on the
# glibc and libgcc of Debian 12, user 65532, nothing to write to. Here
# distroless/cc-debian12 supplies that base; there the libraries are copied
# from the build host. Pass --build-arg VERSION=... when the workspace
# version (Cargo.toml) changes; e2e/images checks that this default matches.

ARG RUST_VERSION=1.95
ARG VERSION=0.1.0
ARG SOURCE=https://github.com/aip-k8s/aip
ARG BASE=gcr.io/distroless/cc-debian12:nonroot

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p aip-operator -p aip-sidecar -p aip-cni -p aip-fault-server \
 && install -D -m 0755 -t /out \
      target/release/aip-operator target/release/aip-sidecar target/release/aip-cni target/release/aip-fault-server

FROM ${BASE} AS runtime
ARG VERSION
ARG SOURCE
LABEL org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.source=${SOURCE} \
      org.opencontainers.image.licenses="Apache-2.0 AND LGPL-2.1-or-later AND GPL-3.0-or-later WITH GCC-exception-3.1"
USER 65532:65532
WORKDIR /

FROM runtime AS aip-operator
LABEL org.opencontainers.image.title=aip-operator \
      org.opencontainers.image.description="The aip control plane: controllers, the per-pod config index, the gRPC policy stream and ToolConnection health."
COPY --from=build /out/aip-operator /usr/local/bin/aip-operator
ENTRYPOINT ["/usr/local/bin/aip-operator"]

# Run by the chart's DaemonSet (as root, with the node's CNI directories
# mounted): it installs itself as a chained CNI plugin on the node.
FROM runtime AS aip-cni
LABEL org.opencontainers.image.title=aip-cni \
      org.opencontainers.image.description="The egress lock: a chained CNI plugin that locks a governed pod's egress to its aip gateway, and the installer its DaemonSet runs on every node."
COPY --from=build /out/aip-cni /usr/local/bin/aip-cni
ENTRYPOINT ["/usr/local/bin/aip-cni"]

FROM runtime AS aip-fault-server
LABEL org.opencontainers.image.title=aip-fault-server \
      org.opencontainers.image.description="A deterministic fault-injection MCP server (stdio and Streamable HTTP) that plays authored, finite response scripts."
COPY --from=build /out/aip-fault-server /usr/local/bin/aip-fault-server
ENTRYPOINT ["/usr/local/bin/aip-fault-server"]

# Last, so that a plain `docker build .` gives the image every agent pod runs.
FROM runtime AS aip-sidecar
LABEL org.opencontainers.image.title=aip-sidecar \
      org.opencontainers.image.description="The per-pod MCP gateway: enforces AgentPolicy on every message between an agent and its MCP servers."
COPY --from=build /out/aip-sidecar /usr/local/bin/aip-sidecar
ENTRYPOINT ["/usr/local/bin/aip-sidecar"]
