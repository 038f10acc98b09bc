//! `sbr` against Debian's Go `sbr` (1.1.1): the same calls, the same answers, the same rules and
//! routes (see `tests::differential` for what is compared and how).
//!
//! Each side is a host namespace (where the plugin runs) and a container namespace with two
//! interfaces, as in the reference's tests: `eth0` (10.93.0.2/24, fd93::2/64) holding the main
//! default routes, and `net1` (192.168.1.209/24, fd91::209/64), the interface sbr works on,
//! with a route of its own (198.51.100.0/24 via 192.168.1.1). The kernel objects compared are
//! the container's `ip rule` and `ip route show table all`, both families. Go's sbr traces on
//! stderr, which is not compared.
//!
//! Where Debian's 1.1.1 is not the reference: it has no `table` (v1.6.0), no `gateways` and no
//! `addSourceHints` (HEAD), and no `1.1.0`; it ignores those keys, so those cases check HEAD's
//! behaviour on our side only.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use anyhow::{Result, ensure};
use serde_json::{Value, json};
use tests::Runtime;
use tests::differential::{
    self, By, Case, Impl, Namespaces, SHARED_VERSIONS, Stage, Step, Suite, Want, Why, config,
    in_version, skel_cases, without,
};
use tests::generated;
use tests::snapshot::{self, Snapshot};

const NETWORK: &str = "sbrdiff";
/// README row: the reference's lock on the `CNI_NETNS` path.
const LOCK_CREATES: &str = "the lock opens `CNI_NETNS` with `O_CREAT`";
const ID: &str = "sbr-diff-1";

/// README rows.
const CHECK_NOTHING: &str = "CHECK does nothing";
const DEL_RULES_ONLY: &str =
    "DEL removes only rules; the tables keep their routes and main is never restored";
const NETNS_GONE: &str = "DEL fails when `CNI_NETNS` is empty or the namespace is gone";
const REPEATED_ADD: &str =
    "a repeated ADD adds a second rule and fails on `default via … table N` (file exists)";
const NO_ADDRESS: &str =
    "when no prevResult address belongs to the interface, all its main routes are still deleted";
const PREV_VERSION: &str = "for cniVersion ≥ 0.3.0 the prevResult must carry its own `cniVersion`";
const PREV_UNPARSABLE: &str = "an unparsable prevResult makes DEL fail";
const TABLE_UNCHECKED: &str = "`table` is not validated (0, negative, 254 accepted)";
const MAIN_DEFAULT: &str =
    "the default route for a gateway is added, then overwritten by main's default when copying";
const FREE_TABLE: &str = "a table counts as free when no rule names it";
const UNLISTED_ROUTES: &str = "all the interface's main routes are deleted, also those serving none of the prevResult addresses";

const HEAD_110: &str = "reference-behaviour.md §1.1/§1.7: HEAD takes 1.1.0, whose result is 1.0.0's with another cniVersion";
const HEAD_TABLE: &str = "reference-behaviour.md §2.5: with `table` (v1.6.0) only a rule `from <ip> lookup <table>` is added per address, routes untouched; 1.1.1 ignores the key";
const HEAD_GATEWAYS: &str = "reference-behaviour.md §2.5: `gateways` (HEAD) is validated and replaces the prevResult gateway of the default route; 1.1.1 ignores the key";
const HEAD_DEL_NO_LINK: &str = "reference-behaviour.md §2.5: DEL succeeds when the link no longer exists (v1.3.0); 1.1.1 fails";
const HEAD_HINTS: &str = "reference-behaviour.md §2.5: `addSourceHints` (HEAD) keeps `<subnet> dev <if> src <ip> scope link` in main; 1.1.1 ignores the key";

struct SbrStage {
    ns: Namespaces,
}

impl Stage for SbrStage {
    fn runtime(&self) -> &Runtime {
        &self.ns.runtime
    }

    fn vars(&self) -> Vec<(String, String)> {
        self.ns.vars()
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let ctr = &self.ns.container;
        let mut snap = Snapshot::new();
        snap.insert("rules", snapshot::rule_lines(ctr)?);
        snap.insert("routes", snapshot::route_lines(ctr)?);
        Ok(snap)
    }
}

fn build(_: Impl) -> Result<SbrStage> {
    let ns = Namespaces::new(
        "dsb",
        "vethsb1",
        &["192.168.1.1/24", "fd91::1/64"],
        "net1",
        &["192.168.1.209/24", "fd91::209/64"],
    )?;
    tests::veth_pair(
        &ns.host,
        "vethsb0",
        &["10.93.0.1/24", "fd93::1/64"],
        &ns.container,
        "eth0",
        &["10.93.0.2/24", "fd93::2/64"],
    )?;
    let ctr = &ns.container;
    ctr.ip(&["link", "set", "dev", "eth0", "address", "02:00:00:00:00:12"])?;
    ctr.ip(&["route", "add", "default", "via", "10.93.0.1", "dev", "eth0"])?;
    ctr.ip(&[
        "-6", "route", "add", "default", "via", "fd93::1", "dev", "eth0",
    ])?;
    ctr.ip(&[
        "route",
        "add",
        "198.51.100.0/24",
        "via",
        "192.168.1.1",
        "dev",
        "net1",
    ])?;
    Ok(SbrStage { ns })
}

fn suite() -> Suite<SbrStage> {
    Suite::new("sbr", build).cni_env(ID, "net1")
}

/// What the second interface's main plugin printed (IPv4 only unless a case says otherwise).
fn prev() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:02", "sandbox": "@NETNS@"}],
        "ips": [{"interface": 0, "address": "192.168.1.209/24", "gateway": "192.168.1.1"}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "192.168.1.1"}]
    })
}

fn prev_ips(ips: Value) -> Value {
    let mut p = prev();
    p["ips"] = ips;
    p
}

fn conf(keys: Value) -> Value {
    config("sbr", NETWORK, prev(), keys)
}

fn conf_at(version: &str, keys: Value) -> Result<Value> {
    in_version(&conf(keys), version)
}

/// ADD, CHECK (from 0.4.0; Go's is a no-op, ours verifies: both succeed right after ADD) and
/// DEL; after DEL the routes are ours to put back (README).
fn lifecycle(name: &str, conf: &Value) -> Case<SbrStage> {
    differential::lifecycle(
        name,
        conf,
        |check| check,
        |del| del.snap_except("routes", "", DEL_RULES_ONLY),
    )
}

/// An IPv6-only prevResult on `net1`, which also has IPv4 routes in main: Go deletes them with
/// the IPv6 ones and copies them nowhere, ours leaves them (README).
fn ipv6_only() -> Case<SbrStage> {
    let v6 = conf(
        json!({"prevResult": prev_ips(json!([{"interface": 0, "address": "fd91::209/64", "gateway": "fd91::1"}]))}),
    );
    let v4_routes = [
        "\"dst\":\"192.168.1.0/24\",\"dev\":\"net1\"",
        "\"dst\":\"198.51.100.0/24\",\"gateway\":\"192.168.1.1\",\"dev\":\"net1\"",
    ];
    let add = v4_routes
        .iter()
        .fold(Step::add(v6.clone()).snap(), |step, route| {
            step.snap_except("routes", route, UNLISTED_ROUTES)
        });
    Case::new("IPv6 only")
        .step(add)
        // Go's CHECK does nothing; ours passes, and net1's IPv4 routes are still in main.
        .step(Step::check(v6.clone()).readme(
            UNLISTED_ROUTES,
            Want::Check(Box::new(move |out, snap| {
                ensure!(
                    out.success() && out.stdout.trim().is_empty(),
                    "CHECK did not pass silently"
                );
                for route in v4_routes {
                    ensure!(
                        snap.section("routes")
                            .iter()
                            .any(|l| l.contains(route) && !l.contains("\"table\"")),
                        "no main route with {route} in\n{}",
                        snap.section("routes").join("\n")
                    );
                }
                Ok(())
            })),
        ))
        .step(Step::del(v6).snap_except("routes", "", DEL_RULES_ONLY))
}

/// Fails unless section `section` has a line containing every part.
fn has(snap: &Snapshot, section: &str, parts: &[&str]) -> Result<()> {
    let lines = snap.section(section);
    ensure!(
        lines.iter().any(|l| parts.iter().all(|p| l.contains(p))),
        "no {section} line with {parts:?} in\n{}",
        lines.join("\n")
    );
    Ok(())
}

fn head_error(msg: &str) -> Want {
    Want::Error {
        code: Some(7),
        msg: msg.to_owned(),
    }
}

#[allow(clippy::too_many_lines)]
fn cases() -> Result<Vec<Case<SbrStage>>> {
    let mut cases = skel_cases(
        &conf(json!({})),
        &[
            "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
        ],
    );
    let dual = prev_ips(json!([
        {"interface": 0, "address": "192.168.1.209/24", "gateway": "192.168.1.1"},
        {"interface": 0, "address": "fd91::209/64", "gateway": "fd91::1"}
    ]));
    cases.extend([
        Case::new("prevResult: missing").step(Step::add(without(conf(json!({})), "prevResult"))),
        // HEAD's `PluginConf` has `Table *int` and `Gateways []string`, Go's decoder words it.
        Case::new("config: table of the wrong JSON type").step(Step::add(conf(json!({"table": "100"}))).head(
            HEAD_TABLE,
            Want::Error {
                code: Some(6),
                msg: "failed to parse network configuration: json: cannot unmarshal string into Go struct field PluginConf.table of type int".into(),
            },
        )),
        Case::new("config: gateways of the wrong JSON type").step(Step::add(conf(json!({"gateways": "192.168.1.1"}))).head(
            HEAD_GATEWAYS,
            Want::Error {
                code: Some(6),
                msg: "failed to parse network configuration: json: cannot unmarshal string into Go struct field PluginConf.gateways of type []string".into(),
            },
        )),
        Case::new("prevResult: missing in 0.2.0").step(Step::add(without(conf(json!({"cniVersion": "0.2.0"})), "prevResult"))),
        // Go's CHECK is a no-op that needs no prevResult; ours checks the prevResult's addresses.
        Case::new("prevResult: missing on CHECK").step(
            Step::check(without(conf(json!({})), "prevResult")).readme(
                CHECK_NOTHING,
                Want::Check(Box::new(|out, _| {
                    ensure!(!out.success(), "CHECK passed without prevResult");
                    Ok(())
                })),
            ),
        ),
        Case::new("prevResult: of the 1.x family in a 0.4.0 config").step(Step::add({
            let mut c = conf(json!({}));
            c["cniVersion"] = json!("0.4.0");
            c
        })),
        Case::new("prevResult: without addresses").step(Step::add(conf(json!({"prevResult": prev_ips(json!([]))}))).snap()),
        Case::new("prevResult: without cniVersion").step(
            Step::add(conf(json!({"prevResult": without(prev(), "cniVersion")}))).readme(
                PREV_VERSION,
                Want::Check(Box::new(|out, snap| {
                    ensure!(out.success(), "ADD failed");
                    has(snap, "rules", &["\"src\":\"192.168.1.209\"", "\"table\":\"100\""])
                })),
            ),
        ),
        Case::new("prevResult: unparsable on DEL")
            .step(Step::add(conf(json!({}))))
            .step(Step::del(conf(json!({"prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "x"}]}}))).readme(
                PREV_UNPARSABLE,
                Want::Check(Box::new(|out, snap| {
                    ensure!(out.success(), "DEL failed");
                    ensure!(!snap.section("rules").iter().any(|l| l.contains("192.168.1.209")), "the rule is still there");
                    Ok(())
                })),
            )),
        Case::new("link: CNI_IFNAME missing in the container")
            .step(Step::add(conf(json!({"prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "net9", "sandbox": "@NETNS@"}],
                "ips": [{"interface": 0, "address": "192.168.1.209/24"}]
            }}))).env("CNI_IFNAME", "net9").snap()),
        Case::new("gateways: more than two").step(
            Step::add(conf(json!({"gateways": ["192.168.1.1", "192.168.1.2", "fd91::1"]})))
                .head(HEAD_GATEWAYS, head_error("gateways list cannot contain more than 2 entries (one IPv4, one IPv6)"))
                .snap(),
        ),
        Case::new("gateways: not an address").step(
            Step::add(conf(json!({"gateways": ["gw.example"]})))
                .head(HEAD_GATEWAYS, head_error("invalid static gateway IP address: gw.example"))
                .snap(),
        ),
        Case::new("gateways: two IPv4").step(
            Step::add(conf(json!({"gateways": ["192.168.1.1", "192.168.1.2"]})))
                .head(HEAD_GATEWAYS, head_error("gateways list contains multiple IPv4 addresses: 192.168.1.1 and 192.168.1.2"))
                .snap(),
        ),
        Case::new("gateways: a static IPv4 gateway").step(Step::add(conf(json!({"gateways": ["192.168.1.254"]}))).head(
            HEAD_GATEWAYS,
            Want::Check(Box::new(|out, snap| {
                ensure!(out.success(), "ADD failed");
                has(snap, "routes", &["\"dst\":\"default\"", "\"gateway\":\"192.168.1.254\"", "\"table\":\"100\""])
            })),
        )),
        Case::new("table: a fixed table").step(Step::add(conf(json!({"table": 5000}))).head(
            HEAD_TABLE,
            Want::Check(Box::new(|out, snap| {
                ensure!(out.success(), "ADD failed");
                has(snap, "rules", &["\"src\":\"192.168.1.209\"", "\"table\":\"5000\""])?;
                ensure!(
                    snap.section("routes").iter().any(|l| l.contains("\"dst\":\"198.51.100.0/24\"") && !l.contains("\"table\"")),
                    "net1's route left main"
                );
                ensure!(!snap.section("routes").iter().any(|l| l.contains("\"table\":\"5000\"")), "routes moved into 5000");
                Ok(())
            })),
        ))
        .step(Step::del(conf(json!({"table": 5000}))).head(
            HEAD_TABLE,
            Want::Check(Box::new(|out, snap| {
                ensure!(out.success(), "DEL failed");
                ensure!(!snap.section("rules").iter().any(|l| l.contains("5000")), "the rule is still there");
                Ok(())
            })),
        )),
        Case::new("table: 254").step(Step::add(conf(json!({"table": 254}))).readme(
            TABLE_UNCHECKED,
            Want::Check(Box::new(|out, _| {
                ensure!(out.error().map(|e| e.code) == Some(7), "want a code 7 error");
                Ok(())
            })),
        )),
        Case::new("addSourceHints").step(Step::add(conf(json!({"addSourceHints": true}))).head(
            HEAD_HINTS,
            Want::Check(Box::new(|out, snap| {
                ensure!(out.success(), "ADD failed");
                has(snap, "routes", &["\"dst\":\"192.168.1.0/24\"", "\"dev\":\"net1\"", "\"prefsrc\":\"192.168.1.209\"", "\"scope\":\"link\""])?;
                ensure!(
                    snap.section("routes").iter().any(|l| l.contains("\"dst\":\"192.168.1.0/24\"") && !l.contains("\"table\"")),
                    "the subnet route left main"
                );
                has(snap, "routes", &["\"dst\":\"default\"", "\"table\":\"100\""])
            })),
        )),
    ]);

    for version in SHARED_VERSIONS {
        cases.push(lifecycle(
            &format!("lifecycle in {version}"),
            &conf_at(version, json!({}))?,
        ));
    }
    let c110 = conf(json!({"cniVersion": "1.1.0", "prevResult": {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "net1", "sandbox": "@NETNS@"}],
        "ips": [{"interface": 0, "address": "192.168.1.209/24", "gateway": "192.168.1.1"}]
    }}));
    cases.push(
        Case::new("lifecycle in 1.1.0")
            .step(Step::add(c110.clone()).go_at("1.0.0", HEAD_110).snap())
            .step(Step::check(c110.clone()).go_at("1.0.0", HEAD_110))
            .step(Step::del(c110).go_at("1.0.0", HEAD_110).snap_except(
                "routes",
                "",
                DEL_RULES_ONLY,
            )),
    );

    cases.extend([
        lifecycle("dual-stack", &conf(json!({"prevResult": dual.clone()}))),
        ipv6_only(),
        lifecycle("an address without a gateway", &conf(json!({"prevResult": prev_ips(json!([{"interface": 0, "address": "192.168.1.209/24"}]))}))),
        lifecycle("an address whose interface index is out of range", &conf(json!({"prevResult": prev_ips(json!([
            {"interface": 0, "address": "192.168.1.209/24", "gateway": "192.168.1.1"},
            {"interface": 5, "address": "192.168.1.210/24"}
        ]))})))
        .setup(|s: &SbrStage| {
            s.ns.container.ip(&["addr", "add", "192.168.1.210/24", "dev", "net1"])?;
            Ok(())
        }),
        lifecycle("table 100 already named by a rule", &conf(json!({}))).setup(|s: &SbrStage| {
            s.ns.container.ip(&["rule", "add", "from", "10.1.1.1", "lookup", "100"])?;
            Ok(())
        }),
        // Go copies main's default into the table next to the one for the gateway.
        lifecycle("a default route on net1 in main", &conf(json!({})))
            .setup(|s: &SbrStage| {
                s.ns.container.ip(&["route", "add", "default", "via", "192.168.1.1", "dev", "net1", "metric", "200"])?;
                Ok(())
            })
            .except("routes", "\"metric\":200", MAIN_DEFAULT),
        Case::new("table 100 holds routes but no rule names it")
            .setup(|s: &SbrStage| {
                s.ns.container.ip(&["route", "add", "203.0.113.0/24", "dev", "eth0", "table", "100"])?;
                Ok(())
            })
            .step(Step::add(conf(json!({}))).readme(
                FREE_TABLE,
                Want::Check(Box::new(|out, snap| {
                    ensure!(out.success(), "ADD failed");
                    has(snap, "rules", &["\"src\":\"192.168.1.209\"", "\"table\":\"101\""])
                })),
            )),
        Case::new("no prevResult address on the interface").step(
            Step::add(conf(json!({"prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "eth0", "sandbox": "@NETNS@"}],
                "ips": [{"interface": 0, "address": "10.93.0.2/24"}]
            }})))
            .readme(
                NO_ADDRESS,
                Want::Check(Box::new(|out, _| {
                    ensure!(out.success(), "ADD failed");
                    Ok(())
                })),
            )
            .snap(),
        ),
        Case::new("re-ADD")
            .step(Step::add(conf(json!({}))))
            .step(Step::add(conf(json!({}))).readme(REPEATED_ADD, Want::Check(Box::new(|out, _| {
                ensure!(out.success(), "the second ADD failed");
                Ok(())
            }))))
            .step(Step::del(conf(json!({}))).snap_except("routes", "", DEL_RULES_ONLY)),
        Case::new("CHECK after drift: the rule removed")
            .step(Step::add(conf(json!({}))))
            .mutate("delete the rule", |s: &SbrStage| {
                s.ns.container.ip(&["rule", "del", "from", "192.168.1.209", "lookup", "100"])?;
                Ok(())
            })
            .step(Step::check(conf(json!({}))).readme(CHECK_NOTHING, Want::Check(Box::new(|out, _| {
                ensure!(!out.success(), "CHECK passed without the rule");
                Ok(())
            })))),
        Case::new("DEL without prevResult")
            .step(Step::add(conf(json!({"prevResult": dual.clone()}))))
            .step(Step::del(without(conf(json!({})), "prevResult")).snap_except("routes", "", DEL_RULES_ONLY)),
        Case::new("DEL twice")
            .step(Step::add(conf(json!({}))))
            .step(Step::del(conf(json!({}))))
            .step(Step::del(conf(json!({}))).snap_except("routes", "", DEL_RULES_ONLY)),
        Case::new("DEL after the link is gone")
            .step(Step::add(conf(json!({}))))
            .mutate("delete net1", |s: &SbrStage| {
                s.ns.container.ip(&["link", "del", "net1"])?;
                Ok(())
            })
            .step(Step::del(conf(json!({}))).head(HEAD_DEL_NO_LINK, Want::Silent)),
        Case::new("DEL after the netns is gone").step(
            Step::del(conf(json!({})))
                .env("CNI_NETNS", "/run/netns/sbr-diff-no-such-netns")
                .readme(NETNS_GONE, Want::Silent),
        ),
        Case::new("upgrade: Go's ADD, DEL by ours")
            .step(Step::add(conf(json!({"prevResult": dual.clone()}))).by(By::Go))
            .step(Step::del(conf(json!({"prevResult": dual.clone()}))).snap_except("routes", "", DEL_RULES_ONLY)),
        Case::new("upgrade: Go's ADD, CHECK by ours")
            .step(Step::add(conf(json!({"prevResult": dual.clone()}))).by(By::Go))
            .step(Step::check(conf(json!({"prevResult": dual.clone()})))),
        Case::new("downgrade: our ADD, DEL by Go")
            .step(Step::add(conf(json!({"prevResult": dual.clone()}))))
            .step(Step::del(conf(json!({"prevResult": dual}))).by(By::Go).snap()),
    ]);
    Ok(cases)
}

#[test]
fn sbr_answers_rules_and_routes_match_the_go_plugin() -> Result<()> {
    suite().run(cases()?)
}

/// Debian's 1.1.1 configuration struct of the plugin, as Go declares it.
const SBR_SCHEMA: generated::Schema = generated::Schema { fields: &[] };

/// Issue 26 item 4: generated configurations decode as Go decodes them (see
/// `tests::generated`).
#[test]
fn generated_configurations_are_decoded_and_applied_as_go_does() -> Result<()> {
    let plan = generated::Plan {
        plugin: "sbr",
        schema: SBR_SCHEMA,
        base: |version| generated::base_in(&conf(json!({})), version),
        env: generated::decode_env(ID, "eth0"),
        known: vec![
            generated::Known {
                why: Why::Readme(LOCK_CREATES),
                applies: |_, go, ours| {
                    generated::msg(go) == "no such file or directory"
                        && generated::failed_at_netns(ours)
                },
            },
            generated::Known {
                why: Why::Readme(PREV_VERSION),
                // Ours takes the config's version and goes on, to whatever follows.
                applies: |_, go, _| {
                    generated::msg(go).ends_with("but unmarshalled CNIVersion is \"\"")
                },
            },
        ],
        decoded: |go, ours| {
            (go.success() && ours.success())
                || (generated::msg(go) == "no such file or directory"
                    && generated::failed_at_netns(ours))
        },
        kernel_fits: generated::any,
        count: 400,
        kernel: 6,
    };
    generated::run(&plan, &suite(), |name, stdin| {
        generated::add_then_del(name, stdin, |del| {
            del.snap_except("routes", "", DEL_RULES_ONLY)
        })
    })
}
