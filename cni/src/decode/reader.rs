//! Reading tokens out of a text that [`super::syntax::validate`] accepted: strings unescaped as
//! Go unescapes them, numbers as their text, and whole values skipped without recursion.
//!
//! The text is known to be well-formed, so skipping only counts brackets outside strings. Every
//! read still checks its bounds and returns an error rather than panic should that not hold.

use std::borrow::Cow;

use super::Error;

/// A position in a validated JSON text.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reader<'a> {
    pub(super) text: &'a [u8],
    pub(super) pos: usize,
}

/// What kind of value starts at a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

impl<'a> Reader<'a> {
    pub(super) fn new(text: &'a [u8]) -> Reader<'a> {
        Reader { text, pos: 0 }
    }

    pub(super) fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    pub(super) fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// The kind of the value at `pos` (after whitespace).
    pub(super) fn kind(&mut self) -> Result<Kind, Error> {
        self.skip_ws();
        match self.peek() {
            Some(b'n') => Ok(Kind::Null),
            Some(b't' | b'f') => Ok(Kind::Bool),
            Some(b'-' | b'0'..=b'9') => Ok(Kind::Number),
            Some(b'"') => Ok(Kind::String),
            Some(b'[') => Ok(Kind::Array),
            Some(b'{') => Ok(Kind::Object),
            _ => Err(self.broken()),
        }
    }

    /// The error for a text that is not what validation promised (never expected).
    pub(super) fn broken(&self) -> Error {
        Error::msg(format!("malformed JSON at offset {}", self.pos))
    }

    /// Consumes `byte` (after whitespace).
    pub(super) fn eat(&mut self, byte: u8) -> Result<(), Error> {
        self.skip_ws();
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.broken())
        }
    }

    /// Consumes `byte` if it comes next (after whitespace).
    pub(super) fn eat_if(&mut self, byte: u8) -> bool {
        self.skip_ws();
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    /// Consumes `true` or `false`.
    pub(super) fn boolean(&mut self) -> Result<bool, Error> {
        self.skip_ws();
        if self.text[self.pos.min(self.text.len())..].starts_with(b"true") {
            self.pos += 4;
            Ok(true)
        } else if self.text[self.pos.min(self.text.len())..].starts_with(b"false") {
            self.pos += 5;
            Ok(false)
        } else {
            Err(self.broken())
        }
    }

    /// Consumes `null`.
    pub(super) fn null(&mut self) -> Result<(), Error> {
        self.skip_ws();
        if self.text[self.pos.min(self.text.len())..].starts_with(b"null") {
            self.pos += 4;
            Ok(())
        } else {
            Err(self.broken())
        }
    }

    /// Consumes a number and returns its text.
    pub(super) fn number(&mut self) -> Result<&'a str, Error> {
        self.skip_ws();
        let start = self.pos;
        while let Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        let text = self.text.get(start..self.pos).unwrap_or_default();
        match std::str::from_utf8(text) {
            Ok(s) if !s.is_empty() => Ok(s),
            _ => Err(self.broken()),
        }
    }

    /// Whether the value at `pos` is the empty string `""`.
    pub(super) fn at_empty_string(&mut self) -> bool {
        self.skip_ws();
        self.text
            .get(self.pos..)
            .is_some_and(|rest| rest.starts_with(b"\"\""))
    }

    /// Consumes a string and returns it unescaped, borrowed from the text when it has no escape
    /// and is valid UTF-8. As Go: invalid UTF-8 and lone surrogates become U+FFFD.
    pub(super) fn string(&mut self) -> Result<Cow<'a, str>, Error> {
        self.eat(b'"')?;
        let start = self.pos;
        let rest = self.text.get(start..).unwrap_or_default();
        let Some(i) = memchr::memchr2(b'"', b'\\', rest) else {
            return Err(self.broken());
        };
        if rest[i] == b'"' {
            self.pos = start + i + 1;
            let raw = &rest[..i];
            return Ok(match std::str::from_utf8(raw) {
                Ok(s) => Cow::Borrowed(s),
                Err(_) => Cow::Owned(go_lossy(raw)),
            });
        }
        let mut out: Vec<u8> = Vec::with_capacity(i + 16);
        loop {
            let rest = self.text.get(self.pos..).unwrap_or_default();
            let Some(i) = memchr::memchr2(b'"', b'\\', rest) else {
                return Err(self.broken());
            };
            out.extend_from_slice(&rest[..i]);
            self.pos += i + 1;
            if rest[i] == b'"' {
                break;
            }
            let escaped = self.peek().ok_or_else(|| self.broken())?;
            self.pos += 1;
            let byte = match escaped {
                b'"' => b'"',
                b'\\' => b'\\',
                b'/' => b'/',
                b'b' => 0x08,
                b'f' => 0x0c,
                b'n' => b'\n',
                b'r' => b'\r',
                b't' => b'\t',
                b'u' => {
                    let c = self.unicode_escape()?;
                    let mut buf = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    continue;
                }
                _ => return Err(self.broken()),
            };
            out.push(byte);
        }
        Ok(Cow::Owned(match String::from_utf8(out) {
            Ok(s) => s,
            Err(e) => go_lossy(e.as_bytes()),
        }))
    }

    /// The character of a `\uXXXX` escape whose `u` was consumed, pairing surrogates as Go does:
    /// a high surrogate followed by an escaped low one is one character, any other surrogate
    /// is U+FFFD (and what follows it is read on its own).
    fn unicode_escape(&mut self) -> Result<char, Error> {
        let first = self.hex4()?;
        if !(0xd800..0xe000).contains(&first) {
            return char::from_u32(first).ok_or_else(|| self.broken());
        }
        if first < 0xdc00 && self.text.get(self.pos..self.pos + 2) == Some(b"\\u") {
            let save = self.pos;
            self.pos += 2;
            let second = self.hex4()?;
            if (0xdc00..0xe000).contains(&second) {
                let c = 0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00);
                return char::from_u32(c).ok_or_else(|| self.broken());
            }
            self.pos = save;
        }
        Ok(char::REPLACEMENT_CHARACTER)
    }

    fn hex4(&mut self) -> Result<u32, Error> {
        let digits = self
            .text
            .get(self.pos..self.pos + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or_else(|| self.broken())?;
        self.pos += 4;
        Ok(digits)
    }

    /// Skips the value at `pos` and returns how deeply it nests (0 for a scalar).
    pub(super) fn skip_value(&mut self) -> Result<usize, Error> {
        match self.kind()? {
            Kind::String => {
                self.skip_string()?;
                Ok(0)
            }
            Kind::Array | Kind::Object => self.skip_container(),
            Kind::Null | Kind::Bool | Kind::Number => {
                while let Some(b) = self.peek() {
                    if matches!(b, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r') {
                        break;
                    }
                    self.pos += 1;
                }
                Ok(0)
            }
        }
    }

    /// The first number between `pos` and `end` (outside strings) whose value does not fit a
    /// float, with where it starts; numbers starting at one of `skipped` are not looked at.
    pub(super) fn number_out_of_float_range(
        &self,
        end: usize,
        skipped: &[usize],
    ) -> Option<(usize, &'a str)> {
        let mut pos = self.pos;
        while pos < end {
            let rest = self.text.get(pos..end)?;
            let i = rest
                .iter()
                .position(|&b| b == b'"' || b == b'-' || b.is_ascii_digit())?;
            pos += i;
            if rest[i] == b'"' {
                let mut string = Reader {
                    text: self.text,
                    pos,
                };
                string.skip_string().ok()?;
                pos = string.pos;
                continue;
            }
            let mut number = Reader {
                text: self.text,
                pos,
            };
            let text = number.number().ok()?;
            if !skipped.contains(&pos) && !text.parse::<f64>().is_ok_and(f64::is_finite) {
                return Some((pos, text));
            }
            pos = number.pos;
        }
        None
    }

    /// The depth of the value at `pos`, which is left where it is.
    pub(super) fn skip_value_copy(self) -> Result<usize, Error> {
        let mut copy = self;
        copy.skip_value()
    }

    /// Skips the string whose opening quote is at `pos`.
    fn skip_string(&mut self) -> Result<(), Error> {
        self.pos += 1;
        loop {
            let rest = self.text.get(self.pos..).unwrap_or_default();
            let Some(i) = memchr::memchr2(b'"', b'\\', rest) else {
                return Err(self.broken());
            };
            if rest[i] == b'"' {
                self.pos += i + 1;
                return Ok(());
            }
            // The escaped byte cannot end the string; `\uXXXX`'s digits are plain bytes.
            self.pos += i + 2;
        }
    }

    /// Skips the array or object whose opening bracket is at `pos`, counting brackets outside
    /// strings; returns its depth.
    fn skip_container(&mut self) -> Result<usize, Error> {
        let mut depth = 0usize;
        let mut deepest = 0;
        while let Some(rest) = self.text.get(self.pos..) {
            let Some(i) = rest.iter().position(|&b| CONTAINER_BYTES[usize::from(b)]) else {
                break;
            };
            self.pos += i;
            match rest[i] {
                b'"' => {
                    self.skip_string()?;
                    continue;
                }
                b'[' | b'{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                _ => {
                    depth = depth.checked_sub(1).ok_or_else(|| self.broken())?;
                    if depth == 0 {
                        self.pos += 1;
                        return Ok(deepest);
                    }
                }
            }
            self.pos += 1;
        }
        Err(self.broken())
    }
}

/// The bytes [`Reader::skip_container`] stops at: quotes and brackets.
static CONTAINER_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    table[b'"' as usize] = true;
    table[b'[' as usize] = true;
    table[b']' as usize] = true;
    table[b'{' as usize] = true;
    table[b'}' as usize] = true;
    table
};

/// `bytes` as a string the way Go's decoder reads it: each byte of an invalid UTF-8 sequence
/// becomes U+FFFD (Go's `utf8.DecodeRune` consumes one byte per error).
pub(super) fn go_lossy(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 8);
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                let bad = e.error_len().unwrap_or(after.len());
                out.extend(std::iter::repeat_n(char::REPLACEMENT_CHARACTER, bad));
                rest = &after[bad..];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(text: &[u8]) -> String {
        Reader::new(text).string().unwrap().into_owned()
    }

    #[test]
    fn strings_unescape_as_go_unescapes_them() {
        assert_eq!(string(br#""plain""#), "plain");
        assert_eq!(
            string(br#""a\"b\\c\/d\b\f\n\r\te""#),
            "a\"b\\c/d\u{8}\u{c}\n\r\te"
        );
        assert_eq!(string(br#""\u00e9\u20AC""#), "é€");
        assert_eq!(string(br#""\ud83d\ude00""#), "😀");
        // Lone surrogates, and a high one followed by something else, become U+FFFD.
        assert_eq!(string(br#""\ud83dx""#), "\u{fffd}x");
        assert_eq!(string(br#""\ude00""#), "\u{fffd}");
        assert_eq!(string(br#""\ud83d\u0041""#), "\u{fffd}A");
        // One U+FFFD per byte of an invalid sequence, escaped or not.
        assert_eq!(string(b"\"a\xe2\x82b\""), "a\u{fffd}\u{fffd}b");
        assert_eq!(string(b"\"\\n\xff\""), "\n\u{fffd}");
        assert_eq!(go_lossy(b"\xf0\x9f\x98"), "\u{fffd}\u{fffd}\u{fffd}");
    }

    #[test]
    fn skipping_a_value_stops_after_it_and_reports_its_depth() {
        let text = br#"[{"a": "]}\"[", "b": [1, {"c": null}]}, 2] , 3"#;
        let mut r = Reader::new(text);
        assert_eq!(r.skip_value().unwrap(), 4);
        assert_eq!(&text[r.pos..], b" , 3");
        let mut r = Reader::new(b"  -12.5e3]");
        assert_eq!(r.skip_value().unwrap(), 0);
        assert_eq!(r.pos, 9);
        let mut r = Reader::new(br#""x\\"y"#);
        r.skip_value().unwrap();
        assert_eq!(r.pos, 5);
    }
}
