//! CNI protocol conformance, table-driven over every plugin binary of the workspace.
//!
//! Each test runs every [`Subject`] through one rule of the protocol (SPEC.md and the skel rules
//! in README.md) and reports all subjects that break it at once. Plugins run as real processes,
//! inside a throwaway host namespace; the attachment cases chain them after Debian's Go `bridge`
//! + `host-local` on a fresh container namespace. A plugin issue adds its binary to [`subjects`].

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use tests::{
    NetworkConfigList, PluginOutput, Runtime, RuntimeConf, TestNetns, Topology, bins, main_plugin,
};

/// One plugin binary under test.
struct Subject {
    /// Binary (and CNI type) name.
    name: &'static str,
    /// What VERSION must list, in order.
    versions: &'static [&'static str],
    /// The plugin's own keys for a config that ADD accepts after `bridge`, given a scratch dir.
    keys: fn(&Path) -> Value,
}

fn subjects() -> Vec<Subject> {
    vec![
        // The `cni` crate's example plugin (cni/examples/passthrough.rs): the protocol crate
        // alone, no kernel code.
        Subject {
            name: "passthrough",
            versions: cni::version::ALL,
            keys: |scratch| json!({ "dataDir": scratch.join("passthrough") }),
        },
        Subject {
            name: "tuning",
            versions: cni::version::ALL,
            keys: |scratch| {
                json!({
                    "dataDir": scratch.join("tuning"),
                    "mtu": 1400,
                    "sysctl": { "net.ipv4.conf.IFNAME.arp_ignore": "1" },
                })
            },
        },
        Subject {
            name: "sbr",
            versions: cni::version::ALL,
            // A fixed table leaves the routes alone: bridge's own CHECK looks for its default
            // route in main, which the default mode moves (sbr's end-to-end tests cover it).
            keys: |_| json!({ "table": 1000 }),
        },
        // Like the Go plugin: 0.3.0 to 1.1.0.
        Subject {
            name: "bandwidth",
            versions: bandwidth::SUPPORTED_VERSIONS,
            keys: |_| {
                json!({ "ingressRate": 8_000_000, "ingressBurst": 80_000,
                              "egressRate": 8_000_000, "egressBurst": 80_000 })
            },
        },
        Subject {
            name: "firewall",
            versions: &["0.4.0", "1.0.0", "1.1.0"],
            keys: |_| json!({ "backend": "iptables" }),
        },
        Subject {
            name: "portmap",
            versions: cni::version::ALL,
            // A static runtimeConfig reaches the plugin (no capability argument replaces it),
            // so every case programs and removes a real mapping.
            keys: |_| {
                json!({ "capabilities": { "portMappings": true }, "runtimeConfig": { "portMappings":
                    [{ "hostPort": 18080, "containerPort": 80, "protocol": "tcp" }] } })
            },
        },
    ]
}

/// A host namespace to run plugins in, a runtime, and a scratch dir for state.
struct Bench {
    /// Kept alive for the runtime, which runs plugins inside it.
    _host: TestNetns,
    runtime: Runtime,
    scratch: tempfile::TempDir,
}

impl Bench {
    fn new() -> Result<Bench> {
        Bench::with_host(TestNetns::new("conf")?)
    }

    fn with_host(host: TestNetns) -> Result<Bench> {
        let runtime =
            Runtime::new(&host)?.use_binary("passthrough", bins::example_binary("passthrough")?);
        Ok(Bench {
            _host: host,
            runtime,
            scratch: tempfile::tempdir()?,
        })
    }

    /// The same bench, each plugin run bounded by `timeout`.
    fn with_timeout(self, timeout: std::time::Duration) -> Bench {
        Bench {
            runtime: self.runtime.with_timeout(timeout),
            ..self
        }
    }

    /// A minimal config of `subject` in `version`.
    fn conf(&self, subject: &Subject, version: &str) -> Value {
        let mut conf = (subject.keys)(self.scratch.path());
        conf["cniVersion"] = json!(version);
        conf["name"] = json!("conformance");
        conf["type"] = json!(subject.name);
        conf
    }

    fn exec(
        &self,
        subject: &Subject,
        command: Option<&str>,
        env: &[(&str, &str)],
        stdin: &[u8],
    ) -> Result<PluginOutput> {
        self.runtime.exec_plugin(subject.name, command, env, stdin)
    }
}

/// Runs `case` for every subject and fails listing every subject that broke the rule.
fn for_each_subject(case: impl Fn(&Subject) -> Result<()>) {
    let failures: Vec<String> = subjects()
        .iter()
        .filter_map(|s| case(s).err().map(|e| format!("{}: {e:#}", s.name)))
        .collect();
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Stdout must be exactly one JSON document (serde rejects trailing text).
fn one_document(out: &PluginOutput) -> Result<Value> {
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "stdout is not one JSON document: {:?}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Asserts a failure with `code` and returns the error object.
fn expect_error(out: &PluginOutput, code: u64) -> Result<Value> {
    let doc = one_document(out)?;
    ensure!(
        !out.status.success(),
        "exit status {} for an error",
        out.status
    );
    ensure!(
        doc["code"] == code,
        "code {} (msg {}), want {code}",
        doc["code"],
        doc["msg"]
    );
    ensure!(
        doc["cniVersion"].is_string(),
        "error object has no cniVersion: {doc}"
    );
    ensure!(
        doc["msg"].as_str().is_some_and(|m| !m.is_empty()),
        "error object has no msg: {doc}"
    );
    Ok(doc)
}

/// A complete ADD/CHECK environment whose netns does not exist: cases using it must be refused
/// before the plugin touches any namespace.
const ATTACH_ENV: [(&str, &str); 4] = [
    ("CNI_CONTAINERID", "conformance-1"),
    ("CNI_NETNS", "/run/netns/conformance-does-not-exist"),
    ("CNI_IFNAME", "eth0"),
    ("CNI_PATH", "/usr/lib/cni"),
];

/// A complete DEL environment (DEL needs no netns).
const DEL_ENV: [(&str, &str); 2] = [("CNI_CONTAINERID", "conformance-1"), ("CNI_IFNAME", "eth0")];

#[test]
fn version_lists_the_supported_versions_and_echoes_the_callers_version() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        for asked in ["0.4.0", "1.1.0"] {
            let out = bench.exec(
                s,
                Some("VERSION"),
                &[],
                json!({"cniVersion": asked}).to_string().as_bytes(),
            )?;
            ensure!(out.status.success(), "VERSION failed: {out:?}");
            let doc = one_document(&out)?;
            ensure!(
                doc["cniVersion"] == asked,
                "cniVersion {}, want {asked}",
                doc["cniVersion"]
            );
            ensure!(
                doc["supportedVersions"] == json!(s.versions),
                "supportedVersions {}",
                doc["supportedVersions"]
            );
        }
        let out = bench.exec(s, Some("VERSION"), &[], b"")?;
        ensure!(
            one_document(&out)?["cniVersion"] == "1.1.0",
            "empty stdin should answer 1.1.0"
        );
        Ok(())
    });
}

#[test]
fn no_command_prints_what_the_plugin_is_on_stderr_only() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        let out = bench.exec(s, None, &[], b"")?;
        ensure!(out.status.success(), "exit {}", out.status);
        ensure!(
            out.stdout.is_empty(),
            "stdout {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            stderr.contains(&format!("CNI {} plugin", s.name)),
            "stderr {stderr:?}"
        );
        Ok(())
    });
}

#[test]
fn missing_variables_are_code_4_and_named() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        let conf = bench.conf(s, "1.0.0").to_string();
        for (command, listed) in [
            ("ADD", "[CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME]"),
            ("CHECK", "[CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME]"),
            ("DEL", "[CNI_CONTAINERID,CNI_IFNAME]"),
        ] {
            let out = bench.exec(s, Some(command), &[], conf.as_bytes())?;
            let err = expect_error(&out, 4).with_context(|| command.to_string())?;
            ensure!(
                err["msg"].as_str().unwrap_or("").contains(listed),
                "{command}: {}",
                err["msg"]
            );
        }
        Ok(())
    });
}

#[test]
fn invalid_container_ids_and_interface_names_are_code_4() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        let conf = bench.conf(s, "1.0.0").to_string();
        // The reference's messages; the value is in the details.
        for (key, value, msg) in [
            (
                "CNI_CONTAINERID",
                "-leading-dash",
                "invalid characters in containerID",
            ),
            (
                "CNI_CONTAINERID",
                "has/slash",
                "invalid characters in containerID",
            ),
            (
                "CNI_IFNAME",
                "sixteen-chars-xx",
                "interface name is too long",
            ),
            ("CNI_IFNAME", "..", "interface name is . or .."),
            (
                "CNI_IFNAME",
                "eth 0",
                "interface name contains / or : or whitespace characters",
            ),
        ] {
            let env: Vec<(&str, &str)> = ATTACH_ENV
                .iter()
                .map(|&(k, v)| if k == key { (k, value) } else { (k, v) })
                .collect();
            let out = bench.exec(s, Some("ADD"), &env, conf.as_bytes())?;
            let err = expect_error(&out, 4).with_context(|| format!("{key}={value}"))?;
            ensure!(err["msg"] == msg, "{key}={value}: msg {}", err["msg"]);
            ensure!(
                err["details"].as_str().is_some_and(|d| d.contains(value)),
                "{key}={value}: details {}",
                err["details"]
            );
        }
        Ok(())
    });
}

#[test]
fn an_unknown_command_is_code_4() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        let out = bench.exec(
            s,
            Some("FROBNICATE"),
            &ATTACH_ENV,
            bench.conf(s, "1.0.0").to_string().as_bytes(),
        )?;
        expect_error(&out, 4)?;
        Ok(())
    });
}

#[test]
fn bad_json_is_code_6_and_a_bad_network_name_is_code_7() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        let env = DEL_ENV;
        for input in [&b"{\"cniVersion\": "[..], b"not json", b"[]", b""] {
            let out = bench.exec(s, Some("DEL"), &env, input)?;
            expect_error(&out, 6)
                .with_context(|| format!("stdin {:?}", String::from_utf8_lossy(input)))?;
        }
        let mut conf = bench.conf(s, "1.0.0");
        conf["name"] = json!("bad name!");
        expect_error(
            &bench.exec(s, Some("DEL"), &env, conf.to_string().as_bytes())?,
            7,
        )?;
        conf.as_object_mut().map(|o| o.remove("name"));
        expect_error(
            &bench.exec(s, Some("DEL"), &env, conf.to_string().as_bytes())?,
            7,
        )?;
        Ok(())
    });
}

#[test]
fn unsupported_versions_are_code_1() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        let env = DEL_ENV;
        for version in ["0.0.1", "0.5.0", "2.0.0"] {
            let out = bench.exec(
                s,
                Some("DEL"),
                &env,
                bench.conf(s, version).to_string().as_bytes(),
            )?;
            let err = expect_error(&out, 1).with_context(|| version.to_string())?;
            ensure!(
                err["cniVersion"] == version,
                "error not in the caller's version: {err}"
            );
        }
        Ok(())
    });
}

/// ADD and DEL take only the listed version strings, as the reference's skel: a `cniVersion`
/// that is no version at all is code 1 there too. CHECK, STATUS and GC parse it first (code 6).
#[test]
fn an_unparsable_version_is_code_1_on_add_and_del_and_code_6_on_the_others() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        for version in ["1.0.0.0", "one"] {
            let conf = bench.conf(s, version).to_string();
            for (command, env, code) in [
                ("ADD", &ATTACH_ENV[..], 1),
                ("DEL", &DEL_ENV[..], 1),
                ("CHECK", &ATTACH_ENV[..], 6),
                ("STATUS", &[][..], 6),
                ("GC", &[][..], 6),
            ] {
                let out = bench.exec(s, Some(command), env, conf.as_bytes())?;
                let err =
                    expect_error(&out, code).with_context(|| format!("{command} {version}"))?;
                if code == 1 {
                    ensure!(
                        err["msg"] == "incompatible CNI versions",
                        "{command} {version}: {}",
                        err["msg"]
                    );
                }
            }
        }
        Ok(())
    });
}

/// SPEC.md lists `CNI_PATH` as optional for every verb (the Go skel requires it; README).
#[test]
fn cni_path_is_optional() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        let conf = bench.conf(s, "1.0.0").to_string();
        let out = bench.exec(s, Some("DEL"), &DEL_ENV, conf.as_bytes())?;
        ensure!(
            out.status.success() && out.stdout.is_empty(),
            "DEL without CNI_PATH: {out:?}"
        );
        let env: Vec<(&str, &str)> = ATTACH_ENV
            .iter()
            .filter(|(k, _)| *k != "CNI_PATH")
            .copied()
            .collect();
        // The netns does not exist: whatever the plugin says, the skel let the call through.
        let out = bench.exec(s, Some("ADD"), &env, conf.as_bytes())?;
        let doc = one_document(&out)?;
        ensure!(
            !doc["msg"]
                .as_str()
                .is_some_and(|m| m.starts_with("required env variables")),
            "ADD without CNI_PATH: {doc}"
        );
        Ok(())
    });
}

#[test]
fn check_below_0_4_0_and_status_or_gc_below_1_1_0_are_code_1() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        let out = bench.exec(
            s,
            Some("CHECK"),
            &ATTACH_ENV,
            bench.conf(s, "0.3.1").to_string().as_bytes(),
        )?;
        let err = expect_error(&out, 1).context("CHECK on 0.3.1")?;
        ensure!(
            err["msg"] == "config version does not allow CHECK",
            "{}",
            err["msg"]
        );
        for command in ["STATUS", "GC"] {
            let out = bench.exec(
                s,
                Some(command),
                &[],
                bench.conf(s, "1.0.0").to_string().as_bytes(),
            )?;
            let err = expect_error(&out, 1).with_context(|| format!("{command} on 1.0.0"))?;
            ensure!(
                err["msg"] == format!("config version does not allow {command}"),
                "{}",
                err["msg"]
            );
        }
        Ok(())
    });
}

#[test]
fn status_and_gc_on_1_1_0_succeed_and_print_nothing() {
    for_each_subject(|s| {
        let bench = Bench::new()?;
        let mut conf = bench.conf(s, "1.1.0");
        let out = bench.exec(s, Some("STATUS"), &[], conf.to_string().as_bytes())?;
        ensure!(
            out.status.success() && out.stdout.is_empty(),
            "STATUS: {out:?}"
        );
        conf["cni.dev/valid-attachments"] = json!([]);
        let out = bench.exec(s, Some("GC"), &[], conf.to_string().as_bytes())?;
        ensure!(out.status.success() && out.stdout.is_empty(), "GC: {out:?}");
        Ok(())
    });
}

/// The newest version Debian's Go `bridge` and `host-local` speak (bookworm ships plugins 1.1.1).
const MAIN_PLUGIN_VERSION: &str = "1.0.0";

/// A bridge + host-local chain ending in `subject`, with host-local's state in the scratch dir.
fn chain(bench: &Bench, subject: &Subject, version: &str) -> NetworkConfigList {
    let mut ours = (subject.keys)(bench.scratch.path());
    ours["type"] = json!(subject.name);
    NetworkConfigList::new(
        "conformance",
        version,
        vec![
            main_plugin::bridge(
                "cni-conf0",
                &["10.97.0.0/24"],
                &bench.scratch.path().join("ipam"),
            ),
            ours,
        ],
    )
}

#[test]
fn add_check_and_del_work_in_every_supported_version_and_print_the_config_version() {
    for_each_subject(|s| {
        for version in s.versions {
            let Topology {
                host,
                container,
                client: _client,
            } = Topology::new("confv")?;
            let bench = Bench::with_host(host)?;
            let rt = RuntimeConf::new("conformance-v", container.path(), "eth0");
            let main_supports = bench.runtime.version("bridge", version)?["supportedVersions"]
                .as_array()
                .is_some_and(|v| v.contains(&json!(version)));
            if main_supports {
                let list = chain(&bench, s, version);
                let result = bench
                    .runtime
                    .add(&list, &rt)
                    .with_context(|| format!("ADD in {version}"))?;
                ensure!(
                    result["cniVersion"] == *version,
                    "{version}: result in {}",
                    result["cniVersion"]
                );
                // 0.1.0/0.2.0 results carry `ip4.ip`, later ones `ips[].address`.
                let ip = result["ips"][0]["address"]
                    .as_str()
                    .or_else(|| result["ip4"]["ip"].as_str())
                    .unwrap_or("");
                ensure!(
                    ip.starts_with("10.97.0."),
                    "{version}: no bridge IP passed on: {result}"
                );
                if *version >= "0.4.0" {
                    bench
                        .runtime
                        .check(&list, &rt)
                        .with_context(|| format!("CHECK in {version}"))?;
                }
                bench
                    .runtime
                    .del(&list, &rt)
                    .with_context(|| format!("DEL in {version}"))?;
            } else {
                // Newer than the main plugin: attach with it in the newest version it speaks, then
                // drive our plugin alone with that result as its prevResult, as a runtime would.
                let list = chain(&bench, s, MAIN_PLUGIN_VERSION);
                let main_only = NetworkConfigList::new(
                    "conformance",
                    MAIN_PLUGIN_VERSION,
                    vec![list.plugins[0].clone()],
                );
                let prev = bench.runtime.add(&main_only, &rt)?;
                let mut conf = bench.conf(s, version);
                conf["prevResult"] = prev;
                let env = [
                    ("CNI_CONTAINERID", "conformance-v"),
                    ("CNI_NETNS", container.path().to_str().unwrap_or_default()),
                    ("CNI_IFNAME", "eth0"),
                ];
                let stdin = conf.to_string();
                let out = bench.exec(s, Some("ADD"), &env, stdin.as_bytes())?;
                ensure!(out.status.success(), "ADD in {version}: {out:?}");
                let result = one_document(&out)?;
                ensure!(
                    result["cniVersion"] == *version,
                    "{version}: result in {}",
                    result["cniVersion"]
                );
                ensure!(
                    result["ips"] == conf["prevResult"]["ips"],
                    "{version}: IPs not passed on: {result}"
                );
                for command in ["CHECK", "DEL"] {
                    let out = bench.exec(s, Some(command), &env, stdin.as_bytes())?;
                    ensure!(
                        out.status.success() && out.stdout.is_empty(),
                        "{command} in {version}: {out:?}"
                    );
                }
                bench.runtime.del(&main_only, &rt)?;
            }
        }
        Ok(())
    });
}

#[test]
fn del_twice_succeeds() {
    for_each_subject(|s| {
        let Topology {
            host,
            container,
            client: _client,
        } = Topology::new("confdd")?;
        let bench = Bench::with_host(host)?;
        let list = chain(&bench, s, MAIN_PLUGIN_VERSION);
        let rt = RuntimeConf::new("conformance-dd", container.path(), "eth0");
        bench.runtime.add(&list, &rt)?;
        bench.runtime.del(&list, &rt).context("first DEL")?;
        bench.runtime.del(&list, &rt).context("second DEL")?;
        // Our plugin alone, with no prevResult at all, a third time.
        let conf = bench.conf(s, "1.1.0").to_string();
        let out = bench.exec(
            s,
            Some("DEL"),
            &[
                ("CNI_CONTAINERID", "conformance-dd"),
                ("CNI_IFNAME", "eth0"),
            ],
            conf.as_bytes(),
        )?;
        ensure!(
            out.status.success() && out.stdout.is_empty(),
            "DEL without netns or prevResult: {out:?}"
        );
        Ok(())
    });
}

#[test]
fn del_succeeds_after_the_netns_is_gone() {
    for_each_subject(|s| {
        let Topology {
            host,
            mut container,
            client: _client,
        } = Topology::new("confgone")?;
        let bench = Bench::with_host(host)?;
        let list = chain(&bench, s, MAIN_PLUGIN_VERSION);
        let rt = RuntimeConf::new("conformance-gone", container.path(), "eth0");
        bench.runtime.add(&list, &rt)?;
        let netns_path = container.path().to_path_buf();
        container.delete()?;
        if netns_path.exists() {
            bail!("the container netns {netns_path:?} still exists");
        }
        bench
            .runtime
            .del(&list, &rt)
            .context("DEL with the netns gone")?;
        Ok(())
    });
}

/// `CNI_LOG_LEVEL` values a runtime may pass through (containerd passes its own).
const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Deadline of one call in the no-hang cases: far above a plugin's milliseconds, far below
/// the runtime's default.
const NO_HANG_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);

/// A subject alone on a container Debian's Go `bridge` attached, with the bridge's result as
/// its prevResult, in 1.1.0 (`cni.dev/valid-attachments` lists the attachment, for GC).
struct Attached {
    bench: Bench,
    container: TestNetns,
    _client: TestNetns,
    rt: RuntimeConf,
    main_only: NetworkConfigList,
    stdin: String,
}

impl Attached {
    fn new(s: &Subject, prefix: &str) -> Result<Attached> {
        let Topology {
            host,
            container,
            client,
        } = Topology::new(prefix)?;
        let bench = Bench::with_host(host)?.with_timeout(NO_HANG_DEADLINE);
        let rt = RuntimeConf::new(ATTACHED_ID, container.path(), "eth0");
        let main_only = NetworkConfigList::new(
            "conformance",
            MAIN_PLUGIN_VERSION,
            vec![chain(&bench, s, MAIN_PLUGIN_VERSION).plugins[0].clone()],
        );
        let prev = bench.runtime.add(&main_only, &rt)?;
        let mut conf = bench.conf(s, "1.1.0");
        conf["prevResult"] = prev;
        conf["cni.dev/valid-attachments"] = json!([{"containerID": ATTACHED_ID, "ifname": "eth0"}]);
        Ok(Attached {
            bench,
            container,
            _client: client,
            rt,
            main_only,
            stdin: conf.to_string(),
        })
    }

    fn netns(&self) -> String {
        self.container
            .path()
            .to_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Runs `verb` of `s` with `CNI_NETNS` = `netns` and `extra` environment.
    fn exec(
        &self,
        s: &Subject,
        verb: &str,
        netns: &str,
        extra: &[(&str, &str)],
    ) -> Result<PluginOutput> {
        let mut env = vec![
            ("CNI_CONTAINERID", ATTACHED_ID),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
        ];
        env.extend_from_slice(extra);
        self.bench
            .exec(s, Some(verb), &env, self.stdin.as_bytes())
            .with_context(|| format!("{verb} with CNI_NETNS={netns} {extra:?}"))
    }

    /// Detaches the bridge.
    fn detach(self) -> Result<()> {
        self.bench.runtime.del(&self.main_only, &self.rt)?;
        Ok(())
    }
}

/// The container ID of an [`Attached`].
const ATTACHED_ID: &str = "conformance-att";

/// Issue 22 item 15: every verb of every plugin finishes at every log level. The skel held the
/// stdout and stderr locks for the whole call, so a thread logging while the main thread waited
/// for it (bandwidth's STATUS probe at `debug`) hung the plugin forever.
#[test]
fn every_verb_finishes_at_every_log_level() {
    for_each_subject(|s| {
        let att = Attached::new(s, "conflog")?;
        let netns = att.netns();
        for level in LOG_LEVELS {
            for verb in ["ADD", "CHECK", "GC", "STATUS", "VERSION", "DEL"] {
                let out = att.exec(s, verb, &netns, &[("CNI_LOG_LEVEL", level)])?;
                ensure!(out.status.success(), "{verb} at {level}: {out:?}");
                if matches!(verb, "ADD" | "VERSION") {
                    one_document(&out).with_context(|| format!("{verb} at {level}"))?;
                } else {
                    ensure!(out.stdout.is_empty(), "{verb} at {level}: {out:?}");
                }
            }
        }
        att.detach()
    });
}

/// Issue 22 item 8: a FIFO as `CNI_NETNS` hangs no verb of any plugin (opening one for reading
/// blocks until a writer comes). ADD and CHECK of a plugin that works inside the namespace
/// refuse it with code 8; DEL succeeds everywhere (nothing of ours can be in a FIFO).
#[test]
fn a_fifo_as_cni_netns_hangs_no_verb() {
    for_each_subject(|s| {
        let bench = Bench::new()?.with_timeout(NO_HANG_DEADLINE);
        let fifo = bench.scratch.path().join("netns-fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
        let fifo = fifo.to_str().context("fifo path")?.to_owned();
        let mut conf = bench.conf(s, "1.1.0");
        conf["prevResult"] = json!({"cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": fifo}],
            "ips": [{"interface": 0, "address": "10.98.0.2/24", "gateway": "10.98.0.1"}]});
        let stdin = conf.to_string();
        let env = [
            ("CNI_CONTAINERID", "conformance-fifo"),
            ("CNI_NETNS", fifo.as_str()),
            ("CNI_IFNAME", "eth0"),
        ];
        let uses_netns = !matches!(s.name, "portmap" | "firewall" | "passthrough");
        for verb in ["ADD", "CHECK", "DEL"] {
            let out = bench
                .exec(s, Some(verb), &env, stdin.as_bytes())
                .with_context(|| verb.to_string())?;
            if verb == "DEL" {
                ensure!(out.status.success(), "DEL: {out:?}");
            } else if uses_netns {
                let err = expect_error(&out, 8).with_context(|| verb.to_string())?;
                // The reference's words, with the filesystem's magic number.
                ensure!(
                    err["msg"].as_str().is_some_and(
                        |m| m.starts_with(&format!("unknown FS magic on \"{fifo}\": "))
                    ),
                    "{verb}: {err}"
                );
            } else {
                ensure!(
                    out.status.success() || out.error().is_some(),
                    "{verb}: {out:?}"
                );
            }
        }
        Ok(())
    });
}

/// Issue 22 item 9: after an ADD, a DEL whose `CNI_NETNS` opens but names no network namespace
/// (a file of `/proc`, another kind of namespace, a path through a regular file) succeeds —
/// there is nothing of the attachment in it — where sbr's failed with code 8.
#[test]
fn del_succeeds_when_cni_netns_names_no_network_namespace() {
    for_each_subject(|s| {
        let att = Attached::new(s, "confnotns")?;
        let netns = att.netns();
        let out = att.exec(s, "ADD", &netns, &[])?;
        ensure!(out.status.success(), "ADD: {out:?}");
        let file = att.bench.scratch.path().join("a-file");
        std::fs::write(&file, "")?;
        let through_file = format!("{}/", file.display());
        for path in [
            "/proc/self/status",
            "/proc/self/ns/uts",
            through_file.as_str(),
        ] {
            let out = att.exec(s, "DEL", path, &[])?;
            ensure!(
                out.status.success() && out.stdout.is_empty(),
                "DEL with CNI_NETNS={path}: {out:?}"
            );
        }
        let out = att.exec(s, "DEL", &netns, &[])?;
        ensure!(out.status.success(), "DEL: {out:?}");
        att.detach()
    });
}

/// Issue 21 §1: a plugin's work is done when it exits. Every verb of every plugin runs as the
/// child of a child subreaper (as under a runtime that is one): once the plugin has exited, no
/// process it started may still run or wait to be reaped (`tests/src/bin/subreaper.rs` reports
/// them), and DEL has then removed everything of the attachment (the state dirs are empty).
#[test]
fn no_process_of_ours_outlives_any_verb() {
    for_each_subject(|s| {
        let att = Attached::new(s, "confreap")?;
        let netns = att.netns();
        let plugin = att.bench.runtime.find_plugin(s.name)?;
        for verb in ["ADD", "CHECK", "STATUS", "GC", "DEL"] {
            let env = [
                ("CNI_COMMAND", verb),
                ("CNI_CONTAINERID", ATTACHED_ID),
                ("CNI_NETNS", netns.as_str()),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/usr/lib/cni"),
            ];
            let (ok, left) = tests::process::run_under_subreaper(
                Path::new(env!("CARGO_BIN_EXE_subreaper")),
                att.bench.runtime.host(),
                &plugin,
                &env,
                att.stdin.as_bytes(),
            )?;
            ensure!(ok, "{verb} failed");
            ensure!(left.is_empty(), "{verb} left processes behind: {left}");
        }
        att.detach()
    });
}
