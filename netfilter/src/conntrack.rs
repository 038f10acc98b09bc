//! Conntrack over netlink (ctnetlink on `NETLINK_NETFILTER`), without the `conntrack` binary.
//!
//! [`Conntrack::delete`] removes the entries whose original direction goes to a protocol and
//! destination port (and optionally address): what `conntrack -D -p udp --dport 53 [--dst A]`
//! does. portmap flushes stale UDP flows this way so a re-mapped port reaches its new owner.
//!
//! The kernel selects the entries, so a call's cost follows what it removes, not what the
//! table holds in user space:
//! - Linux 6.12+ deletes them itself, given the filter (`CTA_FILTER` on a delete): one request,
//!   nothing copied to user space.
//! - Linux 5.9–6.11 refuse that request (nothing is deleted): a dump filtered by the kernel
//!   (`CTA_FILTER` on a dump) returns the matching entries only, which are deleted one exact
//!   tuple each, a hundred per datagram. A refusal is remembered by the handle, so a call
//!   asks once.
//! - Older kernels ignore the dump's filter and send every entry: each entry is checked here
//!   again, so the result is the same, only slower.
//!
//! Either way the kernel walks its whole hash table (shared by every namespace) to find them:
//! that walk, a few tenths of a microsecond per entry of the table, is the floor of a delete.
//! The kernel compares an IPv6 address of a filter inverted (see [`wire`]): an IPv6 filter
//! with an address is given to the kernel without it, and the address compared here.

mod wire;

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE};

use crate::nft::raw::RawMsg;
use crate::nft::{L4Proto, NfProto};
use host::netns::{NetNs, NetnsError};
use netlink::NetlinkSocket;

/// Messages per datagram of a bulk delete or insert. The kernel answers each refused message
/// with an error of its own, each about a kilobyte of the receive buffer (about 200 KiB by
/// default): more refusals than fit would overrun it (`ENOBUFS`).
const MESSAGES_PER_DATAGRAM: usize = 100;

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
    fn matches(&self, f: &FlowFilter) -> bool {
        self.proto == f.proto && self.dport == f.dport && f.daddr.is_none_or(|a| a == self.daddr)
    }
}

/// How [`Conntrack::delete`] removed the entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// The kernel selected and deleted them in one request (Linux 6.12+); it does not say
    /// how many there were.
    InKernel,
    /// A filtered dump found them and this many were deleted (others may have expired
    /// meanwhile).
    Listed(usize),
}

/// A ctnetlink handle bound to one network namespace.
#[derive(Debug)]
pub struct Conntrack {
    socket: NetlinkSocket,
    /// Whether to ask the kernel to delete by filter; off once it refused.
    kernel_flush: bool,
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
        Ok(Conntrack {
            socket,
            kernel_flush: true,
        })
    }

    /// Opens a handle inside `ns` (on a throwaway thread); it stays bound to `ns`.
    ///
    /// # Errors
    /// The namespace cannot be entered, or the socket opened.
    pub fn open_in(ns: &NetNs) -> Result<Conntrack, ConntrackError> {
        ns.run(Conntrack::new)?
    }

    /// Whether [`Conntrack::delete`] first asks the kernel to delete by filter (the default;
    /// turned off by the kernel's first refusal). Off, it always dumps the matching entries
    /// and deletes them one by one, as on Linux 5.9–6.11.
    pub fn set_kernel_flush(&mut self, on: bool) {
        self.kernel_flush = on;
    }

    fn entries(
        &mut self,
        version: NfProto,
        filter: Option<&FlowFilter>,
    ) -> Result<Vec<wire::Entry>, ConntrackError> {
        let replies: Vec<wire::Dumped> =
            self.socket
                .dump_as(wire::dump(version, filter))
                .map_err(|source| ConntrackError::Request {
                    op: "list conntrack entries".to_string(),
                    source,
                })?;
        // Older kernels ignore the family and the filter of a dump: keep only what was asked.
        Ok(replies
            .into_iter()
            .filter_map(|d| d.0)
            .filter(|e| NfProto::of(e.flow.daddr) == version)
            .filter(|e| filter.is_none_or(|f| e.flow.matches(f)))
            .collect())
    }

    /// The original-direction flows of every entry of an IP version (`conntrack -L -f ipv4`).
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn flows(&mut self, version: NfProto) -> Result<Vec<Flow>, ConntrackError> {
        Ok(self
            .entries(version, None)?
            .into_iter()
            .map(|e| e.flow)
            .collect())
    }

    /// The flows of the entries of an IP version that `filter` selects, as the kernel selects
    /// them for a dump (`conntrack -L -f ipv4 -p udp --dport N`).
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn flows_matching(
        &mut self,
        version: NfProto,
        filter: &FlowFilter,
    ) -> Result<Vec<Flow>, ConntrackError> {
        Ok(self
            .entries(version, Some(filter))?
            .into_iter()
            .map(|e| e.flow)
            .collect())
    }

    /// Deletes the entries of `version` that match `filter`. Entries that expire meanwhile are
    /// not an error.
    ///
    /// # Errors
    /// The kernel's errno for the deletion or the dump.
    pub fn delete(
        &mut self,
        version: NfProto,
        filter: &FlowFilter,
    ) -> Result<Deletion, ConntrackError> {
        let kernel_can = wire::kernel_compares_ports(filter.proto)
            && (version == NfProto::Ipv4 || filter.daddr.is_none());
        if self.kernel_flush && kernel_can {
            match self.socket.request(wire::flush(version, filter), 0) {
                Ok(_) => {
                    log::debug!(
                        "conntrack: the kernel deleted the entries to {:?} port {}",
                        filter.proto,
                        filter.dport
                    );
                    return Ok(Deletion::InKernel);
                }
                // Before Linux 6.12 a delete takes no filter: it is refused, nothing deleted.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                    log::debug!("conntrack: no deletion by filter here ({e}); dumping instead");
                    self.kernel_flush = false;
                }
                Err(source) => {
                    return Err(ConntrackError::Request {
                        op: format!(
                            "delete conntrack entries of {} dport {}",
                            filter.proto.number(),
                            filter.dport
                        ),
                        source,
                    });
                }
            }
        }
        let victims = self.entries(version, Some(filter))?;
        let count = victims.len();
        let messages: Vec<_> = victims.iter().map(|e| wire::delete(version, e)).collect();
        let gone =
            self.send_all(messages, 0, libc::ENOENT)
                .map_err(|source| ConntrackError::Request {
                    op: format!(
                        "delete conntrack entries of {} dport {}",
                        filter.proto.number(),
                        filter.dport
                    ),
                    source,
                })?;
        log::debug!(
            "conntrack: deleted {} entries to {:?} port {}",
            count - gone,
            filter.proto,
            filter.dport
        );
        Ok(Deletion::Listed(count - gone))
    }

    /// Inserts an entry per flow, its reply the inverse (no NAT), expiring after
    /// `timeout_secs` (`conntrack -I`): what a test or a benchmark needs to fill a table fast.
    /// An entry that exists already is updated.
    ///
    /// # Errors
    /// A flow whose addresses are of two versions (`EINVAL`), or the kernel's errno.
    pub fn insert(&mut self, flows: &[Flow], timeout_secs: u32) -> Result<(), ConntrackError> {
        let messages = flows
            .iter()
            .map(|f| wire::create(f, timeout_secs))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ConntrackError::Request {
                op: "insert a conntrack entry".to_string(),
                source: io::Error::from_raw_os_error(libc::EINVAL),
            })?;
        self.send_all(messages, NLM_F_CREATE, 0)
            .map(|_| ())
            .map_err(|source| ConntrackError::Request {
                op: "insert conntrack entries".to_string(),
                source,
            })
    }

    /// Sends `messages` with `flags` in datagrams of [`MESSAGES_PER_DATAGRAM`], the last of
    /// each acknowledged, and returns how many the kernel refused with `tolerated`.
    fn send_all(&mut self, messages: Vec<RawMsg>, flags: u16, tolerated: i32) -> io::Result<usize> {
        let mut refused = 0;
        let mut messages = messages.into_iter().peekable();
        while messages.peek().is_some() {
            let chunk: Vec<_> = messages.by_ref().take(MESSAGES_PER_DATAGRAM).collect();
            let last = chunk.len() - 1;
            let flagged = chunk
                .into_iter()
                .enumerate()
                .map(|(i, m)| (m, flags | if i == last { NLM_F_ACK } else { 0 }))
                .collect();
            for f in self.socket.send_batch(flagged)? {
                if tolerated != 0 && f.error.raw_os_error() == Some(tolerated) {
                    refused += 1;
                } else {
                    return Err(f.error);
                }
            }
        }
        Ok(refused)
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
        host::netns::in_new_netns(|| {
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

    /// UDP ports of the `version` entries of `ct`, sorted.
    fn udp_ports(ct: &mut Conntrack, version: NfProto) -> Vec<u16> {
        let mut p: Vec<u16> = ct
            .flows(version)
            .unwrap()
            .into_iter()
            .filter(|f| f.proto == L4Proto::Udp)
            .map(|f| f.dport)
            .collect();
        p.sort_unstable();
        p
    }

    #[test]
    fn udp_flows_are_deleted_by_port_and_address_and_others_stay() {
        // In the kernel where it can (Linux 6.12+), and by a filtered dump.
        for kernel_flush in [true, false] {
            in_tracking_netns(|| {
                let lo4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
                let lo6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
                let _server = UdpSocket::bind((lo4, 0)).unwrap();
                udp_flow((lo4, 5353).into());
                udp_flow((lo4, 5353).into());
                udp_flow((lo4, 5354).into());
                udp_flow((lo6, 5353).into());
                let mut ct = Conntrack::new().unwrap();
                ct.set_kernel_flush(kernel_flush);
                assert_eq!(udp_ports(&mut ct, NfProto::Ipv4), [5353, 5353, 5354]);
                assert_eq!(udp_ports(&mut ct, NfProto::Ipv6), [5353]);
                assert!(proc_conntrack().contains("dport=5353"));

                // Another address, or TCP on that port: nothing goes.
                let other = FlowFilter {
                    proto: L4Proto::Udp,
                    dport: 5353,
                    daddr: Some("10.9.9.9".parse().unwrap()),
                };
                let tcp = FlowFilter {
                    proto: L4Proto::Tcp,
                    dport: 5353,
                    daddr: None,
                };
                for filter in [other, tcp] {
                    let done = ct.delete(NfProto::Ipv4, &filter).unwrap();
                    assert!(matches!(done, Deletion::InKernel | Deletion::Listed(0)));
                }
                assert_eq!(udp_ports(&mut ct, NfProto::Ipv4), [5353, 5353, 5354]);

                let udp = FlowFilter {
                    proto: L4Proto::Udp,
                    dport: 5353,
                    daddr: Some(lo4),
                };
                let done = ct.delete(NfProto::Ipv4, &udp).unwrap();
                assert!(
                    matches!(done, Deletion::InKernel | Deletion::Listed(2)),
                    "{done:?}"
                );
                assert_eq!(udp_ports(&mut ct, NfProto::Ipv4), [5354]);
                // IPv6 entries are only touched for IPv6.
                assert_eq!(udp_ports(&mut ct, NfProto::Ipv6), [5353]);
                let udp6 = FlowFilter {
                    proto: L4Proto::Udp,
                    dport: 5353,
                    daddr: None,
                };
                ct.delete(NfProto::Ipv6, &udp6).unwrap();
                assert!(udp_ports(&mut ct, NfProto::Ipv6).is_empty());
                let left = proc_conntrack();
                assert!(!left.contains("dport=5353"), "{left}");
                assert!(left.contains("dport=5354"), "{left}");
                // Deleting again finds nothing.
                let again = ct.delete(NfProto::Ipv4, &udp).unwrap();
                assert!(matches!(again, Deletion::InKernel | Deletion::Listed(0)));
            });
        }
    }

    /// Whether the running kernel deletes by filter (Linux 6.12 and later).
    fn kernel_deletes_by_filter() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut numbers = release
            .split(|c: char| !c.is_ascii_digit())
            .map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (numbers.next().unwrap(), numbers.next().unwrap());
        (major, minor) >= (6, 12)
    }

    /// A table of thousands of entries of both versions: from many addresses to three, of
    /// three protocols, to five ports, every combination about as often.
    fn crowded_table() -> Vec<Flow> {
        let protos = [L4Proto::Udp, L4Proto::Tcp, L4Proto::Sctp];
        let dports = [5353, 5354, 53, 80, 443];
        let mut flows = Vec::new();
        for i in 0..4000u16 {
            let daddr = IpAddr::V4(Ipv4Addr::new(10, 200, 0, 1 + (i / 15 % 3) as u8));
            let [hi, lo] = i.to_be_bytes();
            flows.push(Flow {
                proto: protos[usize::from(i) % 3],
                saddr: IpAddr::V4(Ipv4Addr::new(10, 1, hi, lo)),
                daddr,
                sport: 1024 + i,
                dport: dports[usize::from(i / 3) % dports.len()],
            });
        }
        for i in 0..3000u16 {
            let daddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1 + i / 15 % 3));
            flows.push(Flow {
                proto: protos[usize::from(i) % 3],
                saddr: IpAddr::V6(Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, i >> 8, i)),
                daddr,
                sport: 1024 + i,
                dport: dports[usize::from(i / 3) % dports.len()],
            });
        }
        flows
    }

    fn sorted(mut flows: Vec<Flow>) -> Vec<(u8, IpAddr, IpAddr, u16, u16)> {
        let mut keys: Vec<_> = flows
            .drain(..)
            .map(|f| (f.proto.number(), f.saddr, f.daddr, f.sport, f.dport))
            .collect();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn a_delete_removes_exactly_the_matching_entries_of_thousands_and_nothing_else() {
        let a4: IpAddr = "10.200.0.1".parse().unwrap();
        let a6: IpAddr = "fd00::1".parse().unwrap();
        let filter = |proto, dport, daddr| FlowFilter {
            proto,
            dport,
            daddr,
        };
        // Each filter with its version: IPv4 and IPv6, with and without an address, UDP, TCP,
        // and SCTP (whose ports the kernel's filter does not compare).
        let steps = [
            (NfProto::Ipv4, filter(L4Proto::Udp, 5353, Some(a4))),
            (NfProto::Ipv4, filter(L4Proto::Udp, 5354, None)),
            (NfProto::Ipv6, filter(L4Proto::Udp, 5353, Some(a6))),
            (NfProto::Ipv6, filter(L4Proto::Udp, 5354, None)),
            (NfProto::Ipv4, filter(L4Proto::Sctp, 5353, None)),
            (NfProto::Ipv6, filter(L4Proto::Tcp, 80, Some(a6))),
            (NfProto::Ipv4, filter(L4Proto::Tcp, 443, Some(a4))),
        ];
        for kernel_flush in [true, false] {
            host::netns::in_new_netns(|| {
                let mut ct = Conntrack::new().unwrap();
                ct.set_kernel_flush(kernel_flush);
                let mut expected = crowded_table();
                ct.insert(&expected, 600).unwrap();
                let table = |ct: &mut Conntrack| {
                    let mut all = ct.flows(NfProto::Ipv4).unwrap();
                    all.extend(ct.flows(NfProto::Ipv6).unwrap());
                    sorted(all)
                };
                assert_eq!(
                    table(&mut ct),
                    sorted(expected.clone()),
                    "the table as made"
                );
                for (version, f) in steps {
                    let matching = |e: &Flow| NfProto::of(e.daddr) == version && e.matches(&f);
                    let stale = expected.iter().filter(|e| matching(e)).count();
                    assert!(
                        stale > 50,
                        "{f:?} names too few entries ({stale}) to prove much"
                    );
                    let mut listed = ct.flows_matching(version, &f).unwrap();
                    let want: Vec<Flow> =
                        expected.iter().filter(|e| matching(e)).cloned().collect();
                    assert_eq!(sorted(std::mem::take(&mut listed)), sorted(want), "{f:?}");
                    let done = ct.delete(version, &f).unwrap();
                    let in_kernel = kernel_flush
                        && kernel_deletes_by_filter()
                        && wire::kernel_compares_ports(f.proto)
                        && (version == NfProto::Ipv4 || f.daddr.is_none());
                    if in_kernel {
                        assert_eq!(done, Deletion::InKernel, "{f:?}");
                    } else if done != Deletion::InKernel {
                        assert_eq!(done, Deletion::Listed(stale), "{f:?}");
                    }
                    expected.retain(|e| !matching(e));
                    assert_eq!(table(&mut ct), sorted(expected.clone()), "after {f:?}");
                }
            })
            .expect("a fresh network namespace needs root");
        }
    }
}
