//! What a plugin call holds on the host: network namespaces (opened without blocking, entered
//! on a thread of their own), state files written atomically, file locks, sysctls.
#![warn(missing_docs)]

pub mod lock;
pub mod netns;
pub mod store;
pub mod sysctl;
