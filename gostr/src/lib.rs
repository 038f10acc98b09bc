//! Go's text for the values the reference's messages print: an errno as `syscall.Errno` words
//! it, a string as `%q` quotes it. The protocol crate and the kernel crates both word their
//! errors with these, so they live apart from either.

/// How Go prints an errno (`syscall.Errno`'s text): the reference's messages embed it
/// (`write /proc/sys/net/ipv4/ip_forward: invalid argument`, `file exists`). An error that
/// carries no errno is printed as it is.
pub fn go_errno(err: &std::io::Error) -> String {
    let Some(errno) = err.raw_os_error() else {
        return err.to_string();
    };
    // Go's table (syscall/zerrors_linux_*.go) for the errnos plugins meet; the C library's
    // wording differs for some (ERANGE), and musl's for more.
    let text = match errno {
        libc::EPERM => "operation not permitted",
        libc::ENOENT => "no such file or directory",
        libc::ESRCH => "no such process",
        libc::EINTR => "interrupted system call",
        libc::EIO => "input/output error",
        libc::ENXIO => "no such device or address",
        libc::EBADF => "bad file descriptor",
        libc::EAGAIN => "resource temporarily unavailable",
        libc::ENOMEM => "cannot allocate memory",
        libc::EACCES => "permission denied",
        libc::EBUSY => "device or resource busy",
        libc::EEXIST => "file exists",
        libc::ENODEV => "no such device",
        libc::ENOTDIR => "not a directory",
        libc::EISDIR => "is a directory",
        libc::EINVAL => "invalid argument",
        libc::EMFILE => "too many open files",
        libc::ENOSPC => "no space left on device",
        libc::EROFS => "read-only file system",
        libc::ERANGE => "numerical result out of range",
        libc::ENAMETOOLONG => "file name too long",
        libc::ELOOP => "too many levels of symbolic links",
        libc::ENODATA => "no data available",
        libc::EMSGSIZE => "message too long",
        libc::EPROTONOSUPPORT => "protocol not supported",
        libc::EOPNOTSUPP => "operation not supported",
        libc::EAFNOSUPPORT => "address family not supported by protocol",
        libc::EADDRINUSE => "address already in use",
        libc::EADDRNOTAVAIL => "cannot assign requested address",
        libc::ENETDOWN => "network is down",
        libc::ENETUNREACH => "network is unreachable",
        libc::ENOBUFS => "no buffer space available",
        libc::ETIMEDOUT => "connection timed out",
        libc::EHOSTUNREACH => "no route to host",
        _ => {
            let desc = nix::errno::Errno::from_raw(errno).desc();
            let mut chars = desc.chars();
            return chars.next().map_or_else(String::new, |first| {
                first.to_lowercase().chain(chars).collect()
            });
        }
    };
    text.to_string()
}

/// A string as Go's `%q` prints it (`strconv.Quote`), for the reference's messages that quote
/// a value: quoted, `"` and `\` escaped, `\a \b \f \n \r \t \v` for those controls, `\xNN`
/// for the other ASCII controls, `\uNNNN` (`\UNNNNNNNN`) for other characters Go does not
/// print (C1 controls, spaces other than ' '), the rest as it is.
pub fn go_quote(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() || (c.is_whitespace() && c != ' ') => {
                if u32::from(c) < 0x1_0000 {
                    let _ = write!(out, "\\u{:04x}", u32::from(c));
                } else {
                    let _ = write!(out, "\\U{:08x}", u32::from(c));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_are_worded_as_go_words_them() {
        let cases = [
            (libc::EINVAL, "invalid argument"),
            (libc::ERANGE, "numerical result out of range"),
            (libc::EEXIST, "file exists"),
            (libc::ENETUNREACH, "network is unreachable"),
            (libc::ENOTSUP, "operation not supported"),
            (libc::EPIPE, "broken pipe"),
        ];
        for (errno, want) in cases {
            assert_eq!(go_errno(&std::io::Error::from_raw_os_error(errno)), want);
        }
        assert_eq!(go_errno(&std::io::Error::other("custom")), "custom");
        assert_eq!(go_quote("a \"b\"\\c\n"), r#""a \"b\"\\c\n""#);
        for (raw, quoted) in [
            ("tab\there", r#""tab\there""#),
            ("bell\u{7}", r#""bell\a""#),
            ("nul\u{0}", r#""nul\x00""#),
            ("del\u{7f}", r#""del\x7f""#),
            ("c1\u{85}", r#""c1\u0085""#),
            ("nbsp\u{a0}", r#""nbsp\u00a0""#),
            ("é ü", r#""é ü""#),
        ] {
            assert_eq!(go_quote(raw), quoted);
        }
    }
}
