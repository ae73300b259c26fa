"""The agent of `make demo`: the unmodified Python MCP SDK talking to the
aip gateway, plus an approver that approves the ask through the admin port.

Usage: demo_agent.py GATEWAY_URL ADMIN_URL TOKEN_FILE
"""
import asyncio
import json
import sys
import urllib.request

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

GATEWAY, ADMIN, TOKEN_FILE = sys.argv[1:4]
BOLD, END = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")


def step(title):
    print(f"\n{BOLD}== {title}{END}")


def show(label, value):
    print(f"   {label}: {json.dumps(value, ensure_ascii=False)}")


async def call(session, name, arguments=None):
    try:
        result = await session.call_tool(name, arguments or {})
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)
    except Exception as exc:
        error = getattr(exc, "error", None)
        return {"error": error.model_dump(mode="json", exclude_none=True) if error else str(exc)}


def admin(path, body=None):
    token = open(TOKEN_FILE).read().strip()
    request = urllib.request.Request(
        ADMIN + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(request) as response:
        return json.load(response)


async def approve_when_asked():
    """A person at the admin port: waits for the ask, then approves it."""
    for _ in range(200):
        pending = await asyncio.to_thread(admin, "/approvals")
        if pending["pending"]:
            ask = pending["pending"][0]
            show("pending approval", {k: ask[k] for k in ("id", "tool", "arguments")})
            decided = await asyncio.to_thread(admin, f"/approvals/{ask['id']}", {"decision": "approve"})
            show("approver said", "approve" if decided["approved"] else "deny")
            return
        await asyncio.sleep(0.05)


async def main():
    async with streamable_http_client(GATEWAY) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()

            step("tools/list: what the policy lets this agent see (delete_item is hidden, restock asks)")
            for tool in (await session.list_tools()).tools:
                show(tool.name, tool.description)

            step("An allowed call (the owner's email is redacted on the way back)")
            show("result", (await call(session, "inv_get_item", {"id": 1}))["structuredContent"])

            step("A blocked call: the exact JSON-RPC error object")
            show("error", (await call(session, "inv_delete_item", {"id": 1}))["error"])

            step("A result full of secrets: DLP redacts every match")
            show("text", (await call(session, "inv_export_customers"))["content"][0]["text"])

            step("An ask: the call waits for a person, who approves it at the admin port")
            result, _ = await asyncio.gather(call(session, "inv_restock", {"qty": 50}), approve_when_asked())
            show("result", result.get("structuredContent", result))

            step("An upstream failure stays with its own call: price_check's socket drops...")
            show("error", (await call(session, "inv_price_check"))["error"])
            step("...while the sibling tool keeps working, and price_check is not replayed")
            show("get_item", (await call(session, "inv_get_item", {"id": 1}))["structuredContent"])
            show("price_check again", (await call(session, "inv_price_check"))["structuredContent"])


asyncio.run(main())
