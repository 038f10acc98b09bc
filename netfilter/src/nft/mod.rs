//! nftables over netlink (`NETLINK_NETFILTER`), without the `nft` binary.
//!
//! Build a [`Batch`] of changes (tables, chains, sets and maps, rules, elements) and
//! [`Nft::apply`] it as one atomic nfnetlink transaction; read back with [`Nft::rules`],
//! [`Nft::elements`] and [`Nft::element`]. Every builder documents the `nft` text it stands for:
//!
//! ```
//! use netfilter::nft::{Batch, Chain, ChainHook, ChainType, DataType::*, Element, Family, L4Proto};
//! use netfilter::nft::{NfProto, Rule, Selector::*, Set, Table, Value, priority};
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
//! Adding what exists is not an error, so the skeleton can be declared on every call (but see
//! below: re-adding a chain that exists costs a wait). Errors carry the errno and name the
//! object of the batch the kernel refused (it answers each message by sequence number).
//! Expressions that `netlink-packet-netfilter` lacks (ct, fib, nat, masq, counter) are encoded
//! in [`expr`]; golden bytes captured with `nft --debug=netlink,mnl` (`netfilter/testdata/nft/`)
//! pin the encoding, and kernel tests compare with `nft -j list`. Replies are decoded here from
//! their bytes, not by that crate, whose parser formats every buffer it parses.
//!
//! ## Size
//!
//! A batch of any size is one transaction in one datagram: nfnetlink commits only a batch
//! whose begin and end arrive in the same datagram (an end sent in a second datagram is
//! refused with EINVAL and the first part aborted), so [`Nft::apply`] raises the socket's send
//! buffer to fit the batch (`SO_SNDBUFFORCE`, as `nft` does) instead of splitting it. An
//! element list longer than a netlink attribute holds (65 535 bytes) is split into several
//! messages of the same transaction; any other attribute too long is refused before anything
//! is sent ([`NftError::Invalid`]).
//!
//! ## Kernels without nf_tables, or without some of it
//!
//! [`NftError::is_unsupported`] tells a kernel that has no nf_tables, or refuses an expression
//! or chain type it does not know, from other failures ([`NftError::is_absent`]: no nf_tables
//! at all); [`Nft::is_available`] asks whether nf_tables is there (one small request);
//! [`Nft::missing_features`] and [`Nft::validate`] have the kernel check a batch without
//! applying it.
//!
//! A kernel without nfnetlink refuses the socket. One with nfnetlink but without nf_tables (its
//! module removed or not built: Debian's kernels have it as a module) opens it, then tries to
//! load the module for each message and answers a request EINVAL and a batch EOPNOTSUPP
//! (`nfnetlink_rcv_msg` and `nfnetlink_rcv_batch`, 5.10 to 6.12). A present nf_tables answers
//! EINVAL to a message it finds malformed too; after such an answer the handle asks for the
//! ruleset's generation, which every nf_tables gives, once: refused with EINVAL too, the error
//! is [`NftError::Absent`].
//!
//! ## One socket per call: why its close can wait
//!
//! Measured on the 6.18 development VM (2 vCPUs, `HZ=250`, preemptible RCU; medians of 15,
//! ranges in brackets; `strace -T` shows the same time in the final `close`):
//!
//! - A commit that deletes something (elements, rules, chains, sets, tables), or that re-adds
//!   a chain that exists (regular or base: the kernel records an update of it), leaves the
//!   freed objects to a per-namespace work item that first waits for an RCU grace period.
//! - The last close of *any* bound `NETLINK_NETFILTER` socket of that namespace waits for that
//!   work (`nft_rcv_nl_event` flushes it): 12 ms [5–24] right after the commit, whichever
//!   socket did the deleting. A socket that only added elements or rules, or re-added a table
//!   or set that exists, leaves nothing: its close takes 15 µs, as does one that did nothing.
//! - The work runs on its own: a close 2 ms after the commit waits 9 ms, 5 ms after 8 ms,
//!   10 ms after usually nothing (34 µs), 20 ms after never.
//! - The work is per namespace (on 6.18): a socket of another namespace closes at once.
//! - A commit deleting thousands of elements waits for a grace period inside the `sendmsg`
//!   itself (15 ms at 4 000 elements, 55–90 ms at 16 000), and its close then returns at once;
//!   2 000 and fewer leave the wait to the close (`strace -T nft -f` deleting them).
//! - A batch checked and aborted ([`Nft::validate`], [`Nft::missing_features`]) costs the
//!   grace period in the abort itself (9 ms [5–22]), and leaves nothing for the close.
//!
//! So a call opens one [`Nft`] (or a [`LazyNft`], opened when first needed), makes its
//! deleting commit as early as it can, and closes that socket once, at exit: its other work
//! overlaps the grace period. Every extra socket closed after a deletion of the namespace (the
//! call's own, or any other process's) waits again. A call that deletes nothing, and re-adds no
//! existing chain, never waits for a grace period.
//!
//! An element given a timeout instead ([`Batch::expire_elements`]) queues nothing: the kernel
//! stops matching it at its next tick (4 ms at `HZ=250`), and the set's garbage collection
//! frees it later. [`Nft::apply`] returns once that tick has passed (the element looked up
//! every quarter of a millisecond: half a tick on average), so that a removal is in effect
//! when the call returns, as a deletion would be.

mod batch;
pub mod committers;
pub mod expr;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod monitor;
mod probe;
pub(crate) mod raw;
mod rule;
mod set;
mod userdata;

use std::fmt;
use std::io;
use std::os::fd::AsFd;

use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, ListAttribute, NfTablesMessage, RuleAttribute,
    RuleMessage, SetAttribute, SetElementAttribute, SetElementList, SetElementMessage, SetMessage,
    TableAttribute, TableMessage,
};

pub use batch::{BaseChain, Batch, Chain, ChainHook, ChainType, Policy, priority};
pub use expr::{CmpOp, Expr, PayloadBase, Verdict};
pub use probe::Feature;
pub use rule::{
    COMMENT_MAX, CtStateFlags, CtStatusFlags, IntoNet, NfProto, Rule, RuleError, Selector,
};
pub use set::{DataType, Element, ElementData, L4Proto, Set, SetData, Value};

use host::netns::{NetNs, NetnsError};
use netlink::NetlinkSocket;

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
    #[error("nftables: {object} failed: {source}{}", feature.as_ref().map(|f| format!(" (the kernel has no nf_tables {f})")).unwrap_or_default())]
    Rejected {
        /// The refused object, in `nft` syntax.
        object: String,
        /// Its position in the batch (from 0), or `None` for the transaction as a whole.
        index: Option<usize>,
        /// The kernel feature the refusal shows missing (`expression "fib"`, `chain type
        /// "nat"`): see [`NftError::missing_feature`].
        feature: Option<String>,
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
    /// The kernel has nfnetlink but no nf_tables (not built, or its module cannot be
    /// loaded): nfnetlink answers a request of a subsystem it does not have with EINVAL, and a
    /// batch for one with EOPNOTSUPP, once its attempt to load the module has failed. A
    /// present nf_tables also answers EINVAL to a message it finds malformed: the kernel
    /// refusing to give the ruleset's generation too, which every nf_tables gives, tells the
    /// two apart ([`Nft`] asks once per handle, and only after such an answer).
    #[error("nftables: failed to {op}: {source}")]
    Absent {
        /// What was attempted (a request, or the batch's `commit the transaction`).
        op: String,
        /// The kernel's errno (EINVAL or EOPNOTSUPP).
        #[source]
        source: io::Error,
    },
}

impl NftError {
    /// The errno, if the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NftError::Open(e) => e.raw_os_error(),
            NftError::Rejected { source, .. }
            | NftError::Request { source, .. }
            | NftError::Absent { source, .. } => source.raw_os_error(),
            NftError::Netns(_) | NftError::Invalid { .. } => None,
        }
    }

    /// True when a table, chain, set, rule or element does not exist (ENOENT). Not when
    /// the ENOENT is the kernel not knowing an expression or chain type: that is
    /// [`NftError::is_unsupported`].
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(libc::ENOENT) && self.missing_feature().is_none()
    }

    /// True when the kernel has no nf_tables at all:
    /// - the netfilter netlink socket cannot be opened: EPROTONOSUPPORT (a kernel without
    ///   nfnetlink, or a process not allowed it, as the tests' seccomp filter does) or
    ///   EAFNOSUPPORT (no netlink at all);
    /// - nfnetlink has no nf_tables subsystem ([`NftError::Absent`]: a request answered
    ///   EINVAL, or a batch refused as a whole with EOPNOTSUPP, where the ruleset's
    ///   generation cannot be read either).
    pub fn is_absent(&self) -> bool {
        match self {
            NftError::Open(_) => matches!(
                self.errno(),
                Some(libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT)
            ),
            NftError::Absent { .. } => true,
            _ => false,
        }
    }

    /// True when the kernel has no nf_tables ([`NftError::is_absent`]), or lacks what was
    /// asked of it: a batch is refused at an expression or a chain type the kernel does not
    /// know (ENOENT or EOPNOTSUPP pointing there: [`NftError::missing_feature`]), e.g. `fib`
    /// without `nft_fib`.
    ///
    /// For a DEL this means "nothing of ours can be there"; for an ADD, a backend that cannot
    /// work here.
    pub fn is_unsupported(&self) -> bool {
        self.is_absent() || self.missing_feature().is_some()
    }

    /// `self` as [`NftError::Absent`] when it is what nfnetlink answers for a subsystem it
    /// does not have (EINVAL to a request, EOPNOTSUPP to a batch as a whole: the message at
    /// its begin) and `generation` (asked only then: the errno of a request of the ruleset's
    /// generation, `None` when the kernel gave it) is EINVAL as well. Otherwise `self`.
    fn absent_when(self, generation: impl FnOnce() -> Option<i32>) -> NftError {
        let shape = match &self {
            NftError::Request { source, .. } => source.raw_os_error() == Some(libc::EINVAL),
            NftError::Rejected {
                index: None,
                source,
                ..
            } => source.raw_os_error() == Some(libc::EOPNOTSUPP),
            _ => false,
        };
        if !shape || generation() != Some(libc::EINVAL) {
            return self;
        }
        match self {
            NftError::Request { op, source }
            | NftError::Rejected {
                object: op, source, ..
            } => NftError::Absent { op, source },
            other => other,
        }
    }

    /// The expression or chain type the kernel refused as unknown, as `expression "fib"` or
    /// `chain type "nat"`: the kernel feature to name in an error. Known from the kernel's
    /// extended ACK, which points at the refused attribute of the refused message, when the
    /// errno is ENOENT or EOPNOTSUPP and the attribute is an expression that is not part of
    /// nf_tables itself (a `jump` to a missing chain is refused at its expression too) or a
    /// chain's type.
    pub fn missing_feature(&self) -> Option<&str> {
        match self {
            NftError::Rejected { feature, .. } => feature.as_deref(),
            _ => None,
        }
    }

    /// The refused object of a batch, in `nft` syntax.
    pub fn failed_object(&self) -> Option<&str> {
        match self {
            NftError::Rejected { object, .. } | NftError::Invalid { object, .. } => Some(object),
            _ => None,
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

/// An nf_tables handle bound to one network namespace: one netlink socket, for a whole plugin
/// call. Every method works on that socket; only [`Nft::first_rule_containing`] opens one of
/// its own. See the module docs for why one socket matters (its close can wait).
#[derive(Debug)]
pub struct Nft {
    socket: NetlinkSocket,
    /// The send buffer the socket has been given (`SO_SNDBUF`, as the kernel reports it), once
    /// a batch needed more than the default.
    sndbuf: Option<usize>,
    /// The receive buffer likewise, once a batch's echoed replies needed more.
    rcvbuf: Option<usize>,
    /// What lookups learnt of sets (a set's types and flags never change while it exists):
    /// every element lookup needs them, and a call looks up several keys of the same sets.
    /// Forgotten when a batch of this handle deletes a table or set; a set another process
    /// deletes and declares otherwise meanwhile is not noticed (a handle serves one call).
    sets: Vec<(Family, String, String, SetInfo)>,
    /// Whether the kernel lacks nf_tables (its ruleset's generation refused with EINVAL),
    /// once a refusal made it worth asking ([`Nft::classify`]).
    absent: Option<bool>,
}

/// The declared types and flags of a set or map.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SetInfo {
    key: Vec<DataType>,
    data: SetData,
    /// `flags timeout`.
    timeout: bool,
}

/// The socket's descriptor (tests tell sockets apart by it). After a batch that deleted
/// objects, its last close waits for the kernel to free them (module docs).
impl AsFd for Nft {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// An [`Nft`] opened on first use and kept for the rest of a plugin call: the call's one
/// nf_tables socket (module docs: each socket's close may wait), with nothing opened on paths
/// that never touch nf_tables. Opened in the namespace of the thread that first uses it.
#[derive(Debug, Default)]
pub struct LazyNft(Option<Nft>);

impl LazyNft {
    /// Nothing opened yet.
    pub fn new() -> LazyNft {
        LazyNft(None)
    }

    /// The handle, opened now if it is not yet.
    ///
    /// # Errors
    /// As [`Nft::new`]; a later call tries again.
    pub fn get(&mut self) -> Result<&mut Nft, NftError> {
        match &mut self.0 {
            Some(nft) => Ok(nft),
            empty => Ok(empty.insert(Nft::new()?)),
        }
    }

    /// The handle if it was opened.
    pub fn opened(&mut self) -> Option<&mut Nft> {
        self.0.as_mut()
    }
}

impl From<Nft> for LazyNft {
    fn from(nft: Nft) -> LazyNft {
        LazyNft(Some(nft))
    }
}

/// A message of a batch on the wire: borrowed from the encoded batch (kept to name what the
/// kernel refused), or owned (the begin and end markers, and what `send_batch` parses).
#[derive(Debug)]
struct Wire<'a>(std::borrow::Cow<'a, raw::RawMsg>);

impl netlink_packet_core::NetlinkSerializable for Wire<'_> {
    fn message_type(&self) -> u16 {
        self.0.kind
    }

    fn buffer_len(&self) -> usize {
        self.0.payload.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.copy_from_slice(&self.0.payload);
    }
}

impl netlink_packet_core::NetlinkDeserializable for Wire<'_> {
    type Error = io::Error;

    fn deserialize(
        header: &netlink_packet_core::NetlinkHeader,
        payload: &[u8],
    ) -> Result<Self, Self::Error> {
        raw::RawMsg::deserialize(header, payload).map(|m| Wire(std::borrow::Cow::Owned(m)))
    }
}

/// `sizeof(struct nlmsghdr)`.
const NLMSG_HDRLEN: usize = 16;
/// What `netlink_sendmsg` needs beyond a datagram in the send buffer (`len > sk_sndbuf - 32`
/// is refused with EMSGSIZE).
const SNDBUF_SLACK: usize = 32;
/// What an echoed reply costs the receive buffer beyond its bytes (the skb's own).
const ECHO_OVERHEAD: usize = 1024;
/// The send buffer a new socket has (`net.core.wmem_default`, 212 992 bytes on most systems);
/// a larger batch raises it first.
const SNDBUF_DEFAULT: usize = 212_992;

impl Nft {
    /// Opens a handle in the calling thread's namespace.
    ///
    /// # Errors
    /// [`NftError::Open`] with the socket errno (EPROTONOSUPPORT without nfnetlink:
    /// [`NftError::is_unsupported`]).
    pub fn new() -> Result<Nft, NftError> {
        let socket = NetlinkSocket::open(netlink_sys::constants::NETLINK_NETFILTER)
            .map_err(NftError::Open)?;
        // Refusals must not echo whole batches back: only the header is needed.
        socket.set_cap_ack(true).map_err(NftError::Open)?;
        Ok(Nft {
            socket,
            sndbuf: None,
            rcvbuf: None,
            sets: Vec::new(),
            absent: None,
        })
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
    /// The transaction goes to the kernel in one datagram, whatever its size: nfnetlink
    /// applies a transaction only when its begin and end come in the same datagram (an end in
    /// a later one is refused with EINVAL, and the first is aborted), so the socket's send
    /// buffer is raised to fit it (`SO_SNDBUFFORCE`; 10 000 port mappings are about 2 MB).
    /// Element lists are split into as many messages as their attributes need.
    ///
    /// # Errors
    /// [`NftError::Invalid`] before sending anything; [`NftError::Rejected`] naming the first
    /// object the kernel refused, with its errno (and the kernel feature it lacks, when the
    /// refusal points at one: [`NftError::is_unsupported`]).
    pub fn apply(&mut self, batch: &Batch) -> Result<(), NftError> {
        self.transact(batch, true).map(drop)
    }

    /// [`Nft::apply`], returning the rules added with [`Batch::add_rule_echo`] as the kernel
    /// committed them (with their handles), in batch order.
    ///
    /// # Errors
    /// As [`Nft::apply`].
    pub fn apply_echo(&mut self, batch: &Batch) -> Result<Vec<ListedRule>, NftError> {
        self.transact(batch, true)
    }

    /// Has the kernel check `batch` without applying it, as `nft --check` does: every message
    /// is processed as for [`Nft::apply`] (names resolved, expressions and chain types looked
    /// up, attributes validated) and the transaction is then aborted, since it has no end.
    /// Nothing changes, but the kernel's abort waits for an RCU grace period (5–20 ms on the
    /// 6.18 development VM), so this is for the rare path: a probe, STATUS.
    ///
    /// # Errors
    /// As [`Nft::apply`] for what the kernel would refuse.
    pub fn validate(&mut self, batch: &Batch) -> Result<(), NftError> {
        self.transact(batch, false).map(drop)
    }

    /// Sends `batch` and returns the rules the kernel echoed back, in batch order. Expiries
    /// ([`Batch::expire_elements`]) of sets without `flags timeout` are sent as deletions.
    /// After a commit that expires elements it returns only once the kernel no longer matches
    /// them ([`Nft::settle_expiries`]): a caller that flushes conntrack next, or tells its
    /// runtime the port is free, must not race the kernel's tick.
    fn transact(&mut self, batch: &Batch, commit: bool) -> Result<Vec<ListedRule>, NftError> {
        let resolved = self.resolve_expiries(batch)?;
        let batch = resolved.as_ref().unwrap_or(batch);
        let echoed = self.transact_resolved(batch, commit)?;
        if commit && self.settle_expiries(batch)? == Expiry::Ignored {
            log::debug!("the kernel does not update element timeouts: deleting instead");
            self.transact_resolved(&batch.expiries_as_deletions(), true)?;
        }
        Ok(echoed)
    }

    /// [`Nft::transact`] without the wait for the expired elements to be gone.
    #[cfg(test)]
    pub(crate) fn transact_unsettled(
        &mut self,
        batch: &Batch,
        commit: bool,
    ) -> Result<Vec<ListedRule>, NftError> {
        let resolved = self.resolve_expiries(batch)?;
        self.transact_resolved(resolved.as_ref().unwrap_or(batch), commit)
    }

    /// `batch` with the expiries of sets that lack `flags timeout` (made by an earlier version
    /// of a plugin) made deletions, `None` when there are none. A set that cannot be found is
    /// left to the kernel's refusal.
    fn resolve_expiries(&mut self, batch: &Batch) -> Result<Option<Batch>, NftError> {
        let mut lacking: Vec<(Table, String)> = Vec::new();
        let sets: Vec<(Table, String)> = batch
            .expiring_sets()
            .map(|(t, s)| (t.clone(), s.to_string()))
            .collect();
        for (table, set) in sets {
            match self.set_info(&table, &set) {
                Ok(info) if !info.timeout => lacking.push((table, set)),
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        if lacking.is_empty() {
            return Ok(None);
        }
        Ok(batch.deleting_expiries(&|t, s| !lacking.iter().any(|(lt, ls)| lt == t && ls == s)))
    }

    /// Waits until the kernel no longer has the element the committed `batch` expired last
    /// (the one with the latest expiry: [`Nft::element_settled`]). An element still there as
    /// it was, without a timeout, was not updated: the kernel (before 6.5) ignores timeout
    /// updates. One with other data was added anew by someone else.
    fn settle_expiries(&mut self, batch: &Batch) -> Result<Expiry, NftError> {
        let Some((table, set, last)) = batch.last_expiring() else {
            return Ok(Expiry::Gone);
        };
        let (table, set, last) = (table.clone(), set.to_string(), last.clone());
        Ok(match self.element_settled(&table, &set, &last.key)? {
            Some(e) if !e.is_expiring() && e.data == last.data && e.comment == last.comment => {
                Expiry::Ignored
            }
            _ => Expiry::Gone,
        })
    }

    /// [`Nft::transact`] of a batch whose expiries are resolved.
    fn transact_resolved(
        &mut self,
        batch: &Batch,
        commit: bool,
    ) -> Result<Vec<ListedRule>, NftError> {
        if batch.drops_sets() {
            self.sets.clear();
        }
        let (encoded, replies) = self.send(batch, commit)?;
        match replies.failures.into_iter().next() {
            None => {
                let mut echoed = replies.messages;
                echoed.sort_by_key(|(index, _)| *index);
                Ok(echoed
                    .iter()
                    .filter(|(_, rule)| rule.is_rule())
                    .map(|(_, rule)| rule.decode())
                    .collect())
            }
            Some(first) => Err(self.classify(rejected(batch, &encoded, first, commit))),
        }
    }

    /// Sends `batch` as one datagram (with its end when `commit`) and returns its messages and
    /// every refusal, in order.
    fn send(
        &mut self,
        batch: &Batch,
        commit: bool,
    ) -> Result<(Vec<batch::Encoded>, netlink::BatchReplies<raw::DumpedRule>), NftError> {
        if batch.is_empty() {
            return Ok((
                Vec::new(),
                netlink::BatchReplies {
                    failures: Vec::new(),
                    messages: Vec::new(),
                },
            ));
        }
        let encoded = batch.encode().map_err(|e| NftError::Invalid {
            object: e.object,
            reason: e.reason,
        })?;
        let control = |kind| {
            (
                Wire(std::borrow::Cow::Owned(raw::RawMsg::batch_control(kind))),
                0,
            )
        };
        let mut wire = Vec::with_capacity(encoded.len() + 2);
        wire.push(control(raw::NFNL_MSG_BATCH_BEGIN));
        wire.extend(
            encoded
                .iter()
                .map(|e| (Wire(std::borrow::Cow::Borrowed(&e.msg)), e.flags)),
        );
        if commit {
            wire.push(control(raw::NFNL_MSG_BATCH_END));
        }
        let bytes: usize = wire
            .iter()
            .map(|(m, _)| (NLMSG_HDRLEN + m.0.payload.len() + 3) & !3)
            .sum();
        self.reserve_send_buffer(bytes)?;
        // The kernel queues every echoed rule (and the ACK) on the socket before it is read: a
        // receive buffer they overrun loses them (ENOBUFS) after the commit. Each costs its
        // bytes and an skb's overhead.
        let echoed: usize = encoded
            .iter()
            .filter(|e| e.flags & netlink_packet_core::NLM_F_ECHO != 0)
            .map(|e| e.msg.payload.len() + NLMSG_HDRLEN + ECHO_OVERHEAD)
            .sum();
        self.reserve_receive_buffer(echoed)?;
        if commit {
            committers::note(&self.socket);
        }
        let replies = self
            .socket
            .send_batch_as::<_, raw::DumpedRule>(wire)
            .map_err(|source| NftError::Request {
                op: format!("send a batch of {bytes} bytes"),
                source,
            })?;
        Ok((encoded, replies))
    }

    /// Makes the socket's send buffer hold a datagram of `bytes`.
    fn reserve_send_buffer(&mut self, bytes: usize) -> Result<(), NftError> {
        use nix::sys::socket::sockopt;
        let have = self.sndbuf.unwrap_or(SNDBUF_DEFAULT);
        if bytes + SNDBUF_SLACK <= have {
            return Ok(());
        }
        // The kernel doubles what it is given (for its bookkeeping): ask for the datagram.
        // SO_SNDBUFFORCE needs CAP_NET_ADMIN, which changing nf_tables needs anyway; without
        // it SO_SNDBUF is capped at net.core.wmem_max, and a datagram still too large is
        // refused by the send with EMSGSIZE.
        let got = self.raise_buffer(
            "send",
            bytes + SNDBUF_SLACK,
            sockopt::SndBufForce,
            sockopt::SndBuf,
        )?;
        self.sndbuf = Some(got);
        Ok(())
    }

    /// Makes the socket's receive buffer hold `bytes` of replies queued at once.
    fn reserve_receive_buffer(&mut self, bytes: usize) -> Result<(), NftError> {
        use nix::sys::socket::sockopt;
        let have = self.rcvbuf.unwrap_or(SNDBUF_DEFAULT);
        if bytes <= have / 2 {
            return Ok(());
        }
        // As for the send buffer: SO_RCVBUFFORCE needs CAP_NET_ADMIN, else SO_RCVBUF is capped
        // at net.core.rmem_max.
        let got = self.raise_buffer("receive", bytes, sockopt::RcvBufForce, sockopt::RcvBuf)?;
        self.rcvbuf = Some(got);
        Ok(())
    }

    /// Asks for a buffer (`which`: send or receive) of `bytes` with `forced`, else `plain`,
    /// and returns the size the kernel reports for it.
    fn raise_buffer<F, P>(
        &self,
        which: &str,
        bytes: usize,
        forced: F,
        plain: P,
    ) -> Result<usize, NftError>
    where
        F: nix::sys::socket::SetSockOpt<Val = usize>,
        P: nix::sys::socket::SetSockOpt<Val = usize>
            + nix::sys::socket::GetSockOpt<Val = usize>
            + Copy,
    {
        use nix::sys::socket::{getsockopt, setsockopt};
        let set = setsockopt(&self.socket, forced, &bytes)
            .or_else(|_| setsockopt(&self.socket, plain, &bytes));
        if let Err(errno) = set {
            log::debug!("cannot raise the nf_tables {which} buffer to {bytes}: {errno}");
        }
        getsockopt(&self.socket, plain).map_err(|e| NftError::Request {
            op: format!("read the {which} buffer size"),
            source: e.into(),
        })
    }

    /// Sends one request (a lookup: `dump` false, or a listing) and returns the replies.
    fn request(
        &mut self,
        op: &dyn Fn() -> String,
        family: Family,
        msg: NfTablesMessage,
        dump: bool,
    ) -> Result<Vec<raw::RawMsg>, NftError> {
        let msg = raw::RawMsg::encode(&batch::nft_message(family, msg));
        let replies = if dump {
            self.socket.dump(msg)
        } else {
            self.socket.request(msg, 0)
        };
        replies.map_err(|source| self.classify(NftError::Request { op: op(), source }))
    }

    /// `err` as [`NftError::Absent`] where the kernel has no nf_tables
    /// ([`NftError::absent_when`]); the kernel is asked for the ruleset's generation only
    /// after a refusal that nfnetlink gives for a subsystem it lacks, once per handle.
    fn classify(&mut self, err: NftError) -> NftError {
        err.absent_when(|| {
            let absent = *self
                .absent
                .get_or_insert_with(|| generation_errno(&mut self.socket) == Some(libc::EINVAL));
            absent.then_some(libc::EINVAL)
        })
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

    /// Whether the kernel has nf_tables: its generation can be read. A kernel without it
    /// answers EINVAL (no such nfnetlink subsystem); without nfnetlink the socket could not be
    /// opened. One small request, nothing changed: the cheap probe for "is nf_tables there".
    ///
    /// # Errors
    /// Other errnos than EINVAL.
    pub fn is_available(&mut self) -> Result<bool, NftError> {
        match generation(&mut self.socket) {
            Ok(()) => {
                self.absent = Some(false);
                Ok(true)
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.absent = Some(true);
                Ok(false)
            }
            Err(source) => Err(NftError::Request {
                op: "read the ruleset generation".to_string(),
                source,
            }),
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

    /// Whether the set or map exists (`nft list set …` succeeds). Declaring a set that exists
    /// with other flags is refused (EEXIST): a caller that re-declares its sets can leave
    /// alone those that exist, made with other flags by an earlier version.
    ///
    /// # Errors
    /// The kernel's errno other than ENOENT.
    pub fn set_exists(&mut self, table: &Table, set: &str) -> Result<bool, NftError> {
        let msg = NfTablesMessage::GetSet(SetMessage {
            attributes: vec![
                SetAttribute::Table(table.name.clone()),
                SetAttribute::Name(set.to_string()),
            ],
        });
        self.exists(table.family, msg, format!("set {table} {set}"))
    }

    /// The handle of a table (`nft -a list table …`), or `None` when it does not exist. The
    /// kernel numbers the tables of a namespace from one counter, so a table deleted and made
    /// again has another handle: rule handles recorded with one are void with the other.
    ///
    /// # Errors
    /// The kernel's errno other than ENOENT.
    pub fn table_handle(&mut self, table: &Table) -> Result<Option<u64>, NftError> {
        let msg = NfTablesMessage::GetTable(TableMessage {
            attributes: vec![TableAttribute::Name(table.name.clone())],
        });
        match self.request(
            &|| format!("look up table {table}"),
            table.family,
            msg,
            false,
        ) {
            Ok(replies) => Ok(replies
                .iter()
                .filter(|reply| reply.nft_kind() == Some(raw::NFT_MSG_NEWTABLE))
                .find_map(|reply| {
                    raw::attributes(reply.attrs())
                        .find(|(kind, _)| *kind == raw::NFTA_TABLE_HANDLE)
                        .and_then(|(_, v)| v.try_into().ok().map(u64::from_be_bytes))
                })),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The rule with `handle` in a chain (`nft -a list chain …` without the others: the
    /// kernel finds it by handle and sends that rule alone), or `None` when the table, chain
    /// or rule does not exist.
    ///
    /// # Errors
    /// The kernel's errno other than ENOENT.
    pub fn rule(
        &mut self,
        table: &Table,
        chain: &str,
        handle: u64,
    ) -> Result<Option<ListedRule>, NftError> {
        let msg = NfTablesMessage::GetRule(RuleMessage {
            attributes: vec![
                RuleAttribute::Table(table.name.clone()),
                RuleAttribute::Chain(chain.to_string()),
                RuleAttribute::Handle(handle),
            ],
        });
        match self
            .socket
            .request_as::<_, raw::DumpedRule>(batch::nft_message(table.family, msg), 0)
        {
            Ok(replies) => Ok(replies
                .iter()
                .find(|r| r.is_in(&table.name, chain))
                .map(raw::DumpedRule::decode)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(source) => Err(self.classify(NftError::Request {
                op: format!("get rule {table} {chain} handle {handle}"),
                source,
            })),
        }
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

    /// The rules of every chain of `table` that `wanted` accepts, with their chains, in one
    /// dump of the table (`nft -a list table …`): the kernel lists every rule of the table,
    /// but only those of the chains wanted are decoded. For a caller that asks about many
    /// chains of its own at once (one per attachment), where a listing per chain would cost
    /// a request each. A table that does not exist holds none.
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn table_rules(
        &mut self,
        table: &Table,
        mut wanted: impl FnMut(&str) -> bool,
    ) -> Result<Vec<(String, ListedRule)>, NftError> {
        let msg = NfTablesMessage::GetRule(RuleMessage {
            attributes: vec![RuleAttribute::Table(table.name.clone())],
        });
        let msg = raw::RawMsg::encode(&batch::nft_message(table.family, msg));
        let replies: Vec<raw::DumpedRule> = match self.socket.dump_as(msg) {
            Ok(replies) => replies,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Vec::new()),
            Err(source) => {
                return Err(self.classify(NftError::Request {
                    op: format!("list table {table}"),
                    source,
                }));
            }
        };
        let mut rules = Vec::new();
        for reply in &replies {
            let Some(chain) = reply.chain_in(&table.name) else {
                continue;
            };
            let Ok(chain) = std::str::from_utf8(chain) else {
                continue;
            };
            if wanted(chain) {
                rules.push((chain.to_owned(), reply.decode()));
            }
        }
        Ok(rules)
    }

    /// The first rule of a chain in the calling thread's namespace that contains one of
    /// `needles` (see [`Nft::rules_containing`]), reading the chain only up to it: the kernel
    /// builds a dump one datagram per read, so the rules after it cost nothing, where a full
    /// listing of a chain of thousands takes milliseconds of kernel time (for a chain's
    /// leading jump, say). Uses a socket of its own, as the rest of the dump stays queued on
    /// it (a socket with a dump in progress refuses another with EBUSY); a fresh socket also
    /// keeps the kernel's first datagram small. Call it before the call's commits: the close
    /// of any nf_tables socket waits for the kernel's frees of the namespace's earlier
    /// deletions (module docs).
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
        let msg = raw::RawMsg::encode(&batch::nft_message(table.family, get_rules(table, chain)));
        let replies: Vec<raw::DumpedRule> = match Nft::new()?.socket.dump_until(msg, wanted) {
            Ok(replies) => replies,
            // That socket is spent: another asks, should the kernel lack nf_tables.
            Err(source) => return Err(Nft::new()?.classify(list_chain_error(table, chain, source))),
        };
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
        let msg = raw::RawMsg::encode(&batch::nft_message(table.family, get_rules(table, chain)));
        let mut replies: Vec<raw::DumpedRule> = match self.socket.dump_as(msg) {
            Ok(replies) => replies,
            Err(source) => return Err(self.classify(list_chain_error(table, chain, source))),
        };
        // Old kernels ignore the dump filter: keep only this chain's rules.
        replies.retain(|reply| reply.is_in(&table.name, chain));
        Ok(replies)
    }

    /// The declared types and flags of a set or map, asked of the kernel once per handle.
    fn set_info(&mut self, table: &Table, set: &str) -> Result<SetInfo, NftError> {
        let known = self
            .sets
            .iter()
            .find(|(f, t, s, _)| *f == table.family && *t == table.name && s == set);
        if let Some((.., info)) = known {
            return Ok(info.clone());
        }
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
        let Some(reply) = replies
            .iter()
            .find(|r| r.nft_kind() == Some(raw::NFT_MSG_NEWSET))
        else {
            return Err(unsupported("no set in the reply"));
        };
        let types = raw::set_types(reply.attrs());
        let key = types
            .key
            .and_then(DataType::split_id)
            .ok_or_else(|| unsupported("key type not supported"))?;
        let data = match types.data {
            _ if !types.is_map => SetData::None,
            Some(set::NFT_DATA_VERDICT) => SetData::Verdict,
            Some(t) => SetData::Values(
                DataType::split_id(t).ok_or_else(|| unsupported("data type not supported"))?,
            ),
            None => SetData::None,
        };
        let info = SetInfo {
            key,
            data,
            timeout: types.timeout,
        };
        self.sets.push((
            table.family,
            table.name.clone(),
            set.to_string(),
            info.clone(),
        ));
        Ok(info)
    }

    /// Every element of a set or map, with data and comments (`nft list map …`). Decoded here
    /// from the dump's bytes (see [`raw`]): well under a microsecond of CPU per element. The
    /// kernel's own listing grows faster than the set: a hash set restarts its walk from the
    /// first element for every datagram of the dump (32 KiB, some 230 elements with
    /// portmap's comments), so 4 000 elements cost it about 3 ms of CPU and 16 000 about
    /// 30 ms on the development VM. Where the key is known, [`Nft::element`] costs the same
    /// whatever the size. Elements whose timeout has ended are left out (the kernel skips
    /// them too); one still expiring says so ([`Element::expires`]).
    ///
    /// # Errors
    /// `is_not_found()` when the table or set does not exist.
    pub fn elements(&mut self, table: &Table, set: &str) -> Result<Vec<Element>, NftError> {
        let SetInfo { key, data, .. } = self.set_info(table, set)?;
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
        Ok(decode_elements(&replies, &key, &data).collect())
    }

    /// The element with `key`, if present (`nft get element …`): one lookup by key in the
    /// kernel (`NFT_MSG_GETSETELEM` without a dump), whatever the size of the set. An element
    /// whose timeout has ended is absent, even while the set's garbage collection has not
    /// freed it yet; one still expiring ([`Batch::expire_elements`]) is returned with the time
    /// it has left ([`Element::expires`]).
    ///
    /// # Errors
    /// `is_not_found()` when the table or set does not exist.
    pub fn element(
        &mut self,
        table: &Table,
        set: &str,
        key: &[Value],
    ) -> Result<Option<Element>, NftError> {
        let SetInfo {
            key: key_types,
            data,
            ..
        } = self.set_info(table, set)?;
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
            Ok(replies) => Ok(decode_elements(&replies, &key_types, &data).find(|e| e.key == key)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Nft::element`] once the kernel no longer has it expiring: while the element at `key`
    /// has a timeout running (one that [`Batch::expire_elements`] gave ends at the kernel's
    /// next tick: at most 4 ms at `HZ=250`, 10 ms at `HZ=100`), it is looked up again every
    /// [`EXPIRY_POLL`], for at most [`EXPIRY_WAIT_MAX`] (a longer timeout is not one of ours:
    /// the element is returned as it is). A key whose element a removal expired can be added
    /// again after this: adding an element that is still there changes nothing, and its
    /// timeout would then remove it. `None` also when the table or set does not exist.
    ///
    /// # Errors
    /// As [`Nft::element`], but for a missing table or set.
    pub fn element_settled(
        &mut self,
        table: &Table,
        set: &str,
        key: &[Value],
    ) -> Result<Option<Element>, NftError> {
        let deadline = std::time::Instant::now() + EXPIRY_WAIT_MAX;
        loop {
            match self.element(table, set, key) {
                Ok(Some(e)) if e.is_expiring() && std::time::Instant::now() < deadline => {
                    std::thread::sleep(EXPIRY_POLL);
                }
                Ok(found) => return Ok(found),
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }
}

/// How often [`Nft::element_settled`] looks an expiring element up: a lookup costs well
/// under a tenth of a millisecond, and the element goes at a tick.
const EXPIRY_POLL: std::time::Duration = std::time::Duration::from_micros(250);

/// The longest [`Nft::element_settled`] waits: ours expire within one kernel tick (4 ms at
/// `HZ=250`, 10 ms at `HZ=100`); a longer timeout is not one of ours.
pub(crate) const EXPIRY_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(100);

/// What became of a committed expiry ([`Nft::settle_expiries`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// The kernel no longer matches it (or someone else's element holds the key now).
    Gone,
    /// The kernel kept it as it was, without a timeout.
    Ignored,
}

/// The error of a refusal of `batch` (encoded as `encoded`; `commit` when it had its end).
fn rejected(
    batch: &Batch,
    encoded: &[batch::Encoded],
    failure: netlink::BatchFailure,
    commit: bool,
) -> NftError {
    // Message 0 is the batch begin; the kernel also answers there for the commit itself.
    let refused = failure.index.checked_sub(1).and_then(|i| encoded.get(i));
    let unknown = matches!(
        failure.error.raw_os_error(),
        Some(libc::ENOENT | libc::EOPNOTSUPP)
    );
    let (object, index, feature) = match refused {
        Some(e) => (
            batch.describe(e.op),
            Some(e.op),
            failure
                .bad_attr_offset
                .filter(|_| unknown)
                .and_then(|offset| raw::missing_feature(&e.msg, offset)),
        ),
        None if commit => ("commit the transaction".to_string(), None, None),
        None => ("check the transaction".to_string(), None, None),
    };
    log::debug!("nft batch refused at {object}: {}", failure.error);
    NftError::Rejected {
        object,
        index,
        feature,
        source: failure.error,
    }
}

/// The elements of a set listing's (or lookup's) replies, decoded with the set's types;
/// elements whose key does not decode as `key` are left out.
fn decode_elements<'a>(
    replies: &'a [raw::RawMsg],
    key: &'a [DataType],
    data: &'a SetData,
) -> impl Iterator<Item = Element> + 'a {
    replies
        .iter()
        .filter(|r| r.nft_kind() == Some(raw::NFT_MSG_NEWSETELEM))
        .flat_map(|r| raw::set_elements(r.attrs()))
        // An element whose timeout has ended is gone but for the set's garbage collection
        // (listings skip it; a lookup may not).
        .filter(|e| e.expiration != Some(0))
        .filter_map(move |e| decode_element(&e, key, data))
}

fn decode_element(e: &raw::RawElement<'_>, key: &[DataType], data: &SetData) -> Option<Element> {
    let key = Value::split(key, e.key?)?;
    let data = match data {
        SetData::None => None,
        SetData::Values(types) => match e.data {
            Some(bytes) => Some(ElementData::Values(Value::split(types, bytes)?)),
            None => None,
        },
        SetData::Verdict => e.verdict.clone().map(ElementData::Verdict),
    };
    Some(Element {
        key,
        data,
        comment: e.userdata.and_then(userdata::parse_comment),
        expires: e.expiration.map(std::time::Duration::from_millis),
    })
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

/// Asks the kernel for the ruleset's generation (`NFT_MSG_GETGEN`): a request without
/// attributes, which every nf_tables answers; nfnetlink without nf_tables answers EINVAL.
fn generation(socket: &mut NetlinkSocket) -> io::Result<()> {
    let msg = NfTablesMessage::GetGen(netlink_packet_netfilter::nftables::GenMessage {
        attributes: Vec::new(),
    });
    socket
        .request(raw::RawMsg::encode(&batch::nft_message(Family::Ip, msg)), 0)
        .map(drop)
}

/// The errno of [`generation`], `None` when the kernel gave it.
fn generation_errno(socket: &mut NetlinkSocket) -> Option<i32> {
    match generation(socket) {
        Ok(()) => None,
        // Not an errno (a reply that did not decode): nf_tables answered.
        Err(e) => e.raw_os_error(),
    }
}

/// The error of a table or chain that does not exist.
fn missing() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

#[cfg(test)]
mod tests;
