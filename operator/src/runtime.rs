//! Wires the operator together: arguments, the Kubernetes client, the index
//! and its feeds, the lease, the status writers, the gRPC and admin servers,
//! and a graceful stop on SIGTERM.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::admin;
use crate::certs::{Served, ServedRx};
use crate::controllers::{approval_lifecycle, connection_health, feed, policy_status, sync_report};
use crate::grpc::{self, ConfigService, Signals, TokenReviewer, tls::ServerTls};
use crate::index::Index;
use crate::lease::{self, LeaseConfig};
use crate::metrics::Metrics;
use crate::webhooks::inject;

/// The aip operator: validates AgentPolicies and ToolConnections, compiles
/// one configuration per agent pod and streams it to that pod's sidecar.
#[derive(clap::Parser, Debug)]
#[command(name = "aip-operator", version)]
pub struct Args {
    /// Where sidecars connect (gRPC over TLS).
    #[arg(long, env = "AIP_GRPC_LISTEN", default_value = "0.0.0.0:8443")]
    pub grpc_listen: SocketAddr,
    /// The most sidecars this replica serves at once; the next are refused
    /// at once (RESOURCE_EXHAUSTED) and retry through the Service until a
    /// replica with room takes them. docs/operator.md#capacity says how
    /// the default was measured and when to add replicas.
    #[arg(long, env = "AIP_MAX_SIDECARS", default_value_t = crate::grpc::DEFAULT_MAX_SIDECARS, value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u32).range(1..), |n| n as usize))]
    pub max_sidecars: usize,
    /// Health, readiness and metrics.
    #[arg(long, env = "AIP_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    pub admin_listen: SocketAddr,
    /// The admission webhooks (HTTPS, same certificate as gRPC).
    #[arg(long, env = "AIP_WEBHOOK_LISTEN", default_value = "0.0.0.0:9443")]
    pub webhook_listen: SocketAddr,
    /// The gRPC server's certificate (PEM); with --tls-key.
    #[arg(long, env = "AIP_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The gRPC server's private key (PEM), with --tls-cert.
    #[arg(long, env = "AIP_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Dev mode: serve a self-signed certificate for these names (comma
    /// separated) instead of --tls-cert, and write it to --dev-tls-out.
    #[arg(long, value_delimiter = ',', conflicts_with = "tls_cert")]
    pub dev_tls_names: Vec<String>,
    /// Where dev mode writes its certificate, for sidecars to trust.
    #[arg(long)]
    pub dev_tls_out: Option<PathBuf>,
    /// Make (once) and serve a CA-signed certificate kept in this Secret of
    /// the operator's namespace, instead of --tls-cert.
    #[arg(long, env = "AIP_TLS_SECRET", conflicts_with_all = ["tls_cert", "dev_tls_names"])]
    pub tls_secret: Option<String>,
    /// Names (DNS or IP) the --tls-secret certificate carries besides the
    /// Service's, e.g. localhost for a development cluster. Read only when
    /// the certificate is made.
    #[arg(long, value_delimiter = ',', requires = "tls_secret")]
    pub tls_extra_names: Vec<String>,
    /// How long a --tls-secret certificate (and its CA) is valid; a new CA
    /// and certificate are made two thirds into it.
    #[arg(long, default_value = "365d", value_parser = humantime::parse_duration)]
    pub tls_validity: Duration,
    /// How long the CA bundle holds both the old and the new CA before a
    /// certificate of a CA the sidecars have not been handed is served:
    /// after a --tls-secret rotation, or a --tls-cert renewal into a new CA.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub tls_overlap: Duration,
    /// With --tls-secret: write its CA into every webhook's caBundle of
    /// these MutatingWebhookConfigurations...
    #[arg(long, env = "AIP_CA_BUNDLE_MUTATING", value_delimiter = ',')]
    pub ca_bundle_mutating: Vec<String>,
    /// ...and these ValidatingWebhookConfigurations.
    #[arg(long, env = "AIP_CA_BUNDLE_VALIDATING", value_delimiter = ',')]
    pub ca_bundle_validating: Vec<String>,
    /// The CA bundle sidecars trust for the operator, with --tls-cert
    /// (default: the serving certificate itself, right when self-signed).
    /// Read again with the certificate, every 10 s.
    #[arg(long, env = "AIP_TLS_CA", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// The operator's own user name as the API server sees it (the only
    /// identity allowed to create ApprovalRequests or expire them).
    #[arg(
        long,
        env = "AIP_OPERATOR_USERNAME",
        default_value = "system:serviceaccount:aip-system:aip-operator"
    )]
    pub operator_username: String,
    /// The audience sidecar tokens must carry.
    #[arg(long, default_value = aip_proto::TOKEN_AUDIENCE)]
    pub token_audience: String,
    /// The namespace of the leader-election Lease (the operator's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "aip-system")]
    pub namespace: String,
    /// This replica's identity in the Lease (its pod name).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// This replica's pod uid: its sync report is owned by the pod, and
    /// goes with it. Without it the report is deleted when the replica
    /// stops.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// The leader-election Lease the replicas share (one writes statuses).
    #[arg(long, default_value = "aip-operator")]
    pub lease_name: String,
    /// How long a lease holder that stops renewing keeps the Lease (renewed
    /// every third of it).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
    /// How long a decided ApprovalRequest is kept (the record of who
    /// decided what) before the operator deletes it.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub approval_retention: Duration,
    /// How long a held call's ApprovalRequest waits for its sidecar to
    /// follow it again (on any replica) before it is withdrawn
    /// (`SidecarAway`); the sidecar is told to give up after twice this.
    /// Longer than a sidecar's reconnect back-off (15 s) and an operator
    /// restart.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub approval_away_bound: Duration,
    #[command(flatten)]
    pub injection: InjectionArgs,
    /// Diagnostics format on stderr.
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: aip_service::LogFormat,
}

/// Sidecar injection (`/inject`); off unless --sidecar-image is given.
#[derive(clap::Args, Debug)]
pub struct InjectionArgs {
    /// The aip-sidecar image to inject; without it `/inject` refuses pods
    /// with a message saying injection is not configured.
    #[arg(long, env = "AIP_SIDECAR_IMAGE")]
    pub sidecar_image: Option<String>,
    /// The injected sidecar's imagePullPolicy.
    #[arg(long, env = "AIP_SIDECAR_PULL_POLICY", default_value = inject::DEFAULT_PULL_POLICY)]
    pub sidecar_pull_policy: String,
    /// The operator's gRPC URL as pods reach it (default
    /// https://SERVICE.NAMESPACE.svc:8443 from --service-name and --namespace).
    #[arg(long, env = "AIP_SIDECAR_OPERATOR_URL")]
    pub sidecar_operator_url: Option<String>,
    /// The operator's Service name (for the URL above and the names in a
    /// --tls-secret certificate).
    #[arg(long, env = "AIP_SERVICE_NAME", default_value = "aip-operator")]
    pub service_name: String,
    /// The loopback port the injected sidecar serves agents on
    /// (AIP_MCP_URL in the pod's other containers points there).
    #[arg(long, default_value_t = inject::DEFAULT_PORT)]
    pub sidecar_port: u16,
    /// The port of the injected sidecar's admin routes (its connections
    /// with their upstream URLs, catalogs, health and metrics), on
    /// --sidecar-admin-address.
    #[arg(long, default_value_t = inject::DEFAULT_ADMIN_PORT)]
    pub sidecar_admin_port: u16,
    /// Where the injected sidecar's admin port listens. The default,
    /// loopback, keeps it inside the pod (kubectl port-forward still reaches
    /// it); 0.0.0.0 opens it to anything that can reach the pod's IP.
    #[arg(long, default_value_t = inject::DEFAULT_ADMIN_ADDRESS)]
    pub sidecar_admin_address: IpAddr,
    /// The port of the injected sidecar's /healthz, /readyz and /metrics
    /// (nothing else), on --sidecar-metrics-address: its probes use it, and
    /// Prometheus may scrape it (the container port aip-metrics).
    #[arg(long, default_value_t = inject::DEFAULT_METRICS_PORT)]
    pub sidecar_metrics_port: u16,
    /// Where that port listens: every IPv4 address (the pod's IP) by
    /// default, since the kubelet probes from the node; :: for IPv6 pods.
    #[arg(long, default_value_t = inject::DEFAULT_METRICS_ADDRESS)]
    pub sidecar_metrics_address: IpAddr,
    /// The user id the injected sidecar runs as (non-root).
    #[arg(long, default_value_t = inject::DEFAULT_USER)]
    pub sidecar_user: i64,
    /// The cluster's DNS servers, which locked pods may reach on port 53
    /// (comma-separated addresses). Default: the addresses of Service
    /// kube-system/kube-dns, read at start.
    #[arg(long, value_delimiter = ',')]
    pub cluster_dns: Vec<IpAddr>,
    /// The user id of a locked pod's proof of its lock (aip-lock-check).
    #[arg(long, default_value_t = crate::webhooks::lock::DEFAULT_CHECK_USER)]
    pub lock_check_user: i64,
    /// The injected sidecar's CPU request.
    #[arg(long, default_value = inject::DEFAULT_CPU_REQUEST)]
    pub sidecar_cpu_request: String,
    /// The injected sidecar's memory request.
    #[arg(long, default_value = inject::DEFAULT_MEMORY_REQUEST)]
    pub sidecar_memory_request: String,
    /// The injected sidecar's memory limit.
    #[arg(long, default_value = inject::DEFAULT_MEMORY_LIMIT)]
    pub sidecar_memory_limit: String,
}

impl InjectionArgs {
    /// Refuses ports the injected sidecar could not all bind, before any
    /// pod gets them; warns when its admin routes would leave the pod.
    fn check(&self) -> anyhow::Result<()> {
        if self.sidecar_image.is_none() {
            return Ok(());
        }
        let conflict = inject::port_conflict(
            self.sidecar_port,
            self.sidecar_admin_port,
            self.sidecar_metrics_port,
        );
        if let Some(conflict) = conflict {
            anyhow::bail!(conflict);
        }
        if !self.sidecar_admin_address.is_loopback() {
            tracing::warn!(address = %self.sidecar_admin_address, "--sidecar-admin-address is not loopback: injected sidecars' connections, upstream URLs and catalogs will be readable by anything that reaches their pod");
        }
        Ok(())
    }

    fn injection(
        &self,
        namespace: &str,
        audience: &str,
        ca_pem: &str,
    ) -> Option<crate::webhooks::inject::Injection> {
        let image = self.sidecar_image.as_ref()?;
        Some(crate::webhooks::inject::Injection {
            image: image.clone(),
            pull_policy: self.sidecar_pull_policy.clone(),
            operator_url: self
                .sidecar_operator_url
                .clone()
                .unwrap_or_else(|| format!("https://{}.{namespace}.svc:8443", self.service_name)),
            server_name: None,
            ca_pem: ca_pem.to_owned(),
            trust: None,
            port: self.sidecar_port,
            admin_port: self.sidecar_admin_port,
            admin_address: self.sidecar_admin_address,
            metrics_port: self.sidecar_metrics_port,
            metrics_address: self.sidecar_metrics_address,
            user_id: self.sidecar_user,
            lock: crate::webhooks::lock::LockSettings {
                cluster_dns: self.cluster_dns.clone(),
                check_user: self.lock_check_user,
            },
            audience: audience.to_owned(),
            cpu_request: self.sidecar_cpu_request.clone(),
            memory_request: self.sidecar_memory_request.clone(),
            memory_limit: self.sidecar_memory_limit.clone(),
        })
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    args.injection.check()?;
    let shutdown = CancellationToken::new();
    tokio::spawn(aip_service::cancel_on_signal(shutdown.clone()));
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (KUBECONFIG or in-cluster)")?;
    let served = serving(&args, &client, &shutdown).await?;
    let identity = args
        .pod_name
        .clone()
        .unwrap_or_else(|| format!("aip-operator-{}", std::process::id()));
    let metrics = Arc::new(Metrics::new());
    let index = Arc::new(Mutex::new(Index::loading()));
    let (policies_tx, policies_rx) = mpsc::unbounded_channel();
    let (connections_tx, connections_rx) = mpsc::unbounded_channel();
    let (pods_gone_tx, pods_gone_rx) = mpsc::unbounded_channel();
    let (evidence_tx, evidence_rx) = mpsc::unbounded_channel();
    let (leader_tx, leader) = watch::channel(false);
    let acked = Arc::new(tokio::sync::Notify::new());

    let grpc_listener = tokio::net::TcpListener::bind(args.grpc_listen)
        .await
        .with_context(|| format!("binding the gRPC address {}", args.grpc_listen))?;
    let admin_listener = tokio::net::TcpListener::bind(args.admin_listen)
        .await
        .with_context(|| format!("binding the admin address {}", args.admin_listen))?;
    let webhook_listener = tokio::net::TcpListener::bind(args.webhook_listen)
        .await
        .with_context(|| format!("binding the webhook address {}", args.webhook_listen))?;
    tracing::info!(grpc = %grpc_listener.local_addr()?, admin = %admin_listener.local_addr()?, webhooks = %webhook_listener.local_addr()?, identity = %identity, "aip-operator starting");
    let webhooks = Arc::new(crate::webhooks::Webhooks {
        index: Some(index.clone()),
        client: client.clone(),
        metrics: metrics.clone(),
        operator: args.operator_username.clone(),
        injection: match args
            .injection
            .injection(&args.namespace, &args.token_audience, "")
        {
            Some(mut injection) => {
                if injection.lock.cluster_dns.is_empty() {
                    injection.lock.cluster_dns = crate::webhooks::lock::cluster_dns(&client).await;
                }
                Some(injection.following(served.clone()))
            }
            None => None,
        },
    });
    let webhook_tls = crate::certs::server_config(&served, &[])?;

    let (ready_tx, ready) = watch::channel(false);
    let admin = Arc::new(admin::Admin {
        metrics: metrics.clone(),
        ready,
    });
    let service = ConfigService::new(
        index.clone(),
        TokenReviewer::new(client.clone(), &args.token_audience),
        Signals {
            policies: policies_tx.clone(),
            evidence: evidence_tx,
            acked: acked.clone(),
        },
        metrics.clone(),
        shutdown.clone(),
    );
    let recorder = crate::events::recorder(client.clone(), &identity);
    let service = service
        .with_approvals(
            client.clone(),
            recorder.clone(),
            &identity,
            args.approval_away_bound,
        )
        .with_max_sidecars(args.max_sidecars);
    let health_ctx = Arc::new(crate::controllers::Context {
        client: client.clone(),
        index: index.clone(),
        leader: leader.clone(),
        recorder: recorder.clone(),
        metrics: metrics.clone(),
        operator: args.operator_username.clone(),
    });
    let status_ctx = Arc::new(crate::controllers::Context {
        client: client.clone(),
        index: index.clone(),
        leader: leader.clone(),
        recorder,
        metrics: metrics.clone(),
        operator: args.operator_username.clone(),
    });
    let lease_config = LeaseConfig {
        namespace: args.namespace.clone(),
        name: args.lease_name.clone(),
        identity: identity.clone(),
        duration: args.lease_duration,
        renew_every: args.lease_duration / 3,
    };
    let touched = feed::Touched {
        policies: policies_tx,
        connections: connections_tx,
        pods_gone: pods_gone_tx,
    };
    if args.tls_secret.is_some() {
        tokio::spawn(crate::certs::keep_ca_bundles(
            client.clone(),
            served.clone(),
            args.ca_bundle_mutating.clone(),
            args.ca_bundle_validating.clone(),
            shutdown.clone(),
        ));
    }
    let lease_task = tokio::spawn(lease::run(
        client.clone(),
        lease_config,
        leader_tx,
        shutdown.clone(),
    ));
    let owner = args.pod_name.as_deref().zip(args.pod_uid.as_deref());
    let report_task = tokio::spawn(sync_report::run(
        sync_report::Publisher::new(client.clone(), &args.namespace, &identity, owner),
        index.clone(),
        acked,
        shutdown.clone(),
    ));
    let peers = feed::peers::run(
        client.clone(),
        &args.namespace,
        &identity,
        index.clone(),
        touched.clone(),
    );
    tokio::select! {
        r = grpc::serve(grpc_listener, served, service) => r.context("the gRPC server")?,
        () = until(feed::run(client.clone(), index.clone(), touched, ready_tx), shutdown.clone()) => {}
        () = until(peers, shutdown.clone()) => {}
        () = until(approval_lifecycle::run(status_ctx.clone(), approval_lifecycle::Settings { retention: args.approval_retention, away_bound: args.approval_away_bound, namespace: args.namespace.clone() }, pods_gone_rx), shutdown.clone()) => {}
        () = until(crate::controllers::egress_status::run(status_ctx.clone()), shutdown.clone()) => {}
        () = until(crate::controllers::lock_proofs::run(status_ctx.clone()), shutdown.clone()) => {}
        () = until(policy_status::run(status_ctx, policies_rx), shutdown.clone()) => {}
        () = admin::serve(admin, admin_listener, shutdown.clone()) => {}
        () = crate::webhooks::serve(webhooks, webhook_listener, webhook_tls, shutdown.clone()) => {}
        () = connection_health::run(health_ctx, connections_rx, evidence_rx, shutdown.clone()) => {}
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), report_task).await;
    tracing::info!("aip-operator stopped");
    Ok(())
}

/// Runs `f` until `shutdown`.
async fn until<F: Future<Output = ()>>(f: F, shutdown: CancellationToken) {
    tokio::select! {
        () = f => {}
        () = shutdown.cancelled() => {}
    }
}

/// The serving certificate and the CA bundle sidecars are to trust, as
/// they change.
async fn serving(
    args: &Args,
    client: &kube::Client,
    shutdown: &CancellationToken,
) -> anyhow::Result<ServedRx> {
    let lifetimes = crate::certs::Lifetimes {
        validity: args.tls_validity,
        overlap: args.tls_overlap,
    };
    if let Some(secret) = &args.tls_secret {
        lifetimes.check()?;
        let service = format!("{}.{}", args.injection.service_name, args.namespace);
        let mut names = vec![
            args.injection.service_name.clone(),
            service.clone(),
            format!("{service}.svc"),
            format!("{service}.svc.cluster.local"),
        ];
        names.extend(args.tls_extra_names.iter().cloned());
        return crate::certs::made::start(
            client.clone(),
            args.namespace.clone(),
            secret.clone(),
            names,
            lifetimes,
            shutdown.clone(),
        )
        .await;
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let files = crate::certs::files::Files {
            cert: cert.clone(),
            key: key.clone(),
            ca: args.tls_ca.clone(),
        };
        return crate::certs::files::start(files, args.tls_overlap, shutdown.clone());
    }
    let tls = server_tls(args)?;
    let bundle = tls.cert_pem.clone();
    Served::fixed(tls, bundle)
}

/// Dev mode's self-signed certificate.
fn server_tls(args: &Args) -> anyhow::Result<ServerTls> {
    if args.dev_tls_names.is_empty() {
        anyhow::bail!(
            "give --tls-secret NAME, or --tls-cert and --tls-key, or --dev-tls-names for a self-signed dev certificate"
        );
    }
    let tls = ServerTls::self_signed(&args.dev_tls_names)?;
    if let Some(out) = &args.dev_tls_out {
        std::fs::write(out, &tls.cert_pem)
            .with_context(|| format!("writing the dev certificate to {}", out.display()))?;
    }
    tracing::warn!(names = %args.dev_tls_names.join(","), "dev mode: serving a self-signed certificate");
    Ok(tls)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser as _;

    use super::*;

    fn parse(flags: &[&str]) -> Args {
        Args::try_parse_from(
            [&["aip-operator", "--sidecar-image", "aip-sidecar:t"], flags].concat(),
        )
        .unwrap()
    }

    #[test]
    fn the_injection_flags_default_to_a_loopback_admin_port() {
        let args = parse(&[]);
        let got = args.injection.injection("aip-system", "aud", "CA").unwrap();
        let want = inject::Injection::new("aip-sidecar:t", "https://x", "CA");
        assert_eq!(
            (
                got.admin_address,
                got.admin_port,
                got.metrics_address,
                got.metrics_port
            ),
            (
                want.admin_address,
                want.admin_port,
                want.metrics_address,
                want.metrics_port
            )
        );
        assert_eq!(got.admin_address.to_string(), "127.0.0.1");
        assert!(args.injection.check().is_ok());
    }

    #[test]
    fn the_injection_flags_set_each_listener() {
        let args = parse(&[
            "--sidecar-admin-address",
            "0.0.0.0",
            "--sidecar-admin-port",
            "9001",
            "--sidecar-metrics-address",
            "::",
            "--sidecar-metrics-port",
            "9002",
        ]);
        let got = args.injection.injection("aip-system", "aud", "CA").unwrap();
        assert_eq!(
            SocketAddr::new(got.admin_address, got.admin_port).to_string(),
            "0.0.0.0:9001"
        );
        assert_eq!(
            SocketAddr::new(got.metrics_address, got.metrics_port).to_string(),
            "[::]:9002"
        );
        let err = Args::try_parse_from(["aip-operator", "--sidecar-metrics-address", "pod-ip"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--sidecar-metrics-address"), "{err}");
    }

    #[test]
    fn listeners_on_one_port_stop_the_operator_before_it_starts() {
        let args = parse(&["--sidecar-metrics-port", "15001"]);
        let err = args.injection.check().unwrap_err().to_string();
        assert_eq!(
            err,
            "--sidecar-metrics-port 15001 is also --sidecar-port: the injected sidecar needs a port of its own for each listener"
        );
        // Without injection the sidecar flags are not used.
        let mut off = parse(&["--sidecar-metrics-port", "15001"]);
        off.injection.sidecar_image = None;
        assert!(off.injection.check().is_ok());
    }
}
