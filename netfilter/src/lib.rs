//! Netfilter for the plugins: an nf_tables client (batches, dumps, sets, the expressions the
//! layouts use), the reference's iptables layouts (read and written natively over nf_tables as
//! iptables-nft encodes them, or through `iptables-restore`), and conntrack flushes the kernel
//! filters.
#![warn(missing_docs)]

pub mod conntrack;
pub mod iptables;
pub mod nft;
pub mod watch;
