//! Shared machinery for the CNI meta plugins.
#![warn(missing_docs)]

pub mod netns;
