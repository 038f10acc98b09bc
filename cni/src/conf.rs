//! The network configuration envelope every plugin receives on stdin.
//!
//! [`NetConf<T>`] holds the keys of the reference's `types.NetConf` (`cniVersion`, `name`,
//! `type`, `capabilities`, `ipam`, `dns`, `prevResult`, `cni.dev/valid-attachments`), the text
//! of `runtimeConfig`, and the plugin's own keys decoded into `T` from the same object, as Go
//! decodes a plugin's struct that embeds `types.NetConf`. Decoding follows Go's rules (see
//! [`crate::decode`]): keys match case-insensitively, unknown keys are ignored, empty strings for
//! optional keys mean unset, and a value of the wrong type is reported in Go's words, naming the
//! plugin's Go struct (`T`'s serde name, e.g. `#[serde(rename = "PluginConf")]`). A plugin
//! without keys of its own uses `NetConf<serde::de::IgnoredAny>`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::decode::{self, DecodeError, Options, RawJson, RawObject};
use crate::error::{CniError, DECODE_LEAD, ErrorCode};
use crate::types::CniResult;

/// One entry of `cni.dev/valid-attachments` in a GC request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename = "types.GCAttachment")]
pub struct GcAttachment {
    /// The container ID of a live attachment.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Its interface name inside the container.
    pub ifname: String,
}

/// The reference's `types.NetConf` (HEAD's, with `cni.dev/valid-attachments`), which every Go
/// plugin embeds: `ipam` and `dns` are decoded only to refuse what Go refuses.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename = "types.NetConf")]
struct Envelope {
    #[serde(rename = "cniVersion")]
    cni_version: String,
    name: String,
    #[serde(rename = "type")]
    plugin_type: String,
    capabilities: BTreeMap<String, bool>,
    ipam: Ipam,
    dns: Dns,
    /// Not a field of `types.NetConf`: any value, decoded (and refused) by the plugins that
    /// read it.
    #[serde(rename = "runtimeConfig")]
    runtime_config: Option<RawJson>,
    /// Go's map: a later `null` makes it nil.
    #[serde(rename = "prevResult", deserialize_with = "decode::nullable")]
    prev_result: Option<RawObject>,
    #[serde(
        rename = "cni.dev/valid-attachments",
        deserialize_with = "decode::nullable"
    )]
    valid_attachments: Option<Vec<GcAttachment>>,
}

/// `types.IPAM`: meta plugins have no IPAM, but Go decodes the key.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename = "types.IPAM")]
struct Ipam {
    #[serde(rename = "type")]
    _plugin_type: String,
}

/// `types.DNS`, decoded as Go decodes it and dropped.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename = "types.DNS")]
struct Dns {
    #[serde(rename = "nameservers")]
    _nameservers: Vec<String>,
    #[serde(rename = "domain")]
    _domain: String,
    #[serde(rename = "search")]
    _search: Vec<String>,
    #[serde(rename = "options")]
    _options: Vec<String>,
}

/// A decoded network configuration: the spec's envelope plus the plugin's keys in `plugin`.
///
/// The plugin's keys are a serde type decoded as Go's `encoding/json` decodes the reference
/// plugin's struct: keys match case-insensitively, unknown keys are ignored, and a value of the
/// wrong type is a code 6 error in Go's words, naming the struct by `T`'s serde name:
///
/// ```
/// use cni::conf::NetConf;
/// use cni::error::ErrorCode;
///
/// #[derive(Debug, Default, serde::Deserialize)]
/// #[serde(default, rename_all = "camelCase", rename = "MtuConf")]
/// struct MtuConf {
///     mtu: Option<u32>,
/// }
///
/// let conf: NetConf<MtuConf> = NetConf::parse(
///     br#"{"cniVersion": "1.0.0", "name": "net", "type": "mtu", "MTU": 1400, "other": 1}"#,
/// )?;
/// assert_eq!((conf.name.as_str(), conf.plugin.mtu), ("net", Some(1400)));
/// assert!(conf.prev_result()?.is_none());
///
/// let err = NetConf::<MtuConf>::parse(br#"{"name": "net", "mtu": "big"}"#).unwrap_err();
/// assert_eq!(err.code, ErrorCode::Decode);
/// assert_eq!(
///     err.msg,
///     "failed to decode network configuration: \
///      json: cannot unmarshal string into Go struct field MtuConf.mtu of type uint32"
/// );
/// # Ok::<(), cni::error::CniError>(())
/// ```
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
    /// `runtimeConfig` (any value: it is the plugin's to decode, if it reads it), kept as
    /// text: decode it with [`NetConf::runtime_config`].
    pub runtime_config: Option<RawJson>,
    /// `prevResult` (an object), kept as text: parse it with [`NetConf::prev_result`].
    pub prev_result: Option<RawJson>,
    /// `cni.dev/valid-attachments` (GC only).
    pub valid_attachments: Option<Vec<GcAttachment>>,
    /// The plugin's own keys.
    pub plugin: T,
    /// The Go type of the plugin's struct (`T`'s serde name), which Go's messages name.
    go_struct: &'static str,
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
    /// and the plugin's keys, skipping everything else; `runtimeConfig` and `prevResult` are
    /// kept as text.
    ///
    /// # Errors
    /// Code 6 led by [`DECODE_LEAD`], as [`decode_error`] words it: of several values of the
    /// wrong type, the first in the document, as Go reports it.
    pub fn from_json(json: &RawJson) -> Result<NetConf<T>, CniError> {
        // Go decodes one struct, the plugin's, with `types.NetConf` embedded: the envelope's
        // fields are the plugin struct's.
        let go_struct = decode::go_struct_type::<T>().unwrap_or(ENVELOPE);
        let envelope = json.decode_with::<Envelope>(Options {
            top_struct: Some(go_struct),
            ..Options::default()
        });
        let plugin = json.decode::<T>();
        let (envelope, plugin) = match (envelope, plugin) {
            (Ok(envelope), Ok(plugin)) => (envelope, plugin),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => return Err(decode_error(DECODE_LEAD, &e)),
            (Err(a), Err(b)) => {
                let first = if b.offset() < a.offset() { b } else { a };
                return Err(decode_error(DECODE_LEAD, &first));
            }
        };
        Ok(NetConf {
            cni_version: envelope.cni_version,
            name: envelope.name,
            plugin_type: envelope.plugin_type,
            capabilities: envelope.capabilities,
            runtime_config: envelope.runtime_config,
            prev_result: envelope.prev_result.map(RawObject::into_inner),
            valid_attachments: envelope.valid_attachments,
            plugin,
            go_struct,
        })
    }
}

/// The Go type of the envelope alone.
const ENVELOPE: &str = "types.NetConf";

impl<T> NetConf<T> {
    /// Decodes `runtimeConfig` into the plugin's type for it (keys matched case-insensitively);
    /// an absent or `null` `runtimeConfig` decodes as `{}`. `R`'s serde name is its Go type
    /// (the reference's are anonymous structs: `struct { Mac string "json:\"mac,omitempty\"" }`).
    ///
    /// # Errors
    /// Code 6 led by [`DECODE_LEAD`] with Go's text naming the `runtimeConfig` field (see
    /// [`decode_error`]). Go decodes `runtimeConfig` with the rest of the plugin's struct: a
    /// plugin that reads it should decode it right after the rest, so that only a config
    /// with a second value of the wrong type, after `runtimeConfig`, can tell the difference.
    pub fn runtime_config<R: DeserializeOwned>(&self) -> Result<R, CniError> {
        let options = Options {
            field_of: Some((self.go_struct, "runtimeConfig")),
            ..Options::default()
        };
        let empty;
        let raw = match &self.runtime_config {
            Some(raw) => raw,
            None => {
                empty = RawJson::from_value(&Value::Object(serde_json::Map::new()));
                &empty
            }
        };
        raw.decode_with(options)
            .map_err(|e| decode_error(DECODE_LEAD, &e))
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
            .map_err(|e| {
                CniError::new(ErrorCode::Decode, e.to_string())
                    .reworded_as(Some(e.reference_text()))
            })
    }

    /// True when the conflist declared capability `key` (e.g. `portMappings`).
    pub fn has_capability(&self, key: &str) -> bool {
        self.capabilities.get(key).copied().unwrap_or(false)
    }
}

/// Checks stdin bytes as JSON (not yet checked to be a config) and keeps them.
///
/// # Errors
/// Code 6 when the bytes are not JSON, with Go's syntax error led by [`DECODE_LEAD`].
pub fn parse_json(bytes: Vec<u8>) -> Result<RawJson, CniError> {
    RawJson::parse(bytes).map_err(|e| decode_error(DECODE_LEAD, &e))
}

/// A configuration that does not decode: code 6, `msg` the reference's (`lead`, then Go's text
/// for the failure where we know it, else ours), `details` ours (the value's path and what is
/// wrong with it) when it says more.
pub fn decode_error(lead: &str, e: &DecodeError) -> CniError {
    let err = CniError::new(ErrorCode::Decode, format!("{lead}: {}", e.reference_text()));
    if e.go_text().is_some() && e.go_text() != Some(e.message()) {
        err.with_details(e.to_string())
    } else {
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The Go types are those of the reference's portmap.
    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", default, rename = "PortMapConf")]
    struct PortmapKeys {
        backend: Option<String>,
        snat: Option<bool>,
        mark_masq_bit: Option<i64>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", default, rename = "main.PortMapEntry")]
    struct Mapping {
        host_port: i64,
        container_port: i64,
        protocol: String,
        #[serde(rename = "hostIP")]
        host_ip: Option<String>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(
        rename_all = "camelCase",
        default,
        rename = "struct { PortMaps []main.PortMapEntry \"json:\\\"portMappings,omitempty\\\"\" }"
    )]
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
            Some(vec![GcAttachment {
                container_id: "abc".into(),
                ifname: "eth0".into()
            }])
        );
    }

    /// Go's texts as Debian's portmap (Go 1.19) prints them for the same configs.
    #[test]
    fn type_errors_are_go_s_with_our_path_in_details() {
        let lead = "failed to decode network configuration: json: cannot unmarshal";
        let cases: [(Value, &str, &str); 9] = [
            (
                json!({"name": "n", "snat": "yes"}),
                "string into Go struct field PortMapConf.snat of type bool",
                "snat: invalid type: string \"yes\", expected bool",
            ),
            (
                json!({"name": "n", "markMasqBit": 1.5}),
                "number 1.5 into Go struct field PortMapConf.markMasqBit of type int",
                "markMasqBit: invalid type: number 1.5, expected int",
            ),
            (
                json!({"name": "n", "capabilities": {"portMappings": 1}}),
                "number into Go struct field PortMapConf.capabilities of type bool",
                "capabilities.portMappings: invalid type: number 1, expected bool",
            ),
            (
                json!({"name": "n", "ipam": 5}),
                "number into Go struct field PortMapConf.ipam of type types.IPAM",
                "ipam: invalid type: number 5, expected types.IPAM",
            ),
            (
                json!({"name": "n", "dns": {"nameservers": "x"}}),
                "string into Go struct field DNS.dns.nameservers of type []string",
                "dns.nameservers: invalid type: string \"x\", expected []string",
            ),
            (
                json!({"name": "n", "prevResult": 5}),
                "number into Go struct field PortMapConf.prevResult of type map[string]interface {}",
                "prevResult: invalid type: number 5, expected map[string]interface {}",
            ),
            (
                json!({"name": "n", "type": [1]}),
                "array into Go struct field PortMapConf.type of type string",
                "type: invalid type: array, expected string",
            ),
            // Of two values of the wrong type, Go reports the first in the document, whether
            // it is the envelope's or the plugin's.
            (
                json!({"name": "n", "markMasqBit": "x", "capabilities": {"a": 1}}),
                "string into Go struct field PortMapConf.markMasqBit of type int",
                "markMasqBit: invalid type: string \"x\", expected int",
            ),
            (
                json!({"name": "n", "capabilities": {"a": 1}, "markMasqBit": "x"}),
                "number into Go struct field PortMapConf.capabilities of type bool",
                "capabilities.a: invalid type: number 1, expected bool",
            ),
        ];
        for (input, go, ours) in cases {
            let err = NetConf::<PortmapKeys>::from_value(input.clone()).unwrap_err();
            assert_eq!(err.code, ErrorCode::Decode, "{input}");
            assert_eq!(err.msg, format!("{lead} {go}"), "{input}");
            assert_eq!(err.details, ours, "{input}");
        }
    }

    #[test]
    fn runtime_config_errors_name_the_field_from_the_plugin_s_struct() {
        let lead = "failed to decode network configuration: json: cannot unmarshal";
        let cases: [(Value, &str, &str); 4] = [
            (
                json!({"portMappings": [{"hostPort": "80"}]}),
                "string into Go struct field PortMapEntry.runtimeConfig.portMappings.hostPort of type int",
                "runtimeConfig.portMappings[0].hostPort: invalid type: string \"80\", expected int",
            ),
            (
                json!({"portMappings": 5}),
                "number into Go struct field .runtimeConfig.portMappings of type []main.PortMapEntry",
                "runtimeConfig.portMappings: invalid type: number 5, expected []main.PortMapEntry",
            ),
            (
                json!({"portMappings": [5]}),
                "number into Go struct field .runtimeConfig.portMappings of type main.PortMapEntry",
                "runtimeConfig.portMappings[0]: invalid type: number 5, expected main.PortMapEntry",
            ),
            (
                json!(5),
                r#"number into Go struct field PortMapConf.runtimeConfig of type struct { PortMaps []main.PortMapEntry "json:\"portMappings,omitempty\"" }"#,
                "runtimeConfig: invalid type: number 5, expected struct { PortMaps []main.PortMapEntry \"json:\\\"portMappings,omitempty\\\"\" }",
            ),
        ];
        for (runtime, go, ours) in cases {
            let conf: NetConf<PortmapKeys> =
                NetConf::from_value(json!({"name": "n", "runtimeConfig": runtime})).unwrap();
            let err = conf.runtime_config::<PortmapRuntime>().unwrap_err();
            assert_eq!(err.code, ErrorCode::Decode, "{runtime}");
            assert_eq!(err.msg, format!("{lead} {go}"), "{runtime}");
            assert_eq!(err.details, ours, "{runtime}");
        }
        // Absent or null: every key at its default.
        for conf in [
            json!({"name": "n"}),
            json!({"name": "n", "runtimeConfig": null}),
        ] {
            let conf: NetConf<PortmapKeys> = NetConf::from_value(conf).unwrap();
            assert_eq!(
                conf.runtime_config::<PortmapRuntime>().unwrap(),
                PortmapRuntime::default()
            );
        }
    }

    #[test]
    fn keys_go_does_not_type_are_not_checked() {
        // `runtimeConfig` belongs to the plugins that read it; `args` to tuning.
        let conf: NetConf<PortmapKeys> =
            NetConf::from_value(json!({"name": "n", "runtimeConfig": 5, "args": [1]})).unwrap();
        assert_eq!(conf.name, "n");
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

    #[test]
    fn prev_result_with_a_bad_address_is_worded_as_go_and_named_in_details() {
        let conf: NetConf<PortmapKeys> = NetConf::from_value(json!({
            "cniVersion": "1.0.0", "name": "n",
            "prevResult": {"ips": [{"address": "10.1.0.300/24"}]}
        }))
        .unwrap();
        let err = conf.prev_result().unwrap_err();
        assert_eq!(
            err.msg,
            "could not parse prevResult: invalid CIDR address: 10.1.0.300/24"
        );
        assert!(err.details.contains("ips[0].address"), "{err:?}");
    }
}
