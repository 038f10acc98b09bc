//! Soak: 1000 ADD/DEL cycles of the full chain (Go `bridge` + `host-local` → tuning → portmap →
//! bandwidth → firewall → sbr) in one container namespace, a new container ID each cycle (as a
//! node sees pods come and go), proving that nothing accumulates and that our plugins' peak RSS
//! does not grow with the node's history.
//!
//! The cycles alternate between two variants of the chain, so both backends of portmap and
//! firewall are soaked: even cycles use the demo's chain (portmap nftables, firewall
//! iptables), odd cycles the other backends (portmap iptables, firewall nftables).
//!
//! - Leaks: after the first two cycles (which create what stays for good: the bridge,
//!   portmap's table and chains, firewall's chains, lock files) the host namespace (links,
//!   addresses, routes, rules, qdiscs, nftables with set and map elements, iptables,
//!   ip6tables), the plugins' state directories (host-local, tuning backups, portmap and
//!   firewall state under `/run`), the container namespace and the UDP conntrack entries of
//!   the mapped ports are snapshotted; after the last cycle they must be identical. No
//!   process may be left in the host namespace once DEL returned.
//! - Traffic: in two consecutive cycles of every [`TRAFFIC_EVERY`] the chain is CHECKed and a TCP connection and a
//!   UDP exchange go from the client through the mapped host ports to servers in the
//!   container. The UDP flow's conntrack entry must exist before DEL and be gone after it
//!   (portmap flushes the UDP entries of its ports); so the final comparison also covers
//!   conntrack entries that would have leaked.
//! - Peak RSS: every plugin execution is reaped with `wait4`. For each variant, plugin and
//!   verb (ADD, DEL), the largest peak RSS of the last [`RSS_WINDOW`] cycles must not exceed that of the
//!   first ones (after a warm-up cycle) by more than [`RSS_TOLERANCE_KIB`]: a fresh process
//!   given the same input must not need more memory because the node has seen more. The
//!   figures are printed.
//!
//! One test, about 2–3 minutes on two cores (a cycle costs 120–150 ms, two thirds of it
//! in the Go bridge); the measured cost is printed.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use netfilter::conntrack::{Conntrack, Flow};
use netfilter::nft::{L4Proto, NfProto};
use serde_json::{Value, json};
use tests::chain::{Chain, RssSample};
use tests::netns::HOST_UPLINK_V4;
use tests::netns::StateDirs;
use tests::snapshot::{self, Scope, Snapshot};
use tests::traffic::{TcpServer, UdpServer, tcp_request, udp_request};
use tests::{NetworkConfigList, Runtime, RuntimeConf, TestNetns, Topology, main_plugin};

/// ADD/DEL cycles.
const CYCLES: usize = 1000;
/// Every this many cycles: CHECK and real traffic through the mapped ports.
const TRAFFIC_EVERY: usize = 100;
/// Cycles per variant at each end of the soak whose peak RSS are compared.
const RSS_WINDOW: usize = 50;
/// How much larger the late peak RSS may be than the early one.
const RSS_TOLERANCE_KIB: u64 = 512;
const NETWORK: &str = "soaknet";
const BRIDGE: &str = "soakbr0";
const SUBNETS: [&str; 2] = ["10.124.0.0/24", "fd12:4::/64"];
const IFNAME: &str = "eth0";
const TCP_HOST_PORT: u16 = 22080;
const UDP_HOST_PORT: u16 = 22053;
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 5353;
const BANNER: &str = "soak";
const TIMEOUT: Duration = Duration::from_secs(3);

/// The chain with portmap's and firewall's backends.
fn chain(scratch: &std::path::Path, portmap: &str, firewall: &str) -> NetworkConfigList {
    NetworkConfigList::new(
        NETWORK,
        "1.0.0",
        vec![
            main_plugin::bridge(BRIDGE, &SUBNETS, &scratch.join("ipam")),
            json!({
                "type": "tuning",
                "dataDir": scratch.join("tuning"),
                "capabilities": {"mac": true},
                "mtu": 1400,
                "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"},
            }),
            json!({
                "type": "portmap",
                "backend": portmap,
                "capabilities": {"portMappings": true},
            }),
            json!({
                "type": "bandwidth",
                "ingressRate": 50_000_000, "ingressBurst": 500_000,
                "egressRate": 20_000_000, "egressBurst": 200_000,
            }),
            json!({"type": "firewall", "backend": firewall}),
            // A fixed table keeps the routes in main, where bridge's own CHECK looks for them.
            json!({"type": "sbr", "table": 100}),
        ],
    )
}

fn runtime_conf(cycle: usize, container: &TestNetns) -> RuntimeConf {
    RuntimeConf::new(&format!("soak-{cycle:04}"), container.path(), IFNAME)
        .with_capability(
            "portMappings",
            json!([
                {"hostPort": TCP_HOST_PORT, "containerPort": TCP_PORT, "protocol": "tcp"},
                {"hostPort": UDP_HOST_PORT, "containerPort": UDP_PORT, "protocol": "udp"},
            ]),
        )
        .with_capability("mac", json!("02:42:0a:7c:00:02"))
}

/// The host's conntrack entries whose original direction goes to one of our host ports.
fn flows_to_our_ports(host: &TestNetns) -> Result<Vec<Flow>> {
    let mut conntrack = Conntrack::open_in(&host.netns()?)?;
    let mut flows = Vec::new();
    for version in [NfProto::Ipv4, NfProto::Ipv6] {
        flows.extend(conntrack.flows(version)?.into_iter().filter(|f| {
            (f.proto == L4Proto::Tcp && f.dport == TCP_HOST_PORT)
                || (f.proto == L4Proto::Udp && f.dport == UDP_HOST_PORT)
        }));
    }
    Ok(flows)
}

fn udp_flows(flows: &[Flow]) -> Vec<String> {
    let mut lines: Vec<String> = flows
        .iter()
        .filter(|f| f.proto == L4Proto::Udp)
        .map(|f| format!("{f:?}"))
        .collect();
    lines.sort();
    lines
}

/// Everything that must be the same before and after the soak.
fn state(topo: &Topology, scratch: &std::path::Path, run: &StateDirs) -> Result<Vec<Snapshot>> {
    // A plugin is done when it exits: nothing of ours may still run once DEL returned.
    snapshot::wait_for_no_processes(&topo.host, Duration::ZERO)?;
    let mut host = Scope::netns(&topo.host)
        .dir("host-local", scratch.join("ipam"))
        .dir("tuning", scratch.join("tuning"));
    for (label, dir) in ["portmap", "firewall"].iter().zip(run.dirs()) {
        host = host.dir(label, dir);
    }
    Ok(vec![
        host.take()?,
        Scope::netns(&topo.container).without_netfilter().take()?,
    ])
}

/// CHECK, then a TCP connection and a UDP exchange from the client through the host ports;
/// the UDP flow must be tracked now (so that DEL has something to flush).
fn exercise(driver: &Chain<'_>, topo: &Topology, rt: &RuntimeConf, result: &Value) -> Result<()> {
    driver.check(rt, result).context("CHECK")?;
    let host =
        |port: u16| -> Result<SocketAddr> { Ok(format!("{HOST_UPLINK_V4}:{port}").parse()?) };
    let reply = tcp_request(&topo.client, host(TCP_HOST_PORT)?, b"", TIMEOUT)
        .context("TCP through the mapped port")?;
    ensure!(reply == BANNER.as_bytes(), "TCP answered {reply:?}");
    let echo = udp_request(&topo.client, host(UDP_HOST_PORT)?, b"ping", TIMEOUT)
        .context("UDP through the mapped port")?;
    ensure!(echo == b"ping", "UDP answered {echo:?}");
    let udp = udp_flows(&flows_to_our_ports(&topo.host)?);
    ensure!(
        !udp.is_empty(),
        "the UDP exchange left no conntrack entry to flush"
    );
    Ok(())
}

/// `(variant, plugin, verb)` → peak RSS (KiB) and wall time of each execution, in order.
type Series = BTreeMap<(usize, String, String), Vec<(u64, Duration)>>;

fn record(series: &mut Series, variant: usize, samples: Vec<RssSample>) {
    for s in samples {
        series
            .entry((variant, s.plugin, s.command))
            .or_default()
            .push((s.max_rss_kib, s.elapsed));
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

#[test]
fn a_thousand_full_chain_cycles_leak_nothing_and_keep_peak_rss_flat() -> Result<()> {
    let topo = Topology::new("soak")?;
    let run = StateDirs::of(&topo.host)?;
    let scratch = tempfile::tempdir()?;
    let runtime = Runtime::new(&topo.host)?;
    let lists = [
        chain(scratch.path(), "nftables", "iptables"),
        chain(scratch.path(), "iptables", "nftables"),
    ];
    let drivers = [
        Chain::new(&runtime, &lists[0]).measuring_rss(),
        Chain::new(&runtime, &lists[1]).measuring_rss(),
    ];
    let _tcp = TcpServer::banner(
        &topo.container,
        SocketAddr::from(([0, 0, 0, 0], TCP_PORT)),
        BANNER,
    )?;
    let _udp = UdpServer::echo(&topo.container, SocketAddr::from(([0, 0, 0, 0], UDP_PORT)))?;

    let mut series = Series::new();
    let mut baseline = None;
    let started = Instant::now();
    let mut measured_from = started;
    for cycle in 0..CYCLES {
        let variant = cycle % 2;
        let driver = &drivers[variant];
        let rt = runtime_conf(cycle, &topo.container);
        let result = driver
            .add(&rt)
            .with_context(|| format!("ADD of cycle {cycle}"))?;
        // Two consecutive cycles, so that both variants carry traffic.
        let traffic = cycle % TRAFFIC_EVERY / 2 == TRAFFIC_EVERY / 4;
        if traffic {
            exercise(driver, &topo, &rt, &result)
                .with_context(|| format!("cycle {cycle}, variant {variant}"))?;
        }
        driver
            .del(&rt, Some(&result))
            .with_context(|| format!("DEL of cycle {cycle}"))?;
        if traffic {
            let udp = udp_flows(&flows_to_our_ports(&topo.host)?);
            ensure!(
                udp.is_empty(),
                "cycle {cycle}: UDP entries after DEL: {udp:?}"
            );
        }
        let samples = driver.take_rss_samples();
        record(&mut series, variant, samples);
        if cycle == 1 {
            let udp = udp_flows(&flows_to_our_ports(&topo.host)?);
            ensure!(udp.is_empty(), "UDP entries after DEL: {udp:?}");
            baseline = Some(state(&topo, scratch.path(), &run)?);
            measured_from = Instant::now();
        }
    }
    let elapsed = measured_from.elapsed();
    let per_cycle = elapsed / u32::try_from(CYCLES - 2)?;
    println!(
        "soak: {CYCLES} cycles in {:.1} s, {per_cycle:?} per cycle, {} code-11 retries",
        started.elapsed().as_secs_f64(),
        drivers.iter().map(Chain::retries).sum::<u64>()
    );

    let baseline = baseline.context("no baseline")?;
    let end = state(&topo, scratch.path(), &run)?;
    for (what, (before, after)) in ["host", "container"].iter().zip(baseline.iter().zip(&end)) {
        before.ensure_same(
            after,
            &format!("{what} after cycle 1 vs after the last cycle"),
        )?;
    }
    let udp = udp_flows(&flows_to_our_ports(&topo.host)?);
    ensure!(udp.is_empty(), "UDP conntrack entries left: {udp:?}");

    let mut grown = Vec::new();
    println!(
        "peak RSS (KiB, max of {RSS_WINDOW} cycles per variant) first / last, and median time"
    );
    for ((variant, plugin, verb), values) in &series {
        let time = median(values.iter().map(|(_, t)| *t).collect());
        // CHECK runs in a few cycles only, and the Go bridge is not ours.
        if plugin == "bridge" || verb == "CHECK" {
            println!(
                "  variant {variant} {plugin:9} {verb:5} {:>15} {time:>10.1?}",
                ""
            );
            continue;
        }
        let rss = |it: &mut dyn Iterator<Item = &(u64, Duration)>| {
            it.map(|(kib, _)| *kib).max().unwrap_or(0)
        };
        // The first execution of each is a warm-up (it may create what stays for good).
        let first = rss(&mut values.iter().skip(1).take(RSS_WINDOW));
        let last = rss(&mut values.iter().rev().take(RSS_WINDOW));
        let line =
            format!("  variant {variant} {plugin:9} {verb:5} {first:6} / {last:6} {time:>10.1?}");
        println!("{line}");
        if last > first + RSS_TOLERANCE_KIB {
            grown.push(line);
        }
    }
    ensure!(
        grown.is_empty(),
        "peak RSS grew by more than {RSS_TOLERANCE_KIB} KiB:\n{}",
        grown.join("\n")
    );
    Ok(())
}
