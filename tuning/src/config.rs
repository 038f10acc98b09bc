//! Configuration: the wire keys, their sources and precedence, and validation (pure).
//!
//! Sources, later wins (reference §2.2):
//! - MAC: `mac` < `CNI_ARGS` `MAC` < `runtimeConfig.mac` < `args.cni.mac`;
//! - sysctls: `args.cni.sysctl` entries override same-named `sysctl` entries and add new ones;
//! - `promisc`, `mtu`, `allmulti`, `txQLen`: an `args.cni` value replaces the config's (so
//!   `args.cni.mtu: 0` cancels an MTU change).

use std::path::PathBuf;

use cni::args::CniArgs;
use cni::conf::NetConf;
use host::sysctl::SysctlKey;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{SysctlProblem, TuningError};
use crate::names::{ALLOWLIST_PATH, DEFAULT_DATA_DIR, IFNAME_PLACEHOLDER};

/// The smallest MTU accepted (IPv4's minimum, and the kernel's Ethernet minimum).
pub const MIN_MTU: i64 = 68;
/// The largest MTU accepted (`ETH_MAX_MTU`, and the largest IP packet).
pub const MAX_MTU: i64 = 65535;

/// The plugin's own keys, as they come on stdin: the reference's `TuningConf` (its serde name
/// is the Go type, which Go's decode errors name), `runtimeConfig` and `args` included, so
/// that a value of the wrong type anywhere is refused as Go refuses it, the first in the
/// document.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", rename = "TuningConf")]
pub struct TuningKeys {
    /// `sysctl`: key → value, in document order (Go's map: a later null resets it).
    #[serde(deserialize_with = "cni::decode::nullable")]
    pub sysctl: Option<SysctlMap>,
    /// `mac`.
    pub mac: Option<String>,
    /// `promisc`.
    pub promisc: Option<bool>,
    /// `mtu` (0: unchanged).
    pub mtu: Option<i64>,
    /// `allmulti` (a Go pointer).
    #[serde(deserialize_with = "cni::decode::nullable")]
    pub allmulti: Option<bool>,
    /// `txQLen` (a Go pointer).
    #[serde(rename = "txQLen", deserialize_with = "cni::decode::nullable")]
    pub tx_qlen: Option<i64>,
    /// `dataDir`.
    pub data_dir: Option<PathBuf>,
    /// `runtimeConfig`.
    runtime_config: RuntimeKeys,
    /// `args` (a Go pointer).
    #[serde(deserialize_with = "cni::decode::nullable")]
    args: Option<ArgsKeys>,
}

/// The keys DEL, STATUS and GC need: only where the backups are. DEL decodes nothing else, so a
/// config that no longer validates (a changed allowlist, a typo) never blocks a DEL.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", rename = "TuningConf")]
pub struct DataDirKeys {
    /// `dataDir`.
    pub data_dir: Option<PathBuf>,
}

impl DataDirKeys {
    /// The data dir, defaulted.
    pub fn dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(
    default,
    rename = "struct { Mac string \"json:\\\"mac,omitempty\\\"\" }"
)]
struct RuntimeKeys {
    mac: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename = "struct { A *main.IPAMArgs \"json:\\\"cni\\\"\" }")]
struct ArgsKeys {
    #[serde(deserialize_with = "cni::decode::nullable")]
    cni: Option<ArgsCni>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase", rename = "main.IPAMArgs")]
struct ArgsCni {
    // All Go pointers.
    #[serde(deserialize_with = "cni::decode::nullable")]
    sysctl: Option<SysctlMap>,
    #[serde(deserialize_with = "cni::decode::nullable")]
    mac: Option<String>,
    #[serde(deserialize_with = "cni::decode::nullable")]
    promisc: Option<bool>,
    #[serde(deserialize_with = "cni::decode::nullable")]
    mtu: Option<i64>,
    #[serde(deserialize_with = "cni::decode::nullable")]
    allmulti: Option<bool>,
    #[serde(rename = "txQLen", deserialize_with = "cni::decode::nullable")]
    tx_qlen: Option<i64>,
}

/// A `sysctl` object, Go's `map[string]string`: its entries in document order, a later
/// duplicate replacing the earlier's value in its place.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SysctlMap(Vec<(String, String)>);

impl SysctlMap {
    /// The entries.
    pub fn entries(&self) -> &[(String, String)] {
        &self.0
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de> Deserialize<'de> for SysctlMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SysctlMap, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = SysctlMap;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of strings")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SysctlMap, A::Error> {
                let mut entries: Vec<(String, String)> = Vec::new();
                let mut at: std::collections::HashMap<String, usize> =
                    std::collections::HashMap::new();
                while let Some((key, value)) = map.next_entry::<String, String>()? {
                    match at.get(&key) {
                        Some(&i) => {
                            if let Some(entry) = entries.get_mut(i) {
                                entry.1 = value;
                            }
                        }
                        None => {
                            at.insert(key.clone(), entries.len());
                            entries.push((key, value));
                        }
                    }
                }
                Ok(SysctlMap(entries))
            }
        }
        d.deserialize_map(Entries)
    }
}

/// One sysctl to set, resolved for this interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlSetting {
    /// Where it came from: `sysctl` or `args.cni.sysctl`.
    pub origin: &'static str,
    /// The key as written (dots, slashes, `IFNAME`), which the allowlist is matched against.
    pub raw: String,
    /// The key with `IFNAME` replaced, as a path under `/proc/sys`.
    pub key: SysctlKey,
    /// The value, written verbatim.
    pub value: String,
}

/// The MAC address to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacSetting {
    /// Where it came from (`mac`, `CNI_ARGS MAC`, `runtimeConfig.mac`, `args.cni.mac`).
    pub origin: &'static str,
    /// The address as given; the result carries it verbatim, as the reference's does.
    pub text: String,
    /// The address bytes.
    pub bytes: Vec<u8>,
}

/// A validated configuration: what ADD changes and CHECK verifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where backup files live.
    pub data_dir: PathBuf,
    /// Sysctls in document order (`sysctl` first, then keys only `args.cni.sysctl` has).
    pub sysctls: Vec<SysctlSetting>,
    /// New hardware address.
    pub mac: Option<MacSetting>,
    /// New MTU.
    pub mtu: Option<u32>,
    /// Turn promiscuous mode on. `false` changes nothing, as in the reference.
    pub promisc: bool,
    /// All-multicast on or off.
    pub allmulti: Option<bool>,
    /// New transmit queue length.
    pub txqlen: Option<u32>,
}

impl Config {
    /// True when ADD changes a link attribute.
    pub fn changes_link(&self) -> bool {
        self.mac.is_some()
            || self.mtu.is_some()
            || self.promisc
            || self.allmulti.is_some()
            || self.txqlen.is_some()
    }

    /// True when ADD changes nothing at all.
    pub fn is_empty(&self) -> bool {
        self.sysctls.is_empty() && !self.changes_link()
    }

    /// Builds and validates the configuration of one call.
    ///
    /// # Errors
    /// [`TuningError::Args`] for bad `CNI_ARGS`, and the validation variants (code 7) naming
    /// the key and value (a key of the wrong type does not decode: [`crate::Tuning`]'s
    /// `failed to load netconf: …`).
    pub fn load(
        conf: &NetConf<TuningKeys>,
        cni_args: &CniArgs,
        ifname: &str,
    ) -> Result<Config, TuningError> {
        cni_args.check_known(&[])?;
        let keys = &conf.plugin;
        let no_args = ArgsCni::default();
        let args = keys
            .args
            .as_ref()
            .and_then(|a| a.cni.as_ref())
            .unwrap_or(&no_args);

        let sysctls = merge_sysctls(keys.sysctl.as_ref(), args.sysctl.as_ref(), ifname)?;

        let mut mac = keys.mac.clone().map(|m| ("mac", m));
        if let Some(m) = cni_args.mac() {
            mac = Some(("CNI_ARGS MAC", m.to_string()));
        }
        if let Some(m) = &keys.runtime_config.mac {
            mac = Some(("runtimeConfig.mac", m.clone()));
        }
        if let Some(m) = &args.mac {
            mac = Some(("args.cni.mac", m.clone()));
        }
        let mac = mac
            .map(|(origin, text)| match parse_mac(&text) {
                Some(bytes) => Ok(MacSetting {
                    origin,
                    text,
                    bytes,
                }),
                None => Err(TuningError::InvalidMac { origin, text }),
            })
            .transpose()?;

        let (mtu_key, mtu) = pick("mtu", keys.mtu, args.mtu);
        let mtu = match mtu {
            None | Some(0) => None,
            Some(m) if (MIN_MTU..=MAX_MTU).contains(&m) => u32::try_from(m).ok(),
            Some(m) => {
                return Err(TuningError::InvalidMtu {
                    key: mtu_key,
                    value: m.to_string(),
                    reason: format!(
                        "must be between {MIN_MTU} and {MAX_MTU} (0 leaves it unchanged)"
                    ),
                });
            }
        };
        let (txq_key, txqlen) = pick("txQLen", keys.tx_qlen, args.tx_qlen);
        let txqlen = txqlen
            .map(|q| {
                u32::try_from(q).map_err(|_| TuningError::InvalidValue {
                    key: txq_key.clone(),
                    value: q.to_string(),
                    reason: format!("must be between 0 and {}", u32::MAX),
                })
            })
            .transpose()?;

        Ok(Config {
            data_dir: keys
                .data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            sysctls,
            mac,
            mtu,
            promisc: pick("promisc", keys.promisc, args.promisc).1 == Some(true),
            allmulti: pick("allmulti", keys.allmulti, args.allmulti).1,
            txqlen,
        })
    }
}

/// The first key the top-level `sysctl` object names twice, as the reference refuses them
/// before anything else on ADD and CHECK (`duplicated sysctl keys are not allowed`). Keys compare
/// byte for byte after JSON unescaping, as Go's do; only the top-level object counts (every
/// top-level key naming the field, matched as Go matches it, into one set, as Go decodes them
/// all into one map), never `args.cni.sysctl`.
///
/// `raw` is the configuration's text: a decoded configuration has merged duplicates already
/// (the later one wins, Go's rule for every other key). The scan reads the top level's keys
/// and skips every other value without building it and without recursion (nesting has no
/// limit here), so it costs one pass over the text and a set of that one object's keys. Text
/// that is not a JSON object (which the skel has refused already) finds nothing.
pub fn duplicate_sysctl_key(raw: &[u8]) -> Option<String> {
    let mut scan = Scan { text: raw, at: 0 };
    scan.expect(b'{')?;
    let mut seen = std::collections::HashSet::new();
    loop {
        match scan.next_token()? {
            b'}' => return None,
            b',' => scan.at += 1,
            b'"' => {
                let key = scan.string()?;
                scan.expect(b':')?;
                if names_sysctl(key) && scan.next_token()? == b'{' {
                    if let Some(dup) = scan.object_keys(&mut seen)? {
                        return Some(dup);
                    }
                } else {
                    scan.skip_value()?;
                }
            }
            _ => return None,
        }
    }
}

/// A cursor over JSON text the skel has checked already; every step returns `None` at the
/// end of the text.
struct Scan<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    /// The next byte that is not whitespace, not consumed.
    fn next_token(&mut self) -> Option<u8> {
        while let Some(&b) = self.text.get(self.at) {
            if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(b);
            }
            self.at += 1;
        }
        None
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next_token()? == byte).then(|| self.at += 1)
    }

    /// The string at the cursor (which is on its opening quote), quotes included, consumed.
    fn string(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        self.at += 1;
        loop {
            match *self.text.get(self.at)? {
                b'"' => {
                    self.at += 1;
                    return self.text.get(start..self.at);
                }
                b'\\' => self.at += 2,
                _ => self.at += 1,
            }
        }
    }

    /// Skips the value at the cursor, counting brackets instead of recursing.
    fn skip_value(&mut self) -> Option<()> {
        match self.next_token()? {
            b'"' => self.string().map(drop),
            b'{' | b'[' => {
                let mut depth = 0_usize;
                loop {
                    match *self.text.get(self.at)? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.at += 1;
                }
            }
            _ => {
                while !matches!(
                    *self.text.get(self.at)?,
                    b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'
                ) {
                    self.at += 1;
                }
                Some(())
            }
        }
    }

    /// The keys of the object at the cursor into `seen`; the first one already there.
    fn object_keys(
        &mut self,
        seen: &mut std::collections::HashSet<String>,
    ) -> Option<Option<String>> {
        self.expect(b'{')?;
        loop {
            match self.next_token()? {
                b'}' => {
                    self.at += 1;
                    return Some(None);
                }
                b',' => self.at += 1,
                b'"' => {
                    let key = unescape(self.string()?);
                    self.expect(b':')?;
                    self.skip_value()?;
                    if let Some(dup) = seen.replace(key) {
                        return Some(Some(dup));
                    }
                }
                _ => return None,
            }
        }
    }
}

/// A JSON string (quotes included) as text; what does not decode (a lone surrogate) is taken
/// as its bytes, lossily.
fn unescape(quoted: &[u8]) -> String {
    if !quoted.contains(&b'\\') {
        let inner = quoted
            .get(1..quoted.len().saturating_sub(1))
            .unwrap_or_default();
        return String::from_utf8_lossy(inner).into_owned();
    }
    serde_json::from_slice(quoted).unwrap_or_else(|_| String::from_utf8_lossy(quoted).into_owned())
}

/// Whether a top-level key names the `sysctl` field, as Go matches keys to fields: ASCII case
/// folded, `ſ` (U+017F) for `s` and `K` (U+212A) for `k`.
fn names_sysctl(quoted: &[u8]) -> bool {
    let inner = quoted
        .get(1..quoted.len().saturating_sub(1))
        .unwrap_or_default();
    if !quoted.contains(&b'\\') && inner.is_ascii() {
        return inner.eq_ignore_ascii_case(b"sysctl");
    }
    let fold = |c: char| match c {
        '\u{17f}' => 's',
        '\u{212a}' => 'k',
        c => c.to_ascii_lowercase(),
    };
    unescape(quoted).chars().map(fold).eq("sysctl".chars())
}

/// The `args.cni` value when there is one, else the config's, with the key it came from.
fn pick<T>(key: &'static str, conf: Option<T>, args: Option<T>) -> (String, Option<T>) {
    match args {
        Some(v) => (format!("args.cni.{key}"), Some(v)),
        None => (key.to_string(), conf),
    }
}

fn merge_sysctls(
    base: Option<&SysctlMap>,
    overrides: Option<&SysctlMap>,
    ifname: &str,
) -> Result<Vec<SysctlSetting>, TuningError> {
    let (base, overrides) = match (base, overrides) {
        (None, Some(o)) if !o.is_empty() => {
            let object: Map<String, Value> = o
                .entries()
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            return Err(TuningError::ArgsSysctlWithoutSysctl {
                value: Value::Object(object).to_string(),
            });
        }
        (b, o) => (
            b.map(|m| m.entries().to_vec()).unwrap_or_default(),
            o.map(|m| m.entries().to_vec()).unwrap_or_default(),
        ),
    };
    let mut merged: Vec<(&'static str, String, String)> =
        base.into_iter().map(|(k, v)| ("sysctl", k, v)).collect();
    for (k, v) in overrides {
        match merged.iter_mut().find(|(_, key, _)| *key == k) {
            Some(entry) => *entry = ("args.cni.sysctl", k, v),
            None => merged.push(("args.cni.sysctl", k, v)),
        }
    }
    merged
        .into_iter()
        .map(|(origin, raw, value)| {
            let key = resolve_sysctl(&raw, ifname).map_err(|why| TuningError::InvalidSysctl {
                origin,
                key: raw.clone(),
                value: value.clone(),
                problem: match reference_refusal(&raw, ifname) {
                    Some(converted) => SysctlProblem::NotNet { converted },
                    None => SysctlProblem::BadComponent(why),
                },
            })?;
            Ok(SysctlSetting {
                origin,
                raw,
                key,
                value,
            })
        })
        .collect()
}

/// Resolves a sysctl key as the reference does: dotted keys become paths, then the first
/// `IFNAME` becomes the interface name (so interface names with dots work through the
/// placeholder, and in the slashed form). The result must stay under `net/` with no empty,
/// `.` or `..` component.
///
/// # Errors
/// Why the key is refused.
pub fn resolve_sysctl(raw: &str, ifname: &str) -> Result<SysctlKey, String> {
    let reason = |e: host::sysctl::SysctlKeyError| match e {
        host::sysctl::SysctlKeyError::NotNet(_) => {
            "only network sysctls (net.*) can be set".to_string()
        }
        host::sysctl::SysctlKeyError::BadComponent(_) => {
            "it has an empty, \".\" or \"..\" component".to_string()
        }
    };
    let path = SysctlKey::parse(raw).map_err(reason)?;
    let path = path.as_path().replacen(IFNAME_PLACEHOLDER, ifname, 1);
    // The path now has a slash before any dot, so parsing it again keeps it as it is.
    SysctlKey::parse(&path).map_err(reason)
}

/// The key as the reference converts it (every `.` to `/`, then the first `IFNAME` to the
/// interface name), when the reference refuses it as `invalid net sysctl key`: once joined
/// under `/proc/sys` and cleaned (`..` applied, empty and `.` components dropped), it is not
/// under `/proc/sys/net/`.
pub fn reference_refusal(raw: &str, ifname: &str) -> Option<String> {
    let converted = raw
        .replace('.', "/")
        .replacen(IFNAME_PLACEHOLDER, ifname, 1);
    let mut parts: Vec<&str> = vec!["proc", "sys"];
    for part in converted.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let under_net = parts.len() > 3 && parts[..3] == ["proc", "sys", "net"];
    (!under_net).then_some(converted)
}

/// Parses a hardware address as Go's `net.ParseMAC` does: 6, 8 or 20 octets written as
/// `aa:bb:…` or `aa-bb-…`, or as dot-separated groups of four hex digits (`aabb.ccdd.eeff`).
pub fn parse_mac(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let hex = |pair: &[u8]| -> Option<u8> {
        let text = std::str::from_utf8(pair).ok()?;
        if text.len() != 2 || !text.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        u8::from_str_radix(text, 16).ok()
    };
    let valid_len = |n: usize| matches!(n, 6 | 8 | 20);
    if b.len() < 14 {
        return None;
    }
    if b[2] == b':' || b[2] == b'-' {
        let sep = b[2];
        if !(b.len() + 1).is_multiple_of(3) || !valid_len((b.len() + 1) / 3) {
            return None;
        }
        b.chunks(3)
            .map(|chunk| match chunk {
                [h, l, s] if *s == sep => hex(&[*h, *l]),
                [h, l] => hex(&[*h, *l]),
                _ => None,
            })
            .collect()
    } else if b[4] == b'.' {
        if !(b.len() + 1).is_multiple_of(5) || !valid_len(2 * (b.len() + 1) / 5) {
            return None;
        }
        let mut out = Vec::new();
        for chunk in b.chunks(5) {
            let digits = match chunk {
                [a, b2, c, d, b'.'] | [a, b2, c, d] => [*a, *b2, *c, *d],
                _ => return None,
            };
            out.push(hex(&digits[..2])?);
            out.push(hex(&digits[2..])?);
        }
        Some(out)
    } else {
        None
    }
}

/// The operator's sysctl allowlist: one regular expression per line, each matched against the
/// **whole** key as written in the config (dots, slashes and `IFNAME` included). The reference
/// matches unanchored, so `net.ipv4.ip_forward` there also allows `xnet.ipv4.ip_forwardy`.
#[derive(Debug, Clone)]
pub struct Allowlist {
    file: PathBuf,
    patterns: Vec<(String, regex_lite::Regex)>,
}

impl Allowlist {
    /// Reads the allowlist at [`ALLOWLIST_PATH`]; `None` when it does not exist.
    ///
    /// # Errors
    /// When it exists but cannot be read or has an invalid pattern.
    pub fn load() -> Result<Option<Allowlist>, TuningError> {
        Allowlist::load_from(ALLOWLIST_PATH.into())
    }

    /// Reads an allowlist file; `None` when it does not exist.
    ///
    /// # Errors
    /// As [`Allowlist::load`].
    pub fn load_from(file: PathBuf) -> Result<Option<Allowlist>, TuningError> {
        match std::fs::read_to_string(&file) {
            Ok(text) => Allowlist::parse(file, &text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(TuningError::AllowlistRead { file, source }),
        }
    }

    /// Parses allowlist text: lines trimmed, empty lines skipped.
    ///
    /// # Errors
    /// [`TuningError::AllowlistPattern`] naming the line that is not a regular expression.
    pub fn parse(file: PathBuf, text: &str) -> Result<Allowlist, TuningError> {
        let mut patterns = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            match regex_lite::Regex::new(&format!("^(?:{line})$")) {
                Ok(re) => patterns.push((line.to_string(), re)),
                Err(source) => {
                    return Err(TuningError::AllowlistPattern {
                        file,
                        line: i + 1,
                        pattern: line.to_string(),
                        source,
                    });
                }
            }
        }
        Ok(Allowlist { file, patterns })
    }

    /// Fails on the first sysctl of `config` that no line matches.
    ///
    /// # Errors
    /// [`TuningError::SysctlNotAllowed`] naming the key and value.
    pub fn check(&self, config: &Config) -> Result<(), TuningError> {
        for s in &config.sysctls {
            if !self.patterns.iter().any(|(_, re)| re.is_match(&s.raw)) {
                return Err(TuningError::SysctlNotAllowed {
                    origin: s.origin,
                    key: s.raw.clone(),
                    value: s.value.clone(),
                    file: self.file.clone(),
                    allowed: self.patterns.iter().map(|(p, _)| p.clone()).collect(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni::error::{CniError, ErrorCode};
    use serde_json::json;

    fn load(conf: Value, args: &str, ifname: &str) -> Result<Config, TuningError> {
        let mut conf = conf;
        conf["cniVersion"] = json!("1.0.0");
        conf["name"] = json!("net");
        let conf: NetConf<TuningKeys> = NetConf::from_value(conf).unwrap();
        Config::load(&conf, &CniArgs::parse(args).unwrap(), ifname)
    }

    fn code(err: TuningError) -> ErrorCode {
        CniError::from(err).code
    }

    #[test]
    fn duplicate_keys_of_the_top_level_sysctl_object_are_found_byte_for_byte() {
        let cases: [(&str, Option<&str>); 12] = [
            (r#"{"sysctl": {"a": "1", "b": "1", "a": "2"}}"#, Some("a")),
            // Exact bytes: case and dots versus slashes make different keys.
            (r#"{"sysctl": {"a": "1", "A": "2"}}"#, None),
            (r#"{"sysctl": {"net.x": "1", "net/x": "2"}}"#, None),
            // After JSON unescaping, as Go compares them.
            (r#"{"sysctl": {"a\u0062": "1", "ab": "2"}}"#, Some("ab")),
            // Every top-level key naming the field feeds one set, as Go decodes them all.
            (r#"{"SysCtl": {"a": "1"}, "sysctl": {"a": "2"}}"#, Some("a")),
            (r#"{"sysctl": {"a": "1"}, "sysctl": {"b": "2"}}"#, None),
            // Only the top-level object.
            (
                r#"{"args": {"cni": {"sysctl": {"a": "1", "a": "2"}}}}"#,
                None,
            ),
            (r#"{"x": {"sysctl": {"a": "1", "a": "2"}}}"#, None),
            // Not this check's business: left to the decoder.
            (r#"{"sysctl": null}"#, None),
            (r#"{"sysctl": [1, 1]}"#, None),
            (r#"{"sysctl": {"a": 1, "a": {"deep": [1]}}"#, Some("a")),
            ("not json", None),
        ];
        let more: [(&str, Option<&str>); 6] = [
            // Values of every kind are skipped, brackets and quotes inside strings too.
            (
                r#" { "x" : "}{\"[" , "n": -1.5e3, "t": true, "sysctl" : { "a" : "]" , "a":"2" } } "#,
                Some("a"),
            ),
            // Go's folding of field names: the long s and the Kelvin sign.
            (
                "{\"\u{17f}ysctl\": {\"a\": \"1\", \"a\": \"2\"}}",
                Some("a"),
            ),
            (r#"{"sy\u0073ctl": {"a": "1", "a": "2"}}"#, Some("a")),
            (r#"{"sysctls": {"a": "1", "a": "2"}}"#, None),
            // Escaped keys compare unescaped; a key that does not decode, lossily.
            (
                r#"{"sysctl": {"\ud800": "1", "\ud800": "2"}}"#,
                Some("\"\\ud800\""),
            ),
            (
                "{\"sysctl\": {\"\u{e9}\": \"1\", \"e\u{301}\": \"2\"}}",
                None,
            ),
        ];
        for (text, want) in cases.into_iter().chain(more) {
            assert_eq!(
                duplicate_sysctl_key(text.as_bytes()).as_deref(),
                want,
                "{text}"
            );
        }
        // Nesting as deep as Go accepts (10 000 levels) before the key is skipped, not
        // recursed into.
        let deep = format!(
            r#"{{"x": {}1{}, "sysctl": {{"k": "1", "k": "2"}}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert_eq!(duplicate_sysctl_key(deep.as_bytes()).as_deref(), Some("k"));
        // Other keys of any size are skipped, not built.
        let big = format!(
            r#"{{"unknown": [{}0], "sysctl": {{"k": "1", "k": "1"}}}}"#,
            "0,".repeat(200_000)
        );
        assert_eq!(duplicate_sysctl_key(big.as_bytes()).as_deref(), Some("k"));
    }

    #[test]
    fn a_duplicate_key_is_code_7_with_the_references_message_and_names_the_key() {
        let err = CniError::from(TuningError::DuplicateSysctlKey {
            key: "net.ipv4.ip_forward".into(),
        });
        assert_eq!(err.code, ErrorCode::InvalidConfig);
        assert_eq!(err.msg, "duplicated sysctl keys are not allowed");
        assert!(
            err.details.contains("\"net.ipv4.ip_forward\""),
            "{}",
            err.details
        );
    }

    #[test]
    fn every_key_is_read_with_its_default() {
        let c = load(json!({}), "", "eth0").unwrap();
        assert!(c.is_empty());
        assert_eq!(c.data_dir, PathBuf::from("/run/cni/tuning"));
        let c = load(
            json!({"mac": "02:00:00:00:00:01", "mtu": 1400, "promisc": true, "allmulti": false,
                   "txQLen": 0, "dataDir": "/tmp/x", "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2"}}),
            "",
            "eth0",
        )
        .unwrap();
        assert_eq!(c.mac.as_ref().unwrap().bytes, [2, 0, 0, 0, 0, 1]);
        assert_eq!(c.mtu, Some(1400));
        assert!(c.promisc);
        assert_eq!(c.allmulti, Some(false));
        assert_eq!(c.txqlen, Some(0));
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.sysctls[0].key.as_path(), "net/ipv4/conf/eth0/rp_filter");
        assert!(c.changes_link());
    }

    #[test]
    fn keys_match_case_insensitively_as_go_does() {
        let c = load(
            json!({"MAC": "02:00:00:00:00:01", "MTU": 1400, "TxQLen": 5, "RuntimeConfig": {"Mac": "02:00:00:00:00:09"}}),
            "",
            "eth0",
        )
        .unwrap();
        assert_eq!(c.mac.unwrap().origin, "runtimeConfig.mac");
        assert_eq!((c.mtu, c.txqlen), (Some(1400), Some(5)));
    }

    #[test]
    fn mac_precedence_is_config_then_cni_args_then_runtime_config_then_args() {
        let m1 = "02:00:00:00:00:01";
        let m2 = "02:00:00:00:00:02";
        let m3 = "02:00:00:00:00:03";
        let m4 = "02:00:00:00:00:04";
        let cases = [
            (json!({"mac": m1}), "", m1),
            (
                json!({"mac": m1}),
                "IgnoreUnknown=1;MAC=02:00:00:00:00:02",
                m2,
            ),
            (
                json!({"mac": m1, "runtimeConfig": {"mac": m3}}),
                "MAC=02:00:00:00:00:02",
                m3,
            ),
            (
                json!({"mac": m1, "runtimeConfig": {"mac": m3}, "args": {"cni": {"mac": m4}}}),
                "MAC=02:00:00:00:00:02",
                m4,
            ),
            (json!({}), "MAC=02:00:00:00:00:02", m2),
        ];
        for (conf, args, want) in cases {
            let c = load(conf.clone(), args, "eth0").unwrap();
            assert_eq!(c.mac.unwrap().text, want, "{conf} {args}");
        }
    }

    #[test]
    fn args_cni_replaces_attributes_and_merges_sysctls() {
        let c = load(
            json!({"mtu": 1400, "promisc": true, "allmulti": true, "txQLen": 10,
                   "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2", "net.ipv4.conf.IFNAME.arp_ignore": "1"},
                   "args": {"cni": {"mtu": 0, "promisc": false, "allmulti": false, "txQLen": 20,
                                    "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "2", "net.ipv4.ip_forward": "1"}}}}),
            "",
            "eth0",
        )
        .unwrap();
        assert_eq!(c.mtu, None, "args.cni.mtu 0 cancels the MTU change");
        assert!(!c.promisc);
        assert_eq!(c.allmulti, Some(false));
        assert_eq!(c.txqlen, Some(20));
        let got: Vec<(&str, &str, &str)> = c
            .sysctls
            .iter()
            .map(|s| (s.origin, s.raw.as_str(), s.value.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("sysctl", "net.ipv4.conf.IFNAME.rp_filter", "2"),
                ("args.cni.sysctl", "net.ipv4.conf.IFNAME.arp_ignore", "2"),
                ("args.cni.sysctl", "net.ipv4.ip_forward", "1"),
            ]
        );
    }

    #[test]
    fn args_sysctl_without_a_top_level_sysctl_is_code_7() {
        let err = load(
            json!({"args": {"cni": {"sysctl": {"net.ipv4.ip_forward": "1"}}}}),
            "",
            "eth0",
        )
        .unwrap_err();
        assert!(matches!(err, TuningError::ArgsSysctlWithoutSysctl { .. }));
        assert!(err.to_string().contains("net.ipv4.ip_forward"), "{err}");
        assert_eq!(code(err), ErrorCode::InvalidConfig);
        // An empty top-level object is a base to merge into.
        let c = load(
            json!({"sysctl": {}, "args": {"cni": {"sysctl": {"net.ipv4.ip_forward": "1"}}}}),
            "",
            "eth0",
        )
        .unwrap();
        assert_eq!(c.sysctls.len(), 1);
    }

    #[test]
    fn sysctl_keys_resolve_dots_slashes_and_the_ifname_placeholder() {
        let cases = [
            (
                "net.ipv4.conf.IFNAME.rp_filter",
                "eth0",
                "net/ipv4/conf/eth0/rp_filter",
            ),
            (
                "net.ipv4.conf.IFNAME.rp_filter",
                "eth0.100",
                "net/ipv4/conf/eth0.100/rp_filter",
            ),
            (
                "net/ipv4/conf/IFNAME/rp_filter",
                "eth0.100",
                "net/ipv4/conf/eth0.100/rp_filter",
            ),
            (
                "net/ipv4/conf/eth0.100/rp_filter",
                "eth0",
                "net/ipv4/conf/eth0.100/rp_filter",
            ),
            (
                "net.ipv6.conf.IFNAME.IFNAME",
                "v.1",
                "net/ipv6/conf/v.1/IFNAME",
            ),
            ("net.core.somaxconn", "eth0", "net/core/somaxconn"),
        ];
        for (raw, ifname, want) in cases {
            assert_eq!(
                resolve_sysctl(raw, ifname).unwrap().as_path(),
                want,
                "{raw}"
            );
        }
    }

    #[test]
    fn sysctls_outside_net_or_with_dot_dot_are_code_7_naming_key_and_value() {
        // (key, the reference's message when it refuses the key too)
        let cases = [
            (
                "kernel.panic",
                Some(r#"invalid net sysctl key: "kernel/panic""#),
            ),
            ("net", Some(r#"invalid net sysctl key: "net""#)),
            (
                "/kernel/panic",
                Some(r#"invalid net sysctl key: "/kernel/panic""#),
            ),
            // The reference turns these into paths under net/ (every dot a slash, so `..` too)
            // and fails only when it opens them: ours alone.
            ("net/ipv4/../../kernel/panic", None),
            ("net.ipv4..conf", None),
            ("/net/ipv4/ip_forward", None),
            (
                "vm/../net/ipv4/ip_forward",
                Some(r#"invalid net sysctl key: "vm////net/ipv4/ip_forward""#),
            ),
        ];
        for (key, reference) in cases {
            let err = load(json!({"sysctl": {key: "7"}}), "", "eth0").unwrap_err();
            let text = err.to_string();
            assert!(text.contains(&format!("{key:?}")), "{text}");
            assert!(text.contains("\"7\""), "{text}");
            let cni = CniError::from(err);
            assert_eq!(cni.code, ErrorCode::InvalidConfig, "{key}");
            match reference {
                Some(msg) => {
                    assert_eq!(cni.msg, msg);
                    assert_eq!(cni.details, text);
                }
                None => assert_eq!(cni.msg, text),
            }
        }
        assert_eq!(
            reference_refusal("net.ipv4.conf.IFNAME.rp_filter", "eth0"),
            None
        );
        // The conversion replaces every dot, then the first IFNAME.
        assert_eq!(
            reference_refusal("vm.IFNAME.x", "eth0.100").as_deref(),
            Some("vm/eth0.100/x")
        );
    }

    /// Go's texts, as Debian's tuning (Go 1.19) prints them after `failed to load netconf: `.
    #[test]
    fn values_of_the_wrong_type_are_refused_in_go_s_words() {
        let cases = [
            (
                json!({"sysctl": {"net.ipv4.ip_forward": 1}}),
                "number into Go struct field TuningConf.sysctl of type string",
            ),
            (
                json!({"sysctl": []}),
                "array into Go struct field TuningConf.sysctl of type map[string]string",
            ),
            (
                json!({"mtu": 1.5}),
                "number 1.5 into Go struct field TuningConf.mtu of type int",
            ),
            (
                json!({"mac": true}),
                "bool into Go struct field TuningConf.mac of type string",
            ),
            (
                json!({"runtimeConfig": {"mac": 5}}),
                "number into Go struct field .runtimeConfig.mac of type string",
            ),
            (
                json!({"runtimeConfig": 5}),
                r#"number into Go struct field TuningConf.runtimeConfig of type struct { Mac string "json:\"mac,omitempty\"" }"#,
            ),
            (
                json!({"args": 5}),
                r#"number into Go struct field TuningConf.args of type struct { A *main.IPAMArgs "json:\"cni\"" }"#,
            ),
            (
                json!({"args": {"cni": 5}}),
                "number into Go struct field .args.cni of type main.IPAMArgs",
            ),
            (
                json!({"args": {"cni": {"mtu": "x"}}}),
                "string into Go struct field IPAMArgs.args.cni.mtu of type int",
            ),
            (
                json!({"args": {"cni": {"sysctl": {"a": 1}}}}),
                "number into Go struct field IPAMArgs.args.cni.sysctl of type string",
            ),
            // The first in the document, as Go decodes them all.
            (
                json!({"mtu": 5, "promisc": "x", "txQLen": "y"}),
                "string into Go struct field TuningConf.promisc of type bool",
            ),
        ];
        for (conf, go) in cases {
            let mut conf = conf;
            conf["cniVersion"] = json!("1.0.0");
            conf["name"] = json!("net");
            let err = NetConf::<TuningKeys>::from_value(conf.clone()).unwrap_err();
            assert_eq!(err.code, ErrorCode::Decode, "{conf}");
            assert_eq!(
                err.msg,
                format!("{}: json: cannot unmarshal {go}", cni::error::DECODE_LEAD),
                "{conf}"
            );
        }
    }

    #[test]
    fn sysctl_objects_keep_document_order_and_a_later_duplicate_s_value() {
        let conf: NetConf<TuningKeys> = NetConf::parse(
            br#"{"name": "net", "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "1",
                "net.ipv4.ip_forward": "1", "net.ipv4.conf.IFNAME.rp_filter": "2"}}"#,
        )
        .unwrap();
        let c = Config::load(&conf, &CniArgs::parse("").unwrap(), "eth0").unwrap();
        let got: Vec<(&str, &str)> = c
            .sysctls
            .iter()
            .map(|s| (s.raw.as_str(), s.value.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("net.ipv4.conf.IFNAME.rp_filter", "2"),
                ("net.ipv4.ip_forward", "1")
            ]
        );
    }

    #[test]
    fn bad_macs_mtus_and_queue_lengths_are_code_7_with_the_references_message() {
        let mac_msg =
            |m: &str| format!("invalid args {m} for MAC addr: address {m}: invalid MAC address");
        // (config, CNI_ARGS, msg: the reference's where it refuses the value too, details)
        let cases = [
            (
                json!({"mac": "zz:00:00:00:00:01"}),
                "",
                mac_msg("zz:00:00:00:00:01"),
                "mac \"zz:00:00:00:00:01\" is not a MAC address",
            ),
            (
                json!({"mac": "02:00:00:00:00"}),
                "",
                mac_msg("02:00:00:00:00"),
                "mac \"02:00:00:00:00\"",
            ),
            (
                json!({"args": {"cni": {"mac": "x"}}}),
                "",
                mac_msg("x"),
                "args.cni.mac \"x\"",
            ),
            (
                json!({}),
                "MAC=02:00",
                mac_msg("02:00"),
                "CNI_ARGS MAC \"02:00\"",
            ),
            (
                json!({"runtimeConfig": {"mac": "nope"}}),
                "",
                mac_msg("nope"),
                "runtimeConfig.mac \"nope\"",
            ),
            // The reference passes MTUs on; the kernel refuses them with EINVAL.
            (
                json!({"mtu": -1}),
                "",
                "invalid argument".into(),
                "invalid mtu -1: must be between 68 and 65535",
            ),
            (
                json!({"mtu": 67}),
                "",
                "invalid argument".into(),
                "invalid mtu 67",
            ),
            (
                json!({"mtu": 65536}),
                "",
                "invalid argument".into(),
                "invalid mtu 65536",
            ),
            (
                json!({"args": {"cni": {"mtu": 100000}}}),
                "",
                "invalid argument".into(),
                "invalid args.cni.mtu 100000",
            ),
            // The reference takes any integer as a queue length (the kernel, a u32): ours alone.
            (
                json!({"txQLen": -1}),
                "",
                "invalid txQLen -1: must be between 0 and 4294967295".into(),
                "",
            ),
            (
                json!({"txQLen": 4294967296_i64}),
                "",
                "invalid txQLen 4294967296: must be between 0 and 4294967295".into(),
                "",
            ),
            (
                json!({"args": {"cni": {"txQLen": -5}}}),
                "",
                "invalid args.cni.txQLen -5: must be between 0 and 4294967295".into(),
                "",
            ),
        ];
        for (conf, args, msg, details) in cases {
            let err = CniError::from(load(conf.clone(), args, "eth0").unwrap_err());
            assert_eq!(err.code, ErrorCode::InvalidConfig, "{conf}");
            assert_eq!(err.msg, msg, "{conf}");
            assert!(err.details.contains(details), "{conf}: {}", err.details);
        }
    }

    #[test]
    fn unknown_cni_args_need_ignore_unknown() {
        let err = load(json!({}), "FOO=bar", "eth0").unwrap_err();
        assert_eq!(code(err), ErrorCode::InvalidEnv);
        assert!(load(json!({}), "IgnoreUnknown=1;FOO=bar", "eth0").is_ok());
        assert!(load(json!({}), "K8S_POD_NAME=web", "eth0").is_ok());
    }

    #[test]
    fn macs_parse_as_go_parses_them() {
        let good = [
            ("00:00:5e:00:53:01", vec![0, 0, 0x5e, 0, 0x53, 1]),
            ("00-00-5E-00-53-01", vec![0, 0, 0x5e, 0, 0x53, 1]),
            ("0000.5e00.5301", vec![0, 0, 0x5e, 0, 0x53, 1]),
            (
                "02:00:5e:10:00:00:00:01",
                vec![2, 0, 0x5e, 0x10, 0, 0, 0, 1],
            ),
            ("0200.5e10.0000.0001", vec![2, 0, 0x5e, 0x10, 0, 0, 0, 1]),
        ];
        for (text, bytes) in good {
            assert_eq!(parse_mac(text), Some(bytes), "{text}");
        }
        let ib = "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01";
        assert_eq!(parse_mac(ib).map(|b| b.len()), Some(20));
        for bad in [
            "",
            "00:00:5e:00:53",
            "00:00:5e:00:53:01:02",
            "00:00:5e-00:53:01",
            "0:00:5e:00:53:01:",
            "00:00:5e:00:53:0g",
            "0000.5e00.530",
            "0000:5e00:5301",
            "+0:00:5e:00:53:01",
            "00:00:5e:00:53:é",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_allowlist_matches_whole_raw_keys() {
        let list = Allowlist::parse(
            "/etc/cni/tuning/allowlist.conf".into(),
            "  ^net\\.ipv4\\.conf\\.IFNAME\\.[a-z_]+$ \n\nnet.ipv4.ip_forward\n",
        )
        .unwrap();
        let conf = |key: &str| load(json!({"sysctl": {key: "1"}}), "", "eth0").unwrap();
        assert!(list.check(&conf("net.ipv4.conf.IFNAME.rp_filter")).is_ok());
        assert!(list.check(&conf("net.ipv4.ip_forward")).is_ok());
        // The reference's unanchored match would allow these.
        for refused in [
            "net.ipv4.ip_forward.x",
            "net.ipv4.conf.eth0.rp_filter",
            "net.ipv4.ip_forwardx",
        ] {
            let err = list.check(&conf(refused)).unwrap_err();
            assert!(err.to_string().contains(&format!("{refused:?}")), "{err}");
            assert_eq!(code(err), ErrorCode::InvalidConfig);
        }
    }

    #[test]
    fn an_invalid_allowlist_pattern_names_file_and_line() {
        let err = Allowlist::parse("/a.conf".into(), "net.core.x\nnet.(ipv4\n").unwrap_err();
        assert!(err.to_string().starts_with("/a.conf:2: "), "{err}");
        assert_eq!(code(err), ErrorCode::InvalidConfig);
    }

    #[test]
    fn a_missing_allowlist_means_no_restriction() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            Allowlist::load_from(dir.path().join("allowlist.conf"))
                .unwrap()
                .is_none()
        );
        std::fs::write(dir.path().join("allowlist.conf"), "net.core.somaxconn\n").unwrap();
        let list = Allowlist::load_from(dir.path().join("allowlist.conf"))
            .unwrap()
            .unwrap();
        let conf = load(json!({"sysctl": {"net.core.somaxconn": "1"}}), "", "eth0").unwrap();
        assert!(list.check(&conf).is_ok());
    }
}
