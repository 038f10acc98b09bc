//! CNI results of every spec era and the conversions between them, restating Go's
//! `pkg/types/020`, `040`, `100` and `internal/convert.go` (containernetworking/cni v1.3.0).
//!
//! Plugins work on one model, [`CniResult`] (spec 1.1.0). [`CniResult::from_prev_result`] reads
//! a `prevResult` the way the reference plugins' shared path does (reference §1.7), and
//! [`CniResult::to_json`] prints a result in the config's version byte-for-byte as Go prints it
//! (§1.8). Each era's wire type lives in its own module with its conversions: `v020` (`ip4`/
//! `ip6` blocks), `v040` (`ips` with `version`), `v100` (sorted keys, optional `dns`).

mod v020;
mod v040;
mod v100;
mod wire;

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use crate::decode::{DecodeError, Options, RawJson};
use crate::version::{Era, LATEST};

/// A result in the internal "current" model (spec 1.1.0); every plugin works on this.
///
/// A `prevResult` of any version comes in through [`CniResult::from_prev_result`] (or
/// [`crate::conf::NetConf::prev_result`]), and [`CniResult::to_json`] prints a result in any
/// version, converted as Go's `convert.go` converts it:
///
/// ```
/// use cni::types::CniResult;
/// use serde_json::json;
///
/// // A 1.0.0 prevResult (no `version` keys), in a 1.0.0 configuration.
/// let prev = json!({"cniVersion": "1.0.0",
///     "interfaces": [{"name": "eth0", "mac": "0a:58:0a:00:00:02", "sandbox": "/run/netns/c1"}],
///     "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}]});
/// let result = CniResult::from_prev_result(&prev, "1.0.0")?;
/// assert_eq!(result.ips[0].address.to_string(), "10.0.0.2/24");
///
/// // 0.4.0 adds each address's `version`; 0.2.0 has `ip4` blocks and no interfaces.
/// assert_eq!(
///     result.to_json("0.4.0")?,
///     r#"{
///     "cniVersion": "0.4.0",
///     "interfaces": [
///         {
///             "name": "eth0",
///             "mac": "0a:58:0a:00:00:02",
///             "sandbox": "/run/netns/c1"
///         }
///     ],
///     "ips": [
///         {
///             "version": "4",
///             "interface": 0,
///             "address": "10.0.0.2/24",
///             "gateway": "10.0.0.1"
///         }
///     ],
///     "dns": {}
/// }"#
/// );
/// assert_eq!(
///     result.to_json("0.2.0")?,
///     r#"{
///     "cniVersion": "0.2.0",
///     "ip4": {
///         "ip": "10.0.0.2/24",
///         "gateway": "10.0.0.1"
///     },
///     "dns": {}
/// }"#
/// );
/// # Ok::<(), cni::types::ResultError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CniResult {
    /// Interfaces created or used, referenced by index from [`IpConfig::interface`].
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    pub ips: Vec<IpConfig>,
    /// Routes installed.
    pub routes: Vec<Route>,
    /// Resolver settings.
    pub dns: Dns,
}

/// An interface of a result.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Interface {
    /// Interface name (`eth0`, `veth1234`); Go prints it even when empty.
    pub name: String,
    /// Hardware address as text.
    pub mac: Option<String>,
    /// MTU; 1.x only, lost when printed in an older version.
    pub mtu: Option<u32>,
    /// Netns path of the container side; absent for host-side interfaces.
    pub sandbox: Option<String>,
    /// vhost-user socket path; 1.x only.
    pub socket_path: Option<String>,
    /// PCI address of a device interface; 1.x only.
    pub pci_id: Option<String>,
}

/// An address assigned to an interface.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpConfig {
    /// Index into [`CniResult::interfaces`], when the plugin said which interface.
    pub interface: Option<usize>,
    /// The address with its prefix, host bits kept (`10.0.0.2/24`).
    pub address: IpNet,
    /// Default gateway for this address.
    pub gateway: Option<IpAddr>,
}

/// A route of a result (Go's `types.Route`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Route {
    /// Destination network.
    pub dst: IpNet,
    /// Next hop; absent for a device route.
    pub gw: Option<IpAddr>,
    /// Route MTU (Go omits zero, so zero reads back as unset).
    pub mtu: Option<u32>,
    /// Advertised MSS (zero reads back as unset).
    pub advmss: Option<u32>,
    /// Route metric (zero reads back as unset).
    pub priority: Option<u32>,
    /// Routing table; zero is kept, as Go keeps a pointer.
    pub table: Option<u32>,
    /// Route scope (Go's `*int`); zero is kept.
    pub scope: Option<i32>,
}

/// Resolver settings of a result (Go's `types.DNS`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dns {
    /// Name server addresses, in order of preference.
    pub nameservers: Vec<String>,
    /// Local domain.
    pub domain: Option<String>,
    /// Search domains.
    pub search: Vec<String>,
    /// Resolver options (`ndots:5`).
    pub options: Vec<String>,
}

/// Why a result could not be parsed or printed; messages follow Go's where Go has one.
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    /// The result is not a JSON object.
    #[error("result is not a JSON object")]
    NotAnObject,
    /// A value does not fit the result type of its era; the message names the JSON path.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The result's own `cniVersion` lies outside the era of the version it was read as.
    #[error(
        "result type supports [{}] but unmarshalled CNIVersion is {}",
        .supported.join(" "),
        crate::error::go_quote(.found)
    )]
    VersionMismatch {
        /// The versions the expected era accepts, in Go's order.
        supported: &'static [&'static str],
        /// The version the result carried (empty when it had none).
        found: String,
    },
    /// A result that must name its own version has no `cniVersion`.
    #[error("result has no cniVersion")]
    MissingVersion,
    /// No result type exists for this version.
    #[error("unsupported CNI result version {0:?}")]
    UnsupportedVersion(String),
    /// A result cannot be printed in this version.
    #[error("no converter for CNI result version {LATEST} to {to}")]
    NoConverter {
        /// The requested version.
        to: String,
    },
    /// A 0.1.0/0.2.0 result needs an address and there is none.
    #[error("cannot convert: no valid IP addresses")]
    NoValidIp,
    /// A `prevResult` failed to parse (Go's prefix around the cause).
    #[error("could not parse prevResult: {0}")]
    PrevResult(Box<ResultError>),
    /// Serialisation failed; not expected with these types.
    #[error("failed to encode result: {0}")]
    Encode(#[from] serde_json::Error),
}

impl ResultError {
    /// The underlying error, without the `prevResult` wrapper.
    pub fn root(&self) -> &ResultError {
        match self {
            ResultError::PrevResult(inner) => inner.root(),
            other => other,
        }
    }

    /// The reference's text for this error: where a value fails its own parser (an address,
    /// a CIDR) Go's message is the parser's, without a path, and so is ours. A value of the
    /// wrong JSON type keeps our account, path included: Go names it after the result types'
    /// own decoders, which we do not reproduce (the top-level README says so).
    pub fn reference_text(&self) -> String {
        match self {
            ResultError::Decode(d) if d.go_text().is_none() => d.message().to_string(),
            ResultError::PrevResult(inner) => {
                format!("could not parse prevResult: {}", inner.reference_text())
            }
            other => other.to_string(),
        }
    }
}

impl CniResult {
    /// Parses a `prevResult` as the reference's shared path does (portmap, tuning, bandwidth,
    /// firewall): a result without `cniVersion` is taken to be `conf_version`, one with its own
    /// version must belong to the era of `conf_version`; then it is converted to the model.
    ///
    /// # Errors
    /// [`ResultError::PrevResult`] around a decode error naming the path, a
    /// [`ResultError::VersionMismatch`] or an [`ResultError::UnsupportedVersion`].
    pub fn from_prev_result(raw: &Value, conf_version: &str) -> Result<CniResult, ResultError> {
        CniResult::from_prev_result_json(&RawJson::from_value(raw), conf_version)
    }

    /// [`CniResult::from_prev_result`] of a `prevResult` kept as text, decoded straight into
    /// the result type.
    ///
    /// # Errors
    /// As [`CniResult::from_prev_result`].
    pub fn from_prev_result_json(
        raw: &RawJson,
        conf_version: &str,
    ) -> Result<CniResult, ResultError> {
        prev_result(raw, conf_version, true).map_err(|e| ResultError::PrevResult(Box::new(e)))
    }

    /// Parses a `prevResult` as the reference sbr does: like [`CniResult::from_prev_result`]
    /// but without assuming `conf_version`, so from 0.3.0 on the result must carry a
    /// `cniVersion` of the config's era.
    ///
    /// # Errors
    /// As [`CniResult::from_prev_result`].
    pub fn from_prev_result_strict(
        raw: &Value,
        conf_version: &str,
    ) -> Result<CniResult, ResultError> {
        prev_result(&RawJson::from_value(raw), conf_version, false)
            .map_err(|e| ResultError::PrevResult(Box::new(e)))
    }

    /// Parses a result that names its own version (a plugin's output), returning that version.
    ///
    /// # Errors
    /// [`ResultError::MissingVersion`] without a `cniVersion`, [`ResultError::UnsupportedVersion`]
    /// for an unknown one, [`ResultError::Decode`] when a value does not fit.
    pub fn parse(raw: &Value) -> Result<(String, CniResult), ResultError> {
        #[derive(Deserialize)]
        struct Versioned {
            #[serde(rename = "cniVersion", default)]
            cni_version: String,
        }
        if !raw.is_object() {
            return Err(ResultError::NotAnObject);
        }
        let raw = RawJson::from_value(raw);
        let version = raw.decode::<Versioned>()?.cni_version;
        if version.is_empty() {
            return Err(ResultError::MissingVersion);
        }
        let era = Era::of(&version).ok_or(ResultError::UnsupportedVersion(version))?;
        decode(era, &raw, Options::default())
    }

    /// The text a plugin prints for this result in `version` ("" means 0.1.0, as in Go):
    /// converted to that version's era and indented with four spaces, without a trailing newline.
    ///
    /// # Errors
    /// [`ResultError::NoValidIp`] for 0.1.0/0.2.0 without any address,
    /// [`ResultError::NoConverter`] for a version no result type exists for.
    pub fn to_json(&self, version: &str) -> Result<String, ResultError> {
        let version = if version.is_empty() { "0.1.0" } else { version };
        let text = match Era::of(version) {
            Some(Era::V020) => {
                crate::json::to_go_string(&v020::Result020::from_current(self, version)?)
            }
            Some(Era::V040) => {
                crate::json::to_go_string(&v040::Result040::from_current(self, version))
            }
            Some(Era::V100) => {
                crate::json::to_go_string(&v100::Result100::from_current(self, version))
            }
            None => {
                return Err(ResultError::NoConverter {
                    to: version.to_string(),
                });
            }
        }?;
        Ok(text)
    }
}

fn prev_result(raw: &RawJson, conf_version: &str, inject: bool) -> Result<CniResult, ResultError> {
    if !raw.is_object() {
        return Err(ResultError::NotAnObject);
    }
    let era = Era::of(conf_version)
        .ok_or_else(|| ResultError::UnsupportedVersion(conf_version.to_string()))?;
    // Go's ParsePrevResult injects the exact key `CNIVersion` when it is absent or "", then
    // re-marshals the map, which sorts the keys: that decides which of two keys differing in
    // case wins (`CNIVersion` sorts before `cniVersion`, so the result's own version wins).
    let injected = serde_json::to_vec(conf_version)?;
    let options = Options {
        sorted_keys: true,
        inject_version: inject.then_some(&injected[..]),
        ..Options::default()
    };
    let (_, result) = decode(era, raw, options)?;
    Ok(result)
}

/// Decodes `raw` with the result type of `era` and checks its `cniVersion` belongs there.
fn decode(
    era: Era,
    raw: &RawJson,
    options: Options<'_>,
) -> Result<(String, CniResult), ResultError> {
    let options = Options {
        null_decoded: wire::NULL_DECODED,
        ..options
    };
    let (version, result) = match era {
        Era::V020 => {
            let mut wire: v020::Result020 = raw.decode_with(options)?;
            (std::mem::take(&mut wire.cni_version), wire.into_current())
        }
        Era::V040 => {
            let mut wire: v040::Result040 = raw.decode_with(options)?;
            (std::mem::take(&mut wire.cni_version), wire.into_current())
        }
        Era::V100 => {
            let mut wire: v100::Result100 = raw.decode_with(options)?;
            (std::mem::take(&mut wire.cni_version), wire.into_current())
        }
    };
    if !era.versions().contains(&version.as_str()) {
        return Err(ResultError::VersionMismatch {
            supported: era.versions(),
            found: version,
        });
    }
    // Go's 0.2.0 result type reads a missing version as 0.1.0.
    let version = if version.is_empty() {
        "0.1.0".to_string()
    } else {
        version
    };
    Ok((version, result))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::version::ALL;
    use serde_json::json;

    pub(crate) fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn dns() -> Dns {
        Dns {
            nameservers: vec!["10.96.0.10".into()],
            domain: Some("cluster.local".into()),
            search: vec!["svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        }
    }

    fn route(dst: &str, gw: Option<&str>) -> Route {
        Route {
            dst: net(dst),
            gw: gw.map(ip),
            ..Route::default()
        }
    }

    fn addr(interface: Option<usize>, address: &str, gateway: Option<&str>) -> IpConfig {
        IpConfig {
            interface,
            address: net(address),
            gateway: gateway.map(ip),
        }
    }

    /// Everything a 1.x result can say: host veth, container eth0, two IPv4 and one IPv6
    /// address, a default route per family and one route with every optional field.
    pub(crate) fn full_model() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "veth1a2b3c4d".into(),
                    mac: Some("aa:bb:cc:dd:ee:01".into()),
                    mtu: Some(1500),
                    ..Interface::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: Some("0a:58:0a:01:00:05".into()),
                    mtu: Some(1450),
                    sandbox: Some("/var/run/netns/cni-1234".into()),
                    socket_path: Some("/run/vhost-user/eth0.sock".into()),
                    pci_id: Some("0000:00:1f.6".into()),
                },
            ],
            ips: vec![
                addr(Some(1), "10.1.0.5/16", Some("10.1.0.1")),
                addr(Some(1), "fd00:1::5/64", Some("fd00:1::1")),
                addr(Some(1), "10.2.0.5/24", None),
            ],
            routes: vec![
                route("0.0.0.0/0", Some("10.1.0.1")),
                Route {
                    mtu: Some(1400),
                    advmss: Some(1360),
                    priority: Some(10),
                    table: Some(100),
                    scope: Some(0),
                    ..route("192.0.2.0/24", None)
                },
                route("::/0", Some("fd00:1::1")),
            ],
            dns: dns(),
        }
    }

    /// [`full_model`] as a 0.3.x/0.4.0 result carries it: no 1.x interface fields.
    fn model_040() -> CniResult {
        let mut model = full_model();
        for interface in &mut model.interfaces {
            interface.mtu = None;
            interface.socket_path = None;
            interface.pci_id = None;
        }
        model
    }

    /// [`full_model`] after a trip through 0.1.0/0.2.0: first address per family, no
    /// interfaces or interface index, routes with `dst` and `gw` only.
    fn model_down_to_020() -> CniResult {
        CniResult {
            interfaces: vec![],
            ips: vec![
                addr(None, "10.1.0.5/16", Some("10.1.0.1")),
                addr(None, "fd00:1::5/64", Some("fd00:1::1")),
            ],
            routes: vec![
                route("0.0.0.0/0", Some("10.1.0.1")),
                route("192.0.2.0/24", None),
                route("::/0", Some("fd00:1::1")),
            ],
            dns: dns(),
        }
    }

    /// What [`fixture`] holds in 0.1.0/0.2.0: Go's 0.2.0 routes keep their extra fields.
    fn model_020() -> CniResult {
        let mut model = model_down_to_020();
        model.routes[1].mtu = Some(1400);
        model.routes[1].table = Some(100);
        model
    }

    /// A realistic result as a plugin of `version` would print it.
    fn fixture(version: &str) -> Value {
        match Era::of(version) {
            Some(Era::V020) => json!({
                "cniVersion": version,
                "ip4": {
                    "ip": "10.1.0.5/16",
                    "gateway": "10.1.0.1",
                    "routes": [
                        {"dst": "0.0.0.0/0", "gw": "10.1.0.1"},
                        {"dst": "192.0.2.0/24", "mtu": 1400, "table": 100}
                    ]
                },
                "ip6": {
                    "ip": "fd00:1::5/64",
                    "gateway": "fd00:1::1",
                    "routes": [{"dst": "::/0", "gw": "fd00:1::1"}]
                },
                "dns": {
                    "nameservers": ["10.96.0.10"], "domain": "cluster.local",
                    "search": ["svc.cluster.local"], "options": ["ndots:5"]
                }
            }),
            Some(Era::V040) => json!({
                "cniVersion": version,
                "interfaces": [
                    {"name": "veth1a2b3c4d", "mac": "aa:bb:cc:dd:ee:01"},
                    {"name": "eth0", "mac": "0a:58:0a:01:00:05", "sandbox": "/var/run/netns/cni-1234"}
                ],
                "ips": [
                    {"version": "4", "interface": 1, "address": "10.1.0.5/16", "gateway": "10.1.0.1"},
                    {"version": "6", "interface": 1, "address": "fd00:1::5/64", "gateway": "fd00:1::1"},
                    {"version": "4", "interface": 1, "address": "10.2.0.5/24"}
                ],
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": "10.1.0.1"},
                    {"dst": "192.0.2.0/24", "mtu": 1400, "advmss": 1360, "priority": 10,
                     "table": 100, "scope": 0},
                    {"dst": "::/0", "gw": "fd00:1::1"}
                ],
                "dns": {
                    "nameservers": ["10.96.0.10"], "domain": "cluster.local",
                    "search": ["svc.cluster.local"], "options": ["ndots:5"]
                }
            }),
            _ => json!({
                "cniVersion": version,
                "interfaces": [
                    {"name": "veth1a2b3c4d", "mac": "aa:bb:cc:dd:ee:01", "mtu": 1500},
                    {"name": "eth0", "mac": "0a:58:0a:01:00:05", "mtu": 1450,
                     "sandbox": "/var/run/netns/cni-1234",
                     "socketPath": "/run/vhost-user/eth0.sock", "pciID": "0000:00:1f.6"}
                ],
                "ips": [
                    {"interface": 1, "address": "10.1.0.5/16", "gateway": "10.1.0.1"},
                    {"interface": 1, "address": "fd00:1::5/64", "gateway": "fd00:1::1"},
                    {"interface": 1, "address": "10.2.0.5/24"}
                ],
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": "10.1.0.1"},
                    {"dst": "192.0.2.0/24", "mtu": 1400, "advmss": 1360, "priority": 10,
                     "table": 100, "scope": 0},
                    {"dst": "::/0", "gw": "fd00:1::1"}
                ],
                "dns": {
                    "nameservers": ["10.96.0.10"], "domain": "cluster.local",
                    "search": ["svc.cluster.local"], "options": ["ndots:5"]
                }
            }),
        }
    }

    fn era(version: &str) -> Era {
        Era::of(version).unwrap()
    }

    #[test]
    fn fixtures_parse_to_what_their_era_can_say() {
        for version in ALL {
            let want = match era(version) {
                Era::V020 => model_020(),
                Era::V040 => model_040(),
                Era::V100 => full_model(),
            };
            let (got_version, got) = CniResult::parse(&fixture(version)).unwrap();
            assert_eq!(got_version, *version);
            assert_eq!(got, want, "{version}");
            let prev = CniResult::from_prev_result(&fixture(version), version).unwrap();
            assert_eq!(prev, want, "{version} as prevResult");
        }
    }

    #[test]
    fn every_pair_of_versions_round_trips_keeping_exactly_what_both_eras_carry() {
        for from in ALL {
            for to in ALL {
                let (_, parsed) = CniResult::parse(&fixture(from)).unwrap();
                let text = parsed.to_json(to).unwrap();
                let value: Value = serde_json::from_str(&text).unwrap();
                let (printed_version, back) = CniResult::parse(&value).unwrap();
                assert_eq!(printed_version, *to, "{from} -> {to}");
                let want = match (era(from), era(to)) {
                    (Era::V020, Era::V020) => model_down_to_020(),
                    (Era::V020, _) => model_020(),
                    (_, Era::V020) => model_down_to_020(),
                    (Era::V040, _) | (_, Era::V040) => model_040(),
                    (Era::V100, Era::V100) => full_model(),
                };
                assert_eq!(back, want, "{from} -> {to}:\n{text}");
                // The printed text is also a valid prevResult for a config of the target version.
                let prev = CniResult::from_prev_result(&value, to).unwrap();
                assert_eq!(prev, want, "{from} -> {to} as prevResult");
            }
        }
    }

    #[test]
    fn one_zero_and_one_one_print_the_same_apart_from_the_version() {
        let a = full_model().to_json("1.0.0").unwrap();
        let b = full_model().to_json("1.1.0").unwrap();
        assert_eq!(with_version(&a, "1.0.0", "1.1.0"), b);
    }

    fn with_version(text: &str, from: &str, to: &str) -> String {
        let line = |v: &str| format!("\n    \"cniVersion\": \"{v}\",\n");
        assert!(text.contains(&line(from)), "{text}");
        text.replace(&line(from), &line(to))
    }

    const GOLDEN_110: &str = r#"{
    "cniVersion": "1.1.0",
    "dns": {
        "domain": "cluster.local",
        "nameservers": [
            "10.96.0.10"
        ],
        "options": [
            "ndots:5"
        ],
        "search": [
            "svc.cluster.local"
        ]
    },
    "interfaces": [
        {
            "mac": "aa:bb:cc:dd:ee:01",
            "mtu": 1500,
            "name": "veth1a2b3c4d"
        },
        {
            "mac": "0a:58:0a:01:00:05",
            "mtu": 1450,
            "name": "eth0",
            "pciID": "0000:00:1f.6",
            "sandbox": "/var/run/netns/cni-1234",
            "socketPath": "/run/vhost-user/eth0.sock"
        }
    ],
    "ips": [
        {
            "address": "10.1.0.5/16",
            "gateway": "10.1.0.1",
            "interface": 1
        },
        {
            "address": "fd00:1::5/64",
            "gateway": "fd00:1::1",
            "interface": 1
        },
        {
            "address": "10.2.0.5/24",
            "interface": 1
        }
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0",
            "gw": "10.1.0.1"
        },
        {
            "advmss": 1360,
            "dst": "192.0.2.0/24",
            "mtu": 1400,
            "priority": 10,
            "scope": 0,
            "table": 100
        },
        {
            "dst": "::/0",
            "gw": "fd00:1::1"
        }
    ]
}"#;

    const GOLDEN_040: &str = r#"{
    "cniVersion": "0.4.0",
    "interfaces": [
        {
            "name": "veth1a2b3c4d",
            "mac": "aa:bb:cc:dd:ee:01"
        },
        {
            "name": "eth0",
            "mac": "0a:58:0a:01:00:05",
            "sandbox": "/var/run/netns/cni-1234"
        }
    ],
    "ips": [
        {
            "version": "4",
            "interface": 1,
            "address": "10.1.0.5/16",
            "gateway": "10.1.0.1"
        },
        {
            "version": "6",
            "interface": 1,
            "address": "fd00:1::5/64",
            "gateway": "fd00:1::1"
        },
        {
            "version": "4",
            "interface": 1,
            "address": "10.2.0.5/24"
        }
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0",
            "gw": "10.1.0.1"
        },
        {
            "dst": "192.0.2.0/24",
            "mtu": 1400,
            "advmss": 1360,
            "priority": 10,
            "table": 100,
            "scope": 0
        },
        {
            "dst": "::/0",
            "gw": "fd00:1::1"
        }
    ],
    "dns": {
        "nameservers": [
            "10.96.0.10"
        ],
        "domain": "cluster.local",
        "search": [
            "svc.cluster.local"
        ],
        "options": [
            "ndots:5"
        ]
    }
}"#;

    const GOLDEN_020: &str = r#"{
    "cniVersion": "0.2.0",
    "ip4": {
        "ip": "10.1.0.5/16",
        "gateway": "10.1.0.1",
        "routes": [
            {
                "dst": "0.0.0.0/0",
                "gw": "10.1.0.1"
            },
            {
                "dst": "192.0.2.0/24"
            }
        ]
    },
    "ip6": {
        "ip": "fd00:1::5/64",
        "gateway": "fd00:1::1",
        "routes": [
            {
                "dst": "::/0",
                "gw": "fd00:1::1"
            }
        ]
    },
    "dns": {
        "nameservers": [
            "10.96.0.10"
        ],
        "domain": "cluster.local",
        "search": [
            "svc.cluster.local"
        ],
        "options": [
            "ndots:5"
        ]
    }
}"#;

    #[test]
    fn each_era_prints_the_exact_text_go_prints() {
        let cases = [
            ("1.1.0", GOLDEN_110.to_string()),
            ("1.0.0", with_version(GOLDEN_110, "1.1.0", "1.0.0")),
            ("0.4.0", GOLDEN_040.to_string()),
            ("0.3.1", with_version(GOLDEN_040, "0.4.0", "0.3.1")),
            ("0.3.0", with_version(GOLDEN_040, "0.4.0", "0.3.0")),
            ("0.2.0", GOLDEN_020.to_string()),
            ("0.1.0", with_version(GOLDEN_020, "0.2.0", "0.1.0")),
            ("", with_version(GOLDEN_020, "0.2.0", "0.1.0")),
        ];
        for (version, want) in cases {
            assert_eq!(full_model().to_json(version).unwrap(), want, "{version:?}");
        }
    }

    #[test]
    fn empty_results_print_dns_before_one_zero_and_omit_it_after() {
        let empty = CniResult::default();
        assert_eq!(
            empty.to_json("0.3.0").unwrap(),
            "{\n    \"cniVersion\": \"0.3.0\",\n    \"dns\": {}\n}"
        );
        assert_eq!(
            empty.to_json("1.0.0").unwrap(),
            "{\n    \"cniVersion\": \"1.0.0\"\n}"
        );
        let one_ip = CniResult {
            ips: vec![addr(Some(0), "10.0.0.2/24", None)],
            ..CniResult::default()
        };
        assert_eq!(
            one_ip.to_json("0.2.0").unwrap(),
            "{\n    \"cniVersion\": \"0.2.0\",\n    \"ip4\": {\n        \"ip\": \"10.0.0.2/24\"\n    },\n    \"dns\": {}\n}"
        );
    }

    #[test]
    fn down_conversion_to_0_2_0_without_any_address_fails() {
        let no_ips = CniResult {
            interfaces: full_model().interfaces,
            routes: full_model().routes,
            dns: dns(),
            ..CniResult::default()
        };
        for version in ["", "0.1.0", "0.2.0"] {
            let err = no_ips.to_json(version).unwrap_err();
            assert!(matches!(err, ResultError::NoValidIp), "{version:?}");
            assert_eq!(err.to_string(), "cannot convert: no valid IP addresses");
        }
        assert!(no_ips.to_json("0.3.0").is_ok());
    }

    #[test]
    fn printing_in_an_unknown_version_gives_go_s_no_converter_error() {
        let err = full_model().to_json("0.5.0").unwrap_err();
        assert_eq!(
            err.to_string(),
            "no converter for CNI result version 1.1.0 to 0.5.0"
        );
    }

    #[test]
    fn prev_result_without_cni_version_takes_the_config_version() {
        for version in ALL {
            let mut raw = fixture(version);
            raw.as_object_mut().unwrap().remove("cniVersion");
            let got = CniResult::from_prev_result(&raw, version).unwrap();
            let (_, want) = CniResult::parse(&fixture(version)).unwrap();
            assert_eq!(got, want, "{version}");
        }
        // An explicit empty `CNIVersion` is replaced too.
        let raw = json!({"CNIVersion": "", "ips": [{"address": "10.0.0.2/24"}]});
        assert_eq!(
            CniResult::from_prev_result(&raw, "1.0.0")
                .unwrap()
                .ips
                .len(),
            1
        );
    }

    #[test]
    fn prev_result_with_its_own_version_of_the_config_era_is_accepted() {
        let cases = [
            ("0.4.0", "0.3.0"),
            ("0.3.0", "0.4.0"),
            ("1.0.0", "1.1.0"),
            ("1.1.0", "1.0.0"),
            ("0.2.0", "0.1.0"),
        ];
        for (conf, prev) in cases {
            let got = CniResult::from_prev_result(&fixture(prev), conf).unwrap();
            let (_, want) = CniResult::parse(&fixture(prev)).unwrap();
            assert_eq!(got, want, "conf {conf}, prevResult {prev}");
        }
    }

    #[test]
    fn prev_result_of_another_era_than_the_config_gives_the_go_error() {
        let cases = [
            ("1.0.0", "0.4.0", "[1.0.0 1.1.0]"),
            ("1.1.0", "0.2.0", "[1.0.0 1.1.0]"),
            ("0.4.0", "1.1.0", "[0.3.0 0.3.1 0.4.0]"),
            ("0.3.1", "0.2.0", "[0.3.0 0.3.1 0.4.0]"),
            ("0.2.0", "0.3.1", "[ 0.1.0 0.2.0]"),
            ("", "1.0.0", "[ 0.1.0 0.2.0]"),
        ];
        for (conf, prev, supported) in cases {
            let mut raw = fixture(prev);
            if era(prev) == Era::V020 {
                // An 0.2.0 result decoded as a 1.x one must fail on its version, not its shape.
                raw = json!({"cniVersion": prev});
            }
            let err = CniResult::from_prev_result(&raw, conf).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "could not parse prevResult: result type supports {supported} but unmarshalled CNIVersion is \"{prev}\""
                ),
                "conf {conf:?}, prevResult {prev}"
            );
            assert!(matches!(err.root(), ResultError::VersionMismatch { .. }));
        }
    }

    #[test]
    fn an_upper_case_version_key_loses_to_the_injected_one_as_in_go() {
        // Go sorts `CNIVERSION` before the injected `CNIVersion`, so the config version wins.
        let raw = json!({"CNIVERSION": "0.4.0", "ips": [{"address": "10.0.0.2/24"}]});
        assert!(CniResult::from_prev_result(&raw, "1.1.0").is_ok());
        // A camel-case key sorts after it and is the one that counts.
        let raw = json!({"cniVersion": "0.4.0", "ips": [{"address": "10.0.0.2/24"}]});
        assert!(CniResult::from_prev_result(&raw, "1.1.0").is_err());
    }

    #[test]
    fn a_null_address_is_go_s_cidr_error_which_stops_the_decode() {
        for (version, raw) in [
            ("0.2.0", json!({"cniVersion": "0.2.0", "ip4": {"ip": null}})),
            (
                "1.0.0",
                json!({"cniVersion": "1.0.0", "ips": [{"address": null}]}),
            ),
            // Go stops at it: a type error sorted before it is not the one reported.
            (
                "1.0.0",
                json!({"cniVersion": "1.0.0", "dns": {"nameservers": 5},
                       "routes": [{"dst": null}]}),
            ),
        ] {
            let err = CniResult::from_prev_result(&raw, version).unwrap_err();
            assert_eq!(
                err.reference_text(),
                "could not parse prevResult: invalid CIDR address: ",
                "{raw}"
            );
        }
    }

    #[test]
    fn a_foreign_version_is_quoted_as_go_quotes_it() {
        let mut raw = fixture("0.4.0");
        raw["cniVersion"] = json!("\u{0}é\n");
        let err = CniResult::from_prev_result(&raw, "0.4.0").unwrap_err();
        assert!(
            err.to_string()
                .ends_with(r#"but unmarshalled CNIVersion is "\x00é\n""#),
            "{err}"
        );
    }

    #[test]
    fn sbr_strict_path_requires_the_version_from_0_3_0_on() {
        let mut raw = fixture("0.4.0");
        raw.as_object_mut().unwrap().remove("cniVersion");
        let err = CniResult::from_prev_result_strict(&raw, "0.4.0").unwrap_err();
        assert_eq!(
            err.to_string(),
            "could not parse prevResult: result type supports [0.3.0 0.3.1 0.4.0] but unmarshalled CNIVersion is \"\""
        );
        let mut raw = fixture("0.2.0");
        raw.as_object_mut().unwrap().remove("cniVersion");
        assert_eq!(
            CniResult::from_prev_result_strict(&raw, "0.2.0").unwrap(),
            model_020()
        );
        assert_eq!(
            CniResult::from_prev_result_strict(&fixture("1.0.0"), "1.1.0").unwrap(),
            full_model()
        );
    }

    #[test]
    fn prev_result_keys_match_case_insensitively() {
        let raw = json!({
            "CniVersion": "1.0.0",
            "Interfaces": [{"Name": "eth0", "MAC": "0a:58:0a:01:00:05", "Sandbox": "/var/run/netns/x",
                            "SocketPath": "/s", "PciId": "0000:00:01.0", "MTU": 9000}],
            "IPs": [{"Interface": 0, "Address": "10.1.0.5/16", "Gateway": "10.1.0.1"}],
            "Routes": [{"Dst": "0.0.0.0/0", "GW": "10.1.0.1", "Table": 5}],
            "DNS": {"Nameservers": ["10.96.0.10"], "Domain": "d", "Search": ["s"], "Options": ["o"]}
        });
        let got = CniResult::from_prev_result(&raw, "1.0.0").unwrap();
        let want = CniResult {
            interfaces: vec![Interface {
                name: "eth0".into(),
                mac: Some("0a:58:0a:01:00:05".into()),
                mtu: Some(9000),
                sandbox: Some("/var/run/netns/x".into()),
                socket_path: Some("/s".into()),
                pci_id: Some("0000:00:01.0".into()),
            }],
            ips: vec![addr(Some(0), "10.1.0.5/16", Some("10.1.0.1"))],
            routes: vec![Route {
                table: Some(5),
                ..route("0.0.0.0/0", Some("10.1.0.1"))
            }],
            dns: Dns {
                nameservers: vec!["10.96.0.10".into()],
                domain: Some("d".into()),
                search: vec!["s".into()],
                options: vec!["o".into()],
            },
        };
        assert_eq!(got, want);
        let old = json!({"IP4": {"IP": "10.1.0.5/16", "Routes": [{"DST": "0.0.0.0/0"}]}});
        let got = CniResult::from_prev_result(&old, "0.2.0").unwrap();
        assert_eq!(got.ips, vec![addr(None, "10.1.0.5/16", None)]);
        assert_eq!(got.routes, vec![route("0.0.0.0/0", None)]);
    }

    #[test]
    fn unknown_keys_in_prev_result_are_dropped() {
        let raw = json!({
            "cniVersion": "1.1.0",
            "extra": {"a": 1},
            "interfaces": [{"name": "eth0", "metadata": {"k": "v"}}],
            "ips": [{"address": "10.0.0.2/24", "version": "4", "flags": 1}],
            "routes": [{"dst": "0.0.0.0/0", "onlink": true}],
            "dns": {"servers": ["x"]}
        });
        let text = CniResult::from_prev_result(&raw, "1.1.0")
            .unwrap()
            .to_json("1.1.0")
            .unwrap();
        let printed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            printed,
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0"}],
                "ips": [{"address": "10.0.0.2/24"}],
                "routes": [{"dst": "0.0.0.0/0"}]
            })
        );
    }

    #[test]
    fn bad_values_are_errors_naming_their_path() {
        let cases = [
            (
                "1.0.0",
                json!({"ips": [{"address": "10.0.0.300/24"}]}),
                "ips[0].address: invalid CIDR address: 10.0.0.300/24",
            ),
            (
                "1.0.0",
                json!({"ips": [{"address": "10.0.0.2"}]}),
                "ips[0].address: invalid CIDR address: 10.0.0.2",
            ),
            (
                "0.4.0",
                json!({"ips": [{"address": "10.0.0.2/24"}, {"address": "fd00::2/64", "gateway": "fd00::zz"}]}),
                "ips[1].gateway: invalid IP address: fd00::zz",
            ),
            (
                "1.1.0",
                json!({"routes": [{"dst": "default"}]}),
                "routes[0].dst: invalid CIDR address: default",
            ),
            (
                "0.2.0",
                json!({"ip6": {"ip": "fd00::2/64", "routes": [{"dst": "::/0", "gw": "x"}]}}),
                "ip6.routes[0].gw: invalid IP address: x",
            ),
        ];
        for (conf, raw, want) in cases {
            let err = CniResult::from_prev_result(&raw, conf).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("could not parse prevResult: {want}")
            );
            assert!(matches!(err.root(), ResultError::Decode(_)), "{err}");
        }
        for (path, raw) in [
            (
                "ips[0].interface",
                json!({"ips": [{"interface": -1, "address": "10.0.0.2/24"}]}),
            ),
            ("ips[0]", json!({"ips": [{"gateway": "10.0.0.1"}]})),
            (
                "routes[0].mtu",
                json!({"routes": [{"dst": "0.0.0.0/0", "mtu": 1500.5}]}),
            ),
            ("interfaces[0].name", json!({"interfaces": [{"name": 5}]})),
        ] {
            let err = CniResult::from_prev_result(&raw, "1.1.0").unwrap_err();
            match err.root() {
                ResultError::Decode(e) => assert_eq!(e.path(), path, "{e}"),
                other => panic!("{path}: {other}"),
            }
        }
    }

    #[test]
    fn a_prev_result_that_is_not_an_object_or_of_an_unknown_version_is_an_error() {
        let err = CniResult::from_prev_result(&json!([1]), "1.0.0").unwrap_err();
        assert_eq!(
            err.to_string(),
            "could not parse prevResult: result is not a JSON object"
        );
        let err = CniResult::from_prev_result(&json!({}), "0.5.0").unwrap_err();
        assert_eq!(
            err.to_string(),
            "could not parse prevResult: unsupported CNI result version \"0.5.0\""
        );
    }

    #[test]
    fn parse_requires_a_known_version_of_its_own() {
        let err = CniResult::parse(&json!({"ips": []})).unwrap_err();
        assert!(matches!(err, ResultError::MissingVersion));
        let err = CniResult::parse(&json!({"cniVersion": "0.9.0"})).unwrap_err();
        assert_eq!(err.to_string(), "unsupported CNI result version \"0.9.0\"");
        let err = CniResult::parse(&json!({"cniVersion": 1})).unwrap_err();
        assert!(err.to_string().starts_with("cniVersion: "), "{err}");
        let (version, _) = CniResult::parse(&json!({"CNIVERSION": "0.3.1"})).unwrap();
        assert_eq!(version, "0.3.1");
    }

    #[test]
    fn printed_strings_are_escaped_like_go_and_addresses_keep_host_bits() {
        let result = CniResult {
            interfaces: vec![Interface {
                name: "a<b>&c".into(),
                sandbox: Some(String::new()),
                ..Interface::default()
            }],
            ips: vec![addr(None, "10.0.0.2/24", None)],
            ..CniResult::default()
        };
        let text = result.to_json("1.1.0").unwrap();
        assert!(
            text.contains(r#""name": "a\u003cb\u003e\u0026c""#),
            "{text}"
        );
        assert!(text.contains(r#""address": "10.0.0.2/24""#), "{text}");
        assert!(!text.contains("sandbox"), "{text}");
    }

    #[test]
    fn four_in_six_addresses_read_back_as_ipv4_as_go_does() {
        let raw =
            json!({"ips": [{"address": "::ffff:10.0.0.2/120", "gateway": "::ffff:10.0.0.1"}]});
        let got = CniResult::from_prev_result(&raw, "1.0.0").unwrap();
        assert_eq!(got.ips, vec![addr(None, "10.0.0.2/24", Some("10.0.0.1"))]);
        let text = got.to_json("0.4.0").unwrap();
        assert!(text.contains("\"version\": \"4\""), "{text}");
    }
}
