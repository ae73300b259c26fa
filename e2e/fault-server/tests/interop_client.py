"""Drives the fault server with the unmodified Python MCP SDK (PyPI `mcp`).

Usage: interop_client.py stdio BINARY CONFIG
       interop_client.py http URL

Prints one JSON document: the tools listed and what each call returned.
"""
import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client


async def exercise(read, write):
    async with ClientSession(read, write) as session:
        init = await session.initialize()
        tools = await session.list_tools()
        calls = []
        for _ in range(4):
            try:
                result = await session.call_tool("get_item", {"id": 1})
                calls.append(result.model_dump(mode="json", by_alias=True, exclude_none=True))
            except Exception as error:  # a JSON-RPC error surfaces as an exception
                calls.append({"exception": str(error)})
        unknown = await session.call_tool("no_such_tool", {})
        return {
            "server": init.model_dump(mode="json", by_alias=True)["serverInfo"]["name"],
            "tools": [t.name for t in tools.tools],
            "calls": calls,
            "unknown": unknown.model_dump(mode="json", by_alias=True, exclude_none=True),
        }


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        params = StdioServerParameters(command=sys.argv[2], args=["--config", sys.argv[3], "--stdio"])
        async with stdio_client(params) as (read, write):
            report = await exercise(read, write)
    else:
        async with streamable_http_client(sys.argv[2]) as streams:
            report = await exercise(streams[0], streams[1])
    print(json.dumps(report))


asyncio.run(main())
