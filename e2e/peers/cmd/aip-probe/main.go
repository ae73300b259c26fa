// aip-probe is the node stories' network prober: run in an agent's
// container it tries what an agent that ignores its gateway would try, and
// says what happened; run as a pod of its own it is a server to try.
//
//	aip-probe idle                   wait for SIGTERM (a container to exec into)
//	aip-probe serve PORT             TCP (writes "hello") and UDP (echo) on [::]:PORT
//	aip-probe tcp ADDR [ADDR...]     a TCP connection to each ADDR (host:port), then closed
//	aip-probe udp ADDR [ADDR...]     a datagram exchange with each ADDR
//	aip-probe dns NAME [NAME...]     each NAME resolved
//	aip-probe mcp URL TOOL [JSON]    one tools/call over Streamable HTTP
//	aip-probe mcp-bench URL TOOL N   N tools/calls in one session: their p50
//	                                 and p99 in microseconds, as JSON
//
// Each attempt prints one JSON line: {"kind", "target", "outcome", "ms",
// "detail"}, outcome one of reached, refused (connection refused, or a
// datagram refused at once), timeout, error. It exits 0 once every attempt
// has been made, whatever their outcomes: the test judges them.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const patience = 3 * time.Second

type result struct {
	Kind    string `json:"kind"`
	Target  string `json:"target"`
	Outcome string `json:"outcome"`
	Ms      int64  `json:"ms"`
	Detail  string `json:"detail,omitempty"`
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "idle":
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
		<-stop
	case "serve":
		if len(args) != 1 {
			usage()
		}
		serve(args[0])
	case "tcp", "udp", "dns":
		for _, target := range args {
			attempt(os.Args[1], target)
		}
	case "mcp-bench":
		if len(args) != 3 {
			usage()
		}
		var n int
		if _, err := fmt.Sscan(args[2], &n); err != nil || n < 1 {
			usage()
		}
		benchTool(args[0], args[1], n)
	case "mcp":
		if len(args) < 2 {
			usage()
		}
		arguments := "{}"
		if len(args) > 2 {
			arguments = args[2]
		}
		callTool(args[0], args[1], arguments)
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: aip-probe idle | serve PORT | tcp ADDR... | udp ADDR... | dns NAME... | mcp URL TOOL [JSON]")
	os.Exit(2)
}

func say(r result) {
	line, _ := json.Marshal(r)
	fmt.Println(string(line))
}

func outcomeOf(err error) (string, string) {
	switch {
	case err == nil:
		return "reached", ""
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused", err.Error()
	case errors.Is(err, syscall.EPERM):
		// A datagram the lock refused: the send fails at once.
		return "refused", err.Error()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout", err.Error()
	}
	var timeout interface{ Timeout() bool }
	if errors.As(err, &timeout) && timeout.Timeout() {
		return "timeout", err.Error()
	}
	return "error", err.Error()
}

func attempt(kind, target string) {
	started := time.Now()
	var err error
	detail := ""
	switch kind {
	case "tcp":
		var conn net.Conn
		// Connected is reached: the server's first words are its own
		// business (an HTTP server says nothing until asked).
		conn, err = net.DialTimeout("tcp", target, patience)
		if err == nil {
			conn.Close()
		}
	case "udp":
		var conn net.Conn
		conn, err = net.DialTimeout("udp", target, patience)
		if err == nil {
			conn.SetDeadline(time.Now().Add(patience))
			_, sendErr := conn.Write([]byte("ping"))
			buf := make([]byte, 16)
			_, err = conn.Read(buf)
			if err == nil && sendErr != nil {
				err = sendErr
			}
			conn.Close()
		}
	case "dns":
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		var addrs []string
		addrs, err = net.DefaultResolver.LookupHost(ctx, target)
		cancel()
		detail = fmt.Sprint(addrs)
	}
	outcome, why := outcomeOf(err)
	if why != "" {
		detail = why
	}
	say(result{Kind: kind, Target: target, Outcome: outcome, Ms: time.Since(started).Milliseconds(), Detail: detail})
}

func callTool(url, tool, arguments string) {
	started := time.Now()
	var args map[string]any
	if err := json.Unmarshal([]byte(arguments), &args); err != nil {
		say(result{Kind: "mcp", Target: url, Outcome: "error", Detail: "arguments: " + err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "aip-probe", Version: "0.1.0"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		outcome, why := outcomeOf(err)
		say(result{Kind: "mcp", Target: url, Outcome: outcome, Ms: time.Since(started).Milliseconds(), Detail: why})
		return
	}
	defer session.Close()
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		outcome, why := outcomeOf(err)
		say(result{Kind: "mcp", Target: url, Outcome: outcome, Ms: time.Since(started).Milliseconds(), Detail: why})
		return
	}
	text := ""
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			text += t.Text
		}
	}
	outcome := "reached"
	if res.IsError {
		outcome = "error"
	}
	say(result{Kind: "mcp", Target: url + " " + tool, Outcome: outcome, Ms: time.Since(started).Milliseconds(), Detail: text})
}

func benchTool(url, tool string, n int) {
	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "aip-probe", Version: "0.1.0"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(1)
	}
	defer session.Close()
	samples := make([]int64, 0, n)
	for i := 0; i < n; i++ {
		started := time.Now()
		res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"path": "/q3"}})
		if err != nil || res.IsError {
			fmt.Fprintln(os.Stderr, "call:", err)
			os.Exit(1)
		}
		samples = append(samples, time.Since(started).Microseconds())
	}
	sort.Slice(samples, func(a, b int) bool { return samples[a] < samples[b] })
	rank := func(p float64) int64 {
		i := int(math.Ceil(p*float64(len(samples)))) - 1
		if i < 0 {
			i = 0
		}
		return samples[i]
	}
	line, _ := json.Marshal(map[string]any{"n": n, "p50_us": rank(0.5), "p99_us": rank(0.99)})
	fmt.Println(string(line))
}

func serve(port string) {
	address := net.JoinHostPort("::", port)
	listener, err := net.Listen("tcp", address)
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	packets, err := net.ListenPacket("udp", address)
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := packets.ReadFrom(buf)
			if err != nil {
				return
			}
			packets.WriteTo(buf[:n], from)
		}
	}()
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			conn.Write([]byte("hello"))
			conn.Close()
		}
	}()
	fmt.Println("serving TCP and UDP on", address)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
