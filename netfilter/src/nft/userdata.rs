//! nftables userdata: the TLVs `nft` stores in rules and elements (libnftnl's `udata`).

/// `NFTNL_UDATA_RULE_COMMENT` and `NFTNL_UDATA_SET_ELEM_COMMENT` share type 0.
const COMMENT: u8 = 0;

/// A comment TLV: type, length (with the NUL), the text and a NUL.
pub(crate) fn comment(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 3);
    out.push(COMMENT);
    // Callers cap comments at COMMENT_MAX (128), so the length fits in the byte.
    out.push(u8::try_from(text.len() + 1).unwrap_or(u8::MAX));
    out.extend_from_slice(text.as_bytes());
    out.push(0);
    out
}

/// The comment stored in userdata, if any.
pub(crate) fn parse_comment(data: &[u8]) -> Option<String> {
    let mut rest = data;
    while let [kind, len, tail @ ..] = rest {
        let len = usize::from(*len);
        let value = tail.get(..len)?;
        if *kind == COMMENT {
            let text = value.split(|b| *b == 0).next().unwrap_or_default();
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        rest = &tail[len..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_round_trip_through_the_tlv_nft_writes() {
        // `userdata = { \x00\x06enter\x00 }` in `nft --debug=netlink`.
        assert_eq!(comment("enter"), b"\x00\x06enter\x00");
        assert_eq!(
            parse_comment(b"\x00\x06enter\x00").as_deref(),
            Some("enter")
        );
        // Other TLVs before the comment are skipped; truncated data yields nothing.
        assert_eq!(
            parse_comment(b"\x01\x02ab\x00\x02x\x00").as_deref(),
            Some("x")
        );
        assert_eq!(parse_comment(b"\x00\x09abc"), None);
        assert_eq!(parse_comment(b""), None);
    }
}
