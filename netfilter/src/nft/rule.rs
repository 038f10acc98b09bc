//! Rules, written the way `nft` reads.
//!
//! A [`Rule`] is a list of statements. Encoding expands them into [`Expr`]s exactly as `nft`
//! 1.0.6 does (register allocation, implicit `meta nfproto` dependencies in `inet` tables,
//! shortened loads for byte-aligned prefixes), so a listed rule prints as its `nft` text and
//! the golden bytes captured from `nft` match ours.

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_netfilter::nftables::MetaKey;

use super::Family;
use super::expr::{CmpOp, CtKey, Expr, NatKind, PayloadBase, REG_1, REG_VERDICT, Verdict};
use super::set::L4Proto;

/// The IP version a statement is about: `meta nfproto ipv4`, `dnat ip to …`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NfProto {
    /// `ipv4` / `ip`.
    Ipv4,
    /// `ipv6` / `ip6`.
    Ipv6,
}

impl NfProto {
    /// The `NFPROTO_*` number.
    pub fn code(self) -> u8 {
        match self {
            NfProto::Ipv4 => 2,
            NfProto::Ipv6 => 10,
        }
    }

    /// The version of `addr`.
    pub fn of(addr: IpAddr) -> NfProto {
        match addr {
            IpAddr::V4(_) => NfProto::Ipv4,
            IpAddr::V6(_) => NfProto::Ipv6,
        }
    }
}

/// Something a rule loads from the packet or its metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Selector {
    /// `ip saddr`.
    IpSaddr,
    /// `ip daddr`.
    IpDaddr,
    /// `ip6 saddr`.
    Ip6Saddr,
    /// `ip6 daddr`.
    Ip6Daddr,
    /// `meta l4proto`.
    MetaL4proto,
    /// `th sport`: the transport source port, whatever the protocol.
    ThSport,
    /// `th dport`: the transport destination port, whatever the protocol.
    ThDport,
    /// `meta nfproto`.
    MetaNfproto,
    /// `meta mark`.
    MetaMark,
    /// `iifname`.
    IifName,
    /// `oifname`.
    OifName,
    /// `ct mark`.
    CtMark,
    /// `ct state`.
    CtState,
    /// `ct status`.
    CtStatus,
}

impl Selector {
    /// The `saddr` selector of an IP version.
    pub fn saddr(v: NfProto) -> Selector {
        match v {
            NfProto::Ipv4 => Selector::IpSaddr,
            NfProto::Ipv6 => Selector::Ip6Saddr,
        }
    }

    /// The `daddr` selector of an IP version.
    pub fn daddr(v: NfProto) -> Selector {
        match v {
            NfProto::Ipv4 => Selector::IpDaddr,
            NfProto::Ipv6 => Selector::Ip6Daddr,
        }
    }

    /// Bytes loaded.
    fn len(self) -> u32 {
        match self {
            Selector::IpSaddr | Selector::IpDaddr => 4,
            Selector::Ip6Saddr | Selector::Ip6Daddr => 16,
            Selector::MetaL4proto | Selector::MetaNfproto => 1,
            Selector::ThSport | Selector::ThDport => 2,
            Selector::MetaMark | Selector::CtMark | Selector::CtState | Selector::CtStatus => 4,
            Selector::IifName | Selector::OifName => 16,
        }
    }

    /// The IP version whose header this reads, if any.
    fn needs(self) -> Option<NfProto> {
        match self {
            Selector::IpSaddr | Selector::IpDaddr => Some(NfProto::Ipv4),
            Selector::Ip6Saddr | Selector::Ip6Daddr => Some(NfProto::Ipv6),
            _ => None,
        }
    }

    fn load(self, dreg: u32) -> Expr {
        let payload = |base, offset| Expr::Payload {
            base,
            offset,
            len: self.len(),
            dreg,
        };
        let meta = |key| Expr::Meta { key, dreg };
        let ct = |key| Expr::Ct { key, dreg };
        match self {
            Selector::IpSaddr => payload(PayloadBase::Network, 12),
            Selector::IpDaddr => payload(PayloadBase::Network, 16),
            Selector::Ip6Saddr => payload(PayloadBase::Network, 8),
            Selector::Ip6Daddr => payload(PayloadBase::Network, 24),
            Selector::ThSport => payload(PayloadBase::Transport, 0),
            Selector::ThDport => payload(PayloadBase::Transport, 2),
            Selector::MetaL4proto => meta(MetaKey::L4Proto),
            Selector::MetaNfproto => meta(MetaKey::Nfproto),
            Selector::MetaMark => meta(MetaKey::Mark),
            Selector::IifName => meta(MetaKey::Iifname),
            Selector::OifName => meta(MetaKey::Oifname),
            Selector::CtMark => ct(CtKey::Mark),
            Selector::CtState => ct(CtKey::State),
            Selector::CtStatus => ct(CtKey::Status),
        }
    }

    /// How `nft` writes it.
    pub fn to_nft(self) -> &'static str {
        match self {
            Selector::IpSaddr => "ip saddr",
            Selector::IpDaddr => "ip daddr",
            Selector::Ip6Saddr => "ip6 saddr",
            Selector::Ip6Daddr => "ip6 daddr",
            Selector::MetaL4proto => "meta l4proto",
            Selector::ThSport => "th sport",
            Selector::ThDport => "th dport",
            Selector::MetaNfproto => "meta nfproto",
            Selector::MetaMark => "meta mark",
            Selector::IifName => "iifname",
            Selector::OifName => "oifname",
            Selector::CtMark => "ct mark",
            Selector::CtState => "ct state",
            Selector::CtStatus => "ct status",
        }
    }
}

/// An address or prefix for `ip saddr`/`ip daddr` matches (an address is a host prefix).
pub trait IntoNet {
    /// The prefix.
    fn into_net(self) -> IpNet;
}

impl IntoNet for IpNet {
    fn into_net(self) -> IpNet {
        self
    }
}

impl IntoNet for ipnet::Ipv4Net {
    fn into_net(self) -> IpNet {
        self.into()
    }
}

impl IntoNet for ipnet::Ipv6Net {
    fn into_net(self) -> IpNet {
        self.into()
    }
}

impl IntoNet for IpAddr {
    fn into_net(self) -> IpNet {
        self.into()
    }
}

impl IntoNet for std::net::Ipv4Addr {
    fn into_net(self) -> IpNet {
        IpAddr::V4(self).into()
    }
}

impl IntoNet for std::net::Ipv6Addr {
    fn into_net(self) -> IpNet {
        IpAddr::V6(self).into()
    }
}

/// `ct state` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtStateFlags(pub u32);

impl CtStateFlags {
    /// `invalid`.
    pub const INVALID: CtStateFlags = CtStateFlags(1);
    /// `established`.
    pub const ESTABLISHED: CtStateFlags = CtStateFlags(2);
    /// `related`.
    pub const RELATED: CtStateFlags = CtStateFlags(4);
    /// `new`.
    pub const NEW: CtStateFlags = CtStateFlags(8);
}

impl std::ops::BitOr for CtStateFlags {
    type Output = CtStateFlags;
    fn bitor(self, rhs: CtStateFlags) -> CtStateFlags {
        CtStateFlags(self.0 | rhs.0)
    }
}

/// `ct status` bits (`IPS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtStatusFlags(pub u32);

impl CtStatusFlags {
    /// `expected`.
    pub const EXPECTED: CtStatusFlags = CtStatusFlags(1);
    /// `seen-reply`.
    pub const SEEN_REPLY: CtStatusFlags = CtStatusFlags(2);
    /// `assured`.
    pub const ASSURED: CtStatusFlags = CtStatusFlags(4);
    /// `confirmed`.
    pub const CONFIRMED: CtStatusFlags = CtStatusFlags(8);
    /// `snat`.
    pub const SNAT: CtStatusFlags = CtStatusFlags(0x10);
    /// `dnat`.
    pub const DNAT: CtStatusFlags = CtStatusFlags(0x20);
}

impl std::ops::BitOr for CtStatusFlags {
    type Output = CtStatusFlags;
    fn bitor(self, rhs: CtStatusFlags) -> CtStatusFlags {
        CtStatusFlags(self.0 | rhs.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Stmt {
    Cmp {
        sel: Selector,
        op: CmpOp,
        value: Vec<u8>,
    },
    Prefix {
        sel: Selector,
        net: IpNet,
    },
    Masked {
        sel: Selector,
        mask: u32,
        value: u32,
    },
    AnyBit {
        sel: Selector,
        bits: u32,
    },
    FibDaddrLocal,
    Dport {
        proto: L4Proto,
        port: u16,
    },
    Lookup {
        keys: Vec<Selector>,
        set: String,
    },
    Vmap {
        keys: Vec<Selector>,
        map: String,
    },
    Counter,
    XtMatch {
        name: String,
        rev: u32,
        info: Vec<u8>,
    },
    Verdict(Verdict),
    NatTo {
        kind: NatKind,
        addr: IpAddr,
        port: Option<u16>,
    },
    NatMap {
        kind: NatKind,
        version: NfProto,
        keys: Vec<Selector>,
        map: String,
    },
    Masquerade,
    Expr(Expr),
}

/// A rule: matches, then at most one terminal statement. Build it in `nft` order; each
/// method's doc shows the `nft` text it stands for.
///
/// ```
/// use netfilter::nft::{NfProto, Rule, Selector::*};
/// // dnat ip to ip daddr . meta l4proto . th dport map @hostip_ports comment "owner"
/// let rule = Rule::new()
///     .dnat_map(NfProto::Ipv4, &[IpDaddr, MetaL4proto, ThDport], "hostip_ports")
///     .comment("owner");
/// assert_eq!(
///     rule.to_nft(),
///     r#"dnat ip to ip daddr . meta l4proto . th dport map @hostip_ports comment "owner""#
/// );
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    stmts: Vec<Stmt>,
    comment: Option<String>,
    compat: Option<(u32, bool)>,
}

/// A rule that cannot be encoded for its table, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError(pub String);

/// The longest comment `nft` accepts (`NFTNL_UDATA_COMMENT_MAXLEN`).
pub const COMMENT_MAX: usize = 128;
/// The longest interface name (`IFNAMSIZ` - 1).
const IFNAME_MAX: usize = 15;

impl Rule {
    /// An empty rule (matches everything, no verdict: the chain goes on).
    pub fn new() -> Rule {
        Rule::default()
    }

    fn push(mut self, stmt: Stmt) -> Rule {
        self.stmts.push(stmt);
        self
    }

    /// `ip saddr 10.0.0.0/8` (`ip6 saddr fd00::/64` for IPv6); a host route matches one address.
    #[must_use]
    pub fn saddr(self, net: impl IntoNet) -> Rule {
        let net = net.into_net();
        let sel = Selector::saddr(NfProto::of(net.addr()));
        self.push(Stmt::Prefix { sel, net })
    }

    /// `ip daddr 10.0.0.0/8` (`ip6 daddr fd00::/64` for IPv6).
    #[must_use]
    pub fn daddr(self, net: impl IntoNet) -> Rule {
        let net = net.into_net();
        let sel = Selector::daddr(NfProto::of(net.addr()));
        self.push(Stmt::Prefix { sel, net })
    }

    /// `meta l4proto tcp`.
    #[must_use]
    pub fn l4proto(self, proto: L4Proto) -> Rule {
        self.push(Stmt::Cmp {
            sel: Selector::MetaL4proto,
            op: CmpOp::Eq,
            value: vec![proto.number()],
        })
    }

    /// `tcp dport 8080` (`udp dport …`, `sctp dport …`): the protocol, then the port.
    #[must_use]
    pub fn dport(self, proto: L4Proto, port: u16) -> Rule {
        self.push(Stmt::Dport { proto, port })
    }

    /// `th dport 8080`.
    #[must_use]
    pub fn th_dport(self, port: u16) -> Rule {
        self.push(Stmt::Cmp {
            sel: Selector::ThDport,
            op: CmpOp::Eq,
            value: port.to_be_bytes().to_vec(),
        })
    }

    /// `meta nfproto ipv4`.
    #[must_use]
    pub fn nfproto(self, v: NfProto) -> Rule {
        self.push(Stmt::Cmp {
            sel: Selector::MetaNfproto,
            op: CmpOp::Eq,
            value: vec![v.code()],
        })
    }

    /// `iifname "eth0"`.
    #[must_use]
    pub fn iifname(self, name: &str) -> Rule {
        self.ifname(Selector::IifName, name)
    }

    /// `oifname "eth0"`.
    #[must_use]
    pub fn oifname(self, name: &str) -> Rule {
        self.ifname(Selector::OifName, name)
    }

    fn ifname(self, sel: Selector, name: &str) -> Rule {
        // Compared over all of IFNAMSIZ, NUL-padded, as nft does for an exact name; a name
        // too long is refused at encoding (see `encode`).
        let mut value = name.as_bytes().to_vec();
        value.resize(value.len().max(16), 0);
        self.push(Stmt::Cmp {
            sel,
            op: CmpOp::Eq,
            value,
        })
    }

    /// `meta mark 0x00000001`.
    #[must_use]
    pub fn mark(self, mark: u32) -> Rule {
        self.push(Stmt::Cmp {
            sel: Selector::MetaMark,
            op: CmpOp::Eq,
            value: mark.to_ne_bytes().to_vec(),
        })
    }

    /// `meta mark & 0x00002000 == 0x00002000`.
    #[must_use]
    pub fn mark_masked(self, mask: u32, value: u32) -> Rule {
        self.push(Stmt::Masked {
            sel: Selector::MetaMark,
            mask,
            value,
        })
    }

    /// `ct state established,related`: any of these states.
    #[must_use]
    pub fn ct_state(self, state: CtStateFlags) -> Rule {
        self.push(Stmt::AnyBit {
            sel: Selector::CtState,
            bits: state.0,
        })
    }

    /// `ct status dnat`: any of these status bits.
    #[must_use]
    pub fn ct_status(self, status: CtStatusFlags) -> Rule {
        self.push(Stmt::AnyBit {
            sel: Selector::CtStatus,
            bits: status.0,
        })
    }

    /// `ct mark 0x00000010`.
    #[must_use]
    pub fn ct_mark(self, mark: u32) -> Rule {
        self.push(Stmt::Cmp {
            sel: Selector::CtMark,
            op: CmpOp::Eq,
            value: mark.to_ne_bytes().to_vec(),
        })
    }

    /// `fib daddr type local`: the destination is an address of this host.
    #[must_use]
    pub fn fib_daddr_local(self) -> Rule {
        self.push(Stmt::FibDaddrLocal)
    }

    /// `ip saddr . ip daddr @pairs`: the concatenated selectors are in the named set.
    #[must_use]
    pub fn in_set(self, keys: &[Selector], set: &str) -> Rule {
        self.push(Stmt::Lookup {
            keys: keys.to_vec(),
            set: set.to_string(),
        })
    }

    /// `counter`.
    #[must_use]
    pub fn counter(self) -> Rule {
        self.push(Stmt::Counter)
    }

    /// An xtables match, as `iptables-nft` writes the extensions it has no native form for:
    /// `name` at revision `rev` with its `xt_*_info` structure (host byte order, padded to
    /// the kernel's `XT_ALIGN`). `nft` lists it translated (`ct state …`) or as `xt match`.
    #[must_use]
    pub fn xt_match(self, name: &str, rev: u32, info: Vec<u8>) -> Rule {
        self.push(Stmt::XtMatch {
            name: name.to_string(),
            rev,
            info,
        })
    }

    /// One expression as it is, for encoders that reproduce another tool's expansion
    /// expression for expression (`iptables-nft`'s, in [`crate::iptables::native`]).
    #[must_use]
    pub fn expr(self, expr: Expr) -> Rule {
        self.push(Stmt::Expr(expr))
    }

    /// `accept`.
    #[must_use]
    pub fn accept(self) -> Rule {
        self.push(Stmt::Verdict(Verdict::Accept))
    }

    /// `drop`.
    #[must_use]
    pub fn drop(self) -> Rule {
        self.push(Stmt::Verdict(Verdict::Drop))
    }

    /// `return`.
    #[must_use]
    pub fn ret(self) -> Rule {
        self.push(Stmt::Verdict(Verdict::Return))
    }

    /// `jump CHAIN`.
    #[must_use]
    pub fn jump(self, chain: &str) -> Rule {
        self.push(Stmt::Verdict(Verdict::Jump(chain.to_string())))
    }

    /// `goto CHAIN`.
    #[must_use]
    pub fn goto(self, chain: &str) -> Rule {
        self.push(Stmt::Verdict(Verdict::Goto(chain.to_string())))
    }

    /// `meta l4proto vmap @MAP`: the verdict is looked up in a verdict map.
    #[must_use]
    pub fn vmap(self, keys: &[Selector], map: &str) -> Rule {
        self.push(Stmt::Vmap {
            keys: keys.to_vec(),
            map: map.to_string(),
        })
    }

    /// `dnat ip to 10.0.0.2:80` (`dnat ip6 to [fd00::2]:80`; without a port: `dnat ip to 10.0.0.2`).
    #[must_use]
    pub fn dnat_to(self, addr: IpAddr, port: Option<u16>) -> Rule {
        self.push(Stmt::NatTo {
            kind: NatKind::Dnat,
            addr,
            port,
        })
    }

    /// `snat ip to 1.2.3.4:99` (`snat ip6 to [fd00::1]:99`; without a port: `snat ip to 1.2.3.4`).
    #[must_use]
    pub fn snat_to(self, addr: IpAddr, port: Option<u16>) -> Rule {
        self.push(Stmt::NatTo {
            kind: NatKind::Snat,
            addr,
            port,
        })
    }

    /// `dnat ip to ip daddr . meta l4proto . th dport map @MAP`: the map's data is
    /// `ipv4_addr . inet_service` (`ipv6_addr . inet_service` for [`NfProto::Ipv6`]).
    #[must_use]
    pub fn dnat_map(self, version: NfProto, keys: &[Selector], map: &str) -> Rule {
        self.push(Stmt::NatMap {
            kind: NatKind::Dnat,
            version,
            keys: keys.to_vec(),
            map: map.to_string(),
        })
    }

    /// `snat ip to ip saddr . th sport map @MAP`, the source-NAT twin of [`Rule::dnat_map`].
    #[must_use]
    pub fn snat_map(self, version: NfProto, keys: &[Selector], map: &str) -> Rule {
        self.push(Stmt::NatMap {
            kind: NatKind::Snat,
            version,
            keys: keys.to_vec(),
            map: map.to_string(),
        })
    }

    /// `masquerade`.
    #[must_use]
    pub fn masquerade(self) -> Rule {
        self.push(Stmt::Masquerade)
    }

    /// `comment "TEXT"` (at most [`COMMENT_MAX`] bytes).
    #[must_use]
    pub fn comment(mut self, comment: &str) -> Rule {
        self.comment = Some(comment.to_string());
        self
    }

    /// The rule's comment.
    pub fn comment_text(&self) -> Option<&str> {
        self.comment.as_deref()
    }

    /// The layer-4 protocol an `iptables-nft` rule states for the xtables extensions in it
    /// (`NFTA_RULE_COMPAT`: the `-p` number and whether it is negated), which the kernel
    /// checks them against (`-m sctp` needs `-p sctp`, `-m multiport` a protocol with ports)
    /// and does not keep.
    #[must_use]
    pub fn compat(mut self, proto: u32, negated: bool) -> Rule {
        self.compat = Some((proto, negated));
        self
    }

    /// The protocol stated with [`Rule::compat`].
    pub fn compat_proto(&self) -> Option<(u32, bool)> {
        self.compat
    }

    /// The rule as `nft list` prints it (modulo nft's own abbreviations).
    pub fn to_nft(&self) -> String {
        let mut parts: Vec<String> = self.stmts.iter().map(stmt_to_nft).collect();
        if let Some(c) = &self.comment {
            parts.push(format!("comment {c:?}"));
        }
        parts.join(" ")
    }

    /// Expands the statements into expressions for a table of `family`.
    ///
    /// # Errors
    /// A statement the family cannot carry (`ip6 daddr` in an `ip` table), an interface name
    /// longer than 15 bytes, or a comment longer than [`COMMENT_MAX`].
    pub fn encode(&self, family: Family) -> Result<Vec<Expr>, RuleError> {
        if let Some(c) = &self.comment
            && c.len() > COMMENT_MAX
        {
            return Err(RuleError(format!(
                "comment of {} bytes is longer than {COMMENT_MAX}",
                c.len()
            )));
        }
        let mut enc = Encoder {
            family,
            known: None,
            exprs: Vec::new(),
        };
        for stmt in &self.stmts {
            enc.stmt(stmt)?;
        }
        Ok(enc.exprs)
    }
}

/// The register holding the concatenation component that starts `words` 32-bit words in:
/// nft names a 16-byte-aligned one by its 16-byte register (`reg 1`, `reg 2`), the others by
/// their 32-bit register (`reg 9` is the second word of `reg 1`).
fn concat_reg(words: u32) -> u32 {
    if words.is_multiple_of(4) {
        REG_1 + words / 4
    } else {
        8 + words
    }
}

struct Encoder {
    family: Family,
    /// The IP version an earlier `meta nfproto` match established (inet tables).
    known: Option<NfProto>,
    exprs: Vec<Expr>,
}

impl Encoder {
    /// Adds the implicit `meta nfproto` match that `ip …`/`ip6 …` selectors need in an
    /// `inet` table, once, and refuses selectors of the other version in `ip`/`ip6` tables.
    fn depend(&mut self, sel: Selector) -> Result<(), RuleError> {
        let Some(v) = sel.needs() else {
            return Ok(());
        };
        match (self.family, v) {
            (Family::Ip, NfProto::Ipv4) | (Family::Ip6, NfProto::Ipv6) => Ok(()),
            (Family::Inet, v) if self.known == Some(v) => Ok(()),
            (Family::Inet, v) => {
                self.exprs.push(Selector::MetaNfproto.load(REG_1));
                self.exprs.push(Expr::Cmp {
                    sreg: REG_1,
                    op: CmpOp::Eq,
                    data: vec![v.code()],
                });
                self.known = Some(v);
                Ok(())
            }
            (family, _) => Err(RuleError(format!(
                "{} cannot match in a table of family {}",
                sel.to_nft(),
                family.name()
            ))),
        }
    }

    /// Loads the concatenation of `keys` from `reg 1` on.
    fn load_concat(&mut self, keys: &[Selector]) -> Result<(), RuleError> {
        if keys.is_empty() {
            return Err(RuleError("a lookup needs at least one key".to_string()));
        }
        for k in keys {
            self.depend(*k)?;
        }
        let mut words = 0;
        for k in keys {
            self.exprs.push(k.load(concat_reg(words)));
            words += k.len().div_ceil(4);
        }
        Ok(())
    }

    fn stmt(&mut self, stmt: &Stmt) -> Result<(), RuleError> {
        let cmp = |op, data| Expr::Cmp {
            sreg: REG_1,
            op,
            data,
        };
        match stmt {
            Stmt::Cmp { sel, op, value } => {
                if matches!(sel, Selector::IifName | Selector::OifName)
                    && (value.len() != 16 || value[IFNAME_MAX] != 0)
                {
                    return Err(RuleError(format!(
                        "interface name {:?} is longer than {IFNAME_MAX} bytes",
                        String::from_utf8_lossy(value).trim_end_matches('\0')
                    )));
                }
                self.depend(*sel)?;
                self.exprs.push(sel.load(REG_1));
                self.exprs.push(cmp(*op, value.clone()));
            }
            Stmt::Prefix { sel, net } => {
                self.depend(*sel)?;
                let prefix = net.prefix_len();
                let addr = super::addr_bytes(net.network());
                if prefix == 0 {
                    // Matches every address of the version: only the dependency remains.
                } else if prefix % 8 == 0 {
                    // nft loads just the prefix bytes when the prefix is byte-aligned.
                    let bytes = usize::from(prefix / 8);
                    let Expr::Payload { base, offset, .. } = sel.load(REG_1) else {
                        return Err(RuleError(format!("{} is not an address", sel.to_nft())));
                    };
                    self.exprs.push(Expr::Payload {
                        base,
                        offset,
                        len: u32::from(prefix / 8),
                        dreg: REG_1,
                    });
                    self.exprs.push(cmp(CmpOp::Eq, addr[..bytes].to_vec()));
                } else {
                    let mask = match net {
                        IpNet::V4(n) => n.netmask().octets().to_vec(),
                        IpNet::V6(n) => n.netmask().octets().to_vec(),
                    };
                    self.exprs.push(sel.load(REG_1));
                    self.exprs.push(Expr::Bitwise {
                        sreg: REG_1,
                        dreg: REG_1,
                        xor: vec![0; mask.len()],
                        mask,
                        explicit_op: false,
                    });
                    self.exprs.push(cmp(CmpOp::Eq, addr));
                }
            }
            Stmt::Masked { sel, mask, value } => {
                self.depend(*sel)?;
                self.exprs.push(sel.load(REG_1));
                self.exprs.push(Expr::Bitwise {
                    sreg: REG_1,
                    dreg: REG_1,
                    mask: mask.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                    explicit_op: true,
                });
                self.exprs
                    .push(cmp(CmpOp::Eq, value.to_ne_bytes().to_vec()));
            }
            Stmt::AnyBit { sel, bits } => {
                self.exprs.push(sel.load(REG_1));
                self.exprs.push(Expr::Bitwise {
                    sreg: REG_1,
                    dreg: REG_1,
                    mask: bits.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                    explicit_op: false,
                });
                self.exprs.push(cmp(CmpOp::Neq, vec![0; 4]));
            }
            Stmt::FibDaddrLocal => {
                // RTN_LOCAL, as a host-order u32.
                const RTN_LOCAL: u32 = 2;
                self.exprs.push(Expr::FibDaddrType { dreg: REG_1 });
                self.exprs
                    .push(cmp(CmpOp::Eq, RTN_LOCAL.to_ne_bytes().to_vec()));
            }
            Stmt::Dport { proto, port } => {
                for (sel, value) in [
                    (Selector::MetaL4proto, vec![proto.number()]),
                    (Selector::ThDport, port.to_be_bytes().to_vec()),
                ] {
                    self.exprs.push(sel.load(REG_1));
                    self.exprs.push(cmp(CmpOp::Eq, value));
                }
            }
            Stmt::Lookup { keys, set } => {
                self.load_concat(keys)?;
                self.exprs.push(Expr::Lookup {
                    set: set.clone(),
                    sreg: REG_1,
                    dreg: None,
                });
            }
            Stmt::Vmap { keys, map } => {
                self.load_concat(keys)?;
                self.exprs.push(Expr::Lookup {
                    set: map.clone(),
                    sreg: REG_1,
                    dreg: Some(REG_VERDICT),
                });
            }
            Stmt::Counter => self.exprs.push(Expr::Counter {
                packets: 0,
                bytes: 0,
            }),
            Stmt::XtMatch { name, rev, info } => self.exprs.push(Expr::XtMatch {
                name: name.clone(),
                rev: *rev,
                info: info.clone(),
            }),
            Stmt::Verdict(v) => self.exprs.push(Expr::ImmediateVerdict(v.clone())),
            Stmt::Expr(e) => self.exprs.push(e.clone()),
            Stmt::NatTo { kind, addr, port } => {
                let version = NfProto::of(*addr);
                self.nat_family(version)?;
                let data = super::addr_bytes(*addr);
                self.exprs.push(Expr::ImmediateData { dreg: REG_1, data });
                let proto = port.map(|p| {
                    self.exprs.push(Expr::ImmediateData {
                        dreg: REG_1 + 1,
                        data: p.to_be_bytes().to_vec(),
                    });
                    REG_1 + 1
                });
                // NF_NAT_RANGE_PROTO_SPECIFIED, which nft sends along with a port.
                self.exprs.push(Expr::Nat {
                    kind: *kind,
                    family: u32::from(version.code()),
                    addr: Some(REG_1),
                    proto,
                    flags: port.map(|_| 2),
                });
            }
            Stmt::NatMap {
                kind,
                version,
                keys,
                map,
            } => {
                self.nat_family(*version)?;
                self.load_concat(keys)?;
                self.exprs.push(Expr::Lookup {
                    set: map.clone(),
                    sreg: REG_1,
                    dreg: Some(REG_1),
                });
                let addr_words = match version {
                    NfProto::Ipv4 => 1,
                    NfProto::Ipv6 => 4,
                };
                self.exprs.push(Expr::Nat {
                    kind: *kind,
                    family: u32::from(version.code()),
                    addr: Some(REG_1),
                    proto: Some(concat_reg(addr_words)),
                    flags: None,
                });
            }
            Stmt::Masquerade => self.exprs.push(Expr::Masquerade),
        }
        Ok(())
    }

    fn nat_family(&self, v: NfProto) -> Result<(), RuleError> {
        match (self.family, v) {
            (Family::Ip, NfProto::Ipv6) | (Family::Ip6, NfProto::Ipv4) => Err(RuleError(format!(
                "{} nat cannot be used in a table of family {}",
                v.code(),
                self.family.name()
            ))),
            _ => Ok(()),
        }
    }
}

fn concat_to_nft(keys: &[Selector]) -> String {
    keys.iter()
        .map(|k| k.to_nft())
        .collect::<Vec<_>>()
        .join(" . ")
}

fn ip_word(v: NfProto) -> &'static str {
    match v {
        NfProto::Ipv4 => "ip",
        NfProto::Ipv6 => "ip6",
    }
}

fn stmt_to_nft(stmt: &Stmt) -> String {
    match stmt {
        Stmt::Cmp { sel, op, value } => {
            let op = match op {
                CmpOp::Eq => "",
                CmpOp::Neq => "!= ",
            };
            let v = match sel {
                Selector::MetaL4proto => proto_name(L4Proto::from_number(value[0])),
                Selector::MetaNfproto if value[0] == NfProto::Ipv4.code() => "ipv4".to_string(),
                Selector::MetaNfproto => "ipv6".to_string(),
                Selector::ThDport | Selector::ThSport => {
                    u16::from_be_bytes([value[0], value[1]]).to_string()
                }
                Selector::IifName | Selector::OifName => format!(
                    "{:?}",
                    String::from_utf8_lossy(value).trim_end_matches('\0')
                ),
                _ => format!(
                    "0x{:08x}",
                    u32::from_ne_bytes(value[..4].try_into().unwrap_or_default())
                ),
            };
            format!("{} {op}{v}", sel.to_nft())
        }
        Stmt::Prefix { sel, net } if net.prefix_len() == net.max_prefix_len() => {
            format!("{} {}", sel.to_nft(), net.addr())
        }
        Stmt::Prefix { sel, net } => format!("{} {}", sel.to_nft(), net.trunc()),
        Stmt::Masked { sel, mask, value } => {
            format!("{} & 0x{mask:08x} == 0x{value:08x}", sel.to_nft())
        }
        Stmt::AnyBit { sel, bits } => {
            let names: &[(u32, &str)] = match sel {
                Selector::CtState => &[
                    (1, "invalid"),
                    (2, "established"),
                    (4, "related"),
                    (8, "new"),
                ],
                _ => &[
                    (1, "expected"),
                    (2, "seen-reply"),
                    (4, "assured"),
                    (8, "confirmed"),
                    (0x10, "snat"),
                    (0x20, "dnat"),
                ],
            };
            let known: u32 = names.iter().map(|(b, _)| b).sum();
            let mut words: Vec<String> = names
                .iter()
                .filter(|(b, _)| bits & b != 0)
                .map(|(_, n)| (*n).to_string())
                .collect();
            if bits & !known != 0 {
                words.push(format!("0x{:x}", bits & !known));
            }
            format!("{} {}", sel.to_nft(), words.join(","))
        }
        Stmt::FibDaddrLocal => "fib daddr type local".to_string(),
        Stmt::Dport { proto, port } => format!("{} dport {port}", proto_name(*proto)),
        Stmt::Lookup { keys, set } => format!("{} @{set}", concat_to_nft(keys)),
        Stmt::Vmap { keys, map } => format!("{} vmap @{map}", concat_to_nft(keys)),
        Stmt::Counter => "counter".to_string(),
        Stmt::XtMatch { name, .. } => format!("xt match {name:?}"),
        Stmt::Expr(Expr::XtMatch { name, .. }) => format!("xt match {name:?}"),
        Stmt::Expr(Expr::XtTarget { name, .. }) => format!("xt target {name:?}"),
        Stmt::Expr(Expr::ImmediateVerdict(v)) | Stmt::Verdict(v) => verdict_to_nft(v),
        Stmt::Expr(e) => format!("[ {e:?} ]"),
        Stmt::NatTo { kind, addr, port } => {
            let target = match (addr, port) {
                (IpAddr::V4(a), Some(p)) => format!("{a}:{p}"),
                (IpAddr::V6(a), Some(p)) => format!("[{a}]:{p}"),
                (a, None) => a.to_string(),
            };
            format!(
                "{} {} to {target}",
                nat_word(*kind),
                ip_word(NfProto::of(*addr))
            )
        }
        Stmt::NatMap {
            kind,
            version,
            keys,
            map,
        } => format!(
            "{} {} to {} map @{map}",
            nat_word(*kind),
            ip_word(*version),
            concat_to_nft(keys)
        ),
        Stmt::Masquerade => "masquerade".to_string(),
    }
}

fn proto_name(p: L4Proto) -> String {
    match p {
        L4Proto::Tcp => "tcp".to_string(),
        L4Proto::Udp => "udp".to_string(),
        L4Proto::Sctp => "sctp".to_string(),
        L4Proto::Other(n) => n.to_string(),
    }
}

fn nat_word(kind: NatKind) -> &'static str {
    match kind {
        NatKind::Snat => "snat",
        NatKind::Dnat => "dnat",
    }
}

/// A verdict as `nft` writes it.
pub(crate) fn verdict_to_nft(v: &Verdict) -> String {
    match v {
        Verdict::Accept => "accept".to_string(),
        Verdict::Drop => "drop".to_string(),
        Verdict::Return => "return".to_string(),
        Verdict::Jump(c) => format!("jump {c}"),
        Verdict::Goto(c) => format!("goto {c}"),
    }
}
