//! Results of CNI 0.1.0 and 0.2.0 (Go's `pkg/types/020`): one `ip4` and one `ip6` block, each with
//! its own routes, and no interfaces.
//!
//! Up-conversion turns the blocks into `ips` entries without an interface index and concatenates
//! their routes (IPv4 block first), keeping every route field Go's `types.Route` reads.
//! Down-conversion keeps the first IPv4 and the first IPv6 address, files each route under the
//! block of its destination's family (dropping it when that block is absent), keeps only `dst`
//! and `gw`, and fails when no address is left.

use serde::{Deserialize, Serialize};

use super::wire::{DnsWire, GoIp, GoIpNet, RouteWire};
use super::{CniResult, IpConfig, ResultError, Route};

/// The 0.1.0/0.2.0 result in Go's field order: `cniVersion`, `ip4`, `ip6`, `dns` (always).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename = "types020.Result")]
pub(crate) struct Result020 {
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub(crate) cni_version: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::wire::whole_pointer"
    )]
    ip4: Option<IpConfig020>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::wire::whole_pointer"
    )]
    ip6: Option<IpConfig020>,
    #[serde(default)]
    dns: DnsWire,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename = "types020.IPConfig")]
struct IpConfig020 {
    ip: GoIpNet,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::decode::nullable"
    )]
    gateway: Option<GoIp>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::wire::wholes"
    )]
    routes: Vec<RouteWire>,
}

impl Result020 {
    /// Go's `convertFrom02x`: the blocks become `ips`, their routes are concatenated.
    pub(crate) fn into_current(self) -> CniResult {
        let mut result = CniResult {
            dns: self.dns.into(),
            ..CniResult::default()
        };
        for block in [self.ip4, self.ip6].into_iter().flatten() {
            result.ips.push(IpConfig {
                interface: None,
                address: block.ip.0,
                gateway: block.gateway.map(|g| g.0),
            });
            result
                .routes
                .extend(block.routes.into_iter().map(Route::from));
        }
        result
    }

    /// Go's `convertTo02x`: first address of each family, routes split by family, `dst`/`gw` only.
    pub(crate) fn from_current(result: &CniResult, version: &str) -> Result<Self, ResultError> {
        let block = |ip: &IpConfig| IpConfig020 {
            ip: GoIpNet(ip.address),
            gateway: ip.gateway.map(GoIp),
            routes: Vec::new(),
        };
        let mut ip4 = result
            .ips
            .iter()
            .find(|ip| ip.address.addr().is_ipv4())
            .map(block);
        let mut ip6 = result
            .ips
            .iter()
            .find(|ip| ip.address.addr().is_ipv6())
            .map(block);
        for route in &result.routes {
            let slot = if route.dst.addr().is_ipv4() {
                &mut ip4
            } else {
                &mut ip6
            };
            if let Some(block) = slot {
                block.routes.push(RouteWire {
                    dst: GoIpNet(route.dst),
                    gw: route.gw.map(GoIp),
                    ..RouteWire::default()
                });
            }
        }
        if ip4.is_none() && ip6.is_none() {
            return Err(ResultError::NoValidIp);
        }
        Ok(Result020 {
            cni_version: version.to_string(),
            ip4,
            ip6,
            dns: (&result.dns).into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::tests::{full_model, net};
    use crate::types::{Dns, Interface};
    use serde_json::json;

    #[test]
    fn blocks_become_ips_without_interface_and_routes_are_concatenated_ipv4_first() {
        let wire: Result020 = crate::decode::from_value(json!({
            "cniVersion": "0.2.0",
            "ip6": {"ip": "fd00::5/64", "routes": [{"dst": "::/0", "gw": "fd00::1"}]},
            "ip4": {"ip": "10.1.0.5/16", "gateway": "10.1.0.1",
                    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.0.2.0/24", "mtu": 1400, "table": 7}]},
            "dns": {"nameservers": ["10.96.0.10"]}
        }))
        .unwrap();
        let result = wire.into_current();
        assert!(result.interfaces.is_empty());
        let ips: Vec<_> = result
            .ips
            .iter()
            .map(|ip| (ip.interface, ip.address))
            .collect();
        assert_eq!(
            ips,
            vec![(None, net("10.1.0.5/16")), (None, net("fd00::5/64"))]
        );
        let dsts: Vec<_> = result.routes.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["0.0.0.0/0", "192.0.2.0/24", "::/0"]);
        // Go's 0.2.0 routes are full `types.Route`s: mtu and table survive the parse.
        assert_eq!(
            (result.routes[1].mtu, result.routes[1].table),
            (Some(1400), Some(7))
        );
        assert_eq!(result.dns.nameservers, ["10.96.0.10"]);
    }

    #[test]
    fn down_conversion_keeps_the_first_address_of_each_family_and_routes_of_present_families() {
        let mut model = full_model();
        model.ips.retain(|ip| ip.address.addr().is_ipv4());
        let wire = Result020::from_current(&model, "0.2.0").unwrap();
        let text = serde_json::to_value(&wire).unwrap();
        assert_eq!(
            text,
            json!({
                "cniVersion": "0.2.0",
                "ip4": {
                    "ip": "10.1.0.5/16",
                    "gateway": "10.1.0.1",
                    "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}, {"dst": "192.0.2.0/24"}]
                },
                "dns": {"nameservers": ["10.96.0.10"], "domain": "cluster.local",
                        "search": ["svc.cluster.local"], "options": ["ndots:5"]}
            })
        );
    }

    #[test]
    fn down_conversion_without_any_address_fails_like_go() {
        let model = CniResult {
            interfaces: vec![Interface {
                name: "eth0".into(),
                ..Interface::default()
            }],
            routes: vec![Route {
                dst: net("0.0.0.0/0"),
                ..Route::default()
            }],
            dns: Dns {
                nameservers: vec!["10.96.0.10".into()],
                ..Dns::default()
            },
            ..CniResult::default()
        };
        let err = Result020::from_current(&model, "0.2.0").unwrap_err();
        assert_eq!(err.to_string(), "cannot convert: no valid IP addresses");
    }

    #[test]
    fn an_ip_block_without_an_ip_is_an_error_naming_it() {
        let err = crate::decode::from_value::<Result020>(json!({"ip4": {"gateway": "10.0.0.1"}}))
            .unwrap_err();
        assert_eq!(err.path(), "ip4");
        let err =
            crate::decode::from_value::<Result020>(json!({"ip4": {"ip": "10.0.0.1"}})).unwrap_err();
        assert_eq!(err.to_string(), "ip4.ip: invalid CIDR address: 10.0.0.1");
    }
}
