//! The main job, run by `scripts/demo.sh`: a real plugin chain on live traffic in throwaway
//! network namespaces, printing what each plugin did, what the kernel shows and which traffic
//! got through. Everything it creates is removed when it ends, also on failure.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use tests::netns::{CLIENT_V4, HOST_UPLINK_V4};
use tests::traffic::{TcpServer, UdpServer, http_get, tcp_request, udp_request};
use tests::{NetworkConfigList, Runtime, RuntimeConf, Topology, main_plugin};

const NETWORK: &str = "demo";
const CONTAINER_ID: &str = "demo-container-1";
const IFNAME: &str = "eth0";
const SUBNET: &str = "10.96.10.0/24";
const TIMEOUT: Duration = Duration::from_secs(3);
/// The MAC address `tuning` gives the container interface.
const TUNED_MAC: &str = "02:42:0a:60:0a:63";
/// The host port `portmap` forwards to the container's HTTP server on 8080.
const HOST_PORT: u16 = 18080;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ndemo failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn section(n: usize, title: &str) {
    println!("\n[{n}] {title}");
}

fn ok(what: &str) {
    println!("  ok  {what}");
}

fn run() -> Result<()> {
    let started = Instant::now();
    println!("CNI meta plugins: a live chain in throwaway network namespaces");

    section(1, "namespaces");
    let topo = Topology::new("cnidemo")?;
    println!(
        "  host       {:<22} plays the node: the main plugin and our host-side work run here",
        topo.host.name()
    );
    println!(
        "  container  {:<22} the pod's namespace (CNI_NETNS)",
        topo.container.name()
    );
    println!(
        "  client     {:<22} an outside machine at {CLIENT_V4}, routed through the host ({HOST_UPLINK_V4})",
        topo.client.name()
    );

    let scratch = tempfile::tempdir()?;
    let list = NetworkConfigList::new(
        NETWORK,
        "1.0.0",
        vec![
            main_plugin::bridge("cni-demo0", &[SUBNET], &scratch.path().join("ipam")),
            json!({ "type": "portmap", "capabilities": { "portMappings": true } }),
            json!({
                "type": "tuning",
                "dataDir": scratch.path().join("tuning"),
                "mac": TUNED_MAC,
                "mtu": 1400,
                "sysctl": { "net.ipv4.conf.IFNAME.arp_ignore": "1" },
            }),
            json!({ "type": "passthrough", "dataDir": scratch.path().join("passthrough") }),
            // A fixed table keeps the routes in main, where bridge's own CHECK looks for them.
            json!({ "type": "sbr", "table": 100 }),
            json!({ "type": "bandwidth", "ingressRate": 50_000_000, "ingressBurst": 500_000,
                    "egressRate": 20_000_000, "egressBurst": 200_000 }),
            json!({ "type": "firewall", "backend": "iptables" }),
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
    );
    println!(
        "  conflist of {} plugins, cniVersion {}:",
        list.plugins.len(),
        list.cni_version
    );
    for plugin in &list.plugins {
        let origin = plugin_origin(&runtime, plugin["type"].as_str().unwrap_or_default())?;
        println!(
            "    - {:<12} {origin}",
            plugin["type"].as_str().unwrap_or_default()
        );
    }
    let t = Instant::now();
    let steps = runtime.add_steps(&list, &rt)?;
    let add_time = t.elapsed();
    let mut prev = Value::Null;
    for (plugin_type, result) in &steps {
        println!("  {plugin_type}:");
        for line in result_changes(&prev, result) {
            println!("      {line}");
        }
        for line in plugin_effects(plugin_type, scratch.path(), &topo)? {
            println!("      {line}");
        }
        prev = result.clone();
    }
    println!("  whole chain ADD took {} ms", add_time.as_millis());
    let container_ip = container_ipv4(&prev)?;

    section(3, "what the kernel shows");
    for line in topo
        .container
        .ip(&["-br", "addr", "show", "dev", IFNAME])?
        .lines()
    {
        println!("  container  {line}");
    }
    for line in topo.container.ip(&["route"])?.lines() {
        println!("  container  route {line}");
    }
    for line in topo
        .host
        .ip(&["-br", "link", "show", "master", "cni-demo0"])?
        .lines()
    {
        println!("  host       bridge port {line}");
    }

    section(4, "live traffic");
    let web: SocketAddr = format!("{container_ip}:8080").parse()?;
    let _server = TcpServer::http(
        &topo.container,
        SocketAddr::from(([0, 0, 0, 0], 8080)),
        "hello from the container\n",
    )?;
    let reply =
        http_get(&topo.host, web, "/", TIMEOUT).context("HTTP from the host to the container")?;
    ensure!(reply.status == 200, "HTTP status {}", reply.status);
    ok(&format!(
        "host      -> container {web}  HTTP {} {:?}",
        reply.status,
        reply.body.trim()
    ));
    let reply = http_get(&topo.client, web, "/", TIMEOUT)
        .context("HTTP from the client to the container")?;
    ok(&format!(
        "client    -> container {web}  HTTP {} (routed through the host)",
        reply.status
    ));
    let mapped: SocketAddr = format!("{HOST_UPLINK_V4}:{HOST_PORT}").parse()?;
    let reply = http_get(&topo.client, mapped, "/", TIMEOUT)
        .context("HTTP from the client to the host port portmap forwards")?;
    ensure!(
        reply.status == 200,
        "HTTP status {} via portmap",
        reply.status
    );
    ok(&format!(
        "client    -> host {mapped} -> container :8080  HTTP {} (portmap DNAT)",
        reply.status
    ));
    let echo_addr: SocketAddr = format!("{CLIENT_V4}:5353").parse()?;
    let echo = UdpServer::echo(&topo.client, echo_addr)?;
    let answer = udp_request(&topo.container, echo_addr, b"ping", TIMEOUT)?;
    ensure!(answer == b"ping", "UDP echo answered {answer:?}");
    ok(&format!(
        "container -> client {echo_addr}  UDP echo, seen from {}",
        echo.peers()
            .first()
            .map_or_else(|| "?".into(), ToString::to_string)
    ));
    let banner = TcpServer::banner(
        &topo.client,
        format!("{CLIENT_V4}:9000").parse()?,
        "outside",
    )?;
    let got = tcp_request(&topo.container, banner.local_addr(), b"", TIMEOUT)?;
    ok(&format!(
        "container -> client {}  TCP banner {:?}",
        banner.local_addr(),
        String::from_utf8_lossy(&got)
    ));

    topo.host.exec_ok(
        "iptables",
        &[
            "-A",
            "CNI-ADMIN",
            "-s",
            CLIENT_V4,
            "-d",
            &container_ip,
            "-j",
            "DROP",
        ],
    )?;
    ensure!(
        http_get(&topo.client, web, "/", Duration::from_millis(500)).is_err(),
        "the admin chain's DROP did not block the client"
    );
    topo.host.exec_ok("iptables", &["-F", "CNI-ADMIN"])?;
    ok(&format!(
        "client    -> container {web}  blocked while CNI-ADMIN drops it (the operator's chain is evaluated first)"
    ));

    section(5, "CHECK");
    runtime.check(&list, &rt)?;
    ok("every plugin verified its part of the attachment");

    section(6, "DEL (plugins in reverse order)");
    let t = Instant::now();
    runtime.del(&list, &rt)?;
    let del_time = t.elapsed();
    ensure!(
        !topo.container.has_link(IFNAME)?,
        "{IFNAME} still exists in the container"
    );
    ok(&format!("{IFNAME} is gone from the container"));
    let left = std::fs::read_dir(scratch.path().join("passthrough"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .count()
        })
        .unwrap_or(0);
    ensure!(left == 0, "passthrough left {left} record(s)");
    ok("passthrough's record is removed");
    ensure!(
        !scratch
            .path()
            .join("tuning")
            .join(format!("{CONTAINER_ID}_{IFNAME}.json"))
            .exists(),
        "tuning left its backup file"
    );
    ok("tuning restored the originals (before bridge removed eth0) and removed its backup");
    let left = portmap_elements(&topo)?;
    ensure!(left.is_empty(), "portmap left {left:?}");
    ok("portmap removed its map elements (the table stays, as a long-lived skeleton)");
    runtime.del(&list, &rt)?;
    ok(&format!(
        "a second DEL succeeds too (DEL is idempotent); first DEL took {} ms",
        del_time.as_millis()
    ));

    println!(
        "\ndone in {} ms; the namespaces are removed now",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// Where the runtime finds a plugin: ours (built here) or Debian's Go reference.
fn plugin_origin(runtime: &Runtime, plugin_type: &str) -> Result<String> {
    let path = runtime.find_plugin(plugin_type)?;
    let whose = if path.starts_with(tests::bins::reference_dir()) {
        "Go, containernetworking-plugins"
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
            "interface {} {} mac {}",
            iface["name"].as_str().unwrap_or("?"),
            place,
            iface["mac"].as_str().unwrap_or("-")
        ));
    }
    for ip in added("ips") {
        lines.push(format!(
            "address {} gateway {}",
            ip["address"].as_str().unwrap_or("?"),
            ip["gateway"].as_str().unwrap_or("-")
        ));
    }
    for route in added("routes") {
        lines.push(format!(
            "route {} via {}",
            route["dst"].as_str().unwrap_or("?"),
            route["gw"].as_str().unwrap_or("(gateway of the address)")
        ));
    }
    if lines.is_empty() {
        lines.push("passed the result on unchanged".into());
    }
    lines
}

/// What a plugin of ours did beyond the result, read back from where it keeps it.
fn plugin_effects(plugin_type: &str, scratch: &Path, topo: &Topology) -> Result<Vec<String>> {
    match plugin_type {
        "passthrough" => {
            let file = scratch
                .join("passthrough")
                .join(format!("{NETWORK}_{CONTAINER_ID}_{IFNAME}.json"));
            let record: Value = serde_json::from_slice(
                &std::fs::read(&file).with_context(|| format!("{file:?}"))?,
            )?;
            Ok(vec![format!(
                "looked up {IFNAME} inside the container over netlink (mac {}) and recorded it in {}",
                record["mac"].as_str().unwrap_or("-"),
                file.display()
            )])
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
                    "inside the container: {IFNAME} mac {} -> {TUNED_MAC}, mtu {} -> 1400, sysctl {}",
                    saved["mac"].as_str().unwrap_or("?"),
                    saved["mtu"],
                    sysctls.join(", ")
                ),
                format!("saved the originals for DEL in {}", file.display()),
            ])
        }
        "sbr" => Ok(topo
            .container
            .ip(&["rule"])?
            .lines()
            .filter(|l| l.contains("from 10."))
            .map(|l| format!("source rule in the container: {}", l.replace('\t', " ")))
            .collect()),
        "bandwidth" => Ok(topo
            .host
            .exec_ok("tc", &["qdisc", "show"])?
            .lines()
            .filter(|l| l.contains(" tbf ") || l.contains(" ingress "))
            .map(|l| format!("shaping on the host: {}", l.trim()))
            .collect()),
        "firewall" => Ok(topo
            .host
            .exec_ok("iptables-save", &["-t", "filter"])?
            .lines()
            .filter(|l| l.contains("CNI-") && l.starts_with("-A"))
            .map(|l| format!("iptables {l}"))
            .collect()),
        "portmap" => {
            let localnet = topo
                .host
                .exec_ok("sysctl", &["-n", "net.ipv4.conf.cni-demo0.route_localnet"])?;
            Ok(portmap_elements(topo)?
                .into_iter()
                .map(|e| format!("nftables element of ip cni_portmap {e}"))
                .chain(std::iter::once(format!(
                    "net.ipv4.conf.cni-demo0.route_localnet = {} (127.0.0.1:{HOST_PORT} works too)",
                    localnet.trim()
                )))
                .collect())
        }
        _ => Ok(Vec::new()),
    }
}

/// The elements of the attachment in portmap's nftables maps and sets, as `nft` lists them.
fn portmap_elements(topo: &Topology) -> Result<Vec<String>> {
    let out = topo
        .host
        .exec("nft", &["list", "table", "ip", "cni_portmap"])?;
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

fn container_ipv4(result: &Value) -> Result<String> {
    for ip in result["ips"].as_array().into_iter().flatten() {
        if let Some((addr, _)) = ip["address"].as_str().and_then(|a| a.split_once('/'))
            && !addr.contains(':')
        {
            return Ok(addr.to_string());
        }
    }
    bail!("the result has no IPv4 address: {result}")
}
