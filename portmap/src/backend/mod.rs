//! The mechanisms that program mappings, behind [`PortmapBackend`]: [`nftables::Nftables`]
//! (our map layout) and [`iptables::Iptables`] (the reference's layout). Which one a call
//! gets, and the verbs that go through whichever made a record, are [`select`]'s.

pub mod iptables;
pub mod nftables;
pub mod select;

use cni::Attachment;
use cni::conf::GcAttachment as Valid;
use host::store::StateStore;
use ipnet::IpNet;
use netfilter::nft::LazyNft;

use crate::config::{Backend, Config, PortMapping};
use crate::error::PortmapError;
use crate::state::{self, State};

/// An ADD, as a backend programs it.
#[derive(Clone, Copy)]
pub struct Add<'a> {
    /// The state store of the plugin's namespace.
    pub store: &'a StateStore,
    /// The attachment.
    pub att: &'a Attachment,
    /// Its configuration.
    pub config: &'a Config,
    /// The container addresses mapped to (the plan's).
    pub ips: &'a [IpNet],
    /// What the ADD records (the backend adds what the kernel tells it).
    pub record: &'a State,
    /// Where the attachment's record was before this ADD, and what it said.
    pub earlier: &'a Earlier,
    /// What must succeed once the kernel objects are written for the ADD to stand
    /// (`route_localnet`); its failure undoes the ADD.
    pub then: &'a dyn Fn() -> Result<(), PortmapError>,
}

impl std::fmt::Debug for Add<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Add")
            .field("att", self.att)
            .field("ips", &self.ips)
            .field("earlier", self.earlier)
            .finish_non_exhaustive()
    }
}

/// The attachment's record before an ADD.
#[derive(Debug)]
pub struct Earlier {
    /// Its file: the attachment's, or the one an earlier version named it.
    pub file: String,
    /// The record, if there was a valid one.
    pub record: Option<State>,
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

/// One mechanism programming an attachment's mappings. Each owns the call's nf_tables socket
/// (the iptables layout reads nf_tables too where the tools are `iptables-nft`).
pub trait PortmapBackend {
    /// Which backend this is.
    fn kind(&self) -> Backend;

    /// Programs `add`: refuses a host port that another attachment holds, unless that
    /// attachment's namespace is gone (the `ports` module tells): then its mappings are removed in
    /// the same write and its records forgotten. Writes the record and the kernel objects in
    /// the backend's own order, under its own lock where it has one, and when anything fails
    /// (also [`Add::then`]) removes what it made, its record and its index entries.
    ///
    /// # Errors
    /// [`PortmapError::Conflict`] naming the owner; the mechanism's failures. Nothing of the
    /// attachment is left half-made.
    fn add(&mut self, add: Add<'_>) -> Result<(), PortmapError>;

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

/// What a layout lacks of the recorded attachments `portmap reconcile` asked it about, found
/// with one read of its own objects, and how to put it back: `S`, the layout's repair of its
/// shared objects, `A` an attachment's.
#[derive(Debug, Default)]
pub struct Lacking<S, A> {
    /// The shared objects missing, as the lines name them.
    pub shared: Vec<String>,
    /// Their repair.
    pub shared_repair: S,
    /// The attachments lacking something.
    pub attachments: Vec<Lack<A>>,
    /// The attachments that cannot be restored (their position in the records asked about),
    /// and why: a host port another attachment holds now.
    pub refused: Vec<(usize, String)>,
}

impl<S, A> Lacking<S, A> {
    /// Whether nothing is missing and nothing refused.
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty() && self.attachments.is_empty() && self.refused.is_empty()
    }
}

/// What one attachment lacks.
#[derive(Debug)]
pub struct Lack<A> {
    /// Its position in the records asked about.
    pub index: usize,
    /// What is missing, as the lines name it.
    pub what: Vec<String>,
    /// Its repair.
    pub repair: A,
}

/// Forgets the record of `att` after a failed ADD (its objects removed).
fn forget(store: &StateStore, att: &Attachment) {
    if let Err(e) = state::remove_record(store, att) {
        log::warn!("failed to remove state after a failed ADD: {e}");
    }
    store.prune();
}

/// Removes the record of an earlier version (`earlier`), now under the attachment's own name
/// (`file`).
fn forget_earlier(store: &StateStore, earlier: &str, file: &str) {
    if earlier != file
        && let Err(e) = store.remove(earlier)
    {
        log::warn!("failed to remove the earlier record {earlier}: {e}");
    }
}
