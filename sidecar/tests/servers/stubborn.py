"""A stdio MCP server that ignores the end of its input (it keeps running
after its stdin closes) but exits on SIGTERM, writing "TERM" to the file
named by its first argument. For the gateway's stop-sequence test."""
import json
import signal
import sys
import time

MARKER = sys.argv[1]


def terminate(*_):
    with open(MARKER, "w") as f:
        f.write("TERM")
    sys.exit(0)


signal.signal(signal.SIGTERM, terminate)
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method = message.get("method")
    if method == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "stubborn", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
while True:
    time.sleep(1)
