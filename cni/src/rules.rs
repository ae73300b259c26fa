//! A pod's [`Lock`] as the rules of its network namespace, in the input
//! format of `iptables-restore` and `ip6tables-restore`. Pure: programming
//! them is `netns.rs`'s job.
//!
//! One chain, [`CHAIN`], entered first from the filter table's OUTPUT
//! chain, which sees the packets the pod's own processes send:
//!
//! 1. loopback (the gateway's port, and the pod's own address) goes;
//! 2. packets of connections already under way (replies to the kubelet's
//!    probes and to other pods' connections) go;
//! 3. the sidecar's user goes anywhere;
//! 4. DNS (UDP and TCP port 53) to the cluster's DNS servers goes;
//! 5. the platform team's destinations go;
//! 6. IPv6's neighbour discovery and multicast listener reports, which the
//!    kernel itself sends, go;
//! 7. everything else is refused at once: TCP with a reset, the rest with
//!    an ICMP port-unreachable (a connected UDP socket reads "connection
//!    refused"). Nothing is dropped, so nothing waits for a timeout.

use std::fmt::Write;
use std::net::IpAddr;

use aip_api::egress_lock::{Destination, Lock, Protocol};

/// The chain every rule lives in.
pub const CHAIN: &str = "AIP-EGRESS";

/// The IP family a rule set is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The restore program's name.
    pub fn restore(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }

    /// The save program's name.
    pub fn save(self) -> &'static str {
        match self {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        }
    }

    fn holds(self, address: IpAddr) -> bool {
        matches!(
            (self, address),
            (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_))
        )
    }
}

/// The `iptables-restore --noflush` input that locks one family.
/// `jump_exists`: OUTPUT already enters the chain (a repeated ADD), so only
/// the chain's contents are replaced.
pub fn restore_input(lock: &Lock, family: Family, jump_exists: bool) -> String {
    let mut out = String::from("*filter\n");
    // Declaring a chain in a --noflush restore empties it: the rules below
    // are the whole chain, whatever it held.
    let _ = writeln!(out, ":{CHAIN} - [0:0]");
    if !jump_exists {
        let _ = writeln!(out, "-I OUTPUT 1 -j {CHAIN}");
    }
    let rule = |out: &mut String, text: &str| {
        let _ = writeln!(out, "-A {CHAIN} {text}");
    };
    rule(&mut out, "-o lo -j RETURN");
    rule(
        &mut out,
        "-m conntrack --ctstate ESTABLISHED,RELATED -j RETURN",
    );
    rule(
        &mut out,
        &format!("-m owner --uid-owner {} -j RETURN", lock.sidecar_uid),
    );
    for server in lock.dns.iter().filter(|a| family.holds(**a)) {
        let prefix = if server.is_ipv4() { 32 } else { 128 };
        for protocol in ["udp", "tcp"] {
            rule(
                &mut out,
                &format!("-d {server}/{prefix} -p {protocol} -m {protocol} --dport 53 -j RETURN"),
            );
        }
    }
    for destination in &lock.allow {
        if let Some(text) = allowed(destination, family) {
            rule(&mut out, &text);
        }
    }
    match family {
        Family::V4 => {
            rule(&mut out, "-p tcp -j REJECT --reject-with tcp-reset");
            rule(&mut out, "-j REJECT --reject-with icmp-port-unreachable");
        }
        Family::V6 => {
            // Router and neighbour solicitations and advertisements, and
            // MLDv2 reports: the kernel's own, needed to reach anything.
            for kind in ["133", "135", "136", "143"] {
                rule(
                    &mut out,
                    &format!("-p ipv6-icmp -m icmp6 --icmpv6-type {kind} -j RETURN"),
                );
            }
            rule(&mut out, "-p tcp -j REJECT --reject-with tcp-reset");
            rule(&mut out, "-j REJECT --reject-with icmp6-port-unreachable");
        }
    }
    out.push_str("COMMIT\n");
    out
}

/// The rule for one destination, or None when it is of the other family.
/// The CRD's CEL rules guarantee a well-formed range; one that is not (an
/// annotation written by hand) is left out, which refuses it.
fn allowed(destination: &Destination, family: Family) -> Option<String> {
    let (address, prefix) = destination.cidr.split_once('/')?;
    let address: IpAddr = address.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    if !family.holds(address) || prefix > max {
        return None;
    }
    let protocol = match destination.protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    };
    let ports = match (destination.port, destination.end_port) {
        (Some(port), Some(end)) if end > port => format!(" -m {protocol} --dport {port}:{end}"),
        (Some(port), _) => format!(" -m {protocol} --dport {port}"),
        (None, _) => String::new(),
    };
    Some(format!(
        "-d {address}/{prefix} -p {protocol}{ports} -j RETURN"
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn lock() -> Lock {
        Lock {
            sidecar_uid: 1337,
            dns: vec!["10.96.0.10".parse().unwrap(), "fd00::a".parse().unwrap()],
            allow: vec![
                Destination {
                    cidr: "203.0.113.0/24".into(),
                    protocol: Protocol::Tcp,
                    port: Some(443),
                    end_port: None,
                },
                Destination {
                    cidr: "2001:db8::/32".into(),
                    protocol: Protocol::Udp,
                    port: Some(4000),
                    end_port: Some(4010),
                },
            ],
        }
    }

    #[test]
    fn ipv4_allows_loopback_replies_the_sidecar_dns_and_the_destinations_then_rejects() {
        let text = restore_input(&lock(), Family::V4, false);
        assert_eq!(
            text,
            "*filter
:AIP-EGRESS - [0:0]
-I OUTPUT 1 -j AIP-EGRESS
-A AIP-EGRESS -o lo -j RETURN
-A AIP-EGRESS -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
-A AIP-EGRESS -m owner --uid-owner 1337 -j RETURN
-A AIP-EGRESS -d 10.96.0.10/32 -p udp -m udp --dport 53 -j RETURN
-A AIP-EGRESS -d 10.96.0.10/32 -p tcp -m tcp --dport 53 -j RETURN
-A AIP-EGRESS -d 203.0.113.0/24 -p tcp -m tcp --dport 443 -j RETURN
-A AIP-EGRESS -p tcp -j REJECT --reject-with tcp-reset
-A AIP-EGRESS -j REJECT --reject-with icmp-port-unreachable
COMMIT
"
        );
    }

    #[test]
    fn ipv6_keeps_its_own_destinations_and_neighbour_discovery() {
        let text = restore_input(&lock(), Family::V6, true);
        assert!(!text.contains("-I OUTPUT"), "a repeated ADD: {text}");
        assert!(text.contains("-A AIP-EGRESS -d fd00::a/128 -p udp -m udp --dport 53 -j RETURN"));
        assert!(
            text.contains(
                "-A AIP-EGRESS -d 2001:db8::/32 -p udp -m udp --dport 4000:4010 -j RETURN"
            )
        );
        assert!(!text.contains("203.0.113.0"), "{text}");
        assert!(text.contains("--icmpv6-type 135 -j RETURN"));
        assert!(
            text.ends_with(
                "-A AIP-EGRESS -j REJECT --reject-with icmp6-port-unreachable\nCOMMIT\n"
            )
        );
    }

    #[test]
    fn a_malformed_destination_is_left_out_so_it_stays_refused() {
        let mut lock = lock();
        lock.allow = vec![Destination {
            cidr: "api.example.com/32".into(),
            protocol: Protocol::Tcp,
            port: None,
            end_port: None,
        }];
        let text = restore_input(&lock, Family::V4, false);
        assert!(!text.contains("example"), "{text}");
    }

    proptest::proptest! {
        /// Whatever the destinations, the chain ends in the two refusals
        /// and names nothing but what it was given.
        #[test]
        fn every_rule_set_ends_in_refusals(
            uid in 1u32..100_000,
            octets in proptest::array::uniform4(0u8..=255),
            prefix in 0u8..=40,
            port in proptest::option::of(1u16..=65535),
        ) {
            let lock = Lock {
                sidecar_uid: uid,
                dns: vec![],
                allow: vec![Destination {
                    cidr: format!("{}.{}.{}.{}/{prefix}", octets[0], octets[1], octets[2], octets[3]),
                    protocol: Protocol::Udp,
                    port,
                    end_port: None,
                }],
            };
            let text = restore_input(&lock, Family::V4, false);
            let lines: Vec<&str> = text.lines().collect();
            proptest::prop_assert_eq!(lines[lines.len() - 2], "-A AIP-EGRESS -j REJECT --reject-with icmp-port-unreachable");
            proptest::prop_assert_eq!(lines.iter().filter(|l| l.contains("-d ")).count(), usize::from(prefix <= 32));
        }
    }
}
