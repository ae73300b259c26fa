//! stdio transport: newline-delimited JSON-RPC, one message per line.
//! Both eras share the pipe: a request whose `params._meta` claims a
//! protocol version is served as 2026-07-28 (no headers here, so only its
//! envelope is checked); anything else as the initialize-era session the
//! process is.
//!
//! One writer task owns stdout so lines never interleave. `drop` closes stdout
//! and ends the server (a dead pipe is the stdio form of a dead socket);
//! `stall_body` writes part of a line and then nothing more, ever.

use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::core::{CallContext, Core, Handled, Reply, Wire, error};
use crate::era::{self, Era, Eras};

enum Out {
    Line(String),
    Stall(Vec<u8>),
    Close,
}

/// Serves until stdin ends, a `drop`/`close` step ends the pipe, or shutdown.
pub async fn serve<R, W>(
    core: Arc<Core>,
    input: R,
    output: W,
    shutdown: CancellationToken,
) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let closed = CancellationToken::new();
    let writer = tokio::spawn(write_loop(output, rx, closed.clone()));
    // Queued calls are answered in the order the worker plays them, which
    // is arrival order: one forwarder awaits them in that order, so replies
    // cannot overtake one another on the way to stdout.
    let (pending_tx, mut pending_rx) = mpsc::unbounded_channel::<oneshot::Receiver<Reply>>();
    let forward_tx = tx.clone();
    let forwarder = tokio::spawn(async move {
        while let Some(pending) = pending_rx.recv().await {
            if let Some(out) = pending.await.ok().and_then(to_out) {
                let _ = forward_tx.send(out);
            }
        }
    });
    // Delayed tools/list answers, each on its own timer.
    let delayed = TaskTracker::new();
    let mut lines = BufReader::new(input).lines();
    let mut ctx = CallContext {
        session: "stdio".to_owned(),
        ..CallContext::default()
    };
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line?,
            () = shutdown.cancelled() => break,
            () = closed.cancelled() => break,
        };
        let Some(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let message: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                let reply = error(&Value::Null, -32700, &format!("Parse error: {e}"), None);
                let _ = tx.send(Out::Line(reply.to_string()));
                continue;
            }
        };
        if message.is_array() {
            let reply = error(
                &Value::Null,
                -32600,
                "Invalid Request: batches are not supported",
                None,
            );
            let _ = tx.send(Out::Line(reply.to_string()));
            continue;
        }
        let request_era = match core.script.era {
            Eras::Legacy => Era::Legacy,
            Eras::Both | Eras::Modern => era::classify(&message, None),
        };
        let handled = match (request_era, core.script.era) {
            (Era::Modern, _) => core.handle_modern(&message, None, &ctx),
            (Era::Legacy, Eras::Modern) => core.refuse_legacy(&message, None),
            (Era::Legacy, _) => {
                if message.get("method").and_then(Value::as_str) == Some("initialize") {
                    let requested = message
                        .pointer("/params/protocolVersion")
                        .and_then(Value::as_str);
                    ctx.protocol_version = Some(Core::negotiate(requested).to_owned());
                }
                core.handle(&message, &ctx)
            }
        };
        match handled {
            Handled::Now(Some(reply))
            | Handled::Refused {
                response: reply, ..
            } => {
                let _ = tx.send(Out::Line(reply.to_string()));
            }
            Handled::Now(None) => {}
            Handled::Later(pending) => {
                let _ = pending_tx.send(pending);
            }
            Handled::Delayed { delay_ms: 0, reply } => {
                if let Some(out) = to_out(reply) {
                    let _ = tx.send(out);
                }
            }
            Handled::Delayed { delay_ms, reply } => {
                let (tx, shutdown, closed) = (tx.clone(), shutdown.clone(), closed.clone());
                delayed.spawn(async move {
                    let delay = tokio::time::sleep(std::time::Duration::from_millis(delay_ms));
                    tokio::select! {
                        () = delay => {
                            if let Some(out) = to_out(reply) {
                                let _ = tx.send(out);
                            }
                        }
                        () = shutdown.cancelled() => {}
                        () = closed.cancelled() => {}
                    }
                });
            }
        }
    }
    drop(pending_tx);
    let _ = forwarder.await;
    delayed.close();
    delayed.wait().await;
    drop(tx);
    closed.cancel(); // releases a writer parked by a stall
    let _ = writer.await;
    Ok(())
}

fn to_out(reply: Reply) -> Option<Out> {
    match reply {
        Reply::Message(v) | Reply::Refused { response: v, .. } => Some(Out::Line(v.to_string())),
        Reply::Canceled => None,
        Reply::Wire(Wire::RawBody(text)) => Some(Out::Line(text)),
        Reply::Wire(Wire::StallBody {
            after_bytes,
            response,
        }) => {
            let mut bytes = response.to_string().into_bytes();
            bytes.truncate(after_bytes);
            Some(Out::Stall(bytes))
        }
        // `close` on exhaustion, and `drop`; HTTP-only steps never load here.
        Reply::Wire(_) => Some(Out::Close),
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut out: W,
    mut rx: mpsc::UnboundedReceiver<Out>,
    closed: CancellationToken,
) {
    while let Some(item) = rx.recv().await {
        let written = match item {
            Out::Line(mut line) => {
                line.push('\n');
                out.write_all(line.as_bytes()).await.and(out.flush().await)
            }
            Out::Stall(bytes) => {
                let _ = out.write_all(&bytes).await;
                let _ = out.flush().await;
                // Nothing more is ever written: the line never ends.
                closed.cancelled().await;
                return;
            }
            Out::Close => {
                let _ = out.shutdown().await;
                closed.cancel();
                return;
            }
        };
        if written.is_err() {
            closed.cancel();
            return;
        }
    }
}
