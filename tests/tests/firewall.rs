//! `firewall` end to end: Debian's Go `bridge` + `host-local`, then our `firewall`, with real
//! TCP between the client namespace of a [`Topology`] and the container, for the iptables and
//! nftables backends; bridge isolation between two bridges; GC; and the differential tests
//! against Debian's Go `firewall` (iptables layout, Go ADD → our CHECK/DEL and the reverse).

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

// Helpers unwrap like tests do: the whole file is test code.
#[cfg(test)]
mod e2e {

    use std::net::SocketAddr;
    use std::time::Duration;

    use anyhow::{Context, Result, ensure};
    use serde_json::{Value, json};
    use tests::netns::CLIENT_V4;
    use tests::traffic::{TcpServer, answers};
    use tests::{
        NetworkConfigList, PluginOutput, Runtime, RuntimeConf, TestNetns, Topology, main_plugin,
        nft_has_element,
    };

    /// How long a connection that must succeed may take.
    const OPEN: Duration = Duration::from_secs(3);
    /// How long to wait before calling a flow blocked (dropped packets never answer).
    const BLOCKED: Duration = Duration::from_millis(700);

    fn can_connect(from: &TestNetns, to: SocketAddr) -> bool {
        answers(from, to, b"hello", BLOCKED)
    }

    fn assert_open(from: &TestNetns, to: SocketAddr, why: &str) {
        assert!(
            answers(from, to, b"hello", OPEN),
            "{why}: {} → {to} should connect",
            from.name()
        );
    }

    fn assert_blocked(from: &TestNetns, to: SocketAddr, why: &str) {
        assert!(
            !can_connect(from, to),
            "{why}: {} → {to} should be blocked",
            from.name()
        );
    }

    /// `iptables-save -t filter` of `ns` without comments and counters, one line per entry.
    fn filter_table(ns: &TestNetns, tool: &str) -> Vec<String> {
        ns.exec_ok(tool, &["-t", "filter"])
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| match l.find(" [") {
                Some(i) if l.starts_with(':') => l[..i].to_owned(),
                _ => l.to_owned(),
            })
            .collect()
    }

    /// The shared iptables skeleton that DEL leaves in place.
    fn is_skeleton(line: &str) -> bool {
        [
        ":CNI-FORWARD -",
        ":CNI-ADMIN -",
        r#"-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD"#,
        r#"-A CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN"#,
    ]
    .contains(&line)
    }

    fn conflist(
        network: &str,
        bridge: &str,
        subnets: &[&str],
        dir: &std::path::Path,
        fw: Value,
    ) -> NetworkConfigList {
        let mut firewall = fw;
        firewall["type"] = json!("firewall");
        NetworkConfigList::new(
            network,
            "1.0.0",
            vec![main_plugin::bridge(bridge, subnets, dir), firewall],
        )
    }

    /// The firewall's own config for a direct exec: the list's last plugin with the envelope and
    /// `prevResult`.
    fn firewall_conf(list: &NetworkConfigList, prev: Option<&Value>) -> Value {
        let mut conf = list.to_value()["plugins"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        conf["cniVersion"] = json!(list.cni_version);
        conf["name"] = json!(list.name);
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        conf
    }

    /// Runs the firewall plugin (`plugin` is `firewall` or a path) once.
    fn exec(
        rt: &Runtime,
        plugin: &str,
        command: &str,
        cid: &str,
        netns: &str,
        conf: &Value,
    ) -> PluginOutput {
        exec_env(rt, plugin, command, (cid, netns), conf, &[])
    }

    /// [`exec`] with more environment, e.g. a `PATH`.
    fn exec_env(
        rt: &Runtime,
        plugin: &str,
        command: &str,
        (cid, netns): (&str, &str),
        conf: &Value,
        more: &[(&str, &str)],
    ) -> PluginOutput {
        let path = rt.cni_path().to_string_lossy().into_owned();
        let mut env = vec![
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", &path),
            // Direct execs use the host namespace itself as CNI_NETNS.
            ("CNI_NETNS_OVERRIDE", "1"),
        ];
        env.extend_from_slice(more);
        rt.exec_plugin(plugin, Some(command), &env, conf.to_string().as_bytes())
            .unwrap()
    }

    fn ok(out: &PluginOutput, what: &str) {
        assert!(
            out.status.success(),
            "{what}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Forwarding through the host with its iptables FORWARD policy DROP, for one backend.
    fn forward_policy_drop(backend: &str) {
        let topo = Topology::new(&format!("fw{}", &backend[..3])).unwrap();
        let dir = tempfile::tempdir().unwrap();
        topo.host
            .exec_ok("iptables", &["-P", "FORWARD", "DROP"])
            .unwrap();
        let before = filter_table(&topo.host, "iptables-save");
        let rt = Runtime::new(&topo.host).unwrap();
        let list = conflist(
            "fwnet",
            "fwbr0",
            &["10.61.0.0/24", "fd61::/64"],
            dir.path(),
            json!({ "backend": backend }),
        );
        let cid = format!("fw-e2e-{backend}");
        let attach = RuntimeConf::new(&cid, topo.container.path(), "eth0");
        let result = rt.add(&list, &attach).unwrap();
        let ctr = SocketAddr::new(tests::result::ipv4(&result).unwrap(), 8080);
        let _server =
            TcpServer::banner(&topo.container, SocketAddr::new(ctr.ip(), 8080), "hello").unwrap();
        let client = SocketAddr::new(CLIENT_V4.parse().unwrap(), 8081);
        let _client_server = TcpServer::banner(&topo.client, client, "hello").unwrap();
        rt.check(&list, &attach).unwrap();
        let netns = topo.container.path().to_string_lossy().into_owned();

        if backend == "iptables" {
            // The reference's semantics: the container may open connections (and gets the
            // replies); connections into it are not opened (that is portmap's job).
            assert_open(&topo.container, client, "after ADD");
            assert_blocked(&topo.client, ctr, "a new inbound connection");
            // The firewall's DEL alone: the flow stops, CHECK notices.
            let conf = firewall_conf(&list, Some(&result));
            ok(&exec(&rt, "firewall", "DEL", &cid, &netns, &conf), "DEL");
            assert_blocked(&topo.container, client, "after the firewall's DEL");
            assert!(
                rt.check(&list, &attach).is_err(),
                "CHECK must see the rules missing"
            );
            ok(&exec(&rt, "firewall", "ADD", &cid, &netns, &conf), "ADD");
            assert_open(&topo.container, client, "after ADD again");
            rt.check(&list, &attach).unwrap();
            // The admin chain is evaluated before the plugin's accepts.
            topo.host
                .exec_ok(
                    "iptables",
                    &["-A", "CNI-ADMIN", "-d", CLIENT_V4, "-j", "DROP"],
                )
                .unwrap();
            assert_blocked(&topo.container, client, "admin DROP rule");
            topo.host.exec_ok("iptables", &["-F", "CNI-ADMIN"]).unwrap();
            assert_open(&topo.container, client, "admin chain flushed");
        } else {
            // Truthful about coexistence: our accept ends only our table's evaluation; iptables'
            // FORWARD policy DROP (another table on the same hook) still drops (README).
            assert_blocked(
                &topo.container,
                client,
                "nftables accept under an iptables FORWARD DROP",
            );
            // The documented operator action: no dropping policy in another forward table.
            topo.host
                .exec_ok("iptables", &["-P", "FORWARD", "ACCEPT"])
                .unwrap();
            assert_open(&topo.container, client, "after ADD");
            let conf = firewall_conf(&list, Some(&result));
            ok(&exec(&rt, "firewall", "DEL", &cid, &netns, &conf), "DEL");
            assert!(
                rt.check(&list, &attach).is_err(),
                "CHECK must see the rules missing"
            );
            ok(&exec(&rt, "firewall", "ADD", &cid, &netns, &conf), "ADD");
            rt.check(&list, &attach).unwrap();
            // The admin chain is evaluated before everything else of ours, and a drop is final.
            topo.host
                .exec_ok(
                    "nft",
                    &[
                        "add",
                        "rule",
                        "inet",
                        "cni_firewall",
                        "admin",
                        "ip",
                        "daddr",
                        CLIENT_V4,
                        "drop",
                    ],
                )
                .unwrap();
            assert_blocked(&topo.container, client, "admin drop rule");
            topo.host
                .exec_ok("nft", &["flush", "chain", "inet", "cni_firewall", "admin"])
                .unwrap();
            assert_open(&topo.container, client, "admin chain flushed");
            topo.host
                .exec_ok("iptables", &["-P", "FORWARD", "DROP"])
                .unwrap();
        }

        rt.del(&list, &attach).unwrap();
        let after: Vec<String> = filter_table(&topo.host, "iptables-save")
            .into_iter()
            .filter(|l| !is_skeleton(l))
            .collect();
        assert_eq!(
            after, before,
            "DEL leaves the filter table as before ADD, but the skeleton"
        );
        if backend == "nftables" {
            let table = topo
                .host
                .exec_ok("nft", &["list", "table", "inet", "cni_firewall"])
                .unwrap();
            // Only the shared skeleton stays: both sets, empty, and their four accepts.
            assert!(
                !table.contains("fwnet/") && !table.contains("elements"),
                "{table}"
            );
            assert!(
                table.contains("ip saddr @containers4 accept")
                    && table.contains("ip6 daddr @containers6 ct state established,related accept"),
                "{table}"
            );
        }
        // DEL again, without prevResult and with the netns gone: nothing left, still success.
        let conf = firewall_conf(&list, None);
        ok(
            &exec(
                &rt,
                "firewall",
                "DEL",
                &cid,
                "/run/netns/gone-for-good",
                &conf,
            ),
            "DEL again",
        );
    }

    #[test]
    fn iptables_backend_opens_forwarding_only_while_its_rules_are_in_place() {
        forward_policy_drop("iptables");
    }

    #[test]
    fn nftables_backend_accepts_admin_drops_win_and_del_restores() {
        forward_policy_drop("nftables");
    }

    /// Two bridges (`a` with two containers, `b` with one), both networks with `policy`.
    fn isolation(backend: &str, policy: &str) {
        let host = TestNetns::new(&format!("fwi{}{}", &backend[..1], &policy[..2])).unwrap();
        host.set_sysctl("net.ipv4.ip_forward", "1").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::new(&host).unwrap();
        let fw = json!({ "backend": backend, "ingressPolicy": policy });
        let net_a = conflist("fwneta", "fwbra", &["10.62.0.0/24"], dir.path(), fw.clone());
        let net_b = conflist("fwnetb", "fwbrb", &["10.63.0.0/24"], dir.path(), fw);
        let ctrs: Vec<TestNetns> = (0..3)
            .map(|i| TestNetns::new(&format!("fwc{i}")).unwrap())
            .collect();
        let mut addrs = Vec::new();
        let mut servers = Vec::new();
        for (i, (ctr, net)) in ctrs.iter().zip([&net_a, &net_a, &net_b]).enumerate() {
            let attach = RuntimeConf::new(&format!("fw-iso-{i}"), ctr.path(), "eth0");
            let result = rt.add(net, &attach).unwrap();
            let addr = SocketAddr::new(tests::result::ipv4(&result).unwrap(), 8080);
            servers.push(TcpServer::banner(ctr, addr, "hello").unwrap());
            addrs.push(addr);
        }
        let same = can_connect(&ctrs[0], addrs[1]);
        let across = can_connect(&ctrs[0], addrs[2]);
        let back = can_connect(&ctrs[2], addrs[0]);
        match policy {
            "open" => assert!(same && across && back, "open: {same} {across} {back}"),
            "same-bridge" => assert!(
                same && !across && !back,
                "same-bridge: {same} {across} {back}"
            ),
            _ => assert!(
                !same && !across && !back,
                "isolated: {same} {across} {back}"
            ),
        }
        for (i, (ctr, net)) in ctrs.iter().zip([&net_a, &net_a, &net_b]).enumerate() {
            rt.del(
                net,
                &RuntimeConf::new(&format!("fw-iso-{i}"), ctr.path(), "eth0"),
            )
            .unwrap();
        }
    }

    #[test]
    fn iptables_open_policy_lets_bridges_talk() {
        isolation("iptables", "open");
    }

    #[test]
    fn iptables_same_bridge_policy_blocks_only_other_bridges() {
        isolation("iptables", "same-bridge");
    }

    #[test]
    fn iptables_isolated_policy_blocks_other_bridges_and_its_own() {
        isolation("iptables", "isolated");
    }

    #[test]
    fn nftables_open_policy_lets_bridges_talk() {
        isolation("nftables", "open");
    }

    #[test]
    fn nftables_same_bridge_policy_blocks_only_other_bridges() {
        isolation("nftables", "same-bridge");
    }

    #[test]
    fn nftables_isolated_policy_blocks_other_bridges_and_its_own() {
        isolation("nftables", "isolated");
    }

    /// A synthetic dual-stack prevResult on bridge `br0`.
    /// A throwaway host namespace, a runtime in it, and the namespace's path (the `CNI_NETNS`
    /// of attachments whose container side does not matter).
    fn host_runtime(prefix: &str) -> Result<(TestNetns, Runtime, String)> {
        let host = TestNetns::new(prefix)?;
        let rt = Runtime::new(&host)?;
        let netns = host.path().to_string_lossy().into_owned();
        Ok((host, rt, netns))
    }

    fn prev_result(v4: &str, v6: &str) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [{ "name": "br0" }, { "name": "veth1", "sandbox": "/x" }],
            "ips": [
                { "address": format!("{v4}/24"), "interface": 1 },
                { "address": format!("{v6}/64"), "interface": 1 },
            ],
        })
    }

    fn direct_conf(backend: &str, policy: &str, prev: Option<Value>) -> Value {
        let mut conf = json!({
            "cniVersion": "1.0.0", "name": "fwdirect", "type": "firewall",
            "backend": backend, "ingressPolicy": policy,
        });
        if let Some(prev) = prev {
            conf["prevResult"] = prev;
        }
        conf
    }

    /// A GC config (CNI 1.1.0) of the direct runs, keeping the attachments `valid`.
    fn gc_conf(backend: &str, valid: Value) -> Value {
        let mut gc = direct_conf(backend, "open", None);
        gc["cniVersion"] = json!("1.1.0");
        gc["cni.dev/valid-attachments"] = valid;
        gc
    }

    /// Our firewall's GC with `gc`.
    fn run_gc(rt: &Runtime, gc: &Value) -> Result<PluginOutput> {
        rt.exec_plugin(
            "firewall",
            Some("GC"),
            &[("CNI_PATH", "/usr/lib/cni")],
            gc.to_string().as_bytes(),
        )
    }

    #[test]
    fn gc_removes_the_objects_of_attachments_that_are_not_valid_in_both_backends() -> Result<()> {
        for backend in ["iptables", "nftables"] {
            let (host, rt, netns) = host_runtime("fwgc")?;
            for (cid, v4, v6) in [
                ("gc-live", "10.64.0.2", "fd64::2"),
                ("gc-stale", "10.64.0.3", "fd64::3"),
            ] {
                ok(
                    &exec(
                        &rt,
                        "firewall",
                        "ADD",
                        cid,
                        &netns,
                        &direct_conf(backend, "open", Some(prev_result(v4, v6))),
                    ),
                    "ADD",
                );
            }
            // Another network's attachment must survive this network's GC.
            let mut other = direct_conf(backend, "open", Some(prev_result("10.64.0.4", "fd64::4")));
            other["name"] = json!("fwother");
            ok(
                &exec(&rt, "firewall", "ADD", "gc-other", &netns, &other),
                "ADD other",
            );
            let gc = gc_conf(
                backend,
                json!([{ "containerID": "gc-live", "ifname": "eth0" }]),
            );
            let out = run_gc(&rt, &gc)?;
            ensure!(
                out.status.success(),
                "GC: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            let state = if backend == "iptables" {
                host.exec_ok("iptables-save", &["-t", "filter"])?
            } else {
                host.exec_ok("nft", &["list", "table", "inet", "cni_firewall"])?
            };
            ensure!(
                state.contains("10.64.0.2") && state.contains("10.64.0.4"),
                "{backend}: {state}"
            );
            ensure!(
                !state.contains("10.64.0.3"),
                "{backend}: stale rules survived GC: {state}"
            );
            // CHECK of the live one still passes; STATUS answers.
            let mut check = direct_conf(backend, "open", Some(prev_result("10.64.0.2", "fd64::2")));
            check["cniVersion"] = json!("1.1.0");
            ok(
                &exec(&rt, "firewall", "CHECK", "gc-live", &netns, &check),
                "CHECK",
            );
            let out = rt.exec_plugin(
                "firewall",
                Some("STATUS"),
                &[("CNI_PATH", "/usr/lib/cni")],
                gc.to_string().as_bytes(),
            )?;
            ensure!(
                out.status.success(),
                "STATUS: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Ok(())
    }

    /// nftables GC with 8000 stale attachments (their elements made with `nft -f`, each with
    /// its owner comment, as 8000 ADDs would have left them): one call removes every stale
    /// element and keeps the valid one and another network's (issue 22 #2: their keys once
    /// went into one netlink attribute, whose 16-bit length wrapped past 64 KiB).
    #[test]
    fn nftables_gc_removes_8000_stale_attachments_at_once() -> Result<()> {
        const STALE: usize = 8000;
        let (host, rt, netns) = host_runtime("fwgc8k")?;
        let conf =
            |cid_v4: &str| direct_conf("nftables", "open", Some(prev_result(cid_v4, "fd71::2")));
        ok(
            &exec(
                &rt,
                "firewall",
                "ADD",
                "gc-live",
                &netns,
                &conf("10.71.255.1"),
            ),
            "ADD live",
        );
        let mut other = conf("10.71.255.2");
        other["name"] = json!("fwother");
        other["prevResult"]["ips"][1]["address"] = json!("fd71::3/64");
        ok(
            &exec(&rt, "firewall", "ADD", "gc-other", &netns, &other),
            "ADD other",
        );
        let elements: Vec<String> = (0..STALE)
            .map(|i| {
                format!(
                    "10.71.{}.{} comment \"fwdirect/stale-{i}/eth0\"",
                    i / 250,
                    i % 250 + 1
                )
            })
            .collect();
        let script = tempfile::NamedTempFile::new()?;
        std::fs::write(
            script.path(),
            format!(
                "add element inet cni_firewall containers4 {{ {} }}\n",
                elements.join(", ")
            ),
        )?;
        host.exec_ok("nft", &["-f", &script.path().to_string_lossy()])?;
        let gc = gc_conf(
            "nftables",
            json!([{ "containerID": "gc-live", "ifname": "eth0" }]),
        );
        let out = run_gc(&rt, &gc)?;
        ensure!(
            out.status.success(),
            "GC of {STALE} stale attachments: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        let table = host.exec_ok(
            "nft",
            &["list", "set", "inet", "cni_firewall", "containers4"],
        )?;
        ensure!(!table.contains("stale-"), "stale elements survived GC");
        ensure!(
            table.contains("fwdirect/gc-live/eth0") && table.contains("fwother/gc-other/eth0"),
            "{table}"
        );
        Ok(())
    }

    /// The nftables backend on a kernel without nf_tables, either way one lacks it (no
    /// nfnetlink; nfnetlink without nf_tables, as on a kernel whose `nf_tables.ko` is
    /// removed): ADD and CHECK fail naming it (999) and make nothing, STATUS fails with code 50
    /// naming it, and DEL (with and without prevResult) and GC succeed: such a kernel holds
    /// nothing of ours, and a container whose firewall used nftables can still be deleted.
    #[test]
    fn nftables_without_nf_tables_names_it_and_del_and_gc_succeed() -> Result<()> {
        for lacking in tests::seccomp::Lacking::BOTH {
            let (host, rt, netns) = host_runtime("fwnonft")?;
            let prev = prev_result("10.72.0.2", "fd72::2");
            let with_prev = direct_conf("nftables", "isolated", Some(prev));
            let bare = direct_conf("nftables", "isolated", None);
            let mut status = bare.clone();
            status["cniVersion"] = json!("1.1.0");
            let gc = gc_conf("nftables", json!([]));
            let outs = lacking.run(|| -> Result<Vec<PluginOutput>> {
                Ok(vec![
                    exec(&rt, "firewall", "ADD", "nonft", &netns, &with_prev),
                    exec(&rt, "firewall", "CHECK", "nonft", &netns, &with_prev),
                    rt.exec_plugin(
                        "firewall",
                        Some("STATUS"),
                        &[("CNI_PATH", "/usr/lib/cni")],
                        status.to_string().as_bytes(),
                    )?,
                    exec(&rt, "firewall", "DEL", "nonft", &netns, &with_prev),
                    exec(&rt, "firewall", "DEL", "nonft", &netns, &bare),
                    run_gc(&rt, &gc)?,
                ])
            })??;
            for (out, verb) in outs.iter().zip(["ADD", "CHECK", "STATUS"]) {
                let err = out
                    .error()
                    .with_context(|| format!("{lacking:?}: {verb} succeeded"))?;
                let code = if verb == "STATUS" { 50 } else { 999 };
                ensure!(
                    err.code == code
                        && err.msg.starts_with(
                            "nftables backend is not usable: the kernel has no nf_tables ("
                        ),
                    "{lacking:?}: {verb}: {err:?}"
                );
            }
            for (out, verb) in outs[3..]
                .iter()
                .zip(["DEL", "DEL without prevResult", "GC"])
            {
                ensure!(
                    out.status.success(),
                    "{lacking:?}: {verb}: {} {}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            // Nothing was made (where the kernel really lacks nf_tables, `nft` fails as well).
            let listed = host.exec("nft", &["list", "table", "inet", "cni_firewall"])?;
            ensure!(
                !listed.status.success(),
                "{lacking:?}: {}",
                String::from_utf8_lossy(&listed.stdout)
            );
        }
        Ok(())
    }

    /// Whether `nft get element` finds `addr` in our set of its family.
    fn nft_has(ns: &TestNetns, addr: &str) -> Result<bool> {
        let set = if addr.contains(':') {
            "containers6"
        } else {
            "containers4"
        };
        nft_has_element(ns, ("inet", "cni_firewall", set), addr)
    }

    /// DEL of the nftables backend expires the attachment's elements (the sets have `flags
    /// timeout`) instead of deleting them: when DEL returns they are gone from lookups and
    /// listings (DEL waits out the kernel's tick), CHECK
    /// fails, and an ADD of the same attachment right after puts them back for good (no
    /// timeout on what ADD adds). Our accepts end only our table's evaluation, so traffic
    /// shows nothing here: the elements are what the test reads.
    #[test]
    fn nftables_del_expires_the_elements_and_a_readd_at_once_stays() -> Result<()> {
        let (host, rt, netns) = host_runtime("fwexp")?;
        let conf = direct_conf(
            "nftables",
            "open",
            Some(prev_result("10.72.0.2", "fd72::2")),
        );
        ok(&exec(&rt, "firewall", "ADD", "exp", &netns, &conf), "ADD");
        let table = listing(&host, "nftables")?;
        ensure!(
            table.matches("flags timeout").count() == 2,
            "both sets have flags timeout:\n{table}"
        );
        for round in 0..3 {
            ensure!(nft_has(&host, "10.72.0.2")? && nft_has(&host, "fd72::2")?);
            ok(&exec(&rt, "firewall", "DEL", "exp", &netns, &conf), "DEL");
            ensure!(
                !nft_has(&host, "10.72.0.2")? && !nft_has(&host, "fd72::2")?,
                "elements found after DEL"
            );
            let table = listing(&host, "nftables")?;
            ensure!(
                !table.contains("fwdirect/exp/eth0") && !table.contains("elements"),
                "round {round}: {table}"
            );
            ensure!(
                !exec(&rt, "firewall", "CHECK", "exp", &netns, &conf)
                    .status
                    .success(),
                "round {round}: CHECK passes after DEL"
            );
            ok(
                &exec(&rt, "firewall", "ADD", "exp", &netns, &conf),
                "ADD again",
            );
            ok(
                &exec(&rt, "firewall", "CHECK", "exp", &netns, &conf),
                "CHECK",
            );
            std::thread::sleep(Duration::from_millis(50));
            ok(
                &exec(&rt, "firewall", "CHECK", "exp", &netns, &conf),
                "CHECK later",
            );
            let table = listing(&host, "nftables")?;
            ensure!(!table.contains("expires"), "round {round}: {table}");
        }
        // DEL without prevResult finds the elements by listing, and expires them too.
        let bare = direct_conf("nftables", "open", None);
        ok(
            &exec(&rt, "firewall", "DEL", "exp", &netns, &bare),
            "DEL bare",
        );
        ensure!(
            !nft_has(&host, "10.72.0.2")? && !nft_has(&host, "fd72::2")?,
            "elements found after DEL without prevResult"
        );
        Ok(())
    }

    /// A table an earlier version made, whose sets lack `flags timeout`: ADD keeps using it
    /// (also when its skeleton must be rebuilt), DEL and GC delete the elements instead.
    #[test]
    fn nftables_del_deletes_in_a_table_made_without_timeouts() -> Result<()> {
        let (host, rt, netns) = host_runtime("fwold")?;
        let conf = |cid_v4: &str| {
            direct_conf(
                "nftables",
                "open",
                Some(prev_result(cid_v4, &cid_v4.replace("10.73.0.", "fd73::"))),
            )
        };
        ok(
            &exec(&rt, "firewall", "ADD", "a", &netns, &conf("10.73.0.2")),
            "ADD",
        );
        ok(
            &exec(&rt, "firewall", "DEL", "a", &netns, &conf("10.73.0.2")),
            "DEL",
        );
        ensure!(
            !listing(&host, "nftables")?.contains("elements"),
            "elements left"
        );
        let made = listing(&host, "nftables")?;
        let old: String = made
            .lines()
            .filter(|l| l.trim() != "flags timeout")
            .map(|l| format!("{l}\n"))
            .collect();
        let file = tempfile::NamedTempFile::new()?;
        std::fs::write(file.path(), &old)?;
        host.exec_ok("nft", &["delete", "table", "inet", "cni_firewall"])?;
        host.exec_ok("nft", &["-f", &file.path().to_string_lossy()])?;
        ensure!(!listing(&host, "nftables")?.contains("flags timeout"));

        ok(
            &exec(&rt, "firewall", "ADD", "a", &netns, &conf("10.73.0.2")),
            "ADD a",
        );
        // A skeleton to rebuild: ADD declares the sets again, as they are.
        host.exec_ok(
            "nft",
            &["flush", "chain", "inet", "cni_firewall", "attachments"],
        )?;
        ok(
            &exec(&rt, "firewall", "ADD", "b", &netns, &conf("10.73.0.3")),
            "ADD b",
        );
        ok(
            &exec(&rt, "firewall", "CHECK", "a", &netns, &conf("10.73.0.2")),
            "CHECK a",
        );
        ok(
            &exec(&rt, "firewall", "CHECK", "b", &netns, &conf("10.73.0.3")),
            "CHECK b",
        );
        ok(
            &exec(&rt, "firewall", "DEL", "a", &netns, &conf("10.73.0.2")),
            "DEL a",
        );
        // Deleted: gone at once.
        ensure!(!nft_has(&host, "10.73.0.2")? && !nft_has(&host, "fd73::2")?);
        ensure!(nft_has(&host, "10.73.0.3")? && nft_has(&host, "fd73::3")?);
        let gc = gc_conf("nftables", json!([]));
        let out = run_gc(&rt, &gc)?;
        ensure!(
            out.status.success(),
            "GC: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        ensure!(!nft_has(&host, "10.73.0.3")? && !nft_has(&host, "fd73::3")?);
        let table = listing(&host, "nftables")?;
        ensure!(
            !table.contains("flags timeout") && !table.contains("elements"),
            "{table}"
        );
        Ok(())
    }

    /// `iptables-save` and `ip6tables-save`, or our nft table, of `ns`.
    fn listing(ns: &TestNetns, backend: &str) -> Result<String> {
        Ok(if backend == "iptables" {
            ns.exec_ok("iptables-save", &["-t", "filter"])?
                + &ns.exec_ok("ip6tables-save", &["-t", "filter"])?
        } else {
            ns.exec_ok("nft", &["list", "table", "inet", "cni_firewall"])?
        })
    }

    #[test]
    fn a_reused_address_belongs_to_its_newest_owner_in_both_backends() -> Result<()> {
        for backend in ["iptables", "nftables"] {
            let (host, rt, netns) = host_runtime("fwreuse")?;
            let conf = direct_conf(backend, "open", Some(prev_result("10.68.0.2", "fd68::2")));
            let bare = direct_conf(backend, "open", None);
            ok(
                &exec(&rt, "firewall", "ADD", "old", &netns, &conf),
                "ADD old",
            );
            ok(
                &exec(&rt, "firewall", "ADD", "new", &netns, &conf),
                "ADD new",
            );
            ok(
                &exec(&rt, "firewall", "CHECK", "new", &netns, &conf),
                "CHECK new",
            );
            if backend == "nftables" {
                let table = listing(&host, backend)?;
                ensure!(
                    table.contains("fwdirect/new/eth0") && !table.contains("fwdirect/old/eth0"),
                    "the elements changed owner: {table}"
                );
                ensure!(
                    !exec(&rt, "firewall", "CHECK", "old", &netns, &conf)
                        .status
                        .success(),
                    "CHECK of the older owner must fail: the addresses are not its own"
                );
            }
            // The older owner's late DEL, with and without prevResult, leaves the addresses.
            ok(
                &exec(&rt, "firewall", "DEL", "old", &netns, &conf),
                "DEL old",
            );
            ok(
                &exec(&rt, "firewall", "DEL", "old", &netns, &bare),
                "DEL old, bare",
            );
            ok(
                &exec(&rt, "firewall", "CHECK", "new", &netns, &conf),
                "CHECK new after",
            );
            let rules = listing(&host, backend)?;
            ensure!(
                rules.contains("10.68.0.2") && rules.contains("fd68::2"),
                "{backend}: the newer owner lost its addresses: {rules}"
            );
            ok(
                &exec(&rt, "firewall", "DEL", "new", &netns, &bare),
                "DEL new, bare",
            );
            let rules = listing(&host, backend)?;
            ensure!(
                !rules.contains("10.68.0.2") && !rules.contains("fd68::2"),
                "{backend}: left behind: {rules}"
            );
            // DEL with prevResult when its rules are gone (or half gone) still succeeds and
            // leaves nothing (iptables: the blind deletion fails, the table is read instead).
            ok(
                &exec(&rt, "firewall", "DEL", "new", &netns, &conf),
                "DEL new again",
            );
            ok(
                &exec(&rt, "firewall", "ADD", "half", &netns, &conf),
                "ADD half",
            );
            if backend == "iptables" {
                host.exec_ok(
                    "iptables",
                    &["-D", "CNI-FORWARD", "-s", "10.68.0.2/32", "-j", "ACCEPT"],
                )?;
            } else {
                host.exec_ok(
                    "nft",
                    &[
                        "delete",
                        "element",
                        "inet",
                        "cni_firewall",
                        "containers4",
                        "{ 10.68.0.2 }",
                    ],
                )?;
            }
            ok(
                &exec(&rt, "firewall", "DEL", "half", &netns, &conf),
                "DEL half",
            );
            let rules = listing(&host, backend)?;
            ensure!(
                !rules.contains("10.68.0.2") && !rules.contains("fd68::2"),
                "{backend}: left behind after a half-removed DEL: {rules}"
            );
        }
        Ok(())
    }

    #[test]
    fn bad_config_and_missing_prev_result_are_named_errors() -> Result<()> {
        let (host, rt, netns) = host_runtime("fwbad")?;
        let out = exec(
            &rt,
            "firewall",
            "ADD",
            "bad1",
            &netns,
            &direct_conf("ipfw", "open", Some(prev_result("10.65.0.2", "fd65::2"))),
        );
        let err = out.error().context("no error object")?;
        ensure!(
            err.code == 7 && err.msg.contains("backend") && err.msg.contains("ipfw"),
            "{err:?}"
        );
        let out = exec(
            &rt,
            "firewall",
            "ADD",
            "bad1",
            &netns,
            &direct_conf("iptables", "open", None),
        );
        let err = out.error().context("no error object")?;
        ensure!(err.msg.contains("missing prevResult"), "{err:?}");
        // Nothing was installed by the refused calls.
        ensure!(
            !host
                .exec_ok("iptables-save", &["-t", "filter"])?
                .contains("CNI-FORWARD")
        );
        Ok(())
    }

    /// The same failing calls to Debian's Go firewall and to ours give the same message (the
    /// reference's, word for word): CHECK of a missing jump or accept, ADD and CHECK without
    /// prevResult, an ingress policy without a bridge, an unknown ingress policy. IPv4 only,
    /// as the Go plugin checks its families in a random order.
    #[test]
    fn error_messages_are_the_go_plugins() -> Result<()> {
        let reference = tests::bins::reference_binary("firewall")?
            .to_string_lossy()
            .into_owned();
        let (host, rt, netns) = host_runtime("fwmsg")?;
        let v4_only = json!({
            "cniVersion": "1.0.0",
            "interfaces": [{ "name": "br0" }, { "name": "veth1", "sandbox": "/x" }],
            "ips": [{ "address": "10.69.0.2/24", "interface": 1 }],
        });
        let conf = direct_conf("iptables", "open", Some(v4_only.clone()));
        let both = |verb: &str, conf: &Value, what: &str| -> Result<String> {
            let go = exec(&rt, &reference, verb, "msg", &netns, conf);
            let ours = exec(&rt, "firewall", verb, "msg", &netns, conf);
            let (go, ours) = (
                go.error().with_context(|| format!("Go {what}: no error"))?,
                ours.error()
                    .with_context(|| format!("our {what}: no error"))?,
            );
            ensure!(
                go.msg == ours.msg,
                "{what}: Go says {go:?}, we say {ours:?}"
            );
            Ok(ours.msg)
        };
        ok(
            &exec(&rt, &reference, "ADD", "msg", &netns, &conf),
            "Go ADD",
        );
        let delete = |rule: &str| -> Result<()> {
            let mut args = vec!["-w", "-D"];
            args.extend(rule.split(' '));
            host.exec_ok("iptables", &args)?;
            Ok(())
        };
        delete("CNI-FORWARD -s 10.69.0.2/32 -j ACCEPT")?;
        let said = both("CHECK", &conf, "CHECK without the source accept")?;
        ensure!(
            said == "expected rule [-s 10.69.0.2/32 -j ACCEPT] not found",
            "{said}"
        );
        host.exec_ok(
            "iptables",
            &[
                "-w",
                "-D",
                "FORWARD",
                "-m",
                "comment",
                "--comment",
                "CNI firewall plugin rules",
                "-j",
                "CNI-FORWARD",
            ],
        )?;
        both("CHECK", &conf, "CHECK without the FORWARD jump")?;
        let bare = direct_conf("iptables", "open", None);
        both("ADD", &bare, "ADD without prevResult")?;
        both("CHECK", &bare, "CHECK without prevResult")?;
        let no_interfaces = json!({
            "cniVersion": "1.0.0",
            "ips": [{ "address": "10.69.0.3/24" }],
        });
        let policy = |p: &str, prev: &Value| direct_conf("iptables", p, Some(prev.clone()));
        both(
            "ADD",
            &policy("same-bridge", &no_interfaces),
            "ADD without a bridge",
        )?;
        let mut unnamed = v4_only.clone();
        unnamed["interfaces"][0]["name"] = json!("");
        both(
            "ADD",
            &policy("same-bridge", &unnamed),
            "ADD with an empty bridge name",
        )?;
        both(
            "ADD",
            &policy("closed", &v4_only),
            "ADD with an unknown policy",
        )?;
        // A key of the wrong JSON type: Go's decoder's words.
        let mut typed = direct_conf("iptables", "open", Some(v4_only));
        typed["iptablesAdminChainName"] = json!(5);
        let said = both("ADD", &typed, "ADD with a number for a string")?;
        ensure!(
            said == "failed to load netconf: json: cannot unmarshal number into Go struct field FirewallNetConf.iptablesAdminChainName of type string",
            "{said}"
        );
        Ok(())
    }

    /// DEL reads only the backend, the zone and prevResult: keys this version refuses on ADD
    /// (a config an older version accepted, a typo the Go plugin ignores) and a prevResult that
    /// does not parse do not keep an attachment's objects (issue 22 #7).
    #[test]
    fn del_succeeds_whatever_the_keys_it_does_not_use_say() -> Result<()> {
        for backend in ["iptables", "nftables"] {
            let (host, rt, netns) = host_runtime("fwdellax")?;
            let prev = prev_result("10.69.1.2", "fd69:1::2");
            ok(
                &exec(
                    &rt,
                    "firewall",
                    "ADD",
                    "lax",
                    &netns,
                    &direct_conf(backend, "open", Some(prev.clone())),
                ),
                "ADD",
            );
            let mut del = direct_conf(backend, "bogus-policy", Some(prev));
            del["iptablesAdminChainName"] = json!("a b");
            del["firewalldZone"] = json!("not a zone!");
            del["prevResult"]["ips"][0]["address"] = json!("not an address");
            let out = exec(&rt, "firewall", "DEL", "lax", &netns, &del);
            ok(&out, &format!("{backend} DEL with keys ADD refuses"));
            let left = listing(&host, backend)?;
            ensure!(
                !left.contains("10.69.1.2") && !left.contains("fd69:1::2"),
                "{backend}: DEL left {left}"
            );
            // The same keys still fail an ADD, naming them.
            let mut add = del.clone();
            add["prevResult"] = prev_result("10.69.1.3", "fd69:1::3");
            let err = exec(&rt, "firewall", "ADD", "lax2", &netns, &add)
                .error()
                .context("ADD with bad keys gave no error")?;
            ensure!(err.code == 7, "{err:?}");
        }
        Ok(())
    }

    /// The lines of both filter tables of `ns` that hold `v4` or `v6` (an address, or part).
    fn lines_with(ns: &TestNetns, v4: &str, v6: &str) -> Vec<String> {
        let (v4s, v6s) = both_tables(ns);
        v4s.into_iter()
            .chain(v6s)
            .filter(|l| l.contains(v4) || l.contains(v6))
            .collect()
    }

    /// The filter tables of both families of `ns`.
    fn both_tables(ns: &TestNetns) -> (Vec<String>, Vec<String>) {
        (
            filter_table(ns, "iptables-save"),
            filter_table(ns, "ip6tables-save"),
        )
    }

    #[test]
    fn iptables_layout_matches_the_go_plugin_after_the_same_add() -> Result<()> {
        let go = TestNetns::new("fwdgo")?;
        let ours = TestNetns::new("fwdrs")?;
        let go_rt = Runtime::new(&go)?;
        let our_rt = Runtime::new(&ours)?;
        let reference = tests::bins::reference_binary("firewall")?;
        for (i, (v4, v6)) in [("10.66.0.2", "fd66::2"), ("10.66.0.3", "fd66::3")]
            .into_iter()
            .enumerate()
        {
            let conf = direct_conf("iptables", "same-bridge", Some(prev_result(v4, v6)));
            let cid = format!("diff-{i}");
            ok(
                &exec(
                    &go_rt,
                    &reference.to_string_lossy(),
                    "ADD",
                    &cid,
                    &go.path().to_string_lossy(),
                    &conf,
                ),
                "Go ADD",
            );
            ok(
                &exec(
                    &our_rt,
                    "firewall",
                    "ADD",
                    &cid,
                    &ours.path().to_string_lossy(),
                    &conf,
                ),
                "our ADD",
            );
        }
        let sorted = |mut v: Vec<String>| {
            // Chain declarations may be listed in any order; rules keep theirs.
            let (mut decl, rules): (Vec<String>, Vec<String>) =
                v.drain(..).partition(|l| l.starts_with(':'));
            decl.sort();
            decl.extend(rules);
            decl
        };
        let (go4, go6) = both_tables(&go);
        let (our4, our6) = both_tables(&ours);
        assert_eq!(sorted(our4), sorted(go4));
        assert_eq!(sorted(our6), sorted(go6));
        Ok(())
    }

    #[test]
    fn go_add_then_our_check_and_del_and_the_reverse() -> Result<()> {
        let reference = tests::bins::reference_binary("firewall")?
            .to_string_lossy()
            .into_owned();
        for (first, second) in [
            (reference.as_str(), "firewall"),
            ("firewall", reference.as_str()),
        ] {
            let (host, rt, netns) = host_runtime("fwxdel")?;
            let before = both_tables(&host);
            let conf = direct_conf(
                "iptables",
                "same-bridge",
                Some(prev_result("10.67.0.2", "fd67::2")),
            );
            ok(&exec(&rt, first, "ADD", "xdel", &netns, &conf), "ADD");
            ok(
                &exec(&rt, second, "CHECK", "xdel", &netns, &conf),
                "CHECK by the other",
            );
            ok(
                &exec(&rt, second, "DEL", "xdel", &netns, &conf),
                "DEL by the other",
            );
            let (v4, v6) = both_tables(&host);
            for line in v4.iter().chain(&v6) {
                ensure!(
                    !line.contains("10.67.0.2") && !line.contains("fd67::2"),
                    "left behind: {line}"
                );
            }
            ensure!(v4.len() > before.0.len(), "the shared skeleton stays");
            // CHECK now fails in both implementations.
            for plugin in [first, second] {
                ensure!(
                    !exec(&rt, plugin, "CHECK", "xdel", &netns, &conf)
                        .status
                        .success(),
                    "{plugin} CHECK after DEL"
                );
            }
        }
        Ok(())
    }

    /// DEL deletes the accepts over nf_tables netlink where iptables is iptables-nft, picking
    /// them by their expressions: rules that only look alike, and other addresses' accepts,
    /// stay.
    #[test]
    fn iptables_del_removes_exactly_the_attachments_accepts() -> Result<()> {
        let (host, rt, netns) = host_runtime("fwexact")?;
        let conf = direct_conf(
            "iptables",
            "open",
            Some(prev_result("10.68.0.2", "fd68::2")),
        );
        ok(&exec(&rt, "firewall", "ADD", "exact", &netns, &conf), "ADD");
        let lookalikes = [
            ("iptables", "-d 10.68.0.2/32 -j ACCEPT"),
            ("iptables", "-s 10.68.0.2/32 -p tcp -j ACCEPT"),
            ("iptables", "-s 10.68.0.2/32 -j DROP"),
            ("iptables", "-s 10.68.0.3/32 -j ACCEPT"),
            ("ip6tables", "-s fd68::2/128 -p udp -j ACCEPT"),
        ];
        for (tool, rule) in lookalikes {
            let mut args = vec!["-w", "-A", "CNI-FORWARD"];
            args.extend(rule.split(' '));
            host.exec_ok(tool, &args)?;
        }
        // Without the iptables tools on PATH only the nf_tables netlink path can succeed.
        let del = exec_env(
            &rt,
            "firewall",
            "DEL",
            ("exact", &netns),
            &conf,
            &[("PATH", "/nonexistent")],
        );
        ok(&del, "DEL without iptables tools");
        // Again, with only the restore tools on PATH (a read with iptables-save would fail):
        // nf_tables holds every rule iptables-nft wrote, so finding no accept there is the
        // answer.
        let tools = restore_tools_only()?;
        let path = tools.path().to_string_lossy().into_owned();
        let again = exec_env(
            &rt,
            "firewall",
            "DEL",
            ("exact", &netns),
            &conf,
            &[("PATH", &path)],
        );
        ok(&again, "DEL again with only the restore tools");
        let (v4, v6) = both_tables(&host);
        let kept: Vec<&String> = v4
            .iter()
            .chain(&v6)
            .filter(|l| l.contains("10.68.0.") || l.contains("fd68::"))
            .collect();
        ensure!(kept.len() == lookalikes.len(), "kept: {kept:?}");
        for (_, rule) in lookalikes {
            ensure!(
                kept.iter().any(|l| l.ends_with(rule)),
                "{rule} was deleted: {kept:?}"
            );
        }
        Ok(())
    }

    /// The state file of attachment `cid` of network `fwdirect` in host namespace `host`.
    fn record_path(host: &TestNetns, cid: &str) -> Result<std::path::PathBuf> {
        use std::os::unix::fs::MetadataExt as _;
        let ino = std::fs::metadata(host.path())?.ino();
        Ok(std::path::PathBuf::from(format!(
            "/run/cni-firewall/{ino}/attachments/fwdirect:{cid}:eth0"
        )))
    }

    /// Where iptables is iptables-nft, ADD records the handles of the accepts it appends, and
    /// DEL deletes them by those handles without listing `CNI-FORWARD` (so a rule there that
    /// holds the address in a form the decoder does not know, which a listing would leave to
    /// the tools, does not matter, and no tool is needed). A record without handles (an
    /// earlier version's), whose handles no longer hold the accepts (deleted and written again
    /// by hand), or whose table was made anew, is looked up in the chain instead.
    #[test]
    fn iptables_del_deletes_by_the_handles_add_recorded() -> Result<()> {
        let (host, rt, netns) = host_runtime("fwhandle")?;
        let no_tools = [("PATH", "/nonexistent")];
        let conf = |v4, v6| direct_conf("iptables", "open", Some(prev_result(v4, v6)));
        let a = conf("10.70.1.2", "fd70:1::2");
        ok(&exec(&rt, "firewall", "ADD", "hnd-a", &netns, &a), "ADD a");
        let record = std::fs::read_to_string(record_path(&host, "hnd-a")?)?;
        let recorded: Value = serde_json::from_str(&record)?;
        ensure!(
            recorded["accepts"].as_array().map(Vec::len) == Some(4),
            "{record}"
        );
        // Rules the decoder does not know, holding a's addresses.
        host.exec_ok(
            "iptables",
            &[
                "-w",
                "-A",
                "CNI-FORWARD",
                "-s",
                "10.70.1.2/32",
                "-m",
                "mark",
                "--mark",
                "1",
                "-j",
                "ACCEPT",
            ],
        )?;
        host.exec_ok(
            "ip6tables",
            &[
                "-w",
                "-A",
                "CNI-FORWARD",
                "-s",
                "fd70:1::2/128",
                "-m",
                "mark",
                "--mark",
                "1",
                "-j",
                "ACCEPT",
            ],
        )?;
        // DEL without prevResult (by the state alone) and without the tools.
        let del = |cid: &str, conf: &Value, what: &str| {
            let out = exec_env(
                &rt,
                "firewall",
                "DEL",
                (cid, &netns),
                &bare_of(conf),
                &no_tools,
            );
            ok(&out, what);
        };
        del("hnd-a", &a, "DEL a by handle, without the tools");
        let left = lines_with(&host, "10.70.1.2", "fd70:1::2");
        ensure!(
            left.len() == 2 && left.iter().all(|l| l.contains("--mark 0x1")),
            "{left:#?}"
        );

        // An earlier version's record: the addresses only.
        let b = conf("10.70.1.3", "fd70:1::3");
        ok(&exec(&rt, "firewall", "ADD", "hnd-b", &netns, &b), "ADD b");
        std::fs::write(
            record_path(&host, "hnd-b")?,
            r#"{"ips":["10.70.1.3","fd70:1::3"]}"#,
        )?;
        // Handles that no longer hold their accepts: one deleted and written again by hand.
        let c = conf("10.70.1.4", "fd70:1::4");
        ok(&exec(&rt, "firewall", "ADD", "hnd-c", &netns, &c), "ADD c");
        for op in ["-D", "-A"] {
            host.exec_ok(
                "iptables",
                &[
                    "-w",
                    op,
                    "CNI-FORWARD",
                    "-s",
                    "10.70.1.4/32",
                    "-j",
                    "ACCEPT",
                ],
            )?;
        }
        for (cid, conf) in [("hnd-b", &b), ("hnd-c", &c)] {
            del(
                cid,
                conf,
                &format!("DEL {cid} by listing, without the tools"),
            );
        }
        // A table made anew (a saved ruleset restored: iptables-nft deletes the table and
        // makes it again, every rule with a new handle, which may be a recorded one of another
        // rule): d's recorded handles name nothing any more, and e's accepts must stay.
        let d = conf("10.70.1.5", "fd70:1::5");
        let e = conf("10.70.1.6", "fd70:1::6");
        ok(&exec(&rt, "firewall", "ADD", "hnd-d", &netns, &d), "ADD d");
        ok(&exec(&rt, "firewall", "ADD", "hnd-e", &netns, &e), "ADD e");
        for family in ["iptables", "ip6tables"] {
            let saved = host.exec_ok(&format!("{family}-save"), &["-t", "filter"])?;
            let file = tempfile::NamedTempFile::new()?;
            std::fs::write(file.path(), saved)?;
            host.exec_ok(
                "sh",
                &[
                    "-c",
                    &format!("{family}-restore < {}", file.path().display()),
                ],
            )?;
        }
        del("hnd-d", &d, "DEL d after the table was made anew");
        let left: Vec<String> = lines_with(&host, "10.70.1.", "fd70:1::")
            .into_iter()
            .filter(|l| !l.contains("--mark 0x1"))
            .collect();
        ensure!(
            left.len() == 4
                && left
                    .iter()
                    .all(|l| l.contains("10.70.1.6") || l.contains("fd70:1::6")),
            "{left:#?}"
        );
        del("hnd-e", &e, "DEL e");
        Ok(())
    }

    /// A state record that does not parse (empty, or garbage: a crash can leave either) is
    /// taken for absent, logged and removed: DEL without prevResult still removes the
    /// attachment's accepts (its addresses' claims name it), ADD again works, and GC removes
    /// the accepts and the file (issue 22 #5).
    #[test]
    fn a_corrupt_state_record_wedges_neither_del_nor_add_nor_gc() -> Result<()> {
        let (host, rt, netns) = host_runtime("fwcorrupt")?;
        let conf = |v4, v6| direct_conf("iptables", "open", Some(prev_result(v4, v6)));
        let a = conf("10.70.2.2", "fd70:2::2");
        ok(&exec(&rt, "firewall", "ADD", "bad-a", &netns, &a), "ADD a");
        std::fs::write(record_path(&host, "bad-a")?, "\u{0}garbage{")?;
        ok(
            &exec(&rt, "firewall", "DEL", "bad-a", &netns, &bare_of(&a)),
            "DEL a over a garbage record",
        );
        let kept = lines_with(&host, "10.70.2.2", "fd70:2::2");
        ensure!(kept.is_empty(), "{kept:#?}");
        ensure!(!record_path(&host, "bad-a")?.exists(), "a's record stays");

        let b = conf("10.70.2.3", "fd70:2::3");
        ok(&exec(&rt, "firewall", "ADD", "bad-b", &netns, &b), "ADD b");
        std::fs::write(record_path(&host, "bad-b")?, "")?;
        ok(
            &exec(&rt, "firewall", "ADD", "bad-b", &netns, &b),
            "ADD b over an empty record",
        );
        ok(
            &exec(&rt, "firewall", "CHECK", "bad-b", &netns, &b),
            "CHECK b",
        );
        ok(
            &exec(&rt, "firewall", "DEL", "bad-b", &netns, &bare_of(&b)),
            "DEL b",
        );
        let kept = lines_with(&host, "10.70.2.3", "fd70:2::3");
        ensure!(kept.is_empty(), "{kept:#?}");

        let c = conf("10.70.2.4", "fd70:2::4");
        ok(&exec(&rt, "firewall", "ADD", "bad-c", &netns, &c), "ADD c");
        std::fs::write(record_path(&host, "bad-c")?, "[1, 2")?;
        let gc = gc_conf("iptables", json!([]));
        let out = run_gc(&rt, &gc)?;
        ensure!(
            out.status.success(),
            "GC over a garbage record: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let kept = lines_with(&host, "10.70.2.4", "fd70:2::4");
        ensure!(kept.is_empty(), "{kept:#?}");
        ensure!(!record_path(&host, "bad-c")?.exists(), "c's record stays");
        Ok(())
    }

    /// DEL returns when its work is done and leaves no process of ours behind (no detached
    /// holder of its nf_tables socket, as an earlier version had): under a subreaper, as a
    /// runtime may be, nothing is left running or unreaped, and the attachment's objects are
    /// gone (issue 21 §1).
    #[test]
    fn del_leaves_no_process_behind_in_both_backends() -> Result<()> {
        let plugin = tests::bins::plugin_binary("firewall")?;
        for backend in ["iptables", "nftables"] {
            let (host, rt, netns) = host_runtime("fwreap")?;
            let conf = direct_conf(backend, "open", Some(prev_result("10.70.3.2", "fd70:3::2")));
            ok(&exec(&rt, "firewall", "ADD", "reap", &netns, &conf), "ADD");
            let (done, left) = tests::process::run_under_subreaper(
                std::path::Path::new(env!("CARGO_BIN_EXE_subreaper")),
                &host.netns()?,
                &plugin,
                &[
                    ("CNI_COMMAND", "DEL"),
                    ("CNI_CONTAINERID", "reap"),
                    ("CNI_NETNS", &netns),
                    ("CNI_IFNAME", "eth0"),
                    ("CNI_PATH", "/usr/lib/cni"),
                    ("CNI_NETNS_OVERRIDE", "1"),
                ],
                conf.to_string().as_bytes(),
            )?;
            ensure!(done, "{backend}: DEL failed");
            ensure!(left.is_empty(), "{backend}: DEL left {left}");
            let listing = listing(&host, backend)?;
            ensure!(
                !listing.contains("10.70.3.2") && !listing.contains("fd70:3::2"),
                "{backend}: {listing}"
            );
        }
        Ok(())
    }

    /// `conf` without its prevResult (DEL then goes by the state alone).
    fn bare_of(conf: &Value) -> Value {
        let mut bare = conf.clone();
        bare.as_object_mut().map(|o| o.remove("prevResult"));
        bare
    }

    #[test]
    fn iptables_add_and_check_read_the_chains_over_nf_tables_without_duplicates() -> Result<()> {
        let (host, rt, netns) = host_runtime("fwnative")?;
        // Only the restore tools on PATH: a read with iptables-save would fail.
        let tools = restore_tools_only()?;
        let path = tools.path().to_string_lossy().into_owned();
        let env = [("PATH", path.as_str())];
        let attachments = [
            ("nat-a", "10.67.0.2", "fd67::2"),
            ("nat-b", "10.67.0.3", "fd67::3"),
        ];
        for (cid, v4, v6) in attachments.into_iter().chain([attachments[0]]) {
            let conf = direct_conf("iptables", "isolated", Some(prev_result(v4, v6)));
            let add = exec_env(&rt, "firewall", "ADD", (cid, &netns), &conf, &env);
            ok(&add, &format!("ADD {cid} with only the restore tools"));
            let check = exec_env(&rt, "firewall", "CHECK", (cid, &netns), &conf, &env);
            ok(&check, &format!("CHECK {cid} with only the restore tools"));
        }
        let (v4, v6) = both_tables(&host);
        for lines in [&v4, &v6] {
            let rules: Vec<&String> = lines.iter().filter(|l| l.starts_with("-A ")).collect();
            let mut unique = rules.clone();
            unique.sort();
            unique.dedup();
            ensure!(unique.len() == rules.len(), "duplicated rules: {rules:#?}");
        }
        let accepts = |lines: &[String]| {
            lines
                .iter()
                .filter(|l| l.starts_with("-A CNI-FORWARD") && l.ends_with("-j ACCEPT"))
                .count()
        };
        ensure!(accepts(&v4) == 4 && accepts(&v6) == 4, "{v4:#?} {v6:#?}");
        // CHECK still notices a missing rule.
        host.exec_ok(
            "iptables",
            &[
                "-w",
                "-D",
                "CNI-FORWARD",
                "-s",
                "10.67.0.3/32",
                "-j",
                "ACCEPT",
            ],
        )?;
        let conf = direct_conf(
            "iptables",
            "isolated",
            Some(prev_result("10.67.0.3", "fd67::3")),
        );
        let check = exec_env(&rt, "firewall", "CHECK", ("nat-b", &netns), &conf, &env);
        ensure!(
            !check.status.success(),
            "CHECK passed with a missing accept"
        );
        Ok(())
    }

    #[test]
    fn iptables_add_writes_over_nf_tables_with_or_without_the_skeleton() -> Result<()> {
        let (host, rt, netns) = host_runtime("fwappend")?;
        let conf = |v4, v6| direct_conf("iptables", "isolated", Some(prev_result(v4, v6)));
        let first = conf("10.66.0.2", "fd66::2");
        ok(
            &exec(&rt, "firewall", "ADD", "app-a", &netns, &first),
            "first ADD",
        );
        // `iptables-restore` now names an nf_tables tool that refuses every script: only the
        // native append can add the second attachment.
        let tools = refusing_nft_restore()?;
        let path = tools.path().to_string_lossy().into_owned();
        let env = [("PATH", path.as_str())];
        let second = conf("10.66.0.3", "fd66::3");
        let add = exec_env(&rt, "firewall", "ADD", ("app-b", &netns), &second, &env);
        ok(&add, "ADD over nf_tables");
        let check = exec_env(&rt, "firewall", "CHECK", ("app-b", &netns), &second, &env);
        ok(&check, "CHECK of the natively added rules");
        // The tools list the natively added accepts exactly as they list their own.
        let (v4, v6) = both_tables(&host);
        for (lines, a, b) in [
            (&v4, "10.66.0.2/32", "10.66.0.3/32"),
            (&v6, "fd66::2/128", "fd66::3/128"),
        ] {
            let accepts = |ip: &str| -> Vec<String> {
                lines
                    .iter()
                    .filter(|l| l.starts_with("-A CNI-FORWARD") && l.contains(ip))
                    .map(|l| l.replace(ip, "ADDR"))
                    .collect()
            };
            ensure!(accepts(a).len() == 2, "{lines:#?}");
            ensure!(accepts(a) == accepts(b), "{lines:#?}");
        }
        // A namespace without the skeleton: the one writer writes the skeleton natively too
        // (the restore, which refuses here, is not run), as the first ADD above wrote it.
        let (bare, bare_rt, bare_netns) = host_runtime("fwappend2")?;
        let add = exec_env(
            &bare_rt,
            "firewall",
            "ADD",
            ("app-c", &bare_netns),
            &first,
            &env,
        );
        ok(&add, "first ADD over nf_tables");
        let check = exec_env(
            &bare_rt,
            "firewall",
            "CHECK",
            ("app-c", &bare_netns),
            &first,
            &env,
        );
        ok(&check, "CHECK of the natively written skeleton");
        let without_b = |lines: Vec<String>| -> Vec<String> {
            lines
                .into_iter()
                .filter(|l| !l.contains("10.66.0.3") && !l.contains("fd66::3"))
                .collect()
        };
        ensure!(
            both_tables(&bare) == (without_b(v4.clone()), without_b(v6.clone())),
            "{:#?}",
            both_tables(&bare)
        );
        ok(
            &exec(&rt, "firewall", "DEL", "app-b", &netns, &second),
            "DEL of the native attachment",
        );
        let (v4, v6) = both_tables(&host);
        ensure!(
            !v4.iter()
                .chain(&v6)
                .any(|l| l.contains("10.66.0.3") || l.contains("fd66::3")),
            "{v4:#?} {v6:#?}"
        );
        Ok(())
    }

    /// A directory whose `iptables-restore` and `ip6tables-restore` lead to
    /// `refuse-nft-restore`: an nf_tables tool by its name, which fails every script.
    fn refusing_nft_restore() -> Result<tempfile::TempDir> {
        use std::os::unix::fs::PermissionsExt;
        let tools = tempfile::tempdir()?;
        let tool = tools.path().join("refuse-nft-restore");
        std::fs::write(&tool, "#!/bin/sh\necho 'refused by the test' >&2\nexit 1\n")?;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755))?;
        for name in ["iptables-restore", "ip6tables-restore"] {
            std::os::unix::fs::symlink(&tool, tools.path().join(name))?;
        }
        Ok(tools)
    }

    /// A directory holding links to `iptables-restore` and `ip6tables-restore` only, for a
    /// `PATH` on which any other iptables tool is missing.
    fn restore_tools_only() -> Result<tempfile::TempDir> {
        let tools = tempfile::tempdir()?;
        for tool in ["iptables-restore", "ip6tables-restore"] {
            std::os::unix::fs::symlink(which(tool)?, tools.path().join(tool))?;
        }
        Ok(tools)
    }

    /// The absolute path of `tool` on this `PATH`.
    fn which(tool: &str) -> Result<std::path::PathBuf> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join(tool))
            .find(|p| p.exists())
            .with_context(|| format!("{tool} is not on PATH"))
    }
}
