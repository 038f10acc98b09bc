//! The main job, run by `scripts/demo.sh`: the full chain bridge → tuning → portmap → bandwidth
//! → firewall → sbr on live traffic in throwaway network namespaces. It prints what each plugin
//! did and which kernel objects it made, checks traffic (HTTP through the mapped port from
//! outside and from 127.0.0.1, throughput against the configured limits, a flow the firewall's
//! admin chain blocks, replies that only source routing lets out), and verifies that DEL removed
//! everything. Everything it creates is removed when it ends: also on failure, on SIGINT,
//! SIGTERM or SIGHUP, when its reader goes away (`demo | head`) and on a panic.
//!
//! `demo --help` prints what it does and exits; it takes no other argument.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use tests::netns::{CLIENT_V4, HOST_UPLINK_V4};
use tests::traffic::{IPERF3_PORT, TcpServer, UdpServer, http_get, iperf3, udp_request_from};
use tests::{NetworkConfigList, Runtime, RuntimeConf, TestNetns, Topology, cleanup, main_plugin};

const NETWORK: &str = "demo";
const CONTAINER_ID: &str = "demo-container-1";
const IFNAME: &str = "eth0";
const BRIDGE: &str = "cni-demo0";
const SUBNET: &str = "10.96.10.0/24";
const TIMEOUT: Duration = Duration::from_secs(3);
/// The MAC address `tuning` gives the container interface.
const TUNED_MAC: &str = "02:42:0a:60:0a:63";
/// The host port `portmap` forwards to the container's HTTP server on 8080.
const HOST_PORT: u16 = 18080;
/// `bandwidth`'s limits, in bits per second: towards the container and out of it.
const INGRESS_RATE: u64 = 40_000_000;
const EGRESS_RATE: u64 = 16_000_000;
/// The routing table `sbr` gives the container's address (its first free id).
const SBR_TABLE: &str = "100";
/// Seconds of each `iperf3` run.
const IPERF_SECS: u32 = 2;

/// What `--help` prints.
const USAGE: &str = "\
usage: demo

Runs the chain bridge -> tuning -> portmap -> bandwidth -> firewall -> sbr (bridge and host-local
from Debian's containernetworking-plugins, the rest ours, built beside it) in throwaway network
namespaces named cnidemo-*, on live traffic: HTTP through the mapped port, iperf3 against the
bandwidth limits, a flow the firewall's admin chain blocks, replies only source routing lets
out. It prints what each plugin did, runs CHECK and DEL, and verifies DEL removed everything.
Needs root. Everything it makes is removed when it ends, also when interrupted.

  --help  print this
";

/// Why the demo stops when stdout is gone: its reader went away (`demo | head`).
const STDOUT_GONE: &str = "stdout was closed";

/// The scratch directory (IPAM and tuning state), for the clean-up of a signal or a panic.
static SCRATCH: OnceLock<PathBuf> = OnceLock::new();

/// `println!` that fails instead of panicking when stdout is gone, so the demo stops and
/// cleans up.
macro_rules! say {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*).context(STDOUT_GONE)
    };
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        // A reader that went away (`demo --help | head -1`) is not an error.
        let _ = std::io::stdout().write_all(USAGE.as_bytes());
        return std::process::ExitCode::SUCCESS;
    }
    if let Some(arg) = args.first() {
        eprintln!("demo: unknown argument {arg:?}\n{USAGE}");
        return std::process::ExitCode::from(2);
    }
    // On a signal or a panic nothing unwinds: remove by name what the destructors would.
    let installed = cleanup::on_interrupt("demo", || {
        let pid = std::process::id();
        cleanup::kill_children_of(pid);
        let _ = cleanup::remove_namespaces_of(pid);
        if let Some(dir) = SCRATCH.get() {
            let _ = std::fs::remove_dir_all(dir);
        }
    });
    let result = installed.and_then(|()| run());
    cleanup::wait_if_interrupted();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.chain().any(|c| c.to_string() == STDOUT_GONE) => {
            eprintln!("demo: {STDOUT_GONE}; stopped, and removed everything it made");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("\ndemo failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn section(n: usize, title: &str) -> Result<()> {
    say!("\n[{n}] {title}")
}

fn ok(what: &str) -> Result<()> {
    say!("  ok  {what}")
}

/// Prints `lines` under a plugin's name, the name on the first line only.
fn plugin_lines(plugin: &str, lines: &[String]) -> Result<()> {
    for (i, line) in lines.iter().enumerate() {
        let name = if i == 0 { plugin } else { "" };
        say!("  {name:<10} {line}")?;
    }
    Ok(())
}

fn mbit(bits_per_second: f64) -> String {
    format!("{:.1} Mbit/s", bits_per_second / 1e6)
}

#[allow(clippy::too_many_lines)]
fn run() -> Result<()> {
    let started = Instant::now();
    say!("CNI meta plugins: a full chain on live traffic, in throwaway network namespaces")?;

    section(1, "namespaces")?;
    let topo = Topology::new("cnidemo")?;
    say!(
        "  host       {:<22} plays the node: the runtime and every plugin run here",
        topo.host.name()
    )?;
    say!(
        "  container  {:<22} the pod's namespace (CNI_NETNS)",
        topo.container.name()
    )?;
    say!(
        "  client     {:<22} an outside machine at {CLIENT_V4}, one hop away (host side {HOST_UPLINK_V4})",
        topo.client.name()
    )?;

    let scratch = tempfile::tempdir()?;
    let mut bridge = main_plugin::bridge(BRIDGE, &[SUBNET], &scratch.path().join("ipam"));
    // No default route from IPAM: the container's way out is the one sbr puts in its table.
    bridge["ipam"]["routes"] = json!([]);
    let list = NetworkConfigList::new(
        NETWORK,
        "1.0.0",
        vec![
            bridge,
            json!({
                "type": "tuning",
                "dataDir": scratch.path().join("tuning"),
                "mac": TUNED_MAC,
                "mtu": 1400,
                "sysctl": { "net.ipv4.conf.IFNAME.arp_ignore": "1" },
            }),
            json!({ "type": "portmap", "backend": "nftables", "capabilities": { "portMappings": true } }),
            json!({ "type": "bandwidth",
                    "ingressRate": INGRESS_RATE, "ingressBurst": 400_000,
                    "egressRate": EGRESS_RATE, "egressBurst": 160_000 }),
            json!({ "type": "firewall", "backend": "iptables" }),
            // The hints keep the subnet's link route in main, where bridge's own CHECK looks
            // for the gateway; every other route, the default among them, moves to table 100.
            json!({ "type": "sbr", "addSourceHints": true }),
        ],
    );
    let runtime = Runtime::new(&topo.host)?;
    let rt = RuntimeConf::new(CONTAINER_ID, topo.container.path(), IFNAME)
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAME", "demo")
        .with_capability(
            "portMappings",
            json!([{ "hostPort": HOST_PORT, "containerPort": 8080, "protocol": "tcp" }]),
        );

    section(
        2,
        &format!("ADD  network {NETWORK:?}, container {CONTAINER_ID:?}, ifname {IFNAME}"),
    )?;
    let types: Vec<&str> = list
        .plugins
        .iter()
        .map(|p| p["type"].as_str().unwrap_or_default())
        .collect();
    say!(
        "  conflist, cniVersion {}: {}",
        list.cni_version,
        types.join(" → ")
    )?;
    for plugin_type in &types {
        say!(
            "    {plugin_type:<10} {}",
            plugin_origin(&runtime, plugin_type)?
        )?;
    }
    say!()?;
    let t = Instant::now();
    let steps = runtime.add_steps(&list, &rt)?;
    let add_time = t.elapsed();
    let result = steps.last().map(|(_, r)| r.clone()).unwrap_or_default();
    let container_ip = tests::result::address(&result, false)?;
    let mut prev = Value::Null;
    for (plugin_type, step) in &steps {
        let mut lines = result_changes(&prev, step);
        lines.extend(plugin_effects(
            plugin_type,
            scratch.path(),
            &topo,
            &container_ip,
        )?);
        plugin_lines(plugin_type, &lines)?;
        prev = step.clone();
    }
    say!("  the whole chain's ADD took {} ms", add_time.as_millis())?;

    section(3, "live traffic")?;
    let _web = TcpServer::http(
        &topo.container,
        SocketAddr::from(([0, 0, 0, 0], 8080)),
        "hello from the container\n",
    )?;
    let mapped: SocketAddr = format!("{HOST_UPLINK_V4}:{HOST_PORT}").parse()?;
    let reply = http_get(&topo.client, mapped, "/", TIMEOUT)
        .context("HTTP from the client to the host port portmap forwards")?;
    ensure!(
        reply.status == 200,
        "HTTP status {} via portmap",
        reply.status
    );
    ok(&format!(
        "portmap    client -> {mapped} -> container :8080  HTTP {} {:?}",
        reply.status,
        reply.body.trim()
    ))?;
    let local: SocketAddr = format!("127.0.0.1:{HOST_PORT}").parse()?;
    let reply = http_get(&topo.host, local, "/", TIMEOUT)
        .context("HTTP from the host's 127.0.0.1 to the mapped port")?;
    ensure!(
        reply.status == 200,
        "HTTP status {} via 127.0.0.1",
        reply.status
    );
    ok(&format!(
        "portmap    host -> {local} -> container :8080  HTTP {} (localhost DNAT, masqueraded)",
        reply.status
    ))?;

    // iperf3's receiver is its client here (-R), so the figures are what arrived.
    let in_server: SocketAddr = format!("{CLIENT_V4}:{IPERF3_PORT}").parse()?;
    let into = iperf3(
        &topo.client,
        in_server,
        &topo.container,
        in_server,
        IPERF_SECS,
        &["-R", "-B", &container_ip],
    )
    .context("iperf3 into the container")?;
    let out_server: SocketAddr = format!("{container_ip}:{IPERF3_PORT}").parse()?;
    let out_of = iperf3(
        &topo.container,
        out_server,
        &topo.client,
        out_server,
        IPERF_SECS,
        &["-R"],
    )
    .context("iperf3 out of the container")?;
    #[allow(clippy::cast_precision_loss)]
    for (report, limit, what) in [
        (
            &into,
            INGRESS_RATE,
            "into the container (ingressRate, tbf on the host veth)",
        ),
        (
            &out_of,
            EGRESS_RATE,
            "out of the container (egressRate, tbf on the IFB)",
        ),
    ] {
        let limit = limit as f64;
        ensure!(
            report.bits_per_second <= limit * 1.1 && report.bits_per_second >= limit * 0.5,
            "{} measured {what}, against a limit of {}",
            mbit(report.bits_per_second),
            mbit(limit)
        );
        ok(&format!(
            "bandwidth  {} {what}; limit {}",
            mbit(report.bits_per_second),
            mbit(limit)
        ))?;
    }

    let web: SocketAddr = format!("{container_ip}:8080").parse()?;
    let drop_rule = ["-s", CLIENT_V4, "-d", &container_ip, "-j", "DROP"];
    topo.host
        .exec_ok("iptables", &[&["-A", "CNI-ADMIN"][..], &drop_rule].concat())?;
    let blocked = http_get(&topo.client, web, "/", Duration::from_millis(500)).is_err();
    topo.host
        .exec_ok("iptables", &[&["-D", "CNI-ADMIN"][..], &drop_rule].concat())?;
    ensure!(blocked, "the admin chain's DROP did not block the client");
    http_get(&topo.client, web, "/", TIMEOUT).context("HTTP once the DROP is gone")?;
    ok(&format!(
        "firewall   client -> {web} blocked while CNI-ADMIN drops it (the operator's chain comes first); flows again once removed"
    ))?;

    let unrouted = topo.container.exec("ip", &["route", "get", CLIENT_V4])?;
    ensure!(
        !unrouted.status.success(),
        "the container's main table routes {CLIENT_V4}: {}",
        String::from_utf8_lossy(&unrouted.stdout)
    );
    let routed = topo
        .container
        .ip(&["route", "get", CLIENT_V4, "from", &container_ip])?;
    ensure!(
        routed.contains(&format!("table {SBR_TABLE}")),
        "replies from {container_ip} are not routed by table {SBR_TABLE}: {routed}"
    );
    let echo_addr: SocketAddr = format!("{CLIENT_V4}:5353").parse()?;
    let echo = UdpServer::echo(&topo.client, echo_addr)?;
    let source: SocketAddr = format!("{container_ip}:0").parse()?;
    let answer = udp_request_from(&topo.container, source, echo_addr, b"ping", TIMEOUT)?;
    ensure!(answer == b"ping", "UDP echo answered {answer:?}");
    ok(&format!(
        "sbr        the container's main table has no route to {CLIENT_V4} (`ip route get` fails),"
    ))?;
    ok(&format!(
        "           yet every reply above went out: `from {container_ip}` selects table {SBR_TABLE} ({})",
        squeeze(routed.lines().next().unwrap_or_default())
    ))?;
    ok(&format!(
        "sbr        container {container_ip} -> client {echo_addr} UDP echo answered, seen from {}",
        echo.peers()
            .first()
            .map_or_else(|| "?".into(), ToString::to_string)
    ))?;

    section(4, "CHECK")?;
    runtime.check(&list, &rt)?;
    ok("every plugin verified its part of the attachment")?;

    section(5, "DEL (plugins in reverse order), then what is left")?;
    let ifb = result["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["name"].as_str())
        .find(|n| n.starts_with("bwp"))
        .map(str::to_owned)
        .context("bandwidth put no IFB in the result")?;
    let t = Instant::now();
    runtime.del(&list, &rt)?;
    let del_time = t.elapsed();
    verify_cleanup(&topo, scratch.path(), &container_ip, &ifb)?;
    runtime.del(&list, &rt)?;
    ok(&format!(
        "a second DEL succeeds too (DEL is idempotent); the first took {} ms",
        del_time.as_millis()
    ))?;

    say!(
        "\ndone in {:.1} s; the namespaces are removed now",
        started.elapsed().as_secs_f64()
    )?;
    Ok(())
}

/// Checks, plugin by plugin, that DEL left nothing of the attachment behind.
fn verify_cleanup(topo: &Topology, scratch: &Path, container_ip: &str, ifb: &str) -> Result<()> {
    ensure!(
        !topo.container.has_link(IFNAME)?,
        "{IFNAME} still exists in the container"
    );
    let ports = topo.host.ip(&["-br", "link", "show", "master", BRIDGE])?;
    ensure!(ports.trim().is_empty(), "ports left on {BRIDGE}: {ports}");
    ok(&format!(
        "bridge     {IFNAME} and its host veth are gone (the bridge {BRIDGE} stays, as bridge leaves it)"
    ))?;
    ensure!(
        !scratch
            .join("tuning")
            .join(format!("{CONTAINER_ID}_{IFNAME}.json"))
            .exists(),
        "tuning left its backup file"
    );
    ok(
        "tuning     its backup file is gone (DEL restored the originals from it before bridge deleted eth0)",
    )?;
    let left = portmap_elements(&topo.host)?;
    ensure!(left.is_empty(), "portmap left {left:?}");
    ok("portmap    its map elements are gone (the table stays, a long-lived skeleton)")?;
    ensure!(
        !topo.host.link_names()?.iter().any(|l| l == ifb),
        "bandwidth left the IFB {ifb}"
    );
    let qdiscs = shaping_qdiscs(&topo.host)?;
    ensure!(qdiscs.is_empty(), "bandwidth left qdiscs: {qdiscs:?}");
    ok(&format!(
        "bandwidth  the IFB {ifb} and every tbf and ingress qdisc are gone (DEL deleted them before it returned)"
    ))?;
    let rules = firewall_rules(&topo.host, container_ip)?;
    ensure!(rules.is_empty(), "firewall left {rules:?}");
    ok(&format!(
        "firewall   no iptables rule names {container_ip} any more"
    ))?;
    let rules = sbr_rules(&topo.container, container_ip)?;
    ensure!(rules.is_empty(), "sbr left {rules:?}");
    ok(&format!(
        "sbr        no rule `from {container_ip}` is left in the container"
    ))?;
    Ok(())
}

/// Where the runtime finds a plugin: ours (built here) or Debian's Go reference.
fn plugin_origin(runtime: &Runtime, plugin_type: &str) -> Result<String> {
    let path = runtime.find_plugin(plugin_type)?;
    let whose = if path.starts_with(tests::bins::reference_dir()) {
        "Go, from Debian's containernetworking-plugins: the main plugin"
    } else {
        "ours"
    };
    Ok(format!("{} ({whose})", path.display()))
}

/// What a plugin added to the result it was given: interfaces, IPs, routes.
fn result_changes(prev: &Value, result: &Value) -> Vec<String> {
    let added = |key: &str| -> Vec<Value> {
        let before = prev[key].as_array().cloned().unwrap_or_default();
        result[key]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|v| !before.contains(v))
            .collect()
    };
    let mut lines = Vec::new();
    for iface in added("interfaces") {
        let place = if iface["sandbox"].is_string() {
            "in the container"
        } else {
            "on the host"
        };
        lines.push(format!(
            "result: interface {} {place}, mac {}",
            iface["name"].as_str().unwrap_or("?"),
            iface["mac"].as_str().unwrap_or("-")
        ));
    }
    for ip in added("ips") {
        lines.push(format!(
            "result: address {} gateway {}",
            ip["address"].as_str().unwrap_or("?"),
            ip["gateway"].as_str().unwrap_or("-")
        ));
    }
    for route in added("routes") {
        lines.push(format!(
            "result: route {} via {}",
            route["dst"].as_str().unwrap_or("?"),
            route["gw"].as_str().unwrap_or("(gateway of the address)")
        ));
    }
    lines
}

/// The kernel objects (and files) a plugin made, read back from the kernel.
fn plugin_effects(
    plugin_type: &str,
    scratch: &Path,
    topo: &Topology,
    container_ip: &str,
) -> Result<Vec<String>> {
    match plugin_type {
        "bridge" => {
            let mut lines: Vec<String> = topo
                .host
                .ip(&["-br", "link", "show", "master", BRIDGE])?
                .lines()
                .map(|l| format!("host: veth {} on bridge {BRIDGE}", first_word(l)))
                .collect();
            lines.push(format!(
                "container: {}",
                squeeze(&topo.container.ip(&["-br", "addr", "show", "dev", IFNAME])?)
            ));
            Ok(lines)
        }
        "tuning" => {
            let file = scratch
                .join("tuning")
                .join(format!("{CONTAINER_ID}_{IFNAME}.json"));
            let saved: Value = serde_json::from_slice(
                &std::fs::read(&file).with_context(|| format!("{file:?}"))?,
            )?;
            let sysctls: Vec<String> = saved["sysctls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    format!(
                        "{} {} -> 1",
                        s["key"].as_str().unwrap_or("?").replace('/', "."),
                        s["value"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            Ok(vec![
                format!(
                    "container: {IFNAME} mac {} -> {TUNED_MAC}, mtu {} -> 1400",
                    saved["mac"].as_str().unwrap_or("?"),
                    saved["mtu"],
                ),
                format!("container: sysctl {}", sysctls.join(", ")),
                format!("file: the originals, for DEL, in {}", file.display()),
            ])
        }
        "portmap" => {
            let localnet = topo
                .host
                .sysctl(&format!("net.ipv4.conf.{BRIDGE}.route_localnet"))?;
            Ok(portmap_elements(&topo.host)?
                .into_iter()
                .map(|e| format!("host: nftables ip cni_portmap, {e}"))
                .chain(std::iter::once(format!(
                    "host: net.ipv4.conf.{BRIDGE}.route_localnet = {} (so 127.0.0.1:{HOST_PORT} works)",
                    localnet.trim()
                )))
                .collect())
        }
        "bandwidth" => Ok(shaping_qdiscs(&topo.host)?
            .into_iter()
            .map(|q| format!("host: {q}"))
            .collect()),
        "firewall" => Ok(firewall_rules(&topo.host, container_ip)?
            .into_iter()
            .map(|r| format!("host: iptables {r}"))
            .collect()),
        "sbr" => {
            let mut lines: Vec<String> = sbr_rules(&topo.container, container_ip)?
                .into_iter()
                .map(|r| format!("container: rule {r}"))
                .collect();
            lines.extend(
                topo.container
                    .ip(&["route", "show", "table", SBR_TABLE])?
                    .lines()
                    .map(|r| format!("container: table {SBR_TABLE}: {}", r.trim())),
            );
            let main = topo.container.ip(&["route", "show", "dev", IFNAME])?;
            lines.push(format!(
                "container: main table routes of {IFNAME}: {}",
                if main.trim().is_empty() {
                    "none left"
                } else {
                    main.trim()
                }
            ));
            Ok(lines)
        }
        _ => Ok(Vec::new()),
    }
}

fn first_word(line: &str) -> &str {
    line.split_whitespace().next().unwrap_or_default()
}

/// `line` with runs of whitespace made single spaces.
fn squeeze(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A `tc` line's words without the reference count and the dashes `tc` pads some with.
fn tc_words(line: &str) -> String {
    let mut words = Vec::new();
    let mut it = line.split_whitespace();
    while let Some(word) = it.next() {
        if word == "refcnt" {
            it.next();
        } else if !word.starts_with("---") {
            words.push(word);
        }
    }
    words.join(" ")
}

/// The host's tbf and ingress qdiscs and the redirect filters feeding the IFBs, as `tc` shows
/// them (without the reference counts).
fn shaping_qdiscs(host: &TestNetns) -> Result<Vec<String>> {
    let mut found: Vec<String> = host
        .exec_ok("tc", &["qdisc", "show"])?
        .lines()
        .filter(|l| l.contains(" tbf ") || l.contains(" ingress "))
        .map(tc_words)
        .collect();
    let ingress: Vec<String> = found
        .iter()
        .filter(|l| l.contains(" ingress "))
        .filter_map(|l| l.split(" dev ").nth(1).map(first_word).map(str::to_owned))
        .collect();
    for dev in ingress {
        let filters = host.exec_ok("tc", &["filter", "show", "dev", &dev, "parent", "ffff:"])?;
        found.extend(
            filters
                .lines()
                .filter(|l| l.contains("mirred"))
                .map(|l| format!("filter on {dev}: {}", squeeze(l))),
        );
    }
    Ok(found)
}

/// The iptables rules (filter table) naming `ip`, as `iptables-save` prints them.
fn firewall_rules(host: &TestNetns, ip: &str) -> Result<Vec<String>> {
    Ok(host
        .exec_ok("iptables-save", &["-t", "filter"])?
        .lines()
        .filter(|l| l.starts_with("-A") && l.contains(&format!("{ip}/32")))
        .map(str::to_owned)
        .collect())
}

/// The policy rules selecting on `from <ip>` in `ns`.
fn sbr_rules(ns: &TestNetns, ip: &str) -> Result<Vec<String>> {
    Ok(ns
        .ip(&["rule"])?
        .lines()
        .filter(|l| l.contains(&format!("from {ip} ")))
        .map(squeeze)
        .collect())
}

/// The elements of the attachment in portmap's nftables maps and sets, as `nft` lists them.
fn portmap_elements(host: &TestNetns) -> Result<Vec<String>> {
    let out = host.exec("nft", &["list", "table", "ip", "cni_portmap"])?;
    let owner = format!("comment \"{NETWORK}/{CONTAINER_ID}/{IFNAME}\"");
    let mut found = Vec::new();
    let mut set = String::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim();
        if let Some(rest) = line
            .strip_prefix("map ")
            .or_else(|| line.strip_prefix("set "))
        {
            set = rest.trim_end_matches(" {").to_string();
        }
        let line = line.trim_start_matches("elements = {").trim();
        for element in line.split(", ").filter(|e| e.contains(&owner)) {
            let element = element.replace(&owner, "").replace("  ", " ");
            let element = element.trim_end_matches(['}', ',', ' ']).trim();
            found.push(format!("{set}: {element}"));
        }
    }
    Ok(found)
}
