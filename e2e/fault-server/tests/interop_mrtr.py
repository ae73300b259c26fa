"""A multi-round-trip call through the Python MCP SDK's `Client` (PyPI `mcp`):
the server answers `input_required` asking for an elicitation, the SDK asks
its elicitation callback and retries with the response and the echoed state.

Usage: interop_mrtr.py http URL [--no-elicitation]
       interop_mrtr.py stdio BINARY CONFIG [--no-elicitation]

Without --no-elicitation the callback accepts with {"name": "octocat"}; with
it the client declares no elicitation capability. Prints one JSON document:
the call's result, or the JSON-RPC error it raised, and what the callback
was asked.
"""
import asyncio
import json
import sys

from mcp import Client, MCPError, StdioServerParameters, types

asked = []


async def elicit(context, params):
    asked.append(params.model_dump(mode="json", by_alias=True, exclude_none=True))
    return types.ElicitResult(action="accept", content={"name": "octocat"})


def first_mcp_error(failure):
    if isinstance(failure, MCPError):
        return failure
    for inner in getattr(failure, "exceptions", ()):
        found = first_mcp_error(inner)
        if found is not None:
            return found
    return None


async def main():
    args = [a for a in sys.argv[1:] if a != "--no-elicitation"]
    callback = None if "--no-elicitation" in sys.argv else elicit
    if args[0] == "stdio":
        server = StdioServerParameters(command=args[1], args=["--config", args[2], "--stdio"])
    else:
        server = args[1]
    kwargs = {"elicitation_callback": callback} if callback else {}
    try:
        async with Client(server, read_timeout_seconds=10, **kwargs) as client:
            result = await client.call_tool("login", {})
            report = {"protocol_version": client.protocol_version,
                      "result": result.model_dump(mode="json", by_alias=True, exclude_none=True)}
    except BaseException as failure:  # the SDK may wrap it in an exception group
        error = first_mcp_error(failure)
        if error is None:
            raise
        report = {"error": {"code": error.error.code, "message": error.error.message, "data": error.error.data}}
    report["asked"] = asked
    print(json.dumps(report))


asyncio.run(main())
