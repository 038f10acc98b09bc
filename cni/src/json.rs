//! Go's `encoding/json` output, so printed results are byte-for-byte what the Go plugins print.
//!
//! `json.MarshalIndent(r, "", "    ")`: four-space indentation, `"key": value`, `{}`/`[]` for
//! empty containers, no trailing newline, and Go's HTML-safe escaping (`<`, `>`, `&`, U+2028 and
//! U+2029 as `\u003c`…). Objects Go marshals from a `map` have their keys sorted byte-wise.

use std::io;

use serde::Serialize;
use serde_json::ser::{CharEscape, Formatter, PrettyFormatter};
#[cfg(test)]
use serde_json::{Map, Value};

/// Sorts the keys of every object in `value` byte-wise, as Go does when it marshals a map (the
/// oracle the result types' own sorted printing is tested against).
#[cfg(test)]
pub(crate) fn sort_keys(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect::<Map<String, Value>>(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

/// Renders `value` as Go's `json.MarshalIndent(value, "", "    ")` does.
pub(crate) fn to_go_string<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter::new());
    value.serialize(&mut ser)?;
    String::from_utf8(out).map_err(<serde_json::Error as serde::ser::Error>::custom)
}

/// serde_json's pretty printer with Go's extra escapes.
struct GoFormatter {
    pretty: PrettyFormatter<'static>,
}

impl GoFormatter {
    fn new() -> Self {
        GoFormatter {
            pretty: PrettyFormatter::with_indent(b"    "),
        }
    }
}

impl Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let escape = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(escape.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        char_escape: CharEscape,
    ) -> io::Result<()> {
        self.pretty.write_char_escape(writer, char_escape)
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.begin_array(writer)
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_array(writer)
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.pretty.begin_array_value(writer, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_array_value(writer)
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.begin_object(writer)
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_object(writer)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.pretty.begin_object_key(writer, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.begin_object_value(writer)
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.pretty.end_object_value(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn output_is_indented_with_four_spaces_and_has_no_trailing_newline() {
        let text =
            to_go_string(&json!({"a": [1, "x"], "b": {}, "c": [], "d": {"e": true}})).unwrap();
        assert_eq!(
            text,
            "{\n    \"a\": [\n        1,\n        \"x\"\n    ],\n    \"b\": {},\n    \"c\": [],\n    \"d\": {\n        \"e\": true\n    }\n}"
        );
    }

    #[test]
    fn strings_are_escaped_as_go_escapes_them() {
        let text = to_go_string(&json!("a<b>&c\u{2028}\u{2029}\"\\\n\t\u{1}é/")).unwrap();
        assert_eq!(
            text,
            r#""a\u003cb\u003e\u0026c\u2028\u2029\"\\\n\t\u0001é/""#
        );
    }

    #[test]
    fn keys_are_sorted_bytewise_at_every_level() {
        let sorted = sort_keys(json!({
            "routes": [{"gw": "x", "dst": "y"}],
            "cniVersion": "1.1.0",
            "CNIVersion": "1.0.0",
            "dns": {"search": [], "domain": "d"}
        }));
        assert_eq!(
            to_go_string(&sorted).unwrap().replace([' ', '\n'], ""),
            r#"{"CNIVersion":"1.0.0","cniVersion":"1.1.0","dns":{"domain":"d","search":[]},"routes":[{"dst":"y","gw":"x"}]}"#
        );
    }
}
