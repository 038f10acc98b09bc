//! nf_tables messages as bytes: what is sent, and the decoding of what the kernel answers.
//!
//! `netlink-packet-netfilter` formats the whole attribute buffer with `{:?}` for an error
//! context at every nested attribute it parses, whether or not the parse fails: listing a
//! chain of 2000 iptables-nft rules cost about 150 ms of string formatting, and a set of 16 000
//! elements half a minute (every element of a dump message formats the whole message). So
//! nothing the kernel sends is parsed by it: [`RawMsg`] carries requests and replies as bytes,
//! and the few attributes we read (a rule's handle, comment and expressions; a set's types; an
//! element's key, data and comment) are walked here, copying only what the caller keeps.

use std::io;

use netlink_packet_core::{
    Emitable, NLA_TYPE_MASK, NetlinkDeserializable, NetlinkHeader, NetlinkSerializable,
};
use netlink_packet_netfilter::NetfilterMessage;
use netlink_packet_netfilter::nftables::MetaKey;

use super::ListedRule;
use super::expr::*;

/// One nfnetlink message as bytes: the netlink message type and the payload after the netlink
/// header (the `nfgenmsg`, then the attributes). Requests and batch messages are encoded by
/// `netlink-packet-netfilter` once, into this; replies are kept as this and decoded here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawMsg {
    /// `nlmsg_type`: `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_*`, or a batch begin/end.
    pub kind: u16,
    /// `nfgenmsg` and attributes.
    pub payload: Vec<u8>,
}

impl RawMsg {
    /// A message encoded by `netlink-packet-netfilter`. Its attributes must fit their u16
    /// lengths (see `batch::check_fits`): the crate's encoder panics otherwise.
    pub(crate) fn encode(msg: &NetfilterMessage) -> RawMsg {
        let mut payload = vec![0u8; Emitable::buffer_len(msg)];
        msg.emit(&mut payload);
        RawMsg {
            kind: NetlinkSerializable::message_type(msg),
            payload,
        }
    }

    /// A batch begin (`NFNL_MSG_BATCH_BEGIN`) or end for the nf_tables subsystem.
    pub(crate) fn batch_control(kind: u16) -> RawMsg {
        // nfgenmsg: family AF_UNSPEC, version 0, res_id NFNL_SUBSYS_NFTABLES (big endian).
        let [hi, lo] = NFNL_SUBSYS_NFTABLES.to_be_bytes();
        RawMsg {
            kind,
            payload: vec![0, 0, hi, lo],
        }
    }

    /// The `NFT_MSG_*` of an nf_tables message, `None` for other subsystems.
    pub(crate) fn nft_kind(&self) -> Option<u16> {
        (self.kind >> 8 == NFNL_SUBSYS_NFTABLES).then_some(self.kind & 0xff)
    }

    /// The attributes, after the `nfgenmsg`.
    pub(crate) fn attrs(&self) -> &[u8] {
        self.payload.get(NFGENMSG_LEN..).unwrap_or_default()
    }
}

impl NetlinkSerializable for RawMsg {
    fn message_type(&self) -> u16 {
        self.kind
    }

    fn buffer_len(&self) -> usize {
        self.payload.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.copy_from_slice(&self.payload);
    }
}

impl NetlinkDeserializable for RawMsg {
    type Error = io::Error;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        Ok(RawMsg {
            kind: header.message_type,
            payload: payload.to_vec(),
        })
    }
}

/// The attributes of a netlink payload as `(type, value)`, flags masked off; stops at the first
/// malformed one.
pub(crate) fn attributes(mut bytes: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let header = bytes.get(..4)?;
        let len = usize::from(u16::from_ne_bytes([header[0], header[1]]));
        let kind = u16::from_ne_bytes([header[2], header[3]]) & NLA_TYPE_MASK;
        let value = bytes.get(4..len)?;
        bytes = bytes.get((len + 3) & !3..).unwrap_or_default();
        Some((kind, value))
    })
}

fn find(bytes: &[u8], kind: u16) -> Option<&[u8]> {
    attributes(bytes).find(|(k, _)| *k == kind).map(|(_, v)| v)
}

fn be32(value: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(value.try_into().ok()?))
}

fn u32_of(bytes: &[u8], kind: u16) -> Option<u32> {
    find(bytes, kind).and_then(be32)
}

fn string(value: &[u8]) -> Option<String> {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8(value[..end].to_vec()).ok()
}

// linux/netfilter/nfnetlink.h and nf_tables.h
pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFTA_TABLE_HANDLE` (u64, big-endian).
pub(crate) const NFTA_TABLE_HANDLE: u16 = 4;
pub(crate) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub(crate) const NFNL_MSG_BATCH_END: u16 = 0x11;
pub(crate) const NFT_MSG_NEWTABLE: u16 = 0;
pub(crate) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(crate) const NFT_MSG_NEWRULE: u16 = 6;
pub(crate) const NFT_MSG_NEWSET: u16 = 9;
pub(crate) const NFT_MSG_NEWSETELEM: u16 = 12;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFT_SET_MAP: u32 = 0x8;
const NFT_SET_TIMEOUT: u32 = 0x10;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_EXPIRATION: u16 = 5;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
/// `sizeof(struct nfgenmsg)`.
const NFGENMSG_LEN: usize = 4;

/// One reply of a rule dump, undecoded: the rule's attributes, or `None` for a message that is
/// not a rule. Filtering by chain and by content ([`DumpedRule::contains_any`]) happens on
/// the bytes, so rules a caller does not want cost a copy, not a decoding.
#[derive(Debug)]
pub(crate) struct DumpedRule(Option<Vec<u8>>);

impl NetlinkDeserializable for DumpedRule {
    type Error = io::Error;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        if header.message_type != (NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWRULE) {
            return Ok(DumpedRule(None));
        }
        let attrs = payload.get(NFGENMSG_LEN..).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "rule message without nfgenmsg")
        })?;
        Ok(DumpedRule(Some(attrs.to_vec())))
    }
}

impl DumpedRule {
    /// Whether this is a rule message at all.
    pub(crate) fn is_rule(&self) -> bool {
        self.0.is_some()
    }

    /// Whether this is a rule of `chain` in `table` (old kernels ignore a dump's filter).
    pub(crate) fn is_in(&self, table: &str, chain: &str) -> bool {
        let Some(attrs) = &self.0 else {
            return false;
        };
        let name_is = |kind, want: &str| {
            find(attrs, kind).is_some_and(|v| v.strip_suffix(&[0]).unwrap_or(v) == want.as_bytes())
        };
        name_is(NFTA_RULE_TABLE, table) && name_is(NFTA_RULE_CHAIN, chain)
    }

    /// The chain of a rule of `table` (old kernels ignore a dump's filter), as bytes.
    pub(crate) fn chain_in(&self, table: &str) -> Option<&[u8]> {
        let attrs = self.0.as_deref()?;
        let name = |kind| find(attrs, kind).map(|v| v.strip_suffix(&[0]).unwrap_or(v));
        (name(NFTA_RULE_TABLE)? == table.as_bytes())
            .then(|| name(NFTA_RULE_CHAIN))
            .flatten()
    }

    /// Whether the rule's bytes contain any of `needles`, e.g. an address a wanted rule
    /// compares with: a rule without any cannot be such a rule.
    pub(crate) fn contains_any(&self, needles: &[memchr::memmem::Finder<'_>]) -> bool {
        self.0
            .as_deref()
            .is_some_and(|attrs| needles.iter().any(|n| n.find(attrs).is_some()))
    }

    /// The rule, decoded.
    pub(crate) fn decode(&self) -> ListedRule {
        let mut rule = ListedRule {
            handle: 0,
            comment: None,
            exprs: Vec::new(),
        };
        for (kind, value) in attributes(self.0.as_deref().unwrap_or_default()) {
            match kind {
                NFTA_RULE_HANDLE => {
                    rule.handle = value.try_into().map(u64::from_be_bytes).unwrap_or(0);
                }
                NFTA_RULE_USERDATA => rule.comment = super::userdata::parse_comment(value),
                NFTA_RULE_EXPRESSIONS => {
                    rule.exprs = attributes(value)
                        .filter(|(k, _)| *k == NFTA_LIST_ELEM)
                        .map(|(_, elem)| decode(elem))
                        .collect();
                }
                _ => {}
            }
        }
        rule
    }
}

/// The type ids and flags of a set, from the attributes of its `NFT_MSG_NEWSET`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SetTypes {
    /// `NFTA_SET_KEY_TYPE`.
    pub key: Option<u32>,
    /// `NFTA_SET_DATA_TYPE`, for maps.
    pub data: Option<u32>,
    /// `NFT_SET_MAP` is set.
    pub is_map: bool,
    /// `NFT_SET_TIMEOUT` is set (`flags timeout`).
    pub timeout: bool,
}

/// The types of a set (`NFT_MSG_NEWSET`'s attributes).
pub(crate) fn set_types(attrs: &[u8]) -> SetTypes {
    SetTypes {
        key: u32_of(attrs, NFTA_SET_KEY_TYPE),
        data: u32_of(attrs, NFTA_SET_DATA_TYPE),
        is_map: u32_of(attrs, NFTA_SET_FLAGS).is_some_and(|f| f & NFT_SET_MAP != 0),
        timeout: u32_of(attrs, NFTA_SET_FLAGS).is_some_and(|f| f & NFT_SET_TIMEOUT != 0),
    }
}

/// One element of a set as the kernel lists it, borrowed from the reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RawElement<'a> {
    /// The key's bytes (`NFTA_SET_ELEM_KEY`'s `NFTA_DATA_VALUE`).
    pub key: Option<&'a [u8]>,
    /// Map data (`NFTA_SET_ELEM_DATA`'s `NFTA_DATA_VALUE`).
    pub data: Option<&'a [u8]>,
    /// A verdict map's verdict, decoded.
    pub verdict: Option<Verdict>,
    /// `NFTA_SET_ELEM_USERDATA`, where nft keeps the comment.
    pub userdata: Option<&'a [u8]>,
    /// `NFTA_SET_ELEM_EXPIRATION`: milliseconds left of an element with a timeout (0: it has
    /// expired, and only the set's garbage collection has not freed it yet).
    pub expiration: Option<u64>,
}

/// The elements of one `NFT_MSG_NEWSETELEM` (its attributes): a dump sends as many per
/// message as fit.
pub(crate) fn set_elements(attrs: &[u8]) -> impl Iterator<Item = RawElement<'_>> {
    attributes(attrs)
        .filter(|(k, _)| *k == NFTA_SET_ELEM_LIST_ELEMENTS)
        .flat_map(|(_, list)| attributes(list))
        .filter(|(k, _)| *k == NFTA_LIST_ELEM)
        .map(|(_, elem)| {
            let mut out = RawElement::default();
            for (kind, value) in attributes(elem) {
                match kind {
                    NFTA_SET_ELEM_KEY => out.key = find(value, NFTA_DATA_VALUE),
                    NFTA_SET_ELEM_DATA => {
                        out.data = find(value, NFTA_DATA_VALUE);
                        out.verdict = find(value, NFTA_DATA_VERDICT).and_then(verdict);
                    }
                    NFTA_SET_ELEM_USERDATA => out.userdata = Some(value),
                    NFTA_SET_ELEM_EXPIRATION => {
                        out.expiration = value.try_into().ok().map(u64::from_be_bytes);
                    }
                    // NFTA_SET_ELEM_TIMEOUT, flags, expressions: not needed here.
                    _ => {}
                }
            }
            out
        })
}

/// The attribute of `attrs` (attributes starting at byte `base` of the message) that spans
/// byte `offset` of the message: `(type, its start in the message, value)`.
fn attribute_at(attrs: &[u8], base: usize, offset: usize) -> Option<(u16, usize, &[u8])> {
    let mut at = 0;
    let mut rest = attrs;
    while let Some(header) = rest.get(..4) {
        let len = usize::from(u16::from_ne_bytes([header[0], header[1]]));
        let kind = u16::from_ne_bytes([header[2], header[3]]) & NLA_TYPE_MASK;
        if len < 4 {
            return None;
        }
        let value = rest.get(4..len)?;
        let start = base + at;
        if (start..start + len).contains(&offset) {
            return Some((kind, start, value));
        }
        let step = (len + 3) & !3;
        at += step;
        rest = rest.get(step..).unwrap_or_default();
    }
    None
}

/// Expressions built into `nf_tables` itself: with nf_tables there, a refusal at one of these
/// is about what it refers to (a chain a verdict jumps to, a set a lookup reads), never about
/// the kernel lacking it (see `net/netfilter/nf_tables_core.c`).
const CORE_EXPRESSIONS: [&str; 14] = [
    "immediate",
    "cmp",
    "lookup",
    "bitwise",
    "byteorder",
    "payload",
    "dynset",
    "range",
    "meta",
    "rt",
    "exthdr",
    "last",
    "objref",
    "inner",
];

/// The kernel feature a refusal with ENOENT or EOPNOTSUPP shows missing, from the extended
/// ACK's offset of the refused attribute (`NLMSGERR_ATTR_OFFS`, from the start of the
/// netlink header of `msg`): an expression type the kernel does not know (`expression
/// "fib"`), or a chain type (`chain type "nat"`). The kernel also points at an expression that
/// refers to something missing (a `jump` to no chain, a `lookup` of no set): those are
/// expressions nf_tables always has, and yield `None`, as does an offset elsewhere.
pub(crate) fn missing_feature(msg: &RawMsg, offset: usize) -> Option<String> {
    // The netlink header, then the nfgenmsg.
    const NLMSG_HDRLEN: usize = 16;
    let base = NLMSG_HDRLEN + NFGENMSG_LEN;
    let (kind, start, value) = attribute_at(msg.attrs(), base, offset)?;
    match (msg.nft_kind()?, kind) {
        (NFT_MSG_NEWRULE, NFTA_RULE_EXPRESSIONS) => {
            let (_, _, elem) =
                attribute_at(value, start + 4, offset).filter(|(k, _, _)| *k == NFTA_LIST_ELEM)?;
            let name = find(elem, NFTA_EXPR_NAME).and_then(string)?;
            (!CORE_EXPRESSIONS.contains(&name.as_str())).then(|| format!("expression {name:?}"))
        }
        (NFT_MSG_NEWCHAIN, NFTA_CHAIN_TYPE) => Some(format!("chain type {:?}", string(value)?)),
        _ => None,
    }
}

/// One expression (the value of an `NFTA_LIST_ELEM`); what is not modelled, or malformed,
/// becomes [`Expr::Other`] with its name.
pub(crate) fn decode(elem: &[u8]) -> Expr {
    let name = find(elem, NFTA_EXPR_NAME)
        .and_then(string)
        .unwrap_or_default();
    let data = find(elem, NFTA_EXPR_DATA).unwrap_or_default();
    decode_data(&name, data).unwrap_or(Expr::Other(name))
}

/// The bytes of an `NFTA_DATA_VALUE` inside `bytes`' attribute `kind`.
fn data_value(bytes: &[u8], kind: u16) -> Option<Vec<u8>> {
    find(find(bytes, kind)?, NFTA_DATA_VALUE).map(<[u8]>::to_vec)
}

pub(crate) fn verdict(data: &[u8]) -> Option<Verdict> {
    // NF_DROP, NF_ACCEPT, then the NFT_* verdicts as negative numbers.
    const DROP: i32 = 0;
    const ACCEPT: i32 = 1;
    const JUMP: i32 = -3;
    const GOTO: i32 = -4;
    const RETURN: i32 = -5;
    let code = u32_of(data, NFTA_VERDICT_CODE)?.cast_signed();
    let chain = || find(data, NFTA_VERDICT_CHAIN).and_then(string);
    Some(match code {
        DROP => Verdict::Drop,
        ACCEPT => Verdict::Accept,
        RETURN => Verdict::Return,
        JUMP => Verdict::Jump(chain()?),
        GOTO => Verdict::Goto(chain()?),
        _ => return None,
    })
}

fn decode_data(name: &str, d: &[u8]) -> Option<Expr> {
    Some(match name {
        "payload" => Expr::Payload {
            dreg: u32_of(d, NFTA_PAYLOAD_DREG)?,
            base: PayloadBase::from_code(u32_of(d, NFTA_PAYLOAD_BASE)?)?,
            offset: u32_of(d, NFTA_PAYLOAD_OFFSET)?,
            len: u32_of(d, NFTA_PAYLOAD_LEN)?,
        },
        "meta" => Expr::Meta {
            dreg: u32_of(d, NFTA_META_DREG)?,
            key: MetaKey::from(u32_of(d, NFTA_META_KEY)?),
        },
        "cmp" => Expr::Cmp {
            sreg: u32_of(d, NFTA_CMP_SREG)?,
            op: match u32_of(d, NFTA_CMP_OP)? {
                NFT_CMP_EQ => CmpOp::Eq,
                NFT_CMP_NEQ => CmpOp::Neq,
                _ => return None,
            },
            data: data_value(d, NFTA_CMP_DATA)?,
        },
        "bitwise" => {
            // No NFTA_BITWISE_OP means NFT_BITWISE_BOOL; shifts are not modelled.
            let op = u32_of(d, NFTA_BITWISE_OP);
            if op.is_some_and(|op| op != NFT_BITWISE_BOOL) {
                return None;
            }
            Expr::Bitwise {
                sreg: u32_of(d, NFTA_BITWISE_SREG)?,
                dreg: u32_of(d, NFTA_BITWISE_DREG)?,
                mask: data_value(d, NFTA_BITWISE_MASK)?,
                xor: data_value(d, NFTA_BITWISE_XOR)?,
                explicit_op: op.is_some(),
            }
        }
        "lookup" => Expr::Lookup {
            set: find(d, NFTA_LOOKUP_SET).and_then(string)?,
            sreg: u32_of(d, NFTA_LOOKUP_SREG)?,
            dreg: u32_of(d, NFTA_LOOKUP_DREG),
        },
        "immediate" => {
            let dreg = u32_of(d, NFTA_IMMEDIATE_DREG)?;
            let data = find(d, NFTA_IMMEDIATE_DATA)?;
            if let Some(value) = find(data, NFTA_DATA_VALUE) {
                Expr::ImmediateData {
                    dreg,
                    data: value.to_vec(),
                }
            } else {
                Expr::ImmediateVerdict(verdict(find(data, NFTA_DATA_VERDICT)?)?)
            }
        }
        "ct" => Expr::Ct {
            dreg: u32_of(d, NFTA_CT_DREG)?,
            key: CtKey::from_code(u32_of(d, NFTA_CT_KEY)?)?,
        },
        "fib"
            if u32_of(d, NFTA_FIB_RESULT)? == NFT_FIB_RESULT_ADDRTYPE
                && u32_of(d, NFTA_FIB_FLAGS)? == NFTA_FIB_F_DADDR =>
        {
            Expr::FibDaddrType {
                dreg: u32_of(d, NFTA_FIB_DREG)?,
            }
        }
        "nat" => Expr::Nat {
            kind: match u32_of(d, NFTA_NAT_TYPE)? {
                0 => NatKind::Snat,
                1 => NatKind::Dnat,
                _ => return None,
            },
            family: u32_of(d, NFTA_NAT_FAMILY)?,
            addr: u32_of(d, NFTA_NAT_REG_ADDR_MIN),
            proto: u32_of(d, NFTA_NAT_REG_PROTO_MIN),
            flags: u32_of(d, NFTA_NAT_FLAGS),
        },
        "masq" => Expr::Masquerade,
        "counter" => {
            let u64_of = |kind| {
                find(d, kind)
                    .and_then(|v| v.try_into().ok())
                    .map_or(0, u64::from_be_bytes)
            };
            Expr::Counter {
                bytes: u64_of(NFTA_COUNTER_BYTES),
                packets: u64_of(NFTA_COUNTER_PACKETS),
            }
        }
        "match" => Expr::XtMatch {
            name: find(d, NFTA_MATCH_NAME).and_then(string)?,
            rev: u32_of(d, NFTA_MATCH_REV)?,
            info: find(d, NFTA_MATCH_INFO)?.to_vec(),
        },
        "target" => Expr::XtTarget {
            name: find(d, NFTA_TARGET_NAME).and_then(string)?,
            rev: u32_of(d, NFTA_TARGET_REV)?,
            info: find(d, NFTA_TARGET_INFO)?.to_vec(),
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::Emitable;

    use super::*;

    #[test]
    fn every_modelled_expression_decodes_back_from_its_encoding() {
        let exprs = [
            Expr::Payload {
                base: PayloadBase::Network,
                offset: 16,
                len: 4,
                dreg: 1,
            },
            Expr::Meta {
                key: MetaKey::Iifname,
                dreg: 1,
            },
            Expr::Ct {
                key: CtKey::State,
                dreg: 1,
            },
            Expr::FibDaddrType { dreg: 1 },
            Expr::Cmp {
                sreg: 1,
                op: CmpOp::Neq,
                data: b"br0\0".to_vec(),
            },
            Expr::Bitwise {
                sreg: 1,
                dreg: 1,
                mask: vec![255, 255, 0, 0],
                xor: vec![0; 4],
                explicit_op: true,
            },
            Expr::Bitwise {
                sreg: 1,
                dreg: 2,
                mask: vec![6, 0, 0, 0],
                xor: vec![0; 4],
                explicit_op: false,
            },
            Expr::Lookup {
                set: "ports".into(),
                sreg: 1,
                dreg: Some(1),
            },
            Expr::Lookup {
                set: "addrs".into(),
                sreg: 9,
                dreg: None,
            },
            Expr::ImmediateData {
                dreg: 9,
                data: vec![0, 80],
            },
            Expr::ImmediateVerdict(Verdict::Accept),
            Expr::ImmediateVerdict(Verdict::Drop),
            Expr::ImmediateVerdict(Verdict::Return),
            Expr::ImmediateVerdict(Verdict::Jump("CNI-ADMIN".into())),
            Expr::ImmediateVerdict(Verdict::Goto("hostports".into())),
            Expr::Nat {
                kind: NatKind::Dnat,
                family: 2,
                addr: Some(1),
                proto: Some(9),
                flags: Some(2),
            },
            Expr::Nat {
                kind: NatKind::Snat,
                family: 10,
                addr: Some(1),
                proto: None,
                flags: None,
            },
            Expr::Masquerade,
            Expr::Counter {
                packets: 0,
                bytes: 0,
            },
            Expr::XtMatch {
                name: "comment".into(),
                rev: 0,
                info: vec![b'x'; 256],
            },
            Expr::XtTarget {
                name: "MARK".into(),
                rev: 2,
                info: vec![0, 0x20, 0, 0, 0, 0x20, 0, 0],
            },
            Expr::Other("quota".into()),
        ];
        for expr in exprs {
            let attr = expr.encode();
            let mut bytes = vec![0u8; attr.buffer_len()];
            attr.emit(&mut bytes);
            let (kind, elem) = attributes(&bytes).next().expect("one attribute");
            assert_eq!(kind, NFTA_LIST_ELEM);
            assert_eq!(decode(elem), expr);
        }
    }

    #[test]
    fn malformed_attributes_end_the_walk_without_panicking() {
        assert_eq!(attributes(&[8, 0, 1, 0, 0, 0]).count(), 0);
        assert_eq!(attributes(&[2, 0]).count(), 0);
        assert_eq!(decode(&[]), Expr::Other(String::new()));
        let two = [5, 0, 1, 0, b'a', 0, 0, 0, 4, 0, 2, 0];
        assert_eq!(
            attributes(&two).collect::<Vec<_>>(),
            [(1, &b"a"[..]), (2, &[][..])]
        );
    }
}
