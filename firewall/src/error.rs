//! The plugin's errors and their CNI codes.
//!
//! Where the reference reports an error for the same condition, the message is the reference's,
//! word for word (scripts and tests match on it; `reference-behaviour.md` §1.9 and §2.4), and
//! what we add (the field, the value, where we looked) goes in the error object's `details`.

use cni::error::{CniError, ErrorCode};
use host::lock::LockError;
use host::store::StoreError;
use netfilter::iptables::IptablesError;
use netfilter::iptables::native::NativeError;
use netfilter::iptables::writer::WriteError;
use netfilter::nft::NftError;

/// Everything that can go wrong in the firewall plugin.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    /// ADD or CHECK without prevResult.
    #[error("missing prevResult from earlier plugin")]
    MissingPrevResult,
    /// An ingress policy needs a bridge and prevResult lists no interface.
    #[error(
        "interface needs to be set for ingress policy {policy:?}, make sure to chain \"firewall\" plugin with \"bridge\""
    )]
    NoInterface {
        /// The policy (`same-bridge` or `isolated`).
        policy: &'static str,
    },
    /// An ingress policy needs a bridge and prevResult's first interface has no name.
    #[error("got empty bridge name")]
    EmptyBridgeName,
    /// An iptables tool failed.
    #[error("iptables: {0}")]
    Iptables(#[from] IptablesError),
    /// A netlink nftables operation failed.
    #[error(transparent)]
    Nft(#[from] NftError),
    /// The iptables writer refused a change over nf_tables (a rule into a chain that is not
    /// there).
    #[error(transparent)]
    Native(NativeError),
    /// The nftables backend on a kernel without nf_tables (no nfnetlink, or nfnetlink without
    /// nf_tables: [`NftError::is_absent`]), for ADD and CHECK; DEL and GC take it for nothing
    /// of ours being there.
    #[error("nftables backend is not usable: the kernel has no nf_tables ({0})")]
    NoNfTables(#[source] NftError),
    /// Another call holds our lock.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The per-attachment state could not be read or written.
    #[error("firewall state: {0}")]
    Store(#[from] StoreError),
    /// CHECK found an object missing: `msg` in the reference's words where it checks the same
    /// object (`expected rule [...] not found`), `details` saying where it was looked for.
    #[error("{msg}")]
    Missing {
        /// The message.
        msg: String,
        /// Where the object was looked for.
        details: String,
    },
    /// firewalld refused to add a container address to the zone.
    #[error("failed to add the address {cidr} to {zone} zone: {reason}")]
    FirewalldAdd {
        /// The source (`10.0.0.2/32`).
        cidr: String,
        /// The zone.
        zone: String,
        /// firewalld's answer (the D-Bus error's message).
        reason: String,
        /// The D-Bus error's name.
        details: String,
    },
    /// CHECK: the zone does not have a container address as a source, or the query failed.
    #[error("failed to find the address {cidr} in {zone} zone")]
    FirewalldQuery {
        /// The source (`10.0.0.2/32`).
        cidr: String,
        /// The zone.
        zone: String,
        /// firewalld's answer or the D-Bus error.
        details: String,
    },
    /// The system bus could not be reached: `msg` in the reference's words where its D-Bus
    /// library reports the same failure (`dial unix <socket>: connect: <errno>`), ours in
    /// `details`.
    #[error("{msg}")]
    NoBus {
        /// The message.
        msg: String,
        /// Our account of the failure.
        details: String,
    },
    /// Any other D-Bus call to firewalld failed (removing a source).
    #[error("firewalld: {op}: {reason}")]
    Firewalld {
        /// What was attempted (`removeSource(trusted, 10.0.0.2/32)`).
        op: String,
        /// The D-Bus error.
        reason: String,
    },
    /// The backend cannot be used here (STATUS).
    #[error("{backend} backend is not usable: {reason}")]
    Unavailable {
        /// The backend.
        backend: &'static str,
        /// Why.
        reason: String,
    },
    /// The host namespace could not be identified.
    #[error("cannot identify the network namespace: {0}")]
    Netns(#[source] std::io::Error),
}

impl From<WriteError> for FirewallError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Tools(e) => FirewallError::Iptables(e),
            WriteError::Native(NativeError::Nft(e)) => FirewallError::Nft(e),
            WriteError::Native(e) => FirewallError::Native(e),
        }
    }
}

impl FirewallError {
    /// What the error object's `details` carries beyond the message.
    fn details(&self) -> Option<String> {
        match self {
            FirewallError::NoInterface { .. } => Some(
                "prevResult.interfaces is empty: the ingress policy isolates the bridge named \
                 by prevResult.interfaces[0]"
                    .to_owned(),
            ),
            FirewallError::EmptyBridgeName => Some(
                "prevResult.interfaces[0].name is empty: the ingress policy isolates the bridge \
                 named there"
                    .to_owned(),
            ),
            FirewallError::Missing { details, .. }
            | FirewallError::NoBus { details, .. }
            | FirewallError::FirewalldAdd { details, .. }
            | FirewallError::FirewalldQuery { details, .. } => Some(details.clone()),
            _ => None,
        }
    }
}

impl From<FirewallError> for CniError {
    fn from(err: FirewallError) -> Self {
        let code = match &err {
            FirewallError::MissingPrevResult
            | FirewallError::NoInterface { .. }
            | FirewallError::EmptyBridgeName => ErrorCode::InvalidConfig,
            FirewallError::Iptables(
                IptablesError::Locked { .. } | IptablesError::Timeout { .. },
            )
            | FirewallError::Lock(LockError::Timeout { .. }) => ErrorCode::TryAgainLater,
            FirewallError::Unavailable { .. } => ErrorCode::PluginNotAvailable,
            // The state directory (read-only, full, gone): the spec's I/O failure.
            FirewallError::Store(_) | FirewallError::Lock(_) => ErrorCode::Io,
            FirewallError::Iptables(_)
            | FirewallError::Nft(_)
            | FirewallError::Native(_)
            | FirewallError::NoNfTables(_)
            | FirewallError::Missing { .. }
            | FirewallError::FirewalldAdd { .. }
            | FirewallError::FirewalldQuery { .. }
            | FirewallError::NoBus { .. }
            | FirewallError::Firewalld { .. }
            | FirewallError::Netns(_) => ErrorCode::Internal,
        };
        match err.details() {
            Some(details) => CniError::new(code, err.to_string()).with_details(details),
            None => CniError::from_error(code, &err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cni(err: FirewallError) -> CniError {
        err.into()
    }

    #[test]
    fn the_references_conditions_carry_its_messages_word_for_word() {
        let cases = [
            (
                FirewallError::MissingPrevResult,
                ErrorCode::InvalidConfig,
                "missing prevResult from earlier plugin",
            ),
            (
                FirewallError::NoInterface {
                    policy: "same-bridge",
                },
                ErrorCode::InvalidConfig,
                r#"interface needs to be set for ingress policy "same-bridge", make sure to chain "firewall" plugin with "bridge""#,
            ),
            (
                FirewallError::EmptyBridgeName,
                ErrorCode::InvalidConfig,
                "got empty bridge name",
            ),
            (
                FirewallError::FirewalldAdd {
                    cidr: "10.0.0.2/32".into(),
                    zone: "trusted".into(),
                    reason: "INVALID_ZONE: nope".into(),
                    details: "org.fedoraproject.FirewallD1.Exception".into(),
                },
                ErrorCode::Internal,
                "failed to add the address 10.0.0.2/32 to trusted zone: INVALID_ZONE: nope",
            ),
            (
                FirewallError::FirewalldQuery {
                    cidr: "fd00::2/128".into(),
                    zone: "cni".into(),
                    details: "querySource answered false".into(),
                },
                ErrorCode::Internal,
                "failed to find the address fd00::2/128 in cni zone",
            ),
        ];
        for (err, code, msg) in cases {
            let cni = cni(err);
            assert_eq!((cni.code, cni.msg.as_str()), (code, msg));
        }
    }

    #[test]
    fn what_we_add_goes_in_details() {
        let missing = cni(FirewallError::Missing {
            msg: "expected rule [-s 10.0.0.2/32 -j ACCEPT] not found".into(),
            details: "ipv4 filter table, chain CNI-FORWARD".into(),
        });
        assert_eq!(
            missing.msg,
            "expected rule [-s 10.0.0.2/32 -j ACCEPT] not found"
        );
        assert_eq!(missing.details, "ipv4 filter table, chain CNI-FORWARD");
        let empty = cni(FirewallError::EmptyBridgeName);
        assert!(empty.details.contains("interfaces[0].name"), "{empty:?}");
    }
}
