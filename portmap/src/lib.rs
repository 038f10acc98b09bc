//! `portmap`: forwards host ports to a container (DNAT), with masquerading for hairpin and
//! localhost traffic, as a chained CNI plugin. A drop-in for the reference plugin; see
//! `portmap/README.md`.
//!
//! Verbs: ADD programs the mappings of `runtimeConfig.portMappings` for the container addresses
//! of `prevResult`; CHECK verifies exactly them; DEL removes them (also without
//! `runtimeConfig`/`prevResult`, and the Go plugin's rules of the attachment); GC removes those of
//! attachments not in `cni.dev/valid-attachments`; STATUS probes the backend.
//!
//! Kernel objects:
//! - nftables backend (default): tables `ip cni_portmap` / `ip6 cni_portmap` with maps
//!   `ports`, `hostip_ports`, `gated_ports`, `gated_hostip_ports`, sets `hairpin`,
//!   `localhost`, `masq_all` and chains `prerouting`, `output`, `postrouting`, `hostports`,
//!   `gate_<hash>` (`nft list table ip cni_portmap`); elements are commented
//!   `network/containerID/ifname`.
//! - iptables backend: the reference's `nat` chains `CNI-HOSTPORT-DNAT`, `CNI-DN-<hash>`,
//!   `CNI-HOSTPORT-SETMARK`, `CNI-HOSTPORT-MASQ` (`iptables-save -t nat`).
//! - `net.ipv4.conf.<host if>.route_localnet = 1` when `snat` (IPv4); UDP conntrack entries of
//!   the mapped host ports are deleted on ADD and DEL (`conntrack -D -p udp --dport N`).
//! - state files under `/run/cni/portmap/`.

pub mod backend;
pub mod config;
pub mod error;
pub mod names;
pub mod plan;
pub mod state;

use common::conf::NetConf;
use common::conntrack::{Conntrack, FlowFilter};
use common::error::{CniError, ErrorCode};
use common::nft::Nft;
use common::skel::{Call, Plugin};
use common::types::CniResult;
use ipnet::IpNet;

use crate::backend::{iptables, nftables};
use crate::config::{Backend, BackendChoice, Config, IpFamily, PortmapKeys};
use crate::error::PortmapError;
use crate::plan::Attachment;
use crate::state::State;

/// The plugin.
#[derive(Debug, Clone, Copy)]
pub struct Portmap;

struct Loaded {
    config: Config,
    prev: Option<CniResult>,
    att: Attachment,
}

fn load(call: &Call) -> Result<Loaded, CniError> {
    let conf: NetConf<PortmapKeys> = call.conf()?;
    let config = config::parse(&conf)?;
    let prev = conf.prev_result()?;
    Ok(Loaded {
        att: Attachment {
            network: conf.name.clone(),
            container_id: call.container_id.clone(),
            ifname: call.ifname.clone(),
        },
        config,
        prev,
    })
}

fn require_prev(prev: Option<CniResult>) -> Result<CniResult, CniError> {
    prev.ok_or_else(|| {
        CniError::invalid_config("must be called as a chained plugin: prevResult is missing")
    })
}

/// The container addresses of families that have mappings.
fn mapped_ips(config: &Config, prev: &CniResult, ifname: &str) -> Vec<IpNet> {
    let (v4, v6) = config::container_ips(prev, ifname);
    [v4, v6]
        .into_iter()
        .flatten()
        .filter(|ip| plan::has_mappings_for(config, IpFamily::of(ip.addr())))
        .collect()
}

fn nft_handle() -> Result<Nft, PortmapError> {
    Nft::new().map_err(PortmapError::Nft)
}

/// One nf_tables socket per call, opened on first use. Closing a socket of this family while
/// the kernel still frees objects of a commit that deleted some waits for an RCU grace period
/// (several milliseconds), so a call keeps its socket until it exits instead of reopening one.
#[derive(Default)]
struct NftCell(Option<Nft>);

impl NftCell {
    fn get(&mut self) -> Result<&mut Nft, PortmapError> {
        let nft = match self.0.take() {
            Some(n) => n,
            None => nft_handle()?,
        };
        Ok(self.0.insert(nft))
    }
}

/// The backend to use: the configured one, or for auto iptables when iptables-only options are
/// set, else nftables when nf_tables answers.
fn resolve(config: &Config) -> Backend {
    match config.backend {
        BackendChoice::Fixed(b) => b,
        BackendChoice::Auto => {
            let ipt_only = config.external_set_mark_chain.is_some()
                || matches!(config.conditions_v4, config::Conditions::Iptables(_))
                || matches!(config.conditions_v6, config::Conditions::Iptables(_));
            if ipt_only {
                return Backend::Iptables;
            }
            let usable = Nft::new()
                .and_then(|mut n| nftables::table_exists(&mut n, IpFamily::V4))
                .is_ok();
            if usable {
                Backend::Nftables
            } else {
                log::info!("nf_tables is not usable here: using the iptables backend");
                Backend::Iptables
            }
        }
    }
}

/// Deletes UDP conntrack entries of the mapped host ports (failures are only logged: the
/// mappings themselves are in place).
fn flush_udp(config: &Config, families: &[IpFamily]) {
    if conntrack_is_empty() {
        return;
    }
    let mut ct = None;
    for family in families {
        let targets = plan::udp_flush_targets(config, *family);
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
                proto: common::nft::L4Proto::Udp,
                dport: port,
                daddr,
            };
            if let Err(e) = c.delete(plan::nfproto(*family), &filter) {
                log::warn!("failed to delete stale UDP conntrack entries for port {port}: {e}");
            }
        }
    }
}

/// Whether this namespace tracks no connection at all, so there is nothing to flush. A
/// conntrack dump walks the kernel's whole hash table, shared by every namespace (several
/// milliseconds), even when this namespace has no entry. Without the counter (no conntrack
/// module) nothing can be tracked either.
fn conntrack_is_empty() -> bool {
    match std::fs::read_to_string(names::CONNTRACK_COUNT) {
        Ok(n) => n.trim() == "0",
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Sets `route_localnet` on the host interface routing to `ip`, as the reference does.
fn enable_route_localnet(ip: std::net::IpAddr) -> Result<(), PortmapError> {
    let err = |e: String| PortmapError::RouteLocalnet(e);
    let mut nl = common::netlink::Netlink::new().map_err(|e| err(e.to_string()))?;
    let oif = nl
        .route_get_oif(ip)
        .map_err(|e| err(e.to_string()))?
        .ok_or_else(|| err(format!("no interface routes to {ip}")))?;
    let link = nl.link_by_index(oif).map_err(|e| err(e.to_string()))?;
    let key = common::sysctl::SysctlKey::interface("ipv4", &link.name, "route_localnet")
        .map_err(|e| err(e.to_string()))?;
    common::sysctl::Sysctl::new(common::sysctl::PROC_SYS)
        .write(&key, "1")
        .map_err(|e| err(e.to_string()))
}

fn families(ips: &[IpNet]) -> Vec<IpFamily> {
    ips.iter().map(|ip| IpFamily::of(ip.addr())).collect()
}

fn add(call: &Call) -> Result<CniResult, CniError> {
    let Loaded { config, prev, att } = load(call)?;
    let prev = require_prev(prev)?;
    if config.mappings.is_empty() {
        return Ok(prev);
    }
    let ips = mapped_ips(&config, &prev, &call.ifname);
    if ips.is_empty() {
        return Ok(prev);
    }
    let backend = resolve(&config);
    let store = state::store()?;
    let file = state::file(&att);
    let old: Option<State> = store.read(&file).map_err(PortmapError::Store)?;
    let new = State::new(backend, &config, &att, &ips);
    let mut nft = NftCell::default();
    if let Some(old) = old.as_ref().filter(|o| **o != new) {
        // A re-ADD with other mappings: drop the old ones first so none is left unowned.
        remove(&mut nft, &config, old)?;
    }
    state::write(&store, &file, &new)?;
    let result = match backend {
        Backend::Nftables => nft
            .get()
            .and_then(|n| nftables::add(n, &config, &att, &ips)),
        Backend::Iptables => iptables::add(&config, &att.container_id, &ips),
    }
    .and_then(|()| {
        let v4 = ips.iter().find(|ip| ip.addr().is_ipv4());
        match v4 {
            Some(ip) if config.snat => enable_route_localnet(ip.addr()).inspect_err(|_| {
                if let Err(e) = remove(&mut nft, &config, &new) {
                    log::warn!("rollback after a failed ADD failed: {e}");
                }
            }),
            _ => Ok(()),
        }
    });
    if let Err(e) = result {
        if let Err(e) = store.remove(&file) {
            log::warn!("failed to remove state after a failed ADD: {e}");
        }
        state::prune(&store);
        return Err(e.into());
    }
    flush_udp(&config, &families(&ips));
    Ok(prev)
}

/// Removes what `state` records.
fn remove(nft: &mut NftCell, config: &Config, state: &State) -> Result<(), PortmapError> {
    let recorded = state.apply_to(config);
    let att = state.attachment();
    match state.backend {
        Backend::Nftables => nftables::del_planned(nft.get()?, &recorded, &att, &state.ips),
        Backend::Iptables => {
            iptables::del(&state.network, &state.container_id, &families(&state.ips))
        }
    }
}

fn check(call: &Call) -> Result<(), CniError> {
    let Loaded { config, prev, att } = load(call)?;
    let prev = require_prev(prev)?;
    if config.mappings.is_empty() {
        return Ok(());
    }
    let ips = mapped_ips(&config, &prev, &call.ifname);
    if ips.is_empty() {
        return Ok(());
    }
    // The backend that made it, when we did; else what ADD would pick.
    let recorded: Option<State> = state::store()?
        .read(&state::file(&att))
        .map_err(PortmapError::Store)?;
    let backend = match recorded {
        Some(s) => s.backend,
        // Made by the Go plugin with its default (iptables) backend: check that layout.
        None if config.backend == BackendChoice::Auto
            && nft_handle().is_ok_and(|mut n| {
                let chain = names::dnat_chain(&att.network, &att.container_id);
                ips.iter()
                    .any(|ip| go_iptables_chain_may_exist(&mut n, IpFamily::of(ip.addr()), &chain))
            }) =>
        {
            Backend::Iptables
        }
        None => resolve(&config),
    };
    match backend {
        Backend::Nftables => nftables::check(&mut nft_handle()?, &config, &att, &ips)?,
        Backend::Iptables => iptables::check(&config, &att.container_id, &ips)?,
    }
    Ok(())
}

/// Whether the Go plugin's iptables chain of this attachment may exist in `family`, found
/// without exec: iptables-nft keeps its `nat` table in nf_tables; the legacy tools leave
/// `nat` in `/proc/net/ip*_tables_names` (then only the dump can tell, so say yes).
fn go_iptables_chain_may_exist(nft: &mut Nft, family: IpFamily, chain: &str) -> bool {
    let table = common::nft::Table::new(
        match family {
            IpFamily::V4 => common::nft::Family::Ip,
            IpFamily::V6 => common::nft::Family::Ip6,
        },
        "nat",
    );
    let in_nft = nft.chain_exists(&table, chain).unwrap_or(false);
    let names = match family {
        IpFamily::V4 => "/proc/net/ip_tables_names",
        IpFamily::V6 => "/proc/net/ip6_tables_names",
    };
    let legacy = std::fs::read_to_string(names).is_ok_and(|s| s.lines().any(|l| l == "nat"));
    in_nft || legacy
}

fn del(call: &Call) -> Result<(), CniError> {
    let Loaded { config, att, .. } = load(call)?;
    let store = state::store()?;
    let file = state::file(&att);
    let recorded: Option<State> = store.read(&file).map_err(PortmapError::Store)?;
    let mut errors: Vec<PortmapError> = Vec::new();
    let mut nft = NftCell::default();
    // Our own elements first. A commit that deletes nf_tables objects makes the kernel free
    // them after an RCU grace period, and the socket's last close waits for that: the rest of
    // this DEL overlaps it, and the socket is finally handed to a detached holder
    // (`common::linger`) so that the plugin's exit does not wait.
    let mut flushed = config.clone();
    // Whether a commit deleted nf_tables objects, so the socket's last close would wait.
    let mut deleted_nft = false;
    match &recorded {
        Some(state) => {
            match remove(&mut nft, &config, state) {
                Ok(()) => deleted_nft = state.backend == Backend::Nftables,
                Err(e) => errors.push(e),
            }
            flushed = state.apply_to(&config);
        }
        None if !config.mappings.is_empty() => {
            // No record (made by the Go plugin, or the state was lost): find ours by owner.
            let owner = att.owner();
            match nft.get() {
                Ok(n) => match nftables::del_listed(n, &|c| c == owner) {
                    Ok(count) => deleted_nft = count > 0,
                    Err(e) => errors.push(e),
                },
                Err(e) => log::debug!("nftables not usable for DEL: {e}"),
            }
        }
        None => {}
    }
    // Then the Go plugin's rules of this attachment (upgrades from the Go plugin): reads,
    // and a commit only when it has some.
    if recorded
        .as_ref()
        .is_none_or(|s| s.backend != Backend::Iptables)
    {
        // The Go plugin's iptables chain of this attachment (upgrade from the Go plugin).
        let chain = names::dnat_chain(&att.network, &att.container_id);
        let fams: Vec<IpFamily> = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter(|f| {
                nft.get()
                    .map_or(true, |n| go_iptables_chain_may_exist(n, *f, &chain))
            })
            .collect();
        if !fams.is_empty()
            && let Err(e) = iptables::del(&att.network, &att.container_id, &fams)
        {
            errors.push(e);
        }
    }
    if let Ok(n) = nft.get()
        && let Err(e) = nftables::del_go_rules(n, &att.container_id)
    {
        errors.push(e);
    }
    // Also without a record: an ADD killed before the rename of its state file leaves the
    // temporary file, which this removes.
    if errors.is_empty() {
        store.remove(&file).map_err(PortmapError::Store)?;
        state::prune(&store);
    }
    if let Some(state) = &recorded {
        flush_udp(&flushed, &families(&state.ips));
    } else if !config.mappings.is_empty() {
        flush_udp(&config, &[IpFamily::V4, IpFamily::V6]);
    }
    if deleted_nft
        && let Some(n) = &nft.0
        && let Err(e) = common::linger::hand_off(n)
    {
        // Then the last close, at exit, waits for the kernel to free the deleted elements.
        log::debug!("closing the nf_tables socket at exit: {e}");
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(joined(errors))
}

/// The failures of a DEL or GC as one error: with the code they share (11 when our lock
/// stayed held, so the runtime retries), else 999.
fn joined(errors: Vec<PortmapError>) -> CniError {
    let msg: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let codes: Vec<ErrorCode> = errors.into_iter().map(|e| CniError::from(e).code).collect();
    let code = match codes.split_first() {
        Some((first, rest)) if rest.iter().all(|c| c == first) => *first,
        _ => ErrorCode::Internal,
    };
    CniError::new(code, msg.join("; "))
}

fn gc(call: &Call) -> Result<(), CniError> {
    let conf: NetConf<PortmapKeys> = call.conf()?;
    let config = config::parse(&conf)?;
    let valid = conf.valid_attachments.clone().unwrap_or_default();
    let live = |id: &str, ifname: &str| {
        valid
            .iter()
            .any(|a| a.container_id == id && a.ifname == ifname)
    };
    let mut errors: Vec<PortmapError> = Vec::new();
    let mut nft = NftCell::default();
    // Recorded attachments first: they also cover owners too long to parse back.
    let store = state::store()?;
    for name in store.list().map_err(PortmapError::Store)? {
        let Ok(Some(st)) = store.read::<State>(&name) else {
            continue;
        };
        if st.network != conf.name || live(&st.container_id, &st.ifname) {
            continue;
        }
        match remove(&mut nft, &config, &st) {
            Ok(()) => {
                let _ = store.remove(&name);
            }
            Err(e) => errors.push(e),
        }
    }
    state::prune(&store);
    if let Ok(n) = nft.get() {
        let doomed = |comment: &str| {
            names::parse_owner(comment)
                .is_some_and(|(net, id, ifname)| net == conf.name && !live(id, ifname))
        };
        if let Err(e) = nftables::del_listed(n, &doomed) {
            errors.push(e);
        }
    }
    if resolve(&config) == Backend::Iptables {
        let ids: Vec<String> = valid.iter().map(|a| a.container_id.clone()).collect();
        if let Err(e) = iptables::gc(&conf.name, &ids) {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(joined(errors))
}

fn status(call: &Call) -> Result<(), CniError> {
    let conf: NetConf<PortmapKeys> = call.conf()?;
    let config = config::parse(&conf)?;
    let unavailable = |e: PortmapError| PortmapError::Unavailable(e.to_string());
    match resolve(&config) {
        Backend::Nftables => {
            let mut nft = nft_handle().map_err(unavailable)?;
            nftables::table_exists(&mut nft, IpFamily::V4)
                .map_err(|e| unavailable(PortmapError::Nft(e)))?;
        }
        Backend::Iptables => iptables::status().map_err(unavailable)?,
    }
    Ok(())
}

impl Plugin for Portmap {
    fn name(&self) -> &'static str {
        "portmap"
    }

    fn supported_versions(&self) -> &'static [&'static str] {
        common::version::ALL
    }

    // Works in the plugin's own namespace: `CNI_NETNS` is never opened, not even by the skel.
    fn uses_netns(&self) -> bool {
        false
    }

    fn add(&self, call: &Call) -> Result<CniResult, CniError> {
        add(call)
    }

    fn check(&self, call: &Call) -> Result<(), CniError> {
        check(call)
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        del(call)
    }

    fn status(&self, call: &Call) -> Result<(), CniError> {
        status(call)
    }

    fn gc(&self, call: &Call) -> Result<(), CniError> {
        gc(call)
    }
}
