//! Lookups in a CNI result (the JSON a chain printed) that the end-to-end tests, the demo and
//! the reliability suites all need.

use anyhow::{Context, Result};
use serde_json::Value;

/// The first address of `result` of one family (IPv6 when `v6`), without its prefix length.
///
/// # Errors
/// When the result lists no address of that family.
pub fn address(result: &Value, v6: bool) -> Result<String> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str()?.split_once('/'))
        .map(|(a, _)| a.to_owned())
        .find(|a| a.contains(':') == v6)
        .with_context(|| format!("no IPv{} address in {result}", if v6 { 6 } else { 4 }))
}

/// The first IPv4 address of `result`, parsed.
///
/// # Errors
/// When the result lists no IPv4 address.
pub fn ipv4(result: &Value) -> Result<std::net::IpAddr> {
    Ok(address(result, false)?.parse()?)
}

/// The prevResult (CNI 1.0.0) of an attachment made without a main plugin: a bridge `br0`,
/// the container's interface `ifname` in the namespace at `netns`, and `address` (CIDR) on it.
pub fn synthetic_prev(netns: &str, ifname: &str, address: &str) -> Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "interfaces": [{ "name": "br0" }, { "name": ifname, "sandbox": netns }],
        "ips": [{ "address": address, "interface": 1 }],
    })
}

/// The host-side veth a main plugin (`bridge`, `ptp`) reported: an interface without a
/// sandbox whose name starts with `veth`.
///
/// # Errors
/// When the result lists none.
pub fn host_veth(result: &Value) -> Result<String> {
    result["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["sandbox"].is_null())
        .filter_map(|i| i["name"].as_str())
        .find(|n| n.starts_with("veth"))
        .map(str::to_owned)
        .with_context(|| format!("no host veth in {result}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_address_of_each_family_and_the_host_veth() {
        let result = json!({
            "interfaces": [
                { "name": "cni0" },
                { "name": "veth1234" },
                { "name": "eth0", "sandbox": "/run/netns/x" },
            ],
            "ips": [
                { "address": "fd00::5/64", "interface": 2 },
                { "address": "10.1.0.5/24", "interface": 2 },
            ],
        });
        assert_eq!(address(&result, false).unwrap(), "10.1.0.5");
        assert_eq!(address(&result, true).unwrap(), "fd00::5");
        assert_eq!(host_veth(&result).unwrap(), "veth1234");
        assert!(address(&json!({ "ips": [] }), false).is_err());
        assert!(
            host_veth(&json!({ "interfaces": [{ "name": "eth0", "sandbox": "/x" }] })).is_err()
        );
    }
}
