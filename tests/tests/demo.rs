//! The demo that README.md's first command runs must keep working and leave nothing behind.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::process::Command;

#[test]
fn the_demo_runs_a_live_chain_and_cleans_up() {
    let out = Command::new(env!("CARGO_BIN_EXE_demo")).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "bridge → tuning → portmap → bandwidth → firewall → sbr",
        "  tuning     result: interface eth0 in the container, mac 02:42:0a:60:0a:63",
        "host: nftables ip cni_portmap, ports: tcp . 18080",
        "host: qdisc tbf 1: dev bwp",
        "host: iptables -A CNI-FORWARD -s 10.96.10.",
        "container: table 100: default via 10.96.10.1 dev eth0",
        "-> container :8080  HTTP 200",
        "host -> 127.0.0.1:18080 -> container :8080  HTTP 200",
        "Mbit/s into the container",
        "Mbit/s out of the container",
        "blocked while CNI-ADMIN drops it",
        "selects table 100",
        "[4] CHECK",
        "ok  every plugin verified",
        "[5] DEL",
        "every tbf and ingress qdisc are gone",
        "a second DEL succeeds too",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} missing from:\n{stdout}"
        );
    }
    // Every namespace it made is gone.
    let names: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let pid_free: Vec<&String> = names.iter().filter(|n| n.starts_with("cnidemo-")).collect();
    assert!(
        pid_free.is_empty(),
        "demo left namespaces behind: {pid_free:?}"
    );
}
