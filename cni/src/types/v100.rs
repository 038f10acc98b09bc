//! Results of CNI 1.0.0 and 1.1.0 (Go's `pkg/types/100`, identical for both versions): the
//! current model on the wire, IPs without `version`, interfaces with `mtu`, `socketPath`, `pciID`.
//!
//! Go's `Result.MarshalJSON` re-marshals the result through a `map`, so every object prints with
//! its keys sorted, and it deletes `dns` when it is empty. The fields here are declared in that
//! order, and routes and `dns` (Go's shared types, which 0.3.x/0.4.0 print in field order) are
//! printed through sorted views, so a result prints straight from its values, without a tree.

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

use super::wire::{DnsWire, GoIp, GoIpNet, RouteWire, is_zero, non_empty};
use super::{CniResult, Interface, IpConfig, Route};

/// The 1.x result, its fields in the byte-wise order of their keys.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename = "types100.Result")]
pub(crate) struct Result100 {
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub(crate) cni_version: String,
    #[serde(
        default,
        skip_serializing_if = "DnsWire::is_empty",
        serialize_with = "sorted_dns"
    )]
    dns: DnsWire,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::wire::pointers"
    )]
    interfaces: Vec<Interface100>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::wire::whole_pointers"
    )]
    ips: Vec<IpConfig100>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "sorted_routes",
        deserialize_with = "super::wire::whole_pointers"
    )]
    routes: Vec<RouteWire>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename = "types100.Interface")]
struct Interface100 {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mac: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    mtu: u32,
    #[serde(default)]
    name: String,
    #[serde(rename = "pciID", default, skip_serializing_if = "Option::is_none")]
    pci_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sandbox: Option<String>,
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    socket_path: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename = "types100.IPConfig")]
struct IpConfig100 {
    address: GoIpNet,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::decode::nullable"
    )]
    gateway: Option<GoIp>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::wire::interface_index"
    )]
    interface: Option<usize>,
}

/// `routes`, each with its keys sorted.
#[allow(clippy::ptr_arg)] // serde's `serialize_with` passes the field as declared.
fn sorted_routes<S: Serializer>(routes: &Vec<RouteWire>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(routes.iter().map(SortedRoute))
}

/// A route with its keys sorted: `advmss`, `dst`, `gw`, `mtu`, `priority`, `scope`, `table`.
struct SortedRoute<'a>(&'a RouteWire);

impl Serialize for SortedRoute<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut out = s.serialize_struct("Route", 7)?;
        if r.advmss != 0 {
            out.serialize_field("advmss", &r.advmss)?;
        }
        out.serialize_field("dst", &r.dst)?;
        if let Some(gw) = &r.gw {
            out.serialize_field("gw", gw)?;
        }
        if r.mtu != 0 {
            out.serialize_field("mtu", &r.mtu)?;
        }
        if r.priority != 0 {
            out.serialize_field("priority", &r.priority)?;
        }
        if let Some(scope) = &r.scope {
            out.serialize_field("scope", scope)?;
        }
        if let Some(table) = &r.table {
            out.serialize_field("table", table)?;
        }
        out.end()
    }
}

/// `dns` with its keys sorted: `domain`, `nameservers`, `options`, `search`.
fn sorted_dns<S: Serializer>(dns: &DnsWire, s: S) -> Result<S::Ok, S::Error> {
    let mut out = s.serialize_struct("DNS", 4)?;
    if let Some(domain) = &dns.domain {
        out.serialize_field("domain", domain)?;
    }
    if !dns.nameservers.is_empty() {
        out.serialize_field("nameservers", &dns.nameservers)?;
    }
    if !dns.options.is_empty() {
        out.serialize_field("options", &dns.options)?;
    }
    if !dns.search.is_empty() {
        out.serialize_field("search", &dns.search)?;
    }
    out.end()
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
    fn keys_print_sorted_as_go_s_map_round_trip_sorts_them() {
        let mut model = full_model();
        model.routes[1].gw = Some("192.0.2.1".parse().unwrap());
        let wire = Result100::from_current(&model, "1.1.0");
        let direct = crate::json::to_go_string(&wire).unwrap();
        let sorted = crate::json::sort_keys(serde_json::to_value(&wire).unwrap());
        assert_eq!(direct, crate::json::to_go_string(&sorted).unwrap());
        assert!(direct.contains("\"advmss\""), "{direct}");
    }

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
