//! The plugin's keys (`table`, `gateways`, `addSourceHints`), validated, and the container
//! addresses sbr acts on, picked from `prevResult`. Pure: no kernel access.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cni::types::{CniResult, IpConfig};
use serde::Deserialize;

use crate::error::SbrError;
use crate::names::RESERVED_TABLES;

/// The plugin's keys as they arrive on stdin (matched case-insensitively by `cni::decode`;
/// the serde name is the reference's Go type, which Go's decode errors name).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename = "PluginConf")]
pub struct SbrKeys {
    /// Fixed table: only rules are added, pointing at it; routes are left alone (a Go
    /// pointer).
    #[serde(deserialize_with = "cni::decode::nullable")]
    pub table: Option<i64>,
    /// Static gateways, at most one per family, overriding the prevResult's (a Go slice).
    #[serde(deserialize_with = "cni::decode::nullable")]
    pub gateways: Option<Vec<String>>,
    /// Keep the subnet routes in main with a `src` hint instead of removing every main route.
    #[serde(rename = "addSourceHints")]
    pub add_source_hints: bool,
}

/// The only key DEL reads (so a config that no longer validates never blocks a DEL):
/// `table`, any integer, which DEL takes as it is.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename = "PluginConf")]
pub struct DelKeys {
    /// `table`.
    #[serde(deserialize_with = "cni::decode::nullable")]
    pub table: Option<i64>,
}

/// The validated configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// Fixed table id (`table`), or `None` to pick a free table per address.
    pub table: Option<u32>,
    /// Static IPv4 gateway for the default routes.
    pub gateway_v4: Option<Ipv4Addr>,
    /// Static IPv6 gateway for the default routes.
    pub gateway_v6: Option<Ipv6Addr>,
    /// `addSourceHints`.
    pub add_source_hints: bool,
}

impl Config {
    /// Validates the wire keys. `gateways` is read as the reference reads it: at most two
    /// entries, each an IP address (an IPv4-mapped IPv6 address is IPv4, as Go's `To4` says),
    /// at most one of each family.
    ///
    /// # Errors
    /// Code 7 naming the key and the value.
    pub fn from_keys(keys: &SbrKeys) -> Result<Config, SbrError> {
        let table = match keys.table {
            None => None,
            Some(t) => match u32::try_from(t) {
                Ok(t) if t != 0 && !RESERVED_TABLES.contains(&t) => Some(t),
                _ => return Err(SbrError::InvalidTable(t)),
            },
        };
        let mut config = Config {
            table,
            add_source_hints: keys.add_source_hints,
            ..Config::default()
        };
        let gateways = keys.gateways.as_deref().unwrap_or_default();
        if gateways.len() > 2 {
            return Err(SbrError::TooManyGateways(gateways.len()));
        }
        for (index, text) in gateways.iter().enumerate() {
            let ip: IpAddr = text.parse().map_err(|_| SbrError::BadGateway {
                index,
                text: text.clone(),
            })?;
            let duplicate = |family, first| SbrError::DuplicateGateway {
                index,
                family,
                first,
                second: text.clone(),
            };
            match ip.to_canonical() {
                IpAddr::V4(v4) => {
                    if let Some(first) = config.gateway_v4.replace(v4) {
                        return Err(duplicate("IPv4", IpAddr::V4(first)));
                    }
                }
                IpAddr::V6(v6) => {
                    if let Some(first) = config.gateway_v6.replace(v6) {
                        return Err(duplicate("IPv6", IpAddr::V6(first)));
                    }
                }
            }
        }
        Ok(config)
    }

    /// The static gateway of `ip`'s family, if one is configured.
    pub fn static_gateway(&self, ip: IpAddr) -> Option<IpAddr> {
        match ip {
            IpAddr::V4(_) => self.gateway_v4.map(IpAddr::V4),
            IpAddr::V6(_) => self.gateway_v6.map(IpAddr::V6),
        }
    }

    /// The gateway of the default route for `ip`: the static one of its family, else the
    /// prevResult's gateway when it is of the same family.
    pub fn gateway_for(&self, ip: &IpConfig) -> Option<IpAddr> {
        self.static_gateway(ip.address.addr()).or_else(|| {
            ip.gateway
                .filter(|gw| gw.is_ipv4() == ip.address.addr().is_ipv4())
        })
    }
}

/// The prevResult addresses of interface `ifname`, in prevResult order: those whose interface
/// index names `ifname`, and those without a usable index (as the reference assumes they are
/// this interface's).
///
/// # Errors
/// [`SbrError::NoAddresses`] when the prevResult has no address at all.
pub fn select_ips(result: &CniResult, ifname: &str) -> Result<Vec<IpConfig>, SbrError> {
    if result.ips.is_empty() {
        return Err(SbrError::NoAddresses {
            ifname: ifname.to_string(),
        });
    }
    Ok(result
        .ips
        .iter()
        .filter(|ip| match ip.interface {
            Some(i) => result
                .interfaces
                .get(i)
                .is_none_or(|iface| iface.name == ifname),
            None => true,
        })
        .cloned()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni::types::Interface;

    fn keys(json: &str) -> SbrKeys {
        cni::decode::from_value(serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn keys_match_case_insensitively_and_default_to_auto_tables() {
        let config =
            Config::from_keys(&keys(r#"{"TABLE": 5000, "addsourcehints": true}"#)).unwrap();
        assert_eq!(config.table, Some(5000));
        assert!(config.add_source_hints);
        assert_eq!(Config::from_keys(&keys("{}")).unwrap(), Config::default());
        assert_eq!(
            Config::from_keys(&keys(r#"{"table": null, "gateways": null}"#)).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn invalid_tables_are_code_7_naming_the_key_and_value() {
        for bad in ["0", "-1", "253", "254", "255", "4294967296"] {
            let err = Config::from_keys(&keys(&format!(r#"{{"table": {bad}}}"#))).unwrap_err();
            let cni: cni::error::CniError = err.into();
            assert_eq!(cni.code.as_u32(), 7, "{bad}");
            assert!(
                cni.msg.starts_with("table:") && cni.msg.contains(bad),
                "{}",
                cni.msg
            );
        }
        assert_eq!(
            Config::from_keys(&keys(r#"{"table": 4294967295}"#))
                .unwrap()
                .table,
            Some(u32::MAX)
        );
    }

    #[test]
    fn gateways_take_one_per_family_and_refusals_have_the_references_message() {
        let config =
            Config::from_keys(&keys(r#"{"gateways": ["fd00::1", "192.168.1.1"]}"#)).unwrap();
        assert_eq!(config.gateway_v4, Some(Ipv4Addr::new(192, 168, 1, 1)));
        assert_eq!(config.gateway_v6, Some("fd00::1".parse().unwrap()));
        // An IPv4-mapped address is IPv4, as Go's To4 has it.
        let config = Config::from_keys(&keys(r#"{"gateways": ["::ffff:10.0.0.1"]}"#)).unwrap();
        assert_eq!(config.gateway_v4, Some(Ipv4Addr::new(10, 0, 0, 1)));
        // (list, msg, details)
        let cases = [
            (
                r#"["10.0.0.1", "10.0.0.2"]"#,
                "gateways list contains multiple IPv4 addresses: 10.0.0.1 and 10.0.0.2",
                "gateways[1]: a second IPv4 address",
            ),
            (
                r#"["fd::1", "fd::2"]"#,
                "gateways list contains multiple IPv6 addresses: fd::1 and fd::2",
                "gateways[1]: a second IPv6 address",
            ),
            (
                r#"["10.0.0.1", "::ffff:10.0.0.2"]"#,
                "gateways list contains multiple IPv4 addresses: 10.0.0.1 and ::ffff:10.0.0.2",
                "gateways[1]",
            ),
            (
                r#"["10.0.0.1", "fd::1", "10.0.0.3"]"#,
                "gateways list cannot contain more than 2 entries (one IPv4, one IPv6)",
                "got 3",
            ),
            (
                r#"["10.0.0.300"]"#,
                "invalid static gateway IP address: 10.0.0.300",
                r#"gateways[0]: "10.0.0.300" is not an IP address"#,
            ),
            (
                r#"["10.0.0.0/24"]"#,
                "invalid static gateway IP address: 10.0.0.0/24",
                "gateways[0]",
            ),
            // Go's ParseIP does not trim.
            (
                r#"[" 10.0.0.1"]"#,
                "invalid static gateway IP address:  10.0.0.1",
                "gateways[0]",
            ),
        ];
        for (list, msg, details) in cases {
            let err = Config::from_keys(&keys(&format!(r#"{{"gateways": {list}}}"#))).unwrap_err();
            let cni: cni::error::CniError = err.into();
            assert_eq!(cni.code.as_u32(), 7);
            assert_eq!(cni.msg, msg, "{list}");
            assert!(cni.details.contains(details), "{list}: {}", cni.details);
        }
    }

    fn ip(address: &str, gateway: Option<&str>, interface: Option<usize>) -> IpConfig {
        IpConfig {
            interface,
            address: address.parse().unwrap(),
            gateway: gateway.map(|g| g.parse().unwrap()),
        }
    }

    #[test]
    fn the_default_route_gateway_is_the_static_one_of_the_family_else_the_prev_results() {
        let config = Config {
            gateway_v4: Some(Ipv4Addr::new(10, 0, 0, 254)),
            ..Config::default()
        };
        let v4 = ip("10.0.0.2/24", Some("10.0.0.1"), None);
        let v6 = ip("fd00::2/64", Some("fd00::1"), None);
        assert_eq!(config.gateway_for(&v4), Some("10.0.0.254".parse().unwrap()));
        assert_eq!(config.gateway_for(&v6), Some("fd00::1".parse().unwrap()));
        assert_eq!(config.gateway_for(&ip("fd00::2/64", None, None)), None);
        assert_eq!(
            Config::default().gateway_for(&ip("fd00::2/64", Some("10.0.0.1"), None)),
            None
        );
    }

    #[test]
    fn addresses_of_other_interfaces_are_skipped_and_missing_indexes_kept() {
        let result = CniResult {
            interfaces: vec![
                Interface {
                    name: "veth0".into(),
                    ..Interface::default()
                },
                Interface {
                    name: "net1".into(),
                    ..Interface::default()
                },
            ],
            ips: vec![
                ip("10.0.0.1/24", None, Some(0)),
                ip("10.0.1.2/24", None, Some(1)),
                ip("10.0.2.2/24", None, None),
                ip("10.0.3.2/24", None, Some(7)),
            ],
            ..CniResult::default()
        };
        let picked: Vec<String> = select_ips(&result, "net1")
            .unwrap()
            .iter()
            .map(|i| i.address.to_string())
            .collect();
        assert_eq!(picked, ["10.0.1.2/24", "10.0.2.2/24", "10.0.3.2/24"]);
        let err = select_ips(&CniResult::default(), "net1").unwrap_err();
        assert_eq!(
            cni::error::CniError::from(err).msg,
            "No IP addresses supplied on interface: net1"
        );
    }
}
