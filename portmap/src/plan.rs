//! What a call maps, computed without touching the kernel (pure) and the same for both
//! layouts: the container addresses ([`mapped_ips`]) and their families, and the host ports
//! whose UDP conntrack entries a change makes stale ([`udp_flush_targets`]). Each backend
//! renders it in its own layout (`backend/nftables/layout.rs`, `backend/iptables/layout.rs`);
//! who holds a host port is the `ports` module's question.

use std::net::IpAddr;

use cni::types::CniResult;
use ipnet::IpNet;

use crate::config::{Config, IpFamily, PortMapping};

/// The container addresses a call maps: with any mapping, the first address of each family
/// (as the reference, which sets up a family even when every mapping's `hostIP` is of the
/// other one: its iptables layout then has an empty chain and an entry rule for it).
pub fn mapped_ips(config: &Config, prev: &CniResult, ifname: &str) -> Vec<IpNet> {
    if config.mappings.is_empty() {
        return Vec::new();
    }
    let (v4, v6) = crate::config::container_ips(prev, ifname);
    [v4, v6].into_iter().flatten().collect()
}

/// The families of `ips`.
pub fn families(ips: &[IpNet]) -> Vec<IpFamily> {
    ips.iter().map(|ip| IpFamily::of(ip.addr())).collect()
}

/// The host ports whose UDP conntrack entries must go after a change: (port, host address).
pub fn udp_flush_targets(mappings: &[PortMapping], family: IpFamily) -> Vec<(u16, Option<IpAddr>)> {
    let mut out: Vec<(u16, Option<IpAddr>)> = mappings
        .iter()
        .filter(|m| m.proto == crate::config::Proto::Udp && m.host_ip.applies_to(family))
        .map(|m| (m.host_port, m.host_ip.addr()))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HostIp, Proto};

    fn mapping(host_port: u16, container_port: u16, proto: Proto, host_ip: HostIp) -> PortMapping {
        PortMapping {
            host_port,
            container_port,
            proto,
            host_ip,
        }
    }

    fn config(mappings: Vec<PortMapping>) -> Config {
        crate::config::test_config(mappings)
    }

    #[test]
    fn udp_flush_targets_are_the_udp_host_ports_of_the_family() {
        let c = config(vec![
            mapping(8080, 80, Proto::Tcp, HostIp::All),
            mapping(53, 53, Proto::Udp, HostIp::All),
            mapping(54, 53, Proto::Udp, HostIp::Any(IpFamily::V6)),
        ]);
        assert_eq!(
            udp_flush_targets(&c.mappings, IpFamily::V4),
            vec![(53, None)]
        );
        assert_eq!(
            udp_flush_targets(&c.mappings, IpFamily::V6),
            vec![(53, None), (54, None)]
        );
    }
}
