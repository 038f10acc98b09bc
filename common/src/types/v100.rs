//! Results of CNI 1.0.0 and 1.1.0 (Go's `pkg/types/100`, identical for both versions): the
//! current model on the wire, IPs without `version`, interfaces with `mtu`, `socketPath`, `pciID`.
//!
//! Go's `Result.MarshalJSON` re-marshals the result through a `map`, so every object prints with
//! its keys sorted, and it deletes `dns` when it is empty. `to_value` + `sort_keys` restate that.

use serde::{Deserialize, Serialize};

use super::wire::{DnsWire, GoIp, GoIpNet, RouteWire, is_zero, non_empty};
use super::{CniResult, Interface, IpConfig, Route};

/// The 1.x result; printed key order comes from sorting, not from this declaration.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Result100 {
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub(crate) cni_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    interfaces: Vec<Interface100>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ips: Vec<IpConfig100>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<RouteWire>,
    #[serde(default, skip_serializing_if = "DnsWire::is_empty")]
    dns: DnsWire,
}

#[derive(Debug, Serialize, Deserialize)]
struct Interface100 {
    #[serde(default)]
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mac: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    mtu: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sandbox: Option<String>,
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    socket_path: Option<String>,
    #[serde(rename = "pciID", default, skip_serializing_if = "Option::is_none")]
    pci_id: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct IpConfig100 {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interface: Option<usize>,
    address: GoIpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<GoIp>,
}

impl Result100 {
    /// The wire form is the model; only Go's zero-means-unset `mtu` needs translating.
    pub(crate) fn into_current(self) -> CniResult {
        CniResult {
            interfaces: self
                .interfaces
                .into_iter()
                .map(|i| Interface {
                    name: i.name,
                    mac: i.mac,
                    mtu: (i.mtu != 0).then_some(i.mtu),
                    sandbox: i.sandbox,
                    socket_path: i.socket_path,
                    pci_id: i.pci_id,
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

    /// Go's `convertFrom100`: the same data under another `cniVersion`.
    pub(crate) fn from_current(result: &CniResult, version: &str) -> Self {
        Result100 {
            cni_version: version.to_string(),
            interfaces: result
                .interfaces
                .iter()
                .map(|i| Interface100 {
                    name: i.name.clone(),
                    mac: non_empty(&i.mac),
                    mtu: i.mtu.unwrap_or(0),
                    sandbox: non_empty(&i.sandbox),
                    socket_path: non_empty(&i.socket_path),
                    pci_id: non_empty(&i.pci_id),
                })
                .collect(),
            ips: result
                .ips
                .iter()
                .map(|ip| IpConfig100 {
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
    use crate::types::tests::full_model;
    use serde_json::json;

    #[test]
    fn every_field_of_the_model_survives_the_wire() {
        let value = serde_json::to_value(Result100::from_current(&full_model(), "1.1.0")).unwrap();
        let back = crate::decode::from_value::<Result100>(value).unwrap();
        assert_eq!(back.cni_version, "1.1.0");
        assert_eq!(back.into_current(), full_model());
    }

    #[test]
    fn empty_dns_and_empty_lists_are_left_out_and_ips_carry_no_version() {
        let value = serde_json::to_value(Result100::from_current(
            &CniResult {
                ips: vec![IpConfig {
                    interface: Some(0),
                    address: "10.0.0.2/24".parse().unwrap(),
                    gateway: None,
                }],
                ..CniResult::default()
            },
            "1.0.0",
        ))
        .unwrap();
        assert_eq!(
            value,
            json!({"cniVersion": "1.0.0", "ips": [{"interface": 0, "address": "10.0.0.2/24"}]})
        );
    }

    #[test]
    fn a_zero_interface_mtu_means_unset_as_in_go() {
        let wire: Result100 = crate::decode::from_value(json!({
            "interfaces": [{"name": "eth0", "mtu": 0, "socketPath": "", "PCIID": "0000:00:01.0"}]
        }))
        .unwrap();
        let result = wire.into_current();
        assert_eq!(result.interfaces[0].mtu, None);
        assert_eq!(result.interfaces[0].socket_path, None);
        assert_eq!(result.interfaces[0].pci_id.as_deref(), Some("0000:00:01.0"));
    }
}
