//! The lock's rules in real network namespaces, programmed the way the
//! plugin programs a pod (`NodeTools`: nsenter and the node's
//! iptables-restore): a "pod" namespace and a "server" namespace joined by
//! a veth pair, both made here (by `unshare --net` holders that exit when
//! this process does), with IPv4 and IPv6 addresses of their own. Probes
//! run on threads that enter the pod's namespace and take a user id, as a
//! container's processes do. Nothing is sent anywhere but between these
//! two namespaces.
//!
//! Needs root (namespaces, iptables): `make test` runs as root.

#![allow(clippy::unwrap_used)]

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aip_api::egress_lock::{Destination, Lock, Protocol};
use aip_cni::netns::{NodeTools, inside};
use aip_cni::plugin::Program;

const SIDECAR: u32 = 7301;
const AGENT: u32 = 7401;
const POD_V4: &str = "10.250.0.1";
const SERVER_V4: &str = "10.250.0.2";
const POD_V6: &str = "fd00:250::1";
const SERVER_V6: &str = "fd00:250::2";
/// A refusal must come at once, not after a timeout.
const AT_ONCE: Duration = Duration::from_secs(1);

/// A network namespace held open by `unshare --net cat`, which exits when
/// its stdin (this process) goes away.
struct Namespace {
    holder: Child,
}

impl Namespace {
    fn new() -> Namespace {
        // It says so once it is in its namespace, then becomes `cat`.
        let mut holder = Command::new("unshare")
            .args(["--net", "sh", "-c", "echo ready; exec cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux)");
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
            &mut ready,
        )
        .unwrap();
        assert_eq!(ready.trim(), "ready", "unshare did not start");
        Namespace { holder }
    }

    fn path(&self) -> String {
        format!("/proc/{}/ns/net", self.holder.id())
    }

    fn ip(&self, args: &[&str]) {
        inside(&self.path(), "ip", args, None).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    }

    /// Runs `f` on a thread inside this namespace, as `uid` when given.
    fn run<T: Send + 'static>(
        &self,
        uid: Option<u32>,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let file = std::fs::File::open(self.path()).unwrap();
        std::thread::spawn(move || {
            rustix::thread::move_into_link_name_space(
                file.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            if let Some(uid) = uid {
                // This thread only: the socket it opens is owned by `uid`.
                rustix::thread::set_thread_gid(rustix::process::Gid::from_raw(uid)).unwrap();
                rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(uid)).unwrap();
            }
            f()
        })
        .join()
        .unwrap()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// The pod's and the server's namespaces, joined, with servers listening:
/// TCP 8080, 9000 and 53, UDP 8081 and 53 (echo), on both families.
struct Net {
    pod: Namespace,
    _server: Namespace,
}

fn net() -> Net {
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests make network namespaces and iptables rules: run them as root (make test does)"
    );
    let pod = Namespace::new();
    let server = Namespace::new();
    let peer = format!("/proc/{}/ns/net", server.holder.id());
    // Made inside the pod's namespace, its peer straight in the server's:
    // neither end ever exists in the machine's own namespace.
    inside(
        &pod.path(),
        "ip",
        &[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &peer,
        ],
        None,
    )
    .or_else(|_| {
        // iproute2 takes a namespace by pid on older versions.
        let pid = server.holder.id().to_string();
        inside(
            &pod.path(),
            "ip",
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &pid,
            ],
            None,
        )
    })
    .unwrap();
    for (ns, v4, v6) in [(&pod, POD_V4, POD_V6), (&server, SERVER_V4, SERVER_V6)] {
        ns.ip(&["link", "set", "lo", "up"]);
        ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", "eth0"]);
        ns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{v6}/64"),
            "dev",
            "eth0",
            "nodad",
        ]);
        ns.ip(&["link", "set", "eth0", "up"]);
    }
    server.run(None, || {
        for address in [SERVER_V4, SERVER_V6] {
            let ip: IpAddr = address.parse().unwrap();
            for port in [8080, 9000, 53] {
                let listener = TcpListener::bind(SocketAddr::new(ip, port)).unwrap();
                std::thread::spawn(move || {
                    for stream in listener.incoming().flatten() {
                        let mut stream = stream;
                        let _ = stream.write_all(b"hello");
                    }
                });
            }
            for port in [8081, 53] {
                let socket = UdpSocket::bind(SocketAddr::new(ip, port)).unwrap();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok((n, from)) = socket.recv_from(&mut buf) {
                        let _ = socket.send_to(&buf[..n], from);
                    }
                });
            }
        }
    });
    Net {
        pod,
        _server: server,
    }
}

fn lock() -> Lock {
    Lock {
        sidecar_uid: SIDECAR,
        dns: vec![SERVER_V4.parse().unwrap(), SERVER_V6.parse().unwrap()],
        allow: vec![Destination {
            cidr: format!("{SERVER_V6}/128"),
            protocol: Protocol::Tcp,
            port: Some(9000),
            end_port: None,
        }],
    }
}

#[derive(Debug, PartialEq)]
enum Seen {
    Reached,
    Refused,
    Other(String),
}

/// A TCP connection to `address:port` from the pod as `uid`.
fn tcp(net: &Net, uid: u32, address: &str, port: u16) -> (Seen, Duration) {
    let to = SocketAddr::new(address.parse().unwrap(), port);
    net.pod.run(Some(uid), move || {
        let started = Instant::now();
        let seen = match TcpStream::connect_timeout(&to, Duration::from_secs(3)) {
            Ok(mut stream) => {
                let mut hello = [0u8; 5];
                stream
                    .set_read_timeout(Some(Duration::from_secs(3)))
                    .unwrap();
                match stream.read_exact(&mut hello) {
                    Ok(()) if &hello == b"hello" => Seen::Reached,
                    other => Seen::Other(format!("{other:?}")),
                }
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => Seen::Refused,
            Err(e) => Seen::Other(e.to_string()),
        };
        (seen, started.elapsed())
    })
}

/// A connected UDP socket's exchange with `address:port` from the pod as
/// `uid`.
fn udp(net: &Net, uid: u32, address: &str, port: u16) -> (Seen, Duration) {
    let to = SocketAddr::new(address.parse().unwrap(), port);
    net.pod.run(Some(uid), move || {
        let started = Instant::now();
        let any: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }
            .parse()
            .unwrap();
        let socket = UdpSocket::bind(any).unwrap();
        socket.connect(to).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let sent = socket.send(b"ping");
        let mut buf = [0u8; 16];
        let got = socket.recv(&mut buf);
        // A refused datagram: the send fails at once (EPERM, the verdict
        // on the packet) and the socket then reads the ICMP refusal.
        let seen = match (sent, got) {
            (Ok(4), Ok(4)) => Seen::Reached,
            (Ok(_) | Err(_), Err(e)) if e.kind() == ErrorKind::ConnectionRefused => Seen::Refused,
            other => Seen::Other(format!("{other:?}")),
        };
        (seen, started.elapsed())
    })
}

fn refused_at_once((seen, took): (Seen, Duration), what: &str) {
    assert_eq!(seen, Seen::Refused, "{what}");
    assert!(took < AT_ONCE, "{what} was refused only after {took:?}");
}

#[test]
fn the_agents_direct_connections_are_refused_at_once_and_the_sidecars_pass() {
    let net = net();
    // Without the lock the agent reaches the server: the test can fail.
    assert_eq!(tcp(&net, AGENT, SERVER_V4, 8080).0, Seen::Reached);
    assert_eq!(udp(&net, AGENT, SERVER_V6, 8081).0, Seen::Reached);

    NodeTools.lock(&net.pod.path(), &lock()).unwrap();

    for server in [SERVER_V4, SERVER_V6] {
        refused_at_once(tcp(&net, AGENT, server, 8080), &format!("TCP to {server}"));
        refused_at_once(udp(&net, AGENT, server, 8081), &format!("UDP to {server}"));
        // The sidecar's user goes anywhere.
        assert_eq!(
            tcp(&net, SIDECAR, server, 8080).0,
            Seen::Reached,
            "{server}"
        );
        assert_eq!(
            udp(&net, SIDECAR, server, 8081).0,
            Seen::Reached,
            "{server}"
        );
        // DNS to the cluster's DNS servers, both protocols.
        assert_eq!(
            udp(&net, AGENT, server, 53).0,
            Seen::Reached,
            "DNS/UDP {server}"
        );
        assert_eq!(
            tcp(&net, AGENT, server, 53).0,
            Seen::Reached,
            "DNS/TCP {server}"
        );
    }
    // The allowed destination, and only on its port and protocol.
    assert_eq!(tcp(&net, AGENT, SERVER_V6, 9000).0, Seen::Reached);
    refused_at_once(tcp(&net, AGENT, SERVER_V4, 9000), "TCP 9000 on IPv4");
    // Root is not exempt either (the injector refuses root agents anyway).
    refused_at_once(tcp(&net, 0, SERVER_V4, 8080), "TCP as root");
    // Loopback (the gateway's port) and the pod's own address stay open.
    net.pod.run(None, || {
        let listener = TcpListener::bind("0.0.0.0:15001").unwrap();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let _ = stream.write_all(b"hello");
            }
        });
    });
    assert_eq!(tcp(&net, AGENT, "127.0.0.1", 15001).0, Seen::Reached);
    assert_eq!(tcp(&net, AGENT, POD_V4, 15001).0, Seen::Reached);
}

#[test]
fn locking_again_replaces_the_rules_and_keeps_one_jump() {
    let net = net();
    NodeTools.lock(&net.pod.path(), &lock()).unwrap();
    let mut wider = lock();
    wider.allow.push(Destination {
        cidr: format!("{SERVER_V4}/32"),
        protocol: Protocol::Tcp,
        port: Some(8080),
        end_port: None,
    });
    NodeTools.lock(&net.pod.path(), &wider).unwrap();
    for (save, jump) in [
        ("iptables-save", "-A OUTPUT -j AIP-EGRESS"),
        ("ip6tables-save", "-A OUTPUT -j AIP-EGRESS"),
    ] {
        let saved = inside(&net.pod.path(), save, &[], None).unwrap();
        assert_eq!(
            saved.lines().filter(|l| l.trim() == jump).count(),
            1,
            "{saved}"
        );
    }
    assert_eq!(tcp(&net, AGENT, SERVER_V4, 8080).0, Seen::Reached);
    refused_at_once(tcp(&net, AGENT, SERVER_V6, 8080), "TCP 8080 on IPv6");
}
