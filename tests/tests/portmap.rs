//! `portmap` end to end: bridge + host-local + portmap chains run by the test runtime, with
//! real traffic from the client namespace, for both backends (every case runs twice).

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use tests::netns::{CLIENT_V4, HOST_UPLINK_V4, HOST_UPLINK_V6};
use tests::traffic::{TcpServer, UdpServer, tcp_request, udp_request, udp_request_from};
use tests::{NetworkConfigList, Runtime, RuntimeConf, TestNetns, Topology, main_plugin};

const TIMEOUT: Duration = Duration::from_secs(3);
const NETWORK: &str = "pmtest";

struct Fixture {
    topo: Topology,
    runtime: Runtime,
    scratch: tempfile::TempDir,
    backend: &'static str,
}

impl Fixture {
    fn new(backend: &'static str) -> Fixture {
        let topo = Topology::new("pm").unwrap_or_else(|e| panic!("topology: {e:#}"));
        let runtime = Runtime::new(&topo.host).unwrap_or_else(|e| panic!("runtime: {e:#}"));
        let scratch = tempfile::tempdir().unwrap_or_else(|e| panic!("scratch: {e}"));
        Fixture {
            topo,
            runtime,
            scratch,
            backend,
        }
    }

    fn list(&self, subnets: &[&str], keys: Value) -> NetworkConfigList {
        let mut portmap = json!({
            "type": "portmap",
            "backend": self.backend,
            "capabilities": {"portMappings": true},
        });
        for (k, v) in keys.as_object().into_iter().flatten() {
            portmap[k] = v.clone();
        }
        NetworkConfigList::new(
            NETWORK,
            "1.0.0",
            vec![
                main_plugin::bridge("pmbr0", subnets, &self.scratch.path().join("ipam")),
                portmap,
            ],
        )
    }

    fn rt(&self, id: &str, ns: &TestNetns, mappings: Value) -> RuntimeConf {
        RuntimeConf::new(id, ns.path(), "eth0").with_capability("portMappings", mappings)
    }

    /// The container's first address of `v6`'s family.
    fn ip(result: &Value, v6: bool) -> IpAddr {
        result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| {
                i["address"]
                    .as_str()?
                    .split('/')
                    .next()?
                    .parse::<IpAddr>()
                    .ok()
            })
            .find(|a| a.is_ipv6() == v6)
            .unwrap_or_else(|| panic!("no address of that family in {result}"))
    }

    /// Elements left in our maps and sets, gate chains, and the attachment's iptables rules.
    fn leftovers(&self) -> Result<Vec<String>> {
        let mut left = Vec::new();
        for fam in ["ip", "ip6"] {
            let out = self
                .topo
                .host
                .exec("nft", &["list", "table", fam, "cni_portmap"])?;
            let text = String::from_utf8_lossy(&out.stdout);
            for line in text.lines() {
                if line.contains("comment \"") || line.contains("chain gate_") {
                    left.push(format!("{fam}: {}", line.trim()));
                }
            }
            let prog = if fam == "ip" {
                "iptables-save"
            } else {
                "ip6tables-save"
            };
            let out = self.topo.host.exec(prog, &["-t", "nat"])?;
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if line.contains("CNI-DN-") {
                    left.push(format!("{prog}: {line}"));
                }
            }
        }
        Ok(left)
    }
}

fn host(port: u16) -> SocketAddr {
    let ip: IpAddr = HOST_UPLINK_V4
        .parse()
        .unwrap_or_else(|e| panic!("{HOST_UPLINK_V4}: {e}"));
    SocketAddr::new(ip, port)
}

fn tcp(h: u16, c: u16) -> Value {
    json!({"hostPort": h, "containerPort": c, "protocol": "tcp"})
}

fn get(ns: &TestNetns, to: SocketAddr) -> Result<String> {
    Ok(String::from_utf8(tcp_request(ns, to, b"", TIMEOUT)?)?)
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod nftables {
            $( #[test] fn $name() { super::$name("nftables").unwrap(); } )*
        }
        mod iptables {
            $( #[test] fn $name() { super::$name("iptables").unwrap(); } )*
        }
    };
}

both_backends!(
    tcp_and_udp_reach_the_container_via_the_host_address_until_del,
    a_specific_host_ip_maps_only_that_address,
    two_containers_on_different_ports,
    ipv6_mapping_forwards_tcp,
    hairpin_and_localhost_reach_the_container,
    masq_all_hides_the_client_address,
    conditions_gate_the_mapping,
    a_conflicting_host_port_is_refused_and_changes_nothing,
    udp_flow_is_retargeted_after_del_and_readd,
    del_without_runtime_config_removes_the_mapping,
);

fn tcp_and_udp_reach_the_container_via_the_host_address_until_del(
    backend: &'static str,
) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt(
        "ctr1",
        &f.topo.container,
        json!([tcp(8080, 80), {"hostPort": 5353, "containerPort": 53, "protocol": "UDP"}]),
    );
    let before = f.leftovers()?;
    ensure!(before.is_empty(), "{before:?}");
    let result = f.runtime.add(&list, &rt)?;
    let ctr = Fixture::ip(&result, false);
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "tcp-hello")?;
    let _u = UdpServer::banner(&f.topo.container, SocketAddr::new(ctr, 53), "udp-hello")?;
    assert_eq!(get(&f.topo.client, host(8080))?, "tcp-hello");
    assert_eq!(
        udp_request(&f.topo.client, host(5353), b"x", TIMEOUT)?,
        b"udp-hello"
    );
    f.runtime.check(&list, &rt)?;
    ensure!(!f.leftovers()?.is_empty(), "ADD made nothing visible");
    f.runtime.del(&list, &rt)?;
    ensure!(
        get(&f.topo.client, host(8080)).is_err(),
        "still mapped after DEL"
    );
    let left = f.leftovers()?;
    ensure!(left.is_empty(), "left after DEL: {left:?}");
    // DEL is idempotent.
    f.runtime.del(&list, &rt)?;
    Ok(())
}

fn a_specific_host_ip_maps_only_that_address(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt("ctr1", &f.topo.container, json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": HOST_UPLINK_V4}]));
    let result = f.runtime.add(&list, &rt)?;
    let ctr = Fixture::ip(&result, false);
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "hello")?;
    assert_eq!(get(&f.topo.client, host(8080))?, "hello");
    // The bridge's gateway is a local address of the host too, but not the mapped one.
    let gw: SocketAddr = "10.97.0.1:8080".parse()?;
    ensure!(
        get(&f.topo.client, gw).is_err(),
        "other host address is mapped too"
    );
    f.runtime.check(&list, &rt)?;
    f.runtime.del(&list, &rt)?;
    Ok(())
}

fn two_containers_on_different_ports(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let second = TestNetns::new("pm-ctr2")?;
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt1 = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let rt2 = f.rt("ctr2", &second, json!([tcp(8081, 80)]));
    let ip1 = Fixture::ip(&f.runtime.add(&list, &rt1)?, false);
    let ip2 = Fixture::ip(&f.runtime.add(&list, &rt2)?, false);
    let _a = TcpServer::banner(&f.topo.container, SocketAddr::new(ip1, 80), "one")?;
    let _b = TcpServer::banner(&second, SocketAddr::new(ip2, 80), "two")?;
    assert_eq!(get(&f.topo.client, host(8080))?, "one");
    assert_eq!(get(&f.topo.client, host(8081))?, "two");
    f.runtime.del(&list, &rt1)?;
    ensure!(get(&f.topo.client, host(8080)).is_err());
    assert_eq!(get(&f.topo.client, host(8081))?, "two");
    f.runtime.check(&list, &rt2)?;
    f.runtime.del(&list, &rt2)?;
    ensure!(f.leftovers()?.is_empty());
    Ok(())
}

fn ipv6_mapping_forwards_tcp(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24", "fd97::/64"], json!({}));
    let rt = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let result = f.runtime.add(&list, &rt)?;
    let ctr6 = Fixture::ip(&result, true);
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr6, 80), "v6")?;
    let to = SocketAddr::new(HOST_UPLINK_V6.parse()?, 8080);
    assert_eq!(get(&f.topo.client, to)?, "v6");
    f.runtime.check(&list, &rt)?;
    f.runtime.del(&list, &rt)?;
    ensure!(get(&f.topo.client, to).is_err());
    ensure!(f.leftovers()?.is_empty());
    Ok(())
}

fn hairpin_and_localhost_reach_the_container(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let ctr = Fixture::ip(&f.runtime.add(&list, &rt)?, false);
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "me")?;
    assert_eq!(get(&f.topo.container, host(8080)).context("hairpin")?, "me");
    assert_eq!(
        get(&f.topo.host, "127.0.0.1:8080".parse()?).context("localhost")?,
        "me"
    );
    f.runtime.del(&list, &rt)?;
    Ok(())
}

fn masq_all_hides_the_client_address(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({"masqAll": true}));
    let rt = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let ctr = Fixture::ip(&f.runtime.add(&list, &rt)?, false);
    let server = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "hi")?;
    assert_eq!(get(&f.topo.client, host(8080))?, "hi");
    let peers = server.peers();
    ensure!(
        peers.iter().all(|p| p.ip().to_string() == "10.97.0.1"),
        "peers {peers:?} should be the bridge address"
    );
    f.runtime.del(&list, &rt)?;
    Ok(())
}

fn conditions_gate_the_mapping(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let cond = |src: &str| {
        if backend == "nftables" {
            json!([format!("ip saddr {src}")])
        } else {
            json!(["-s", src])
        }
    };
    let rt = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let allowed = f.list(&["10.97.0.0/24"], json!({"conditionsV4": cond(CLIENT_V4)}));
    let ctr = Fixture::ip(&f.runtime.add(&allowed, &rt)?, false);
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "ok")?;
    assert_eq!(get(&f.topo.client, host(8080))?, "ok");
    f.runtime.check(&allowed, &rt)?;
    f.runtime.del(&allowed, &rt)?;
    let denied = f.list(
        &["10.97.0.0/24"],
        json!({"conditionsV4": cond("10.55.0.0/16")}),
    );
    f.runtime.add(&denied, &rt)?;
    ensure!(
        get(&f.topo.client, host(8080)).is_err(),
        "condition did not gate"
    );
    f.runtime.del(&denied, &rt)?;
    ensure!(f.leftovers()?.is_empty());
    Ok(())
}

fn a_conflicting_host_port_is_refused_and_changes_nothing(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let second = TestNetns::new("pm-ctr2")?;
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt1 = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let result = f.runtime.add(&list, &rt1)?;
    let ctr = Fixture::ip(&result, false);
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "first")?;
    let snapshot = f.leftovers()?;
    // Re-ADD by the same owner (portmap alone, after the cached result) is idempotent.
    let conf = json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "portmap", "backend": backend,
        "runtimeConfig": {"portMappings": [tcp(8080, 80)]}, "prevResult": result});
    let netns = f.topo.container.path().to_string_lossy().into_owned();
    let out = f.runtime.exec_plugin(
        "portmap",
        Some("ADD"),
        &[
            ("CNI_CONTAINERID", "ctr1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", &netns),
        ],
        conf.to_string().as_bytes(),
    )?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    ensure!(f.leftovers()? == snapshot, "re-ADD changed the ruleset");
    let snapshot = f.leftovers()?;
    let rt2 = f.rt("ctr2", &second, json!([tcp(9000, 80), tcp(8080, 80)]));
    let Err(err) = f.runtime.add(&list, &rt2) else {
        anyhow::bail!("a conflicting ADD succeeded");
    };
    let msg = format!("{err:#}");
    ensure!(msg.contains("8080") && msg.contains("ctr1"), "{msg}");
    ensure!(
        f.leftovers()? == snapshot,
        "the failed ADD changed the ruleset"
    );
    assert_eq!(get(&f.topo.client, host(8080))?, "first");
    f.runtime.del(&list, &rt2)?;
    f.runtime.del(&list, &rt1)?;
    ensure!(f.leftovers()?.is_empty());
    Ok(())
}

fn udp_flow_is_retargeted_after_del_and_readd(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let second = TestNetns::new("pm-ctr2")?;
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let udp = json!([{"hostPort": 5353, "containerPort": 53, "protocol": "udp"}]);
    let rt1 = f.rt("ctr1", &f.topo.container, udp.clone());
    let ip1 = Fixture::ip(&f.runtime.add(&list, &rt1)?, false);
    let _a = UdpServer::banner(&f.topo.container, SocketAddr::new(ip1, 53), "one")?;
    let from: SocketAddr = format!("{CLIENT_V4}:40000").parse()?;
    assert_eq!(
        udp_request_from(&f.topo.client, from, host(5353), b"x", TIMEOUT)?,
        b"one"
    );
    f.runtime.del(&list, &rt1)?;
    let rt2 = f.rt("ctr2", &second, udp);
    let ip2 = Fixture::ip(&f.runtime.add(&list, &rt2)?, false);
    let _b = UdpServer::banner(&second, SocketAddr::new(ip2, 53), "two")?;
    assert_eq!(
        udp_request_from(&f.topo.client, from, host(5353), b"x", TIMEOUT)?,
        b"two"
    );
    f.runtime.del(&list, &rt2)?;
    Ok(())
}

fn del_without_runtime_config_removes_the_mapping(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let ctr = Fixture::ip(&f.runtime.add(&list, &rt)?, false);
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "x")?;
    assert_eq!(get(&f.topo.client, host(8080))?, "x");
    // What libcni GC synthesises: no runtimeConfig, no prevResult, no netns.
    let conf =
        json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "portmap", "backend": backend});
    let out = f.runtime.exec_plugin(
        "portmap",
        Some("DEL"),
        &[("CNI_CONTAINERID", "ctr1"), ("CNI_IFNAME", "eth0")],
        conf.to_string().as_bytes(),
    )?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    ensure!(get(&f.topo.client, host(8080)).is_err(), "still mapped");
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    f.runtime.del(&list, &rt)?;
    Ok(())
}
