//! What ADD and DEL change and what CHECK expects, computed from the configuration, the
//! prevResult and a snapshot of the namespace's rules and routes. Pure: the kernel work is in
//! [`crate::apply`].
//!
//! ADD, per container address in prevResult order:
//! - without `table`: pick the address's table (the one its existing rule names on a repeated
//!   ADD, else the first id from 100 that no rule, no route and no prevResult route uses), add
//!   `from <ip>/32|/128 lookup <table>`, put `default via <gateway> dev <if>` in it when a
//!   gateway applies, and copy into it every main-table route of the interface whose source
//!   hint or gateway lies in the address's subnet or which has neither; then remove the
//!   interface's main-table routes (with `addSourceHints`: only those not of link scope, after
//!   putting `<subnet> dev <if> src <ip> scope link` in main);
//! - with `table`: only the rule, pointing at that table (the routes are the main plugin's).

use std::collections::BTreeSet;
use std::net::IpAddr;

use cni::types::{IpConfig, Route as ResultRoute};
use ipnet::IpNet;
use netlink::{Route, Rule, TABLE_MAIN};
use netlink_packet_route::route::{RouteFlags, RouteScope, RouteType};
use netlink_packet_route::rule::RuleAction;

use crate::config::Config;
use crate::error::SbrError;
use crate::names::{FIRST_TABLE, RESERVED_TABLES, host_net};

/// What sbr sees of the container namespace.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Index of `CNI_IFNAME`; `None` when it is gone (DEL only).
    pub link_index: Option<u32>,
    /// Every rule of both families.
    pub rules: Vec<Rule>,
    /// Every route of every table and both families.
    pub routes: Vec<Route>,
    /// The interface's addresses.
    pub addresses: Vec<IpNet>,
}

/// One kernel change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `ip rule add`.
    AddRule(Rule),
    /// `ip rule del` of a dumped rule; already gone counts as done.
    DelRule(Rule),
    /// `ip route replace`; `previous` is what it replaces, for the rollback.
    PutRoute {
        /// The route to install.
        route: Route,
        /// The route with the same key before, if any.
        previous: Option<Route>,
        /// What the route is for (the reference words a failure by it).
        why: Put,
    },
    /// `ip route del`; already gone counts as done.
    DelRoute(Route),
    /// `ip route add` back into main on DEL, best effort: a route already there (or no longer
    /// possible) is left as it is.
    RestoreRoute(Route),
}

/// What a route ADD puts is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// `default via <gateway>` in an address's table.
    Default,
    /// A copy of one of the interface's main-table routes.
    Copy,
    /// `<subnet> dev <if> src <ip> scope link` in main (`addSourceHints`).
    Hint,
    /// A route put back by a rollback.
    Undo,
}

impl Op {
    /// The change that undoes this one, for rolling back a failed ADD.
    pub fn undo(&self) -> Option<Op> {
        match self {
            Op::AddRule(rule) => Some(Op::DelRule(rule.clone())),
            Op::PutRoute {
                previous: Some(previous),
                ..
            } => Some(Op::PutRoute {
                route: previous.clone(),
                previous: None,
                why: Put::Undo,
            }),
            Op::PutRoute { route, .. } => Some(Op::DelRoute(route.clone())),
            Op::DelRoute(route) => Some(Op::PutRoute {
                route: route.clone(),
                previous: None,
                why: Put::Undo,
            }),
            Op::DelRule(_) | Op::RestoreRoute(_) => None,
        }
    }
}

/// True for a rule of the shape sbr creates for `ip`: `from <ip>/32|/128 lookup <table>` and
/// no other selector (a rule by Go sbr has the same shape).
pub fn is_sbr_rule(rule: &Rule, ip: IpAddr) -> bool {
    rule.src == Some(host_net(ip))
        && rule.dst.is_none()
        && rule.action == RuleAction::ToTable
        && rule.tos == 0
        && rule.extra.is_empty()
}

/// The metric the kernel gives a route without one: 0 for IPv4, 1024 for IPv6.
fn metric(route: &Route) -> u32 {
    route
        .priority
        .unwrap_or_else(|| if route.is_ipv6() { 1024 } else { 0 })
}

/// True when the kernel treats both as the same route (replace overwrites, add collides).
/// IPv6 device routes of different interfaces coexist (`fe80::/64` on each link).
pub fn same_key(a: &Route, b: &Route) -> bool {
    let v6_device = a.is_ipv6() && a.gateway.is_none() && b.gateway.is_none();
    a.table == b.table
        && a.dst == b.dst
        && a.tos == b.tos
        && metric(a) == metric(b)
        && (!v6_device || a.oif == b.oif)
}

/// True when a main-table route of the interface serves `ip`: its source hint or gateway lies
/// in the address's subnet, or it has neither (a plain device route).
fn serves(ip: &IpConfig, route: &Route) -> bool {
    let inside = |a: Option<IpAddr>| a.is_some_and(|a| ip.address.contains(&a));
    inside(route.pref_src)
        || inside(route.gateway)
        || (route.pref_src.is_none() && route.gateway.is_none())
}

fn default_net(ip: IpAddr) -> IpNet {
    match ip {
        IpAddr::V4(_) => IpNet::V4(ipnet::Ipv4Net::default()),
        IpAddr::V6(_) => IpNet::V6(ipnet::Ipv6Net::default()),
    }
}

/// The interface's own routes in main: unicast, through the interface (multipath routes are
/// not the interface's alone and stay).
fn link_main_routes(seen: &Observed, link: u32) -> Vec<&Route> {
    seen.routes
        .iter()
        .filter(|r| r.table == TABLE_MAIN && r.oif == Some(link) && r.kind == RouteType::Unicast)
        .collect()
}

/// Tables sbr must not allocate: named by a rule, holding a route, named by a prevResult route
/// (CNI 1.1 `table`), or reserved.
fn used_tables(seen: &Observed, prev_routes: &[ResultRoute]) -> BTreeSet<u32> {
    let mut used: BTreeSet<u32> = RESERVED_TABLES.into_iter().collect();
    used.extend(
        seen.rules
            .iter()
            .filter(|r| r.action == RuleAction::ToTable)
            .map(|r| r.table),
    );
    used.extend(seen.routes.iter().map(|r| r.table));
    used.extend(prev_routes.iter().filter_map(|r| r.table));
    used
}

/// The changes of an ADD of `ips` on link `link`.
///
/// # Errors
/// [`SbrError::NoFreeTable`] when every table id from 100 up is taken.
pub fn plan_add(
    config: &Config,
    ips: &[IpConfig],
    prev_routes: &[ResultRoute],
    link: u32,
    seen: &Observed,
) -> Result<Vec<Op>, SbrError> {
    let mut ops = Vec::new();
    if ips.is_empty() {
        return Ok(ops);
    }
    if let Some(table) = config.table {
        for ip in ips {
            let addr = ip.address.addr();
            if !seen
                .rules
                .iter()
                .any(|r| is_sbr_rule(r, addr) && r.table == table)
            {
                ops.push(Op::AddRule(Rule::from_source(host_net(addr), table)));
            }
        }
        return Ok(ops);
    }
    let put = |ops: &mut Vec<Op>, route: Route, why: Put| {
        let previous = seen.routes.iter().find(|r| same_key(r, &route)).cloned();
        ops.push(Op::PutRoute {
            route,
            previous,
            why,
        });
    };
    let main = link_main_routes(seen, link);
    let mut used = used_tables(seen, prev_routes);
    for ip in ips {
        let addr = ip.address.addr();
        let table = match seen.rules.iter().find(|r| is_sbr_rule(r, addr)) {
            // A repeated ADD keeps the table it got the first time.
            Some(existing) => existing.table,
            None => {
                let table = (FIRST_TABLE..=u32::MAX)
                    .find(|t| !used.contains(t))
                    .ok_or(SbrError::NoFreeTable(addr))?;
                used.insert(table);
                ops.push(Op::AddRule(Rule::from_source(host_net(addr), table)));
                table
            }
        };
        let gateway = config.gateway_for(ip);
        if let Some(gw) = gateway {
            let mut route = Route::new(default_net(addr), table);
            route.gateway = Some(gw);
            route.oif = Some(link);
            put(&mut ops, route, Put::Default);
        }
        // The default route just made wins over a copy of main's (a static gateway must).
        let replaced_default =
            |r: &Route| gateway.is_some() && r.is_default() && r.is_ipv6() == addr.is_ipv6();
        for route in main
            .iter()
            .filter(|r| serves(ip, r) && !replaced_default(r))
        {
            let mut copy = (*route).clone();
            copy.table = table;
            // Flags the kernel set on the original (e.g. `linkdown`) are refused on add.
            copy.flags = RouteFlags::empty();
            put(&mut ops, copy, Put::Copy);
        }
    }
    // Only the routes copied into a table leave main: DEL puts back what the tables hold, so a
    // route serving none of the addresses (the IPv6 default when prevResult lists only IPv4)
    // deleted here would be gone for good.
    let main: Vec<&Route> = main
        .into_iter()
        .filter(|r| ips.iter().any(|ip| serves(ip, r)))
        .collect();
    if config.add_source_hints {
        let mut hints = Vec::new();
        for ip in ips {
            let subnet = ip.address.trunc();
            let mut hint = Route::new(subnet, TABLE_MAIN);
            hint.oif = Some(link);
            hint.pref_src = Some(ip.address.addr());
            hint.scope = RouteScope::Link;
            put(&mut ops, hint.clone(), Put::Hint);
            hints.push(hint);
        }
        for route in main {
            if route.scope != RouteScope::Link && !hints.iter().any(|h| same_key(h, route)) {
                ops.push(Op::DelRoute(route.clone()));
            }
        }
    } else {
        ops.extend(main.into_iter().map(|r| Op::DelRoute(r.clone())));
    }
    Ok(ops)
}

/// The changes of a DEL: the sbr-shaped rules of this interface's addresses (from prevResult
/// and from the interface itself, so a DEL without prevResult or after an ADD by the Go plugin
/// finds them too), restricted to `table` when one is configured (any table: DEL removes what
/// an ADD with that `table` made, as the reference does). Without `table`, the routes of each
/// table only these rules used are removed and the interface's routes among them go back into
/// main where nothing took their place.
pub fn plan_del(table: Option<u32>, prev_ips: &[IpAddr], seen: &Observed) -> Vec<Op> {
    let mut ips: Vec<IpAddr> = prev_ips.to_vec();
    ips.extend(seen.addresses.iter().map(IpNet::addr));
    let owned: Vec<&Rule> = seen
        .rules
        .iter()
        .filter(|r| ips.iter().any(|ip| is_sbr_rule(r, *ip)))
        .filter(|r| match table {
            Some(table) => r.table == table,
            None => r.table != 0 && !RESERVED_TABLES.contains(&r.table),
        })
        .collect();
    let mut ops: Vec<Op> = owned.iter().map(|r| Op::DelRule((*r).clone())).collect();
    if table.is_some() {
        return ops;
    }
    let tables: BTreeSet<u32> = owned.iter().map(|r| r.table).collect();
    let mut restore: Vec<Route> = Vec::new();
    for table in tables {
        let shared = seen
            .rules
            .iter()
            .any(|r| r.action == RuleAction::ToTable && r.table == table && !owned.contains(&r));
        if shared {
            continue;
        }
        for route in seen.routes.iter().filter(|r| r.table == table) {
            ops.push(Op::DelRoute(route.clone()));
            if seen.link_index.is_some() && route.oif == seen.link_index {
                let mut back = route.clone();
                back.table = TABLE_MAIN;
                let taken = seen.routes.iter().any(|r| same_key(r, &back))
                    || restore.iter().any(|r| same_key(r, &back));
                if !taken {
                    restore.push(back);
                }
            }
        }
    }
    // Device routes first: a gateway is only accepted once its subnet is reachable.
    restore.sort_by_key(|r| r.gateway.is_some());
    ops.extend(restore.into_iter().map(Op::RestoreRoute));
    ops
}

/// What CHECK finds missing for `ips` on interface `ifname` (index `link`): the address itself,
/// its rule, and without `table` the default route of its table (or any route through the
/// interface when no gateway applies); with `table`, the prevResult routes that name that
/// table. Empty when everything is in place.
pub fn check(
    config: &Config,
    ips: &[IpConfig],
    prev_routes: &[ResultRoute],
    ifname: &str,
    link: u32,
    seen: &Observed,
) -> Vec<String> {
    let mut missing = Vec::new();
    for ip in ips {
        let addr = ip.address.addr();
        if !seen.addresses.iter().any(|a| a.addr() == addr) {
            missing.push(format!("address {} is not on {ifname}", ip.address));
        }
        let rule = seen
            .rules
            .iter()
            .find(|r| is_sbr_rule(r, addr) && config.table.is_none_or(|t| r.table == t));
        let Some(rule) = rule else {
            let table = config
                .table
                .map_or_else(|| "<table>".to_owned(), |t| t.to_string());
            missing.push(format!(
                "rule \"from {} lookup {table}\" is missing",
                host_net(addr)
            ));
            continue;
        };
        if config.table.is_some() {
            continue;
        }
        let table = rule.table;
        let mut through_link = seen
            .routes
            .iter()
            .filter(|r| r.table == table && r.oif == Some(link));
        match config.gateway_for(ip) {
            Some(gw) => {
                let found = through_link.any(|r| {
                    r.is_default() && r.is_ipv6() == gw.is_ipv6() && r.gateway == Some(gw)
                });
                if !found {
                    missing.push(format!(
                        "route \"default via {gw} dev {ifname} table {table}\" is missing"
                    ));
                }
            }
            None => {
                if through_link.next().is_none() {
                    missing.push(format!(
                        "table {table} of {addr} has no route through {ifname}"
                    ));
                }
            }
        }
    }
    if let Some(table) = config.table {
        for want in prev_routes.iter().filter(|r| r.table == Some(table)) {
            let found = seen.routes.iter().any(|r| {
                r.table == table
                    && r.dst == want.dst
                    && want.gw.is_none_or(|g| r.gateway == Some(g))
            });
            if !found {
                let via = want.gw.map(|g| format!(" via {g}")).unwrap_or_default();
                missing.push(format!(
                    "prevResult route \"{}{via} table {table}\" is missing",
                    want.dst
                ));
            }
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::route::RouteProtocol;

    const LINK: u32 = 3;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ipcfg(address: &str, gateway: Option<&str>) -> IpConfig {
        IpConfig {
            interface: None,
            address: net(address),
            gateway: gateway.map(|g| g.parse().unwrap()),
        }
    }

    fn route(dst: &str, gw: Option<&str>, src: Option<&str>, table: u32) -> Route {
        Route {
            gateway: gw.map(|g| g.parse().unwrap()),
            pref_src: src.map(|s| s.parse().unwrap()),
            oif: Some(LINK),
            ..Route::new(net(dst), table)
        }
    }

    fn subnet_route(dst: &str, src: &str) -> Route {
        Route {
            protocol: RouteProtocol::Kernel,
            scope: RouteScope::Link,
            ..route(dst, None, Some(src), TABLE_MAIN)
        }
    }

    /// The stock rules (local, main, default) of both families.
    fn stock_rules() -> Vec<Rule> {
        let mut rules = Vec::new();
        for ipv6 in [false, true] {
            for (priority, table) in [(0, 255), (32766, 254), (32767, 253)] {
                rules.push(Rule {
                    ipv6,
                    src: None,
                    dst: None,
                    table,
                    priority: Some(priority),
                    action: RuleAction::ToTable,
                    tos: 0,
                    extra: Vec::new(),
                });
            }
        }
        rules
    }

    /// net1 with 10.1.0.5/24 behind a bridge: the kernel's subnet route and a default route.
    fn bridged() -> Observed {
        Observed {
            link_index: Some(LINK),
            rules: stock_rules(),
            routes: vec![
                route("0.0.0.0/0", Some("10.1.0.1"), None, TABLE_MAIN),
                subnet_route("10.1.0.0/24", "10.1.0.5"),
                // Another interface's routes are not touched.
                Route {
                    oif: Some(2),
                    ..subnet_route("10.2.0.0/24", "10.2.0.5")
                },
            ],
            addresses: vec![net("10.1.0.5/24")],
        }
    }

    fn rules_of(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .filter_map(|op| match op {
                Op::AddRule(r) => Some(r.to_string()),
                _ => None,
            })
            .collect()
    }

    fn puts(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .filter_map(|op| match op {
                Op::PutRoute { route, .. } => Some(route.to_string()),
                _ => None,
            })
            .collect()
    }

    fn dels(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .filter_map(|op| match op {
                Op::DelRoute(route) => Some(route.to_string()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn plan_add_moves_the_interface_routes_into_table_100_behind_a_source_rule() {
        let ips = [ipcfg("10.1.0.5/24", Some("10.1.0.1"))];
        let ops = plan_add(&Config::default(), &ips, &[], LINK, &bridged()).unwrap();
        assert_eq!(rules_of(&ops), ["from 10.1.0.5/32 lookup 100"]);
        assert_eq!(
            puts(&ops),
            [
                "default via 10.1.0.1 dev 3 table 100",
                "10.1.0.0/24 dev 3 src 10.1.0.5 table 100",
            ]
        );
        assert_eq!(
            dels(&ops),
            [
                "default via 10.1.0.1 dev 3 table 254",
                "10.1.0.0/24 dev 3 src 10.1.0.5 table 254",
            ]
        );
        // The rule comes first, the main-table deletions last.
        assert!(matches!(ops[0], Op::AddRule(_)));
        assert!(matches!(ops.last(), Some(Op::DelRoute(_))));
    }

    #[test]
    fn plan_add_skips_tables_named_by_rules_routes_and_prev_result_routes() {
        let mut seen = bridged();
        seen.rules.push(Rule::from_source(net("10.9.9.9/32"), 100));
        seen.routes
            .push(route("10.7.0.0/16", Some("10.1.0.1"), None, 101));
        let prev = [ResultRoute {
            dst: net("10.8.0.0/16"),
            table: Some(102),
            ..ResultRoute::default()
        }];
        let ips = [ipcfg("10.1.0.5/24", None), ipcfg("10.1.0.6/24", None)];
        let ops = plan_add(&Config::default(), &ips, &prev, LINK, &seen).unwrap();
        assert_eq!(
            rules_of(&ops),
            ["from 10.1.0.5/32 lookup 103", "from 10.1.0.6/32 lookup 104"]
        );
        // Without a gateway no default route is made up; main's routes serve both addresses
        // (gateway and source hint lie in both subnets) and go into both tables.
        assert_eq!(
            puts(&ops),
            [
                "default via 10.1.0.1 dev 3 table 103",
                "10.1.0.0/24 dev 3 src 10.1.0.5 table 103",
                "default via 10.1.0.1 dev 3 table 104",
                "10.1.0.0/24 dev 3 src 10.1.0.5 table 104",
            ]
        );
    }

    #[test]
    fn plan_add_copies_only_routes_serving_each_address() {
        let seen = Observed {
            link_index: Some(LINK),
            rules: stock_rules(),
            routes: vec![
                subnet_route("10.1.0.0/24", "10.1.0.5"),
                subnet_route("192.168.5.0/24", "192.168.5.9"),
                route("10.50.0.0/16", Some("192.168.5.1"), None, TABLE_MAIN),
                route("fd00::/64", None, None, TABLE_MAIN),
            ],
            addresses: vec![],
        };
        let ips = [ipcfg("10.1.0.5/24", None), ipcfg("192.168.5.9/24", None)];
        let ops = plan_add(&Config::default(), &ips, &[], LINK, &seen).unwrap();
        assert_eq!(
            puts(&ops),
            [
                "10.1.0.0/24 dev 3 src 10.1.0.5 table 100",
                "fd00::/64 dev 3 table 100",
                "192.168.5.0/24 dev 3 src 192.168.5.9 table 101",
                "10.50.0.0/16 via 192.168.5.1 dev 3 table 101",
                "fd00::/64 dev 3 table 101",
            ]
        );
        assert_eq!(dels(&ops).len(), 4);
    }

    #[test]
    fn plan_add_with_a_fixed_table_adds_only_rules_and_is_idempotent() {
        let config = Config {
            table: Some(5000),
            gateway_v4: Some("10.1.0.254".parse().unwrap()),
            ..Config::default()
        };
        let ips = [
            ipcfg("10.1.0.5/24", Some("10.1.0.1")),
            ipcfg("fd00::5/64", None),
        ];
        let mut seen = bridged();
        let ops = plan_add(&config, &ips, &[], LINK, &seen).unwrap();
        assert_eq!(
            ops,
            [
                Op::AddRule(Rule::from_source(net("10.1.0.5/32"), 5000)),
                Op::AddRule(Rule::from_source(net("fd00::5/128"), 5000)),
            ]
        );
        seen.rules.push(Rule::from_source(net("10.1.0.5/32"), 5000));
        let again = plan_add(&config, &ips, &[], LINK, &seen).unwrap();
        assert_eq!(again, ops[1..]);
    }

    #[test]
    fn plan_add_repeated_keeps_the_table_of_the_existing_rule() {
        let mut seen = bridged();
        seen.rules.push(Rule::from_source(net("10.1.0.5/32"), 107));
        let ips = [ipcfg("10.1.0.5/24", Some("10.1.0.1"))];
        let ops = plan_add(&Config::default(), &ips, &[], LINK, &seen).unwrap();
        assert!(rules_of(&ops).is_empty());
        assert!(
            puts(&ops).iter().all(|r| r.ends_with("table 107")),
            "{ops:?}"
        );
    }

    #[test]
    fn plan_add_uses_static_gateways_of_the_same_family() {
        let config = Config {
            gateway_v4: Some("10.1.0.254".parse().unwrap()),
            gateway_v6: Some("fd00::fe".parse().unwrap()),
            ..Config::default()
        };
        // Main's default via the prevResult gateway is not copied over the static one.
        let mut seen = bridged();
        seen.routes.retain(|r| r.is_default());
        let ips = [
            ipcfg("10.1.0.5/24", Some("10.1.0.1")),
            ipcfg("fd00::5/64", None),
        ];
        let ops = plan_add(&config, &ips, &[], LINK, &seen).unwrap();
        assert_eq!(
            puts(&ops),
            [
                "default via 10.1.0.254 dev 3 table 100",
                "default via fd00::fe dev 3 table 101",
            ]
        );
    }

    #[test]
    fn plan_add_with_source_hints_keeps_link_scope_routes_in_main() {
        let config = Config {
            add_source_hints: true,
            ..Config::default()
        };
        let ips = [ipcfg("10.1.0.5/24", Some("10.1.0.1"))];
        let seen = bridged();
        let ops = plan_add(&config, &ips, &[], LINK, &seen).unwrap();
        let hint = ops
            .iter()
            .find_map(|op| match op {
                Op::PutRoute {
                    route,
                    previous,
                    why: Put::Hint,
                } => Some((route.clone(), previous.clone())),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            hint.0.to_string(),
            "10.1.0.0/24 dev 3 src 10.1.0.5 table 254"
        );
        assert_eq!(hint.0.scope, RouteScope::Link);
        // It replaces the kernel's subnet route, which the rollback would put back.
        assert_eq!(hint.1, Some(seen.routes[1].clone()));
        assert_eq!(dels(&ops), ["default via 10.1.0.1 dev 3 table 254"]);
    }

    #[test]
    fn plan_add_leaves_in_main_the_routes_serving_none_of_the_addresses() {
        let mut seen = bridged();
        seen.routes
            .push(route("::/0", Some("fd01::1"), None, TABLE_MAIN));
        let ips = [ipcfg("10.1.0.5/24", Some("10.1.0.1"))];
        for add_source_hints in [false, true] {
            let config = Config {
                add_source_hints,
                ..Config::default()
            };
            let ops = plan_add(&config, &ips, &[], LINK, &seen).unwrap();
            assert!(
                !dels(&ops)
                    .iter()
                    .any(|d| d.starts_with("default via fd01::1")),
                "{ops:?}"
            );
            assert!(!puts(&ops).iter().any(|p| p.contains("fd01::1")), "{ops:?}");
            assert!(dels(&ops).contains(&"default via 10.1.0.1 dev 3 table 254".to_owned()));
        }
    }

    #[test]
    fn plan_add_without_an_address_of_the_interface_changes_nothing() {
        let ops = plan_add(&Config::default(), &[], &[], LINK, &bridged()).unwrap();
        assert!(ops.is_empty());
    }

    #[test]
    fn rollback_undoes_each_change() {
        let r = route("10.1.0.0/24", None, None, 100);
        let old = route("10.1.0.0/24", None, None, TABLE_MAIN);
        let rule = Rule::from_source(net("10.1.0.5/32"), 100);
        assert_eq!(Op::AddRule(rule.clone()).undo(), Some(Op::DelRule(rule)));
        let put_new = Op::PutRoute {
            route: r.clone(),
            previous: None,
            why: Put::Copy,
        };
        assert_eq!(put_new.undo(), Some(Op::DelRoute(r.clone())));
        let put_over = Op::PutRoute {
            route: r,
            previous: Some(old.clone()),
            why: Put::Default,
        };
        assert_eq!(
            put_over.undo(),
            Some(Op::PutRoute {
                route: old.clone(),
                previous: None,
                why: Put::Undo,
            })
        );
        assert_eq!(
            Op::DelRoute(old.clone()).undo(),
            Some(Op::PutRoute {
                route: old.clone(),
                previous: None,
                why: Put::Undo,
            })
        );
        assert_eq!(Op::RestoreRoute(old).undo(), None);
    }

    /// The namespace after an ADD of 10.1.0.5 into table 100 (and someone else's table 200).
    fn after_add() -> Observed {
        let mut seen = bridged();
        seen.routes.retain(|r| r.oif != Some(LINK));
        let mut rule = Rule::from_source(net("10.1.0.5/32"), 100);
        rule.priority = Some(32765);
        seen.rules.push(rule);
        let mut foreign = Rule::from_source(net("10.1.0.5/32"), 200);
        foreign.dst = Some(net("10.99.0.0/16"));
        seen.rules.push(foreign);
        seen.routes.extend([
            route("0.0.0.0/0", Some("10.1.0.1"), None, 100),
            Route {
                table: 100,
                ..subnet_route("10.1.0.0/24", "10.1.0.5")
            },
            route("10.99.0.0/16", Some("10.1.0.1"), None, 200),
        ]);
        seen
    }

    #[test]
    fn plan_del_removes_the_rule_and_table_and_puts_routes_back_in_main() {
        let seen = after_add();
        let ops = plan_del(None, &[], &seen);
        let Op::DelRule(rule) = &ops[0] else {
            panic!("{ops:?}")
        };
        assert_eq!(rule.to_string(), "32765: from 10.1.0.5/32 lookup 100");
        assert_eq!(
            dels(&ops),
            [
                "default via 10.1.0.1 dev 3 table 100",
                "10.1.0.0/24 dev 3 src 10.1.0.5 table 100",
            ]
        );
        let restored: Vec<String> = ops
            .iter()
            .filter_map(|op| match op {
                Op::RestoreRoute(r) => Some(r.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(
            restored,
            [
                "10.1.0.0/24 dev 3 src 10.1.0.5 table 254",
                "default via 10.1.0.1 dev 3 table 254",
            ]
        );
        assert_eq!(
            ops.len(),
            5,
            "the rule with a `to` selector is not sbr's: {ops:?}"
        );
    }

    #[test]
    fn plan_del_finds_rules_by_prev_result_when_the_interface_is_gone() {
        let mut seen = after_add();
        seen.addresses.clear();
        seen.link_index = None;
        assert!(plan_del(None, &[], &seen).is_empty());
        let ops = plan_del(None, &["10.1.0.5".parse().unwrap()], &seen);
        assert_eq!(dels(&ops).len(), 2);
        assert!(!ops.iter().any(|op| matches!(op, Op::RestoreRoute(_))));
    }

    #[test]
    fn plan_del_with_a_fixed_table_removes_only_rules_of_that_table() {
        let mut seen = after_add();
        seen.rules.push(Rule::from_source(net("10.1.0.5/32"), 5000));
        let ops = plan_del(Some(5000), &[], &seen);
        assert_eq!(
            ops,
            [Op::DelRule(Rule::from_source(net("10.1.0.5/32"), 5000))]
        );
    }

    #[test]
    fn plan_del_with_a_reserved_table_removes_the_rules_an_add_with_it_made() {
        // The reference's ADD takes `table: 254`; our DEL must still clean up after it.
        let mut seen = after_add();
        seen.rules
            .push(Rule::from_source(net("10.1.0.5/32"), TABLE_MAIN));
        let ops = plan_del(Some(TABLE_MAIN), &[], &seen);
        assert_eq!(
            ops,
            [Op::DelRule(Rule::from_source(
                net("10.1.0.5/32"),
                TABLE_MAIN
            ))]
        );
    }

    #[test]
    fn plan_del_leaves_a_table_another_rule_still_uses() {
        let mut seen = after_add();
        seen.rules.push(Rule::from_source(net("10.77.0.1/32"), 100));
        let ops = plan_del(None, &[], &seen);
        assert_eq!(ops.len(), 1, "{ops:?}");
    }

    #[test]
    fn check_passes_after_add_and_names_each_missing_object() {
        let ips = [ipcfg("10.1.0.5/24", Some("10.1.0.1"))];
        let seen = after_add();
        let config = Config::default();
        assert!(check(&config, &ips, &[], "net1", LINK, &seen).is_empty());

        let mut no_default = seen.clone();
        no_default
            .routes
            .retain(|r| !(r.table == 100 && r.is_default()));
        assert_eq!(
            check(&config, &ips, &[], "net1", LINK, &no_default),
            ["route \"default via 10.1.0.1 dev net1 table 100\" is missing"]
        );
        let mut no_rule = seen.clone();
        no_rule.rules.retain(|r| r.table != 100);
        no_rule.addresses.clear();
        assert_eq!(
            check(&config, &ips, &[], "net1", LINK, &no_rule),
            [
                "address 10.1.0.5/24 is not on net1",
                "rule \"from 10.1.0.5/32 lookup <table>\" is missing",
            ]
        );
        let mut empty_table = seen;
        empty_table.routes.retain(|r| r.table != 100);
        assert_eq!(
            check(
                &config,
                &[ipcfg("10.1.0.5/24", None)],
                &[],
                "net1",
                LINK,
                &empty_table
            ),
            ["table 100 of 10.1.0.5 has no route through net1"]
        );
    }

    #[test]
    fn check_with_a_fixed_table_wants_the_rule_and_the_prev_result_routes_of_that_table() {
        let config = Config {
            table: Some(5000),
            ..Config::default()
        };
        let ips = [ipcfg("10.1.0.5/24", None)];
        let prev = [ResultRoute {
            dst: net("10.60.0.0/16"),
            gw: Some("10.1.0.1".parse().unwrap()),
            table: Some(5000),
            ..ResultRoute::default()
        }];
        let mut seen = bridged();
        assert_eq!(
            check(&config, &ips, &prev, "net1", LINK, &seen),
            [
                "rule \"from 10.1.0.5/32 lookup 5000\" is missing",
                "prevResult route \"10.60.0.0/16 via 10.1.0.1 table 5000\" is missing",
            ]
        );
        seen.rules.push(Rule::from_source(net("10.1.0.5/32"), 5000));
        seen.routes
            .push(route("10.60.0.0/16", Some("10.1.0.1"), None, 5000));
        assert!(check(&config, &ips, &prev, "net1", LINK, &seen).is_empty());
    }
}
