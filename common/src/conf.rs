//! The network configuration envelope every plugin receives on stdin.
//!
//! [`NetConf<T>`] holds the keys the spec defines for all plugins (`cniVersion`, `name`, `type`,
//! `capabilities`, `runtimeConfig`, `prevResult`, `args`, `cni.dev/valid-attachments`) and the
//! plugin's own keys decoded into `T` from the same object, as if flattened in. Decoding follows
//! Go's rules (see [`crate::decode`]): keys match case-insensitively, unknown keys are ignored,
//! empty strings for optional keys mean unset. A plugin without keys of its own uses
//! `NetConf<serde::de::IgnoredAny>`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer};
use serde_json::Value;

use crate::decode::{DecodeError, RawJson};
use crate::error::{CniError, ErrorCode};
use crate::types::CniResult;

/// One entry of `cni.dev/valid-attachments` in a GC request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
pub struct Attachment {
    /// The container ID of a live attachment.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Its interface name inside the container.
    pub ifname: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Envelope {
    #[serde(rename = "cniVersion")]
    cni_version: String,
    name: String,
    #[serde(rename = "type")]
    plugin_type: String,
    capabilities: BTreeMap<String, bool>,
    #[serde(rename = "runtimeConfig")]
    runtime_config: Object,
    #[serde(rename = "prevResult")]
    prev_result: Option<Object>,
    args: Option<Object>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
}

/// The text of a value that must be a JSON object (kept, not decoded).
#[derive(Debug, Default)]
struct Object(Option<RawJson>);

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Object, D::Error> {
        let raw = RawJson::deserialize(deserializer)?;
        if raw.is_object() {
            return Ok(Object(Some(raw)));
        }
        let unexpected = match raw.as_bytes().iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'[') => serde::de::Unexpected::Seq,
            Some(b'"') => serde::de::Unexpected::Other("string"),
            Some(b't' | b'f') => serde::de::Unexpected::Other("boolean"),
            _ => serde::de::Unexpected::Other("number"),
        };
        Err(serde::de::Error::invalid_type(unexpected, &"a JSON object"))
    }
}

/// A decoded network configuration: the spec's envelope plus the plugin's keys in `plugin`.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf<T> {
    /// `cniVersion` as given ("" when absent).
    pub cni_version: String,
    /// `name`: the network name.
    pub name: String,
    /// `type`: the plugin type.
    pub plugin_type: String,
    /// `capabilities` the plugin declared in the conflist.
    pub capabilities: BTreeMap<String, bool>,
    /// `runtimeConfig` (an object), kept as text: decode it with [`NetConf::runtime_config`].
    pub runtime_config: Option<RawJson>,
    /// `prevResult` (an object), kept as text: parse it with [`NetConf::prev_result`].
    pub prev_result: Option<RawJson>,
    /// `args` (an object, for example `args.cni.*`), kept as text: decode it with
    /// [`RawJson::decode`].
    pub args: Option<RawJson>,
    /// `cni.dev/valid-attachments` (GC only).
    pub valid_attachments: Option<Vec<Attachment>>,
    /// The plugin's own keys.
    pub plugin: T,
}

impl<T: DeserializeOwned> NetConf<T> {
    /// Decodes a configuration from stdin bytes.
    ///
    /// # Errors
    /// Code 6 (decode) when the bytes are not a JSON object or a key has the wrong type; the
    /// message names the key's path.
    pub fn parse(bytes: &[u8]) -> Result<NetConf<T>, CniError> {
        NetConf::from_json(&parse_json(bytes.to_vec())?)
    }

    /// Decodes a configuration from a JSON value (tests build configs with `json!`).
    ///
    /// # Errors
    /// As [`NetConf::parse`].
    pub fn from_value(value: Value) -> Result<NetConf<T>, CniError> {
        NetConf::from_json(&RawJson::from_value(&value))
    }

    /// Decodes a configuration from checked JSON text (the skel's copy of stdin): the envelope
    /// and the plugin's keys, skipping everything else; `runtimeConfig`, `prevResult` and
    /// `args` are kept as text.
    ///
    /// # Errors
    /// As [`NetConf::parse`].
    pub fn from_json(json: &RawJson) -> Result<NetConf<T>, CniError> {
        if !json.is_object() {
            return Err(CniError::new(
                ErrorCode::Decode,
                "failed to decode network configuration: not a JSON object",
            ));
        }
        let envelope: Envelope = json.decode().map_err(conf_decode_error)?;
        let plugin: T = json.decode().map_err(conf_decode_error)?;
        Ok(NetConf {
            cni_version: envelope.cni_version,
            name: envelope.name,
            plugin_type: envelope.plugin_type,
            capabilities: envelope.capabilities,
            runtime_config: envelope.runtime_config.0,
            prev_result: envelope.prev_result.and_then(|o| o.0),
            args: envelope.args.and_then(|o| o.0),
            valid_attachments: envelope.valid_attachments,
            plugin,
        })
    }
}

impl<T> NetConf<T> {
    /// Decodes `runtimeConfig` into the plugin's type for it (keys matched case-insensitively);
    /// an absent `runtimeConfig` decodes as `{}`.
    ///
    /// # Errors
    /// Code 6 naming the offending `runtimeConfig` path.
    pub fn runtime_config<R: DeserializeOwned>(&self) -> Result<R, CniError> {
        let decoded = match &self.runtime_config {
            Some(raw) => raw.decode(),
            None => crate::decode::from_slice(b"{}"),
        };
        decoded.map_err(|e| {
            let path = if e.path().is_empty() {
                "runtimeConfig".to_string()
            } else {
                format!("runtimeConfig.{}", e.path())
            };
            CniError::new(
                ErrorCode::Decode,
                format!(
                    "failed to decode network configuration: {path}: {}",
                    e.message()
                ),
            )
        })
    }

    /// Parses `prevResult` (if any) into the current result model, the way the reference does:
    /// a prevResult without its own `cniVersion` is taken to be in the config's version.
    ///
    /// # Errors
    /// Code 6 when it does not parse or its version belongs to another result era.
    pub fn prev_result(&self) -> Result<Option<CniResult>, CniError> {
        let Some(raw) = &self.prev_result else {
            return Ok(None);
        };
        CniResult::from_prev_result_json(raw, &self.cni_version)
            .map(Some)
            .map_err(|e| CniError::new(ErrorCode::Decode, e.to_string()))
    }

    /// True when the conflist declared capability `key` (e.g. `portMappings`).
    pub fn has_capability(&self, key: &str) -> bool {
        self.capabilities.get(key).copied().unwrap_or(false)
    }
}

/// Checks stdin bytes as JSON (not yet checked to be a config) and keeps them.
///
/// # Errors
/// Code 6 when the bytes are not JSON, with Go's syntax error.
pub fn parse_json(bytes: Vec<u8>) -> Result<RawJson, CniError> {
    RawJson::parse(bytes).map_err(conf_decode_error)
}

fn conf_decode_error(e: DecodeError) -> CniError {
    CniError::new(
        ErrorCode::Decode,
        format!("failed to decode network configuration: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", default)]
    struct PortmapKeys {
        backend: Option<String>,
        snat: Option<bool>,
        mark_masq_bit: Option<i32>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", default)]
    struct Mapping {
        host_port: u16,
        container_port: u16,
        protocol: String,
        #[serde(rename = "hostIP")]
        host_ip: Option<String>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", default)]
    struct PortmapRuntime {
        port_mappings: Vec<Mapping>,
    }

    /// The containerd payload of landscape §3.2: capitalised capability keys.
    const CONTAINERD_PORTMAP: &str = r#"{
      "cniVersion": "1.0.0",
      "name": "cbr0",
      "type": "portmap",
      "capabilities": { "portMappings": true },
      "runtimeConfig": {
        "portMappings": [
          { "HostPort": 30080, "ContainerPort": 8080, "Protocol": "tcp", "HostIP": "" },
          { "HostPort": 5353, "ContainerPort": 53, "Protocol": "udp", "HostIP": "192.0.2.10" }
        ],
        "dns": { "Servers": ["10.96.0.10"] },
        "cgroupPath": "/kubepods.slice",
        "io.kubernetes.cri.pod-annotations": { "a": "b" }
      },
      "backend": "",
      "snat": true,
      "prevResult": { "cniVersion": "1.0.0", "ips": [ { "address": "10.1.0.5/24" } ] }
    }"#;

    #[test]
    fn containerd_payload_decodes_envelope_plugin_keys_and_runtime_config() {
        let conf: NetConf<PortmapKeys> = NetConf::parse(CONTAINERD_PORTMAP.as_bytes()).unwrap();
        assert_eq!(conf.cni_version, "1.0.0");
        assert_eq!(conf.name, "cbr0");
        assert_eq!(conf.plugin_type, "portmap");
        assert!(conf.has_capability("portMappings"));
        assert!(!conf.has_capability("bandwidth"));
        assert_eq!(
            conf.plugin,
            PortmapKeys {
                backend: None,
                snat: Some(true),
                mark_masq_bit: None
            }
        );
        let rt: PortmapRuntime = conf.runtime_config().unwrap();
        assert_eq!(rt.port_mappings.len(), 2);
        assert_eq!(rt.port_mappings[0].host_port, 30080);
        assert_eq!(rt.port_mappings[0].host_ip, None);
        assert_eq!(rt.port_mappings[1].host_ip.as_deref(), Some("192.0.2.10"));
    }

    #[test]
    fn bandwidth_payloads_of_containerd_and_cri_o_decode_alike() {
        #[derive(Debug, Default, Deserialize, PartialEq)]
        #[serde(rename_all = "camelCase", default)]
        struct Bandwidth {
            ingress_rate: u64,
            ingress_burst: u64,
            egress_rate: u64,
            egress_burst: u64,
        }
        #[derive(Debug, Default, Deserialize)]
        #[serde(default)]
        struct Runtime {
            bandwidth: Option<Bandwidth>,
        }
        let containerd = br#"{"cniVersion": "1.0.0", "name": "k8s", "type": "bandwidth",
            "capabilities": {"bandwidth": true},
            "runtimeConfig": {"bandwidth": {"IngressRate": 10000000, "IngressBurst": 4294967295,
                                            "EgressRate": 0, "EgressBurst": 0}}}"#;
        let crio = br#"{"cniVersion": "1.0.0", "name": "k8s", "type": "bandwidth",
            "runtimeConfig": {"bandwidth": {"ingressRate": 10000000, "ingressBurst": 34359738359,
                                            "egressRate": 0, "egressBurst": 0}}}"#;
        let a: Runtime = NetConf::<serde::de::IgnoredAny>::parse(containerd)
            .unwrap()
            .runtime_config()
            .unwrap();
        let b: Runtime = NetConf::<serde::de::IgnoredAny>::parse(crio)
            .unwrap()
            .runtime_config()
            .unwrap();
        let (a, b) = (a.bandwidth.unwrap(), b.bandwidth.unwrap());
        assert_eq!(
            (a.ingress_rate, a.ingress_burst),
            (10_000_000, 4_294_967_295)
        );
        assert_eq!(
            (b.ingress_rate, b.ingress_burst),
            (10_000_000, 34_359_738_359)
        );
        assert_eq!((a.egress_rate, b.egress_burst), (0, 0));
    }

    #[test]
    fn capitalised_envelope_keys_are_accepted_as_go_does() {
        let conf: NetConf<PortmapKeys> = NetConf::parse(
            br#"{"CNIVersion": "0.4.0", "Name": "n", "Type": "portmap",
                 "RuntimeConfig": {"portMappings": []}, "PrevResult": {"ips": []},
                 "Backend": "nftables", "MarkMasqBit": 5}"#,
        )
        .unwrap();
        assert_eq!(conf.cni_version, "0.4.0");
        assert_eq!(conf.name, "n");
        let rt: PortmapRuntime = conf.runtime_config().unwrap();
        assert!(rt.port_mappings.is_empty());
        assert!(conf.runtime_config.is_some());
        assert!(conf.prev_result.is_some());
        assert_eq!(conf.plugin.backend.as_deref(), Some("nftables"));
        assert_eq!(conf.plugin.mark_masq_bit, Some(5));
    }

    #[test]
    fn gc_valid_attachments_are_decoded() {
        let conf: NetConf<PortmapKeys> = NetConf::parse(
            br#"{"cniVersion": "1.1.0", "name": "cbr0", "type": "portmap",
                 "cni.dev/valid-attachments": [{"containerID": "abc", "ifname": "eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(
            conf.valid_attachments,
            Some(vec![Attachment {
                container_id: "abc".into(),
                ifname: "eth0".into()
            }])
        );
    }

    #[test]
    fn type_errors_are_decode_errors_naming_the_key() {
        let cases: [(Value, &str); 4] = [
            (json!({"name": "n", "snat": "yes"}), "snat"),
            (json!({"name": "n", "markMasqBit": 1.5}), "markMasqBit"),
            (json!({"name": 1}), "name"),
            (
                json!({"name": "n", "capabilities": {"portMappings": 1}}),
                "capabilities.portMappings",
            ),
        ];
        for (input, key) in cases {
            let err = NetConf::<PortmapKeys>::from_value(input.clone()).unwrap_err();
            assert_eq!(err.code, ErrorCode::Decode, "{input}");
            assert!(err.msg.contains(key), "{input}: {}", err.msg);
        }
        let conf: NetConf<PortmapKeys> = NetConf::from_value(json!({
            "name": "n", "runtimeConfig": {"portMappings": [{"hostPort": "80"}]}
        }))
        .unwrap();
        let err = conf.runtime_config::<PortmapRuntime>().unwrap_err();
        assert_eq!(err.code, ErrorCode::Decode);
        assert!(
            err.msg.contains("runtimeConfig.portMappings[0].hostPort"),
            "{}",
            err.msg
        );
    }

    #[test]
    fn non_objects_and_bad_json_are_decode_errors() {
        for input in [&b"[]"[..], b"\"x\"", b"{", b""] {
            let err = NetConf::<PortmapKeys>::parse(input).unwrap_err();
            assert_eq!(err.code, ErrorCode::Decode);
        }
    }

    #[test]
    fn prev_result_without_version_takes_the_config_version() {
        let conf: NetConf<PortmapKeys> = NetConf::from_value(json!({
            "cniVersion": "1.0.0", "name": "n",
            "prevResult": {"ips": [{"address": "10.1.0.5/24"}]}
        }))
        .unwrap();
        let prev = conf.prev_result().unwrap().unwrap();
        assert_eq!(prev.ips[0].address.to_string(), "10.1.0.5/24");
        let conf: NetConf<PortmapKeys> =
            NetConf::from_value(json!({"cniVersion": "1.0.0", "name": "n"})).unwrap();
        assert_eq!(conf.prev_result().unwrap(), None);
    }

    #[test]
    fn prev_result_of_another_era_is_a_decode_error() {
        let conf: NetConf<PortmapKeys> = NetConf::from_value(json!({
            "cniVersion": "1.0.0", "name": "n",
            "prevResult": {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.1.0.5/24"}]}
        }))
        .unwrap();
        let err = conf.prev_result().unwrap_err();
        assert_eq!(err.code, ErrorCode::Decode);
        assert!(
            err.msg.starts_with("could not parse prevResult"),
            "{}",
            err.msg
        );
    }
}
