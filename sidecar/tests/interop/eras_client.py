"""The Python MCP SDK's high-level client (PyPI `mcp`), unmodified, in a
chosen protocol mode, for the era interop tests.

Usage: eras_client.py URL MODE CALLS_JSON
       eras_client.py stdio MODE CALLS_JSON COMMAND ARGS...

MODE is the SDK's own: "auto" (its default: server/discover first, the
initialize handshake only for a server that does not answer it), "legacy"
(the initialize handshake), or a version to adopt ("2026-07-28").
CALLS_JSON is a list of [tool, arguments]. Elicitation requests are answered
by accepting with {"name": AIP_ELICIT_NAME}; the requests are reported.
Prints one JSON report: the negotiated protocol version, the tools listed,
each call's result or error, and the elicitation requests received.
"""
import asyncio
import json
import os
import sys

from mcp import Client, StdioServerParameters, types

ELICITED = []


async def elicit(context, params):
    asked = params.model_dump(mode="json", by_alias=True, exclude_none=True)
    ELICITED.append(asked)
    # The same answer under every property the form requires.
    required = asked.get("requestedSchema", {}).get("required") or ["name"]
    name = os.environ.get("AIP_ELICIT_NAME", "octocat")
    return types.ElicitResult(action="accept", content={key: name for key in required})


def dump(value):
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


async def main(server, mode, calls):
    async with Client(server, mode=mode, elicitation_callback=elicit) as client:
        report = {"protocol_version": client.protocol_version}
        report["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
        results = []
        for name, arguments in calls:
            try:
                results.append(dump(await client.call_tool(name, arguments)))
            except Exception as exc:  # an error the server or gateway returned
                error = getattr(exc, "error", None)
                results.append({"error": dump(error) if hasattr(error, "model_dump") else {"message": str(exc)}})
        report["results"] = results
        report["elicited"] = ELICITED
        print(json.dumps(report))


server = sys.argv[1]
if server == "stdio":  # the command (the stdio wrap) runs as a subprocess
    server = StdioServerParameters(command=sys.argv[4], args=sys.argv[5:])
asyncio.run(main(server, sys.argv[2], json.loads(sys.argv[3])))
