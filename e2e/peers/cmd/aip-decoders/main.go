// Command aip-decoders reads a JSON array of JSON-RPC message texts on
// standard input and prints, for each, what two real Go readers make of it:
// the standard library's encoding/json decoding into the structs an MCP
// server typically declares (it matches keys case-insensitively), and the
// official MCP Go SDK's own server, fed the text as an HTTP request body.
//
// Each view is [method, params.name, params.arguments] (null where absent),
// or {"error": ...} when the reader refused the text. The gateway's decoder
// differential test compares them with what the policy evaluated.
//
// With -folds it prints instead every rune that Go's key matching folds to
// an ASCII letter, as [rune, ascii], for the gateway's folding table test.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	folds := flag.Bool("folds", false, "print the runes Go folds to ASCII letters")
	flag.Parse()
	if *folds {
		printFolds()
		return
	}
	var texts []string
	if err := json.NewDecoder(os.Stdin).Decode(&texts); err != nil {
		fail("reading the corpus: %v", err)
	}
	sdk := newSDKReader()
	out := make([]map[string]any, 0, len(texts))
	for _, text := range texts {
		out = append(out, map[string]any{
			"encoding/json": stdlibView(text),
			"go-sdk":        sdk.view(text),
		})
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("writing the views: %v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "aip-decoders: "+format+"\n", args...)
	os.Exit(1)
}

// printFolds lists the non-ASCII runes r for which encoding/json's key
// folding (upper of lower, per rune) gives an ASCII letter.
func printFolds() {
	var out [][2]string
	for r := rune(0x80); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		f := unicode.ToUpper(unicode.ToLower(r))
		if f < utf8.RuneSelf && unicode.IsLetter(f) {
			out = append(out, [2]string{string(r), string(unicode.ToLower(f))})
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("writing the folds: %v", err)
	}
}

type envelope struct {
	Method *string         `json:"method"`
	Params json.RawMessage `json:"params"`
}

type callParams struct {
	Name      *string         `json:"name"`
	Arguments *map[string]any `json:"arguments"`
}

func stdlibView(text string) any {
	var env envelope
	if err := decode([]byte(text), &env); err != nil {
		return map[string]any{"error": err.Error()}
	}
	var params callParams
	isCall := env.Method != nil && *env.Method == "tools/call"
	if isCall && len(env.Params) > 0 && !bytes.Equal(env.Params, []byte("null")) {
		if err := decode(env.Params, &params); err != nil {
			return map[string]any{"error": err.Error()}
		}
	}
	var args any
	if params.Arguments != nil {
		args = *params.Arguments
	}
	return []any{env.Method, params.Name, args}
}

func decode(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	return d.Decode(v)
}

// sdkReader is the official MCP Go SDK's server behind its own Streamable
// HTTP handler (stateless, so no initialize is needed), with a middleware
// that records what the SDK decoded and answers with an error.
type sdkReader struct {
	handler http.Handler
	seen    chan any
}

func newSDKReader() *sdkReader {
	server := mcp.NewServer(&mcp.Implementation{Name: "aip-decoders", Version: "1"}, nil)
	r := &sdkReader{seen: make(chan any, 1)}
	server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			view := []any{method, nil, nil}
			if p, ok := req.GetParams().(*mcp.CallToolParamsRaw); ok {
				var args any
				if len(p.Arguments) > 0 {
					if err := decode(p.Arguments, &args); err != nil {
						args = map[string]any{"error": err.Error()}
					}
				}
				view = []any{method, p.Name, args}
			}
			select {
			case r.seen <- view:
			default:
			}
			return nil, fmt.Errorf("recorded")
		}
	})
	r.handler = mcp.NewStreamableHTTPHandler(
		func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true},
	)
	return r
}

// view posts the text as a request body, exactly as sent, and reports what
// reached the SDK's method handlers.
func (r *sdkReader) view(text string) any {
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(text))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	rec := httptest.NewRecorder()
	r.handler.ServeHTTP(rec, req)
	select {
	case v := <-r.seen:
		return v
	default:
		body := rec.Body.String()
		if len(body) > 200 {
			body = body[:200]
		}
		return map[string]any{"error": fmt.Sprintf("HTTP %d before any handler: %s", rec.Code, body)}
	}
}
