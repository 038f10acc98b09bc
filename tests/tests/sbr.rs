//! End-to-end tests of `sbr`: a container with two interfaces (a bridge chain on `eth0`, a ptp
//! chain on `net1`), source routes checked with `ip route get` and with real replies, the
//! `table`, `gateways` and `addSourceHints` variants, IPv6, DEL, and the same ADD through
//! Debian's Go `sbr`.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use tests::netns::{CLIENT_V4, CLIENT_V6};
use tests::traffic::{TcpServer, tcp_request};
use tests::{NetworkConfigList, Runtime, RuntimeConf, TestNetns, Topology, main_plugin};

const TIMEOUT: Duration = Duration::from_secs(5);
/// The chains run at 1.0.0: Debian's Go main plugins speak no later version.
const VERSION: &str = "1.0.0";

/// The address of `ifname` (of the given family) in a chain result.
fn address_of(result: &Value, ifname: &str, v6: bool) -> Result<IpAddr> {
    let interfaces = result["interfaces"].as_array().context("no interfaces")?;
    result["ips"]
        .as_array()
        .context("no ips")?
        .iter()
        .filter(|ip| {
            ip["interface"]
                .as_u64()
                .and_then(|i| interfaces.get(usize::try_from(i).ok()?))
                .is_some_and(|iface| iface["name"] == ifname)
        })
        .filter_map(|ip| ip["address"].as_str()?.parse::<ipnet::IpNet>().ok())
        .map(|net| net.addr())
        .find(|addr| addr.is_ipv6() == v6)
        .with_context(|| format!("no address of {ifname} in {result}"))
}

/// Every rule of both families, as `ip rule` prints them.
fn rules(ns: &TestNetns) -> Result<String> {
    Ok(ns.ip(&["rule"])? + &ns.ip(&["-6", "rule"])?)
}

/// The routing tables holding at least one route, both families.
fn tables(ns: &TestNetns) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for family in ["-4", "-6"] {
        let routes = ns.ip_json(&[family, "route", "show", "table", "all"])?;
        for route in routes.as_array().context("routes")? {
            out.insert(route["table"].as_str().unwrap_or("main").to_owned());
        }
    }
    Ok(out)
}

/// Transmitted packets of `ifname`.
fn tx_packets(ns: &TestNetns, ifname: &str) -> Result<u64> {
    let link = ns.ip_json(&["-s", "link", "show", ifname])?;
    link[0]["stats64"]["tx"]["packets"]
        .as_u64()
        .with_context(|| format!("no tx counter: {link}"))
}

/// `ip route get <dst> [from <src>]` inside `ns`.
fn route_get(ns: &TestNetns, dst: IpAddr, src: Option<IpAddr>) -> Result<String> {
    let dst = dst.to_string();
    let mut args = vec!["route", "get", dst.as_str()];
    let src = src.map(|s| s.to_string());
    if let Some(src) = &src {
        args.extend(["from", src.as_str()]);
    }
    ns.ip(&args)
}

/// A container with `eth0` on a bridge (default route in main) and `net1` on ptp, with sbr
/// (keys `sbr_keys`) chained on `net1` only.
struct TwoInterfaces {
    topo: Topology,
    rt: Runtime,
    _data: tempfile::TempDir,
    bridge: (NetworkConfigList, RuntimeConf),
    ptp: (NetworkConfigList, RuntimeConf),
    /// The ptp chain's ADD result.
    result: Value,
}

impl TwoInterfaces {
    fn new(prefix: &str, v6: bool, sbr_keys: Value) -> Result<TwoInterfaces> {
        let topo = Topology::new(prefix)?;
        let data = tempfile::tempdir()?;
        let rt = Runtime::new(&topo.host)?;
        let (bridge_net, ptp_net) = if v6 {
            ("fd61::/64", "fd62::/64")
        } else {
            ("10.61.0.0/24", "10.62.0.0/24")
        };
        let bridge_list = NetworkConfigList::new(
            "sbr-eth0",
            VERSION,
            vec![main_plugin::bridge("sbrbr0", &[bridge_net], data.path())],
        );
        let mut ptp = main_plugin::ptp(&[ptp_net], data.path());
        // The first interface owns the main default route; the second gets one from sbr.
        ptp["ipam"]["routes"] = json!([]);
        let mut sbr = sbr_keys;
        sbr["type"] = json!("sbr");
        let ptp_list = NetworkConfigList::new("sbr-net1", VERSION, vec![ptp, sbr]);
        let bridge_conf = RuntimeConf::new("sbr-ctr", topo.container.path(), "eth0");
        let ptp_conf = RuntimeConf::new("sbr-ctr", topo.container.path(), "net1");
        rt.add(&bridge_list, &bridge_conf)?;
        let result = rt.add(&ptp_list, &ptp_conf)?;
        Ok(TwoInterfaces {
            topo,
            rt,
            _data: data,
            bridge: (bridge_list, bridge_conf),
            ptp: (ptp_list, ptp_conf),
            result,
        })
    }

    /// Sends 200 KB to an echo server on `addr` in the container from the client and returns
    /// how many packets `eth0` and `net1` sent meanwhile.
    fn echo_from_client(&self, addr: IpAddr) -> Result<(u64, u64)> {
        let ctr = &self.topo.container;
        let _server = TcpServer::echo(ctr, SocketAddr::new(addr, 8080))?;
        let before = (tx_packets(ctr, "eth0")?, tx_packets(ctr, "net1")?);
        let payload = vec![b'x'; 200_000];
        let got = tcp_request(
            &self.topo.client,
            SocketAddr::new(addr, 8080),
            &payload,
            TIMEOUT,
        )?;
        ensure!(
            got.len() == payload.len(),
            "echo returned {} bytes",
            got.len()
        );
        let after = (tx_packets(ctr, "eth0")?, tx_packets(ctr, "net1")?);
        Ok((after.0 - before.0, after.1 - before.1))
    }
}

#[test]
fn replies_from_the_second_interface_leave_through_it_and_del_leaves_only_main() -> Result<()> {
    let two = TwoInterfaces::new("sbr2", false, json!({}))?;
    let ctr = &two.topo.container;
    let net1 = address_of(&two.result, "net1", false)?;
    let client: IpAddr = CLIENT_V4.parse()?;

    assert!(
        rules(ctr)?.contains(&format!("from {net1} lookup 100")),
        "{}",
        rules(ctr)?
    );
    let sourced = route_get(ctr, client, Some(net1))?;
    assert!(
        sourced.contains("dev net1") && sourced.contains("table 100"),
        "{sourced}"
    );
    let unsourced = route_get(ctr, client, None)?;
    assert!(unsourced.contains("dev eth0"), "{unsourced}");
    assert_eq!(ctr.ip(&["route", "show", "dev", "net1"])?, "");

    // Replies from net1's address go out through net1, not through eth0's default route:
    // the host drops packets arriving on the wrong interface (strict reverse-path filter), so
    // the exchange only completes this way.
    two.topo
        .host
        .set_sysctl("net.ipv4.conf.all.rp_filter", "1")?;
    let (eth0_tx, net1_tx) = two.echo_from_client(net1)?;
    // Offloads send the 200 KB in a few dozen large packets.
    assert!(net1_tx >= 10, "net1 sent {net1_tx} packets");
    assert!(eth0_tx < 5, "eth0 sent {eth0_tx} packets");
    // Without the rule the same replies take eth0 and the host drops them.
    ctr.ip(&["rule", "del", "from", &net1.to_string()])?;
    assert!(two.echo_from_client(net1).is_err());
    ctr.ip(&["rule", "add", "from", &net1.to_string(), "lookup", "100"])?;

    two.rt.check(&two.bridge.0, &two.bridge.1)?;
    // The ptp chain's own CHECK looks for its routes in main: sbr's CHECK alone.
    let mut check_conf = json!({"cniVersion": VERSION, "name": "sbr-net1", "type": "sbr"});
    check_conf["prevResult"] = two.result.clone();
    let env = [
        ("CNI_CONTAINERID", "sbr-ctr"),
        ("CNI_NETNS", ctr.path().to_str().context("path")?),
        ("CNI_IFNAME", "net1"),
    ];
    let stdin = serde_json::to_vec(&check_conf)?;
    let ok = two.rt.exec_plugin("sbr", Some("CHECK"), &env, &stdin)?;
    assert!(ok.status.success(), "{ok:?}");
    ctr.ip(&["route", "flush", "table", "100"])?;
    let failed = two.rt.exec_plugin("sbr", Some("CHECK"), &env, &stdin)?;
    let error = failed.error().context("CHECK should fail")?;
    assert_eq!(
        error.msg,
        "sbr CHECK of net1 failed: route \"default via 10.62.0.1 dev net1 table 100\" is missing",
        "{error:?}"
    );

    two.rt.del(&two.ptp.0, &two.ptp.1)?;
    let left = rules(ctr)?;
    assert!(!left.contains("lookup 100"), "{left}");
    assert_eq!(
        tables(ctr)?,
        BTreeSet::from(["local".to_owned(), "main".to_owned()])
    );
    // eth0 keeps working through main.
    assert!(route_get(ctr, client, None)?.contains("dev eth0"));
    two.rt.del(&two.bridge.0, &two.bridge.1)?;
    Ok(())
}

#[test]
fn ipv6_replies_from_the_second_interface_leave_through_it() -> Result<()> {
    let two = TwoInterfaces::new("sbr6", true, json!({}))?;
    let ctr = &two.topo.container;
    let net1 = address_of(&two.result, "net1", true)?;
    let client: IpAddr = CLIENT_V6.parse()?;
    assert!(
        ctr.ip(&["-6", "rule"])?
            .contains(&format!("from {net1} lookup 100")),
        "{}",
        rules(ctr)?
    );
    let sourced = route_get(ctr, client, Some(net1))?;
    assert!(
        sourced.contains("dev net1") && sourced.contains("table 100"),
        "{sourced}"
    );
    assert!(route_get(ctr, client, None)?.contains("dev eth0"));
    let (eth0_tx, net1_tx) = two.echo_from_client(net1)?;
    // Offloads send the 200 KB in a few dozen large packets.
    assert!(net1_tx >= 10, "net1 sent {net1_tx} packets");
    assert!(eth0_tx < 5, "eth0 sent {eth0_tx} packets");
    two.rt.del(&two.ptp.0, &two.ptp.1)?;
    assert!(!ctr.ip(&["-6", "rule"])?.contains("lookup 100"));
    assert_eq!(
        tables(ctr)?,
        BTreeSet::from(["local".to_owned(), "main".to_owned()])
    );
    Ok(())
}

#[test]
fn a_fixed_table_gets_only_rules_and_the_chain_check_passes() -> Result<()> {
    let two = TwoInterfaces::new("sbrt", false, json!({ "table": 5000 }))?;
    let ctr = &two.topo.container;
    let net1 = address_of(&two.result, "net1", false)?;
    let main_before = ctr.ip(&["route", "show", "dev", "net1"])?;
    assert!(!main_before.is_empty());
    assert!(rules(ctr)?.contains(&format!("from {net1} lookup 5000")));
    // Routes stay where the main plugin put them, so ptp's own CHECK passes too.
    two.rt.check(&two.ptp.0, &two.ptp.1)?;
    assert_eq!(
        tables(ctr)?,
        BTreeSet::from(["local".to_owned(), "main".to_owned()])
    );
    two.rt.del(&two.ptp.0, &two.ptp.1)?;
    assert!(!rules(ctr)?.contains("lookup 5000"));
    Ok(())
}

/// A bridge + sbr chain on `eth0` alone, with sbr keys `keys`.
fn bridge_with_sbr(
    prefix: &str,
    keys: Value,
) -> Result<(
    Topology,
    Runtime,
    tempfile::TempDir,
    NetworkConfigList,
    RuntimeConf,
    Value,
)> {
    let topo = Topology::new(prefix)?;
    let data = tempfile::tempdir()?;
    let rt = Runtime::new(&topo.host)?;
    let mut sbr = keys;
    sbr["type"] = json!("sbr");
    let list = NetworkConfigList::new(
        "sbr-one",
        VERSION,
        vec![
            main_plugin::bridge("sbrbr1", &["10.63.0.0/24"], data.path()),
            sbr,
        ],
    );
    let conf = RuntimeConf::new("sbr-one", topo.container.path(), "eth0");
    let result = rt.add(&list, &conf)?;
    Ok((topo, rt, data, list, conf, result))
}

#[test]
fn static_gateways_replace_the_prev_result_gateway_in_the_table() -> Result<()> {
    let (topo, rt, _data, list, conf, result) =
        bridge_with_sbr("sbrg", json!({ "gateways": ["10.63.0.254"] }))?;
    let ctr = &topo.container;
    let eth0 = address_of(&result, "eth0", false)?;
    let table = ctr.ip(&["route", "show", "table", "100"])?;
    assert!(
        table.contains("default via 10.63.0.254 dev eth0"),
        "{table}"
    );
    assert!(!table.contains("10.63.0.1 "), "{table}");
    // The host answers on the static gateway's address, so replies really go through it.
    topo.host
        .ip(&["addr", "add", "10.63.0.254/24", "dev", "sbrbr1"])?;
    let client: IpAddr = CLIENT_V4.parse()?;
    assert!(route_get(ctr, client, Some(eth0))?.contains("via 10.63.0.254"));
    let _server = TcpServer::banner(ctr, SocketAddr::new(eth0, 8081), "via the static gateway")?;
    let got = tcp_request(&topo.client, SocketAddr::new(eth0, 8081), b"", TIMEOUT)?;
    assert_eq!(got, b"via the static gateway");
    rt.del(&list, &conf)?;
    assert!(!rules(ctr)?.contains("lookup 100"));
    Ok(())
}

#[test]
fn source_hints_keep_the_subnet_route_in_main() -> Result<()> {
    let (topo, rt, _data, list, conf, result) =
        bridge_with_sbr("sbrh", json!({ "addSourceHints": true }))?;
    let ctr = &topo.container;
    let eth0 = address_of(&result, "eth0", false)?;
    let main = ctr.ip(&["route", "show", "dev", "eth0"])?;
    assert!(
        main.contains(&format!("10.63.0.0/24 scope link src {eth0}")),
        "{main}"
    );
    assert!(!main.contains("default"), "{main}");
    let table = ctr.ip(&["route", "show", "table", "100"])?;
    assert!(
        table.contains("default via 10.63.0.1 dev eth0") && table.contains("10.63.0.0/24"),
        "{table}"
    );
    // The subnet is reachable without a source; everything else only from the address.
    assert!(route_get(ctr, "10.63.0.1".parse()?, None)?.contains("dev eth0"));
    assert!(route_get(ctr, CLIENT_V4.parse()?, None).is_err());
    assert!(route_get(ctr, CLIENT_V4.parse()?, Some(eth0))?.contains("table 100"));
    rt.del(&list, &conf)?;
    Ok(())
}

/// Code 7 with the reference's message where it refuses the value too (`gateways`, HEAD), ours
/// (naming the key) where only we do (`table`).
#[test]
fn bad_keys_are_code_7_with_the_references_message() -> Result<()> {
    let host = TestNetns::new("sbrbad")?;
    let rt = Runtime::new(&host)?;
    let add = |conf: &Value| -> Result<tests::CniErrorObject> {
        let out = rt.exec_plugin(
            "sbr",
            Some("ADD"),
            &[
                ("CNI_CONTAINERID", "bad"),
                ("CNI_NETNS", host.path().to_str().context("path")?),
                ("CNI_IFNAME", "eth0"),
                ("CNI_NETNS_OVERRIDE", "1"),
            ],
            &serde_json::to_vec(conf)?,
        )?;
        out.error().context("ADD should fail")
    };
    for (keys, want) in [
        (json!({ "table": 254 }), "table: invalid routing table 254"),
        (
            json!({ "gateways": ["10.0.0.1", "10.0.0.2"] }),
            "gateways list contains multiple IPv4 addresses: 10.0.0.1 and 10.0.0.2",
        ),
        (
            json!({ "gateways": ["nope"] }),
            "invalid static gateway IP address: nope",
        ),
        (
            json!({ "gateways": ["10.0.0.1", "fd::1", "10.0.0.2"] }),
            "gateways list cannot contain more than 2 entries (one IPv4, one IPv6)",
        ),
    ] {
        let mut conf = keys;
        conf["cniVersion"] = json!(VERSION);
        conf["name"] = json!("bad");
        conf["type"] = json!("sbr");
        conf["prevResult"] = json!({"cniVersion": VERSION, "ips": [{"address": "10.0.0.2/24"}]});
        let error = add(&conf)?;
        assert_eq!(error.code, 7, "{error:?}");
        assert!(error.msg.starts_with(want), "{error:?}");
    }
    // Without prevResult, and with a prevResult without addresses: the reference's words.
    for (prev, want) in [
        (None, "This plugin must be called as chained plugin"),
        (
            Some(json!({"cniVersion": VERSION})),
            "No IP addresses supplied on interface: eth0",
        ),
    ] {
        let mut conf = json!({"cniVersion": VERSION, "name": "bad", "type": "sbr"});
        if let Some(prev) = prev {
            conf["prevResult"] = prev;
        }
        let error = add(&conf)?;
        assert_eq!((error.code, error.msg.as_str()), (7, want), "{error:?}");
    }
    Ok(())
}

/// The rules and every table of `ns` after the same dual-stack bridge ADD, for comparison.
fn sbr_state(ns: &TestNetns) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for args in [
        &["rule"][..],
        &["-6", "rule"],
        &["route", "show", "table", "all"],
        &["-6", "route", "show", "table", "all"],
    ] {
        // Link-local addresses come from random MACs; everything else must match.
        lines.extend(
            ns.ip(args)?
                .lines()
                .filter(|l| !l.starts_with("local fe80::"))
                .map(str::to_owned),
        );
    }
    lines.sort();
    Ok(lines)
}

#[test]
fn the_same_add_makes_the_same_rules_and_tables_as_go_sbr() -> Result<()> {
    let mut states = Vec::new();
    for go in [false, true] {
        let topo = Topology::new(if go { "sbrgo" } else { "sbrrs" })?;
        let data = tempfile::tempdir()?;
        let mut rt = Runtime::new(&topo.host)?;
        if go {
            rt = rt.use_reference("sbr");
        }
        let list = NetworkConfigList::new(
            "sbr-diff",
            VERSION,
            vec![
                main_plugin::bridge("sbrbr2", &["10.64.0.0/24", "fd64::/64"], data.path()),
                json!({ "type": "sbr" }),
            ],
        );
        let conf = RuntimeConf::new("sbr-diff", topo.container.path(), "eth0");
        rt.add(&list, &conf)?;
        states.push(sbr_state(&topo.container)?);
        if go {
            // Go's ADD, our DEL (an upgrade between the two): no rule is left behind.
            let ours = Runtime::new(&topo.host)?;
            ours.del(&list, &conf)?;
            let left = rules(&topo.container)?;
            assert!(!left.contains("lookup 10"), "{left}");
        } else {
            rt.del(&list, &conf)?;
        }
    }
    let joined = states[0].join("\n");
    assert!(
        joined.contains("lookup 100") && joined.contains("lookup 101"),
        "{joined}"
    );
    assert_eq!(states[0], states[1]);
    Ok(())
}

/// Issue 22 item 7: DEL reads `table` alone. After an ADD, a DEL whose `gateways` and
/// `addSourceHints` ADD would refuse still removes the rule; rules an ADD with `table: 254`
/// made (the reference's ADD takes it) are removed by a DEL with it; a `table` that names no
/// routing table removes nothing and succeeds.
#[test]
fn del_reads_only_table_and_gets_through_keys_add_refuses() -> Result<()> {
    let host = TestNetns::new("sbrdelh")?;
    let ctr = TestNetns::new("sbrdelc")?;
    ctr.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "p0"])?;
    ctr.ip(&["link", "set", "eth0", "up"])?;
    ctr.ip(&["addr", "add", "10.0.9.2/24", "dev", "eth0"])?;
    let rt = Runtime::new(&host)?;
    let netns = ctr.path().to_str().context("path")?.to_owned();
    let exec = |verb: &str, keys: Value| -> Result<tests::PluginOutput> {
        let mut conf = keys;
        conf["cniVersion"] = json!(VERSION);
        conf["name"] = json!("sbrdel");
        conf["type"] = json!("sbr");
        conf["prevResult"] = json!({"cniVersion": VERSION,
            "ips": [{"address": "10.0.9.2/24", "gateway": "10.0.9.1"}]});
        rt.exec_plugin(
            "sbr",
            Some(verb),
            &[
                ("CNI_CONTAINERID", "sbrdel"),
                ("CNI_NETNS", &netns),
                ("CNI_IFNAME", "eth0"),
            ],
            &serde_json::to_vec(&conf)?,
        )
    };
    let out = exec("ADD", json!({}))?;
    ensure!(out.status.success(), "ADD: {out:?}");
    ensure!(rules(&ctr)?.contains("from 10.0.9.2 lookup 100"));
    for keys in [
        json!({"gateways": ["x"], "addSourceHints": "yes"}),
        json!({"gateways": ["10.0.0.1", "10.0.0.2", "10.0.0.3"]}),
    ] {
        let out = exec("ADD", keys.clone())?;
        ensure!(!out.status.success(), "ADD with {keys} worked");
    }
    let out = exec("DEL", json!({"gateways": ["x"], "addSourceHints": "yes"}))?;
    ensure!(out.status.success(), "DEL: {out:?}");
    ensure!(!rules(&ctr)?.contains("lookup 100"), "{}", rules(&ctr)?);

    ctr.ip(&["rule", "add", "from", "10.0.9.2/32", "table", "254"])?;
    let out = exec("DEL", json!({"table": -1}))?;
    ensure!(out.status.success(), "DEL: {out:?}");
    ensure!(rules(&ctr)?.contains("from 10.0.9.2 lookup main"));
    let out = exec("DEL", json!({"table": 254}))?;
    ensure!(out.status.success(), "DEL: {out:?}");
    ensure!(
        !rules(&ctr)?.contains("from 10.0.9.2 lookup main"),
        "{}",
        rules(&ctr)?
    );
    Ok(())
}
