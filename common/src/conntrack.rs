//! Conntrack over netlink (ctnetlink on `NETLINK_NETFILTER`), without the `conntrack` binary.
//!
//! [`Conntrack::delete`] removes the entries whose original direction goes to a protocol and
//! destination port (and optionally address): what `conntrack -D -p udp --dport 53 [--dst A]`
//! does. portmap flushes stale UDP flows this way so a re-mapped port reaches its new owner.
//! The kernel deletes one entry per exact tuple, so this dumps the table of one IP version,
//! filters it here, and deletes the matches in one datagram.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{DefaultNla, NLA_TYPE_MASK, NLM_F_ACK, Nla};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};

use crate::netlink::NetlinkSocket;
use crate::netns::{NetNs, NetnsError};
use crate::nft::{L4Proto, NfProto};

/// `CTA_ZONE`: entries in a non-default zone are only found with their zone.
const CTA_ZONE: u16 = 18;

/// A failed conntrack operation.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The request failed.
    #[error("conntrack: failed to {op}: {source}")]
    Request {
        /// What was attempted.
        op: String,
        /// The errno or I/O error.
        #[source]
        source: io::Error,
    },
}

impl ConntrackError {
    /// The errno, if the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            ConntrackError::Request { source, .. } => source.raw_os_error(),
            ConntrackError::Netns(_) => None,
        }
    }
}

impl From<ConntrackError> for crate::error::CniError {
    fn from(err: ConntrackError) -> Self {
        match err {
            ConntrackError::Netns(e) => e.into(),
            e => crate::error::CniError::from_error(crate::error::ErrorCode::Internal, &e),
        }
    }
}

/// Which entries to delete: their original direction's protocol, destination port and,
/// optionally, destination address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowFilter {
    /// The transport protocol (`-p udp`).
    pub proto: L4Proto,
    /// The original destination port (`--dport`).
    pub dport: u16,
    /// The original destination address (`--dst`), if restricted.
    pub daddr: Option<IpAddr>,
}

/// The original-direction tuple of a conntrack entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    /// Transport protocol.
    pub proto: L4Proto,
    /// Source address.
    pub saddr: IpAddr,
    /// Destination address.
    pub daddr: IpAddr,
    /// Source port (0 for port-less protocols).
    pub sport: u16,
    /// Destination port (0 for port-less protocols).
    pub dport: u16,
}

impl Flow {
    fn from_tuples(tuples: &[Tuple]) -> Option<Flow> {
        let (mut saddr, mut daddr, mut proto) = (None, None, None);
        let (mut sport, mut dport) = (0, 0);
        for t in tuples {
            match t {
                Tuple::Ip(ips) => {
                    for ip in ips {
                        match ip {
                            IPTuple::SourceAddress(a) => saddr = Some(*a),
                            IPTuple::DestinationAddress(a) => daddr = Some(*a),
                            _ => {}
                        }
                    }
                }
                Tuple::Proto(ps) => {
                    for p in ps {
                        match p {
                            ProtoTuple::Protocol(n) => {
                                proto = Some(L4Proto::from_number(u8::from(*n)));
                            }
                            ProtoTuple::SourcePort(s) => sport = *s,
                            ProtoTuple::DestinationPort(d) => dport = *d,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Some(Flow {
            proto: proto?,
            saddr: saddr?,
            daddr: daddr?,
            sport,
            dport,
        })
    }

    fn matches(&self, f: &FlowFilter) -> bool {
        self.proto == f.proto && self.dport == f.dport && f.daddr.is_none_or(|a| a == self.daddr)
    }
}

/// A ctnetlink handle bound to one network namespace.
#[derive(Debug)]
pub struct Conntrack {
    socket: NetlinkSocket,
}

/// One dumped entry: its flow and what identifies it for a delete.
struct Entry {
    flow: Flow,
    orig: Vec<Tuple>,
    zone: Option<DefaultNla>,
}

impl Conntrack {
    /// Opens a handle in the calling thread's namespace.
    ///
    /// # Errors
    /// The socket errno.
    pub fn new() -> Result<Conntrack, ConntrackError> {
        let socket = NetlinkSocket::open(netlink_sys::constants::NETLINK_NETFILTER)
            .and_then(|s| s.set_cap_ack(true).map(|()| s))
            .map_err(|source| ConntrackError::Request {
                op: "open a netfilter netlink socket".to_string(),
                source,
            })?;
        Ok(Conntrack { socket })
    }

    /// Opens a handle inside `ns` (on a throwaway thread); it stays bound to `ns`.
    ///
    /// # Errors
    /// The namespace cannot be entered, or the socket opened.
    pub fn open_in(ns: &NetNs) -> Result<Conntrack, ConntrackError> {
        ns.run(Conntrack::new)?
    }

    fn header(version: NfProto) -> NetfilterHeader {
        NetfilterHeader::new(NetfilterProtoFamily::from(version.code()), 0, 0)
    }

    fn entries(&mut self, version: NfProto) -> Result<Vec<Entry>, ConntrackError> {
        let request = NetfilterMessage::new(Self::header(version), ConntrackMessage::Get(vec![]));
        let replies = self
            .socket
            .dump(request)
            .map_err(|source| ConntrackError::Request {
                op: "list conntrack entries".to_string(),
                source,
            })?;
        let mut out = Vec::new();
        for reply in replies {
            let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = reply.inner else {
                continue;
            };
            let mut orig = None;
            let mut zone = None;
            for attr in attrs {
                match attr {
                    ConntrackAttribute::CtaTupleOrig(t) => orig = Some(t),
                    ConntrackAttribute::Other(nla) if nla.kind() & NLA_TYPE_MASK == CTA_ZONE => {
                        zone = Some(nla);
                    }
                    _ => {}
                }
            }
            let Some(orig) = orig else { continue };
            let Some(flow) = Flow::from_tuples(&orig) else {
                continue;
            };
            // Older kernels ignore the family of a dump: keep only this version's entries.
            if NfProto::of(flow.daddr) == version {
                out.push(Entry { flow, orig, zone });
            }
        }
        Ok(out)
    }

    /// The original-direction flows of every entry of an IP version (`conntrack -L -f ipv4`).
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn flows(&mut self, version: NfProto) -> Result<Vec<Flow>, ConntrackError> {
        Ok(self.entries(version)?.into_iter().map(|e| e.flow).collect())
    }

    /// Deletes the entries of `version` that match `filter` and returns how many went.
    /// Entries that expire meanwhile are not an error.
    ///
    /// # Errors
    /// The kernel's errno for the dump or for a delete.
    pub fn delete(
        &mut self,
        version: NfProto,
        filter: &FlowFilter,
    ) -> Result<usize, ConntrackError> {
        let victims: Vec<Entry> = self
            .entries(version)?
            .into_iter()
            .filter(|e| e.flow.matches(filter))
            .collect();
        if victims.is_empty() {
            return Ok(0);
        }
        let count = victims.len();
        let messages = victims
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(e.orig)];
                if let Some(zone) = e.zone {
                    attrs.push(ConntrackAttribute::Other(zone));
                }
                let msg =
                    NetfilterMessage::new(Self::header(version), ConntrackMessage::Delete(attrs));
                (msg, if i + 1 == count { NLM_F_ACK } else { 0 })
            })
            .collect();
        let failures =
            self.socket
                .send_batch(messages)
                .map_err(|source| ConntrackError::Request {
                    op: "delete conntrack entries".to_string(),
                    source,
                })?;
        let mut gone = 0;
        for f in failures {
            if f.error.raw_os_error() == Some(libc::ENOENT) {
                gone += 1;
            } else {
                return Err(ConntrackError::Request {
                    op: format!(
                        "delete conntrack entries of {} dport {}",
                        filter.proto.number(),
                        filter.dport
                    ),
                    source: f.error,
                });
            }
        }
        log::debug!(
            "conntrack: deleted {} entries to {:?} port {}",
            count - gone,
            filter.proto,
            filter.dport
        );
        Ok(count - gone)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr, UdpSocket};

    use super::*;
    use crate::nft::{Batch, Chain, ChainHook, ChainType, CtStateFlags, Family, Nft, Rule, Table};

    /// Runs `body` on a thread in a fresh network namespace of its own, `lo` up, with
    /// connection tracking switched on (a `ct state` rule on output makes the kernel track).
    fn in_tracking_netns<T: Send>(body: impl FnOnce() -> T + Send) -> T {
        crate::netns::in_new_netns(|| {
            let status = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status()
                .unwrap();
            assert!(status.success());
            let t = Table::new(Family::Inet, "track");
            let mut b = Batch::new();
            b.add_table(&t)
                .add_chain(
                    &t,
                    &Chain::base("out", ChainType::Filter, ChainHook::Output, 0),
                )
                .add_rule(
                    &t,
                    "out",
                    &Rule::new().ct_state(CtStateFlags::NEW).counter(),
                );
            Nft::new().unwrap().apply(&b).unwrap();
            body()
        })
        .expect("a fresh network namespace needs root")
    }

    /// Sends one datagram from a fresh socket to `to`: one conntrack entry each.
    fn udp_flow(to: std::net::SocketAddr) {
        let bind: std::net::SocketAddr = if to.is_ipv4() {
            (Ipv4Addr::LOCALHOST, 0).into()
        } else {
            (Ipv6Addr::LOCALHOST, 0).into()
        };
        UdpSocket::bind(bind).unwrap().send_to(b"x", to).unwrap();
    }

    fn proc_conntrack() -> String {
        std::fs::read_to_string("/proc/thread-self/net/nf_conntrack").unwrap_or_default()
    }

    #[test]
    fn udp_flows_are_deleted_by_port_and_address_and_others_stay() {
        in_tracking_netns(|| {
            let lo4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
            let lo6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
            let _server = UdpSocket::bind((lo4, 0)).unwrap();
            udp_flow((lo4, 5353).into());
            udp_flow((lo4, 5353).into());
            udp_flow((lo4, 5354).into());
            udp_flow((lo6, 5353).into());
            let mut ct = Conntrack::new().unwrap();
            let ports = |ct: &mut Conntrack, v| {
                let mut p: Vec<u16> = ct
                    .flows(v)
                    .unwrap()
                    .into_iter()
                    .filter(|f| f.proto == L4Proto::Udp)
                    .map(|f| f.dport)
                    .collect();
                p.sort_unstable();
                p
            };
            assert_eq!(ports(&mut ct, NfProto::Ipv4), [5353, 5353, 5354]);
            assert_eq!(ports(&mut ct, NfProto::Ipv6), [5353]);
            assert!(proc_conntrack().contains("dport=5353"));

            // Another address: nothing matches.
            let other = FlowFilter {
                proto: L4Proto::Udp,
                dport: 5353,
                daddr: Some("10.9.9.9".parse().unwrap()),
            };
            assert_eq!(ct.delete(NfProto::Ipv4, &other).unwrap(), 0);
            // TCP on that port: nothing matches.
            let tcp = FlowFilter {
                proto: L4Proto::Tcp,
                dport: 5353,
                daddr: None,
            };
            assert_eq!(ct.delete(NfProto::Ipv4, &tcp).unwrap(), 0);

            let udp = FlowFilter {
                proto: L4Proto::Udp,
                dport: 5353,
                daddr: Some(lo4),
            };
            assert_eq!(ct.delete(NfProto::Ipv4, &udp).unwrap(), 2);
            assert_eq!(ports(&mut ct, NfProto::Ipv4), [5354]);
            // IPv6 entries are only touched for IPv6.
            assert_eq!(ports(&mut ct, NfProto::Ipv6), [5353]);
            let udp6 = FlowFilter {
                proto: L4Proto::Udp,
                dport: 5353,
                daddr: None,
            };
            assert_eq!(ct.delete(NfProto::Ipv6, &udp6).unwrap(), 1);
            assert!(ports(&mut ct, NfProto::Ipv6).is_empty());
            let left = proc_conntrack();
            assert!(!left.contains("dport=5353"), "{left}");
            assert!(left.contains("dport=5354"), "{left}");
            // Deleting again finds nothing.
            assert_eq!(ct.delete(NfProto::Ipv4, &udp).unwrap(), 0);
        });
    }
}
