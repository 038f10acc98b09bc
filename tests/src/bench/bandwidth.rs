//! `bandwidth` against Debian's Go `bandwidth`: ADD, CHECK and DEL of ingress and egress
//! shaping (a host `tbf`, an IFB with its `tbf`, an `ingress` qdisc and redirect filter) on a
//! veth pair between two throwaway namespaces, cniVersion 1.0.0.
//!
//! The Go DEL leaves the host veth's `tbf` and `ingress` qdisc behind (they normally go with the
//! veth), and its next ADD then fails with "file exists". So the suite runs one
//! [`Lifecycle`] iteration at a time and removes those qdiscs, untimed, in between.

use anyhow::Result;
use serde_json::json;

use super::{Lifecycle, Options, Row};
use crate::bins::{plugin_binary, reference_binary};
use crate::netns::{TestNetns, veth_pair};

/// Runs the suite.
///
/// # Errors
/// When a namespace cannot be made or a plugin exec fails.
pub fn run(options: &Options) -> Result<Vec<Row>> {
    let host = TestNetns::new("benchbw-h")?;
    let container = TestNetns::new("benchbw-c")?;
    veth_pair(
        &host,
        "veth-bw0",
        &[],
        &container,
        "eth0",
        &["10.93.0.2/24"],
    )?;
    let netns = container.path().to_path_buf();
    let config = json!({
        "cniVersion": "1.0.0",
        "name": "bench",
        "type": "bandwidth",
        "ingressRate": 10_000_000, "ingressBurst": 100_000,
        "egressRate": 10_000_000, "egressBurst": 100_000,
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "veth-bw0"},
                {"name": "eth0", "sandbox": netns},
            ],
            "ips": [{"address": "10.93.0.2/24", "interface": 1}],
        },
    });
    let lifecycle = Lifecycle {
        plugin: "bandwidth".into(),
        case: "ingress+egress".into(),
        ours: plugin_binary("bandwidth")?,
        reference: reference_binary("bandwidth")?,
        host: host.netns()?,
        netns,
        ifname: "eth0".into(),
        args: String::new(),
        config,
        check: true,
    };
    let mut rows: Vec<Row> = Vec::new();
    for _ in 0..options.iterations.max(1) {
        for parent in ["root", "ingress"] {
            // Absent qdiscs make `tc` fail; that is the clean state we want.
            let _ = host.exec("tc", &["qdisc", "del", "dev", "veth-bw0", parent]);
        }
        let once = lifecycle.run(1)?;
        if rows.is_empty() {
            rows = once;
        } else {
            for (row, new) in rows.iter_mut().zip(once) {
                row.ours.0.extend(new.ours.0);
                row.reference.0.extend(new.reference.0);
            }
        }
    }
    Ok(rows)
}
