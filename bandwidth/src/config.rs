//! The plugin's keys and their validation (pure).
//!
//! The four limits come either from the top level of the config or from
//! `runtimeConfig.bandwidth` (capability `bandwidth`): as in the reference, if any of the four
//! top-level keys is present (even as 0), the top-level set is used and the runtime's is
//! ignored. Keys match case-insensitively (containerd sends `IngressRate`).

use common::conf::NetConf;
use common::error::CniError;
use serde::Deserialize;

use crate::error::BandwidthError;
use crate::names::DEFAULT_LATENCY_MS;

/// Bursts runtimes send when Kubernetes gives them none: kubelet/dockershim and cri-dockerd
/// `MaxInt32` bits, containerd `MaxUint32` bits, CRI-O `MaxUint32 × 8 − 1` bits.
pub const SENTINEL_BURSTS: [u64; 3] = [i32::MAX as u64, u32::MAX as u64, u32::MAX as u64 * 8 - 1];

/// Largest configurable latency: a minute of queue is already far past useful.
pub const MAX_LATENCY_MS: u64 = 60_000;

/// The plugin's own top-level keys.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BandwidthKeys {
    /// Bits per second into the container.
    pub ingress_rate: Option<u64>,
    /// Bits of burst into the container.
    pub ingress_burst: Option<u64>,
    /// Bits per second out of the container.
    pub egress_rate: Option<u64>,
    /// Bits of burst out of the container.
    pub egress_burst: Option<u64>,
    /// TBF latency in milliseconds (default 25, as the reference).
    pub latency_ms: Option<u64>,
    /// Replace a runtime's sentinel burst by one derived from the rate (default true).
    pub derive_sentinel_burst: Option<bool>,
}

/// One limit set as the runtime sends it in `runtimeConfig.bandwidth`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BandwidthEntry {
    /// Bits per second into the container.
    pub ingress_rate: u64,
    /// Bits of burst into the container.
    pub ingress_burst: u64,
    /// Bits per second out of the container.
    pub egress_rate: u64,
    /// Bits of burst out of the container.
    pub egress_burst: u64,
}

/// `runtimeConfig` as far as this plugin reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RuntimeKeys {
    /// The `bandwidth` capability.
    pub bandwidth: Option<BandwidthEntry>,
}

/// A validated limit for one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Bits per second (≥ 8).
    pub rate: u64,
    /// Bits of burst (≥ 8, < 4 GB in bytes).
    pub burst: u64,
    /// True when `burst` is one of [`SENTINEL_BURSTS`].
    pub sentinel: bool,
    /// The config path of the rate, for messages (`ingressRate` or
    /// `runtimeConfig.bandwidth.ingressRate`).
    pub rate_field: String,
    /// The config path of the burst, for messages.
    pub burst_field: String,
}

impl Limit {
    /// Bytes per second, as the kernel counts.
    pub fn rate_bytes(&self) -> u64 {
        self.rate / 8
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Traffic into the container, if shaped.
    pub ingress: Option<Limit>,
    /// Traffic out of the container, if shaped.
    pub egress: Option<Limit>,
    /// TBF latency in microseconds.
    pub latency_us: u32,
    /// Whether sentinel bursts are replaced by derived ones.
    pub derive_sentinel_burst: bool,
}

impl Config {
    /// True when nothing is shaped.
    pub fn is_empty(&self) -> bool {
        self.ingress.is_none() && self.egress.is_none()
    }

    /// Validates the decoded config.
    ///
    /// # Errors
    /// Code 7 naming the field for a rate without burst (or the reverse), a value below
    /// 1 byte, a burst of 4 GB or more, or a latency out of range; code 6 when
    /// `runtimeConfig` does not decode.
    pub fn from_conf(conf: &NetConf<BandwidthKeys>) -> Result<Config, CniError> {
        let keys = &conf.plugin;
        let latency_ms = keys.latency_ms.unwrap_or(DEFAULT_LATENCY_MS);
        if !(1..=MAX_LATENCY_MS).contains(&latency_ms) {
            return Err(BandwidthError::Config(format!(
                "latencyMs {latency_ms} is out of range: it must be between 1 and {MAX_LATENCY_MS}"
            ))
            .into());
        }
        let latency_us = u32::try_from(latency_ms * 1000).unwrap_or(u32::MAX);
        let top = [
            keys.ingress_rate,
            keys.ingress_burst,
            keys.egress_rate,
            keys.egress_burst,
        ];
        let (values, prefix) = if top.iter().any(Option::is_some) {
            (top.map(Option::unwrap_or_default), "")
        } else {
            let runtime: RuntimeKeys = conf.runtime_config()?;
            match runtime.bandwidth {
                Some(b) => (
                    [
                        b.ingress_rate,
                        b.ingress_burst,
                        b.egress_rate,
                        b.egress_burst,
                    ],
                    "runtimeConfig.bandwidth.",
                ),
                None => ([0; 4], ""),
            }
        };
        let [ingress_rate, ingress_burst, egress_rate, egress_burst] = values;
        Ok(Config {
            ingress: limit(ingress_rate, ingress_burst, prefix, "ingress")?,
            egress: limit(egress_rate, egress_burst, prefix, "egress")?,
            latency_us,
            derive_sentinel_burst: keys.derive_sentinel_burst.unwrap_or(true),
        })
    }
}

/// Validates one direction; `None` when both values are 0.
fn limit(rate: u64, burst: u64, prefix: &str, direction: &str) -> Result<Option<Limit>, CniError> {
    let rate_field = format!("{prefix}{direction}Rate");
    let burst_field = format!("{prefix}{direction}Burst");
    let fail = |msg: String| Err(CniError::from(BandwidthError::Config(msg)));
    match (rate, burst) {
        (0, 0) => return Ok(None),
        (_, 0) => {
            return fail(format!(
                "{rate_field} is {rate} but {burst_field} is 0 or missing: if rate is set, burst must also be set"
            ));
        }
        (0, _) => {
            return fail(format!(
                "{burst_field} is {burst} but {rate_field} is 0 or missing: if burst is set, rate must also be set"
            ));
        }
        _ => {}
    }
    if rate < 8 {
        return fail(format!(
            "{rate_field} {rate} is below 8 bits/s: the kernel counts whole bytes per second"
        ));
    }
    if burst < 8 {
        return fail(format!(
            "{burst_field} {burst} is below 8 bits: the kernel counts whole bytes"
        ));
    }
    if burst / 8 >= u64::from(u32::MAX) {
        return fail(format!(
            "{burst_field} {burst} is too large: burst cannot be more than 4GB"
        ));
    }
    Ok(Some(Limit {
        rate,
        burst,
        sentinel: SENTINEL_BURSTS.contains(&burst),
        rate_field,
        burst_field,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::error::ErrorCode;
    use serde_json::{Value, json};

    fn parse(v: Value) -> Result<Config, CniError> {
        let mut v = v;
        v["name"] = json!("net");
        v["cniVersion"] = json!("1.0.0");
        Config::from_conf(&NetConf::from_value(v)?)
    }

    #[test]
    fn top_level_keys_win_over_runtime_config_even_when_zero() {
        let c = parse(json!({
            "ingressRate": 0,
            "runtimeConfig": {"bandwidth": {"ingressRate": 8000, "ingressBurst": 80}}
        }))
        .unwrap();
        assert!(c.is_empty());
        let c = parse(json!({
            "runtimeConfig": {"bandwidth": {"ingressRate": 8000, "ingressBurst": 80}}
        }))
        .unwrap();
        assert_eq!(
            c.ingress.as_ref().map(|l| (l.rate, l.burst)),
            Some((8000, 80))
        );
        assert_eq!(
            c.ingress.unwrap().rate_field,
            "runtimeConfig.bandwidth.ingressRate"
        );
        assert!(c.egress.is_none());
        // An invalid static set fails even though the runtime set is valid.
        let err = parse(json!({
            "ingressBurst": 123,
            "runtimeConfig": {"bandwidth": {"ingressRate": 8000, "ingressBurst": 80}}
        }))
        .unwrap_err();
        assert!(
            err.msg.contains("if burst is set, rate must also be set"),
            "{err}"
        );
    }

    #[test]
    fn capitalised_runtime_keys_and_sentinel_bursts_are_recognised() {
        let c = parse(json!({
            "RuntimeConfig": {"Bandwidth": {"IngressRate": 10_000_000, "IngressBurst": 4_294_967_295_u64,
                                            "EgressRate": 0, "EgressBurst": 0}}
        }))
        .unwrap();
        let ingress = c.ingress.unwrap();
        assert!(ingress.sentinel);
        assert_eq!(ingress.rate_bytes(), 1_250_000);
        assert!(c.egress.is_none());
        assert!(c.derive_sentinel_burst);
        for sentinel in SENTINEL_BURSTS {
            let c = parse(json!({"egressRate": 1000, "egressBurst": sentinel})).unwrap();
            assert!(c.egress.unwrap().sentinel, "{sentinel}");
        }
        let c = parse(json!({"egressRate": 1000, "egressBurst": 4_294_967_294_u64})).unwrap();
        assert!(!c.egress.unwrap().sentinel);
        let c = parse(json!({"egressRate": 1000, "egressBurst": 80, "deriveSentinelBurst": false}))
            .unwrap();
        assert!(!c.derive_sentinel_burst);
    }

    #[test]
    fn invalid_values_are_code_7_naming_the_field() {
        let cases = [
            (
                json!({"ingressRate": 8000}),
                "ingressBurst",
                "if rate is set, burst must also be set",
            ),
            (
                json!({"ingressRate": 0, "ingressBurst": 123}),
                "ingressRate",
                "if burst is set, rate must also be set",
            ),
            (
                json!({"egressRate": 7, "egressBurst": 80}),
                "egressRate",
                "below 8",
            ),
            (
                json!({"egressRate": 80, "egressBurst": 7}),
                "egressBurst",
                "below 8",
            ),
            (
                json!({"egressRate": 80, "egressBurst": 34_359_738_360_u64}),
                "egressBurst",
                "burst cannot be more than 4GB",
            ),
            (
                json!({"runtimeConfig": {"bandwidth": {"egressRate": 80}}}),
                "runtimeConfig.bandwidth.egressBurst",
                "burst must also be set",
            ),
            (json!({"latencyMs": 0}), "latencyMs 0", "between 1 and"),
            (json!({"latencyMs": 60_001}), "latencyMs", "between 1 and"),
        ];
        for (input, field, text) in cases {
            let err = parse(input.clone()).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidConfig, "{input}");
            assert!(err.msg.contains(field), "{input}: {}", err.msg);
            assert!(err.msg.contains(text), "{input}: {}", err.msg);
        }
    }

    #[test]
    fn the_4gb_boundary_is_exclusive_as_in_the_reference() {
        let just_below = (u64::from(u32::MAX) - 1) * 8;
        assert!(parse(json!({"egressRate": 80, "egressBurst": just_below})).is_ok());
        let at_limit = u64::from(u32::MAX) * 8;
        assert!(parse(json!({"egressRate": 80, "egressBurst": at_limit})).is_err());
    }

    #[test]
    fn wrong_types_are_decode_errors() {
        let err =
            parse(json!({"runtimeConfig": {"bandwidth": {"ingressRate": "10M"}}})).unwrap_err();
        assert_eq!(err.code, ErrorCode::Decode);
        assert!(
            err.msg.contains("runtimeConfig.bandwidth.ingressRate"),
            "{}",
            err.msg
        );
        let err = parse(json!({"ingressRate": -1})).unwrap_err();
        assert_eq!(err.code, ErrorCode::Decode);
    }
}
