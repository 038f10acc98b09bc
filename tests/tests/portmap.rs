//! `portmap` end to end: bridge + host-local + portmap chains run by the test runtime, with
//! real traffic from the client namespace, for both backends (every case runs twice).

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use tests::mounts::{bind, with_private_mounts};
use tests::netns::{CLIENT_V4, HOST_UPLINK_V4, HOST_UPLINK_V6};
use tests::traffic::{TcpServer, UdpServer, tcp_request, udp_request, udp_request_from};
use tests::{
    NetworkConfigList, PluginOutput, Runtime, RuntimeConf, TestNetns, Topology, main_plugin,
    nft_has_element,
};

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

    /// Our portmap alone, with `conf` completed by the network name and backend.
    fn exec(
        &self,
        command: &str,
        id: &str,
        env: &[(&str, &str)],
        conf: Value,
    ) -> Result<PluginOutput> {
        let mut conf = conf;
        conf["name"] = json!(NETWORK);
        conf["type"] = json!("portmap");
        conf["backend"] = json!(self.backend);
        let mut vars = vec![("CNI_CONTAINERID", id), ("CNI_IFNAME", "eth0")];
        vars.extend_from_slice(env);
        self.runtime
            .exec_plugin("portmap", Some(command), &vars, conf.to_string().as_bytes())
    }

    /// Our portmap alone on network `network` (not the fixture's), as container `id`
    /// mapping `mappings` to `ip`.
    fn exec_on(
        &self,
        command: &str,
        network: &str,
        id: &str,
        ip: &str,
        mappings: Value,
    ) -> Result<PluginOutput> {
        let netns = self.topo.container.path().to_path_buf();
        self.exec_in(command, network, id, &netns, ip, mappings)
    }

    /// [`Fixture::exec_on`] with `netns` as `CNI_NETNS`.
    fn exec_in(
        &self,
        command: &str,
        network: &str,
        id: &str,
        netns: &std::path::Path,
        ip: &str,
        mappings: Value,
    ) -> Result<PluginOutput> {
        let netns = netns.to_string_lossy().into_owned();
        let conf = json!({"cniVersion": "1.0.0", "name": network, "type": "portmap",
            "backend": self.backend,
            "runtimeConfig": {"portMappings": mappings},
            "prevResult": prev_result(self, &[ip])});
        self.runtime.exec_plugin(
            "portmap",
            Some(command),
            &[
                ("CNI_CONTAINERID", id),
                ("CNI_IFNAME", "eth0"),
                ("CNI_NETNS", &netns),
            ],
            conf.to_string().as_bytes(),
        )
    }

    /// The plugin's state directory for the host namespace.
    fn state_dir(&self) -> Result<std::path::PathBuf> {
        use std::os::unix::fs::MetadataExt as _;
        let ino = std::fs::metadata(self.topo.host.path())?.ino();
        Ok(std::path::PathBuf::from(format!(
            "/run/cni/portmap/net-{ino}"
        )))
    }

    /// Elements left in our maps and sets, gate chains, the attachment's iptables rules, and
    /// the state directory of the host namespace (DEL removes it once it is empty).
    fn leftovers(&self) -> Result<Vec<String>> {
        let mut left = Vec::new();
        let dir = self.state_dir()?;
        if dir.exists() {
            left.push(format!("state directory {}", dir.display()));
        }
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

impl Drop for Fixture {
    /// A failed test may leave state behind; the namespace it describes goes away now.
    fn drop(&mut self) {
        if let Ok(dir) = self.state_dir() {
            let _ = std::fs::remove_dir_all(dir);
        }
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
    an_ipv4_mapped_host_ip_maps_the_ipv4_address,
    two_containers_on_different_ports,
    ipv6_mapping_forwards_tcp,
    hairpin_and_localhost_reach_the_container,
    masq_all_hides_the_client_address,
    conditions_gate_the_mapping,
    a_conflicting_host_port_is_refused_and_changes_nothing,
    a_vanished_owner_gives_its_host_port_up_and_a_live_one_keeps_it,
    udp_flow_is_retargeted_after_del_and_readd,
    del_without_runtime_config_removes_the_mapping,
    del_without_its_record_removes_the_attachment_at_its_keys,
    del_never_fails_on_config_it_does_not_need,
    del_leaves_no_process_behind,
    a_state_file_that_does_not_parse_counts_as_absent,
    gc_removes_attachments_that_are_not_valid_and_keeps_the_others,
    ten_thousand_mappings_are_added_checked_and_deleted,
    a_failed_route_localnet_rolls_back_the_mappings,
    a_container_the_host_has_no_route_to_is_mapped_without_route_localnet,
    status_reports_a_usable_backend,
    attachments_whose_old_state_names_met_keep_their_own_mappings,
    an_owner_whose_netns_path_vanished_keeps_its_port_while_its_netns_lives,
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

fn an_ipv4_mapped_host_ip_maps_the_ipv4_address(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let mapped = format!("::ffff:{HOST_UPLINK_V4}");
    let rt = f.rt(
        "ctr1",
        &f.topo.container,
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": mapped}]),
    );
    let result = f.runtime.add(&list, &rt)?;
    let ctr = Fixture::ip(&result, false);
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "mapped")?;
    assert_eq!(get(&f.topo.client, host(8080))?, "mapped");
    f.runtime.check(&list, &rt)?;
    f.runtime.del(&list, &rt)?;
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
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

/// A maps 8080 and 8081; while A's namespace lives, B's ADD of 8080 is refused naming A.
/// Once A's namespace is deleted without a DEL (the runtime lost it), B's ADD takes 8080
/// over: traffic to the host port reaches B, nothing of A is left (8081 neither), and B's DEL
/// leaves nothing at all.
fn a_vanished_owner_gives_its_host_port_up_and_a_live_one_keeps_it(
    backend: &'static str,
) -> Result<()> {
    let f = Fixture::new(backend);
    let mut a = TestNetns::new("pm-ctra")?;
    let b = TestNetns::new("pm-ctrb")?;
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt_a = f.rt("ctra", &a, json!([tcp(8080, 80), tcp(8081, 81)]));
    let rt_b = f.rt("ctrb", &b, json!([tcp(8080, 80)]));
    let ip_a = Fixture::ip(&f.runtime.add(&list, &rt_a)?, false);
    {
        let _a80 = TcpServer::banner(&a, SocketAddr::new(ip_a, 80), "A")?;
        let _a81 = TcpServer::banner(&a, SocketAddr::new(ip_a, 81), "A81")?;
        assert_eq!(get(&f.topo.client, host(8080))?, "A");
        assert_eq!(get(&f.topo.client, host(8081))?, "A81");
        let Err(err) = f.runtime.add(&list, &rt_b) else {
            anyhow::bail!("B took the port of a live A");
        };
        let msg = format!("{err:#}");
        ensure!(msg.contains("tcp/8080") && msg.contains("ctra"), "{msg}");
        assert_eq!(get(&f.topo.client, host(8080))?, "A");
        f.runtime.del(&list, &rt_b)?;
    }
    // A's namespace goes away without a DEL. The kernel lets go of it a moment after the
    // unmount (the last references drop in deferred work): B's ADD is refused, as a live
    // owner's port must be, until then, and retried as a runtime retries.
    a.delete()?;
    let mut added = f.runtime.add(&list, &rt_b);
    for _ in 0..100 {
        if added.is_ok() {
            break;
        }
        f.runtime.del(&list, &rt_b)?;
        std::thread::sleep(Duration::from_millis(50));
        added = f.runtime.add(&list, &rt_b);
    }
    let ip_b = Fixture::ip(&added?, false);
    let _b80 = TcpServer::banner(&b, SocketAddr::new(ip_b, 80), "B")?;
    assert_eq!(get(&f.topo.client, host(8080))?, "B");
    ensure!(
        get(&f.topo.client, host(8081)).is_err(),
        "A's other mapping is left"
    );
    let left = f.leftovers()?;
    ensure!(
        left.iter()
            .all(|l| !l.contains("ctra") && !l.contains(&ip_a.to_string())),
        "A's objects left after the takeover: {left:?}"
    );
    f.runtime.check(&list, &rt_b)?;
    f.runtime.del(&list, &rt_b)?;
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
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

/// DEL of an attachment whose record is gone (but whose config names its mappings) removes
/// all of its objects, its masquerade elements included (with `masqAll` here), and nothing of
/// another attachment's: the nftables backend looks its keys up, without listing the maps.
fn del_without_its_record_removes_the_attachment_at_its_keys(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let second = TestNetns::new("pm-ctr2")?;
    let list = f.list(&["10.97.0.0/24"], json!({"masqAll": true}));
    let rt1 = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let rt2 = f.rt("ctr2", &second, json!([tcp(9090, 80)]));
    f.runtime.add(&list, &rt1)?;
    let ip2 = Fixture::ip(&f.runtime.add(&list, &rt2)?, false);
    let _t = TcpServer::banner(&second, SocketAddr::new(ip2, 80), "second")?;
    std::fs::remove_file(f.state_dir()?.join(format!("{NETWORK}:ctr1:eth0.json")))?;
    let conf = json!({"cniVersion": "1.0.0", "masqAll": true,
        "runtimeConfig": {"portMappings": [tcp(8080, 80)]}});
    succeeded(f.exec("DEL", "ctr1", &[], conf)?, "DEL")?;
    let left = f.leftovers()?;
    ensure!(
        left.iter().all(|l| !l.contains("ctr1")),
        "ctr1's objects left: {left:?}"
    );
    ensure!(
        left.iter().any(|l| l.contains("ctr2")),
        "ctr2's objects went too: {left:?}"
    );
    assert_eq!(get(&f.topo.client, host(9090))?, "second");
    f.runtime.del(&list, &rt2)?;
    f.runtime.del(&list, &rt1)?;
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

/// Fails, with what the plugin printed, unless `out` is a success.
fn succeeded(out: PluginOutput, what: &str) -> Result<()> {
    ensure!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

/// DEL returns when its work is done and leaves no process of ours behind (no detached
/// holder of its nf_tables socket): a runtime that is a subreaper collects nothing.
fn del_leaves_no_process_behind(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt(
        "ctr1",
        &f.topo.container,
        json!([tcp(8080, 80), tcp(8081, 81)]),
    );
    f.runtime.add(&list, &rt)?;
    ensure!(!f.leftovers()?.is_empty(), "ADD mapped nothing");
    let conf = json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "portmap",
        "backend": backend, "runtimeConfig": {"portMappings": [tcp(8080, 80), tcp(8081, 81)]}});
    let plugin = f.runtime.find_plugin("portmap")?;
    let (ok, left) = tests::process::run_under_subreaper(
        std::path::Path::new(env!("CARGO_BIN_EXE_subreaper")),
        f.runtime.host(),
        &plugin,
        &[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "ctr1"),
            ("CNI_IFNAME", "eth0"),
        ],
        conf.to_string().as_bytes(),
    )?;
    ensure!(ok, "DEL failed");
    ensure!(left.is_empty(), "processes left by DEL: {left}");
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    f.runtime.del(&list, &rt)?;
    Ok(())
}

/// A container made before an upgrade, or whose config changed since, must still be
/// deletable: DEL reads only what it needs (the Go DEL validates everything).
fn del_never_fails_on_config_it_does_not_need(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let bad_mapping = |m: Value| json!({"runtimeConfig": {"portMappings": [m]}});
    for bad in [
        json!({"backend": "bogus"}),
        json!({"markMasqBit": 99, "externalSetMarkChain": "X"}),
        bad_mapping(
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "fe80::1%eth0"}),
        ),
        bad_mapping(json!({"hostPort": 70000, "containerPort": 80, "protocol": "tcp"})),
        bad_mapping(json!({"hostPort": 8080, "containerPort": 80, "protocol": "icmp"})),
    ] {
        f.runtime.add(&list, &rt)?;
        ensure!(!f.leftovers()?.is_empty(), "ADD mapped nothing");
        let mut conf = json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "portmap",
            "backend": backend, "runtimeConfig": {"portMappings": [tcp(8080, 80)]}});
        for (k, v) in bad.as_object().into_iter().flatten() {
            conf[k] = v.clone();
        }
        exec_raw(&f, "DEL", &[], &conf).with_context(|| format!("DEL with {bad}"))?;
        ensure!(
            f.leftovers()?.is_empty(),
            "left after DEL with {bad}: {:?}",
            f.leftovers()?
        );
        f.runtime.del(&list, &rt)?;
    }
    Ok(())
}

/// An empty or garbled state file (a crash, `/run` not a tmpfs) is treated as absent: DEL
/// finds the objects from the kernel, a re-ADD and its CHECK work, GC removes the file.
fn a_state_file_that_does_not_parse_counts_as_absent(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let record = f.state_dir()?.join(format!("{NETWORK}:ctr1:eth0.json"));
    let netns = f.topo.container.path().to_string_lossy().into_owned();
    let result = f.runtime.add(&list, &rt)?;
    let ctr = Fixture::ip(&result, false);
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "ok")?;
    let ok = |out: PluginOutput, what: &str| {
        ensure!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        Ok(())
    };
    // DEL as libcni's GC sends it (no runtimeConfig): only the kernel can tell what to remove.
    ensure!(record.exists(), "no {}", record.display());
    std::fs::write(&record, "")?;
    ok(
        f.exec("DEL", "ctr1", &[], json!({"cniVersion": "1.0.0"}))?,
        "DEL",
    )?;
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    ensure!(get(&f.topo.client, host(8080)).is_err(), "still mapped");
    // A re-ADD over a garbled record, then its CHECK.
    let conf = json!({"cniVersion": "1.0.0",
        "runtimeConfig": {"portMappings": [tcp(8080, 80)]}, "prevResult": result});
    ok(
        f.exec("ADD", "ctr1", &[("CNI_NETNS", &netns)], conf.clone())?,
        "ADD",
    )?;
    std::fs::write(&record, "{\"backend\": \"nftab")?;
    ok(
        f.exec("ADD", "ctr1", &[("CNI_NETNS", &netns)], conf.clone())?,
        "re-ADD",
    )?;
    ok(
        f.exec("CHECK", "ctr1", &[("CNI_NETNS", &netns)], conf)?,
        "CHECK",
    )?;
    assert_eq!(get(&f.topo.client, host(8080))?, "ok");
    // GC of an attachment whose record is garbage.
    std::fs::write(&record, "garbage")?;
    let gc = json!({"cniVersion": "1.1.0", "cni.dev/valid-attachments": []});
    ok(f.exec("GC", "", &[], gc)?, "GC")?;
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    f.runtime.del(&list, &rt)?;
    Ok(())
}

fn gc_removes_attachments_that_are_not_valid_and_keeps_the_others(
    backend: &'static str,
) -> Result<()> {
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
    // GC speaks CNI 1.1.0, which the Go main plugins do not: call ours directly.
    let gc = json!({"cniVersion": "1.1.0",
        "cni.dev/valid-attachments": [{"containerID": "ctr2", "ifname": "eth0"}]});
    let out = f.exec("GC", "", &[], gc)?;
    ensure!(out.status.success(), "GC: {out:?}");
    ensure!(
        get(&f.topo.client, host(8080)).is_err(),
        "ctr1 is not valid but still mapped"
    );
    assert_eq!(get(&f.topo.client, host(8081))?, "two");
    f.runtime
        .check(&list, &rt2)
        .context("CHECK of the kept attachment")?;
    let left = f.leftovers()?;
    ensure!(
        left.iter().all(|l| !l.contains("ctr1")),
        "ctr1 left after GC: {left:?}"
    );
    f.runtime.del(&list, &rt1)?;
    f.runtime.del(&list, &rt2)?;
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

/// `mappings` TCP mappings, host ports 20000 onwards to the same container ports, as podman
/// sends a port range (`-p 20000-29999:20000-29999`): one mapping per port.
fn port_range(mappings: u16) -> Value {
    Value::Array(
        (0..mappings)
            .map(
                |i| json!({"hostPort": 20_000 + i, "containerPort": 20_000 + i, "protocol": "tcp"}),
            )
            .collect(),
    )
}

/// Issue 22 #4: 10 000 mappings (podman expands a port range into single mappings) are added
/// in one transaction (nftables: 10 000 elements; iptables: 30 000 rules and 667 entry rules),
/// carry traffic at both ends of the range, pass CHECK, and DEL leaves nothing.
fn ten_thousand_mappings_are_added_checked_and_deleted(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt("ctr1", &f.topo.container, port_range(10_000));
    let ip = Fixture::ip(&f.runtime.add(&list, &rt)?, false);
    let _first = TcpServer::banner(&f.topo.container, SocketAddr::new(ip, 20_000), "first")?;
    let _last = TcpServer::banner(&f.topo.container, SocketAddr::new(ip, 29_999), "last")?;
    assert_eq!(get(&f.topo.client, host(20_000))?, "first");
    assert_eq!(get(&f.topo.client, host(29_999))?, "last");
    f.runtime.check(&list, &rt)?;
    f.runtime.del(&list, &rt)?;
    ensure!(
        get(&f.topo.client, host(20_000)).is_err(),
        "still mapped after DEL"
    );
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

fn a_failed_route_localnet_rolls_back_the_mappings(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt(
        "ctr1",
        &f.topo.container,
        json!([tcp(8080, 80), tcp(8081, 81)]),
    );
    // A read-only /proc/sys (as in some containerised runtimes): the sysctl write fails after
    // the mappings are committed.
    let err = with_private_mounts(
        || {
            let sys = std::path::Path::new("/proc/sys");
            bind(sys, sys, true)
        },
        || Ok(f.runtime.add(&list, &rt)),
    )?
    .err()
    .context("ADD succeeded with a read-only /proc/sys")?;
    let msg = format!("{err:#}");
    ensure!(msg.contains("route_localnet"), "{msg}");
    let left = f.leftovers()?;
    ensure!(left.is_empty(), "left after the failed ADD: {left:?}");
    ensure!(get(&f.topo.client, host(8080)).is_err(), "still mapped");
    f.runtime.del(&list, &rt)?;
    Ok(())
}

fn a_container_the_host_has_no_route_to_is_mapped_without_route_localnet(
    backend: &'static str,
) -> Result<()> {
    let f = Fixture::new(backend);
    // The host namespace routes only its uplink's subnet: nothing to 10.123.0.2.
    ensure!(
        f.topo.host.ip(&["route", "get", "10.123.0.2"]).is_err(),
        "the host has a route to 10.123.0.2"
    );
    let before = f
        .topo
        .host
        .exec_ok("sysctl", &["-a", "--pattern", "route_localnet"])?;
    let netns = f.topo.container.path().to_string_lossy().into_owned();
    let conf = json!({"cniVersion": "1.0.0",
        "runtimeConfig": {"portMappings": [tcp(8080, 80)]},
        "prevResult": prev_result(&f, &["10.123.0.2/24"])});
    for verb in ["ADD", "CHECK"] {
        let out = f.exec(verb, "ctr1", &[("CNI_NETNS", &netns)], conf.clone())?;
        ensure!(
            out.status.success(),
            "{verb}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    ensure!(!f.leftovers()?.is_empty(), "ADD mapped nothing");
    let after = f
        .topo
        .host
        .exec_ok("sysctl", &["-a", "--pattern", "route_localnet"])?;
    ensure!(
        before == after,
        "route_localnet changed:\n{before}\n{after}"
    );
    let out = f.exec("DEL", "ctr1", &[], conf)?;
    ensure!(out.status.success(), "DEL: {out:?}");
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

fn status_reports_a_usable_backend(backend: &'static str) -> Result<()> {
    let f = Fixture::new(backend);
    let out = f.exec("STATUS", "", &[], json!({"cniVersion": "1.1.0"}))?;
    ensure!(
        out.status.success() && out.stdout.is_empty(),
        "STATUS: {out:?}"
    );
    if backend == "iptables" {
        // No iptables tools on the node: the backend is unusable.
        let out = f.exec(
            "STATUS",
            "",
            &[("PATH", "/nonexistent")],
            json!({"cniVersion": "1.1.0"}),
        )?;
        let err = out
            .error()
            .context("STATUS without iptables printed no error")?;
        ensure!(err.code == 50, "{err:?}");
    }
    Ok(())
}

/// Fails unless `out` is a success.
fn ok(out: &PluginOutput, what: &str) -> Result<()> {
    ensure!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Issue 26 item 1: network `pmtest_x` with container `c` and network `pmtest` with container
/// `x_c` shared one state file (`pmtest_x_c_eth0.json`): the second ADD took the first's
/// record for its own old one and removed the first's mappings, and a DEL of either removed
/// the other's record. Each keeps its own now: CHECK of each passes after both ADDs and after
/// the other's DEL.
fn attachments_whose_old_state_names_met_keep_their_own_mappings(
    backend: &'static str,
) -> Result<()> {
    let f = Fixture::new(backend);
    let one = ("pmtest_x", "c", "10.97.0.2/24", json!([tcp(8080, 80)]));
    let two = ("pmtest", "x_c", "10.97.0.3/24", json!([tcp(9090, 80)]));
    for (net, id, ip, maps) in [&one, &two] {
        ok(&f.exec_on("ADD", net, id, ip, maps.clone())?, "ADD")?;
    }
    for (net, id, ip, maps) in [&one, &two] {
        ok(
            &f.exec_on("CHECK", net, id, ip, maps.clone())?,
            &format!("CHECK of {net}/{id}"),
        )?;
    }
    let (net, id, ip, maps) = &two;
    ok(&f.exec_on("DEL", net, id, ip, json!([]))?, "DEL")?;
    ensure!(
        f.exec_on("CHECK", net, id, ip, maps.clone())?
            .error()
            .is_some(),
        "{net}/{id} is left after its DEL"
    );
    let (net, id, ip, maps) = &one;
    ok(
        &f.exec_on("CHECK", net, id, ip, maps.clone())?,
        "CHECK after the other's DEL",
    )?;
    ok(&f.exec_on("DEL", net, id, ip, json!([]))?, "DEL")?;
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

/// Issue 26 item 3: a takeover rests on proof that the owner's namespace is gone, never on
/// its path. c1's `CNI_NETNS` is `/proc/<pid>/ns/net` of a process in namespace A, which
/// exits while A lives on; c3's is B's bind mount, unmounted while a process keeps B. Both
/// keep their ports (their paths were taken for their namespaces: both were taken over).
/// Once B is gone for good, c4 takes c3's port over.
fn an_owner_whose_netns_path_vanished_keeps_its_port_while_its_netns_lives(
    backend: &'static str,
) -> Result<()> {
    let f = Fixture::new(backend);
    let a = TestNetns::new("pm-live-a")?;
    let mut b = TestNetns::new("pm-live-b")?;
    let sleep = || {
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("1000");
        cmd
    };
    let mut in_a = a.spawn(&mut sleep())?;
    let proc_path = std::path::PathBuf::from(format!("/proc/{}/ns/net", in_a.id()));
    let (c1, c3) = (json!([tcp(8080, 80)]), json!([tcp(9090, 80)]));
    ok(
        &f.exec_in("ADD", NETWORK, "c1", &proc_path, "10.97.0.2/24", c1.clone())?,
        "ADD of c1",
    )?;
    in_a.kill()?;
    in_a.wait()?;
    ensure!(!proc_path.exists());
    let refused = |out: PluginOutput, holder: &str| -> Result<()> {
        let err = out.error().context("an ADD took a live owner's port")?;
        ensure!(format!("{err:?}").contains(holder), "{err:?}");
        Ok(())
    };
    refused(
        f.exec_on("ADD", NETWORK, "c2", "10.97.0.3/24", c1.clone())?,
        "c1",
    )?;
    let mut in_b = b.spawn(&mut sleep())?;
    ok(
        &f.exec_in("ADD", NETWORK, "c3", b.path(), "10.97.0.4/24", c3.clone())?,
        "ADD of c3",
    )?;
    b.delete()?;
    ensure!(!b.path().exists());
    refused(
        f.exec_on("ADD", NETWORK, "c4", "10.97.0.5/24", c3.clone())?,
        "c3",
    )?;
    ok(
        &f.exec_on("CHECK", NETWORK, "c3", "10.97.0.4/24", c3.clone())?,
        "c3 kept",
    )?;
    // B goes: its last process exits, and the kernel destroys it (a worker does, a moment
    // later: the ADD is retried until it has).
    in_b.kill()?;
    in_b.wait()?;
    let mut taken = false;
    for _ in 0..100 {
        if f.exec_on("ADD", NETWORK, "c4", "10.97.0.5/24", c3.clone())?
            .status
            .success()
        {
            taken = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ensure!(
        taken,
        "c4 never took the port of c3, whose namespace is gone"
    );
    ok(
        &f.exec_on("CHECK", NETWORK, "c4", "10.97.0.5/24", c3.clone())?,
        "c4",
    )?;
    for (id, ip) in [
        ("c4", "10.97.0.5/24"),
        ("c3", "10.97.0.4/24"),
        ("c2", "10.97.0.3/24"),
        ("c1", "10.97.0.2/24"),
    ] {
        ok(&f.exec_on("DEL", NETWORK, id, ip, json!([]))?, "DEL")?;
    }
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

/// Issue 26 item 2: c1 holds 8080 in the iptables layout; an operator's `iptables -t nat -F;
/// -X` removes its chain; c2's ADD of 8080 rightly succeeds, and from then on c2 holds the
/// port: c3's ADD of it is refused naming c2 (it succeeded, with a dead port, while the index
/// still named c1).
#[test]
fn the_port_index_names_the_holder_that_took_a_port_after_a_flush() -> Result<()> {
    let f = Fixture::new("iptables");
    let add = |id: &str, ip: &str| f.exec_on("ADD", NETWORK, id, ip, json!([tcp(8080, 80)]));
    ok(&add("c1", "10.97.0.2/24")?, "ADD of c1")?;
    for args in [["-t", "nat", "-F"], ["-t", "nat", "-X"]] {
        f.topo.host.exec_ok("iptables", &args)?;
    }
    ok(&add("c2", "10.97.0.3/24")?, "ADD of c2 after the flush")?;
    let out = add("c3", "10.97.0.4/24")?;
    let err = out
        .error()
        .context("c3's ADD of the port c2 holds succeeded")?;
    ensure!(
        err.msg.contains("8080") && format!("{err:?}").contains("c2"),
        "{err:?}"
    );
    for (id, ip) in [
        ("c3", "10.97.0.4/24"),
        ("c2", "10.97.0.3/24"),
        ("c1", "10.97.0.2/24"),
    ] {
        ok(&f.exec_on("DEL", NETWORK, id, ip, json!([]))?, "DEL")?;
    }
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

/// Issue 26 item 7: a FIFO planted at a host port's index entry and at a record hangs no
/// call (they were opened without `O_NONBLOCK`, our iptables lock held): ADD treats them as
/// absent, maps the port and indexes it, so the next ADD of the port is refused.
#[test]
fn a_fifo_planted_in_the_state_directory_hangs_no_add() -> Result<()> {
    let f = Fixture::new("iptables");
    let dir = f.state_dir()?;
    std::fs::create_dir_all(&dir)?;
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
    // The index entry, and the record under its name and under the one earlier versions gave it.
    for name in [
        ".port-v4-tcp-8080",
        "pmtest:c1:eth0.json",
        "pmtest_c1_eth0.json",
    ] {
        nix::unistd::mkfifo(&dir.join(name), mode)?;
    }
    let add = |id: &str, ip: &str| f.exec_on("ADD", NETWORK, id, ip, json!([tcp(8080, 80)]));
    ok(&add("c1", "10.97.0.2/24")?, "ADD with FIFOs planted")?;
    ensure!(
        add("c2", "10.97.0.3/24")?.error().is_some(),
        "the port of c1 was not indexed"
    );
    for (id, ip) in [("c2", "10.97.0.3/24"), ("c1", "10.97.0.2/24")] {
        ok(&f.exec_on("DEL", NETWORK, id, ip, json!([]))?, "DEL")?;
    }
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

/// A prevResult for our portmap alone: `ip` on eth0 in the container namespace.
fn prev_result(f: &Fixture, ips: &[&str]) -> Value {
    let ips: Vec<Value> = ips
        .iter()
        .map(|a| json!({"interface": 0, "address": a}))
        .collect();
    json!({"cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": f.topo.container.path()}],
        "ips": ips})
}

#[test]
fn lock_contention_gives_code_11_and_changes_nothing() -> Result<()> {
    let f = Fixture::new("iptables");
    // Our own /run/cni/portmap, so holding its lock stalls no other test.
    let run_dir = tempfile::tempdir()?;
    let netns = f.topo.container.path().to_string_lossy().into_owned();
    let conf = json!({"cniVersion": "1.0.0",
        "runtimeConfig": {"portMappings": [tcp(8080, 80)]},
        "prevResult": prev_result(&f, &["10.97.0.2/24"])});
    let out = with_private_mounts(
        || {
            bind(
                run_dir.path(),
                std::path::Path::new("/run/cni/portmap"),
                false,
            )
        },
        || {
            let _held = host::lock::FileLock::acquire(
                run_dir.path().join("iptables.lock"),
                Duration::from_secs(1),
            )?;
            f.exec("ADD", "ctr1", &[("CNI_NETNS", &netns)], conf.clone())
        },
    )?;
    let err = out
        .error()
        .context("ADD under a held lock printed no error")?;
    ensure!(err.code == 11, "{err:?}");
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    let left: Vec<_> = std::fs::read_dir(run_dir.path())?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| n != "iptables.lock")
        .collect();
    ensure!(left.is_empty(), "state left by the failed ADD: {left:?}");
    Ok(())
}

#[test]
fn a_failing_second_family_rolls_back_the_first() -> Result<()> {
    let f = Fixture::new("iptables");
    // PATH with the real tools except an ip6tables-restore that always fails. It reads its
    // script first (by absolute path: PATH has nothing else), as the real one does, so the
    // plugin's write never meets a closed pipe.
    let bin = tempfile::tempdir()?;
    for tool in ["iptables-save", "iptables-restore", "ip6tables-save"] {
        let real = which(tool)?;
        std::os::unix::fs::symlink(real, bin.path().join(tool))?;
    }
    let fake = bin.path().join("ip6tables-restore");
    std::fs::write(
        &fake,
        "#!/bin/sh\n/bin/cat >/dev/null\necho 'injected failure' >&2\nexit 1\n",
    )?;
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let path = bin.path().to_string_lossy().into_owned();
    let netns = f.topo.container.path().to_string_lossy().into_owned();
    let conf = json!({"cniVersion": "1.0.0",
        "runtimeConfig": {"portMappings": [tcp(8080, 80)]},
        "prevResult": prev_result(&f, &["10.97.0.2/24", "fd97::2/64"])});
    let out = f.exec(
        "ADD",
        "ctr1",
        &[("CNI_NETNS", &netns), ("PATH", &path)],
        conf,
    )?;
    let err = out
        .error()
        .context("ADD with a failing ip6tables printed no error")?;
    ensure!(err.msg.contains("injected failure"), "{err:?}");
    let left = f.leftovers()?;
    ensure!(
        left.is_empty(),
        "the IPv4 rules were not rolled back: {left:?}"
    );
    Ok(())
}

fn which(tool: &str) -> Result<std::path::PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin"]
        .iter()
        .map(|d| std::path::Path::new(d).join(tool))
        .find(|p| p.exists())
        .with_context(|| format!("{tool} not found"))
}

#[test]
fn del_removes_the_go_nftables_rules_of_the_attachment_only() -> Result<()> {
    let f = Fixture::new("nftables");
    let list = f.list(&["10.97.0.0/24"], json!({}));
    // Only bridge acts: ours has no mappings to program.
    let rt = f.rt("ctrgo", &f.topo.container, json!([]));
    let ctr = Fixture::ip(&f.runtime.add(&list, &rt)?, false);
    // The Go nftables backend's objects (reference-behaviour.md §2.1) for this container and
    // for another one.
    let script = format!(
        r#"add table ip cni_hostport {{ comment "CNI portmap plugin" ; }}
add chain ip cni_hostport hostports
add chain ip cni_hostport hostip_hostports
add chain ip cni_hostport hostports_all
add rule ip cni_hostport hostports_all jump hostip_hostports
add rule ip cni_hostport hostports_all jump hostports
add chain ip cni_hostport prerouting {{ type nat hook prerouting priority -100 ; }}
add rule ip cni_hostport prerouting fib daddr type local jump hostports_all
add chain ip cni_hostport output {{ type nat hook output priority -100 ; }}
add rule ip cni_hostport output fib daddr type local jump hostports_all
add chain ip cni_hostport masquerading {{ type nat hook postrouting priority 100 ; }}
add rule ip cni_hostport hostports tcp dport 8080 dnat to {ctr}:80 comment "ctrgo"
add rule ip cni_hostport hostports tcp dport 9090 dnat to 10.97.0.200:80 comment "other"
add rule ip cni_hostport masquerading ip saddr {ctr} ip daddr {ctr} masquerade comment "ctrgo"
add rule ip cni_hostport masquerading ip saddr 127.0.0.1 ip daddr {ctr} masquerade comment "ctrgo"
add rule ip cni_hostport masquerading ip saddr 10.97.0.200 ip daddr 10.97.0.200 masquerade comment "other"
add table ip6 cni_hostport {{ comment "CNI portmap plugin" ; }}
add chain ip6 cni_hostport hostports
add chain ip6 cni_hostport masquerading {{ type nat hook postrouting priority 100 ; }}
add rule ip6 cni_hostport hostports tcp dport 8080 dnat to [fd97::2]:80 comment "ctrgo"
add rule ip6 cni_hostport hostports tcp dport 9090 dnat to [fd97::200]:80 comment "other"
"#
    );
    let file = f.scratch.path().join("go.nft");
    std::fs::write(&file, script)?;
    f.topo
        .host
        .exec_ok("nft", &["-f", &file.to_string_lossy()])?;
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "go")?;
    assert_eq!(
        get(&f.topo.client, host(8080))?,
        "go",
        "the Go layout is live"
    );
    f.runtime.del(&list, &rt)?;
    ensure!(get(&f.topo.client, host(8080)).is_err(), "still mapped");
    for fam in ["ip", "ip6"] {
        let text = f
            .topo
            .host
            .exec_ok("nft", &["list", "table", fam, "cni_hostport"])?;
        ensure!(
            !text.contains("\"ctrgo\""),
            "{fam}: ctrgo's rules left:\n{text}"
        );
        ensure!(
            text.contains("\"other\""),
            "{fam}: other's rules removed:\n{text}"
        );
    }
    let text = f
        .topo
        .host
        .exec_ok("nft", &["list", "table", "ip", "cni_hostport"])?;
    ensure!(
        text.contains("jump hostports_all") && text.contains("chain masquerading"),
        "the Go skeleton was touched:\n{text}"
    );
    Ok(())
}

/// Which layouts hold something of the attachment: (iptables `CNI-DN-` rules, our nftables
/// elements).
fn layouts(f: &Fixture) -> Result<(bool, bool)> {
    let left = f.leftovers()?;
    let ipt = left.iter().any(|l| l.contains("tables-save: "));
    let nft = left
        .iter()
        .any(|l| l.starts_with("ip: ") || l.starts_with("ip6: "));
    Ok((ipt, nft))
}

/// Our portmap alone with `conf` as given (no backend key added).
fn exec_raw(f: &Fixture, command: &str, env: &[(&str, &str)], conf: &Value) -> Result<()> {
    let mut vars = vec![("CNI_CONTAINERID", "ctr1"), ("CNI_IFNAME", "eth0")];
    vars.extend_from_slice(env);
    let out =
        f.runtime
            .exec_plugin("portmap", Some(command), &vars, conf.to_string().as_bytes())?;
    ensure!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

#[test]
fn auto_backend_is_iptables_where_its_tools_work_and_nftables_otherwise() -> Result<()> {
    let f = Fixture::new("");
    let netns = f.topo.container.path().to_string_lossy().into_owned();
    for backend in [None, Some(Value::Null), Some(json!(""))] {
        let mut conf = json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "portmap",
            "runtimeConfig": {"portMappings": [tcp(8080, 80)]},
            "prevResult": prev_result(&f, &["10.97.0.2/24"])});
        if let Some(b) = &backend {
            conf["backend"] = b.clone();
        }
        // As the reference decides: the iptables tools work here.
        exec_raw(&f, "ADD", &[("CNI_NETNS", &netns)], &conf)?;
        ensure!(
            layouts(&f)? == (true, false),
            "backend {backend:?}: {:?}",
            f.leftovers()?
        );
        exec_raw(&f, "CHECK", &[("CNI_NETNS", &netns)], &conf)?;
        exec_raw(&f, "DEL", &[], &conf)?;
        ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
        // Without the tools on PATH: nftables.
        let no_tools = [("CNI_NETNS", netns.as_str()), ("PATH", "/nonexistent")];
        exec_raw(&f, "ADD", &no_tools, &conf)?;
        ensure!(
            layouts(&f)? == (false, true),
            "backend {backend:?} without iptables: {:?}",
            f.leftovers()?
        );
        exec_raw(&f, "CHECK", &no_tools, &conf)?;
        exec_raw(&f, "DEL", &[("PATH", "/nonexistent")], &conf)?;
        ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    }
    Ok(())
}

/// A host port mapped in one layout is refused to the other: our iptables mapping (found in
/// the host-port index) refuses our nftables ADD, and our nftables mapping (looked up by key)
/// refuses our iptables ADD, each naming the owner and changing nothing.
#[test]
fn a_port_the_other_layout_maps_is_refused() -> Result<()> {
    let f = Fixture::new("nftables");
    let second = TestNetns::new("pm-ctr2")?;
    let nft_list = f.list(&["10.97.0.0/24"], json!({}));
    let mut ipt_list = f.list(&["10.97.0.0/24"], json!({"backend": "iptables"}));
    ipt_list.disable_check = true;
    let rt1 = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    let rt2 = f.rt("ctr2", &second, json!([tcp(8080, 80)]));
    for (first_list, second_list, owner) in [
        (&ipt_list, &nft_list, "id: \"ctr1\""),
        (&nft_list, &ipt_list, "pmtest/ctr1/eth0"),
    ] {
        let ctr = Fixture::ip(&f.runtime.add(first_list, &rt1)?, false);
        let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "first")?;
        let snapshot = f.leftovers()?;
        let Err(err) = f.runtime.add(second_list, &rt2) else {
            anyhow::bail!("an ADD of a port the other layout maps succeeded");
        };
        let msg = format!("{err:#}");
        ensure!(msg.contains("tcp/8080") && msg.contains(owner), "{msg}");
        ensure!(
            f.leftovers()? == snapshot,
            "the refused ADD changed the ruleset"
        );
        assert_eq!(get(&f.topo.client, host(8080))?, "first");
        f.runtime.del(second_list, &rt2)?;
        f.runtime.del(first_list, &rt1)?;
    }
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

/// Our iptables layout, written natively (the tools here are `iptables-nft`), is the Go
/// plugin's: the same `iptables-save -t nat` after the same ADD; the Go CHECK accepts ours
/// (with only the IPv4 tools on `PATH`: Go 1.1.1's CHECK looks for an IPv4 container's chain
/// in both families' tables and fails even on its own layout otherwise), and refuses it once a
/// rule is gone; the Go DEL removes it; and ours CHECKs and DELs what the Go ADD made.
#[test]
fn the_go_plugin_checks_and_deletes_our_iptables_layout_and_ours_its() -> Result<()> {
    ensure!(
        netfilter::iptables::native::writes_nf_tables(netfilter::iptables::Family::V4),
        "this test needs iptables-nft"
    );
    let f = Fixture::new("iptables");
    let netns = f.topo.container.path().to_string_lossy().into_owned();
    let mappings = json!([tcp(8080, 80), {"hostPort": 5353, "containerPort": 53, "protocol": "udp"},
        {"hostPort": 3868, "containerPort": 3868, "protocol": "sctp", "hostIP": "10.98.0.1"}]);
    let conf = json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "portmap",
        "runtimeConfig": {"portMappings": mappings},
        "prevResult": prev_result(&f, &["10.97.0.2/24"])});
    let tools = tests::bins::ipv4_iptables_tools()?;
    let v4_path = tools.path().to_string_lossy().into_owned();
    let go = |command: &str, path: Option<&str>| -> Result<PluginOutput> {
        let mut env = vec![
            ("CNI_CONTAINERID", "ctr1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", netns.as_str()),
            ("CNI_PATH", "/usr/lib/cni"),
        ];
        env.extend(path.map(|p| ("PATH", p)));
        let binary = tests::bins::reference_binary("portmap")?;
        f.runtime.exec_plugin(
            &binary.to_string_lossy(),
            Some(command),
            &env,
            conf.to_string().as_bytes(),
        )
    };
    let nat = || tests::snapshot::iptables_save_args(&f.topo.host, "iptables-save", &["-t", "nat"]);
    let ours = |command: &str| f.exec(command, "ctr1", &[("CNI_NETNS", &netns)], conf.clone());

    succeeded(ours("ADD")?, "our ADD")?;
    let our_layout = nat()?;
    succeeded(go("CHECK", Some(&v4_path))?, "Go CHECK of our layout")?;
    let chain = our_layout
        .iter()
        .find_map(|l| l.strip_prefix(":CNI-DN-"))
        .map(|rest| format!("CNI-DN-{}", rest.split(' ').next().unwrap_or_default()))
        .context("no CNI-DN- chain")?;
    let dnat = [
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        "8080",
        "-j",
        "DNAT",
        "--to-destination",
        "10.97.0.2:80",
    ];
    let rule = |op: &str| {
        let mut args = vec!["-t", "nat", op, chain.as_str()];
        args.extend(dnat);
        f.topo.host.exec_ok("iptables", &args)
    };
    rule("-D")?;
    ensure!(
        !go("CHECK", Some(&v4_path))?.status.success(),
        "the Go CHECK passed without a DNAT rule"
    );
    rule("-A")?;
    succeeded(go("DEL", None)?, "Go DEL of our layout")?;
    ensure!(
        f.leftovers()? == [format!("state directory {}", f.state_dir()?.display())],
        "the Go DEL left {:?}",
        f.leftovers()?
    );
    // Our DEL finds nothing left but its record.
    succeeded(f.exec("DEL", "ctr1", &[], conf.clone())?, "our DEL")?;
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);

    succeeded(go("ADD", None)?, "Go ADD")?;
    ensure!(
        nat()? == our_layout,
        "the Go ADD's layout differs from ours:\n{}\n---\n{}",
        nat()?.join("\n"),
        our_layout.join("\n")
    );
    succeeded(ours("CHECK")?, "our CHECK of the Go layout")?;
    succeeded(ours("DEL")?, "our DEL of the Go layout")?;
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

/// A directory for `PATH` whose iptables tools are Debian's legacy (x_tables) ones.
fn legacy_tools() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for family in ["iptables", "ip6tables"] {
        for suffix in ["", "-save", "-restore"] {
            let legacy = tests::bins::on_path(&format!("{family}-legacy{suffix}"))?;
            std::os::unix::fs::symlink(legacy, dir.path().join(format!("{family}{suffix}")))?;
        }
    }
    Ok(dir)
}

/// A kernel without nf_tables as the plugin sees it (issue 22 #6), either way one lacks it: a
/// seccomp filter refuses every netfilter netlink socket (no nfnetlink), or lets the kernel
/// answer each nf_tables message as it does without the nf_tables module (nfnetlink without
/// nf_tables: EINVAL, EOPNOTSUPP). Auto falls back to the legacy iptables tools (a `PATH` whose
/// tools are Debian's `iptables-legacy` ones), whose ADD, CHECK and DEL work and leave nothing;
/// an explicit nftables backend fails ADD naming nf_tables (999) and changes nothing, STATUS
/// says the same with code 50, and DEL (with and without a record) and GC succeed.
#[test]
fn without_nf_tables_auto_uses_the_legacy_tools_and_del_always_works() -> Result<()> {
    for lacking in tests::seccomp::Lacking::BOTH {
        without_nf_tables(lacking).with_context(|| format!("{lacking:?}"))?;
    }
    Ok(())
}

fn without_nf_tables(lacking: tests::seccomp::Lacking) -> Result<()> {
    let f = Fixture::new("");
    let tools = legacy_tools()?;
    let path = tools.path().to_string_lossy().into_owned();
    let netns = f.topo.container.path().to_string_lossy().into_owned();
    let mut conf = json!({"cniVersion": "1.0.0",
        "runtimeConfig": {"portMappings": [tcp(8080, 80)]},
        "prevResult": prev_result(&f, &["10.97.0.2/24"])});
    let legacy_nat = || -> Result<Vec<String>> {
        let out = f
            .topo
            .host
            .exec(&format!("{path}/iptables-save"), &["-t", "nat"])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("CNI-"))
            .map(str::to_string)
            .collect())
    };
    let outputs = lacking.run(|| -> Result<Vec<PluginOutput>> {
        let with = [("CNI_NETNS", netns.as_str()), ("PATH", path.as_str())];
        let mut outs = Vec::new();
        for command in ["ADD", "CHECK"] {
            outs.push(f.exec(command, "ctr1", &with, conf.clone())?);
        }
        Ok(outs)
    })??;
    for (out, command) in outputs.into_iter().zip(["ADD", "CHECK"]) {
        succeeded(out, command)?;
    }
    ensure!(
        legacy_nat()?
            .iter()
            .any(|l| l.contains("--dport 8080 -j DNAT")),
        "auto did not map with the legacy tools: {:?}",
        legacy_nat()?
    );
    let del = lacking.run(|| f.exec("DEL", "ctr1", &[("PATH", path.as_str())], conf.clone()))??;
    ensure!(
        del.status.success(),
        "DEL: {}",
        String::from_utf8_lossy(&del.stdout)
    );
    ensure!(
        legacy_nat()?.iter().all(|l| !l.contains("CNI-DN-")),
        "{:?}",
        legacy_nat()?
    );

    // The nftables backend, asked for explicitly.
    conf["backend"] = json!("nftables");
    conf["name"] = json!(NETWORK);
    conf["type"] = json!("portmap");
    let raw = |command: &str, env: &[(&str, &str)], conf: &Value| -> Result<PluginOutput> {
        let mut vars = vec![("CNI_CONTAINERID", "ctr2"), ("CNI_IFNAME", "eth0")];
        vars.extend_from_slice(env);
        f.runtime
            .exec_plugin("portmap", Some(command), &vars, conf.to_string().as_bytes())
    };
    let (add, status, del, gc) = lacking.run(|| -> Result<_> {
        let add = raw("ADD", &[("CNI_NETNS", netns.as_str())], &conf)?;
        let mut status_conf = conf.clone();
        status_conf["cniVersion"] = json!("1.1.0");
        let status = raw("STATUS", &[], &status_conf)?;
        let del = raw("DEL", &[], &conf)?;
        let mut gc_conf = status_conf.clone();
        gc_conf["cni.dev/valid-attachments"] = json!([]);
        let gc = raw("GC", &[], &gc_conf)?;
        Ok((add, status, del, gc))
    })??;
    let err = add
        .error()
        .context("ADD of the nftables backend succeeded")?;
    ensure!(
        err.code == 999
            && err.msg.starts_with(
                "unable to set up nftables rules for port mappings: the kernel has no nf_tables ("
            ),
        "{err:?}"
    );
    let err = status
        .error()
        .context("STATUS of the nftables backend succeeded")?;
    ensure!(
        err.code == 50 && err.msg.contains("the kernel has no nf_tables ("),
        "{err:?}"
    );
    for (out, command) in [(del, "DEL"), (gc, "GC")] {
        ensure!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    ensure!(f.leftovers()?.is_empty(), "{:?}", f.leftovers()?);
    Ok(())
}

/// Issue 22 #2: GC of 4 500 stale elements of our maps (their state files gone, so only the
/// listing finds them by owner) deletes them all in one transaction: their keys no longer go
/// into one netlink attribute, whose 16-bit length wrapped past 64 KiB.
#[test]
fn gc_removes_4500_stale_elements_whose_records_are_gone() -> Result<()> {
    let f = Fixture::new("nftables");
    let netns = f.topo.container.path().to_string_lossy().into_owned();
    let conf = json!({"cniVersion": "1.0.0",
        "runtimeConfig": {"portMappings": port_range(4_500)},
        "prevResult": prev_result(&f, &["10.97.0.2/24"])});
    let out = f.exec("ADD", "ctr1", &[("CNI_NETNS", &netns)], conf)?;
    ensure!(
        out.status.success(),
        "ADD: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let elements = f.leftovers()?.len();
    ensure!(elements > 4_500, "only {elements} objects made");
    std::fs::remove_dir_all(f.state_dir()?)?;
    let gc = json!({"cniVersion": "1.1.0", "cni.dev/valid-attachments": []});
    let out = f.exec("GC", "", &[], gc)?;
    ensure!(
        out.status.success(),
        "GC: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    ensure!(
        f.leftovers()?.is_empty(),
        "{} objects left",
        f.leftovers()?.len()
    );
    Ok(())
}

/// Whether `nft get element` finds `key` in our map `map` of the ip table.
fn nft_has(f: &Fixture, map: &str, key: &str) -> Result<bool> {
    nft_has_element(&f.topo.host, ("ip", "cni_portmap", map), key)
}

/// `nft list table ip cni_portmap` in the host namespace.
fn ipv4_table(f: &Fixture) -> Result<String> {
    f.topo
        .host
        .exec_ok("nft", &["list", "table", "ip", "cni_portmap"])
}

/// DEL of the nftables backend expires the attachment's elements instead of deleting them
/// (the maps have `flags timeout`): when DEL returns they are gone from listings and lookups
/// and no longer map (DEL waits out the kernel's tick), and a re-ADD of the same attachment right after maps again, for good (the new
/// elements carry no timeout).
#[test]
fn nftables_del_expires_the_elements_and_a_readd_at_once_maps_again() -> Result<()> {
    let f = Fixture::new("nftables");
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt(
        "ctr1",
        &f.topo.container,
        json!([tcp(8080, 80), {"hostPort": 5353, "containerPort": 53, "protocol": "udp"}]),
    );
    let mut ctr = Fixture::ip(&f.runtime.add(&list, &rt)?, false);
    let mut server = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "tcp-hello")?;
    let table = ipv4_table(&f)?;
    ensure!(
        table.matches("flags timeout").count() == 7,
        "every map and set of the table has flags timeout:\n{table}"
    );
    ensure!(nft_has(&f, "ports", "tcp . 8080")?, "no element after ADD");
    assert_eq!(get(&f.topo.client, host(8080))?, "tcp-hello");
    for round in 0..3 {
        f.runtime.del(&list, &rt)?;
        ensure!(
            get(&f.topo.client, host(8080)).is_err(),
            "still mapped after DEL"
        );
        ensure!(
            !nft_has(&f, "ports", "tcp . 8080")? && !nft_has(&f, "ports", "udp . 5353")?,
            "element found after DEL"
        );
        let left = f.leftovers()?;
        ensure!(left.is_empty(), "round {round}: left after DEL: {left:?}");
        // Right after DEL, no wait: the same attachment again (bridge's host-local may give the
        // container another address).
        ctr = Fixture::ip(&f.runtime.add(&list, &rt)?, false);
        drop(server);
        server = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "tcp-hello")?;
        let table = ipv4_table(&f)?;
        f.runtime.check(&list, &rt)?;
        assert_eq!(
            get(&f.topo.client, host(8080))
                .with_context(|| format!("round {round} re-ADD: {table}"))?,
            "tcp-hello"
        );
        // Long after any timeout of the expired elements, the new ones still map.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(get(&f.topo.client, host(8080))?, "tcp-hello");
        let table = ipv4_table(&f)?;
        ensure!(
            !table.contains("expires"),
            "a timeout on an added element:\n{table}"
        );
        f.runtime.check(&list, &rt)?;
    }
    // Our portmap alone, DEL then ADD of the same host port at once, to another address and
    // back (an ADD that finds an expired element still there, after a DEL killed in its
    // wait, waits it out: the kernel refuses an element with other data at a key still
    // there; common's tests cover that wait).
    let netns = f.topo.container.path().to_string_lossy().into_owned();
    let conf = |addr: &str| {
        json!({"cniVersion": "1.0.0",
            "runtimeConfig": {"portMappings": [tcp(8080, 80)]},
            "prevResult": prev_result(&f, &[&format!("{addr}/24")])})
    };
    let mut addr = ctr.to_string();
    for round in 0..6 {
        let next = if round % 2 == 0 {
            "10.97.0.250".to_string()
        } else {
            ctr.to_string()
        };
        succeeded(
            f.exec("DEL", "ctr1", &[("CNI_NETNS", &netns)], conf(&addr))?,
            "DEL",
        )?;
        succeeded(
            f.exec("ADD", "ctr1", &[("CNI_NETNS", &netns)], conf(&next))?,
            "ADD",
        )?;
        addr = next;
        std::thread::sleep(Duration::from_millis(20));
        let found = f.topo.host.exec_ok(
            "nft",
            &[
                "get",
                "element",
                "ip",
                "cni_portmap",
                "ports",
                "{ tcp . 8080 }",
            ],
        )?;
        ensure!(
            found.contains(&format!(": {addr} . 80")),
            "round {round}: {found}"
        );
        ensure!(!found.contains("expires"), "round {round}: {found}");
    }
    assert_eq!(get(&f.topo.client, host(8080))?, "tcp-hello");
    drop(server);
    f.runtime.del(&list, &rt)?;
    ensure!(
        get(&f.topo.client, host(8080)).is_err(),
        "still mapped after the last DEL"
    );
    Ok(())
}

/// A table an earlier version made, whose maps and sets lack `flags timeout` (where an expiry
/// is refused): DEL deletes the attachment's elements instead, and GC too.
#[test]
fn nftables_del_deletes_in_a_table_made_without_timeouts() -> Result<()> {
    let f = Fixture::new("nftables");
    let list = f.list(&["10.97.0.0/24"], json!({}));
    let rt = f.rt("ctr1", &f.topo.container, json!([tcp(8080, 80)]));
    // Our table as this version makes it, then made again without the flags.
    f.runtime.add(&list, &rt)?;
    f.runtime.del(&list, &rt)?;
    ensure!(f.leftovers()?.is_empty(), "elements left");
    let made = ipv4_table(&f)?;
    ensure!(made.contains("flags timeout"), "{made}");
    let old: String = made
        .lines()
        .filter(|l| l.trim() != "flags timeout")
        .map(|l| format!("{l}\n"))
        .collect();
    let file = f.scratch.path().join("old.nft");
    std::fs::write(&file, &old)?;
    f.topo
        .host
        .exec_ok("nft", &["delete", "table", "ip", "cni_portmap"])?;
    f.topo
        .host
        .exec_ok("nft", &["-f", &file.to_string_lossy()])?;
    let remade = ipv4_table(&f)?;
    ensure!(!remade.contains("flags timeout"), "{remade}");

    let second = TestNetns::new("pm-ctr2")?;
    let rt2 = f.rt("ctr2", &second, json!([tcp(8081, 80)]));
    let ctr = Fixture::ip(&f.runtime.add(&list, &rt)?, false);
    let ip2 = Fixture::ip(&f.runtime.add(&list, &rt2)?, false);
    let _t = TcpServer::banner(&f.topo.container, SocketAddr::new(ctr, 80), "old")?;
    let _u = TcpServer::banner(&second, SocketAddr::new(ip2, 80), "two")?;
    assert_eq!(get(&f.topo.client, host(8080))?, "old");
    f.runtime.check(&list, &rt)?;
    f.runtime.del(&list, &rt)?;
    // Deleted: gone at once.
    ensure!(
        get(&f.topo.client, host(8080)).is_err(),
        "still mapped after DEL"
    );
    ensure!(
        !nft_has(&f, "ports", "tcp . 8080")?,
        "element found after DEL"
    );
    let left = f.leftovers()?;
    ensure!(
        left.iter().all(|l| !l.contains("ctr1")),
        "left after DEL: {left:?}"
    );
    // GC of the other attachment deletes too.
    let gc = json!({"cniVersion": "1.1.0", "cni.dev/valid-attachments": []});
    succeeded(f.exec("GC", "", &[], gc)?, "GC")?;
    ensure!(
        get(&f.topo.client, host(8081)).is_err(),
        "still mapped after GC"
    );
    ensure!(
        f.leftovers()?.iter().all(|l| !l.contains("ctr2")),
        "{:?}",
        f.leftovers()?
    );
    let table = ipv4_table(&f)?;
    ensure!(
        !table.contains("flags timeout"),
        "the old table was replaced:\n{table}"
    );
    f.runtime.del(&list, &rt2)?;
    Ok(())
}
