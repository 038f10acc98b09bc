// The crate's documentation is its README (its example compiles and runs as a doctest).
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod arena;
pub mod args;
pub mod attachment;
pub mod conf;
pub mod decode;
pub mod error;
pub(crate) mod json;
pub mod logging;
pub mod operator;
pub mod reconcile;
pub mod skel;
pub mod types;
pub mod version;

pub use attachment::Attachment;
