//! The mechanisms that program the firewall, behind [`FirewallBackend`].

pub mod firewalld;
pub mod iptables;
pub mod nftables;
pub mod state;

use cni::conf::GcAttachment;

use crate::error::FirewallError;
use crate::names::{owner_comment, state_name};
use crate::plan::Target;

/// Who an object belongs to: the network and the attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The network name.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

impl Owner {
    /// The nftables owner comment.
    #[must_use]
    pub fn comment(&self) -> String {
        owner_comment(&self.network, &self.container_id, &self.ifname)
    }

    /// The state file name.
    #[must_use]
    pub fn state_name(&self) -> String {
        state_name(&self.network, &self.container_id, &self.ifname)
    }

    /// Whether `attachment` is this one.
    #[must_use]
    pub fn is(&self, attachment: &GcAttachment) -> bool {
        attachment.container_id == self.container_id && attachment.ifname == self.ifname
    }
}

/// One firewall mechanism.
pub trait FirewallBackend {
    /// The backend's name, for messages.
    fn name(&self) -> &'static str;

    /// Opens forwarding for `target` (and installs its bridge's isolation rules).
    ///
    /// # Errors
    /// When the change cannot be made; nothing of this attachment is left half-made.
    fn add(&mut self, owner: &Owner, target: &Target) -> Result<(), FirewallError>;

    /// Verifies exactly this attachment's objects.
    ///
    /// # Errors
    /// [`FirewallError::Missing`] naming the first missing object.
    fn check(&mut self, owner: &Owner, target: &Target) -> Result<(), FirewallError>;

    /// Removes this attachment's objects; `target` is prevResult's, when there was one.
    /// Succeeds when there is nothing to remove.
    ///
    /// # Errors
    /// When removal fails.
    fn del(&mut self, owner: &Owner, target: Option<&Target>) -> Result<(), FirewallError>;

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
