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
}
