//! Our `portmap` and `firewall` on other nodes' userlands: Debian 11, 12 and 13 (iptables
//! 1.8.7, 1.8.9, 1.8.11; Go plugins 0.9.0, 1.1.1, 1.1.1), each with its `iptables-nft` and with
//! its `iptables-legacy`, on this kernel (`tests::userland`: cached root filesystems, a node
//! per flavour mounted over one).
//!
//! In each node, in throwaway namespaces (a host where the plugins run, containers on a Go
//! `bridge` of that release with `host-local` IPAM, a client one hop from the host), with two
//! mappings (8080→80, 8443→443) on both families and snat (hairpin and localhost marks):
//!
//! - **the same layout**: ADD by that release's Go plugins on one host and by ours on another,
//!   compared with that release's `iptables-save` and `ip6tables-save` (`nat`, `filter`);
//! - **traffic** through the mappings from the client (each host port to its own container
//!   port, the client's address kept), from the host's `127.0.0.1`, from the container to
//!   itself (hairpin), and straight to the container without masquerade;
//! - **CHECK and DEL across**: ours of Go's, Go's of ours (Go's CHECK once per family, with the
//!   other family's tools off `PATH`: with both there it looks for one family's rules in both
//!   tables and fails even after its own ADD, a bug the portmap README lists), each leaving
//!   the tables as the other's own DEL does;
//! - **that release's `save | restore`** of both families, after which the tables read the
//!   same, both CHECKs pass and the traffic still goes where it should;
//! - **a mixed node**, one container added by Go and one by ours, in both orders: every shared
//!   rule once, both reachable, and after both DELs the tables of a node where Go did all four.
//!
//! Debian 11's Go plugins speak CNI up to 0.4.0, so that node's calls are in 0.4.0; the others
//! in 1.0.0. A node's failures are collected per scenario and reported together.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use tests::netns::{CLIENT_V4, CLIENT_V6, HOST_UPLINK_V4, HOST_UPLINK_V6};
use tests::snapshot::Snapshot;
use tests::traffic::{TcpServer, tcp_request};
use tests::userland::{self, Flavour, GO_DIR, NODE_PATH, Node, OUR_DIR, Release};
use tests::{NetworkConfigList, PluginOutput, Runtime, RuntimeConf, TestNetns, Topology};

const NETWORK: &str = "userland";
const BRIDGE: &str = "cni-ul0";
const SUBNETS: [&str; 2] = ["10.88.0.0/24", "fd88::/64"];
/// The container of every host, and the second container of a mixed node.
const A: &str = "a0a1a2a3a4a5a6a7a8a9aaabacadaeafa0a1a2a3a4a5a6a7a8a9aaabacadaeaf";
const B: &str = "b0b1b2b3b4b5b6b7b8b9babbbcbdbebfb0b1b2b3b4b5b6b7b8b9babbbcbdbebf";
/// Host port → container port, per container.
const A_PORTS: [(u16, u16); 2] = [(8080, 80), (8443, 443)];
const B_PORTS: [(u16, u16); 2] = [(9080, 80), (9443, 443)];
const TIMEOUT: Duration = Duration::from_secs(3);

#[test]
fn debian_11_bullseye_iptables_1_8_7() -> Result<()> {
    matrix(userland::BULLSEYE)
}

#[test]
fn debian_12_bookworm_iptables_1_8_9() -> Result<()> {
    matrix(userland::BOOKWORM)
}

#[test]
fn debian_13_trixie_iptables_1_8_11() -> Result<()> {
    matrix(userland::TRIXIE)
}

/// Every scenario with both flavours of `release`; all failures reported together.
fn matrix(release: Release) -> Result<()> {
    let mut failures = Vec::new();
    for flavour in Flavour::BOTH {
        let started = Instant::now();
        let outcome = Hosts::new().and_then(|hosts| {
            userland::with_node(release, flavour, |node| Ok(scenarios(node, &hosts)))
        });
        match outcome {
            Ok(results) => {
                for (name, result) in results {
                    match result {
                        Ok(()) => eprintln!("{} {flavour}: {name}: ok", release.codename),
                        Err(e) => failures.push(format!(
                            "Debian {} ({}, iptables {}) {flavour}: {name}: {e:#}",
                            release.debian, release.codename, release.iptables
                        )),
                    }
                }
            }
            Err(e) => failures.push(format!("{} {flavour}: {e:#}", release.codename)),
        }
        eprintln!("{} {flavour}: {:.1?}", release.codename, started.elapsed());
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n\n"));
    }
    Ok(())
}

/// The namespaces of one node's scenarios, made before the node is mounted (it sees
/// `/run/netns` as it was then).
struct Hosts {
    go: Host,
    ours: Host,
    /// Go added both containers.
    reference: Host,
    /// Go added A, then ours B.
    go_first: Host,
    /// Ours added A, then Go B.
    ours_first: Host,
    /// Every form of the codec, by the node's tools and by ours.
    forms: TestNetns,
    /// A DEL refused: Go's and ours.
    busy_go: Host,
    busy_ours: Host,
}

impl Hosts {
    fn new() -> Result<Hosts> {
        Ok(Hosts {
            go: Host::new("ulg")?,
            ours: Host::new("ulo")?,
            reference: Host::new("ulr")?,
            go_first: Host::new("ulm")?,
            ours_first: Host::new("uln")?,
            forms: TestNetns::new("ulf")?,
            busy_go: Host::new("ulbg")?,
            busy_ours: Host::new("ulbo")?,
        })
    }
}

/// A host, its client and two container namespaces.
struct Host {
    topo: Topology,
    second: TestNetns,
}

impl Host {
    fn new(prefix: &str) -> Result<Host> {
        Ok(Host {
            topo: Topology::new(prefix)?,
            second: TestNetns::new(&format!("{prefix}-ctrb"))?,
        })
    }

    fn ns(&self) -> &TestNetns {
        &self.topo.host
    }

    fn container(&self, id: &str) -> &TestNetns {
        if id == A {
            &self.topo.container
        } else {
            &self.second
        }
    }
}

/// Which implementation makes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum By {
    Go,
    Ours,
}

impl std::fmt::Display for By {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            By::Go => "Go",
            By::Ours => "ours",
        })
    }
}

/// One container attached to a host's bridge, with its servers on ports 80 and 443.
struct Attached {
    id: &'static str,
    netns: PathBuf,
    /// The bridge's result: the meta plugins' `prevResult`.
    prev: Value,
    v4: IpAddr,
    v6: IpAddr,
    ports: [(u16, u16); 2],
    servers: Vec<TcpServer>,
}

/// The calls of one host inside a node.
struct Calls<'n> {
    node: &'n Node,
    host: &'n Host,
    runtime: Runtime,
    /// The bridge alone, as the chain's first plugin.
    bridge: NetworkConfigList,
}

impl<'n> Calls<'n> {
    fn new(node: &'n Node, host: &'n Host) -> Result<Calls<'n>> {
        // Each host keeps its own leases, so that two hosts give their containers the same
        // addresses.
        let leases = PathBuf::from(format!("/run/ipam-{}", host.ns().name()));
        let bridge = NetworkConfigList::new(
            NETWORK,
            node.release().cni_version,
            vec![tests::main_plugin::bridge(BRIDGE, &SUBNETS, &leases)],
        );
        Ok(Calls {
            node,
            host,
            runtime: node.runtime(host.ns(), false)?,
            bridge,
        })
    }

    /// Attaches container `id` to the bridge and starts its servers.
    fn attach(&self, id: &'static str) -> Result<Attached> {
        let netns = self.host.container(id);
        let rt = RuntimeConf::new(id, netns.path(), "eth0");
        let prev = self.runtime.add(&self.bridge, &rt).context("bridge ADD")?;
        let v4: IpAddr = tests::result::address(&prev, false)?.parse()?;
        let v6: IpAddr = tests::result::address(&prev, true)?.parse()?;
        let mut servers = Vec::new();
        for port in [80, 443] {
            servers.push(TcpServer::banner(
                netns,
                SocketAddr::new("::".parse()?, port),
                &format!("port {port}"),
            )?);
        }
        Ok(Attached {
            id,
            netns: netns.path().to_path_buf(),
            prev,
            v4,
            v6,
            ports: if id == A { A_PORTS } else { B_PORTS },
            servers,
        })
    }

    fn detach(&self, att: &Attached) -> Result<()> {
        let rt = RuntimeConf::new(att.id, &att.netns, "eth0");
        self.runtime.del(&self.bridge, &rt).context("bridge DEL")
    }

    /// The config `plugin` gets for `att`, its prevResult cut to `family` when given.
    fn conf(&self, plugin: &str, att: &Attached, family: Option<bool>) -> Value {
        let mut prev = att.prev.clone();
        if let (Some(v6), Some(ips)) = (family, prev["ips"].as_array_mut()) {
            ips.retain(|ip| {
                ip["address"]
                    .as_str()
                    .is_some_and(|a| a.contains(':') == v6)
            });
        }
        let mut conf = json!({
            "cniVersion": self.node.release().cni_version,
            "name": NETWORK,
            "type": plugin,
            "prevResult": prev,
        });
        if plugin == "portmap" {
            conf["snat"] = json!(true);
            conf["runtimeConfig"] = json!({
                "portMappings": att.ports.iter().map(|(host, container)| json!({
                    "hostPort": host, "containerPort": container, "protocol": "tcp"
                })).collect::<Vec<_>>()
            });
        }
        conf
    }

    /// `verb` of `plugin` for `att` by `by`, with the node's `PATH` (or `path`).
    fn call(
        &self,
        by: By,
        verb: &str,
        plugin: &str,
        att: &Attached,
        family: Option<bool>,
        path: &str,
    ) -> Result<PluginOutput> {
        let dir = match by {
            By::Go => GO_DIR,
            By::Ours => OUR_DIR,
        };
        let binary = format!("{dir}/{plugin}");
        let netns = att.netns.to_string_lossy().into_owned();
        let cni_path = format!("{OUR_DIR}:{GO_DIR}");
        let env = [
            ("CNI_CONTAINERID", att.id),
            ("CNI_NETNS", netns.as_str()),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", cni_path.as_str()),
            ("PATH", path),
        ];
        let stdin = serde_json::to_vec(&self.conf(plugin, att, family))?;
        self.runtime
            .exec_plugin(&binary, Some(verb), &env, &stdin)
            .with_context(|| format!("{by} {plugin} {verb}"))
    }

    /// `verb` of portmap then firewall (DEL: the other way round) by `by`, which must succeed.
    fn meta(&self, by: By, verb: &str, att: &Attached) -> Result<()> {
        let mut plugins = ["portmap", "firewall"];
        if verb == "DEL" {
            plugins.reverse();
        }
        for plugin in plugins {
            let out = self.call(by, verb, plugin, att, None, NODE_PATH)?;
            ensure!(
                out.status.success(),
                "{by} {plugin} {verb} of container {}: {}{}",
                &att.id[..2],
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Go's CHECK: portmap's once per family with only that family's tools on `PATH`,
    /// firewall's (which needs both) once.
    fn go_check(&self, att: &Attached) -> Result<()> {
        let only = |tools: &str| format!("/opt/cni-rs/only-{tools}:/usr/local/bin:/usr/bin:/bin");
        for (plugin, family, path) in [
            ("portmap", Some(false), only("iptables")),
            ("portmap", Some(true), only("ip6tables")),
            ("firewall", None, NODE_PATH.to_owned()),
        ] {
            let out = self.call(By::Go, "CHECK", plugin, att, family, &path)?;
            ensure!(
                out.status.success(),
                "Go {plugin} CHECK ({}): {}{}",
                match family {
                    Some(false) => "IPv4",
                    Some(true) => "IPv6",
                    None => "both families",
                },
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// The tables as the node's `iptables-save` and `ip6tables-save` print them.
    fn tables(&self) -> Result<Snapshot> {
        let mut snap = Snapshot::new();
        for tool in ["iptables", "ip6tables"] {
            for table in ["nat", "filter"] {
                snap.insert(
                    format!("{tool} {table}"),
                    self.node.save(self.host.ns(), tool, table)?,
                );
            }
        }
        Ok(snap)
    }

    /// Traffic through `att`'s mappings (the second one over IPv6 only with `second_v6`), and
    /// straight to it.
    fn traffic(&self, att: &Attached, second_v6: bool) -> Result<()> {
        let topo = &self.host.topo;
        let client = [CLIENT_V4.parse::<IpAddr>()?, CLIENT_V6.parse()?];
        for (i, host) in [HOST_UPLINK_V4, HOST_UPLINK_V6].into_iter().enumerate() {
            let host: IpAddr = host.parse()?;
            let mapped = if i == 1 && !second_v6 { 1 } else { 2 };
            for (host_port, port) in att.ports.into_iter().take(mapped) {
                let to = SocketAddr::new(host, host_port);
                let got = reply(&topo.client, to)?;
                ensure!(
                    got == format!("port {port}"),
                    "from the client to {to}: {got:?}, where container port {port} answers"
                );
                // The hairpin: the container through its own host port.
                let got = reply(self.host.container(att.id), to)?;
                ensure!(
                    got == format!("port {port}"),
                    "from the container to {to}: {got:?}"
                );
            }
            let direct = SocketAddr::new(if i == 0 { att.v4 } else { att.v6 }, 80);
            let (got, peer) = reply_peer(&topo.client, direct, &att.servers[0])?;
            ensure!(got == "port 80", "from the client to {direct}: {got:?}");
            ensure!(
                peer == client[i],
                "the client's direct connection to {direct} arrived from {peer}, not from the \
                 client {}: masqueraded",
                client[i]
            );
        }
        let (host_port, port) = att.ports[0];
        let local = SocketAddr::new("127.0.0.1".parse()?, host_port);
        let got = reply(self.host.ns(), local)?;
        ensure!(
            got == format!("port {port}"),
            "from the host to {local}: {got:?}"
        );
        Ok(())
    }
}

/// What the node's own tools get wrong, which shows in the Go plugin's rules (it asks
/// `iptables -C` before each append; we read the table and compare ourselves).
#[derive(Debug, Clone, Copy, Default)]
struct Quirks {
    /// `ip6tables -C` ignores a rule's matches (ip6tables-legacy 1.8.9, fixed in 1.8.10 by
    /// "ip6tables: Fix checking existence of rule"): Go skips every IPv6 rule that differs
    /// from one before it in its matches only, here the second mapping's hairpin mark and
    /// DNAT rules, and that host port is not forwarded over IPv6.
    ip6_check_blind: bool,
}

impl Quirks {
    /// Asks the node's `ip6tables -C` for a rule that differs from the chain's only one in
    /// its port, in `ns` (a scratch chain, removed).
    fn probe(node: &Node, ns: &TestNetns) -> Result<Quirks> {
        let rule = |op: &str, port: &str| {
            node.run(
                Some(ns),
                "ip6tables",
                &[
                    "-t",
                    "filter",
                    op,
                    "CNI-RS-PROBE",
                    "-p",
                    "tcp",
                    "--dport",
                    port,
                    "-j",
                    "RETURN",
                ],
                b"",
            )
        };
        node.run_ok(ns, "ip6tables", &["-t", "filter", "-N", "CNI-RS-PROBE"])?;
        rule("-A", "1")?;
        let blind = rule("-C", "2")?.status.success();
        node.run_ok(ns, "ip6tables", &["-t", "filter", "-F", "CNI-RS-PROBE"])?;
        node.run_ok(ns, "ip6tables", &["-t", "filter", "-X", "CNI-RS-PROBE"])?;
        Ok(Quirks {
            ip6_check_blind: blind,
        })
    }

    /// Whether Go's rules forward `att`'s second host port over IPv6.
    fn go_maps_second_v6(self) -> bool {
        !self.ip6_check_blind
    }

    /// Whether our CHECK of what Go added (`checked`) says what it should: that all is there,
    /// or where Go left a rule out, that it is missing.
    fn our_check_of_gos(self, checked: Result<()>) -> Result<()> {
        if !self.ip6_check_blind {
            return checked;
        }
        let missing = format!("--dport {} -j CNI-HOSTPORT-SETMARK not found", A_PORTS[1].0);
        match checked {
            Ok(()) => bail!("it passed, though Go left out the IPv6 rules of host port 8443"),
            Err(e) if format!("{e:#}").contains(&missing) => Ok(()),
            Err(e) => Err(e.context(format!("not the failure expected: {missing}"))),
        }
    }

    /// Fails unless `ours` holds Go's tables, plus only what Go leaves out through the
    /// node's tools.
    fn same(self, go: &Snapshot, ours: &Snapshot, what: &str) -> Result<()> {
        let Err(e) = go.ensure_same(ours, what) else {
            return Ok(());
        };
        if !self.ip6_check_blind {
            return Err(e);
        }
        let seconds = [A_PORTS[1].0, B_PORTS[1].0];
        for name in go.section_names().chain(ours.section_names()) {
            let (lost, gained) =
                tests::snapshot::multiset_difference(go.section(name), ours.section(name));
            let explained = |line: &String| {
                name == "ip6tables nat"
                    && line.starts_with("-A CNI-DN-")
                    && seconds
                        .iter()
                        .any(|p| line.contains(&format!(" --dport {p} ")))
            };
            if !lost.is_empty() || !gained.iter().all(explained) {
                return Err(
                    e.context("beyond the IPv6 rules ip6tables-legacy 1.8.9's -C hides from Go")
                );
            }
        }
        Ok(())
    }
}

/// What the server at `to` says to a connection from `ns`.
fn reply(ns: &TestNetns, to: SocketAddr) -> Result<String> {
    let bytes = tcp_request(ns, to, b"", TIMEOUT)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// As [`reply`], with the source address `server` saw.
fn reply_peer(ns: &TestNetns, to: SocketAddr, server: &TcpServer) -> Result<(String, IpAddr)> {
    let got = reply(ns, to)?;
    let peer = server
        .peers()
        .last()
        .map(|p| p.ip().to_canonical())
        .context("the server saw no connection")?;
    Ok((got, peer))
}

/// Runs every scenario on `node`, each with its own hosts; their outcomes by name.
fn scenarios(node: &Node, hosts: &Hosts) -> Vec<(&'static str, Result<()>)> {
    let quirks = match prepare(node).and_then(|()| Quirks::probe(node, &hosts.go.topo.client)) {
        Ok(quirks) => quirks,
        Err(e) => return vec![("the node", Err(e))],
    };
    if quirks.ip6_check_blind {
        eprintln!(
            "{} {}: ip6tables -C ignores matches here",
            node.release().codename,
            node.flavour()
        );
    }
    let mut outcomes = Vec::new();
    if node.flavour() == Flavour::Nft {
        // What we write natively, as the node's tools read it; 1.8.7's encoding is ours.
        let same = node.release().iptables == "1.8.7";
        let tools = |ns: &TestNetns, program: &str, args: &[&str], stdin: &[u8]| {
            node.run(Some(ns), program, args, stdin)
        };
        outcomes.push((
            "every form written natively, read and found by the node's tools as their own",
            tests::iptables_layout::forms_read_alike(&hosts.forms, &tools, same),
        ));
    }
    outcomes.extend([
        (
            "one container: layout, traffic, CHECK and DEL across, save|restore",
            across(node, quirks, &hosts.go, &hosts.ours),
        ),
        (
            "a mixed node: Go first, then ours; ours first, then Go",
            mixed(node, quirks, hosts),
        ),
        (
            "a DEL refused while an operator's rule jumps to the chain",
            refused_del(node, quirks, &hosts.busy_go, &hosts.busy_ours),
        ),
    ]);
    outcomes
}

/// The per-family tool directories Go's CHECK runs with.
fn prepare(node: &Node) -> Result<()> {
    for tools in ["iptables", "ip6tables"] {
        let dir = node.path(&format!("/opt/cni-rs/only-{tools}"));
        std::fs::create_dir_all(&dir)?;
        for suffix in ["", "-save", "-restore"] {
            let name = format!("{tools}{suffix}");
            std::os::unix::fs::symlink(format!("/usr/sbin/{name}"), dir.join(&name))?;
        }
    }
    Ok(())
}

/// Go on one host, ours on another, then across.
fn across(node: &Node, quirks: Quirks, go_host: &Host, our_host: &Host) -> Result<()> {
    let go = Calls::new(node, go_host)?;
    let ours = Calls::new(node, our_host)?;
    let a_go = go.attach(A)?;
    let a_ours = ours.attach(A)?;
    go.meta(By::Go, "ADD", &a_go)?;
    ours.meta(By::Ours, "ADD", &a_ours)?;
    quirks.same(&go.tables()?, &ours.tables()?, "Go's ADD (-) and ours (+)")?;
    go.traffic(&a_go, quirks.go_maps_second_v6())
        .context("through Go's rules")?;
    ours.traffic(&a_ours, true).context("through ours")?;

    ours.meta(By::Ours, "CHECK", &a_ours)
        .context("our CHECK of ours")?;
    quirks
        .our_check_of_gos(go.meta(By::Ours, "CHECK", &a_go))
        .context("our CHECK of Go's")?;
    go.go_check(&a_go).context("Go's CHECK of its own")?;
    ours.go_check(&a_ours).context("Go's CHECK of ours")?;

    // The node's own save | restore of both families.
    for calls in [&go, &ours] {
        let before = calls.tables()?;
        node.save_restore(calls.host.ns())?;
        before.ensure_same(&calls.tables()?, "before (-) and after (+) save | restore")?;
    }
    ours.meta(By::Ours, "CHECK", &a_ours)
        .context("after save | restore, our CHECK of ours")?;
    quirks
        .our_check_of_gos(go.meta(By::Ours, "CHECK", &a_go))
        .context("after save | restore, our CHECK of Go's")?;
    ours.go_check(&a_ours)
        .context("after save | restore, Go's CHECK of ours")?;
    ours.traffic(&a_ours, true)
        .context("after save | restore, through ours")?;

    // DEL across, then each its own (a second DEL finds nothing).
    ours.meta(By::Go, "DEL", &a_ours)
        .context("Go's DEL of ours")?;
    go.meta(By::Ours, "DEL", &a_go).context("our DEL of Go's")?;
    go.tables()?
        .ensure_same(&ours.tables()?, "our DEL of Go's (-) and Go's of ours (+)")?;
    ours.meta(By::Ours, "DEL", &a_ours)?;
    go.meta(By::Go, "DEL", &a_go)?;
    go.tables()?.ensure_same(
        &ours.tables()?,
        "after a second DEL, Go's host (-) and ours (+)",
    )?;
    go.detach(&a_go)?;
    ours.detach(&a_ours)?;
    Ok(())
}

/// One container by each implementation on one host, in both orders, against a host where
/// Go added both.
fn mixed(node: &Node, quirks: Quirks, hosts: &Hosts) -> Result<()> {
    let reference = Calls::new(node, &hosts.reference)?;
    let ra = reference.attach(A)?;
    let rb = reference.attach(B)?;
    reference.meta(By::Go, "ADD", &ra)?;
    reference.meta(By::Go, "ADD", &rb)?;
    let both = reference.tables()?;
    for (host, first, second) in [
        (&hosts.go_first, By::Go, By::Ours),
        (&hosts.ours_first, By::Ours, By::Go),
    ] {
        let calls = Calls::new(node, host)?;
        let a = calls.attach(A)?;
        let b = calls.attach(B)?;
        calls.meta(first, "ADD", &a)?;
        calls.meta(second, "ADD", &b)?;
        quirks.same(
            &both,
            &calls.tables()?,
            &format!("Go's two ADDs (-) and the ADDs by {first}, then by {second} (+)"),
        )?;
        let full = |by: By| by == By::Ours || quirks.go_maps_second_v6();
        calls
            .traffic(&a, full(first))
            .with_context(|| format!("through the rules by {first}"))?;
        calls
            .traffic(&b, full(second))
            .with_context(|| format!("through the rules by {second}"))?;
        calls.meta(first, "DEL", &a)?;
        calls.meta(second, "DEL", &b)?;
        calls.detach(&a)?;
        calls.detach(&b)?;
        host_after_dels(&reference, &ra, &rb)?.ensure_same(
            &calls.tables()?,
            &format!("after Go's two DELs (-) and the DELs by {first} and by {second} (+)"),
        )?;
    }
    Ok(())
}

/// The reference host's tables after Go's DELs of both containers (made once, on first use).
fn host_after_dels(reference: &Calls<'_>, a: &Attached, b: &Attached) -> Result<Snapshot> {
    if reference
        .tables()?
        .section("iptables nat")
        .iter()
        .any(|l| l.contains("CNI-DN-"))
    {
        reference.meta(By::Go, "DEL", a)?;
        reference.meta(By::Go, "DEL", b)?;
        reference.detach(a)?;
        reference.detach(b)?;
    }
    reference.tables()
}

/// An operator's rule in IPv4's `PREROUTING` jumps to the attachment's chain: the kernel
/// refuses to delete it, and Go's DEL fails after emptying it and removing its entry rules;
/// so does ours, with the same IPv4 table left and no traffic through the mapping (Go stops
/// there, ours removes the IPv6 mapping too). Once the operator's rule is gone, a second DEL
/// finishes.
fn refused_del(node: &Node, quirks: Quirks, go_host: &Host, our_host: &Host) -> Result<()> {
    let go = Calls::new(node, go_host)?;
    let ours = Calls::new(node, our_host)?;
    let a_go = go.attach(A)?;
    let a_ours = ours.attach(A)?;
    go.meta(By::Go, "ADD", &a_go)?;
    ours.meta(By::Ours, "ADD", &a_ours)?;
    let chain = ours
        .tables()?
        .section("iptables nat")
        .iter()
        .find_map(|l| l.strip_prefix(":CNI-DN-"))
        .and_then(|l| l.split(' ').next())
        .map(|hash| format!("CNI-DN-{hash}"))
        .context("no CNI-DN- chain")?;
    let operator = |calls: &Calls<'_>, op: &str| {
        node.run_ok(
            calls.host.ns(),
            "iptables",
            &[
                "-t",
                "nat",
                op,
                "PREROUTING",
                "-s",
                "192.0.2.1/32",
                "-j",
                &chain,
            ],
        )
    };
    for (calls, by, att) in [(&go, By::Go, &a_go), (&ours, By::Ours, &a_ours)] {
        operator(calls, "-I")?;
        let out = calls.call(by, "DEL", "portmap", att, None, NODE_PATH)?;
        let error = tests::CniErrorObject::parse(&out.stdout);
        ensure!(
            !out.status.success()
                && error
                    .as_ref()
                    .is_some_and(|e| e.msg.starts_with("could not teardown ipv4 dnat: ")),
            "the DEL by {by} with the chain still jumped to: {:?} {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Go stops at the family that failed, IPv4, and leaves the IPv6 mapping in place; ours
    // goes on and removes it (README: "a DEL refused by the kernel").
    let mut go_tables = Snapshot::new();
    for name in go.tables()?.section_names() {
        let lines = go.tables()?.section(name).to_vec();
        let kept = if name == "ip6tables nat" {
            lines.into_iter().filter(|l| !l.contains(&chain)).collect()
        } else {
            lines
        };
        go_tables.insert(name, kept);
    }
    quirks.same(
        &go_tables,
        &ours.tables()?,
        "after the refused DEL, Go's without its IPv6 chain (-) and ours (+)",
    )?;
    let (host_port, _) = a_ours.ports[0];
    for host in [HOST_UPLINK_V4, HOST_UPLINK_V6] {
        let to = SocketAddr::new(host.parse()?, host_port);
        ensure!(
            reply(&ours.host.topo.client, to).is_err(),
            "after the refused DEL, {to} still forwards"
        );
    }
    for (calls, by, att) in [(&go, By::Go, &a_go), (&ours, By::Ours, &a_ours)] {
        operator(calls, "-D")?;
        calls
            .meta(by, "DEL", att)
            .with_context(|| format!("the DEL by {by} once the operator's rule is gone"))?;
        calls.detach(att)?;
    }
    go.tables()?.ensure_same(
        &ours.tables()?,
        "after the second DEL, Go's (-) and ours (+)",
    )
}
