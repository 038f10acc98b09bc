//! Test support (compiled for this crate's tests and with the `fixtures` feature): the
//! hostport table the nf_tables tests and the bench build, written once. Not for production
//! use.

use super::{
    Batch, Chain, ChainHook, ChainType, DataType as T, NfProto, Rule, Selector, Set, Table,
    priority,
};

/// The comment of the rule that maps by host address and port.
pub const BY_HOST_IP: &str = "by host ip";

/// A portmap-style DNAT table in `table` (family `ip`): the maps `hostip_ports` (host
/// address, protocol, port → container address, port) and `ports` (protocol, port →
/// container address, port), the regular chain `hostports` looking both up (the first rule
/// commented [`BY_HOST_IP`]), and the base chain `prerouting` jumping there for local
/// destinations. Empty maps: a caller adds its elements, sets, chains and rules after it.
#[must_use]
pub fn hostport_table(table: &Table) -> Batch {
    let mut b = Batch::new();
    b.add_table(table)
        .add_set(
            table,
            &Set::map(
                "hostip_ports",
                &[T::Ipv4Addr, T::InetProto, T::InetService],
                &[T::Ipv4Addr, T::InetService],
            ),
        )
        .add_set(
            table,
            &Set::map(
                "ports",
                &[T::InetProto, T::InetService],
                &[T::Ipv4Addr, T::InetService],
            ),
        )
        .add_chain(table, &Chain::regular("hostports"))
        .add_chain(
            table,
            &Chain::base(
                "prerouting",
                ChainType::Nat,
                ChainHook::Prerouting,
                priority::DSTNAT,
            ),
        )
        .add_rule(
            table,
            "prerouting",
            &Rule::new().fib_daddr_local().jump("hostports"),
        )
        .add_rule(
            table,
            "hostports",
            &Rule::new()
                .dnat_map(
                    NfProto::Ipv4,
                    &[Selector::IpDaddr, Selector::MetaL4proto, Selector::ThDport],
                    "hostip_ports",
                )
                .comment(BY_HOST_IP),
        )
        .add_rule(
            table,
            "hostports",
            &Rule::new().dnat_map(
                NfProto::Ipv4,
                &[Selector::MetaL4proto, Selector::ThDport],
                "ports",
            ),
        );
    b
}
