//! The plugin's errors and their CNI codes.
//!
//! Where the Go reference reports an error for the same condition, the message is the
//! reference's, word for word (scripts match on it), and what we know beyond it (the field and
//! value, the object, the kernel's answer) goes in the error's `details`.

use cni::error::{CniError, ErrorCode};
use host::netns::NetnsError;
use netlink::{NetlinkError, OpenError};

/// A step of ADD the reference reports with a prefix of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The root `tbf` of the shaped device.
    DeviceQdisc,
    /// Creating the IFB device.
    AddIfb,
    /// The `ingress` qdisc of the shaped device.
    IngressQdisc,
    /// The redirect filter.
    Filter,
    /// The root `tbf` of the IFB.
    IfbQdisc,
}

impl Step {
    /// The reference's prefix for a failure of this step.
    pub fn prefix(self) -> &'static str {
        match self {
            Step::DeviceQdisc => "create qdisc",
            Step::AddIfb => "adding link",
            Step::IngressQdisc => "create ingress qdisc",
            Step::Filter => "add filter",
            Step::IfbQdisc => "create ifb qdisc: create qdisc",
        }
    }
}

/// The reference's message for ADD without a `prevResult`.
pub const NOT_CHAINED_ADD: &str = "must be called as chained plugin";
/// The reference's message for CHECK without a `prevResult`.
pub const NOT_CHAINED_CHECK: &str = "must be called as a chained plugin";
/// The reference's message for CHECK when the IFB is missing (its lookup error included).
pub const IFB_NOT_FOUND: &str = "get ifb device: Link not found";

/// Everything that can go wrong in this plugin.
#[derive(Debug, thiserror::Error)]
pub enum BandwidthError {
    /// A config value is invalid: `msg` is the reference's text for the condition where it has
    /// one, `details` names the field and value.
    #[error("{msg}")]
    Config {
        /// The message.
        msg: String,
        /// The field, its value and why.
        details: String,
    },
    /// ADD or CHECK without a `prevResult` (the reference's texts differ by verb).
    #[error("{}", if *.0 == "CHECK" { NOT_CHAINED_CHECK } else { NOT_CHAINED_ADD })]
    NotChained(&'static str),
    /// The container's interface is not in its namespace.
    #[error(
        "container interface {ifname} has no veth peer: could not look up {ifname:?}: {}",
        if source.is_not_found() { "Link not found".to_owned() } else { source.go_text() }
    )]
    NoContainerInterface {
        /// `CNI_IFNAME`.
        ifname: String,
        /// The lookup failure.
        #[source]
        source: NetlinkError,
    },
    /// `CNI_NETNS` could not be opened (reported in the reference's words).
    #[error(transparent)]
    OpenNetns(NetnsError),
    /// The container namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A netlink socket could not be opened in a namespace.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A step of ADD failed, reported as the reference reports it.
    #[error("{}: {}", .step.prefix(), .source.go_text())]
    Step {
        /// The step.
        step: Step,
        /// The kernel's refusal.
        #[source]
        source: NetlinkError,
    },
    /// A netlink request failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The scheduler clock could not be read.
    #[error("failed to read {path}: {0}", path = netlink::tc::PSCHED_PATH)]
    Psched(#[source] std::io::Error),
    /// Both names an IFB of this attachment may have are held by other links.
    #[error("cannot create an ifb device: {names} are held by links of other attachments")]
    IfbNamesTaken {
        /// The names.
        names: String,
        /// What holds them.
        what: String,
    },
    /// The interface already has an ingress-side qdisc we cannot share.
    #[error("interface {ifname} already has a {kind} qdisc at ffff:, not an ingress qdisc")]
    ForeignIngressQdisc {
        /// The interface.
        ifname: String,
        /// The kind found.
        kind: String,
    },
    /// CHECK found the kernel state differs from the config: `msg` is the reference's text
    /// where it checks the same thing, `details` says what differs.
    #[error("{msg}")]
    Drift {
        /// The message.
        msg: String,
        /// The object and the values found and wanted.
        details: String,
    },
    /// STATUS could not create an IFB device or a tbf qdisc.
    #[error("bandwidth shaping is unavailable: {0}")]
    Unavailable(String),
    /// DEL or GC failures, all of them.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<BandwidthError>),
}

impl BandwidthError {
    /// A config error with the reference's (or our own) `msg` and the field in `details`.
    pub fn config(msg: impl Into<String>, details: impl Into<String>) -> BandwidthError {
        BandwidthError::Config {
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// A CHECK drift with `msg` and what differs in `details`.
    pub fn drift(msg: impl Into<String>, details: impl Into<String>) -> BandwidthError {
        BandwidthError::Drift {
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// A closure wrapping the failure of an ADD `step`.
    pub fn step(step: Step) -> impl Fn(NetlinkError) -> BandwidthError {
        move |source| BandwidthError::Step { step, source }
    }

    /// The `details` of the error object.
    fn details(&self) -> String {
        match self {
            BandwidthError::Config { details, .. } | BandwidthError::Drift { details, .. } => {
                details.clone()
            }
            BandwidthError::NotChained(verb) => {
                format!("{verb} needs the prevResult of the plugins before it in the chain")
            }
            BandwidthError::NoContainerInterface { source, .. }
            | BandwidthError::Step { source, .. } => source.to_string(),
            BandwidthError::IfbNamesTaken { what, .. } => what.clone(),
            BandwidthError::Several(errors) => errors
                .iter()
                .map(BandwidthError::details)
                .filter(|d| !d.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
            other => causes(other),
        }
    }
}

/// The chain of `err`'s causes, as [`CniError::from_error`] puts them in `details`.
fn causes(err: &dyn std::error::Error) -> String {
    let mut causes = Vec::new();
    let mut source = err.source();
    while let Some(cause) = source {
        causes.push(cause.to_string());
        source = cause.source();
    }
    causes.join(": ")
}

impl From<BandwidthError> for CniError {
    fn from(err: BandwidthError) -> Self {
        let code = match &err {
            BandwidthError::OpenNetns(e) => {
                let code = if e.is_internal() {
                    ErrorCode::Internal
                } else {
                    ErrorCode::InvalidNetns
                };
                return CniError::from_error(code, e).reworded_as(e.reference_msg());
            }
            BandwidthError::Config { .. } | BandwidthError::NotChained(_) => {
                ErrorCode::InvalidConfig
            }
            BandwidthError::Netns(_) | BandwidthError::Open(OpenError::Netns(_)) => {
                ErrorCode::InvalidNetns
            }
            BandwidthError::Unavailable(_) => ErrorCode::PluginNotAvailable,
            BandwidthError::NoContainerInterface { .. }
            | BandwidthError::Open(OpenError::Netlink(_))
            | BandwidthError::Step { .. }
            | BandwidthError::Netlink(_)
            | BandwidthError::Psched(_)
            | BandwidthError::IfbNamesTaken { .. }
            | BandwidthError::ForeignIngressQdisc { .. }
            | BandwidthError::Drift { .. }
            | BandwidthError::Several(_) => ErrorCode::Internal,
        };
        CniError::new(code, err.to_string()).with_details(err.details())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn nl_err(op: &str, errno: i32) -> NetlinkError {
        NetlinkError {
            op: op.into(),
            source: io::Error::from_raw_os_error(errno),
        }
    }

    #[test]
    fn messages_are_the_references_and_our_specifics_go_in_details() {
        let cases: Vec<(BandwidthError, u32, &str, &str)> = vec![
            (
                BandwidthError::NotChained("ADD"),
                7,
                "must be called as chained plugin",
                "ADD needs",
            ),
            (
                BandwidthError::NotChained("CHECK"),
                7,
                "must be called as a chained plugin",
                "CHECK needs",
            ),
            (
                BandwidthError::NoContainerInterface {
                    ifname: "eth0".into(),
                    source: nl_err("get link \"eth0\"", libc::ENODEV),
                },
                999,
                "container interface eth0 has no veth peer: could not look up \"eth0\": Link not found",
                "get link \"eth0\"",
            ),
            (
                BandwidthError::Step {
                    step: Step::DeviceQdisc,
                    source: nl_err("add tbf qdisc on link 7", libc::EEXIST),
                },
                999,
                "create qdisc: file exists",
                "add tbf qdisc on link 7",
            ),
            (
                BandwidthError::Step {
                    step: Step::IfbQdisc,
                    source: nl_err("add tbf qdisc on link 9", libc::ENOMEM),
                },
                999,
                "create ifb qdisc: create qdisc: cannot allocate memory",
                "link 9",
            ),
            (
                BandwidthError::Step {
                    step: Step::AddIfb,
                    source: nl_err("add ifb link \"bwp0\"", libc::EPERM),
                },
                999,
                "adding link: operation not permitted",
                "bwp0",
            ),
            (
                BandwidthError::Step {
                    step: Step::IngressQdisc,
                    source: nl_err("add ingress qdisc", libc::EINVAL),
                },
                999,
                "create ingress qdisc: invalid argument",
                "add ingress qdisc",
            ),
            (
                BandwidthError::Step {
                    step: Step::Filter,
                    source: nl_err("add filter", libc::ENOENT),
                },
                999,
                "add filter: no such file or directory",
                "add filter",
            ),
            (
                BandwidthError::drift("Rate doesn't match", "veth1: tbf rate is 1 B/s, want 2"),
                999,
                "Rate doesn't match",
                "veth1: tbf rate is 1 B/s, want 2",
            ),
            (
                BandwidthError::config(
                    "if rate is set, burst must also be set",
                    "ingressRate is 8000 but ingressBurst is 0 or missing",
                ),
                7,
                "if rate is set, burst must also be set",
                "ingressRate is 8000",
            ),
        ];
        for (err, code, msg, details) in cases {
            let cni = CniError::from(err);
            assert_eq!(cni.code.as_u32(), code, "{cni:?}");
            assert_eq!(cni.msg, msg);
            assert!(cni.details.contains(details), "{cni:?}");
        }
    }

    #[test]
    fn several_errors_join_messages_and_details() {
        let cni = CniError::from(BandwidthError::Several(vec![
            BandwidthError::Netlink(nl_err("delete link 5", libc::EPERM)),
            BandwidthError::drift("a", "b"),
        ]));
        assert_eq!(cni.code, ErrorCode::Internal);
        assert!(
            cni.msg.contains("delete link 5") && cni.msg.ends_with("; a"),
            "{cni:?}"
        );
        assert!(cni.details.contains('b'), "{cni:?}");
    }
}
