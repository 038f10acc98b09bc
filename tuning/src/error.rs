//! Everything that can go wrong in the tuning plugin, and its CNI error code.

use std::path::PathBuf;

use common::error::{CniError, ErrorCode};

/// A tuning failure, naming the key, value, file or interface involved.
#[derive(Debug, thiserror::Error)]
pub enum TuningError {
    /// A configuration key that does not decode (wrong JSON type).
    #[error("failed to decode {key}: {reason}")]
    Decode {
        /// The JSON path of the key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A sysctl key that may not be set (outside `net.`, or a bad component).
    #[error("{origin} key {key:?} (value {value:?}) is invalid: {reason}")]
    InvalidSysctl {
        /// `sysctl` or `args.cni.sysctl`.
        origin: &'static str,
        /// The key as written in the config.
        key: String,
        /// Its value.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// A sysctl key that the operator's allowlist does not permit.
    #[error("{origin} key {key:?} (value {value:?}) is not allowed by {file}")]
    SysctlNotAllowed {
        /// `sysctl` or `args.cni.sysctl`.
        origin: &'static str,
        /// The key as written in the config.
        key: String,
        /// Its value.
        value: String,
        /// The allowlist file.
        file: PathBuf,
        /// The allowlist's patterns, for the error details.
        allowed: Vec<String>,
    },
    /// `args.cni.sysctl` without a top-level `sysctl` object (a panic in the reference).
    #[error(
        "args.cni.sysctl {value} is set but the config has no top-level sysctl object to override"
    )]
    ArgsSysctlWithoutSysctl {
        /// The `args.cni.sysctl` object as JSON.
        value: String,
    },
    /// A link attribute value out of range or malformed (`mac`, `mtu`, `txQLen`).
    #[error("invalid {key} {value}: {reason}")]
    InvalidValue {
        /// The key, with its source (`mtu`, `args.cni.mtu`, `CNI_ARGS MAC`…).
        key: String,
        /// The value as given.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// An allowlist line that is not a regular expression.
    #[error("{file}:{line}: invalid sysctl allowlist pattern {pattern:?}: {source}")]
    AllowlistPattern {
        /// The allowlist file.
        file: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line.
        pattern: String,
        /// The regex error.
        #[source]
        source: regex_lite::Error,
    },
    /// The allowlist exists but cannot be read.
    #[error("failed to read sysctl allowlist {file:?}: {source}")]
    AllowlistRead {
        /// The allowlist file.
        file: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `CNI_ARGS` is malformed or has unknown keys.
    #[error(transparent)]
    Args(#[from] common::args::ArgsError),
    /// ADD or CHECK without a `prevResult`.
    #[error("tuning must be called as a chained plugin: prevResult is missing")]
    MissingPrevResult,
    /// The container namespace cannot be opened or entered.
    #[error(transparent)]
    Netns(#[from] common::netns::NetnsError),
    /// `CNI_IFNAME` does not exist in the container.
    #[error("interface {ifname:?} not found in the container netns")]
    LinkNotFound {
        /// The interface.
        ifname: String,
    },
    /// A netlink request failed.
    #[error(transparent)]
    Netlink(#[from] common::netlink::NetlinkError),
    /// A sysctl of the config does not exist in the container.
    #[error("{origin} key {key:?} (value {value:?}) does not exist in the container netns")]
    SysctlMissing {
        /// `sysctl` or `args.cni.sysctl`.
        origin: &'static str,
        /// The key as written in the config.
        key: String,
        /// Its value.
        value: String,
    },
    /// A sysctl read or write failed.
    #[error(transparent)]
    Sysctl(#[from] common::sysctl::SysctlError),
    /// A backup file operation failed.
    #[error("failed to {op} backup file {path:?}: {source}")]
    Backup {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A backup file that is not the JSON either plugin writes.
    #[error("backup file {path:?} is not valid: {reason}")]
    BackupCorrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The data dir lock could not be taken.
    #[error(transparent)]
    Lock(#[from] common::lock::LockError),
    /// CHECK found a live value different from the configured one.
    #[error("{0}")]
    Drift(String),
    /// DEL could not restore everything; the backup file is kept for a retry.
    #[error("failed to restore {ifname}: {}", .errors.join("; "))]
    Restore {
        /// The interface.
        ifname: String,
        /// Each failure.
        errors: Vec<String>,
    },
    /// ADD failed and undoing its earlier steps failed too.
    #[error("{cause}; rolling back also failed: {}", .rollback.join("; "))]
    RollbackFailed {
        /// The failure that started the rollback.
        cause: Box<TuningError>,
        /// What could not be undone.
        rollback: Vec<String>,
    },
}

impl From<TuningError> for CniError {
    fn from(err: TuningError) -> Self {
        let code = match &err {
            TuningError::Decode { .. } => ErrorCode::Decode,
            TuningError::InvalidSysctl { .. }
            | TuningError::SysctlNotAllowed { .. }
            | TuningError::ArgsSysctlWithoutSysctl { .. }
            | TuningError::InvalidValue { .. }
            | TuningError::AllowlistPattern { .. }
            | TuningError::MissingPrevResult
            | TuningError::SysctlMissing { .. } => ErrorCode::InvalidConfig,
            TuningError::Args(e) => return e.clone().into(),
            TuningError::Netns(_) => ErrorCode::InvalidNetns,
            TuningError::LinkNotFound { .. } => ErrorCode::UnknownContainer,
            TuningError::Lock(common::lock::LockError::Timeout { .. }) => ErrorCode::TryAgainLater,
            TuningError::AllowlistRead { .. }
            | TuningError::Backup { .. }
            | TuningError::Lock(_) => ErrorCode::Io,
            TuningError::Netlink(_)
            | TuningError::Sysctl(_)
            | TuningError::BackupCorrupt { .. }
            | TuningError::Drift(_)
            | TuningError::Restore { .. }
            | TuningError::RollbackFailed { .. } => ErrorCode::Internal,
        };
        let cni = CniError::from_error(code, &err);
        match err {
            TuningError::SysctlNotAllowed { allowed, .. } => {
                cni.with_details(format!("allowed (whole-key patterns): {allowed:?}"))
            }
            _ => cni,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_errors_are_code_7_and_name_key_and_value() {
        let err: CniError = TuningError::InvalidSysctl {
            origin: "sysctl",
            key: "kernel.panic".into(),
            value: "1".into(),
            reason: "only net.* sysctls can be set".into(),
        }
        .into();
        assert_eq!(err.code, ErrorCode::InvalidConfig);
        assert!(err.msg.contains("\"kernel.panic\""), "{}", err.msg);
        assert!(err.msg.contains("\"1\""), "{}", err.msg);
        let err: CniError = TuningError::InvalidValue {
            key: "mtu".into(),
            value: "70000".into(),
            reason: "out of range".into(),
        }
        .into();
        assert_eq!(err.code, ErrorCode::InvalidConfig);
        assert_eq!(err.msg, "invalid mtu 70000: out of range");
    }

    #[test]
    fn an_allowlist_refusal_lists_the_patterns_in_details() {
        let err: CniError = TuningError::SysctlNotAllowed {
            origin: "sysctl",
            key: "net.core.somaxconn".into(),
            value: "1024".into(),
            file: "/etc/cni/tuning/allowlist.conf".into(),
            allowed: vec!["net.ipv4.conf.IFNAME.*".into()],
        }
        .into();
        assert_eq!(err.code, ErrorCode::InvalidConfig);
        assert!(
            err.details.contains("net.ipv4.conf.IFNAME.*"),
            "{}",
            err.details
        );
    }
}
