// The TypeScript MCP SDK's client (npm @modelcontextprotocol/client),
// unmodified, for the era interop tests.
//
// Usage: node ts_client.mjs URL MODE CALLS_JSON
//
// MODE is the SDK's version negotiation: "legacy" (its default: the
// initialize handshake), "auto" (server/discover first), or a version to
// pin ("2026-07-28"). CALLS_JSON is a list of [tool, arguments].
// Elicitation requests are accepted with {"name": "octocat"}.
// Prints one JSON report: the negotiated version, the tools listed, each
// call's result or error, and the elicitation requests received.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const [url, mode, calls] = process.argv.slice(2);
const versionNegotiation = { mode: mode === 'legacy' || mode === 'auto' ? mode : { pin: mode } };
const client = new Client(
    { name: 'aip-interop', version: '1.0.0' },
    { capabilities: { elicitation: {} }, versionNegotiation }
);
const elicited = [];
client.setRequestHandler('elicitation/create', async request => {
    elicited.push(request.params);
    return { action: 'accept', content: { name: 'octocat' } };
});
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const report = { protocol_version: client.getNegotiatedProtocolVersion() };
report.tools = (await client.listTools()).tools.map(t => t.name).sort();
report.results = [];
for (const [name, args] of JSON.parse(calls)) {
    try {
        report.results.push(await client.callTool({ name, arguments: args }));
    } catch (error) {
        report.results.push({ error: { code: error.code, message: error.message } });
    }
}
report.elicited = elicited;
console.log(JSON.stringify(report));
await client.close();
