//! Differential tests against the Go reference binaries of Debian's `containernetworking-plugins`.
//!
//! The Go `tuning` with no settings is a pure pass-through of its prevResult, printed by the Go
//! CNI library; our `passthrough` prints its prevResult through `common::types`. Fed the same
//! stdin, both must print the same bytes in every 0.x version: that pins our result parsing,
//! conversion and printing (key order, omitted fields, indentation, escaping) to Go's.
//!
//! Our `tuning` is compared with the Go one directly: the same result for the same config (MAC
//! sources and precedence included) in every shared version, a Go ADD undone by our DEL from
//! the Go backup file, and our ADD passing the Go CHECK and undone by the Go DEL from our file.
//!
//! Debian 12 ships plugins 1.1.1, built on an older CNI library than the reference we follow
//! (cni v1.3.0): it has no route `mtu`/`advmss`/`priority`/`table`/`scope` nor interface `mtu`,
//! and prints 1.0.0 results in struct order where v1.3.0 sorts their keys. So the inputs here
//! avoid those fields, and 1.x outputs are compared as JSON values rather than bytes.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use tests::{PluginOutput, Runtime, TestNetns};

/// Debian's Go plugins (1.1.1) speak up to 1.0.0.
const SHARED_VERSIONS: [&str; 6] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// A prevResult with everything Debian's Go library knows of, in the 1.0.0 shape.
fn rich_result(sandbox: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "cni0", "mac": "56:c1:60:b0:c5:90"},
            {"name": "veth1234", "mac": "aa:3b:e6:b0:a0:4b"},
            {"name": "eth0", "mac": "a6:94:68:1a:1e:89", "sandbox": sandbox}
        ],
        "ips": [
            {"interface": 2, "address": "10.96.10.2/24", "gateway": "10.96.10.1"},
            {"interface": 2, "address": "fd00:10::2/64", "gateway": "fd00:10::1"},
            {"address": "10.96.11.7/24"}
        ],
        "routes": [
            {"dst": "0.0.0.0/0"},
            {"dst": "::/0", "gw": "fd00:10::1"},
            {"dst": "192.0.2.0/24", "gw": "10.96.10.254"}
        ],
        "dns": {"nameservers": ["10.96.0.10"], "domain": "cluster.local", "search": ["ns.svc.cluster.local"], "options": ["ndots:5"]}
    })
}

/// The prevResult as a plugin of `version` would have printed it.
fn in_version(result: &Value, version: &str) -> Result<Value> {
    let (_, model) = common::types::CniResult::parse(result)?;
    Ok(serde_json::from_str(&model.to_json(version)?)?)
}

struct Pair {
    go: PluginOutput,
    ours: PluginOutput,
}

/// A host namespace to run plugins in and a container namespace with an `eth0`.
struct Stage {
    _host: TestNetns,
    _container: TestNetns,
    runtime: Runtime,
    netns: String,
}

impl Stage {
    fn new(prefix: &str) -> Result<Stage> {
        let host = TestNetns::new(&format!("{prefix}-h"))?;
        let container = TestNetns::new(&format!("{prefix}-c"))?;
        container.ip(&[
            "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
        ])?;
        let netns = container.path().to_str().context("netns path")?.to_owned();
        Ok(Stage {
            runtime: Runtime::new(&host)?,
            _host: host,
            _container: container,
            netns,
        })
    }

    /// Runs the Go `tuning` and our `passthrough` ADD on the same config and prevResult.
    fn run_both(&self, version: &str, prev: &Value) -> Result<Pair> {
        let scratch = tempfile::tempdir()?;
        let conf = |plugin: &str| {
            json!({
                "cniVersion": version,
                "name": "differential",
                "type": plugin,
                "dataDir": scratch.path(),
                "prevResult": prev,
            })
            .to_string()
        };
        let env = [
            ("CNI_CONTAINERID", "differential-1"),
            ("CNI_NETNS", &self.netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni"),
        ];
        let go_tuning = tests::bins::reference_binary("tuning")?;
        let go = self.runtime.exec_plugin(
            go_tuning.to_str().unwrap_or_default(),
            Some("ADD"),
            &env,
            conf("tuning").as_bytes(),
        )?;
        let ours = self.runtime.exec_plugin(
            "passthrough",
            Some("ADD"),
            &env,
            conf("passthrough").as_bytes(),
        )?;
        Ok(Pair { go, ours })
    }
}

/// Same bytes in 0.x; the same JSON value in 1.x (see the module docs).
fn same_output(pair: &Pair, version: &str, case: &str) -> Result<()> {
    let show = |o: &PluginOutput| String::from_utf8_lossy(&o.stdout).into_owned();
    ensure!(
        pair.go.status.success(),
        "{case}: Go failed: {} {}",
        show(&pair.go),
        String::from_utf8_lossy(&pair.go.stderr)
    );
    ensure!(
        pair.ours.status.success(),
        "{case}: ours failed: {}",
        show(&pair.ours)
    );
    let same = if version.starts_with("0.") {
        pair.go.stdout == pair.ours.stdout
    } else {
        serde_json::from_slice::<Value>(&pair.go.stdout)?
            == serde_json::from_slice::<Value>(&pair.ours.stdout)?
    };
    ensure!(
        same,
        "{case}: outputs differ\n--- Go:\n{}\n--- ours:\n{}",
        show(&pair.go),
        show(&pair.ours)
    );
    Ok(())
}

#[test]
fn results_are_printed_byte_for_byte_as_go_prints_them_in_every_shared_version() -> Result<()> {
    let stage = Stage::new("diffprint")?;
    let netns = stage.netns.clone();
    let rich = rich_result(&netns);
    let mut failures = Vec::new();
    for prev_version in SHARED_VERSIONS {
        let prev = in_version(&rich, prev_version)?;
        for conf_version in SHARED_VERSIONS {
            let same_era =
                common::version::Era::of(prev_version) == common::version::Era::of(conf_version);
            if !same_era {
                continue;
            }
            let case = format!("prevResult {prev_version}, config {conf_version}");
            if let Err(e) = stage
                .run_both(conf_version, &prev)
                .and_then(|p| same_output(&p, conf_version, &case))
            {
                failures.push(format!("{e:#}"));
            }
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn prev_results_without_a_version_with_go_cased_keys_or_odd_characters_print_as_go_prints_them()
-> Result<()> {
    let stage = Stage::new("diffkeys")?;
    let netns = stage.netns.clone();
    let mut no_version = rich_result(&netns);
    no_version
        .as_object_mut()
        .context("object")?
        .remove("cniVersion");
    let cased = json!({
        "CNIVersion": "0.4.0",
        "Interfaces": [{"Name": "eth0", "MAC": "a6:94:68:1a:1e:89", "Sandbox": netns}],
        "IPs": [{"Version": "4", "Interface": 0, "Address": "10.96.10.2/24", "Gateway": "10.96.10.1"}],
        "Routes": [{"Dst": "0.0.0.0/0", "GW": "10.96.10.1"}],
        "DNS": {"Nameservers": ["10.96.0.10"]}
    });
    let escaped = json!({
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "eth0", "mac": "a6:94:68:1a:1e:89", "sandbox": format!("{netns}?a=<b>&c")}],
        "ips": [{"version": "4", "address": "10.96.10.2/24"}],
        "dns": {"domain": "caf\u{e9}.example", "search": ["a\u{2028}b", "tab\there"]}
    });
    let cases = [
        ("1.0.0", &no_version, "prevResult without cniVersion"),
        ("0.4.0", &cased, "capitalised keys"),
        ("0.4.0", &escaped, "characters Go escapes"),
    ];
    for (version, prev, case) in cases {
        same_output(&stage.run_both(version, prev)?, version, case)?;
    }
    Ok(())
}

/// Bad calls get the same error code from Debian's Go `tuning` and from our skel. (An unknown
/// `CNI_COMMAND` is left out: Debian's skel is older than the reference and answers 3 there.)
#[test]
fn bad_calls_get_the_same_error_codes_as_the_go_skel() -> Result<()> {
    let host = TestNetns::new("diffcodes")?;
    let runtime = Runtime::new(&host)?;
    let go_tuning = tests::bins::reference_binary("tuning")?;
    let go_tuning = go_tuning.to_str().unwrap_or_default();
    let del = [
        ("CNI_CONTAINERID", "c1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/usr/lib/cni"),
    ];
    type Env<'a> = Vec<(&'a str, &'a str)>;
    let cases: [(&str, &str, Env, &str, u64); 8] = [
        ("bad JSON", "DEL", del.to_vec(), "{", 6),
        (
            "no network name",
            "DEL",
            del.to_vec(),
            r#"{"cniVersion":"1.0.0"}"#,
            7,
        ),
        (
            "bad network name",
            "DEL",
            del.to_vec(),
            r#"{"cniVersion":"1.0.0","name":"a b"}"#,
            7,
        ),
        (
            "bad container ID",
            "DEL",
            vec![
                ("CNI_CONTAINERID", "-c"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/x"),
            ],
            r#"{"cniVersion":"1.0.0","name":"a"}"#,
            4,
        ),
        (
            "interface name too long",
            "DEL",
            vec![
                ("CNI_CONTAINERID", "c"),
                ("CNI_IFNAME", "abcdefghijklmnopq"),
                ("CNI_PATH", "/x"),
            ],
            r#"{"cniVersion":"1.0.0","name":"a"}"#,
            4,
        ),
        (
            "unsupported version",
            "DEL",
            del.to_vec(),
            r#"{"cniVersion":"0.9.0","name":"a"}"#,
            1,
        ),
        (
            "CHECK below 0.4.0",
            "CHECK",
            vec![
                ("CNI_CONTAINERID", "c"),
                ("CNI_NETNS", "/run/netns/none"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/x"),
            ],
            r#"{"cniVersion":"0.3.1","name":"a"}"#,
            1,
        ),
        (
            "missing variables",
            "ADD",
            vec![("CNI_PATH", "/x")],
            r#"{"cniVersion":"1.0.0","name":"a"}"#,
            4,
        ),
    ];
    for (case, command, env, stdin, code) in cases {
        for plugin in [go_tuning, "passthrough"] {
            let out = runtime.exec_plugin(plugin, Some(command), &env, stdin.as_bytes())?;
            let err = out
                .error()
                .with_context(|| format!("{case}: {plugin} printed no error object"))?;
            ensure!(!out.status.success(), "{case}: {plugin} exited 0");
            ensure!(
                err.code == code,
                "{case}: {plugin} gave code {} ({}), want {code}",
                err.code,
                err.msg
            );
        }
    }
    Ok(())
}

/// Link attributes tuning touches, as `ip -j -d link show` reports them.
fn link_attrs(ns: &TestNetns, ifname: &str) -> Result<Value> {
    let l = ns.ip_json(&["-d", "link", "show", "dev", ifname])?[0].clone();
    let flags = l["flags"].as_array().cloned().unwrap_or_default();
    Ok(json!({
        "address": l["address"],
        "mtu": l["mtu"],
        // `ip -j` leaves txqlen out when it is 0.
        "txqlen": l["txqlen"].as_u64().unwrap_or(0),
        "promisc": flags.contains(&json!("PROMISC")),
        "allmulti": flags.contains(&json!("ALLMULTI")),
    }))
}

/// Go's `tuning` and ours, on one container netns and one data dir.
struct TuningStage {
    container: TestNetns,
    _host: TestNetns,
    runtime: Runtime,
    netns: String,
    data_dir: tempfile::TempDir,
}

impl TuningStage {
    fn new(prefix: &str) -> Result<TuningStage> {
        let host = TestNetns::new(&format!("{prefix}-h"))?;
        let container = TestNetns::new(&format!("{prefix}-c"))?;
        container.ip(&[
            "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
        ])?;
        let netns = container.path().to_str().context("netns path")?.to_owned();
        Ok(TuningStage {
            runtime: Runtime::new(&host)?,
            _host: host,
            container,
            netns,
            data_dir: tempfile::tempdir()?,
        })
    }

    fn conf(&self, version: &str, keys: &Value, prev: &Value) -> Value {
        let mut conf = keys.clone();
        conf["cniVersion"] = json!(version);
        conf["name"] = json!("differential");
        conf["type"] = json!("tuning");
        conf["dataDir"] = json!(self.data_dir.path());
        conf["prevResult"] = prev.clone();
        conf
    }

    /// Runs `command` of the Go binary (`go`) or ours.
    fn exec(&self, go: bool, command: &str, conf: &Value, cni_args: &str) -> Result<PluginOutput> {
        let binary = if go {
            tests::bins::reference_binary("tuning")?
        } else {
            tests::bins::plugin_binary("tuning")?
        };
        self.runtime.exec_plugin(
            binary.to_str().unwrap_or_default(),
            Some(command),
            &[
                ("CNI_CONTAINERID", "differential-1"),
                ("CNI_NETNS", &self.netns),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/usr/lib/cni"),
                ("CNI_ARGS", cni_args),
            ],
            conf.to_string().as_bytes(),
        )
    }

    fn backup_file(&self) -> std::path::PathBuf {
        self.data_dir.path().join("differential-1_eth0.json")
    }

    /// ADD then DEL by Go, then by ours, on the same interface; the two ADD outputs.
    fn add_both(&self, conf: &Value, cni_args: &str) -> Result<Pair> {
        let before = link_attrs(&self.container, "eth0")?;
        let mut outputs = Vec::new();
        for go in [true, false] {
            let add = self.exec(go, "ADD", conf, cni_args)?;
            let del = self.exec(go, "DEL", conf, cni_args)?;
            ensure!(del.status.success(), "DEL (go: {go}): {del:?}");
            ensure!(
                link_attrs(&self.container, "eth0")? == before,
                "DEL (go: {go}) did not restore the link"
            );
            outputs.push(add);
        }
        let ours = outputs.pop().context("ours")?;
        let go = outputs.pop().context("go")?;
        Ok(Pair { go, ours })
    }
}

/// The tuning keys Debian's Go `tuning` (1.1.1) knows: no `txQLen`, no allowlist.
fn go_tuning_keys() -> Value {
    json!({
        "mac": "02:AA:bb:cc:dd:01",
        "mtu": 1400,
        "promisc": true,
        "allmulti": true,
        "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"},
    })
}

#[test]
fn our_tuning_prints_what_go_tuning_prints_in_every_shared_version() -> Result<()> {
    let stage = TuningStage::new("difftune")?;
    let rich = rich_result(&stage.netns);
    let mut failures = Vec::new();
    let precedence = json!({
        "mac": "02:00:00:00:00:01",
        "runtimeConfig": {"mac": "02:00:00:00:00:03"},
        "args": {"cni": {"mac": "02:00:00:00:00:04", "mtu": 1300}},
        "mtu": 1400,
    });
    for version in SHARED_VERSIONS {
        let prev = in_version(&rich, version)?;
        let cases = [
            ("all Go keys", go_tuning_keys(), ""),
            (
                "MAC from CNI_ARGS",
                json!({"mac": "02:00:00:00:00:01"}),
                "IgnoreUnknown=1;MAC=02:00:00:00:00:02",
            ),
            (
                "MAC and MTU precedence",
                precedence.clone(),
                "IgnoreUnknown=1;MAC=02:00:00:00:00:02",
            ),
        ];
        for (case, keys, args) in cases {
            let case = format!("{case}, {version}");
            let conf = stage.conf(version, &keys, &prev);
            if let Err(e) = stage
                .add_both(&conf, args)
                .and_then(|p| same_output(&p, version, &case))
            {
                failures.push(format!("{e:#}"));
            }
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn a_go_add_is_undone_by_our_del() -> Result<()> {
    let stage = TuningStage::new("diffgodel")?;
    let before = link_attrs(&stage.container, "eth0")?;
    let prev = in_version(&rich_result(&stage.netns), "1.0.0")?;
    let conf = stage.conf("1.0.0", &go_tuning_keys(), &prev);
    let add = stage.exec(true, "ADD", &conf, "")?;
    ensure!(add.status.success(), "Go ADD: {add:?}");
    ensure!(
        link_attrs(&stage.container, "eth0")? != before,
        "Go ADD changed nothing"
    );
    // The Go file, read here as JSON: only the attributes it changes, one-space indentation.
    let text = std::fs::read_to_string(stage.backup_file())?;
    ensure!(text.starts_with("{\n \"mac\": "), "{text}");
    let saved: Value = serde_json::from_str(&text)?;
    let want = json!({
        "mac": before["address"],
        "promisc": before["promisc"],
        "mtu": before["mtu"],
        "allmulti": before["allmulti"],
    });
    ensure!(saved == want, "Go backup {saved}, want {want}");
    let del = stage.exec(false, "DEL", &conf, "")?;
    ensure!(
        del.status.success() && del.stdout.is_empty(),
        "our DEL: {del:?}"
    );
    ensure!(
        link_attrs(&stage.container, "eth0")? == before,
        "our DEL did not restore Go's ADD"
    );
    ensure!(!stage.backup_file().exists(), "our DEL left Go's file");
    Ok(())
}

#[test]
fn our_add_passes_go_check_and_go_del_restores_from_our_file() -> Result<()> {
    let stage = TuningStage::new("diffgochk")?;
    let before = link_attrs(&stage.container, "eth0")?;
    for version in ["0.4.0", "1.0.0"] {
        let prev = in_version(&rich_result(&stage.netns), version)?;
        // Go's CHECK compares the MAC as a string against the kernel's lower-case form.
        let mut keys = go_tuning_keys();
        keys["mac"] = json!("02:aa:bb:cc:dd:01");
        // Debian's Go CHECK (1.1.1) does not substitute IFNAME (fixed in v1.3.0).
        keys["sysctl"] = json!({"net.ipv4.conf.eth0.arp_ignore": "1"});
        let conf = stage.conf(version, &keys, &prev);
        let add = stage.exec(false, "ADD", &conf, "")?;
        ensure!(add.status.success(), "our ADD: {add:?}");
        let mut check_conf = conf.clone();
        check_conf["prevResult"] = add.json()?;
        let check = stage.exec(true, "CHECK", &check_conf, "")?;
        ensure!(
            check.status.success(),
            "{version}: Go CHECK after our ADD: {}",
            String::from_utf8_lossy(&check.stdout)
        );
        let del = stage.exec(true, "DEL", &conf, "")?;
        ensure!(del.status.success(), "Go DEL: {del:?}");
        ensure!(
            link_attrs(&stage.container, "eth0")? == before,
            "{version}: Go DEL did not restore from our file"
        );
        ensure!(!stage.backup_file().exists(), "Go DEL left our file");
        // Go never restores sysctls; put it back for the next round.
        stage
            .container
            .set_sysctl("net.ipv4.conf.eth0.arp_ignore", "0")?;
    }
    Ok(())
}
