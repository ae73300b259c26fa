"""Calls mocked (and real) executables through PATH with `subprocess`, the
way a Python agent's tool wrapper would: it never knows which are mocked.

Usage: cli_subprocess.py COUNT NAME [ARG...] [-- NAME [ARG...]]

Runs the first command COUNT times, then the one after `--` (if any) once.
Prints one JSON document: every call's argv, return code, stdout, stderr.
"""
import json
import subprocess
import sys


def call(argv):
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return {
        "argv": argv,
        "returncode": done.returncode,
        "stdout": done.stdout,
        "stderr": done.stderr,
    }


def main():
    count = int(sys.argv[1])
    rest = sys.argv[2:]
    first, after = (rest, [])
    if "--" in rest:
        split = rest.index("--")
        first, after = rest[:split], rest[split + 1:]
    calls = [call(first) for _ in range(count)]
    if after:
        calls.append(call(after))
    json.dump(calls, sys.stdout)


if __name__ == "__main__":
    main()
