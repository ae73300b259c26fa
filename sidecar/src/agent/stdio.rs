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
//! Both eras share the channel, decided per message: one whose `_meta`
//! names a protocol version is a 2026-07-28 message, checked as the
//! revision says (no headers on stdio) and served without initialize; its
//! `subscriptions/listen` streams its notifications onto stdout, tagged
//! with its id, until `notifications/cancelled` names that id (at most
//! [`MAX_LISTENS`] at once).

use std::sync::Arc;
use std::time::Duration;

use aip_mcp::jsonrpc::{Message, Refusal, Refused};
use aip_mcp::lines::{self, Line};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::gate::{Caller, Era, Gateway, Reply};
use aip_service::budget::Budget;

/// The agent's session name at the gateway.
pub const SESSION: &str = "stdio";
/// Messages handled at once, at most.
pub const MAX_IN_FLIGHT: usize = 256;
/// Messages queued for stdout, at most (a reply waits for room; progress
/// and relayed requests are dropped or refused past it, as over HTTP).
const MAX_QUEUED: usize = 1024;
/// What the messages in flight may hold together (as over HTTP: each
/// reserves four times its size); past it, stdin is not read.
const IN_FLIGHT_BUDGET: usize = 32 * 1024 * 1024;
const EXPANSION: usize = 4;
/// Modern subscriptions open at once, at most.
pub const MAX_LISTENS: usize = 16;

/// The agent's open modern subscriptions: the listen request's id (as JSON
/// text) -> what ends it.
type Listens = Arc<std::sync::Mutex<std::collections::HashMap<String, CancellationToken>>>;
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
    let caller = Caller {
        session: SESSION.to_owned(),
        events: Some(to_agent.clone()),
        era: Era::Legacy,
    };
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
    let listens = Listens::default();
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
        let (gateway, caller, to_agent) = (gateway.clone(), caller.clone(), to_agent.clone());
        let initialized = initialized.clone();
        let listens = listens.clone();
        handling.spawn(async move {
            let reply = match line.parse(&gateway) {
                Ok(message) if Era::of(&message.value) == Era::Modern => {
                    modern(&gateway, message, &to_agent, &listens).await
                }
                Ok(message) => {
                    let initializes = message.method() == Some("initialize");
                    let reply = gateway.handle_message(message, &caller).await;
                    if initializes
                        && matches!(&reply, Reply::Message(r) if r.get("result").is_some())
                    {
                        initialized.send_replace(true);
                    }
                    reply
                }
                Err(refused) => gateway.refuse(&refused),
            };
            if let Reply::Message(reply) = reply {
                let _ = to_agent.send(reply).await;
            }
            drop((permit, reserved));
        });
    }
    // The agent is done sending: nobody is left to decide for the asks it
    // left waiting, but the calls it made may still be answered; its
    // subscriptions end.
    gateway.withdraw_asks(SESSION);
    for (_, listen) in aip_service::sync::lock(&listens).drain() {
        listen.cancel();
    }
    if tokio::time::timeout(DRAIN, drain(&mut handling))
        .await
        .is_err()
    {
        gateway.end_session(SESSION);
        drain(&mut handling).await;
    }
    announcing.abort();
    drop((caller, to_agent));
    let _ = writer.await;
}

/// A line as the gateway parses it; one over the size limit is refused as
/// parse would, without having been held whole.
trait Parse {
    fn parse(self, gateway: &Gateway) -> Result<Message, Refused>;
}

impl Parse for Line {
    fn parse(self, gateway: &Gateway) -> Result<Message, Refused> {
        match self {
            Line::Complete(bytes) => gateway.parse(&bytes),
            Line::TooLong { bytes } => Err(Refused {
                refusal: Refusal::TooLarge {
                    size: bytes,
                    limit: gateway.limits().max_bytes,
                },
                id: None,
            }),
        }
    }
}

/// A 2026-07-28 message on the channel: checked as the revision says,
/// then served (a listen opens its stream; a cancellation naming one ends
/// it).
async fn modern(
    gateway: &Arc<Gateway>,
    message: Message,
    to_agent: &mpsc::Sender<Value>,
    listens: &Listens,
) -> Reply {
    if let Err(invalid) = aip_mcp::modern::check_request(&message.value, None) {
        let response = invalid.response(message.id());
        let reason = response["error"]["message"].as_str().unwrap_or_default();
        gateway.record_refusal(reason, message.id());
        return match message.id() {
            Some(_) => Reply::Message(response),
            None => Reply::Nothing,
        };
    }
    let cancelled = (message.method() == Some("notifications/cancelled"))
        .then(|| message.params().and_then(|p| p.get("requestId")))
        .flatten()
        .and_then(|id| aip_service::sync::lock(listens).remove(&id.to_string()));
    if let Some(listen) = cancelled {
        listen.cancel();
        return Reply::Nothing;
    }
    if message.method() == Some("subscriptions/listen") && message.id().is_some() {
        return listen(gateway, &message, to_agent, listens).await;
    }
    let caller = Caller {
        session: SESSION.to_owned(),
        events: Some(to_agent.clone()),
        era: Era::Modern,
    };
    gateway.handle_message(message, &caller).await
}

/// A modern `subscriptions/listen`: its acknowledgement, then its
/// notifications, until the agent cancels it or the gateway stops (then
/// its closing result).
async fn listen(
    gateway: &Arc<Gateway>,
    message: &Message,
    to_agent: &mpsc::Sender<Value>,
    listens: &Listens,
) -> Reply {
    let key = message.id().map(Value::to_string).unwrap_or_default();
    let ended = CancellationToken::new();
    {
        let mut open = aip_service::sync::lock(listens);
        if open.len() >= MAX_LISTENS || open.contains_key(&key) {
            let why = format!("at most {MAX_LISTENS} subscriptions at once, each under its own id");
            let busy = json!({"jsonrpc": "2.0", "id": message.id(),
                "error": {"code": aip_policy::codes::INTERNAL_ERROR, "message": why}});
            return Reply::Message(busy);
        }
        open.insert(key.clone(), ended.clone());
    }
    let mut subscription = match gateway.listen(message).await {
        Ok(s) => s,
        Err(refused) => {
            aip_service::sync::lock(listens).remove(&key);
            return refused;
        }
    };
    if to_agent.send(subscription.acknowledgement()).await.is_err() {
        return Reply::Nothing;
    }
    loop {
        let next = tokio::select! {
            next = subscription.next() => next,
            () = ended.cancelled() => return Reply::Nothing,
        };
        let Some(note) = next else {
            aip_service::sync::lock(listens).remove(&key);
            return Reply::Message(subscription.closing());
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
/// `Gateway::session_notes`).
async fn announce_tool_changes(
    gateway: Arc<Gateway>,
    mut initialized: watch::Receiver<bool>,
    to_agent: mpsc::Sender<Value>,
) {
    if initialized.wait_for(|done| *done).await.is_err() {
        return;
    }
    let mut notes = gateway.session_notes(SESSION);
    while let Some(note) = notes.next().await {
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
