//! The busy node: every plugin's ADD, CHECK and DEL, ours and Go's side by side, on a node that
//! looks like production rather than on the empty namespaces of the other suites.
//!
//! One host namespace, where every plugin of this suite runs, holds:
//! - a bridge (`cni0`, 10.95.0.1/16) with [`Options::busy_veths`] veths on it, their peers in
//!   one other namespace (the pods' ends), as every bridge conflist makes; portmap's container
//!   is on the bridge too;
//! - [`Options::busy_kube_rules`] kube-proxy-style rules in its `nat` table, written with one
//!   `iptables-restore --noflush`: `PREROUTING`/`OUTPUT` → `KUBE-SERVICES` → one
//!   `KUBE-SVC-…` per service (the masquerade mark, then a random pick of two endpoints) →
//!   `KUBE-SEP-…` (mark, DNAT), and `KUBE-POSTROUTING`;
//! - conntrack entries inserted over netlink ([`netfilter::conntrack::Conntrack::insert`]): three
//!   in four TCP, one in four UDP, one in ten IPv6, to service and pod ports (never portmap's
//!   measured UDP port, so no flush shrinks the table), with a timeout longer than any run.
//!
//! The node grows in levels, and each level is timed before the next is made:
//! 1. 1 conntrack entry, no kube-proxy rules: portmap only;
//! 2. 1 entry, the kube-proxy rules: portmap only (the base of the conntrack targets, and
//!    the kube-proxy rules' own growth over level 1);
//! 3. each size of [`Options::busy_conntrack`] (default 20 000 and 100 000 entries), with the
//!    kube-proxy rules: every plugin, with the configs and containers of its own suite.
//!
//! At every level, the kernel's share is timed apart from this process (no plugin start in
//! it): the commit of one attachment of portmap's iptables layout and of its removal
//! ([`crate::portmap::kernel_samples`]), and the UDP flush portmap makes, both ways the
//! kernel offers it (one filtered delete on Linux 6.12+, a filtered dump and exact deletes
//! before), beside a dump of the whole IPv4 table (what Go, and our flush before, read).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use harness::netns::{StateDirs, TestNetns, veth_pair};
use netfilter::conntrack::{Conntrack, Deletion, Flow, FlowFilter};
use netfilter::nft::{L4Proto, NfProto};

use crate::{Options, Results, Row, Samples, bandwidth, firewall, portmap, sbr, tuning};

/// The suite's name.
pub const SUITE: &str = "busy";
/// The default conntrack table sizes of the busy levels.
pub const DEFAULT_CONNTRACK: [usize; 2] = [20_000, 100_000];
/// The default number of veths on the bridge.
pub const DEFAULT_VETHS: usize = 100;
/// The default number of kube-proxy-style rules.
pub const DEFAULT_KUBE_RULES: usize = 5000;
/// Timed repetitions per row at most: Go's portmap calls over thousands of kube-proxy rules
/// and conntrack entries take a second or more each.
pub const BUSY_ITERATIONS: usize = 20;
/// The conntrack entries of the first two levels.
pub const BASE_CONNTRACK: usize = 1;
/// Rows of the kernel's share of a conntrack flush and dump.
pub const CONNTRACK: &str = "conntrack";
/// The case of portmap's iptables layout committed by this process alone.
pub const CASE_KERNEL_COMMIT: &str = "iptables layout: the kernel's commit alone";
/// The conntrack row of the flush the kernel makes itself.
pub const CASE_FLUSH_IN_KERNEL: &str = "UDP flush: one filtered delete (Linux 6.12+)";
/// The conntrack row of the flush by a filtered dump.
pub const CASE_FLUSH_BY_DUMP: &str = "UDP flush: filtered dump, exact deletes (Linux 5.9-6.11)";
/// The conntrack row of a whole-table dump.
pub const CASE_DUMP_ALL: &str = "dump of the whole IPv4 table";
/// Whole-table dumps timed per level at most (one takes half a second at 100 000 entries).
const DUMP_ALL_ITERATIONS: usize = 5;
/// Inserted entries live this long: longer than any run.
const ENTRY_TIMEOUT_SECS: u32 = 4 * 3600;
/// The UDP host port portmap's configs map (the flush the conntrack rows time).
const MAPPED_UDP_PORT: u16 = 5353;
/// Entries inserted per call of [`Conntrack::insert`], so that progress can be shown.
const INSERT_CHUNK: usize = 10_000;

/// A row measured on the busy node, with the node's state when it was.
#[derive(Debug, Clone)]
pub struct NodeRow {
    /// Conntrack entries inserted in the host namespace.
    pub conntrack: usize,
    /// kube-proxy-style rules in its `nat` table.
    pub kube_rules: usize,
    /// veths on its bridge.
    pub veths: usize,
    /// The row.
    pub row: Row,
}

/// The host namespace of the busy node and what it holds so far.
struct Node {
    host: TestNetns,
    _pods: TestNetns,
    _state: StateDirs,
    veths: usize,
    kube_rules: usize,
    conntrack: usize,
    conntrack_handle: Conntrack,
}

impl Node {
    /// The host namespace with the bridge and its `veths`, the pods' ends in another one.
    fn new(veths: usize) -> Result<Node> {
        let host = TestNetns::new("benchbusy-h")?;
        let pods = TestNetns::new("benchbusy-p")?;
        let state = StateDirs::of(&host)?;
        let mut batch = String::from(
            "link add cni0 type bridge\naddr add 10.95.0.1/16 dev cni0\nlink set cni0 up\n",
        );
        let mut peers = String::new();
        for i in 0..veths {
            batch.push_str(&format!(
                "link add vb{i} type veth peer name p{i} netns {}\nlink set vb{i} master cni0 up\n",
                pods.name()
            ));
            peers.push_str(&format!("link set p{i} up\n"));
        }
        ip_batch(&host, &batch)?;
        if veths > 0 {
            ip_batch(&pods, &peers)?;
        }
        let conntrack_handle = Conntrack::open_in(&host.netns()?)?;
        Ok(Node {
            host,
            _pods: pods,
            _state: state,
            veths,
            kube_rules: 0,
            conntrack: 0,
            conntrack_handle,
        })
    }

    /// Inserts entries until there are `count` of ours.
    fn fill_conntrack(&mut self, count: usize) -> Result<()> {
        while self.conntrack < count {
            let end = count.min(self.conntrack + INSERT_CHUNK);
            let flows: Vec<Flow> = (self.conntrack..end).map(background_flow).collect();
            self.conntrack_handle
                .insert(&flows, ENTRY_TIMEOUT_SECS)
                .with_context(|| format!("inserting conntrack entries up to {end}"))?;
            self.conntrack = end;
            if end < count {
                eprintln!("  busy: {end}/{count} conntrack entries");
            }
        }
        Ok(())
    }

    /// The namespace's conntrack entries, as the kernel counts them.
    fn conntrack_count(&self) -> Result<usize> {
        let text = self
            .host
            .run(|| std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count"))??;
        Ok(text.trim().parse()?)
    }

    /// Writes the kube-proxy-style rules, `count` of them, in one `iptables-restore`.
    fn install_kube_rules(&mut self, count: usize) -> Result<()> {
        ensure!(self.kube_rules == 0, "kube-proxy rules are written once");
        let script = kube_proxy_rules(count);
        let out = self.host.output(
            Command::new("iptables-restore").arg("--noflush"),
            script.as_bytes(),
            Duration::from_secs(120),
        )?;
        if !out.status.success() {
            bail!(
                "iptables-restore of {count} kube-proxy rules failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.kube_rules = count;
        Ok(())
    }
}

/// Runs `ip -batch -` with `commands` inside `ns`.
fn ip_batch(ns: &TestNetns, commands: &str) -> Result<()> {
    let out = ns.output(
        Command::new("ip").args(["-batch", "-"]),
        commands.as_bytes(),
        Duration::from_secs(60),
    )?;
    if !out.status.success() {
        bail!("ip -batch failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The `i`th background entry: see the module docs. Every `i` gives another source, so no
/// two collide.
fn background_flow(i: usize) -> Flow {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    const PORTS: [u16; 8] = [443, 80, 53, 6443, 9100, 10250, 8443, 3306];
    let proto = if i % 4 == 3 {
        L4Proto::Udp
    } else {
        L4Proto::Tcp
    };
    let [_, b1, b2, b3] = u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes();
    let (saddr, daddr) = if i % 10 == 9 {
        let [hi, lo] = [u16::from(b1), u16::from(b2) << 8 | u16::from(b3)];
        (
            IpAddr::V6(Ipv6Addr::new(0xfd96, 0, 0, 0, 0, 0, hi, lo)),
            IpAddr::V6(Ipv6Addr::new(0xfd44, 0, 0, 0, 0, 0, 0, 2 + (lo % 200))),
        )
    } else {
        (
            IpAddr::V4(Ipv4Addr::new(10, 96 + (b1 & 0x1f), b2, b3)),
            IpAddr::V4(Ipv4Addr::new(10, 244, b3 % 64, 2 + b2 % 200)),
        )
    };
    Flow {
        proto,
        saddr,
        daddr,
        sport: 32_768 + u16::try_from(i % 28_000).unwrap_or(0),
        dport: PORTS[i % PORTS.len()],
    }
}

/// A chain name of kube-proxy's shape: `KUBE-SVC-` or `KUBE-SEP-` and 16 characters.
fn kube_chain(prefix: &str, n: usize) -> String {
    // A fixed odd multiplier spreads the numbers over the 16 hex digits, like a hash.
    let hash = (n as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("{prefix}{hash:016X}")
}

/// An `iptables-restore --noflush` script of exactly `count` kube-proxy-style rules in `nat`
/// (see the module docs; fewer than the 7 fixed rules gives those only).
fn kube_proxy_rules(count: usize) -> String {
    let mut chains = vec![
        "KUBE-SERVICES".to_owned(),
        "KUBE-POSTROUTING".to_owned(),
        "KUBE-MARK-MASQ".to_owned(),
    ];
    let mut rules: Vec<String> = vec![
        r#"-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#.into(),
        r#"-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#.into(),
        r#"-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING"#.into(),
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000".into(),
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN".into(),
        "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0".into(),
        r#"-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully"#.into(),
    ];
    // Each service: its KUBE-SERVICES rule, the masquerade mark and two picks in its
    // KUBE-SVC chain, and two rules in each endpoint's KUBE-SEP chain.
    const PER_SERVICE: usize = 8;
    let mut service = 0;
    while rules.len() + PER_SERVICE <= count {
        let svc = kube_chain("KUBE-SVC-", service);
        let ip = format!("10.96.{}.{}", service / 250, service % 250 + 1);
        let name = format!("default/svc-{service}:http");
        rules.push(format!(
            r#"-A KUBE-SERVICES -d {ip}/32 -p tcp -m comment --comment "{name} cluster IP" -m tcp --dport 80 -j {svc}"#
        ));
        rules.push(format!(
            r#"-A {svc} ! -s 10.244.0.0/16 -d {ip}/32 -p tcp -m comment --comment "{name} cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ"#
        ));
        for endpoint in 0..2 {
            let sep = kube_chain("KUBE-SEP-", 2 * service + endpoint);
            let pod = format!(
                "10.244.{}.{}",
                (2 * service + endpoint) / 250 % 256,
                (2 * service + endpoint) % 250 + 2
            );
            let pick = if endpoint == 0 {
                "-m statistic --mode random --probability 0.50000000000 "
            } else {
                ""
            };
            rules.push(format!(
                r#"-A {svc} -m comment --comment "{name} -> {pod}:8080" {pick}-j {sep}"#
            ));
            rules.push(format!(
                r#"-A {sep} -s {pod}/32 -m comment --comment "{name}" -j KUBE-MARK-MASQ"#
            ));
            rules.push(format!(
                r#"-A {sep} -p tcp -m comment --comment "{name}" -m tcp -j DNAT --to-destination {pod}:8080"#
            ));
            chains.push(sep);
        }
        chains.push(svc);
        service += 1;
    }
    // The rest, to make `count` exactly: services without a KUBE-SVC chain of their own.
    let mut extra = 0;
    while rules.len() < count {
        rules.push(format!(
            r#"-A KUBE-SERVICES -d 10.97.{}.{}/32 -p tcp -m comment --comment "default/ext-{extra}:http" -m tcp --dport 80 -j KUBE-MARK-MASQ"#,
            extra / 250,
            extra % 250 + 1
        ));
        extra += 1;
    }
    let mut script = String::from("*nat\n");
    for chain in &chains {
        script.push_str(&format!(":{chain} - [0:0]\n"));
    }
    for rule in &rules {
        script.push_str(rule);
        script.push('\n');
    }
    script.push_str("COMMIT\n");
    script
}

/// `n` conntrack entries, in words.
#[must_use]
pub fn entries(n: usize) -> String {
    if n == 1 {
        "1 conntrack entry".to_owned()
    } else {
        format!("{n} conntrack entries")
    }
}

/// The busy levels as (conntrack entries, kube-proxy rules), in the order they are made.
fn levels(options: &Options) -> Vec<(usize, usize)> {
    let kube = options.busy_kube_rules;
    let mut levels = vec![(BASE_CONNTRACK, 0)];
    if kube > 0 {
        levels.push((BASE_CONNTRACK, kube));
    }
    let mut sizes: Vec<usize> = options
        .busy_conntrack
        .iter()
        .copied()
        .filter(|&n| n > BASE_CONNTRACK)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    levels.extend(sizes.into_iter().map(|n| (n, kube)));
    levels
}

/// Runs the suite.
///
/// # Errors
/// When the node cannot be made or an exec fails.
pub fn run(options: &Options) -> Result<Results> {
    let iterations = options.iterations.clamp(1, BUSY_ITERATIONS);
    let mut node = Node::new(options.busy_veths)?;
    let hostns = node.host.netns()?;
    let pm = TestNetns::new("benchbusy-pm")?;
    veth_pair(&node.host, "vpm0", &[], &pm, "eth0", &["10.95.0.2/16"])?;
    node.host.ip(&["link", "set", "vpm0", "master", "cni0"])?;
    portmap::make_shared_chains(&hostns, pm.path(), "10.95.0.2")?;

    let mut results = Results::default();
    let mut counts = Vec::new();
    let mut flushes: Vec<Flushes> = Vec::new();
    for (conntrack, kube) in levels(options) {
        if kube > node.kube_rules {
            node.install_kube_rules(kube)?;
        }
        node.fill_conntrack(conntrack)?;
        let counted = node.conntrack_count()?;
        counts.push(format!("{counted} at level {conntrack}"));
        eprintln!(
            "  busy: level of {} ({counted} counted), {kube} kube-proxy rules, {} veths",
            entries(conntrack),
            node.veths
        );
        // The kernel's commit is timed once after each iteration of the iptables backend's
        // lifecycle, finding the caches as a plugin's commit does (timed in a loop of its own,
        // the table stays in cache and the commit reads about a third faster).
        let mut commits = [Samples::default(), Samples::default(), Samples::default()];
        let mut probe = || -> Result<()> {
            let one = portmap::kernel_samples(&hostns, 1, false)?;
            for (all, new) in commits.iter_mut().zip(one) {
                all.0.extend(new.0);
            }
            Ok(())
        };
        let mut rows = portmap::rows_in(&hostns, pm.path(), "10.95.0.2", iterations, &mut probe)
            .with_context(|| format!("portmap at {}", entries(conntrack)))?;
        rows.extend(kernel_commit_rows(commits));
        let conntrack_rows = conntrack_rows(&mut node.conntrack_handle, iterations)?;
        let in_kernel = conntrack_rows
            .iter()
            .find(|r| r.case == CASE_FLUSH_IN_KERNEL)
            .map(|r| r.ours.median());
        let by_dump = conntrack_rows
            .iter()
            .find(|r| r.case == CASE_FLUSH_BY_DUMP)
            .map_or(Duration::ZERO, |r| r.ours.median());
        let portmap_ms = |case: &str, step: &str| {
            rows.iter()
                .find(|r| r.suite == "portmap" && r.case == case && r.step == step)
                .map_or(f64::NAN, |r| r.ours.median().as_secs_f64() * 1e3)
        };
        let calls = [
            portmap_ms(portmap::CASE_NFTABLES, "ADD"),
            portmap_ms(portmap::CASE_NFTABLES, "DEL"),
            portmap_ms(portmap::CASE_IPTABLES, "ADD"),
            portmap_ms(portmap::CASE_IPTABLES, "DEL"),
        ];
        flushes.push(Flushes {
            conntrack,
            kube,
            by_dump,
            in_kernel,
            calls,
        });
        rows.extend(conntrack_rows);
        if conntrack > BASE_CONNTRACK {
            rows.extend(every_plugin(&node.host, iterations)?);
        }
        results.busy.extend(rows.into_iter().map(|row| NodeRow {
            conntrack,
            kube_rules: kube,
            veths: node.veths,
            row,
        }));
    }
    results.notes.push(format!(
        "busy: the node is one host namespace with a bridge and {} veths on it, {} \
         kube-proxy-style rules in its nat table once the second level is made, and the \
         conntrack entries of each level inserted over netlink (the kernel counted {}: the \
         namespace's own traffic adds a few). Every plugin runs in that namespace with the \
         config of its own suite; {} timed iterations per row.",
        node.veths,
        node.kube_rules,
        counts.join(", "),
        iterations
    ));
    results.notes.push(floor_note(&flushes));
    Ok(results)
}

/// Every plugin but portmap, with the configs and containers of its own suite, `host` as
/// their host namespace.
fn every_plugin(host: &TestNetns, iterations: usize) -> Result<Vec<Row>> {
    let mut rows = tuning::rows_in(host, iterations).context("tuning on the busy node")?;
    rows.extend(bandwidth::rows_in(host, iterations).context("bandwidth on the busy node")?);
    rows.extend(sbr::rows_in(host, iterations).context("sbr on the busy node")?);
    for backend in ["iptables", "nftables"] {
        rows.extend(
            firewall::rows_in(host, backend, iterations)
                .with_context(|| format!("firewall {backend} on the busy node"))?,
        );
    }
    Ok(rows)
}

/// An in-process row of ours alone.
fn alone(suite: &str, case: &str, step: &str, ours: Samples) -> Row {
    Row {
        suite: suite.to_owned(),
        case: case.to_owned(),
        step: step.to_owned(),
        ours,
        reference: Samples::default(),
        reference_label: "–".to_owned(),
    }
}

/// The commit of one attachment of portmap's iptables layout, and of its removal, from the
/// samples of [`portmap::kernel_samples`].
fn kernel_commit_rows([add, del, _close]: [Samples; 3]) -> Vec<Row> {
    vec![
        alone("portmap", CASE_KERNEL_COMMIT, "ADD", add),
        alone("portmap", CASE_KERNEL_COMMIT, "DEL", del),
    ]
}

/// The UDP flush of portmap's mapped port (IPv4, any address), as the kernel makes it itself
/// (when it can) and by a filtered dump, and a whole-table dump, timed from this process.
fn conntrack_rows(ct: &mut Conntrack, iterations: usize) -> Result<Vec<Row>> {
    let filter = FlowFilter {
        proto: L4Proto::Udp,
        dport: MAPPED_UDP_PORT,
        daddr: None,
    };
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<Duration> {
        let start = Instant::now();
        f()?;
        Ok(start.elapsed())
    };
    let mut rows = Vec::new();
    ct.set_kernel_flush(true);
    let mut in_kernel = Samples::default();
    for i in 0..=iterations {
        let mut how = Deletion::InKernel;
        let took = time(&mut || {
            how = ct.delete(NfProto::Ipv4, &filter)?;
            Ok(())
        })?;
        if how != Deletion::InKernel {
            // This kernel deletes by filter no more (before Linux 6.12): no such row.
            in_kernel = Samples::default();
            break;
        }
        if i > 0 {
            in_kernel.push_time(took);
        }
    }
    if !in_kernel.is_empty() {
        rows.push(alone(CONNTRACK, CASE_FLUSH_IN_KERNEL, "flush", in_kernel));
    }
    ct.set_kernel_flush(false);
    let mut by_dump = Samples::default();
    for i in 0..=iterations {
        let took = time(&mut || Ok(ct.delete(NfProto::Ipv4, &filter).map(|_| ())?))?;
        if i > 0 {
            by_dump.push_time(took);
        }
    }
    ct.set_kernel_flush(true);
    rows.push(alone(CONNTRACK, CASE_FLUSH_BY_DUMP, "flush", by_dump));
    let mut whole = Samples::default();
    for i in 0..=iterations.min(DUMP_ALL_ITERATIONS) {
        let took = time(&mut || Ok(ct.flows(NfProto::Ipv4).map(|_| ())?))?;
        if i > 0 {
            whole.push_time(took);
        }
    }
    rows.push(alone(CONNTRACK, CASE_DUMP_ALL, "dump", whole));
    Ok(rows)
}

/// What the floor note reports of one level.
struct Flushes {
    conntrack: usize,
    kube: usize,
    /// The flush by filtered dump.
    by_dump: Duration,
    /// The flush the kernel makes itself, where it can.
    in_kernel: Option<Duration>,
    /// portmap's medians in ms: nftables ADD, DEL, iptables ADD, DEL.
    calls: [f64; 4],
}

/// The report's note on the kernel's floor: what one flush takes at each level, both ways,
/// beside portmap's ADD and DEL there.
fn floor_note(flushes: &[Flushes]) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let figures: Vec<String> = flushes
        .iter()
        .map(|f| {
            let kernel = f.in_kernel.map_or_else(
                || "no filtered delete on this kernel".to_owned(),
                |k| format!("{:.2} ms in the kernel", ms(k)),
            );
            let [nft_add, nft_del, ipt_add, ipt_del] = f.calls;
            format!(
                "at {} ({} kube-proxy rules) {kernel}, {:.2} ms by filtered dump, \
                 against portmap ADD / DEL {nft_add:.2} / {nft_del:.2} ms (nftables), \
                 {ipt_add:.2} / {ipt_del:.2} ms (iptables)",
                entries(f.conntrack),
                f.kube,
                ms(f.by_dump)
            )
        })
        .collect();
    format!(
        "busy: the floor of portmap's UDP conntrack flush (one port, IPv4), timed from the \
         bench process: {}. Either way the kernel walks its whole conntrack hash table, shared \
         by every namespace, and visits each entry in it: that walk grows with the entries \
         of the table, whatever the flush removes, and no request can avoid it (the table is \
         hashed on whole tuples, so entries to one port are found only by visiting all). It \
         is what stops the targets of portmap at 100000 entries over 1: what a call does \
         besides is the same at every level. A filtered dump also takes the lock of each of \
         the table's buckets (`net.netfilter.nf_conntrack_buckets`), which costs \
         milliseconds even with one entry; the filtered delete (Linux 6.12+) skips empty \
         buckets. Go flushes on ADD only, by a dump of the whole table (the whole-table dump \
         rows); its DEL flushes nothing, ours does (on ADD and DEL).",
        figures.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_rules_come_to_the_count_asked_in_chains_they_declare() {
        for count in [7, 8, 40, 5000, 5003] {
            let script = kube_proxy_rules(count);
            let rules: Vec<&str> = script.lines().filter(|l| l.starts_with("-A ")).collect();
            assert_eq!(rules.len(), count);
            for rule in rules {
                let chain = rule.split_whitespace().nth(1).unwrap();
                let builtin = ["PREROUTING", "OUTPUT", "POSTROUTING"].contains(&chain);
                assert!(
                    builtin || script.contains(&format!("\n:{chain} - [0:0]\n")),
                    "{chain} undeclared"
                );
                if let Some(target) = rule.split(" -j ").nth(1) {
                    let target = target.split_whitespace().next().unwrap();
                    if target.starts_with("KUBE-") {
                        assert!(
                            script.contains(&format!("\n:{target} - [0:0]\n")),
                            "{target}"
                        );
                    }
                }
            }
            assert!(script.starts_with("*nat\n") && script.ends_with("COMMIT\n"));
        }
        let chain = kube_chain("KUBE-SVC-", 3);
        assert_eq!(chain.len(), "KUBE-SVC-".len() + 16);
    }

    #[test]
    fn background_flows_are_distinct_and_never_portmaps_udp_port() {
        let flows: Vec<Flow> = (0..50_000).map(background_flow).collect();
        let mut keys: Vec<_> = flows
            .iter()
            .map(|f| (f.proto.number(), f.saddr, f.daddr, f.sport, f.dport))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), flows.len());
        assert!(flows.iter().all(|f| f.dport != MAPPED_UDP_PORT));
        assert!(flows.iter().all(|f| f.saddr.is_ipv4() == f.daddr.is_ipv4()));
        let udp = flows.iter().filter(|f| f.proto == L4Proto::Udp).count();
        let v6 = flows.iter().filter(|f| f.saddr.is_ipv6()).count();
        assert_eq!((udp, v6), (12_500, 5_000));
    }

    #[test]
    fn levels_start_with_one_entry_without_then_with_the_kube_rules() {
        let options = Options {
            busy_conntrack: vec![100_000, 20_000, 1],
            ..Options::default()
        };
        assert_eq!(
            levels(&options),
            [(1, 0), (1, 5000), (20_000, 5000), (100_000, 5000)]
        );
        let none = Options {
            busy_kube_rules: 0,
            busy_conntrack: vec![50],
            ..Options::default()
        };
        assert_eq!(levels(&none), [(1, 0), (50, 0)]);
    }
}
