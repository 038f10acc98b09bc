//! `tuning` against Debian's Go `tuning` (1.1.1): the same calls, the same answers, the same
//! link attributes and sysctls (see `tests::differential` for what is compared and how).
//!
//! Each side is a host namespace (where the plugin runs) and a container namespace with `eth0`,
//! one end of a veth with a fixed MAC, and a backup directory of its own (`@DATADIR@`). The
//! kernel objects compared are the container's links (MAC, MTU, queue length, flags) and the
//! sysctls of [`SYSCTLS`]. The backup files are not compared as such; the upgrade cases check
//! that each implementation undoes what the other did from the other's file.
//!
//! Also here, from the former `reference.rs`: with no settings, `tuning` prints its prevResult
//! back, so the pass-through cases pin result parsing, conversion and printing to Go's (byte for
//! byte in 0.x), for every version pair of an era, a prevResult without `cniVersion`, Go-cased
//! keys and characters Go escapes.
//!
//! Where Debian's 1.1.1 is not the reference: it has no duplicate-key check (v1.2.0), no
//! `txQLen` (v1.4.0), no allowlist (v1.2.0), no `1.1.0`, and its CHECK does not substitute
//! `IFNAME` (v1.3.0; the README lists it).

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use tests::Runtime;
use tests::differential::{
    self, By, Case, Impl, Namespaces, SHARED_VERSIONS, Stage, Step, Suite, Want, Why, config,
    in_version, result_in_version, skel_cases, with_keys, without,
};
use tests::generated::{self, Field, Go};
use tests::snapshot::{self, Snapshot};

const NETWORK: &str = "tndiff";
const ID: &str = "tuning-diff-1";

/// The sysctls the cases set, read in the container after each step.
const SYSCTLS: [&str; 5] = [
    "net.ipv4.conf.eth0.arp_ignore",
    "net.ipv4.conf.eth0.arp_filter",
    "net.ipv4.conf.all.arp_announce",
    "net.ipv6.conf.eth0.accept_ra",
    "net.core.somaxconn",
];

/// README rows.
const SYSCTLS_RESTORED: &str = "sysctls are never restored";
const REGEX_ENGINE: &str = "allowlist uses Go RE2 syntax";
const ROLLBACK: &str = "no rollback: a failure leaves earlier sysctls/attributes applied";
const SYSCTL_BACKUP: &str = "sysctl-only config writes no backup file";
const LINK_GONE: &str = "DEL keeps the file when the link is gone or the file is corrupt";
const MAC_CASE: &str = "CHECK compares MACs as strings (an upper-case MAC always fails)";
const PROMISC_FALSE: &str =
    "`promisc: false` changes nothing on ADD, yet CHECK demands promiscuous mode off";
const IFNAME_CHECK: &str = "Debian's Go 1.1.1 CHECK does not substitute `IFNAME`";
const REPEATED_ADD: &str = "a repeated ADD overwrites the backup with already-changed values";
const PANIC: &str = "`args.cni.sysctl` without top-level `sysctl` panics (exit 2, no JSON)";
const ORDER_OF_STEPS: &str =
    "the first refusal of a config with several faults follows its order of steps";
const BAD_MTU: &str =
    "a bad `mtu` fails with the kernel's `invalid argument` after earlier changes were made";
const DOT_COMPONENTS: &str = "a key with an empty, `.` or `..` component that stays under `net/`";
const DEL_DECODES: &str = "DEL fails on bad `CNI_ARGS` or bad plugin keys";
const K8S_ARGS: &str = "`CNI_ARGS` with `K8S_*` keys and no `IgnoreUnknown` fails every verb";

/// What 1.1.1 lacks and HEAD has.
const HEAD_110: &str = "reference-behaviour.md §1.1/§1.7: HEAD takes 1.1.0, whose result is 1.0.0's with another cniVersion";
const HEAD_DUPLICATES: &str = "reference-behaviour.md §2.2: since v1.2.0 a top-level `sysctl` object naming a key twice is refused before anything changes (issue 19: code 7)";
const HEAD_TXQLEN: &str = "reference-behaviour.md §2.2: `txQLen` (v1.4.0) sets the transmit queue length and DEL restores it; 1.1.1 ignores it";
const HEAD_KEY_QUOTED: &str = "reference-behaviour.md §2.2: `invalid net sysctl key` quotes the key after its conversion to a path (`kernel/hostname`) at HEAD, as written in 1.1.1";
const HEAD_ALLOWLIST: &str = "reference-behaviour.md §2.2: since v1.2.0 ADD refuses a sysctl no line of /etc/cni/tuning/allowlist.conf matches; 1.1.1 has no allowlist";

struct TuningStage {
    ns: Namespaces,
    data_dir: tempfile::TempDir,
}

impl Stage for TuningStage {
    fn runtime(&self) -> &Runtime {
        &self.ns.runtime
    }

    fn vars(&self) -> Vec<(String, String)> {
        let mut vars = self.ns.vars();
        vars.push((
            "@DATADIR@".to_owned(),
            self.data_dir.path().to_string_lossy().into_owned(),
        ));
        vars
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let ctr = &self.ns.container;
        let mut snap = Snapshot::new();
        snap.insert("links", snapshot::link_attr_lines(ctr, |_| true)?);
        let mut sysctls = Vec::new();
        for key in SYSCTLS {
            // eth0 may be gone (a case deletes it).
            let value = ctr.sysctl(key).unwrap_or_else(|_| "<absent>".to_owned());
            sysctls.push(format!("{key} = {value}"));
        }
        snap.insert("sysctl", sysctls);
        // Backup files; our lock file and temporary directory are left out (README: flock on
        // `<dataDir>/.lock`, temporary files in `<dataDir>/.tmp/`).
        let mut files: Vec<String> = std::fs::read_dir(self.data_dir.path())?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name != ".lock" && name != ".tmp")
            .collect();
        files.sort();
        snap.insert("files", files);
        Ok(snap)
    }
}

fn build(_: Impl) -> Result<TuningStage> {
    Ok(TuningStage {
        ns: Namespaces::new("dtn", "vethtn0", &[], "eth0", &["10.97.0.2/24"])?,
        data_dir: tempfile::tempdir()?,
    })
}

fn suite() -> Suite<TuningStage> {
    Suite::new("tuning", build).cni_env(ID, "eth0")
}

/// A prevResult with everything Debian's Go library knows of, in the 1.0.0 shape (from the
/// former `reference.rs`): the container's `eth0` and two foreign interfaces, an address that
/// names no interface, routes of both families, DNS.
fn rich_prev() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "cni0", "mac": "56:c1:60:b0:c5:90"},
            {"name": "veth1234", "mac": "aa:3b:e6:b0:a0:4b"},
            {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "@NETNS@"}
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

/// A 1.0.0 config with [`rich_prev`], the side's data dir and `keys` on top.
fn conf(keys: Value) -> Value {
    let base = config(
        "tuning",
        NETWORK,
        rich_prev(),
        json!({"dataDir": "@DATADIR@"}),
    );
    with_keys(base, &keys)
}

/// [`conf`] in `version`, its prevResult converted.
fn conf_at(version: &str, keys: Value) -> Result<Value> {
    in_version(&conf(keys), version)
}

/// Every link attribute Debian's Go `tuning` knows, and a sysctl by its plain name (1.1.1's
/// CHECK does not substitute `IFNAME`).
fn all_go_keys() -> Value {
    json!({
        "mac": "02:aa:bb:cc:dd:01",
        "mtu": 1400,
        "promisc": true,
        "allmulti": true,
        "sysctl": {"net.ipv4.conf.eth0.arp_ignore": "1"},
    })
}

/// ADD and DEL with the kernel compared, CHECK in between from 0.4.0. Ours restores the sysctls
/// on DEL, Go does not.
fn lifecycle(name: &str, conf: &Value) -> Case<TuningStage> {
    let case = differential::lifecycle(
        name,
        conf,
        |check| check,
        |del| del.snap_except("sysctl", "", SYSCTLS_RESTORED),
    );
    if sysctl_only(conf) {
        case.except("files", "", SYSCTL_BACKUP)
    } else {
        case
    }
}

/// True when `conf` sets sysctls and no link attribute: Go writes no backup file then.
fn sysctl_only(conf: &Value) -> bool {
    let attrs = ["mac", "mtu", "promisc", "allmulti", "txQLen"];
    let sets_attr = |o: &Value| {
        attrs
            .iter()
            .any(|k| o.get(*k).is_some_and(|v| v != &json!(false)))
    };
    let has_sysctl = conf.get("sysctl").is_some() || conf["args"]["cni"].get("sysctl").is_some();
    has_sysctl
        && !sets_attr(conf)
        && !sets_attr(&conf["args"]["cni"])
        && conf["RuntimeConfig"].get("mac").is_none()
        && conf["runtimeConfig"].get("mac").is_none()
}

/// `conf` as raw text with `"sysctl"` replaced by `sysctl_text` (JSON values cannot hold a key
/// twice).
fn with_raw_sysctl(conf: &Value, sysctl_text: &str) -> String {
    let mut c = conf.clone();
    c["sysctl"] = json!("@SYSCTL@");
    c.to_string().replace("\"@SYSCTL@\"", sysctl_text)
}

/// Fails unless the snapshot's links show `line` (e.g. `eth0 txqlen 500`).
fn link_has(snap: &Snapshot, line: &str) -> Result<()> {
    let links = snap.section("links");
    ensure!(
        links.iter().any(|l| l == line),
        "no `{line}` among\n{}",
        links.join("\n")
    );
    Ok(())
}

#[allow(clippy::too_many_lines)]
fn cases() -> Result<Vec<Case<TuningStage>>> {
    let mut cases = skel_cases(
        &conf(json!({"mtu": 1400})),
        &[
            "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
        ],
    );
    let dup = with_raw_sysctl(
        &conf(json!({"mtu": 1400})),
        r#"{"net.ipv4.conf.eth0.arp_ignore": "1", "net.ipv4.conf.eth0.arp_ignore": "2"}"#,
    );
    let dup_error = || Want::Error {
        code: Some(7),
        msg: "duplicated sysctl keys are not allowed".into(),
    };
    // The validation table of reference-behaviour.md §2.2.
    cases.extend([
        Case::new("config: a sysctl key twice")
            .step(Step::raw(Some("ADD"), &dup).head(HEAD_DUPLICATES, dup_error()).snap()),
        Case::new("config: a sysctl key twice on CHECK")
            .step(Step::raw(Some("CHECK"), &dup).head(HEAD_DUPLICATES, dup_error())),
        // Only the top-level object is checked; in `args.cni.sysctl` the later value wins.
        Case::new("config: a key twice in args.cni.sysctl").except("files", "", SYSCTL_BACKUP).step(
            Step::raw(
                Some("ADD"),
                &conf(json!({"sysctl": {}, "args": {"cni": "@ARGS@"}})).to_string().replace(
                    "\"@ARGS@\"",
                    r#"{"sysctl": {"net.ipv4.conf.eth0.arp_filter": "1", "net.ipv4.conf.eth0.arp_filter": "0"}}"#,
                ),
            )
            .snap(),
        ),
        // Issue 26 item 4b: Go decodes each object of a key written twice into the one map.
        Case::new("config: sysctl objects under two spellings of the key merge")
            .except("files", "", SYSCTL_BACKUP)
            .step(
                Step::raw(
                    Some("ADD"),
                    &conf(json!({"sysctl": {"net.ipv4.conf.eth0.arp_ignore": "1"}}))
                        .to_string()
                        .replacen(
                            "\"sysctl\":{",
                            r#""Sysctl":{"net.ipv4.conf.all.arp_announce":"2"},"sysctl":{"#,
                            1,
                        ),
                )
                .snap(),
            ),
        Case::new("config: mtu of the wrong JSON type").step(Step::add(conf(json!({"mtu": "big"})))),
        Case::new("config: a fractional mtu").step(Step::add(conf(json!({"mtu": 1500.5})))),
        Case::new("config: a sysctl value of the wrong JSON type").step(Step::add(conf(json!({"sysctl": {"net.ipv4.conf.IFNAME.rp_filter": 1}})))),
        Case::new("config: runtimeConfig.mac of the wrong JSON type").step(Step::add(conf(json!({"runtimeConfig": {"mac": 5}})))),
        Case::new("config: args.cni.mtu of the wrong JSON type").step(Step::add(conf(json!({"args": {"cni": {"mtu": "big"}}})))),
        Case::new("config: args of the wrong JSON type").step(Step::add(conf(json!({"args": ["cni"]})))),
        Case::new("config: of two values of the wrong JSON type, the first").step(Step::add(conf(json!({"promisc": "yes", "mtu": "big"})))),
        Case::new("config: a JSON type error on DEL").step(
            Step::del(conf(json!({"mtu": "big"}))).readme(DEL_DECODES, Want::Silent),
        ),
        Case::new("CNI_ARGS: a pair without =")
            .step(Step::add(conf(json!({"mtu": 1400}))).env("CNI_ARGS", "IgnoreUnknown=1;MAC")),
        Case::new("CNI_ARGS: an unknown key").step(Step::add(conf(json!({"mtu": 1400}))).env("CNI_ARGS", "FOO=bar")),
        Case::new("CNI_ARGS: a bad IgnoreUnknown value")
            .step(Step::add(conf(json!({"mtu": 1400}))).env("CNI_ARGS", "IgnoreUnknown=maybe;FOO=bar")),
        Case::new("CNI_ARGS: a bad pair on DEL").step(
            Step::del(conf(json!({"mtu": 1400})))
                .env("CNI_ARGS", "FOO=bar")
                .readme(DEL_DECODES, Want::Silent),
        ),
        Case::new("CNI_ARGS: Kubernetes keys without IgnoreUnknown").step(
            Step::add(conf(json!({"mtu": 1400})))
                .env("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web")
                .readme(K8S_ARGS, Want::Check(Box::new(|out, snap| {
                    ensure!(out.success(), "ADD failed");
                    link_has(snap, "eth0 mtu 1400")
                }))),
        ),
        Case::new("prevResult: missing on ADD").step(Step::add(without(conf(json!({"mtu": 1400})), "prevResult"))),
        Case::new("prevResult: of the 1.x family in a 0.4.0 config").step(Step::add({
            let mut c = conf(json!({"mtu": 1400}));
            c["cniVersion"] = json!("0.4.0");
            c
        })),
        Case::new("prevResult: missing on CHECK").step(Step::check(without(conf(json!({"mtu": 1400})), "prevResult"))),
        Case::new("sysctl: outside /proc/sys/net").step(
            Step::add(conf(json!({"sysctl": {"kernel.hostname": "x"}})))
                .head(
                    HEAD_KEY_QUOTED,
                    Want::Error {
                        code: Some(7),
                        msg: "invalid net sysctl key: \"kernel/hostname\"".into(),
                    },
                )
                .snap(),
        ),
        // Go turns every `.` into `/`, so `..` becomes `//`, the path stays under /proc/sys/net
        // and names a file that does not exist; ours refuses the key itself.
        Case::new("sysctl: escaping /proc/sys/net with ..").step(
            Step::add(conf(json!({"sysctl": {"net/../kernel/hostname": "x"}})))
                .msg_per_readme(DOT_COMPONENTS)
                .snap(),
        ),
        Case::new("sysctl: one that does not exist").step(
            Step::add(conf(json!({"sysctl": {"net.ipv4.conf.eth0.no_such_key": "1"}}))).snap(),
        ),
        // Go writes its backup file before it parses the MAC, and leaves it behind.
        Case::new("mac: not a MAC").step(
            Step::add(conf(json!({"mac": "02:aa:bb"}))).snap_except("files", "", ROLLBACK),
        ),
        // Go writes its backup file before the kernel refuses the MTU, and leaves it behind.
        Case::new("mtu: below the minimum").step(Step::add(conf(json!({"mtu": 10}))).snap_except("files", "", ROLLBACK)),
        Case::new("link: CNI_IFNAME missing in the container")
            .step(Step::add(conf(json!({"mtu": 1400}))).env("CNI_IFNAME", "eth9"))
            .step(Step::check(conf(json!({"mtu": 1400}))).env("CNI_IFNAME", "eth9"))
            .step(Step::del(conf(json!({"mtu": 1400}))).env("CNI_IFNAME", "eth9")),
        Case::new("args.cni.sysctl without a top-level sysctl").step(
            Step::add(conf(json!({"args": {"cni": {"sysctl": {"net.ipv4.conf.eth0.arp_filter": "1"}}}}))).readme(
                PANIC,
                Want::Check(Box::new(|out, _| {
                    let code = out.error().map(|e| e.code);
                    ensure!(code == Some(7), "want a code 7 error");
                    Ok(())
                })),
            ),
        ),
    ]);

    // Every version both advertise, and 1.1.0.
    for version in SHARED_VERSIONS {
        cases.push(lifecycle(
            &format!("lifecycle in {version}"),
            &conf_at(version, all_go_keys())?,
        ));
    }
    let c110 = conf(json!({"cniVersion": "1.1.0", "mtu": 1400, "mac": "02:aa:bb:cc:dd:01"}));
    cases.push(
        Case::new("lifecycle in 1.1.0")
            .step(Step::add(c110.clone()).go_at("1.0.0", HEAD_110).snap())
            .step(Step::check(c110.clone()).go_at("1.0.0", HEAD_110))
            .step(Step::del(c110).go_at("1.0.0", HEAD_110).snap()),
    );

    // Pass-through (no settings): the printing of every result shape.
    let pairs = SHARED_VERSIONS
        .iter()
        .flat_map(|p| SHARED_VERSIONS.iter().map(move |c| (*p, *c)));
    for (prev_version, conf_version) in
        pairs.filter(|(p, c)| cni::version::Era::of(p) == cni::version::Era::of(c))
    {
        let mut c = conf(json!({}));
        c["cniVersion"] = json!(conf_version);
        c["prevResult"] = result_in_version(&rich_prev(), prev_version)?;
        cases.push(
            Case::new(format!(
                "pass-through: a {prev_version} prevResult in a {conf_version} config"
            ))
            .step(Step::add(c).snap()),
        );
    }
    let mut no_version = rich_prev();
    no_version
        .as_object_mut()
        .context("object")?
        .remove("cniVersion");
    cases.extend([
        Case::new("pass-through: a prevResult without cniVersion")
            .step(Step::add(conf(json!({"prevResult": no_version})))),
        Case::new("pass-through: capitalised prevResult keys").step(Step::add({
            let mut c = conf(json!({}));
            c["cniVersion"] = json!("0.4.0");
            c["prevResult"] = json!({
                "CNIVersion": "0.4.0",
                "Interfaces": [{"Name": "eth0", "MAC": "a6:94:68:1a:1e:89", "Sandbox": "@NETNS@"}],
                "IPs": [{"Version": "4", "Interface": 0, "Address": "10.96.10.2/24", "Gateway": "10.96.10.1"}],
                "Routes": [{"Dst": "0.0.0.0/0", "GW": "10.96.10.1"}],
                "DNS": {"Nameservers": ["10.96.0.10"]}
            });
            c
        })),
        Case::new("pass-through: characters Go escapes").step(Step::add({
            let mut c = conf(json!({}));
            c["cniVersion"] = json!("0.4.0");
            c["prevResult"] = json!({
                "cniVersion": "0.4.0",
                "interfaces": [{"name": "eth0", "mac": "a6:94:68:1a:1e:89", "sandbox": "@NETNS@?a=<b>&c"}],
                "ips": [{"version": "4", "address": "10.96.10.2/24"}],
                "dns": {"domain": "caf\u{e9}.example", "search": ["a\u{2028}b", "tab\there"]}
            });
            c
        })),
    ]);

    // Settings through ADD, CHECK and DEL.
    let precedence = json!({
        "mac": "02:00:00:00:00:01",
        "runtimeConfig": {"mac": "02:00:00:00:00:03"},
        "args": {"cni": {"mac": "02:00:00:00:00:04", "mtu": 1300}},
        "mtu": 1400,
    });
    cases.extend([
        lifecycle("sysctls only", &conf(json!({"sysctl": {
            "net.ipv4.conf.eth0.arp_ignore": "1",
            "net.ipv4.conf.all.arp_announce": "2",
            "net.ipv6.conf.eth0.accept_ra": "0",
            "net.core.somaxconn": "1024"
        }}))),
        lifecycle("a sysctl key in slash form", &conf(json!({"sysctl": {"net/ipv4/conf/eth0/arp_filter": "1"}}))),
        lifecycle("mac, mtu, promisc and allmulti", &conf(all_go_keys())),
        lifecycle("allmulti false", &conf(json!({"allmulti": false}))),
        lifecycle("promisc false", &conf(json!({"promisc": false}))),
        lifecycle("mac from runtimeConfig (capitalised key)", &conf(json!({"RuntimeConfig": {"mac": "02:00:00:00:00:03"}}))),
        lifecycle("mac and mtu from args.cni", &conf(json!({"args": {"cni": {"mac": "02:00:00:00:00:04", "mtu": 1300}}}))),
        lifecycle("mac and mtu precedence", &conf(precedence.clone())),
        lifecycle("args.cni.mtu 0 cancels the mtu", &conf(json!({"mtu": 1400, "args": {"cni": {"mtu": 0}}}))),
        lifecycle("args.cni.sysctl overrides sysctl", &conf(json!({
            "sysctl": {"net.ipv4.conf.eth0.arp_ignore": "1", "net.ipv4.conf.eth0.arp_filter": "1"},
            "args": {"cni": {"sysctl": {"net.ipv4.conf.eth0.arp_ignore": "2"}}}
        }))),
        Case::new("mac from CNI_ARGS")
            .step(Step::add(conf(json!({"mac": "02:00:00:00:00:01"}))).env("CNI_ARGS", "IgnoreUnknown=1;MAC=02:00:00:00:00:02").snap())
            .step(Step::check(conf(json!({"mac": "02:00:00:00:00:01"}))).env("CNI_ARGS", "IgnoreUnknown=1;MAC=02:00:00:00:00:02"))
            .step(Step::del(conf(json!({"mac": "02:00:00:00:00:01"}))).env("CNI_ARGS", "IgnoreUnknown=1;MAC=02:00:00:00:00:02").snap()),
        Case::new("mac and mtu precedence with CNI_ARGS")
            .step(Step::add(conf(precedence.clone())).env("CNI_ARGS", "IgnoreUnknown=1;MAC=02:00:00:00:00:02").snap())
            .step(Step::del(conf(precedence)).env("CNI_ARGS", "IgnoreUnknown=1;MAC=02:00:00:00:00:02").snap()),
        Case::new("mac in upper case")
            .step(Step::add(conf(json!({"mac": "02:AA:BB:CC:DD:01"}))).snap())
            .step(Step::check(conf(json!({"mac": "02:AA:BB:CC:DD:01"}))).readme(MAC_CASE, Want::Silent))
            .step(Step::del(conf(json!({"mac": "02:AA:BB:CC:DD:01"}))).snap()),
        Case::new("promisc false on a promiscuous link")
            .setup(|s: &TuningStage| {
                s.ns.container.ip(&["link", "set", "eth0", "promisc", "on"])?;
                Ok(())
            })
            .step(Step::add(conf(json!({"promisc": false}))).snap())
            .step(Step::check(conf(json!({"promisc": false}))).readme(PROMISC_FALSE, Want::Silent))
            .step(Step::del(conf(json!({"promisc": false}))).snap()),
        Case::new("IFNAME in a sysctl key")
            .except("files", "", SYSCTL_BACKUP)
            .step(Step::add(conf(json!({"sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}}))).snap())
            .step(Step::check(conf(json!({"sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}}))).readme(IFNAME_CHECK, Want::Silent))
            .step(Step::del(conf(json!({"sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}}))).snap_except("sysctl", "", SYSCTLS_RESTORED)),
        Case::new("txQLen").step(Step::add(conf(json!({"txQLen": 500}))).head(HEAD_TXQLEN, Want::Check(Box::new(|out, snap| {
            ensure!(out.success(), "ADD failed");
            link_has(snap, "eth0 txqlen 500")
        }))))
        .step(Step::check(conf(json!({"txQLen": 500}))).head(HEAD_TXQLEN, Want::Silent))
        .step(Step::del(conf(json!({"txQLen": 500}))).head(HEAD_TXQLEN, Want::Check(Box::new(|out, snap| {
            ensure!(out.success(), "DEL failed");
            link_has(snap, "eth0 txqlen 1000")
        })))),
        Case::new("re-ADD with another mtu")
            .step(Step::add(conf(json!({"mtu": 1400}))))
            .step(Step::add(conf(json!({"mtu": 1300}))).snap())
            .step(Step::del(conf(json!({"mtu": 1300}))).snap_except("links", "eth0 mtu", REPEATED_ADD)),
        Case::new("CHECK after drift: mtu")
            .step(Step::add(conf(json!({"mtu": 1400}))))
            .mutate("set eth0's mtu to 1450", |s: &TuningStage| {
                s.ns.container.ip(&["link", "set", "eth0", "mtu", "1450"])?;
                Ok(())
            })
            .step(Step::check(conf(json!({"mtu": 1400}))))
            .step(Step::del(conf(json!({"mtu": 1400}))).snap()),
        Case::new("CHECK after drift: mac")
            .step(Step::add(conf(json!({"mac": "02:aa:bb:cc:dd:01"}))))
            .mutate("set eth0's MAC", |s: &TuningStage| {
                s.ns.container.ip(&["link", "set", "eth0", "address", "02:aa:bb:cc:dd:09"])?;
                Ok(())
            })
            .step(Step::check(conf(json!({"mac": "02:aa:bb:cc:dd:01"})))),
        Case::new("CHECK after drift: promisc")
            .step(Step::add(conf(json!({"promisc": true}))))
            .mutate("turn promiscuous mode off", |s: &TuningStage| {
                s.ns.container.ip(&["link", "set", "eth0", "promisc", "off"])?;
                Ok(())
            })
            .step(Step::check(conf(json!({"promisc": true})))),
        Case::new("CHECK after drift: a sysctl")
            .step(Step::add(conf(json!({"sysctl": {"net.ipv4.conf.eth0.arp_ignore": "1"}}))))
            .mutate("reset arp_ignore", |s: &TuningStage| s.ns.container.set_sysctl("net.ipv4.conf.eth0.arp_ignore", "0"))
            .step(Step::check(conf(json!({"sysctl": {"net.ipv4.conf.eth0.arp_ignore": "1"}})))),
        Case::new("DEL without a backup file").step(Step::del(conf(json!({"mtu": 1400}))).snap()),
        Case::new("DEL without prevResult")
            .step(Step::add(conf(json!({"mtu": 1400}))))
            .step(Step::del(without(conf(json!({"mtu": 1400})), "prevResult")).snap()),
        Case::new("DEL twice")
            .step(Step::add(conf(all_go_keys())))
            .step(Step::del(conf(all_go_keys())))
            .step(Step::del(conf(all_go_keys())).snap_except("sysctl", "", SYSCTLS_RESTORED)),
        Case::new("DEL after the link is gone")
            .step(Step::add(conf(json!({"mtu": 1400}))))
            .mutate("delete eth0", |s: &TuningStage| {
                s.ns.container.ip(&["link", "del", "eth0"])?;
                Ok(())
            })
            .step(Step::del(conf(json!({"mtu": 1400}))).snap_except("files", "", LINK_GONE)),
        Case::new("upgrade: Go's ADD, DEL by ours")
            .step(Step::add(conf(all_go_keys())).by(By::Go))
            .step(Step::del(conf(all_go_keys())).snap_except("sysctl", "", SYSCTLS_RESTORED)),
        Case::new("upgrade: Go's ADD, CHECK by ours")
            .step(Step::add(conf(all_go_keys())).by(By::Go))
            .step(Step::check(conf(all_go_keys()))),
        Case::new("downgrade: our ADD, CHECK and DEL by Go")
            .step(Step::add(conf(all_go_keys())))
            .step(Step::check(conf(all_go_keys())).by(By::Go))
            .step(Step::del(conf(all_go_keys())).by(By::Go).snap()),
    ]);
    Ok(cases)
}

#[test]
fn tuning_answers_and_link_attributes_match_the_go_plugin() -> Result<()> {
    suite().run(cases()?)
}

/// Runs `cases` in a private mount namespace whose `/etc/cni` is a fresh tmpfs holding
/// `tuning/allowlist.conf` with `allowlist` (the machine's `/etc/cni` is never touched).
fn with_allowlist(allowlist: &str, cases: Vec<Case<TuningStage>>) -> Result<()> {
    tests::mounts::with_private_mounts(
        || {
            nix::mount::mount(
                Some("tmpfs"),
                "/etc/cni",
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )?;
            std::fs::create_dir_all("/etc/cni/tuning")?;
            std::fs::write("/etc/cni/tuning/allowlist.conf", allowlist)?;
            Ok(())
        },
        || suite().run(cases),
    )
}

/// The allowlist (`/etc/cni/tuning/allowlist.conf`). 1.1.1 has none, so these are HEAD's
/// literals.
#[test]
fn the_sysctl_allowlist_is_read_as_the_reference_reads_it() -> Result<()> {
    let allowed = conf(json!({"sysctl": {"net.ipv4.conf.eth0.arp_ignore": "1"}}));
    let refused = conf(json!({"sysctl": {"net.ipv4.conf.eth0.arp_filter": "1"}}));
    let cases = vec![
        Case::new("allowlist: a listed sysctl").step(Step::add(allowed).head(
            HEAD_ALLOWLIST,
            Want::Check(Box::new(|out, snap| {
                ensure!(out.success(), "ADD failed");
                ensure!(
                    snap.section("sysctl").iter().any(|l| l == "net.ipv4.conf.eth0.arp_ignore = 1"),
                    "arp_ignore not set"
                );
                Ok(())
            })),
        )),
        Case::new("allowlist: a sysctl not listed").step(Step::add(refused).head(
            HEAD_ALLOWLIST,
            Want::Error {
                code: None,
                msg: "Sysctl net.ipv4.conf.eth0.arp_filter is not allowed. Only the following sysctls are allowed: [^net\\.ipv4\\.conf\\.eth0\\.arp_ignore$ ^net\\.core\\..*$]".into(),
            },
        )),
        // CHECK and DEL do not read the allowlist.
        Case::new("allowlist: CHECK and DEL of a sysctl not listed")
            .step(Step::check(conf(json!({"sysctl": {"net.ipv4.conf.eth0.arp_filter": "0"}}))).head(HEAD_ALLOWLIST, Want::Silent))
            .step(Step::del(conf(json!({"sysctl": {"net.ipv4.conf.eth0.arp_filter": "0"}}))).head(HEAD_ALLOWLIST, Want::Silent)),
    ];
    let listed = with_allowlist(
        "^net\\.ipv4\\.conf\\.eth0\\.arp_ignore$\n\n  ^net\\.core\\..*$  \n",
        cases,
    );
    // A line that is no regular expression fails ADD, before anything changes. The message is
    // the regular expression engine's own (Go's RE2 there, regex-lite here: README).
    let broken = with_allowlist(
        "net(\n",
        vec![
            Case::new("allowlist: a line that is no regular expression").step(
                Step::add(conf(
                    json!({"sysctl": {"net.ipv4.conf.eth0.arp_ignore": "1"}}),
                ))
                .readme(
                    REGEX_ENGINE,
                    Want::Check(Box::new(|out, snap| {
                        ensure!(
                            out.error().map(|e| e.code) == Some(7),
                            "want a code 7 error"
                        );
                        ensure!(
                            snap.section("sysctl")
                                .iter()
                                .any(|l| l == "net.ipv4.conf.eth0.arp_ignore = 0"),
                            "arp_ignore changed"
                        );
                        Ok(())
                    })),
                ),
            ),
        ],
    );
    match (listed, broken) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Err(a), Err(b)) => Err(anyhow::anyhow!("{a:#}\n{b:#}")),
    }
}

/// Debian's 1.1.1 `TuningConf`, as Go declares it.
/// Whether every sysctl in `value` (a `net.` key anywhere) is given a number.
fn numeric_sysctls(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Object(map) => map.iter().all(|(key, v)| {
            if key.starts_with("net.") {
                v.as_str()
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            } else {
                numeric_sysctls(v)
            }
        }),
        serde_json::Value::Array(items) => items.iter().all(numeric_sysctls),
        _ => true,
    }
}

const TUNING_SCHEMA: generated::Schema = generated::Schema {
    fields: &[
        Field {
            key: "sysctl",
            go: Go::Map(
                &[
                    "net.ipv4.conf.IFNAME.arp_ignore",
                    "net.ipv4.conf.eth0.arp_filter",
                    "net.ipv4.conf.all.arp_announce",
                    "net.core.somaxconn",
                ],
                &Go::Str(&["0", "1", "2"]),
            ),
        },
        Field {
            key: "mac",
            go: Go::Str(&["02:aa:bb:cc:dd:01", "02:AA:BB:CC:DD:02"]),
        },
        Field {
            key: "promisc",
            go: Go::Bool,
        },
        Field {
            key: "mtu",
            go: Go::Int(1280, 1500),
        },
        Field {
            key: "allmulti",
            go: Go::Ptr(&Go::Bool),
        },
        Field {
            key: "runtimeConfig",
            go: Go::Struct(&[Field {
                key: "mac",
                go: Go::Str(&["02:aa:bb:cc:dd:03"]),
            }]),
        },
        Field {
            key: "args",
            go: Go::Ptr(&Go::Struct(&[Field {
                key: "cni",
                go: Go::Ptr(&Go::Struct(&[
                    Field {
                        key: "mac",
                        go: Go::Ptr(&Go::Str(&["02:aa:bb:cc:dd:04"])),
                    },
                    Field {
                        key: "mtu",
                        go: Go::Ptr(&Go::Int(1280, 1500)),
                    },
                    Field {
                        key: "promisc",
                        go: Go::Ptr(&Go::Bool),
                    },
                    Field {
                        key: "allmulti",
                        go: Go::Ptr(&Go::Bool),
                    },
                ])),
            }])),
        },
    ],
};

/// Issue 26 item 4: generated configurations decode as Go decodes them (see
/// `tests::generated`).
#[test]
fn generated_configurations_are_decoded_and_applied_as_go_does() -> Result<()> {
    let plan = generated::Plan {
        plugin: "tuning",
        schema: TUNING_SCHEMA,
        base: |version| generated::base_in(&conf(json!({})), version),
        env: generated::decode_env(ID, "eth0"),
        known: vec![
            generated::Known {
                why: Why::Head(HEAD_DUPLICATES),
                applies: |_, go, ours| {
                    generated::msg(ours) == "duplicated sysctl keys are not allowed"
                        && generated::msg(go) != generated::msg(ours)
                },
            },
            generated::Known {
                why: Why::Readme(PANIC),
                applies: |_, go, ours| generated::go_crashed(go) && !ours.success(),
            },
            generated::Known {
                why: Why::Readme(ORDER_OF_STEPS),
                applies: |_, go, ours| !go.success() && ours.error().is_some_and(|e| e.code == 7),
            },
            generated::Known {
                why: Why::Readme(BAD_MTU),
                applies: |_, go, ours| {
                    generated::failed_at_netns(go) && generated::msg(ours) == "invalid argument"
                },
            },
        ],
        decoded: generated::past_decoding,
        // `args.cni.mac: ""` cancels the MAC change in Go, ours takes it for unset (the
        // top-level README's row of `""`): such configurations are the decode tier's.
        // A sysctl value the kernel refuses fails the ADD after Go wrote the sysctls before it
        // (in random order), ours before writing any (README: ROLLBACK).
        kernel_fits: |stdin| {
            !generated::folded(stdin).contains("\"mac\": \"\"")
                && serde_json::from_str::<serde_json::Value>(stdin)
                    .is_ok_and(|conf| numeric_sysctls(&conf))
        },
        count: 500,
        kernel: 8,
    };
    generated::run(&plan, &suite(), |name, stdin| {
        // Ours restores the sysctls on DEL, Go does not (README).
        let case = generated::add_then_del(name, stdin, |del| {
            del.snap_except("sysctl", "", SYSCTLS_RESTORED)
        });
        // Ours keeps a backup for sysctls too (README).
        if generated::folded(stdin).contains("\"sysctl\": {\"") {
            case.except("files", "", SYSCTL_BACKUP)
        } else {
            case
        }
    })
}
