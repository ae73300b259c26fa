//! `kubectl aip`: the approver's side of AIP. Lists the tool calls waiting
//! for a person and records a decision by patching an ApprovalRequest's
//! status, exactly as `kubectl patch --subresource=status` would: the
//! operator's webhooks stamp who decided and refuse whoever may not.
//! For platform teams, `grant` lets the operator read exactly the Secrets
//! one ToolConnection names; `tools` shows a connection's tools and what
//! changed in the withheld ones, and `tools accept` serves one again.

#![forbid(unsafe_code)]

mod approvals;
mod grant;
mod tools;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kubectl aip",
    bin_name = "kubectl aip",
    version,
    about = "Decide the tool calls AI agents wait on (ApprovalRequests); review and accept changed tools; grant the operator the Secrets a ToolConnection names"
)]
struct Cli {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// Namespace (default: the context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Pending ApprovalRequests: name, tool, pod, redacted arguments, age
    /// and time left; with --all also decided ones, their decision and who
    /// made it.
    Approvals {
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Decided requests too, with their decision and who made it.
        #[arg(long)]
        all: bool,
    },
    /// Approve one request: the call it holds runs once.
    Approve {
        /// The ApprovalRequest's name (as `kubectl aip approvals` lists it).
        name: String,
        /// Why, recorded in the request's status beside who decided.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Deny one request: the agent gets an error saying so.
    Deny {
        /// The ApprovalRequest's name (as `kubectl aip approvals` lists it).
        name: String,
        /// Required: the agent's operator will want to know why.
        #[arg(long)]
        reason: String,
    },
    /// A ToolConnection's tools: state, who accepted each, scan findings,
    /// and for each withheld tool a diff of the accepted definition against
    /// the listed one.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Tools {
        /// The ToolConnection.
        #[arg(required = true)]
        connection: Option<String>,
        #[command(subcommand)]
        command: Option<ToolsCommand>,
    },
    /// Let the operator read exactly the Secrets a ToolConnection names (a
    /// Role with resourceNames, bound to the operator's service account).
    Grant {
        /// The ToolConnection.
        connection: String,
        /// The operator's service account, NAMESPACE/NAME.
        #[arg(long, default_value = "aip-system/aip-operator")]
        operator: String,
    },
}

#[derive(Subcommand)]
enum ToolsCommand {
    /// Serve a withheld tool (Drifted or New, toolTrust FirstUse) as the
    /// operator listed it: recorded in the status with who accepted it.
    Accept {
        /// The ToolConnection.
        connection: String,
        /// The tool, by the name its server lists it under.
        tool: String,
        /// Accept only if the tool is still listed with this schema hash
        /// (what `kubectl aip tools` showed).
        #[arg(long)]
        schema_hash: Option<String>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", aip_errors::one_line(&e));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Arguments first: a bad one is reported without a cluster to ask.
    match &cli.command {
        Command::Deny { reason, .. } if reason.trim().is_empty() => {
            anyhow::bail!("--reason must say why the call is denied")
        }
        Command::Grant { operator, .. } => {
            grant::operator_account(operator)?;
        }
        _ => {}
    }
    let target = approvals::Target::connect(
        cli.kubeconfig.as_deref(),
        cli.context.clone(),
        cli.namespace.clone(),
    )
    .await?;
    match cli.command {
        Command::Approvals {
            all_namespaces,
            all,
        } => {
            let table = target.list(all_namespaces, all).await?;
            print!("{table}");
        }
        Command::Approve { name, reason } => {
            let said = target
                .decide(&name, approvals::Verdict::Approved, reason)
                .await?;
            println!("{said}");
        }
        Command::Tools {
            connection: Some(connection),
            command: None,
        } => print!("{}", tools::show(&target, &connection).await?),
        Command::Tools {
            command:
                Some(ToolsCommand::Accept {
                    connection,
                    tool,
                    schema_hash,
                }),
            ..
        } => println!(
            "{}",
            tools::accept(&target, &connection, &tool, schema_hash.as_deref()).await?
        ),
        Command::Tools { .. } => unreachable!("clap requires a connection or a subcommand"),
        Command::Grant {
            connection,
            operator,
        } => println!("{}", grant::grant(&target, &connection, &operator).await?),
        Command::Deny { name, reason } => {
            let said = target
                .decide(&name, approvals::Verdict::Denied, Some(reason))
                .await?;
            println!("{said}");
        }
    }
    Ok(())
}
