//! The mechanisms that program mappings, behind [`PortmapBackend`]: [`nftables::Nftables`]
//! (our map layout) and [`iptables::Iptables`] (the reference's layout).

pub mod iptables;
pub mod nftables;

use common::conf::Attachment as Valid;
use common::iptables::native::Recorded;
use common::nft::LazyNft;
use common::store::StateStore;
use ipnet::IpNet;

use crate::config::{Backend, BackendChoice, Config};
use crate::error::PortmapError;
use crate::host;
use crate::plan::{Attachment, PortKey};
use crate::state::{self, State};

/// Whether nf_tables answers here: the call's socket opens and a table lookup is answered
/// (found or not).
pub fn nft_answers(nft: &mut LazyNft) -> bool {
    nft.get()
        .and_then(|n| n.table_exists(&nftables::table(crate::config::IpFamily::V4)))
        .is_ok()
}

/// What became of the attachment holding a host port another ADD asks for.
#[derive(Debug)]
pub enum Fate {
    /// Its network namespace is there, or it cannot be told (no record, made by the Go plugin
    /// or by an earlier version): it keeps its ports and the ADD is refused, naming it.
    Live,
    /// Its recorded network namespace is gone: these records (its attachments holding the
    /// port) are taken over, their mappings removed in the ADD's own transaction.
    Gone(Vec<State>),
}

/// What an ADD did besides its own objects.
#[derive(Debug, Default)]
pub struct Added {
    /// The records of the attachments it took host ports over from (for the caller to
    /// remove).
    pub taken: Vec<State>,
    /// The handles of the entry rules it wrote natively (iptables layout), per family where
    /// it wrote them all, for the state.
    pub recorded: Vec<Recorded>,
}

/// Tells what became of the holders of host ports, from their records.
pub trait Holders {
    /// The attachment whose owner comment is `owner` (our map layout).
    fn by_owner(&self, owner: &str) -> Fate;

    /// The attachments of `container_id` on `network`, whose chain the iptables layout
    /// shares.
    fn by_container(&self, network: &str, container_id: &str) -> Fate;

    /// The record of the attachment the host-port index names as holding `key` in the
    /// iptables layout, when that record still claims it ([`crate::state::claim_ports`]).
    fn indexed(&self, key: &PortKey) -> Option<State>;
}

/// One mechanism programming an attachment's mappings. Each owns the call's nf_tables socket
/// (the iptables layout reads nf_tables too where the tools are `iptables-nft`).
pub trait PortmapBackend {
    /// Which backend this is.
    fn kind(&self) -> Backend;

    /// Programs the mappings of `config` to `ips` for `att`, in one transaction per call (per
    /// family for iptables); refuses a host port that another attachment holds, unless
    /// `holders` says that attachment is gone: then its mappings are removed in the same
    /// transaction, and its records are returned (for the caller to remove).
    ///
    /// # Errors
    /// [`PortmapError::Conflict`] naming the owner; the mechanism's failures. Nothing of the
    /// attachment is left half-made.
    fn add(
        &mut self,
        att: &Attachment,
        config: &Config,
        ips: &[IpNet],
        holders: &dyn Holders,
    ) -> Result<Added, PortmapError>;

    /// Verifies exactly the attachment's objects and the shared ones they need (`record`: its
    /// state, when it has one).
    ///
    /// # Errors
    /// [`PortmapError::Check`] naming the first missing or different object.
    fn check(
        &mut self,
        att: &Attachment,
        config: &Config,
        ips: &[IpNet],
        record: Option<&State>,
    ) -> Result<(), PortmapError>;

    /// Removes what `record` says its ADD made, where it still belongs to the attachment.
    ///
    /// # Errors
    /// The mechanism's failures other than "not found".
    fn del(&mut self, record: &State) -> Result<(), PortmapError>;

    /// Removes the attachment's objects without its record, found by their owner.
    ///
    /// # Errors
    /// The mechanism's failures other than "not found".
    fn del_unrecorded(&mut self, att: &Attachment) -> Result<(), PortmapError>;

    /// Removes the objects of `network` whose attachment is not in `valid`, found by their
    /// owner (attachments with records are removed through them first).
    ///
    /// # Errors
    /// The mechanism's failures.
    fn gc(&mut self, network: &str, valid: &[Valid]) -> Result<(), PortmapError>;

    /// Whether the mechanism works here.
    ///
    /// # Errors
    /// Why it does not.
    fn status(&mut self) -> Result<(), PortmapError>;

    /// The call's nf_tables socket, handed on to the next user.
    fn into_socket(self: Box<Self>) -> LazyNft;
}

/// The backend the configuration selects: the configured one; for auto (no `backend`, `null`
/// or `""`) the reference's rule, iptables when the iptables tools are usable and nftables
/// otherwise, except that options only one backend has select it.
pub fn select(config: &Config, nft: &mut LazyNft) -> Backend {
    match config.backend {
        BackendChoice::Fixed(b) => b,
        BackendChoice::Auto if config.iptables_only() => Backend::Iptables,
        BackendChoice::Auto if config.nftables_only() => Backend::Nftables,
        BackendChoice::Auto => {
            if host::iptables_usable(|| nft_answers(nft)) {
                Backend::Iptables
            } else if nft_answers(nft) {
                log::info!("the iptables tools are not usable here: using the nftables backend");
                Backend::Nftables
            } else {
                Backend::Iptables
            }
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

/// Removes the attachment's objects from our layouts: what `record` says, with the backend
/// that made it; without a record, and when `list` (there are mappings to remove, or the
/// record was discarded), the elements our maps hold under its owner. Returns what failed.
pub fn del(
    nft: &mut LazyNft,
    att: &Attachment,
    record: Option<&State>,
    list: bool,
) -> Vec<PortmapError> {
    let kind = match record {
        Some(record) => record.backend,
        None if list && nft.get().is_ok() => Backend::Nftables,
        None => return Vec::new(),
    };
    let mut be = open(kind, std::mem::take(nft));
    let outcome = match record {
        Some(record) => be.del(record),
        None => be.del_unrecorded(att),
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
                state::release_ports(store, &name, &record.port_keys());
                if let Err(e) = store.remove(&name) {
                    log::warn!("failed to remove {name}: {e}");
                }
            }
            Err(e) => errors.push(e),
        }
    }
    state::sweep_ports(store);
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
