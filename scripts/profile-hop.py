#!/usr/bin/env python3
"""Where an HTTP call through the sidecar spends its instructions and
system calls, against the floor (a pass-through hyper proxy).

Runs the gateway benchmark's `--profile N` mode twice (N = SMALL and LARGE
sequential calls, through the floor and then through the sidecar), each
process under callgrind and then under strace -c, and reports the
difference divided by LARGE - SMALL: what one call costs, with start-up and
warm-up cancelled out. Callgrind's counts are repeatable from run to run
(unlike timings on a shared machine); they cover user space only, which is
why the system calls are counted beside them.

usage: scripts/profile-hop.py [BENCH_EXECUTABLE [OUT_DIR]]
(without an executable, cargo builds the gateway benchmark and it is used;
needs valgrind and strace)
"""

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict

SMALL, LARGE = 500, 1500
TOP = 25

LINE = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*?)(?: \[[^\]]*\])?$")


def run(bench, out, wrap_for):
    for n in (SMALL, LARGE):
        env = dict(os.environ, AIP_BENCH_WRAP=wrap_for(n))
        print(f"profile-hop: {n} calls under {env['AIP_BENCH_WRAP'].split()[0]}", file=sys.stderr)
        subprocess.run([bench, "--profile", str(n)], env=env, check=True,
                       stdout=subprocess.DEVNULL, timeout=900)


def functions(path, inclusive):
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", f"--inclusive={'yes' if inclusive else 'no'}", path],
        check=True, capture_output=True, text=True).stdout
    costs, total = {}, 0
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        ir, name = int(m.group(1).replace(",", "")), m.group(2)
        if name == "PROGRAM TOTALS":
            total = ir
            continue
        name = name.split(":", 1)[1] if ":" in name.split("<")[0] else name
        costs[name] = costs.get(name, 0) + ir
    return total, costs


def family(name):
    """What a function belongs to: its crate, or the C library it is in."""
    if name.startswith("_rjem_") or name.startswith("tcache_") or "je_" in name[:4]:
        return "jemalloc"
    if name.startswith("__mem") or name.startswith("__str"):
        return "libc string ops"
    m = re.search(r"([A-Za-z_][A-Za-z0-9_]*)::", name)
    return m.group(1) if m else "other (libc, runtime)"


def per_call(role, out):
    small_total, small = functions(f"{out}/{role}-{SMALL}.out", inclusive=False)
    large_total, large = functions(f"{out}/{role}-{LARGE}.out", inclusive=False)
    calls = LARGE - SMALL
    diff = {k: (large.get(k, 0) - small.get(k, 0)) / calls for k in set(large) | set(small)}
    return (large_total - small_total) / calls, diff


def syscalls(path):
    counts = {}
    for line in open(path):
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            calls = int(parts[3])
            counts[parts[-1]] = calls
    return counts


def bench_executable():
    """Builds the gateway benchmark (as make bench does) and names it."""
    built = subprocess.run(
        ["cargo", "bench", "--locked", "-p", "aip-sidecar", "--bench", "gateway", "--no-run",
         "--message-format=json-render-diagnostics"],
        check=True, stdout=subprocess.PIPE, text=True).stdout
    for line in built.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message["target"]["name"] == "gateway" \
                and message.get("executable"):
            return message["executable"]
    sys.exit("profile-hop: cargo built no gateway benchmark")


def main():
    for tool in ("valgrind", "callgrind_annotate", "strace"):
        if not shutil.which(tool):
            sys.exit(f"profile-hop: {tool} is not on PATH (Debian: apt-get install valgrind strace)")
    bench = sys.argv[1] if len(sys.argv) > 1 else bench_executable()
    out = sys.argv[2] if len(sys.argv) > 2 else "target/profile"
    os.makedirs(out, exist_ok=True)
    out = os.path.abspath(out)
    run(bench, out, lambda n: f"valgrind -q --tool=callgrind --callgrind-out-file={out}/{{role}}-{n}.out")
    run(bench, out, lambda n: f"strace -f -c -o {out}/{{role}}-{n}.strace")
    calls = LARGE - SMALL

    print(f"## Instructions per call (callgrind, user space; {LARGE} - {SMALL} calls)\n")
    totals = {}
    for role in ("floor", "sidecar"):
        totals[role] = per_call(role, out)
    floor, sidecar = totals["floor"][0], totals["sidecar"][0]
    print(f"| | instructions per call |\n|---|---|")
    print(f"| floor | {floor/1000:.1f}k |\n| sidecar | {sidecar/1000:.1f}k ({sidecar/floor:.2f}x the floor) |\n")

    print("### The sidecar's per call, by crate (self cost)\n")
    print("| crate | sidecar | floor |\n|---|---|---|")
    fam = {r: defaultdict(float) for r in totals}
    for role, (_, diff) in totals.items():
        for name, ir in diff.items():
            fam[role][family(name)] += ir
    for name, ir in sorted(fam["sidecar"].items(), key=lambda x: -x[1])[:TOP]:
        if ir < 200:
            break
        print(f"| {name} | {ir/1000:.1f}k | {fam['floor'].get(name, 0)/1000:.1f}k |")

    print(f"\n### The sidecar's top {TOP} functions per call (self cost)\n")
    print("| function | instructions |\n|---|---|")
    for name, ir in sorted(totals["sidecar"][1].items(), key=lambda x: -x[1])[:TOP]:
        short = name if len(name) <= 110 else name[:107] + "..."
        print(f"| `{short}` | {ir/1000:.1f}k |")

    print(f"\n## System calls per call (strace -f -c; {LARGE} - {SMALL} calls)\n")
    print("| call | floor | sidecar |\n|---|---|---|")
    sc = {}
    for role in ("floor", "sidecar"):
        small = syscalls(f"{out}/{role}-{SMALL}.strace")
        large = syscalls(f"{out}/{role}-{LARGE}.strace")
        sc[role] = {k: (large.get(k, 0) - small.get(k, 0)) / calls for k in set(large) | set(small)}
    names = sorted(set(sc["floor"]) | set(sc["sidecar"]), key=lambda k: -sc["sidecar"].get(k, 0))
    for name in names:
        f, s = max(sc["floor"].get(name, 0), 0), max(sc["sidecar"].get(name, 0), 0)
        if max(f, s) >= 0.05:
            print(f"| {name} | {f:.2f} | {s:.2f} |")
    print(f"| **all** | {sum(sc['floor'].values()):.2f} | {sum(sc['sidecar'].values()):.2f} |")


if __name__ == "__main__":
    main()
