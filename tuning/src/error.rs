//! Everything that can go wrong in the tuning plugin, and its CNI error object.
//!
//! Where the reference reports an error for the same condition, the object's `msg` is the
//! reference's message word for word ([`TuningError::reference_msg`]) and `details` is ours
//! (the [`std::fmt::Display`] text, naming the key, value, file or interface, and its causes);
//! where only we refuse something, `msg` is ours. Codes are the spec's.

use std::path::PathBuf;

use cni::error::{CniError, ErrorCode, go_errno, go_quote};

/// A tuning failure, naming the key, value, file or interface involved.
#[derive(Debug, thiserror::Error)]
pub enum TuningError {
    /// The top-level `sysctl` object names a key twice.
    #[error("the top-level sysctl object names {key:?} more than once")]
    DuplicateSysctlKey {
        /// The key, as written.
        key: String,
    },
    /// A sysctl key that may not be set.
    #[error("{origin} key {key:?} (value {value:?}) is invalid: {problem}")]
    InvalidSysctl {
        /// `sysctl` or `args.cni.sysctl`.
        origin: &'static str,
        /// The key as written in the config.
        key: String,
        /// Its value.
        value: String,
        /// Why it is refused.
        problem: SysctlProblem,
    },
    /// A sysctl key that the operator's allowlist does not permit.
    #[error(
        "{origin} key {key:?} (value {value:?}) matches no line of {file} (each line must match \
         the whole key)"
    )]
    SysctlNotAllowed {
        /// `sysctl` or `args.cni.sysctl`.
        origin: &'static str,
        /// The key as written in the config.
        key: String,
        /// Its value.
        value: String,
        /// The allowlist file.
        file: PathBuf,
        /// The allowlist's patterns.
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
    /// A MAC address that does not parse.
    #[error(
        "{origin} {text:?} is not a MAC address (6, 8 or 20 hex octets separated by : or -, or \
         groups of 4 hex digits separated by .)"
    )]
    InvalidMac {
        /// Where it came from (`mac`, `CNI_ARGS MAC`, `runtimeConfig.mac`, `args.cni.mac`).
        origin: &'static str,
        /// The address as given.
        text: String,
    },
    /// An MTU the kernel would refuse (the reference passes it on and reports the kernel's
    /// refusal).
    #[error("invalid {key} {value}: {reason}")]
    InvalidMtu {
        /// `mtu` or `args.cni.mtu`.
        key: String,
        /// The value as given.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// A link attribute value only we refuse (`txQLen` out of range, a MAC of the wrong length).
    #[error("invalid {key} {value}: {reason}")]
    InvalidValue {
        /// The key, with its source (`txQLen`, `args.cni.txQLen`, `CNI_ARGS MAC`…).
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
    Args(#[from] cni::args::ArgsError),
    /// ADD or CHECK without a `prevResult`.
    #[error("tuning must be called as a chained plugin: prevResult is missing")]
    MissingPrevResult,
    /// The container namespace cannot be opened or entered.
    #[error(transparent)]
    Netns(#[from] host::netns::NetnsError),
    /// `CNI_IFNAME` does not exist in the container (ADD).
    #[error("interface {ifname:?} not found in the container netns")]
    LinkNotFound {
        /// The interface.
        ifname: String,
    },
    /// `CNI_IFNAME` does not exist in the container (CHECK).
    #[error("interface {ifname:?} not found in the container netns")]
    CheckLinkNotFound {
        /// The interface.
        ifname: String,
    },
    /// A netlink request failed.
    #[error(transparent)]
    Netlink(#[from] netlink::NetlinkError),
    /// A sysctl of the config does not exist in the container.
    #[error("{origin} key {key:?} (value {value:?}) does not exist in the container netns")]
    SysctlMissing {
        /// `sysctl` or `args.cni.sysctl`.
        origin: &'static str,
        /// The key as written in the config.
        key: String,
        /// Its value.
        value: String,
        /// The resolved path under `/proc/sys`.
        path: String,
    },
    /// A sysctl read or write failed.
    #[error(transparent)]
    Sysctl(#[from] host::sysctl::SysctlError),
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
    Lock(#[from] host::lock::LockError),
    /// CHECK found a live value different from the configured one.
    #[error("{ours}")]
    Drift {
        /// The reference's message for it.
        reference: String,
        /// Ours, naming the key or attribute, both values and where the setting came from.
        ours: String,
    },
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

/// Why a sysctl key or value is refused.
#[derive(Debug)]
pub enum SysctlProblem {
    /// It names no network sysctl once resolved, which the reference refuses too; `converted`
    /// is the key as the reference converts it (dots to slashes, `IFNAME` replaced).
    NotNet {
        /// The reference's converted key.
        converted: String,
    },
    /// It has an empty, `.` or `..` component but stays under `net/` (only we refuse it).
    BadComponent(String),
    /// It names a directory of sysctls, not one (`/proc/sys/<path>`).
    Directory {
        /// The path under `/proc/sys`.
        path: String,
    },
    /// The kernel refused the value.
    Refused {
        /// The path under `/proc/sys`.
        path: String,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

impl std::fmt::Display for SysctlProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SysctlProblem::NotNet { .. } => f.write_str("only network sysctls (net.*) can be set"),
            SysctlProblem::BadComponent(why) => f.write_str(why),
            SysctlProblem::Directory { path } => {
                write!(f, "{path} is a directory of sysctls, not one")
            }
            SysctlProblem::Refused { source, .. } => {
                write!(f, "the kernel refused the value ({source})")
            }
        }
    }
}

impl TuningError {
    /// The reference plugin's message for the same condition; `None` where only we refuse.
    pub fn reference_msg(&self) -> Option<String> {
        Some(match self {
            TuningError::DuplicateSysctlKey { .. } => {
                "duplicated sysctl keys are not allowed".to_string()
            }
            TuningError::InvalidSysctl { problem, .. } => match problem {
                SysctlProblem::NotNet { converted } => {
                    format!("invalid net sysctl key: {}", go_quote(converted))
                }
                SysctlProblem::BadComponent(_) => return None,
                SysctlProblem::Directory { path } => {
                    format!("open /proc/sys/{path}: is a directory")
                }
                SysctlProblem::Refused { path, source } => {
                    format!("write /proc/sys/{path}: {}", go_errno(source))
                }
            },
            TuningError::SysctlNotAllowed { key, allowed, .. } => format!(
                "Sysctl {key} is not allowed. Only the following sysctls are allowed: [{}]",
                allowed.join(" ")
            ),
            TuningError::InvalidMac { text, .. } => {
                format!("invalid args {text} for MAC addr: address {text}: invalid MAC address")
            }
            TuningError::InvalidMtu { .. } => "invalid argument".to_string(),
            TuningError::AllowlistPattern {
                pattern, source, ..
            } => {
                let first = source.to_string();
                let first = first.lines().next().unwrap_or_default().to_string();
                format!("error parsing regexp: {first}: `{pattern}`")
            }
            TuningError::AllowlistRead { file, source } => {
                format!("open {}: {}", file.display(), go_errno(source))
            }
            TuningError::MissingPrevResult => "Required prevResult missing".to_string(),
            TuningError::LinkNotFound { ifname } => {
                format!("failed to get {}: Link not found", go_quote(ifname))
            }
            TuningError::CheckLinkNotFound { ifname } => {
                format!("Cannot find container link {ifname}")
            }
            TuningError::Netlink(e) => go_errno(&e.source),
            TuningError::SysctlMissing { path, .. } => {
                format!("open /proc/sys/{path}: no such file or directory")
            }
            TuningError::Sysctl(e) => {
                let op = match e.source.raw_os_error() {
                    Some(
                        libc::ENOENT | libc::EACCES | libc::EISDIR | libc::ENOTDIR | libc::ELOOP,
                    ) => "open",
                    _ => e.op,
                };
                format!(
                    "{op} /proc/sys/{}: {}",
                    e.key.as_path(),
                    go_errno(&e.source)
                )
            }
            TuningError::Drift { reference, .. } => reference.clone(),
            TuningError::RollbackFailed { cause, .. } => return cause.reference_msg(),
            TuningError::ArgsSysctlWithoutSysctl { .. }
            | TuningError::InvalidValue { .. }
            | TuningError::Args(_)
            | TuningError::Netns(_)
            | TuningError::Backup { .. }
            | TuningError::BackupCorrupt { .. }
            | TuningError::Lock(_)
            | TuningError::Restore { .. } => return None,
        })
    }
}

impl From<TuningError> for CniError {
    fn from(err: TuningError) -> Self {
        let err = match err {
            TuningError::Args(e) => return e.into(),
            TuningError::Netns(e) => {
                let code = if e.is_internal() {
                    ErrorCode::Internal
                } else {
                    ErrorCode::InvalidNetns
                };
                return CniError::from_error(code, &e).reworded_as(e.reference_msg());
            }
            other => other,
        };
        let code = match &err {
            TuningError::DuplicateSysctlKey { .. }
            | TuningError::InvalidSysctl { .. }
            | TuningError::SysctlNotAllowed { .. }
            | TuningError::ArgsSysctlWithoutSysctl { .. }
            | TuningError::InvalidMac { .. }
            | TuningError::InvalidMtu { .. }
            | TuningError::InvalidValue { .. }
            | TuningError::AllowlistPattern { .. }
            | TuningError::MissingPrevResult
            | TuningError::SysctlMissing { .. } => ErrorCode::InvalidConfig,
            TuningError::Args(_) => ErrorCode::InvalidEnv,
            TuningError::Netns(_) => ErrorCode::InvalidNetns,
            TuningError::LinkNotFound { .. } | TuningError::CheckLinkNotFound { .. } => {
                ErrorCode::UnknownContainer
            }
            TuningError::Lock(host::lock::LockError::Timeout { .. }) => ErrorCode::TryAgainLater,
            TuningError::AllowlistRead { .. }
            | TuningError::Backup { .. }
            | TuningError::Lock(_) => ErrorCode::Io,
            TuningError::Netlink(_)
            | TuningError::Sysctl(_)
            | TuningError::BackupCorrupt { .. }
            | TuningError::Drift { .. }
            | TuningError::Restore { .. }
            | TuningError::RollbackFailed { .. } => ErrorCode::Internal,
        };
        CniError::from_error(code, &err).reworded_as(err.reference_msg())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cni(err: TuningError) -> CniError {
        err.into()
    }

    #[test]
    fn messages_are_the_references_and_our_account_goes_to_details() {
        let io = |errno| std::io::Error::from_raw_os_error(errno);
        // (error, code, msg, a piece of the details)
        let cases: Vec<(TuningError, u32, &str, &str)> = vec![
            (
                TuningError::DuplicateSysctlKey {
                    key: "net.ipv4.ip_forward".into(),
                },
                7,
                "duplicated sysctl keys are not allowed",
                "\"net.ipv4.ip_forward\" more than once",
            ),
            (
                TuningError::InvalidSysctl {
                    origin: "sysctl",
                    key: "kernel.panic".into(),
                    value: "1".into(),
                    problem: SysctlProblem::NotNet {
                        converted: "kernel/panic".into(),
                    },
                },
                7,
                r#"invalid net sysctl key: "kernel/panic""#,
                r#"sysctl key "kernel.panic" (value "1") is invalid: only network sysctls"#,
            ),
            (
                TuningError::InvalidSysctl {
                    origin: "sysctl",
                    key: "net.ipv4.conf".into(),
                    value: "1".into(),
                    problem: SysctlProblem::Directory {
                        path: "net/ipv4/conf".into(),
                    },
                },
                7,
                "open /proc/sys/net/ipv4/conf: is a directory",
                "is a directory of sysctls",
            ),
            (
                TuningError::InvalidSysctl {
                    origin: "args.cni.sysctl",
                    key: "net.ipv4.ip_forward".into(),
                    value: "x".into(),
                    problem: SysctlProblem::Refused {
                        path: "net/ipv4/ip_forward".into(),
                        source: io(libc::EINVAL),
                    },
                },
                7,
                "write /proc/sys/net/ipv4/ip_forward: invalid argument",
                "args.cni.sysctl key",
            ),
            (
                TuningError::SysctlNotAllowed {
                    origin: "sysctl",
                    key: "net.core.somaxconn".into(),
                    value: "1024".into(),
                    file: "/etc/cni/tuning/allowlist.conf".into(),
                    allowed: vec![
                        "net.ipv4.conf.IFNAME.*".into(),
                        "net.ipv4.ip_forward".into(),
                    ],
                },
                7,
                "Sysctl net.core.somaxconn is not allowed. Only the following sysctls are \
                 allowed: [net.ipv4.conf.IFNAME.* net.ipv4.ip_forward]",
                "matches no line of /etc/cni/tuning/allowlist.conf",
            ),
            (
                TuningError::InvalidMac {
                    origin: "mac",
                    text: "zz:00:00:00:00:01".into(),
                },
                7,
                "invalid args zz:00:00:00:00:01 for MAC addr: address zz:00:00:00:00:01: \
                 invalid MAC address",
                "mac \"zz:00:00:00:00:01\" is not a MAC address",
            ),
            (
                TuningError::InvalidMtu {
                    key: "mtu".into(),
                    value: "70000".into(),
                    reason: "must be between 68 and 65535".into(),
                },
                7,
                "invalid argument",
                "invalid mtu 70000: must be between 68 and 65535",
            ),
            (
                TuningError::MissingPrevResult,
                7,
                "Required prevResult missing",
                "chained plugin",
            ),
            (
                TuningError::LinkNotFound {
                    ifname: "eth9".into(),
                },
                3,
                r#"failed to get "eth9": Link not found"#,
                "not found in the container netns",
            ),
            (
                TuningError::CheckLinkNotFound {
                    ifname: "eth9".into(),
                },
                3,
                "Cannot find container link eth9",
                "not found in the container netns",
            ),
            (
                TuningError::SysctlMissing {
                    origin: "sysctl",
                    key: "net.ipv4.nonexistent".into(),
                    value: "1".into(),
                    path: "net/ipv4/nonexistent".into(),
                },
                7,
                "open /proc/sys/net/ipv4/nonexistent: no such file or directory",
                "does not exist in the container netns",
            ),
            (
                TuningError::Netlink(netlink::NetlinkError {
                    op: "set link 3".into(),
                    source: io(libc::EBUSY),
                }),
                999,
                "device or resource busy",
                "netlink: failed to set link 3",
            ),
            (
                TuningError::Drift {
                    reference:
                        "Error: Tuning configured MTU of eth0 is 1400, current value is 1500".into(),
                    ours: "eth0 mtu is 1500, configured 1400".into(),
                },
                999,
                "Error: Tuning configured MTU of eth0 is 1400, current value is 1500",
                "eth0 mtu is 1500, configured 1400",
            ),
        ];
        for (err, code, msg, details) in cases {
            let text = err.to_string();
            let cni = cni(err);
            assert_eq!((cni.code.as_u32(), cni.msg.as_str()), (code, msg), "{text}");
            assert!(cni.details.contains(details), "{text}: {}", cni.details);
        }
    }

    #[test]
    fn errors_only_we_raise_keep_our_message() {
        let e = cni(TuningError::InvalidValue {
            key: "txQLen".into(),
            value: "-1".into(),
            reason: "must be between 0 and 4294967295".into(),
        });
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert_eq!(e.msg, "invalid txQLen -1: must be between 0 and 4294967295");
        // A rollback that failed too is reported with the reference's words for the cause.
        let e = cni(TuningError::RollbackFailed {
            cause: Box::new(TuningError::Netlink(netlink::NetlinkError {
                op: "set link 3".into(),
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            })),
            rollback: vec!["mtu: gone".into()],
        });
        assert_eq!(e.msg, "invalid argument");
        assert!(e.details.contains("rolling back also failed: mtu: gone"));
    }
}
