"""The example agent: what a tool-using program does, through the gateway.

It lists the tools it may see, reads a file (allowed), changes a file's
mode (blocked: the policy does not allow fs_chmod), and deletes a file
(held until a person approves the ApprovalRequest it makes). Each step
prints one line: the call, and what the gateway or the server said.
"""
import asyncio
import os

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

# The approval timeout of the policy is 120 s; wait a little longer.
HELD_CALL_TIMEOUT_S = 150
# How long to wait for the first tools.
TOOLS_PATIENCE_S = 300


async def call(session, tool, arguments, timeout=30):
    try:
        result = await session.call_tool(tool, arguments, read_timeout_seconds=timeout)
    except Exception as error:  # a JSON-RPC error, e.g. the policy's refusal
        print(f"{tool}: refused: {error}", flush=True)
        return
    text = " ".join(c.text for c in result.content if getattr(c, "text", None))
    outcome = "error" if result.is_error else "ok"
    print(f"{tool}: {outcome}: {text}", flush=True)


async def tools_once_granted(session):
    """The tools the agent may see, once there are any: until the operator
    may read the connection's Secret (`kubectl aip grant`), there are none."""
    for _ in range(TOOLS_PATIENCE_S // 2):
        names = [t.name for t in (await session.list_tools()).tools]
        if names:
            return names
        await asyncio.sleep(2)
    raise SystemExit(f"no tools after {TOOLS_PATIENCE_S} s: is the connection granted? (kubectl get aip -n agents)")


async def main():
    url = os.environ["AIP_MCP_URL"]
    async with streamable_http_client(url) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            names = await tools_once_granted(session)
            print("tools:", ", ".join(names), flush=True)
            await call(session, "fs_read_file", {"path": "/reports/q3.txt"})
            await call(session, "fs_chmod", {"path": "/reports/q3.txt"})
            print("fs_delete_file: waiting for a person (kubectl aip approvals -n agents)", flush=True)
            await call(session, "fs_delete_file", {"path": "/reports/old.txt"}, HELD_CALL_TIMEOUT_S)


asyncio.run(main())
