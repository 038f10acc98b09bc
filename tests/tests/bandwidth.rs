//! `bandwidth` end to end: Debian's Go `bridge` + `host-local`, then our `bandwidth`, with
//! `iperf3` between the container and a client namespace in both directions; CHECK against
//! hand-made drift; DEL, GC and STATUS; shaping inside the container when there is no host
//! veth (also when the container's veth has its peer in a third namespace, at an index a host
//! link shares); and differential runs against Debian's Go `bandwidth` (same result, Go ADD +
//! our CHECK and DEL, our ADD + Go DEL, and the IFB names when two interfaces of one container
//! are on the same network).
//!
//! Rates are modest (10–15 Mbit/s) and runs short (2 s), so the whole file stays fast. The
//! receiver of each `iperf3` run is its client (`-R` where needed), so intervals count bytes
//! that actually went through the shaper.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bandwidth::names::{fallback_ifb_name, reference_ifb_name};
use cni::Attachment;
use serde_json::{Value, json};
use tests::netns::CLIENT_V4;
use tests::result::{address, host_veth};
use tests::traffic::{IPERF3_PORT, Iperf3Report, iperf3};
use tests::{
    NetworkConfigList, PluginOutput, Runtime, RuntimeConf, TestNetns, Topology, main_plugin,
};

const NETWORK: &str = "bwnet";
const EGRESS_RATE: u64 = 10_000_000;
const INGRESS_RATE: u64 = 15_000_000;
/// 10 ms of traffic at the rate, in bits.
const fn burst_for(rate: u64) -> u64 {
    rate / 100
}
const SECS: u32 = 2;

fn chain(scratch: &Path, subnet: &str, bandwidth: Value) -> NetworkConfigList {
    let mut bw = bandwidth;
    bw["type"] = json!("bandwidth");
    NetworkConfigList::new(
        NETWORK,
        "1.0.0",
        vec![
            main_plugin::bridge("cni-bw0", &[subnet], &scratch.join("ipam")),
            bw,
        ],
    )
}

fn static_limits() -> Value {
    json!({
        "ingressRate": INGRESS_RATE, "ingressBurst": burst_for(INGRESS_RATE),
        "egressRate": EGRESS_RATE, "egressBurst": burst_for(EGRESS_RATE),
    })
}

/// Throughput into the container: the server sends from the client namespace.
fn into_container(topo: &Topology, secs: u32) -> Result<Iperf3Report> {
    let server: SocketAddr = format!("{CLIENT_V4}:{IPERF3_PORT}").parse()?;
    iperf3(&topo.client, server, &topo.container, server, secs, &["-R"])
        .context("iperf3 into the container")
}

/// Throughput out of the container: the server in the container sends to the client.
fn out_of_container(topo: &Topology, ip: &str, secs: u32) -> Result<Iperf3Report> {
    let server: SocketAddr = format!("{ip}:{IPERF3_PORT}").parse()?;
    iperf3(&topo.container, server, &topo.client, server, secs, &["-R"])
        .context("iperf3 out of the container")
}

#[allow(clippy::cast_precision_loss)]
fn ensure_near(what: &str, measured: f64, rate: u64) -> Result<()> {
    let rate = rate as f64;
    ensure!(
        (measured - rate).abs() <= 0.25 * rate,
        "{what}: {:.2} Mbit/s, want {:.2} ± 25%",
        measured / 1e6,
        rate / 1e6
    );
    Ok(())
}

#[allow(clippy::cast_precision_loss)]
fn ensure_well_above(what: &str, measured: f64, rate: u64) -> Result<()> {
    ensure!(
        measured > 3.0 * rate as f64,
        "{what}: {:.2} Mbit/s is not well above {:.2}",
        measured / 1e6,
        rate as f64 / 1e6
    );
    Ok(())
}

fn links(ns: &TestNetns) -> Result<Vec<String>> {
    ns.link_names()
}

/// The IFB links (`bwp…`) in `ns`.
fn ifbs(ns: &TestNetns) -> Result<Vec<String>> {
    Ok(links(ns)?
        .into_iter()
        .filter(|l| l.starts_with("bwp"))
        .collect())
}

fn tc_json(ns: &TestNetns, args: &[&str]) -> Result<Value> {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    Ok(serde_json::from_str(&ns.exec_ok("tc", &all)?)?)
}

fn qdisc_kinds(ns: &TestNetns, dev: &str) -> Result<Vec<String>> {
    Ok(tc_json(ns, &["qdisc", "show", "dev", dev])?
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|q| q["kind"].as_str().map(str::to_owned))
        .collect())
}

/// Fails when `dev` in `ns` still has a `tbf` or `ingress` qdisc.
fn ensure_unshaped(ns: &TestNetns, dev: &str) -> Result<()> {
    let kinds = qdisc_kinds(ns, dev)?;
    ensure!(
        !kinds.iter().any(|k| k == "tbf" || k == "ingress"),
        "qdiscs left on {dev}: {kinds:?}"
    );
    Ok(())
}

/// Our plugin alone, with `conf` (`name`, `cniVersion`, `type` added) on stdin.
fn exec_ours(
    runtime: &Runtime,
    command: &str,
    rt: &RuntimeConf,
    mut conf: Value,
    version: &str,
) -> Result<PluginOutput> {
    conf["name"] = json!(NETWORK);
    conf["cniVersion"] = json!(version);
    conf["type"] = json!("bandwidth");
    let netns = rt.netns.to_string_lossy().into_owned();
    runtime.exec_plugin(
        "bandwidth",
        Some(command),
        &[
            ("CNI_CONTAINERID", &rt.container_id),
            ("CNI_NETNS", &netns),
            ("CNI_IFNAME", &rt.ifname),
            // The Go skel requires it (our plugin does not).
            ("CNI_PATH", "/usr/lib/cni"),
        ],
        conf.to_string().as_bytes(),
    )
}

fn ok(out: &PluginOutput, what: &str) -> Result<()> {
    ensure!(
        out.status.success(),
        "{what} failed: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn shaping_holds_both_directions_near_the_rate_and_del_lifts_it() -> Result<()> {
    let topo = Topology::new("bwe2e")?;
    let scratch = tempfile::tempdir()?;
    let runtime = Runtime::new(&topo.host)?;
    let list = chain(scratch.path(), "10.95.1.0/24", static_limits());
    let rt = RuntimeConf::new("bw-e2e", topo.container.path(), "eth0");
    let result = runtime.add(&list, &rt)?;
    let ip = address(&result, false)?;
    let veth = host_veth(&result)?;

    // The IFB is appended to the result, on the host, with its MAC, and has the reference's
    // name.
    let ifb = reference_ifb_name(NETWORK, "bw-e2e");
    let last = result["interfaces"]
        .as_array()
        .and_then(|a| a.last())
        .context("no interfaces")?;
    ensure!(last["name"] == ifb && last["sandbox"].is_null(), "{result}");
    ensure!(
        last["mac"].as_str().is_some_and(|m| m.len() == 17),
        "{result}"
    );
    ensure!(qdisc_kinds(&topo.host, &veth)?.contains(&"tbf".to_owned()));
    ensure!(qdisc_kinds(&topo.host, &veth)?.contains(&"ingress".to_owned()));
    ensure!(qdisc_kinds(&topo.host, &ifb)?.contains(&"tbf".to_owned()));
    runtime.check(&list, &rt).context("CHECK after ADD")?;

    let down = into_container(&topo, SECS)?;
    ensure_near("into the container", down.bits_per_second, INGRESS_RATE)?;
    let up = out_of_container(&topo, &ip, SECS)?;
    ensure_near("out of the container", up.bits_per_second, EGRESS_RATE)?;

    // DEL of bandwidth alone (the bridge attachment stays): every shaping object goes.
    let mut conf = list.plugins[1].clone();
    conf["prevResult"] = result.clone();
    ok(
        &exec_ours(&runtime, "DEL", &rt, conf.clone(), "1.0.0")?,
        "DEL",
    )?;
    // The shaping and the IFB are gone the moment DEL returns.
    ensure_unshaped(&topo.host, &veth)?;
    ensure!(
        !links(&topo.host)?.iter().any(|l| l.starts_with("bw")),
        "IFB left behind: {:?}",
        links(&topo.host)?
    );
    let down = into_container(&topo, 1)?;
    ensure_well_above(
        "into the container after DEL",
        down.bits_per_second,
        INGRESS_RATE,
    )?;
    let up = out_of_container(&topo, &ip, 1)?;
    ensure_well_above(
        "out of the container after DEL",
        up.bits_per_second,
        EGRESS_RATE,
    )?;
    // A second DEL finds nothing and succeeds.
    ok(
        &exec_ours(&runtime, "DEL", &rt, conf, "1.0.0")?,
        "second DEL",
    )?;
    runtime.del(&list, &rt)?;
    Ok(())
}

#[test]
fn capitalised_runtime_config_with_a_sentinel_burst_keeps_the_first_second_near_the_rate()
-> Result<()> {
    let topo = Topology::new("bwsent")?;
    let scratch = tempfile::tempdir()?;
    let runtime = Runtime::new(&topo.host)?;
    let list = chain(
        scratch.path(),
        "10.95.2.0/24",
        json!({"capabilities": {"bandwidth": true}}),
    );
    // containerd's shape: capitalised keys, MaxUint32 bits of burst, zero egress.
    let rt = RuntimeConf::new("bw-sentinel", topo.container.path(), "eth0").with_capability(
        "bandwidth",
        json!({"IngressRate": EGRESS_RATE, "IngressBurst": 4_294_967_295_u64,
               "EgressRate": 0, "EgressBurst": 0}),
    );
    let result = runtime.add(&list, &rt)?;
    let veth = host_veth(&result)?;
    // Egress is not shaped: no IFB, no ingress qdisc.
    ensure!(
        !links(&topo.host)?.iter().any(|l| l.starts_with("bwp")),
        "an IFB exists without egress shaping"
    );
    ensure!(!qdisc_kinds(&topo.host, &veth)?.contains(&"ingress".to_owned()));
    let tbf = &tc_json(&topo.host, &["qdisc", "show", "dev", &veth, "root"])?[0];
    ensure!(tbf["kind"] == "tbf", "{tbf}");
    // The derived burst: 10 ms at 10 Mbit/s = 12500 bytes (tc prints what the buffer allows).
    let burst = tbf["options"]["burst"].as_u64().context("no burst")?;
    ensure!((12_000..=12_500).contains(&burst), "burst {burst}: {tbf}");
    runtime.check(&list, &rt)?;

    let report = into_container(&topo, SECS)?;
    ensure_near("into the container", report.bits_per_second, EGRESS_RATE)?;
    let first = report.json["intervals"][0]["sum"]["bits_per_second"]
        .as_f64()
        .context("no first interval")?;
    #[allow(clippy::cast_precision_loss)]
    let allowed = EGRESS_RATE as f64 * 1.25 + (burst * 8) as f64;
    ensure!(
        first <= allowed,
        "first second at {:.2} Mbit/s exceeds rate + burst ({:.2} Mbit/s)",
        first / 1e6,
        allowed / 1e6
    );
    runtime.del(&list, &rt)?;
    Ok(())
}

#[test]
fn sentinel_derivation_can_be_turned_off_and_then_overflow_is_a_config_error() -> Result<()> {
    let topo = Topology::new("bwnod")?;
    let scratch = tempfile::tempdir()?;
    let runtime = Runtime::new(&topo.host)?;
    let list = chain(
        scratch.path(),
        "10.95.3.0/24",
        json!({"ingressRate": EGRESS_RATE, "ingressBurst": 4_294_967_295_u64,
               "deriveSentinelBurst": false}),
    );
    let rt = RuntimeConf::new("bw-noderive", topo.container.path(), "eth0");
    let err = runtime.add(&list, &rt).unwrap_err();
    ensure!(err.code() == Some(7), "{err}");
    let msg = err.to_string();
    ensure!(msg.contains("ingressBurst"), "{msg}");
    // Nothing is left on the host veth by the failed ADD (the bridge's own state aside).
    for link in links(&topo.host)? {
        if link.starts_with("veth") {
            ensure!(!qdisc_kinds(&topo.host, &link)?.contains(&"tbf".to_owned()));
        }
    }
    Ok(())
}

#[test]
fn check_fails_on_hand_made_drift_that_the_reference_misses() -> Result<()> {
    let topo = Topology::new("bwchk")?;
    let scratch = tempfile::tempdir()?;
    let runtime = Runtime::new(&topo.host)?;
    let list = chain(scratch.path(), "10.95.4.0/24", static_limits());
    let rt = RuntimeConf::new("bw-check", topo.container.path(), "eth0");
    let result = runtime.add(&list, &rt)?;
    let veth = host_veth(&result)?;
    runtime.check(&list, &rt)?;

    topo.host
        .exec_ok("tc", &["qdisc", "del", "dev", &veth, "root"])?;
    let err = runtime.check(&list, &rt).unwrap_err();
    ensure!(err.to_string().contains("root qdisc"), "{err}");
    // ADD again converges (replace, reuse) and CHECK passes.
    let mut conf = list.plugins[1].clone();
    // The bridge's result, without the IFB our first ADD appended.
    let mut prev = result.clone();
    prev["interfaces"].as_array_mut().map(Vec::pop);
    conf["prevResult"] = prev;
    ok(
        &exec_ours(&runtime, "ADD", &rt, conf, "1.0.0")?,
        "second ADD",
    )?;
    runtime.check(&list, &rt)?;

    topo.host.exec_ok(
        "tc",
        &[
            "filter", "del", "dev", &veth, "parent", "ffff:", "prio", "1",
        ],
    )?;
    let err = runtime.check(&list, &rt).unwrap_err();
    ensure!(err.to_string().contains("filter"), "{err}");

    // A different rate is drift too.
    let mut other = list.clone();
    other.plugins[1]["egressRate"] = json!(EGRESS_RATE * 2);
    ensure!(runtime.check(&other, &rt).is_err());
    runtime.del(&list, &rt)?;
    Ok(())
}

#[test]
fn del_after_the_netns_is_gone_removes_the_ifb() -> Result<()> {
    let mut topo = Topology::new("bwgone")?;
    let scratch = tempfile::tempdir()?;
    let runtime = Runtime::new(&topo.host)?;
    let list = chain(scratch.path(), "10.95.5.0/24", static_limits());
    let rt = RuntimeConf::new("bw-gone", topo.container.path(), "eth0");
    runtime.add(&list, &rt)?;
    ensure!(links(&topo.host)?.iter().any(|l| l.starts_with("bwp")));
    topo.container.delete()?;
    runtime.del(&list, &rt)?;
    ensure!(ifbs(&topo.host)?.is_empty(), "{:?}", ifbs(&topo.host)?);
    // The kernel tears a deleted namespace down asynchronously (a workqueue, after RCU grace
    // periods): the host end of its veth goes with it, a moment later.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<String> = links(&topo.host)?
            .into_iter()
            .filter(|l| l.starts_with("bwp") || l.starts_with("veth"))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "left behind: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn gc_removes_only_this_networks_ifbs_of_attachments_no_longer_valid() -> Result<()> {
    let host = TestNetns::new("bwgc")?;
    let runtime = Runtime::new(&host)?;
    // IFBs as ADD leaves them: ours for two attachments of this network (one under the
    // fallback name), one of another network, and one without an owner (as the Go plugin
    // makes them).
    let owner = |network: &str, id: &str| Attachment {
        network: network.into(),
        container_id: id.into(),
        ifname: "eth0".into(),
    };
    let ours = [
        (
            reference_ifb_name(NETWORK, "c-alive"),
            owner(NETWORK, "c-alive"),
        ),
        (
            fallback_ifb_name(&owner(NETWORK, "c-dead")),
            owner(NETWORK, "c-dead"),
        ),
        (
            reference_ifb_name("othernet", "c-dead"),
            owner("othernet", "c-dead"),
        ),
    ];
    for (name, owner) in &ours {
        host.ip(&["link", "add", name, "type", "ifb"])?;
        host.ip(&[
            "link",
            "set",
            name,
            "alias",
            &bandwidth::names::alias(owner),
        ])?;
    }
    let go_made = reference_ifb_name(NETWORK, "c-go");
    host.ip(&["link", "add", &go_made, "type", "ifb"])?;

    let conf = json!({
        "cniVersion": "1.1.0", "name": NETWORK, "type": "bandwidth",
        "cni.dev/valid-attachments": [{"containerID": "c-alive", "ifname": "eth0"}],
    });
    let out = runtime.exec_plugin("bandwidth", Some("GC"), &[], conf.to_string().as_bytes())?;
    ensure!(out.status.success() && out.stdout.is_empty(), "GC: {out:?}");
    let left = links(&host)?;
    ensure!(left.contains(&ours[0].0), "{left:?}");
    ensure!(!left.contains(&ours[1].0), "{left:?}");
    ensure!(left.contains(&ours[2].0), "{left:?}");
    ensure!(left.contains(&go_made), "{left:?}");
    Ok(())
}

#[test]
fn status_probes_ifb_and_tbf_in_a_throwaway_namespace() -> Result<()> {
    let host = TestNetns::new("bwstat")?;
    let runtime = Runtime::new(&host)?;
    let before = links(&host)?;
    let conf = json!({"cniVersion": "1.1.0", "name": NETWORK, "type": "bandwidth"});
    let out = runtime.exec_plugin(
        "bandwidth",
        Some("STATUS"),
        &[],
        conf.to_string().as_bytes(),
    )?;
    ensure!(
        out.status.success() && out.stdout.is_empty(),
        "STATUS: {out:?}"
    );
    ensure!(links(&host)? == before, "STATUS changed the host namespace");
    Ok(())
}

/// A macvlan as the container's interface: no veth peer on the host, so shaping happens
/// inside the container (root tbf on eth0 for egress, IFB in the container for ingress).
#[test]
fn without_a_host_veth_shaping_happens_inside_the_container() -> Result<()> {
    let topo = Topology::new("bwmv")?;
    // Client reachable through a macvlan: container eth0 (macvlan on host link mvp0) and the
    // client's second leg on a veth, same subnet.
    tests::veth_pair(
        &topo.host,
        "mvp0",
        &[],
        &topo.client,
        "leg0",
        &["10.94.0.2/24"],
    )?;
    topo.host.ip(&[
        "link", "add", "mv0", "link", "mvp0", "type", "macvlan", "mode", "bridge",
    ])?;
    topo.host
        .ip(&["link", "set", "mv0", "netns", topo.container.name()])?;
    topo.container.ip(&["link", "set", "mv0", "name", "eth0"])?;
    topo.container
        .ip(&["addr", "add", "10.94.0.3/24", "dev", "eth0"])?;
    topo.container.ip(&["link", "set", "eth0", "up"])?;
    let runtime = Runtime::new(&topo.host)?;
    let rt = RuntimeConf::new("bw-macvlan", topo.container.path(), "eth0");
    let netns = topo.container.path().to_string_lossy().into_owned();
    let prev = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": netns}],
        "ips": [{"address": "10.94.0.3/24", "interface": 0}],
    });
    let mut conf = static_limits();
    conf["prevResult"] = prev;
    let out = exec_ours(&runtime, "ADD", &rt, conf.clone(), "1.0.0")?;
    ok(&out, "ADD")?;
    let result = out.json()?;
    let ifb = reference_ifb_name(NETWORK, "bw-macvlan");
    let last = result["interfaces"]
        .as_array()
        .and_then(|a| a.last())
        .context("no interfaces")?;
    ensure!(
        last["name"] == ifb && last["sandbox"] == netns.as_str(),
        "{result}"
    );
    ensure!(links(&topo.container)?.contains(&ifb));
    ensure!(!links(&topo.host)?.contains(&ifb));
    ensure!(qdisc_kinds(&topo.container, "eth0")?.contains(&"tbf".to_owned()));
    ok(
        &exec_ours(&runtime, "CHECK", &rt, conf.clone(), "1.0.0")?,
        "CHECK",
    )?;

    // Client ↔ container over the macvlan: egress is the container's own tbf, ingress the IFB.
    let server: SocketAddr = format!("10.94.0.2:{IPERF3_PORT}").parse()?;
    let down = iperf3(&topo.client, server, &topo.container, server, SECS, &["-R"])?;
    ensure_near("into the container", down.bits_per_second, INGRESS_RATE)?;
    let server: SocketAddr = format!("10.94.0.3:{IPERF3_PORT}").parse()?;
    let up = iperf3(&topo.container, server, &topo.client, server, SECS, &["-R"])?;
    ensure_near("out of the container", up.bits_per_second, EGRESS_RATE)?;

    ok(&exec_ours(&runtime, "DEL", &rt, conf, "1.0.0")?, "DEL")?;
    ensure!(
        !links(&topo.container)?.iter().any(|l| l.starts_with("bw")),
        "{:?}",
        links(&topo.container)?
    );
    ensure_unshaped(&topo.container, "eth0")?;
    Ok(())
}

/// Drops the IFB's name and MAC (random, and named differently on purpose) from a result, and
/// an empty `dns` from a 1.x result (Debian's older Go library prints `"dns": {}` there).
fn without_ifb_identity(mut result: Value) -> Value {
    if result["cniVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with('1'))
        && result["dns"] == json!({})
        && let Some(o) = result.as_object_mut()
    {
        o.remove("dns");
    }
    if let Some(last) = result["interfaces"]
        .as_array_mut()
        .and_then(|a| a.last_mut())
        .filter(|i| i["name"].as_str().is_some_and(|n| n.starts_with("bwp")))
    {
        last["name"] = json!("<ifb>");
        last["mac"] = json!("<mac>");
    }
    result
}

#[test]
fn differential_results_equal_the_go_plugins_in_every_shared_version() -> Result<()> {
    let topo = Topology::new("bwdiff")?;
    let scratch = tempfile::tempdir()?;
    let ours = Runtime::new(&topo.host)?;
    let go = Runtime::new(&topo.host)?.use_reference("bandwidth");
    let main = NetworkConfigList::new(
        NETWORK,
        "1.0.0",
        vec![main_plugin::bridge(
            "cni-bwd0",
            &["10.95.6.0/24"],
            &scratch.path().join("ipam"),
        )],
    );
    let rt = RuntimeConf::new("bw-diff", topo.container.path(), "eth0");
    let prev = ours.add(&main, &rt)?;
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0"] {
        for limits in [
            static_limits(),
            json!({"ingressRate": INGRESS_RATE, "ingressBurst": burst_for(INGRESS_RATE)}),
        ] {
            let mut conf = limits.clone();
            let (_, model) = cni::types::CniResult::parse(&prev)?;
            conf["prevResult"] = serde_json::from_str(&model.to_json(version)?)?;
            let mut outputs = Vec::new();
            for runtime in [&go, &ours] {
                let add = exec_ours(runtime, "ADD", &rt, conf.clone(), version)?;
                ok(&add, &format!("ADD {version}"))?;
                let del = exec_ours(runtime, "DEL", &rt, conf.clone(), version)?;
                ok(&del, &format!("DEL {version}"))?;
                outputs.push(without_ifb_identity(add.json()?));
            }
            ensure!(
                outputs[0] == outputs[1],
                "{version} {limits}: Go printed {}, we printed {}",
                outputs[0],
                outputs[1]
            );
        }
    }
    ours.del(&main, &rt)?;
    Ok(())
}

#[test]
fn differential_a_go_add_passes_our_check_and_our_del_cleans_it_up() -> Result<()> {
    let topo = Topology::new("bwgo")?;
    let scratch = tempfile::tempdir()?;
    let go = Runtime::new(&topo.host)?.use_reference("bandwidth");
    let ours = Runtime::new(&topo.host)?;
    let list = chain(scratch.path(), "10.95.7.0/24", static_limits());
    let rt = RuntimeConf::new("bw-upgrade", topo.container.path(), "eth0");
    let result = go.add(&list, &rt)?;
    let veth = host_veth(&result)?;
    let go_ifb = reference_ifb_name(NETWORK, "bw-upgrade");
    ensure!(links(&topo.host)?.contains(&go_ifb), "Go made no {go_ifb}");

    let mut conf = list.plugins[1].clone();
    conf["prevResult"] = result;
    ok(
        &exec_ours(&ours, "CHECK", &rt, conf.clone(), "1.0.0")?,
        "our CHECK of Go's ADD",
    )?;
    ok(
        &exec_ours(&ours, "DEL", &rt, conf, "1.0.0")?,
        "our DEL of Go's ADD",
    )?;
    ensure!(
        !links(&topo.host)?.contains(&go_ifb),
        "{go_ifb} left behind"
    );
    ensure_unshaped(&topo.host, &veth)?;
    go.del(&list, &rt)?;
    Ok(())
}

#[test]
fn add_without_prev_result_is_a_config_error_not_a_panic() -> Result<()> {
    let topo = Topology::new("bwnoprev")?;
    let runtime = Runtime::new(&topo.host)?;
    let rt = RuntimeConf::new("bw-noprev", topo.container.path(), "eth0");
    for conf in [json!({}), static_limits()] {
        let out = exec_ours(&runtime, "ADD", &rt, conf.clone(), "1.0.0")?;
        let err = out.error().context("no error object")?;
        // The reference's message (it panics without limits; with them, this).
        if err.code != 7 || err.msg != "must be called as chained plugin" {
            bail!("{conf}: {err:?}");
        }
    }
    Ok(())
}

/// A host and a container namespace joined by veth pairs, without a main plugin: for runs of
/// our plugin and of the Go one on interfaces made by hand.
struct Pod {
    host: TestNetns,
    container: TestNetns,
    ours: Runtime,
    go: Runtime,
}

/// Which implementation runs a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Impl {
    Ours,
    Go,
}

impl Pod {
    /// `pairs`: (host end, container end) of each veth pair.
    fn new(prefix: &str, pairs: &[(&str, &str)]) -> Result<Pod> {
        let host = TestNetns::new(&format!("{prefix}-h"))?;
        let container = TestNetns::new(&format!("{prefix}-c"))?;
        for (i, (host_if, ctr_if)) in pairs.iter().enumerate() {
            let addr = format!("10.96.{i}.2/24");
            tests::veth_pair(&host, host_if, &[], &container, ctr_if, &[&addr])?;
        }
        let ours = Runtime::new(&host)?;
        let go = Runtime::new(&host)?.use_reference("bandwidth");
        Ok(Pod {
            host,
            container,
            ours,
            go,
        })
    }

    /// The prevResult a main plugin prints for the veth pair `(host_if, ctr_if)`.
    fn prev_result(&self, (host_if, ctr_if): (&str, &str)) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": host_if},
                {"name": ctr_if, "sandbox": self.container.path()},
            ],
        })
    }

    /// Runs `command` of `by` for container `id`'s `ctr_if` with `conf` (the plugin's keys)
    /// on stdin.
    fn exec_with(
        &self,
        by: Impl,
        command: &str,
        id: &str,
        ctr_if: &str,
        conf: Value,
    ) -> Result<PluginOutput> {
        let runtime = match by {
            Impl::Ours => &self.ours,
            Impl::Go => &self.go,
        };
        let rt = RuntimeConf::new(id, self.container.path(), ctr_if);
        exec_ours(runtime, command, &rt, conf, "1.0.0")
    }

    /// Runs `command` of `by` for container `id`'s `ctr_if` (its veth peer `host_if`), with
    /// both directions shaped and the prevResult of the pair.
    fn exec(&self, by: Impl, command: &str, id: &str, pair: (&str, &str)) -> Result<PluginOutput> {
        let mut conf = static_limits();
        conf["prevResult"] = self.prev_result(pair);
        self.exec_with(by, command, id, pair.1, conf)
    }

    /// [`Pod::exec`] that must succeed.
    fn ok(&self, by: Impl, command: &str, id: &str, pair: (&str, &str)) -> Result<PluginOutput> {
        let out = self.exec(by, command, id, pair)?;
        ok(&out, &format!("{by:?} {command} of {id}/{}", pair.1))?;
        Ok(out)
    }

    /// The host's IFBs, sorted.
    fn ifbs(&self) -> Result<Vec<String>> {
        let mut names = ifbs(&self.host)?;
        names.sort();
        Ok(names)
    }
}

fn sorted<const N: usize>(mut names: [String; N]) -> Vec<String> {
    names.sort();
    names.to_vec()
}

/// The IFB name the fallback gives interface `ifname` of container `id` on [`NETWORK`].
fn fallback(id: &str, ifname: &str) -> String {
    fallback_ifb_name(&Attachment {
        network: NETWORK.into(),
        container_id: id.into(),
        ifname: ifname.into(),
    })
}

const ETH0: (&str, &str) = ("veth-a", "eth0");
const NET1: (&str, &str) = ("veth-b", "net1");

#[test]
fn two_interfaces_of_one_container_on_one_network_get_the_reference_name_and_the_fallback()
-> Result<()> {
    let pod = Pod::new("bwtwo", &[ETH0, NET1])?;
    let id = "bw-two";
    let reference = reference_ifb_name(NETWORK, id);
    let fallback = fallback(id, "net1");
    let first = pod.ok(Impl::Ours, "ADD", id, ETH0)?.json()?;
    let second = pod.ok(Impl::Ours, "ADD", id, NET1)?.json()?;
    ensure!(
        first["interfaces"][2]["name"] == reference.as_str(),
        "{first}"
    );
    ensure!(
        second["interfaces"][2]["name"] == fallback.as_str(),
        "{second}"
    );
    ensure!(pod.ifbs()? == sorted([reference.clone(), fallback.clone()]));
    // Each veth redirects to its own IFB, and a repeated ADD keeps it.
    for pair in [ETH0, NET1] {
        pod.ok(Impl::Ours, "CHECK", id, pair)?;
        pod.ok(Impl::Ours, "ADD", id, pair)?;
    }
    ensure!(pod.ifbs()? == sorted([reference.clone(), fallback]));
    pod.ok(Impl::Ours, "DEL", id, NET1)?;
    ensure!(pod.ifbs()? == [reference.clone()], "{:?}", pod.ifbs()?);
    pod.ok(Impl::Ours, "CHECK", id, ETH0)?;
    pod.ok(Impl::Ours, "DEL", id, ETH0)?;
    ensure!(pod.ifbs()?.is_empty(), "{:?}", pod.ifbs()?);
    for (veth, _) in [ETH0, NET1] {
        ensure_unshaped(&pod.host, veth)?;
    }
    Ok(())
}

#[test]
fn differential_a_go_made_ifb_next_to_ours_in_one_container_is_left_to_its_own_del() -> Result<()> {
    let pod = Pod::new("bwmix", &[ETH0, NET1])?;
    let id = "bw-mix";
    let reference = reference_ifb_name(NETWORK, id);
    let fallback = fallback(id, "net1");
    // Before an upgrade, the Go plugin shaped eth0; after it, ours shapes net1.
    pod.ok(Impl::Go, "ADD", id, ETH0)?;
    pod.ok(Impl::Ours, "ADD", id, NET1)?;
    ensure!(pod.ifbs()? == sorted([reference.clone(), fallback.clone()]));
    // Our CHECK knows the Go-made IFB as eth0's by the filter that redirects to it.
    pod.ok(Impl::Ours, "CHECK", id, ETH0)?;
    pod.ok(Impl::Ours, "CHECK", id, NET1)?;
    pod.ok(Impl::Ours, "DEL", id, NET1)?;
    ensure!(pod.ifbs()? == [reference.clone()], "{:?}", pod.ifbs()?);
    pod.ok(Impl::Ours, "CHECK", id, ETH0)?;
    pod.ok(Impl::Ours, "DEL", id, ETH0)?;
    ensure!(pod.ifbs()?.is_empty(), "{:?}", pod.ifbs()?);
    ensure_unshaped(&pod.host, ETH0.0)?;
    Ok(())
}

#[test]
fn differential_with_the_container_gone_each_del_takes_its_own_ifb() -> Result<()> {
    let mut pod = Pod::new("bwmixg", &[ETH0, NET1])?;
    let id = "bw-mix-gone";
    let reference = reference_ifb_name(NETWORK, id);
    pod.ok(Impl::Go, "ADD", id, ETH0)?;
    pod.ok(Impl::Ours, "ADD", id, NET1)?;
    pod.container.delete()?;
    // No filter can tell whose the Go-made IFB is, but net1 has its own (by alias): that one
    // goes, the Go-made one is left to eth0's DEL.
    pod.ok(Impl::Ours, "DEL", id, NET1)?;
    ensure!(pod.ifbs()? == [reference], "{:?}", pod.ifbs()?);
    pod.ok(Impl::Ours, "DEL", id, ETH0)?;
    ensure!(pod.ifbs()?.is_empty(), "{:?}", pod.ifbs()?);
    Ok(())
}

#[test]
fn differential_our_add_is_checked_and_deleted_by_the_go_plugin() -> Result<()> {
    let pod = Pod::new("bwgodel", &[ETH0])?;
    let id = "bw-go-del";
    let reference = reference_ifb_name(NETWORK, id);
    pod.ok(Impl::Ours, "ADD", id, ETH0)?;
    ensure!(pod.ifbs()? == [reference.clone()], "{:?}", pod.ifbs()?);
    pod.ok(Impl::Go, "CHECK", id, ETH0)?;
    pod.ok(Impl::Go, "DEL", id, ETH0)?;
    ensure!(pod.ifbs()?.is_empty(), "{:?}", pod.ifbs()?);
    // The Go DEL leaves the host veth's qdiscs (to go with the veth); ours removes them.
    pod.ok(Impl::Ours, "DEL", id, ETH0)?;
    ensure_unshaped(&pod.host, ETH0.0)?;
    Ok(())
}

/// `tc -j qdisc show dev <dev>` of `ns`, as (kind, rate in bytes/s) pairs.
fn qdisc_rates(ns: &TestNetns, dev: &str) -> Result<Vec<(String, Option<u64>)>> {
    Ok(tc_json(ns, &["qdisc", "show", "dev", dev])?
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| {
            (
                q["kind"].as_str().unwrap_or_default().to_owned(),
                q["options"]["rate"].as_u64(),
            )
        })
        .collect())
}

/// Issue 22 #1: interface indexes repeat across namespaces. The container's `eth0` (index 5)
/// is a veth whose peer (index 77) lives in a third namespace; the host's index 77 is another
/// pod's veth, whose own peer has index 5. Matching indexes alone would take the victim's veth
/// for the container's peer.
#[test]
fn a_veth_whose_peer_is_in_a_third_namespace_never_shapes_the_host_link_at_that_index() -> Result<()>
{
    let host = TestNetns::new("bwvic-h")?;
    let victim = TestNetns::new("bwvic-v")?;
    let container = TestNetns::new("bwvic-c")?;
    let third = TestNetns::new("bwvic-x")?;
    host.ip(&[
        "link",
        "add",
        "vich",
        "index",
        "77",
        "type",
        "veth",
        "peer",
        "name",
        "vicv",
        "index",
        "5",
        "netns",
        victim.name(),
    ])?;
    host.ip(&["link", "set", "vich", "up"])?;
    host.exec_ok(
        "tc",
        &[
            "qdisc", "add", "dev", "vich", "root", "tbf", "rate", "1mbit", "burst", "10kb",
            "latency", "25ms",
        ],
    )?;
    container.ip(&[
        "link",
        "add",
        "eth0",
        "index",
        "5",
        "type",
        "veth",
        "peer",
        "name",
        "p0",
        "index",
        "77",
        "netns",
        third.name(),
    ])?;
    container.ip(&["link", "set", "eth0", "up"])?;
    let victim_before = qdisc_rates(&host, "vich")?;
    ensure!(
        victim_before == [("tbf".to_owned(), Some(125_000))],
        "{victim_before:?}"
    );

    let runtime = Runtime::new(&host)?;
    let rt = RuntimeConf::new("bw-victim", container.path(), "eth0");
    let mut conf = json!({
        "ingressRate": 50_000_000, "ingressBurst": 500_000,
        "egressRate": 50_000_000, "egressBurst": 500_000,
    });
    // Listing the victim's veth too, as the Go plugin would want it.
    conf["prevResult"] = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "vich"}, {"name": "eth0", "sandbox": container.path()}],
    });
    ok(
        &exec_ours(&runtime, "ADD", &rt, conf.clone(), "1.0.0")?,
        "ADD",
    )?;
    // Shaped inside the container, as for any interface without a host-side veth.
    ensure!(qdisc_kinds(&container, "eth0")?.contains(&"tbf".to_owned()));
    ensure!(ifbs(&container)? == [reference_ifb_name(NETWORK, "bw-victim")]);
    ensure!(ifbs(&host)?.is_empty(), "{:?}", ifbs(&host)?);
    ensure!(
        qdisc_rates(&host, "vich")? == victim_before,
        "the victim's veth was shaped"
    );
    ok(
        &exec_ours(&runtime, "CHECK", &rt, conf.clone(), "1.0.0")?,
        "CHECK",
    )?;
    ok(&exec_ours(&runtime, "DEL", &rt, conf, "1.0.0")?, "DEL")?;
    ensure!(
        qdisc_rates(&host, "vich")? == victim_before,
        "DEL touched the victim's veth"
    );
    ensure!(ifbs(&container)?.is_empty(), "{:?}", ifbs(&container)?);
    ensure_unshaped(&container, "eth0")?;
    Ok(())
}

/// Issue 22 #9: a `CNI_NETNS` that opens but is no network namespace (procfs files, another
/// kind of namespace, a trailing slash) leaves DEL nothing to do inside; it cleans the host
/// side and succeeds.
#[test]
fn del_succeeds_for_netns_paths_that_are_no_network_namespace() -> Result<()> {
    let pod = Pod::new("bwnotns", &[ETH0])?;
    let id = "bw-not-netns";
    let trailing = format!("{}/", pod.container.path().display());
    for netns in ["/proc/self/status", "/proc/self/ns/uts", trailing.as_str()] {
        pod.ok(Impl::Ours, "ADD", id, ETH0)?;
        ensure!(!pod.ifbs()?.is_empty());
        let out = pod.ours.exec_plugin(
            "bandwidth",
            Some("DEL"),
            &[
                ("CNI_CONTAINERID", id),
                ("CNI_NETNS", netns),
                ("CNI_IFNAME", ETH0.1),
                ("CNI_PATH", "/usr/lib/cni"),
            ],
            json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "bandwidth"})
                .to_string()
                .as_bytes(),
        )?;
        ok(&out, &format!("DEL with CNI_NETNS={netns}"))?;
        ensure!(pod.ifbs()?.is_empty(), "{netns}: {:?}", pod.ifbs()?);
        // What only the container side could find (the veth's qdiscs) goes with a real DEL.
        pod.ok(Impl::Ours, "DEL", id, ETH0)?;
    }
    Ok(())
}

/// Issue 22 #15: STATUS's probe must not wait on a thread that logs while the caller holds
/// the log's stream. With debug logging on, it returns (the runtime's deadline catches a hang).
#[test]
fn status_returns_with_debug_logging() -> Result<()> {
    let host = TestNetns::new("bwstdbg")?;
    let runtime = Runtime::new(&host)?.with_timeout(Duration::from_secs(20));
    let conf = json!({"cniVersion": "1.1.0", "name": NETWORK, "type": "bandwidth"});
    let out = runtime.exec_plugin(
        "bandwidth",
        Some("STATUS"),
        &[("CNI_LOG_LEVEL", "debug")],
        conf.to_string().as_bytes(),
    )?;
    ensure!(out.status.success(), "STATUS: {out:?}");
    // The probe's requests were logged, on the caller's thread.
    ensure!(
        String::from_utf8_lossy(&out.stderr).contains("bwpstatus0"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The message of the error `out` printed.
fn error_msg(out: &PluginOutput) -> Result<String> {
    Ok(out
        .error()
        .with_context(|| format!("no error object: {out:?}"))?
        .msg)
}

/// Issue 19 #3: for the same condition, the same `msg` as the Go plugin, word for word (ours
/// adds `details`).
#[test]
fn differential_error_messages_are_the_go_plugins_word_for_word() -> Result<()> {
    let pod = Pod::new("bwmsg", &[ETH0])?;
    let with_prev = |mut conf: Value| {
        conf["prevResult"] = pod.prev_result(ETH0);
        conf
    };
    let cases = [
        (
            "ADD",
            "eth0",
            with_prev(json!({"ingressRate": 8000})),
            "if rate is set, burst must also be set",
        ),
        (
            "ADD",
            "eth0",
            with_prev(json!({"egressBurst": 800})),
            "if burst is set, rate must also be set",
        ),
        (
            "ADD",
            "eth0",
            with_prev(json!({"egressRate": 8000, "egressBurst": 34_359_738_360_u64})),
            "burst cannot be more than 4GB",
        ),
        (
            "ADD",
            "eth0",
            static_limits(),
            "must be called as chained plugin",
        ),
        (
            "CHECK",
            "eth0",
            static_limits(),
            "must be called as a chained plugin",
        ),
        (
            "ADD",
            "nope0",
            with_prev(static_limits()),
            "container interface nope0 has no veth peer: could not look up \"nope0\": Link not found",
        ),
    ];
    for (command, ifname, conf, msg) in cases {
        for by in [Impl::Go, Impl::Ours] {
            let out = pod.exec_with(by, command, "bw-msg", ifname, conf.clone())?;
            let got = error_msg(&out)?;
            ensure!(got == msg, "{by:?} {command} {conf}: {got:?}, want {msg:?}");
        }
    }
    // CHECK of what each made itself, after drift.
    let ifb = reference_ifb_name(NETWORK, "bw-msg");
    for by in [Impl::Go, Impl::Ours] {
        pod.ok(by, "ADD", "bw-msg", ETH0)?;
        let mut faster = with_prev(static_limits());
        faster["egressRate"] = json!(EGRESS_RATE * 2);
        let out = pod.exec_with(by, "CHECK", "bw-msg", "eth0", faster)?;
        let got = error_msg(&out)?;
        ensure!(got == "Rate doesn't match", "{by:?}: {got:?}");
        pod.host.ip(&["link", "del", &ifb])?;
        let out = pod.exec(by, "CHECK", "bw-msg", ETH0)?;
        let got = error_msg(&out)?;
        ensure!(got == "get ifb device: Link not found", "{by:?}: {got:?}");
        // Ours removes what either made (the Go DEL leaves the veth's qdiscs).
        pod.ok(Impl::Ours, "DEL", "bw-msg", ETH0)?;
    }
    Ok(())
}
