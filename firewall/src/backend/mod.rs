//! The mechanisms that program the firewall, behind [`FirewallBackend`].

pub mod firewalld;
pub mod firewalld_signal;
pub mod iptables;
pub mod nftables;
pub mod state;

use cni::Attachment;
use cni::conf::GcAttachment;

use crate::error::FirewallError;
use crate::plan::Target;

/// An attachment as its record has it, for `reconcile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The attachment.
    pub owner: Attachment,
    /// What it needs opened: the addresses it still claims, its bridge, its namespace.
    pub target: Target,
}

/// What is missing of some attachments' objects ([`FirewallBackend::missing`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Missing {
    /// The shared objects that are missing, described for the operator (`FORWARD jump to
    /// CNI-FORWARD`, `table inet cni_firewall`).
    pub shared: Vec<String>,
    /// The attachments (indices into those asked about) that lack an object of their own or
    /// one their bridge needs, with what they lack (`accepts of 10.0.0.2`).
    pub attachments: Vec<(usize, Vec<String>)>,
}

impl Missing {
    /// Whether nothing is missing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty() && self.attachments.is_empty()
    }
}

/// What [`FirewallBackend::restore`] did for each attachment it was to restore (by index):
/// nothing when it is restored, else why not.
pub type Restored = Vec<(usize, Option<String>)>;

/// One firewall mechanism.
pub trait FirewallBackend {
    /// The backend's name, for messages.
    fn name(&self) -> &'static str;

    /// Opens forwarding for `target` (and installs its bridge's isolation rules).
    ///
    /// # Errors
    /// When the change cannot be made; nothing of this attachment is left half-made.
    fn add(&mut self, owner: &Attachment, target: &Target) -> Result<(), FirewallError>;

    /// Verifies exactly this attachment's objects.
    ///
    /// # Errors
    /// [`FirewallError::Missing`] naming the first missing object.
    fn check(&mut self, owner: &Attachment, target: &Target) -> Result<(), FirewallError>;

    /// Removes this attachment's objects; `target` is prevResult's, when there was one.
    /// Succeeds when there is nothing to remove.
    ///
    /// # Errors
    /// When removal fails.
    fn del(&mut self, owner: &Attachment, target: Option<&Target>) -> Result<(), FirewallError>;

    /// Removes the objects of `network` whose attachment is not in `valid`.
    ///
    /// # Errors
    /// When removal fails.
    fn gc(&mut self, network: &str, valid: &[GcAttachment]) -> Result<(), FirewallError>;

    /// Whether the backend is usable.
    ///
    /// # Errors
    /// [`FirewallError::Unavailable`] saying why.
    fn status(&mut self) -> Result<(), FirewallError>;

    /// What is missing of the objects of `attachments`, all made by this backend under its
    /// configuration (`reconcile`): one read of the backend's own objects for all of them
    /// (not one per attachment), nothing written.
    ///
    /// # Errors
    /// When the objects cannot be read.
    fn missing(&mut self, attachments: &[Recorded]) -> Result<Missing, FirewallError>;

    /// Puts back what `missing` (this backend's answer for `attachments`) found missing:
    /// the shared objects and the objects of each attachment it names, adding nothing that
    /// is there, touching nothing but our own objects.
    ///
    /// # Errors
    /// When nothing could be restored (the shared objects, say); an attachment that alone
    /// could not be restored is in the [`Restored`] list with why.
    fn restore(
        &mut self,
        attachments: &[Recorded],
        missing: &Missing,
    ) -> Result<Restored, FirewallError>;
}
