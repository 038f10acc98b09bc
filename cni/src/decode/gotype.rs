//! Go's account of a value of the wrong type: `encoding/json`'s `UnmarshalTypeError` (Go 1.19,
//! which built Debian's plugins; the format has not changed since Go 1.14), and the Go type a
//! Rust type stands for.
//!
//! Go prints `json: cannot unmarshal <value> into Go struct field <Struct>.<Field> of type
//! <Type>`, where
//! - `<value>` is the JSON value's kind: `string`, `bool`, `array`, `object`, or `number`, with
//!   the literal (`number -8000`, `number 1.5`) when the target is a number the literal does not
//!   fit (`ParseInt`, `ParseUint` or `ParseFloat` fails, or the result overflows the type);
//! - `<Field>` is the path of struct fields from the top, by their declared JSON names (map keys
//!   and array indexes are not part of it), and `<Struct>` the name of the struct type holding the
//!   innermost one (empty for an anonymous struct); with no struct field on the path Go prints
//!   `into Go value of type <Type>`;
//! - `<Type>` is the type of the value that failed as Go prints it: `uint64`, `[]string`,
//!   `map[string]bool`, `types.IPAM`, `struct { Mac string "json:\"mac,omitempty\"" }`.
//!
//! The Go type comes from the Rust type: scalars by the `deserialize_*` method they call (an
//! `i64` stands for Go's `int`, 64 bits on every platform the plugins run on: no config field of
//! the reference is an `int64`), a struct by its serde name, which the wire structs set to their
//! Go type (`#[serde(rename = "main.PortMapEntry")]`, or the anonymous `struct { … }` text), and
//! containers by their elements, found by letting the visitor deserialize from a [`Probe`]
//! that answers every request with the type asked for. Probing happens only on the error path.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::{RAW_OBJECT_TOKEN, RAW_TOKEN};

/// Go's `interface {}`, the type of an untyped value.
const ANY: &str = "interface {}";
/// The Go type of [`super::RawObject`]: `types.NetConf`'s `prevResult`.
pub(super) const OBJECT: &str = "map[string]interface {}";

/// Go's account of a type mismatch: the JSON value's kind and the Go type it did not fit.
#[derive(Debug, Clone)]
pub(super) struct Mismatch {
    /// `string`, `number`, `number 1.5`, `bool`, `array`, `object`.
    pub(super) value: Cow<'static, str>,
    /// The Go type.
    pub(super) go_type: Cow<'static, str>,
}

/// The name Go gives the struct type `go_type` in `Go struct field <Struct>.<Field>`: the name
/// without its package, empty for an anonymous struct.
pub(super) fn struct_name(go_type: &str) -> &str {
    if go_type.starts_with("struct {") {
        ""
    } else {
        go_type.rsplit('.').next().unwrap_or(go_type)
    }
}

/// Go's `UnmarshalTypeError` text for `mismatch` at the struct fields `fields` (outermost
/// first: the Go type of the struct holding each, and its name).
pub(super) fn unmarshal_type_error(
    mismatch: &Mismatch,
    fields: &[(&'static str, &'static str)],
) -> String {
    let Mismatch { value, go_type } = mismatch;
    match fields.last() {
        None => format!("json: cannot unmarshal {value} into Go value of type {go_type}"),
        Some((owner, _)) => {
            let path: Vec<&str> = fields.iter().map(|(_, name)| *name).collect();
            format!(
                "json: cannot unmarshal {value} into Go struct field {}.{} of type {go_type}",
                struct_name(owner),
                path.join(".")
            )
        }
    }
}

/// The Go type of `T` when it decodes as a struct: its serde name.
pub(super) fn struct_type_of<'de, T: de::Deserialize<'de>>() -> Option<&'static str> {
    match T::deserialize(Probe::default()) {
        Err(Found::Type(_, Some(name))) => Some(name),
        _ => None,
    }
}

/// The Go type of the elements a sequence visitor asks for.
pub(super) fn element_of<'de, V: Visitor<'de>>(visitor: V) -> Cow<'static, str> {
    element_at(visitor, 0)
}

/// The Go type of the values a map visitor asks for.
pub(super) fn value_of<'de, V: Visitor<'de>>(visitor: V) -> Cow<'static, str> {
    value_at(visitor, 0)
}

fn element_at<'de, V: Visitor<'de>>(visitor: V, depth: u8) -> Cow<'static, str> {
    match visitor.visit_seq(ProbeSeq { depth }) {
        Err(Found::Type(ty, _)) => ty,
        _ => Cow::Borrowed(ANY),
    }
}

fn value_at<'de, V: Visitor<'de>>(visitor: V, depth: u8) -> Cow<'static, str> {
    match visitor.visit_map(ProbeMap {
        depth,
        key_given: false,
    }) {
        Err(Found::Type(ty, _)) => ty,
        _ => Cow::Borrowed(ANY),
    }
}

/// The end of a probe: the type found (and, for a struct, its name), or a visitor's own error.
#[derive(Debug)]
enum Found {
    Type(Cow<'static, str>, Option<&'static str>),
    Other,
}

impl Found {
    fn ty(ty: impl Into<Cow<'static, str>>) -> Found {
        Found::Type(ty.into(), None)
    }
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Type(ty, _) => write!(f, "Go type {ty}"),
            Found::Other => f.write_str("no Go type"),
        }
    }
}

impl std::error::Error for Found {}

impl de::Error for Found {
    fn custom<T: fmt::Display>(_: T) -> Found {
        Found::Other
    }
}

/// Types nested deeper than this are taken for untyped (a recursive type would never end).
const MAX_PROBE_DEPTH: u8 = 16;

/// A deserializer that answers the first request with the Go type it stands for.
#[derive(Debug, Default, Clone, Copy)]
struct Probe {
    depth: u8,
}

macro_rules! scalars {
    ($($method:ident => $go:literal),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Found> {
                Err(Found::ty($go))
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for Probe {
    type Error = Found;

    scalars! {
        deserialize_any => "interface {}", deserialize_ignored_any => "interface {}",
        deserialize_bool => "bool",
        deserialize_i8 => "int8", deserialize_i16 => "int16", deserialize_i32 => "int32",
        deserialize_i64 => "int", deserialize_i128 => "int",
        deserialize_u8 => "uint8", deserialize_u16 => "uint16", deserialize_u32 => "uint32",
        deserialize_u64 => "uint64", deserialize_u128 => "uint64",
        deserialize_f32 => "float32", deserialize_f64 => "float64",
        deserialize_char => "string", deserialize_str => "string", deserialize_string => "string",
        deserialize_identifier => "string",
        deserialize_bytes => "[]uint8", deserialize_byte_buf => "[]uint8",
        deserialize_unit => "struct {}",
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Found> {
        // A pointer: Go names the type it points to.
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: V,
    ) -> Result<V::Value, Found> {
        Err(Found::ty("struct {}"))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Found> {
        match name {
            RAW_TOKEN => Err(Found::ty(ANY)),
            RAW_OBJECT_TOKEN => Err(Found::ty(OBJECT)),
            _ if self.depth >= MAX_PROBE_DEPTH => Err(Found::ty(ANY)),
            _ => visitor.visit_newtype_struct(Probe {
                depth: self.depth + 1,
            }),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Found> {
        if self.depth >= MAX_PROBE_DEPTH {
            return Err(Found::ty(ANY));
        }
        Err(Found::ty(format!(
            "[]{}",
            element_at(visitor, self.depth + 1)
        )))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Found> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, Found> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Found> {
        if self.depth >= MAX_PROBE_DEPTH {
            return Err(Found::ty(ANY));
        }
        Err(Found::ty(format!(
            "map[string]{}",
            value_at(visitor, self.depth + 1)
        )))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Found> {
        Err(Found::Type(Cow::Borrowed(name), Some(name)))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Found> {
        // The plugins' enums are strings on the wire.
        Err(Found::ty("string"))
    }
}

/// A sequence whose first element is a [`Probe`].
struct ProbeSeq {
    depth: u8,
}

impl<'de> SeqAccess<'de> for ProbeSeq {
    type Error = Found;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Found> {
        seed.deserialize(Probe { depth: self.depth }).map(Some)
    }
}

/// A map with one entry: the key `""` and a [`Probe`] for its value.
struct ProbeMap {
    depth: u8,
    key_given: bool,
}

impl<'de> MapAccess<'de> for ProbeMap {
    type Error = Found;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Found> {
        if self.key_given {
            return Ok(None);
        }
        self.key_given = true;
        seed.deserialize(de::value::BorrowedStrDeserializer::new(""))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Found> {
        seed.deserialize(Probe { depth: self.depth })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;
    use serde_json::Value;

    use super::*;

    fn go<T: for<'de> Deserialize<'de>>() -> String {
        match T::deserialize(Probe::default()) {
            Err(Found::Type(ty, _)) => ty.into_owned(),
            Err(Found::Other) => panic!("a visitor's own error"),
            Ok(_) => panic!("no type found"),
        }
    }

    #[derive(Deserialize)]
    #[serde(rename = "main.PortMapEntry")]
    #[allow(dead_code)]
    struct Entry {
        port: i64,
    }

    #[test]
    fn rust_types_name_the_go_types_they_stand_for() {
        assert_eq!(go::<u64>(), "uint64");
        assert_eq!(go::<i64>(), "int");
        assert_eq!(go::<Option<bool>>(), "bool");
        assert_eq!(go::<Vec<String>>(), "[]string");
        assert_eq!(go::<Option<Vec<String>>>(), "[]string");
        assert_eq!(go::<BTreeMap<String, bool>>(), "map[string]bool");
        assert_eq!(
            go::<serde_json::Map<String, Value>>(),
            "map[string]interface {}"
        );
        assert_eq!(go::<Vec<Entry>>(), "[]main.PortMapEntry");
        assert_eq!(go::<Vec<Vec<u16>>>(), "[][]uint16");
        assert_eq!(go::<Value>(), "interface {}");
        assert_eq!(struct_type_of::<Entry>(), Some("main.PortMapEntry"));
        assert_eq!(struct_type_of::<Vec<Entry>>(), None);
    }

    #[test]
    fn struct_names_drop_the_package_and_anonymous_structs_have_none() {
        assert_eq!(struct_name("main.PortMapEntry"), "PortMapEntry");
        assert_eq!(struct_name("PluginConf"), "PluginConf");
        assert_eq!(
            struct_name(
                r#"struct { PortMaps []main.PortMapEntry "json:\"portMappings,omitempty\"" }"#
            ),
            ""
        );
    }

    #[test]
    fn the_text_is_go_s_with_and_without_struct_fields() {
        let m = Mismatch {
            value: "number -8000".into(),
            go_type: "uint64".into(),
        };
        assert_eq!(
            unmarshal_type_error(&m, &[("PluginConf", "ingressRate")]),
            "json: cannot unmarshal number -8000 into Go struct field PluginConf.ingressRate of type uint64"
        );
        let m = Mismatch {
            value: "string".into(),
            go_type: "int".into(),
        };
        assert_eq!(
            unmarshal_type_error(
                &m,
                &[
                    ("PortMapConf", "runtimeConfig"),
                    ("struct { … }", "portMappings"),
                    ("main.PortMapEntry", "hostPort")
                ]
            ),
            "json: cannot unmarshal string into Go struct field PortMapEntry.runtimeConfig.portMappings.hostPort of type int"
        );
        let m = Mismatch {
            value: "array".into(),
            go_type: "main.PluginConf".into(),
        };
        assert_eq!(
            unmarshal_type_error(&m, &[]),
            "json: cannot unmarshal array into Go value of type main.PluginConf"
        );
    }
}
