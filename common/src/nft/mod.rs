//! nftables over netlink (`NETLINK_NETFILTER`), without the `nft` binary.
//!
//! Build a [`Batch`] of changes (tables, chains, sets and maps, rules, elements) and
//! [`Nft::apply`] it as one atomic nfnetlink transaction; read back with [`Nft::rules`],
//! [`Nft::elements`] and [`Nft::element`]. Every builder documents the `nft` text it stands for:
//!
//! ```
//! use common::nft::{Batch, Chain, ChainHook, ChainType, DataType::*, Element, Family, L4Proto};
//! use common::nft::{NfProto, Rule, Selector::*, Set, Table, Value, priority};
//! let t = Table::new(Family::Ip, "cni_hostport");
//! let mut batch = Batch::new();
//! batch
//!     // add table ip cni_hostport
//!     .add_table(&t)
//!     // add map ip cni_hostport ports { type inet_proto . inet_service : ipv4_addr . inet_service; }
//!     .add_set(&t, &Set::map("ports", &[InetProto, InetService], &[Ipv4Addr, InetService]))
//!     // add chain ip cni_hostport hostports
//!     .add_chain(&t, &Chain::regular("hostports"))
//!     // add chain ip cni_hostport prerouting { type nat hook prerouting priority dstnat; policy accept; }
//!     .add_chain(&t, &Chain::base("prerouting", ChainType::Nat, ChainHook::Prerouting, priority::DSTNAT))
//!     // add rule ip cni_hostport prerouting fib daddr type local jump hostports
//!     .add_rule(&t, "prerouting", &Rule::new().fib_daddr_local().jump("hostports"))
//!     // add rule ip cni_hostport hostports dnat ip to meta l4proto . th dport map @ports
//!     .add_rule(&t, "hostports", &Rule::new().dnat_map(NfProto::Ipv4, &[MetaL4proto, ThDport], "ports"))
//!     // add element ip cni_hostport ports { tcp . 8080 comment "owner" : 10.0.0.2 . 80 }
//!     .add_elements(&t, "ports", &[Element::new([L4Proto::Tcp.into(), Value::Port(8080)])
//!         .to(["10.0.0.2".parse::<std::net::Ipv4Addr>().unwrap().into(), Value::Port(80)])
//!         .comment("owner")]);
//! assert_eq!(batch.len(), 7);
//! ```
//!
//! Adding what exists is not an error, so the skeleton can be declared on every call. Errors
//! carry the errno and name the object of the batch the kernel refused (it answers each
//! message by sequence number). Expressions that `netlink-packet-netfilter` lacks (ct, fib, nat,
//! masq, counter) are encoded in [`expr`]; golden bytes captured with `nft --debug=netlink,mnl`
//! (`common/testdata/nft/`) pin the encoding, and kernel tests compare with `nft -j list`.

mod batch;
pub mod expr;
mod raw;
mod rule;
mod set;
mod userdata;

use std::fmt;
use std::io;
use std::os::fd::AsFd;

use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, ListAttribute, NfTablesMessage, RuleAttribute,
    RuleMessage, SetAttribute, SetElementAttribute, SetElementList, SetElementMessage, SetFlags,
    SetMessage, TableAttribute, TableMessage,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};

pub use batch::{BaseChain, Batch, Chain, ChainHook, ChainType, Policy, priority};
pub use expr::{CmpOp, Expr, PayloadBase, Verdict};
pub use rule::{
    COMMENT_MAX, CtStateFlags, CtStatusFlags, IntoNet, NfProto, Rule, RuleError, Selector,
};
pub use set::{DataType, Element, ElementData, L4Proto, Set, SetData, Value};

use crate::netlink::NetlinkSocket;
use crate::netns::{NetNs, NetnsError};

/// The address family of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `ip`: IPv4 only.
    Ip,
    /// `ip6`: IPv6 only.
    Ip6,
    /// `inet`: both.
    Inet,
}

impl Family {
    /// The `NFPROTO_*` number carried in the nfnetlink header.
    pub fn code(self) -> u8 {
        match self {
            Family::Ip => 2,
            Family::Ip6 => 10,
            Family::Inet => 1,
        }
    }

    /// The family with this `NFPROTO_*` number.
    pub fn from_code(code: u8) -> Option<Family> {
        [Family::Ip, Family::Ip6, Family::Inet]
            .into_iter()
            .find(|f| f.code() == code)
    }

    /// The family as `nft` names it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
            Family::Inet => "inet",
        }
    }
}

/// A table: family and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Table {
    /// The family.
    pub family: Family,
    /// The name.
    pub name: String,
}

impl Table {
    /// `table FAMILY NAME`.
    pub fn new(family: Family, name: &str) -> Table {
        Table {
            family,
            name: name.to_string(),
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family.name(), self.name)
    }
}

/// A failed nftables operation.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The netfilter netlink socket could not be opened.
    #[error("nftables: failed to open a netfilter netlink socket: {0}")]
    Open(#[source] io::Error),
    /// An object of a batch could not be encoded; nothing was sent.
    #[error("nftables: cannot {object}: {reason}")]
    Invalid {
        /// The object, in `nft` syntax.
        object: String,
        /// Why.
        reason: String,
    },
    /// The kernel refused an object of a batch, so none of the batch was applied.
    #[error("nftables: {object} failed: {source}")]
    Rejected {
        /// The refused object, in `nft` syntax.
        object: String,
        /// Its position in the batch (from 0), or `None` for the transaction as a whole.
        index: Option<usize>,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// A request (listing, lookup) or the exchange itself failed.
    #[error("nftables: failed to {op}: {source}")]
    Request {
        /// What was attempted.
        op: String,
        /// The errno or I/O error.
        #[source]
        source: io::Error,
    },
}

impl NftError {
    /// The errno, if the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NftError::Open(e) => e.raw_os_error(),
            NftError::Rejected { source, .. } | NftError::Request { source, .. } => {
                source.raw_os_error()
            }
            NftError::Netns(_) | NftError::Invalid { .. } => None,
        }
    }

    /// True when a table, chain, set, rule or element does not exist (ENOENT).
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(libc::ENOENT)
    }

    /// The refused object of a batch, in `nft` syntax.
    pub fn failed_object(&self) -> Option<&str> {
        match self {
            NftError::Rejected { object, .. } | NftError::Invalid { object, .. } => Some(object),
            _ => None,
        }
    }
}

impl From<NftError> for crate::error::CniError {
    fn from(err: NftError) -> Self {
        match err {
            NftError::Netns(e) => e.into(),
            e => crate::error::CniError::from_error(crate::error::ErrorCode::Internal, &e),
        }
    }
}

/// An address as nf_tables compares it: its bytes in network order (4 or 16).
#[must_use]
pub fn addr_bytes(addr: std::net::IpAddr) -> Vec<u8> {
    match addr {
        std::net::IpAddr::V4(a) => a.octets().to_vec(),
        std::net::IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// A rule as listed from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRule {
    /// The handle, for [`Batch::delete_rule`].
    pub handle: u64,
    /// The comment, if any.
    pub comment: Option<String>,
    /// The expressions.
    pub exprs: Vec<Expr>,
}

impl ListedRule {
    /// True when this is `rule` as encoded for `family` (counter values, the NAT flags the
    /// kernel derives itself and whether the bitwise operator was explicit are not compared).
    pub fn is(&self, rule: &Rule, family: Family) -> bool {
        let Ok(want) = rule.encode(family) else {
            return false;
        };
        let norm = |e: &Expr| match e {
            Expr::Counter { .. } => Expr::Counter {
                packets: 0,
                bytes: 0,
            },
            Expr::Nat {
                kind,
                family,
                addr,
                proto,
                ..
            } => Expr::Nat {
                kind: *kind,
                family: *family,
                addr: *addr,
                proto: *proto,
                flags: None,
            },
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
                ..
            } => Expr::Bitwise {
                sreg: *sreg,
                dreg: *dreg,
                mask: mask.clone(),
                xor: xor.clone(),
                explicit_op: false,
            },
            e => e.clone(),
        };
        self.comment.as_deref() == rule.comment_text()
            && self.exprs.len() == want.len()
            && self
                .exprs
                .iter()
                .zip(&want)
                .all(|(a, b)| norm(a) == norm(b))
    }
}

/// `NFNL_SUBSYS_NFTABLES`, the resource id of batch begin/end messages.
const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// An nf_tables handle bound to one network namespace.
#[derive(Debug)]
pub struct Nft {
    socket: NetlinkSocket,
}

/// The socket, for [`crate::linger::hand_off`]: after a batch that deleted objects, the
/// socket's last close waits for the kernel to free them.
impl AsFd for Nft {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl Nft {
    /// Opens a handle in the calling thread's namespace.
    ///
    /// # Errors
    /// [`NftError::Open`] with the socket errno.
    pub fn new() -> Result<Nft, NftError> {
        let socket = NetlinkSocket::open(netlink_sys::constants::NETLINK_NETFILTER)
            .map_err(NftError::Open)?;
        // Refusals must not echo whole batches back: only the header is needed.
        socket.set_cap_ack(true).map_err(NftError::Open)?;
        Ok(Nft { socket })
    }

    /// Opens a handle inside `ns` (on a throwaway thread); it stays bound to `ns`.
    ///
    /// # Errors
    /// The namespace cannot be entered, or the socket opened.
    pub fn open_in(ns: &NetNs) -> Result<Nft, NftError> {
        ns.run(Nft::new)?
    }

    /// Applies `batch` as one transaction: every change or none.
    ///
    /// # Errors
    /// [`NftError::Invalid`] before sending anything; [`NftError::Rejected`] naming the first
    /// object the kernel refused, with its errno.
    pub fn apply(&mut self, batch: &Batch) -> Result<(), NftError> {
        if batch.is_empty() {
            return Ok(());
        }
        let messages = batch.encode().map_err(|e| NftError::Invalid {
            object: e.object,
            reason: e.reason,
        })?;
        let count = messages.len();
        let control = |m| {
            NetfilterMessage::new(
                NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, NFNL_SUBSYS_NFTABLES),
                m,
            )
        };
        let mut wire = Vec::with_capacity(count + 2);
        wire.push((control(ControlMessage::BatchBegin), 0));
        wire.extend(messages);
        wire.push((control(ControlMessage::BatchEnd), 0));
        let failures = self
            .socket
            .send_batch(wire)
            .map_err(|source| NftError::Request {
                op: "send a batch".to_string(),
                source,
            })?;
        let Some(first) = failures.into_iter().next() else {
            return Ok(());
        };
        let (object, index) = match first.index {
            i if (1..=count).contains(&i) => (batch.describe(i - 1), Some(i - 1)),
            _ => ("commit the transaction".to_string(), None),
        };
        log::debug!("nft batch refused at {object}: {}", first.error);
        Err(NftError::Rejected {
            object,
            index,
            source: first.error,
        })
    }

    fn request(
        &mut self,
        op: &dyn Fn() -> String,
        family: Family,
        msg: NfTablesMessage,
        dump: bool,
    ) -> Result<Vec<NfTablesMessage>, NftError> {
        let msg = batch::nft_message(family, msg);
        let replies = if dump {
            self.socket.dump(msg)
        } else {
            self.socket.request(msg, 0)
        }
        .map_err(|source| NftError::Request { op: op(), source })?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r.inner {
                NetfilterMessageInner::NfTables(m) => Some(m),
                _ => None,
            })
            .collect())
    }

    fn exists(
        &mut self,
        family: Family,
        msg: NfTablesMessage,
        what: String,
    ) -> Result<bool, NftError> {
        match self.request(&|| format!("look up {what}"), family, msg, false) {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether the table exists (`nft list table …` succeeds).
    ///
    /// # Errors
    /// The kernel's errno other than ENOENT.
    pub fn table_exists(&mut self, table: &Table) -> Result<bool, NftError> {
        let msg = NfTablesMessage::GetTable(TableMessage {
            attributes: vec![TableAttribute::Name(table.name.clone())],
        });
        self.exists(table.family, msg, format!("table {table}"))
    }

    /// Whether the chain exists (`nft list chain …` succeeds).
    ///
    /// # Errors
    /// The kernel's errno other than ENOENT.
    pub fn chain_exists(&mut self, table: &Table, chain: &str) -> Result<bool, NftError> {
        let msg = NfTablesMessage::GetChain(ChainMessage {
            attributes: vec![
                ChainAttribute::Table(table.name.clone()),
                ChainAttribute::Name(chain.to_string()),
            ],
        });
        self.exists(table.family, msg, format!("chain {table} {chain}"))
    }

    /// The rules of a chain in order, with handles and comments (`nft -a list chain …`).
    ///
    /// # Errors
    /// `is_not_found()` when the table or chain does not exist.
    pub fn rules(&mut self, table: &Table, chain: &str) -> Result<Vec<ListedRule>, NftError> {
        Ok(self
            .dump_rules(table, chain)?
            .iter()
            .map(raw::DumpedRule::decode)
            .collect())
    }

    /// The rules of a chain, in order, that contain any of `needles` in their netlink encoding
    /// (an address, a chain name…). The kernel still lists the whole chain, but the others are
    /// not decoded: for a caller looking for given rules in a chain of thousands, most of the
    /// cost of [`Nft::rules`] is the decoding.
    ///
    /// # Errors
    /// `is_not_found()` when the table or chain does not exist.
    pub fn rules_containing(
        &mut self,
        table: &Table,
        chain: &str,
        needles: &[&[u8]],
    ) -> Result<Vec<ListedRule>, NftError> {
        let finders = finders(needles);
        Ok(self
            .dump_rules(table, chain)?
            .iter()
            .filter(|rule| rule.contains_any(&finders))
            .map(raw::DumpedRule::decode)
            .collect())
    }

    /// The first rule of a chain in the calling thread's namespace that contains one of
    /// `needles` (see [`Nft::rules_containing`]), reading the chain only up to it: the kernel
    /// builds a dump one datagram per read, so the rules after it cost nothing, where a full
    /// listing of a chain of thousands takes milliseconds of kernel time (for a chain's
    /// leading jump, say). Uses a socket of its own, as the rest of the dump stays queued on
    /// it; a fresh socket also keeps the kernel's first datagram small.
    ///
    /// # Errors
    /// `is_not_found()` when the table or chain does not exist.
    pub fn first_rule_containing(
        table: &Table,
        chain: &str,
        needles: &[&[u8]],
    ) -> Result<Option<ListedRule>, NftError> {
        let finders = finders(needles);
        let wanted =
            |rule: &raw::DumpedRule| rule.is_in(&table.name, chain) && rule.contains_any(&finders);
        let msg = get_rules(table, chain);
        let replies: Vec<raw::DumpedRule> = Nft::new()?
            .socket
            .dump_until(batch::nft_message(table.family, msg), wanted)
            .map_err(|source| list_chain_error(table, chain, source))?;
        if let Some(found) = replies.last().filter(|rule| wanted(rule)) {
            return Ok(Some(found.decode()));
        }
        // Read to the end without a match: tell an empty chain from a missing one.
        if Nft::new()?.chain_exists(table, chain)? {
            Ok(None)
        } else {
            Err(list_chain_error(table, chain, missing()))
        }
    }

    fn dump_rules(&mut self, table: &Table, chain: &str) -> Result<Vec<raw::DumpedRule>, NftError> {
        // A dump of a missing chain is simply empty: ask first, so a caller can tell them apart.
        if !self.chain_exists(table, chain)? {
            return Err(list_chain_error(table, chain, missing()));
        }
        let msg = get_rules(table, chain);
        let mut replies: Vec<raw::DumpedRule> = self
            .socket
            .dump_as(batch::nft_message(table.family, msg))
            .map_err(|source| list_chain_error(table, chain, source))?;
        // Old kernels ignore the dump filter: keep only this chain's rules.
        replies.retain(|reply| reply.is_in(&table.name, chain));
        Ok(replies)
    }

    /// The declared key and data types of a set or map.
    fn set_types(
        &mut self,
        table: &Table,
        set: &str,
    ) -> Result<(Vec<DataType>, SetData), NftError> {
        let op = || format!("look up set {table} {set}");
        let msg = NfTablesMessage::GetSet(SetMessage {
            attributes: vec![
                SetAttribute::Table(table.name.clone()),
                SetAttribute::Name(set.to_string()),
            ],
        });
        let replies = self.request(&op, table.family, msg, false)?;
        let unsupported = |what: &str| NftError::Request {
            op: op(),
            source: io::Error::new(io::ErrorKind::InvalidData, what.to_string()),
        };
        let Some(NfTablesMessage::NewSet(SetMessage { attributes })) = replies.into_iter().next()
        else {
            return Err(unsupported("no set in the reply"));
        };
        let (mut key, mut data, mut is_map) = (None, None, false);
        for attr in attributes {
            match attr {
                SetAttribute::KeyType(t) => key = Some(t),
                SetAttribute::DataType(t) => data = Some(t),
                SetAttribute::Flags(f) => is_map = f.contains(SetFlags::Map),
                _ => {}
            }
        }
        let key = key
            .and_then(DataType::split_id)
            .ok_or_else(|| unsupported("key type not supported"))?;
        let data = match data {
            _ if !is_map => SetData::None,
            Some(set::NFT_DATA_VERDICT) => SetData::Verdict,
            Some(t) => SetData::Values(
                DataType::split_id(t).ok_or_else(|| unsupported("data type not supported"))?,
            ),
            None => SetData::None,
        };
        Ok((key, data))
    }

    /// Every element of a set or map, with data and comments (`nft list map …`).
    ///
    /// # Errors
    /// `is_not_found()` when the table or set does not exist.
    pub fn elements(&mut self, table: &Table, set: &str) -> Result<Vec<Element>, NftError> {
        let (key, data) = self.set_types(table, set)?;
        let msg = NfTablesMessage::GetSetElement(SetElementMessage {
            attributes: vec![
                SetElementList::Table(table.name.clone()),
                SetElementList::Set(set.to_string()),
            ],
        });
        let replies = self.request(
            &|| format!("list set {table} {set}"),
            table.family,
            msg,
            true,
        )?;
        Ok(decode_elements(replies, &key, &data))
    }

    /// The element with `key`, if present (`nft get element …`).
    ///
    /// # Errors
    /// `is_not_found()` when the table or set does not exist.
    pub fn element(
        &mut self,
        table: &Table,
        set: &str,
        key: &[Value],
    ) -> Result<Option<Element>, NftError> {
        let (key_types, data) = self.set_types(table, set)?;
        let msg = NfTablesMessage::GetSetElement(SetElementMessage {
            attributes: vec![
                SetElementList::Table(table.name.clone()),
                SetElementList::Set(set.to_string()),
                SetElementList::Elements(vec![ListAttribute::Element(vec![
                    SetElementAttribute::Key(DataAttribute::Value(Value::concat(key))),
                ])]),
            ],
        });
        match self.request(
            &|| format!("get element {table} {set}"),
            table.family,
            msg,
            false,
        ) {
            Ok(replies) => Ok(decode_elements(replies, &key_types, &data)
                .into_iter()
                .find(|e| e.key == key)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn decode_elements(
    replies: Vec<NfTablesMessage>,
    key: &[DataType],
    data: &SetData,
) -> Vec<Element> {
    let mut out = Vec::new();
    for reply in replies {
        let NfTablesMessage::NewSetElement(SetElementMessage { attributes }) = reply else {
            continue;
        };
        for list in attributes {
            let SetElementList::Elements(elements) = list else {
                continue;
            };
            for element in elements {
                let ListAttribute::Element(attrs) = element else {
                    continue;
                };
                if let Some(e) = decode_element(&attrs, key, data) {
                    out.push(e);
                }
            }
        }
    }
    out
}

fn decode_element(
    attrs: &[SetElementAttribute],
    key: &[DataType],
    data: &SetData,
) -> Option<Element> {
    let mut element = Element {
        key: Vec::new(),
        data: None,
        comment: None,
    };
    for attr in attrs {
        match attr {
            SetElementAttribute::Key(DataAttribute::Value(bytes)) => {
                element.key = Value::split(key, bytes)?;
            }
            SetElementAttribute::Data(DataAttribute::Value(bytes)) => {
                if let SetData::Values(types) = data {
                    element.data = Some(ElementData::Values(Value::split(types, bytes)?));
                }
            }
            SetElementAttribute::Data(DataAttribute::Verdict(v)) => {
                element.data = Some(ElementData::Verdict(Verdict::from_attributes(v)?));
            }
            SetElementAttribute::UserData(d) => element.comment = userdata::parse_comment(d),
            _ => {}
        }
    }
    (!element.key.is_empty()).then_some(element)
}

/// Substring finders for `needles`, empty ones left out (they would match every rule).
fn finders<'a>(needles: &[&'a [u8]]) -> Vec<memchr::memmem::Finder<'a>> {
    needles
        .iter()
        .filter(|n| !n.is_empty())
        .map(|n| memchr::memmem::Finder::new(*n))
        .collect()
}

/// The request listing the rules of `chain` in `table`.
fn get_rules(table: &Table, chain: &str) -> NfTablesMessage {
    NfTablesMessage::GetRule(RuleMessage {
        attributes: vec![
            RuleAttribute::Table(table.name.clone()),
            RuleAttribute::Chain(chain.to_string()),
        ],
    })
}

/// A failure to list `chain` in `table`.
fn list_chain_error(table: &Table, chain: &str, source: io::Error) -> NftError {
    NftError::Request {
        op: format!("list chain {table} {chain}"),
        source,
    }
}

/// The error of a table or chain that does not exist.
fn missing() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

#[cfg(test)]
mod tests;
