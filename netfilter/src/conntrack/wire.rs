//! ctnetlink messages as bytes: the requests [`super::Conntrack`] sends and the decoding of the
//! entries a dump returns.
//!
//! A dump reply is read where it lies in the receive buffer: only the original tuple's
//! addresses, protocol and ports are decoded, and only its bytes (and the zone) are copied, to
//! be sent back as they are when the entry is deleted. As with nf_tables (`nft::raw`),
//! `netlink-packet-netfilter` would format each message into an error context for every
//! nested attribute it parses, and build every attribute of every entry.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{NLA_F_NESTED, NetlinkDeserializable, NetlinkHeader};

use super::{Flow, FlowFilter};
use crate::nft::raw::{RawMsg, attributes};
use crate::nft::{L4Proto, NfProto};

// linux/netfilter/nfnetlink.h, nfnetlink_conntrack.h
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TIMEOUT: u16 = 7;
/// Entries in a non-default zone are only found with their zone.
const CTA_ZONE: u16 = 18;
const CTA_FILTER: u16 = 25;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
// net/netfilter/nf_conntrack_netlink.c: CTA_FILTER_F_*, which tuple fields a filter compares.
const CTA_FILTER_F_CTA_IP_DST: u32 = 1 << 1;
const CTA_FILTER_F_CTA_PROTO_NUM: u32 = 1 << 3;
const CTA_FILTER_F_CTA_PROTO_DST_PORT: u32 = 1 << 5;
/// `sizeof(struct nfgenmsg)`.
const NFGENMSG_LEN: usize = 4;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// Appends one attribute (`kind`, `value`) to `out`, padded to 4 bytes.
fn put(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    // An attribute's length is a u16; every value here is a few dozen bytes.
    let len16 = u16::try_from(len).unwrap_or(u16::MAX);
    out.extend_from_slice(&len16.to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len() + ((4 - len % 4) % 4), 0);
}

/// Appends a nested attribute whose value `fill` writes.
fn nest(out: &mut Vec<u8>, kind: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::with_capacity(64);
    fill(&mut inner);
    put(out, kind | NLA_F_NESTED, &inner);
}

fn addr_attr(out: &mut Vec<u8>, v4: u16, v6: u16, addr: IpAddr) {
    match addr {
        IpAddr::V4(a) => put(out, v4, &a.octets()),
        IpAddr::V6(a) => put(out, v6, &a.octets()),
    }
}

/// A message of the ctnetlink subsystem: `nfgenmsg` of `version`, then `attrs`.
fn message(kind: u16, version: NfProto, attrs: &[u8]) -> RawMsg {
    let mut payload = Vec::with_capacity(NFGENMSG_LEN + attrs.len());
    // nfgenmsg: family, version NFNETLINK_V0, res_id 0.
    payload.extend_from_slice(&[version.code(), 0, 0, 0]);
    payload.extend_from_slice(attrs);
    RawMsg {
        kind: NFNL_SUBSYS_CTNETLINK << 8 | kind,
        payload,
    }
}

/// Whether the kernel's tuple filter can compare the destination port of `proto`: it compares
/// ports of TCP and UDP only, and lets any other protocol's entries through whatever the port.
pub(super) fn kernel_compares_ports(proto: L4Proto) -> bool {
    matches!(proto.number(), IPPROTO_TCP | IPPROTO_UDP)
}

/// The `CTA_TUPLE_ORIG` and `CTA_FILTER` attributes that select the entries whose original
/// direction goes to `filter`'s protocol and port, and to its address when `with_address`.
///
/// The kernel compares an IPv6 address of a filter inverted (`!ipv6_addr_cmp()` in
/// `ctnetlink_filter_match_tuple`, Linux 5.9 to 6.18 at least: an IPv6 destination filter
/// selects every entry *but* those to the address), so callers never ask it to compare one.
fn filter_attrs(filter: &FlowFilter, with_address: bool) -> Vec<u8> {
    let mut flags = CTA_FILTER_F_CTA_PROTO_NUM | CTA_FILTER_F_CTA_PROTO_DST_PORT;
    let mut attrs = Vec::with_capacity(64);
    nest(&mut attrs, CTA_TUPLE_ORIG, |t| {
        if let (true, Some(addr)) = (with_address, filter.daddr) {
            flags |= CTA_FILTER_F_CTA_IP_DST;
            nest(t, CTA_TUPLE_IP, |ip| {
                addr_attr(ip, CTA_IP_V4_DST, CTA_IP_V6_DST, addr);
            });
        }
        nest(t, CTA_TUPLE_PROTO, |p| {
            put(p, CTA_PROTO_NUM, &[filter.proto.number()]);
            put(p, CTA_PROTO_DST_PORT, &filter.dport.to_be_bytes());
        });
    });
    // CTA_FILTER_ORIG_FLAGS is an NLA_U32: host byte order.
    nest(&mut attrs, CTA_FILTER, |f| {
        put(f, CTA_FILTER_ORIG_FLAGS, &flags.to_ne_bytes());
    });
    attrs
}

/// A request that the kernel delete, in one walk of its table, every entry of `version` that
/// `filter` selects (Linux 6.12+: `IPCTNL_MSG_CT_DELETE` with `CTA_FILTER`). IPv4 addresses
/// are compared by the kernel, IPv6 ones never (see [`filter_attrs`]): the caller asks only
/// for a filter without one.
///
/// An older kernel reads the message as the deletion of one exact entry and refuses the
/// partial tuple with `EINVAL` (Linux 5.9–6.11 answer a filtered flush without a tuple with
/// `EOPNOTSUPP`): it never deletes anything.
pub(super) fn flush(version: NfProto, filter: &FlowFilter) -> RawMsg {
    message(
        IPCTNL_MSG_CT_DELETE,
        version,
        &filter_attrs(filter, version == NfProto::Ipv4),
    )
}

/// A dump of the entries of `version`: with `filter`, only those whose original direction goes
/// to its protocol and port (and its IPv4 address), as far as the kernel can tell (Linux 5.9+;
/// an older one ignores the filter and sends every entry). The caller checks each entry again.
pub(super) fn dump(version: NfProto, filter: Option<&FlowFilter>) -> RawMsg {
    let attrs = filter.map_or_else(Vec::new, |f| filter_attrs(f, version == NfProto::Ipv4));
    message(IPCTNL_MSG_CT_GET, version, &attrs)
}

/// The deletion of the one dumped entry `entry`.
pub(super) fn delete(version: NfProto, entry: &Entry) -> RawMsg {
    let mut attrs = Vec::with_capacity(entry.orig.len() + 16);
    put(&mut attrs, CTA_TUPLE_ORIG | NLA_F_NESTED, &entry.orig);
    if let Some(zone) = entry.zone {
        put(&mut attrs, CTA_ZONE, &zone);
    }
    message(IPCTNL_MSG_CT_DELETE, version, &attrs)
}

fn tuple(
    out: &mut Vec<u8>,
    kind: u16,
    proto: u8,
    (saddr, sport): (IpAddr, u16),
    (daddr, dport): (IpAddr, u16),
) {
    nest(out, kind, |t| {
        nest(t, CTA_TUPLE_IP, |ip| {
            addr_attr(ip, CTA_IP_V4_SRC, CTA_IP_V6_SRC, saddr);
            addr_attr(ip, CTA_IP_V4_DST, CTA_IP_V6_DST, daddr);
        });
        nest(t, CTA_TUPLE_PROTO, |p| {
            put(p, CTA_PROTO_NUM, &[proto]);
            put(p, CTA_PROTO_SRC_PORT, &sport.to_be_bytes());
            put(p, CTA_PROTO_DST_PORT, &dport.to_be_bytes());
        });
    });
}

/// The creation of an entry for `flow` (its reply the inverse: no NAT) that expires after
/// `timeout_secs`, as `conntrack -I` sends it. `None` when the addresses are of two versions.
pub(super) fn create(flow: &Flow, timeout_secs: u32) -> Option<RawMsg> {
    let version = NfProto::of(flow.daddr);
    if NfProto::of(flow.saddr) != version {
        return None;
    }
    let proto = flow.proto.number();
    let src = (flow.saddr, flow.sport);
    let dst = (flow.daddr, flow.dport);
    let mut attrs = Vec::with_capacity(160);
    tuple(&mut attrs, CTA_TUPLE_ORIG, proto, src, dst);
    tuple(&mut attrs, CTA_TUPLE_REPLY, proto, dst, src);
    put(&mut attrs, CTA_TIMEOUT, &timeout_secs.to_be_bytes());
    Some(message(IPCTNL_MSG_CT_NEW, version, &attrs))
}

/// One entry of a dump: its original-direction flow and what a deletion sends back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    /// The original direction.
    pub flow: Flow,
    /// The value of `CTA_TUPLE_ORIG`, as the kernel sent it.
    pub orig: Vec<u8>,
    /// `CTA_ZONE`, when the kernel sent one.
    pub zone: Option<[u8; 2]>,
}

/// One reply of a dump: an entry, or `None` for a message that is not one (or whose tuple is
/// not of an IP version or lacks an address).
#[derive(Debug)]
pub(super) struct Dumped(pub Option<Entry>);

impl NetlinkDeserializable for Dumped {
    type Error = io::Error;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        if header.message_type != (NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW) {
            return Ok(Dumped(None));
        }
        Ok(Dumped(entry(
            payload.get(NFGENMSG_LEN..).unwrap_or_default(),
        )))
    }
}

/// The entry whose message attributes are `attrs`.
fn entry(attrs: &[u8]) -> Option<Entry> {
    let mut orig = None;
    let mut zone = None;
    for (kind, value) in attributes(attrs) {
        match kind {
            CTA_TUPLE_ORIG => orig = Some(value),
            CTA_ZONE => zone = value.try_into().ok(),
            _ => {}
        }
    }
    let orig = orig?;
    Some(Entry {
        flow: flow(orig)?,
        orig: orig.to_vec(),
        zone,
    })
}

/// The flow of a tuple's attributes.
fn flow(tuple: &[u8]) -> Option<Flow> {
    let (mut saddr, mut daddr, mut proto) = (None, None, None);
    let (mut sport, mut dport) = (0, 0);
    let port = |v: &[u8]| v.try_into().map(u16::from_be_bytes).unwrap_or(0);
    for (kind, value) in attributes(tuple) {
        match kind {
            CTA_TUPLE_IP => {
                for (kind, value) in attributes(value) {
                    let v4 = || {
                        <[u8; 4]>::try_from(value)
                            .ok()
                            .map(Ipv4Addr::from)
                            .map(IpAddr::V4)
                    };
                    let v6 = || {
                        <[u8; 16]>::try_from(value)
                            .ok()
                            .map(Ipv6Addr::from)
                            .map(IpAddr::V6)
                    };
                    match kind {
                        CTA_IP_V4_SRC => saddr = v4(),
                        CTA_IP_V4_DST => daddr = v4(),
                        CTA_IP_V6_SRC => saddr = v6(),
                        CTA_IP_V6_DST => daddr = v6(),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (kind, value) in attributes(value) {
                    match kind {
                        CTA_PROTO_NUM => proto = value.first().copied().map(L4Proto::from_number),
                        CTA_PROTO_SRC_PORT => sport = port(value),
                        CTA_PROTO_DST_PORT => dport = port(value),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn udp(daddr: Option<&str>) -> FlowFilter {
        FlowFilter {
            proto: L4Proto::Udp,
            dport: 5353,
            daddr: daddr.map(|a| a.parse().unwrap()),
        }
    }

    #[test]
    fn a_created_entry_reads_back_as_its_flow() {
        let flow = Flow {
            proto: L4Proto::Udp,
            saddr: "10.1.2.3".parse().unwrap(),
            daddr: "10.9.8.7".parse().unwrap(),
            sport: 40000,
            dport: 53,
        };
        let msg = create(&flow, 60).unwrap();
        assert_eq!(msg.kind, 0x100);
        assert_eq!(msg.payload[0], 2, "AF_INET");
        let read = entry(msg.attrs()).unwrap();
        assert_eq!(read.flow, flow);
        assert_eq!(read.zone, None);
        // The deletion sends the tuple back as it came.
        let del = delete(NfProto::Ipv4, &read);
        assert_eq!(del.kind, 0x102);
        assert_eq!(entry(del.attrs()).unwrap(), read);
        let mixed = Flow {
            daddr: "fd00::1".parse().unwrap(),
            ..flow
        };
        assert!(create(&mixed, 60).is_none());
    }

    #[test]
    fn a_flush_compares_ipv4_addresses_but_never_ipv6_ones() {
        let v4 = flush(NfProto::Ipv4, &udp(Some("10.0.0.1")));
        // nfgenmsg, CTA_TUPLE_ORIG { CTA_TUPLE_IP { V4_DST }, CTA_TUPLE_PROTO { NUM, DPORT } },
        // CTA_FILTER { ORIG_FLAGS = IP_DST | PROTO_NUM | PROTO_DST_PORT }.
        let mut want = vec![2, 0, 0, 0];
        want.extend_from_slice(&[36, 0, 1, 0x80]);
        want.extend_from_slice(&[12, 0, 1, 0x80, 8, 0, 2, 0, 10, 0, 0, 1]);
        want.extend_from_slice(&[
            20, 0, 2, 0x80, 5, 0, 1, 0, 17, 0, 0, 0, 6, 0, 3, 0, 0x14, 0xe9, 0, 0,
        ]);
        want.extend_from_slice(&[12, 0, 25, 0x80, 8, 0, 1, 0]);
        want.extend_from_slice(&0x2au32.to_ne_bytes());
        assert_eq!(v4.payload, want);
        assert_eq!(v4.kind, 0x102);

        let v6 = flush(NfProto::Ipv6, &udp(Some("fd00::1")));
        let attrs: Vec<(u16, &[u8])> = attributes(v6.attrs()).collect();
        let orig: Vec<u16> = attributes(attrs[0].1).map(|(k, _)| k).collect();
        assert_eq!(
            orig,
            [CTA_TUPLE_PROTO],
            "no address for the kernel to compare"
        );
        let flags: Vec<(u16, &[u8])> = attributes(attrs[1].1).collect();
        assert_eq!(flags, [(CTA_FILTER_ORIG_FLAGS, &0x28u32.to_ne_bytes()[..])]);
        assert_eq!(v6.payload[0], 10, "AF_INET6");
    }

    #[test]
    fn a_dump_filters_as_a_flush_does_or_not_at_all() {
        let filtered = dump(NfProto::Ipv4, Some(&udp(None)));
        assert_eq!(filtered.kind, 0x101);
        assert_eq!(filtered.attrs(), flush(NfProto::Ipv4, &udp(None)).attrs());
        assert_eq!(dump(NfProto::Ipv6, None).payload, [10, 0, 0, 0]);
    }

    #[test]
    fn the_kernel_compares_ports_of_tcp_and_udp_only() {
        assert!(kernel_compares_ports(L4Proto::Udp));
        assert!(kernel_compares_ports(L4Proto::Tcp));
        assert!(!kernel_compares_ports(L4Proto::Sctp));
    }

    #[test]
    fn replies_without_a_whole_tuple_are_no_entry() {
        let header = |kind: u16| {
            let mut h = NetlinkHeader::default();
            h.message_type = kind;
            h
        };
        let msg = create(
            &Flow {
                proto: L4Proto::Tcp,
                saddr: "fd00::2".parse().unwrap(),
                daddr: "fd00::1".parse().unwrap(),
                sport: 1,
                dport: 2,
            },
            1,
        )
        .unwrap();
        let read = Dumped::deserialize(&header(0x100), &msg.payload).unwrap();
        assert_eq!(read.0.unwrap().flow.dport, 2);
        // Another message type, a truncated payload, a tuple without an address.
        assert!(
            Dumped::deserialize(&header(0x102), &msg.payload)
                .unwrap()
                .0
                .is_none()
        );
        assert!(
            Dumped::deserialize(&header(0x100), &msg.payload[..2])
                .unwrap()
                .0
                .is_none()
        );
        let mut no_ip = vec![10, 0, 0, 0];
        nest(&mut no_ip, CTA_TUPLE_ORIG, |t| {
            nest(t, CTA_TUPLE_PROTO, |p| put(p, CTA_PROTO_NUM, &[17]));
        });
        assert!(
            Dumped::deserialize(&header(0x100), &no_ip)
                .unwrap()
                .0
                .is_none()
        );
    }
}
