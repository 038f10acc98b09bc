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
//!   `CNI-HOSTPORT-SETMARK`, `CNI-HOSTPORT-MASQ` (`iptables-save -t nat`), written over
//!   nf_tables netlink where the tools are `iptables-nft`, else with `iptables-restore`.
//! - `net.ipv4.conf.<host if>.route_localnet = 1` when `snat` (IPv4); UDP conntrack entries of
//!   the mapped host ports are deleted on ADD and DEL (`conntrack -D -p udp --dport N`); see
//!   [`host`].
//! - state files under `/run/cni/portmap/`, and the iptables layout's host-port index beside
//!   them ([`state`]).
//!
//! Each verb reads its configuration ([`config`]), plans what to change from what the kernel
//! holds ([`plan`]) and leaves the change to a [`backend::PortmapBackend`]; DEL also removes
//! what the Go plugin made for the attachment ([`leftovers`]).

pub mod backend;
pub mod config;
pub mod error;
pub mod leftovers;
pub mod names;
pub mod node;
pub mod plan;
pub mod state;

use cni::conf::NetConf;
use cni::error::{CniError, ErrorCode};
use cni::skel::{Call, Plugin};
use cni::types::CniResult;

use crate::config::{Backend, Config, IpFamily, PortmapKeys};
use crate::error::PortmapError;
use crate::plan::Attachment;
use crate::state::State;
use netfilter::nft::LazyNft;

/// The plugin.
#[derive(Debug, Clone, Copy)]
pub struct Portmap;

struct Loaded {
    config: Config,
    prev: Option<CniResult>,
    att: Attachment,
}

/// The configuration, as the reference's `parseConfig` reads it: decoded, its prevResult
/// parsed, then validated, each failure worded as the reference words it for the verb.
fn load(call: &Call) -> Result<Loaded, CniError> {
    let worded = |e: CniError| error::config_error(call.command, e);
    let decode = |e: CniError| worded(config::decode_error(e));
    let conf: NetConf<PortmapKeys> = call.conf().map_err(decode)?;
    let prev = config::prev_result(&conf).map_err(worded)?;
    let config = config::parse(&conf).map_err(|e| match e.code {
        ErrorCode::Decode => decode(e),
        _ => worded(e),
    })?;
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

fn add(call: &Call) -> Result<CniResult, CniError> {
    let Loaded { config, prev, att } = load(call)?;
    let prev = error::require_prev(prev, call.command)?;
    let ips = plan::mapped_ips(&config, &prev, &call.ifname);
    if ips.is_empty() {
        return Ok(prev);
    }
    let mut nft = LazyNft::new();
    let kind = backend::select(&config, &mut nft);
    let mut be = backend::open(kind, nft);
    let store = state::store()?;
    let file = state::file(&att);
    // What identifies the owner's namespace, to tell later whether it is gone (opened, never
    // entered for work: a socket made inside tells its cookie).
    let netns = call.netns.as_deref().and_then(state::NetnsId::of);
    let mut new = State::new(kind, &config, &att, &ips, netns);
    // An earlier version's record may be under another name; ours replaces it.
    let state::Located {
        file: old_file,
        record: old,
    } = state::locate(&store, &att)?;
    let old = old.found();
    let index = state::PortIndex::new(&store);
    match &old {
        // A re-ADD of the same: what the kernel recorded for it still holds.
        Some(old) if old.same_as(&new) => new.iptables_rules.clone_from(&old.iptables_rules),
        // A re-ADD with other mappings: drop the old ones first so none is left unowned.
        Some(old) => {
            backend::remove(&mut be, old)?;
            index.release(&att, &old.port_keys());
        }
        None => {}
    }
    // The iptables layout's ADD holds our lock from its conflict check to its index entries.
    let _lock = match kind {
        Backend::Iptables => Some(backend::iptables::lock()?),
        Backend::Nftables => None,
    };
    // Our map layout is found by its record before it is made (its owner comments tell the
    // rest); the iptables layout by its chain name, so its record is written once, after the
    // commit, with the handles of its entry rules (an inode costs a millisecond on an ext4
    // `/run`).
    if kind == Backend::Nftables {
        state::write(&store, &file, &new)?;
    }
    // Whether the kernel objects were made, and must be removed when what follows fails.
    let mut made = false;
    let result = be
        .add(&att, &config, &ips, &state::Records::new(&store))
        .inspect(|_| made = true)
        .and_then(|added| {
            match ips.iter().find(|ip| ip.addr().is_ipv4()) {
                Some(ip) if config.snat => node::enable_route_localnet(ip.addr())?,
                _ => {}
            }
            Ok(added)
        })
        .and_then(|added| {
            state::forget_taken(&store, &added.taken);
            if !added.recorded.is_empty() {
                new.iptables_rules
                    .retain(|r| added.recorded.iter().all(|a| a.family != r.family));
                new.iptables_rules.extend(added.recorded);
            }
            if kind == Backend::Iptables && (old.as_ref() != Some(&new) || old_file != file) {
                state::write(&store, &file, &new)?;
            }
            // Under the lock, in the step that made the claim: the index names this ADD for
            // each key it now holds.
            if kind == Backend::Iptables {
                index.claim(&file, &new)?;
            }
            Ok(())
        });
    if let Err(e) = result {
        if made && let Err(e) = backend::remove(&mut be, &new) {
            log::warn!("rollback after a failed ADD failed: {e}");
        }
        index.release(&att, &new.port_keys());
        if let Err(e) = state::remove_record(&store, &att) {
            log::warn!("failed to remove state after a failed ADD: {e}");
        }
        store.prune();
        return Err(e.into());
    }
    // The record of an earlier version, now under the attachment's own name.
    if old_file != file
        && let Err(e) = store.remove(&old_file)
    {
        log::warn!("failed to remove the earlier record {old_file}: {e}");
    }
    node::flush_udp(&config.mappings, &plan::families(&ips));
    Ok(prev)
}

fn check(call: &Call) -> Result<(), CniError> {
    let Loaded { config, prev, att } = load(call)?;
    let prev = error::require_prev(prev, call.command)?;
    if config.mappings.is_empty() {
        return Ok(());
    }
    let ips = plan::mapped_ips(&config, &prev, &call.ifname);
    if ips.is_empty() {
        return Ok(());
    }
    let recorded = state::locate(&state::store()?, &att)?.record.found();
    let mut nft = LazyNft::new();
    // The backend that made it, when we did; else what ADD would pick (the Go plugin's
    // default, iptables, where its tools work).
    let kind = match &recorded {
        Some(s) => s.backend,
        None => backend::select(&config, &mut nft),
    };
    backend::open(kind, nft).check(&att, &config, &ips, recorded.as_ref())?;
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
    let record = state::locate(&store, &att)?.record;
    // A discarded record leaves only the kernel's owner comments to find the objects by.
    let discarded = matches!(record, state::Record::Discarded);
    let found = if discarded {
        backend::Unrecorded::Listing
    } else if mappings.is_empty() {
        backend::Unrecorded::Nowhere
    } else {
        backend::Unrecorded::Keys(&mappings)
    };
    let recorded = record.found();
    let mut nft = LazyNft::new();
    let mut errors = backend::del(&mut nft, &att, recorded.as_ref(), found);
    // Then the Go plugin's objects of this attachment (upgrades from the Go plugin): reads,
    // and a commit only when it has some.
    let iptables_done = recorded
        .as_ref()
        .is_some_and(|r| r.backend == Backend::Iptables);
    errors.extend(leftovers::remove(&mut nft, &att, iptables_done));
    match &recorded {
        Some(record) => node::flush_udp(&record.mappings, &record.families()),
        None => node::flush_udp(&mappings, &IpFamily::BOTH),
    }
    // The record goes once its objects are gone (also without a record: an ADD killed before
    // the rename of its state file leaves the temporary file, which this removes). A store
    // that cannot be written fails the DEL only now, the kernel objects already removed.
    if errors.is_empty() {
        let keys = match &recorded {
            Some(record) => record.port_keys(),
            None => IpFamily::BOTH
                .iter()
                .flat_map(|f| plan::PortKey::of(&mappings, *f))
                .collect(),
        };
        state::PortIndex::new(&store).release(&att, &keys);
        match state::remove_record(&store, &att) {
            Ok(_) => {
                // Without its record the index entries naming it are found by their dead target.
                if discarded {
                    state::PortIndex::new(&store).sweep();
                }
                store.prune();
            }
            Err(e) => errors.push(e),
        }
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
    let mut nft = LazyNft::new();
    let kind = backend::select(&config, &mut nft);
    let errors = backend::gc(nft, kind, &state::store()?, &conf.name, &valid);
    if errors.is_empty() {
        return Ok(());
    }
    Err(error::joined(errors))
}

fn status(call: &Call) -> Result<(), CniError> {
    let conf: NetConf<PortmapKeys> = call.conf()?;
    let config = config::parse(&conf)?;
    let mut nft = LazyNft::new();
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
        cni::version::ALL
    }

    // Works in the plugin's own namespace: the skel does not open `CNI_NETNS`; ADD opens it
    // only to record what identifies it (`state::NetnsId`).
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
