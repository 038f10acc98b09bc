//! The CNI protocol as the reference plugins speak it, for plugins written in Rust: the result
//! types of every CNI version and their conversions, configuration decoded as Go's
//! `encoding/json` decodes it, the skeleton that reads a call from the environment and stdin
//! and prints the result or error object (`plugin_main!`), `CNI_ARGS`, error codes and the
//! reference's wording, and logging to stderr. No kernel code: a plugin brings its own.
#![warn(missing_docs)]

pub mod arena;
pub mod args;
pub mod attachment;
pub mod conf;
pub mod decode;
pub mod error;
pub(crate) mod json;
pub mod logging;
pub mod skel;
pub mod types;
pub mod version;

pub use attachment::Attachment;
