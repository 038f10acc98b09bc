//! The two mechanisms that program mappings: [`nftables`] (default) and [`iptables`].

pub mod iptables;
pub mod nftables;
