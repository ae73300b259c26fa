#!/usr/bin/env bash
# Runs every coverage-guided fuzz target (fuzz/fuzz_targets) for SECONDS
# each (default 60) with cargo-fuzz and libFuzzer (coverage-guided; no
# sanitizer, so the stable toolchain builds it: the fuzzed crates forbid
# unsafe code, which is what a sanitizer would watch), starting from the seed corpus in fuzz/corpus/TARGET (never modified: what
# a run finds goes to target/fuzz-corpus/TARGET). Prints the executions per
# target; exits 1 if any target found a crash (its input is kept in
# fuzz/artifacts/TARGET), 2 if the targets did not build. cargo-fuzz is installed into target/tools on
# first use.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
fuzz_version=0.13.1
tools=target/tools
if ! "$tools/bin/cargo-fuzz" --version 2>/dev/null | grep -q "$fuzz_version"; then
  echo "installing cargo-fuzz $fuzz_version into $tools (first use, about 2 minutes) ..."
  cargo install --quiet --locked --root "$tools" --version "$fuzz_version" cargo-fuzz
fi
# cargo asks rustc about the target with its source on stdin, from
# /dev/null: when that is a regular file with text in it (a program
# renamed and replaced it: the gateway's audit rotation once did, run with
# `--audit /dev/null`), every build fails on that text as Rust source.
if [ ! -c /dev/null ]; then
  echo "fuzz: /dev/null is not the null device but $(stat -c %F /dev/null) (owner $(stat -c %U /dev/null)): builds read it as source and fail." >&2
  echo "fuzz: restore it as root: rm /dev/null && mknod -m 666 /dev/null c 1 3" >&2
  exit 2
fi
targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^aip-fuzz$')
# Build every target once, apart from running them: a build that fails is
# reported as such (with its first errors, which name the crate), never as
# a crash found.
echo "building the fuzz targets (release, first run about 3 minutes) ..."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
build() {
  PATH="$tools/bin:$PATH" cargo fuzz build --sanitizer none --fuzz-dir fuzz </dev/null >"$log" 2>&1
}
failed_build() {
  echo "the fuzz targets did not build; the first errors:" >&2
  grep -n -m 1 -A 60 -E '^(error|warning: build failed|--- stderr)' "$log" >&2 || true
  echo "... the last lines:" >&2
  tail -n 20 "$log" >&2
  df -h . "${TMPDIR:-/tmp}" >&2
}
if ! build; then
  # Once more from a clean build directory: a build the machine broke
  # (its disk, the registry) is told apart from one the code breaks,
  # which fails the same way twice.
  failed_build
  echo "building the fuzz targets again from a clean fuzz/target ..." >&2
  rm -rf fuzz/target
  if ! build; then
    failed_build
    exit 2
  fi
  echo "WARNING: the fuzz targets built only at the second attempt (the first attempt's errors are above)" >&2
fi
status=0
summary=()
for target in $targets; do
  work=target/fuzz-corpus/$target
  mkdir -p "$work"
  echo "fuzzing $target for ${seconds}s ..."
  if PATH="$tools/bin:$PATH" cargo fuzz run --sanitizer none --fuzz-dir fuzz "$target" "$work" "fuzz/corpus/$target" \
      -- -max_total_time="$seconds" -print_final_stats=1 </dev/null >"$log" 2>&1; then
    outcome=ok
  else
    outcome="FOUND A CRASH (see fuzz/artifacts/$target)"
    status=1
    tail -n 40 "$log"
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  summary+=("$target: ${runs:-?} executions in ${seconds}s, $outcome")
done
printf '%s\n' "${summary[@]}"
exit "$status"
