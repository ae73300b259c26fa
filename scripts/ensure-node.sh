#!/usr/bin/env bash
# What the test node (aip-node, e2e/kube-test/src/node/) needs beyond the
# Kubernetes binaries of scripts/ensure-controlplane.sh: containerd, runc,
# the CNI plugins and iptables, from Debian's packages (containerd 1.6.20,
# runc 1.1.5, CNI plugins 1.1.1, iptables 1.8.9 on bookworm). Installed
# when missing; the node runs as root, so this does too.
set -euo pipefail
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/portmap ] \
  || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v nsenter >/dev/null && command -v unshare >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "ensure-node: the test node needs ${need[*]} (Debian packages) and runs as root; run as root" >&2
  exit 1
fi
command -v apt-get >/dev/null || {
  echo "ensure-node: no apt-get: install ${need[*]} with this system's package manager" >&2
  exit 1
}
echo "installing ${need[*]} (Debian packages, for the test node) ..."
# An old package list may name versions the mirror no longer has.
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "installed: $(dpkg-query -W -f='${Package} ${Version}  ' "${need[@]}")"
