//! `portmap` against Debian's Go `portmap` (its default iptables backend), cniVersion 1.0.0,
//! two mappings per container (tcp 8080→80, udp 5353→53), run from a throwaway host namespace
//! with a veth to the container namespace (so the `route_localnet` lookup finds a route).
//!
//! - Lifecycle: ADD and DEL of ours with the nftables backend and with the iptables backend,
//!   each against Go. CHECK is timed on its own, repeated on one attachment: Go 1.1.1's CHECK
//!   of an IPv4 container fails at its IPv6 step after checking everything IPv4 (a Go bug, see
//!   `portmap/README.md`), so its time is that of the whole IPv4 check plus the failing lookup.
//! - Scale: with N other containers' mappings installed (ours: N ADDs of our binary, nftables;
//!   Go: the same N in the Go iptables layout, written by our iptables backend, whose layout
//!   is the reference's), one more ADD and DEL of ours (nftables) and of Go, for each size of
//!   `Options::sizes`, with at most 30 iterations per size.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use common::netns::NetNs;
use serde_json::{Value, json};

use super::{Exec, Lifecycle, Options, Row, Samples, run_exec, time_exec};
use crate::bins::{plugin_binary, reference_binary};
use crate::netns::{TestNetns, veth_pair};

const NETWORK: &str = "bench";
/// Scale iterations per size: Go's ADD with a thousand chains installed takes long.
const SCALE_ITERATIONS: usize = 30;

/// The plugin config for a container at `ip` with host ports `tcp`/`udp`.
fn config(netns: &Path, backend: Option<&str>, ip: &str, tcp: u16, udp: u16) -> Value {
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "portmap",
        "runtimeConfig": {"portMappings": [
            {"hostPort": tcp, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": udp, "containerPort": 53, "protocol": "udp"},
        ]},
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": netns}],
            "ips": [{"interface": 0, "address": format!("{ip}/16")}],
        },
    });
    if let Some(b) = backend {
        conf["backend"] = json!(b);
    }
    conf
}

fn exec(binary: &Path, command: &str, id: &str, netns: &Path, conf: &Value) -> Exec {
    let env = [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", id),
        ("CNI_NETNS", &netns.to_string_lossy()),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/nonexistent"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    Exec {
        binary: binary.to_owned(),
        env,
        stdin: serde_json::to_vec(conf).unwrap_or_default(),
    }
}

/// Like [`time_exec`], but a failure whose stdout contains `tolerated` counts as done.
fn time_exec_tolerating(ns: &NetNs, exec: &Exec, tolerated: &str) -> Result<Duration> {
    let (elapsed, out) = run_exec(ns, exec)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() && !stdout.contains(tolerated) {
        bail!("{} failed: {stdout}", exec.binary.display());
    }
    Ok(elapsed)
}

/// The portmap state directory of `host`, removed when the suite ends (the N installed
/// attachments are not deleted one by one; their kernel state goes with the namespace).
struct StateDir(PathBuf);

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The container address of the `i`th other container (10.94.1.0 onwards).
fn other_ip(i: usize) -> String {
    let n = 256 + i;
    format!("10.94.{}.{}", n / 256, n % 256)
}

/// Host ports of the `i`th other container, clear of 8080 and 5353.
fn other_ports(i: usize) -> Result<(u16, u16)> {
    let tcp = u16::try_from(10_000 + 2 * i).context("too many other containers")?;
    Ok((tcp, tcp + 1))
}

/// Runs the suite.
///
/// # Errors
/// When a namespace cannot be made or a plugin exec fails.
pub fn run(options: &Options) -> Result<Vec<Row>> {
    let host = TestNetns::new("benchpm-h")?;
    let container = TestNetns::new("benchpm-c")?;
    veth_pair(
        &host,
        "veth-pm0",
        &["10.94.0.1/16"],
        &container,
        "eth0",
        &["10.94.0.2/16"],
    )?;
    let _state = StateDir(PathBuf::from(format!(
        "/run/cni/portmap/net-{}",
        std::fs::metadata(host.path())?.ino()
    )));
    let netns = container.path().to_path_buf();
    let ours = plugin_binary("portmap")?;
    let go = reference_binary("portmap")?;
    let hostns = host.netns()?;
    let mut rows = Vec::new();

    for backend in ["nftables", "iptables"] {
        let conf = config(&netns, Some(backend), "10.94.0.2", 8080, 5353);
        let lifecycle = Lifecycle {
            plugin: "portmap".into(),
            case: format!("2 mappings, ours {backend}"),
            ours: ours.clone(),
            reference: go.clone(),
            host: host.netns()?,
            netns: netns.clone(),
            ifname: "eth0".into(),
            args: String::new(),
            config: conf.clone(),
            check: false,
        };
        rows.extend(
            lifecycle
                .run(options.iterations)
                .with_context(|| format!("portmap {backend} lifecycle"))?,
        );
        rows.push(check_row(
            &hostns,
            &netns,
            [&ours, &go],
            &conf,
            options.iterations,
            format!("2 mappings, ours {backend}"),
        )?);
    }

    let mut sizes = options.sizes.clone();
    sizes.sort_unstable();
    let mut installed = 0;
    for size in sizes {
        while installed < size {
            let (tcp, udp) = other_ports(installed)?;
            let ip = other_ip(installed);
            let id = format!("other-{installed}");
            for backend in ["nftables", "iptables"] {
                let conf = config(&netns, Some(backend), &ip, tcp, udp);
                time_exec(&hostns, &exec(&ours, "ADD", &id, &netns, &conf))
                    .with_context(|| format!("installing {id} ({backend})"))?;
            }
            installed += 1;
        }
        let lifecycle = Lifecycle {
            plugin: "portmap".into(),
            case: format!("{size} others installed, ours nftables"),
            ours: ours.clone(),
            reference: go.clone(),
            host: host.netns()?,
            netns: netns.clone(),
            ifname: "eth0".into(),
            args: String::new(),
            config: config(&netns, Some("nftables"), "10.94.0.2", 8080, 5353),
            check: false,
        };
        rows.extend(
            lifecycle
                .run(options.iterations.min(SCALE_ITERATIONS))
                .with_context(|| format!("portmap with {size} others"))?,
        );
    }
    Ok(rows)
}

/// CHECK of one attachment each, repeated `iterations` times, ours and Go alternating.
fn check_row(
    host: &NetNs,
    netns: &Path,
    [ours, go]: [&PathBuf; 2],
    conf: &Value,
    iterations: usize,
    case: String,
) -> Result<Row> {
    // Ours first: its iptables backend refuses host ports the Go chain already maps.
    let mut checks = Vec::new();
    for (binary, id) in [(ours, "bench-check-ours"), (go, "bench-check-go")] {
        let added = time_exec(host, &exec(binary, "ADD", id, netns, conf))?;
        let mut check = conf.clone();
        check["prevResult"] =
            serde_json::from_slice(&added.stdout).context("ADD printed no JSON result")?;
        checks.push(exec(binary, "CHECK", id, netns, &check));
    }
    let (mut ours_t, mut go_t) = (Samples::default(), Samples::default());
    for i in 0..=iterations {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let elapsed = if which == 0 {
                time_exec(host, &checks[0])?.elapsed
            } else {
                time_exec_tolerating(host, &checks[1], "could not check ipv6 dnat: chain CNI-DN-")?
            };
            // The first round warms up.
            if i > 0 {
                if which == 0 { &mut ours_t } else { &mut go_t }.push(elapsed);
            }
        }
    }
    for (binary, id) in [(ours, "bench-check-ours"), (go, "bench-check-go")] {
        time_exec(host, &exec(binary, "DEL", id, netns, conf))?;
    }
    Ok(Row {
        suite: "portmap".into(),
        case,
        step: "CHECK".into(),
        ours: ours_t,
        reference: go_t,
        reference_label: "Go portmap".into(),
    })
}
