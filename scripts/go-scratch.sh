# Sourced by the scripts that build Go programs (ensure-controlplane.sh,
# ensure-go-peers.sh, ensure-crane.sh, ensure-bench-peers.sh). Their
# results are cached in target/ by the hash of go.sum, so Go's own module
# and build caches are of no use once a build is done, and Kubernetes'
# alone come to several GB: a test run on a machine with a small disk
# ran out of it. So each build gets empty caches of its own in
# target/go-scratch/NAME, removed when the script ends (and at the start
# of the next one, after an interrupted run). AIP_GO_CACHE=keep builds
# with Go's usual caches instead (GOCACHE, GOMODCACHE), for whoever
# rebuilds often and has the disk for them.
go_scratch() {
  [ "${AIP_GO_CACHE:-}" = keep ] && return 0
  go_scratch_dir="$PWD/target/go-scratch/$1"
  go_scratch_clean
  mkdir -p "$go_scratch_dir"
  export GOCACHE="$go_scratch_dir/cache" GOMODCACHE="$go_scratch_dir/mod"
  # The module cache is written read-only unless asked; rm needs it writable.
  export GOFLAGS="${GOFLAGS:+$GOFLAGS }-modcacherw"
  trap go_scratch_clean EXIT
}
go_scratch_clean() {
  if [ -d "$go_scratch_dir" ]; then
    chmod -R u+w "$go_scratch_dir" 2>/dev/null || true
    rm -rf "$go_scratch_dir"
  fi
}
