//! The plugin's keys: wire form (as Go decodes it) → validated [`Config`]. Pure.

use cni::error::{CniError, go_quote};
use serde::Deserialize;
use serde_json::Value;

use crate::names::{
    DEFAULT_ADMIN_CHAIN, DEFAULT_ZONE, FORWARD_CHAIN, IPTABLES_CHAIN_MAX, STAGE1_CHAIN,
    STAGE2_CHAIN,
};

/// The keys as they arrive (matched case-insensitively; `""` and `null` mean unset; the serde
/// name is the reference's Go type, which Go's decode errors name).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename = "FirewallNetConf")]
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

/// The keys DEL and GC read, and nothing else: a teardown parses only what it needs, so that
/// an attachment made under a config this version refuses (an older version's, a typo the Go
/// plugin ignored) can still be removed. Raw values: a key of the wrong type is not an error.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename = "FirewallNetConf")]
pub struct TeardownWire {
    /// `backend`.
    pub backend: Option<Value>,
    /// `firewalldZone`.
    #[serde(rename = "firewalldZone")]
    pub zone: Option<Value>,
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

/// What happens to traffic between bridges (and, for `isolated`, within one). Serialised
/// (in the records of attachments) by its configured name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
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

/// A value only we refuse (the reference passes it on): our own message naming the key and
/// value, the reason in details.
fn invalid(field: &str, value: &str, why: &str) -> CniError {
    CniError::invalid_config(format!("invalid {field} {}", go_quote(value))).with_details(why)
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
            // The reference's message; it fails only after installing the backend's rules.
            Some(other) => {
                return Err(CniError::invalid_config(format!(
                    "unknown ingress policy: {}",
                    go_quote(other)
                ))
                .with_details(
                    "ingressPolicy: expected \"open\", \"same-bridge\" or \"isolated\"",
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

impl Config {
    /// The configuration of a DEL or GC: the backend (auto when absent or not one we know,
    /// as the reference treats any other value) and the zone as given; the keys a teardown
    /// does not use (admin chain, ingress policy) at their defaults. Never fails.
    #[must_use]
    pub fn for_teardown(wire: &TeardownWire) -> Config {
        let text = |v: &Option<Value>| v.as_ref().and_then(Value::as_str).map(str::to_owned);
        let backend = match text(&wire.backend).as_deref() {
            None | Some("") => BackendChoice::Auto,
            Some("iptables") => BackendChoice::Iptables,
            Some("nftables") => BackendChoice::Nftables,
            Some("firewalld") => BackendChoice::Firewalld,
            Some(other) => {
                log::warn!(
                    "unknown backend {}: removing with auto-detection",
                    go_quote(other)
                );
                BackendChoice::Auto
            }
        };
        Config {
            backend,
            admin_chain: DEFAULT_ADMIN_CHAIN.to_owned(),
            zone: text(&wire.zone)
                .filter(|z| !z.is_empty())
                .unwrap_or_else(|| DEFAULT_ZONE.to_owned()),
            ingress: IngressPolicy::Open,
        }
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
    use cni::error::ErrorCode;
    use serde_json::json;

    fn conf(v: serde_json::Value) -> Result<Config, CniError> {
        let wire: WireConf = cni::decode::from_value(v).unwrap();
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
            let text = format!("{} {}", err.msg, err.details);
            assert!(text.contains(field) && text.contains(value), "{text}");
        }
    }

    #[test]
    fn an_unknown_ingress_policy_is_the_references_message_with_the_field_in_details() {
        let err = conf(json!({"ingressPolicy": "closed"})).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidConfig);
        assert_eq!(err.msg, r#"unknown ingress policy: "closed""#);
        assert!(
            err.details.starts_with("ingressPolicy: "),
            "{}",
            err.details
        );
        let err = conf(json!({"ingressPolicy": "a\"b\u{1}\n"})).unwrap_err();
        assert_eq!(err.msg, r#"unknown ingress policy: "a\"b\x01\n""#);
    }

    #[test]
    fn teardown_reads_only_the_backend_and_zone_and_never_fails() {
        let teardown = |v: serde_json::Value| {
            let wire: TeardownWire = cni::decode::from_value(v).unwrap();
            Config::for_teardown(&wire)
        };
        let c = teardown(
            json!({"backend": "nftables", "iptablesAdminChainName": "a b",
            "ingressPolicy": "closed", "firewalldZone": "my zone"}),
        );
        assert_eq!(c.backend, BackendChoice::Nftables);
        assert_eq!(c.zone, "my zone");
        assert_eq!(c.admin_chain, "CNI-ADMIN");
        assert_eq!(c.ingress, IngressPolicy::Open);
        for v in [
            json!({"backend": "bogus"}),
            json!({"backend": 5, "firewalldZone": ["x"]}),
            json!({"backend": ""}),
            json!({}),
        ] {
            let c = teardown(v);
            assert_eq!(
                (c.backend, c.zone.as_str()),
                (BackendChoice::Auto, "trusted")
            );
        }
        let c = teardown(json!({"BACKEND": "firewalld", "FirewalldZone": "cni"}));
        assert_eq!(
            (c.backend, c.zone.as_str()),
            (BackendChoice::Firewalld, "cni")
        );
    }
}
