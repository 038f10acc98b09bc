//! The plugin's errors and their CNI codes.

use cni::error::{CniError, ErrorCode};
use cni::skel::Command;
use cni::types::CniResult;

/// A portmap failure.
#[derive(Debug, thiserror::Error)]
pub enum PortmapError {
    /// Invalid configuration (code 7): the reference's message where it refuses the same
    /// input, with the field and value in `details`.
    #[error("{msg}")]
    Config {
        /// The message.
        msg: String,
        /// The field, its value and why (the error's `details`).
        details: String,
    },
    /// A host port is already mapped by another attachment.
    #[error("host port {what} is already mapped by {owner}")]
    Conflict {
        /// `tcp/8080` or `10.1.1.1 tcp/8080`.
        what: String,
        /// The owner's comment (`network/containerID/ifname`) or the Go plugin's chain.
        owner: String,
    },
    /// nftables refused or failed.
    #[error("unable to set up nftables rules for port mappings: {0}")]
    Nft(#[source] netfilter::nft::NftError),
    /// The kernel has no nf_tables, or not what our layout needs: why.
    #[error("unable to set up nftables rules for port mappings: {0}")]
    NftUnusable(String),
    /// iptables failed.
    #[error("unable to set up iptables port mappings: {0}")]
    Iptables(#[source] netfilter::iptables::IptablesError),
    /// The iptables layout could not be read or written over nf_tables.
    #[error("unable to set up iptables port mappings: {0}")]
    Native(#[source] netfilter::iptables::native::NativeError),
    /// An attachment's iptables chain could not be removed from one family (`ipv4`,
    /// `ipv6`), as the reference words it.
    #[error("could not teardown {family} dnat: {cause}")]
    Teardown {
        /// `ipv4` or `ipv6`.
        family: &'static str,
        /// What failed.
        cause: String,
    },
    /// Our iptables lock could not be taken.
    #[error(transparent)]
    Lock(#[from] host::lock::LockError),
    /// CHECK found drift.
    #[error("{0}")]
    Check(String),
    /// CHECK found drift: the reference's message, and ours naming the object exactly.
    #[error("{msg}")]
    CheckDetailed {
        /// The message.
        msg: String,
        /// What is missing, as we name it (the error's `details`).
        details: String,
    },
    /// `route_localnet` could not be enabled.
    #[error("unable to enable route_localnet: {0}")]
    RouteLocalnet(String),
    /// The state store failed.
    #[error("portmap state: {0}")]
    Store(#[source] host::store::StoreError),
    /// No backend is usable (STATUS).
    #[error("{0}")]
    Unavailable(String),
}

impl From<PortmapError> for CniError {
    fn from(err: PortmapError) -> Self {
        use netfilter::iptables::IptablesError;
        let code = match &err {
            PortmapError::Config { msg, details } => {
                return CniError::invalid_config(msg.clone()).with_details(details.clone());
            }
            PortmapError::CheckDetailed { msg, details } => {
                return CniError::new(ErrorCode::Internal, msg.clone())
                    .with_details(details.clone());
            }
            PortmapError::Lock(host::lock::LockError::Timeout { .. })
            | PortmapError::Iptables(
                IptablesError::Locked { .. } | IptablesError::Timeout { .. },
            ) => ErrorCode::TryAgainLater,
            PortmapError::Lock(_) | PortmapError::Store(_) => ErrorCode::Io,
            PortmapError::Unavailable(_) => ErrorCode::PluginNotAvailable,
            PortmapError::Conflict { .. }
            | PortmapError::Nft(_)
            | PortmapError::NftUnusable(_)
            | PortmapError::Iptables(_)
            | PortmapError::Native(_)
            | PortmapError::Teardown { .. }
            | PortmapError::Check(_)
            | PortmapError::RouteLocalnet(_) => ErrorCode::Internal,
        };
        CniError::from_error(code, &err)
    }
}

/// The failures of a DEL or GC as one error: with the code they share (11 when our lock
/// stayed held, so the runtime retries), else 999.
pub fn joined(errors: Vec<PortmapError>) -> CniError {
    let msg: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let codes: Vec<ErrorCode> = errors.into_iter().map(|e| CniError::from(e).code).collect();
    let code = match codes.split_first() {
        Some((first, rest)) if rest.iter().all(|c| c == first) => *first,
        _ => ErrorCode::Internal,
    };
    CniError::new(code, msg.join("; "))
}

/// The outcome of a DEL or GC that collected `errors`: none, or them [`joined`].
///
/// # Errors
/// [`joined`].
pub fn all(errors: Vec<PortmapError>) -> Result<(), CniError> {
    if errors.is_empty() {
        return Ok(());
    }
    Err(joined(errors))
}

/// A failure of the iptables writer as the plugin's error: nf_tables' under the nftables
/// prefix, as before the writer existed; the native layer's and the tools' under the iptables
/// one.
pub fn write_error(e: netfilter::iptables::writer::WriteError) -> PortmapError {
    use netfilter::iptables::native::NativeError;
    use netfilter::iptables::writer::WriteError;
    match e {
        WriteError::Native(NativeError::Nft(e)) => PortmapError::Nft(e),
        WriteError::Native(e) => PortmapError::Native(e),
        WriteError::Tools(e) => PortmapError::Iptables(e),
    }
}

/// A configuration that does not parse, as the reference reports it for `verb`: its ADD and
/// DEL wrap every failure of its `parseConfig` in `failed to parse config: `, its CHECK
/// returns it as it is.
pub fn config_error(verb: Command, mut err: CniError) -> CniError {
    if matches!(verb, Command::Add | Command::Del) {
        err.msg = format!("failed to parse config: {}", err.msg);
    }
    err
}

/// prevResult, which ADD and CHECK need; without it, the reference's message for each verb.
///
/// # Errors
/// Code 7.
pub fn require_prev(prev: Option<CniResult>, verb: Command) -> Result<CniResult, CniError> {
    prev.ok_or_else(|| {
        let msg = match verb {
            Command::Add => "must be called as chained plugin",
            _ => "Required prevResult missing",
        };
        CniError::invalid_config(msg).with_details("the config has no prevResult")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_check_without_prev_result_give_the_references_messages() {
        let add = require_prev(None, Command::Add).unwrap_err();
        assert_eq!(
            (add.code.as_u32(), add.msg.as_str()),
            (7, "must be called as chained plugin")
        );
        let check = require_prev(None, Command::Check).unwrap_err();
        assert_eq!(
            (check.code.as_u32(), check.msg.as_str()),
            (7, "Required prevResult missing")
        );
    }
}
