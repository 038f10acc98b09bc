//! `bandwidth` against Debian's Go `bandwidth` (1.1.1): the same calls, the same answers, the
//! same IFB and the same qdiscs and filters (see `tests::differential` for what is compared and
//! how).
//!
//! Each side is a host namespace (where the plugin runs, as with a veth main plugin) and a
//! container namespace joined by a veth `vethbw0` ↔ `eth0` with fixed MACs. The kernel objects
//! compared are the host's links (the IFB's name and attributes in a section of their own), the
//! qdiscs, filters and classes of the host veth and of the IFB (the IFB's name masked there as
//! `<ifb>`, since the `ifb` section already compares it), and the container's qdiscs. The IFB's
//! MAC is random, so it is masked in results (`@IFB_MAC@`).
//!
//! Where Debian's 1.1.1 is not the reference: it advertises no `1.1.0`. (Its IFB already has
//! HEAD's `txqueuelen` 0.)

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

const NETWORK: &str = "bwdiff";
const ID: &str = "bandwidth-diff-1";
const HOST_IF: &str = "vethbw0";

/// README rows.
const DEL_KEEPS_QDISCS: &str =
    "DEL removes only the IFB; the host veth's qdiscs stay until the veth goes";
const IFB_TXQLEN: &str = "IFB txqueuelen 0";
const IFB_ALIAS: &str = "IFB without alias";
const DEL_VALIDATES: &str = "DEL parses and validates the limits (an invalid config fails DEL)";
const PANIC: &str = "ADD with no limits and no prevResult panics (exit 2, no JSON)";
/// README row: the reference's message for a netns that cannot be opened.
const NETNS_MSG: &str = "a netns that cannot be opened: `failed to open netns %!q(<nil>): …`";
const REPEATED_ADD: &str = "ADD uses \"add\": a second ADD fails with \"file exists\"; no rollback";
const ONLY_VETH: &str = "only veth main plugins work; otherwise ADD fails";
const PEER_LISTED: &str = "host veth must be listed in prevResult";
const WRAPS: &str = "buffer/limit silently wrap on overflow; rates < 8 bit/s divide by zero";
const COLLIDE: &str =
    "a second interface of one container on the same network collides on the IFB name";
const SENTINEL: &str = "sentinel bursts taken literally";

const HEAD_CHECK_NOTHING: &str = "reference-behaviour.md §2.3: CHECK with nothing configured succeeds (1.1.1 dereferences a nil config and panics; fixed in v1.9.1)";
const HEAD_110: &str = "reference-behaviour.md §1.1/§1.7: HEAD takes 1.1.0, whose result is 1.0.0's with another cniVersion";

struct BandwidthStage {
    ns: Namespaces,
}

/// True for an IFB this plugin or the Go one made (live or retired).
fn is_ifb(name: &str) -> bool {
    name.starts_with("bwp")
}

impl Stage for BandwidthStage {
    fn runtime(&self) -> &Runtime {
        &self.ns.runtime
    }

    fn vars(&self) -> Vec<(String, String)> {
        self.ns.vars()
    }

    fn masks_of(&self, json: &Value) -> Vec<(String, String)> {
        json["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["name"].as_str().is_some_and(is_ifb))
            .filter_map(|i| i["mac"].as_str())
            .map(|mac| (mac.to_owned(), "@IFB_MAC@".to_owned()))
            .collect()
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let host = &self.ns.host;
        let mut snap = Snapshot::new();
        let names = host.link_names()?;
        let ifbs: Vec<&String> = names.iter().filter(|n| is_ifb(n)).collect();
        let lines = snapshot::link_attr_lines(host, |name| !is_ifb(name))?;
        let (ifb_lines, other): (Vec<String>, Vec<String>) = lines
            .into_iter()
            .partition(|l| ifbs.iter().any(|i| l.starts_with(&format!("{i} "))));
        snap.insert("links", other);
        let mut ifb: Vec<String> = ifbs.iter().map(|i| format!("name {i}")).collect();
        ifb.extend(ifb_lines.iter().map(|l| {
            let (_, attr) = l.split_once(' ').unwrap_or_default();
            attr.to_owned()
        }));
        snap.insert("ifb", ifb);
        let mask = |lines: Vec<String>| -> Vec<String> {
            lines
                .into_iter()
                .map(|l| ifbs.iter().fold(l, |l, i| l.replace(i.as_str(), "<ifb>")))
                .collect()
        };
        let tc = |dev: &str| -> Result<Vec<String>> {
            let mut lines = snapshot::tc_lines(host, &["qdisc", "show", "dev", dev])?;
            lines.extend(snapshot::tc_lines(
                host,
                &["filter", "show", "dev", dev, "ingress"],
            )?);
            Ok(mask(lines))
        };
        snap.insert(format!("tc {HOST_IF}"), tc(HOST_IF)?);
        let mut ifb_tc = Vec::new();
        for i in &ifbs {
            ifb_tc.extend(tc(i)?);
        }
        snap.insert("tc ifb", ifb_tc);
        snap.insert(
            "tc container",
            snapshot::tc_lines(&self.ns.container, &["qdisc", "show"])?,
        );
        Ok(snap)
    }
}

fn build(_: Impl) -> Result<BandwidthStage> {
    Ok(BandwidthStage {
        ns: Namespaces::new("dbw", HOST_IF, &["10.95.0.1/24"], "eth0", &["10.95.0.2/24"])?,
    })
}

fn suite() -> Suite<BandwidthStage> {
    Suite::new("bandwidth", build).cni_env(ID, "eth0")
}

/// What a veth main plugin prints: the host veth (no sandbox), the container's `eth0`.
fn prev() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": HOST_IF, "mac": "02:00:00:00:00:01"},
            {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "@NETNS@"}
        ],
        "ips": [{"interface": 1, "address": "10.95.0.2/24", "gateway": "10.95.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}]
    })
}

/// 8 Mbit/s in, 16 Mbit/s out, bursts of 80 and 160 kbit.
fn limits() -> Value {
    json!({"ingressRate": 8_000_000, "ingressBurst": 80_000, "egressRate": 16_000_000, "egressBurst": 160_000})
}

/// A 1.0.0 config with [`prev`] and `keys` (e.g. [`limits`]).
fn conf(keys: Value) -> Value {
    config("bandwidth", NETWORK, prev(), keys)
}

fn conf_at(version: &str, keys: Value) -> Result<Value> {
    in_version(&conf(keys), version)
}

/// ADD, CHECK (from 0.4.0) and DEL, the kernel compared after ADD and DEL; after DEL the host
/// veth's qdiscs are ours to remove (README), and the IFB's queue length is the kernel's.
fn lifecycle(name: &str, conf: &Value) -> Case<BandwidthStage> {
    with_ifb_rows(differential::lifecycle(
        name,
        conf,
        |check| check,
        |del| del.snap_except(&format!("tc {HOST_IF}"), "", DEL_KEEPS_QDISCS),
    ))
}

/// The README's rows on the IFB's attributes: queue length and owner alias.
fn with_ifb_rows(case: Case<BandwidthStage>) -> Case<BandwidthStage> {
    case.except("ifb", "txqlen", IFB_TXQLEN)
        .except("ifb", "ifalias", IFB_ALIAS)
}

fn ok_with_tbf(dev_section: &'static str) -> Want {
    Want::Check(Box::new(move |out, snap| {
        ensure!(out.success(), "ADD failed");
        ensure!(
            snap.section(dev_section)
                .iter()
                .any(|l| l.contains("\"kind\":\"tbf\"")),
            "no tbf in `{dev_section}`: {:?}",
            snap.section(dev_section)
        );
        Ok(())
    }))
}

#[allow(clippy::too_many_lines)]
fn cases() -> Result<Vec<Case<BandwidthStage>>> {
    let mut cases = skel_cases(
        &conf(limits()),
        &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
    );
    // The validation of reference-behaviour.md §2.3 (parsing: ADD, CHECK and DEL alike).
    cases.extend([
        Case::new("config: ingress rate without burst").step(Step::add(conf(json!({"ingressRate": 8000})))),
        Case::new("config: egress burst without rate").step(Step::add(conf(json!({"egressBurst": 8000})))),
        Case::new("config: ingress burst without rate on CHECK").step(Step::check(conf(json!({"ingressBurst": 123})))),
        Case::new("config: a burst of 4 GB").step(Step::add(conf(json!({"egressRate": 8000, "egressBurst": 34_359_738_360_u64})))),
        // Just below the 4 GB bound, the queue limit (rate × 25 ms + burst) passes 2^32 bytes: Go
        // sends it wrapped (a limit of 24999998 bytes).
        Case::new("config: a burst just below 4 GB").step(
            Step::add(conf(json!({"ingressRate": 8_000_000_000_u64, "ingressBurst": 34_359_738_352_u64})))
                .readme(
                    WRAPS,
                    Want::Check(Box::new(|out, _| {
                        ensure!(out.error().map(|e| e.code) == Some(7), "want a code 7 error");
                        Ok(())
                    })),
                )
                .snap(),
        ),
        Case::new("config: a rate of the wrong JSON type").step(Step::add(conf(json!({"ingressRate": "fast", "ingressBurst": 8000})))),
        Case::new("config: a negative rate").step(Step::add(conf(json!({"ingressRate": -8000, "ingressBurst": 8000})))),
        Case::new("config: a fractional rate").step(Step::add(conf(json!({"ingressRate": 1.5, "ingressBurst": 8000})))),
        Case::new("config: a runtimeConfig rate of the wrong JSON type").step(Step::add(conf(json!({
            "runtimeConfig": {"bandwidth": {"ingressRate": "fast", "ingressBurst": 8000}}
        })))),
        Case::new("config: runtimeConfig.bandwidth of the wrong JSON type").step(Step::add(conf(json!({
            "runtimeConfig": {"bandwidth": 8000}
        })))),
        // Go decodes runtimeConfig with the rest, even when the top-level keys are the ones used.
        Case::new("config: a runtimeConfig of the wrong JSON type beside top-level keys").step(Step::add(conf(json!({
            "ingressRate": 8000, "ingressBurst": 8000,
            "runtimeConfig": {"bandwidth": {"egressRate": true}}
        })))),
        Case::new("config: of two values of the wrong JSON type, the first").step(Step::add(conf(json!({
            "egressBurst": "x", "capabilities": {"bandwidth": 1}
        })))),
        Case::new("config: an invalid static set wins over a valid runtimeConfig").step(Step::add(conf(json!({
            "ingressBurst": 8000,
            "runtimeConfig": {"bandwidth": limits()}
        })))),
        Case::new("config: a static set of zeros wins over runtimeConfig").step(Step::add(conf(json!({
            "ingressRate": 0,
            "runtimeConfig": {"bandwidth": limits()}
        }))).snap()),
        Case::new("config: an invalid config on DEL")
            .step(Step::del(conf(json!({"ingressRate": 8000}))).readme(DEL_VALIDATES, Want::Silent)),
        // Issue 26: a `null` for one of the four keys makes Go allocate the embedded entry,
        // which then wins over runtimeConfig (all zero: no shaping).
        Case::new("config: a null key selects the top-level set")
            .step(Step::add(conf(json!({"ingressRate": null, "runtimeConfig": {"bandwidth": limits()}}))).snap()),
        Case::new("config: a rate below 8 bit/s").step(Step::add(conf(json!({"ingressRate": 4, "ingressBurst": 8}))).readme(
            WRAPS,
            Want::Check(Box::new(|out, _| {
                ensure!(out.error().map(|e| e.code) == Some(7), "want a code 7 error");
                Ok(())
            })),
        )),
        Case::new("prevResult: missing with limits").step(Step::add(without(conf(limits()), "prevResult"))),
        Case::new("prevResult: of the 1.x family in a 0.4.0 config").step(Step::add({
            let mut c = conf(limits());
            c["cniVersion"] = json!("0.4.0");
            c
        })),
        Case::new("prevResult: missing on CHECK").step(Step::check(without(conf(limits()), "prevResult"))),
        Case::new("prevResult: missing without limits").step(Step::add(without(conf(json!({})), "prevResult")).readme(
            PANIC,
            Want::Check(Box::new(|out, _| {
                ensure!(out.error().map(|e| e.code) == Some(7), "want a code 7 error");
                Ok(())
            })),
        )),
        Case::new("prevResult: without interfaces").step(
            Step::add(conf(json!({
                "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.95.0.2/24"}]},
                "ingressRate": 8000, "ingressBurst": 8000
            })))
            .readme(PEER_LISTED, ok_with_tbf("tc vethbw0")),
        ),
        Case::new("prevResult: the host veth not listed").step(
            Step::add(conf(json!({
                "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "@NETNS@"}]},
                "ingressRate": 8000, "ingressBurst": 8000
            })))
            .readme(PEER_LISTED, ok_with_tbf("tc vethbw0")),
        ),
        Case::new("link: CNI_IFNAME missing in the container")
            .step(Step::add(conf(limits())).env("CNI_IFNAME", "eth9")),
        Case::new("link: not a veth")
            .setup(|s: &BandwidthStage| {
                s.ns.container.ip(&["link", "add", "br0", "type", "bridge"])?;
                s.ns.container.ip(&["link", "set", "br0", "up"])?;
                Ok(())
            })
            .step(Step::add(conf(json!({"ingressRate": 8000, "ingressBurst": 8000}))).env("CNI_IFNAME", "br0").readme(
                ONLY_VETH,
                Want::Check(Box::new(|out, _| {
                    ensure!(out.success(), "ADD failed");
                    Ok(())
                })),
            )),
        Case::new("no limits: prevResult passed through, nothing made")
            .step(Step::add(conf(json!({}))).snap())
            .step(Step::check(conf(json!({}))).head(HEAD_CHECK_NOTHING, Want::Silent))
            .step(Step::del(conf(json!({}))).snap()),
    ]);

    // Every version both advertise (bandwidth starts at 0.3.0), and 1.1.0.
    cases.push(
        Case::new("cniVersion 0.2.0 is not supported")
            .step(Step::add(conf(json!({"cniVersion": "0.2.0"})))),
    );
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0"] {
        cases.push(lifecycle(
            &format!("lifecycle in {version}"),
            &conf_at(version, limits())?,
        ));
    }
    let c110 = conf(json!({"cniVersion": "1.1.0"}));
    let c110 = {
        let mut c = c110;
        for (k, v) in limits().as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    };
    cases.push(with_ifb_rows(
        Case::new("lifecycle in 1.1.0")
            .step(Step::add(c110.clone()).go_at("1.0.0", HEAD_110).snap())
            .step(Step::check(c110.clone()).go_at("1.0.0", HEAD_110))
            .step(Step::del(c110).go_at("1.0.0", HEAD_110).snap_except(
                &format!("tc {HOST_IF}"),
                "",
                DEL_KEEPS_QDISCS,
            )),
    ));

    cases.extend([
        lifecycle("ingress only", &conf(json!({"ingressRate": 8_000_000, "ingressBurst": 80_000}))),
        lifecycle("egress only", &conf(json!({"egressRate": 16_000_000, "egressBurst": 160_000}))),
        lifecycle("runtimeConfig only", &conf(json!({"runtimeConfig": {"bandwidth": limits()}}))),
        lifecycle("capitalised keys", &conf(json!({"IngressRate": 8_000_000, "IngressBurst": 80_000, "EgressRate": 1_000_000, "EgressBurst": 10_000}))),
        lifecycle("runtimeConfig under Go-cased keys", &conf(json!({"RuntimeConfig": {"bandWidth": limits()}}))),
        lifecycle("rates above 2^32 bytes/s", &conf(json!({"ingressRate": 40_000_000_000_u64, "ingressBurst": 400_000_000, "egressRate": 40_000_000_000_u64, "egressBurst": 400_000_000}))),
        lifecycle("low rates", &conf(json!({"ingressRate": 8000, "ingressBurst": 80, "egressRate": 16, "egressBurst": 8}))),
        lifecycle("a host veth with MTU 9000", &conf(limits())).setup(|s: &BandwidthStage| {
            s.ns.host.ip(&["link", "set", HOST_IF, "mtu", "9000"])?;
            s.ns.container.ip(&["link", "set", "eth0", "mtu", "9000"])?;
            Ok(())
        }),
        Case::new("a sentinel burst").step(
            // containerd's sentinel, MaxUint32 bits.
            Step::add(conf(json!({"ingressRate": 10_000_000, "ingressBurst": 4_294_967_295_u64}))).readme(SENTINEL, ok_with_tbf("tc vethbw0")),
        ),
        with_ifb_rows(Case::new("re-ADD")
            .step(Step::add(conf(limits())))
            .step(Step::add(conf(limits())).readme(REPEATED_ADD, Want::Check(Box::new(|out, _| {
                ensure!(out.success(), "the second ADD failed");
                Ok(())
            }))))
            .step(Step::del(conf(limits())).snap_except(&format!("tc {HOST_IF}"), "", DEL_KEEPS_QDISCS))),
        Case::new("CHECK after drift: the ingress rate changed")
            .step(Step::add(conf(limits())))
            .mutate("change the host veth's tbf", |s: &BandwidthStage| {
                s.ns.host.exec_ok("tc", &["qdisc", "change", "dev", HOST_IF, "root", "handle", "1:", "tbf", "rate", "2mbit", "burst", "10000", "latency", "25ms"])?;
                Ok(())
            })
            .step(Step::check(conf(limits()))),
        Case::new("CHECK after drift: the IFB deleted")
            .step(Step::add(conf(limits())))
            .mutate("delete the IFB", |s: &BandwidthStage| {
                for name in s.ns.host.link_names()? {
                    if name.starts_with("bwp") {
                        s.ns.host.ip(&["link", "del", &name])?;
                    }
                }
                Ok(())
            })
            .step(Step::check(conf(limits()))),
        with_ifb_rows(Case::new("DEL twice")
            .step(Step::add(conf(limits())))
            .step(Step::del(conf(limits())))
            .step(Step::del(conf(limits())).snap_except(&format!("tc {HOST_IF}"), "", DEL_KEEPS_QDISCS))),
        with_ifb_rows(Case::new("DEL without prevResult or netns")
            .step(Step::add(conf(limits())))
            .step(Step::del(without(conf(limits()), "prevResult")).unset("CNI_NETNS").snap_except(&format!("tc {HOST_IF}"), "", DEL_KEEPS_QDISCS))),
        with_ifb_rows(Case::new("upgrade: Go's ADD, DEL by ours")
            .step(Step::add(conf(limits())).by(By::Go))
            .step(Step::del(conf(limits())).snap_except(&format!("tc {HOST_IF}"), "", DEL_KEEPS_QDISCS))),
        Case::new("upgrade: Go's ADD, CHECK by ours")
            .step(Step::add(conf(limits())).by(By::Go))
            .step(Step::check(conf(limits()))),
        with_ifb_rows(Case::new("downgrade: our ADD, DEL by Go")
            .step(Step::add(conf(limits())))
            .step(Step::del(conf(limits())).by(By::Go).snap())),
        Case::new("downgrade: our ADD, CHECK by Go")
            .step(Step::add(conf(limits())))
            .step(Step::check(conf(limits())).by(By::Go)),
        Case::new("two interfaces of one container")
            .setup(|s: &BandwidthStage| {
                tests::veth_pair(&s.ns.host, "vethbw1", &[], &s.ns.container, "eth1", &[])?;
                Ok(())
            })
            .step(Step::add(conf(limits())))
            .step(
                Step::add(conf(json!({
                    "egressRate": 16_000_000, "egressBurst": 160_000,
                    "prevResult": {
                        "cniVersion": "1.0.0",
                        "interfaces": [{"name": "vethbw1"}, {"name": "eth1", "sandbox": "@NETNS@"}]
                    }
                })))
                .env("CNI_IFNAME", "eth1")
                .readme(COLLIDE, Want::Check(Box::new(|out, _| {
                    ensure!(out.success(), "the second interface's ADD failed");
                    Ok(())
                }))),
            ),
    ]);
    Ok(cases)
}

#[test]
fn bandwidth_answers_and_shaping_match_the_go_plugin() -> Result<()> {
    suite().run(cases()?)
}

/// Debian's 1.1.1 configuration struct of the plugin, as Go declares it.
const BANDWIDTH_SCHEMA: generated::Schema = generated::Schema {
    fields: &[
        Field {
            key: "ingressRate",
            go: Go::Uint(0, 100_000_000),
        },
        Field {
            key: "ingressBurst",
            go: Go::Uint(0, 1_000_000),
        },
        Field {
            key: "egressRate",
            go: Go::Uint(0, 100_000_000),
        },
        Field {
            key: "egressBurst",
            go: Go::Uint(0, 1_000_000),
        },
        Field {
            key: "runtimeConfig",
            go: Go::Struct(&[Field {
                key: "bandwidth",
                go: Go::Ptr(&Go::Struct(&[
                    Field {
                        key: "ingressRate",
                        go: Go::Uint(0, 100_000_000),
                    },
                    Field {
                        key: "ingressBurst",
                        go: Go::Uint(0, 1_000_000),
                    },
                    Field {
                        key: "egressRate",
                        go: Go::Uint(0, 100_000_000),
                    },
                    Field {
                        key: "egressBurst",
                        go: Go::Uint(0, 1_000_000),
                    },
                ])),
            }]),
        },
    ],
};

/// Issue 26 item 4: generated configurations decode as Go decodes them (see
/// `tests::generated`).
#[test]
fn generated_configurations_are_decoded_and_applied_as_go_does() -> Result<()> {
    let plan = generated::Plan {
        plugin: "bandwidth",
        schema: BANDWIDTH_SCHEMA,
        base: |version| generated::base_in(&conf(json!({})), version),
        env: generated::decode_env(ID, "eth0"),
        known: vec![
            generated::Known {
                why: Why::Readme(NETNS_MSG),
                applies: |_, go, ours| {
                    generated::msg(go)
                        .strip_prefix("failed to open netns %!q(<nil>): ")
                        .is_some_and(|rest| rest == generated::msg(ours))
                },
            },
            generated::Known {
                why: Why::Readme(PANIC),
                applies: |_, go, ours| generated::go_crashed(go) && !ours.success(),
            },
        ],
        decoded: generated::past_decoding,
        // A prevResult that does not list the host veth is the README's (`no interfaces
        // provided`, `no veth peer of container interface found in host ns`).
        kernel_fits: |stdin| {
            serde_json::from_str::<serde_json::Value>(stdin).is_ok_and(|conf| {
                generated::go_key(&conf, "prevResult")
                    .and_then(|prev| generated::go_key(prev, "interfaces"))
                    .and_then(serde_json::Value::as_array)
                    .is_some_and(|interfaces| {
                        // The host veth listed (else README: ONLY_VETH's neighbour row).
                        interfaces
                            .iter()
                            .any(|i| generated::go_key(i, "name") == Some(&json!("vethbw0")))
                    })
            })
        },
        count: 450,
        kernel: 8,
    };
    generated::run(&plan, &suite(), |name, stdin| {
        with_ifb_rows(generated::add_then_del(name, stdin, |del| {
            del.snap_except(&format!("tc {HOST_IF}"), "", DEL_KEEPS_QDISCS)
        }))
    })
}
