//! Results of CNI 0.3.0, 0.3.1 and 0.4.0 (Go's `pkg/types/040`): `interfaces`, `ips` carrying a
//! `version` of "4" or "6", `routes` and `dns`.
//!
//! Towards 1.x only the IP `version` is dropped; from 1.x it is recomputed from the address family
//! and the interface `mtu`, `socketPath` and `pciID` are lost. Routes are Go's shared
//! `types.Route`, so `mtu`, `advmss`, `priority`, `table` and `scope` travel in this era too.

use serde::{Deserialize, Serialize};

use super::wire::{DnsWire, GoIp, GoIpNet, RouteWire, non_empty};
use super::{CniResult, Interface, IpConfig, Route};

/// The 0.3.x/0.4.0 result in Go's field order: `cniVersion`, `interfaces`, `ips`, `routes`,
/// then `dns`, which Go prints even when empty.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename = "types040.Result")]
pub(crate) struct Result040 {
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub(crate) cni_version: String,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::wire::pointers"
    )]
    interfaces: Vec<Interface040>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::wire::whole_pointers"
    )]
    ips: Vec<IpConfig040>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::wire::whole_pointers"
    )]
    routes: Vec<RouteWire>,
    #[serde(default)]
    dns: DnsWire,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename = "types040.Interface")]
struct Interface040 {
    #[serde(default)]
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sandbox: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename = "types040.IPConfig")]
struct IpConfig040 {
    // Go reads it but never checks it against the address; conversions recompute it.
    #[serde(default)]
    version: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::wire::interface_index"
    )]
    interface: Option<usize>,
    address: GoIpNet,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::decode::nullable"
    )]
    gateway: Option<GoIp>,
}

impl Result040 {
    /// Go's `convertFrom04x`: everything but the IP `version` carries over.
    pub(crate) fn into_current(self) -> CniResult {
        CniResult {
            interfaces: self
                .interfaces
                .into_iter()
                .map(|i| Interface {
                    name: i.name,
                    mac: i.mac,
                    sandbox: i.sandbox,
                    ..Interface::default()
                })
                .collect(),
            ips: self
                .ips
                .into_iter()
                .map(|ip| IpConfig {
                    interface: ip.interface,
                    address: ip.address.0,
                    gateway: ip.gateway.map(|g| g.0),
                })
                .collect(),
            routes: self.routes.into_iter().map(Route::from).collect(),
            dns: self.dns.into(),
        }
    }

    /// Go's `convertTo04x`: IP `version` from the address family, 1.x-only interface keys dropped.
    pub(crate) fn from_current(result: &CniResult, version: &str) -> Self {
        Result040 {
            cni_version: version.to_string(),
            interfaces: result
                .interfaces
                .iter()
                .map(|i| Interface040 {
                    name: i.name.clone(),
                    mac: non_empty(&i.mac),
                    sandbox: non_empty(&i.sandbox),
                })
                .collect(),
            ips: result
                .ips
                .iter()
                .map(|ip| IpConfig040 {
                    version: if ip.address.addr().is_ipv4() {
                        "4"
                    } else {
                        "6"
                    }
                    .to_string(),
                    interface: ip.interface,
                    address: GoIpNet(ip.address),
                    gateway: ip.gateway.map(GoIp),
                })
                .collect(),
            routes: result.routes.iter().map(RouteWire::from).collect(),
            dns: (&result.dns).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::tests::{full_model, net};
    use serde_json::json;

    #[test]
    fn the_ip_version_is_recomputed_from_the_address_and_not_trusted() {
        let wire: Result040 = crate::decode::from_value(json!({
            "cniVersion": "0.4.0",
            "ips": [{"version": "6", "address": "10.1.0.5/16"}, {"address": "fd00::5/64"}]
        }))
        .unwrap();
        let result = wire.into_current();
        assert_eq!(result.ips[0].address, net("10.1.0.5/16"));
        let back = serde_json::to_value(Result040::from_current(&result, "0.4.0")).unwrap();
        assert_eq!(
            back["ips"],
            json!([{"version": "4", "address": "10.1.0.5/16"}, {"version": "6", "address": "fd00::5/64"}])
        );
    }

    #[test]
    fn one_x_interface_fields_are_lost_and_route_fields_kept() {
        let wire = Result040::from_current(&full_model(), "0.3.1");
        let back = wire_round_trip(wire);
        let mut want = full_model();
        for i in &mut want.interfaces {
            i.mtu = None;
            i.socket_path = None;
            i.pci_id = None;
        }
        assert_eq!(back, want);
    }

    #[test]
    fn empty_lists_are_omitted_but_dns_and_interface_name_are_always_printed() {
        let result = CniResult {
            interfaces: vec![Interface {
                mac: Some(String::new()),
                ..Interface::default()
            }],
            ..CniResult::default()
        };
        let value = serde_json::to_value(Result040::from_current(&result, "0.3.0")).unwrap();
        assert_eq!(
            value,
            json!({"cniVersion": "0.3.0", "interfaces": [{"name": ""}], "dns": {}})
        );
    }

    #[test]
    fn a_negative_interface_index_is_an_error_naming_it() {
        let err = crate::decode::from_value::<Result040>(json!({
            "ips": [{"interface": -1, "address": "10.0.0.2/24"}]
        }))
        .unwrap_err();
        assert_eq!(err.path(), "ips[0].interface");
    }

    fn wire_round_trip(wire: Result040) -> CniResult {
        let value = serde_json::to_value(wire).unwrap();
        crate::decode::from_value::<Result040>(value)
            .unwrap()
            .into_current()
    }
}
