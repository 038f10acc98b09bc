//! Shared machinery for the CNI meta plugins.
#![warn(missing_docs)]

pub mod arena;
pub mod args;
pub mod conf;
pub mod conntrack;
pub mod decode;
pub mod error;
pub mod iptables;
pub(crate) mod json;
pub mod lock;
pub mod logging;
pub mod netlink;
pub mod netns;
pub mod nft;
pub mod skel;
pub mod store;
pub mod sysctl;
pub mod types;
pub mod version;
