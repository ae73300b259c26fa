"""An unmodified Python MCP SDK client (PyPI `mcp`) for the interop tests.

Usage: client.py CALLS_JSON http URL
       client.py CALLS_JSON stdio COMMAND ARGS...

CALLS_JSON is a list of [tool, arguments] or [tool, arguments, {"progress": true}].
Prints one JSON report: the server name, the tools listed, and each call's
result or JSON-RPC error (with the progress updates received, if asked).

With AIP_SAMPLE_REPLY set, the client offers sampling and answers every
sampling/createMessage with that text; the requests it got are reported
under "sampled".
"""
import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client, types
from mcp.client.streamable_http import streamable_http_client

SAMPLED = []


async def sample(context, params):
    """Answers a server's sampling request with AIP_SAMPLE_REPLY."""
    SAMPLED.append(params.model_dump(mode="json", by_alias=True, exclude_none=True))
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text=os.environ["AIP_SAMPLE_REPLY"]),
        model="interop-test",
    )


async def other(session, op, argument):
    """Prompts and resources: @prompts, @prompt NAME, @resources, @read URI."""
    try:
        if op == "@prompts":
            return {"prompts": [p.name for p in (await session.list_prompts()).prompts]}
        if op == "@prompt":
            result = await session.get_prompt(argument)
            return result.model_dump(mode="json", by_alias=True, exclude_none=True)
        if op == "@resources":
            return {"resources": [str(r.uri) for r in (await session.list_resources()).resources]}
        if op == "@read":
            result = await session.read_resource(argument)
            return result.model_dump(mode="json", by_alias=True, exclude_none=True)
    except Exception as exc:
        error = getattr(exc, "error", None)
        if error is not None and hasattr(error, "model_dump"):
            return {"error": error.model_dump(mode="json", exclude_none=True)}
        return {"error": {"message": str(exc)}}
    return {"error": {"message": f"unknown operation {op}"}}


async def exercise(read, write, calls):
    sampling = sample if "AIP_SAMPLE_REPLY" in os.environ else None
    async with ClientSession(read, write, sampling_callback=sampling) as session:
        init = await session.initialize()
        tools = await session.list_tools()
        results = []
        for name, arguments, *options in calls:
            if name.startswith("@"):
                results.append(await other(session, name, arguments))
                continue
            updates = []

            async def on_progress(progress, total, message):
                updates.append({"progress": progress, "total": total, "message": message})

            wants_progress = bool(options and options[0].get("progress"))
            try:
                if wants_progress:
                    result = await session.call_tool(name, arguments, progress_callback=on_progress)
                else:
                    result = await session.call_tool(name, arguments)
                dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
                if wants_progress:
                    dumped["progress_updates"] = updates
                results.append(dumped)
            except Exception as exc:  # JSON-RPC errors surface as exceptions
                error = getattr(exc, "error", None)
                if error is not None and hasattr(error, "model_dump"):
                    results.append({"error": error.model_dump(mode="json", exclude_none=True)})
                else:
                    results.append({"error": {"message": str(exc)}})
        return {
            "server": init.server_info.name if hasattr(init, "server_info") else init.serverInfo.name,
            "tools": [t.name for t in tools.tools],
            "results": results,
            "sampled": SAMPLED,
        }


async def main():
    calls = json.loads(sys.argv[1])
    if sys.argv[2] == "http":
        async with streamable_http_client(sys.argv[3]) as streams:
            report = await exercise(streams[0], streams[1], calls)
    else:
        params = StdioServerParameters(command=sys.argv[3], args=sys.argv[4:])
        async with stdio_client(params) as (read, write):
            report = await exercise(read, write, calls)
    print(json.dumps(report))


asyncio.run(main())
