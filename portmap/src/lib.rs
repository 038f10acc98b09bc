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
//!   the mapped host ports are deleted on ADD and DEL (`conntrack -D -p udp --dport N`); see
//!   [`host`].
//! - state files under `/run/cni/portmap/` ([`state`]).
//!
//! Each verb reads its configuration ([`config`]), plans what to change from what the kernel
//! holds ([`plan`]) and leaves the change to a [`backend::PortmapBackend`]; DEL also removes
//! what the Go plugin made for the attachment ([`leftovers`]).

pub mod backend;
pub mod config;
pub mod error;
pub mod host;
pub mod leftovers;
pub mod names;
pub mod plan;
pub mod state;

use common::conf::NetConf;
use common::error::CniError;
use common::skel::{Call, Command, Plugin};
use common::types::CniResult;
use ipnet::IpNet;

use crate::backend::NftSocket;
use crate::config::{Backend, Config, IpFamily, PortmapKeys};
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

/// prevResult, which ADD and CHECK need: the reference's message for each verb.
fn require_prev(prev: Option<CniResult>, verb: Command) -> Result<CniResult, CniError> {
    prev.ok_or_else(|| {
        let msg = match verb {
            Command::Add => "must be called as chained plugin",
            _ => "Required prevResult missing",
        };
        CniError::invalid_config(msg).with_details("the config has no prevResult")
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

fn families(ips: &[IpNet]) -> Vec<IpFamily> {
    ips.iter().map(|ip| IpFamily::of(ip.addr())).collect()
}

fn add(call: &Call) -> Result<CniResult, CniError> {
    let Loaded { config, prev, att } = load(call)?;
    let prev = require_prev(prev, call.command)?;
    let ips = mapped_ips(&config, &prev, &call.ifname);
    if ips.is_empty() {
        return Ok(prev);
    }
    let mut nft = NftSocket::default();
    let kind = backend::select(&config, &mut nft);
    let mut be = backend::open(kind, nft);
    let store = state::store()?;
    let file = state::file(&att);
    // The owner's namespace, to tell later whether it is gone (stat only: never opened).
    let netns = call.netns.as_deref().and_then(state::NetnsId::of);
    let new = State::new(kind, &config, &att, &ips, netns);
    if let Some(old) = state::read(&store, &file)?.found().filter(|o| *o != new) {
        // A re-ADD with other mappings: drop the old ones first so none is left unowned.
        backend::remove(&mut be, &old)?;
    }
    state::write(&store, &file, &new)?;
    let result = be
        .add(&att, &config, &ips, &state::Records(&store))
        .and_then(|taken| {
            match ips.iter().find(|ip| ip.addr().is_ipv4()) {
                Some(ip) if config.snat => {
                    host::enable_route_localnet(ip.addr()).inspect_err(|_| {
                        if let Err(e) = backend::remove(&mut be, &new) {
                            log::warn!("rollback after a failed ADD failed: {e}");
                        }
                    })?
                }
                _ => {}
            }
            Ok(taken)
        });
    match result {
        Ok(taken) => state::forget_taken(&store, &taken),
        Err(e) => {
            if let Err(e) = store.remove(&file) {
                log::warn!("failed to remove state after a failed ADD: {e}");
            }
            state::prune(&store);
            return Err(e.into());
        }
    }
    host::flush_udp(&config.mappings, &families(&ips));
    Ok(prev)
}

fn check(call: &Call) -> Result<(), CniError> {
    let Loaded { config, prev, att } = load(call)?;
    let prev = require_prev(prev, call.command)?;
    if config.mappings.is_empty() {
        return Ok(());
    }
    let ips = mapped_ips(&config, &prev, &call.ifname);
    if ips.is_empty() {
        return Ok(());
    }
    let recorded = state::read(&state::store()?, &state::file(&att))?.found();
    let mut nft = NftSocket::default();
    // The backend that made it, when we did; else what ADD would pick (the Go plugin's
    // default, iptables, where its tools work).
    let kind = match recorded {
        Some(s) => s.backend,
        None => backend::select(&config, &mut nft),
    };
    backend::open(kind, nft).check(&att, &config, &ips)?;
    Ok(())
}

fn del(call: &Call) -> Result<(), CniError> {
    // Only what DEL needs: a container made before an upgrade, or with a config that changed
    // since, must still be deletable.
    let conf: NetConf<serde::de::IgnoredAny> = call.conf()?;
    let mappings = config::del_mappings(&conf);
    let att = Attachment {
        network: conf.name,
        container_id: call.container_id.clone(),
        ifname: call.ifname.clone(),
    };
    let store = state::store()?;
    let file = state::file(&att);
    let record = state::read(&store, &file)?;
    // A discarded record leaves only the kernel's owner comments to find the objects by.
    let list = matches!(record, state::Record::Discarded) || !mappings.is_empty();
    let recorded = record.found();
    let mut errors: Vec<PortmapError> = Vec::new();
    // Our own objects first. A commit that deletes nf_tables objects makes the kernel free
    // them after an RCU grace period, and the last close of the call's socket, at exit, waits
    // for that: the rest of this DEL overlaps it.
    let mut nft = NftSocket::default();
    match &recorded {
        Some(record) => {
            let mut be = backend::open(record.backend, nft);
            if let Err(e) = be.del(record) {
                errors.push(e);
            }
            nft = be.into_socket();
        }
        None if list && nft.get().is_ok() => {
            // No record (made by the Go plugin, or the state was lost): find ours by owner.
            let mut be = backend::open(Backend::Nftables, nft);
            if let Err(e) = be.del_unrecorded(&att) {
                errors.push(e);
            }
            nft = be.into_socket();
        }
        None => {}
    }
    // Then the Go plugin's objects of this attachment (upgrades from the Go plugin): reads,
    // and a commit only when it has some.
    let iptables_done = recorded
        .as_ref()
        .is_some_and(|r| r.backend == Backend::Iptables);
    errors.extend(leftovers::remove(&mut nft, &att, iptables_done));
    // Also without a record: an ADD killed before the rename of its state file leaves the
    // temporary file, which this removes.
    if errors.is_empty() {
        store.remove(&file).map_err(PortmapError::Store)?;
        state::prune(&store);
    }
    match &recorded {
        Some(record) => host::flush_udp(&record.mappings, &record.families()),
        None => host::flush_udp(&mappings, &IpFamily::BOTH),
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(error::joined(errors))
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
    let mut nft = NftSocket::default();
    let kind = backend::select(&config, &mut nft);
    let mut be = backend::open(Backend::Nftables, nft);
    // Recorded attachments first: they also cover owners too long to parse back.
    let store = state::store()?;
    for name in store.list().map_err(PortmapError::Store)? {
        let Ok(Some(st)) = state::read(&store, &name).map(state::Record::found) else {
            continue;
        };
        if st.network != conf.name || live(&st.container_id, &st.ifname) {
            continue;
        }
        match backend::remove(&mut be, &st) {
            Ok(()) => {
                let _ = store.remove(&name);
            }
            Err(e) => errors.push(e),
        }
    }
    state::prune(&store);
    let mut nft = be.into_socket();
    if nft.get().is_ok() {
        let mut be = backend::open(Backend::Nftables, nft);
        if let Err(e) = be.gc(&conf.name, &valid) {
            errors.push(e);
        }
        nft = be.into_socket();
    }
    if kind == Backend::Iptables
        && let Err(e) = backend::open(Backend::Iptables, nft).gc(&conf.name, &valid)
    {
        errors.push(e);
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(error::joined(errors))
}

fn status(call: &Call) -> Result<(), CniError> {
    let conf: NetConf<PortmapKeys> = call.conf()?;
    let config = config::parse(&conf)?;
    let mut nft = NftSocket::default();
    let kind = backend::select(&config, &mut nft);
    backend::open(kind, nft)
        .status()
        .map_err(|e| PortmapError::Unavailable(e.to_string()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_check_without_prev_result_give_the_references_messages() {
        let add = require_prev(None, Command::Add).unwrap_err();
        assert_eq!(
            (add.code.as_u32(), add.msg.as_str()),
            (7, "must be called as chained plugin")
        );
        let check = require_prev(None, Command::Check).unwrap_err();
        assert_eq!(
            (check.code.as_u32(), check.msg.as_str()),
            (7, "Required prevResult missing")
        );
    }
}
