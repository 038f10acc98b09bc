//! IFB devices and interface aliases: `ip link add NAME type ifb`, `ip link set dev X alias A`.
//!
//! An IFB ("intermediate functional block") device is where traffic redirected from another
//! interface's ingress gets queued, so it can be shaped like egress traffic. The alias
//! (`IFLA_IFALIAS`, up to 255 bytes) is free text the kernel keeps on any link; plugins use it to
//! record which attachment owns a device, which GC reads back.

use std::io;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoKind, LinkAttribute, LinkExtentMask, LinkFlags, LinkInfo, LinkMessage,
};

use super::{Link, Netlink, NetlinkError};

/// Longest alias the kernel accepts (`IFALIASZ - 1`).
pub const MAX_ALIAS: usize = 255;

/// A link together with its alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkAlias {
    /// The link.
    pub link: Link,
    /// Its `IFLA_IFALIAS`, if set.
    pub alias: Option<String>,
}

impl LinkAlias {
    fn from_message(msg: LinkMessage) -> LinkAlias {
        let alias = msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfAlias(s) if !s.is_empty() => Some(s.clone()),
            _ => None,
        });
        LinkAlias {
            link: Link::from_message(msg),
            alias,
        }
    }
}

/// EINVAL for an alias the kernel would refuse (longer than [`MAX_ALIAS`] bytes).
fn check_alias(alias: &str, op: impl FnOnce() -> String) -> Result<(), NetlinkError> {
    if alias.len() > MAX_ALIAS {
        return Err(NetlinkError::new(
            op(),
            io::Error::from_raw_os_error(libc::EINVAL),
        ));
    }
    Ok(())
}

impl Netlink {
    /// Creates an IFB device with `mtu` and (when given) `txqlen`, then sets its alias and
    /// brings it up in one more request, and returns it: `ip link add NAME mtu M type ifb &&
    /// ip link set NAME alias A up`. The kernel takes an alias only on an existing link; with
    /// the alias and `up` in one request, an IFB made here that is up always has its alias,
    /// and one that is down without an alias is what a caller killed in between left. The
    /// name must be new; nothing is left behind when a step fails.
    ///
    /// # Errors
    /// `is_exists()` when the name is taken, EINVAL (before anything is created) for an alias
    /// longer than [`MAX_ALIAS`] bytes; the kernel's errno otherwise.
    pub fn add_ifb(
        &mut self,
        name: &str,
        mtu: u32,
        txqlen: Option<u32>,
        alias: &str,
    ) -> Result<Link, NetlinkError> {
        check_alias(alias, || {
            format!("add ifb link {name:?} with alias {alias:?}")
        })?;
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        if let Some(q) = txqlen {
            msg.attributes.push(LinkAttribute::TxQueueLen(q));
        }
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]));
        log::debug!("ip link add {name} mtu {mtu} type ifb");
        self.request(
            format!("add ifb link {name:?}"),
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )?;
        let mut link = self.link_by_name(name)?;
        let mut up = LinkMessage::default();
        up.header.index = link.index;
        up.header.flags = LinkFlags::Up;
        up.header.change_mask = LinkFlags::Up;
        up.attributes
            .push(LinkAttribute::IfAlias(alias.to_string()));
        log::debug!("ip link set dev {name} alias {alias:?} up");
        if let Err(e) = self.request(
            format!("set alias {alias:?} and up on link {name:?}"),
            RouteNetlinkMessage::SetLink(up),
            0,
        ) {
            let _ = self.del_link(link.index);
            return Err(e);
        }
        link.up = true;
        Ok(link)
    }

    /// Sets the alias of link `index` (`ip link set dev X alias A`); "" removes it.
    ///
    /// # Errors
    /// EINVAL for an alias longer than [`MAX_ALIAS`] bytes; the kernel's errno otherwise.
    pub fn set_alias(&mut self, index: u32, alias: &str) -> Result<(), NetlinkError> {
        let op = format!("set alias {alias:?} on link {index}");
        check_alias(alias, || op.clone())?;
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes
            .push(LinkAttribute::IfAlias(alias.to_string()));
        log::debug!("ip link set dev {index} alias {alias:?}");
        self.request(op, RouteNetlinkMessage::SetLink(msg), 0)
            .map(drop)
    }

    /// Looks a link up by name, with its alias.
    ///
    /// # Errors
    /// `is_not_found()` when there is no such link.
    pub fn link_alias_by_name(&mut self, name: &str) -> Result<LinkAlias, NetlinkError> {
        let op = format!("get link {name:?}");
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.request(&op, RouteNetlinkMessage::GetLink(msg), 0)?
            .into_iter()
            .find_map(|r| match r {
                RouteNetlinkMessage::NewLink(m) => Some(LinkAlias::from_message(m)),
                _ => None,
            })
            .ok_or_else(|| NetlinkError::new(op, io::Error::from_raw_os_error(libc::ENODEV)))
    }

    /// Lists the IFB devices with their aliases (`ip link show type ifb`), without statistics.
    /// The kernel filters by kind when the `ifb` module is loaded, so the dump costs O(IFBs)
    /// rather than O(links); the kind is checked here too, for kernels that ignore the filter.
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn ifbs_with_aliases(&mut self) -> Result<Vec<LinkAlias>, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]));
        msg.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        let replies = self.dump("list ifb links", RouteNetlinkMessage::GetLink(msg))?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewLink(m) => Some(LinkAlias::from_message(m)),
                _ => None,
            })
            .filter(|l| l.link.kind.as_deref() == Some("ifb"))
            .collect())
    }
}
