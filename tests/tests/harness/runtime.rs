//! The libcni-like runtime: a real chain with the Go `bridge` + `host-local`, the mechanics of
//! chaining with fake plugin scripts that record what they receive, and raw execution.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use host::netns::NetNs;
use serde_json::{Value, json};
use tests::runtime::VALID_ATTACHMENTS_KEY;
use tests::traffic::{TcpServer, tcp_request};
use tests::{GcAttachment, NetworkConfigList, Runtime, RuntimeConf, TestNetns, bins, main_plugin};

const TIMEOUT: Duration = Duration::from_secs(3);

fn bridge_list(data_dir: &Path) -> NetworkConfigList {
    NetworkConfigList::new(
        "harness-bridge",
        "1.0.0",
        vec![main_plugin::bridge(
            "cnitest0",
            &["10.99.0.0/24", "fd99::/64"],
            data_dir,
        )],
    )
}

#[test]
fn bridge_chain_add_check_traffic_del_with_the_go_plugins() -> Result<()> {
    let host = TestNetns::new("rt-host")?;
    let ctr = TestNetns::new("rt-ctr")?;
    let data = tempfile::tempdir()?;
    let list = bridge_list(data.path());
    let rt = Runtime::new(&host)?;
    let conf = RuntimeConf::new("harness-bridge-1", ctr.path(), "eth0");

    let result = rt.add(&list, &conf)?;
    let ips: Vec<ipnet::IpNet> = result["ips"]
        .as_array()
        .context("no ips")?
        .iter()
        .map(|ip| ip["address"].as_str().unwrap_or_default().parse())
        .collect::<Result<_, _>>()?;
    assert_eq!(ips.len(), 2, "{result}");
    let (cidr, cidr6) = (ips[0], ips[1]);
    let subnet: ipnet::IpNet = "10.99.0.0/24".parse()?;
    assert!(subnet.contains(&cidr.addr()), "{result}");
    let subnet6: ipnet::IpNet = "fd99::/64".parse()?;
    assert!(subnet6.contains(&cidr6.addr()), "{result}");
    assert_eq!(rt.cached_result(&list.name, &conf)?, Some(result.clone()));
    // host-local wrote its allocations under our tempdir, not /var/lib/cni.
    assert!(
        data.path()
            .join("harness-bridge")
            .join(cidr.addr().to_string())
            .exists()
    );
    assert!(ctr.has_link("eth0")?);
    assert!(host.has_link("cnitest0")?);

    rt.check(&list, &conf)?;

    let server = TcpServer::banner(&ctr, "[::]:8080".parse()?, "from the container")?;
    let got = tcp_request(&host, SocketAddr::new(cidr.addr(), 8080), b"", TIMEOUT)?;
    assert_eq!(got, b"from the container");
    // The v6 wildcard listener sees v4 clients as v4-mapped addresses.
    assert_eq!(
        server.peers()[0].ip().to_canonical(),
        "10.99.0.1".parse::<IpAddr>()?
    );
    // IPv6 too, once duplicate address detection in the container is over.
    let v6 = SocketAddr::new(cidr6.addr(), 8080);
    tests::traffic::wait_for_tcp(&host, v6, Duration::from_secs(5))?;
    assert_eq!(tcp_request(&host, v6, b"", TIMEOUT)?, b"from the container");
    assert_eq!(
        server.peers().last().map(|p| p.ip()),
        Some("fd99::1".parse()?)
    );
    drop(server);

    rt.del(&list, &conf)?;
    assert!(!ctr.has_link("eth0")?, "{:?}", ctr.link_names()?);
    assert_eq!(rt.cached_result(&list.name, &conf)?, None);
    rt.del(&list, &conf)?;
    Ok(())
}

#[test]
fn del_works_without_a_netns_path() -> Result<()> {
    let host = TestNetns::new("rt-host")?;
    let mut ctr = TestNetns::new("rt-ctr")?;
    let data = tempfile::tempdir()?;
    let list = bridge_list(data.path());
    let rt = Runtime::new(&host)?;
    let conf = RuntimeConf::new("harness-bridge-2", ctr.path(), "eth0");
    rt.add(&list, &conf)?;
    ctr.delete()?;
    rt.del(&list, &RuntimeConf::new("harness-bridge-2", "", "eth0"))?;
    // host-local released the address.
    let allocated = std::fs::read_dir(data.path().join("harness-bridge"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("10.99."))
        .count();
    assert_eq!(allocated, 0);
    Ok(())
}

#[test]
fn a_failing_plugin_gives_its_type_status_cni_error_and_stderr() -> Result<()> {
    let host = TestNetns::new("rt-fail")?;
    let list = NetworkConfigList::new(
        "harness-fail",
        "1.0.0",
        // No ipam: the bridge plugin refuses the config.
        vec![json!({"type": "bridge", "bridge": "cnitest1"})],
    );
    let rt = Runtime::new(&host)?;
    let conf = RuntimeConf::new("harness-fail-1", "/nonexistent/netns", "eth0");
    let err = rt.add(&list, &conf).unwrap_err();
    let failure = err.plugin_failure().context("not a plugin failure")?;
    assert_eq!(failure.plugin_type, "bridge");
    assert_eq!(failure.command, "ADD");
    assert!(!failure.status.success());
    let cni = failure.error.as_ref().context("no CNI error object")?;
    assert!(cni.code > 0 && !cni.msg.is_empty(), "{cni:?}");
    assert_eq!(err.code(), Some(cni.code));
    assert!(err.to_string().contains("bridge"), "{err}");
    assert_eq!(rt.cached_result(&list.name, &conf)?, None);
    Ok(())
}

#[test]
fn exec_plugin_sends_exactly_the_given_environment() -> Result<()> {
    let host = TestNetns::new("rt-raw")?;
    let rt = Runtime::new(&host)?;
    let conf = br#"{"cniVersion":"1.0.0","name":"n","type":"bridge"}"#;
    let out = rt.exec_plugin("bridge", Some("ADD"), &[], conf)?;
    assert!(!out.status.success());
    let err = out.error().context("no CNI error")?;
    // The spec's code for missing environment variables.
    assert_eq!(err.code, 4, "{err:?}");
    assert!(err.msg.contains("CNI_CONTAINERID"), "{err:?}");

    let version = rt.exec_plugin("bridge", Some("VERSION"), &[], conf)?;
    assert!(version.status.success());
    assert!(version.json()?["supportedVersions"].as_array().is_some());
    assert_eq!(rt.version("bridge", "1.0.0")?, version.json()?);

    let by_path = bins::reference_binary("bridge")?;
    let out = rt.exec_plugin(&by_path.to_string_lossy(), Some("VERSION"), &[], b"{}")?;
    assert!(out.status.success());
    Ok(())
}

#[test]
fn plugins_are_found_in_our_dir_first_and_never_silently_replaced_by_go_ones() -> Result<()> {
    let host = TestNetns::new("rt-find")?;
    let empty = tempfile::tempdir()?;
    let rt = Runtime::new(&host)?.with_bin_dir(empty.path());
    let err = rt.find_plugin("portmap").unwrap_err().to_string();
    assert!(
        err.contains(&empty.path().join("portmap").display().to_string()),
        "{err}"
    );
    assert!(err.contains("cargo build"), "{err}");
    assert_eq!(
        rt.find_plugin("bridge")?,
        bins::reference_dir().join("bridge")
    );
    let rt = rt.use_reference("portmap");
    assert_eq!(
        rt.find_plugin("portmap")?,
        bins::reference_dir().join("portmap")
    );
    let path = std::env::split_paths(&rt.cni_path()).collect::<Vec<_>>();
    assert_eq!(path, vec![empty.path().to_owned(), bins::reference_dir()]);
    let err = rt.find_plugin("no-such-plugin").unwrap_err().to_string();
    assert!(err.contains("no-such-plugin"), "{err}");
    Ok(())
}

#[test]
fn the_runtime_refuses_the_machines_own_namespace() -> Result<()> {
    let err = Runtime::in_netns(NetNs::open("/proc/self/ns/net")?).unwrap_err();
    assert!(err.to_string().contains("refusing"), "{err}");
    let err = Runtime::in_netns(NetNs::current()?).unwrap_err();
    assert!(err.to_string().contains("refusing"), "{err}");
    Ok(())
}

/// Fake plugins: shell scripts that log their stdin and `CNI_*` environment to a directory and
/// answer ADD with a result naming themselves.
struct Fakes {
    dir: tempfile::TempDir,
}

/// One recorded plugin call.
#[derive(Debug)]
struct Call {
    plugin: String,
    command: String,
    stdin: Value,
    env: BTreeMap<String, String>,
}

impl Fakes {
    fn new(names: &[&str]) -> Result<Fakes> {
        let fakes = Fakes {
            dir: tempfile::tempdir()?,
        };
        std::fs::create_dir(fakes.log())?;
        for name in names {
            let script = format!(
                r#"#!/bin/sh
log='{log}'
n=$(ls "$log" | wc -l)
f="$log/$(printf %04d "$n")-{name}-$CNI_COMMAND"
env | grep '^CNI_' | sort > "$f.env"
cat > "$f.json"
case "$(cat "$f.json")" in
*'"fail":true'*)
  echo '{{"cniVersion":"1.1.0","code":7,"msg":"told to fail","details":"fail is set"}}'
  echo 'failing on purpose' >&2
  exit 1;;
esac
if [ "$CNI_COMMAND" = ADD ]; then
  echo '{{"cniVersion":"1.1.0","interfaces":[{{"name":"{name}"}}],"ips":[]}}'
fi
"#,
                log = fakes.log().display()
            );
            let path = fakes.path(name);
            std::fs::write(&path, script)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
        Ok(fakes)
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The calls recorded since the last call of `take`, oldest first.
    fn take(&self) -> Result<Vec<Call>> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.log())?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        files.sort();
        let mut calls = Vec::new();
        for json in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "json"))
        {
            let stem = json.file_stem().unwrap().to_string_lossy().into_owned();
            let parts: Vec<&str> = stem.splitn(3, '-').collect();
            let env = std::fs::read_to_string(json.with_extension("env"))?
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            calls.push(Call {
                plugin: parts[1].to_owned(),
                command: parts[2].to_owned(),
                stdin: serde_json::from_slice(&std::fs::read(json)?)?,
                env,
            });
        }
        for f in files {
            std::fs::remove_file(f)?;
        }
        Ok(calls)
    }
}

fn order(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .map(|c| format!("{} {}", c.plugin, c.command))
        .collect()
}

fn fake_runtime(host: &TestNetns, fakes: &Fakes) -> Result<Runtime> {
    Ok(Runtime::new(host)?
        .use_binary("fakea", fakes.path("fakea"))
        .use_binary("fakeb", fakes.path("fakeb")))
}

fn fake_list(version: &str) -> NetworkConfigList {
    NetworkConfigList::new(
        "fakenet",
        version,
        vec![
            json!({"type": "fakea", "name": "ignored", "cniVersion": "0.1.0"}),
            json!({"type": "fakeb", "capabilities": {"portMappings": true, "mac": false}}),
        ],
    )
}

#[test]
fn chains_are_run_like_libcni() -> Result<()> {
    let host = TestNetns::new("rt-fake")?;
    let fakes = Fakes::new(&["fakea", "fakeb"])?;
    let rt = fake_runtime(&host, &fakes)?;
    let list = fake_list("1.1.0");
    let ports = json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]);
    let conf = RuntimeConf::new("ctr1", "/run/netns/somewhere", "eth0")
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAME", "web")
        .with_capability("portMappings", ports.clone())
        .with_capability("bandwidth", json!({"ingressRate": 1000}))
        .with_capability("mac", json!("02:00:00:00:00:01"));

    // ADD: in order, prevResult chained, runtimeConfig filtered by capabilities.
    let result = rt.add(&list, &conf)?;
    let calls = fakes.take()?;
    assert_eq!(order(&calls), ["fakea ADD", "fakeb ADD"]);
    let (a, b) = (&calls[0], &calls[1]);
    assert_eq!(a.stdin["name"], "fakenet");
    assert_eq!(a.stdin["cniVersion"], "1.1.0");
    assert!(a.stdin.get("prevResult").is_none(), "{}", a.stdin);
    assert!(a.stdin.get("runtimeConfig").is_none(), "{}", a.stdin);
    assert_eq!(b.stdin["prevResult"]["interfaces"][0]["name"], "fakea");
    assert_eq!(b.stdin["runtimeConfig"], json!({"portMappings": ports}));
    assert_eq!(result["interfaces"][0]["name"], "fakeb");
    let cni_path = rt.cni_path().to_string_lossy().into_owned();
    let expected_env: BTreeMap<String, String> = [
        ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web"),
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "ctr1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", "/run/netns/somewhere"),
        ("CNI_PATH", &cni_path),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(a.env, expected_env);

    // CHECK: in order, with the cached final result.
    rt.check(&list, &conf)?;
    let calls = fakes.take()?;
    assert_eq!(order(&calls), ["fakea CHECK", "fakeb CHECK"]);
    assert!(calls.iter().all(|c| c.stdin["prevResult"] == result));

    // STATUS: in order, plain config, no container environment.
    rt.status(&list)?;
    let calls = fakes.take()?;
    assert_eq!(order(&calls), ["fakea STATUS", "fakeb STATUS"]);
    assert!(calls[0].stdin.get("prevResult").is_none());
    assert_eq!(calls[0].env["CNI_CONTAINERID"], "");

    // GC: the cached attachment is valid by default, so nothing is deleted.
    rt.gc(&list, None)?;
    let calls = fakes.take()?;
    assert_eq!(order(&calls), ["fakea GC", "fakeb GC"]);
    assert_eq!(
        calls[1].stdin[VALID_ATTACHMENTS_KEY],
        json!([{"containerID": "ctr1", "ifname": "eth0"}])
    );
    assert_eq!(calls[1].env["CNI_NETNS"], "");

    // DEL: in reverse, with the cached result; the cache is then forgotten.
    rt.del(&list, &conf)?;
    let calls = fakes.take()?;
    assert_eq!(order(&calls), ["fakeb DEL", "fakea DEL"]);
    assert!(calls.iter().all(|c| c.stdin["prevResult"] == result));
    assert_eq!(
        calls[0].stdin["runtimeConfig"],
        json!({"portMappings": ports})
    );
    assert!(rt.cached_attachments()?.is_empty());

    // A second DEL has no cached result to send.
    rt.del(&list, &conf)?;
    let calls = fakes.take()?;
    assert!(calls.iter().all(|c| c.stdin.get("prevResult").is_none()));
    Ok(())
}

#[test]
fn gc_deletes_cached_attachments_that_are_not_valid() -> Result<()> {
    let host = TestNetns::new("rt-gc")?;
    let fakes = Fakes::new(&["fakea", "fakeb"])?;
    let rt = fake_runtime(&host, &fakes)?;
    let list = fake_list("1.1.0");
    let keep = RuntimeConf::new("keep", "/run/netns/k", "eth0");
    let stale = RuntimeConf::new("stale", "/run/netns/s", "eth0");
    rt.add(&list, &keep)?;
    rt.add(&list, &stale)?;
    fakes.take()?;

    let valid = [GcAttachment {
        container_id: "keep".into(),
        ifname: "eth0".into(),
    }];
    rt.gc(&list, Some(&valid))?;
    let calls = fakes.take()?;
    assert_eq!(
        order(&calls),
        ["fakeb DEL", "fakea DEL", "fakea GC", "fakeb GC"]
    );
    assert_eq!(calls[0].env["CNI_CONTAINERID"], "stale");
    assert_eq!(calls[0].env["CNI_NETNS"], "/run/netns/s");
    assert_eq!(
        calls[2].stdin[VALID_ATTACHMENTS_KEY],
        json!([{"containerID": "keep", "ifname": "eth0"}])
    );
    let left: Vec<String> = rt
        .cached_attachments()?
        .into_iter()
        .map(|a| a.rt.container_id)
        .collect();
    assert_eq!(left, ["keep"]);
    Ok(())
}

#[test]
fn version_switches_are_honoured() -> Result<()> {
    let host = TestNetns::new("rt-ver")?;
    let fakes = Fakes::new(&["fakea", "fakeb"])?;
    let rt = fake_runtime(&host, &fakes)?;
    let conf = RuntimeConf::new("ctr", "/run/netns/x", "eth0");

    // Before 1.1.0 STATUS and GC do not reach the plugins; before 0.4.0 CHECK is refused and
    // DEL gets no prevResult.
    let old = fake_list("0.3.1");
    rt.add(&old, &conf)?;
    rt.status(&old)?;
    rt.gc(&old, None)?;
    assert!(rt.check(&old, &conf).is_err());
    rt.del(&old, &conf)?;
    let calls = fakes.take()?;
    assert_eq!(
        order(&calls),
        ["fakea ADD", "fakeb ADD", "fakeb DEL", "fakea DEL"]
    );
    assert!(calls[2].stdin.get("prevResult").is_none());

    let mut off = fake_list("1.1.0");
    off.disable_check = true;
    off.disable_gc = true;
    rt.add(&off, &conf)?;
    rt.check(&off, &conf)?;
    rt.gc(&off, Some(&[]))?;
    assert_eq!(order(&fakes.take()?), ["fakea ADD", "fakeb ADD"]);
    assert_eq!(rt.cached_attachments()?.len(), 1);
    Ok(())
}

#[test]
fn a_failing_add_stops_the_chain_and_caches_nothing() -> Result<()> {
    let host = TestNetns::new("rt-ffail")?;
    let fakes = Fakes::new(&["fakea", "fakeb"])?;
    let rt = fake_runtime(&host, &fakes)?;
    let mut list = fake_list("1.1.0");
    list.plugins[0]["fail"] = json!(true);
    let conf = RuntimeConf::new("ctr", "/run/netns/x", "eth0");
    let err = rt.add(&list, &conf).unwrap_err();
    let failure = err.plugin_failure().context("not a plugin failure")?;
    assert_eq!(failure.plugin_type, "fakea");
    assert_eq!(failure.status.code(), Some(1));
    assert_eq!(err.code(), Some(7));
    assert_eq!(failure.error.as_ref().unwrap().details, "fail is set");
    assert!(failure.stderr.contains("failing on purpose"));
    assert_eq!(order(&fakes.take()?), ["fakea ADD"]);
    assert!(rt.cached_attachments()?.is_empty());
    Ok(())
}
