//! `firewall` against Debian's Go `firewall` (1.1.1): the same calls, the same answers, the
//! same `filter` table (see `tests::differential` for what is compared and how).
//!
//! Each side is a host namespace (where the plugin runs) and a container namespace joined by a
//! veth `vethfw0` ↔ `eth0`; prevResult names a bridge `cni0` first, as `bridge` does (the
//! isolation rules name it; it need not exist). The kernel objects compared are the host's
//! `iptables-save`/`ip6tables-save` of `filter` and `nft list ruleset`. Both implementations
//! get `DBUS_SYSTEM_BUS_ADDRESS` pointing at a socket that does not exist, so auto-detection
//! never finds a firewalld.
//!
//! Where Debian's 1.1.1 is not the reference: it has no `isolated` ingress policy (v1.7.0) and
//! no `1.1.0`.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use anyhow::{Result, ensure};
use serde_json::{Value, json};
use tests::Runtime;
use tests::differential::{
    self, By, Case, Impl, Namespaces, Stage, Step, Suite, Want, Why, config, in_version,
    skel_cases, without,
};
use tests::generated::{self, Field, Go};
use tests::snapshot::{self, Snapshot};

const NETWORK: &str = "fwdiff";
const ID: &str = "firewall-diff-1";
const HOST_IF: &str = "vethfw0";

/// README lines.
const UNKNOWN_BACKEND: &str = "an unknown `backend` means auto-detection";
const UNKNOWN_POLICY: &str =
    "an unknown `ingressPolicy` fails ADD (code 999) after the backend's rules are installed";
const NEW_NFT: &str = "no nftables backend";
const VALIDATED: &str =
    "`iptablesAdminChainName` and `firewalldZone` are passed to the tool or D-Bus unchecked";
const DEL_WITHOUT_PREV: &str = "DEL without prevResult removes nothing";
const REUSED_IP: &str =
    "DEL of an old container removes the accepts of a newer one that reuses its address";
const CHECK_CREATES: &str = "CHECK creates missing chains";
const PREV_RESULT_TYPES: &str = "a prevResult value of the wrong JSON type";
const NO_BRIDGE: &str = "with an ingress policy, a prevResult without interfaces, or whose first interface has no name, fails ADD (code 999) after the backend's chains, jumps and accepts are installed, and leaves them";

const HEAD_110: &str = "reference-behaviour.md §1.1/§1.7: HEAD takes 1.1.0, whose result is 1.0.0's with another cniVersion";
const HEAD_ISOLATED: &str = "reference-behaviour.md §2.4: `ingressPolicy: isolated` (v1.7.0) adds `-i <br> -o <br> -j DROP` at the top of CNI-ISOLATION-STAGE-1 with the `isolated` comment; 1.1.1 refuses the policy";

struct FirewallStage {
    ns: Namespaces,
}

impl Stage for FirewallStage {
    fn runtime(&self) -> &Runtime {
        &self.ns.runtime
    }

    fn vars(&self) -> Vec<(String, String)> {
        self.ns.vars()
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let mut snap = Snapshot::new();
        for (name, lines) in snapshot::netfilter_sections(&self.ns.host, &["filter"])? {
            snap.insert(name, lines);
        }
        Ok(snap)
    }
}

fn build(_: Impl) -> Result<FirewallStage> {
    Ok(FirewallStage {
        ns: Namespaces::new("dfw", HOST_IF, &[], "eth0", &["10.94.0.2/24", "fd94::2/64"])?,
    })
}

fn suite() -> Suite<FirewallStage> {
    Suite::new("firewall", build).cni_env(ID, "eth0").env(
        "DBUS_SYSTEM_BUS_ADDRESS",
        "unix:path=/nonexistent/system_bus_socket",
    )
}

/// What `bridge` prints: the bridge, the host veth, the container's `eth0` with one address of
/// each family.
fn prev() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "cni0", "mac": "02:00:00:00:00:0a"},
            {"name": HOST_IF, "mac": "02:00:00:00:00:01"},
            {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "@NETNS@"}
        ],
        "ips": [
            {"interface": 2, "address": "10.94.0.2/24", "gateway": "10.94.0.1"},
            {"interface": 2, "address": "fd94::2/64", "gateway": "fd94::1"}
        ],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {}
    })
}

/// [`prev`] with the addresses `ips` (address, interface index or none).
fn prev_with(ips: &[(&str, Option<u64>)]) -> Value {
    let mut p = prev();
    p["ips"] = Value::Array(
        ips.iter()
            .map(|(a, i)| match i {
                Some(i) => json!({"interface": i, "address": a}),
                None => json!({"address": a}),
            })
            .collect(),
    );
    p
}

fn conf(keys: Value) -> Value {
    config("firewall", NETWORK, prev(), keys)
}

fn conf_at(version: &str, keys: Value) -> Result<Value> {
    in_version(&conf(keys), version)
}

fn lifecycle(name: &str, conf: &Value) -> Case<FirewallStage> {
    differential::lifecycle(name, conf, |check| check, |del| del)
}

/// Fails unless the IPv4 `filter` table has a line with all of `parts`.
fn filter4_has(snap: &Snapshot, parts: &[&str]) -> Result<()> {
    let filter = snap.section("iptables filter");
    ensure!(
        filter.iter().any(|l| parts.iter().all(|p| l.contains(p))),
        "no rule with {parts:?} in\n{}",
        filter.join("\n")
    );
    Ok(())
}

fn delete_rule(s: &FirewallStage, args: &[&str]) -> Result<()> {
    let mut full = vec!["-t", "filter", "-D"];
    full.extend_from_slice(args);
    s.ns.host.exec_ok("iptables", &full)?;
    Ok(())
}

#[allow(clippy::too_many_lines)]
fn cases() -> Result<Vec<Case<FirewallStage>>> {
    let mut cases = skel_cases(&conf(json!({})), &["0.4.0", "1.0.0", "1.1.0"]);
    let second = |ips: &[(&str, Option<u64>)]| conf(json!({"prevResult": prev_with(ips)}));
    cases.extend([
        Case::new("prevResult: missing on ADD").step(Step::add(without(conf(json!({})), "prevResult"))),
        // The reference looks at the prevResult before the policy.
        Case::new("prevResult: missing on ADD, and an unknown ingress policy").step(Step::add(
            without(conf(json!({"ingressPolicy": "closed"})), "prevResult"),
        )),
        Case::new("prevResult: of the 1.x family in a 0.4.0 config").step(Step::add({
            let mut c = conf(json!({}));
            c["cniVersion"] = json!("0.4.0");
            c
        })),
        Case::new("prevResult: missing on CHECK").step(Step::check(without(conf(json!({})), "prevResult"))),
        Case::new("prevResult: missing on DEL").step(Step::add(conf(json!({})))).step(
            Step::del(without(conf(json!({})), "prevResult")).readme(
                DEL_WITHOUT_PREV,
                Want::Check(Box::new(|out, snap| {
                    ensure!(out.success(), "DEL failed");
                    ensure!(
                        !snap.section("iptables filter").iter().any(|l| l.contains("10.94.0.2")),
                        "the accepts are still there"
                    );
                    Ok(())
                })),
            ),
        ),
        Case::new("config: an unknown backend").step(
            Step::add(conf(json!({"backend": "pf"})))
                .readme(
                    UNKNOWN_BACKEND,
                    Want::Check(Box::new(|out, _| {
                        ensure!(out.error().map(|e| e.code) == Some(7), "want a code 7 error");
                        Ok(())
                    })),
                )
                .snap(),
        ),
        // The reference fails only after installing the accepts; ours before anything.
        Case::new("config: an unknown ingress policy").step(
            Step::add(conf(json!({"ingressPolicy": "bogus"})))
                .readme(
                    UNKNOWN_POLICY,
                    Want::Error { code: Some(7), msg: "unknown ingress policy: \"bogus\"".into() },
                )
                .snap(),
        ),
        Case::new("config: an admin chain name iptables refuses").step(
            Step::add(conf(json!({"iptablesAdminChainName": "CNI ADMIN"}))).msg_per_readme(VALIDATED),
        ),
        // The reference fails only after installing its chains, jumps and accepts; ours before
        // anything (the snapshot is compared with the Go side, which did not run the step).
        Case::new("config: same-bridge without interfaces").step(
            Step::add(conf(json!({
                "ingressPolicy": "same-bridge",
                "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.94.0.2/24"}]}
            })))
            .readme(
                NO_BRIDGE,
                Want::Error {
                    code: Some(7),
                    msg: r#"interface needs to be set for ingress policy "same-bridge", make sure to chain "firewall" plugin with "bridge""#.into(),
                },
            )
            .snap(),
        ),
        Case::new("config: same-bridge with an empty bridge name").step(
            Step::add(conf(json!({
                "ingressPolicy": "same-bridge",
                "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": ""}], "ips": [{"address": "10.94.0.2/24"}]}
            })))
            .readme(
                NO_BRIDGE,
                Want::Error { code: Some(7), msg: "got empty bridge name".into() },
            )
            .snap(),
        ),
        Case::new("config: backend firewalld without a firewalld").step(Step::add(conf(json!({"backend": "firewalld"}))).snap()),
        Case::new("config: backend firewalld without a firewalld, CHECK").step(Step::check(conf(json!({"backend": "firewalld"})))),
        Case::new("config: a key of the wrong JSON type").step(Step::add(conf(json!({"ingressPolicy": 5})))),
        Case::new("config: a backend of the wrong JSON type").step(Step::add(conf(json!({"backend": ["iptables"]})))),
        Case::new("config: an envelope key of the wrong JSON type").step(Step::add(conf(json!({"capabilities": {"portMappings": "yes"}})))),
        Case::new("config: of two keys of the wrong JSON type, the first").step(Step::add(conf(json!({"firewalldZone": 1, "dns": {"nameservers": "x"}})))),
        Case::new("prevResult: an interface name of the wrong JSON type").step(
            Step::add(conf(json!({
                "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": 5}], "ips": [{"address": "10.94.0.2/24"}]}
            })))
            .msg_per_readme(PREV_RESULT_TYPES),
        ),
        Case::new("config: backend nftables").step(Step::add(conf(json!({"backend": "nftables"}))).readme(
            NEW_NFT,
            Want::Check(Box::new(|out, snap| {
                ensure!(out.success(), "ADD failed");
                ensure!(
                    !snap.section("iptables filter").iter().any(|l| l.contains("CNI-")),
                    "the nftables backend made iptables rules"
                );
                Ok(())
            })),
        )),
        Case::new("cniVersion 0.3.1 is not supported").step(Step::add(conf_at("0.3.1", json!({}))?)),
    ]);

    for version in ["0.4.0", "1.0.0"] {
        cases.push(lifecycle(
            &format!("lifecycle in {version}"),
            &conf_at(version, json!({}))?,
        ));
    }
    let c110 = conf(json!({"cniVersion": "1.1.0"}));
    cases.push(
        Case::new("lifecycle in 1.1.0")
            .step(Step::add(c110.clone()).go_at("1.0.0", HEAD_110).snap())
            .step(Step::check(c110.clone()).go_at("1.0.0", HEAD_110))
            .step(Step::del(c110).go_at("1.0.0", HEAD_110).snap()),
    );

    cases.extend([
        lifecycle("backend empty string", &conf(json!({"backend": ""}))),
        lifecycle("backend iptables", &conf(json!({"backend": "iptables"}))),
        lifecycle(
            "a custom admin chain",
            &conf(json!({"iptablesAdminChainName": "CNI-foobar"})),
        ),
        lifecycle(
            "capitalised keys",
            &conf(json!({"IptablesAdminChainName": "CNI-foobar", "Backend": "iptables"})),
        ),
        lifecycle(
            "a firewalld zone with the iptables backend",
            &conf(json!({"firewalldZone": "public"})),
        ),
        lifecycle(
            "ingress policy open",
            &conf(json!({"ingressPolicy": "open"})),
        ),
        lifecycle(
            "ingress policy empty string",
            &conf(json!({"ingressPolicy": ""})),
        ),
        lifecycle(
            "ingress policy same-bridge",
            &conf(json!({"ingressPolicy": "same-bridge"})),
        ),
        lifecycle("IPv4 only", &second(&[("10.94.0.2/24", Some(2))])),
        lifecycle("IPv6 only", &second(&[("fd94::2/64", Some(2))])),
        lifecycle(
            "every prevResult address, whatever its interface",
            &second(&[
                ("10.94.0.2/24", Some(2)),
                ("10.94.1.2/24", None),
                ("192.0.2.1/24", Some(0)),
                ("fd94::2/64", Some(2)),
            ]),
        ),
        Case::new("ingress policy isolated").step(
            Step::add(conf(json!({"ingressPolicy": "isolated"}))).head(
                HEAD_ISOLATED,
                Want::Check(Box::new(|out, snap| {
                    ensure!(out.success(), "ADD failed");
                    filter4_has(
                        snap,
                        &[
                            "-A CNI-ISOLATION-STAGE-1",
                            "-i cni0 -o cni0",
                            "ingressPolicy: isolated",
                            "-j DROP",
                        ],
                    )?;
                    filter4_has(
                        snap,
                        &[
                            "-A CNI-ISOLATION-STAGE-1",
                            "-i cni0 ! -o cni0",
                            "-j CNI-ISOLATION-STAGE-2",
                        ],
                    )?;
                    filter4_has(snap, &["-A CNI-ISOLATION-STAGE-2", "-o cni0", "-j DROP"])?;
                    filter4_has(snap, &["-A FORWARD", "-j CNI-ISOLATION-STAGE-1"])
                })),
            ),
        ),
        Case::new("re-ADD")
            .step(Step::add(conf(json!({"ingressPolicy": "same-bridge"}))))
            .step(Step::add(conf(json!({"ingressPolicy": "same-bridge"}))).snap())
            .step(Step::del(conf(json!({"ingressPolicy": "same-bridge"}))).snap()),
        Case::new("DEL twice")
            .step(Step::add(conf(json!({}))))
            .step(Step::del(conf(json!({}))))
            .step(Step::del(conf(json!({}))).snap()),
        Case::new("CHECK after drift: an accept removed")
            .step(Step::add(conf(json!({}))))
            .mutate("delete the IPv4 source accept", |s: &FirewallStage| {
                delete_rule(s, &["CNI-FORWARD", "-s", "10.94.0.2/32", "-j", "ACCEPT"])
            })
            .step(Step::check(conf(json!({}))))
            .step(Step::del(conf(json!({}))).snap()),
        Case::new("CHECK after drift: the FORWARD jump removed")
            .step(Step::add(conf(json!({}))))
            .mutate("delete the FORWARD jump", |s: &FirewallStage| {
                delete_rule(
                    s,
                    &[
                        "FORWARD",
                        "-m",
                        "comment",
                        "--comment",
                        "CNI firewall plugin rules",
                        "-j",
                        "CNI-FORWARD",
                    ],
                )
            })
            .step(Step::check(conf(json!({})))),
        Case::new("CHECK after drift: the admin chain removed")
            .step(Step::add(conf(json!({}))))
            .mutate("delete the admin jump and chain", |s: &FirewallStage| {
                delete_rule(
                    s,
                    &[
                        "CNI-FORWARD",
                        "-m",
                        "comment",
                        "--comment",
                        "CNI firewall plugin admin overrides",
                        "-j",
                        "CNI-ADMIN",
                    ],
                )?;
                s.ns.host
                    .exec_ok("iptables", &["-t", "filter", "-X", "CNI-ADMIN"])?;
                Ok(())
            })
            .step(
                Step::check(conf(json!({})))
                    .snap_except("iptables filter", "CNI-ADMIN", CHECK_CREATES)
                    .snap_except("nft", "CNI-ADMIN", CHECK_CREATES),
            ),
        Case::new("two containers: DEL of one keeps the other's accepts")
            .step(Step::add(conf(json!({}))))
            .step(
                Step::add(second(&[("10.94.0.3/24", Some(2))]))
                    .env("CNI_CONTAINERID", "second")
                    .snap(),
            )
            .step(Step::del(conf(json!({}))).snap()),
        Case::new("an address reused by a newer attachment")
            .step(Step::add(conf(json!({}))))
            .step(Step::add(conf(json!({}))).env("CNI_CONTAINERID", "second"))
            .step(Step::del(conf(json!({}))).readme(
                REUSED_IP,
                Want::Check(Box::new(|out, snap| {
                    ensure!(out.success(), "DEL failed");
                    filter4_has(snap, &["-s 10.94.0.2/32", "-j ACCEPT"])
                })),
            )),
        Case::new("upgrade: Go's ADD, DEL by ours")
            .step(Step::add(conf(json!({"ingressPolicy": "same-bridge"}))).by(By::Go))
            .step(Step::del(conf(json!({"ingressPolicy": "same-bridge"}))).snap()),
        Case::new("upgrade: Go's ADD, CHECK by ours")
            .step(Step::add(conf(json!({"ingressPolicy": "same-bridge"}))).by(By::Go))
            .step(Step::check(conf(json!({"ingressPolicy": "same-bridge"})))),
        Case::new("downgrade: our ADD, CHECK and DEL by Go")
            .step(Step::add(conf(json!({"ingressPolicy": "same-bridge"}))))
            .step(Step::check(conf(json!({"ingressPolicy": "same-bridge"}))).by(By::Go))
            .step(
                Step::del(conf(json!({"ingressPolicy": "same-bridge"})))
                    .by(By::Go)
                    .snap(),
            ),
    ]);
    Ok(cases)
}

#[test]
fn firewall_answers_and_filter_rules_match_the_go_plugin() -> Result<()> {
    suite().run(cases()?)
}

/// Debian's 1.1.1 configuration struct of the plugin, as Go declares it.
const FIREWALL_SCHEMA: generated::Schema = generated::Schema {
    fields: &[
        Field {
            key: "backend",
            go: Go::Str(&["iptables"]),
        },
        Field {
            key: "iptablesAdminChainName",
            go: Go::Str(&["", "CNI-ADMIN", "MY-ADMIN"]),
        },
        Field {
            key: "ingressPolicy",
            go: Go::Str(&["", "open", "same-bridge"]),
        },
    ],
};

/// Issue 26 item 4: generated configurations decode as Go decodes them (see
/// `tests::generated`).
#[test]
fn generated_configurations_are_decoded_and_applied_as_go_does() -> Result<()> {
    let plan = generated::Plan {
        plugin: "firewall",
        schema: FIREWALL_SCHEMA,
        base: |version| generated::base_in(&conf(json!({})), version),
        env: generated::decode_env(ID, "eth0"),
        known: vec![generated::Known {
            why: Why::Readme(UNKNOWN_BACKEND),
            // Ours refuses it where Go goes on, to success or a later failure.
            applies: |_, _, ours| generated::msg(ours).starts_with("invalid backend"),
        }],
        decoded: generated::past_decoding,
        kernel_fits: generated::any,
        count: 300,
        kernel: 8,
    };
    generated::run(&plan, &suite(), |name, stdin| {
        generated::add_then_del(name, stdin, |del| del)
    })
}
