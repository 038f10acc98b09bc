//! `tuning`: ADD, CHECK and DEL of ours against Debian's Go `tuning`, on a container netns with
//! a veth, changing the MAC, MTU, promiscuous mode and two sysctls (cniVersion 1.0.0). The
//! sysctl keys name eth0 because Debian's Go CHECK (1.1.1) does not substitute IFNAME.

use anyhow::{Context, Result};
use harness::bins;
use harness::netns::{TestNetns, veth_pair};
use serde_json::json;

use crate::{Lifecycle, Options, Results, Row};

/// The case, as the report and the targets name it.
pub const CASE: &str = "mac+mtu+promisc+2 sysctls";

/// Runs the suite.
///
/// # Errors
/// When the namespaces cannot be made or a plugin fails.
pub fn run(options: &Options) -> Result<Results> {
    let host = TestNetns::new("benchtune-h")?;
    Ok(rows_in(&host, options.iterations)?.into())
}

/// The case's rows, `iterations` lifecycles of each plugin, with `host` as the plugins' host
/// namespace (where the container's veth has its other end).
///
/// # Errors
/// When the container cannot be made or a plugin fails.
pub fn rows_in(host: &TestNetns, iterations: usize) -> Result<Vec<Row>> {
    let container = TestNetns::new("benchtune-c")?;
    veth_pair(
        host,
        "veth-bench",
        &[],
        &container,
        "eth0",
        &["10.93.0.2/24"],
    )?;
    let data_dir = tempfile::tempdir()?;
    let netns = container.path().to_path_buf();
    let config = json!({
        "cniVersion": "1.0.0",
        "name": "bench",
        "type": "tuning",
        "dataDir": data_dir.path(),
        "mac": "02:42:ac:11:00:02",
        "mtu": 1400,
        "promisc": true,
        "sysctl": {
            "net.ipv4.conf.eth0.arp_ignore": "1",
            "net.ipv4.conf.eth0.arp_announce": "2",
        },
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "sandbox": netns}],
            "ips": [{"interface": 0, "address": "10.93.0.2/24"}],
        },
    });
    let lifecycle = Lifecycle {
        plugin: "tuning".into(),
        case: CASE.into(),
        ours: bins::plugin_binary("tuning")?,
        reference: bins::reference_binary("tuning")?,
        host: host.netns()?,
        netns,
        ifname: "eth0".into(),
        args: String::new(),
        config,
        check: true,
    };
    lifecycle.run(iterations).context("tuning lifecycle")
}
