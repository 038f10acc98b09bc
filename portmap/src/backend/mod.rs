//! The mechanisms that program mappings, behind [`PortmapBackend`]: [`nftables::Nftables`]
//! (our map layout) and [`iptables::Iptables`] (the reference's layout).

pub mod iptables;
pub mod nftables;

use cni::conf::GcAttachment as Valid;
use host::store::StateStore;
use ipnet::IpNet;
use netfilter::iptables::native::Recorded;
use netfilter::nft::{Feature, LazyNft};

use crate::config::{Backend, BackendChoice, Config, PortMapping};
use crate::error::PortmapError;
use crate::node;
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

    /// The attachment the host-port index names as holding `key` in the iptables layout
    /// ([`crate::state::PortIndex`]), if it has an entry for it.
    fn indexed(&self, key: &PortKey) -> Option<Attachment>;

    /// The record of `att`, if it has a valid one.
    fn record(&self, att: &Attachment) -> Option<State>;
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

    /// Removes the attachment's objects without its record, found by their owner where
    /// `found` says.
    ///
    /// # Errors
    /// The mechanism's failures other than "not found".
    fn del_unrecorded(
        &mut self,
        att: &Attachment,
        found: Unrecorded<'_>,
    ) -> Result<(), PortmapError>;

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

/// What the iptables tools offer here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IptablesTools {
    /// The tools and their kernel side answer ([`node::iptables_usable`]).
    pub usable: bool,
    /// `iptables-restore` and `iptables-save` are on `PATH` (the legacy ones may still need
    /// their module loaded, which their first run does).
    pub on_path: bool,
}

/// What nf_tables offers our map layout here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftSupport {
    /// Every expression and chain type the layout uses.
    Usable,
    /// nf_tables without some of them: what it lacks (`expression "fib"`).
    Lacks(String),
    /// No nf_tables at all (or not for us): why.
    Absent(String),
}

impl NftSupport {
    /// Why the layout cannot work here, if it cannot.
    pub fn unusable(&self) -> Option<String> {
        match self {
            NftSupport::Usable => None,
            NftSupport::Lacks(what) => Some(format!("the kernel has no nf_tables {what}")),
            NftSupport::Absent(why) => Some(format!("the kernel has no nf_tables ({why})")),
        }
    }
}

/// The nf_tables features our map layout needs (the skeleton's expressions and chain type).
const NFT_FEATURES: [Feature; 5] = [
    Feature::NatChain,
    Feature::Fib,
    Feature::Nat,
    Feature::Masquerade,
    Feature::Ct,
];

/// What nf_tables offers our map layout here, asked on the call's socket: where our table
/// exists, the kernel had every feature when it was made (one lookup); otherwise the kernel
/// checks a batch that uses each feature and is never committed ([`Nft::missing_features`],
/// an RCU grace period, 5–20 ms): the rare path of the first ADD on a node that auto sends
/// to nftables, and of STATUS.
pub fn nft_support(nft: &mut LazyNft) -> NftSupport {
    let nft = match nft.get() {
        Ok(nft) => nft,
        Err(e) => return NftSupport::Absent(e.to_string()),
    };
    match nft.table_exists(&nftables::table(crate::config::IpFamily::V4)) {
        Ok(true) => return NftSupport::Usable,
        Ok(false) => {}
        Err(e) => return NftSupport::Absent(e.to_string()),
    }
    match nft.missing_features(netfilter::nft::Family::Ip, &NFT_FEATURES) {
        Ok(missing) if missing.is_empty() => NftSupport::Usable,
        Ok(missing) => {
            let what: Vec<String> = missing.iter().map(|f| f.describe()).collect();
            NftSupport::Lacks(what.join(", "))
        }
        Err(e) => NftSupport::Absent(e.to_string()),
    }
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
    choose_auto(tools, || nft_support(nft))
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

/// Where a DEL without a record finds the attachment's objects of our map layout.
#[derive(Debug, Clone, Copy)]
pub enum Unrecorded<'m> {
    /// Nowhere: there is nothing to remove (no record, no mappings).
    Nowhere,
    /// At the keys of these mappings (the DEL's `runtimeConfig`), looked up.
    Keys(&'m [PortMapping]),
    /// By listing every map for its owner (a record that did not parse).
    Listing,
}

/// Removes the attachment's objects from our layouts: what `record` says, with the backend
/// that made it; without a record, the elements our maps hold under its owner where `found`
/// says. Returns what failed.
pub fn del(
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
                state::PortIndex::new(store).release(&record.attachment(), &record.port_keys());
                if let Err(e) = store.remove(&name) {
                    log::warn!("failed to remove {name}: {e}");
                }
            }
            Err(e) => errors.push(e),
        }
    }
    state::PortIndex::new(store).sweep();
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
