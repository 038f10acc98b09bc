//! nf_tables change events, grouped by transaction, with who made each transaction.
//!
//! A [`Monitor`] is a `NETLINK_NETFILTER` socket of one network namespace that has joined the
//! `NFNLGRP_NFTABLES` multicast group: the kernel sends it a message for every object each
//! committed transaction adds or deletes (what `nft monitor` prints). [`Monitor::next`] returns
//! them a [`Transaction`] at a time, or [`Report::Lost`] when the kernel had to drop some.
//!
//! ## What the kernel sends (`nf_tables_commit`, 5.10 to 6.18)
//!
//! - A transaction with nothing in it is not committed: no message at all.
//! - Otherwise the generation counter is raised first, then one message per object of the
//!   transaction goes out, in the transaction's order (`NFT_MSG_NEWTABLE`, `…DELCHAIN`,
//!   `…NEWRULE`, `…DELSETELEM`, …), then one `NFT_MSG_NEWGEN` that closes it. The objects'
//!   messages are packed into as few datagrams as fit (about a page each: `nft_commit_notify`,
//!   in every kernel from 5.10), and all of them are queued on the listening socket before
//!   the commit returns.
//! - Each object's message carries the family in its `nfgenmsg`, the low 16 bits of the new
//!   generation in the `nfgenmsg`'s `res_id` (big-endian), and the table's name, plus the chain,
//!   set, object or flowtable name the kind has. Deleting a table deletes its rules, sets,
//!   chains, objects and flowtables first, each with its own message (a set's elements go with
//!   the set, without messages of their own); `nft flush ruleset` deletes every table so.
//! - `NFT_MSG_NEWGEN` carries the whole generation (`NFTA_GEN_ID`), and the thread that
//!   committed: `NFTA_GEN_PROC_PID` is its thread id *in the initial pid namespace*
//!   (`task_pid_nr(current)`: the process id only for a process's main thread) and
//!   `NFTA_GEN_PROC_NAME` its `comm` (15 bytes at most: `nft`, `iptables-nft-re`, `firewalld`,
//!   a Rust thread's name). Its netlink header's port id is the committing socket's port id,
//!   whatever the pid namespace.
//! - Kernels from 6.3 have `NFT_MSG_DESTROY*` requests (a deletion that does not fail when the
//!   object is absent); an event of that type is read as a deletion too.
//!
//! A message the socket has no room for is dropped and the socket's next read fails with
//! ENOBUFS (as does the kernel's own failure to build one): the events are lost, and a
//! listener must assume anything could have changed ([`Report::Lost`]). The receive buffer is
//! raised for that reason to [`RECEIVE_BUFFER`] (as `nft monitor` does): deleting 5 000 rules
//! queues about 2 MB of messages.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use netlink_sys::Socket;

use super::raw::{NFNL_SUBSYS_NFTABLES, attributes};
use super::{Family, NftError};
use host::netns::NetNs;

/// `NFNLGRP_NFTABLES` (linux/netfilter/nfnetlink.h).
const NFNLGRP_NFTABLES: u32 = 7;
/// The receive buffer a monitor asks for: 16 MiB, as `nft monitor` does.
pub const RECEIVE_BUFFER: usize = 16 << 20;
/// One read: a datagram of events is at most a page or two (`NLMSG_GOODSIZE`).
const READ_BUF: usize = 64 * 1024;
/// `NLMSG_ERROR`, `NLMSG_DONE`: never sent to a multicast group, skipped if they were.
const NLMSG_MIN_TYPE: u16 = 0x10;
const NLMSG_HDRLEN: usize = 16;
/// `sizeof(struct nfgenmsg)`: family, version, `res_id`.
const NFGENMSG_LEN: usize = 4;

// NFT_MSG_* (linux/netfilter/nf_tables.h).
const NFT_MSG_NEWGEN: u16 = 15;
// NFTA_GEN_*.
const NFTA_GEN_ID: u16 = 1;
const NFTA_GEN_PROC_PID: u16 = 2;
const NFTA_GEN_PROC_NAME: u16 = 3;

/// The kind of object an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// A table.
    Table,
    /// A chain (base or regular).
    Chain,
    /// A rule.
    Rule,
    /// A set or map.
    Set,
    /// An element of a set or map.
    SetElement,
    /// A stateful object (counter, quota, ct helper, …).
    Object,
    /// A flowtable.
    Flowtable,
}

/// What happened to the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// Added (or, for a table or chain that existed, updated).
    New,
    /// Deleted (`NFT_MSG_DEL*`, or `NFT_MSG_DESTROY*` from kernels 6.3 and later).
    Deleted,
}

impl ObjectKind {
    /// The kind and change of an `NFT_MSG_*` other than `NEWGEN` (`None` for the `GET*` ones
    /// and any the kernel may add).
    fn of(msg: u16) -> Option<(ObjectKind, Change)> {
        use {Change::*, ObjectKind::*};
        Some(match msg {
            0 => (Table, New),
            2 | 26 => (Table, Deleted),
            3 => (Chain, New),
            5 | 27 => (Chain, Deleted),
            6 => (Rule, New),
            8 | 28 => (Rule, Deleted),
            9 => (Set, New),
            11 | 29 => (Set, Deleted),
            12 => (SetElement, New),
            14 | 30 => (SetElement, Deleted),
            18 => (Object, New),
            20 | 31 => (Object, Deleted),
            22 => (Flowtable, New),
            24 | 32 => (Flowtable, Deleted),
            _ => return None,
        })
    }

    /// The attributes of this kind's message that hold the table's name, the chain's name (for
    /// chains and rules), the object's own name (sets, elements: their set, objects,
    /// flowtables) and its handle (a big-endian u64; elements have none).
    fn attributes(self) -> (u16, Option<u16>, Option<u16>, Option<u16>) {
        match self {
            // NFTA_TABLE_NAME, NFTA_TABLE_HANDLE.
            ObjectKind::Table => (1, None, None, Some(4)),
            // NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_HANDLE.
            ObjectKind::Chain => (1, Some(3), None, Some(2)),
            // NFTA_RULE_TABLE, NFTA_RULE_CHAIN, NFTA_RULE_HANDLE.
            ObjectKind::Rule => (1, Some(2), None, Some(3)),
            // NFTA_SET_TABLE, NFTA_SET_NAME, NFTA_SET_HANDLE.
            ObjectKind::Set => (1, None, Some(2), Some(16)),
            // NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET.
            ObjectKind::SetElement => (1, None, Some(2), None),
            // NFTA_OBJ_TABLE, NFTA_OBJ_NAME, NFTA_OBJ_HANDLE.
            ObjectKind::Object => (1, None, Some(2), Some(6)),
            // NFTA_FLOWTABLE_TABLE, NFTA_FLOWTABLE_NAME, NFTA_FLOWTABLE_HANDLE.
            ObjectKind::Flowtable => (1, None, Some(2), Some(5)),
        }
    }
}

/// One object added or deleted by a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The kind of object.
    pub kind: ObjectKind,
    /// Added or deleted.
    pub change: Change,
    /// The table's `NFPROTO_*` family (see [`Event::family`]; `arp`, `bridge` and `netdev`
    /// tables have no [`Family`]).
    pub family_code: u8,
    /// The table's name (for a table, its own).
    pub table: String,
    /// The chain's name, for a chain or a rule.
    pub chain: Option<String>,
    /// The set's name for a set or an element, the object's or flowtable's for those.
    pub name: Option<String>,
    /// The object's handle, where the kind has one (elements have none).
    pub handle: Option<u64>,
    /// The low 16 bits of the generation the transaction made (the `nfgenmsg`'s `res_id`).
    generation16: u16,
}

impl Event {
    /// An event as the kernel would report it, for a caller's tests of what it reacts to
    /// (the generation is left at zero).
    #[must_use]
    pub fn new(
        kind: ObjectKind,
        change: Change,
        family_code: u8,
        table: &str,
        chain: Option<&str>,
        name: Option<&str>,
    ) -> Event {
        Event {
            kind,
            change,
            family_code,
            table: table.to_owned(),
            chain: chain.map(str::to_owned),
            name: name.map(str::to_owned),
            handle: None,
            generation16: 0,
        }
    }

    /// The object as `nft` would name it: `chain ip filter CNI-FORWARD`, `rule ip filter
    /// CNI-FORWARD`, `set inet cni_firewall containers4`, `table ip6 nat`.
    #[must_use]
    pub fn describe(&self) -> String {
        let family = self.family().map_or_else(
            || format!("family {}", self.family_code),
            |f| f.name().to_owned(),
        );
        let kind = match self.kind {
            ObjectKind::Table => "table",
            ObjectKind::Chain => "chain",
            ObjectKind::Rule => "rule",
            ObjectKind::Set => "set",
            ObjectKind::SetElement => "element of set",
            ObjectKind::Object => "object",
            ObjectKind::Flowtable => "flowtable",
        };
        let mut text = format!("{kind} {family} {}", self.table);
        if let Some(inner) = self.chain.as_deref().or(self.name.as_deref()) {
            text.push(' ');
            text.push_str(inner);
        }
        text
    }

    /// The table's family, when it is one of ours (`ip`, `ip6`, `inet`).
    #[must_use]
    pub fn family(&self) -> Option<Family> {
        Family::from_code(self.family_code)
    }

    /// Whether the object was deleted.
    #[must_use]
    pub fn is_deletion(&self) -> bool {
        self.change == Change::Deleted
    }

    /// Whether the object is `table` or inside it.
    #[must_use]
    pub fn is_in(&self, table: &super::Table) -> bool {
        self.family_code == table.family.code() && self.table == table.name
    }

    /// Decodes an nf_tables object's message (`msg`: its `NFT_MSG_*`; `payload`: the
    /// `nfgenmsg` and attributes). `None` for a message that is not about an object, or that
    /// lacks its table's name.
    fn decode(msg: u16, payload: &[u8]) -> Option<Event> {
        let (kind, change) = ObjectKind::of(msg)?;
        let (family_code, generation16) = nfgenmsg(payload)?;
        let attrs = payload.get(NFGENMSG_LEN..)?;
        let (table, chain, name, handle) = kind.attributes();
        Some(Event {
            kind,
            change,
            family_code,
            table: string_of(attrs, table)?,
            chain: chain.and_then(|kind| string_of(attrs, kind)),
            name: name.and_then(|kind| string_of(attrs, kind)),
            handle: handle.and_then(|kind| u64_of(attrs, kind)),
            generation16,
        })
    }
}

/// One committed transaction: the objects it added and deleted, and who committed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    /// The generation the transaction made; `None` when its closing `NFT_MSG_NEWGEN` never
    /// came (lost to an overrun, see [`Report::Lost`]).
    pub generation: Option<u32>,
    /// The id of the thread that committed, in the initial pid namespace (see the module
    /// docs); `None` as for `generation`.
    pub pid: Option<u32>,
    /// That thread's name (`comm`: 15 bytes at most).
    pub process: Option<String>,
    /// The port id of the netlink socket that committed (see [`port_id`]).
    pub port_id: Option<u32>,
    /// The objects added and deleted, in the kernel's order.
    pub events: Vec<Event>,
    /// When the transaction's last message was read.
    pub received: Instant,
}

impl Transaction {
    /// The objects the transaction deleted.
    pub fn deletions(&self) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(|e| e.is_deletion())
    }

    /// Whether the transaction deleted `table` or anything in it.
    #[must_use]
    pub fn deletes_in(&self, table: &super::Table) -> bool {
        self.deletions().any(|e| e.is_in(table))
    }

    /// Whether a thread of the calling process committed the transaction: its thread id is
    /// this process's id or one of its live threads' (`/proc/self/task/<tid>`).
    ///
    /// Only as reliable as the pid it compares: the kernel gives the id in the initial pid
    /// namespace, so a process in a pid namespace of its own (a container without the host's
    /// pids) never recognises itself, and a thread that has exited since its commit is not
    /// found. A caller that knows the sockets it commits on compares [`Transaction::port_id`]
    /// with their [`port_id`] instead, which holds in any pid namespace.
    #[must_use]
    pub fn is_by_this_process(&self) -> bool {
        self.pid.is_some_and(|pid| {
            pid == std::process::id()
                || std::path::Path::new(&format!("/proc/self/task/{pid}")).exists()
        })
    }
}

/// What [`Monitor::next`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// A transaction, complete unless events were lost before it.
    Transaction(Transaction),
    /// The kernel dropped events (the socket's receive buffer overran, ENOBUFS): some
    /// transactions were not seen, or only in part. Reconcile anyway.
    Lost,
}

/// A listener for the nf_tables events of one network namespace (module docs).
#[derive(Debug)]
pub struct Monitor {
    socket: Socket,
    buf: Vec<u8>,
    /// Events read whose transaction's `NFT_MSG_NEWGEN` has not come yet.
    pending: Vec<Event>,
    /// Reports complete but not yet returned (one datagram can close several transactions).
    ready: std::collections::VecDeque<Report>,
    /// The receive timeout the socket has now (`None`: blocking).
    timeout: Option<Duration>,
}

impl AsFd for Monitor {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl Monitor {
    /// Listens in the calling thread's network namespace, with a receive buffer of
    /// [`RECEIVE_BUFFER`] (or what `net.core.rmem_max` allows a process without
    /// `CAP_NET_ADMIN`).
    ///
    /// # Errors
    /// [`NftError::Open`] with the errno of the socket, its bind, or joining the group.
    pub fn new() -> Result<Monitor, NftError> {
        let mut socket =
            Socket::new(netlink_sys::constants::NETLINK_NETFILTER).map_err(NftError::Open)?;
        socket.bind_auto().map_err(NftError::Open)?;
        socket
            .add_membership(NFNLGRP_NFTABLES)
            .map_err(NftError::Open)?;
        let mut monitor = Monitor {
            socket,
            buf: Vec::with_capacity(READ_BUF),
            pending: Vec::new(),
            ready: std::collections::VecDeque::new(),
            timeout: None,
        };
        monitor.set_receive_buffer(RECEIVE_BUFFER)?;
        Ok(monitor)
    }

    /// [`Monitor::new`] inside `ns` (opened on a throwaway thread); it stays bound to `ns`.
    ///
    /// # Errors
    /// The namespace cannot be entered, or as [`Monitor::new`].
    pub fn open_in(ns: &NetNs) -> Result<Monitor, NftError> {
        ns.run(Monitor::new)?
    }

    /// Asks for a receive buffer of `bytes` (`SO_RCVBUFFORCE`, else `SO_RCVBUF`, which
    /// `net.core.rmem_max` caps) and returns the size the kernel reports: twice what it
    /// granted, for its bookkeeping.
    ///
    /// # Errors
    /// The errno of reading the size back.
    pub fn set_receive_buffer(&mut self, bytes: usize) -> Result<usize, NftError> {
        use nix::sys::socket::{getsockopt, setsockopt, sockopt};
        if let Err(errno) = setsockopt(&self.socket, sockopt::RcvBufForce, &bytes)
            .or_else(|_| setsockopt(&self.socket, sockopt::RcvBuf, &bytes))
        {
            log::debug!("cannot raise the nf_tables monitor's receive buffer to {bytes}: {errno}");
        }
        getsockopt(&self.socket, sockopt::RcvBuf).map_err(|e| NftError::Request {
            op: "read the receive buffer size".to_string(),
            source: e.into(),
        })
    }

    /// The port id of this socket (events of transactions committed on it would carry it).
    ///
    /// # Errors
    /// The errno of `getsockname`.
    pub fn port_id(&self) -> Result<u32, NftError> {
        port_id(self)
    }

    /// The next transaction, or [`Report::Lost`]; `None` when `timeout` passes first
    /// (`None`: wait for ever). What the kernel has queued already is read even with a zero
    /// timeout, without waiting (a caller that polls the socket drains it so).
    ///
    /// A transaction is returned once its `NFT_MSG_NEWGEN` is read. Events of a generation
    /// whose `NFT_MSG_NEWGEN` was lost are returned as a transaction without generation (and
    /// without pid) when an event of a later generation shows that it ended.
    ///
    /// # Errors
    /// [`NftError::Request`] with the errno of a failed read other than ENOBUFS.
    pub fn next(&mut self, timeout: Option<Duration>) -> Result<Option<Report>, NftError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(report) = self.ready.pop_front() {
                return Ok(Some(report));
            }
            // Past the deadline, one more read that does not wait: what is queued already
            // is returned even with a zero timeout.
            let (wait, flags) = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    // At least a microsecond: a zero SO_RCVTIMEO means "block".
                    Some(left) if !left.is_zero() => {
                        (Some(left.max(Duration::from_micros(1))), libc::MSG_TRUNC)
                    }
                    _ => (self.timeout, libc::MSG_TRUNC | libc::MSG_DONTWAIT),
                },
                None => (None, libc::MSG_TRUNC),
            };
            let polling = flags & libc::MSG_DONTWAIT != 0;
            self.set_timeout(wait)?;
            self.buf.clear();
            match self.socket.recv(&mut self.buf, flags) {
                Ok(n) if n > self.buf.len() => {
                    // Never for events (each datagram is at most a couple of pages), but a
                    // truncated datagram's messages cannot be read: treat them as lost.
                    log::debug!("nf_tables event datagram of {n} bytes truncated");
                    self.ready.push_back(Report::Lost);
                }
                Ok(_) => {
                    let received = Instant::now();
                    let buf = std::mem::take(&mut self.buf);
                    self.read_datagram(&buf, received);
                    self.buf = buf;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.ready.push_back(Report::Lost);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if polling {
                        return Ok(None);
                    }
                }
                Err(source) => {
                    return Err(NftError::Request {
                        op: "receive nf_tables events".to_string(),
                        source,
                    });
                }
            }
        }
    }

    /// Sets the socket's receive timeout, when it changes.
    fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<(), NftError> {
        use nix::sys::socket::{setsockopt, sockopt};
        use nix::sys::time::{TimeVal, TimeValLike};
        if timeout == self.timeout {
            return Ok(());
        }
        let micros = timeout.map_or(0, |t| i64::try_from(t.as_micros()).unwrap_or(i64::MAX));
        setsockopt(
            &self.socket,
            sockopt::ReceiveTimeout,
            &TimeVal::microseconds(micros),
        )
        .map_err(|e| NftError::Request {
            op: "set the receive timeout".to_string(),
            source: e.into(),
        })?;
        self.timeout = timeout;
        Ok(())
    }

    /// Reads the messages of one datagram into `pending` and `ready`.
    fn read_datagram(&mut self, mut bytes: &[u8], received: Instant) {
        while let Some(header) = bytes.get(..NLMSG_HDRLEN) {
            let len = u32_ne(&header[0..4]) as usize;
            let kind = u16::from_ne_bytes([header[4], header[5]]);
            let port = u32_ne(&header[12..16]);
            let Some(payload) = bytes.get(NLMSG_HDRLEN..len) else {
                // A length shorter than its header or past the datagram: nothing after it
                // can be found.
                log::debug!("malformed nf_tables event of length {len}");
                self.ready.push_back(Report::Lost);
                return;
            };
            bytes = bytes.get((len + 3) & !3..).unwrap_or_default();
            if kind < NLMSG_MIN_TYPE || kind >> 8 != NFNL_SUBSYS_NFTABLES {
                continue;
            }
            let msg = kind & 0xff;
            if msg == NFT_MSG_NEWGEN {
                self.close(payload, port, received);
            } else if let Some(event) = Event::decode(msg, payload) {
                self.open(event, received);
            }
        }
    }

    /// Adds an object's event to its transaction, closing a pending one of an earlier
    /// generation whose `NFT_MSG_NEWGEN` was lost.
    fn open(&mut self, event: Event, received: Instant) {
        if self
            .pending
            .first()
            .is_some_and(|e| e.generation16 != event.generation16)
        {
            let events = std::mem::take(&mut self.pending);
            self.ready.push_back(Report::Transaction(Transaction {
                generation: None,
                pid: None,
                process: None,
                port_id: None,
                events,
                received,
            }));
        }
        self.pending.push(event);
    }

    /// Closes the pending transaction with its `NFT_MSG_NEWGEN` (`payload`), sent by the
    /// socket of port id `port`.
    fn close(&mut self, payload: &[u8], port: u32, received: Instant) {
        let attrs = payload.get(NFGENMSG_LEN..).unwrap_or_default();
        let generation = be32_of(attrs, NFTA_GEN_ID);
        // Events of another generation than this one belong to a transaction whose own
        // NEWGEN was lost: report them apart.
        if let Some(generation) = generation
            && self
                .pending
                .first()
                .is_some_and(|e| u32::from(e.generation16) != generation & 0xffff)
        {
            let events = std::mem::take(&mut self.pending);
            self.ready.push_back(Report::Transaction(Transaction {
                generation: None,
                pid: None,
                process: None,
                port_id: None,
                events,
                received,
            }));
        }
        self.ready.push_back(Report::Transaction(Transaction {
            generation,
            pid: be32_of(attrs, NFTA_GEN_PROC_PID),
            process: string_of(attrs, NFTA_GEN_PROC_NAME),
            port_id: Some(port),
            events: std::mem::take(&mut self.pending),
            received,
        }));
    }
}

/// The port id of a bound netlink socket (an [`super::Nft`], a [`Monitor`]): the events of
/// the transactions committed on it carry it ([`Transaction::port_id`]).
///
/// # Errors
/// The errno of `getsockname`.
pub fn port_id(socket: &impl AsFd) -> Result<u32, NftError> {
    nix::sys::socket::getsockname::<nix::sys::socket::NetlinkAddr>(socket.as_fd().as_raw_fd())
        .map(|addr| addr.pid())
        .map_err(|e| NftError::Request {
            op: "read the netlink socket's port id".to_string(),
            source: e.into(),
        })
}

/// The family and `res_id` of an `nfgenmsg`.
fn nfgenmsg(payload: &[u8]) -> Option<(u8, u16)> {
    let header = payload.get(..NFGENMSG_LEN)?;
    Some((header[0], u16::from_be_bytes([header[2], header[3]])))
}

fn u32_ne(bytes: &[u8]) -> u32 {
    bytes.try_into().map(u32::from_ne_bytes).unwrap_or_default()
}

fn find(attrs: &[u8], kind: u16) -> Option<&[u8]> {
    attributes(attrs).find(|(k, _)| *k == kind).map(|(_, v)| v)
}

fn string_of(attrs: &[u8], kind: u16) -> Option<String> {
    let value = find(attrs, kind)?;
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8(value[..end].to_vec()).ok()
}

fn be32_of(attrs: &[u8], kind: u16) -> Option<u32> {
    Some(u32::from_be_bytes(find(attrs, kind)?.try_into().ok()?))
}

fn u64_of(attrs: &[u8], kind: u16) -> Option<u64> {
    Some(u64::from_be_bytes(find(attrs, kind)?.try_into().ok()?))
}

/// When to act on a burst of events: once `quiet` has passed since the last one, but no
/// later than `max_delay` after the first, so that a steady stream still gets an answer.
/// Pure: the caller passes the clock's readings in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debounce {
    /// How long no event must come before acting.
    pub quiet: Duration,
    /// The longest wait after the first event of a burst.
    pub max_delay: Duration,
    /// The first and last event of the burst not yet acted on.
    burst: Option<(Instant, Instant)>,
}

impl Debounce {
    /// A debounce with nothing noted.
    #[must_use]
    pub fn new(quiet: Duration, max_delay: Duration) -> Debounce {
        Debounce {
            quiet,
            max_delay,
            burst: None,
        }
    }

    /// When to act for events at `times` (in any order); `None` for none.
    #[must_use]
    pub fn fire_at(quiet: Duration, max_delay: Duration, times: &[Instant]) -> Option<Instant> {
        let first = times.iter().min()?;
        let last = times.iter().max()?;
        Some((*last + quiet).min(*first + max_delay))
    }

    /// Notes an event at `at`.
    pub fn note(&mut self, at: Instant) {
        self.burst = Some(match self.burst {
            None => (at, at),
            Some((first, last)) => (first.min(at), last.max(at)),
        });
    }

    /// When to act, if an event is waiting.
    #[must_use]
    pub fn deadline(&self) -> Option<Instant> {
        self.burst
            .map(|(first, last)| (last + self.quiet).min(first + self.max_delay))
    }

    /// How long to wait from `now` for the next event before acting: `None` when nothing is
    /// waiting (wait for ever), zero when it is time.
    #[must_use]
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        self.deadline().map(|d| d.saturating_duration_since(now))
    }

    /// Whether it is time to act at `now`; if so the burst is forgotten (the caller acts).
    pub fn fire(&mut self, now: Instant) -> bool {
        if self.deadline().is_some_and(|d| d <= now) {
            self.burst = None;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests;
