//! The plugin's errors and their CNI codes.

use common::error::{CniError, ErrorCode};
use common::netlink::{NetlinkError, OpenError};
use common::netns::NetnsError;

/// Everything that can go wrong in this plugin.
#[derive(Debug, thiserror::Error)]
pub enum BandwidthError {
    /// A config value is invalid (the message names the field).
    #[error("{0}")]
    Config(String),
    /// ADD or CHECK without a `prevResult`.
    #[error("must be called as a chained plugin: {0} needs a prevResult")]
    NotChained(&'static str),
    /// The container's interface is not in its namespace.
    #[error("container interface {ifname:?} not found")]
    NoContainerInterface {
        /// `CNI_IFNAME`.
        ifname: String,
        /// The lookup failure.
        #[source]
        source: NetlinkError,
    },
    /// The container namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A netlink socket could not be opened in a namespace.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A netlink request failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The scheduler clock could not be read.
    #[error("failed to read {path}: {0}", path = common::netlink::tc::PSCHED_PATH)]
    Psched(#[source] std::io::Error),
    /// Both names an IFB of this attachment may have are held by other links.
    #[error("cannot create an ifb device: {names} are held by links of other attachments ({what})")]
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
    /// CHECK found the kernel state differs from the config.
    #[error("{0}")]
    Drift(String),
    /// STATUS could not create an IFB device or a tbf qdisc.
    #[error("bandwidth shaping is unavailable: {0}")]
    Unavailable(String),
    /// DEL or GC failures, all of them.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<BandwidthError>),
}

impl From<BandwidthError> for CniError {
    fn from(err: BandwidthError) -> Self {
        let code = match &err {
            BandwidthError::Config(_) | BandwidthError::NotChained(_) => ErrorCode::InvalidConfig,
            BandwidthError::Netns(_) | BandwidthError::Open(OpenError::Netns(_)) => {
                ErrorCode::InvalidNetns
            }
            BandwidthError::Unavailable(_) => ErrorCode::PluginNotAvailable,
            BandwidthError::NoContainerInterface { .. }
            | BandwidthError::Open(OpenError::Netlink(_))
            | BandwidthError::Netlink(_)
            | BandwidthError::Psched(_)
            | BandwidthError::IfbNamesTaken { .. }
            | BandwidthError::ForeignIngressQdisc { .. }
            | BandwidthError::Drift(_)
            | BandwidthError::Several(_) => ErrorCode::Internal,
        };
        CniError::from_error(code, &err)
    }
}
