//! `firewall`: ADD/CHECK/DEL of ours (iptables and nftables backends) against the Go plugin
//! with its iptables backend, interleaved; and our ADD with N other attachments installed
//! (the sizes of [`Options::sizes`]) against none, per backend.

use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::{Exec, Lifecycle, Options, Row, Samples, time_exec};
use crate::bins::{plugin_binary, reference_binary};
use crate::netns::TestNetns;

/// A dual-stack prevResult on bridge `cni-bench0` for address number `n`.
fn prev_result(n: usize) -> Value {
    let (hi, lo) = (n / 250, n % 250 + 2);
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{ "name": "cni-bench0" }, { "name": "veth0", "sandbox": "/x" }],
        "ips": [
            { "address": format!("10.70.{hi}.{lo}/16"), "interface": 1 },
            { "address": format!("fd70::{hi}:{lo}/64"), "interface": 1 },
        ],
    })
}

fn config(backend: &str, n: usize) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "bench", "type": "firewall", "backend": backend,
        "prevResult": prev_result(n),
    })
}

fn exec(binary: &std::path::Path, command: &str, cid: &str, netns: &str, conf: &Value) -> Exec {
    let env = [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", cid),
        ("CNI_NETNS", netns),
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

/// Runs the suite.
///
/// # Errors
/// When a namespace cannot be made or any exec fails.
pub fn run(options: &Options) -> Result<Vec<Row>> {
    let ours = plugin_binary("firewall")?;
    let reference = reference_binary("firewall")?;
    let mut rows = Vec::new();
    for backend in ["iptables", "nftables"] {
        // The Go plugin takes an unknown backend for auto-detection, i.e. iptables here.
        let host = TestNetns::new("bench-fw")?;
        let ctr = TestNetns::new("bench-fwc")?;
        let lifecycle = Lifecycle {
            plugin: "firewall".to_owned(),
            case: format!("ours {backend} vs Go iptables"),
            ours: ours.clone(),
            reference: reference.clone(),
            host: host.netns()?,
            netns: ctr.path().to_owned(),
            ifname: "eth0".to_owned(),
            args: String::new(),
            config: config(backend, 0),
            check: true,
        };
        rows.extend(lifecycle.run(options.iterations)?);
    }
    for backend in ["iptables", "nftables"] {
        for &size in &options.sizes {
            rows.push(scale(&ours, backend, size, options.iterations)?);
        }
    }
    Ok(rows)
}

/// Our ADD (each followed by an untimed DEL) with `others` attachments installed.
fn scale(ours: &std::path::Path, backend: &str, others: usize, iterations: usize) -> Result<Row> {
    let host = TestNetns::new("bench-fws")?;
    let ctr = TestNetns::new("bench-fwsc")?;
    let ns = host.netns()?;
    let netns = ctr.path().to_string_lossy().into_owned();
    let started = Instant::now();
    for n in 0..others {
        time_exec(
            &ns,
            &exec(
                ours,
                "ADD",
                &format!("other-{n}"),
                &netns,
                &config(backend, n + 1),
            ),
        )
        .with_context(|| format!("installing other attachment {n}"))?;
    }
    log::info!("{others} others installed in {:?}", started.elapsed());
    let conf = config(backend, others + 1);
    let mut samples = Samples::default();
    for i in 0..=iterations {
        let cid = format!("bench-scale-{i}");
        let add = time_exec(&ns, &exec(ours, "ADD", &cid, &netns, &conf))?;
        time_exec(&ns, &exec(ours, "DEL", &cid, &netns, &conf))?;
        // The first is a warm-up.
        if i > 0 {
            samples.push(add.elapsed);
        }
    }
    Ok(Row {
        suite: "firewall".to_owned(),
        case: format!("ours {backend}, {others} others installed"),
        step: "ADD".to_owned(),
        ours: samples,
        reference: Samples::default(),
        reference_label: "–".to_owned(),
    })
}
