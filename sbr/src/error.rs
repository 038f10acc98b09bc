//! Errors of the sbr plugin and their CNI codes.

use common::error::{CniError, ErrorCode};
use common::lock::LockError;
use common::netlink::NetlinkError;
use common::netns::NetnsError;

/// Everything that can go wrong in sbr.
#[derive(Debug, thiserror::Error)]
pub enum SbrError {
    /// A key or the prevResult is unusable (code 7).
    #[error("{0}")]
    InvalidConfig(String),
    /// No prevResult on ADD or CHECK (code 7).
    #[error("must be called as a chained plugin: prevResult is missing")]
    NotChained,
    /// The container namespace could not be opened or entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The per-namespace lock could not be taken (code 11 after the wait).
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The container interface does not exist.
    #[error("cannot find interface {ifname} in the container: {source}")]
    Link {
        /// `CNI_IFNAME`.
        ifname: String,
        /// The lookup failure.
        #[source]
        source: NetlinkError,
    },
    /// A netlink operation failed (the message names it).
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// ADD failed and was rolled back; `undo` lists what could not be undone.
    #[error("{cause}{}", rollback_note(.undo))]
    Add {
        /// The failed step.
        #[source]
        cause: NetlinkError,
        /// Undo steps that failed too.
        undo: Vec<String>,
    },
    /// CHECK found objects missing or different.
    #[error("sbr CHECK of {ifname} failed: {}", .missing.join("; "))]
    Check {
        /// `CNI_IFNAME`.
        ifname: String,
        /// What is missing, one entry per object.
        missing: Vec<String>,
    },
    /// DEL could not remove some objects (it removed the rest).
    #[error("sbr DEL of {ifname} failed: {}", .failures.join("; "))]
    Del {
        /// `CNI_IFNAME`.
        ifname: String,
        /// One entry per failed removal.
        failures: Vec<String>,
    },
}

fn rollback_note(undo: &[String]) -> String {
    if undo.is_empty() {
        String::new()
    } else {
        format!(" (rollback left behind: {})", undo.join("; "))
    }
}

impl From<SbrError> for CniError {
    fn from(err: SbrError) -> Self {
        match err {
            SbrError::InvalidConfig(msg) => CniError::invalid_config(msg),
            SbrError::NotChained => CniError::from_error(ErrorCode::InvalidConfig, &err),
            SbrError::Netns(e) => e.into(),
            SbrError::Lock(e) => e.into(),
            SbrError::Link { .. }
            | SbrError::Netlink(_)
            | SbrError::Add { .. }
            | SbrError::Check { .. }
            | SbrError::Del { .. } => CniError::from_error(ErrorCode::Internal, &err),
        }
    }
}
