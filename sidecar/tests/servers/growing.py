"""An MCP server (the Python SDK's MCPServer) whose tool list grows: each
call of `grow` adds a tool and announces it with
notifications/tools/list_changed, sent as the SDK sends it, outside the call
(over Streamable HTTP: on the session's standalone GET stream).

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
    await ctx.session.send_tool_list_changed()
    return name


if sys.argv[1] == "stdio":
    server.run("stdio")
else:
    # uvicorn says "Uvicorn running on ..." on stderr once it serves.
    server.run("streamable-http", port=int(sys.argv[2]))
