//! Diagnostics on stderr (text, or JSON for log pipelines; never ANSI
//! colours in a pipe), trace spans over OTLP when asked, and a shutdown
//! token cancelled by SIGTERM or SIGINT.

use tokio_util::sync::CancellationToken;

/// How diagnostics are written to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Spans for distributed tracing use this target: they are exported over
/// OTLP when an endpoint is configured and never reach the diagnostics on
/// stderr, so without an endpoint they cost next to nothing.
pub const TRACE_TARGET: &str = "aip::trace";

/// A line a person or a script waits for at start-up (where a process
/// listens), on stderr whatever `RUST_LOG` says: the text as it is, or under
/// the JSON format one object shaped as the diagnostics' own lines
/// (`timestamp`, `level`, `fields.message`, `target`), so that every line a
/// process prints parses as JSON.
pub fn announce(format: LogFormat, target: &str, text: &str) {
    print_line(format, "INFO", target, text);
}

/// A line printed outside the diagnostics (before they start, or after a
/// fatal error: `error: ...`), in `format`, at `level`.
pub fn print_line(format: LogFormat, level: &str, target: &str, text: &str) {
    use std::io::Write;
    let line = match format {
        LogFormat::Text => text.to_owned(),
        LogFormat::Json => serde_json::json!({
            "timestamp": humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
            "level": level,
            "fields": {"message": text},
            "target": target,
        })
        .to_string(),
    };
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Installs the global tracing subscriber. `RUST_LOG` overrides
/// `default_level`.
pub fn init_tracing(format: LogFormat, default_level: &str) {
    // Without an endpoint nothing can fail.
    let _ = init_telemetry(format, default_level, None, "aip");
}

/// What must happen before the process exits: spans still queued for
/// export are flushed.
#[must_use = "call shutdown() before exiting, or queued spans are lost"]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the span exporter (if any).
    pub fn shutdown(&self) {
        if let Some(provider) = &self.provider
            && let Err(e) = provider.shutdown()
        {
            tracing::warn!(error = %e, "spans could not be flushed");
        }
    }
}

/// Installs the global tracing subscriber: diagnostics on stderr
/// (`RUST_LOG` overrides `default_level`), and with `otlp_endpoint` (a gRPC
/// URL such as `http://collector:4317`) the `TRACE_TARGET` spans exported
/// over OTLP as `service`. With an endpoint it must run inside a Tokio
/// runtime (the exporter's gRPC client lives there).
pub fn init_telemetry(
    format: LogFormat,
    default_level: &str,
    otlp_endpoint: Option<&str>,
    service: &str,
) -> Result<Telemetry, String> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let directives = std::env::var("RUST_LOG").unwrap_or_else(|_| default_level.to_owned());
    let filter = tracing_subscriber::EnvFilter::new(format!("{directives},{TRACE_TARGET}=off"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().boxed(),
    }
    .with_filter(filter);
    let Some(endpoint) = otlp_endpoint else {
        let _ = tracing_subscriber::registry().with(fmt).try_init();
        return Ok(Telemetry { provider: None });
    };
    let provider = otlp_provider(endpoint, service)?;
    let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "aip");
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(TRACE_TARGET, tracing::Level::INFO),
        );
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(spans)
        .try_init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

fn otlp_provider(
    endpoint: &str,
    service: &str,
) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, String> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("OTLP endpoint {endpoint}: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service.to_owned())
        .build();
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Makes `span` a child of the caller's span that `traceparent` (and
/// `tracestate`) name, W3C trace context as MCP carries it in `_meta`; an
/// invalid traceparent is ignored (the span starts a trace of its own).
pub fn join_remote_trace(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let mut fields =
        std::collections::HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    if let Some(state) = tracestate {
        fields.insert("tracestate".to_owned(), state.to_owned());
    }
    let remote = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&fields);
    if remote.span().span_context().is_remote() {
        // Refused only for a span already started, which this is not.
        let _ = span.set_parent(remote);
    }
}

/// `span`'s W3C trace context (`traceparent`, and `tracestate` when there
/// is one) for the next hop, sorted by name; empty when the span is not
/// exported (no OTLP endpoint), so that nothing is passed on in its name.
pub fn trace_context_of(span: &tracing::Span) -> Vec<(String, String)> {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut fields = std::collections::HashMap::new();
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&context, &mut fields);
    let mut fields: Vec<(String, String)> = fields.into_iter().collect();
    fields.sort();
    fields
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT.
pub async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; SIGTERM will end the process abruptly");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("signal received, shutting down");
    shutdown.cancel();
}
