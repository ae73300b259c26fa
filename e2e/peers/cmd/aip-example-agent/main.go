// aip-example-agent is the agent of examples/cluster: a tool-using program
// built on the official MCP Go SDK's client, talking to whatever
// $AIP_MCP_URL names (the gateway the injector put in its pod; nothing in it
// knows about the gateway).
//
// It lists the tools it may see, reads a file (allowed), changes a file's
// mode (blocked: the policy does not allow fs_chmod), and deletes a file
// (held until a person approves the ApprovalRequest the gateway makes).
// Each step prints one line: the call, and what the gateway or the server
// said. With $AIP_DIRECT_MCP_URL set it first makes the read as an agent
// that ignores its gateway would, straight to the tool server at that URL,
// and says whether the pod's egress lock refused it; with
// $AIP_EXPECT_DIRECT=refused that refusal is one of the expected outcomes. It exits 0 when every step ended as the example expects (the read
// and the approved delete succeed, the chmod is refused with -32001); 2
// when one did not (then the Job fails, and says so); 1 when it cannot
// reach the gateway or never sees a tool.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const (
	// The example policy's approval timeout is 120 s; wait a little longer.
	heldCallTimeout = 150 * time.Second
	callTimeout     = 30 * time.Second
	// Until the operator may read the connection's Secret (`kubectl aip
	// grant`), the gateway serves no tools.
	toolsPatience = 300 * time.Second
)

func main() {
	url := os.Getenv("AIP_MCP_URL")
	if url == "" {
		fail("AIP_MCP_URL is not set (the injected gateway sets it in the agent's environment)")
	}
	ctx := context.Background()
	var unexpected []string
	if direct := os.Getenv("AIP_DIRECT_MCP_URL"); direct != "" {
		refused := aroundTheGateway(ctx, direct)
		if os.Getenv("AIP_EXPECT_DIRECT") == "refused" && !refused {
			unexpected = append(unexpected, "read_file straight to the tool server: expected the egress lock to refuse it")
		}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "aip-example-agent", Version: "0.1.0"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		fail("connecting to %s: %v", url, err)
	}
	defer session.Close()

	names := toolsOnceGranted(ctx, session)
	fmt.Println("tools:", strings.Join(names, ", "))
	expect := func(tool string, got outcome, want outcome) {
		if got != want {
			unexpected = append(unexpected, fmt.Sprintf("%s: expected %s, got %s", tool, want, got))
		}
	}
	expect("fs_read_file", call(ctx, session, "fs_read_file", map[string]any{"path": "/reports/q3.txt"}, callTimeout), succeeded)
	expect("fs_chmod", call(ctx, session, "fs_chmod", map[string]any{"path": "/reports/q3.txt"}, callTimeout), outcome{refused: -32001})
	fmt.Println("fs_delete_file: waiting for a person (kubectl aip approvals -n agents)")
	expect("fs_delete_file", call(ctx, session, "fs_delete_file", map[string]any{"path": "/reports/old.txt"}, heldCallTimeout), succeeded)
	if len(unexpected) > 0 {
		session.Close()
		fmt.Fprintf(os.Stderr, "aip-example-agent: %d calls did not end as the example expects:\n  %s\n", len(unexpected), strings.Join(unexpected, "\n  "))
		os.Exit(2)
	}
}

// aroundTheGateway reads the report straight from the tool server at url,
// as an agent that ignores $AIP_MCP_URL would; true when the connection was
// refused (the pod's egress lock), false when the server was reached.
func aroundTheGateway(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	started := time.Now()
	client := mcp.NewClient(&mcp.Implementation{Name: "aip-example-agent", Version: "0.1.0"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err == nil {
		defer session.Close()
		_, err = session.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "/reports/q3.txt"}})
	}
	took := time.Since(started).Milliseconds()
	if err != nil && (errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(err.Error(), "connection refused")) {
		fmt.Printf("read_file straight to %s (around the gateway): refused in %d ms: the pod's egress lock holds\n", url, took)
		return true
	}
	if err != nil {
		fmt.Printf("read_file straight to %s (around the gateway): reached the server, which said: %v\n", url, err)
	} else {
		fmt.Printf("read_file straight to %s (around the gateway): reached the server and read the file: nothing locks this pod's egress\n", url)
	}
	return false
}

// How a call ended: a result (ok, or a tool error), or a JSON-RPC error's
// code (refused), or no answer at all.
type outcome struct {
	ok      bool
	refused int64
	failed  bool
}

var succeeded = outcome{ok: true}

func (o outcome) String() string {
	switch {
	case o.ok:
		return "a result"
	case o.refused != 0:
		return fmt.Sprintf("error %d", o.refused)
	default:
		return "no answer (or a tool error)"
	}
}

func toolsOnceGranted(ctx context.Context, session *mcp.ClientSession) []string {
	deadline := time.Now().Add(toolsPatience)
	for {
		listed, err := session.ListTools(ctx, nil)
		if err != nil {
			fail("tools/list: %v", err)
		}
		if len(listed.Tools) > 0 {
			names := make([]string, 0, len(listed.Tools))
			for _, tool := range listed.Tools {
				names = append(names, tool.Name)
			}
			return names
		}
		if time.Now().After(deadline) {
			fail("no tools after %s: is the connection granted? (kubectl get aip -n agents)", toolsPatience)
		}
		time.Sleep(2 * time.Second)
	}
}

func call(ctx context.Context, session *mcp.ClientSession, tool string, arguments map[string]any, timeout time.Duration) outcome {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	result, err := session.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: arguments})
	if err != nil { // a JSON-RPC error, e.g. the policy's refusal
		var refusal *jsonrpc.Error
		if errors.As(err, &refusal) {
			// The gateway says why in the error's data.
			fmt.Printf("%s: refused: %d %s %s\n", tool, refusal.Code, refusal.Message, refusal.Data)
			return outcome{refused: refusal.Code}
		}
		fmt.Printf("%s: failed: %v\n", tool, err)
		return outcome{failed: true}
	}
	var text []string
	for _, content := range result.Content {
		if t, ok := content.(*mcp.TextContent); ok {
			text = append(text, t.Text)
		}
	}
	said := "ok"
	if result.IsError {
		said = "error"
	}
	fmt.Printf("%s: %s: %s\n", tool, said, strings.Join(text, " "))
	return outcome{ok: !result.IsError, failed: result.IsError}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "aip-example-agent: "+format+"\n", args...)
	os.Exit(1)
}
