//! Decoding JSON the way Go's `encoding/json` does, so our plugins accept what the Go ones accept,
//! straight from the text, in time and memory in proportion to it.
//!
//! Runtimes rely on Go's leniency: containerd sends `HostPort` and `IngressRate`, reference tests
//! send `RuntimeConfig`, podman sends `"backend": ""`. This module decodes any `Deserialize` type
//! from JSON text with these rules:
//!
//! - object keys match struct fields **case-insensitively** (Go's folding: ASCII, plus `K` for
//!   `k` and `ſ` for `s`), an exact match preferred; when two keys land on the same field, the
//!   later one in the document wins;
//! - unknown keys are ignored: skipped in the text, never decoded;
//! - `null` leaves a struct field at its default, a string, number or bool anywhere at its zero
//!   value, and makes an array or a map empty, as Go leaves the value alone;
//! - an empty string for an `Option` field means "unset" (`None`);
//! - errors name the path of the offending value (`runtimeConfig.portMappings[1].hostPort: …`),
//!   and a value of the wrong type also gets Go's text for it ([`DecodeError::go_text`]:
//!   `json: cannot unmarshal string into Go struct field PortMapEntry.runtimeConfig.portMappings.hostPort
//!   of type int`; see `gotype` for how the Go types are named);
//! - the text is checked whole first, as Go's `checkValid` does, so a syntax error anywhere is
//!   reported before a type error; the messages are Go's (`unexpected end of JSON input`);
//! - nesting up to Go's limit of 10 000 levels is accepted, deeper is a syntax error in Go's
//!   words. Checking and skipping never recurse, and a typed value recurses only as deep as its
//!   type. An untyped value (`serde_json::Value`, or anything else decoded through
//!   `deserialize_any`) nested deeper than [`MAX_UNTYPED_DEPTH`] is refused, naming its path:
//!   building, printing, cloning and dropping such a tree all recurse once per level;
//! - strings are unescaped as Go does: invalid UTF-8 and lone surrogates become U+FFFD.
//!
//! Numbers are as strict as Go's: `8080.0`, `"8080"`, `1e3` or `-1` for an unsigned port are
//! errors. Types decoded here must not use `#[serde(flatten)]`, untagged enums
//! or `deny_unknown_fields`, nor recurse through their own fields: unknown keys never reach the
//! type, and buffering types would lose the matching below them. Each struct's object is read twice (once to find which key wins for
//! each field, once to decode the winners), so the cost is linear in the text times the depth of
//! the *type*, never quadratic in the number of keys.
//!
//! [`RawJson`] holds a checked JSON text (the whole stdin, or one value of it such as
//! `prevResult`) and decodes it on demand.

mod gotype;
mod reader;
mod syntax;

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Unexpected, Visitor,
};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use gotype::Mismatch;
use reader::{Kind, Reader};
pub use syntax::MAX_DEPTH;
use syntax::{Checked, TopIndex};

/// A decode failure, with the JSON path of the value that failed and, where Go's
/// `encoding/json` fails on the same value, Go's text for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DecodeError {
    path: String,
    msg: String,
    go: Option<String>,
    offset: usize,
    /// A field a struct requires is absent: what a run of [`decode_text`] that leaves values
    /// out may meet without Go meeting it.
    missing: bool,
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

    /// Go's text for the same failure, where we know it: its syntax errors
    /// (`unexpected end of JSON input`) and its `UnmarshalTypeError`s (`json: cannot unmarshal
    /// number -8000 into Go struct field PluginConf.ingressRate of type uint64`).
    pub fn go_text(&self) -> Option<&str> {
        self.go.as_deref()
    }

    /// Go's text where we know it ([`DecodeError::go_text`]), else ours (the path and the
    /// message).
    pub fn reference_text(&self) -> Cow<'_, str> {
        match &self.go {
            Some(go) => Cow::Borrowed(go),
            None => Cow::Owned(self.to_string()),
        }
    }

    /// Where the value that failed starts in the text: of two failures in one document, Go
    /// reports the one that comes first.
    pub fn offset(&self) -> usize {
        self.offset
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
            go: None,
            offset: 0,
            missing: false,
        }
    }
}

/// The error while decoding: the message and the path, innermost segment first (each level adds
/// its own segment as the error passes on its way out, so the success path builds no paths).
#[derive(Debug)]
struct Error {
    msg: String,
    path: Vec<Segment>,
    /// Go's account, for a value of the wrong type.
    go: Option<Mismatch>,
    /// Where the innermost value the error is known to be in starts.
    offset: Option<usize>,
    /// A required field is absent (see [`DecodeError`]).
    missing: bool,
    /// The field is absent from the text itself, not for a value left out
    /// ([`Options::left_out`]): Go meets the same value, holding its zero value.
    genuine: bool,
}

#[derive(Debug)]
enum Segment {
    /// A field of a struct whose Go type is `owner`.
    Field {
        owner: &'static str,
        name: &'static str,
    },
    /// A key of a map (not part of Go's path).
    Key(String),
    /// An index of an array (not part of Go's path).
    Index(usize),
}

impl Error {
    fn msg(msg: impl Into<String>) -> Error {
        Error {
            msg: msg.into(),
            path: Vec::new(),
            go: None,
            offset: None,
            missing: false,
            genuine: false,
        }
    }

    /// Our message `msg` for a value at `offset` for which Go reports `mismatch`.
    fn mismatch(msg: impl Into<String>, mismatch: Mismatch, offset: usize) -> Error {
        Error {
            go: Some(mismatch),
            offset: Some(offset),
            ..Error::msg(msg)
        }
    }

    /// The error in the value starting at `offset`, unless an inner value was already named.
    fn at(mut self, offset: usize) -> Error {
        self.offset.get_or_insert(offset);
        self
    }

    fn in_field(mut self, owner: &'static str, name: &'static str) -> Error {
        self.path.push(Segment::Field { owner, name });
        self
    }

    fn in_key(mut self, key: &str) -> Error {
        self.path.push(Segment::Key(key.to_owned()));
        self
    }

    fn in_index(mut self, index: usize) -> Error {
        self.path.push(Segment::Index(index));
        self
    }

    /// The error as reported, for a document that is the value of `field_of`'s field, if any.
    fn finish(mut self, field_of: Option<(&'static str, &'static str)>) -> DecodeError {
        if let Some((owner, name)) = field_of {
            self = self.in_field(owner, name);
        }
        let mut path = String::new();
        let mut fields = Vec::new();
        for segment in self.path.iter().rev() {
            let key = match segment {
                Segment::Field { owner, name } => {
                    fields.push((*owner, *name));
                    *name
                }
                Segment::Key(key) => key,
                Segment::Index(i) => {
                    use std::fmt::Write as _;
                    let _ = write!(path, "[{i}]");
                    continue;
                }
            };
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(key);
        }
        DecodeError {
            path,
            go: self.go.map(|m| gotype::unmarshal_type_error(&m, &fields)),
            msg: self.msg,
            offset: self.offset.unwrap_or(0),
            missing: self.missing && !self.genuine,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

impl Error {
    /// A struct's own missing field (not one of a value inside it) where nothing was left
    /// out: Go meets it too.
    fn missing_in_text(mut self) -> Error {
        if self.missing && self.path.is_empty() {
            self.genuine = true;
        }
        self
    }

    /// An error of a value that stands for one left out ([`Options::left_out`]): a missing
    /// field in it is what leaving out made.
    fn of_left_out(mut self) -> Error {
        self.genuine = false;
        self
    }
}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error::msg(msg.to_string())
    }

    fn missing_field(field: &'static str) -> Self {
        Error {
            missing: true,
            ..Error::msg(format!("missing field `{field}`"))
        }
    }
}

/// A JSON value's text, checked to be well-formed and nested no deeper than Go accepts, decoded
/// on demand with Go's rules. Decoding a struct with a `RawJson` field keeps that value's text
/// (skipped once, copied, never turned into a tree).
#[derive(Clone, PartialEq, Eq)]
pub struct RawJson {
    text: Vec<u8>,
    /// The entries of the top-level object, when the text was checked here and is one.
    top: Option<TopIndex>,
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 256;
        let text = String::from_utf8_lossy(&self.text[..self.text.len().min(SHOWN)]);
        let more = if self.text.len() > SHOWN { "…" } else { "" };
        write!(f, "RawJson({text}{more})")
    }
}

impl Default for RawJson {
    /// `null`.
    fn default() -> RawJson {
        RawJson {
            text: b"null".to_vec(),
            top: None,
        }
    }
}

impl RawJson {
    /// Checks `text` is one JSON value (whitespace around it allowed) and keeps it.
    ///
    /// # Errors
    /// Go's syntax error (`unexpected end of JSON input`, `invalid character …`), also for
    /// nesting deeper than [`MAX_DEPTH`].
    pub fn parse(text: Vec<u8>) -> Result<RawJson, DecodeError> {
        let top = validate(&text)?.top;
        Ok(RawJson { text, top })
    }

    /// The text of `value`.
    pub fn from_value(value: &Value) -> RawJson {
        let text = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
        // serde_json writes well-formed JSON, but its nesting is not bounded: check it.
        RawJson::parse(text).unwrap_or_default()
    }

    /// The text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.text
    }

    /// Whether the value is an object.
    pub fn is_object(&self) -> bool {
        let mut reader = Reader::new(&self.text);
        reader.kind().ok() == Some(Kind::Object)
    }

    /// Decodes `T` from the text with Go's rules (see the module docs).
    ///
    /// # Errors
    /// A [`DecodeError`] naming the path and the problem when a value has the wrong type or
    /// range.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, DecodeError> {
        self.decode_with(Options::default())
    }

    /// The value as a [`Value`] tree (for tests and tools; plugins decode into their types).
    ///
    /// # Errors
    /// When a number does not fit a float.
    pub fn to_value(&self) -> Result<Value, DecodeError> {
        self.decode()
    }

    /// Decodes `T` with `options`.
    pub(crate) fn decode_with<T: DeserializeOwned>(
        &self,
        options: Options<'_>,
    ) -> Result<T, DecodeError> {
        decode_text(&self.text, self.top.as_ref(), options)
    }
}

/// How [`RawJson::decode_with`] reads objects into structs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Options<'o> {
    /// Go's `ParsePrevResult` re-marshals the raw result through a map before it decodes it, so
    /// each object's keys reach the struct sorted byte-wise, exact duplicates collapsed to the
    /// last one: of several keys naming one field, the greatest non-null one wins.
    pub(crate) sorted_keys: bool,
    /// The JSON text of a value for the top-level key `CNIVersion`, used unless the top-level
    /// object has that exact key with a value other than `""` (Go's `ParsePrevResult`).
    pub(crate) inject_version: Option<&'o [u8]>,
    /// The Go type of the top-level struct in errors, instead of its own (the configuration's
    /// envelope is part of each plugin's Go struct, `types.NetConf` embedded).
    pub(crate) top_struct: Option<&'static str>,
    /// The text is the value of this field of a struct of this Go type (`runtimeConfig` of
    /// `PortMapConf`): errors name their path from there.
    pub(crate) field_of: Option<(&'static str, &'static str)>,
    /// Values starting at these offsets are left out: a decode that failed there is run again
    /// to find the other failures ([`decode_text`]).
    pub(crate) left_out: &'o [usize],
    /// Fields (the struct's Go type, the field's name) whose `null` is decoded, not left out:
    /// the field's Go type decodes itself (`UnmarshalJSON`, as `types.IPNet` does), and Go
    /// hands it a `null` too. The field's type must take `null` ([`each`]).
    pub(crate) null_decoded: &'static [(&'static str, &'static str)],
    /// Where a decode notes the occurrences to leave out so that values it dropped undecoded
    /// (a slice's or map's occurrences before a `null` or `[]` reset it, a slice's elements
    /// past its final length) are decoded after all ([`decode_text`]).
    pub(crate) unchecked: Option<&'o RefCell<Vec<usize>>>,
}

impl Options<'_> {
    /// Whether the value starting at `offset` is left out.
    fn leaves_out(&self, offset: usize) -> bool {
        self.left_out.contains(&offset)
    }

    /// Notes that occurrence `dropped` of `occurrences` was dropped (in part) undecoded: a
    /// decode leaving out those after it decodes it as the value.
    fn note_unchecked(&self, occurrences: &[Source<'_>], dropped: usize) {
        let Some(unchecked) = self.unchecked else {
            return;
        };
        let mut unchecked = unchecked.borrow_mut();
        for source in occurrences.iter().skip(dropped + 1) {
            if let Source::Text(offset) = source
                && !unchecked.contains(offset)
            {
                unchecked.push(*offset);
            }
        }
    }
}

/// The key [`Options::inject_version`] sets.
const INJECTED_KEY: &str = "CNIVersion";

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<RawJson, D::Error> {
        deserializer.deserialize_newtype_struct(RAW_TOKEN, RawVisitor)
    }
}

/// The newtype name through which [`RawJson`] asks our deserializer for a value's text: it
/// answers with the bytes.
const RAW_TOKEN: &str = "$cni::decode::RawJson";

/// As [`RAW_TOKEN`], for [`RawObject`]: a value that is not an object is a type error.
const RAW_OBJECT_TOKEN: &str = "$cni::decode::RawObject";

/// The newtype name through which [`nullable`] tells our deserializer that an `Option` stands
/// for a Go pointer, slice or map.
const NULLABLE_TOKEN: &str = "$cni::decode::nullable";

/// The newtype name through which [`each`] asks our deserializer for every occurrence.
const EACH_TOKEN: &str = "$cni::decode::each";

/// What a [`nullable`] value ending in `null` gives once its earlier occurrences decoded
/// without failure ([`De::then_null`]): `None`.
const NULL_AFTER: &str = "$cni::decode::null-after";

/// Decodes an `Option` field that stands for a Go pointer, slice or map (`*bool`, `*[]string`,
/// `map[string]string`), which a later `null` of the same key resets to nil: with
/// `#[serde(deserialize_with = "cni::decode::nullable")]`. An `Option` without it stands
/// for a Go value whose zero value means unset (`string`, `int`, `bool`), which a `null`
/// leaves alone (Go's `encoding/json`: "null … has no effect on a value", but "sets a
/// pointer, interface, map or slice to nil"). Either way a `null` alone is `None`.
///
/// # Errors
/// The inner value's.
pub fn nullable<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Nullable<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for Nullable<T> {
        type Value = Option<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a value or null")
        }

        fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            d.deserialize_option(NullableOption(std::marker::PhantomData))
        }

        /// A key whose occurrences hold a `null` before the last: the runs of occurrences
        /// between the `null`s, each decoded as Go decodes them (the earlier ones for their
        /// failures only, as the `null` after them resets what they gave); the last stays.
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<T>, A::Error> {
            let mut last = None;
            while let Some(Run(value)) = seq.next_element::<Run<T>>()? {
                last = value;
            }
            Ok(last)
        }
    }

    /// One run of occurrences ([`Nullable::visit_seq`]).
    struct Run<T>(Option<T>);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Run<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_option(NullableOption(std::marker::PhantomData))
                .map(Run)
        }
    }

    /// Serde's `Option`, but for a value decoded for its failures only ([`NULL_AFTER`]).
    struct NullableOption<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for NullableOption<T> {
        type Value = Option<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a value or null")
        }

        fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            match T::deserialize(d) {
                Ok(value) => Ok(Some(value)),
                Err(e) if e.to_string() == NULL_AFTER => Ok(None),
                Err(e) => Err(e),
            }
        }
    }

    deserializer.deserialize_newtype_struct(NULLABLE_TOKEN, Nullable(std::marker::PhantomData))
}

/// Decodes a value that, as a Go type with its own JSON decoder (`UnmarshalJSON`), Go decodes
/// from every occurrence of its key, `null` included, each replacing the last: `T` is decoded
/// from each in turn (so a bad earlier one fails the decode, as in Go), and the last stays.
/// For a field: `#[serde(deserialize_with = "cni::decode::each")]`.
///
/// # Errors
/// The first occurrence's that fails.
pub fn each<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Each<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for Each<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a value")
        }

        /// The occurrences before the last are decoded for their failures only: a field
        /// missing from one is no failure (Go's decoder leaves it zero, and the next
        /// occurrence replaces the value).
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
            loop {
                if seq.size_hint().is_some_and(|left| left > 1) {
                    seq.next_element::<Earlier<T>>()?;
                    continue;
                }
                let Some(value) = seq.next_element::<T>()? else {
                    return Err(de::Error::custom("no value"));
                };
                while seq.next_element::<Earlier<T>>()?.is_some() {}
                return Ok(value);
            }
        }

        fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
            T::deserialize(d)
        }
    }

    /// An occurrence before the last ([`Each::visit_seq`]).
    struct Earlier<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Earlier<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            match T::deserialize(d) {
                Ok(_) => Ok(Earlier(std::marker::PhantomData)),
                // Serde's words for a required field absent (ours and every deserializer's).
                Err(e) if e.to_string().starts_with("missing field `") => {
                    Ok(Earlier(std::marker::PhantomData))
                }
                Err(e) => Err(e),
            }
        }
    }

    deserializer.deserialize_newtype_struct(EACH_TOKEN, Each(std::marker::PhantomData))
}

/// The text of a value that must be a JSON object, kept (checked, not decoded): Go's
/// `map[string]interface {}`, such as `prevResult` in a configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawObject(RawJson);

impl RawObject {
    /// The object's text.
    pub fn into_inner(self) -> RawJson {
        self.0
    }
}

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<RawObject, D::Error> {
        let raw = deserializer.deserialize_newtype_struct(RAW_OBJECT_TOKEN, RawVisitor)?;
        // Another deserializer than ours hands over any value.
        if raw.is_object() {
            Ok(RawObject(raw))
        } else {
            Err(de::Error::invalid_type(
                Unexpected::Other("a non-object"),
                &"a JSON object",
            ))
        }
    }
}

/// The Go type of `T` when it is a struct: its serde name (see `gotype`).
pub fn go_struct_type<T: DeserializeOwned>() -> Option<&'static str> {
    gotype::struct_type_of::<T>()
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = RawJson;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bytes<E: de::Error>(self, text: &[u8]) -> Result<RawJson, E> {
        Ok(RawJson {
            text: text.to_vec(),
            top: None,
        })
    }

    /// Another deserializer (not ours): through a `Value`.
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<RawJson, D::Error> {
        let value = Value::deserialize(d)?;
        let text = serde_json::to_vec(&value).map_err(de::Error::custom)?;
        RawJson::parse(text).map_err(de::Error::custom)
    }
}

/// Decodes `T` from a JSON value with Go's matching rules (see the module docs).
///
/// # Errors
/// A [`DecodeError`] naming the path and the problem when a value has the wrong type or range.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, DecodeError> {
    RawJson::from_value(&value).decode()
}

/// Checks `bytes` as JSON and decodes `T` from them with Go's rules.
///
/// # Errors
/// A [`DecodeError`] when the bytes are not JSON or do not fit `T`.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let checked = validate(bytes)?;
    decode_text(bytes, checked.top.as_ref(), Options::default())
}

fn validate(text: &[u8]) -> Result<Checked, DecodeError> {
    syntax::validate(text).map_err(|e| DecodeError {
        path: String::new(),
        go: Some(e.msg.clone()),
        msg: e.msg,
        offset: e.offset,
        missing: false,
    })
}

/// The deepest untyped value decoded (serde_json refuses deeper documents altogether).
pub const MAX_UNTYPED_DEPTH: usize = 128;

/// Decodes `T` from the checked `text`, reporting the failure Go reports. Go decodes the text
/// in order (a prevResult's keys sorted) and goes on past a value of the wrong type: it
/// reports the first such value, unless a value's own decoder (an address, a CIDR) fails,
/// which stops it there and is reported instead. The decoder here decodes each field once,
/// from all its keys, and stops at its first failure: a decode that fails is run again with
/// the values that failed left out, to find the others. Values Go decodes and then drops (a
/// slice's or map's occurrences before a `null` resets it, elements past a slice's final
/// length) are dropped here undecoded: a run that leaves out what came after them decodes
/// them. Runs after the first happen only for such texts, a few at most. Of the failures
/// found, the first that stops Go is reported, else the first of the others: the first in
/// the document, or, sorted, the first met.
fn decode_text<T: DeserializeOwned>(
    text: &[u8],
    index: Option<&TopIndex>,
    options: Options<'_>,
) -> Result<T, DecodeError> {
    let unchecked = RefCell::new(Vec::new());
    let mut left_out: Vec<usize> = options.left_out.to_vec();
    let mut value = None;
    let mut found: Vec<DecodeError> = Vec::new();
    for run in 0..RERUNS {
        let options = Options {
            left_out: &left_out,
            unchecked: Some(&unchecked),
            ..options
        };
        // After a failure, the next run leaves out only what failed (to find the failures
        // after it); after a success, what the run dropped undecoded is decoded next.
        let outcome = decode_once::<T>(text, index, options);
        let dropped = unchecked.take();
        let mut more: Vec<usize> = match outcome {
            Ok(v) => {
                if run == 0 {
                    value = Some(v);
                }
                dropped
            }
            // A field left missing after the first run is only what leaving values out made.
            Err(e) if run > 0 && e.missing => Vec::new(),
            Err(e) => {
                let offset = e.offset;
                found.push(e);
                vec![offset]
            }
        };
        more.retain(|o| !left_out.contains(o));
        if more.is_empty() {
            break;
        }
        left_out.extend(more);
    }
    if found.is_empty() {
        return value.ok_or_else(|| de::Error::custom("no decode ran"));
    }
    let (stopping, going_on): (Vec<DecodeError>, Vec<DecodeError>) =
        found.into_iter().partition(|e| e.go.is_none());
    let first_of = |errors: Vec<DecodeError>| {
        if options.sorted_keys {
            errors.into_iter().next()
        } else {
            errors.into_iter().min_by_key(|e| e.offset)
        }
    };
    let reported = first_of(stopping).or_else(|| first_of(going_on));
    Err(reported.unwrap_or_else(|| de::Error::custom("no failure recorded")))
}

/// How many times [`decode_text`] runs a decode again.
const RERUNS: usize = 16;

fn decode_once<T: DeserializeOwned>(
    text: &[u8],
    index: Option<&TopIndex>,
    options: Options<'_>,
) -> Result<T, DecodeError> {
    let mut reader = Reader::new(text);
    let value = T::deserialize(De {
        r: &mut reader,
        options,
        top: true,
        untyped: false,
        index,
        many: Vec::new(),
        nullable: false,
        then_null: false,
    })
    .map_err(|e| e.finish(options.field_of))?;
    reader.skip_ws();
    match reader.peek() {
        None => Ok(value),
        Some(_) => Err(reader.broken().finish(options.field_of)),
    }
}

/// Returns the index of the field of `fields` that `key` names: exact match first, then the
/// first one equal under Go's case folding.
pub fn match_field(key: &str, fields: &[&str]) -> Option<usize> {
    fields
        .iter()
        .position(|f| field_name(f) == key)
        .or_else(|| fields.iter().position(|f| go_fold_eq(field_name(f), key)))
}

/// The mark at the end of a field's deserializing name that keeps its `null`s: such a field
/// is handed every occurrence of its key, `null` too, even when all are `null` (where an
/// unmarked one is left alone). Its type must take `null`, as [`present`] does.
/// `#[serde(rename(deserialize = "ingressRate\0"))]`.
pub const KEEPS_NULL: char = '\0';

/// A field's JSON key: its deserializing name without [`KEEPS_NULL`].
fn field_name(name: &str) -> &str {
    name.strip_suffix(KEEPS_NULL).unwrap_or(name)
}

/// Decodes an `Option` field that stands for a Go field reached through an embedded struct
/// pointer (bandwidth's `*BandwidthEntry`): any occurrence of its key, `null` too, makes it
/// present (Go allocates the struct to decode into), a `null` alone as `T`'s zero value. The
/// field must be marked [`KEEPS_NULL`] so that a `null` reaches it.
///
/// # Errors
/// The inner value's.
pub fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    struct Present<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for Present<T> {
        type Value = Option<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a value or null")
        }

        fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(Some(T::default()))
        }

        fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(Some(T::default()))
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            T::deserialize(d).map(Some)
        }
    }

    deserializer.deserialize_option(Present(std::marker::PhantomData))
}

/// Go's `equalFoldRight` for an ASCII field name: `key` equals `field` ignoring ASCII case,
/// where the Kelvin sign also stands for `k` and the long s for `s`.
fn go_fold_eq(field: &str, key: &str) -> bool {
    if key.is_ascii() {
        return field.eq_ignore_ascii_case(key);
    }
    let mut field = field.bytes();
    for c in key.chars() {
        let Some(f) = field.next() else { return false };
        let ok = match c {
            '\u{212a}' => f.eq_ignore_ascii_case(&b'k'),
            '\u{17f}' => f.eq_ignore_ascii_case(&b's'),
            c if c.is_ascii() => u8::try_from(c).is_ok_and(|c| f.eq_ignore_ascii_case(&c)),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    field.next().is_none()
}

/// The deserializer over one value of a checked text.
struct De<'r, 'a> {
    r: &'r mut Reader<'a>,
    options: Options<'a>,
    /// Whether this is the document's top-level value ([`Options::inject_version`]).
    top: bool,
    /// Whether this value is part of an untyped one whose depth was checked.
    untyped: bool,
    /// The entries of the document's top-level object, when [`De::top`] and known.
    index: Option<&'a TopIndex>,
    /// Every occurrence of the value, when its key was written more than once (in a struct,
    /// or in each of several arrays for one element): Go decodes each in turn into the same
    /// value. Empty for the one value at the reader.
    many: Vec<Source<'a>>,
    /// The value is an `Option` standing for a Go pointer, slice or map ([`nullable`]): a
    /// later `null` resets what earlier occurrences gave it.
    nullable: bool,
    /// The occurrences are those of a [`nullable`] value whose last is `null`: they are
    /// decoded for their failures only, and success is the error [`NULL_AFTER`], which
    /// [`nullable`] turns into `None`.
    then_null: bool,
}

impl<'a> De<'_, 'a> {
    fn child<'s>(&'s mut self) -> De<'s, 'a> {
        De::one(self.r, self.options, self.untyped)
    }

    /// A deserializer of the one value at the reader.
    fn one<'s>(r: &'s mut Reader<'a>, options: Options<'a>, untyped: bool) -> De<'s, 'a> {
        De {
            r,
            options,
            top: false,
            untyped,
            index: None,
            many: Vec::new(),
            nullable: false,
            then_null: false,
        }
    }

    /// What a value decoded from several occurrences gives: itself, or, when those were
    /// decoded for their failures only ([`De::then_null`]), [`NULL_AFTER`].
    fn or_null<T>(then_null: bool, value: Result<T, Error>) -> Result<T, Error> {
        match value {
            Ok(_) if then_null => Err(Error::msg(NULL_AFTER)),
            other => other,
        }
    }

    /// Runs `f` with a deserializer of the one value at `source` (in the text `r` reads, or
    /// injected).
    fn at<R>(
        r: &mut Reader<'a>,
        options: Options<'a>,
        untyped: bool,
        source: Source<'a>,
        f: impl FnOnce(De<'_, 'a>) -> R,
    ) -> R {
        match source {
            Source::Text(pos) => {
                r.pos = pos;
                f(De::one(r, options, untyped))
            }
            Source::Injected(text) => {
                let mut reader = Reader::new(text);
                f(De::one(&mut reader, options, untyped))
            }
        }
    }

    /// The error for the value at the reader, of the wrong JSON type for a value whose Go type
    /// is `go_type`: ours names the JSON value and the Go type (never a Rust one), Go's account
    /// goes with it. The value is left consumed or not.
    fn mismatch(&mut self, go_type: impl Into<Cow<'static, str>>) -> Error {
        let go_type = go_type.into();
        let kind = match self.r.kind() {
            Ok(kind) => kind,
            Err(e) => return e,
        };
        let offset = self.r.pos;
        let (ours, value): (String, &'static str) = match kind {
            // Go never fails on a null: it leaves the value alone.
            Kind::Null => ("null".into(), "null"),
            Kind::Bool => match self.r.boolean() {
                Ok(b) => (format!("bool {b}"), "bool"),
                Err(e) => return e,
            },
            Kind::Number => match self.number() {
                Ok(text) => (format!("number {text}"), "number"),
                Err(e) => return e,
            },
            Kind::String => match self.r.string() {
                Ok(s) => (format!("string {s:?}"), "string"),
                Err(e) => return e,
            },
            Kind::Array => ("array".into(), "array"),
            Kind::Object => ("object".into(), "object"),
        };
        let msg = format!("invalid type: {ours}, expected {go_type}");
        let mismatch = Mismatch {
            value: Cow::Borrowed(value),
            go_type,
        };
        Error::mismatch(msg, mismatch, offset)
    }

    /// The number at the reader, as Go reads it: a prevResult's went through a `float64` and
    /// back first ([`Options::sorted_keys`]: Go's `ParsePrevResult` decodes the result into a
    /// map of untyped values and encodes it again), so `1.0` is `1` there and an integer past
    /// 2^53 loses its last digits.
    fn number(&mut self) -> Result<Cow<'a, str>, Error> {
        let text = self.r.number()?;
        if !self.options.sorted_keys {
            return Ok(Cow::Borrowed(text));
        }
        Ok(match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Cow::Owned(go_float(f)),
            _ => Cow::Borrowed(text),
        })
    }

    /// Consumes a `null` at the reader, if there is one: Go leaves a string, number or bool
    /// alone, so it decodes as the zero value.
    fn null(&mut self) -> Result<bool, Error> {
        if self.r.kind()? == Kind::Null {
            self.r.null()?;
            return Ok(true);
        }
        Ok(false)
    }

    fn visit_string<V: Visitor<'a>>(&mut self, visitor: V) -> Result<V::Value, Error> {
        if self.null()? {
            return visitor.visit_borrowed_str("");
        }
        if self.r.kind()? != Kind::String {
            return Err(self.mismatch("string"));
        }
        match self.r.string()? {
            Cow::Borrowed(s) => visitor.visit_borrowed_str(s),
            Cow::Owned(s) => visitor.visit_string(s),
        }
    }

    /// An integer of type `ty`: as Go's `ParseInt`/`ParseUint`, an integer literal in range
    /// (no minus sign for an unsigned one, not even `-0`); else Go names the literal.
    fn visit_integer<V: Visitor<'a>>(
        &mut self,
        visitor: V,
        ty: &IntType,
    ) -> Result<V::Value, Error> {
        if self.null()? {
            return visitor.visit_u64(0);
        }
        if self.r.kind()? != Kind::Number {
            return Err(self.mismatch(ty.go));
        }
        let offset = self.r.pos;
        let text = self.number()?;
        let ours = match Number::parse(&text) {
            Ok(Number::Unsigned(n)) if i128::from(n) <= ty.max => return visitor.visit_u64(n),
            // Number::parse reads every literal with a minus sign as signed, `-0` included.
            Ok(Number::Signed(n)) if ty.min < 0 && i128::from(n) >= ty.min => {
                return visitor.visit_i64(n);
            }
            Ok(Number::Float(_)) => format!("invalid type: number {text}, expected {}", ty.go),
            Ok(_) => format!("invalid value: number {text}, expected {}", ty.go),
            // Out of a float's range.
            Err(e) => e.msg,
        };
        let mismatch = Mismatch {
            value: Cow::Owned(format!("number {text}")),
            go_type: Cow::Borrowed(ty.go),
        };
        Err(Error::mismatch(ours, mismatch, offset))
    }

    fn visit_float<V: Visitor<'a>>(
        &mut self,
        visitor: V,
        go_type: &'static str,
    ) -> Result<V::Value, Error> {
        if self.null()? {
            return visitor.visit_f64(0.0);
        }
        if self.r.kind()? != Kind::Number {
            return Err(self.mismatch(go_type));
        }
        let offset = self.r.pos;
        let text = self.number()?;
        match Number::float(&text) {
            Ok(f) => visitor.visit_f64(f),
            Err(e) => Err(Error::mismatch(
                e.msg,
                Mismatch {
                    value: Cow::Owned(format!("number {text}")),
                    go_type: Cow::Borrowed(go_type),
                },
                offset,
            )),
        }
    }

    /// The first number in the value at the reader (which is left where it is) that does not
    /// fit a float: Go decodes every number of an untyped value (`prevResult`, Go's
    /// `map[string]interface {}`) into a `float64`, and refuses such a one.
    fn untyped_numbers(&mut self) -> Result<(), Error> {
        self.r.skip_ws();
        let mut copy = *self.r;
        copy.skip_value()?;
        match self
            .r
            .number_out_of_float_range(copy.pos, self.options.left_out)
        {
            Some((offset, text)) => Err(Error::mismatch(
                format!("number {text} out of range"),
                Mismatch {
                    value: Cow::Owned(format!("number {text}")),
                    go_type: Cow::Borrowed("float64"),
                },
                offset,
            )),
            None => Ok(()),
        }
    }

    /// The Go type of the struct at the reader, whose serde name is `name`.
    fn struct_type(&self, name: &'static str) -> &'static str {
        match self.options.top_struct {
            Some(top) if self.top => top,
            _ => name,
        }
    }

    /// Reads the objects of a struct with `fields` (the one at the reader, or each of
    /// `objects`, a key written more than once): which keys give each field its values
    /// (skipping unknown keys), then hands the fields to `visitor` in the order Go first
    /// assigns them. The document's own top-level object is read from its index, skipping
    /// nothing.
    fn visit_struct<V: Visitor<'a>>(
        &mut self,
        owner: &'static str,
        fields: &'static [&'static str],
        objects: &[Source<'a>],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let inject = self.options.inject_version.filter(|_| self.top);
        let mut picker = Picker::new(
            fields,
            self.options.sorted_keys,
            inject.is_some(),
            self.options.left_out,
        );
        let text = self.r.text;
        let end = match self.index.filter(|_| self.top && objects.is_empty()) {
            Some(index) => {
                for entry in &index.entries {
                    let key = Reader {
                        text,
                        pos: entry.key,
                    }
                    .string()?;
                    picker.offer(key, entry.value, entry.end);
                }
                Some(index.end)
            }
            None if objects.is_empty() => {
                self.offer_entries(&mut picker)?;
                Some(self.r.pos)
            }
            None => {
                for object in objects {
                    self.r.pos = object.offset();
                    self.offer_entries(&mut picker)?;
                }
                None
            }
        };
        let null_decoded = self.options.null_decoded;
        let skipped = picker.skipped;
        let winners = picker.finish(text, inject, |field| {
            fields.get(field).is_some_and(|name| {
                name.ends_with(KEEPS_NULL) || null_decoded.contains(&(owner, *name))
            })
        });
        let value = visitor
            .visit_map(StructAccess {
                r: &mut *self.r,
                options: self.options,
                owner,
                fields,
                winners: winners.into_iter(),
                current: None,
            })
            .map_err(|e| if skipped { e } else { e.missing_in_text() })?;
        if let Some(end) = end {
            self.r.pos = end;
        }
        Ok(value)
    }

    /// Offers the entries of the object at the reader to `picker`, and moves past it.
    fn offer_entries(&mut self, picker: &mut Picker<'a>) -> Result<(), Error> {
        self.r.eat(b'{')?;
        let mut first = true;
        while !self.r.eat_if(b'}') {
            if !first {
                self.r.eat(b',')?;
            }
            first = false;
            let key = self.r.string()?;
            self.r.eat(b':')?;
            self.r.skip_ws();
            let start = self.r.pos;
            self.r.skip_value()?;
            picker.offer(key, start, self.r.pos);
        }
        Ok(())
    }

    /// The occurrences of a Go pointer, slice or map (`nullable`), or of a value (not), that
    /// count: a `null` resets the first, so those after the last `null`; the second ignores
    /// it.
    fn kept(&mut self, nullable: bool) -> Vec<Source<'a>> {
        let sources = std::mem::take(&mut self.many);
        let text = self.r.text;
        if nullable {
            match sources.iter().rposition(|s| s.is_null(text)) {
                Some(last) => sources.get(last + 1..).unwrap_or_default().to_vec(),
                None => sources,
            }
        } else {
            sources.into_iter().filter(|s| !s.is_null(text)).collect()
        }
    }

    /// A scalar written more than once: Go decodes every occurrence into the one value, so
    /// each must fit (`check`), and the last that is not `null` stays (`decode`; when all are
    /// `null`, the zero value).
    fn scalar<T>(
        mut self,
        check: impl Fn(De<'_, 'a>) -> Result<(), Error>,
        decode: impl FnOnce(De<'_, 'a>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let then_null = self.then_null;
        let sources = std::mem::take(&mut self.many);
        let text = self.r.text;
        let Some(last) = sources
            .iter()
            .rposition(|s| !s.is_null(text))
            .or_else(|| sources.len().checked_sub(1))
        else {
            return decode(self);
        };
        for (i, source) in sources.iter().enumerate() {
            if i != last && !source.is_null(text) {
                De::at(self.r, self.options, self.untyped, *source, &check)
                    .map_err(|e| e.at(source.offset()))?;
            }
        }
        let value = De::at(self.r, self.options, self.untyped, sources[last], decode);
        De::or_null(then_null, value)
    }

    /// Where the elements of the array at the reader start.
    fn element_starts(&mut self) -> Result<Vec<usize>, Error> {
        self.r.eat(b'[')?;
        let mut starts = Vec::new();
        while !self.r.eat_if(b']') {
            if !starts.is_empty() {
                self.r.eat(b',')?;
            }
            self.r.skip_ws();
            starts.push(self.r.pos);
            self.r.skip_value()?;
        }
        Ok(starts)
    }

    /// The elements of a slice that the arrays `arrays` were decoded into in turn, as Go 1.19
    /// decodes them: element `i` of each array into element `i` of the slice as it stands, so
    /// a struct element merges the objects at its index; the slice keeps the length of the
    /// last array; its elements past that length stay in the backing array, and a later
    /// longer array decodes into them again, unless the slice grew meanwhile (a new backing
    /// array of capacity `cap + cap/2`, at least 4, holding only the elements within the
    /// length); an empty array makes a new empty slice.
    /// A `null` among `arrays` resets the slice as an empty array does (to nil). Elements
    /// dropped this way were decoded by Go all the same: they are noted
    /// ([`Options::note_unchecked`]).
    fn merged_array(&mut self, arrays: &[Source<'a>]) -> Result<Vec<Vec<Source<'a>>>, Error> {
        // Each element's occurrences, with the array each is in.
        let mut slots: Vec<Vec<(usize, Source<'a>)>> = Vec::new();
        let (mut len, mut cap) = (0usize, 0usize);
        let mut dropped: Option<usize> = None;
        let mut drop = |slots: &mut Vec<Vec<(usize, Source<'a>)>>, from: usize| {
            for slot in slots.drain(from.min(slots.len())..) {
                if let Some(&(array, _)) = slot.last() {
                    dropped = dropped.max(Some(array));
                }
            }
        };
        let text = self.r.text;
        for (n, array) in arrays.iter().enumerate() {
            if array.is_null(text) {
                (len, cap) = (0, 0);
                drop(&mut slots, 0);
                continue;
            }
            self.r.pos = array.offset();
            let elements = self.element_starts()?;
            for (i, start) in elements.iter().enumerate() {
                if i >= cap {
                    cap = (cap + cap / 2).max(4);
                    drop(&mut slots, len);
                    slots.resize_with(cap, Vec::new);
                }
                len = len.max(i + 1);
                let source = if self.options.leaves_out(*start) {
                    // Left out: a null keeps its place.
                    Source::Injected(b"null")
                } else {
                    Source::Text(*start)
                };
                if let Some(slot) = slots.get_mut(i) {
                    slot.push((n, source));
                }
            }
            if elements.len() < len {
                len = elements.len();
            }
            if elements.is_empty() {
                (len, cap) = (0, 0);
                drop(&mut slots, 0);
            }
        }
        drop(&mut slots, len);
        if let Some(array) = dropped {
            self.options.note_unchecked(arrays, array);
        }
        Ok(slots
            .into_iter()
            .map(|slot| slot.into_iter().map(|(_, source)| source).collect())
            .collect())
    }
}

/// `f` as Go's `encoding/json` writes a `float64`: the shortest text that reads back as `f`,
/// with an exponent (`1e+21`, `1.5e-7`) below 1e-6 and from 1e21 on.
fn go_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let text = format!("{f:e}");
        match text.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
            _ => text,
        }
    } else {
        format!("{f}")
    }
}

/// The text of one object holding the entries of each of `objects` in turn (their spans in
/// `text`): what Go's one map or struct holds after decoding them one after the other.
fn merged_objects(text: &[u8], objects: &[(usize, usize)]) -> Vec<u8> {
    let mut merged = vec![b'{'];
    for &(start, end) in objects {
        let inner = text
            .get(start + 1..end.saturating_sub(1))
            .unwrap_or_default();
        if inner.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if merged.len() > 1 {
            merged.push(b',');
        }
        merged.extend_from_slice(inner);
    }
    merged.push(b'}');
    merged
}

/// Which keys give each field of a struct its value, as the object's entries are offered in
/// order: every occurrence, in the order Go decodes them into the field.
struct Picker<'a> {
    fields: &'static [&'static str],
    sorted: bool,
    /// Entries whose value starts at one of these are left out ([`Options::left_out`]).
    left_out: &'a [usize],
    /// Normal: one slot per field, its occurrences in document order.
    slots: Vec<Option<Winner<'a>>>,
    /// Sorted: every key naming a field, resolved at the end.
    all: Vec<Offered<'a>>,
    /// Whether to look for the exact key [`INJECTED_KEY`].
    watch_version: bool,
    /// The span of that key's last value.
    exact_version: Option<(usize, usize)>,
    /// Whether an entry was left out.
    skipped: bool,
}

/// A key naming a field, offered in sorted mode.
struct Offered<'a> {
    field: usize,
    key: Cow<'a, str>,
    value: Source<'a>,
    order: usize,
}

impl<'a> Picker<'a> {
    fn new(
        fields: &'static [&'static str],
        sorted: bool,
        watch_version: bool,
        left_out: &'a [usize],
    ) -> Picker<'a> {
        let mut slots = Vec::new();
        if !sorted {
            slots.resize_with(fields.len(), || None);
        }
        Picker {
            fields,
            sorted,
            left_out,
            slots,
            all: Vec::new(),
            watch_version,
            exact_version: None,
            skipped: false,
        }
    }

    /// The entry `key` whose value spans `start..end`.
    fn offer(&mut self, key: Cow<'a, str>, start: usize, end: usize) {
        if self.left_out.contains(&start) {
            self.skipped = true;
            return;
        }
        if self.watch_version && key == INJECTED_KEY {
            self.exact_version = Some((start, end));
        }
        let Some(field) = match_field(&key, self.fields) else {
            return;
        };
        if self.sorted {
            self.all.push(Offered {
                field,
                key,
                value: Source::Text(start),
                order: start,
            });
        } else if let Some(slot) = self.slots.get_mut(field) {
            match slot {
                Some(winner) => winner.more.push(Source::Text(start)),
                None => {
                    *slot = Some(Winner {
                        field,
                        first: Source::Text(start),
                        more: Vec::new(),
                        order: start,
                    });
                }
            }
        }
    }

    /// The fields to assign, each with its occurrences, in the order Go assigns them first;
    /// a field whose every occurrence is `null` is left out (Go leaves it alone, or sets a
    /// pointer it never set to nil: its default either way). With `inject`, the top-level
    /// `CNIVersion` Go's `ParsePrevResult` adds unless `text` has it with a value other than
    /// `""`. A field for which `null_decoded` holds keeps its `null`s.
    fn finish(
        mut self,
        text: &[u8],
        inject: Option<&'a [u8]>,
        null_decoded: impl Fn(usize) -> bool,
    ) -> Vec<Winner<'a>> {
        if let Some(version) = inject {
            let has_version = self
                .exact_version
                .is_some_and(|(s, e)| text.get(s..e) != Some(b"\"\""));
            if !has_version && let Some(field) = match_field(INJECTED_KEY, self.fields) {
                let value = Source::Injected(version);
                if self.sorted {
                    self.all.push(Offered {
                        field,
                        key: Cow::Borrowed(INJECTED_KEY),
                        value,
                        order: usize::MAX,
                    });
                } else if let Some(slot) = self.slots.get_mut(field) {
                    match slot {
                        Some(winner) => winner.more.push(value),
                        None => {
                            *slot = Some(Winner {
                                field,
                                first: value,
                                more: Vec::new(),
                                order: usize::MAX,
                            });
                        }
                    }
                }
            }
        }
        let mut winners = if self.sorted {
            resolve_sorted(self.all)
        } else {
            let mut winners: Vec<Winner<'a>> = self.slots.into_iter().flatten().collect();
            winners.sort_by_key(|w| w.order);
            winners
        };
        winners.retain(|w| null_decoded(w.field) || !w.sources().all(|s| s.is_null(text)));
        winners
    }
}

/// The occurrences of one struct field: where each value is, in the order Go decodes them.
struct Winner<'a> {
    field: usize,
    first: Source<'a>,
    more: Vec<Source<'a>>,
    /// Where Go first assigns the field, for the order of assignment.
    order: usize,
}

impl<'a> Winner<'a> {
    fn sources(&self) -> impl Iterator<Item = Source<'a>> + '_ {
        std::iter::once(self.first).chain(self.more.iter().copied())
    }
}

/// Where one occurrence of a value is.
#[derive(Debug, Clone, Copy)]
enum Source<'a> {
    /// At this offset of the text being read.
    Text(usize),
    /// This JSON text ([`Options::inject_version`]).
    Injected(&'a [u8]),
}

impl Source<'_> {
    fn is_null(self, text: &[u8]) -> bool {
        match self {
            Source::Text(pos) => text.get(pos) == Some(&b'n'),
            Source::Injected(value) => value.first() == Some(&b'n'),
        }
    }

    /// The offset errors in it are reported at.
    fn offset(self) -> usize {
        match self {
            Source::Text(pos) => pos,
            Source::Injected(_) => 0,
        }
    }
}

/// Go's `ParsePrevResult` ([`Options::sorted_keys`]): the object went through a map, so each
/// distinct key is left with its last occurrence, and the keys reach the struct sorted
/// byte-wise. Per field, those occurrences in key order, the fields by their first key.
fn resolve_sorted(mut all: Vec<Offered<'_>>) -> Vec<Winner<'_>> {
    all.sort_by(|a, b| {
        (a.field, a.key.as_bytes(), a.order).cmp(&(b.field, b.key.as_bytes(), b.order))
    });
    let mut winners: Vec<(Cow<'_, str>, Winner<'_>)> = Vec::new();
    let mut entries = all.into_iter().peekable();
    while let Some(entry) = entries.next() {
        let last_of_key = entries
            .peek()
            .is_none_or(|n| n.field != entry.field || n.key != entry.key);
        if !last_of_key {
            continue;
        }
        match winners.last_mut() {
            Some((_, w)) if w.field == entry.field => w.more.push(entry.value),
            _ => winners.push((
                entry.key,
                Winner {
                    field: entry.field,
                    first: entry.value,
                    more: Vec::new(),
                    order: 0,
                },
            )),
        }
    }
    winners.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    winners.into_iter().map(|(_, w)| w).collect()
}

struct StructAccess<'r, 'a> {
    r: &'r mut Reader<'a>,
    options: Options<'a>,
    /// The struct's Go type.
    owner: &'static str,
    fields: &'static [&'static str],
    winners: std::vec::IntoIter<Winner<'a>>,
    current: Option<Winner<'a>>,
}

impl<'a> MapAccess<'a> for StructAccess<'_, 'a> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'a>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(winner) = self.winners.next() else {
            return Ok(None);
        };
        let name = self.fields.get(winner.field).copied().unwrap_or_default();
        self.current = Some(winner);
        seed.deserialize(de::value::BorrowedStrDeserializer::new(name))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'a>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let winner = self
            .current
            .take()
            .ok_or_else(|| Error::msg("value requested before key"))?;
        let name = field_name(self.fields.get(winner.field).copied().unwrap_or_default());
        let start = winner.first.offset();
        let result = if winner.more.is_empty() {
            De::at(self.r, self.options, false, winner.first, |de| {
                seed.deserialize(de)
            })
        } else {
            // Over the document's reader: the occurrences are read where they are.
            seed.deserialize(De {
                many: winner.sources().collect(),
                ..De::one(self.r, self.options, false)
            })
        };
        result.map_err(|e| e.at(start).in_field(self.owner, name))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.winners.len())
    }
}

/// An array read element by element.
struct ArrayAccess<'r, 'a> {
    r: &'r mut Reader<'a>,
    options: Options<'a>,
    untyped: bool,
    index: usize,
    done: bool,
    /// Whether an element was read (or skipped): the next follows a comma.
    started: bool,
}

impl ArrayAccess<'_, '_> {
    /// Moves to the next element: its index, or `None` past the closing bracket.
    fn advance(&mut self) -> Result<Option<usize>, Error> {
        if self.done || self.r.eat_if(b']') {
            self.done = true;
            return Ok(None);
        }
        if self.started {
            self.r.eat(b',')?;
        }
        self.started = true;
        self.r.skip_ws();
        self.index += 1;
        Ok(Some(self.index - 1))
    }

    /// Skips what the visitor left of the array.
    fn finish(mut self) -> Result<(), Error> {
        while self.advance()?.is_some() {
            self.r.skip_value()?;
        }
        Ok(())
    }
}

impl<'a> SeqAccess<'a> for ArrayAccess<'_, 'a> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'a>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some(index) = self.advance()? else {
            return Ok(None);
        };
        self.r.skip_ws();
        let start = self.r.pos;
        if self.options.leaves_out(start) {
            // Left out: a null in its place keeps the indexes of the others.
            self.r.skip_value()?;
            let mut null = Reader::new(b"null");
            return seed
                .deserialize(De::one(&mut null, self.options, self.untyped))
                .map(Some)
                .map_err(|e| e.of_left_out().at(start).in_index(index));
        }
        seed.deserialize(De::one(self.r, self.options, self.untyped))
            .map(Some)
            .map_err(|e| e.at(start).in_index(index))
    }
}

/// The elements of a slice that several arrays were decoded into, one after the other, as Go
/// decodes them (see [`De::merged_array`]): each with the occurrences decoded into it.
struct MergedArray<'r, 'a> {
    r: &'r mut Reader<'a>,
    options: Options<'a>,
    untyped: bool,
    elements: std::iter::Enumerate<std::vec::IntoIter<Vec<Source<'a>>>>,
    /// Whether the elements are an array's (their index is part of an error's path), or
    /// the occurrences of one value ([`each`]).
    indexed: bool,
}

impl<'a> SeqAccess<'a> for MergedArray<'_, 'a> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'a>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some((index, mut sources)) = self.elements.next() else {
            return Ok(None);
        };
        let Some(&first) = sources.first() else {
            return Err(Error::msg("an element with no value"));
        };
        let left_out = sources.iter().any(|s| matches!(s, Source::Injected(_)));
        let result = if sources.len() == 1 {
            De::at(self.r, self.options, self.untyped, first, |de| {
                seed.deserialize(de)
            })
        } else {
            seed.deserialize(De {
                many: std::mem::take(&mut sources),
                ..De::one(self.r, self.options, self.untyped)
            })
        };
        result.map(Some).map_err(|e| {
            let e = if left_out { e.of_left_out() } else { e };
            let e = e.at(first.offset());
            if self.indexed { e.in_index(index) } else { e }
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.elements.len())
    }
}

/// The runs of occurrences of a [`nullable`] value reset by a `null` before its last
/// occurrence (see `Nullable::visit_seq`): each a nullable value of its own.
struct Runs<'r, 'a> {
    r: &'r mut Reader<'a>,
    options: Options<'a>,
    untyped: bool,
    runs: std::vec::IntoIter<Vec<Source<'a>>>,
}

impl<'a> SeqAccess<'a> for Runs<'_, 'a> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'a>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some(run) = self.runs.next() else {
            return Ok(None);
        };
        let first = run.first().copied();
        let result = match run[..] {
            [only] => De::at(self.r, self.options, self.untyped, only, |mut de| {
                de.nullable = true;
                seed.deserialize(de)
            }),
            _ => seed.deserialize(De {
                many: run,
                nullable: true,
                ..De::one(self.r, self.options, self.untyped)
            }),
        };
        result.map(Some).map_err(|e| match first {
            Some(f) => e.at(f.offset()),
            None => e,
        })
    }
}

/// An object read entry by entry, keys as they are (maps and untyped values); then, for a
/// map a key written more than once filled, each further object in turn (Go adds every
/// object's entries to the one map).
struct ObjectAccess<'r, 'a> {
    r: &'r mut Reader<'a>,
    options: Options<'a>,
    untyped: bool,
    first: bool,
    done: bool,
    key: Option<Cow<'a, str>>,
    /// Where the further objects start.
    then: std::vec::IntoIter<usize>,
}

impl<'a> ObjectAccess<'_, 'a> {
    /// Moves to the next entry and reads its key, or `None` past the last closing brace.
    /// Entries left out ([`Options::left_out`]) are skipped.
    fn advance(&mut self) -> Result<Option<Cow<'a, str>>, Error> {
        loop {
            if self.done {
                return Ok(None);
            }
            if self.r.eat_if(b'}') {
                match self.then.next() {
                    Some(next) => {
                        self.r.pos = next;
                        self.r.eat(b'{')?;
                        self.first = true;
                        continue;
                    }
                    None => {
                        self.done = true;
                        return Ok(None);
                    }
                }
            }
            if !self.first {
                self.r.eat(b',')?;
            }
            self.first = false;
            let key = self.r.string()?;
            self.r.eat(b':')?;
            self.r.skip_ws();
            if self.options.leaves_out(self.r.pos) {
                self.r.skip_value()?;
                continue;
            }
            return Ok(Some(key));
        }
    }

    /// Skips what the visitor left of the object.
    fn finish(mut self) -> Result<(), Error> {
        if self.key.take().is_some() {
            self.r.skip_value()?;
        }
        while self.advance()?.is_some() {
            self.r.skip_value()?;
        }
        Ok(())
    }
}

impl<'a> MapAccess<'a> for ObjectAccess<'_, 'a> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'a>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(key) = self.advance()? else {
            return Ok(None);
        };
        let decoded = seed
            .deserialize(KeyDe(key.clone()))
            .map_err(|e| e.in_key(&key))?;
        self.key = Some(key);
        Ok(Some(decoded))
    }

    fn next_value_seed<V: DeserializeSeed<'a>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| Error::msg("value requested before key"))?;
        self.r.skip_ws();
        let start = self.r.pos;
        seed.deserialize(De::one(self.r, self.options, self.untyped))
            .map_err(|e| e.at(start).in_key(&key))
    }
}

/// An object key, for map keys and enum variant names.
struct KeyDe<'a>(Cow<'a, str>);

impl<'de> Deserializer<'de> for KeyDe<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Cow::Borrowed(s) => visitor.visit_borrowed_str(s),
            Cow::Owned(s) => visitor.visit_string(s),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'a> de::EnumAccess<'a> for KeyDe<'a> {
    type Error = Error;
    type Variant = UnitOnly;

    fn variant_seed<V: DeserializeSeed<'a>>(self, seed: V) -> Result<(V::Value, UnitOnly), Error> {
        Ok((seed.deserialize(self)?, UnitOnly))
    }
}

/// The variant of an enum given as a plain string.
struct UnitOnly;

impl<'a> de::VariantAccess<'a> for UnitOnly {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'a>>(self, _: T) -> Result<T::Value, Error> {
        Err(de::Error::invalid_type(
            Unexpected::UnitVariant,
            &"newtype variant",
        ))
    }

    fn tuple_variant<V: Visitor<'a>>(self, _: usize, _: V) -> Result<V::Value, Error> {
        Err(de::Error::invalid_type(
            Unexpected::UnitVariant,
            &"tuple variant",
        ))
    }

    fn struct_variant<V: Visitor<'a>>(
        self,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Error> {
        Err(de::Error::invalid_type(
            Unexpected::UnitVariant,
            &"struct variant",
        ))
    }
}

/// An enum given as `{"Variant": content}`.
struct VariantObject<'r, 'a>(De<'r, 'a>);

impl<'r, 'a> de::EnumAccess<'a> for VariantObject<'r, 'a> {
    type Error = Error;
    type Variant = VariantObject<'r, 'a>;

    fn variant_seed<V: DeserializeSeed<'a>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self::Variant), Error> {
        let key = self.0.r.string()?;
        self.0.r.eat(b':')?;
        Ok((seed.deserialize(KeyDe(key))?, self))
    }
}

impl<'a> de::VariantAccess<'a> for VariantObject<'_, 'a> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        self.0.r.null()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'a>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self.0)
    }

    fn tuple_variant<V: Visitor<'a>>(self, _: usize, visitor: V) -> Result<V::Value, Error> {
        self.0.deserialize_seq(visitor)
    }

    fn struct_variant<V: Visitor<'a>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.0.deserialize_struct("struct {}", fields, visitor)
    }
}

/// A number's value as Go reads it into an untyped value or a field.
#[derive(Debug, Clone, Copy)]
enum Number {
    Unsigned(u64),
    Signed(i64),
    Float(f64),
}

impl Number {
    fn is_integer(text: &str) -> bool {
        !text.contains(['.', 'e', 'E'])
    }

    fn parse(text: &str) -> Result<Number, Error> {
        if Number::is_integer(text) {
            if text.starts_with('-') {
                if let Ok(n) = text.parse::<i64>() {
                    return Ok(Number::Signed(n));
                }
            } else if let Ok(n) = text.parse::<u64>() {
                return Ok(Number::Unsigned(n));
            }
        }
        Number::float(text).map(Number::Float)
    }

    fn float(text: &str) -> Result<f64, Error> {
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(f),
            _ => Err(Error::msg(format!("number {text} out of range"))),
        }
    }

    fn visit<'a, V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        match self {
            Number::Unsigned(n) => visitor.visit_u64(n),
            Number::Signed(n) => visitor.visit_i64(n),
            Number::Float(n) => visitor.visit_f64(n),
        }
    }
}

/// An integer type: its Go name (see `gotype`) and range.
#[derive(Debug)]
struct IntType {
    go: &'static str,
    min: i128,
    max: i128,
}

const U8: IntType = IntType {
    go: "uint8",
    min: 0,
    max: u8::MAX as i128,
};
const U16: IntType = IntType {
    go: "uint16",
    min: 0,
    max: u16::MAX as i128,
};
const U32: IntType = IntType {
    go: "uint32",
    min: 0,
    max: u32::MAX as i128,
};
const U64: IntType = IntType {
    go: "uint64",
    min: 0,
    max: u64::MAX as i128,
};
const I8: IntType = IntType {
    go: "int8",
    min: i8::MIN as i128,
    max: i8::MAX as i128,
};
const I16: IntType = IntType {
    go: "int16",
    min: i16::MIN as i128,
    max: i16::MAX as i128,
};
const I32: IntType = IntType {
    go: "int32",
    min: i32::MIN as i128,
    max: i32::MAX as i128,
};
/// Go's `int` (see `gotype`).
const I64: IntType = IntType {
    go: "int",
    min: i64::MIN as i128,
    max: i64::MAX as i128,
};

macro_rules! integers {
    ($($method:ident => $ty:expr),* $(,)?) => {
        $(
            fn $method<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
                if !self.many.is_empty() {
                    return self.scalar(
                        |de| de.$method(IgnoredAny).map(drop),
                        |de| de.$method(visitor),
                    );
                }
                self.visit_integer(visitor, &$ty)
            }
        )*
    };
}

impl<'a> Deserializer<'a> for De<'_, 'a> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if !self.many.is_empty() {
            // Go's `interface {}`: each occurrence replaces the value (its numbers still
            // decoded into floats).
            let sources = std::mem::take(&mut self.many);
            let text = self.r.text;
            for source in &sources {
                if !source.is_null(text) {
                    De::at(self.r, self.options, true, *source, |mut de| {
                        de.untyped_numbers()
                    })?;
                }
            }
            let last = *sources.last().ok_or_else(|| Error::msg("no value"))?;
            let value = De::at(self.r, self.options, self.untyped, last, |de| {
                de.deserialize_any(visitor)
            });
            return De::or_null(self.then_null, value);
        }
        match self.r.kind()? {
            Kind::Null => {
                self.r.null()?;
                visitor.visit_unit()
            }
            Kind::Bool => visitor.visit_bool(self.r.boolean()?),
            Kind::Number => {
                let offset = self.r.pos;
                let text = self.number()?;
                match Number::parse(&text) {
                    Ok(number) => number.visit(visitor),
                    Err(e) => Err(Error::mismatch(
                        e.msg,
                        Mismatch {
                            value: Cow::Owned(format!("number {text}")),
                            go_type: Cow::Borrowed("float64"),
                        },
                        offset,
                    )),
                }
            }
            Kind::String => self.visit_string(visitor),
            Kind::Array | Kind::Object => {
                if !self.untyped {
                    let depth = self.r.skip_value_copy()?;
                    if depth > MAX_UNTYPED_DEPTH {
                        return Err(Error::msg(format!(
                            "an untyped value nested {depth} deep, more than {MAX_UNTYPED_DEPTH}"
                        )));
                    }
                    self.untyped = true;
                }
                if self.r.kind()? == Kind::Array {
                    self.deserialize_seq(visitor)
                } else {
                    self.deserialize_map(visitor)
                }
            }
        }
    }

    fn deserialize_bool<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if !self.many.is_empty() {
            return self.scalar(
                |de| de.deserialize_bool(IgnoredAny).map(drop),
                |de| de.deserialize_bool(visitor),
            );
        }
        if self.null()? {
            return visitor.visit_bool(false);
        }
        if self.r.kind()? == Kind::Bool {
            visitor.visit_bool(self.r.boolean()?)
        } else {
            Err(self.mismatch("bool"))
        }
    }

    integers! {
        deserialize_u8 => U8, deserialize_u16 => U16, deserialize_u32 => U32,
        deserialize_u64 => U64, deserialize_u128 => U64,
        deserialize_i8 => I8, deserialize_i16 => I16, deserialize_i32 => I32,
        deserialize_i64 => I64, deserialize_i128 => I64,
    }

    fn deserialize_f32<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if !self.many.is_empty() {
            return self.scalar(
                |de| de.deserialize_f32(IgnoredAny).map(drop),
                |de| de.deserialize_f32(visitor),
            );
        }
        self.visit_float(visitor, "float32")
    }

    fn deserialize_f64<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if !self.many.is_empty() {
            return self.scalar(
                |de| de.deserialize_f64(IgnoredAny).map(drop),
                |de| de.deserialize_f64(visitor),
            );
        }
        self.visit_float(visitor, "float64")
    }

    fn deserialize_char<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_string(visitor)
    }

    fn deserialize_str<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_string(visitor)
    }

    fn deserialize_string<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if !self.many.is_empty() {
            return self.scalar(
                |de| de.deserialize_string(IgnoredAny).map(drop),
                |de| de.deserialize_string(visitor),
            );
        }
        self.visit_string(visitor)
    }

    fn deserialize_bytes<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if !self.many.is_empty() {
            return self.scalar(
                |de| de.deserialize_bytes(IgnoredAny).map(drop),
                |de| de.deserialize_bytes(visitor),
            );
        }
        match self.r.kind()? {
            Kind::String => match self.r.string()? {
                Cow::Borrowed(s) => visitor.visit_borrowed_bytes(s.as_bytes()),
                Cow::Owned(s) => visitor.visit_byte_buf(s.into_bytes()),
            },
            Kind::Array => self.deserialize_seq(visitor),
            _ => Err(self.mismatch("[]uint8")),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(visitor)
    }

    /// An `Option` stands for a Go value whose zero value means unset (a `null` leaves it
    /// alone, `""` is unset), or, marked [`nullable`], for a Go pointer, slice or map (a
    /// `null` resets it). Of a key written more than once, the occurrences that count decide
    /// (see [`De::kept`]).
    fn deserialize_option<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if !self.many.is_empty() {
            let nullable = std::mem::take(&mut self.nullable);
            let text = self.r.text;
            let ends_null = self.many.last().is_some_and(|s| s.is_null(text));
            if nullable && ends_null {
                // Go decodes every occurrence before the null: a value of the wrong type
                // among them fails the decode, though the pointer ends nil.
                let checked: Vec<Source<'a>> = std::mem::take(&mut self.many)
                    .into_iter()
                    .filter(|s| !s.is_null(text))
                    .collect();
                if checked.is_empty() {
                    return visitor.visit_none();
                }
                return visitor.visit_some(De {
                    many: checked,
                    then_null: true,
                    ..De::one(self.r, self.options, self.untyped)
                });
            }
            let mut kept = self.kept(nullable);
            let Some(&last) = kept.last() else {
                return visitor.visit_none();
            };
            if matches!(last, Source::Text(pos) if text.get(pos..).is_some_and(|t| t.starts_with(b"\"\"")))
            {
                // Unset; what came before is decoded by a run that leaves the `""` out, as
                // Go decodes it (`Options::note_unchecked`).
                if let Some(before) = kept.len().checked_sub(2) {
                    self.options.note_unchecked(&kept, before);
                }
                return visitor.visit_none();
            }
            if let [only] = kept[..] {
                return De::at(self.r, self.options, self.untyped, only, |de| {
                    visitor.visit_some(de)
                });
            }
            return visitor.visit_some(De {
                many: std::mem::take(&mut kept),
                ..De::one(self.r, self.options, self.untyped)
            });
        }
        if self.r.kind()? == Kind::Null {
            self.r.null()?;
            visitor.visit_none()
        } else if self.r.at_empty_string() {
            self.r.pos += 2;
            visitor.visit_none()
        } else {
            self.nullable = false;
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if !self.many.is_empty() {
            return self.scalar(
                |de| de.deserialize_unit(IgnoredAny).map(drop),
                |de| de.deserialize_unit(visitor),
            );
        }
        if self.null()? {
            visitor.visit_unit()
        } else {
            Err(self.mismatch("struct {}"))
        }
    }

    fn deserialize_unit_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'a>>(
        mut self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        if name == NULLABLE_TOKEN {
            self.nullable = true;
            let text = self.r.text;
            let reset = self.many.split_last().is_some_and(|(last, earlier)| {
                !last.is_null(text) && earlier.iter().any(|s| s.is_null(text))
            });
            if reset {
                // Runs ending in a `null` (each followed by it), then the last run.
                let mut runs = Vec::new();
                let mut run = Vec::new();
                for source in std::mem::take(&mut self.many) {
                    let null = source.is_null(text);
                    if !null || !run.is_empty() {
                        run.push(source);
                    }
                    if null && !run.is_empty() {
                        runs.push(std::mem::take(&mut run));
                    }
                }
                runs.push(run);
                return visitor.visit_seq(Runs {
                    r: &mut *self.r,
                    options: self.options,
                    untyped: self.untyped,
                    runs: runs.into_iter(),
                });
            }
            return visitor.visit_newtype_struct(self);
        }
        if name == EACH_TOKEN {
            // Every occurrence, `null` too, as a sequence: Go calls a value's own decoder on
            // each ([`each`]).
            let then_null = self.then_null;
            let sources = if self.many.is_empty() {
                self.r.skip_ws();
                vec![Source::Text(self.r.pos)]
            } else {
                std::mem::take(&mut self.many)
            };
            let value = visitor.visit_seq(MergedArray {
                r: &mut *self.r,
                options: self.options,
                untyped: self.untyped,
                elements: sources
                    .into_iter()
                    .map(|s| vec![s])
                    .collect::<Vec<_>>()
                    .into_iter()
                    .enumerate(),
                indexed: false,
            });
            return De::or_null(then_null, value);
        }
        if name != RAW_TOKEN && name != RAW_OBJECT_TOKEN {
            return visitor.visit_newtype_struct(self);
        }
        let object_only = name == RAW_OBJECT_TOKEN;
        if !self.many.is_empty() {
            // Go decodes each occurrence into the one struct (`runtimeConfig`) or map
            // (`prevResult`): the text handed on holds the entries of each object in turn.
            let then_null = self.then_null;
            let sources = self.kept(false);
            let text = self.r.text;
            let mut objects = Vec::new();
            for source in &sources {
                self.r.pos = source.offset();
                let kind = self.r.kind()?;
                let start = self.r.pos;
                if kind != Kind::Object {
                    if object_only {
                        return Err(self.mismatch(gotype::OBJECT));
                    }
                    // Refused when the plugin decodes it, as Go refuses it.
                    self.r.skip_value()?;
                    let value = text.get(start..self.r.pos).unwrap_or_default();
                    return De::or_null(then_null, visitor.visit_borrowed_bytes(value));
                }
                if object_only {
                    self.untyped_numbers()?;
                }
                self.r.skip_value()?;
                objects.push((start, self.r.pos));
            }
            return De::or_null(
                then_null,
                visitor.visit_byte_buf(merged_objects(text, &objects)),
            );
        }
        if object_only {
            match self.r.kind()? {
                Kind::Object => self.untyped_numbers()?,
                _ => return Err(self.mismatch(gotype::OBJECT)),
            }
        }
        self.r.skip_ws();
        let start = self.r.pos;
        self.r.skip_value()?;
        let text = self.r.text.get(start..self.r.pos).unwrap_or_default();
        visitor.visit_borrowed_bytes(text)
    }

    fn deserialize_seq<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if !self.many.is_empty() {
            // A slice: a `null` resets it; each array after decodes into it (`merged_array`).
            let arrays = std::mem::take(&mut self.many);
            let text = self.r.text;
            for array in arrays.iter().filter(|a| !a.is_null(text)) {
                self.r.pos = array.offset();
                if self.r.kind()? != Kind::Array {
                    let go = format!("[]{}", gotype::element_of(visitor));
                    return Err(self.mismatch(go));
                }
            }
            let elements = self.merged_array(&arrays)?;
            let value = visitor.visit_seq(MergedArray {
                r: &mut *self.r,
                options: self.options,
                untyped: self.untyped,
                elements: elements.into_iter().enumerate(),
                indexed: true,
            });
            return De::or_null(self.then_null, value);
        }
        if self.null()? {
            // Go's nil slice.
            return visitor.visit_seq(de::value::SeqDeserializer::new(std::iter::empty::<()>()));
        }
        if self.r.kind()? != Kind::Array {
            let go = format!("[]{}", gotype::element_of(visitor));
            return Err(self.mismatch(go));
        }
        self.r.eat(b'[')?;
        let mut access = ArrayAccess {
            r: &mut *self.r,
            options: self.options,
            untyped: self.untyped,
            index: 0,
            done: false,
            started: false,
        };
        let value = visitor.visit_seq(&mut access)?;
        access.finish()?;
        Ok(value)
    }

    fn deserialize_tuple<V: Visitor<'a>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'a>>(mut self, visitor: V) -> Result<V::Value, Error> {
        let then_null = self.then_null;
        let mut starts = Vec::new();
        if self.many.is_empty() {
            if self.null()? {
                // Go's nil map.
                return visitor
                    .visit_map(de::value::MapDeserializer::new(
                        std::iter::empty::<((), ())>(),
                    ));
            }
            self.r.skip_ws();
            starts.push(self.r.pos);
        } else {
            // A map: a `null` resets it; each object after adds its entries. Those before
            // were decoded by Go all the same: noted (`Options::note_unchecked`).
            let text = self.r.text;
            if let Some(reset) = self.many.iter().rposition(|s| s.is_null(text))
                && let Some(dropped) = self.many[..reset].iter().rposition(|s| !s.is_null(text))
            {
                self.options.note_unchecked(&self.many, dropped);
            }
            starts = self.kept(true).iter().map(|s| s.offset()).collect();
        }
        for start in &starts {
            self.r.pos = *start;
            if self.r.kind()? != Kind::Object {
                let go = format!("map[string]{}", gotype::value_of(visitor));
                return Err(self.mismatch(go));
            }
        }
        let mut starts = starts.into_iter();
        let Some(first) = starts.next() else {
            return De::or_null(
                then_null,
                visitor.visit_map(de::value::MapDeserializer::new(
                    std::iter::empty::<((), ())>(),
                )),
            );
        };
        self.r.pos = first;
        self.r.eat(b'{')?;
        let mut access = ObjectAccess {
            r: &mut *self.r,
            options: self.options,
            untyped: self.untyped,
            first: true,
            done: false,
            key: None,
            then: starts.collect::<Vec<_>>().into_iter(),
        };
        let value = visitor.visit_map(&mut access)?;
        access.finish()?;
        De::or_null(then_null, Ok(value))
    }

    /// A struct: its fields from the object's entries, or, of a key written more than once,
    /// from every object's in turn (Go decodes each into the one struct); a `null` leaves the
    /// struct alone: the zero value for a fresh one.
    fn deserialize_struct<V: Visitor<'a>>(
        mut self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let owner = self.struct_type(name);
        let then_null = self.then_null;
        let left_out = self.many.iter().any(|s| matches!(s, Source::Injected(_)));
        let objects = if self.many.is_empty() {
            match self.r.kind()? {
                Kind::Object => return self.visit_struct(owner, fields, &[], visitor),
                Kind::Null => {
                    self.r.null()?;
                    Vec::new()
                }
                _ => return Err(self.mismatch(owner)),
            }
        } else {
            let objects = self.kept(false);
            for object in &objects {
                self.r.pos = object.offset();
                if self.r.kind()? != Kind::Object {
                    return Err(self.mismatch(owner));
                }
            }
            objects
        };
        if objects.is_empty() {
            // `null`: Go's zero struct, whose missing fields Go meets too.
            let value = visitor
                .visit_map(de::value::MapDeserializer::new(
                    std::iter::empty::<((), ())>(),
                ))
                .map_err(|e: Error| if left_out { e } else { e.missing_in_text() });
            return De::or_null(then_null, value);
        }
        let value = self.visit_struct(owner, fields, &objects, visitor);
        De::or_null(then_null, value)
    }

    fn deserialize_enum<V: Visitor<'a>>(
        mut self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        if !self.many.is_empty() {
            return self.scalar(
                |mut de| match de.r.kind()? {
                    Kind::Null | Kind::String | Kind::Object => Ok(()),
                    _ => Err(de.mismatch("string")),
                },
                |de| de.deserialize_enum(_name, _variants, visitor),
            );
        }
        match self.r.kind()? {
            Kind::String => visitor.visit_enum(KeyDe(self.r.string()?)),
            Kind::Object => {
                self.r.eat(b'{')?;
                let value = visitor.visit_enum(VariantObject(self.child()))?;
                self.r.eat(b'}')?;
                Ok(value)
            }
            _ => Err(self.mismatch("string")),
        }
    }

    fn deserialize_identifier<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_string(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.many.is_empty() {
            match self.index.filter(|_| self.top) {
                Some(index) => self.r.pos = index.end,
                None => {
                    self.r.skip_value()?;
                }
            }
        }
        De::or_null(self.then_null, visitor.visit_unit())
    }
}

#[cfg(test)]
mod tests;
