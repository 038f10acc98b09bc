//! `bandwidth` against Debian's Go `bandwidth`: ADD, CHECK and DEL of ingress and egress
//! shaping (a host `tbf`, an IFB with its `tbf`, an `ingress` qdisc and redirect filter) on a
//! veth pair between two throwaway namespaces, cniVersion 1.0.0.
//!
//! The Go DEL leaves the host veth's `tbf` and `ingress` qdisc behind (they normally go with the
//! veth), and its next ADD then fails with "file exists". So the suite runs its own
//! [`Lifecycle`] loop and removes those qdiscs, untimed, after every cycle.
//!
//! Another attachment, shaped by our plugin on a veth pair of its own, stays in the host
//! namespace throughout, as on a node where shaping is in use. The first `ingress` qdisc and
//! tc filter on a machine flip global kernel static keys (code patched on every CPU, up to
//! half a millisecond), which the last ones flip back: without the other attachment every ADD
//! of either plugin would be the machine's first shaped one, and every DEL its last.
//!
//! Both DELs wait for the kernel to delete the IFB (`RTM_DELLINK`: RCU grace periods and the
//! device's last references, 7–30 ms here), which dominates either DEL; ours also removes the
//! host veth's `tbf` and `ingress` qdisc first (a tenth of a millisecond).

use anyhow::{Context, Result};
use harness::bins::{plugin_binary, reference_binary};
use harness::netns::{TestNetns, veth_pair};
use serde_json::json;

use crate::{Exec, Lifecycle, Options, Results, Row, Samples, time_exec};

/// The case, as the report and the targets name it.
pub const CASE: &str = "ingress+egress";

/// Runs the suite.
///
/// # Errors
/// When a namespace cannot be made or a plugin exec fails.
pub fn run(options: &Options) -> Result<Results> {
    let host = TestNetns::new("benchbw-h")?;
    Ok(rows_in(&host, options.iterations)?.into())
}

/// The case's rows, `iterations` lifecycles of each plugin, with `host` as the plugins' host
/// namespace; the other attachment is removed from it at the end.
///
/// # Errors
/// When the namespaces cannot be made or a plugin fails.
pub fn rows_in(host: &TestNetns, iterations: usize) -> Result<Vec<Row>> {
    let container = TestNetns::new("benchbw-c")?;
    veth_pair(host, "veth-bw0", &[], &container, "eth0", &["10.93.0.2/24"])?;
    let other = TestNetns::new("benchbw-o")?;
    veth_pair(host, "veth-bw1", &[], &other, "eth0", &["10.93.1.2/24"])?;
    let netns = container.path().to_path_buf();
    let config = |netns: &std::path::Path, veth: &str, ip: &str| {
        json!({
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "bandwidth",
            "ingressRate": 10_000_000, "ingressBurst": 100_000,
            "egressRate": 10_000_000, "egressBurst": 100_000,
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": veth},
                    {"name": "eth0", "sandbox": netns},
                ],
                "ips": [{"address": ip, "interface": 1}],
            },
        })
    };
    let ours = plugin_binary("bandwidth")?;
    let other_binary = ours.clone();
    let other_exec = |command: &str| {
        Exec::plugin(
            &other_binary,
            command,
            "bench-other",
            other.path(),
            "eth0",
            &config(other.path(), "veth-bw1", "10.93.1.2/24"),
        )
    };
    time_exec(&host.netns()?, &other_exec("ADD")).context("shaping the other attachment")?;
    let lifecycle = Lifecycle {
        plugin: "bandwidth".into(),
        case: CASE.into(),
        ours,
        reference: reference_binary("bandwidth")?,
        host: host.netns()?,
        netns,
        ifname: "eth0".into(),
        args: String::new(),
        config: config(container.path(), "veth-bw0", "10.93.0.2/24"),
        check: true,
    };
    // Lifecycle::run's loop, with Go's leftover qdiscs removed (untimed) after every cycle of
    // either plugin.
    let settle = || {
        for parent in ["root", "ingress"] {
            // Absent qdiscs make `tc` fail; that is the clean state we want.
            let _ = host.exec("tc", &["qdisc", "del", "dev", "veth-bw0", parent]);
        }
    };
    let mut ours = [Samples::default(), Samples::default(), Samples::default()];
    let mut reference = ours.clone();
    for (binary, id) in [
        (&lifecycle.ours, "bench-warmup-ours"),
        (&lifecycle.reference, "bench-warmup-ref"),
    ] {
        lifecycle.cycle(binary, id)?;
        settle();
    }
    for i in 0..iterations.max(1) {
        let order = if i % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for is_ours in order {
            let (binary, samples) = if is_ours {
                (&lifecycle.ours, &mut ours)
            } else {
                (&lifecycle.reference, &mut reference)
            };
            let times = lifecycle.cycle(binary, &format!("bench-{i}"))?;
            settle();
            for (s, t) in samples.iter_mut().zip(times) {
                s.push(t);
            }
        }
    }
    time_exec(&host.netns()?, &other_exec("DEL")).context("unshaping the other attachment")?;
    Ok(lifecycle.rows(ours, reference))
}
