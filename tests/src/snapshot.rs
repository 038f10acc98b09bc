//! Snapshots of what plugins can leave behind in a network namespace and in directories,
//! normalised so that two snapshots of the same state compare equal.
//!
//! Shared by the reliability tests (`concurrency.rs`, `faults.rs`) and the differential suites
//! ([`crate::differential`], `diff_*.rs`).
//!
//! A [`Snapshot`] is a map of named sections, each a list of normalised lines:
//!
//! | section | read with | normalisation |
//! | --- | --- | --- |
//! | `links` | `ip -j -d link show` | `name kind=… master=… alias=…` (no index, MAC, flags, MTU) |
//! | `addresses` | `ip -j addr show` | `dev addr/len`, without IPv6 link-local addresses (derived from MACs) |
//! | `routes` | `ip -j route show table all`, also `-6` | the JSON without `flags`/`expires`, without IPv6 link-local host routes |
//! | `rules` | `ip -j rule show`, also `-6` | the JSON |
//! | `qdiscs` | `tc -j qdisc show` | the JSON without `refcnt` |
//! | `nftables` | `nft -j list ruleset` | each object without `handle` and counter values; tables sorted, objects in listing order within each |
//! | `iptables`, `ip6tables` | `iptables-save`, `ip6tables-save` | without comments and chain counters, in order |
//! | `files:<label>` | the directory tree | relative paths (`d/` for directories), `<absent>` when the root does not exist |
//!
//! The netfilter sections are optional ([`Scope::without_netfilter`], e.g. for container
//! namespaces, which plugins never give rules). Nothing here changes any state; every read
//! runs inside the given namespace. Interface indices, MACs, link-local addresses and handles
//! are left out because they differ between two namespaces (or two runs) holding the same
//! objects, so a snapshot of one namespace can also be compared with one of another namespace
//! that went through the same steps.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::netns::TestNetns;
use anyhow::{Context, Result, bail};
use serde_json::Value;

/// What a snapshot covers: one namespace, optionally its netfilter state, and directories.
#[derive(Debug, Clone)]
pub struct Scope<'a> {
    ns: &'a TestNetns,
    netfilter: bool,
    dirs: Vec<(String, PathBuf)>,
}

impl<'a> Scope<'a> {
    /// Links, addresses, routes, rules, qdiscs and netfilter rules of `ns`.
    pub fn netns(ns: &'a TestNetns) -> Scope<'a> {
        Scope {
            ns,
            netfilter: true,
            dirs: Vec::new(),
        }
    }

    /// Leaves out nftables and iptables (three execs fewer).
    #[must_use]
    pub fn without_netfilter(mut self) -> Scope<'a> {
        self.netfilter = false;
        self
    }

    /// Adds the tree under `dir` as section `files:<label>`. The label, not the path, names it,
    /// so trees at different paths (a tempdir per run, a state dir per namespace inode)
    /// compare.
    #[must_use]
    pub fn dir(mut self, label: &str, dir: impl Into<PathBuf>) -> Scope<'a> {
        self.dirs.push((label.to_owned(), dir.into()));
        self
    }

    /// Reads everything in scope now.
    ///
    /// # Errors
    /// When a tool fails or prints something unexpected, or a directory cannot be read.
    pub fn take(&self) -> Result<Snapshot> {
        let mut sections = BTreeMap::new();
        let ns = self.ns;
        sections.insert("links".to_owned(), link_lines(&links(ns)?));
        sections.insert("addresses".to_owned(), address_lines(ns)?);
        sections.insert("routes".to_owned(), route_lines(ns)?);
        sections.insert("rules".to_owned(), rule_lines(ns)?);
        sections.insert("qdiscs".to_owned(), qdisc_lines(&qdiscs(ns)?));
        if self.netfilter {
            sections.insert("nftables".to_owned(), nft_lines(&nft_ruleset(ns)?));
            sections.insert("iptables".to_owned(), iptables_save(ns, "iptables-save")?);
            sections.insert("ip6tables".to_owned(), iptables_save(ns, "ip6tables-save")?);
        }
        for (label, dir) in &self.dirs {
            sections.insert(format!("files:{label}"), tree(dir)?);
        }
        Ok(Snapshot { sections })
    }
}

/// Normalised state, section by section (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    sections: BTreeMap<String, Vec<String>>,
}

impl Snapshot {
    /// An empty snapshot, to fill with [`Snapshot::insert`].
    pub fn new() -> Snapshot {
        Snapshot::default()
    }

    /// Sets section `name` to `lines`.
    pub fn insert(&mut self, name: impl Into<String>, lines: Vec<String>) {
        self.sections.insert(name.into(), lines);
    }

    /// The lines of one section (empty when the section was not taken).
    pub fn section(&self, name: &str) -> &[String] {
        self.sections.get(name).map_or(&[], Vec::as_slice)
    }

    /// The sections taken.
    pub fn section_names(&self) -> impl Iterator<Item = &str> {
        self.sections.keys().map(String::as_str)
    }

    /// What changed from `self` to `later`, one line per difference: `<section>: + <line>` for
    /// a line only `later` has (or has more often), `- <line>` for one it lost, and
    /// `<section>: same lines in another order` when only the order differs. Empty when both
    /// are equal.
    pub fn diff(&self, later: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        let names: std::collections::BTreeSet<&String> =
            self.sections.keys().chain(later.sections.keys()).collect();
        for name in names {
            let before = self.section(name);
            let after = later.section(name);
            if before == after {
                continue;
            }
            let (lost, gained) = multiset_difference(before, after);
            for line in &lost {
                out.push(format!("{name}: - {line}"));
            }
            for line in &gained {
                out.push(format!("{name}: + {line}"));
            }
            if lost.is_empty() && gained.is_empty() {
                out.push(format!("{name}: same lines in another order"));
            }
        }
        out
    }

    /// Fails, listing every difference, unless `later` equals `self`.
    ///
    /// # Errors
    /// When they differ; the message starts with `what`.
    pub fn ensure_same(&self, later: &Snapshot, what: &str) -> Result<()> {
        let diff = self.diff(later);
        if !diff.is_empty() {
            bail!(
                "{what}: {} difference(s)\n  {}",
                diff.len(),
                diff.join("\n  ")
            );
        }
        Ok(())
    }
}

/// Lines of `a` missing from `b` and lines of `b` missing from `a`, counting repeats (a line
/// twice in `b` and once in `a` is one line missing from `a`), each sorted.
pub fn multiset_difference(a: &[String], b: &[String]) -> (Vec<String>, Vec<String>) {
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for line in a {
        *counts.entry(line).or_default() += 1;
    }
    for line in b {
        *counts.entry(line).or_default() -= 1;
    }
    let mut lost = Vec::new();
    let mut gained = Vec::new();
    for (line, n) in counts {
        for _ in 0..n.max(0) {
            lost.push(line.to_owned());
        }
        for _ in 0..(-n).max(0) {
            gained.push(line.to_owned());
        }
    }
    (lost, gained)
}

/// The processes (pid and command name) whose main thread is in `ns`: children a plugin left
/// running there (ours leave none), such as an `iptables-restore` of a killed one. Threads of other
/// processes that merely entered `ns` (this test's own helpers) do not count.
///
/// # Errors
/// When `ns` or `/proc` cannot be read.
pub fn processes_in(ns: &TestNetns) -> Result<Vec<(u32, String)>> {
    use std::os::unix::fs::MetadataExt as _;
    let ino = std::fs::metadata(ns.path())?.ino();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process that exits meanwhile is simply not there.
        let Ok(meta) = std::fs::metadata(entry.path().join("ns/net")) else {
            continue;
        };
        if meta.ino() == ino {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            found.push((pid, comm.trim().to_owned()));
        }
    }
    Ok(found)
}

/// Waits (up to `timeout`) until no process runs in `ns` ([`processes_in`]).
///
/// # Errors
/// When some still run at the deadline, naming them.
pub fn wait_for_no_processes(ns: &TestNetns, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = processes_in(ns)?;
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "processes still in {} after {timeout:?}: {left:?}",
                ns.name()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ip -j -d link show` of `ns`.
///
/// # Errors
/// When `ip` fails.
pub fn links(ns: &TestNetns) -> Result<Vec<Value>> {
    array(ns.ip_json(&["-d", "link", "show"])?)
}

/// `tc -j qdisc show` of `ns` (every device).
///
/// # Errors
/// When `tc` fails or prints no JSON.
pub fn qdiscs(ns: &TestNetns) -> Result<Vec<Value>> {
    let out = ns.exec_ok("tc", &["-j", "qdisc", "show"])?;
    array(parse_json(&out, "tc -j qdisc show")?)
}

/// The `nftables` array of `nft -j list ruleset` of `ns`.
///
/// # Errors
/// When `nft` fails or prints no JSON.
pub fn nft_ruleset(ns: &TestNetns) -> Result<Vec<Value>> {
    // A set's elements come in several netlink messages, each resuming the walk by count; a
    // hash set that the kernel resizes meanwhile (resizes run later, in a worker) is listed
    // with elements twice or not at all. Nothing changes while a test reads the ruleset, so
    // two reads in a row that agree (counters aside) are a consistent one.
    let read = || -> Result<Vec<Value>> {
        let out = ns.exec_ok("nft", &["-j", "list", "ruleset"])?;
        let doc = parse_json(&out, "nft -j list ruleset")?;
        array(doc["nftables"].clone())
    };
    let stripped = |ruleset: &[Value]| {
        let mut v = Value::Array(ruleset.to_vec());
        strip_volatile(&mut v);
        v
    };
    let mut last = read()?;
    for _ in 0..NFT_READS {
        let next = read()?;
        if stripped(&next) == stripped(&last) {
            return Ok(next);
        }
        last = next;
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "`nft list ruleset` in {} changed between each of {NFT_READS} reads",
        ns.name()
    )
}

/// Reads of [`nft_ruleset`] before it gives up waiting for two that agree.
const NFT_READS: usize = 20;

/// The output of `tool` (`iptables-save`, `ip6tables-save`, with `args` such as `-t nat`) in
/// `ns`, without comment lines and with chain counters stripped (`:FORWARD ACCEPT`).
///
/// # Errors
/// When the tool fails.
pub fn iptables_save_args(ns: &TestNetns, tool: &str, args: &[&str]) -> Result<Vec<String>> {
    Ok(ns
        .exec_ok(tool, args)?
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| match l.rfind(" [") {
            Some(i) if l.starts_with(':') => l[..i].to_owned(),
            _ => l.to_owned(),
        })
        .collect())
}

/// [`iptables_save_args`] of every table.
///
/// # Errors
/// When the tool fails.
pub fn iptables_save(ns: &TestNetns, tool: &str) -> Result<Vec<String>> {
    iptables_save_args(ns, tool, &[])
}

fn parse_json(text: &str, what: &str) -> Result<Value> {
    if text.trim().is_empty() {
        return Ok(Value::Array(Vec::new()));
    }
    serde_json::from_str(text).with_context(|| format!("`{what}` printed no JSON: {text}"))
}

fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(a) => Ok(a),
        Value::Null => Ok(Vec::new()),
        other => bail!("expected a JSON array, got {other}"),
    }
}

fn link_lines(links: &[Value]) -> Vec<String> {
    let mut lines: Vec<String> = links
        .iter()
        .map(|l| {
            let kind = l["linkinfo"]["info_kind"]
                .as_str()
                .or_else(|| l["link_type"].as_str())
                .unwrap_or("?");
            let mut line = format!("{} kind={kind}", l["ifname"].as_str().unwrap_or("?"));
            if let Some(master) = l["master"].as_str() {
                line.push_str(&format!(" master={master}"));
            }
            if let Some(alias) = l["ifalias"].as_str() {
                line.push_str(&format!(" alias={alias}"));
            }
            line
        })
        .collect();
    lines.sort();
    lines
}

fn address_lines(ns: &TestNetns) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for link in array(ns.ip_json(&["addr", "show"])?)? {
        let dev = link["ifname"].as_str().unwrap_or("?");
        for addr in link["addr_info"].as_array().into_iter().flatten() {
            let local = addr["local"].as_str().unwrap_or("?");
            if addr["family"] == "inet6" && addr["scope"] == "link" {
                continue;
            }
            lines.push(format!("{dev} {local}/{}", addr["prefixlen"]));
        }
    }
    lines.sort();
    Ok(lines)
}

/// `ip -j route show table all` of both families: one JSON line per route without `flags` and
/// `expires`, IPv6 link-local host routes left out (they embed MACs), sorted.
///
/// # Errors
/// When `ip` fails.
pub fn route_lines(ns: &TestNetns) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for family in ["-4", "-6"] {
        for mut route in array(ns.ip_json(&[family, "route", "show", "table", "all"])?)? {
            let dst = route["dst"].as_str().unwrap_or_default();
            // The host route of a link-local address embeds the MAC of its link.
            if dst.starts_with("fe80:") && !dst.contains('/') {
                continue;
            }
            if let Some(obj) = route.as_object_mut() {
                obj.remove("flags");
                obj.remove("expires");
            }
            lines.push(route.to_string());
        }
    }
    lines.sort();
    Ok(lines)
}

/// `ip -j rule show` of both families: one line per rule (`-4 {json}`), sorted.
///
/// # Errors
/// When `ip` fails.
pub fn rule_lines(ns: &TestNetns) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for family in ["-4", "-6"] {
        for rule in array(ns.ip_json(&[family, "rule", "show"])?)? {
            lines.push(format!("{family} {rule}"));
        }
    }
    lines.sort();
    Ok(lines)
}

fn qdisc_lines(qdiscs: &[Value]) -> Vec<String> {
    let mut lines: Vec<String> = qdiscs
        .iter()
        .map(|q| {
            let mut q = q.clone();
            if let Some(obj) = q.as_object_mut() {
                obj.remove("refcnt");
            }
            q.to_string()
        })
        .collect();
    lines.sort();
    lines
}

/// One line per object, grouped by table (tables sorted by family and name, since their
/// listing order is their creation order, which races when two programs create them), each
/// table's objects in listing order (rule order matters).
fn nft_lines(ruleset: &[Value]) -> Vec<String> {
    let mut objects: Vec<((String, String), String)> = ruleset
        .iter()
        .filter(|o| o.get("metainfo").is_none())
        .map(|o| {
            let body = o
                .as_object()
                .and_then(|m| m.values().next())
                .unwrap_or(&Value::Null);
            let table = if o.get("table").is_some() {
                &body["name"]
            } else {
                &body["table"]
            };
            let key = (
                body["family"].as_str().unwrap_or_default().to_owned(),
                table.as_str().unwrap_or_default().to_owned(),
            );
            let mut o = o.clone();
            strip_volatile(&mut o);
            (key, o.to_string())
        })
        .collect();
    objects.sort_by(|a, b| a.0.cmp(&b.0));
    objects.into_iter().map(|(_, line)| line).collect()
}

/// One line per nftables object of `ruleset` (see [`nft_ruleset`]), without handles and
/// counter values, in an order that does not depend on the order the objects were created in:
/// tables by family and name; in each table the table, then its chains, sets, maps and other
/// objects by kind and name, then the rules of each chain (chains by name, each chain's rules in
/// their order, which matters). Two rulesets holding the same objects compare equal whoever
/// created them in whichever order.
pub fn nft_sorted_lines(ruleset: &[Value]) -> Vec<String> {
    /// (family, table, rank, name, position): rank 0 the table, 1 named objects, 2 rules.
    type Key = (String, String, u8, String, usize);
    let mut objects: Vec<(Key, String)> = Vec::new();
    for (position, object) in ruleset.iter().enumerate() {
        let Some((kind, body)) = object.as_object().and_then(|m| m.iter().next()) else {
            continue;
        };
        if kind == "metainfo" {
            continue;
        }
        let field = |key: &str| body[key].as_str().unwrap_or_default().to_owned();
        let family = field("family");
        let (table, rank, name) = match kind.as_str() {
            "table" => (field("name"), 0, String::new()),
            "rule" => (field("table"), 2, field("chain")),
            _ => (field("table"), 1, format!("{kind} {}", field("name"))),
        };
        let mut object = object.clone();
        strip_volatile(&mut object);
        objects.push(((family, table, rank, name, position), object.to_string()));
    }
    objects.sort_by(|a, b| a.0.cmp(&b.0));
    objects.into_iter().map(|(_, line)| line).collect()
}

/// `ruleset` without the tables that hold nothing (no chain, set, map, rule or other object):
/// `iptables-nft` creates an empty table when a chain of a missing table is merely listed, so
/// an implementation that execs `iptables -S` leaves empty tables where one that does not
/// leaves nothing, and neither is behaviour.
pub fn without_empty_nft_tables(ruleset: &[Value]) -> Vec<Value> {
    let owner = |o: &Value| -> Option<(String, String)> {
        let (kind, body) = o.as_object()?.iter().next()?;
        let table = if kind == "table" {
            &body["name"]
        } else {
            &body["table"]
        };
        Some((
            body["family"].as_str()?.to_owned(),
            table.as_str()?.to_owned(),
        ))
    };
    let used: std::collections::BTreeSet<(String, String)> = ruleset
        .iter()
        .filter(|o| o.get("table").is_none())
        .filter_map(owner)
        .collect();
    ruleset
        .iter()
        .filter(|o| o.get("table").is_none() || owner(o).is_some_and(|t| used.contains(&t)))
        .cloned()
        .collect()
}

/// `iptables-save -t <table>` and `ip6tables-save -t <table>` of `ns` for each of `tables`, as
/// sections `iptables <table>` and `ip6tables <table>` (see [`iptables_save_args`]).
///
/// # Errors
/// When a tool fails.
pub fn iptables_tables(ns: &TestNetns, tables: &[&str]) -> Result<Vec<(String, Vec<String>)>> {
    let mut out = Vec::new();
    for tool in ["iptables", "ip6tables"] {
        for table in tables {
            let lines = iptables_save_args(ns, &format!("{tool}-save"), &["-t", table])?;
            out.push((format!("{tool} {table}"), lines));
        }
    }
    Ok(out)
}

/// The attributes of every link of `ns` a plugin may set, one line each (`<name> <attribute>
/// <value>`): kind, MTU, transmit queue length, flags (sorted), alias and master when set, and
/// the MAC of the links for which `keep_mac` says so (a MAC the kernel chose at random differs
/// between two namespaces holding the same objects). No interface index.
///
/// # Errors
/// When `ip` fails.
pub fn link_attr_lines(ns: &TestNetns, keep_mac: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for link in links(ns)? {
        let name = link["ifname"].as_str().unwrap_or("?");
        let kind = link["linkinfo"]["info_kind"]
            .as_str()
            .or_else(|| link["link_type"].as_str())
            .unwrap_or("?");
        let mut flags: Vec<&str> = link["flags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        flags.sort_unstable();
        lines.push(format!("{name} kind {kind}"));
        lines.push(format!("{name} mtu {}", link["mtu"]));
        // `ip -j` leaves txqlen out when it is 0.
        lines.push(format!(
            "{name} txqlen {}",
            link["txqlen"].as_u64().unwrap_or(0)
        ));
        lines.push(format!("{name} flags {}", flags.join(",")));
        for key in ["ifalias", "master"] {
            if let Some(value) = link[key].as_str() {
                lines.push(format!("{name} {key} {value}"));
            }
        }
        if keep_mac(name) {
            lines.push(format!(
                "{name} address {}",
                link["address"].as_str().unwrap_or("?")
            ));
        }
    }
    lines.sort();
    Ok(lines)
}

/// `tc -j <args>` in `ns` (e.g. `qdisc show dev eth0`), one JSON line per object without
/// `refcnt`, in the order `tc` lists them.
///
/// # Errors
/// When `tc` fails or prints no JSON.
pub fn tc_lines(ns: &TestNetns, args: &[&str]) -> Result<Vec<String>> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let out = ns.exec_ok("tc", &full)?;
    Ok(array(parse_json(&out, &format!("tc {}", full.join(" ")))?)?
        .into_iter()
        .map(|mut o| {
            if let Some(obj) = o.as_object_mut() {
                obj.remove("refcnt");
            }
            o.to_string()
        })
        .collect())
}

/// The netfilter state of `ns` as a differential test compares it: section `nft` (every
/// nftables object, [`nft_sorted_lines`], empty tables left out: [`without_empty_nft_tables`])
/// and the [`iptables_tables`] sections of `tables`. The `iptables-nft` tables of `tables`
/// (`ip nat`, `ip6 nat`, …) are left out of `nft`: they are compared as `iptables-save` prints
/// them, by meaning, where their expressions are one release's encoding (ours is 1.8.7's,
/// which every release reads, where this machine's 1.8.9 writes some matches natively).
///
/// # Errors
/// When a tool fails.
pub fn netfilter_sections(ns: &TestNetns, tables: &[&str]) -> Result<Vec<(String, Vec<String>)>> {
    let iptables_nft = |o: &Value| {
        o.as_object()
            .and_then(|m| m.iter().next())
            .is_some_and(|(kind, body)| {
                let table = if kind == "table" {
                    &body["name"]
                } else {
                    &body["table"]
                };
                matches!(body["family"].as_str(), Some("ip" | "ip6"))
                    && table.as_str().is_some_and(|t| tables.contains(&t))
            })
    };
    let ruleset: Vec<Value> = without_empty_nft_tables(&nft_ruleset(ns)?)
        .into_iter()
        .filter(|o| !iptables_nft(o))
        .collect();
    let mut sections = vec![("nft".to_owned(), nft_sorted_lines(&ruleset))];
    sections.extend(iptables_tables(ns, tables)?);
    Ok(sections)
}

/// Removes what changes without any object changing: handles, counter values, timeouts left.
fn strip_volatile(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for key in ["handle", "packets", "bytes", "expires"] {
                map.remove(key);
            }
            map.values_mut().for_each(strip_volatile);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_volatile),
        _ => {}
    }
}

/// Relative paths under `root`, directories ending in `/`, sorted; `<absent>` when `root`
/// does not exist.
fn tree(root: &Path) -> Result<Vec<String>> {
    if !root.exists() {
        return Ok(vec!["<absent>".to_owned()]);
    }
    let mut lines = vec!["./".to_owned()];
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("failed to read {}", dir.display()))?
        {
            let entry = entry?;
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            if entry.file_type()?.is_dir() {
                lines.push(format!("{rel}/"));
                stack.push(path);
            } else {
                lines.push(rel);
            }
        }
    }
    lines.sort();
    Ok(lines)
}
