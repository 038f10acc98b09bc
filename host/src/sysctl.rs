//! Network sysctls under `/proc/sys/net`, with key validation.
//!
//! Keys come in two spellings: dotted (`net.ipv4.conf.eth0.rp_filter`) and slashed
//! (`net/ipv4/conf/eth0.100/rp_filter`). As in sysctl(8) and the reference plugin, a key whose
//! first `.` comes before its first `/` is dotted and has its dots and slashes swapped; so an
//! interface name containing a dot can only be written in the slashed form. Only keys under
//! `net/` are accepted, and no component may be empty, `.` or `..`.
//!
//! `/proc/sys/net` resolves against the network namespace of the thread that opens the file, so
//! a [`Sysctl`] must be used from inside [`crate::netns::NetNs::run`] to reach a container.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// The real sysctl tree.
pub const PROC_SYS: &str = "/proc/sys";

/// A rejected sysctl key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SysctlKeyError {
    /// Not under `net.`.
    #[error("sysctl {0:?} is not a network sysctl (it must start with net.)")]
    NotNet(String),
    /// An empty, `.` or `..` component.
    #[error("sysctl {0:?} has an empty, \".\" or \"..\" component")]
    BadComponent(String),
}

/// A sysctl read or write failure.
#[derive(Debug, thiserror::Error)]
#[error("failed to {op} sysctl {key}: {source}")]
pub struct SysctlError {
    /// "read" or "write".
    pub op: &'static str,
    /// The key, dotted.
    pub key: SysctlKey,
    /// The cause (`NotFound` when the key does not exist in this namespace).
    #[source]
    pub source: io::Error,
}

impl SysctlError {
    /// True when the key does not exist (no such interface, no IPv6, …).
    pub fn is_not_found(&self) -> bool {
        self.source.kind() == io::ErrorKind::NotFound
    }
}

/// A validated network sysctl key, kept as its path relative to `/proc/sys`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SysctlKey {
    path: String,
}

impl SysctlKey {
    /// Validates and normalises `key` (dotted or slashed form).
    ///
    /// # Errors
    /// [`SysctlKeyError`] naming the key when it is outside `net.` or has a bad component.
    pub fn parse(key: &str) -> Result<SysctlKey, SysctlKeyError> {
        let path = to_path_form(key);
        let components: Vec<&str> = path.split('/').collect();
        if components
            .iter()
            .any(|c| c.is_empty() || *c == "." || *c == "..")
        {
            return Err(SysctlKeyError::BadComponent(key.to_string()));
        }
        if components.first() != Some(&"net") || components.len() < 2 {
            return Err(SysctlKeyError::NotNet(key.to_string()));
        }
        Ok(SysctlKey { path })
    }

    /// The key as a path relative to `/proc/sys` (`net/ipv4/conf/eth0.100/rp_filter`).
    pub fn as_path(&self) -> &str {
        &self.path
    }

    /// The per-interface key `net/<family>/conf/<ifname>/<name>` (`family` is `ipv4`/`ipv6`).
    ///
    /// # Errors
    /// When `ifname` or `name` would make a bad component (`..`, `/`, empty).
    pub fn interface(family: &str, ifname: &str, name: &str) -> Result<SysctlKey, SysctlKeyError> {
        let key = format!("net/{family}/conf/{ifname}/{name}");
        if ifname.contains('/') || name.contains('/') || family.contains('/') {
            return Err(SysctlKeyError::BadComponent(key));
        }
        SysctlKey::parse(&key)
    }
}

impl fmt::Display for SysctlKey {
    /// Dotted form, except that a component containing a dot forces the slashed form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.contains('.') {
            f.write_str(&self.path)
        } else {
            f.write_str(&self.path.replace('/', "."))
        }
    }
}

/// The reference's `toNormalName`: if a `.` comes before any `/`, swap `.` and `/`.
fn to_path_form(key: &str) -> String {
    let first_dot = key.find('.');
    let first_slash = key.find('/');
    let dotted = match (first_dot, first_slash) {
        (Some(d), Some(s)) => d < s,
        (Some(_), None) => true,
        _ => false,
    };
    if dotted {
        key.chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect()
    } else {
        key.to_string()
    }
}

/// Reads and writes sysctls under a root directory (`/proc/sys`, or a tempdir in tests).
#[derive(Debug, Clone)]
pub struct Sysctl {
    root: PathBuf,
}

impl Default for Sysctl {
    fn default() -> Self {
        Sysctl::new(PROC_SYS)
    }
}

impl Sysctl {
    /// A sysctl tree rooted at `root`.
    pub fn new(root: impl AsRef<Path>) -> Self {
        Sysctl {
            root: root.as_ref().to_path_buf(),
        }
    }

    fn file(&self, key: &SysctlKey) -> PathBuf {
        self.root.join(key.as_path())
    }

    /// Reads a value, without the trailing newline.
    ///
    /// # Errors
    /// A [`SysctlError`] (`is_not_found()` when the key does not exist).
    pub fn read(&self, key: &SysctlKey) -> Result<String, SysctlError> {
        std::fs::read_to_string(self.file(key))
            .map(|v| v.trim_end_matches('\n').to_string())
            .map_err(|source| SysctlError {
                op: "read",
                key: key.clone(),
                source,
            })
    }

    /// Writes a value.
    ///
    /// # Errors
    /// A [`SysctlError`]; writing a key that does not exist is never a create.
    pub fn write(&self, key: &SysctlKey, value: &str) -> Result<(), SysctlError> {
        let err = |source| SysctlError {
            op: "write",
            key: key.clone(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(self.file(key))
            .map_err(err)?;
        io::Write::write_all(&mut file, value.as_bytes()).map_err(err)
    }

    /// Writes `value` only when it differs from the current one; returns the previous value.
    ///
    /// # Errors
    /// As [`Sysctl::read`] and [`Sysctl::write`].
    pub fn set(&self, key: &SysctlKey, value: &str) -> Result<String, SysctlError> {
        let old = self.read(key)?;
        if old.trim() != value.trim() {
            log::debug!("sysctl -w {key}={value} (was {old})");
            self.write(key, value)?;
        }
        Ok(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_and_slashed_keys_normalise_to_the_same_path() {
        let cases = [
            ("net.ipv4.ip_forward", "net/ipv4/ip_forward"),
            ("net/ipv4/ip_forward", "net/ipv4/ip_forward"),
            (
                "net/ipv4/conf/eth0.100/rp_filter",
                "net/ipv4/conf/eth0.100/rp_filter",
            ),
            (
                "net.ipv4.conf.eth0/100.rp_filter",
                "net/ipv4/conf/eth0.100/rp_filter",
            ),
            ("net.core.somaxconn", "net/core/somaxconn"),
        ];
        for (key, path) in cases {
            assert_eq!(SysctlKey::parse(key).unwrap().as_path(), path, "{key}");
        }
    }

    #[test]
    fn keys_outside_net_or_with_bad_components_are_rejected() {
        for key in [
            "kernel.hostname",
            "vm/swappiness",
            "net",
            "netx.a",
            "/net/ipv4/ip_forward",
        ] {
            assert!(SysctlKey::parse(key).is_err(), "{key}");
        }
        for key in [
            "net/ipv4/../../kernel/hostname",
            "net.ipv4..ip_forward",
            "net/ipv4//ip_forward",
            "net/./ipv4",
            "net/ipv4/",
        ] {
            assert_eq!(
                SysctlKey::parse(key),
                Err(SysctlKeyError::BadComponent(key.to_string())),
                "{key}"
            );
        }
        assert!(
            SysctlKey::parse("kernel.hostname")
                .unwrap_err()
                .to_string()
                .contains("net.")
        );
    }

    #[test]
    fn interface_keys_accept_dotted_interface_names() {
        let key = SysctlKey::interface("ipv4", "eth0.100", "rp_filter").unwrap();
        assert_eq!(key.as_path(), "net/ipv4/conf/eth0.100/rp_filter");
        assert_eq!(key.to_string(), "net/ipv4/conf/eth0.100/rp_filter");
        let key = SysctlKey::interface("ipv6", "eth0", "disable_ipv6").unwrap();
        assert_eq!(key.to_string(), "net.ipv6.conf.eth0.disable_ipv6");
        assert!(SysctlKey::interface("ipv4", "..", "x").is_err());
        assert!(SysctlKey::interface("ipv4", "a/b", "x").is_err());
    }

    #[test]
    fn read_write_and_set_work_on_a_tree_rooted_anywhere() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("net/ipv4/conf/eth0.100")).unwrap();
        std::fs::write(dir.path().join("net/ipv4/conf/eth0.100/rp_filter"), "1\n").unwrap();
        let sysctl = Sysctl::new(dir.path());
        let key = SysctlKey::parse("net/ipv4/conf/eth0.100/rp_filter").unwrap();
        assert_eq!(sysctl.read(&key).unwrap(), "1");
        assert_eq!(sysctl.set(&key, "2").unwrap(), "1");
        assert_eq!(sysctl.read(&key).unwrap(), "2");
        let missing = SysctlKey::parse("net.ipv4.conf.eth9.rp_filter").unwrap();
        let err = sysctl.read(&missing).unwrap_err();
        assert!(err.is_not_found());
        assert!(
            err.to_string().contains("net.ipv4.conf.eth9.rp_filter"),
            "{err}"
        );
        // Writing never creates a key.
        assert!(sysctl.write(&missing, "1").unwrap_err().is_not_found());
    }

    #[test]
    fn sysctls_of_a_fresh_namespace_are_its_own() {
        let ns = crate::netns::in_new_netns(|| crate::netns::NetNs::current().unwrap()).unwrap();
        let key = SysctlKey::parse("net.ipv4.conf.lo.forwarding").unwrap();
        let host_before = Sysctl::default().read(&key).unwrap();
        let (old, new) = ns
            .run(|| {
                let s = Sysctl::default();
                let old = s.read(&key).unwrap();
                let flipped = if old == "1" { "0" } else { "1" };
                s.set(&key, flipped).unwrap();
                (old, s.read(&key).unwrap())
            })
            .unwrap();
        assert_ne!(old, new);
        assert_eq!(Sysctl::default().read(&key).unwrap(), host_before);
    }
}
