//! Errors of the sbr plugin and their CNI error objects.
//!
//! Where the reference reports an error for the same condition, the object's `msg` is the
//! reference's message word for word ([`SbrError::reference_msg`]) and `details` is ours (the
//! [`std::fmt::Display`] text naming the key, value or object, and its causes); where only we
//! refuse something, `msg` is ours. Codes are the spec's.

use std::net::IpAddr;

use cni::error::{CniError, ErrorCode, go_errno};
use host::lock::LockError;
use host::netns::NetnsError;
use netlink::NetlinkError;

/// Everything that can go wrong in sbr.
#[derive(Debug, thiserror::Error)]
pub enum SbrError {
    /// `table` is no table sbr may use (code 7; the reference takes any integer).
    #[error(
        "table: invalid routing table {0}: must be 1 to 4294967295 and not 253, 254 or 255 (the \
         kernel's default, main and local tables)"
    )]
    InvalidTable(i64),
    /// `gateways` has more than two entries (code 7).
    #[error("gateways: at most 2 entries (one IPv4, one IPv6), got {0}")]
    TooManyGateways(usize),
    /// An entry of `gateways` is not an IP address (code 7).
    #[error("gateways[{index}]: {text:?} is not an IP address")]
    BadGateway {
        /// Its position.
        index: usize,
        /// The entry.
        text: String,
    },
    /// `gateways` has two addresses of one family (code 7).
    #[error("gateways[{index}]: a second {family} address: {first} and {second}")]
    DuplicateGateway {
        /// The position of the second one.
        index: usize,
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The first address of the family.
        first: IpAddr,
        /// The second one, as written.
        second: String,
    },
    /// The prevResult has no address at all (code 7).
    #[error("prevResult lists no IP address (interface {ifname})")]
    NoAddresses {
        /// `CNI_IFNAME`.
        ifname: String,
    },
    /// Every table id from 100 up is taken (code 7; the reference would wrap around).
    #[error("no free routing table from 100 up for {0}")]
    NoFreeTable(IpAddr),
    /// No prevResult on ADD or CHECK (code 7).
    #[error("sbr must be called as a chained plugin: prevResult is missing")]
    NotChained,
    /// The container namespace could not be opened or entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The per-namespace lock could not be taken (code 11 after the wait).
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The container interface does not exist.
    #[error("interface {ifname} does not exist in the container")]
    LinkNotFound {
        /// The reference's words for the step (`Cannot find network interface eth0`).
        lead: String,
        /// `CNI_IFNAME`.
        ifname: String,
    },
    /// A netlink request failed; `lead` is the reference's words for the step where it has
    /// one (`Failed to list all rules`), ours otherwise.
    #[error("{lead}: {source}")]
    Kernel {
        /// What was being done.
        lead: String,
        /// The failure.
        #[source]
        source: NetlinkError,
    },
    /// ADD failed and was rolled back; `undo` lists what could not be undone.
    #[error("{lead}: {cause}{}", rollback_note(.undo))]
    Add {
        /// The step that failed, in the reference's words (`Failed to add rule`).
        lead: String,
        /// Its failure.
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
        /// The reference's message for the last failure, when it makes that step too.
        reference: Option<String>,
    },
}

fn rollback_note(undo: &[String]) -> String {
    if undo.is_empty() {
        String::new()
    } else {
        format!(" (rollback left behind: {})", undo.join("; "))
    }
}

impl SbrError {
    /// The reference plugin's message for the same condition; `None` where only we refuse.
    pub fn reference_msg(&self) -> Option<String> {
        Some(match self {
            SbrError::TooManyGateways(_) => {
                "gateways list cannot contain more than 2 entries (one IPv4, one IPv6)".to_string()
            }
            SbrError::BadGateway { text, .. } => {
                format!("invalid static gateway IP address: {text}")
            }
            SbrError::DuplicateGateway {
                family,
                first,
                second,
                ..
            } => {
                format!("gateways list contains multiple {family} addresses: {first} and {second}")
            }
            SbrError::NoAddresses { ifname } => {
                format!("No IP addresses supplied on interface: {ifname}")
            }
            SbrError::NotChained => "This plugin must be called as chained plugin".to_string(),
            SbrError::LinkNotFound { lead, .. } => format!("{lead}: Link not found"),
            SbrError::Kernel { lead, source } => format!("{lead}: {}", go_errno(&source.source)),
            SbrError::Add { lead, cause, .. } => format!("{lead}: {}", go_errno(&cause.source)),
            SbrError::Del { reference, .. } => return reference.clone(),
            SbrError::InvalidTable(_)
            | SbrError::NoFreeTable(_)
            | SbrError::Netns(_)
            | SbrError::Lock(_)
            | SbrError::Check { .. } => return None,
        })
    }
}

impl From<SbrError> for CniError {
    fn from(err: SbrError) -> Self {
        let err = match err {
            SbrError::Netns(e) => {
                let code = if e.is_internal() {
                    ErrorCode::Internal
                } else {
                    ErrorCode::InvalidNetns
                };
                return CniError::from_error(code, &e).reworded_as(e.reference_msg());
            }
            SbrError::Lock(e) => {
                let code = if matches!(e, host::lock::LockError::Timeout { .. }) {
                    ErrorCode::TryAgainLater
                } else {
                    ErrorCode::Io
                };
                return CniError::from_error(code, &e);
            }
            other => other,
        };
        let code = match err {
            SbrError::InvalidTable(_)
            | SbrError::TooManyGateways(_)
            | SbrError::BadGateway { .. }
            | SbrError::DuplicateGateway { .. }
            | SbrError::NoAddresses { .. }
            | SbrError::NoFreeTable(_)
            | SbrError::NotChained => ErrorCode::InvalidConfig,
            SbrError::LinkNotFound { .. } => ErrorCode::UnknownContainer,
            _ => ErrorCode::Internal,
        };
        CniError::from_error(code, &err).reworded_as(err.reference_msg())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn netlink(op: &str, errno: i32) -> NetlinkError {
        NetlinkError {
            op: op.into(),
            source: std::io::Error::from_raw_os_error(errno),
        }
    }

    #[test]
    fn messages_are_the_references_and_our_account_goes_to_details() {
        // (error, code, msg, a piece of the details)
        let cases: Vec<(SbrError, u32, &str, &str)> = vec![
            (
                SbrError::NotChained,
                7,
                "This plugin must be called as chained plugin",
                "prevResult is missing",
            ),
            (
                SbrError::NoAddresses {
                    ifname: "net1".into(),
                },
                7,
                "No IP addresses supplied on interface: net1",
                "prevResult lists no IP address",
            ),
            (
                SbrError::TooManyGateways(3),
                7,
                "gateways list cannot contain more than 2 entries (one IPv4, one IPv6)",
                "got 3",
            ),
            (
                SbrError::BadGateway {
                    index: 1,
                    text: "x".into(),
                },
                7,
                "invalid static gateway IP address: x",
                "gateways[1]: \"x\" is not an IP address",
            ),
            (
                SbrError::DuplicateGateway {
                    index: 1,
                    family: "IPv4",
                    first: "10.0.0.1".parse().unwrap(),
                    second: "10.0.0.2".into(),
                },
                7,
                "gateways list contains multiple IPv4 addresses: 10.0.0.1 and 10.0.0.2",
                "gateways[1]",
            ),
            (
                SbrError::LinkNotFound {
                    lead: "Cannot find network interface net1".into(),
                    ifname: "net1".into(),
                },
                3,
                "Cannot find network interface net1: Link not found",
                "does not exist in the container",
            ),
            (
                SbrError::Kernel {
                    lead: "Failed to list all rules".into(),
                    source: netlink("dump rules", libc::ENOBUFS),
                },
                999,
                "Failed to list all rules: no buffer space available",
                "netlink: failed to dump rules",
            ),
            (
                SbrError::Add {
                    lead: "Failed to add default route to 10.1.0.1".into(),
                    cause: netlink("add route", libc::ENETUNREACH),
                    undo: Vec::new(),
                },
                999,
                "Failed to add default route to 10.1.0.1: network is unreachable",
                "netlink: failed to add route",
            ),
            (
                SbrError::Del {
                    ifname: "net1".into(),
                    failures: vec!["delete rule: x".into()],
                    reference: Some("Failed to delete rule operation not permitted".into()),
                },
                999,
                "Failed to delete rule operation not permitted",
                "sbr DEL of net1 failed: delete rule: x",
            ),
        ];
        for (err, code, msg, details) in cases {
            let text = err.to_string();
            let cni = CniError::from(err);
            assert_eq!((cni.code.as_u32(), cni.msg.as_str()), (code, msg), "{text}");
            assert!(cni.details.contains(details), "{text}: {}", cni.details);
        }
    }

    #[test]
    fn errors_only_we_raise_keep_our_message() {
        let cni = CniError::from(SbrError::InvalidTable(254));
        assert_eq!(cni.code, ErrorCode::InvalidConfig);
        assert!(
            cni.msg.starts_with("table: invalid routing table 254"),
            "{}",
            cni.msg
        );
        let cni = CniError::from(SbrError::Check {
            ifname: "net1".into(),
            missing: vec!["rule x is missing".into()],
        });
        assert_eq!(cni.msg, "sbr CHECK of net1 failed: rule x is missing");
    }
}
