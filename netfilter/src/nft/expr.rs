//! nf_tables expressions: the kernel's instruction set, one register operation each.
//!
//! [`Rule`](super::Rule) builders expand `nft` statements into these, exactly as `nft` does; the
//! listing decodes the kernel's dump back into them. Each variant's doc shows how
//! `nft --debug=netlink` prints it. `netlink-packet-netfilter` encodes payload, meta, cmp,
//! bitwise, lookup and immediate; ct, fib, nat, masq and counter are encoded here, and golden
//! bytes captured from `nft` pin both (`netfilter/testdata/nft/`).

use netlink_packet_core::DefaultNla;
use netlink_packet_netfilter::nftables::{
    Bitwise, Cmp, DataAttribute, ExpressionAttribute, Expressions, Immediate, ListAttribute,
    Lookup, Meta, MetaKey, Operator, Payload, Register, Verdict as NlVerdict, VerdictAttribute,
};

/// The verdict register (`reg 0`).
pub const REG_VERDICT: u32 = 0;
/// The first 16-byte data register (`reg 1`); 32-bit register `n` is `8 + n`.
pub const REG_1: u32 = 1;

/// Where a payload expression reads (`NFT_PAYLOAD_*_HEADER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadBase {
    /// `link layer header`.
    LinkLayer,
    /// `network header`.
    Network,
    /// `transport header`.
    Transport,
}

impl PayloadBase {
    fn code(self) -> u32 {
        match self {
            PayloadBase::LinkLayer => 0,
            PayloadBase::Network => 1,
            PayloadBase::Transport => 2,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<PayloadBase> {
        match code {
            0 => Some(PayloadBase::LinkLayer),
            1 => Some(PayloadBase::Network),
            2 => Some(PayloadBase::Transport),
            _ => None,
        }
    }
}

/// Conntrack keys (`NFT_CT_*`) the rules use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtKey {
    /// `ct state`.
    State,
    /// `ct status`.
    Status,
    /// `ct mark`.
    Mark,
}

impl CtKey {
    fn code(self) -> u32 {
        match self {
            CtKey::State => 0,
            CtKey::Status => 2,
            CtKey::Mark => 3,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<CtKey> {
        match code {
            0 => Some(CtKey::State),
            2 => Some(CtKey::Status),
            3 => Some(CtKey::Mark),
            _ => None,
        }
    }
}

/// Comparison operators (`NFT_CMP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `eq`.
    Eq,
    /// `neq`.
    Neq,
}

/// `SNAT` or `DNAT` (`NFT_NAT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatKind {
    /// Source NAT.
    Snat,
    /// Destination NAT.
    Dnat,
}

/// A verdict: what happens to the packet after a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `return`.
    Return,
    /// `jump CHAIN`.
    Jump(String),
    /// `goto CHAIN`.
    Goto(String),
}

impl Verdict {
    // NF_DROP / NF_ACCEPT are the netfilter verdicts 0 and 1; the rest are NFT_* negatives.
    const DROP: u32 = 0;
    const ACCEPT: u32 = 1;

    pub(crate) fn to_attributes(&self) -> Vec<VerdictAttribute> {
        match self {
            Verdict::Accept => vec![VerdictAttribute::Code(NlVerdict::Other(Self::ACCEPT))],
            Verdict::Drop => vec![VerdictAttribute::Code(NlVerdict::Other(Self::DROP))],
            Verdict::Return => vec![VerdictAttribute::Code(NlVerdict::Return)],
            Verdict::Jump(chain) => vec![
                VerdictAttribute::Code(NlVerdict::Jump),
                VerdictAttribute::Chain(chain.clone()),
            ],
            Verdict::Goto(chain) => vec![
                VerdictAttribute::Code(NlVerdict::Goto),
                VerdictAttribute::Chain(chain.clone()),
            ],
        }
    }
}

/// One nf_tables expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// `[ payload load 4b @ network header + 16 => reg 1 ]`.
    Payload {
        /// Header the offset counts from.
        base: PayloadBase,
        /// Byte offset.
        offset: u32,
        /// Bytes to load.
        len: u32,
        /// Destination register.
        dreg: u32,
    },
    /// `[ meta load l4proto => reg 1 ]`.
    Meta {
        /// Which meta key.
        key: MetaKey,
        /// Destination register.
        dreg: u32,
    },
    /// `[ ct load state => reg 1 ]`.
    Ct {
        /// Which conntrack key.
        key: CtKey,
        /// Destination register.
        dreg: u32,
    },
    /// `[ fib daddr type => reg 1 ]`: the route type of the destination address.
    FibDaddrType {
        /// Destination register.
        dreg: u32,
    },
    /// `[ cmp eq reg 1 0x00000006 ]`.
    Cmp {
        /// Register compared.
        sreg: u32,
        /// Operator.
        op: CmpOp,
        /// Right-hand side, in register byte order.
        data: Vec<u8>,
    },
    /// `[ bitwise reg 1 = ( reg 1 & 0x00000006 ) ^ 0x00000000 ]`.
    Bitwise {
        /// Source register.
        sreg: u32,
        /// Destination register.
        dreg: u32,
        /// AND mask (its length is the operand length).
        mask: Vec<u8>,
        /// XOR value.
        xor: Vec<u8>,
        /// Whether `NFTA_BITWISE_OP` (`NFT_BITWISE_BOOL`, the default) is sent explicitly, as
        /// nft does for a written `&` but not for flag matches.
        explicit_op: bool,
    },
    /// `[ lookup reg 1 set NAME dreg 1 ]` (`dreg 0` for a verdict map, none for a set).
    Lookup {
        /// Set or map name.
        set: String,
        /// First register of the key.
        sreg: u32,
        /// Where a map puts the data.
        dreg: Option<u32>,
    },
    /// `[ immediate reg 1 0x0100000a ]`.
    ImmediateData {
        /// Destination register.
        dreg: u32,
        /// The value, in register byte order.
        data: Vec<u8>,
    },
    /// `[ immediate reg 0 accept ]`.
    ImmediateVerdict(Verdict),
    /// `[ nat dnat ip addr_min reg 1 proto_min reg 9 ]`.
    Nat {
        /// SNAT or DNAT.
        kind: NatKind,
        /// `NFPROTO_IPV4` or `NFPROTO_IPV6`.
        family: u32,
        /// Register holding the address.
        addr: Option<u32>,
        /// Register holding the port.
        proto: Option<u32>,
        /// `NF_NAT_RANGE_*` flags, when `nft` sends them.
        flags: Option<u32>,
    },
    /// `[ masq ]`.
    Masquerade,
    /// `[ counter pkts 0 bytes 0 ]`; the listing fills in the kernel's counts.
    Counter {
        /// Packets seen.
        packets: u64,
        /// Bytes seen.
        bytes: u64,
    },
    /// `[ match name conntrack rev 3 ]`: an xtables match, as `iptables-nft` writes the
    /// extensions it has no native form for (`-m comment`, `-m conntrack`, …).
    XtMatch {
        /// The extension's name.
        name: String,
        /// Its revision.
        rev: u32,
        /// Its `xt_*_info` structure, in host byte order and padded as the kernel keeps it.
        info: Vec<u8>,
    },
    /// `[ target name DNAT rev 2 ]`: an xtables target, as `iptables-nft` writes the targets
    /// it has no native form for (`-j DNAT`, `-j MARK`, `-j MASQUERADE`, …).
    XtTarget {
        /// The extension's name.
        name: String,
        /// Its revision.
        rev: u32,
        /// Its `xt_*` target structure, in host byte order and padded as the kernel keeps it.
        info: Vec<u8>,
    },
    /// An expression this module does not model, by name.
    Other(String),
}

// Attribute numbers of the expressions (linux/netfilter/nf_tables.h): those encoded here, and
// those the crate encodes but [`super::raw`] decodes.
pub(super) const NFTA_PAYLOAD_DREG: u16 = 1;
pub(super) const NFTA_PAYLOAD_BASE: u16 = 2;
pub(super) const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub(super) const NFTA_PAYLOAD_LEN: u16 = 4;
pub(super) const NFTA_META_DREG: u16 = 1;
pub(super) const NFTA_META_KEY: u16 = 2;
pub(super) const NFTA_CMP_SREG: u16 = 1;
pub(super) const NFTA_CMP_OP: u16 = 2;
pub(super) const NFTA_CMP_DATA: u16 = 3;
pub(super) const NFT_CMP_EQ: u32 = 0;
pub(super) const NFT_CMP_NEQ: u32 = 1;
pub(super) const NFTA_BITWISE_SREG: u16 = 1;
pub(super) const NFTA_BITWISE_DREG: u16 = 2;
pub(super) const NFTA_BITWISE_MASK: u16 = 4;
pub(super) const NFTA_BITWISE_XOR: u16 = 5;
pub(super) const NFTA_BITWISE_OP: u16 = 6;
pub(super) const NFTA_LOOKUP_SET: u16 = 1;
pub(super) const NFTA_LOOKUP_SREG: u16 = 2;
pub(super) const NFTA_LOOKUP_DREG: u16 = 3;
pub(super) const NFTA_IMMEDIATE_DREG: u16 = 1;
pub(super) const NFTA_IMMEDIATE_DATA: u16 = 2;
pub(super) const NFTA_CT_DREG: u16 = 1;
pub(super) const NFTA_CT_KEY: u16 = 2;
pub(super) const NFTA_FIB_DREG: u16 = 1;
pub(super) const NFTA_FIB_RESULT: u16 = 2;
pub(super) const NFTA_FIB_FLAGS: u16 = 3;
pub(super) const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub(super) const NFTA_FIB_F_DADDR: u32 = 2;
pub(super) const NFTA_NAT_TYPE: u16 = 1;
pub(super) const NFTA_NAT_FAMILY: u16 = 2;
pub(super) const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub(super) const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub(super) const NFTA_NAT_FLAGS: u16 = 7;
pub(super) const NFT_BITWISE_BOOL: u32 = 0;
pub(super) const NFTA_COUNTER_BYTES: u16 = 1;
pub(super) const NFTA_COUNTER_PACKETS: u16 = 2;
pub(super) const NFTA_MATCH_NAME: u16 = 1;
pub(super) const NFTA_MATCH_REV: u16 = 2;
pub(super) const NFTA_MATCH_INFO: u16 = 3;
pub(super) const NFTA_TARGET_NAME: u16 = 1;
pub(super) const NFTA_TARGET_REV: u16 = 2;
pub(super) const NFTA_TARGET_INFO: u16 = 3;

fn u32_nla(kind: u16, value: u32) -> DefaultNla {
    DefaultNla::new(kind, value.to_be_bytes().to_vec())
}

/// The attributes of an xtables match or target: its NUL-terminated name, its revision and
/// its info (`NFTA_MATCH_*` and `NFTA_TARGET_*` number them alike).
fn xt_attributes(name: &str, rev: u32, info: &[u8]) -> Vec<DefaultNla> {
    let mut c_name = name.as_bytes().to_vec();
    c_name.push(0);
    vec![
        DefaultNla::new(NFTA_MATCH_NAME, c_name),
        u32_nla(NFTA_MATCH_REV, rev),
        DefaultNla::new(NFTA_MATCH_INFO, info.to_vec()),
    ]
}

fn own(name: &str, attributes: Vec<DefaultNla>) -> Expressions {
    Expressions::Other {
        expression_type: name.to_string(),
        attributes,
    }
}

impl Expr {
    /// The netlink form: one `NFTA_LIST_ELEM` of a rule's `NFTA_RULE_EXPRESSIONS`.
    pub(crate) fn encode(&self) -> ListAttribute<ExpressionAttribute> {
        let reg = |r: u32| Register::from(r);
        let value = |d: &[u8]| DataAttribute::Value(d.to_vec());
        let exprs = match self {
            Expr::Payload {
                base,
                offset,
                len,
                dreg,
            } => Expressions::Payload(vec![
                Payload::DestinationRegister(reg(*dreg)),
                Payload::Base(base.code()),
                Payload::Offset(*offset),
                Payload::Len(*len),
            ]),
            Expr::Meta { key, dreg } => {
                Expressions::Meta(vec![Meta::Key(*key), Meta::DestinationRegister(reg(*dreg))])
            }
            Expr::Ct { key, dreg } => own(
                "ct",
                vec![
                    u32_nla(NFTA_CT_KEY, key.code()),
                    u32_nla(NFTA_CT_DREG, *dreg),
                ],
            ),
            Expr::FibDaddrType { dreg } => own(
                "fib",
                vec![
                    u32_nla(NFTA_FIB_FLAGS, NFTA_FIB_F_DADDR),
                    u32_nla(NFTA_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE),
                    u32_nla(NFTA_FIB_DREG, *dreg),
                ],
            ),
            Expr::Cmp { sreg, op, data } => Expressions::Cmp(vec![
                Cmp::SourceRegister(reg(*sreg)),
                Cmp::Op(match op {
                    CmpOp::Eq => Operator::Equal,
                    CmpOp::Neq => Operator::NotEqual,
                }),
                Cmp::Data(value(data)),
            ]),
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
                explicit_op,
            } => {
                let mut attrs = vec![
                    Bitwise::SourceRegister(reg(*sreg)),
                    Bitwise::DestinationRegister(reg(*dreg)),
                ];
                if *explicit_op {
                    attrs.push(Bitwise::Op(NFT_BITWISE_BOOL));
                }
                attrs.extend([
                    Bitwise::Length(u32::try_from(mask.len()).unwrap_or(u32::MAX)),
                    Bitwise::Mask(value(mask)),
                    Bitwise::Xor(value(xor)),
                ]);
                Expressions::Bitwise(attrs)
            }
            Expr::Lookup { set, sreg, dreg } => {
                let mut attrs = vec![Lookup::SourceRegister(reg(*sreg))];
                if let Some(dreg) = dreg {
                    attrs.push(Lookup::DestinationRegister(reg(*dreg)));
                }
                attrs.push(Lookup::Set(set.clone()));
                Expressions::Lookup(attrs)
            }
            Expr::ImmediateData { dreg, data } => Expressions::Immediate(vec![
                Immediate::DestinationRegister(reg(*dreg)),
                Immediate::Data(value(data)),
            ]),
            Expr::ImmediateVerdict(verdict) => Expressions::Immediate(vec![
                Immediate::DestinationRegister(reg(REG_VERDICT)),
                Immediate::Data(DataAttribute::Verdict(verdict.to_attributes())),
            ]),
            Expr::Nat {
                kind,
                family,
                addr,
                proto,
                flags,
            } => {
                let mut attrs = vec![
                    u32_nla(
                        NFTA_NAT_TYPE,
                        match kind {
                            NatKind::Snat => 0,
                            NatKind::Dnat => 1,
                        },
                    ),
                    u32_nla(NFTA_NAT_FAMILY, *family),
                ];
                if let Some(r) = addr {
                    attrs.push(u32_nla(NFTA_NAT_REG_ADDR_MIN, *r));
                }
                if let Some(r) = proto {
                    attrs.push(u32_nla(NFTA_NAT_REG_PROTO_MIN, *r));
                }
                if let Some(f) = flags {
                    attrs.push(u32_nla(NFTA_NAT_FLAGS, *f));
                }
                own("nat", attrs)
            }
            Expr::Masquerade => own("masq", vec![]),
            // `nft` sends a counter without initial values; the kernel starts at zero.
            Expr::Counter { .. } => own("counter", vec![]),
            Expr::XtMatch { name, rev, info } => own("match", xt_attributes(name, *rev, info)),
            Expr::XtTarget { name, rev, info } => own("target", xt_attributes(name, *rev, info)),
            Expr::Other(name) => own(name, vec![]),
        };
        ListAttribute::from(exprs)
    }
}
