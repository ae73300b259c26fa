//! The agent listener's bounds, on the real binary: running out of file
//! descriptors does not end the process, a client that trickles its headers
//! (or idles on keep-alive) is disconnected, large requests past the
//! in-flight budget are answered 503 with Retry-After before their bodies
//! are read, and a message of a million tiny values is refused by count,
//! not built.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(20);

/// `aip-sidecar run` with a policy and no connections, started under
/// `prefix` (e.g. prlimit); stderr lines arrive on `lines`.
struct Sidecar {
    child: Child,
    addr: SocketAddr,
    lines: mpsc::Receiver<String>,
    /// The configuration's directory, removed after the process is gone.
    _scratch: tempfile::TempDir,
}

impl Sidecar {
    fn start(prefix: &[&str], name: &str) -> Sidecar {
        Sidecar::start_with(prefix, name, &["--header-timeout-seconds", "1"])
    }

    /// The same, with `extra` arguments to `run`.
    fn start_with(prefix: &[&str], name: &str, extra: &[&str]) -> Sidecar {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("aip-bounds-{name}-"))
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let dir = tmp.path();
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            "apiVersion: aip.io/v1alpha1\nkind: AgentPolicy\nmetadata: {name: p}\nspec: {}\n",
        )
        .unwrap();
        let bin = env!("CARGO_BIN_EXE_aip-sidecar");
        let mut command = match prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let mut child = command
            .args(["run", "--config"])
            .arg(&config)
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(extra)
            .args(["--audit", "/dev/null"])
            .arg("--approval-token-file")
            .arg(dir.join("token"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = follow(child.stderr.take().unwrap());
        let addr = loop {
            let line = lines.recv_timeout(PATIENCE).expect("the sidecar starts");
            if let Some(rest) = line.split("agents at http://").nth(1) {
                break rest.split('/').next().unwrap().parse().unwrap();
            }
        };
        Sidecar {
            child,
            addr,
            lines,
            _scratch: tmp,
        }
    }

    fn ping(&self) -> Option<String> {
        let mut s = TcpStream::connect(self.addr).ok()?;
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        self.send_ping(&mut s)?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    fn send_ping(&self, s: &mut TcpStream) -> Option<()> {
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
        write!(
            s,
            "POST /mcp HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-type: application/json\r\naccept: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .ok()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn follow(stderr: ChildStderr) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Reads until the server closes the connection; true if it did.
fn closed_by_server(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
}

#[test]
fn running_out_of_file_descriptors_does_not_end_the_process() {
    let mut sidecar = Sidecar::start(&["prlimit", "--nofile=48:48"], "fds");
    // More connections than the process has descriptors for.
    let held: Vec<TcpStream> = (0..80)
        .filter_map(|_| TcpStream::connect(sidecar.addr).ok())
        .collect();
    assert!(held.len() > 48, "the backlog took them");
    loop {
        let line = sidecar
            .lines
            .recv_timeout(PATIENCE)
            .expect("the sidecar says accepting failed");
        if line.contains("accept failed") {
            break;
        }
    }
    assert!(sidecar.child.try_wait().unwrap().is_none(), "still running");
    drop(held);
    // The descriptors come back as the connections close (the header
    // deadline closes the ones it had accepted): it serves again.
    let deadline = std::time::Instant::now() + PATIENCE;
    let served = loop {
        match sidecar.ping() {
            Some(reply) if reply.starts_with("HTTP/1.1 200") => break true,
            _ if std::time::Instant::now() > deadline => break false,
            // Each attempt is an event of its own; the listener's backoff
            // is at most a second.
            _ => std::thread::yield_now(),
        }
    };
    assert!(served);
    assert!(sidecar.child.try_wait().unwrap().is_none());
}

/// Past `--max-connections`, a new connection waits in the kernel's
/// backlog: its request is answered only once a served connection ends.
#[test]
fn connections_past_the_cap_wait_until_one_ends() {
    let sidecar = Sidecar::start_with(
        &[],
        "cap",
        &["--max-connections", "2", "--header-timeout-seconds", "60"],
    );
    let mut holders: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(sidecar.addr).unwrap())
        .collect();
    // Both are served: a request on each would be answered.
    let mut third = TcpStream::connect(sidecar.addr).unwrap();
    sidecar.send_ping(&mut third).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut first = [0u8; 12];
    let waited = third.read(&mut first);
    assert!(
        matches!(&waited, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "answered past the cap: {waited:?}"
    );
    drop(holders.remove(0));
    third.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut out = String::new();
    third.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    drop(holders);
}

/// A body that stops arriving is answered 408 at `--body-timeout-seconds`,
/// and its room in the budget goes back.
#[test]
fn a_stalled_body_is_given_up_at_its_deadline() {
    let sidecar = Sidecar::start_with(
        &[],
        "body",
        &[
            "--body-timeout-seconds",
            "1",
            "--header-timeout-seconds",
            "60",
        ],
    );
    let mut s = TcpStream::connect(sidecar.addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\naccept: application/json\r\ncontent-length: 1000\r\n\r\n{{\"jsonrpc\"",
        sidecar.addr
    )
    .unwrap();
    let started = std::time::Instant::now();
    let mut out = [0u8; 64];
    let n = s.read(&mut out).unwrap();
    let head = String::from_utf8_lossy(&out[..n]).into_owned();
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "at the deadline, not before"
    );
    assert!(sidecar.ping().unwrap().starts_with("HTTP/1.1 200"));
}

#[test]
fn trickled_headers_and_idle_connections_are_closed() {
    let sidecar = Sidecar::start(&[], "slow");
    let mut trickle = TcpStream::connect(sidecar.addr).unwrap();
    trickle
        .write_all(b"POST /mcp HTTP/1.1\r\nhost: localhost\r\n")
        .unwrap();
    assert!(closed_by_server(trickle), "half a request's headers");

    let mut idle = TcpStream::connect(sidecar.addr).unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    write!(
        idle,
        "POST /mcp HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\naccept: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(closed_by_server(idle), "an idle keep-alive connection");
    assert!(sidecar.ping().unwrap().starts_with("HTTP/1.1 200"));
}

#[test]
fn large_requests_past_the_budget_get_503_before_their_bodies_are_read() {
    let sidecar = Sidecar::start(&[], "budget");
    let pad = "a".repeat(4 * 1024 * 1024 - 100);
    let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{pad}"}}}}"#);
    let head = |addr: SocketAddr| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        s.set_write_timeout(Some(PATIENCE)).unwrap();
        write!(
            s,
            "POST /mcp HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\naccept: application/json\r\nmcp-session-id: x\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        s
    };
    // Two 4 MiB requests reserve the whole budget (4 x their size each)...
    let mut first = head(sidecar.addr);
    let mut second = head(sidecar.addr);
    // ... so a third is refused as soon as they are reserved. Connections
    // are served concurrently: a third whose headers were read first is
    // served in full (it sends its body too), and another is tried; and a
    // holder served after a third was refused itself (its connection then
    // answers at once), so it is opened again.
    let deadline = std::time::Instant::now() + PATIENCE;
    let refused = loop {
        for holder in [&mut first, &mut second] {
            if answered(holder) {
                *holder = head(sidecar.addr);
            }
        }
        let mut third = head(sidecar.addr);
        let _ = third.write_all(body.as_bytes());
        let mut reply = vec![0u8; 4096];
        let n = third.read(&mut reply).unwrap();
        let reply = String::from_utf8_lossy(&reply[..n]).into_owned();
        if reply.starts_with("HTTP/1.1 503") {
            break reply;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never refused; the last reply: {reply}"
        );
    };
    assert!(
        refused.to_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    assert!(
        refused.to_lowercase().contains("connection: close"),
        "the unread body is not waited for: {refused}"
    );
    assert!(refused.contains("retry in a second"), "{refused}");
    // The first body arrives: it is served (404: its session is unknown,
    // which is decided after the body is read).
    first.write_all(body.as_bytes()).unwrap();
    let mut status = [0u8; 12];
    first.read_exact(&mut status).unwrap();
    assert_eq!(&status, b"HTTP/1.1 404");
    drop((first, second));
    assert!(sidecar.ping().unwrap().starts_with("HTTP/1.1 200"));
}

/// Whether the server has answered (or closed) `stream` already: a
/// request still waiting for its body has nothing to read.
fn answered(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let answered =
        !matches!(stream.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    stream.set_nonblocking(false).unwrap();
    answered
}

#[test]
fn a_message_of_a_million_tiny_values_is_refused_by_count() {
    let sidecar = Sidecar::start(&[], "values");
    let numbers = vec!["1"; 1_500_000].join(",");
    let body =
        format!(r#"{{"jsonrpc":"2.0","id":9,"method":"initialize","params":{{"x":[{numbers}]}}}}"#);
    let mut s = TcpStream::connect(sidecar.addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\naccept: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.contains("more than 131072 JSON values"),
        "{}",
        &out[..out.len().min(400)]
    );
    assert!(out.contains(r#""id":9"#), "the id is still known");
}

/// A body that arrives in pieces (here three chunks of a chunked body,
/// each its own frame for the server) is put together before it is read;
/// the same message in one piece gets the same answer.
#[test]
fn a_body_in_pieces_is_read_whole() {
    let sidecar = Sidecar::start(&[], "pieces");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"pieces","version":"1"}}}"#;
    let (a, rest) = body.split_at(20);
    let (b, c) = rest.split_at(50);
    let chunked: String = [a, b, c]
        .iter()
        .map(|piece| format!("{:x}\r\n{piece}\r\n", piece.len()))
        .collect();
    let head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\n";
    let requests = [
        format!("{head}Transfer-Encoding: chunked\r\n\r\n{chunked}0\r\n\r\n"),
        format!("{head}Content-Length: {}\r\n\r\n{body}", body.len()),
    ];
    for request in requests {
        let mut stream = TcpStream::connect(sidecar.addr).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            response.contains(r#""protocolVersion":"2025-11-25""#),
            "{response}"
        );
        assert!(
            response.to_ascii_lowercase().contains("mcp-session-id:"),
            "{response}"
        );
    }
}
