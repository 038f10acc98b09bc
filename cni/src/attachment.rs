//! The attachment a call is about: the triple the spec keys everything on.

use crate::conf::GcAttachment;

/// One attachment of a container to a network: the network's name, `CNI_CONTAINERID` and
/// `CNI_IFNAME`. The spec makes the triple unique on a node; a plugin names and records what
/// it makes for an attachment by it (each plugin in its own encoding: a comment, a file name,
/// an alias).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attachment {
    /// The network name (`name` of the configuration).
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

impl Attachment {
    /// The attachment of `network`, `container_id` and `ifname`.
    pub fn new(
        network: impl Into<String>,
        container_id: impl Into<String>,
        ifname: impl Into<String>,
    ) -> Self {
        Attachment {
            network: network.into(),
            container_id: container_id.into(),
            ifname: ifname.into(),
        }
    }

    /// Whether a GC's valid attachment names this one (GC is per network: the entry carries
    /// the container ID and interface only).
    #[must_use]
    pub fn is(&self, valid: &GcAttachment) -> bool {
        valid.container_id == self.container_id && valid.ifname == self.ifname
    }

    /// Whether this attachment is among a GC's valid attachments.
    #[must_use]
    pub fn is_among(&self, valid: &[GcAttachment]) -> bool {
        valid.iter().any(|v| self.is(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_attachment_names_the_container_and_interface_of_any_network() {
        let a = Attachment::new("net", "c1", "eth0");
        let same = GcAttachment {
            container_id: "c1".into(),
            ifname: "eth0".into(),
        };
        let other_if = GcAttachment {
            container_id: "c1".into(),
            ifname: "eth1".into(),
        };
        assert!(a.is(&same));
        assert!(!a.is(&other_if));
        assert!(a.is_among(&[other_if.clone(), same]));
        assert!(!a.is_among(&[other_if]));
    }
}
