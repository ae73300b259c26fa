//! `aip tools`: a live MCP server's tools as the gateway judges them. `pin`
//! prints the pins of what the server lists now (a `toolPins:` block for a
//! ToolConnection's spec or the standalone configuration); `check` lists
//! the tools again and says, for each, whether a gateway holding those pins
//! would serve it, with the poisoning scan's findings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aip_mcp::credentials::Credentials;
use aip_mcp::{Connection, Endpoint};
use aip_policy::tools::fingerprint::is_hash;
use aip_policy::tools::{Context, Finding, Fingerprint, Pin, Pins, Scanner, Standing, Trust};
use anyhow::{Context as _, anyhow, bail};
use clap::{Args, Subcommand};
use secrecy::SecretString;
use serde_json::Value;

#[derive(Subcommand)]
pub enum Command {
    /// List a server's tools and print their pins: a `toolPins:` block to
    /// put in a ToolConnection's spec (or a standalone configuration).
    /// Scan findings are printed to stderr.
    Pin(Target),
    /// List a server's tools and compare them with pins: each tool's
    /// state (served, drifted, unpinned; missing when pinned and no longer
    /// listed) and the poisoning scan's findings. Exits 1 when a gateway
    /// holding these pins would withhold a tool.
    Check {
        #[command(flatten)]
        target: Target,
        /// The pins: a ToolConnection document (its spec.toolPins) or what
        /// `aip tools pin` printed. Without it, only the scan.
        #[arg(long)]
        pins: Option<PathBuf>,
        /// Treat a finding as `toolScan: Block` does: the tool is withheld.
        #[arg(long)]
        block_findings: bool,
        /// A tool other servers offer the same agents (repeat for several):
        /// a description that names one reaches for another server's tool.
        #[arg(long = "other-tool", value_name = "NAME")]
        other_tools: Vec<String>,
    },
}

/// Which server, and how to reach it.
#[derive(Args)]
pub struct Target {
    /// The server's Streamable HTTP endpoint, e.g. http://127.0.0.1:8080/mcp.
    #[arg(long, required_unless_present = "command", conflicts_with = "command")]
    url: Option<String>,
    /// A header to send, `NAME: VALUE` (repeat for several). Values are
    /// never printed.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// Seconds to wait for the server's answers.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// A stdio server to run instead, after `--`: PROGRAM [ARGS...].
    #[arg(last = true)]
    command: Vec<String>,
}

pub fn run(command: Command) -> anyhow::Result<bool> {
    match command {
        Command::Pin(target) => pin(&target),
        Command::Check {
            target,
            pins,
            block_findings,
            other_tools,
        } => check(&target, pins.as_deref(), block_findings, &other_tools),
    }
}

fn pin(target: &Target) -> anyhow::Result<bool> {
    let listing = list(target)?;
    let tools = &listing.listed;
    for (name, findings) in scan(&listing.shown, &[]) {
        for f in findings {
            eprintln!("warning: {name}: {}", describe(&f));
        }
    }
    println!(
        "# {} tools listed by {} (aip tools pin)",
        tools.len(),
        target.describe()
    );
    println!("toolPins:");
    for (tool, shown) in tools.iter().zip(&listing.shown) {
        if name_of(tool) != name_of(shown) {
            bail!("a tool's name carries a credential: it cannot be pinned or printed");
        }
        let seen = Fingerprint::of(tool);
        println!("  {}:", yaml_key(name_of(tool)));
        println!("    schemaHash: {}", seen.schema_hash);
        println!("    metadataHash: {}", seen.metadata_hash);
    }
    Ok(true)
}

fn check(
    target: &Target,
    pins: Option<&Path>,
    block_findings: bool,
    other_tools: &[String],
) -> anyhow::Result<bool> {
    let pins = match pins {
        Some(path) => read_pins(path)?,
        None => Pins::default(),
    };
    let listing = list(target)?;
    let tools = &listing.listed;
    let findings = scan(&listing.shown, other_tools);
    let mut withheld = 0;
    let width = listing
        .shown
        .iter()
        .map(|t| name_of(t).len())
        .max()
        .unwrap_or(0);
    for (tool, shown) in tools.iter().zip(&listing.shown) {
        let name = name_of(shown);
        let standing = pins.judge(name_of(tool), &Fingerprint::of(tool));
        let found = findings.get(name).map_or(0, Vec::len);
        let (state, why) = match &standing {
            Standing::Served if found > 0 && block_findings => {
                ("blocked", "the scan found something".to_owned())
            }
            Standing::Served => ("served", String::new()),
            Standing::Drifted(_) => ("drifted", standing.reason().unwrap_or_default()),
            Standing::Unpinned => ("unpinned", standing.reason().unwrap_or_default()),
        };
        if state != "served" {
            withheld += 1;
        }
        println!("{}", format!("{name:width$}  {state:8}  {why}").trim_end());
    }
    for name in pins.tools.keys() {
        if !tools.iter().any(|t| name_of(t) == name) {
            withheld += 1;
            println!(
                "{name:width$}  {:8}  pinned, and the server no longer lists it",
                "missing"
            );
        }
    }
    let total: usize = findings.values().map(Vec::len).sum();
    println!("{total} findings");
    for (name, list) in &findings {
        for f in list {
            println!("{name}: {}", describe(f));
        }
    }
    println!("{} tools, {withheld} withheld", tools.len());
    Ok(withheld == 0)
}

/// The server's tools, listed once (initialize, initialized, tools/list
/// with every page), through the MCP client the gateway itself uses.
fn list(target: &Target) -> anyhow::Result<Listing> {
    let endpoint = match (&target.url, target.command.is_empty()) {
        (Some(url), true) => Endpoint::Http { url: url.clone() },
        (None, false) => Endpoint::Stdio {
            command: target.command.clone(),
        },
        _ => bail!("give either --url or a command after --"),
    };
    let mut connection = Connection::new("aip-tools", endpoint);
    connection.timeout = Duration::from_secs(target.timeout.max(1));
    connection.health_deadline = connection.timeout;
    let headers: Vec<(String, SecretString)> = target
        .headers
        .iter()
        .map(|h| header(h))
        .collect::<anyhow::Result<_>>()?;
    // A value the server echoes in its tools is not printed, in any of
    // the spellings the gateway looks for; the hashes are of what the
    // server sent.
    let credentials = Credentials::new(&headers);
    connection.credentials = Ok(headers);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listed = runtime.block_on(async move {
        let upstream = aip_mcp::Upstream::new(Arc::new(connection)).map_err(|e| anyhow!(e))?;
        let listed = upstream.health_check().await;
        upstream.close().await;
        listed.map_err(|failure| {
            let detail = match &failure {
                aip_mcp::Failure::Network(why) | aip_mcp::Failure::Malformed(why) => {
                    format!(": {why}")
                }
                _ => String::new(),
            };
            anyhow!(
                "{} did not list its tools: {}{detail}",
                target.describe(),
                failure.reason()
            )
        })
    })?;
    let shown = listed.iter().map(|t| credentials.redacted(t)).collect();
    Ok(Listing { listed, shown })
}

/// A server's tools as it listed them (what the hashes are of) and as they
/// may be shown (credentials redacted: what the scan reads and names).
struct Listing {
    listed: Vec<Value>,
    shown: Vec<Value>,
}

/// `NAME: VALUE`, the value kept secret.
fn header(text: &str) -> anyhow::Result<(String, SecretString)> {
    let Some((name, value)) = text.split_once(':') else {
        bail!("--header takes NAME: VALUE; the one given has no ':'");
    };
    let name = name.trim();
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    {
        bail!("--header {name:?} is not a valid header name");
    }
    Ok((name.to_owned(), SecretString::from(value.trim().to_owned())))
}

/// The scan's findings by tool name (only tools with findings).
fn scan(tools: &[Value], other_tools: &[String]) -> BTreeMap<String, Vec<Finding>> {
    let scanner = match Scanner::builtin() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warning: the poisoning scan's rules do not compile ({e}); no scan");
            return BTreeMap::new();
        }
    };
    tools
        .iter()
        .map(|t| {
            let context = Context { other_tools };
            (name_of(t).to_owned(), scanner.scan(t, &context))
        })
        .filter(|(_, f)| !f.is_empty())
        .collect()
}

fn describe(f: &Finding) -> String {
    format!("{} ({}) at {}: {:?}", f.rule, f.class, f.field, f.excerpt)
}

fn name_of(tool: &Value) -> &str {
    tool.get("name").and_then(Value::as_str).unwrap_or_default()
}

/// A tool name as a YAML key: plain when it is a plain word, else quoted.
fn yaml_key(name: &str) -> String {
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && !name.starts_with(['-', '.']);
    if plain {
        name.to_owned()
    } else {
        serde_json::to_string(name).unwrap_or_default()
    }
}

/// Pins from a ToolConnection document (spec.toolPins) or from what
/// `aip tools pin` printed (toolPins at the top).
fn read_pins(path: &Path) -> anyhow::Result<Pins> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let doc: Value =
        serde_saphyr::from_str(&text).with_context(|| format!("{} is not YAML", path.display()))?;
    let (at, listed) = match (doc.pointer("/spec/toolPins"), doc.get("toolPins")) {
        (Some(pins), _) => ("spec.toolPins", pins),
        (None, Some(pins)) => ("toolPins", pins),
        (None, None) => bail!("{}: no toolPins (nor spec.toolPins)", path.display()),
    };
    let Some(listed) = listed.as_object() else {
        bail!("{}: {at} must map tool names to pins", path.display());
    };
    let mut tools = BTreeMap::new();
    for (name, pin) in listed {
        let hash = |field: &str| -> anyhow::Result<Option<String>> {
            match pin.get(field) {
                None => Ok(None),
                Some(Value::String(h)) if is_hash(h) => Ok(Some(h.clone())),
                Some(other) => bail!(
                    "{}: {at}.{name}.{field}: {other} is not a fingerprint: expected \"sha256:\" and 64 lower-case hex digits",
                    path.display()
                ),
            }
        };
        let Some(schema_hash) = hash("schemaHash")? else {
            bail!("{}: {at}.{name}.schemaHash is missing", path.display());
        };
        tools.insert(
            name.clone(),
            Pin {
                schema_hash,
                metadata_hash: hash("metadataHash")?,
            },
        );
    }
    Ok(Pins {
        trust: Trust::Pinned,
        tools,
    })
}

impl Target {
    fn describe(&self) -> String {
        match &self.url {
            // Without its query: a credential has no business there, and
            // is not repeated if someone put one there.
            Some(url) => url.split(['?', '#']).next().unwrap_or_default().to_owned(),
            None => self.command.join(" "),
        }
    }
}
