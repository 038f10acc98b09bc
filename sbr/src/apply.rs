//! The only code that touches the kernel: takes the namespace lock, reads the namespace's
//! rules, routes and the interface, and carries out a [`crate::plan`] over one netlink socket
//! opened inside the container namespace.
//!
//! The lock is `flock(2)` on the network namespace itself (the nsfs inode behind `CNI_NETNS`),
//! so every path naming that namespace (`/run/netns/x`, `/proc/<pid>/ns/net`) shares it, no
//! file is ever created, and the Go plugin's lock on a `/run/netns` path is the same lock.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use cni::types::{IpConfig, Route as ResultRoute};
use host::lock::{DEFAULT_WAIT, FileLock};
use host::netns::{NetNs, NetnsError};
use netlink::{Netlink, NetlinkError, OpenError};

use crate::config::Config;
use crate::error::SbrError;
use crate::plan::{self, Observed, Op, Put};

/// The container namespace, locked, with a netlink socket inside it.
struct Container {
    nl: Netlink,
    /// Held by ADD and DEL, which change the namespace; CHECK only reads it.
    _lock: Option<FileLock>,
}

impl Container {
    /// The namespace, locked against other ADDs and DELs of sbr.
    fn open(ns: &NetNs) -> Result<Container, SbrError> {
        let fd = ns
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| NetnsError::Open {
                path: ns.path().to_path_buf(),
                source,
            })?;
        let lock = FileLock::acquire_file(File::from(fd), ns.path().to_path_buf(), DEFAULT_WAIT)?;
        let mut container = Container::open_unlocked(ns)?;
        container._lock = Some(lock);
        Ok(container)
    }

    /// The namespace, for reading only.
    fn open_unlocked(ns: &NetNs) -> Result<Container, SbrError> {
        let nl = Netlink::open_in_place(ns).map_err(|e| match e {
            OpenError::Netns(e) => SbrError::Netns(e),
            OpenError::Netlink(source) => SbrError::Kernel {
                lead: "failed to open a netlink socket in the container".into(),
                source,
            },
        })?;
        Ok(Container { nl, _lock: None })
    }

    /// `ifname`'s index, `None` when it does not exist; `lead` words any other failure.
    fn link_index(&mut self, ifname: &str, lead: &str) -> Result<Option<u32>, SbrError> {
        match self.nl.link_by_name(ifname) {
            Ok(link) => Ok(Some(link.index)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(source) => Err(SbrError::Kernel {
                lead: lead.to_owned(),
                source,
            }),
        }
    }

    /// `ifname`'s index (ADD): the reference's words when it is missing.
    fn require_link(&mut self, ifname: &str) -> Result<u32, SbrError> {
        let lead = format!("Cannot find network interface {ifname}");
        self.link_index(ifname, &lead)?
            .ok_or_else(|| SbrError::LinkNotFound {
                lead,
                ifname: ifname.to_owned(),
            })
    }

    fn rules(&mut self, lead: &str) -> Result<Vec<netlink::Rule>, SbrError> {
        self.nl.rules().map_err(|source| SbrError::Kernel {
            lead: lead.to_owned(),
            source,
        })
    }

    fn routes(&mut self, lead: &str) -> Result<Vec<netlink::Route>, SbrError> {
        self.nl.routes().map_err(|source| SbrError::Kernel {
            lead: lead.to_owned(),
            source,
        })
    }

    fn addresses(&mut self, link: Option<u32>, lead: &str) -> Result<Vec<ipnet::IpNet>, SbrError> {
        match link {
            Some(index) => Ok(self
                .nl
                .addresses(Some(index))
                .map_err(|source| SbrError::Kernel {
                    lead: lead.to_owned(),
                    source,
                })?
                .into_iter()
                .map(|a| a.addr)
                .collect()),
            None => Ok(Vec::new()),
        }
    }

    fn run(&mut self, op: &Op) -> Result<(), NetlinkError> {
        let gone_is_done = |r: Result<(), NetlinkError>| match r {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        };
        match op {
            Op::AddRule(rule) => self.nl.add_rule(rule),
            Op::DelRule(rule) => gone_is_done(self.nl.del_rule(rule)),
            Op::PutRoute { route, .. } => self.nl.replace_route(route),
            Op::DelRoute(route) => gone_is_done(self.nl.del_route(route)),
            Op::RestoreRoute(route) => {
                // IPv6 keeps one device route per interface for a prefix (fe80::/64); a route
                // with a gateway must not become a second next hop of another one's.
                let result = if route.is_ipv6() && route.gateway.is_none() {
                    self.nl.append_route(route)
                } else {
                    self.nl.add_route(route)
                };
                if let Err(e) = result {
                    log::info!("not restoring {route} to main: {e}");
                }
                Ok(())
            }
        }
    }
}

/// ADD: applies the plan for `ips` on `ifname` inside `ns`; on a failure, undoes the steps done.
///
/// # Errors
/// The lock, a missing interface, or the failed step (with any undo step that failed).
pub fn add(
    ns: &NetNs,
    ifname: &str,
    config: &Config,
    ips: &[IpConfig],
    prev_routes: &[ResultRoute],
) -> Result<(), SbrError> {
    if ips.is_empty() {
        log::warn!("prevResult has no address of {ifname}: nothing to route by source");
        return Ok(());
    }
    let mut c = Container::open(ns)?;
    // The reference's order: rules, routes, the interface. A fixed table needs rules only,
    // not even the interface (the reference does not look it up then).
    let rules = c.rules("Failed to list all rules")?;
    let (link, routes) = match config.table {
        Some(_) => (0, Vec::new()),
        None => {
            let routes = c.routes("Failed to list all routes")?;
            (c.require_link(ifname)?, routes)
        }
    };
    let seen = Observed {
        link_index: Some(link),
        rules,
        routes,
        addresses: Vec::new(),
    };
    let ops = plan::plan_add(config, ips, prev_routes, link, &seen)?;
    for (done, op) in ops.iter().enumerate() {
        if let Err(cause) = c.run(op) {
            let mut undo = Vec::new();
            for step in ops[..done].iter().rev().filter_map(Op::undo) {
                if let Err(e) = c.run(&step) {
                    undo.push(e.to_string());
                }
            }
            return Err(SbrError::Add {
                lead: add_lead(op, config.table.is_some()),
                cause,
                undo,
            });
        }
    }
    Ok(())
}

/// The reference's words for a failed ADD step (ours for the steps it does not fail on).
fn add_lead(op: &Op, fixed_table: bool) -> String {
    match op {
        Op::AddRule(_) if fixed_table => "failed to add rule".into(),
        Op::AddRule(_) => "Failed to add rule".into(),
        Op::PutRoute {
            route,
            why: Put::Default,
            ..
        } => match route.gateway {
            Some(gw) => format!("Failed to add default route to {gw}"),
            None => "Failed to add default route".into(),
        },
        Op::PutRoute {
            why: Put::Copy | Put::Undo,
            ..
        } => "Failed to readd route".into(),
        // The reference only logs a failed source hint.
        Op::PutRoute {
            route,
            why: Put::Hint,
            ..
        } => format!("failed to add source hint route {route}"),
        Op::DelRoute(_) => "Failed to delete route".into(),
        Op::DelRule(rule) => format!("failed to delete rule {rule}"),
        Op::RestoreRoute(route) => format!("failed to restore route {route}"),
    }
}

/// CHECK: compares the namespace with what ADD made for `ips` on `ifname`.
///
/// # Errors
/// [`SbrError::Check`] listing every missing object; lock or netlink failures.
pub fn check(
    ns: &NetNs,
    ifname: &str,
    config: &Config,
    ips: &[IpConfig],
    prev_routes: &[ResultRoute],
) -> Result<(), SbrError> {
    let mut c = Container::open_unlocked(ns)?;
    let Some(link) = c.link_index(ifname, &format!("failed to look up {ifname}"))? else {
        return Err(SbrError::Check {
            ifname: ifname.to_owned(),
            missing: vec![format!(
                "interface {ifname} does not exist in the container"
            )],
        });
    };
    let seen = Observed {
        link_index: Some(link),
        rules: c.rules("failed to list rules")?,
        routes: c.routes("failed to list routes")?,
        addresses: c.addresses(Some(link), "failed to list addresses")?,
    };
    let missing = plan::check(config, ips, prev_routes, ifname, link, &seen);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(SbrError::Check {
            ifname: ifname.to_owned(),
            missing,
        })
    }
}

/// DEL: removes this interface's rules (and, without `table`, their tables) from the namespace
/// at `path`. A missing path, or one that is no namespace (such as the empty file the Go
/// plugin's lock leaves behind), means there is nothing left to remove.
///
/// # Errors
/// The lock, or removals that failed (after trying all of them).
pub fn del(
    path: Option<&Path>,
    ifname: &str,
    table: Option<u32>,
    prev_ips: &[std::net::IpAddr],
) -> Result<(), SbrError> {
    let Some(path) = path else {
        log::info!("CNI_NETNS is empty: the namespace and its rules are gone");
        return Ok(());
    };
    let ns = match NetNs::open(path) {
        Ok(ns) => ns,
        // Missing, or no network namespace (a file, `/proc/self/status`, another kind of
        // namespace, a path with a trailing slash): no rule of ours can be in it.
        Err(e) if e.is_absent() => {
            log::info!("{e}: nothing to remove");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let mut c = Container::open(&ns)?;
    let rules = match table {
        Some(table) => c.rules(&format!("failed to list rules of table {table} to tidy"))?,
        None => c.rules("Failed to list all rules to tidy")?,
    };
    let link = c.link_index(ifname, &format!("Failed to get link {ifname}"))?;
    let seen = Observed {
        link_index: link,
        rules,
        routes: if table.is_some() {
            Vec::new()
        } else {
            c.routes("failed to list routes to tidy")?
        },
        addresses: c.addresses(link, "Failed to list all addrs")?,
    };
    let mut failures = Vec::new();
    let mut reference = None;
    for op in plan::plan_del(table, prev_ips, &seen) {
        if let Err(e) = c.run(&op) {
            if let Op::DelRule(_) = op {
                // The reference keeps going and returns its last rule failure, so worded.
                reference = Some(format!(
                    "Failed to delete rule {}",
                    cni::error::go_errno(&e.source)
                ));
            }
            failures.push(e.to_string());
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(SbrError::Del {
            ifname: ifname.to_owned(),
            failures,
            reference,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Runs `body` on a thread in a fresh network namespace holding veth `net1` (peer `peer1`)
    /// with `10.1.0.5/24` and `fd01::5/64`, a default route via `10.1.0.1` and one via
    /// `fd01::1`.
    fn in_container<T: Send>(body: impl FnOnce(NetNs) -> T + Send) -> T {
        host::netns::in_new_netns(|| {
            for cmd in [
                "link add net1 type veth peer name peer1",
                "link set peer1 up",
                "link set net1 up",
                "addr add 10.1.0.5/24 dev net1",
                "addr add fd01::5/64 dev net1 nodad",
                "route add default via 10.1.0.1",
                "-6 route add default via fd01::1",
            ] {
                ip(cmd);
            }
            body(NetNs::current().unwrap())
        })
        .expect("a fresh network namespace needs root")
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

    fn ipcfg(address: &str, gateway: &str) -> IpConfig {
        IpConfig {
            interface: None,
            address: address.parse().unwrap(),
            gateway: Some(gateway.parse().unwrap()),
        }
    }

    /// Every rule and route of the namespace, as `ip` prints them, sorted (the kernel may
    /// list IPv6 routes of one prefix in another order after they were re-added).
    fn state() -> Vec<String> {
        let mut lines: Vec<String> = [
            "rule",
            "-6 rule",
            "route show table all",
            "-6 route show table all",
        ]
        .map(ip)
        .iter()
        .flat_map(|out| out.lines().map(str::to_owned).collect::<Vec<_>>())
        .collect();
        lines.sort();
        lines
    }

    #[test]
    fn add_check_del_round_trip_leaves_the_namespace_as_it_was() {
        in_container(|ns| {
            let before = state();
            let ips = [
                ipcfg("10.1.0.5/24", "10.1.0.1"),
                ipcfg("fd01::5/64", "fd01::1"),
            ];
            let config = Config::default();
            add(&ns, "net1", &config, &ips, &[]).unwrap();
            assert!(ip("rule").contains("from 10.1.0.5 lookup 100"));
            assert!(ip("-6 rule").contains("from fd01::5 lookup 101"));
            assert_eq!(ip("route show dev net1"), "");
            assert!(ip("route show table 100").contains("default via 10.1.0.1 dev net1"));
            assert!(ip("-6 route show table 101").contains("default via fd01::1 dev net1"));
            check(&ns, "net1", &config, &ips, &[]).unwrap();
            // A second ADD changes nothing.
            let after_add = state();
            add(&ns, "net1", &config, &ips, &[]).unwrap();
            assert_eq!(state(), after_add);

            ip("route del default via 10.1.0.1 table 100");
            let err = check(&ns, "net1", &config, &ips, &[]).unwrap_err();
            assert_eq!(
                err.to_string(),
                "sbr CHECK of net1 failed: route \"default via 10.1.0.1 dev net1 table 100\" \
                 is missing"
            );
            // ADD again repairs it.
            add(&ns, "net1", &config, &ips, &[]).unwrap();
            check(&ns, "net1", &config, &ips, &[]).unwrap();
            del(Some(ns.path()), "net1", config.table, &[]).unwrap();
            assert_eq!(state(), before);
            del(Some(ns.path()), "net1", config.table, &[]).unwrap();
            assert_eq!(state(), before);
        });
    }

    #[test]
    fn a_failed_add_is_rolled_back() {
        in_container(|ns| {
            let before = state();
            // The second address's gateway is unreachable: its default route fails after the
            // first address's rule, table and the second rule are in place.
            let ips = [
                ipcfg("10.1.0.5/24", "10.1.0.1"),
                ipcfg("10.1.0.6/24", "192.0.2.1"),
            ];
            let err = add(&ns, "net1", &Config::default(), &ips, &[]).unwrap_err();
            assert!(err.to_string().contains("default via 192.0.2.1"), "{err}");
            assert!(
                matches!(err, SbrError::Add { ref undo, .. } if undo.is_empty()),
                "{err}"
            );
            // The reference's words for the step, the kernel's answer as Go prints it.
            assert_eq!(
                cni::error::CniError::from(err).msg,
                "Failed to add default route to 192.0.2.1: network is unreachable"
            );
            assert_eq!(state(), before);
        });
    }

    #[test]
    fn a_missing_interface_is_named_in_the_references_words_unless_a_table_is_fixed() {
        in_container(|ns| {
            let before = state();
            let ips = [ipcfg("10.1.0.5/24", "10.1.0.1")];
            let err = add(&ns, "nope0", &Config::default(), &ips, &[]).unwrap_err();
            let cni = cni::error::CniError::from(err);
            assert_eq!(cni.code.as_u32(), 3);
            assert_eq!(
                cni.msg,
                "Cannot find network interface nope0: Link not found"
            );
            assert_eq!(state(), before);
            // With `table` the reference never looks the interface up: the rule is added.
            let config = Config {
                table: Some(5000),
                ..Config::default()
            };
            add(&ns, "nope0", &config, &ips, &[]).unwrap();
            assert!(ip("rule").contains("from 10.1.0.5 lookup 5000"));
        });
    }

    #[test]
    fn concurrent_adds_into_one_namespace_get_distinct_tables() {
        in_container(|ns| {
            ip("link add net2 type veth peer name peer2");
            ip("link set net2 up");
            ip("addr add 10.2.0.5/24 dev net2");
            let path = ns.path().to_path_buf();
            std::thread::scope(|s| {
                for (ifname, address) in [("net1", "10.1.0.5/24"), ("net2", "10.2.0.5/24")] {
                    let path = path.clone();
                    s.spawn(move || {
                        // Each ADD opens the namespace itself, as separate processes would.
                        let ns = NetNs::open(&path).unwrap();
                        let ips = [ipcfg(address, "10.9.9.9")];
                        let ips = [IpConfig {
                            gateway: None,
                            ..ips[0].clone()
                        }];
                        add(&ns, ifname, &Config::default(), &ips, &[]).unwrap();
                    });
                }
            });
            let rules = ip("rule");
            let tables: Vec<&str> = rules
                .lines()
                .filter(|l| l.contains("from 10."))
                .filter_map(|l| l.split("lookup ").nth(1))
                .collect();
            assert_eq!(tables.len(), 2, "{rules}");
            assert_ne!(tables[0], tables[1], "{rules}");
        });
    }

    #[test]
    fn the_lock_is_the_namespace_itself_and_creates_no_file() {
        in_container(|ns| {
            let held = Container::open(&ns).unwrap();
            // Another opener of the same namespace (another path, same nsfs inode) waits.
            let other = NetNs::open("/proc/thread-self/ns/net").unwrap();
            let fd = other.as_fd().try_clone_to_owned().unwrap();
            let err = FileLock::acquire_file(
                File::from(fd),
                other.path().to_path_buf(),
                std::time::Duration::from_millis(50),
            )
            .unwrap_err();
            assert!(
                matches!(err, host::lock::LockError::Timeout { .. }),
                "{err}"
            );
            drop(held);
            Container::open(&other).unwrap();
        });
    }

    #[test]
    fn del_succeeds_without_a_namespace() {
        del(None, "net1", None, &[]).unwrap();
        del(
            Some(Path::new("/run/netns/sbr-no-such-ns")),
            "net1",
            None,
            &[],
        )
        .unwrap();
        assert!(!Path::new("/run/netns/sbr-no-such-ns").exists());
        // A regular file where the namespace was (the Go plugin leaves one) is no namespace,
        // nor is a path through it, a file of /proc or a namespace of another kind.
        let file = tempfile_path();
        std::fs::write(&file, b"").unwrap();
        let trailing = format!("{}/", file.display());
        for path in [
            file.to_str().unwrap(),
            &trailing,
            "/proc/self/status",
            "/proc/self/ns/uts",
        ] {
            del(Some(Path::new(path)), "net1", None, &[]).unwrap();
            del(Some(Path::new(path)), "net1", Some(254), &[]).unwrap();
        }
        std::fs::remove_file(&file).unwrap();
    }

    fn tempfile_path() -> std::path::PathBuf {
        std::env::temp_dir().join(format!("sbr-test-not-a-netns-{}", std::process::id()))
    }
}
