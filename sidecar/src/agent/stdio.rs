//! The agent over stdio (`aip-sidecar stdio`, for desktop MCP clients): one
//! JSON-RPC message per line on stdin, replies and messages for the agent on
//! stdout. Each line runs the gateway's pipeline — the same one HTTP agents
//! get — in its own task, so an ask waits without holding up what follows.
//! At most [`MAX_IN_FLIGHT`] messages, holding at most a memory budget
//! together, are handled at once: past that, stdin is not read until one
//! finishes, so a client that pipelines faster than its servers answer is
//! slowed down instead of queued without bound.
//!
//! The agent is one session. Its stream for messages about a request is
//! stdout itself, so progress, logging and relayed server requests reach it
//! while the request runs; `notifications/tools/list_changed` follows the
//! tools it may see, once it has initialized.
//!
//! Both eras share the channel, decided per message by the gate's edge
//! (gate/edge.rs) like every rule of an era: a 2026-07-28 message is
//! checked as the revision says (no headers on stdio) and served without
//! initialize; its `subscriptions/listen` streams its notifications onto
//! stdout, tagged with its id, until `notifications/cancelled` names that
//! id (at most `gate::MAX_LISTENS_PER_SESSION` at once). This file frames
//! lines and writes stdout; the gate's one entry does the rest.

use std::sync::Arc;
use std::time::Duration;

use aip_mcp::lines::{self, Line};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;

use crate::gate::{Answer, Caller, Gateway, Input, Listen, Reply, STDIO_SESSION, Transport};
use aip_service::budget::Budget;

/// Messages handled at once, at most.
pub const MAX_IN_FLIGHT: usize = 256;
/// Messages queued for stdout, at most (a reply waits for room; progress
/// and relayed requests are dropped or refused past it, as over HTTP).
const MAX_QUEUED: usize = 1024;
/// What the messages in flight may hold together (as over HTTP: each
/// reserves four times its size); past it, stdin is not read.
const IN_FLIGHT_BUDGET: usize = 32 * 1024 * 1024;
const EXPANSION: usize = 4;
/// How long calls still in flight when stdin ends may take to be answered.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves one agent on `input`/`output` until its input ends and what it
/// sent has been answered (asks it left waiting are withdrawn at once; calls
/// get [`DRAIN`] to finish).
pub async fn serve<R, W>(gateway: Arc<Gateway>, input: R, output: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (to_agent, writer) = writer(output);
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let budget = Budget::new(IN_FLIGHT_BUDGET);
    let mut handling = JoinSet::new();
    let initialized = Arc::new(watch::Sender::new(false));
    let announcing = tokio::spawn(announce_tool_changes(
        gateway.clone(),
        initialized.subscribe(),
        to_agent.clone(),
    ));
    let limit = gateway.limits().max_bytes;
    let mut input = BufReader::new(input);
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        let line = match lines::next_line(&mut input, limit).await {
            Ok(Some(Line::Complete(line))) if line.trim_ascii().is_empty() => continue,
            Ok(Some(line)) => line,
            Ok(None) | Err(_) => break,
        };
        while handling.try_join_next().is_some() {}
        let size = match &line {
            Line::Complete(bytes) => bytes.len(),
            Line::TooLong { .. } => 0, // not held: refused as it is
        };
        let reserved = budget.reserve(EXPANSION * size).await;
        let (gateway, to_agent) = (gateway.clone(), to_agent.clone());
        let initialized = initialized.clone();
        handling.spawn(async move {
            let input = match line {
                Line::Complete(bytes) => Input::Bytes(bytes.into()),
                Line::TooLong { bytes } => Input::TooLong { size: bytes },
            };
            let caller = Caller {
                transport: Transport::Stdio,
                events: Some(to_agent.clone()),
            };
            let reply = match gateway.handle(input, caller).await {
                Answer::Reply { reply, .. } => reply,
                Answer::Session { reply, .. } => {
                    let _ = to_agent.send(reply).await;
                    initialized.send_replace(true);
                    Reply::Nothing
                }
                Answer::Listen(listen) => stream(listen, &to_agent).await,
                Answer::Plain { .. } => Reply::Nothing, // HTTP's only
            };
            if let Some(reply) = reply.into_message() {
                let _ = to_agent.send(reply).await;
            }
            drop((permit, reserved));
        });
    }
    // The agent is done sending: nobody is left to decide for the asks it
    // left waiting, but the calls it made may still be answered; its
    // subscriptions end.
    gateway.withdraw(STDIO_SESSION);
    if tokio::time::timeout(DRAIN, drain(&mut handling))
        .await
        .is_err()
    {
        gateway.end_session(STDIO_SESSION);
        drain(&mut handling).await;
    }
    announcing.abort();
    drop(to_agent);
    let _ = writer.await;
}

/// A 2026-07-28 subscription on stdout: its acknowledgement, then its
/// notifications, until the agent cancels it or the gateway stops (then
/// its closing result).
async fn stream(mut listen: Box<Listen>, to_agent: &mpsc::Sender<Value>) -> Reply {
    let acknowledgement = listen.subscription.acknowledgement();
    if to_agent.send(acknowledgement).await.is_err() {
        return Reply::Nothing;
    }
    loop {
        let next = tokio::select! {
            next = listen.subscription.next() => next,
            () = listen.ended.cancelled() => return Reply::Nothing,
        };
        let Some(note) = next else {
            return Reply::Message(listen.subscription.closing());
        };
        if to_agent.send(note).await.is_err() {
            return Reply::Nothing;
        }
    }
}

async fn drain(handling: &mut JoinSet<()>) {
    while handling.join_next().await.is_some() {}
}

/// `notifications/tools/list_changed` each time the tools the agent may see
/// change, once it has initialized, and the session's notes (see
/// `Gateway::session_stream`).
async fn announce_tool_changes(
    gateway: Arc<Gateway>,
    mut initialized: watch::Receiver<bool>,
    to_agent: mpsc::Sender<Value>,
) {
    if initialized.wait_for(|done| *done).await.is_err() {
        return;
    }
    let Ok((stream, mut notes)) = gateway.session_stream(STDIO_SESSION) else {
        return;
    };
    loop {
        let note = tokio::select! {
            note = notes.next() => note,
            () = stream.ended.cancelled() => None,
        };
        let Some(note) = note else { return };
        if to_agent.send(note).await.is_err() {
            return;
        }
    }
}

/// One task owns the output, so lines never interleave; whatever is queued
/// goes out in one write. It ends once every sender is gone and every line
/// is written (or the agent stops reading).
fn writer<W: AsyncWrite + Unpin + Send + 'static>(
    mut out: W,
) -> (mpsc::Sender<Value>, tokio::task::JoinHandle<()>) {
    const BATCH: usize = 256 * 1024;
    let (tx, mut rx) = mpsc::channel::<Value>(MAX_QUEUED);
    let handle = tokio::spawn(async move {
        let mut buf = Vec::with_capacity(16 * 1024);
        while let Some(message) = rx.recv().await {
            push_line(&mut buf, &message);
            while buf.len() < BATCH {
                let Ok(more) = rx.try_recv() else { break };
                push_line(&mut buf, &more);
            }
            if out.write_all(&buf).await.and(out.flush().await).is_err() {
                return;
            }
            aip_service::busy_poll::touch(); // an answer or the next line usually follows
            buf.clear();
        }
        let _ = out.shutdown().await;
    });
    (tx, handle)
}

fn push_line(buf: &mut Vec<u8>, message: &Value) {
    if serde_json::to_writer(&mut *buf, message).is_ok() {
        buf.push(b'\n');
    }
}

/// The process's stdin and stdout: non-blocking pipes on the event loop
/// when they are pipes (the usual case), tokio's blocking-pool handles
/// otherwise (a terminal, a file).
pub fn process_stdio() -> (
    Box<dyn AsyncRead + Unpin + Send>,
    Box<dyn AsyncWrite + Unpin + Send>,
) {
    use std::os::fd::AsFd;
    let input: Box<dyn AsyncRead + Unpin + Send> = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| tokio::net::unix::pipe::Receiver::from_file(std::fs::File::from(fd)).ok())
        .map_or_else(
            || Box::new(tokio::io::stdin()) as Box<dyn AsyncRead + Unpin + Send>,
            |r| Box::new(r),
        );
    let output: Box<dyn AsyncWrite + Unpin + Send> = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| tokio::net::unix::pipe::Sender::from_file(std::fs::File::from(fd)).ok())
        .map_or_else(
            || Box::new(tokio::io::stdout()) as Box<dyn AsyncWrite + Unpin + Send>,
            |w| Box::new(w),
        );
    (input, output)
}
