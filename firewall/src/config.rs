//! The plugin's keys: wire form (as Go decodes it) → validated [`Config`]. Pure.

use common::error::CniError;
use serde::Deserialize;

use crate::names::{
    DEFAULT_ADMIN_CHAIN, DEFAULT_ZONE, FORWARD_CHAIN, IPTABLES_CHAIN_MAX, STAGE1_CHAIN,
    STAGE2_CHAIN,
};

/// The keys as they arrive (matched case-insensitively; `""` and `null` mean unset).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct WireConf {
    /// `backend`.
    pub backend: Option<String>,
    /// `iptablesAdminChainName`.
    #[serde(rename = "iptablesAdminChainName")]
    pub admin_chain: Option<String>,
    /// `firewalldZone`.
    #[serde(rename = "firewalldZone")]
    pub zone: Option<String>,
    /// `ingressPolicy`.
    #[serde(rename = "ingressPolicy")]
    pub ingress_policy: Option<String>,
}

/// Which mechanism programs the firewall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// Absent or `""`: firewalld when it owns its name on the system bus, else iptables.
    Auto,
    /// `iptables`: the reference's filter-table layout.
    Iptables,
    /// `nftables`: one `inet` table of our own, over netlink.
    Nftables,
    /// `firewalld`: container IPs become sources of a zone.
    Firewalld,
}

/// What happens to traffic between bridges (and, for `isolated`, within one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressPolicy {
    /// No isolation (the default; also `""`).
    Open,
    /// Traffic from this bridge to another isolated bridge is dropped.
    SameBridge,
    /// As `same-bridge`, and traffic between containers of this bridge is dropped too.
    Isolated,
}

impl IngressPolicy {
    /// The policy as configured.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            IngressPolicy::Open => "open",
            IngressPolicy::SameBridge => "same-bridge",
            IngressPolicy::Isolated => "isolated",
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The backend to use.
    pub backend: BackendChoice,
    /// The iptables admin chain (`CNI-ADMIN` by default).
    pub admin_chain: String,
    /// The firewalld zone (`trusted` by default).
    pub zone: String,
    /// The ingress policy.
    pub ingress: IngressPolicy,
}

fn invalid(field: &str, value: &str, why: &str) -> CniError {
    CniError::invalid_config(format!("invalid {field} {value:?}: {why}"))
}

impl Config {
    /// Validates the wire keys.
    ///
    /// # Errors
    /// Code 7 naming the field and value.
    pub fn from_wire(wire: &WireConf) -> Result<Config, CniError> {
        let backend = match wire.backend.as_deref() {
            None => BackendChoice::Auto,
            Some("iptables") => BackendChoice::Iptables,
            Some("nftables") => BackendChoice::Nftables,
            Some("firewalld") => BackendChoice::Firewalld,
            Some(other) => {
                return Err(invalid(
                    "backend",
                    other,
                    "expected \"iptables\", \"nftables\", \"firewalld\" or \"\" (auto)",
                ));
            }
        };
        let ingress = match wire.ingress_policy.as_deref() {
            None | Some("open") => IngressPolicy::Open,
            Some("same-bridge") => IngressPolicy::SameBridge,
            Some("isolated") => IngressPolicy::Isolated,
            Some(other) => {
                return Err(invalid(
                    "ingressPolicy",
                    other,
                    "expected \"open\", \"same-bridge\" or \"isolated\"",
                ));
            }
        };
        let admin_chain = wire
            .admin_chain
            .clone()
            .unwrap_or_else(|| DEFAULT_ADMIN_CHAIN.to_owned());
        validate_chain(&admin_chain)?;
        let zone = wire.zone.clone().unwrap_or_else(|| DEFAULT_ZONE.to_owned());
        validate_zone(&zone)?;
        Ok(Config {
            backend,
            admin_chain,
            zone,
            ingress,
        })
    }
}

/// Targets and chains the admin chain must not be confused with.
const RESERVED_CHAINS: [&str; 11] = [
    "ACCEPT",
    "DROP",
    "RETURN",
    "REJECT",
    "QUEUE",
    "INPUT",
    "OUTPUT",
    "PREROUTING",
    "POSTROUTING",
    FORWARD_CHAIN,
    crate::names::CNI_FORWARD_CHAIN,
];

fn validate_chain(name: &str) -> Result<(), CniError> {
    let field = "iptablesAdminChainName";
    if name.len() > IPTABLES_CHAIN_MAX {
        return Err(invalid(
            field,
            name,
            &format!("longer than {IPTABLES_CHAIN_MAX} bytes"),
        ));
    }
    if name.starts_with(['-', '!'])
        || name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\'' || c == '\\')
    {
        return Err(invalid(
            field,
            name,
            "must not start with - or ! nor contain whitespace, quotes or backslashes",
        ));
    }
    if RESERVED_CHAINS.contains(&name) || name == STAGE1_CHAIN || name == STAGE2_CHAIN {
        return Err(invalid(field, name, "is a built-in or plugin-owned chain"));
    }
    Ok(())
}

fn validate_zone(zone: &str) -> Result<(), CniError> {
    // firewalld's own rule for zone names: letters, digits, `_`, `-`, `/`, `+`, at most 17.
    if zone.len() > 17
        || !zone
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/' | '+'))
    {
        return Err(invalid(
            "firewalldZone",
            zone,
            "expected at most 17 letters, digits, '_', '-', '/' or '+'",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::error::ErrorCode;
    use serde_json::json;

    fn conf(v: serde_json::Value) -> Result<Config, CniError> {
        let wire: WireConf = common::decode::from_value(v).unwrap();
        Config::from_wire(&wire)
    }

    #[test]
    fn absent_and_empty_keys_take_the_reference_defaults() {
        for v in [
            json!({}),
            json!({"backend": "", "ingressPolicy": "", "firewalldZone": "", "iptablesAdminChainName": ""}),
            json!({"backend": null}),
        ] {
            assert_eq!(
                conf(v).unwrap(),
                Config {
                    backend: BackendChoice::Auto,
                    admin_chain: "CNI-ADMIN".into(),
                    zone: "trusted".into(),
                    ingress: IngressPolicy::Open,
                }
            );
        }
    }

    #[test]
    fn every_backend_and_policy_is_accepted_case_insensitively_by_key() {
        let c = conf(json!({"Backend": "nftables", "INGRESSPOLICY": "isolated",
            "iptablesadminchainname": "CNI-foobar", "firewalldzone": "cni"}))
        .unwrap();
        assert_eq!(c.backend, BackendChoice::Nftables);
        assert_eq!(c.ingress, IngressPolicy::Isolated);
        assert_eq!(c.admin_chain, "CNI-foobar");
        assert_eq!(c.zone, "cni");
        assert_eq!(
            conf(json!({"backend": "firewalld", "ingressPolicy": "same-bridge"}))
                .unwrap()
                .backend,
            BackendChoice::Firewalld
        );
        assert_eq!(
            conf(json!({"backend": "iptables"})).unwrap().backend,
            BackendChoice::Iptables
        );
    }

    #[test]
    fn bad_values_are_code_7_naming_the_field_and_value() {
        for (v, field, value) in [
            (json!({"backend": "ipfw"}), "backend", "ipfw"),
            (
                json!({"ingressPolicy": "closed"}),
                "ingressPolicy",
                "closed",
            ),
            (
                json!({"iptablesAdminChainName": "A-VERY-LONG-CHAIN-NAME-OVER-28-BYTES"}),
                "iptablesAdminChainName",
                "A-VERY-LONG",
            ),
            (
                json!({"iptablesAdminChainName": "has space"}),
                "iptablesAdminChainName",
                "has space",
            ),
            (
                json!({"iptablesAdminChainName": "CNI-FORWARD"}),
                "iptablesAdminChainName",
                "CNI-FORWARD",
            ),
            (
                json!({"iptablesAdminChainName": "DROP"}),
                "iptablesAdminChainName",
                "DROP",
            ),
            (
                json!({"firewalldZone": "my zone"}),
                "firewalldZone",
                "my zone",
            ),
        ] {
            let err = conf(v).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidConfig, "{err:?}");
            assert!(
                err.msg.contains(field) && err.msg.contains(value),
                "{}",
                err.msg
            );
        }
    }
}
