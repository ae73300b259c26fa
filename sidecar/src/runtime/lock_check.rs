//! `aip-sidecar lock-check`: the proof a locked pod gives of its own lock,
//! run as its first init container under a user id of its own (neither the
//! gateway's nor an agent's). The injector cannot see which node a pod
//! lands on, nor whether that node's CNI plugin locked it; the pod can: a
//! TCP connection and a UDP exchange to a destination the lock forbids must
//! be refused at once. Anything else (a timeout, an unreachable network, an
//! answer) means the pod's egress is open, and the container fails, so the
//! gateway and the agents never start. Its last line is the reason the pod
//! shows (the kubelet's termination message).
//!
//! The probe's address is from a documentation range (RFC 5737), which no
//! network routes: with the lock, the packet never leaves the pod.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long a refusal may take: the lock refuses before the packet leaves.
const AT_ONCE: Duration = Duration::from_secs(2);

/// Where the reason goes for `kubectl describe pod` (the kubelet's
/// default terminationMessagePath), besides stderr.
const TERMINATION_LOG: &str = "/dev/termination-log";

pub fn lock_check(probe: SocketAddr) -> ExitCode {
    match check(probe) {
        Ok(said) => {
            eprintln!("{said}");
            ExitCode::SUCCESS
        }
        Err(reason) => {
            let text = format!(
                "the egress lock is not in place: {reason}; the node's aip-cni plugin did not lock this pod (is the chart's egressLock.cni DaemonSet running on this node?), so its gateway and agents do not start (docs/security.md)"
            );
            eprintln!("{text}");
            let _ = std::fs::write(TERMINATION_LOG, &text);
            ExitCode::FAILURE
        }
    }
}

fn check(probe: SocketAddr) -> Result<String, String> {
    let started = Instant::now();
    match TcpStream::connect_timeout(&probe, AT_ONCE) {
        Ok(_) => return Err(format!("a TCP connection to {probe} was accepted")),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
        Err(e) if e.kind() == ErrorKind::TimedOut => {
            return Err(format!(
                "a TCP connection to {probe} was not refused within {}s",
                AT_ONCE.as_secs()
            ));
        }
        Err(e) => {
            return Err(format!(
                "a TCP connection to {probe} failed otherwise ({e})"
            ));
        }
    }
    let any: SocketAddr = if probe.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .map_err(|e| format!("{e}"))?;
    let socket = UdpSocket::bind(any).map_err(|e| format!("cannot open a UDP socket: {e}"))?;
    socket
        .connect(probe)
        .map_err(|e| format!("cannot connect a UDP socket to {probe}: {e}"))?;
    socket
        .set_read_timeout(Some(AT_ONCE))
        .map_err(|e| e.to_string())?;
    // A refused datagram: the send fails at once (the verdict on the
    // packet), and the socket then reads the refusal.
    let _ = socket.send(b"aip-lock-check");
    let mut buf = [0u8; 64];
    match socket.recv(&mut buf) {
        Ok(_) => return Err(format!("a UDP datagram to {probe} was answered")),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Err(format!(
                "a UDP datagram to {probe} was not refused within {}s",
                AT_ONCE.as_secs()
            ));
        }
        Err(e) => return Err(format!("a UDP datagram to {probe} failed otherwise ({e})")),
    }
    Ok(format!(
        "the egress lock is in place: TCP and UDP to {probe} refused in {} ms",
        started.elapsed().as_millis()
    ))
}
