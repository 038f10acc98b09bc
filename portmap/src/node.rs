//! The host's side of a mapping, outside the backends' tables: UDP conntrack entries of the
//! mapped ports, `route_localnet` on the interface routing to the container, and the probes
//! (`PATH`, `/proc`) that spare a call an exec or a dump.
//!
//! `conntrack -D -p udp --dport N`, `sysctl -w net.ipv4.conf.<if>.route_localnet=1`.

use std::net::IpAddr;

use netfilter::conntrack::{Conntrack, FlowFilter};
use netfilter::nft::L4Proto;

use crate::config::{IpFamily, PortMapping};
use crate::error::PortmapError;
use crate::names;
use crate::plan;

/// Deletes UDP conntrack entries of the mapped host ports of `families`, so a flow a client
/// keeps sending is mapped anew (failures are only logged: the mappings are in place).
pub fn flush_udp(mappings: &[PortMapping], families: &[IpFamily]) {
    if conntrack_is_empty() {
        return;
    }
    let mut ct = None;
    for family in families {
        let targets = plan::udp_flush_targets(mappings, *family);
        if targets.is_empty() {
            continue;
        }
        if ct.is_none() {
            match Conntrack::new() {
                Ok(c) => ct = Some(c),
                Err(e) => {
                    log::warn!("failed to open conntrack: {e}");
                    return;
                }
            }
        }
        let Some(c) = ct.as_mut() else { return };
        for (port, daddr) in targets {
            let filter = FlowFilter {
                proto: L4Proto::Udp,
                dport: port,
                daddr,
            };
            if let Err(e) = c.delete((*family).into(), &filter) {
                log::warn!("failed to delete stale UDP conntrack entries for port {port}: {e}");
            }
        }
    }
}

/// Whether this namespace tracks no connection at all, so there is nothing to flush. Before
/// Linux 6.12 a flush is a filtered dump, which locks every bucket of the kernel's hash table,
/// shared by every namespace (about 10 ms here), even when this namespace has no entry. Without
/// the counter (no conntrack module) nothing can be tracked either.
fn conntrack_is_empty() -> bool {
    match std::fs::read_to_string(names::CONNTRACK_COUNT) {
        Ok(n) => n.trim() == "0",
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Sets `route_localnet` on the host interface routing to `ip`, as the reference does, so
/// that `127.0.0.1:hostPort` can be DNATed to the container. Where no interface routes to
/// `ip` (a later plugin or an agent installs the route, or policy routing reaches it), the
/// reference skips the setting and so does this: the mappings work without it.
///
/// # Errors
/// [`PortmapError::RouteLocalnet`] when the sysctl cannot be written.
pub fn enable_route_localnet(ip: IpAddr) -> Result<(), PortmapError> {
    let Some(ifname) = routing_interface(ip) else {
        return Ok(());
    };
    let err = |e: String| PortmapError::RouteLocalnet(e);
    let key = host::sysctl::SysctlKey::interface("ipv4", &ifname, "route_localnet")
        .map_err(|e| err(e.to_string()))?;
    host::sysctl::Sysctl::new(host::sysctl::PROC_SYS)
        .write(&key, "1")
        .map_err(|e| err(e.to_string()))
}

/// The name of the host interface the first route to `ip` goes through, if the host has one.
fn routing_interface(ip: IpAddr) -> Option<String> {
    let skip = |why: String| {
        log::info!("not setting route_localnet: {why}");
        None
    };
    let mut nl = match netlink::Netlink::new() {
        Ok(nl) => nl,
        Err(e) => return skip(e.to_string()),
    };
    let oif = match nl.route_get_oif(ip) {
        Ok(Some(oif)) => oif,
        Ok(None) => return skip(format!("no interface routes to {ip}")),
        Err(e) => return skip(e.to_string()),
    };
    match nl.link_by_index(oif) {
        Ok(link) => Some(link.name),
        Err(e) => skip(e.to_string()),
    }
}

/// Whether the legacy (`ip_tables`) `nat` table of `family` is loaded: then only its dump can
/// tell what it holds.
pub fn legacy_nat_loaded(family: IpFamily) -> bool {
    let names = match family {
        IpFamily::V4 => names::LEGACY_IPV4_TABLES,
        IpFamily::V6 => names::LEGACY_IPV6_TABLES,
    };
    std::fs::read_to_string(names).is_ok_and(|s| s.lines().any(|l| l == "nat"))
}

/// Whether `iptables-restore` and `iptables-save` are on `PATH`.
pub fn iptables_on_path() -> bool {
    ["iptables-restore", "iptables-save"]
        .iter()
        .all(|tool| netfilter::iptables::native::on_path(tool).is_some())
}

/// Whether the iptables tools are usable here, as the reference decides it (it runs
/// `iptables -t filter -S INPUT 1` on every call): `iptables-restore` and `iptables-save` are on
/// `PATH`, and their kernel side answers. Without exec where the answer can be read: nf_tables
/// (`nf_tables_answers`, on the call's socket) where they are `iptables-nft`; the `ip_tables`
/// module's `/proc/net/ip_tables_names` where they are the legacy tools. Where that file is
/// missing the module may just not be loaded yet (a fresh boot), and the reference's probe
/// would load it: then the tools themselves are asked (`legacy_probe`: `iptables-save -t
/// filter`, which loads it as the reference's `iptables` does), once per boot where the
/// module loads, on every call (as the reference) where it cannot.
pub fn iptables_usable(
    nf_tables_answers: impl FnOnce() -> bool,
    legacy_probe: impl FnOnce() -> bool,
) -> bool {
    use netfilter::iptables::native;
    tools_usable(
        iptables_on_path(),
        native::writes_nf_tables(netfilter::iptables::Family::V4),
        || std::path::Path::new(names::LEGACY_IPV4_TABLES).exists(),
        nf_tables_answers,
        legacy_probe,
    )
}

/// [`iptables_usable`]'s decision from what the host offers, each asked only when needed.
fn tools_usable(
    on_path: bool,
    nft_variant: bool,
    legacy_loaded: impl FnOnce() -> bool,
    nf_tables_answers: impl FnOnce() -> bool,
    legacy_probe: impl FnOnce() -> bool,
) -> bool {
    if !on_path {
        false
    } else if nft_variant {
        nf_tables_answers()
    } else {
        legacy_loaded() || legacy_probe()
    }
}

/// The reference's probe of the legacy tools, which loads the `ip_tables` module where the
/// kernel has it: `iptables-save -t filter` succeeds.
pub fn legacy_probe() -> bool {
    match netfilter::iptables::Iptables::new(netfilter::iptables::Family::V4).probe() {
        Ok(()) => true,
        Err(e) => {
            log::info!("the iptables tools do not work here: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_tools_whose_module_is_not_loaded_yet_are_probed_as_the_reference_does() {
        let never = || -> bool { panic!("asked") };
        // Legacy tools, module loaded: no exec.
        assert!(tools_usable(true, false, || true, never, never));
        // Not loaded yet: the probe decides (its run loads the module, as the reference's).
        assert!(tools_usable(true, false, || false, never, || true));
        assert!(!tools_usable(true, false, || false, never, || false));
        // iptables-nft: nf_tables answers, nothing is run.
        assert!(tools_usable(true, true, never, || true, never));
        assert!(!tools_usable(true, true, never, || false, never));
        // No tools: nothing else is asked.
        assert!(!tools_usable(false, false, never, never, never));
    }
}
