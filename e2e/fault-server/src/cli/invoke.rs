//! One invocation of a mocked executable, top to bottom: choose the step
//! and record it (under the session lock, before any delay), then play it —
//! delay, stdout, stderr, exit code — unless a signal or the deadline comes
//! first, and record how it ended.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::cli::attempt::{CliAttempt, CliOutcome};
use crate::cli::document::{CliScript, CliStep};
use crate::cli::session::Session;

/// Exit code of an invocation that fails closed (unmatched arguments, an
/// exhausted sequence, an unreadable session): nothing real was run. The
/// same code `env` and `timeout` use when they cannot run the command.
pub const EXIT_FAIL_CLOSED: u8 = 125;
/// Exit code when SIGTERM or SIGINT ends a step before it completes.
pub const EXIT_CANCELED: u8 = 130;
/// Exit code when the deadline passes before a step completes (as `timeout`).
pub const EXIT_DEADLINE: u8 = 124;

#[derive(Debug, Clone)]
pub struct Invocation {
    /// The shim directory (the session).
    pub session: PathBuf,
    pub executable: String,
    /// The arguments after the name.
    pub argv: Vec<String>,
}

/// Plays one invocation; returns the process exit code.
pub async fn run(invocation: Invocation, started: Instant) -> u8 {
    // Handlers first: from here on a SIGTERM is an event to record, not the
    // default death.
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return fail_closed(&invocation.executable, "cannot install signal handlers");
    };
    let name = invocation.executable.clone();
    let (session, script) = match open(&invocation) {
        Ok(opened) => opened,
        Err(message) => return fail_closed(&name, &message),
    };
    let base = CliAttempt::new(
        &session.info.session,
        &name,
        &invocation.argv,
        session.info.log_args,
    );
    let session_deadline = session.info.deadline_ms;
    let selected = session.transact(|state| {
        choose_step(&script, state, &invocation, base, session_deadline, started)
    });
    let (step, mut line) = match selected {
        Err(e) => return fail_closed(&name, &format!("cannot record the attempt: {e}")),
        Ok(Selected::Refused(message)) => return fail_closed(&name, &message),
        Ok(Selected::Step(chosen)) => *chosen,
    };
    let deadline_ms = line.deadline_ms;
    let deadline = deadline_ms.map(|ms| started + Duration::from_millis(ms));
    let ending = tokio::select! {
        // A signal that arrived while the step was being chosen is already
        // pending here, and wins over a step that would complete at once.
        biased;
        _ = term.recv() => Ending::Canceled("SIGTERM"),
        _ = int.recv() => Ending::Canceled("SIGINT"),
        () = aip_service::time::sleep_until(deadline) => Ending::Deadline,
        () = play(&step) => Ending::Completed,
    };
    let exit_code = match ending {
        Ending::Completed => step.exit_code,
        Ending::Canceled(signal) => {
            line.signal = Some(signal);
            EXIT_CANCELED
        }
        Ending::Deadline => EXIT_DEADLINE,
    };
    line.outcome = match ending {
        Ending::Completed => CliOutcome::Completed,
        Ending::Canceled(_) => CliOutcome::Canceled,
        Ending::Deadline => CliOutcome::Deadline,
    };
    line.exit_code = Some(exit_code);
    line.latency_ms = elapsed_ms(started);
    if let Err(e) = session.transact(|_| ((), line)) {
        // The step's outcome stands; only its ending is missing from the log,
        // which then reads as a process that never finished.
        eprintln!("aip-fault-server: {name}: cannot record the attempt's end: {e}");
    }
    if ending == Ending::Deadline {
        eprintln!(
            "aip-fault-server: {name}: deadline of {} ms passed",
            deadline_ms.unwrap_or_default()
        );
    }
    exit_code
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Completed,
    Canceled(&'static str),
    Deadline,
}

enum Selected {
    /// Consumed and recorded as started; the line is the template for its end.
    Step(Box<(CliStep, CliAttempt)>),
    /// Recorded as unmatched, exhausted or unknown; the message says which.
    Refused(String),
}

fn open(invocation: &Invocation) -> Result<(Session, CliScript), String> {
    let session = Session::open(&invocation.session)
        .map_err(|e| format!("cannot read the mock session: {e}"))?;
    let text = session
        .read_document()
        .map_err(|e| format!("cannot read the mock session: {e}"))?;
    let script = CliScript::from_yaml(&text).map_err(|e| {
        format!(
            "the session's document is invalid: {}: {e}",
            session.paths.document().display()
        )
    })?;
    Ok((session, script))
}

/// Under the lock: the first matching response's next step, consumed.
fn choose_step(
    script: &CliScript,
    state: &mut crate::cli::session::State,
    invocation: &Invocation,
    mut line: CliAttempt,
    session_deadline: Option<u64>,
    started: Instant,
) -> (Selected, CliAttempt) {
    state.attempts += 1;
    line.attempt = state.attempts;
    let name = &invocation.executable;
    let refuse = |mut line: CliAttempt, outcome, message: String| {
        line.outcome = outcome;
        line.exit_code = Some(EXIT_FAIL_CLOSED);
        line.latency_ms = elapsed_ms(started);
        (Selected::Refused(message), line)
    };
    let Some(executable) = script.executable(name) else {
        let message = "is not declared by this mock session".to_owned();
        return refuse(line, CliOutcome::UnknownExecutable, message);
    };
    let Some(r) = (executable.responses.iter()).position(|r| r.matcher.matches(&invocation.argv))
    else {
        let message = "no scripted response matches these arguments".to_owned();
        return refuse(line, CliOutcome::Unmatched, message);
    };
    let steps = &executable.responses[r].steps;
    line.response_index = Some(r);
    line.steps_total = Some(steps.len());
    let cursors = state.cursors.entry(name.clone()).or_default();
    if cursors.len() < executable.responses.len() {
        cursors.resize(executable.responses.len(), 0);
    }
    let index = cursors[r];
    let Some(step) = steps.get(index) else {
        let message = format!(
            "scripted sequence exhausted (response {r}, {} steps)",
            steps.len()
        );
        return refuse(line, CliOutcome::Exhausted, message);
    };
    cursors[r] += 1; // consumed now, whatever happens next
    line.step_index = Some(index);
    line.delay_ms = step.delay_ms;
    line.deadline_ms = [session_deadline, step.deadline_ms]
        .into_iter()
        .flatten()
        .min();
    line.latency_ms = elapsed_ms(started);
    (Selected::Step(Box::new((step.clone(), line.clone()))), line)
}

/// The step itself: the delay, then stdout, then stderr. A reader that stops
/// draining leaves the output partial; the step still counts as played.
async fn play(step: &CliStep) {
    if step.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(step.delay_ms)).await;
    }
    write_all(tokio::io::stdout(), &step.stdout).await;
    write_all(tokio::io::stderr(), &step.stderr).await;
}

async fn write_all(mut out: impl tokio::io::AsyncWrite + Unpin, text: &str) {
    if text.is_empty() {
        return;
    }
    // A closed pipe is the reader's choice; the outcome stands.
    let _ = out.write_all(text.as_bytes()).await;
    let _ = out.flush().await;
}

fn fail_closed(name: &str, message: &str) -> u8 {
    eprintln!("aip-fault-server: {name}: {message}; fails closed, nothing real was run");
    EXIT_FAIL_CLOSED
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
