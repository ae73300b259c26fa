#!/usr/bin/env bash
# `make dist`: release archives of the two commands people install on their
# own machines — kubectl-aip (the kubectl plugin approvers use) and aip (the
# policy tool) — for linux amd64, in target/dist/:
#
#   NAME-VERSION-linux-amd64.tar.gz   NAME-VERSION-linux-amd64/{NAME,LICENSE}
#   SHA256SUMS                        `sha256sum -c SHA256SUMS` checks them
#
# The binaries are the release builds, linked against glibc: the newest
# glibc symbol version they need is printed (docs/install.md says which
# distributions that covers). Archives are reproducible: sorted, owned by
# 0:0, dated by the last commit (or SOURCE_DATE_EPOCH), gzip without a name
# or time stamp.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || {
  echo "dist: builds linux amd64 archives on a linux amd64 host, not $(uname -s)-$(uname -m)" >&2
  exit 1
}
cargo build --release --locked -p kubectl-aip -p aip-cli
out=target/dist
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
rm -rf "$out"
mkdir -p "$out"
archives=()
for name in kubectl-aip aip; do
  version=$("target/release/$name" --version | awk '{print $NF}') # "kubectl aip 0.1.0"
  base=$name-$version-linux-amd64
  stage=$out/.stage/$base
  install -d -m 0755 "$stage"
  install -m 0755 "target/release/$name" "$stage/$name"
  install -m 0644 LICENSE "$stage/LICENSE"
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$out/.stage" -cf - "$base" | gzip -9 -n > "$out/$base.tar.gz"
  glibc="glibc (objdump, from binutils, names the version)"
  if command -v objdump >/dev/null; then
    glibc=$(objdump -T "target/release/$name" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)
  fi
  archives+=("$base.tar.gz")
  printf '%-40s %6s  needs %s\n' "$out/$base.tar.gz" "$(du -h "$out/$base.tar.gz" | cut -f1)" "$glibc"
done
rm -rf "$out/.stage"
(cd "$out" && sha256sum "${archives[@]}" > SHA256SUMS)
cat "$out/SHA256SUMS"
