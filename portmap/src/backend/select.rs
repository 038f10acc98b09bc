//! Which backend a call gets ([`select`]: the configured one, or auto's choice from what the
//! node offers), and the verbs that go through the backend that made a record, whichever the
//! call's configuration selects ([`add`], [`del`], [`gc`]).

use cni::Attachment;
use cni::conf::GcAttachment as Valid;
use host::store::StateStore;
use ipnet::IpNet;
use netfilter::nft::LazyNft;

use super::nftables::{self, NftSupport};
use super::{Add, Earlier, PortmapBackend, Unrecorded, iptables};
use crate::config::{Backend, BackendChoice, Config, IpFamily, PortMapping};
use crate::error::PortmapError;
use crate::node;
use crate::ports;
use crate::state::{self, NetnsId, State};

/// Whether nf_tables answers here: the call's socket opens and a table lookup is answered
/// (found or not).
pub fn nft_answers(nft: &mut LazyNft) -> bool {
    nft.get()
        .and_then(|n| n.table_exists(&nftables::table(IpFamily::V4)))
        .is_ok()
}

/// What the iptables tools offer here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IptablesTools {
    /// The tools and their kernel side answer ([`node::iptables_usable`]).
    pub usable: bool,
    /// `iptables-restore` and `iptables-save` are on `PATH` (the legacy ones may still need
    /// their module loaded, which their first run does).
    pub on_path: bool,
}

/// The backend the configuration selects: the configured one; for auto (no `backend`,
/// `null` or `""`) the one options only one backend has select, else [`choose_auto`] with
/// what the host offers, probed on the call's socket.
pub fn select(config: &Config, nft: &mut LazyNft) -> Backend {
    if let Some(backend) = preset(config) {
        return backend;
    }
    let tools = IptablesTools {
        usable: node::iptables_usable(|| nft_answers(nft), node::legacy_probe),
        on_path: node::iptables_on_path(),
    };
    choose_auto(tools, || nftables::nft_support(nft))
}

/// The backend the configuration names, or that its options of one backend select.
pub fn preset(config: &Config) -> Option<Backend> {
    match config.backend {
        BackendChoice::Fixed(b) => Some(b),
        BackendChoice::Auto if config.iptables_only() => Some(Backend::Iptables),
        BackendChoice::Auto if config.nftables_only() => Some(Backend::Nftables),
        BackendChoice::Auto => None,
    }
}

/// Auto's choice, the reference's rule: iptables when its tools are usable, else nftables,
/// but never a layout whose expressions the kernel refuses (`nft`, asked only then): without
/// them, iptables (where its tools are on `PATH` the legacy ones load their module on first
/// use; without them the ADD fails naming the tools).
pub fn choose_auto(tools: IptablesTools, nft: impl FnOnce() -> NftSupport) -> Backend {
    if tools.usable {
        return Backend::Iptables;
    }
    match nft().unusable() {
        None => {
            log::info!("the iptables tools are not usable here: using the nftables backend");
            Backend::Nftables
        }
        Some(why) if tools.on_path => {
            log::info!("not using the nftables backend: {why}");
            Backend::Iptables
        }
        Some(why) => {
            log::warn!("neither backend is usable here: {why}, and no iptables tools on PATH");
            Backend::Iptables
        }
    }
}

/// Removes what `record` says with the backend that made it (not necessarily `be`), on the
/// call's socket.
///
/// # Errors
/// The backend's failure.
pub fn remove(be: &mut Box<dyn PortmapBackend>, record: &State) -> Result<(), PortmapError> {
    let kind = be.kind();
    if kind == record.backend {
        return be.del(record);
    }
    let current = std::mem::replace(be, open(kind, LazyNft::new()));
    let mut other = open(record.backend, current.into_socket());
    let result = other.del(record);
    *be = open(kind, other.into_socket());
    result
}

/// ADD of `att`: the record an earlier ADD left is replaced (its mappings removed first,
/// through the backend that made them, when they differ), then `kind`'s backend programs
/// the mappings and writes the record in its own order, `route_localnet` enabled where `snat`
/// needs it.
///
/// # Errors
/// The store's, the backend's failures; nothing of the attachment is left half-made.
pub fn add(
    nft: LazyNft,
    kind: Backend,
    att: &Attachment,
    config: &Config,
    ips: &[IpNet],
    netns: Option<NetnsId>,
) -> Result<(), PortmapError> {
    let mut be = open(kind, nft);
    let store = state::store()?;
    let mut record = State::new(kind, config, att, ips, netns);
    // An earlier version's record may be under another name; ours replaces it.
    let state::Located { file, record: old } = state::locate(&store, att)?;
    let earlier = Earlier {
        file,
        record: old.found(),
    };
    match &earlier.record {
        // A re-ADD of the same: what the kernel recorded for it still holds.
        Some(old) if old.same_as(&record) => record.iptables_rules.clone_from(&old.iptables_rules),
        // A re-ADD with other mappings: drop the old ones first so none is left unowned.
        Some(old) => {
            remove(&mut be, old)?;
            ports::release(&store, old);
        }
        None => {}
    }
    let then = || match ips.iter().find(|ip| ip.addr().is_ipv4()) {
        Some(ip) if config.snat => node::enable_route_localnet(ip.addr()),
        _ => Ok(()),
    };
    be.add(Add {
        store: &store,
        att,
        config,
        ips,
        record: &record,
        earlier: &earlier,
        then: &then,
    })
}

/// DEL of `att`: what its record says, through the backend that made it; without a record,
/// what our maps hold under its owner at the keys of `mappings` (the DEL's
/// `runtimeConfig`); then what the Go plugin made for it (`leftovers`), the UDP
/// conntrack entries of its host ports, and once its objects are gone its record and index
/// entries. Returns what failed.
///
/// # Errors
/// The store cannot be found or read (nothing is removed then).
pub fn del(att: &Attachment, mappings: &[PortMapping]) -> Result<Vec<PortmapError>, PortmapError> {
    let store = state::store()?;
    let record = state::locate(&store, att)?.record;
    // A discarded record leaves only the kernel's owner comments to find the objects by.
    let discarded = matches!(record, state::Record::Discarded);
    let found = if discarded {
        Unrecorded::Listing
    } else if mappings.is_empty() {
        Unrecorded::Nowhere
    } else {
        Unrecorded::Keys(mappings)
    };
    let recorded = record.found();
    let mut nft = LazyNft::new();
    let mut errors = remove_objects(&mut nft, att, recorded.as_ref(), found);
    // Then the Go plugin's objects of this attachment (upgrades from the Go plugin): reads,
    // and a commit only when it has some.
    let iptables_done = recorded
        .as_ref()
        .is_some_and(|r| r.backend == Backend::Iptables);
    errors.extend(crate::leftovers::remove(&mut nft, att, iptables_done));
    match &recorded {
        Some(record) => node::flush_udp(&record.mappings, &record.families()),
        None => node::flush_udp(mappings, &IpFamily::BOTH),
    }
    // The record goes once its objects are gone (also without a record: an ADD killed before
    // the rename of its state file leaves the temporary file, which this removes). A store
    // that cannot be written fails the DEL only now, the kernel objects already removed.
    if errors.is_empty() {
        let keys = match &recorded {
            Some(record) => ports::keys(record),
            None => ports::unrecorded_keys(mappings),
        };
        ports::PortIndex::new(&store).release(att, &keys);
        match state::remove_record(&store, att) {
            Ok(()) => {
                // Without its record the index entries naming it are found by their dead target.
                if discarded {
                    ports::PortIndex::new(&store).sweep();
                }
                store.prune();
            }
            Err(e) => errors.push(e),
        }
    }
    Ok(errors)
}

/// Removes the attachment's objects from our layouts (the DEL's first step): what `record` says, with the backend
/// that made it; without a record, the elements our maps hold under its owner where `found`
/// says. Returns what failed.
fn remove_objects(
    nft: &mut LazyNft,
    att: &Attachment,
    record: Option<&State>,
    found: Unrecorded<'_>,
) -> Vec<PortmapError> {
    let kind = match (record, found) {
        (Some(record), _) => record.backend,
        (None, Unrecorded::Nowhere) => return Vec::new(),
        (None, _) if nft.get().is_ok() => Backend::Nftables,
        (None, _) => return Vec::new(),
    };
    let mut be = open(kind, std::mem::take(nft));
    let outcome = match record {
        Some(record) => be.del(record),
        None => be.del_unrecorded(att, found),
    };
    *nft = be.into_socket();
    outcome.err().into_iter().collect()
}

/// GC of `network`: the recorded attachments not in `valid` (through their records, which
/// also cover owners too long to parse back), then what our maps hold under their owners,
/// and with the iptables backend (`kind`), the `CNI-DN-` chains of containers not valid.
/// Returns what failed.
pub fn gc(
    nft: LazyNft,
    kind: Backend,
    store: &StateStore,
    network: &str,
    valid: &[Valid],
) -> Vec<PortmapError> {
    let mut errors = Vec::new();
    let mut be = open(Backend::Nftables, nft);
    let live = |r: &State| {
        valid
            .iter()
            .any(|a| a.container_id == r.container_id && a.ifname == r.ifname)
    };
    let names = match store.list() {
        Ok(names) => names,
        Err(e) => {
            errors.push(PortmapError::Store(e));
            Vec::new()
        }
    };
    for name in names {
        let Ok(Some(record)) = state::read(store, &name).map(state::Record::found) else {
            continue;
        };
        if record.network != network || live(&record) {
            continue;
        }
        match remove(&mut be, &record) {
            Ok(()) => {
                ports::release(store, &record);
                if let Err(e) = store.remove(&name) {
                    log::warn!("failed to remove {name}: {e}");
                }
            }
            Err(e) => errors.push(e),
        }
    }
    ports::PortIndex::new(store).sweep();
    store.prune();
    let mut nft = be.into_socket();
    if nft.get().is_ok() {
        let mut be = open(Backend::Nftables, nft);
        errors.extend(be.gc(network, valid).err());
        nft = be.into_socket();
    }
    if kind == Backend::Iptables {
        errors.extend(open(Backend::Iptables, nft).gc(network, valid).err());
    }
    errors
}

/// The backend `kind`, owning `nft`.
pub fn open(kind: Backend, nft: LazyNft) -> Box<dyn PortmapBackend> {
    match kind {
        Backend::Nftables => Box::new(nftables::Nftables::new(nft)),
        Backend::Iptables => Box::new(iptables::Iptables::new(nft)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USABLE: IptablesTools = IptablesTools {
        usable: true,
        on_path: true,
    };
    /// Legacy tools whose module is not loaded yet.
    const ON_PATH: IptablesTools = IptablesTools {
        usable: false,
        on_path: true,
    };
    const NONE: IptablesTools = IptablesTools {
        usable: false,
        on_path: false,
    };

    #[test]
    fn auto_never_picks_nftables_where_the_kernel_lacks_its_expressions() {
        let lacks_fib = || NftSupport::Lacks("expression \"fib\"".into());
        let absent = || NftSupport::Absent("Protocol not supported".into());
        assert_eq!(choose_auto(ON_PATH, lacks_fib), Backend::Iptables);
        assert_eq!(choose_auto(ON_PATH, absent), Backend::Iptables);
        assert_eq!(
            choose_auto(ON_PATH, || NftSupport::Usable),
            Backend::Nftables
        );
        assert_eq!(choose_auto(NONE, || NftSupport::Usable), Backend::Nftables);
        // Neither works: iptables, whose ADD names the missing tools.
        assert_eq!(choose_auto(NONE, lacks_fib), Backend::Iptables);
        // Usable tools are chosen without asking nf_tables (the probe costs a grace period).
        assert_eq!(
            choose_auto(USABLE, || panic!("nf_tables probed")),
            Backend::Iptables
        );
        assert_eq!(
            lacks_fib().unusable().as_deref(),
            Some("the kernel has no nf_tables expression \"fib\"")
        );
    }

    #[test]
    fn the_configured_backend_and_one_backend_s_options_preset_it() {
        let mut config = crate::config::test_config(Vec::new());
        assert_eq!(preset(&config), None);
        config.external_set_mark_chain = Some("KUBE-MARK-MASQ".into());
        assert_eq!(preset(&config), Some(Backend::Iptables));
        config.backend = BackendChoice::Fixed(Backend::Nftables);
        assert_eq!(preset(&config), Some(Backend::Nftables));
    }
}
