//! Concurrency: 50 attachments of one network (distinct containers, each in its own namespace)
//! ADDed all at once from 50 threads, checked, then DELed all at once; per plugin (Go `bridge` +
//! `host-local`, then the plugin) and for the full chain bridge → tuning → portmap → bandwidth →
//! firewall → sbr.
//!
//! What each test proves:
//!
//! - Every ADD and DEL succeeds. A failure must be a CNI error; code 11 (a bounded lock wait
//!   expired) is retried with the same input, at most [`tests::chain::DEFAULT_MAX_ATTEMPTS`] times,
//!   and counted (printed); any other error fails the test.
//! - After the ADDs, each attachment's kernel objects and files are there exactly once and
//!   carry that attachment's data (no lost or duplicated rule, element, qdisc or file, no
//!   mix-up between containers): [`Part::verify`].
//! - After the DELs, the host namespace (links, addresses, routes, rules, qdiscs, nftables,
//!   iptables, ip6tables) and the plugins' state directories equal those of a *reference node*
//!   that went through one sequential ADD and DEL of the same chain: what the first ADD
//!   creates for good (the bridge, portmap's nftables table, firewall's chains, lock files)
//!   exists exactly once although 50 first ADDs raced to create it, and nothing of any
//!   attachment is left, and no process a plugin started still
//!   runs there once its DEL returned. Both nodes start from equal snapshots.
//! - Each container namespace is, after DEL, exactly as it was before ADD (sbr's rules and
//!   tables, tuning's changes, bandwidth's objects gone).
//!
//! Tests run in parallel and with other test binaries: each owns its host and container
//! namespaces, and every state directory it reads belongs to its own namespaces (tempdirs for
//! `host-local` and `tuning`; portmap's and firewall's per-namespace-inode directories under
//! `/run`, removed when the test ends).

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use bandwidth::names::{self, reference_ifb_name};
use cni::Attachment;
use serde_json::{Value, json};
use tests::chain::Chain;
use tests::result::{address, host_veth};
use tests::snapshot::{self, Scope};
use tests::{NetworkConfigList, Runtime, RuntimeConf, TestNetns, main_plugin};

/// Attachments per test, all racing.
const CONTAINERS: usize = 50;
const NETWORK: &str = "ccnet";
const BRIDGE: &str = "ccbr0";
const SUBNETS: [&str; 2] = ["10.123.0.0/24", "fd12:3::/64"];
const IFNAME: &str = "eth0";
/// Container `i` maps host port `HOST_PORT_BASE + i` (TCP to 80, UDP to 53).
const HOST_PORT_BASE: u16 = 21000;
/// The MTU tuning gives every container interface (bridge's veth starts at 1500).
const TUNED_MTU: u64 = 1400;
/// The fixed sbr table of the full chain.
const SBR_TABLE: u32 = 100;
/// Deadline of one plugin execution: generous, since 100 chains (two tests) run at once on
/// two cores; a lock wait inside a plugin is bounded by the plugin itself (code 11).
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(120);

/// One node: a host namespace where the plugins run, its runtime, and its state directories.
struct Node {
    host: TestNetns,
    runtime: Runtime,
    scratch: tempfile::TempDir,
    portmap_dir: PathBuf,
    firewall_dir: PathBuf,
}

impl Node {
    fn new(prefix: &str) -> Result<Node> {
        let host = TestNetns::new(prefix)?;
        let runtime = Runtime::new(&host)?.with_timeout(PLUGIN_TIMEOUT);
        let ino = std::fs::metadata(host.path())?.ino();
        let [portmap_dir, firewall_dir] = tests::netns::plugin_state_dirs(ino);
        let node = Node {
            portmap_dir,
            firewall_dir,
            host,
            runtime,
            scratch: tempfile::tempdir()?,
        };
        // State under this inode number can only be left by a dead namespace that had it.
        node.remove_run_dirs();
        Ok(node)
    }

    fn remove_run_dirs(&self) {
        for dir in [&self.portmap_dir, &self.firewall_dir] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    fn ipam_dir(&self) -> PathBuf {
        self.scratch.path().join("ipam")
    }

    fn tuning_dir(&self) -> PathBuf {
        self.scratch.path().join("tuning")
    }

    /// The host namespace and every state directory the chain's plugins write.
    fn scope(&self) -> Scope<'_> {
        Scope::netns(&self.host)
            .dir("host-local", self.ipam_dir())
            .dir("tuning", self.tuning_dir())
            .dir("portmap", &self.portmap_dir)
            .dir("firewall", &self.firewall_dir)
    }

    fn list(&self, parts: &[Part]) -> NetworkConfigList {
        let mut plugins = vec![main_plugin::bridge(BRIDGE, &SUBNETS, &self.ipam_dir())];
        plugins.extend(parts.iter().map(|p| p.config(self)));
        NetworkConfigList::new(NETWORK, "1.0.0", plugins)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.remove_run_dirs();
    }
}

/// A plugin after the bridge, with the backend or mode under test.
#[derive(Debug, Clone, Copy)]
enum Part {
    Tuning,
    Portmap(&'static str),
    Bandwidth,
    Firewall(&'static str),
    /// `table: None` is sbr's own mode (a table per address, routes moved into it).
    Sbr(Option<u32>),
}

/// One ADDed attachment.
struct Attached<'a> {
    i: usize,
    ns: &'a TestNetns,
    rt: RuntimeConf,
    v4: String,
    v6: String,
    host_veth: String,
}

impl Attached<'_> {
    fn cid(&self) -> &str {
        &self.rt.container_id
    }

    fn port(&self) -> u16 {
        host_port(self.i)
    }
}

fn host_port(i: usize) -> u16 {
    HOST_PORT_BASE + u16::try_from(i).unwrap_or(u16::MAX - HOST_PORT_BASE)
}

fn mac(i: usize) -> String {
    format!("02:42:0a:7b:{:02x}:{:02x}", i / 256, i % 256)
}

fn container_id(i: usize) -> String {
    format!("cc-ctr-{i:03}")
}

/// The attachment of container `i` with every capability a plugin of the chains may declare.
fn runtime_conf(i: usize, ns: &TestNetns) -> RuntimeConf {
    let port = host_port(i);
    RuntimeConf::new(&container_id(i), ns.path(), IFNAME)
        .with_capability(
            "portMappings",
            json!([
                {"hostPort": port, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": port, "containerPort": 53, "protocol": "udp"},
            ]),
        )
        .with_capability("mac", json!(mac(i)))
}

impl Part {
    fn config(self, node: &Node) -> Value {
        match self {
            Part::Tuning => json!({
                "type": "tuning",
                "dataDir": node.tuning_dir(),
                "capabilities": {"mac": true},
                "mtu": TUNED_MTU,
                "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"},
            }),
            Part::Portmap(backend) => json!({
                "type": "portmap",
                "backend": backend,
                "capabilities": {"portMappings": true},
            }),
            Part::Bandwidth => json!({
                "type": "bandwidth",
                "ingressRate": 50_000_000, "ingressBurst": 500_000,
                "egressRate": 20_000_000, "egressBurst": 200_000,
            }),
            Part::Firewall(backend) => json!({"type": "firewall", "backend": backend}),
            Part::Sbr(Some(table)) => json!({"type": "sbr", "table": table}),
            Part::Sbr(None) => json!({"type": "sbr"}),
        }
    }

    /// Each attachment's objects exist exactly once, with its own data.
    fn verify(self, node: &Node, all: &[Attached<'_>]) -> Result<()> {
        match self {
            Part::Tuning => verify_tuning(node, all),
            Part::Portmap("nftables") => verify_portmap_nftables(node, all),
            Part::Portmap(_) => verify_portmap_iptables(node, all),
            Part::Bandwidth => verify_bandwidth(node, all),
            Part::Firewall("nftables") => verify_firewall_nftables(node, all),
            Part::Firewall(_) => verify_firewall_iptables(node, all),
            Part::Sbr(table) => verify_sbr(all, table),
        }
        .with_context(|| format!("{self:?} after {} concurrent ADDs", all.len()))
    }
}

/// Runs `f` on every item, each on its own thread, all released at once by a barrier; the
/// results come back in item order.
fn race<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let barrier = Barrier::new(items.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .iter()
            .map(|item| {
                let (barrier, f) = (&barrier, &f);
                s.spawn(move || {
                    barrier.wait();
                    f(item)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// All results, or one error listing every failure.
fn all_ok<R>(results: Vec<Result<R>>, what: &str) -> Result<Vec<R>> {
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for r in results {
        match r {
            Ok(v) => ok.push(v),
            Err(e) => failed.push(format!("{e:#}")),
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} {what} failed:\n  {}",
            failed.len(),
            failed.len() + ok.len(),
            failed.join("\n  ")
        );
    }
    Ok(ok)
}

fn container_scope(ns: &TestNetns) -> Scope<'_> {
    Scope::netns(ns).without_netfilter()
}

/// The whole scenario for one chain: a reference node (one sequential ADD and DEL), then 50
/// concurrent ADDs, the per-attachment checks, 50 concurrent DELs, and the comparisons.
fn run(name: &str, parts: &[Part]) -> Result<()> {
    let started = std::time::Instant::now();
    // Reference: what one ADD and DEL leave on a fresh node.
    let reference = Node::new("ccref")?;
    let fresh_reference = reference.scope().take()?;
    {
        let list = reference.list(parts);
        let driver = Chain::new(&reference.runtime, &list);
        let ctr = TestNetns::new("ccref-ctr")?;
        let rt = runtime_conf(0, &ctr);
        let result = driver.add(&rt).context("reference ADD")?;
        driver.del(&rt, Some(&result)).context("reference DEL")?;
        snapshot::wait_for_no_processes(&reference.host, Duration::ZERO)?;
    }
    let settled_reference = reference.scope().take()?;
    drop(reference);

    let node = Node::new("cc")?;
    node.scope()
        .take()?
        .ensure_same(&fresh_reference, "fresh node vs fresh reference node")?;
    let list = node.list(parts);
    let driver = Chain::new(&node.runtime, &list);

    let indices: Vec<usize> = (0..CONTAINERS).collect();
    let containers = all_ok(
        race(&indices, |_| TestNetns::new("cc-ctr")),
        "namespace creations",
    )?;
    let before = all_ok(
        race(&containers, |ns| container_scope(ns).take()),
        "container snapshots",
    )?;
    let rts: Vec<RuntimeConf> = containers
        .iter()
        .enumerate()
        .map(|(i, ns)| runtime_conf(i, ns))
        .collect();

    let results = all_ok(race(&rts, |rt| driver.add(rt)), "concurrent ADDs")?;
    let attached = rts
        .iter()
        .zip(&results)
        .zip(&containers)
        .enumerate()
        .map(|(i, ((rt, result), ns))| {
            Ok(Attached {
                i,
                ns,
                rt: rt.clone(),
                v4: address(result, false)?,
                v6: address(result, true)?,
                host_veth: host_veth(result)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let distinct: BTreeSet<&str> = attached.iter().map(|a| a.v4.as_str()).collect();
    ensure!(
        distinct.len() == CONTAINERS,
        "host-local handed out duplicate addresses"
    );
    let verified = parts
        .iter()
        .try_for_each(|part| part.verify(&node, &attached));

    // DEL also after a failed check: the namespaces must be emptied the way a runtime would.
    let inputs: Vec<(&RuntimeConf, &Value)> = rts.iter().zip(&results).collect();
    let deleted = all_ok(
        race(&inputs, |&(rt, result)| driver.del(rt, Some(result))),
        "concurrent DELs",
    );
    println!(
        "{name}: {CONTAINERS} concurrent ADDs and DELs in {:.1} s, {} code-11 retries{}",
        started.elapsed().as_secs_f64(),
        driver.retries(),
        driver
            .retried()
            .iter()
            .map(|r| format!("\n  {r}"))
            .collect::<String>()
    );
    verified?;
    deleted?;

    snapshot::wait_for_no_processes(&node.host, Duration::ZERO)?;
    settled_reference.ensure_same(
        &node.scope().take()?,
        "after the concurrent DELs, node vs reference node after one ADD and DEL",
    )?;
    let after = all_ok(
        race(&containers, |ns| container_scope(ns).take()),
        "container snapshots",
    )?;
    for ((b, a), ns) in before.iter().zip(&after).zip(&containers) {
        b.ensure_same(
            a,
            &format!("container {} before ADD vs after DEL", ns.name()),
        )?;
    }
    Ok(())
}

/// Names of the files directly in `dir` (none when it does not exist), without `skip` and the
/// state store's directory of temporaries (kept between writes).
fn file_names(dir: &Path, skip: &[&str]) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("failed to read {}", dir.display())),
    };
    let mut names = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name != host::store::TEMP_DIR && !skip.contains(&name.as_str()) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Fails, naming what is missing and what is unexpected, unless both lists hold the same
/// lines the same number of times.
fn ensure_same_lines(what: &str, actual: Vec<String>, expected: Vec<String>) -> Result<()> {
    let (missing, unexpected) = snapshot::multiset_difference(&expected, &actual);
    ensure!(
        missing.is_empty() && unexpected.is_empty(),
        "{what}: {} found, {} expected\n  missing:    {missing:?}\n  unexpected: {unexpected:?}",
        actual.len(),
        expected.len()
    );
    Ok(())
}

fn verify_tuning(node: &Node, all: &[Attached<'_>]) -> Result<()> {
    let dir = node.tuning_dir();
    ensure_same_lines(
        "tuning backup files",
        file_names(&dir, &[".lock"])?,
        all.iter()
            .map(|a| format!("{}_{IFNAME}.json", a.cid()))
            .collect(),
    )?;
    for a in all {
        let path = dir.join(format!("{}_{IFNAME}.json", a.cid()));
        let backup: Value = serde_json::from_slice(&std::fs::read(&path)?)
            .with_context(|| format!("{}", path.display()))?;
        ensure!(
            backup["containerID"] == a.cid() && backup["mtu"] == 1500,
            "{}: {backup}",
            path.display()
        );
        let link = &a.ns.ip_json(&["link", "show", IFNAME])?[0];
        ensure!(
            link["mtu"] == TUNED_MTU && link["address"] == mac(a.i),
            "{} in {}: {link}",
            IFNAME,
            a.ns.name()
        );
        let arp_ignore = a.ns.sysctl(&format!("net.ipv4.conf.{IFNAME}.arp_ignore"))?;
        ensure!(
            arp_ignore == "1",
            "arp_ignore is {arp_ignore} in {}",
            a.ns.name()
        );
    }
    Ok(())
}

/// The elements of set or map `name` of table `family cni_*` in a ruleset, as
/// `<key> -> <data> #<comment>` (`<key> #<comment>` for a set).
fn nft_elements(ruleset: &[Value], family: &str, table: &str, name: &str) -> Result<Vec<String>> {
    let object = ruleset
        .iter()
        .filter_map(|o| o.get("set").or_else(|| o.get("map")))
        .find(|s| s["family"] == family && s["table"] == table && s["name"] == name)
        .with_context(|| format!("no set {family} {table} {name}"))?;
    Ok(object["elem"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            // A map element is [key, data]; a key with a comment is {"elem": {"val", "comment"}}.
            let (key, data) = match e.as_array() {
                Some(pair) if pair.len() == 2 => (&pair[0], Some(&pair[1])),
                _ => (e, None),
            };
            let (val, comment) = match key.get("elem") {
                Some(inner) => (&inner["val"], inner["comment"].as_str().unwrap_or("")),
                None => (key, ""),
            };
            match data {
                Some(d) => format!("{val} -> {d} #{comment}"),
                None => format!("{val} #{comment}"),
            }
        })
        .collect())
}

fn owner(a: &Attached<'_>) -> String {
    format!("{NETWORK}/{}/{IFNAME}", a.cid())
}

fn verify_portmap_nftables(node: &Node, all: &[Attached<'_>]) -> Result<()> {
    let ruleset = snapshot::nft_ruleset(&node.host)?;
    for (family, v6) in [("ip", false), ("ip6", true)] {
        let ip = |a: &Attached<'_>| if v6 { a.v6.clone() } else { a.v4.clone() };
        ensure_same_lines(
            &format!("{family} cni_portmap map ports"),
            nft_elements(&ruleset, family, "cni_portmap", "ports")?,
            all.iter()
                .flat_map(|a| {
                    [("tcp", 80), ("udp", 53)].map(|(proto, to)| {
                        format!(
                            "{} -> {} #{}",
                            json!({"concat": [proto, a.port()]}),
                            json!({"concat": [ip(a), to]}),
                            owner(a)
                        )
                    })
                })
                .collect(),
        )?;
        ensure_same_lines(
            &format!("{family} cni_portmap set hairpin"),
            nft_elements(&ruleset, family, "cni_portmap", "hairpin")?,
            all.iter()
                .map(|a| format!("{} #{}", json!({"concat": [ip(a), ip(a)]}), owner(a)))
                .collect(),
        )?;
        for name in [
            "hostip_ports",
            "gated_hostip_ports",
            "gated_ports",
            "masq_all",
        ] {
            let left = nft_elements(&ruleset, family, "cni_portmap", name)?;
            ensure!(left.is_empty(), "{family} {name} holds {left:?}");
        }
    }
    ensure_same_lines(
        "ip cni_portmap set localhost",
        nft_elements(&ruleset, "ip", "cni_portmap", "localhost")?,
        all.iter()
            .map(|a| format!("{} #{}", json!(a.v4), owner(a)))
            .collect(),
    )?;
    verify_portmap_state(node, all, false)
}

/// One state file per attachment; with the iptables backend (`index`), also the host-port
/// index's entries of each one's ports, each a hard link to its record.
fn verify_portmap_state(node: &Node, all: &[Attached<'_>], index: bool) -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let record = |a: &Attached<'_>| format!("{NETWORK}:{}:{IFNAME}.json", a.cid());
    let mut expected: Vec<String> = all.iter().map(record).collect();
    if index {
        for a in all {
            for family in ["v4", "v6"] {
                for proto in ["tcp", "udp"] {
                    let entry = format!(".port-{family}-{proto}-{}", a.port());
                    let linked = std::fs::metadata(node.portmap_dir.join(&entry))?.ino();
                    let own = std::fs::metadata(node.portmap_dir.join(record(a)))?.ino();
                    ensure!(linked == own, "{entry} is not {}", record(a));
                    expected.push(entry);
                }
            }
        }
    }
    ensure_same_lines(
        "portmap state files",
        file_names(&node.portmap_dir, &[])?,
        expected,
    )
}

fn verify_portmap_iptables(node: &Node, all: &[Attached<'_>]) -> Result<()> {
    for (tool, v6) in [("iptables-save", false), ("ip6tables-save", true)] {
        let nat = snapshot::iptables_save_args(&node.host, tool, &["-t", "nat"])?;
        let count = |pred: &dyn Fn(&str) -> bool| nat.iter().filter(|l| pred(l)).count();
        let mut chains = Vec::new();
        for a in all {
            let comment = format!(
                r#"-m comment --comment "dnat name: \"{NETWORK}\" id: \"{}\"""#,
                a.cid()
            );
            let entries: Vec<&String> = nat
                .iter()
                .filter(|l| l.starts_with("-A CNI-HOSTPORT-DNAT ") && l.contains(&comment))
                .collect();
            let chain = entries
                .first()
                .and_then(|l| l.rsplit(' ').next())
                .with_context(|| format!("{tool}: no entry rule of {}", a.cid()))?;
            let dest = |port: u16| {
                if v6 {
                    format!("[{}]:{port}", a.v6)
                } else {
                    format!("{}:{port}", a.v4)
                }
            };
            let expected_entries: Vec<String> = ["tcp", "udp"]
                .iter()
                .map(|p| {
                    format!(
                        "-A CNI-HOSTPORT-DNAT -p {p} {comment} -m multiport --dports {} -j {chain}",
                        a.port()
                    )
                })
                .collect();
            ensure_same_lines(
                &format!("{tool}: entry rules of {}", a.cid()),
                entries.iter().map(|l| (*l).clone()).collect(),
                expected_entries,
            )?;
            ensure_same_lines(
                &format!("{tool}: DNAT rules of {}", a.cid()),
                nat.iter()
                    .filter(|l| l.starts_with(&format!("-A {chain} ")) && l.contains("-j DNAT"))
                    .cloned()
                    .collect(),
                [("tcp", 80), ("udp", 53)]
                    .iter()
                    .map(|(p, to)| {
                        format!(
                            "-A {chain} -p {p} -m {p} --dport {} -j DNAT --to-destination {}",
                            a.port(),
                            dest(*to)
                        )
                    })
                    .collect(),
            )?;
            ensure!(
                count(&|l| l == format!(":{chain} -")) == 1,
                "{tool}: chain {chain} is not declared exactly once"
            );
            chains.push(chain.to_owned());
        }
        ensure_same_lines(
            &format!("{tool}: CNI-DN- chains"),
            nat.iter()
                .filter_map(|l| l.strip_prefix(':'))
                .filter(|c| c.starts_with("CNI-DN-"))
                .map(|c| c.trim_end_matches(" -").to_owned())
                .collect(),
            chains,
        )?;
        ensure!(
            count(&|l| l.starts_with("-A CNI-HOSTPORT-DNAT ")) == 2 * all.len(),
            "{tool}: CNI-HOSTPORT-DNAT holds other rules: {nat:#?}"
        );
    }
    verify_portmap_state(node, all, true)
}

fn verify_bandwidth(node: &Node, all: &[Attached<'_>]) -> Result<()> {
    let qdiscs = snapshot::qdiscs(&node.host)?;
    let links = snapshot::links(&node.host)?;
    let on = |dev: &str| -> Vec<String> {
        qdiscs
            .iter()
            .filter(|q| q["dev"] == dev)
            .map(|q| format!("{} {}", q["kind"], q["handle"]))
            .collect()
    };
    let mut ifbs = Vec::new();
    for a in all {
        ensure_same_lines(
            &format!("qdiscs on {} ({})", a.host_veth, a.cid()),
            on(&a.host_veth),
            vec![r#""tbf" "1:""#.into(), r#""ingress" "ffff:""#.into()],
        )?;
        let owner = Attachment {
            network: NETWORK.into(),
            container_id: a.cid().into(),
            ifname: IFNAME.into(),
        };
        let ifb = reference_ifb_name(NETWORK, a.cid());
        ensure_same_lines(
            &format!("qdiscs on {ifb} ({})", a.cid()),
            on(&ifb),
            vec![r#""tbf" "1:""#.into()],
        )?;
        let found: Vec<&Value> = links.iter().filter(|l| l["ifname"] == ifb).collect();
        ensure!(
            found.len() == 1
                && found[0]["linkinfo"]["info_kind"] == "ifb"
                && found[0]["ifalias"] == names::alias(&owner),
            "IFB {ifb} of {}: {found:?}",
            a.cid()
        );
        let filters = node.host.exec_ok(
            "tc",
            &[
                "-j",
                "filter",
                "show",
                "dev",
                &a.host_veth,
                "parent",
                "ffff:",
            ],
        )?;
        // One filter redirects to the IFB; like the reference's, it carries
        // two mirred actions (its RedirIndex and its action list).
        let filters_json: Value = serde_json::from_str(&filters)?;
        let redirects = filters_json
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| {
                f["options"]["actions"]
                    .as_array()
                    .is_some_and(|acts| acts.iter().any(|act| act["to_dev"] == ifb))
            })
            .count();
        ensure!(
            redirects == 1,
            "{} filters redirecting to {ifb} on {}: {filters}",
            redirects,
            a.host_veth
        );
        ifbs.push(format!("{ifb} kind=ifb"));
    }
    ensure_same_lines(
        "IFBs on the host",
        links
            .iter()
            .filter(|l| l["linkinfo"]["info_kind"] == "ifb")
            .map(|l| format!("{} kind=ifb", l["ifname"].as_str().unwrap_or("?")))
            .collect(),
        ifbs,
    )
}

fn verify_firewall_iptables(node: &Node, all: &[Attached<'_>]) -> Result<()> {
    for (tool, v6) in [("iptables-save", false), ("ip6tables-save", true)] {
        let filter = snapshot::iptables_save_args(&node.host, tool, &["-t", "filter"])?;
        ensure_same_lines(
            &format!("{tool}: accepts in CNI-FORWARD"),
            filter
                .iter()
                .filter(|l| l.starts_with("-A CNI-FORWARD ") && l.ends_with("-j ACCEPT"))
                .cloned()
                .collect(),
            all.iter()
                .flat_map(|a| {
                    let ip = if v6 {
                        format!("{}/128", a.v6)
                    } else {
                        format!("{}/32", a.v4)
                    };
                    [
                        format!(
                            "-A CNI-FORWARD -d {ip} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
                        ),
                        format!("-A CNI-FORWARD -s {ip} -j ACCEPT"),
                    ]
                })
                .collect(),
        )?;
    }
    ensure_same_lines(
        "firewall attachment state files",
        file_names(&node.firewall_dir.join("attachments"), &[])?,
        all.iter()
            .map(|a| format!("{NETWORK}:{}:{IFNAME}", a.cid()))
            .collect(),
    )?;
    ensure_same_lines(
        "firewall IP claims",
        file_names(&node.firewall_dir.join("ips"), &[])?,
        all.iter()
            .flat_map(|a| [a.v4.clone(), a.v6.clone()])
            .collect(),
    )
}

fn verify_firewall_nftables(node: &Node, all: &[Attached<'_>]) -> Result<()> {
    let ruleset = snapshot::nft_ruleset(&node.host)?;
    for (set, v6) in [("containers4", false), ("containers6", true)] {
        ensure_same_lines(
            &format!("inet cni_firewall set {set}"),
            nft_elements(&ruleset, "inet", "cni_firewall", set)?,
            all.iter()
                .map(|a| {
                    let ip = if v6 { &a.v6 } else { &a.v4 };
                    format!("{} #{}", json!(ip), owner(a))
                })
                .collect(),
        )?;
    }
    Ok(())
}

/// Each address has exactly one `from <ip> lookup <table>` rule in its container (with
/// `table`, that one); in sbr's own mode the table holds the default route through the
/// interface and main holds no route of it any more.
fn verify_sbr(all: &[Attached<'_>], table: Option<u32>) -> Result<()> {
    for a in all {
        for (family, ip) in [("-4", &a.v4), ("-6", &a.v6)] {
            let rules = a.ns.ip_json(&[family, "rule", "show"])?;
            let own: Vec<&Value> = rules
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["src"].as_str() == Some(ip.as_str()))
                .collect();
            ensure!(own.len() == 1, "rules of {ip} in {}: {rules}", a.ns.name());
            let t = own[0]["table"].as_str().unwrap_or_default().to_owned();
            match table {
                Some(fixed) => ensure!(t == fixed.to_string(), "rule of {ip}: {}", own[0]),
                None => {
                    let routes = a.ns.ip_json(&[family, "route", "show", "table", &t])?;
                    ensure!(
                        routes
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|r| r["dst"] == "default" && r["dev"] == IFNAME),
                        "table {t} of {ip} in {}: {routes}",
                        a.ns.name()
                    );
                    let main = a.ns.ip_json(&[family, "route", "show", "dev", IFNAME])?;
                    ensure!(
                        main.as_array().is_none_or(Vec::is_empty),
                        "main still routes via {IFNAME} in {}: {main}",
                        a.ns.name()
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn tuning_attachments_added_and_deleted_concurrently() -> Result<()> {
    run("tuning", &[Part::Tuning])
}

#[test]
fn portmap_nftables_attachments_added_and_deleted_concurrently() -> Result<()> {
    run("portmap (nftables)", &[Part::Portmap("nftables")])
}

#[test]
fn portmap_iptables_attachments_added_and_deleted_concurrently() -> Result<()> {
    run("portmap (iptables)", &[Part::Portmap("iptables")])
}

#[test]
fn bandwidth_attachments_added_and_deleted_concurrently() -> Result<()> {
    run("bandwidth", &[Part::Bandwidth])
}

#[test]
fn firewall_iptables_attachments_added_and_deleted_concurrently() -> Result<()> {
    run("firewall (iptables)", &[Part::Firewall("iptables")])
}

#[test]
fn firewall_nftables_attachments_added_and_deleted_concurrently() -> Result<()> {
    run("firewall (nftables)", &[Part::Firewall("nftables")])
}

#[test]
fn sbr_attachments_added_and_deleted_concurrently() -> Result<()> {
    run("sbr", &[Part::Sbr(None)])
}

#[test]
fn full_chain_attachments_added_and_deleted_concurrently() -> Result<()> {
    run(
        "full chain",
        &[
            Part::Tuning,
            Part::Portmap("nftables"),
            Part::Bandwidth,
            Part::Firewall("iptables"),
            Part::Sbr(Some(SBR_TABLE)),
        ],
    )
}
