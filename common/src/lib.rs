//! Shared machinery for the CNI meta plugins.
#![warn(missing_docs)]

pub mod decode;
pub mod netns;
pub mod version;
