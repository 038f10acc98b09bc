//! podman's default network, run once with our `portmap`, `firewall` and `tuning` and once
//! with the Go ones (Debian's 1.1.1), Debian's Go `bridge` + `host-local` first both times:
//! the same results and the same `iptables-save`.
//!
//! The conflist is the one podman 4.3 writes for its default network `podman`
//! (`87-podman-bridge.conflist`: `bridge` `cni-podman0` with `isGateway`, `ipMasq` and
//! `hairpinMode`, host-local over 10.88.0.0/16, then `portmap` with the `portMappings`
//! capability, `firewall` with `"backend": ""`, `tuning` without keys; cniVersion 0.4.0;
//! `tests/tests/podman.rs` checks that podman still writes this chain), with one change:
//! host-local keeps its leases in a tempdir instead of `/var/lib/cni/networks`. The runtime sends
//! what podman sends: a 64-hex container ID, `CNI_ARGS` `IgnoreUnknown=1;K8S_POD_NAME=<name>`,
//! one port mapping without `hostIP`.
//!
//! Each run has a throwaway host namespace (where the plugins run) and container namespace.
//! Compared after ADD and after DEL: the final result (MACs, the host veth's name and the netns
//! path masked: the kernel and `bridge` choose them per run) and `iptables-save` of `nat` and
//! `filter`, both families, without counters, hash-named chains (`CNI-<hash>`, `CNI-DN-<hash>`)
//! renamed in order of appearance. Both runs use a `DBUS_SYSTEM_BUS_ADDRESS` that leads
//! nowhere, so `firewall`'s auto backend is iptables for both.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use anyhow::{Result, bail};
use serde_json::{Value, json};
use tests::differential::{Impl, line_diff, normalise_hash_chains};
use tests::{NetworkConfigList, Runtime, RuntimeConf, TestNetns, bins, snapshot};

const CONTAINER_ID: &str = "5d0f3b0a2c9e4a7f8b1c6d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a";

/// podman 4.3's default network, as it writes it (leases moved to `leases`).
fn podman_default_conflist(leases: &std::path::Path) -> Result<NetworkConfigList> {
    NetworkConfigList::from_value(&json!({
        "cniVersion": "0.4.0",
        "name": "podman",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni-podman0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "ranges": [[{"subnet": "10.88.0.0/16", "gateway": "10.88.0.1"}]],
                    "dataDir": leases
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
            {"type": "firewall", "backend": ""},
            {"type": "tuning"}
        ]
    }))
}

/// What one run left: the result and the netfilter tables, after ADD and after DEL.
struct Run {
    result: Value,
    after_add: Vec<(String, Vec<String>)>,
    after_del: Vec<(String, Vec<String>)>,
}

/// `iptables-save` of `nat` and `filter`, both families, hash-named chains renamed.
fn tables(host: &TestNetns) -> Result<Vec<(String, Vec<String>)>> {
    Ok(snapshot::iptables_tables(host, &["nat", "filter"])?
        .into_iter()
        .map(|(name, lines)| (name, normalise_hash_chains(&lines)))
        .collect())
}

/// The result with what each run chooses afresh masked: MACs, the host veth's name, the netns.
fn masked(result: &Value, netns: &str) -> Value {
    let text = result.to_string().replace(netns, "<netns>");
    let mut result: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    for iface in result["interfaces"].as_array_mut().into_iter().flatten() {
        if iface.get("mac").is_some() {
            iface["mac"] = json!("<mac>");
        }
        if iface["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("veth"))
        {
            iface["name"] = json!("<veth>");
        }
    }
    result
}

fn run(side: Impl) -> Result<Run> {
    let host = TestNetns::new("dpod-h")?;
    let container = TestNetns::new("dpod-c")?;
    let _state = tests::netns::StateDirs::of(&host)?;
    let scratch = tempfile::tempdir()?;
    let mut runtime = Runtime::new(&host)?.with_env(
        "DBUS_SYSTEM_BUS_ADDRESS",
        "unix:path=/nonexistent/system_bus_socket",
    );
    if side == Impl::Go {
        runtime = runtime.with_plugin_dirs(vec![bins::reference_dir()]);
    }
    let list = podman_default_conflist(&scratch.path().join("leases"))?;
    let rt = RuntimeConf::new(CONTAINER_ID, container.path(), "eth0")
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAME", "web")
        .with_capability(
            "portMappings",
            json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
        );
    let result = runtime.add(&list, &rt)?;
    let after_add = tables(&host)?;
    runtime.del(&list, &rt)?;
    let after_del = tables(&host)?;
    Ok(Run {
        result: masked(&result, &container.path().to_string_lossy()),
        after_add,
        after_del,
    })
}

#[test]
fn podmans_default_network_gives_the_same_result_and_iptables_with_ours_and_go() -> Result<()> {
    let (go, ours) = std::thread::scope(|s| {
        let go = s.spawn(|| run(Impl::Go));
        (go.join(), run(Impl::Ours))
    });
    let go = go.map_err(|_| anyhow::anyhow!("the Go run panicked"))??;
    let ours = ours?;
    let mut problems = Vec::new();
    if go.result != ours.result {
        let lines = |v: &Value| -> Vec<String> {
            serde_json::to_string_pretty(v)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect()
        };
        problems.push(format!(
            "result differs (Go -, ours +):\n{}",
            line_diff(&lines(&go.result), &lines(&ours.result)).join("\n")
        ));
    }
    for (when, g, o) in [
        ("ADD", &go.after_add, &ours.after_add),
        ("DEL", &go.after_del, &ours.after_del),
    ] {
        for ((name, g), (_, o)) in g.iter().zip(o) {
            if g != o {
                problems.push(format!(
                    "`{name}` after {when} differs (Go -, ours +):\n{}",
                    line_diff(g, o).join("\n")
                ));
            }
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n\n"));
    }
    Ok(())
}
