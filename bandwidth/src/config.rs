//! The plugin's keys and their validation (pure).
//!
//! The four limits come either from the top level of the config or from
//! `runtimeConfig.bandwidth` (capability `bandwidth`): as in the reference, if any of the four
//! top-level keys is present (even as 0), the top-level set is used and the runtime's is
//! ignored. Keys match case-insensitively (containerd sends `IngressRate`).

use cni::conf::NetConf;
use cni::error::CniError;
use serde::Deserialize;

use crate::error::BandwidthError;
use crate::names::DEFAULT_LATENCY_MS;

/// Bursts runtimes send when Kubernetes gives them none: kubelet/dockershim and cri-dockerd
/// `MaxInt32` bits, containerd `MaxUint32` bits, CRI-O `MaxUint32 × 8 − 1` bits.
pub const SENTINEL_BURSTS: [u64; 3] = [i32::MAX as u64, u32::MAX as u64, u32::MAX as u64 * 8 - 1];

/// Largest configurable latency: a minute of queue is already far past useful.
pub const MAX_LATENCY_MS: u64 = 60_000;

/// The plugin's own keys: the reference's `PluginConf` (its serde name is the Go type, which
/// Go's decode errors name), `runtimeConfig` included, so that a value of the wrong type
/// anywhere is refused as Go refuses it, the first in the document, whichever set is used.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default, rename = "PluginConf")]
pub struct BandwidthKeys {
    /// Bits per second into the container. The four limits are the fields of the reference's
    /// embedded `*BandwidthEntry`: any of their keys, `null` too, makes Go allocate the entry,
    /// which then wins over `runtimeConfig.bandwidth` (a `null` alone is 0).
    #[serde(
        rename(deserialize = "ingressRate\0"),
        deserialize_with = "cni::decode::present"
    )]
    pub ingress_rate: Option<u64>,
    /// Bits of burst into the container.
    #[serde(
        rename(deserialize = "ingressBurst\0"),
        deserialize_with = "cni::decode::present"
    )]
    pub ingress_burst: Option<u64>,
    /// Bits per second out of the container.
    #[serde(
        rename(deserialize = "egressRate\0"),
        deserialize_with = "cni::decode::present"
    )]
    pub egress_rate: Option<u64>,
    /// Bits of burst out of the container.
    #[serde(
        rename(deserialize = "egressBurst\0"),
        deserialize_with = "cni::decode::present"
    )]
    pub egress_burst: Option<u64>,
    /// TBF latency in milliseconds (default 25, as the reference).
    pub latency_ms: Option<u64>,
    /// Replace a runtime's sentinel burst by one derived from the rate (default true).
    pub derive_sentinel_burst: Option<bool>,
    /// `runtimeConfig`.
    pub runtime_config: RuntimeKeys,
}

/// One limit set as the runtime sends it in `runtimeConfig.bandwidth`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default, rename = "main.BandwidthEntry")]
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

/// `runtimeConfig` as far as this plugin reads it (an anonymous struct in the reference).
#[derive(Debug, Default, Deserialize)]
#[serde(
    default,
    rename = "struct { Bandwidth *main.BandwidthEntry \"json:\\\"bandwidth,omitempty\\\"\" }"
)]
pub struct RuntimeKeys {
    /// The `bandwidth` capability (a Go pointer).
    #[serde(deserialize_with = "cni::decode::nullable")]
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

    /// Validates the decoded config: first what the reference checks, in its order and with
    /// its messages (so that a config it rejects fails here with its text), then our own
    /// checks.
    ///
    /// # Errors
    /// Code 7, with the field and value in `details`, for a rate without burst (or the
    /// reverse), a burst of 4 GB or more, a value below 1 byte, or a latency out of range.
    pub fn from_conf(conf: &NetConf<BandwidthKeys>) -> Result<Config, CniError> {
        let keys = &conf.plugin;
        let top = [
            keys.ingress_rate,
            keys.ingress_burst,
            keys.egress_rate,
            keys.egress_burst,
        ];
        let (values, prefix) = if top.iter().any(Option::is_some) {
            (top.map(Option::unwrap_or_default), "")
        } else {
            match &keys.runtime_config.bandwidth {
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
        let ingress = Fields::new(prefix, "ingress", ingress_rate, ingress_burst);
        let egress = Fields::new(prefix, "egress", egress_rate, egress_burst);
        ingress.reference_checks()?;
        egress.reference_checks()?;
        let latency_ms = keys.latency_ms.unwrap_or(DEFAULT_LATENCY_MS);
        if !(1..=MAX_LATENCY_MS).contains(&latency_ms) {
            return Err(BandwidthError::config(
                format!("latencyMs {latency_ms} is out of range"),
                format!("it must be between 1 and {MAX_LATENCY_MS} (milliseconds)"),
            )
            .into());
        }
        Ok(Config {
            ingress: ingress.limit()?,
            egress: egress.limit()?,
            latency_us: u32::try_from(latency_ms * 1000).unwrap_or(u32::MAX),
            derive_sentinel_burst: keys.derive_sentinel_burst.unwrap_or(true),
        })
    }
}

/// One direction's two values, with their config paths.
struct Fields {
    rate: u64,
    burst: u64,
    rate_field: String,
    burst_field: String,
}

impl Fields {
    fn new(prefix: &str, direction: &str, rate: u64, burst: u64) -> Fields {
        Fields {
            rate,
            burst,
            rate_field: format!("{prefix}{direction}Rate"),
            burst_field: format!("{prefix}{direction}Burst"),
        }
    }

    /// The reference's `validateRateAndBurst`, in its order, with its messages.
    fn reference_checks(&self) -> Result<(), BandwidthError> {
        let Fields {
            rate,
            burst,
            rate_field,
            burst_field,
        } = self;
        if *burst == 0 && *rate != 0 {
            return Err(BandwidthError::config(
                "if rate is set, burst must also be set",
                format!("{rate_field} is {rate} but {burst_field} is 0 or missing"),
            ));
        }
        if *rate == 0 && *burst != 0 {
            return Err(BandwidthError::config(
                "if burst is set, rate must also be set",
                format!("{burst_field} is {burst} but {rate_field} is 0 or missing"),
            ));
        }
        if burst / 8 >= u64::from(u32::MAX) {
            return Err(BandwidthError::config(
                "burst cannot be more than 4GB",
                format!("{burst_field} is {burst} bits, 4 GB or more"),
            ));
        }
        Ok(())
    }

    /// Our own checks on a direction that passed [`Fields::reference_checks`]; `None` when
    /// both values are 0 (not shaped).
    fn limit(self) -> Result<Option<Limit>, BandwidthError> {
        if self.rate == 0 && self.burst == 0 {
            return Ok(None);
        }
        if self.rate < 8 {
            return Err(BandwidthError::config(
                format!("{} {} is below 8 bits/s", self.rate_field, self.rate),
                "the kernel counts whole bytes per second",
            ));
        }
        if self.burst < 8 {
            return Err(BandwidthError::config(
                format!("{} {} is below 8 bits", self.burst_field, self.burst),
                "the kernel counts whole bytes",
            ));
        }
        Ok(Some(Limit {
            rate: self.rate,
            burst: self.burst,
            sentinel: SENTINEL_BURSTS.contains(&self.burst),
            rate_field: self.rate_field,
            burst_field: self.burst_field,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni::error::ErrorCode;
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
        assert_eq!(err.msg, "if burst is set, rate must also be set");
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
    fn invalid_values_are_code_7_with_the_references_message_and_the_field_in_details() {
        // (input, msg, details): msg exact, details containing.
        let cases = [
            (
                json!({"ingressRate": 8000}),
                "if rate is set, burst must also be set",
                "ingressRate is 8000 but ingressBurst is 0 or missing",
            ),
            (
                json!({"ingressRate": 0, "ingressBurst": 123}),
                "if burst is set, rate must also be set",
                "ingressBurst is 123 but ingressRate is 0 or missing",
            ),
            (
                json!({"egressRate": 80, "egressBurst": 34_359_738_360_u64}),
                "burst cannot be more than 4GB",
                "egressBurst is 34359738360 bits",
            ),
            (
                json!({"runtimeConfig": {"bandwidth": {"egressRate": 80}}}),
                "if rate is set, burst must also be set",
                "runtimeConfig.bandwidth.egressRate is 80 but runtimeConfig.bandwidth.egressBurst",
            ),
            // Only we reject these: our own messages, naming the field.
            (
                json!({"egressRate": 7, "egressBurst": 80}),
                "egressRate 7 is below 8 bits/s",
                "whole bytes",
            ),
            (
                json!({"egressRate": 80, "egressBurst": 7}),
                "egressBurst 7 is below 8 bits",
                "whole bytes",
            ),
            (
                json!({"latencyMs": 0}),
                "latencyMs 0 is out of range",
                "between 1 and 60000",
            ),
            (
                json!({"latencyMs": 60_001}),
                "latencyMs 60001 is out of range",
                "between 1 and 60000",
            ),
            // The reference's checks come first, in its order: ingress before egress, and
            // before anything only we check.
            (
                json!({"ingressRate": 7, "ingressBurst": 80, "egressRate": 8000, "latencyMs": 0}),
                "if rate is set, burst must also be set",
                "egressRate is 8000",
            ),
            (
                json!({"ingressBurst": 8, "egressRate": 8000}),
                "if burst is set, rate must also be set",
                "ingressBurst is 8",
            ),
        ];
        for (input, msg, details) in cases {
            let err = parse(input.clone()).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidConfig, "{input}");
            assert_eq!(err.msg, msg, "{input}");
            assert!(err.details.contains(details), "{input}: {err:?}");
        }
    }

    #[test]
    fn the_4gb_boundary_is_exclusive_as_in_the_reference() {
        let just_below = (u64::from(u32::MAX) - 1) * 8;
        assert!(parse(json!({"egressRate": 80, "egressBurst": just_below})).is_ok());
        let at_limit = u64::from(u32::MAX) * 8;
        assert!(parse(json!({"egressRate": 80, "egressBurst": at_limit})).is_err());
    }

    /// Go's texts, as Debian's bandwidth (Go 1.19) prints them after `failed to parse network
    /// configuration: `.
    #[test]
    fn values_of_the_wrong_type_are_refused_in_go_s_words() {
        let cases = [
            (
                json!({"ingressRate": "fast"}),
                "string into Go struct field PluginConf.ingressRate of type uint64",
            ),
            (
                json!({"ingressRate": -8000}),
                "number -8000 into Go struct field PluginConf.ingressRate of type uint64",
            ),
            (
                json!({"ingressRate": 1.5}),
                "number 1.5 into Go struct field PluginConf.ingressRate of type uint64",
            ),
            (
                json!({"ingressRate": {}}),
                "object into Go struct field PluginConf.ingressRate of type uint64",
            ),
            (
                json!({"runtimeConfig": {"bandwidth": 5}}),
                "number into Go struct field .runtimeConfig.bandwidth of type main.BandwidthEntry",
            ),
            (
                json!({"runtimeConfig": {"bandwidth": {"ingressRate": "x"}}}),
                "string into Go struct field BandwidthEntry.runtimeConfig.bandwidth.ingressRate of type uint64",
            ),
            // Go decodes runtimeConfig even when the top-level keys are the ones used, and
            // reports the first value of the wrong type in the document.
            (
                json!({"ingressRate": 1, "ingressBurst": 1,
                       "runtimeConfig": {"bandwidth": {"ingressRate": "x"}}}),
                "string into Go struct field BandwidthEntry.runtimeConfig.bandwidth.ingressRate of type uint64",
            ),
            (
                json!({"egressRate": "y", "runtimeConfig": {"bandwidth": {"ingressRate": "x"}}}),
                "string into Go struct field PluginConf.egressRate of type uint64",
            ),
        ];
        for (conf, go) in cases {
            let err = parse(conf.clone()).unwrap_err();
            assert_eq!(err.code, ErrorCode::Decode, "{conf}");
            assert_eq!(
                err.msg,
                format!("{}: json: cannot unmarshal {go}", cni::error::DECODE_LEAD),
                "{conf}"
            );
        }
    }
}
