//! Go's `encoding/json` scanner: whether a text is one well-formed JSON value, how deeply it
//! nests, and Go's words when it is not.
//!
//! Go checks the whole input before it decodes anything (`checkValid`), so a syntax error
//! anywhere wins over a type error earlier in the text; [`validate`] is that check. It walks the
//! text once, without recursion, keeping one byte per open array or object, and refuses nesting
//! deeper than Go's `maxNestingDepth` (10 000) with Go's error. Its messages are Go's
//! `SyntaxError` texts (`invalid character 'x' looking for beginning of value`, `unexpected end
//! of JSON input`), including Go's habit of reporting a value cut short at the end of the input
//! as an invalid space (it feeds its state machine one `' '` at EOF).

use std::fmt::Write as _;

/// The deepest nesting of arrays and objects Go's decoder accepts.
pub const MAX_DEPTH: usize = 10_000;

/// Why a text is not JSON, in Go's words, and the byte offset where the scan stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub(crate) msg: String,
    pub(crate) offset: usize,
}

const EOF: &str = "unexpected end of JSON input";

/// What [`validate`] found besides well-formedness.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Checked {
    /// How deep the value nests (0 for a scalar).
    pub(crate) depth: usize,
    /// When the value is an object: where its entries are, so that decoding it needs to skip
    /// none of their values again.
    pub(crate) top: Option<TopIndex>,
}

/// The entries of a top-level object, in document order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TopIndex {
    pub(crate) entries: Vec<TopEntry>,
    /// Offset just past the object's closing brace.
    pub(crate) end: usize,
}

/// One entry of a top-level object: offsets of its key's opening quote, of its value, and just
/// past its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TopEntry {
    pub(crate) key: usize,
    pub(crate) value: usize,
    pub(crate) end: usize,
}

/// Checks that `text` holds exactly one JSON value (whitespace around it allowed) nested at
/// most [`MAX_DEPTH`] deep.
pub(crate) fn validate(text: &[u8]) -> Result<Checked, SyntaxError> {
    let mut scan = Scan { text, pos: 0 };
    // One entry per open container: true for an object.
    let mut open: Vec<bool> = Vec::new();
    let mut deepest = 0;
    let mut top: Option<TopIndex> = None;
    // The top-level entry whose value is being read.
    let mut pending: Option<TopEntry> = None;
    scan.skip_ws();
    'value: loop {
        let c = scan.peek_or_eof()?;
        match c {
            b'{' | b'[' => {
                open.push(c == b'{');
                if open.len() > MAX_DEPTH {
                    return Err(scan.invalid(c, "exceeded max depth"));
                }
                deepest = deepest.max(open.len());
                scan.pos += 1;
                scan.skip_ws();
                let close = if c == b'{' { b'}' } else { b']' };
                let next = scan.peek_or_eof()?;
                if open.len() == 1 && c == b'{' {
                    top = Some(TopIndex::default());
                }
                if next == close {
                    scan.pos += 1;
                    open.pop();
                    if open.is_empty()
                        && let Some(index) = top.as_mut()
                    {
                        index.end = scan.pos;
                    }
                } else if c == b'[' {
                    continue 'value;
                } else {
                    if let Some(entry) = scan.key(open.len() == 1)? {
                        pending = Some(entry);
                    }
                    continue 'value;
                }
            }
            b'"' => scan.string()?,
            b'-' | b'0'..=b'9' => scan.number()?,
            b't' => scan.literal(b"true")?,
            b'f' => scan.literal(b"false")?,
            b'n' => scan.literal(b"null")?,
            _ => return Err(scan.invalid(c, "looking for beginning of value")),
        }
        // After a value: close containers until one continues or the document ends.
        loop {
            if open.len() == 1
                && let (Some(mut entry), Some(index)) = (pending.take(), top.as_mut())
            {
                entry.end = scan.pos;
                index.entries.push(entry);
            }
            scan.skip_ws();
            let Some(&in_object) = open.last() else {
                return match scan.peek() {
                    None => Ok(Checked {
                        depth: deepest,
                        top,
                    }),
                    Some(c) => Err(scan.invalid(c, "after top-level value")),
                };
            };
            let c = scan.peek_or_eof()?;
            match (c, in_object) {
                (b',', true) => {
                    scan.pos += 1;
                    scan.skip_ws();
                    if let Some(entry) = scan.key(open.len() == 1)? {
                        pending = Some(entry);
                    }
                    continue 'value;
                }
                (b',', false) => {
                    scan.pos += 1;
                    scan.skip_ws();
                    continue 'value;
                }
                (b'}', true) | (b']', false) => {
                    scan.pos += 1;
                    open.pop();
                    if open.is_empty()
                        && let Some(index) = top.as_mut()
                    {
                        index.end = scan.pos;
                    }
                }
                (_, true) => return Err(scan.invalid(c, "after object key:value pair")),
                (_, false) => return Err(scan.invalid(c, "after array element")),
            }
        }
    }
}

struct Scan<'a> {
    text: &'a [u8],
    pos: usize,
}

impl Scan<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn peek_or_eof(&self) -> Result<u8, SyntaxError> {
        self.peek().ok_or_else(|| self.eof())
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn eof(&self) -> SyntaxError {
        SyntaxError {
            msg: EOF.to_owned(),
            offset: self.text.len(),
        }
    }

    fn invalid(&self, c: u8, context: &str) -> SyntaxError {
        SyntaxError {
            msg: format!("invalid character {} {context}", quote_char(c)),
            offset: self.pos,
        }
    }

    /// An object key at `pos` and the colon after it, up to the start of its value; for a key
    /// of the top-level object, the entry's offsets so far.
    fn key(&mut self, top_level: bool) -> Result<Option<TopEntry>, SyntaxError> {
        let key = self.pos;
        match self.peek_or_eof()? {
            b'"' => self.string()?,
            c => return Err(self.invalid(c, "looking for beginning of object key string")),
        }
        self.skip_ws();
        match self.peek_or_eof()? {
            b':' => {
                self.pos += 1;
                self.skip_ws();
                Ok(top_level.then_some(TopEntry {
                    key,
                    value: self.pos,
                    end: 0,
                }))
            }
            c => Err(self.invalid(c, "after object key")),
        }
    }

    /// A string literal starting at the `"` at `pos`. Raw bytes of 0x80 and above are not
    /// checked, as in Go: the decoder replaces invalid UTF-8.
    fn string(&mut self) -> Result<(), SyntaxError> {
        self.pos += 1;
        loop {
            while let Some(&b) = self.text.get(self.pos) {
                if STRING_STOPS[usize::from(b)] {
                    break;
                }
                self.pos += 1;
            }
            match self.peek_or_eof()? {
                b'"' => {
                    self.pos += 1;
                    return Ok(());
                }
                b'\\' => {
                    self.pos += 1;
                    match self.peek_or_eof()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.pos += 1,
                        b'u' => {
                            self.pos += 1;
                            for _ in 0..4 {
                                match self.peek_or_eof()? {
                                    c if c.is_ascii_hexdigit() => self.pos += 1,
                                    c => {
                                        return Err(
                                            self.invalid(c, "in \\u hexadecimal character escape")
                                        );
                                    }
                                }
                            }
                        }
                        c => return Err(self.invalid(c, "in string escape code")),
                    }
                }
                c => return Err(self.invalid(c, "in string literal")),
            }
        }
    }

    /// The next byte where one of `want` must follow; at the end of the input Go sees a space.
    fn need(&self, want: fn(u8) -> bool, context: &str) -> Result<(), SyntaxError> {
        match self.peek() {
            Some(c) if want(c) => Ok(()),
            Some(c) => Err(self.invalid(c, context)),
            None => Err(self.invalid(b' ', context)),
        }
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    /// A number: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Result<(), SyntaxError> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
            self.need(|c| c.is_ascii_digit(), "in numeric literal")?;
        }
        if self.peek() == Some(b'0') {
            self.pos += 1;
        } else {
            self.digits();
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.need(
                |c| c.is_ascii_digit(),
                "after decimal point in numeric literal",
            )?;
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.need(|c| c.is_ascii_digit(), "in exponent of numeric literal")?;
            self.digits();
        }
        Ok(())
    }

    /// `true`, `false` or `null`, whose first byte is at `pos`.
    fn literal(&mut self, word: &'static [u8]) -> Result<(), SyntaxError> {
        for &want in &word[1..] {
            self.pos += 1;
            match self.peek() {
                Some(c) if c == want => {}
                found => {
                    let name = String::from_utf8_lossy(word);
                    let context = format!("in literal {name} (expecting {})", quote_char(want));
                    return Err(self.invalid(found.unwrap_or(b' '), &context));
                }
            }
        }
        self.pos += 1;
        Ok(())
    }
}

/// The bytes that end a run of plain string content: a quote, a backslash, a control character.
static STRING_STOPS: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// Go's `quoteChar`: the byte as a rune (so 0xff is `'ÿ'`) in `strconv.Quote`'s escapes, in
/// single quotes.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => return "'\\''".to_owned(),
        b'"' => return "'\"'".to_owned(),
        _ => {}
    }
    let mut out = String::from("'");
    match c {
        0x07 => out.push_str("\\a"),
        0x08 => out.push_str("\\b"),
        0x0c => out.push_str("\\f"),
        b'\n' => out.push_str("\\n"),
        b'\r' => out.push_str("\\r"),
        b'\t' => out.push_str("\\t"),
        0x0b => out.push_str("\\v"),
        b'\\' => out.push_str("\\\\"),
        0x00..=0x1f | 0x7f => {
            let _ = write!(out, "\\x{c:02x}");
        }
        // C1 controls and the soft hyphen are not printable to Go.
        0x80..=0x9f | 0xad => {
            let _ = write!(out, "\\u{c:04x}");
        }
        _ => out.push(char::from(c)),
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        validate(text.as_bytes()).unwrap_err().msg
    }

    #[test]
    fn well_formed_values_validate_and_report_their_depth() {
        let cases: [(&str, usize); 9] = [
            ("1", 0),
            (" \t\r\n\"x\" ", 0),
            ("[]", 1),
            ("{}", 1),
            ("[[], {}]", 2),
            (r#"{"a": [1, -2.5e+3, true, false, null, "\u00e9\n"]}"#, 2),
            (r#"{"a":{"b":{"c":[0]}}}"#, 4),
            ("-0.0E-0", 0),
            ("\"\u{ff} raw bytes\"", 0),
        ];
        for (text, depth) in cases {
            assert_eq!(
                validate(text.as_bytes()).map(|c| c.depth),
                Ok(depth),
                "{text}"
            );
        }
        // Invalid UTF-8 inside a string is Go's to replace, not an error.
        assert_eq!(validate(b"\"\xff\xfe\"").map(|c| c.depth), Ok(0));
    }

    #[test]
    fn malformed_values_get_go_s_syntax_errors() {
        let cases = [
            ("", "unexpected end of JSON input"),
            ("   ", "unexpected end of JSON input"),
            ("{\"name\": ", "unexpected end of JSON input"),
            ("[1", "unexpected end of JSON input"),
            ("\"abc", "unexpected end of JSON input"),
            ("x", "invalid character 'x' looking for beginning of value"),
            (
                "[1,]",
                "invalid character ']' looking for beginning of value",
            ),
            (
                "{,}",
                "invalid character ',' looking for beginning of object key string",
            ),
            (
                "{\"a\":1,}",
                "invalid character '}' looking for beginning of object key string",
            ),
            ("{\"a\" 1}", "invalid character '1' after object key"),
            (
                "{\"a\":1 \"b\"}",
                "invalid character '\"' after object key:value pair",
            ),
            ("[1 2]", "invalid character '2' after array element"),
            ("{} {}", "invalid character '{' after top-level value"),
            ("01", "invalid character '1' after top-level value"),
            ("-", "invalid character ' ' in numeric literal"),
            ("-x", "invalid character 'x' in numeric literal"),
            (
                "1.",
                "invalid character ' ' after decimal point in numeric literal",
            ),
            (
                "1.e5",
                "invalid character 'e' after decimal point in numeric literal",
            ),
            (
                "1e+",
                "invalid character ' ' in exponent of numeric literal",
            ),
            (
                "tru",
                "invalid character ' ' in literal true (expecting 'e')",
            ),
            (
                "nul!",
                "invalid character '!' in literal null (expecting 'l')",
            ),
            (
                "fals",
                "invalid character ' ' in literal false (expecting 'e')",
            ),
            ("\"a\nb\"", "invalid character '\\n' in string literal"),
            ("\"\\x\"", "invalid character 'x' in string escape code"),
            (
                "\"\\u12g4\"",
                "invalid character 'g' in \\u hexadecimal character escape",
            ),
            (
                "'",
                "invalid character '\\'' looking for beginning of value",
            ),
            (
                "\u{1}",
                "invalid character '\\x01' looking for beginning of value",
            ),
        ];
        for (text, msg) in cases {
            assert_eq!(err(text), msg, "{text:?}");
        }
        assert_eq!(
            validate(b"\xff").unwrap_err().msg,
            "invalid character '\u{ff}' looking for beginning of value"
        );
        assert_eq!(
            validate(b"\x85").unwrap_err().msg,
            "invalid character '\\u0085' looking for beginning of value"
        );
    }

    #[test]
    fn a_top_level_object_s_entries_are_indexed() {
        let text = r#" {"a": 1, "b" : {"c": [2, {"d": 3}]}, "e":"x" ,"f":null} "#;
        let index = validate(text.as_bytes()).unwrap().top.unwrap();
        let spans: Vec<(&str, &str)> = index
            .entries
            .iter()
            .map(|e| (&text[e.key..e.value], &text[e.value..e.end]))
            .collect();
        assert_eq!(
            spans,
            [
                (r#""a": "#, "1"),
                (r#""b" : "#, r#"{"c": [2, {"d": 3}]}"#),
                (r#""e":"#, r#""x""#),
                (r#""f":"#, "null"),
            ]
        );
        assert_eq!(&text[index.end..], " ");
        let empty = validate(b"{ }").unwrap().top.unwrap();
        assert!(empty.entries.is_empty());
        assert_eq!(empty.end, 3);
        assert_eq!(validate(b"[{}]").unwrap().top, None);
    }

    #[test]
    fn nesting_is_accepted_to_go_s_limit_and_refused_past_it() {
        let nest = |depth: usize, open: &str, close: &str| {
            format!("{}1{}", open.repeat(depth), close.repeat(depth))
        };
        let arrays = nest(MAX_DEPTH, "[", "]");
        assert_eq!(validate(arrays.as_bytes()).map(|c| c.depth), Ok(MAX_DEPTH));
        let objects = nest(MAX_DEPTH, "{\"a\":", "}");
        assert_eq!(validate(objects.as_bytes()).map(|c| c.depth), Ok(MAX_DEPTH));
        let too_deep = nest(MAX_DEPTH + 1, "[", "]");
        let e = validate(too_deep.as_bytes()).unwrap_err();
        assert_eq!(e.msg, "invalid character '[' exceeded max depth");
        assert_eq!(e.offset, MAX_DEPTH);
        // Refused as soon as the limit is passed, however much unclosed nesting follows.
        let e = validate("{\"a\":".repeat(1_000_000).as_bytes()).unwrap_err();
        assert_eq!(e.msg, "invalid character '{' exceeded max depth");
    }
}
