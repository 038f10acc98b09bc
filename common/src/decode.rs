//! Decoding JSON the way Go's `encoding/json` does, so our plugins accept what the Go ones accept.
//!
//! Runtimes rely on Go's leniency: containerd sends `HostPort` and `IngressRate`, reference tests
//! send `RuntimeConfig`, podman sends `"backend": ""`. This module decodes any `Deserialize` type
//! from a [`serde_json::Value`] with these rules:
//!
//! - object keys match struct fields **case-insensitively**, an exact match preferred; when two
//!   keys land on the same field, the later one in the document wins;
//! - unknown keys are ignored (unless the type says `deny_unknown_fields`);
//! - a `null` value leaves the field at its default, as Go does;
//! - an empty string for an `Option` field means "unset" (`None`);
//! - errors name the path of the offending value (`runtimeConfig.portMappings[1].hostPort: …`).
//!
//! Numbers keep serde's strictness, which equals Go's: `8080.0`, `"8080"` or `-1` for an
//! unsigned port are errors. Types decoded here must not use `#[serde(flatten)]` or untagged
//! enums: those buffer their input and lose the case-insensitive matching below them.

use std::fmt;

use serde::Deserializer;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};
use serde_json::{Map, Value};

/// A decode failure, with the JSON path of the value that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DecodeError {
    path: String,
    msg: String,
}

impl DecodeError {
    /// The JSON path of the offending value (`a.b[2].c`), empty for the document itself.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The message without the path.
    pub fn message(&self) -> &str {
        &self.msg
    }

    fn at(mut self, path: &str) -> Self {
        if self.path.is_empty() {
            self.path = path.to_string();
        }
        self
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.msg)
        } else {
            write!(f, "{}: {}", self.path, self.msg)
        }
    }
}

impl de::Error for DecodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DecodeError {
            path: String::new(),
            msg: msg.to_string(),
        }
    }
}

/// Decodes `T` from a JSON value with Go's matching rules (see the module docs).
///
/// # Errors
/// A [`DecodeError`] naming the path and the problem when a value has the wrong type or range.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, DecodeError> {
    T::deserialize(ValueDeserializer {
        value,
        path: String::new(),
    })
}

/// Parses `bytes` as JSON and decodes `T` from it with Go's matching rules.
///
/// # Errors
/// A [`DecodeError`] when the bytes are not JSON or do not fit `T`.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| DecodeError {
        path: String::new(),
        msg: e.to_string(),
    })?;
    from_value(value)
}

/// Returns the field of `fields` that `key` names: exact match first, then ASCII case-folded.
pub fn match_field<'f>(key: &str, fields: &[&'f str]) -> Option<&'f str> {
    fields
        .iter()
        .find(|f| **f == key)
        .or_else(|| fields.iter().find(|f| f.eq_ignore_ascii_case(key)))
        .copied()
}

/// Rewrites the keys of `map` to the canonical field names, dropping nulls; later keys win.
fn fold_keys(map: Map<String, Value>, fields: &[&str]) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = Vec::with_capacity(map.len());
    for (key, value) in map {
        if value.is_null() {
            continue;
        }
        let name = match_field(&key, fields).map_or(key, str::to_string);
        match out.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = value,
            None => out.push((name, value)),
        }
    }
    out
}

fn child_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

struct ValueDeserializer {
    value: Value,
    path: String,
}

impl ValueDeserializer {
    fn invalid_type(&self, exp: &dyn de::Expected) -> DecodeError {
        let unexp = match &self.value {
            Value::Null => de::Unexpected::Unit,
            Value::Bool(b) => de::Unexpected::Bool(*b),
            Value::Number(_) => de::Unexpected::Other("number"),
            Value::String(s) => de::Unexpected::Str(s),
            Value::Array(_) => de::Unexpected::Seq,
            Value::Object(_) => de::Unexpected::Map,
        };
        <DecodeError as de::Error>::invalid_type(unexp, exp).at(&self.path)
    }
}

macro_rules! forward_to_json {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
                let path = self.path;
                self.value.$method(visitor).map_err(|e| DecodeError { path, msg: e.to_string() })
            }
        )*
    };
}

impl<'de> Deserializer<'de> for ValueDeserializer {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        let path = self.path.clone();
        match self.value {
            Value::Array(items) => visitor.visit_seq(ArrayAccess::new(items, path.clone())),
            Value::Object(map) => {
                let entries = map.into_iter().collect();
                visitor.visit_map(ObjectAccess::new(entries, path.clone()))
            }
            other => other
                .deserialize_any(visitor)
                .map_err(<DecodeError as de::Error>::custom),
        }
        .map_err(|e| e.at(&path))
    }

    forward_to_json! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_identifier
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match &self.value {
            Value::Null => visitor.visit_none(),
            Value::String(s) if s.is_empty() => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Array(items) => {
                let path = self.path;
                visitor
                    .visit_seq(ArrayAccess::new(items, path.clone()))
                    .map_err(|e| e.at(&path))
            }
            _ => Err(self.invalid_type(&visitor)),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Object(map) => {
                let path = self.path;
                let entries = map.into_iter().collect();
                visitor
                    .visit_map(ObjectAccess::new(entries, path.clone()))
                    .map_err(|e| e.at(&path))
            }
            _ => Err(self.invalid_type(&visitor)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Object(map) => {
                let path = self.path;
                let entries = fold_keys(map, fields);
                visitor
                    .visit_map(ObjectAccess::new(entries, path.clone()))
                    .map_err(|e| e.at(&path))
            }
            _ => Err(self.invalid_type(&visitor)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        let path = self.path.clone();
        self.value
            .deserialize_enum(name, variants, visitor)
            .map_err(|e| DecodeError {
                path,
                msg: e.to_string(),
            })
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_unit()
    }
}

struct ArrayAccess {
    items: std::iter::Enumerate<std::vec::IntoIter<Value>>,
    len: usize,
    path: String,
}

impl ArrayAccess {
    fn new(items: Vec<Value>, path: String) -> Self {
        ArrayAccess {
            len: items.len(),
            items: items.into_iter().enumerate(),
            path,
        }
    }
}

impl<'de> SeqAccess<'de> for ArrayAccess {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DecodeError> {
        match self.items.next() {
            Some((i, value)) => {
                self.len -= 1;
                let path = format!("{}[{i}]", self.path);
                seed.deserialize(ValueDeserializer {
                    value,
                    path: path.clone(),
                })
                .map(Some)
                .map_err(|e| e.at(&path))
            }
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.len)
    }
}

struct ObjectAccess {
    entries: std::vec::IntoIter<(String, Value)>,
    pending: Option<(String, Value)>,
    path: String,
}

impl ObjectAccess {
    fn new(entries: Vec<(String, Value)>, path: String) -> Self {
        ObjectAccess {
            entries: entries.into_iter(),
            pending: None,
            path,
        }
    }
}

impl<'de> MapAccess<'de> for ObjectAccess {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DecodeError> {
        match self.entries.next() {
            Some((key, value)) => {
                let path = child_path(&self.path, &key);
                let k = seed
                    .deserialize(key.clone().into_deserializer())
                    .map_err(|e: DecodeError| e.at(&path))?;
                self.pending = Some((key, value));
                Ok(Some(k))
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DecodeError> {
        let (key, value) = self
            .pending
            .take()
            .ok_or_else(|| <DecodeError as de::Error>::custom("value requested before key"))?;
        let path = child_path(&self.path, &key);
        seed.deserialize(ValueDeserializer {
            value,
            path: path.clone(),
        })
        .map_err(|e| e.at(&path))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(rename_all = "camelCase", default)]
    struct Mapping {
        host_port: u16,
        container_port: u16,
        protocol: String,
        #[serde(rename = "hostIP")]
        host_ip: Option<String>,
    }

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(rename_all = "camelCase", default)]
    struct Runtime {
        port_mappings: Vec<Mapping>,
    }

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(rename_all = "camelCase", default)]
    struct Conf {
        name: String,
        backend: Option<String>,
        snat: Option<bool>,
        runtime_config: Runtime,
        capabilities: BTreeMap<String, bool>,
    }

    #[test]
    fn containerd_capitalised_keys_decode_into_camel_case_fields() {
        let conf: Conf = from_value(json!({
            "Name": "cbr0",
            "RuntimeConfig": {"portMappings": [
                {"HostPort": 30080, "ContainerPort": 8080, "Protocol": "tcp", "HostIP": ""},
                {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "192.0.2.10"}
            ]}
        }))
        .unwrap();
        assert_eq!(conf.name, "cbr0");
        assert_eq!(
            conf.runtime_config.port_mappings,
            vec![
                Mapping {
                    host_port: 30080,
                    container_port: 8080,
                    protocol: "tcp".into(),
                    host_ip: None
                },
                Mapping {
                    host_port: 5353,
                    container_port: 53,
                    protocol: "udp".into(),
                    host_ip: Some("192.0.2.10".into())
                },
            ]
        );
    }

    #[test]
    fn later_duplicate_key_wins_whatever_its_case() {
        let a: Conf = from_value(json!({"name": "first", "NAME": "second"})).unwrap();
        assert_eq!(a.name, "second");
        let b: Conf = from_value(json!({"NAME": "first", "name": "second"})).unwrap();
        assert_eq!(b.name, "second");
    }

    #[test]
    fn exact_match_is_preferred_over_a_case_folded_one() {
        #[derive(Debug, Deserialize, Default)]
        #[serde(default)]
        struct Two {
            #[serde(rename = "mtu")]
            lower: u32,
            #[serde(rename = "MTU")]
            upper: u32,
        }
        let t: Two = from_value(json!({"MTU": 1, "mtu": 2})).unwrap();
        assert_eq!((t.lower, t.upper), (2, 1));
    }

    #[test]
    fn empty_string_and_null_mean_unset_for_optional_fields() {
        let conf: Conf = from_value(json!({"name": "n", "backend": "", "snat": null})).unwrap();
        assert_eq!(conf.backend, None);
        assert_eq!(conf.snat, None);
    }

    #[test]
    fn null_leaves_a_required_field_at_its_default() {
        #[derive(Debug, Deserialize)]
        struct Strict {
            #[serde(default = "seven")]
            n: u32,
        }
        fn seven() -> u32 {
            7
        }
        let s: Strict = from_value(json!({"n": null})).unwrap();
        assert_eq!(s.n, 7);
    }

    #[test]
    fn unknown_keys_are_ignored_at_every_level() {
        let conf: Conf = from_value(json!({
            "name": "n",
            "dns": {"Servers": ["10.96.0.10"]},
            "runtimeConfig": {"cgroupPath": "/x", "portMappings": [{"hostPort": 1, "extra": true}]}
        }))
        .unwrap();
        assert_eq!(conf.runtime_config.port_mappings[0].host_port, 1);
    }

    #[test]
    fn maps_keep_their_keys_verbatim() {
        let conf: Conf =
            from_value(json!({"capabilities": {"portMappings": true, "Bandwidth": false}}))
                .unwrap();
        assert_eq!(conf.capabilities.get("portMappings"), Some(&true));
        assert_eq!(conf.capabilities.get("Bandwidth"), Some(&false));
    }

    #[test]
    fn type_errors_name_the_path_of_the_value() {
        let cases = [
            (
                json!({"runtimeConfig": {"portMappings": [{}, {"hostPort": "80"}]}}),
                "runtimeConfig.portMappings[1].hostPort",
            ),
            (
                json!({"RuntimeConfig": {"PortMappings": [{"HostPort": 8080.0}]}}),
                "runtimeConfig.portMappings[0].hostPort",
            ),
            (
                json!({"runtimeConfig": {"portMappings": [{"hostPort": -1}]}}),
                "runtimeConfig.portMappings[0].hostPort",
            ),
            (
                json!({"runtimeConfig": {"portMappings": [{"hostPort": 70000}]}}),
                "runtimeConfig.portMappings[0].hostPort",
            ),
            (json!({"name": 5}), "name"),
            (json!({"runtimeConfig": []}), "runtimeConfig"),
        ];
        for (input, path) in cases {
            let err = from_value::<Conf>(input.clone()).unwrap_err();
            assert_eq!(err.path(), path, "{input}: {err}");
            assert!(err.to_string().starts_with(path), "{err}");
        }
    }

    #[test]
    fn a_document_that_is_not_an_object_is_an_error() {
        let err = from_slice::<Conf>(b"[1,2]").unwrap_err();
        assert!(err.to_string().contains("expected struct"), "{err}");
        let err = from_slice::<Conf>(b"{\"name\": ").unwrap_err();
        assert!(err.to_string().contains("EOF"), "{err}");
    }

    #[test]
    fn enums_and_untyped_values_still_decode() {
        #[derive(Debug, Deserialize, PartialEq)]
        #[serde(rename_all = "lowercase")]
        enum Backend {
            Iptables,
            Nftables,
        }
        #[derive(Debug, Deserialize)]
        struct WithEnum {
            backend: Option<Backend>,
            extra: Option<Value>,
        }
        let w: WithEnum =
            from_value(json!({"Backend": "nftables", "extra": {"a": [1, null]}})).unwrap();
        assert_eq!(w.backend, Some(Backend::Nftables));
        assert_eq!(w.extra, Some(json!({"a": [1, null]})));
        let err = from_value::<WithEnum>(json!({"backend": "ebtables"})).unwrap_err();
        assert_eq!(err.path(), "backend");
        assert!(err.message().contains("unknown variant"));
        let _ = Backend::Iptables;
    }
}
