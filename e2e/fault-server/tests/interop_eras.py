"""Drives the fault server with the Python MCP SDK's `Client` (PyPI `mcp`),
which negotiates the era itself: mode "auto" probes server/discover and falls
back to initialize, "legacy" forces initialize, a version pins 2026-07-28.

Usage: interop_eras.py MODE http URL
       interop_eras.py MODE stdio BINARY CONFIG [ERA]

Prints one JSON document: the negotiated protocol version, the server's
name, the tools listed and what each call returned; or, when connecting
fails with a JSON-RPC error, that error.
"""
import asyncio
import json
import sys

from mcp import Client, MCPError, StdioServerParameters


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def exercise(client):
    tools = await client.list_tools()
    calls = []
    for _ in range(4):
        try:
            calls.append(dump(await client.call_tool("get_item", {"id": 1})))
        except MCPError as error:  # a JSON-RPC error surfaces as an exception
            calls.append({"exception": {"code": error.error.code, "message": error.error.message}})
    info = client.server_info
    return {
        "protocol_version": client.protocol_version,
        "server": info.name if info else None,
        "tools": [t.name for t in tools.tools],
        "calls": calls,
    }


async def main():
    mode, transport = sys.argv[1], sys.argv[2]
    if transport == "stdio":
        args = ["--config", sys.argv[4], "--stdio"]
        if len(sys.argv) > 5:
            args += ["--era", sys.argv[5]]
        server = StdioServerParameters(command=sys.argv[3], args=args)
    else:
        server = sys.argv[3]
    try:
        async with Client(server, mode=mode, read_timeout_seconds=10) as client:
            report = await exercise(client)
    except BaseException as failure:  # the SDK may wrap it in an exception group
        error = first_mcp_error(failure)
        if error is None:
            raise
        report = {"connect_error": {"code": error.error.code, "message": error.error.message,
                                    "data": error.error.data}}
    print(json.dumps(report))


def first_mcp_error(failure):
    if isinstance(failure, MCPError):
        return failure
    for inner in getattr(failure, "exceptions", ()):
        found = first_mcp_error(inner)
        if found is not None:
            return found
    return None


asyncio.run(main())
