//! `portmap` against Debian's Go `portmap` (its default iptables backend), cniVersion 1.0.0,
//! two mappings per container (tcp 8080→80, udp 5353→53), run from a throwaway host namespace
//! with a veth to the container namespace (so the `route_localnet` lookup finds a route).
//!
//! - Lifecycle: ADD and DEL of ours with the nftables backend and with the iptables backend,
//!   each against Go. CHECK is timed on its own, repeated on one attachment: Go 1.1.1's CHECK
//!   of an IPv4 container fails at its IPv6 step after checking everything IPv4 (a Go bug, see
//!   `portmap/README.md`), so its time is that of the whole IPv4 check plus the failing lookup.
//! - Scale: with N other containers' mappings installed, one more ADD and DEL of three series,
//!   interleaved: `ours nftables`, `ours iptables` and `Go iptables`, for each size of
//!   [`Options::scale_sizes`] (which adds 1000, the size of the growth targets, when the
//!   largest requested size reaches it), with at most [`super::SCALE_ITERATIONS`] iterations
//!   per size. All three share one host namespace, where every other container is installed
//!   twice: by our binary with the nftables backend and with the iptables backend, whose
//!   layout is the reference's. So Go's ADD and DEL run over N containers in its own layout,
//!   but Go installs none of them: its "install" figure is our iptables backend's, and the
//!   report labels it so. (Go's own installs would cost as much as its ADD at every size.)
//!   The iptables layout stops at [`Options::reference_max_size`]: each of its installing
//!   ADDs reloads the whole nat table, so 5000 would take about 25 minutes; larger sizes
//!   have `ours nftables` only, and the report notes the extrapolated install time.
//! - A second host and container namespace pair never gets others: at every size above 0,
//!   each series' ADD and DEL are timed there too, in alternation with the measured ones
//!   ([`super::ScalePoint::alongside`]), and the growth targets divide by those.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use common::netns::NetNs;
use serde_json::{Value, json};

use super::{
    Alongside, Exec, GO_IPTABLES, Install, Lifecycle, OURS_IPTABLES, OURS_NFTABLES, Options,
    Results, Row, Sample, Samples, ScalePoint, cutoff_note, run_exec, time_exec,
};
use crate::bins::{plugin_binary, reference_binary};
use crate::netns::{StateDirs, TestNetns, veth_pair};

const NETWORK: &str = "bench";

/// Lifecycle case of our nftables backend.
pub const CASE_NFTABLES: &str = "2 mappings, ours nftables";
/// Lifecycle case of our iptables backend.
pub const CASE_IPTABLES: &str = "2 mappings, ours iptables";

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
    Exec::plugin(binary, command, id, netns, "eth0", conf)
}

/// Like [`time_exec`], but a failure whose stdout contains `tolerated` counts as done.
fn time_exec_tolerating(ns: &NetNs, exec: &Exec, tolerated: &str) -> Result<Sample> {
    let timed = run_exec(ns, exec)?;
    let stdout = String::from_utf8_lossy(&timed.stdout);
    if !timed.status.success() && !stdout.contains(tolerated) {
        bail!("{} failed: {stdout}", exec.binary.display());
    }
    Ok(timed.sample())
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

/// A host namespace (with the state directories the plugin makes there) and a container
/// namespace, joined by a veth: `veth-pm0` 10.94.0.1/16 on the host, `eth0` 10.94.0.2/16 inside.
fn host_and_container(suffix: &str) -> Result<(TestNetns, StateDirs, TestNetns)> {
    let host = TestNetns::new(&format!("benchpm-h{suffix}"))?;
    let state = StateDirs::of(&host)?;
    let container = TestNetns::new(&format!("benchpm-c{suffix}"))?;
    veth_pair(
        &host,
        "veth-pm0",
        &["10.94.0.1/16"],
        &container,
        "eth0",
        &["10.94.0.2/16"],
    )?;
    Ok((host, state, container))
}

/// Runs the suite.
///
/// # Errors
/// When a namespace cannot be made or a plugin exec fails.
pub fn run(options: &Options) -> Result<Results> {
    let (host, _state, container) = host_and_container("")?;
    let netns = container.path().to_path_buf();
    let ours = plugin_binary("portmap")?;
    let go = reference_binary("portmap")?;
    let hostns = host.netns()?;
    let mut results = Results::default();

    for (backend, case) in [("nftables", CASE_NFTABLES), ("iptables", CASE_IPTABLES)] {
        let conf = config(&netns, Some(backend), "10.94.0.2", 8080, 5353);
        let lifecycle = Lifecycle {
            plugin: "portmap".into(),
            case: case.into(),
            ours: ours.clone(),
            reference: go.clone(),
            host: host.netns()?,
            netns: netns.clone(),
            ifname: "eth0".into(),
            args: String::new(),
            config: conf.clone(),
            check: false,
        };
        results.rows.extend(
            lifecycle
                .run(options.iterations)
                .with_context(|| format!("portmap {backend} lifecycle"))?,
        );
        results.rows.push(check_row(
            &hostns,
            &netns,
            [&ours, &go],
            &conf,
            options.iterations,
            case.to_owned(),
        )?);
    }
    // Where each size's ADD and DEL are also timed with no others (ScalePoint::alongside).
    let (empty_host, _empty_state, empty_container) = host_and_container("0")?;
    let empty = (empty_host.netns()?, empty_container.path());
    results.extend(scale(
        options,
        (&hostns, &netns),
        (&empty.0, empty.1),
        &ours,
        &go,
    )?);
    Ok(results)
}

/// The scale series; see the module docs.
/// `grown` is the host namespace where the others go and the container's path; `empty` the
/// same pair that never gets others.
fn scale(
    options: &Options,
    (host, netns): (&NetNs, &Path),
    empty: (&NetNs, &Path),
    ours: &Path,
    go: &Path,
) -> Result<Results> {
    // (series, binary, backend in the config: Go ignores the key).
    let series = [
        (OURS_NFTABLES, ours, "nftables"),
        (OURS_IPTABLES, ours, "iptables"),
        (GO_IPTABLES, go, "iptables"),
    ];
    let mut installs = [Samples::default(), Samples::default()];
    let mut results = Results {
        notes: vec![format!(
            "portmap: Go's others are written by our iptables backend, whose layout is the \
             reference's, so Go's ADD and DEL run over its own layout, but its install figures \
             are those of {OURS_IPTABLES}, not Go's."
        )],
        ..Results::default()
    };
    let sizes = options.scale_sizes("portmap");
    let mut installed = 0;
    for &size in &sizes {
        // The iptables layout (ours iptables and Go) stops at the reference's largest size.
        let iptables = size <= options.reference_max_size;
        let active = if iptables { series.len() } else { 1 };
        while installed < size {
            let (tcp, udp) = other_ports(installed)?;
            let ip = other_ip(installed);
            let id = format!("other-{installed}");
            for (install, backend) in installs
                .iter_mut()
                .zip(["nftables", "iptables"])
                .take(active.min(2))
            {
                let conf = config(netns, Some(backend), &ip, tcp, udp);
                let timed = time_exec(host, &exec(ours, "ADD", &id, netns, &conf))
                    .with_context(|| format!("installing {id} ({backend})"))?;
                install.push(timed.sample());
            }
            installed += 1;
            if installed % 500 == 0 && installed < size {
                eprintln!("  portmap: {installed}/{size} others installed");
            }
        }
        eprintln!(
            "  portmap: {size} others installed (ours nftables {:.1} s, ours iptables {:.1} s)",
            installs[0].total().as_secs_f64(),
            installs[1].total().as_secs_f64()
        );

        let mut add = [Samples::default(), Samples::default(), Samples::default()];
        let mut del = add.clone();
        let mut alongside = [
            Alongside::default(),
            Alongside::default(),
            Alongside::default(),
        ];
        // Round 0 warms up; then each round starts with the next series. Above 0 others, each
        // series' ADD and DEL are also timed in the empty namespace, first or second in turn.
        for i in 0..=options.scale_iterations() {
            let id = format!("bench-scale-{i}");
            for k in 0..active {
                let which = (i + k) % active;
                let (name, binary, backend) = series[which];
                let cycle = |(host, netns): (&NetNs, &Path)| -> Result<[Sample; 2]> {
                    let conf = config(netns, Some(backend), "10.94.0.2", 8080, 5353);
                    let a = time_exec(host, &exec(binary, "ADD", &id, netns, &conf))
                        .with_context(|| format!("{name} ADD with {size} others"))?;
                    let d = time_exec(host, &exec(binary, "DEL", &id, netns, &conf))
                        .with_context(|| format!("{name} DEL with {size} others"))?;
                    Ok([a.sample(), d.sample()])
                };
                let empty_first = size > 0 && i % 2 == 1;
                let before = if empty_first {
                    Some(cycle(empty)?)
                } else {
                    None
                };
                let [a, d] = cycle((host, netns))?;
                let after = if size > 0 && !empty_first {
                    Some(cycle(empty)?)
                } else {
                    None
                };
                if i > 0 {
                    add[which].push(a);
                    del[which].push(d);
                    if let Some([a, d]) = before.or(after) {
                        alongside[which].add.push(a);
                        alongside[which].del.push(d);
                    }
                }
            }
        }
        for ((((name, _, _), add), del), alongside) in
            series.iter().zip(add).zip(del).zip(alongside).take(active)
        {
            let reference = *name == GO_IPTABLES;
            let (by, samples) = match *name {
                OURS_NFTABLES => (OURS_NFTABLES.to_owned(), installs[0].clone()),
                OURS_IPTABLES => (OURS_IPTABLES.to_owned(), installs[1].clone()),
                _ => (
                    format!("{OURS_IPTABLES} (Go's layout)"),
                    installs[1].clone(),
                ),
            };
            results.scale.push(ScalePoint {
                suite: "portmap".to_owned(),
                series: (*name).to_owned(),
                reference,
                others: size,
                add,
                del,
                install: Install {
                    by,
                    own: !reference,
                    samples,
                },
                alongside: (size > 0).then_some(alongside),
            });
        }
    }
    results.notes.extend(cutoff_note(
        "portmap",
        &format!("{GO_IPTABLES} or {OURS_IPTABLES} figures"),
        "their shared iptables layout is installed by one ADD of our iptables backend per \
         other, whose cost grows with the nat table",
        &sizes,
        options.reference_max_size,
        &installs[1],
    ));
    Ok(results)
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
    // Both attachments stay installed while they are checked, so Go's maps other host ports:
    // our ADD and CHECK rightly refuse a host port another container's chain maps.
    let mut go_conf = conf.clone();
    go_conf["runtimeConfig"]["portMappings"][0]["hostPort"] = json!(8081);
    go_conf["runtimeConfig"]["portMappings"][1]["hostPort"] = json!(5354);
    let attachments = [
        (ours, "bench-check-ours", conf),
        (go, "bench-check-go", &go_conf),
    ];
    let mut checks = Vec::new();
    for (binary, id, conf) in attachments {
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
            let sample = if which == 0 {
                time_exec(host, &checks[0])?.sample()
            } else {
                time_exec_tolerating(host, &checks[1], "could not check ipv6 dnat: chain CNI-DN-")?
            };
            // The first round warms up.
            if i > 0 {
                if which == 0 { &mut ours_t } else { &mut go_t }.push(sample);
            }
        }
    }
    for (binary, id, conf) in attachments {
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
