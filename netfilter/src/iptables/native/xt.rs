//! The xtables structures `iptables-nft` sends for the extensions it has no native nf_tables
//! form for (and, for `tcp`, `udp` and `mark`, those 1.8.7 sends where later releases write
//! native expressions, which 1.8.7 cannot read): the `info` of an [`Expr::XtMatch`](crate::nft::Expr::XtMatch) or
//! [`Expr::XtTarget`](crate::nft::Expr::XtTarget), byte for byte as the kernel keeps it (host
//! byte order, padded to `XT_ALIGN`, the x86-64 layout of `linux/netfilter/xt_*.h`), and the
//! decoding back to the values `iptables-save` prints. Each decoder accepts only what its
//! encoder makes: a structure with any other field set is not one of ours to print.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::super::Family;

fn u16_at(info: &[u8], at: usize) -> Option<u16> {
    info.get(at..at + 2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
}

fn u32_at(info: &[u8], at: usize) -> Option<u32> {
    info.get(at..at + 4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

fn put_u16(info: &mut [u8], at: usize, value: u16) {
    info[at..at + 2].copy_from_slice(&value.to_ne_bytes());
}

fn put_u32(info: &mut [u8], at: usize, value: u32) {
    info[at..at + 4].copy_from_slice(&value.to_ne_bytes());
}

/// Whether every byte of `info` from `end` on is zero.
fn zero_after(info: &[u8], end: usize) -> bool {
    info.get(end..)
        .is_some_and(|rest| rest.iter().all(|b| *b == 0))
}

// ---------------------------------------------------------------------------------------------
// -m comment (revision 0): `struct xt_comment_info { char comment[256]; }`.

/// `XT_MAX_COMMENT_LEN`: the comment and its terminating NUL.
const COMMENT_LEN: usize = 256;

/// The info of `-m comment --comment TEXT`; `None` when the text is longer than 255 bytes or
/// holds a NUL (the tool refuses both).
pub(super) fn comment_info(text: &str) -> Option<Vec<u8>> {
    if text.len() >= COMMENT_LEN || text.contains('\0') {
        return None;
    }
    let mut info = text.as_bytes().to_vec();
    info.resize(COMMENT_LEN, 0);
    Some(info)
}

/// The text of a comment match.
pub(super) fn comment(info: &[u8]) -> Option<String> {
    if info.len() != COMMENT_LEN {
        return None;
    }
    let end = info.iter().position(|b| *b == 0)?;
    if !zero_after(info, end) {
        return None;
    }
    String::from_utf8(info[..end].to_vec()).ok()
}

// ---------------------------------------------------------------------------------------------
// -m conntrack (revision 3): `struct xt_conntrack_mtinfo3`: eight 16-byte addresses and masks,
// two u32 expiry bounds, five u16 (l4proto and ports), then the u16 flags.

const CT_MATCH_FLAGS: usize = 146;
const CT_INVERT_FLAGS: usize = 148;
const CT_STATE_MASK: usize = 150;
/// `XT_ALIGN(sizeof(struct xt_conntrack_mtinfo3))`.
const CT_INFO_LEN: usize = 168;
const XT_CONNTRACK_STATE: u16 = 1;
/// The states in the order `iptables-save` prints them, with their `XT_CONNTRACK_STATE_*` bit.
const CT_STATES: [(&str, u16); 7] = [
    ("INVALID", 1),
    ("NEW", 1 << 3),
    ("RELATED", 1 << 2),
    ("ESTABLISHED", 1 << 1),
    ("UNTRACKED", 1 << 8),
    ("SNAT", 1 << 6),
    ("DNAT", 1 << 7),
];

/// The info of `-m conntrack [!] --ctstate A,B`.
pub(super) fn ctstate_info(negated: bool, states: &str) -> Option<Vec<u8>> {
    let mut mask = 0u16;
    for state in states.split(',') {
        mask |= CT_STATES.iter().find(|(name, _)| *name == state)?.1;
    }
    let mut info = vec![0; CT_INFO_LEN];
    put_u16(&mut info, CT_MATCH_FLAGS, XT_CONNTRACK_STATE);
    if negated {
        put_u16(&mut info, CT_INVERT_FLAGS, XT_CONNTRACK_STATE);
    }
    put_u16(&mut info, CT_STATE_MASK, mask);
    Some(info)
}

/// `[!] --ctstate A,B` from a conntrack match that tests the state and nothing else.
pub(super) fn ctstate(info: &[u8]) -> Option<Vec<String>> {
    let (flags, invert, mask) = (
        u16_at(info, CT_MATCH_FLAGS)?,
        u16_at(info, CT_INVERT_FLAGS)?,
        u16_at(info, CT_STATE_MASK)?,
    );
    if flags != XT_CONNTRACK_STATE || invert & !XT_CONNTRACK_STATE != 0 || mask == 0 {
        return None;
    }
    let known = CT_STATES.iter().fold(0, |all, (_, bit)| all | bit);
    if mask & !known != 0 {
        return None;
    }
    let states: Vec<&str> = CT_STATES
        .iter()
        .filter(|(_, bit)| mask & bit != 0)
        .map(|(name, _)| *name)
        .collect();
    let mut args = Vec::new();
    if invert != 0 {
        args.push("!".to_owned());
    }
    args.push("--ctstate".to_owned());
    args.push(states.join(","));
    Some(args)
}

// ---------------------------------------------------------------------------------------------
// -m multiport (revision 1): `struct xt_multiport_v1 { u8 flags; u8 count; u16 ports[15];
// u8 pflags[15]; u8 invert; }`.

/// The most ports one multiport match holds (`XT_MULTI_PORTS`).
pub const MULTIPORT_MAX: usize = 15;
const MULTIPORT_LEN: usize = 48;
const MULTIPORT_PORTS: usize = 2;
const XT_MULTIPORT_DESTINATION: u8 = 1;

/// The info of `-m multiport --dports P1,P2,…` (single ports, at most 15).
pub(super) fn multiport_info(ports: &[u16]) -> Option<Vec<u8>> {
    if ports.is_empty() || ports.len() > MULTIPORT_MAX {
        return None;
    }
    let mut info = vec![0; MULTIPORT_LEN];
    info[0] = XT_MULTIPORT_DESTINATION;
    info[1] = u8::try_from(ports.len()).ok()?;
    for (i, port) in ports.iter().enumerate() {
        put_u16(&mut info, MULTIPORT_PORTS + 2 * i, *port);
    }
    Some(info)
}

/// The ports of a multiport match of destination ports without ranges or negation.
pub(super) fn multiport_dports(info: &[u8]) -> Option<Vec<u16>> {
    if info.len() != MULTIPORT_LEN || info[0] != XT_MULTIPORT_DESTINATION {
        return None;
    }
    let count = usize::from(info[1]);
    if count == 0 || count > MULTIPORT_MAX {
        return None;
    }
    let ports_end = MULTIPORT_PORTS + 2 * count;
    // No pflags (ranges), no invert, nothing past the ports.
    if !zero_after(info, ports_end) {
        return None;
    }
    (0..count)
        .map(|i| u16_at(info, MULTIPORT_PORTS + 2 * i))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// -m addrtype (revision 1): `struct xt_addrtype_info_v1 { u16 source; u16 dest; u32 flags; }`.

const ADDRTYPE_LEN: usize = 8;
const XT_ADDRTYPE_INVERT_SOURCE: u32 = 1;
const XT_ADDRTYPE_INVERT_DEST: u32 = 2;
/// The address types in bit order (`1 << i`), as the tool names them.
const ADDRTYPES: [&str; 12] = [
    "UNSPEC",
    "UNICAST",
    "LOCAL",
    "BROADCAST",
    "ANYCAST",
    "MULTICAST",
    "BLACKHOLE",
    "UNREACHABLE",
    "PROHIBIT",
    "THROW",
    "NAT",
    "XRESOLVE",
];

/// The type bits of `LOCAL,UNICAST`.
pub(super) fn addrtype_bits(types: &str) -> Option<u16> {
    let mut bits = 0u16;
    for name in types.split(',') {
        let at = ADDRTYPES.iter().position(|t| *t == name)?;
        bits |= 1 << at;
    }
    Some(bits)
}

fn addrtype_names(bits: u16) -> String {
    ADDRTYPES
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, name)| *name)
        .collect::<Vec<_>>()
        .join(",")
}

/// The info of `-m addrtype [[!] --src-type S] [[!] --dst-type D]`: (negated, type bits)
/// each.
pub(super) fn addrtype_info(src: Option<(bool, u16)>, dst: Option<(bool, u16)>) -> Vec<u8> {
    let mut info = vec![0; ADDRTYPE_LEN];
    let mut flags = 0;
    if let Some((negated, bits)) = src {
        put_u16(&mut info, 0, bits);
        if negated {
            flags |= XT_ADDRTYPE_INVERT_SOURCE;
        }
    }
    if let Some((negated, bits)) = dst {
        put_u16(&mut info, 2, bits);
        if negated {
            flags |= XT_ADDRTYPE_INVERT_DEST;
        }
    }
    put_u32(&mut info, 4, flags);
    info
}

/// `[!] --src-type S [!] --dst-type D` from an addrtype match without interface limits.
pub(super) fn addrtype(info: &[u8]) -> Option<Vec<String>> {
    if info.len() != ADDRTYPE_LEN {
        return None;
    }
    let (src, dst, flags) = (u16_at(info, 0)?, u16_at(info, 2)?, u32_at(info, 4)?);
    if flags & !(XT_ADDRTYPE_INVERT_SOURCE | XT_ADDRTYPE_INVERT_DEST) != 0
        || (src == 0 && dst == 0)
        || (src | dst) >> ADDRTYPES.len() != 0
    {
        return None;
    }
    let mut args = Vec::new();
    for (bits, invert, opt) in [
        (src, XT_ADDRTYPE_INVERT_SOURCE, "--src-type"),
        (dst, XT_ADDRTYPE_INVERT_DEST, "--dst-type"),
    ] {
        if bits == 0 {
            if flags & invert != 0 {
                return None;
            }
            continue;
        }
        if flags & invert != 0 {
            args.push("!".to_owned());
        }
        args.push(opt.to_owned());
        args.push(addrtype_names(bits));
    }
    Some(args)
}

// ---------------------------------------------------------------------------------------------
// -m tcp (revision 0): `struct xt_tcp { u16 spts[2]; u16 dpts[2]; u8 option, flg_mask, flg_cmp,
// invflags; }`; -m udp (revision 0): `struct xt_udp { u16 spts[2]; u16 dpts[2]; u8 invflags; }`.
// Ports in host byte order; both padded to 16 bytes.

/// `XT_ALIGN(sizeof(struct xt_tcp))`, which is also `struct xt_udp`'s.
const TCPUDP_LEN: usize = 16;
/// `XT_TCP_INV_DSTPT`, `XT_UDP_INV_DSTPT`.
const INV_DSTPT: u8 = 2;

/// Where `invflags` sits in `struct xt_tcp` (`tcp`) or `struct xt_udp`.
fn tcpudp_invflags(tcp: bool) -> usize {
    if tcp { 11 } else { 8 }
}

/// The info of `-m tcp|udp [!] --dport N`: every source port, destination ports N–N.
pub(super) fn dport_info(tcp: bool, port: u16, negated: bool) -> Vec<u8> {
    let mut info = vec![0; TCPUDP_LEN];
    put_u16(&mut info, 2, u16::MAX);
    put_u16(&mut info, 4, port);
    put_u16(&mut info, 6, port);
    if negated {
        info[tcpudp_invflags(tcp)] = INV_DSTPT;
    }
    info
}

/// Whether the destination port is negated, and the port, of a tcp or udp match that tests
/// one destination port and nothing else.
pub(super) fn dport(tcp: bool, info: &[u8]) -> Option<(bool, u16)> {
    if info.len() != TCPUDP_LEN {
        return None;
    }
    let port = u16_at(info, 4)?;
    let negated = info[tcpudp_invflags(tcp)] == INV_DSTPT;
    (info == dport_info(tcp, port, negated).as_slice()).then_some((negated, port))
}

// ---------------------------------------------------------------------------------------------
// -m mark (revision 1): `struct xt_mark_mtinfo1 { u32 mark, mask; u8 invert; }`, 16 bytes.

const MARK_MATCH_LEN: usize = 16;

/// The info of `-m mark [!] --mark MARK/MASK`.
pub(super) fn mark_match_info(mark: u32, mask: u32, negated: bool) -> Vec<u8> {
    let mut info = vec![0; MARK_MATCH_LEN];
    put_u32(&mut info, 0, mark);
    put_u32(&mut info, 4, mask);
    info[8] = u8::from(negated);
    info
}

/// The mark, mask and negation of a mark match.
pub(super) fn mark_match(info: &[u8]) -> Option<(u32, u32, bool)> {
    if info.len() != MARK_MATCH_LEN || info[8] > 1 || !zero_after(info, 9) {
        return None;
    }
    Some((u32_at(info, 0)?, u32_at(info, 4)?, info[8] == 1))
}

// ---------------------------------------------------------------------------------------------
// -m sctp (revision 0): `struct xt_sctp_info { u16 dpts[2]; u16 spts[2]; u32 chunkmap[64];
// u32 chunk_match_type; struct { u8 chunktype, flag, flag_mask; } flag_info[4];
// int flag_count; u32 flags; u32 invflags; }`.

/// `XT_ALIGN(sizeof(struct xt_sctp_info))`.
const SCTP_LEN: usize = 296;
const SCTP_FLAGS: usize = 284;
const XT_SCTP_DEST_PORTS: u32 = 2;

/// Where `flag_info[4]` starts; its entries are 3 bytes each, `chunktype` first.
const SCTP_FLAG_INFO: usize = 268;

/// The info of `-m sctp --dport N`: destination ports N–N, and the tool's defaults otherwise
/// (no chunk flags: each `flag_info[i].chunktype` is -1).
pub(super) fn sctp_dport_info(port: u16) -> Vec<u8> {
    let mut info = vec![0; SCTP_LEN];
    put_u16(&mut info, 0, port);
    put_u16(&mut info, 2, port);
    for i in 0..4 {
        info[SCTP_FLAG_INFO + 3 * i] = u8::MAX;
    }
    put_u32(&mut info, SCTP_FLAGS, XT_SCTP_DEST_PORTS);
    info
}

/// The port of an sctp match that tests one destination port and nothing else.
pub(super) fn sctp_dport(info: &[u8]) -> Option<u16> {
    if info.len() != SCTP_LEN {
        return None;
    }
    let port = u16_at(info, 0)?;
    (info == sctp_dport_info(port).as_slice()).then_some(port)
}

// ---------------------------------------------------------------------------------------------
// -j DNAT (revision 2): `struct nf_nat_range2 { u32 flags; union nf_inet_addr min_addr,
// max_addr; __be16 min_proto, max_proto, base_proto; }`.

/// `XT_ALIGN(sizeof(struct nf_nat_range2))`.
const NAT_RANGE2_LEN: usize = 48;
const NF_NAT_RANGE_MAP_IPS: u32 = 1;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;

/// The info of `-j DNAT --to-destination ADDR[:PORT]` (one address, one port).
pub(super) fn dnat_info(addr: IpAddr, port: Option<u16>) -> Vec<u8> {
    let mut info = vec![0; NAT_RANGE2_LEN];
    let mut flags = NF_NAT_RANGE_MAP_IPS;
    let bytes = crate::nft::addr_bytes(addr);
    info[4..4 + bytes.len()].copy_from_slice(&bytes);
    info[20..20 + bytes.len()].copy_from_slice(&bytes);
    if let Some(port) = port {
        flags |= NF_NAT_RANGE_PROTO_SPECIFIED;
        info[36..38].copy_from_slice(&port.to_be_bytes());
        info[38..40].copy_from_slice(&port.to_be_bytes());
    }
    put_u32(&mut info, 0, flags);
    info
}

/// The address and port of a DNAT target to one address of `family` and at most one port.
pub(super) fn dnat(family: Family, info: &[u8]) -> Option<(IpAddr, Option<u16>)> {
    if info.len() != NAT_RANGE2_LEN {
        return None;
    }
    let addr = match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&info[4..8]).ok()?)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&info[4..20]).ok()?)),
    };
    let flags = u32_at(info, 0)?;
    let port = match flags {
        NF_NAT_RANGE_MAP_IPS => None,
        f if f == NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED => {
            Some(u16::from_be_bytes([info[36], info[37]]))
        }
        _ => return None,
    };
    (info == dnat_info(addr, port).as_slice()).then_some((addr, port))
}

// ---------------------------------------------------------------------------------------------
// -j MASQUERADE (revision 0): IPv4 `struct nf_nat_ipv4_multi_range_compat { u32 rangesize;
// struct nf_nat_ipv4_range range[1]; }` with one empty range; IPv6 an empty
// `struct nf_nat_range`.

/// The info of `-j MASQUERADE` (no options).
pub(super) fn masquerade_info(family: Family) -> Vec<u8> {
    match family {
        Family::V4 => {
            let mut info = vec![0; 24];
            put_u32(&mut info, 0, 1);
            info
        }
        Family::V6 => vec![0; 40],
    }
}

// ---------------------------------------------------------------------------------------------
// -j MARK (revision 2): `struct xt_mark_tginfo2 { u32 mark, mask; }`.

/// The info of `-j MARK --set-xmark MARK/MASK`.
pub(super) fn mark_info(mark: u32, mask: u32) -> Vec<u8> {
    let mut info = vec![0; 8];
    put_u32(&mut info, 0, mark);
    put_u32(&mut info, 4, mask);
    info
}

/// The mark and mask of a MARK target.
pub(super) fn mark(info: &[u8]) -> Option<(u32, u32)> {
    if info.len() != 8 {
        return None;
    }
    Some((u32_at(info, 0)?, u32_at(info, 4)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_structure_decodes_back_from_its_encoding() {
        assert_eq!(
            comment(&comment_info("dnat name: \"n\"").unwrap()).as_deref(),
            Some("dnat name: \"n\"")
        );
        assert!(comment_info(&"x".repeat(255)).is_some());
        assert!(comment_info(&"x".repeat(256)).is_none());
        assert_eq!(
            ctstate(&ctstate_info(true, "NEW,INVALID").unwrap()).unwrap(),
            ["!", "--ctstate", "INVALID,NEW"]
        );
        assert_eq!(
            multiport_dports(&multiport_info(&[8080, 443]).unwrap()).unwrap(),
            [8080, 443]
        );
        assert!(multiport_info(&[1; 16]).is_none());
        let local = addrtype_bits("LOCAL").unwrap();
        assert_eq!(local, 4);
        assert_eq!(
            addrtype(&addrtype_info(None, Some((false, local)))).unwrap(),
            ["--dst-type", "LOCAL"]
        );
        assert_eq!(
            addrtype(&addrtype_info(
                Some((true, addrtype_bits("UNICAST,LOCAL").unwrap())),
                None
            ))
            .unwrap(),
            ["!", "--src-type", "UNICAST,LOCAL"]
        );
        assert_eq!(sctp_dport(&sctp_dport_info(9)), Some(9));
        for tcp in [true, false] {
            assert_eq!(
                dport(tcp, &dport_info(tcp, 8080, false)),
                Some((false, 8080))
            );
            assert_eq!(dport(tcp, &dport_info(tcp, 1, true)), Some((true, 1)));
        }
        assert_eq!(
            mark_match(&mark_match_info(0x2000, 0x2000, false)),
            Some((0x2000, 0x2000, false))
        );
        assert_eq!(
            mark_match(&mark_match_info(1, u32::MAX, true)),
            Some((1, u32::MAX, true))
        );
        let v6: IpAddr = "fd00::2".parse().unwrap();
        assert_eq!(
            dnat(Family::V6, &dnat_info(v6, Some(80))),
            Some((v6, Some(80)))
        );
        let v4: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(dnat(Family::V4, &dnat_info(v4, None)), Some((v4, None)));
        assert_eq!(mark(&mark_info(0x2000, 0x2000)), Some((0x2000, 0x2000)));
    }

    #[test]
    fn structures_with_other_fields_set_are_not_decoded() {
        let mut ports = multiport_info(&[80, 81]).unwrap();
        ports[MULTIPORT_PORTS + 30] = 1; // a range flag
        assert_eq!(multiport_dports(&ports), None);
        let mut addr = addrtype_info(None, Some((false, 4)));
        addr[4] |= 4; // --limit-iface-in
        assert_eq!(addrtype(&addr), None);
        let mut sctp = sctp_dport_info(9);
        sctp[8] = 1; // a chunk in the chunk map
        assert_eq!(sctp_dport(&sctp), None);
        let mut tcp = dport_info(true, 80, false);
        tcp[0] = 1; // a source port range
        assert_eq!(dport(true, &tcp), None);
        let mut tcp = dport_info(true, 80, false);
        tcp[9] = 2; // --tcp-flags
        assert_eq!(dport(true, &tcp), None);
        let mut range = dport_info(false, 80, false);
        range[6] = 90; // destination ports 80-90
        assert_eq!(dport(false, &range), None);
        let mut mark = mark_match_info(1, 1, false);
        mark[8] = 2;
        assert_eq!(mark_match(&mark), None);
        let v4: IpAddr = "10.0.0.2".parse().unwrap();
        let mut nat = dnat_info(v4, Some(80));
        nat[23] = 9; // a range of addresses
        assert_eq!(dnat(Family::V4, &nat), None);
        let mut text = comment_info("a").unwrap();
        text[10] = b'b';
        assert_eq!(comment(&text), None);
    }
}
