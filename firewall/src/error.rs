//! The plugin's errors and their CNI codes.

use common::error::{CniError, ErrorCode};
use common::iptables::IptablesError;
use common::lock::LockError;
use common::nft::NftError;
use common::store::StoreError;

/// Everything that can go wrong in the firewall plugin.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    /// ADD or CHECK without prevResult.
    #[error("missing prevResult from earlier plugin")]
    MissingPrevResult,
    /// An ingress policy needs a bridge and prevResult has none.
    #[error("{0}")]
    NoBridge(String),
    /// An iptables tool failed.
    #[error("iptables: {0}")]
    Iptables(#[from] IptablesError),
    /// A netlink nftables operation failed.
    #[error(transparent)]
    Nft(#[from] NftError),
    /// Another call holds our lock.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The per-attachment state could not be read or written.
    #[error("firewall state: {0}")]
    Store(#[from] StoreError),
    /// CHECK found a rule missing.
    #[error("expected {what} not found")]
    Missing {
        /// The rule or object, in the backend's syntax.
        what: String,
    },
    /// A D-Bus call to firewalld failed.
    #[error("firewalld: {op}: {reason}")]
    Firewalld {
        /// What was attempted (`add 10.0.0.2/32 to zone trusted`).
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

impl From<FirewallError> for CniError {
    fn from(err: FirewallError) -> Self {
        let code = match &err {
            FirewallError::MissingPrevResult | FirewallError::NoBridge(_) => {
                ErrorCode::InvalidConfig
            }
            FirewallError::Iptables(
                IptablesError::Locked { .. } | IptablesError::Timeout { .. },
            )
            | FirewallError::Lock(LockError::Timeout { .. }) => ErrorCode::TryAgainLater,
            FirewallError::Unavailable { .. } => ErrorCode::PluginNotAvailable,
            FirewallError::Iptables(_)
            | FirewallError::Lock(_)
            | FirewallError::Nft(_)
            | FirewallError::Store(_)
            | FirewallError::Missing { .. }
            | FirewallError::Firewalld { .. }
            | FirewallError::Netns(_) => ErrorCode::Internal,
        };
        CniError::from_error(code, &err)
    }
}
