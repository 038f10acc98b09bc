//! sbr: ours against Go `sbr` (`/usr/lib/cni/sbr`), ADD → CHECK → DEL at cniVersion 1.0.0, in a
//! container namespace whose `eth0` has the address, subnet route and default route the
//! prevResult describes (as a main plugin leaves them).
//!
//! Two cases, because Go's DEL removes only the rule: the moved routes stay in its table and
//! never come back to main, and a second Go ADD with a gateway then fails on the table's
//! leftover default route.
//! - `moves 2 routes`: before every timed cycle (untimed) Go's leftover table is flushed and
//!   main's routes are put back, so both plugins move the subnet and default route every time.
//! - `rule only` ([`Lifecycle`], back-to-back cycles, no reset): `table: 100` and no gateway.
//!   Ours adds and checks just the rule; Debian's Go sbr (v1.1.1) ignores `table`, and once its
//!   first cycle has emptied main it too only adds the rule (table 100, the first without one).
//!   (Without `table`, our real CHECK would rightly fail here: nothing is left to move into the
//!   table.)
//!
//! Go's CHECK is a no-op (it returns at once); ours reads rules, routes and addresses. Go's lock
//! opens `CNI_NETNS` with `O_CREAT`, which is harmless here as the namespace exists.

use std::path::Path;

use anyhow::{Context, Result};
use harness::bins::{plugin_binary, reference_binary};
use harness::netns::{TestNetns, veth_pair};
use serde_json::{Value, json};

use crate::{Exec, Lifecycle, Options, Results, Row, Sample, Samples, time_exec};

const VERSION: &str = "1.0.0";

/// The case that moves the subnet and default route every cycle.
pub const CASE_MOVES: &str = "moves 2 routes";
/// The back-to-back case that only adds the rule.
pub const CASE_RULE: &str = "rule only";

fn config(ctr: &TestNetns, gateway: bool) -> Value {
    let mut ip = json!({ "address": "10.70.0.2/24", "interface": 0 });
    if gateway {
        ip["gateway"] = json!("10.70.0.1");
    }
    let mut config = json!({
        "cniVersion": VERSION,
        "name": "bench-sbr",
        "type": "sbr",
        "prevResult": {
            "cniVersion": VERSION,
            "interfaces": [{ "name": "eth0", "sandbox": ctr.path() }],
            "ips": [ip],
            "routes": [{ "dst": "0.0.0.0/0" }],
        },
    });
    if !gateway {
        config["table"] = json!(100);
    }
    config
}

/// Main's routes of `eth0` back, Go's leftover table gone.
fn reset(ctr: &TestNetns) -> Result<()> {
    // `ip route flush` fails on a table that never existed: a missing table is already empty.
    let _ = ctr.exec("ip", &["route", "flush", "table", "100"])?;
    ctr.ip(&[
        "route",
        "replace",
        "10.70.0.0/24",
        "dev",
        "eth0",
        "proto",
        "kernel",
        "scope",
        "link",
        "src",
        "10.70.0.2",
    ])?;
    ctr.ip(&[
        "route",
        "replace",
        "default",
        "via",
        "10.70.0.1",
        "dev",
        "eth0",
    ])?;
    Ok(())
}

fn exec(binary: &Path, command: &str, ctr: &TestNetns, config: &Value) -> Exec {
    Exec::plugin(binary, command, "bench-sbr", ctr.path(), "eth0", config)
}

/// One reset (untimed) and a timed ADD, CHECK, DEL of `binary`.
fn fresh_cycle(
    host: &host::netns::NetNs,
    binary: &Path,
    ctr: &TestNetns,
    config: &Value,
) -> Result<[Sample; 3]> {
    reset(ctr)?;
    let add = time_exec(host, &exec(binary, "ADD", ctr, config))?;
    let mut check_config = config.clone();
    check_config["prevResult"] =
        serde_json::from_slice(&add.stdout).context("ADD printed no JSON result")?;
    let check = time_exec(host, &exec(binary, "CHECK", ctr, &check_config))?;
    let del = time_exec(host, &exec(binary, "DEL", ctr, config))?;
    Ok([add.sample(), check.sample(), del.sample()])
}

/// Runs both cases.
///
/// # Errors
/// When the namespaces cannot be made or a plugin run fails.
pub fn run(options: &Options) -> Result<Results> {
    let host = TestNetns::new("bench-sbr-host")?;
    Ok(rows_in(&host, options.iterations)?.into())
}

/// Both cases' rows, `iterations` cycles of each plugin, with `host` as the plugins' host
/// namespace.
///
/// # Errors
/// When the container cannot be made or a plugin run fails.
pub fn rows_in(host: &TestNetns, iterations: usize) -> Result<Vec<Row>> {
    let ctr = TestNetns::new("bench-sbr-ctr")?;
    veth_pair(
        host,
        "vbsbr0",
        &["10.70.0.1/24"],
        &ctr,
        "eth0",
        &["10.70.0.2/24"],
    )?;
    let ours = plugin_binary("sbr")?;
    let go = reference_binary("sbr")?;
    let host_ns = host.netns()?;

    let config_gw = config(&ctr, true);
    let mut samples: [[Samples; 3]; 2] = Default::default();
    fresh_cycle(&host_ns, &ours, &ctr, &config_gw)?;
    fresh_cycle(&host_ns, &go, &ctr, &config_gw)?;
    for i in 0..iterations {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let binary = if which == 0 { &ours } else { &go };
            let times = fresh_cycle(&host_ns, binary, &ctr, &config_gw)?;
            for (s, t) in samples[which].iter_mut().zip(times) {
                s.push(t);
            }
        }
    }
    let [ours_samples, go_samples] = samples;
    let mut rows: Vec<Row> = ["ADD", "CHECK", "DEL"]
        .into_iter()
        .zip(ours_samples.into_iter().zip(go_samples))
        .map(|(step, (ours, reference))| Row {
            suite: "sbr".to_owned(),
            case: CASE_MOVES.to_owned(),
            step: step.to_owned(),
            ours,
            reference,
            reference_label: "Go sbr".to_owned(),
        })
        .collect();

    reset(&ctr)?;
    let steady = Lifecycle {
        plugin: "sbr".to_owned(),
        case: CASE_RULE.to_owned(),
        ours,
        reference: go,
        host: host_ns,
        netns: ctr.path().to_owned(),
        ifname: "eth0".to_owned(),
        args: String::new(),
        config: config(&ctr, false),
        check: true,
    };
    rows.extend(steady.run(iterations)?);
    Ok(rows)
}
