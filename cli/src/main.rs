//! `aip`: check, evaluate, convert and redact with AgentPolicy files, and run
//! AIP conformance vectors. Thin: parse arguments, call aip-policy, print.

#![forbid(unsafe_code)]

mod approvals;
mod cluster;
mod conformance;
mod load;
mod policy_cmds;
mod tools;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "aip", version, about = "AgentPolicy (aip.io/v1alpha1) tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Pending asks of a standalone gateway: list, approve, deny.
    #[command(subcommand)]
    Approvals(approvals::Command),
    /// Work with AgentPolicy files.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// A live MCP server's tools: pin them, or check them against pins and
    /// the poisoning scan.
    #[command(subcommand)]
    Tools(tools::Command),
    /// Run AIP conformance vector files (a file, or every *.yaml under a
    /// directory). The last line reads "N passed, M failed".
    Conformance {
        /// Vector files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Validate policy files, plain AIP documents or cluster AgentPolicy
    /// objects (with podSelector, toolConnections, approval); print every
    /// error with its field path.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Evaluate one JSON-RPC message against a policy.
    Eval {
        file: PathBuf,
        /// The JSON-RPC message, e.g.
        /// '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{}}}'
        #[arg(long)]
        request: String,
        /// For a tool that asks: the person's answer.
        #[arg(long, value_enum)]
        approval: Option<policy_cmds::ApprovalArg>,
        /// Print the verdict as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the policy as a Kubernetes AgentPolicy (version and owner become
    /// annotations).
    Convert {
        file: PathBuf,
        /// Put the object in this namespace.
        #[arg(long, short)]
        namespace: Option<String>,
    },
    /// Apply the policy's DLP patterns to a tool result (JSON) or plain text.
    Redact {
        file: PathBuf,
        /// An MCP tool result object, e.g. '{"content":[{"type":"text","text":"..."}]}'.
        #[arg(long, conflicts_with = "text", required_unless_present = "text")]
        result: Option<String>,
        /// Plain text.
        #[arg(long)]
        text: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Policy(PolicyCommand::Check { files }) => policy_cmds::check(&files),
        Command::Policy(PolicyCommand::Eval {
            file,
            request,
            approval,
            json,
        }) => policy_cmds::eval(&file, &request, approval, json),
        Command::Policy(PolicyCommand::Convert { file, namespace }) => {
            policy_cmds::convert(&file, namespace.as_deref())
        }
        Command::Policy(PolicyCommand::Redact { file, result, text }) => {
            policy_cmds::redact(&file, result.as_deref(), text.as_deref())
        }
        Command::Conformance { paths, json } => conformance::run(&paths, json),
        Command::Approvals(command) => approvals::run(command),
        Command::Tools(command) => tools::run(command),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {}", aip_errors::one_line(&e));
            ExitCode::FAILURE
        }
    }
}
