//! End-to-end tests of our `tuning` binary: chained after Debian's Go `bridge` + `host-local`
//! through the libcni-like runtime (ADD, CHECK, drift by hand, DEL restores), the allowlist in a
//! private mount namespace, STATUS and GC.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use nix::mount::{MsFlags, mount};
use serde_json::{Value, json};
use tests::mounts::with_private_mounts;
use tests::{
    NetworkConfigList, PluginOutput, Runtime, RuntimeConf, TestNetns, Topology, main_plugin,
};

const IFNAME: &str = "eth0";
const MAC: &str = "02:42:ac:11:00:02";

/// A bridge + host-local + tuning chain in `version`, with state in `scratch`.
fn chain(scratch: &Path, version: &str, tuning: Value) -> NetworkConfigList {
    NetworkConfigList::new(
        "tunenet",
        version,
        vec![
            main_plugin::bridge("cni-tune0", &["10.95.0.0/24"], &scratch.join("ipam")),
            tuning,
        ],
    )
}

fn link(ns: &TestNetns, ifname: &str) -> Result<Value> {
    Ok(ns.ip_json(&["-d", "link", "show", "dev", ifname])?[0].clone())
}

fn flag(link: &Value, flag: &str) -> bool {
    link["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == flag))
}

#[test]
fn a_bridge_chain_is_tuned_checked_drift_is_caught_and_del_restores() -> Result<()> {
    let topo = Topology::new("tunee2e")?;
    let scratch = tempfile::tempdir()?;
    let data_dir = scratch.path().join("tuning");
    let list = chain(
        scratch.path(),
        "1.0.0",
        json!({
            "type": "tuning",
            "capabilities": {"mac": true},
            "dataDir": data_dir,
            "mtu": 1400,
            "promisc": true,
            "txQLen": 500,
            "sysctl": {
                "net.ipv4.conf.IFNAME.arp_ignore": "1",
                "net.ipv4.conf.all.arp_announce": "2",
            },
        }),
    );
    let runtime = Runtime::new(&topo.host)?;
    let rt = RuntimeConf::new("tune-e2e-1", topo.container.path(), IFNAME)
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAME", "web")
        .with_capability("mac", json!(MAC));

    let result = runtime.add(&list, &rt)?;
    let container_if = result["interfaces"]
        .as_array()
        .and_then(|i| i.iter().find(|i| i["name"] == IFNAME))
        .context("no container interface in the result")?;
    ensure!(container_if["mac"] == MAC, "result MAC: {result}");
    let l = link(&topo.container, IFNAME)?;
    ensure!(
        l["address"] == MAC && l["mtu"] == 1400 && l["txqlen"] == 500,
        "{l}"
    );
    ensure!(flag(&l, "PROMISC"), "{l}");
    ensure!(topo.container.sysctl("net.ipv4.conf.eth0.arp_ignore")? == "1");
    ensure!(topo.container.sysctl("net.ipv4.conf.all.arp_announce")? == "2");
    let backup = data_dir.join(format!("tune-e2e-1_{IFNAME}.json"));
    let saved: Value = serde_json::from_slice(&std::fs::read(&backup)?)?;
    ensure!(
        saved["mtu"] == 1500 && saved["network"] == "tunenet",
        "{saved}"
    );

    runtime.check(&list, &rt).context("CHECK right after ADD")?;

    topo.container.ip(&["link", "set", IFNAME, "mtu", "1300"])?;
    let err = runtime
        .check(&list, &rt)
        .err()
        .context("CHECK passed with the MTU drifted")?;
    ensure!(
        err.to_string()
            .contains("eth0 mtu is 1300, configured 1400"),
        "{err}"
    );
    topo.container.ip(&["link", "set", IFNAME, "mtu", "1400"])?;
    runtime.check(&list, &rt)?;
    topo.container
        .set_sysctl("net.ipv4.conf.all.arp_announce", "0")?;
    let err = runtime
        .check(&list, &rt)
        .err()
        .context("CHECK passed with a sysctl drifted")?;
    ensure!(
        err.to_string().contains("net.ipv4.conf.all.arp_announce"),
        "{err}"
    );
    topo.container
        .set_sysctl("net.ipv4.conf.all.arp_announce", "2")?;

    // Our DEL alone first, with the cached result, to see the interface restored before the
    // bridge removes it.
    let cached = runtime
        .cached_result("tunenet", &rt)?
        .context("no cached result")?;
    let tuning_conf = tests::runtime::build_plugin_config(
        &list,
        &list.plugins[1],
        Some(&cached),
        &rt.capability_args,
    )?;
    let out = runtime.exec_plugin(
        "tuning",
        Some("DEL"),
        &[
            ("CNI_CONTAINERID", "tune-e2e-1"),
            (
                "CNI_NETNS",
                topo.container.path().to_str().unwrap_or_default(),
            ),
            ("CNI_IFNAME", IFNAME),
        ],
        tuning_conf.to_string().as_bytes(),
    )?;
    ensure!(out.status.success(), "tuning DEL: {out:?}");
    let l = link(&topo.container, IFNAME)?;
    // `ip -j` leaves txqlen out when it is 0 (the veth default on recent kernels).
    let txqlen = l["txqlen"].as_u64().unwrap_or(0);
    ensure!(
        l["address"] == saved["mac"]
            && l["mtu"] == saved["mtu"]
            && json!(txqlen) == saved["txQLen"],
        "not restored to {saved}: {l}"
    );
    ensure!(!flag(&l, "PROMISC"), "{l}");
    ensure!(topo.container.sysctl("net.ipv4.conf.eth0.arp_ignore")? == "0");
    ensure!(topo.container.sysctl("net.ipv4.conf.all.arp_announce")? == "0");
    ensure!(!backup.exists(), "backup file left after DEL");

    // The whole chain, as a runtime would (our DEL runs again, with nothing left to do).
    runtime.del(&list, &rt)?;
    ensure!(!topo.container.has_link(IFNAME)?);
    Ok(())
}

#[test]
fn chain_del_restores_namespace_wide_sysctls_and_removes_the_backup() -> Result<()> {
    let topo = Topology::new("tunedel")?;
    let scratch = tempfile::tempdir()?;
    let data_dir = scratch.path().join("tuning");
    let list = chain(
        scratch.path(),
        "0.4.0",
        json!({"type": "tuning", "dataDir": data_dir,
               "sysctl": {"net.ipv4.ip_forward": "1", "net.ipv4.conf.IFNAME.rp_filter": "2"}}),
    );
    let runtime = Runtime::new(&topo.host)?;
    let rt = RuntimeConf::new("tune-del-1", topo.container.path(), IFNAME);
    runtime.add(&list, &rt)?;
    ensure!(topo.container.sysctl("net.ipv4.ip_forward")? == "1");
    runtime.check(&list, &rt)?;
    runtime.del(&list, &rt)?;
    ensure!(topo.container.sysctl("net.ipv4.ip_forward")? == "0");
    ensure!(
        std::fs::read_dir(&data_dir)?
            .filter_map(Result::ok)
            .all(|e| e.file_name().to_string_lossy().starts_with('.'))
    );
    runtime.del(&list, &rt).context("DEL twice")?;
    Ok(())
}

/// Runs `f` on a thread with a private mount namespace whose `/etc` is an overlay holding
/// `/etc/cni/tuning/allowlist.conf` with `contents`; the machine's `/etc` is never written.
/// Plugins spawned from that thread (and threads it starts) see the overlay.
fn with_allowlist<T: Send>(contents: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let layers = tempfile::tempdir()?;
    let (upper, work) = (layers.path().join("upper"), layers.path().join("work"));
    std::fs::create_dir_all(upper.join("cni/tuning"))?;
    std::fs::create_dir_all(&work)?;
    std::fs::write(upper.join("cni/tuning/allowlist.conf"), contents)?;
    let setup = || -> Result<()> {
        let options = format!(
            "lowerdir=/etc,upperdir={},workdir={}",
            upper.display(),
            work.display()
        );
        mount(
            Some("overlay"),
            "/etc",
            Some("overlay"),
            MsFlags::empty(),
            Some(options.as_str()),
        )
        .context("overlay mount on /etc in the private mount namespace")?;
        Ok(())
    };
    with_private_mounts(setup, f)
}

/// Our tuning alone on a container netns with an `eth0`, given a fake prevResult.
struct Alone {
    container: TestNetns,
    runtime: Runtime,
    _host: TestNetns,
    scratch: tempfile::TempDir,
}

impl Alone {
    fn new(prefix: &str) -> Result<Alone> {
        let host = TestNetns::new(&format!("{prefix}-h"))?;
        let container = TestNetns::new(&format!("{prefix}-c"))?;
        container.ip(&[
            "link", "add", IFNAME, "type", "veth", "peer", "name", "peer0",
        ])?;
        Ok(Alone {
            runtime: Runtime::new(&host)?,
            _host: host,
            container,
            scratch: tempfile::tempdir()?,
        })
    }

    fn data_dir(&self) -> PathBuf {
        self.scratch.path().join("tuning")
    }

    fn conf(&self, version: &str, keys: Value) -> Value {
        let prev = json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": IFNAME, "mac": "aa:bb:cc:dd:ee:ff", "sandbox": self.container.path()}],
            "ips": [{"interface": 0, "address": "10.94.0.2/24"}]
        });
        // The prevResult as a plugin of `version` would have printed it.
        let prev = cni::types::CniResult::parse(&prev)
            .and_then(|(_, r)| r.to_json(version))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .unwrap_or(prev);
        let mut conf = keys;
        conf["cniVersion"] = json!(version);
        conf["name"] = json!("alone");
        conf["type"] = json!("tuning");
        conf["dataDir"] = json!(self.data_dir());
        conf["prevResult"] = prev;
        conf
    }

    fn exec(&self, command: &str, container_id: &str, conf: &Value) -> Result<PluginOutput> {
        self.exec_text(command, container_id, &conf.to_string())
    }

    /// As [`Alone::exec`], with the configuration's text as given (duplicate keys and all).
    fn exec_text(&self, command: &str, container_id: &str, conf: &str) -> Result<PluginOutput> {
        self.exec_binary("tuning", command, container_id, conf)
    }

    /// As [`Alone::exec_text`], with `binary` (a name in the runtime's path, or a path).
    fn exec_binary(
        &self,
        binary: &str,
        command: &str,
        container_id: &str,
        conf: &str,
    ) -> Result<PluginOutput> {
        let netns = self
            .container
            .path()
            .to_str()
            .unwrap_or_default()
            .to_owned();
        self.runtime.exec_plugin(
            binary,
            Some(command),
            &[
                ("CNI_CONTAINERID", container_id),
                ("CNI_NETNS", &netns),
                ("CNI_IFNAME", IFNAME),
                // Required by the Go skel.
                ("CNI_PATH", "/usr/lib/cni"),
            ],
            conf.as_bytes(),
        )
    }
}

#[test]
fn the_allowlist_refuses_keys_it_does_not_match_whole_and_allows_those_it_does() -> Result<()> {
    let stage = Alone::new("tuneallow")?;
    let allowlist = "net\\.ipv4\\.conf\\.IFNAME\\..*\n\nnet.core.somaxconn\n";
    let machine_file = Path::new("/etc/cni/tuning/allowlist.conf");
    let machine_before = std::fs::read(machine_file).ok();
    with_allowlist(allowlist, || {
        let refused = stage.conf(
            "1.0.0",
            json!({"sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2", "net.ipv4.ip_forward": "1"}}),
        );
        let out = stage.exec("ADD", "allow-1", &refused)?;
        let err = out.error().context("ADD refused without an error object")?;
        ensure!(err.code == 7, "code {}: {}", err.code, err.msg);
        // The reference's message, with the lines as it lists them; ours in details.
        ensure!(
            err.msg
                == "Sysctl net.ipv4.ip_forward is not allowed. Only the following sysctls are \
                    allowed: [net\\.ipv4\\.conf\\.IFNAME\\..* net.core.somaxconn]",
            "{}",
            err.msg
        );
        ensure!(
            err.details.contains("\"net.ipv4.ip_forward\"") && err.details.contains("\"1\""),
            "{}",
            err.details
        );
        ensure!(
            stage.container.sysctl("net.ipv4.conf.eth0.rp_filter")? == "0",
            "nothing may change"
        );
        // Matching a prefix is not enough: the whole key must match.
        let prefix = stage.conf("1.0.0", json!({"sysctl": {"net.core.somaxconnx": "1"}}));
        ensure!(
            stage
                .exec("ADD", "allow-1", &prefix)?
                .error()
                .is_some_and(|e| e.code == 7)
        );
        let out = stage.exec("DEL", "allow-1", &refused)?;
        ensure!(out.status.success(), "DEL after a refused ADD: {out:?}");

        let allowed = stage.conf(
            "1.0.0",
            json!({"sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2", "net.core.somaxconn": "512"}}),
        );
        let out = stage.exec("ADD", "allow-2", &allowed)?;
        ensure!(out.status.success(), "allowed ADD: {out:?}");
        ensure!(stage.container.sysctl("net.ipv4.conf.eth0.rp_filter")? == "2");
        ensure!(stage.exec("DEL", "allow-2", &allowed)?.status.success());
        ensure!(stage.container.sysctl("net.ipv4.conf.eth0.rp_filter")? == "0");
        Ok(())
    })?;
    ensure!(
        std::fs::read(machine_file).ok() == machine_before,
        "the machine's /etc was changed"
    );
    Ok(())
}

#[test]
fn validation_errors_are_code_7_naming_key_and_value_and_change_nothing() -> Result<()> {
    let stage = Alone::new("tuneval")?;
    let cases = [
        (json!({"sysctl": {"kernel.panic": "1"}}), "kernel.panic"),
        (
            json!({"sysctl": {"net/ipv4/../../kernel/panic": "1"}}),
            "net/ipv4/../../kernel/panic",
        ),
        (json!({"mac": "02:00:00:00:00"}), "02:00:00:00:00"),
        (json!({"mtu": 70000}), "70000"),
        (json!({"txQLen": -1}), "-1"),
        (
            json!({"args": {"cni": {"sysctl": {"net.ipv4.ip_forward": "1"}}}}),
            "net.ipv4.ip_forward",
        ),
    ];
    for (keys, named) in cases {
        let out = stage.exec("ADD", "val-1", &stage.conf("1.0.0", keys.clone()))?;
        let err = out
            .error()
            .with_context(|| format!("{keys}: no error object"))?;
        ensure!(err.code == 7, "{keys}: code {} {}", err.code, err.msg);
        // The msg is the reference's where it refuses the value too; ours names it in details.
        ensure!(
            err.msg.contains(named) || err.details.contains(named),
            "{keys}: {err:?}"
        );
        ensure!(
            !String::from_utf8_lossy(&out.stderr).contains("panicked"),
            "{keys}: panic"
        );
    }
    ensure!(
        !stage
            .data_dir()
            .join(format!("val-1_{IFNAME}.json"))
            .exists()
    );
    Ok(())
}

#[test]
fn gc_removes_backups_of_this_network_that_are_no_longer_valid() -> Result<()> {
    let stage = Alone::new("tunegc")?;
    let keys = json!({"sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2"}});
    for id in ["gc-live", "gc-stale"] {
        let out = stage.exec("ADD", id, &stage.conf("1.1.0", keys.clone()))?;
        ensure!(out.status.success(), "{out:?}");
    }
    // A file of another network and one written by the Go plugin (no network recorded).
    std::fs::write(
        stage.data_dir().join("other_eth0.json"),
        r#"{"mtu": 1500, "network": "othernet", "containerID": "other", "ifname": "eth0"}"#,
    )?;
    std::fs::write(
        stage.data_dir().join("go_eth0.json"),
        "{\n \"mtu\": 1500\n}",
    )?;
    let mut gc = stage.conf("1.1.0", json!({}));
    gc.as_object_mut().map(|o| o.remove("prevResult"));
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "gc-live", "ifname": IFNAME}]);
    let out = stage
        .runtime
        .exec_plugin("tuning", Some("GC"), &[], gc.to_string().as_bytes())?;
    ensure!(out.status.success() && out.stdout.is_empty(), "GC: {out:?}");
    let mut left: Vec<String> = std::fs::read_dir(stage.data_dir())?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    left.sort();
    ensure!(
        left == ["gc-live_eth0.json", "go_eth0.json", "other_eth0.json"],
        "{left:?}"
    );
    Ok(())
}

#[test]
fn status_reports_an_unusable_data_dir_as_code_50() -> Result<()> {
    let stage = Alone::new("tunestat")?;
    let mut conf = stage.conf("1.1.0", json!({}));
    conf.as_object_mut().map(|o| o.remove("prevResult"));
    let out =
        stage
            .runtime
            .exec_plugin("tuning", Some("STATUS"), &[], conf.to_string().as_bytes())?;
    ensure!(
        out.status.success() && out.stdout.is_empty(),
        "STATUS: {out:?}"
    );
    let file = stage.scratch.path().join("a-file");
    std::fs::write(&file, "")?;
    conf["dataDir"] = json!(file.join("tuning"));
    let out =
        stage
            .runtime
            .exec_plugin("tuning", Some("STATUS"), &[], conf.to_string().as_bytes())?;
    let err = out.error().context("STATUS printed no error")?;
    ensure!(err.code == 50, "{err:?}");
    ensure!(err.msg.contains("a-file"), "{}", err.msg);
    Ok(())
}

#[test]
fn every_version_from_0_1_0_to_1_1_0_prints_the_mac_into_its_result() -> Result<()> {
    let stage = Alone::new("tunever")?;
    for version in cni::version::ALL {
        let conf = stage.conf(version, json!({"mac": MAC}));
        let out = stage.exec("ADD", "ver-1", &conf)?;
        ensure!(out.status.success(), "{version}: {out:?}");
        let result = out.json()?;
        ensure!(result["cniVersion"] == *version, "{version}: {result}");
        if version.starts_with("0.1") || version.starts_with("0.2") {
            ensure!(result["ip4"]["ip"] == "10.94.0.2/24", "{version}: {result}");
        } else {
            ensure!(result["interfaces"][0]["mac"] == MAC, "{version}: {result}");
        }
        ensure!(link(&stage.container, IFNAME)?["address"] == MAC);
        ensure!(stage.exec("DEL", "ver-1", &conf)?.status.success());
        ensure!(
            link(&stage.container, IFNAME)?["address"] != MAC,
            "{version}: MAC not restored"
        );
    }
    Ok(())
}

/// Issue 22 item 10: a symlink planted where earlier versions wrote the backup's temporary file
/// (`<dataDir>/.<id>_<if>.json.tmp`), or at the temporary directory, is never written through
/// nor renamed into place; DEL removes the planted link, never its target.
#[test]
fn a_symlink_planted_at_the_backups_temporary_names_is_not_written_through() -> Result<()> {
    let stage = Alone::new("tunesym")?;
    let victim = stage.scratch.path().join("victim");
    std::fs::write(&victim, "precious")?;
    let victim_dir = stage.scratch.path().join("victim-dir");
    std::fs::create_dir(&victim_dir)?;
    std::fs::create_dir_all(stage.data_dir())?;
    let planted = stage.data_dir().join(format!(".sym-1_{IFNAME}.json.tmp"));
    std::os::unix::fs::symlink(&victim, &planted)?;
    std::os::unix::fs::symlink(&victim_dir, stage.data_dir().join(".tmp"))?;
    let conf = stage.conf("1.0.0", json!({"mtu": 1400}));
    let out = stage.exec("ADD", "sym-1", &conf)?;
    ensure!(out.status.success(), "ADD: {out:?}");
    ensure!(
        std::fs::read_to_string(&victim)? == "precious",
        "written through"
    );
    ensure!(
        std::fs::read_dir(&victim_dir)?.next().is_none(),
        "a temporary file went through the planted directory link"
    );
    let backup = stage.data_dir().join(format!("sym-1_{IFNAME}.json"));
    ensure!(std::fs::symlink_metadata(&backup)?.is_file());
    let saved: Value = serde_json::from_slice(&std::fs::read(&backup)?)?;
    ensure!(saved["mtu"] == 1500, "{saved}");
    let out = stage.exec("DEL", "sym-1", &conf)?;
    ensure!(out.status.success(), "DEL: {out:?}");
    ensure!(link(&stage.container, IFNAME)?["mtu"] == 1500);
    ensure!(std::fs::symlink_metadata(&planted).is_err() && !backup.exists());
    ensure!(std::fs::read_to_string(&victim)? == "precious");
    Ok(())
}

/// Issue 26 item 1, in tuning: container `tcol_x` with `eth0` and container `tcol` with
/// `x_eth0` meet at the reference's backup name `tcol_x_eth0.json`. The second ADD took the
/// first's backup for its own and replaced it, so the first's DEL found nothing and left its
/// MTU changed. Each keeps its own backup now, and each DEL restores its own link.
#[test]
fn attachments_whose_backup_names_meet_each_restore_their_own_link() -> Result<()> {
    let stage = Alone::new("tunecol")?;
    stage.container.ip(&[
        "link", "add", "x_eth0", "mtu", "9000", "type", "veth", "peer", "name", "peer1",
    ])?;
    let conf = stage.conf("1.0.0", json!({"mtu": 1400}));
    let netns = stage.container.path().to_string_lossy().into_owned();
    let exec = |command: &str, id: &str, ifname: &str| -> Result<()> {
        let out = stage.runtime.exec_plugin(
            "tuning",
            Some(command),
            &[
                ("CNI_CONTAINERID", id),
                ("CNI_NETNS", &netns),
                ("CNI_IFNAME", ifname),
            ],
            conf.to_string().as_bytes(),
        )?;
        ensure!(out.status.success(), "{command} {id}/{ifname}: {out:?}");
        Ok(())
    };
    exec("ADD", "tcol_x", IFNAME)?;
    exec("ADD", "tcol", "x_eth0")?;
    for ifname in [IFNAME, "x_eth0"] {
        ensure!(link(&stage.container, ifname)?["mtu"] == 1400, "{ifname}");
    }
    exec("DEL", "tcol", "x_eth0")?;
    ensure!(link(&stage.container, "x_eth0")?["mtu"] == 9000);
    ensure!(
        link(&stage.container, IFNAME)?["mtu"] == 1400,
        "the other attachment's DEL restored eth0"
    );
    exec("DEL", "tcol_x", IFNAME)?;
    ensure!(
        link(&stage.container, IFNAME)?["mtu"] == 1500,
        "eth0 not restored by its own DEL"
    );
    let left: Vec<_> = std::fs::read_dir(stage.data_dir())?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    ensure!(left.is_empty(), "backups left: {left:?}");
    Ok(())
}

/// Issue 19: a top-level `sysctl` object naming a key twice fails ADD and CHECK with code 7 and
/// the reference's message before anything changes; DEL, which the reference does not check
/// either, goes through.
#[test]
fn duplicate_sysctl_keys_fail_add_and_check_before_any_change() -> Result<()> {
    let stage = Alone::new("tunedup")?;
    let before = stage.container.sysctl("net.ipv4.conf.eth0.arp_ignore")?;
    let good = stage.conf(
        "1.0.0",
        json!({"mtu": 1400, "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}}),
    );
    let text = good.to_string();
    let dup = text.replacen(
        r#""net.ipv4.conf.IFNAME.arp_ignore":"1""#,
        r#""net.ipv4.conf.IFNAME.arp_ignore":"1","net.ipv4.conf.IFNAME.arp_ignore":"2""#,
        1,
    );
    ensure!(dup != text, "{text}");
    for verb in ["ADD", "CHECK"] {
        let out = stage.exec_text(verb, "dup-1", &dup)?;
        let err = out.error().with_context(|| format!("{verb}: {out:?}"))?;
        ensure!(
            err.code == 7 && err.msg == "duplicated sysctl keys are not allowed",
            "{verb}: {err:?}"
        );
        ensure!(
            err.details.contains("net.ipv4.conf.IFNAME.arp_ignore"),
            "{verb}: {err:?}"
        );
    }
    ensure!(stage.container.sysctl("net.ipv4.conf.eth0.arp_ignore")? == before);
    ensure!(link(&stage.container, IFNAME)?["mtu"] == 1500);
    ensure!(
        !stage
            .data_dir()
            .join(format!("dup-1_{IFNAME}.json"))
            .exists()
    );
    let out = stage.exec_text("DEL", "dup-1", &dup)?;
    ensure!(out.status.success(), "DEL: {out:?}");
    Ok(())
}

/// Whether a Go `tuning` binary knows `txQLen` (v1.4.0 and later): its ADD, on an interface
/// of a namespace of its own, changes the queue length or not. (Debian's binary prints no
/// version of its own.)
fn go_knows_txqlen(go: &str) -> Result<bool> {
    let stage = Alone::new("tunegoprobe")?;
    let conf = stage.conf("1.0.0", json!({"txQLen": 7}));
    let out = stage.exec_binary(go, "ADD", "probe-1", &conf.to_string())?;
    ensure!(out.status.success(), "Go ADD with txQLen: {out:?}");
    Ok(link(&stage.container, IFNAME)?["txqlen"] == 7)
}

/// Issue 22 item 13: what the Go DEL restores from our backup file (the README's claim). Go
/// reads the keys it knows: HEAD restores every link attribute ours sets, Debian's 1.1.1
/// predates `txQLen` (v1.4.0) and leaves the queue length changed; no Go version restores
/// sysctls. Either way it removes the file.
#[test]
fn the_go_del_restores_from_our_file_the_link_attributes_it_knows() -> Result<()> {
    let stage = Alone::new("tunegodel")?;
    let go = tests::bins::reference_binary("tuning")?;
    let go = go.to_str().context("path")?;
    let knows_txqlen = go_knows_txqlen(go)?;
    let before = link(&stage.container, IFNAME)?;
    let conf = stage.conf(
        "1.0.0",
        json!({"mac": "02:aa:bb:cc:dd:01", "mtu": 1400, "promisc": true, "allmulti": true,
               "txQLen": 500, "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}}),
    );
    let out = stage.exec("ADD", "godel-1", &conf)?;
    ensure!(out.status.success(), "our ADD: {out:?}");
    let changed = link(&stage.container, IFNAME)?;
    ensure!(
        changed["txqlen"] == 500 && changed["mtu"] == 1400,
        "{changed}"
    );
    let out = stage.exec_binary(go, "DEL", "godel-1", &conf.to_string())?;
    ensure!(out.status.success(), "Go DEL: {out:?}");
    let after = link(&stage.container, IFNAME)?;
    for key in ["address", "mtu"] {
        ensure!(after[key] == before[key], "{key}: {after} vs {before}");
    }
    for f in ["PROMISC", "ALLMULTI"] {
        ensure!(
            flag(&after, f) == flag(&before, f),
            "{f}: {after} vs {before}"
        );
    }
    let want_txqlen = if knows_txqlen {
        &before["txqlen"]
    } else {
        &json!(500)
    };
    ensure!(
        after["txqlen"] == *want_txqlen,
        "txqlen {} (Go knows txQLen: {knows_txqlen})",
        after["txqlen"]
    );
    ensure!(stage.container.sysctl("net.ipv4.conf.eth0.arp_ignore")? == "1");
    ensure!(
        !stage
            .data_dir()
            .join(format!("godel-1_{IFNAME}.json"))
            .exists()
    );
    Ok(())
}
