#!/usr/bin/env bash
# `make images`: OCI images of aip-operator, aip-sidecar, aip-cni and aip-fault-server
# as image archives in target/images/NAME.tar, without a container engine.
#
# Each image is one layer built from scratch: the release binary as
# /usr/local/bin/NAME (the entrypoint), the glibc shared libraries it links
# (ldd) copied from this Debian host with their copyright files and dpkg
# records (as distroless/cc carries them, so scanners see glibc's version),
# /etc/passwd and /etc/group naming user 65532 (nonroot), and
# /etc/nsswitch.conf (hosts: files dns). Nothing else: no shell, no package
# manager, no writable path. The process runs as 65532:65532 with a
# read-only root filesystem; /etc/hosts and /etc/resolv.conf come from the
# container runtime.
#
# Why the shared libraries rather than a static binary: this machine has no
# musl target, and a glibc binary linked statically still loads NSS modules
# at run time for getaddrinfo, from the exact glibc it was linked against.
# Shipping the very libc the binaries were linked with keeps name resolution
# (files, then DNS, as Kubernetes expects) glibc's own.
#
# crane (go-containerregistry, scripts/ensure-crane.sh) writes the image
# format: `crane append` turns the layer into an image with OCI media types
# and pushes it to a throwaway registry that crane itself serves on
# loopback, and `crane mutate` sets the config (entrypoint, user, labels,
# platform) and saves the archive in `docker save`'s tarball format, which
# `docker load`, `kind load image-archive` and `ctr images import` all read.
#
# Environment: IMAGE_REPOSITORY (default ghcr.io/aip-k8s) and IMAGE_TAG
# (default: the binaries' version, which is the chart's appVersion).
# Layer contents are dated by the last commit (or SOURCE_DATE_EPOCH), so the
# same binaries give the same image digest.
set -euo pipefail
cd "$(dirname "$0")/.."

images=(aip-operator aip-sidecar aip-cni aip-fault-server aip-example-agent aip-probe pause)
declare -A manifest=(
  [aip-operator]=operator/Cargo.toml
  [aip-sidecar]=sidecar/Cargo.toml
  [aip-cni]=cni/Cargo.toml
  [aip-fault-server]=e2e/fault-server/Cargo.toml
)
# Three images of Go programs, static (no libraries): the agent of
# examples/cluster, on the official MCP Go SDK's client; and two of the test
# node (aip-node), which imports every archive here: its sandbox (pause)
# image and its network prober (aip-probe, an agent that ignores its
# gateway). All are built from e2e/peers by scripts/ensure-go-peers.sh.
declare -A binary=(
  [aip-operator]=target/release/aip-operator
  [aip-sidecar]=target/release/aip-sidecar
  [aip-cni]=target/release/aip-cni
  [aip-fault-server]=target/release/aip-fault-server
  [aip-example-agent]=target/peers/aip-example-agent
  [aip-probe]=target/peers/aip-probe
  [pause]=target/peers/pause
)
declare -A static_description=(
  [aip-example-agent]="The agent of examples/cluster: the official MCP Go SDK's client making an allowed, a blocked and a held call through the injected gateway."
  [aip-probe]="The test node's network prober: what an agent that ignores its gateway would try (TCP, UDP, DNS, MCP), and a TCP and UDP server to try it on."
  [pause]="The pod sandbox of the project's test node: holds a pod's namespaces, exits on SIGTERM."
)
# The Go programs link the Go standard library (BSD-3-Clause); the agent
# also the MCP Go SDK and its dependencies (MIT, Apache-2.0, BSD-3-Clause).
declare -A static_licences=(
  [aip-example-agent]="Apache-2.0 AND BSD-3-Clause AND MIT"
  [aip-probe]="Apache-2.0 AND BSD-3-Clause AND MIT"
  [pause]="Apache-2.0 AND BSD-3-Clause"
)
# The sandbox image's name: what the node's containerd is configured with
# (e2e/kube-test/src/node/mod.rs, PAUSE_IMAGE); never pushed anywhere.
pause_reference=localhost/aip-node/pause:1.0
# The prober, like the sandbox, is the test node's alone.
probe_reference=localhost/aip-node/aip-probe:1.0
repository=${IMAGE_REPOSITORY:-ghcr.io/aip-k8s}
out=target/images
work=$out/.build
crane=target/tools/crane
# The licences of what each image holds: ours, glibc's and libgcc's. A
# library from another package stops the build until it is added here.
declare -A package_licence=(
  [libc6]="LGPL-2.1-or-later"
  [libgcc-s1]="GPL-3.0-or-later WITH GCC-exception-3.1"
)

for tool in ldd dpkg-query tar; do
  command -v "$tool" >/dev/null || {
    echo "images: $tool is not on PATH (the images take their libraries from a Debian or Ubuntu host)" >&2
    exit 1
  }
done
cargo build --release --locked -p aip-operator -p aip-sidecar -p aip-cni -p aip-fault-server
scripts/ensure-go-peers.sh
scripts/ensure-crane.sh

source_url=$(awk -F'"' '/^repository *=/ {print $2; exit}' Cargo.toml)
revision=$(git describe --always --dirty --abbrev=40 2>/dev/null || echo unknown)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

# libraries BINARY: the absolute paths of the shared objects it loads.
libraries() {
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $3; next} $1 ~ /^\// {print $1}'
}

# rootfs NAME DIR: the image's file tree; DIR.packages lists the Debian
# packages its libraries come from.
rootfs() {
  local name=$1 root=$2 lib pkg
  rm -rf "$root"
  mkdir -p "$(dirname "$root")"
  : > "$root.packages"
  install -d -m 0755 "$root"/{etc,usr/local/bin,usr/share/doc/aip,var/lib/dpkg/status.d}
  install -m 0755 "${binary[$name]}" "$root/usr/local/bin/$name"
  install -m 0644 LICENSE "$root/usr/share/doc/aip/copyright"
  for lib in $( [ -n "${static_description[$name]:-}" ] || libraries "${binary[$name]}"); do
    install -d -m 0755 "$root$(dirname "$lib")"
    install -m 0755 "$(readlink -f "$lib")" "$root$lib"
    pkg=$(dpkg-query -S "$lib" 2>/dev/null | head -n1 | cut -d: -f1) \
      || pkg=$(dpkg-query -S "$(readlink -f "$lib")" | head -n1 | cut -d: -f1)
    [ -n "${package_licence[$pkg]:-}" ] || {
      echo "images: $name links $lib from package $pkg, whose licence scripts/images.sh does not list" >&2
      exit 1
    }
    if [ ! -e "$root/var/lib/dpkg/status.d/$pkg" ]; then
      install -d -m 0755 "$root/usr/share/doc/$pkg"
      install -m 0644 "/usr/share/doc/$pkg/copyright" "$root/usr/share/doc/$pkg/copyright"
      dpkg-query -s "$pkg" > "$root/var/lib/dpkg/status.d/$pkg"
      chmod 0644 "$root/var/lib/dpkg/status.d/$pkg"
      echo "$pkg" >> "$root.packages"
    fi
  done
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    > "$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$root/etc/nsswitch.conf"
  [ -f /etc/os-release ] && install -m 0644 /etc/os-release "$root/etc/os-release"
  chmod 0644 "$root"/etc/{passwd,group,nsswitch.conf}
}

# layer DIR TAR: DIR as a reproducible tar (sorted, owned by 0:0, dated
# $epoch).
layer() {
  local entries
  entries=$(cd "$1" && ls -A | LC_ALL=C sort)
  # shellcheck disable=SC2086 # entries are top-level names without spaces
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
    --format=gnu -C "$1" -cf "$2" $entries
}

# registry: crane's registry on a loopback port, started on first use.
port=
registry() {
  [ -z "$port" ] || return 0
  local log=$work/registry.log
  "$crane" registry serve --address 127.0.0.1:0 > "$log" 2>&1 &
  registry_pid=$!
  trap 'kill "$registry_pid" 2>/dev/null || true' EXIT
  for _ in $(seq 100); do
    port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$log")
    [ -n "$port" ] && return 0
    kill -0 "$registry_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "images: crane's registry did not start:" >&2
  cat "$log" >&2
  exit 1
}

mkdir -p "$work"
workspace_version=$(awk -F'"' '/^version *=/ {print $2; exit}' Cargo.toml)
for name in "${images[@]}"; do
  if [ -n "${static_description[$name]:-}" ]; then
    version=$workspace_version
    description=${static_description[$name]}
  else
    version=$("${binary[$name]}" --version | awk '{print $2}')
    description=$(sed -n 's/^description = "\(.*\)"$/\1/p' "${manifest[$name]}" | head -n1)
  fi
  tag=${IMAGE_TAG:-$version}
  reference=$repository/$name:$tag
  [ "$name" != pause ] || reference=$pause_reference
  [ "$name" != aip-probe ] || reference=$probe_reference
  rootfs "$name" "$work/$name/rootfs"
  licences=${static_licences[$name]:-Apache-2.0}
  for pkg in $(LC_ALL=C sort "$work/$name/rootfs.packages"); do
    licences="$licences AND ${package_licence[$pkg]}"
  done
  layer "$work/$name/rootfs" "$work/$name/layer.tar"
  labels=(
    "org.opencontainers.image.title=$name"
    "org.opencontainers.image.description=$description"
    "org.opencontainers.image.version=$version"
    "org.opencontainers.image.source=$source_url"
    "org.opencontainers.image.revision=$revision"
    "org.opencontainers.image.licenses=$licences"
  )
  # The archive is current when its layer, labels, name and tools are.
  key=$( (sha256sum < "$work/$name/layer.tar"; printf '%s\n' "$reference" "${labels[@]}";
          cat "$crane.key" "$0") | sha256sum | cut -c1-16)
  if [ -f "$out/$name.tar" ] && [ "$(cat "$out/$name.key" 2>/dev/null)" = "$key" ]; then
    printf '%-35s %-46s %s (unchanged)\n' "$out/$name.tar" "$reference" "$(du -h "$out/$name.tar" | cut -f1)"
    continue
  fi
  registry
  scratch=127.0.0.1:$port/$name:$tag
  "$crane" append --insecure --oci-empty-base -f "$work/$name/layer.tar" -t "$scratch" \
    >/dev/null 2>"$work/$name/crane.log" || { cat "$work/$name/crane.log" >&2; exit 1; }
  rm -f "$out/$name.tar" "$out/$name.key"
  label_args=()
  for label in "${labels[@]}"; do label_args+=(--label "$label"); done
  "$crane" mutate --insecure "$scratch" \
    --set-platform linux/amd64 \
    --entrypoint "/usr/local/bin/$name" \
    --user 65532:65532 \
    --workdir / \
    "${label_args[@]}" \
    -t "$reference" -o "$out/$name.tar" 2>"$work/$name/crane.log" \
    || { cat "$work/$name/crane.log" >&2; exit 1; }
  echo "$key" > "$out/$name.key"
  printf '%-35s %-46s %s\n' "$out/$name.tar" "$reference" "$(du -h "$out/$name.tar" | cut -f1)"
done
