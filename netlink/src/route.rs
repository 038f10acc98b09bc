//! Routes, policy rules and addresses over route netlink: dumps of every table and family, and
//! add/replace/delete of single objects, as `ip route`, `ip rule` and `ip address` do them, and
//! route lookups (`ip route get ADDR`: which interface the kernel would send a packet on).
//!
//! The types keep what the kernel needs to recreate an object (a route's metrics and preference
//! ride along in [`Route::extra`]), so a dumped route can be re-added elsewhere, for example in
//! another table, without losing attributes.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleHeader, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{Netlink, NetlinkError};

/// `RT_TABLE_MAIN`: the table `ip route` shows by default.
pub const TABLE_MAIN: u32 = 254;
/// `RT_TABLE_LOCAL`: local and broadcast addresses, maintained by the kernel.
pub const TABLE_LOCAL: u32 = 255;
/// `RT_TABLE_DEFAULT`: the last table of the stock rules.
pub const TABLE_DEFAULT: u32 = 253;

/// A route as the kernel reports it, or one to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination network (`0.0.0.0/0` or `::/0` for a default route).
    pub dst: IpNet,
    /// Next hop, absent for a device route.
    pub gateway: Option<IpAddr>,
    /// Preferred source address (`src` in `ip route`).
    pub pref_src: Option<IpAddr>,
    /// Output interface index.
    pub oif: Option<u32>,
    /// Routing table.
    pub table: u32,
    /// Metric (`metric`); `None` lets the kernel choose (0 for IPv4, 1024 for IPv6).
    pub priority: Option<u32>,
    /// Who installed it (`proto kernel`, `proto boot`, …).
    pub protocol: RouteProtocol,
    /// Scope (`scope link`, …).
    pub scope: RouteScope,
    /// Type (`unicast`, `local`, `broadcast`, …).
    pub kind: RouteType,
    /// Type of service.
    pub tos: u8,
    /// `RTNH_F_*`/`RTM_F_*` flags as reported (`linkdown`, `cloned`, …).
    pub flags: RouteFlags,
    /// Attributes kept as they are when the route is re-added: metrics (`mtu`, `advmss`, …) and
    /// the IPv6 router preference.
    pub extra: Vec<RouteAttribute>,
}

impl Route {
    /// A unicast route to `dst` in `table`, with kernel defaults for everything else
    /// (`proto boot`, `scope global`), as `ip route add` makes it.
    pub fn new(dst: IpNet, table: u32) -> Route {
        Route {
            dst,
            gateway: None,
            pref_src: None,
            oif: None,
            table,
            priority: None,
            protocol: RouteProtocol::Boot,
            scope: RouteScope::Universe,
            kind: RouteType::Unicast,
            tos: 0,
            flags: RouteFlags::empty(),
            extra: Vec::new(),
        }
    }

    /// True for `0.0.0.0/0` and `::/0`.
    pub fn is_default(&self) -> bool {
        self.dst.prefix_len() == 0
    }

    /// True when the route is IPv6.
    pub fn is_ipv6(&self) -> bool {
        matches!(self.dst, IpNet::V6(_))
    }

    fn from_message(msg: RouteMessage) -> Option<Route> {
        let header = msg.header;
        let v6 = match header.address_family {
            AddressFamily::Inet => false,
            AddressFamily::Inet6 => true,
            _ => return None,
        };
        let mut dst_addr = None;
        let mut route = Route {
            dst: unspecified_net(v6),
            gateway: None,
            pref_src: None,
            oif: None,
            table: u32::from(header.table),
            priority: None,
            protocol: header.protocol,
            scope: header.scope,
            kind: header.kind,
            tos: header.tos,
            flags: header.flags,
            extra: Vec::new(),
        };
        for attr in msg.attributes {
            match attr {
                RouteAttribute::Destination(a) => dst_addr = ip_of(&a),
                RouteAttribute::Gateway(a) => route.gateway = ip_of(&a),
                RouteAttribute::PrefSource(a) => route.pref_src = ip_of(&a),
                RouteAttribute::Oif(i) => route.oif = Some(i),
                RouteAttribute::Table(t) => route.table = t,
                RouteAttribute::Priority(p) => route.priority = Some(p),
                a @ (RouteAttribute::Metrics(_) | RouteAttribute::Preference(_)) => {
                    route.extra.push(a);
                }
                _ => {}
            }
        }
        if let Some(addr) = dst_addr {
            route.dst = IpNet::new(addr, header.destination_prefix_length).ok()?;
        }
        Some(route)
    }

    fn to_message(&self) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header = RouteHeader {
            address_family: family_of(self.is_ipv6()),
            destination_prefix_length: self.dst.prefix_len(),
            source_prefix_length: 0,
            tos: self.tos,
            // Tables above 255 only fit the attribute; the header then says "unspecified".
            table: u8::try_from(self.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC),
            protocol: self.protocol,
            scope: self.scope,
            kind: self.kind,
            flags: self.flags,
        };
        let attrs = &mut msg.attributes;
        attrs.push(RouteAttribute::Table(self.table));
        if self.dst.prefix_len() > 0 {
            attrs.push(RouteAttribute::Destination(self.dst.addr().into()));
        }
        if let Some(gw) = self.gateway {
            attrs.push(RouteAttribute::Gateway(gw.into()));
        }
        if let Some(src) = self.pref_src {
            attrs.push(RouteAttribute::PrefSource(src.into()));
        }
        if let Some(oif) = self.oif {
            attrs.push(RouteAttribute::Oif(oif));
        }
        if let Some(p) = self.priority {
            attrs.push(RouteAttribute::Priority(p));
        }
        attrs.extend(self.extra.iter().cloned());
        msg
    }
}

impl fmt::Display for Route {
    /// `ip route` syntax: `10.0.0.0/24 via 10.0.0.1 dev 3 src 10.0.0.2 table 100 metric 5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_default() {
            f.write_str("default")?;
        } else {
            write!(f, "{}", self.dst)?;
        }
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " dev {oif}")?;
        }
        if let Some(src) = self.pref_src {
            write!(f, " src {src}")?;
        }
        write!(f, " table {}", self.table)?;
        if let Some(p) = self.priority {
            write!(f, " metric {p}")?;
        }
        Ok(())
    }
}

/// A policy routing rule (`ip rule`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `true` for an IPv6 rule.
    pub ipv6: bool,
    /// `from` selector; `None` matches every source.
    pub src: Option<IpNet>,
    /// `to` selector; `None` matches every destination.
    pub dst: Option<IpNet>,
    /// Table looked up (`lookup N`) for [`RuleAction::ToTable`].
    pub table: u32,
    /// Position (`pref`); `None` on add lets the kernel put it before the last-but-one rule.
    pub priority: Option<u32>,
    /// What the rule does (`lookup`, `blackhole`, `goto`, …).
    pub action: RuleAction,
    /// Type of service selector.
    pub tos: u8,
    /// Other selectors and attributes (`iif`, `fwmark`, `suppress_prefixlength`, …), kept so
    /// that a dumped rule can be deleted exactly.
    pub extra: Vec<RuleAttribute>,
}

impl Rule {
    /// `from <src> lookup <table>`, priority left to the kernel.
    pub fn from_source(src: IpNet, table: u32) -> Rule {
        Rule {
            ipv6: matches!(src, IpNet::V6(_)),
            src: Some(src),
            dst: None,
            table,
            priority: None,
            action: RuleAction::ToTable,
            tos: 0,
            extra: Vec::new(),
        }
    }

    fn from_message(msg: RuleMessage) -> Option<Rule> {
        let header = msg.header;
        let ipv6 = match header.family {
            AddressFamily::Inet => false,
            AddressFamily::Inet6 => true,
            _ => return None,
        };
        let mut rule = Rule {
            ipv6,
            src: None,
            dst: None,
            table: u32::from(header.table),
            priority: None,
            action: header.action,
            tos: header.tos,
            extra: Vec::new(),
        };
        for attr in msg.attributes {
            match attr {
                RuleAttribute::Source(a) => rule.src = IpNet::new(a, header.src_len).ok(),
                RuleAttribute::Destination(a) => rule.dst = IpNet::new(a, header.dst_len).ok(),
                RuleAttribute::Table(t) => rule.table = t,
                RuleAttribute::Priority(p) => rule.priority = Some(p),
                // The kernel reports who made the rule, and "no suppression" (-1) on every
                // rule; neither is a selector.
                RuleAttribute::Protocol(_) | RuleAttribute::SuppressPrefixLen(u32::MAX) => {}
                other => rule.extra.push(other),
            }
        }
        Some(rule)
    }

    fn to_message(&self) -> RuleMessage {
        let mut msg = RuleMessage::default();
        msg.header = RuleHeader {
            family: family_of(self.ipv6),
            dst_len: self.dst.map_or(0, |d| d.prefix_len()),
            src_len: self.src.map_or(0, |s| s.prefix_len()),
            tos: self.tos,
            table: u8::try_from(self.table).unwrap_or(0),
            action: self.action,
            flags: Default::default(),
        };
        let attrs = &mut msg.attributes;
        if let Some(src) = self.src {
            attrs.push(RuleAttribute::Source(src.addr()));
        }
        if let Some(dst) = self.dst {
            attrs.push(RuleAttribute::Destination(dst.addr()));
        }
        if self.action == RuleAction::ToTable {
            attrs.push(RuleAttribute::Table(self.table));
        }
        if let Some(p) = self.priority {
            attrs.push(RuleAttribute::Priority(p));
        }
        attrs.extend(self.extra.iter().cloned());
        msg
    }
}

impl fmt::Display for Rule {
    /// `ip rule` syntax: `32765: from 10.0.0.2/32 lookup 100`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = self.priority {
            write!(f, "{p}: ")?;
        }
        match self.src {
            Some(src) => write!(f, "from {src}")?,
            None => f.write_str("from all")?,
        }
        if let Some(dst) = self.dst {
            write!(f, " to {dst}")?;
        }
        if self.action == RuleAction::ToTable {
            write!(f, " lookup {}", self.table)
        } else {
            write!(f, " action {:?}", self.action)
        }
    }
}

/// An address of an interface (`ip address`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// Interface index.
    pub index: u32,
    /// The address with its prefix length (`10.0.0.2/24`).
    pub addr: IpNet,
    /// Scope (`global`, `link`, `host`).
    pub scope: AddressScope,
}

impl Address {
    fn from_message(msg: AddressMessage) -> Option<Address> {
        if !matches!(
            msg.header.family,
            AddressFamily::Inet | AddressFamily::Inet6
        ) {
            return None;
        }
        let mut local = None;
        let mut address = None;
        for attr in msg.attributes {
            match attr {
                AddressAttribute::Local(a) => local = Some(a),
                AddressAttribute::Address(a) => address = Some(a),
                _ => {}
            }
        }
        // On point-to-point links IFA_ADDRESS is the peer; IFA_LOCAL is ours when present.
        let ip = local.or(address)?;
        Some(Address {
            index: msg.header.index,
            addr: IpNet::new(ip, msg.header.prefix_len).ok()?,
            scope: msg.header.scope,
        })
    }
}

impl Netlink {
    /// The index of the output interface of the route to `dst` (`ip route get DST`), or `None`
    /// when the kernel's answer names none.
    ///
    /// # Errors
    /// The kernel's errno (ENETUNREACH when there is no route).
    pub fn route_get_oif(&mut self, dst: IpAddr) -> Result<Option<u32>, NetlinkError> {
        let mut msg = RouteMessage::default();
        match dst {
            IpAddr::V4(a) => {
                msg.header.address_family = AddressFamily::Inet;
                msg.header.destination_prefix_length = 32;
                msg.attributes
                    .push(RouteAttribute::Destination(RouteAddress::Inet(a)));
            }
            IpAddr::V6(a) => {
                msg.header.address_family = AddressFamily::Inet6;
                msg.header.destination_prefix_length = 128;
                msg.attributes
                    .push(RouteAttribute::Destination(RouteAddress::Inet6(a)));
            }
        }
        let replies = self.request(
            format!("get route to {dst}"),
            RouteNetlinkMessage::GetRoute(msg),
            0,
        )?;
        Ok(replies.into_iter().find_map(|r| match r {
            RouteNetlinkMessage::NewRoute(m) => m.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            }),
            _ => None,
        }))
    }

    /// Lists the routes of every table and both families (`ip route show table all`, plus
    /// `ip -6`); cloned cache entries are left out.
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn routes(&mut self) -> Result<Vec<Route>, NetlinkError> {
        // One dump of every family (AF_UNSPEC) instead of one per family: a round trip less.
        // Families other than IPv4 and IPv6 (multicast routing tables) are dropped.
        let replies = self.dump(
            "list routes",
            RouteNetlinkMessage::GetRoute(RouteMessage::default()),
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewRoute(m) => Route::from_message(m),
                _ => None,
            })
            .filter(|r| !r.flags.contains(RouteFlags::Cloned))
            .collect())
    }

    /// Lists the routes of one table, both families (`ip route show table N`).
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn routes_in_table(&mut self, table: u32) -> Result<Vec<Route>, NetlinkError> {
        let mut routes = self.routes()?;
        routes.retain(|r| r.table == table);
        Ok(routes)
    }

    /// Adds `route`; fails with `is_exists()` when one with the same key is there
    /// (`ip route add`).
    ///
    /// # Errors
    /// The kernel's errno (EEXIST, ENETUNREACH for an unreachable gateway, …).
    pub fn add_route(&mut self, route: &Route) -> Result<(), NetlinkError> {
        log::debug!("ip route add {route}");
        self.request(
            format!("add route {route}"),
            RouteNetlinkMessage::NewRoute(route.to_message()),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Adds `route`, replacing one with the same key (`ip route replace`).
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn replace_route(&mut self, route: &Route) -> Result<(), NetlinkError> {
        log::debug!("ip route replace {route}");
        self.request(
            format!("replace route {route}"),
            RouteNetlinkMessage::NewRoute(route.to_message()),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .map(drop)
    }

    /// Adds `route` next to routes with the same key (`ip route append`): how IPv6 keeps one
    /// device route per interface for the same prefix (`fe80::/64`). IPv4 routes, and IPv6
    /// routes with a gateway, become extra next hops of an existing route with the same key.
    ///
    /// # Errors
    /// `is_exists()` when the very same route is there.
    pub fn append_route(&mut self, route: &Route) -> Result<(), NetlinkError> {
        log::debug!("ip route append {route}");
        self.request(
            format!("append route {route}"),
            RouteNetlinkMessage::NewRoute(route.to_message()),
            NLM_F_CREATE | NLM_F_APPEND,
        )
        .map(drop)
    }

    /// Deletes the route matching `route`'s table, destination, metric, gateway and device
    /// (`ip route del`).
    ///
    /// # Errors
    /// `is_not_found()` (ESRCH) when there is no such route.
    pub fn del_route(&mut self, route: &Route) -> Result<(), NetlinkError> {
        log::debug!("ip route del {route}");
        let mut msg = route.to_message();
        // Deleting by key: the kernel would reject a delete that names a scope it does not use.
        msg.header.scope = RouteScope::NoWhere;
        msg.header.protocol = RouteProtocol::Unspec;
        msg.header.flags = RouteFlags::empty();
        msg.attributes.retain(|a| {
            !matches!(
                a,
                RouteAttribute::Metrics(_) | RouteAttribute::Preference(_)
            )
        });
        self.request(
            format!("delete route {route}"),
            RouteNetlinkMessage::DelRoute(msg),
            0,
        )
        .map(drop)
    }

    /// Lists the policy rules of both families (`ip rule` and `ip -6 rule`).
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn rules(&mut self) -> Result<Vec<Rule>, NetlinkError> {
        // One dump of every family, as for routes.
        let replies = self.dump(
            "list rules",
            RouteNetlinkMessage::GetRule(RuleMessage::default()),
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewRule(m) => Rule::from_message(m),
                _ => None,
            })
            .collect())
    }

    /// Adds `rule` (`ip rule add`); an identical rule makes it fail with `is_exists()`.
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn add_rule(&mut self, rule: &Rule) -> Result<(), NetlinkError> {
        log::debug!("ip rule add {rule}");
        self.request(
            format!("add rule {rule}"),
            RouteNetlinkMessage::NewRule(rule.to_message()),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Deletes the first rule matching every selector of `rule` (`ip rule del`); give the
    /// priority of a dumped rule to delete exactly that one.
    ///
    /// # Errors
    /// `is_not_found()` (ENOENT) when no rule matches.
    pub fn del_rule(&mut self, rule: &Rule) -> Result<(), NetlinkError> {
        log::debug!("ip rule del {rule}");
        self.request(
            format!("delete rule {rule}"),
            RouteNetlinkMessage::DelRule(rule.to_message()),
            0,
        )
        .map(drop)
    }

    /// Lists the addresses of link `index`, or of every link with `None` (`ip address show`).
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn addresses(&mut self, index: Option<u32>) -> Result<Vec<Address>, NetlinkError> {
        // One dump of every family, as for routes.
        let replies = self.dump(
            "list addresses",
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewAddress(m) => Address::from_message(m),
                _ => None,
            })
            .filter(|a| index.is_none_or(|i| a.index == i))
            .collect())
    }

    /// Adds `addr` to link `index` (`ip address add`); IPv6 addresses skip duplicate address
    /// detection (`nodad`) so they are usable at once.
    ///
    /// # Errors
    /// The kernel's errno (EEXIST when the link already has it).
    pub fn add_address(&mut self, index: u32, addr: IpNet) -> Result<(), NetlinkError> {
        log::debug!("ip address add {addr} dev {index}");
        self.request(
            format!("add address {addr} to link {index}"),
            RouteNetlinkMessage::NewAddress(address_message(index, addr)),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Removes `addr` from link `index` (`ip address del`).
    ///
    /// # Errors
    /// `is_not_found()` when the link does not have it.
    pub fn del_address(&mut self, index: u32, addr: IpNet) -> Result<(), NetlinkError> {
        log::debug!("ip address del {addr} dev {index}");
        self.request(
            format!("delete address {addr} from link {index}"),
            RouteNetlinkMessage::DelAddress(address_message(index, addr)),
            0,
        )
        .map(drop)
    }
}

fn address_message(index: u32, addr: IpNet) -> AddressMessage {
    use netlink_packet_route::address::AddressFlags;
    let mut msg = AddressMessage::default();
    msg.header.family = family_of(matches!(addr, IpNet::V6(_)));
    msg.header.prefix_len = addr.prefix_len();
    msg.header.index = index;
    msg.attributes.push(AddressAttribute::Local(addr.addr()));
    msg.attributes.push(AddressAttribute::Address(addr.addr()));
    if matches!(addr, IpNet::V6(_)) {
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    msg
}

fn family_of(v6: bool) -> AddressFamily {
    if v6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    }
}

fn unspecified_net(v6: bool) -> IpNet {
    if v6 {
        IpNet::V6(ipnet::Ipv6Net::default())
    } else {
        IpNet::V4(ipnet::Ipv4Net::default())
    }
}

fn ip_of(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(a) => Some(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn in_fresh_netns<T: Send>(body: impl FnOnce() -> T + Send) -> T {
        host::netns::in_new_netns(body).expect("a fresh network namespace needs root")
    }

    fn ip(args: &str) -> String {
        let out = Command::new("ip").args(args.split(' ')).output().unwrap();
        assert!(
            out.status.success(),
            "ip {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// A veth `d0` (peer `d1`) with `10.9.0.2/24` and `fd09::2/64`, both ends up.
    fn dummy_link() -> u32 {
        ip("link add d0 type veth peer name d1");
        ip("link set d1 up");
        ip("link set d0 up");
        let mut nl = Netlink::new().unwrap();
        let index = nl.link_by_name("d0").unwrap().index;
        nl.add_address(index, net("10.9.0.2/24")).unwrap();
        nl.add_address(index, net("fd09::2/64")).unwrap();
        index
    }

    #[test]
    fn addresses_are_added_listed_and_removed() {
        in_fresh_netns(|| {
            let index = dummy_link();
            let mut nl = Netlink::new().unwrap();
            let addrs: Vec<IpNet> = nl
                .addresses(Some(index))
                .unwrap()
                .into_iter()
                .map(|a| a.addr)
                .collect();
            assert!(addrs.contains(&net("10.9.0.2/24")), "{addrs:?}");
            assert!(addrs.contains(&net("fd09::2/64")), "{addrs:?}");
            assert!(ip("-6 addr show dev d0").contains("fd09::2/64"));
            let err = nl.add_address(index, net("10.9.0.2/24")).unwrap_err();
            assert!(err.is_exists(), "{err}");
            nl.del_address(index, net("10.9.0.2/24")).unwrap();
            assert!(!ip("addr show dev d0").contains("10.9.0.2"));
            // Loopback's addresses (it gets them when up) are listed when no link is named.
            ip("link set lo up");
            let all = nl.addresses(None).unwrap();
            assert!(all.iter().any(|a| a.addr == net("127.0.0.1/8")), "{all:?}");
        });
    }

    #[test]
    fn routes_of_every_table_and_family_are_dumped_with_their_attributes() {
        in_fresh_netns(|| {
            let index = dummy_link();
            ip("route add 10.50.0.0/16 via 10.9.0.1 dev d0 metric 7 mtu 1400 table 1000");
            ip("-6 route add fd50::/48 via fd09::1 dev d0 table 100");
            let mut nl = Netlink::new().unwrap();
            let routes = nl.routes().unwrap();
            let v4 = routes
                .iter()
                .find(|r| r.dst == net("10.50.0.0/16"))
                .unwrap();
            assert_eq!(v4.table, 1000);
            assert_eq!(v4.gateway, Some("10.9.0.1".parse().unwrap()));
            assert_eq!(v4.oif, Some(index));
            assert_eq!(v4.priority, Some(7));
            assert!(!v4.extra.is_empty(), "metrics kept: {v4:?}");
            let v6 = routes.iter().find(|r| r.dst == net("fd50::/48")).unwrap();
            assert_eq!(v6.table, 100);
            // The kernel's subnet route of the address is in main, with its source hint.
            let subnet = routes
                .iter()
                .find(|r| r.dst == net("10.9.0.0/24") && r.table == TABLE_MAIN)
                .unwrap();
            assert_eq!(subnet.pref_src, Some("10.9.0.2".parse().unwrap()));
            assert_eq!(subnet.scope, RouteScope::Link);
            assert!(routes.iter().any(|r| r.table == TABLE_LOCAL));
            assert_eq!(nl.routes_in_table(1000).unwrap(), vec![v4.clone()]);
        });
    }

    #[test]
    fn a_dumped_route_is_copied_into_another_table_with_its_metrics_and_deleted() {
        in_fresh_netns(|| {
            dummy_link();
            ip("route add 10.60.0.0/16 via 10.9.0.1 dev d0 mtu 1300");
            let mut nl = Netlink::new().unwrap();
            let original = nl
                .routes_in_table(TABLE_MAIN)
                .unwrap()
                .into_iter()
                .find(|r| r.dst == net("10.60.0.0/16"))
                .unwrap();
            let mut copy = original.clone();
            copy.table = 4000;
            nl.add_route(&copy).unwrap();
            assert!(nl.add_route(&copy).unwrap_err().is_exists());
            nl.replace_route(&copy).unwrap();
            let shown = ip("route show table 4000");
            assert!(
                shown.contains("10.60.0.0/16 via 10.9.0.1 dev d0") && shown.contains("mtu 1300"),
                "{shown}"
            );
            nl.del_route(&original).unwrap();
            assert!(!ip("route show").contains("10.60.0.0/16"));
            // IPv6 keeps a device route per interface for one prefix: append, not add.
            ip("link add e0 type veth peer name e1");
            ip("link set e0 up");
            ip("link set e1 up");
            let fe80 = |nl: &mut Netlink, dev: &str| {
                let index = nl.link_by_name(dev).unwrap().index;
                nl.routes_in_table(TABLE_MAIN)
                    .unwrap()
                    .into_iter()
                    .find(|r| r.oif == Some(index) && r.dst == net("fe80::/64"))
            };
            let mut tries = 0;
            while fe80(&mut nl, "e0").is_none() && tries < 100 {
                std::thread::sleep(std::time::Duration::from_millis(20));
                tries += 1;
            }
            let link_local = fe80(&mut nl, "e0").unwrap();
            nl.del_route(&link_local).unwrap();
            assert!(fe80(&mut nl, "e0").is_none() && fe80(&mut nl, "e1").is_some());
            assert!(nl.add_route(&link_local).unwrap_err().is_exists());
            nl.append_route(&link_local).unwrap();
            assert_eq!(fe80(&mut nl, "e0"), Some(link_local));
            nl.del_route(&copy).unwrap();
            assert!(nl.del_route(&copy).unwrap_err().is_not_found());
            assert_eq!(ip("route show table 4000"), "");
        });
    }

    #[test]
    fn a_new_default_route_in_a_table_looks_like_ip_route_add() {
        in_fresh_netns(|| {
            let index = dummy_link();
            let mut nl = Netlink::new().unwrap();
            for (dst, gw) in [("0.0.0.0/0", "10.9.0.1"), ("::/0", "fd09::1")] {
                let mut route = Route::new(net(dst), 100);
                route.gateway = Some(gw.parse().unwrap());
                route.oif = Some(index);
                assert!(route.is_default());
                nl.add_route(&route).unwrap();
            }
            assert_eq!(ip("route show table 100"), "default via 10.9.0.1 dev d0 \n");
            assert!(ip("-6 route show table 100").contains("default via fd09::1 dev d0"));
            let unreachable = Route {
                gateway: Some("10.77.0.1".parse().unwrap()),
                oif: Some(index),
                ..Route::new(net("10.80.0.0/16"), 100)
            };
            let err = nl.add_route(&unreachable).unwrap_err();
            assert_eq!(err.errno(), Some(libc::ENETUNREACH), "{err}");
            assert!(
                err.to_string().contains("10.80.0.0/16 via 10.77.0.1"),
                "{err}"
            );
        });
    }

    #[test]
    fn source_rules_of_both_families_are_added_listed_and_deleted_exactly() {
        in_fresh_netns(|| {
            let mut nl = Netlink::new().unwrap();
            let stock = nl.rules().unwrap();
            // local, main, default for IPv4; local, main for IPv6.
            assert_eq!(stock.len(), 5, "{stock:?}");
            let v4 = Rule::from_source(net("10.9.0.2/32"), 100);
            let v6 = Rule::from_source(net("fd09::2/128"), 5000);
            nl.add_rule(&v4).unwrap();
            nl.add_rule(&v6).unwrap();
            assert!(ip("rule show").contains("32765:\tfrom 10.9.0.2 lookup 100"));
            assert!(ip("-6 rule show").contains("from fd09::2 lookup 5000"));
            let rules = nl.rules().unwrap();
            let got4 = rules.iter().find(|r| r.src == v4.src).unwrap();
            assert_eq!((got4.table, got4.priority), (100, Some(32765)));
            assert!(!got4.ipv6 && got4.extra.is_empty(), "{got4:?}");
            let got6 = rules.iter().find(|r| r.src == v6.src).unwrap();
            assert!(got6.ipv6);
            assert_eq!(got6.table, 5000);
            // Same selectors at another priority: deleting the dumped one removes only it.
            let mut other = v4.clone();
            other.priority = Some(100);
            nl.add_rule(&other).unwrap();
            nl.del_rule(got4).unwrap();
            let left: Vec<_> = nl
                .rules()
                .unwrap()
                .into_iter()
                .filter(|r| r.src == v4.src)
                .collect();
            assert_eq!(left.len(), 1);
            assert_eq!(left[0].priority, Some(100));
            nl.del_rule(&left[0]).unwrap();
            assert!(nl.del_rule(&left[0]).unwrap_err().is_not_found());
            nl.del_rule(got6).unwrap();
            assert_eq!(nl.rules().unwrap(), stock);
            assert_eq!(got4.to_string(), "32765: from 10.9.0.2/32 lookup 100");
        });
    }

    #[test]
    fn route_get_names_the_interface_of_a_connected_route() {
        // A fresh namespace of our own: only its loopback, which routes 127.0.0.0/8.
        let oif = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let mut nl = Netlink::new().unwrap();
            let lo = nl.link_by_name("lo").unwrap();
            nl.set_link(
                lo.index,
                &crate::LinkChange {
                    up: Some(true),
                    ..Default::default()
                },
            )
            .unwrap();
            let oif = nl.route_get_oif("127.0.0.1".parse().unwrap()).unwrap();
            let unreachable = nl.route_get_oif("192.0.2.1".parse().unwrap());
            (oif, lo.index, unreachable.is_err())
        })
        .join()
        .unwrap();
        assert_eq!(oif.0, Some(oif.1));
        assert!(oif.2, "no route to 192.0.2.1 in an empty namespace");
    }
}
