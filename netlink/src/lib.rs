#![warn(missing_docs)]
//! Route netlink (`NETLINK_ROUTE`): links today; routes, rules, qdiscs and filters are added by the
//! plugins that need them.
//!
//! [`Netlink`] wraps one socket. Open it inside a namespace with [`Netlink::open_in`] and keep
//! using it from any thread: the socket stays bound to that namespace. Every error names the
//! operation and object, and [`NetlinkError::is_not_found`] tells "already gone" apart, which
//! DEL relies on.

pub mod census;
mod ifb;
mod in_place;
mod route;
mod socket;
pub mod tc;

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd as _, BorrowedFd};

use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoKind, LinkAttribute, LinkExtentMask, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::nsid::{NsidAttribute, NsidMessage};

pub use ifb::LinkAlias;
pub use route::{Address, Route, Rule, TABLE_DEFAULT, TABLE_LOCAL, TABLE_MAIN};
pub use socket::{BatchFailure, BatchReplies, NetlinkSocket};

use host::netns::{NetNs, NetnsError};

/// A failed netlink operation, naming what was attempted.
#[derive(Debug, thiserror::Error)]
#[error("netlink: failed to {op}: {source}")]
pub struct NetlinkError {
    /// What was attempted, e.g. `get link "eth0"`.
    pub op: String,
    /// The errno or I/O error.
    #[source]
    pub source: io::Error,
}

impl NetlinkError {
    fn new(op: impl Into<String>, source: io::Error) -> Self {
        NetlinkError {
            op: op.into(),
            source,
        }
    }

    /// The errno, if the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    /// True when the object does not exist (ENODEV, ENOENT, ESRCH): "already gone" for DEL.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::ENODEV | libc::ENOENT | libc::ESRCH)
        )
    }

    /// True when the object already exists (EEXIST).
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }

    /// The cause as Go's `syscall.Errno` spells it (`file exists`, `no such device`), which
    /// the reference plugins' messages carry after their own prefix. Go's table is glibc's
    /// `strerror` with a lower-case first letter; musl words some differently, so the usual
    /// netlink errnos are spelled out here.
    pub fn go_text(&self) -> String {
        let known = match self.errno() {
            Some(libc::EPERM) => "operation not permitted",
            Some(libc::ENOENT) => "no such file or directory",
            Some(libc::ESRCH) => "no such process",
            Some(libc::E2BIG) => "argument list too long",
            Some(libc::ENOMEM) => "cannot allocate memory",
            Some(libc::EACCES) => "permission denied",
            Some(libc::EBUSY) => "device or resource busy",
            Some(libc::EEXIST) => "file exists",
            Some(libc::ENODEV) => "no such device",
            Some(libc::EINVAL) => "invalid argument",
            Some(libc::ENOSPC) => "no space left on device",
            Some(libc::ERANGE) => "numerical result out of range",
            Some(libc::EMSGSIZE) => "message too long",
            Some(libc::EPROTONOSUPPORT) => "protocol not supported",
            Some(libc::EOPNOTSUPP) => "operation not supported",
            Some(libc::EAFNOSUPPORT) => "address family not supported by protocol",
            Some(libc::ENOBUFS) => "no buffer space available",
            _ => "",
        };
        if !known.is_empty() {
            return known.to_owned();
        }
        let text = self.source.to_string();
        let text = text.split(" (os error").next().unwrap_or_default();
        let mut chars = text.chars();
        chars.next().map_or_else(String::new, |first| {
            first.to_lowercase().chain(chars).collect()
        })
    }
}

/// Opening a netlink socket inside a namespace can fail either way.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The socket could not be opened.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Hardware address (6 bytes for Ethernet), if any.
    pub mac: Option<Vec<u8>>,
    /// MTU.
    pub mtu: u32,
    /// Transmit queue length.
    pub txqlen: u32,
    /// `IFF_UP`.
    pub up: bool,
    /// `IFF_PROMISC`.
    pub promisc: bool,
    /// `IFF_ALLMULTI`.
    pub allmulti: bool,
    /// `IFLA_LINK`: for a veth, the peer's index (in the peer's namespace).
    pub link: Option<u32>,
    /// `IFLA_LINK_NETNSID`: set when the peer lives in another namespace.
    pub link_netnsid: Option<i32>,
    /// The `IFLA_INFO_KIND` (`veth`, `bridge`, `ifb`, …), if any.
    pub kind: Option<String>,
    /// The master device's index (a bridge port's bridge).
    pub master: Option<u32>,
}

impl Link {
    /// The MAC in the usual lower-case `aa:bb:cc:dd:ee:ff` form.
    pub fn mac_string(&self) -> Option<String> {
        self.mac.as_deref().map(format_mac)
    }

    fn from_message(msg: LinkMessage) -> Link {
        let mut link = Link {
            index: msg.header.index,
            name: String::new(),
            mac: None,
            mtu: 0,
            txqlen: 0,
            up: msg.header.flags.contains(LinkFlags::Up),
            promisc: msg.header.flags.contains(LinkFlags::Promisc),
            allmulti: msg.header.flags.contains(LinkFlags::Allmulti),
            link: None,
            link_netnsid: None,
            kind: None,
            master: None,
        };
        for attr in msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n,
                LinkAttribute::Address(a) => link.mac = Some(a),
                LinkAttribute::Mtu(m) => link.mtu = m,
                LinkAttribute::TxQueueLen(q) => link.txqlen = q,
                LinkAttribute::Link(l) => link.link = Some(l),
                LinkAttribute::LinkNetNsId(id) => link.link_netnsid = Some(id),
                LinkAttribute::Controller(m) => link.master = Some(m),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        if let LinkInfo::Kind(kind) = info {
                            link.kind = Some(kind_name(&kind));
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }
}

fn kind_name(kind: &InfoKind) -> String {
    match kind {
        InfoKind::Other(s) => s.clone(),
        known => known.to_string(),
    }
}

/// Changes to apply to a link; `None` fields are left alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkChange {
    /// New MTU (`ip link set dev X mtu N`).
    pub mtu: Option<u32>,
    /// New hardware address (`ip link set dev X address M`).
    pub mac: Option<Vec<u8>>,
    /// New transmit queue length (`ip link set dev X txqueuelen N`).
    pub txqlen: Option<u32>,
    /// Promiscuous mode on or off (`ip link set dev X promisc on|off`).
    pub promisc: Option<bool>,
    /// All-multicast on or off (`ip link set dev X allmulticast on|off`).
    pub allmulti: Option<bool>,
    /// Administrative state (`ip link set dev X up|down`).
    pub up: Option<bool>,
}

impl LinkChange {
    /// True when nothing would change.
    pub fn is_empty(&self) -> bool {
        *self == LinkChange::default()
    }
}

/// A route netlink handle bound to one network namespace.
#[derive(Debug)]
pub struct Netlink {
    socket: NetlinkSocket,
}

impl Netlink {
    /// Opens a handle in the calling thread's namespace.
    ///
    /// # Errors
    /// A [`NetlinkError`] when the socket cannot be opened.
    pub fn new() -> Result<Netlink, NetlinkError> {
        NetlinkSocket::open(netlink_sys::constants::NETLINK_ROUTE)
            .map(|socket| Netlink { socket })
            .map_err(|e| NetlinkError::new("open a route netlink socket", e))
    }

    /// Opens a handle inside `ns` (on a throwaway thread); it stays bound to `ns`.
    ///
    /// # Errors
    /// [`OpenError`] when the namespace cannot be entered or the socket opened.
    pub fn open_in(ns: &NetNs) -> Result<Netlink, OpenError> {
        Ok(ns.run(Netlink::new)??)
    }

    /// Sends a request and waits for its ACK; for operations not wrapped here.
    ///
    /// # Errors
    /// The kernel's errno, with `op` naming the operation.
    pub fn request(
        &mut self,
        op: impl fmt::Display,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        self.socket
            .request(msg, flags)
            .map_err(|e| NetlinkError::new(op.to_string(), e))
    }

    /// Runs a dump request; for dumps not wrapped here.
    ///
    /// # Errors
    /// The kernel's errno, with `op` naming the operation.
    pub fn dump(
        &mut self,
        op: impl fmt::Display,
        msg: RouteNetlinkMessage,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        self.socket
            .dump(msg)
            .map_err(|e| NetlinkError::new(op.to_string(), e))
    }

    /// Looks a link up by name (`ip link show dev NAME`).
    ///
    /// # Errors
    /// `is_not_found()` when there is no such link.
    pub fn link_by_name(&mut self, name: &str) -> Result<Link, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link(format!("get link {name:?}"), msg)
    }

    /// Looks a link up by index.
    ///
    /// # Errors
    /// `is_not_found()` when there is no such link.
    pub fn link_by_index(&mut self, index: u32) -> Result<Link, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.get_link(format!("get link {index}"), msg)
    }

    fn get_link(&mut self, op: String, mut msg: LinkMessage) -> Result<Link, NetlinkError> {
        // Without statistics ([`Link`] has none) the kernel's reply is a third of the size, and
        // cheaper to fill and to parse.
        msg.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        let replies = self.request(&op, RouteNetlinkMessage::GetLink(msg), 0)?;
        replies
            .into_iter()
            .find_map(|r| match r {
                RouteNetlinkMessage::NewLink(m) => Some(Link::from_message(m)),
                _ => None,
            })
            .ok_or_else(|| NetlinkError::new(op, io::Error::from_raw_os_error(libc::ENODEV)))
    }

    /// Lists every link (`ip link show`).
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn links(&mut self) -> Result<Vec<Link>, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        let replies = self.dump("list links", RouteNetlinkMessage::GetLink(msg))?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewLink(m) => Some(Link::from_message(m)),
                _ => None,
            })
            .collect())
    }

    /// Applies `change` to link `index` in one request (`ip link set dev …`).
    ///
    /// # Errors
    /// The kernel's errno (EINVAL for an MTU out of range, for example).
    pub fn set_link(&mut self, index: u32, change: &LinkChange) -> Result<(), NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        let mut flag = |on: Option<bool>, bit: LinkFlags| {
            if let Some(on) = on {
                msg.header.change_mask |= bit;
                if on {
                    msg.header.flags |= bit;
                }
            }
        };
        flag(change.up, LinkFlags::Up);
        flag(change.promisc, LinkFlags::Promisc);
        flag(change.allmulti, LinkFlags::Allmulti);
        if let Some(mtu) = change.mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(mac) = &change.mac {
            msg.attributes.push(LinkAttribute::Address(mac.clone()));
        }
        if let Some(q) = change.txqlen {
            msg.attributes.push(LinkAttribute::TxQueueLen(q));
        }
        log::debug!("ip link set dev {index} {change:?}");
        self.request(
            format!("set link {index} {change:?}"),
            RouteNetlinkMessage::SetLink(msg),
            0,
        )
        .map(drop)
    }

    /// Deletes link `index` (`ip link del`); deleting one end of a veth removes both.
    ///
    /// # Errors
    /// `is_not_found()` when it is already gone.
    pub fn del_link(&mut self, index: u32) -> Result<(), NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        log::debug!("ip link del dev {index}");
        self.request(
            format!("delete link {index}"),
            RouteNetlinkMessage::DelLink(msg),
            0,
        )
        .map(drop)
    }

    /// The id this handle's namespace gives the namespace `ns` (`RTM_GETNSID` with
    /// `NETNSA_FD`), the number a link whose peer lives in `ns` carries as
    /// `IFLA_LINK_NETNSID`; `None` when it has given it none (then no link here has its peer
    /// there). Ids are per namespace: the same namespace has different ids, or none, as seen
    /// from different ones.
    ///
    /// # Errors
    /// The kernel's errno (EINVAL when `ns` is not a network namespace).
    pub fn nsid_of(&mut self, ns: BorrowedFd<'_>) -> Result<Option<i32>, NetlinkError> {
        let op = "get the id of a network namespace";
        let fd = u32::try_from(ns.as_raw_fd())
            .map_err(|_| NetlinkError::new(op, io::Error::from_raw_os_error(libc::EBADF)))?;
        let mut msg = NsidMessage::default();
        msg.attributes.push(NsidAttribute::Fd(fd));
        let replies = self.request(op, RouteNetlinkMessage::GetNsId(msg), 0)?;
        let id = replies.into_iter().find_map(|r| match r {
            RouteNetlinkMessage::NewNsId(m) => m.attributes.into_iter().find_map(|a| match a {
                NsidAttribute::Id(id) => Some(id),
                _ => None,
            }),
            _ => None,
        });
        // NETNSA_NSID_NOT_ASSIGNED.
        Ok(id.filter(|&id| id >= 0))
    }

    /// The id this handle's namespace gives `ns`, given now if it had none (`RTM_NEWNSID`
    /// with `NETNSA_NSID` -1, as `ip netns set NAME auto`; what the kernel does itself when a
    /// link here gets a peer there).
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn nsid_given(&mut self, ns: BorrowedFd<'_>) -> Result<i32, NetlinkError> {
        if let Some(id) = self.nsid_of(ns)? {
            return Ok(id);
        }
        let op = "give a network namespace an id";
        let fd = u32::try_from(ns.as_raw_fd())
            .map_err(|_| NetlinkError::new(op, io::Error::from_raw_os_error(libc::EBADF)))?;
        let mut msg = NsidMessage::default();
        msg.attributes.push(NsidAttribute::Fd(fd));
        msg.attributes.push(NsidAttribute::Id(-1));
        match self.request(op, RouteNetlinkMessage::NewNsId(msg), 0) {
            Ok(_) => {}
            // Given one meanwhile, by a link or another call.
            Err(e) if e.is_exists() => {}
            Err(e) => return Err(e),
        }
        self.nsid_of(ns)?
            .ok_or_else(|| NetlinkError::new(op, io::Error::from_raw_os_error(libc::ENOENT)))
    }

    /// The ids this handle's namespace has given namespaces (`ip netns list-id`: an
    /// `RTM_GETNSID` dump), one request for any number of them.
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn nsids(&mut self) -> Result<Vec<i32>, NetlinkError> {
        let replies = self.dump(
            "list network namespace ids",
            RouteNetlinkMessage::GetNsId(NsidMessage::default()),
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewNsId(m) => m.attributes.into_iter().find_map(|a| match a {
                    NsidAttribute::Id(id) => Some(id),
                    _ => None,
                }),
                _ => None,
            })
            .filter(|&id| id >= 0)
            .collect())
    }

    /// Whether a namespace that exists has id `id` here (`RTM_GETNSID` with `NETNSA_NSID`).
    /// The kernel forgets a namespace's ids only when it destroys it, and answers for none
    /// that is being destroyed, so an id given to a namespace that is not found any more
    /// proves that namespace gone.
    ///
    /// # Errors
    /// The kernel's errno other than "not found".
    pub fn nsid_exists(&mut self, id: i32) -> Result<bool, NetlinkError> {
        let mut msg = NsidMessage::default();
        msg.attributes.push(NsidAttribute::Id(id));
        match self.request(
            format!("look up network namespace id {id}"),
            RouteNetlinkMessage::GetNsId(msg),
            0,
        ) {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Parses a MAC address `aa:bb:cc:dd:ee:ff` (also `-` separated, any case) into 6 bytes.
///
/// # Errors
/// A message naming the bad address.
pub fn parse_mac(s: &str) -> Result<Vec<u8>, String> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 || parts.iter().any(|p| p.len() != 2) {
        return Err(format!("invalid MAC address {s:?}"));
    }
    parts
        .iter()
        .map(|p| u8::from_str_radix(p, 16).map_err(|_| format!("invalid MAC address {s:?}")))
        .collect()
}

/// Formats bytes as a lower-case colon-separated MAC.
pub fn format_mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd as _;
    use std::process::Command;

    /// Runs `body` on a thread in a fresh network namespace of its own.
    fn in_fresh_netns<T: Send>(body: impl FnOnce() -> T + Send) -> T {
        host::netns::in_new_netns(body).expect("a fresh network namespace needs root")
    }

    /// `ip` from the calling thread's namespace: children inherit the thread's netns.
    fn ip(args: &str) {
        let out = Command::new("ip").args(args.split(' ')).output().unwrap();
        assert!(
            out.status.success(),
            "ip {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn ip_json(args: &str) -> serde_json::Value {
        let out = Command::new("ip")
            .args(["-j"])
            .args(args.split(' '))
            .output()
            .unwrap();
        assert!(out.status.success(), "ip -j {args}");
        serde_json::from_slice(&out.stdout).unwrap()
    }

    #[test]
    fn errnos_read_as_go_spells_them() {
        let err = |errno| NetlinkError::new("op", io::Error::from_raw_os_error(errno));
        assert_eq!(err(libc::EEXIST).go_text(), "file exists");
        assert_eq!(err(libc::EBUSY).go_text(), "device or resource busy");
        assert_eq!(err(libc::ENOMEM).go_text(), "cannot allocate memory");
        // Others: the C library's text, lower-cased, without Rust's "(os error N)".
        let other = err(libc::ETIMEDOUT).go_text();
        assert!(
            other.starts_with(char::is_lowercase) && !other.contains("os error"),
            "{other}"
        );
        let io = NetlinkError::new("op", io::Error::other("Truncated reply"));
        assert_eq!(io.go_text(), "truncated reply");
    }

    #[test]
    fn macs_parse_and_format() {
        assert_eq!(
            parse_mac("02:AA:bb:0c:00:ff").unwrap(),
            [2, 0xaa, 0xbb, 0x0c, 0, 0xff]
        );
        assert_eq!(parse_mac("02-aa-bb-0c-00-ff").unwrap()[1], 0xaa);
        for bad in [
            "",
            "02:aa:bb:0c:00",
            "02:aa:bb:0c:00:ff:11",
            "0g:aa:bb:0c:00:ff",
            "2:aa:bb:c:0:f",
        ] {
            assert!(parse_mac(bad).unwrap_err().contains(bad), "{bad}");
        }
        assert_eq!(format_mac(&[2, 0xaa, 0, 1, 2, 3]), "02:aa:00:01:02:03");
    }

    #[test]
    fn link_lookup_finds_veth_details_and_reports_missing_links_as_not_found() {
        in_fresh_netns(|| {
            ip("link add veth-a type veth peer name veth-b");
            let mut nl = Netlink::new().unwrap();
            let a = nl.link_by_name("veth-a").unwrap();
            let b = nl.link_by_name("veth-b").unwrap();
            assert_eq!(a.kind.as_deref(), Some("veth"));
            assert_eq!(a.link, Some(b.index));
            assert_eq!(nl.link_by_index(a.index).unwrap(), a);
            assert_eq!(a.mac.as_ref().map(Vec::len), Some(6));
            let mut names: Vec<String> = nl.links().unwrap().into_iter().map(|l| l.name).collect();
            names.sort();
            assert_eq!(names, ["lo", "veth-a", "veth-b"]);
            let err = nl.link_by_name("nope0").unwrap_err();
            assert!(err.is_not_found(), "{err}");
            assert!(err.to_string().contains("nope0"), "{err}");
            let err = nl.link_by_index(9999).unwrap_err();
            assert!(err.is_not_found(), "{err}");
        });
    }

    #[test]
    fn set_link_changes_every_attribute_in_one_request() {
        in_fresh_netns(|| {
            ip("link add veth-a type veth peer name veth-b");
            let mut nl = Netlink::new().unwrap();
            let a = nl.link_by_name("veth-a").unwrap();
            let change = LinkChange {
                mtu: Some(1400),
                mac: Some(parse_mac("02:00:00:00:12:34").unwrap()),
                txqlen: Some(321),
                promisc: Some(true),
                allmulti: Some(true),
                up: Some(true),
            };
            nl.set_link(a.index, &change).unwrap();
            let after = nl.link_by_name("veth-a").unwrap();
            assert_eq!(after.mtu, 1400);
            assert_eq!(after.mac_string().as_deref(), Some("02:00:00:00:12:34"));
            assert_eq!(after.txqlen, 321);
            assert!(after.up && after.promisc && after.allmulti);
            // Cross-check with iproute2's view of the same namespace.
            let shown = &ip_json("link show dev veth-a")[0];
            assert_eq!(shown["mtu"], 1400);
            assert_eq!(shown["address"], "02:00:00:00:12:34");
            assert_eq!(shown["txqlen"], 321);
            let flags: Vec<&str> = shown["flags"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|f| f.as_str())
                .collect();
            assert!(
                flags.contains(&"PROMISC") && flags.contains(&"ALLMULTI"),
                "{flags:?}"
            );
            // Turning flags off touches only those flags.
            nl.set_link(
                a.index,
                &LinkChange {
                    promisc: Some(false),
                    ..LinkChange::default()
                },
            )
            .unwrap();
            let off = nl.link_by_name("veth-a").unwrap();
            assert!(!off.promisc && off.allmulti && off.up);
        });
    }

    #[test]
    fn kernel_refusals_carry_the_errno_and_the_operation() {
        in_fresh_netns(|| {
            ip("link add veth-a type veth peer name veth-b");
            let mut nl = Netlink::new().unwrap();
            let a = nl.link_by_name("veth-a").unwrap();
            let err = nl
                .set_link(
                    a.index,
                    &LinkChange {
                        mtu: Some(10),
                        ..LinkChange::default()
                    },
                )
                .unwrap_err();
            assert_eq!(err.errno(), Some(libc::EINVAL));
            assert!(err.to_string().contains("set link"), "{err}");
            assert_eq!(nl.link_by_name("veth-a").unwrap().mtu, 1500);
        });
    }

    #[test]
    fn del_link_removes_both_veth_ends_and_is_not_found_the_second_time() {
        in_fresh_netns(|| {
            ip("link add veth-a type veth peer name veth-b");
            let mut nl = Netlink::new().unwrap();
            let a = nl.link_by_name("veth-a").unwrap();
            nl.del_link(a.index).unwrap();
            assert!(nl.link_by_name("veth-b").unwrap_err().is_not_found());
            assert!(nl.del_link(a.index).unwrap_err().is_not_found());
        });
    }

    #[test]
    fn a_handle_opened_in_a_namespace_stays_bound_to_it() {
        let ns = in_fresh_netns(|| {
            ip("link add inside0 type veth peer name inside1");
            NetNs::current().unwrap()
        });
        let mut nl = Netlink::open_in(&ns).unwrap();
        assert!(nl.link_by_name("inside0").is_ok());
        // The caller's own namespace has no such link.
        assert!(
            Netlink::new()
                .unwrap()
                .link_by_name("inside0")
                .unwrap_err()
                .is_not_found()
        );
    }

    #[test]
    fn a_namespace_id_names_where_a_veth_peer_lives_and_only_there() {
        let peer_ns = in_fresh_netns(|| NetNs::current().unwrap());
        let unrelated = in_fresh_netns(|| NetNs::current().unwrap());
        // iproute2 takes a path with a slash as the namespace file: this process's descriptor.
        let path = format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            peer_ns.as_fd().as_raw_fd()
        );
        in_fresh_netns(|| {
            ip(&format!(
                "link add here0 type veth peer name there0 netns {path}"
            ));
            let mut nl = Netlink::new().unwrap();
            let here = nl.link_by_name("here0").unwrap();
            let id = here
                .link_netnsid
                .expect("a peer elsewhere has a namespace id");
            assert_eq!(nl.nsid_of(peer_ns.as_fd()).unwrap(), Some(id));
            assert_eq!(nl.nsid_of(unrelated.as_fd()).unwrap(), None);
            // Not a network namespace.
            let file = std::fs::File::open("/proc/self/status").unwrap();
            assert!(nl.nsid_of(file.as_fd()).is_err());
        });
    }

    #[test]
    fn dumps_spanning_several_datagrams_are_read_whole() {
        in_fresh_netns(|| {
            for i in 0..40 {
                ip(&format!("link add va{i} type veth peer name vb{i}"));
            }
            let links = Netlink::new().unwrap().links().unwrap();
            assert_eq!(links.len(), 81);
        });
    }
}
