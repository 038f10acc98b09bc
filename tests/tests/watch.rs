//! `firewall reconcile --watch` end to end: the watcher started in the host namespace as its
//! service would be (before or after the attachments), Debian's Go `bridge` + `host-local`
//! then our `firewall` with `ingressPolicy: same-bridge` on two bridges, real TCP through the
//! accepts (the host's `FORWARD` policy DROP) and across the isolation; then another program
//! breaks the host's firewall (`iptables -F; -X`, `nft flush ruleset`) and the watcher alone
//! brings forwarding and isolation back. The plugin's own ADD and DEL while it watches, and
//! its own repairs, start no reconcile; a dead attachment is removed, never brought back;
//! SIGTERM stops it with status 0. A hundred attachments: the time from the flush to the
//! watcher's end of repair is printed (measured, not asserted), with its memory after many
//! repairs. (firewalld's reload is in `firewalld.rs`, with the firewalld those tests start.)

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

// Helpers unwrap like tests do: the whole file is test code.
#[cfg(test)]
mod e2e {
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    use serde_json::json;
    use tests::firewall_state::{records, wait_destroyed};
    use tests::netns::CLIENT_V4;
    use tests::result::synthetic_prev;
    use tests::traffic::{TcpServer, answers};
    use tests::watcher::{DONE, RECONCILING, Watcher};
    use tests::{Runtime, RuntimeConf, TestNetns, Topology};

    /// How long a connection that must succeed may take.
    const OPEN: Duration = Duration::from_secs(3);
    /// How long to wait before calling a flow blocked (dropped packets never answer).
    const BLOCKED: Duration = Duration::from_millis(700);
    /// How long the watcher may take to repair before the test gives up (its target is under
    /// a second; this is a bound on a hung test, not a measure).
    const REPAIRED: Duration = Duration::from_secs(10);
    /// How long the watcher may take to start (its first reconcile) and to stop.
    const START: Duration = Duration::from_secs(20);

    /// What another program does to the host's firewall.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Disruption {
        /// `iptables -F; iptables -X` (and ip6tables) of the filter table, with iptables-nft.
        FlushFilter,
        /// `nft flush ruleset`.
        FlushRuleset,
    }

    impl Disruption {
        /// The program names (`comm`) the watcher's log gives as the deleter.
        fn deleters(self) -> &'static [&'static str] {
            match self {
                Disruption::FlushFilter => &["by iptables (pid", "by ip6tables (pid"],
                Disruption::FlushRuleset => &["by nft (pid"],
            }
        }

        fn apply(self, host: &TestNetns) {
            match self {
                Disruption::FlushFilter => {
                    // One shell, so that the four follow each other closely. Should the
                    // watcher repair between a -F and its -X (a burst longer than its quiet
                    // interval), the -X fails on chains jumped to again: not checked.
                    host.exec_ok(
                        "sh",
                        &[
                            "-c",
                            "for t in iptables ip6tables; do $t -t filter -F; \
                                 $t -t filter -X 2>/dev/null; done; true",
                        ],
                    )
                    .unwrap();
                }
                Disruption::FlushRuleset => {
                    host.exec_ok("nft", &["flush", "ruleset"]).unwrap();
                }
            }
        }
    }

    /// The causes the watcher logged, one per reconcile.
    fn causes(log: &str) -> Vec<&str> {
        log.lines()
            .filter_map(|l| l.strip_prefix(RECONCILING))
            .collect()
    }

    /// Two networks with `same-bridge` isolation: `a` (dual-stack) with a live container and
    /// one whose namespace is deleted before the watcher starts, `b` with one live container.
    /// The watcher starts (its first reconcile removes the dead one); an ADD and a DEL of a
    /// third while it watches; then each of `disruptions`, after which forwarding and
    /// isolation come back by the watcher alone; SIGTERM; DEL of all.
    fn watched(backend: &str, disruptions: &[Disruption]) {
        let topo = Topology::new(&format!("wt{}", &backend[..2])).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::new(&topo.host).unwrap();
        let iptables = backend == "iptables";
        let drop_forward = || {
            if iptables {
                // The accepts are what lets the containers' traffic out.
                for tool in ["iptables", "ip6tables"] {
                    topo.host.exec_ok(tool, &["-P", "FORWARD", "DROP"]).unwrap();
                }
            }
        };
        drop_forward();
        let net_a = tests::firewall_state::same_bridge_conflist(
            "wtneta",
            "wtbra",
            &["10.76.0.0/24", "fd76::/64"],
            dir.path(),
            backend,
        );
        let net_b = tests::firewall_state::same_bridge_conflist(
            "wtnetb",
            "wtbrb",
            &["10.77.0.0/24"],
            dir.path(),
            backend,
        );
        let ctr_b = TestNetns::new("wtctrb").unwrap();
        let ctr_c = TestNetns::new("wtctrc").unwrap();
        let mut ctr_dead = TestNetns::new("wtdead").unwrap();
        let attach_a = RuntimeConf::new("wt-a", topo.container.path(), "eth0");
        let attach_b = RuntimeConf::new("wt-b", ctr_b.path(), "eth0");
        let attach_c = RuntimeConf::new("wt-c", ctr_c.path(), "eth0");
        let attach_dead = RuntimeConf::new("wt-dead", ctr_dead.path(), "eth0");
        rt.add(&net_a, &attach_a).unwrap();
        let result_b = rt.add(&net_b, &attach_b).unwrap();
        rt.add(&net_a, &attach_dead).unwrap();
        let b = SocketAddr::new(tests::result::ipv4(&result_b).unwrap(), 8080);
        let _server_b = TcpServer::banner(&ctr_b, b, "hello").unwrap();
        let client = SocketAddr::new(CLIENT_V4.parse().unwrap(), 8081);
        let _server_client = TcpServer::banner(&topo.client, client, "hello").unwrap();
        let intact = || {
            answers(&topo.container, client, b"hello", OPEN)
                && !answers(&topo.container, b, b"hello", BLOCKED)
        };
        assert!(intact(), "after ADD: no forwarding out, or no isolation");
        ctr_dead.delete().unwrap();
        wait_destroyed(&topo.host, "wtneta:wt-dead:eth0").unwrap();

        let mut watcher = Watcher::start(&rt, "firewall", &[], START).unwrap();
        let first = watcher.wait_for_reconcile(1, START).unwrap();
        assert!(
            first.contains(&format!("removed wtneta/wt-dead/eth0 ({backend})")),
            "{first}"
        );
        assert_eq!(
            records(&topo.host).unwrap(),
            ["wtneta:wt-a:eth0", "wtnetb:wt-b:eth0"]
        );
        // The plugin's own calls while it watches: an ADD and a DEL (which deletes objects of
        // the firewall's) start no reconcile (checked on the causes at the end).
        rt.add(&net_a, &attach_c).unwrap();
        rt.del(&net_a, &attach_c).unwrap();

        let mut reconciles = 1;
        for what in disruptions {
            what.apply(&topo.host);
            if iptables && *what == Disruption::FlushRuleset {
                // The node's own firewall comes back by its own means; ours by the watcher.
                drop_forward();
            }
            let deadline = Instant::now() + REPAIRED;
            while !intact() {
                assert!(
                    Instant::now() < deadline,
                    "{what:?}: not repaired within {REPAIRED:?}; the watcher's log:\n{}",
                    watcher.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            // Forwarding is back: a reconcile caused by the disruption has run (and ended).
            let log = watcher
                .wait_for_log(REPAIRED, "the repair's end", |log| {
                    log.rfind(RECONCILING)
                        .is_some_and(|i| log[i..].lines().any(|l| l.starts_with(DONE)))
                })
                .unwrap();
            let now = watcher.reconciles();
            assert!(now > reconciles, "{what:?}: no reconcile:\n{log}");
            let repair = watcher
                .wait_for_reconcile(reconciles + 1, REPAIRED)
                .unwrap();
            assert!(
                what.deleters().iter().any(|d| repair.contains(d)),
                "{what:?}: the first repair's cause is not the disruption:\n{repair}"
            );
            assert!(
                repair.contains(&format!("restored wtneta/wt-a/eth0 ({backend})")),
                "{what:?}:\n{log}"
            );
            reconciles = now;
            rt.check(&net_a, &attach_a).unwrap();
            rt.check(&net_b, &attach_b).unwrap();
        }
        let (status, log) = watcher.stop(START).unwrap();
        assert!(status.success(), "{status}:\n{log}");
        assert!(log.ends_with("watch: stopping on SIGTERM\n"), "{log}");
        assert!(
            !log.contains("restored wtneta/wt-dead/"),
            "the dead attachment came back:\n{log}"
        );
        // Every reconcile has the start or another program's deletion as its cause: none the
        // plugin's own ADD and DEL, none the watcher's own repairs.
        for cause in causes(&log) {
            assert!(
                cause == "start)"
                    || disruptions
                        .iter()
                        .any(|d| d.deleters().iter().any(|by| cause.contains(by))),
                "a reconcile not caused by another program: {cause}\n{log}"
            );
        }
        assert!(
            !log.contains(" by firewall"),
            "the plugin's own call started a reconcile:\n{log}"
        );
        rt.del(&net_a, &attach_a).unwrap();
        rt.del(&net_b, &attach_b).unwrap();
        rt.del(&net_a, &attach_dead).unwrap();
        assert!(records(&topo.host).unwrap().is_empty());
    }

    #[test]
    fn the_watcher_brings_the_iptables_accepts_back_after_a_filter_flush_and_a_ruleset_flush() {
        watched(
            "iptables",
            &[Disruption::FlushFilter, Disruption::FlushRuleset],
        );
    }

    #[test]
    fn the_watcher_brings_the_nftables_table_back_after_a_ruleset_flush() {
        watched("nftables", &[Disruption::FlushRuleset]);
    }

    /// Started where nothing was ever added, the watcher reconciles once quietly, answers
    /// SIGINT too with status 0, and refuses an option it does not take.
    #[test]
    fn the_watcher_stops_on_sigint_and_refuses_other_options() {
        let host = TestNetns::new("wtcli").unwrap();
        let rt = Runtime::new(&host).unwrap();
        let watcher = Watcher::start(&rt, "firewall", &[], START).unwrap();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(watcher.pid()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let mut watcher = watcher;
        let log = watcher
            .wait_for_log(START, "its stop", |l| l.contains("stopping on SIGINT"))
            .unwrap();
        assert!(
            log.contains("reconcile: nothing missing; 0 attachment(s) in place"),
            "{log}"
        );
        let (status, _) = watcher.stop(START).unwrap_or_else(|e| panic!("{e}"));
        assert!(status.success(), "{status}");
        let out = rt
            .operate("firewall", &["reconcile", "--watch", "--now"], &[])
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
    }

    /// A hundred attachments (synthetic prevResults, one live namespace) of `backend`, the
    /// watcher running, then `rounds` of `disruption`: each time the watcher alone puts all
    /// of them back (CHECK passes for each after the last). Prints the time from the end of the
    /// disruption's command to the end of the watcher's repair, and the watcher's memory.
    fn a_hundred(backend: &str, disruption: Disruption, rounds: usize) {
        let host = TestNetns::new(&format!("wt100{}", &backend[..2])).unwrap();
        let ctr = TestNetns::new("wt100c").unwrap();
        let rt = Runtime::new(&host).unwrap();
        let netns = ctr.path().to_string_lossy().into_owned();
        let conf = |i: usize| {
            json!({
                "cniVersion": "1.0.0", "name": "wt100", "type": "firewall", "backend": backend,
                "prevResult": synthetic_prev(&netns, "veth1", &format!("10.78.{}.{}/16", i / 200, i % 200 + 2)),
            })
        };
        let call = |command: &str, i: usize| {
            let id = format!("wt100-{i}");
            let out = rt
                .exec_attachment("firewall", command, &id, &netns, &conf(i))
                .unwrap();
            assert!(
                out.status.success(),
                "{command} {i}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        for i in 0..100 {
            call("ADD", i);
        }
        let mut watcher = Watcher::start(&rt, "firewall", &[], START).unwrap();
        let mut rss = Vec::new();
        let mut took = Vec::new();
        for round in 0..rounds {
            let before = watcher.reconciles();
            disruption.apply(&host);
            let flushed = Instant::now();
            let log = watcher
                .wait_for_log(REPAIRED, "the repair of the hundred", |log| {
                    log.match_indices(RECONCILING)
                        .nth(before)
                        .is_some_and(|(i, _)| log[i..].lines().any(|l| l.starts_with(DONE)))
                })
                .unwrap();
            took.push(flushed.elapsed());
            let repair = &log[log.match_indices(RECONCILING).nth(before).unwrap().0..];
            let restored = repair
                .lines()
                .filter(|l| l.starts_with("restored wt100/"))
                .count();
            assert_eq!(restored, 100, "round {round}:\n{repair}");
            // Let a split burst's second reconcile (if any) end before the next round.
            std::thread::sleep(Duration::from_millis(600));
            rss.push(watcher.rss_kib().unwrap());
        }
        for i in 0..100 {
            call("CHECK", i);
        }
        let (status, log) = watcher.stop(START).unwrap();
        assert!(status.success(), "{status}:\n{log}");
        for i in 0..100 {
            call("DEL", i);
        }
        let mut ms: Vec<f64> = took.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        eprintln!(
            "watcher, {backend}, 100 attachments, {disruption:?}: repaired {:.0} ms after the \
             command returned (median of {rounds}; min {:.0}, max {:.0}); RSS {} KiB after the \
             first repair, {} KiB after the last",
            ms[ms.len() / 2],
            ms[0],
            ms[ms.len() - 1],
            rss[0],
            rss[rss.len() - 1],
        );
    }

    #[test]
    fn a_hundred_iptables_attachments_come_back_by_the_watcher_after_each_flush() {
        a_hundred("iptables", Disruption::FlushFilter, 5);
    }

    #[test]
    fn a_hundred_nftables_attachments_come_back_by_the_watcher_after_each_ruleset_flush() {
        a_hundred("nftables", Disruption::FlushRuleset, 5);
    }
}
