//! `firewall reconcile` end to end: Debian's Go `bridge` + `host-local`, then our `firewall`
//! with `ingressPolicy: same-bridge` on two bridges, with real TCP through the firewall's
//! accepts (the host's iptables `FORWARD` policy DROP) and across its isolation; then what
//! other programs do to a node's firewall (`iptables -F; -X`, an `iptables-restore` of an
//! older save, `nft flush ruleset`), and `firewall reconcile` run in the host namespace as an
//! operator would. For the iptables backend with the `iptables-nft` and the legacy tools, and
//! for the nftables backend; and a hundred attachments restored by one reconcile. (firewalld's
//! reload is in `firewalld.rs`, with the firewalld those tests start.)

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

// Helpers unwrap like tests do: the whole file is test code.
#[cfg(test)]
mod e2e {
    use std::net::SocketAddr;
    use std::path::PathBuf;
    use std::process::Command;
    use std::time::Duration;

    use serde_json::{Value, json};
    use tests::netns::{CLIENT_V4, HOST_UPLINK_V4};
    use tests::result::synthetic_prev;
    use tests::traffic::{TcpServer, answers};
    use tests::{
        NetworkConfigList, PluginOutput, Runtime, RuntimeConf, TestNetns, Topology, main_plugin,
        nft_has_element,
    };

    /// How long a connection that must succeed may take.
    const OPEN: Duration = Duration::from_secs(3);
    /// How long to wait before calling a flow blocked (dropped packets never answer).
    const BLOCKED: Duration = Duration::from_millis(700);

    /// The iptables tools a case uses, and where the plugin finds them.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Tools {
        /// The machine's `iptables-nft`.
        Nft,
        /// `iptables-legacy`, first on the plugin's `PATH`.
        Legacy,
    }

    impl Tools {
        /// `iptables`, `iptables-save`…, as the case runs them.
        fn tool(self, family: &str, suffix: &str) -> String {
            match self {
                Tools::Nft => format!("{family}{suffix}"),
                Tools::Legacy => format!("{family}-legacy{suffix}"),
            }
        }
    }

    /// What the test does to the host's firewall.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Disruption {
        /// `iptables -t nat -F; iptables -t nat -X` (and ip6tables).
        FlushNat,
        /// `iptables -F; iptables -X` (and ip6tables) of the filter table.
        FlushFilter,
        /// `iptables-restore` (and ip6tables) of the filter table saved before the ADDs.
        RestoreOlder,
        /// `nft flush ruleset`.
        FlushRuleset,
    }

    /// The firewall's own config for a direct exec, with `prevResult`.
    fn firewall_conf(list: &NetworkConfigList, prev: &Value) -> Value {
        let mut conf = list.plugins.last().unwrap().clone();
        conf["cniVersion"] = json!(list.cni_version);
        conf["name"] = json!(list.name);
        conf["prevResult"] = prev.clone();
        conf
    }

    /// `<tool>-save -t filter` of `ns` without comments and counters, sorted (the order of
    /// rules a reconcile appends may differ from the ADDs'; their number may not).
    fn filter_table(ns: &TestNetns, tools: Tools) -> Vec<String> {
        let mut lines = Vec::new();
        for family in ["iptables", "ip6tables"] {
            let save = ns
                .exec_ok(&tools.tool(family, "-save"), &["-t", "filter"])
                .unwrap();
            lines.extend(save.lines().filter(|l| !l.starts_with('#')).map(
                |l| match l.find(" [") {
                    Some(i) if l.starts_with(':') => format!("{family} {}", &l[..i]),
                    _ => format!("{family} {l}"),
                },
            ));
        }
        lines.sort();
        lines
    }

    /// `firewall reconcile` in `rt`'s host namespace: its stdout, after checking it succeeded.
    fn reconcile(rt: &Runtime) -> String {
        reconcile_of(rt, "firewall")
    }

    /// `<plugin> reconcile` in `rt`'s host namespace: its stdout, after checking it succeeded.
    fn reconcile_of(rt: &Runtime, plugin: &str) -> String {
        let out = rt.operate(plugin, &["reconcile"], &[]).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "reconcile failed ({}): {stdout} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Lines of a reconcile's output that say it changed something.
    fn changes(stdout: &str) -> Vec<&str> {
        stdout
            .lines()
            .filter(|l| l.starts_with("restored ") || l.starts_with("removed "))
            .collect()
    }

    fn ok(out: &PluginOutput, what: &str) {
        assert!(
            out.status.success(),
            "{what}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn records(host: &TestNetns) -> Vec<String> {
        tests::firewall_state::records(host).unwrap()
    }

    fn wait_destroyed(host: &TestNetns, record: &str) {
        tests::firewall_state::wait_destroyed(host, record).unwrap();
    }

    /// Breaks the host's firewall as `what` says, with the case's tools.
    fn disrupt(host: &TestNetns, tools: Tools, what: Disruption, older: &[(String, String)]) {
        match what {
            Disruption::FlushFilter | Disruption::FlushNat => {
                let table = if what == Disruption::FlushNat {
                    "nat"
                } else {
                    "filter"
                };
                for family in ["iptables", "ip6tables"] {
                    let tool = tools.tool(family, "");
                    host.exec_ok(&tool, &["-t", table, "-F"]).unwrap();
                    host.exec_ok(&tool, &["-t", table, "-X"]).unwrap();
                }
            }
            Disruption::RestoreOlder => {
                for (family, save) in older {
                    let out = host
                        .output(
                            &mut Command::new(tools.tool(family, "-restore")),
                            save.as_bytes(),
                            OPEN,
                        )
                        .unwrap();
                    assert!(out.status.success(), "{family}-restore: {out:?}");
                }
            }
            Disruption::FlushRuleset => {
                host.exec_ok("nft", &["flush", "ruleset"]).unwrap();
            }
        }
    }

    /// Two networks with `same-bridge` isolation, `a` (dual-stack) with a live container and
    /// one whose namespace is deleted after its ADD, `b` with one live container; each of
    /// `disruptions` in turn, each followed by two reconciles; then DEL of all three.
    fn comes_back(backend: &str, tools: Tools, disruptions: &[Disruption]) {
        let topo = Topology::new(&format!(
            "rc{}{}",
            &backend[..2],
            &format!("{tools:?}")[..1]
        ))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let legacy_bin = tests::bins::legacy_iptables_tools().unwrap();
        let mut rt = Runtime::new(&topo.host).unwrap();
        if tools == Tools::Legacy {
            let path = std::env::join_paths(
                std::iter::once(legacy_bin.path().to_path_buf())
                    .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
            )
            .unwrap();
            rt = rt.with_env("PATH", &path.to_string_lossy());
        }
        let iptables = backend == "iptables";
        if iptables {
            // The accepts are what lets the containers' traffic out.
            for family in ["iptables", "ip6tables"] {
                topo.host
                    .exec_ok(&tools.tool(family, ""), &["-P", "FORWARD", "DROP"])
                    .unwrap();
            }
        }
        let before = filter_table(&topo.host, tools);
        let older: Vec<(String, String)> = ["iptables", "ip6tables"]
            .into_iter()
            .map(|family| {
                let save = topo
                    .host
                    .exec_ok(&tools.tool(family, "-save"), &["-t", "filter"])
                    .unwrap();
                (family.to_owned(), save)
            })
            .collect();
        let net_a = tests::firewall_state::same_bridge_conflist(
            "rcneta",
            "rcbra",
            &["10.72.0.0/24", "fd72::/64"],
            dir.path(),
            backend,
        );
        let net_b = tests::firewall_state::same_bridge_conflist(
            "rcnetb",
            "rcbrb",
            &["10.73.0.0/24"],
            dir.path(),
            backend,
        );
        let ctr_b = TestNetns::new("rcctrb").unwrap();
        let mut ctr_dead = TestNetns::new("rcdead").unwrap();
        let attach_a = RuntimeConf::new("rc-a", topo.container.path(), "eth0");
        let attach_b = RuntimeConf::new("rc-b", ctr_b.path(), "eth0");
        let attach_dead = RuntimeConf::new("rc-dead", ctr_dead.path(), "eth0");
        let result_a = rt.add(&net_a, &attach_a).unwrap();
        let result_b = rt.add(&net_b, &attach_b).unwrap();
        let result_dead = rt.add(&net_a, &attach_dead).unwrap();
        let dead_ip = tests::result::ipv4(&result_dead).unwrap();
        let b = SocketAddr::new(tests::result::ipv4(&result_b).unwrap(), 8080);
        let _server_b = TcpServer::banner(&ctr_b, b, "hello").unwrap();
        let client = SocketAddr::new(CLIENT_V4.parse().unwrap(), 8081);
        let _server_client = TcpServer::banner(&topo.client, client, "hello").unwrap();
        let intact = |why: &str| {
            assert!(
                answers(&topo.container, client, b"hello", OPEN),
                "{why}: the container's traffic out is not forwarded"
            );
            assert!(
                !answers(&topo.container, b, b"hello", BLOCKED),
                "{why}: the isolation of the bridges is gone"
            );
        };
        intact("after ADD");
        let added = filter_table(&topo.host, tools);
        let ruleset = |ns: &TestNetns| ns.exec_ok("nft", &["-a", "list", "ruleset"]).unwrap();
        // Nothing is missing, nobody is gone: nothing changes.
        let quiet = reconcile(&rt);
        assert!(changes(&quiet).is_empty(), "{quiet}");
        assert!(
            quiet.contains("nothing missing; 3 attachment(s) in place"),
            "{quiet}"
        );
        // The dead attachment's namespace goes.
        ctr_dead.delete().unwrap();
        wait_destroyed(&topo.host, "rcneta:rc-dead:eth0");
        let mut first = true;
        for what in disruptions {
            disrupt(&topo.host, tools, *what, &older);
            let broken = !answers(&topo.container, client, b"hello", BLOCKED)
                || answers(&topo.container, b, b"hello", OPEN);
            assert!(broken, "{what:?} changed nothing that traffic shows");
            if iptables && *what == Disruption::FlushRuleset {
                // The node's own firewall comes back by its own means; ours by reconcile.
                for family in ["iptables", "ip6tables"] {
                    topo.host
                        .exec_ok(&tools.tool(family, ""), &["-P", "FORWARD", "DROP"])
                        .unwrap();
                }
            }
            assert!(
                rt.check(&net_a, &attach_a).is_err(),
                "{what:?}: CHECK passed"
            );
            let stdout = reconcile(&rt);
            let changed = changes(&stdout);
            assert!(
                changed
                    .iter()
                    .any(|l| l.starts_with(&format!("restored rcneta/rc-a/eth0 ({backend})")))
                    && changed
                        .iter()
                        .any(|l| l.starts_with(&format!("restored rcnetb/rc-b/eth0 ({backend})"))),
                "{what:?}: {stdout}"
            );
            assert!(
                !changed
                    .iter()
                    .any(|l| l.contains("restored rcneta/rc-dead/")),
                "{what:?}: the dead attachment came back: {stdout}"
            );
            if first {
                assert!(
                    changed
                        .iter()
                        .any(|l| l.starts_with(&format!("removed rcneta/rc-dead/eth0 ({backend})"))),
                    "{what:?}: {stdout}"
                );
                first = false;
            }
            assert_eq!(
                records(&topo.host),
                ["rcneta:rc-a:eth0", "rcnetb:rc-b:eth0"]
            );
            intact(&format!("after {what:?} and reconcile"));
            rt.check(&net_a, &attach_a).unwrap();
            rt.check(&net_b, &attach_b).unwrap();
            if iptables {
                // What the ADDs made, but the dead one's accepts, each once.
                let dead: Vec<String> = result_dead["ips"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|ip| {
                        let cidr = ip["address"].as_str().unwrap();
                        format!(" {}/", cidr.split('/').next().unwrap())
                    })
                    .collect();
                let want: Vec<String> = added
                    .iter()
                    .filter(|l| !dead.iter().any(|d| l.contains(d.as_str())))
                    .cloned()
                    .collect();
                assert_eq!(filter_table(&topo.host, tools), want, "{what:?}");
            } else {
                let set = ("inet", "cni_firewall", "containers4");
                assert!(
                    nft_has_element(
                        &topo.host,
                        set,
                        &tests::result::ipv4(&result_a).unwrap().to_string()
                    )
                    .unwrap()
                );
                assert!(nft_has_element(&topo.host, set, &b.ip().to_string()).unwrap());
                assert!(!nft_has_element(&topo.host, set, &dead_ip.to_string()).unwrap());
            }
            // Again: nothing missing, nothing written.
            let (nft_before, ipt_before) = (ruleset(&topo.host), filter_table(&topo.host, tools));
            let again = reconcile(&rt);
            assert!(changes(&again).is_empty(), "{what:?}, again: {again}");
            assert!(
                again.contains("nothing missing; 2 attachment(s) in place"),
                "{again}"
            );
            assert_eq!(
                ruleset(&topo.host),
                nft_before,
                "{what:?}: a second reconcile wrote"
            );
            assert_eq!(filter_table(&topo.host, tools), ipt_before);
        }
        // DEL of each leaves nothing of ours but the shared skeleton.
        rt.del(&net_a, &attach_a).unwrap();
        rt.del(&net_b, &attach_b).unwrap();
        rt.del(&net_a, &attach_dead).unwrap();
        // A DEL of the firewall alone, with prevResult, of the removed one: nothing to do.
        let netns = topo.host.path().to_string_lossy().into_owned();
        let path = rt.cni_path().to_string_lossy().into_owned();
        ok(
            &rt.exec_plugin(
                "firewall",
                Some("DEL"),
                &[
                    ("CNI_CONTAINERID", "rc-dead"),
                    ("CNI_NETNS", &netns),
                    ("CNI_IFNAME", "eth0"),
                    ("CNI_PATH", &path),
                    ("CNI_NETNS_OVERRIDE", "1"),
                ],
                firewall_conf(&net_a, &result_dead).to_string().as_bytes(),
            )
            .unwrap(),
            "DEL of the removed attachment",
        );
        assert!(records(&topo.host).is_empty(), "{:?}", records(&topo.host));
        let shared = [
            ":CNI-FORWARD -",
            ":CNI-ADMIN -",
            ":CNI-ISOLATION-STAGE-1 -",
            ":CNI-ISOLATION-STAGE-2 -",
            "-A FORWARD -m comment",
            "-A CNI-FORWARD -m comment",
            "-A CNI-ISOLATION-STAGE-",
        ];
        let left: Vec<String> = filter_table(&topo.host, tools)
            .into_iter()
            .filter(|l| {
                !shared
                    .iter()
                    .any(|s| l.split_once(' ').is_some_and(|(_, r)| r.starts_with(s)))
            })
            .collect();
        assert_eq!(left, before, "DEL left more than the shared skeleton");
        if !iptables {
            let table = topo
                .host
                .exec_ok("nft", &["list", "table", "inet", "cni_firewall"])
                .unwrap();
            assert!(
                !table.contains("rcnet") && !table.contains("elements"),
                "{table}"
            );
        }
    }

    #[test]
    fn iptables_with_nft_tools_comes_back_after_a_flush_an_older_save_and_a_ruleset_flush() {
        comes_back(
            "iptables",
            Tools::Nft,
            &[
                Disruption::FlushFilter,
                Disruption::RestoreOlder,
                Disruption::FlushRuleset,
            ],
        );
    }

    #[test]
    fn iptables_with_legacy_tools_comes_back_after_a_flush_and_an_older_save() {
        comes_back(
            "iptables",
            Tools::Legacy,
            &[Disruption::FlushFilter, Disruption::RestoreOlder],
        );
    }

    #[test]
    fn nftables_comes_back_after_a_ruleset_flush() {
        comes_back("nftables", Tools::Nft, &[Disruption::FlushRuleset]);
    }

    /// A hundred attachments of `plugin` named `<prefix>-<i>` in network `prefix` (`conf`
    /// gives attachment i's config for the container namespace's path), then `disruption`:
    /// one reconcile restores them all, CHECK passes for each, a second reconcile changes
    /// nothing, DEL leaves no record.
    fn a_hundred(
        plugin: &str,
        prefix: &str,
        backend: &str,
        disruption: Disruption,
        conf: &dyn Fn(&str, usize) -> Value,
        records: fn(&TestNetns) -> Vec<String>,
    ) {
        let host = TestNetns::new(&format!("{prefix}{}", &backend[..2])).unwrap();
        let ctr = TestNetns::new(&format!("{prefix}c")).unwrap();
        let rt = Runtime::new(&host).unwrap();
        let netns = ctr.path().to_string_lossy().into_owned();
        let call = |command: &str, i: usize| {
            let id = format!("{prefix}-{i}");
            rt.exec_attachment(plugin, command, &id, &netns, &conf(&netns, i))
                .unwrap()
        };
        for i in 0..100 {
            ok(&call("ADD", i), "ADD");
        }
        disrupt(&host, Tools::Nft, disruption, &[]);
        let stdout = reconcile_of(&rt, plugin);
        let restored = changes(&stdout)
            .iter()
            .filter(|l| l.starts_with(&format!("restored {prefix}/")))
            .count();
        assert_eq!(restored, 100, "{stdout}");
        assert!(stdout.contains("100 attachment(s) restored"), "{stdout}");
        for i in 0..100 {
            ok(&call("CHECK", i), &format!("CHECK {i}"));
        }
        let again = reconcile_of(&rt, plugin);
        assert!(changes(&again).is_empty(), "{again}");
        for i in 0..100 {
            ok(&call("DEL", i), "DEL");
        }
        assert!(records(&host).is_empty());
    }

    /// The firewall's hundred, each with one address of 10.74.0.0/16.
    fn firewall_a_hundred(backend: &str, disruption: Disruption) {
        let conf = |netns: &str, i: usize| {
            json!({
                "cniVersion": "1.0.0", "name": "rc100", "type": "firewall", "backend": backend,
                "prevResult": synthetic_prev(netns, "veth1", &format!("10.74.{}.{}/16", i / 200, i % 200 + 2)),
            })
        };
        a_hundred("firewall", "rc100", backend, disruption, &conf, records);
    }

    #[test]
    fn a_hundred_iptables_attachments_come_back_in_one_reconcile() {
        firewall_a_hundred("iptables", Disruption::FlushFilter);
    }

    #[test]
    fn a_hundred_nftables_attachments_come_back_in_one_reconcile() {
        firewall_a_hundred("nftables", Disruption::FlushRuleset);
    }

    /// The command line: `--help` lists the command, a wrong one is a usage error (2), and
    /// reconcile in a namespace where nothing was ever added succeeds quietly.
    #[test]
    fn the_command_line_describes_reconcile_and_refuses_what_it_does_not_take() {
        let host = TestNetns::new("rccli").unwrap();
        let rt = Runtime::new(&host).unwrap();
        let help = rt.operate("firewall", &["--help"], &[]).unwrap();
        ok(&help, "--help");
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(
            text.contains("reconcile") && text.contains("CNI_COMMAND"),
            "{text}"
        );
        let help = rt
            .operate("firewall", &["reconcile", "--help"], &[])
            .unwrap();
        ok(&help, "reconcile --help");
        assert!(
            String::from_utf8_lossy(&help.stdout).starts_with("Usage: firewall reconcile"),
            "{help:?}"
        );
        for args in [&["reconsile"][..], &["reconcile", "--now"]] {
            let out = rt.operate("firewall", args, &[]).unwrap();
            assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
            assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
        }
        let stdout = reconcile(&rt);
        assert_eq!(
            stdout,
            "reconcile: nothing missing; 0 attachment(s) in place\n"
        );
        // Not even a lock file is made where nothing is recorded.
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(host.path()).unwrap());
        let dir = PathBuf::from(format!("/run/cni-firewall/{ino}"));
        assert!(!dir.exists(), "{} made", dir.display());
        // A runtime's call is unchanged: no arguments, CNI_COMMAND set.
        let version = rt
            .exec_plugin(
                "firewall",
                Some("VERSION"),
                &[],
                b"{\"cniVersion\":\"1.1.0\"}",
            )
            .unwrap();
        ok(&version, "VERSION");
        assert_eq!(
            String::from_utf8_lossy(&version.stdout),
            "{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\",\"1.1.0\"]}\n"
        );
    }

    // portmap reconcile.

    fn portmap_records(host: &TestNetns) -> Vec<String> {
        tests::portmap_state::records(host).unwrap()
    }

    fn portmap_index(host: &TestNetns) -> Vec<String> {
        tests::portmap_state::index(host).unwrap()
    }

    fn portmap_dir(host: &TestNetns) -> PathBuf {
        tests::portmap_state::dir(host).unwrap()
    }

    fn wait_portmap_destroyed(host: &TestNetns, id: &str) {
        tests::portmap_state::wait_destroyed(host, id).unwrap();
    }

    /// What of portmap's `ns` shows: `nft list ruleset` and both families' `nat` tables as
    /// the case's tools save them, without counters (a packet of the host's own, a neighbour
    /// solicitation, may pass a rule between two reads).
    fn portmap_tables(ns: &TestNetns, tools: Tools) -> String {
        let mut text = String::new();
        for l in ns.exec_ok("nft", &["list", "ruleset"]).unwrap().lines() {
            let l = match l.find("counter packets ") {
                Some(i) => {
                    let rest = &l[i + "counter packets ".len()..];
                    let after = rest
                        .split_once(" bytes ")
                        .and_then(|(_, b)| b.split_once(' ').map(|(_, r)| r))
                        .unwrap_or("");
                    format!("{}counter {after}", &l[..i])
                }
                None => l.to_owned(),
            };
            text.push_str(&l);
            text.push('\n');
        }
        for family in ["iptables", "ip6tables"] {
            let save = ns
                .exec_ok(&tools.tool(family, "-save"), &["-t", "nat"])
                .unwrap();
            for l in save.lines().filter(|l| !l.starts_with('#')) {
                let l = match l.find(" [") {
                    Some(i) if l.starts_with(':') => &l[..i],
                    _ => l,
                };
                text.push_str(l);
                text.push('\n');
            }
        }
        text
    }

    fn portmap_conflist(dir: &std::path::Path, backend: &str) -> NetworkConfigList {
        NetworkConfigList::new(
            "rpnet",
            "1.0.0",
            vec![
                main_plugin::bridge("rpbr0", &["10.76.0.0/24"], dir),
                json!({ "type": "portmap", "backend": backend,
                        "capabilities": {"portMappings": true} }),
            ],
        )
    }

    fn mapping(host_port: u16) -> Value {
        json!([{ "hostPort": host_port, "containerPort": 80, "protocol": "tcp" }])
    }

    /// A live container mapping host port 8080 and one mapping 8081 whose namespace is
    /// deleted after its ADD, with traffic from the client through the host's address; each
    /// of `disruptions` in turn breaks the mapping, one `portmap reconcile` brings it back
    /// (not the dead one, whose record and index entries go), CHECK passes, a second
    /// reconcile writes nothing; then DEL leaves nothing behind.
    fn portmap_comes_back(backend: &str, tools: Tools, disruptions: &[Disruption]) {
        let topo = Topology::new(&format!(
            "rp{}{}",
            &backend[..2],
            &format!("{tools:?}")[..1]
        ))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let legacy_bin = tests::bins::legacy_iptables_tools().unwrap();
        let mut rt = Runtime::new(&topo.host).unwrap();
        if tools == Tools::Legacy {
            let path = std::env::join_paths(
                std::iter::once(legacy_bin.path().to_path_buf())
                    .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
            )
            .unwrap();
            rt = rt.with_env("PATH", &path.to_string_lossy());
        }
        let older: Vec<(String, String)> = ["iptables", "ip6tables"]
            .into_iter()
            .map(|family| {
                let save = topo
                    .host
                    .exec_ok(&tools.tool(family, "-save"), &["-t", "nat"])
                    .unwrap();
                (family.to_owned(), save)
            })
            .collect();
        let net = portmap_conflist(dir.path(), backend);
        let mut ctr_dead = TestNetns::new("rpdead").unwrap();
        let attach = RuntimeConf::new("rp-a", topo.container.path(), "eth0")
            .with_capability("portMappings", mapping(8080));
        let attach_dead = RuntimeConf::new("rp-dead", ctr_dead.path(), "eth0")
            .with_capability("portMappings", mapping(8081));
        let result = rt.add(&net, &attach).unwrap();
        rt.add(&net, &attach_dead).unwrap();
        let ctr = SocketAddr::new(tests::result::ipv4(&result).unwrap(), 80);
        let _server = TcpServer::banner(&topo.container, ctr, "hello").unwrap();
        let host_port: SocketAddr = SocketAddr::new(HOST_UPLINK_V4.parse().unwrap(), 8080);
        let forwards = |wait| answers(&topo.client, host_port, b"hello", wait);
        assert!(forwards(OPEN), "no forwarding after ADD");
        let quiet = reconcile_of(&rt, "portmap");
        assert!(changes(&quiet).is_empty(), "{quiet}");
        assert!(
            quiet.contains("nothing missing; 2 attachment(s) in place"),
            "{quiet}"
        );
        let index_before = portmap_index(&topo.host);
        ctr_dead.delete().unwrap();
        wait_portmap_destroyed(&topo.host, "rp-dead");
        let mut first = true;
        for what in disruptions {
            disrupt(&topo.host, tools, *what, &older);
            assert!(!forwards(BLOCKED), "{what:?} left the mapping in place");
            assert!(rt.check(&net, &attach).is_err(), "{what:?}: CHECK passed");
            let stdout = reconcile_of(&rt, "portmap");
            let changed = changes(&stdout);
            assert!(
                changed
                    .iter()
                    .any(|l| l.starts_with(&format!("restored rpnet/rp-a/eth0 ({backend})"))),
                "{what:?}: {stdout}"
            );
            assert!(
                !changed
                    .iter()
                    .any(|l| l.contains("restored rpnet/rp-dead/")),
                "{what:?}: the dead attachment came back: {stdout}"
            );
            if first {
                assert!(
                    changed
                        .iter()
                        .any(|l| l.starts_with(&format!("removed rpnet/rp-dead/eth0 ({backend})"))),
                    "{what:?}: {stdout}"
                );
                first = false;
            }
            let records = portmap_records(&topo.host);
            assert_eq!(records.len(), 1, "{records:?}");
            assert!(records[0].contains("rp-a"), "{records:?}");
            if backend == "iptables" {
                // The dead one's entry went, the live one's stayed.
                let index = portmap_index(&topo.host);
                assert_eq!(index.len(), 1, "{index_before:?} became {index:?}");
                assert!(index[0].contains("-8080"), "{index:?}");
            }
            assert!(forwards(OPEN), "{what:?}: no forwarding after reconcile");
            rt.check(&net, &attach).unwrap();
            let tables = portmap_tables(&topo.host, tools);
            assert!(
                !tables.contains("8081"),
                "the dead mapping is back: {tables}"
            );
            let again = reconcile_of(&rt, "portmap");
            assert!(changes(&again).is_empty(), "{what:?}, again: {again}");
            assert!(
                again.contains("nothing missing; 1 attachment(s) in place"),
                "{again}"
            );
            assert_eq!(
                portmap_tables(&topo.host, tools),
                tables,
                "{what:?}: a second reconcile wrote"
            );
        }
        rt.del(&net, &attach).unwrap();
        rt.del(&net, &attach_dead).unwrap();
        assert!(!forwards(BLOCKED), "forwarding after DEL");
        let tables = portmap_tables(&topo.host, tools);
        assert!(
            !tables.contains("CNI-DN-") && !tables.contains("rpnet/"),
            "DEL left: {tables}"
        );
        assert!(
            !portmap_dir(&topo.host).exists(),
            "{:?}",
            portmap_records(&topo.host)
        );
    }

    #[test]
    fn portmap_iptables_with_nft_tools_comes_back_after_a_nat_flush_an_older_save_and_a_ruleset_flush()
     {
        portmap_comes_back(
            "iptables",
            Tools::Nft,
            &[
                Disruption::FlushNat,
                Disruption::RestoreOlder,
                Disruption::FlushRuleset,
            ],
        );
    }

    #[test]
    fn portmap_iptables_with_legacy_tools_comes_back_after_a_nat_flush_and_an_older_save() {
        portmap_comes_back(
            "iptables",
            Tools::Legacy,
            &[Disruption::FlushNat, Disruption::RestoreOlder],
        );
    }

    #[test]
    fn portmap_nftables_comes_back_after_a_ruleset_flush() {
        portmap_comes_back("nftables", Tools::Nft, &[Disruption::FlushRuleset]);
    }

    /// `portmap reconcile --watch` started after the ADD brings the mapping back by itself
    /// after `nft flush ruleset` (which takes the iptables-nft tables too), and CHECK passes.
    fn portmap_watched(backend: &str) {
        let topo = Topology::new(&format!("rw{}", &backend[..2])).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::new(&topo.host).unwrap();
        let net = portmap_conflist(dir.path(), backend);
        let attach = RuntimeConf::new("rw-a", topo.container.path(), "eth0")
            .with_capability("portMappings", mapping(8080));
        let result = rt.add(&net, &attach).unwrap();
        let ctr = SocketAddr::new(tests::result::ipv4(&result).unwrap(), 80);
        let _server = TcpServer::banner(&topo.container, ctr, "hello").unwrap();
        let host_port = SocketAddr::new(HOST_UPLINK_V4.parse().unwrap(), 8080);
        assert!(
            answers(&topo.client, host_port, b"hello", OPEN),
            "after ADD"
        );
        let mut watcher =
            tests::watcher::Watcher::start(&rt, "portmap", &[], Duration::from_secs(10)).unwrap();
        topo.host.exec_ok("nft", &["flush", "ruleset"]).unwrap();
        let repair = watcher
            .wait_for_reconcile(2, Duration::from_secs(10))
            .unwrap();
        assert!(
            repair.contains(&format!("restored rpnet/rw-a/eth0 ({backend})")),
            "{repair}"
        );
        assert!(
            answers(&topo.client, host_port, b"hello", OPEN),
            "after the watcher"
        );
        rt.check(&net, &attach).unwrap();
        let (status, log) = watcher.stop(Duration::from_secs(5)).unwrap();
        assert!(status.success(), "{status}: {log}");
        rt.del(&net, &attach).unwrap();
        assert!(!portmap_dir(&topo.host).exists());
    }

    #[test]
    fn portmap_s_watcher_brings_the_iptables_layout_back_after_a_ruleset_flush() {
        portmap_watched("iptables");
    }

    #[test]
    fn portmap_s_watcher_brings_the_nftables_layout_back_after_a_ruleset_flush() {
        portmap_watched("nftables");
    }

    /// portmap's hundred, attachment i mapping host port 20000 + i.
    fn portmap_a_hundred(backend: &str, disruption: Disruption) {
        let conf = |netns: &str, i: usize| {
            json!({
                "cniVersion": "1.0.0", "name": "rp100", "type": "portmap", "backend": backend,
                "runtimeConfig": { "portMappings": mapping(20_000 + u16::try_from(i).unwrap()) },
                "prevResult": synthetic_prev(netns, "eth0", &format!("10.77.{}.{}/16", i / 200, i % 200 + 2)),
            })
        };
        a_hundred(
            "portmap",
            "rp100",
            backend,
            disruption,
            &conf,
            portmap_records,
        );
    }

    #[test]
    fn a_hundred_portmap_iptables_attachments_come_back_in_one_reconcile() {
        portmap_a_hundred("iptables", Disruption::FlushNat);
    }

    #[test]
    fn a_hundred_portmap_nftables_attachments_come_back_in_one_reconcile() {
        portmap_a_hundred("nftables", Disruption::FlushRuleset);
    }

    /// `portmap --help` lists reconcile; in a namespace where nothing was ever added it
    /// succeeds quietly, without making the state directory.
    #[test]
    fn portmap_s_command_line_describes_reconcile() {
        let host = TestNetns::new("rpcli").unwrap();
        let rt = Runtime::new(&host).unwrap();
        let help = rt.operate("portmap", &["--help"], &[]).unwrap();
        ok(&help, "--help");
        assert!(String::from_utf8_lossy(&help.stdout).contains("reconcile"));
        let help = rt
            .operate("portmap", &["reconcile", "--help"], &[])
            .unwrap();
        ok(&help, "reconcile --help");
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(
            text.starts_with("Usage: portmap reconcile") && text.contains("CNI-HOSTPORT-DNAT"),
            "{text}"
        );
        let out = rt.operate("portmap", &["reconcile", "--now"], &[]).unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert_eq!(
            reconcile_of(&rt, "portmap"),
            "reconcile: nothing missing; 0 attachment(s) in place\n"
        );
        assert!(!portmap_dir(&host).exists());
    }
}
