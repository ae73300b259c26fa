"""An MCP server (the Python SDK's MCPServer, both protocol eras) whose tool
list grows: each call of `grow` adds a tool and announces it with
notifications/tools/list_changed, sent as the SDK sends it, outside the call:
to `subscriptions/listen` streams (2026-07-28) and, for a legacy session, on
its standalone GET stream (over stdio: on stdout).

    growing.py stdio
    growing.py http PORT
"""
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("growing")
grown = 0


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds a tool named extra_N and says the list changed."""
    global grown
    grown += 1
    name = f"extra_{grown}"

    def extra() -> str:
        return name

    server.add_tool(extra, name=name, description=f"tool number {grown}")
    await ctx.notify_tools_changed()
    try:
        await ctx.session.send_tool_list_changed()
    except Exception:  # a modern request has no session to announce on
        pass
    return name


if sys.argv[1] == "stdio":
    server.run("stdio")
else:
    # uvicorn says "Uvicorn running on ..." on stderr once it serves.
    server.run("streamable-http", port=int(sys.argv[2]))
