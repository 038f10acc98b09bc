//! `portmap` against Debian's Go `portmap` (1.1.1): the same calls, the same answers, the same
//! kernel objects (see `tests::differential` for what is compared and how).
//!
//! Each side is a host namespace (where the plugin runs) and a container namespace joined by a
//! veth `vethpm0` (10.96.0.1/24, fd96::1/64) ↔ `eth0` (10.96.0.2/24, fd96::2/64), so the
//! `route_localnet` lookup finds a route. The kernel objects compared are the host's
//! `iptables-save`/`ip6tables-save` of `nat` and `filter`, `nft list ruleset` and the
//! `route_localnet` sysctls. The prevResult is written here (dual-stack unless a case says
//! otherwise) and converted to each version by `cni::types`.
//!
//! Where Debian's 1.1.1 is not the reference: it has no `backend` key (it ignores it and always
//! uses iptables, HEAD's default), no nftables backend, no `masqAll`, no `1.1.0`; its CHECK fails
//! even right after its own ADD (a bug the README lists), so CHECKs after an ADD are checked
//! against HEAD's success.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use anyhow::{Result, ensure};
use serde_json::{Value, json};
use tests::Runtime;
use tests::differential::{
    self, By, Case, Impl, Namespaces, Stage, Step, Suite, Want, Why, config, in_version,
    result_in_version, skel_cases, with_keys, without,
};
use tests::generated::{self, Field, Go};
use tests::snapshot::{self, Snapshot};

const NETWORK: &str = "pmdiff";
const ID: &str = "0123456789abcdef0123456789abcdef";
const HOST_IF: &str = "vethpm0";

/// README row: Debian's Go CHECK fails even after its own ADD.
const GO_CHECK_BUG: &str = "CHECK (1.1.1, a Go bug)";
/// README row: ports, protocols and host IPs are validated.
const VALIDATED: &str = "ports > 65535, protocol, hostIP not validated; protocol passed verbatim";
/// README row: host-port conflicts are refused.
const CONFLICTS: &str = "host-port conflicts: last writer wins silently";
/// README row: DEL reads only what it needs of the config.
const DEL_LENIENT: &str = "DEL validates the whole config like ADD";
/// README row: a re-ADD with other mappings replaces the old ones (iptables layout).
const READD: &str = "re-ADD with other mappings (iptables): the chain keeps the old rules";
/// README row: DEL without mappings.
const DEL_WITHOUT_MAPPINGS: &str = "DEL with no `runtimeConfig.portMappings` does nothing";
/// README row: the messages of the work itself (the tools' errors).
const WORK_MESSAGES: &str = "messages of the work itself";
/// README row: the nftables layout.
const NFT_LAYOUT: &str = "table `cni_portmap` with maps";
/// README row: a failed ADD leaves what it made so far.
const FAILED_ADD: &str = "a failed ADD leaves what it made so far";
/// README row: an empty iptables condition.
const EMPTY_CONDITION: &str = "an empty entry in an iptables `conditionsV4`/`conditionsV6`";

/// What 1.1.1 lacks and HEAD has.
const HEAD_110: &str = "reference-behaviour.md §1.1/§1.7: HEAD takes 1.1.0, whose result is 1.0.0's with another cniVersion";
const HEAD_BACKEND: &str = "reference-behaviour.md §2.1: HEAD validates `backend` and the options of each backend; 1.1.1 has no `backend` key";
const HEAD_MASQ_ALL: &str = "reference-behaviour.md §2.1 (iptables step 3): masqAll (v1.2.0) marks every source (`-s 0.0.0.0/0`, which iptables-save omits) and adds no localhost rule; 1.1.1 ignores it";
const HEAD_PREV_FAMILY: &str = "reference-behaviour.md §1.7: HEAD's 1.x result type supports [1.0.0 1.1.0]; 1.1.1's only [1.0.0]";

struct PortmapStage {
    ns: Namespaces,
}

impl Stage for PortmapStage {
    fn runtime(&self) -> &Runtime {
        &self.ns.runtime
    }

    fn vars(&self) -> Vec<(String, String)> {
        self.ns.vars()
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let host = &self.ns.host;
        let mut snap = Snapshot::new();
        for (name, lines) in snapshot::netfilter_sections(host, &["nat", "filter"])? {
            snap.insert(name, lines);
        }
        let mut sysctls = Vec::new();
        for link in ["all", "default", HOST_IF] {
            let key = format!("net.ipv4.conf.{link}.route_localnet");
            sysctls.push(format!("{key} = {}", host.sysctl(&key)?));
        }
        snap.insert("sysctl", sysctls);
        Ok(snap)
    }
}

fn build(_: Impl) -> Result<PortmapStage> {
    Ok(PortmapStage {
        ns: Namespaces::new(
            "dpm",
            HOST_IF,
            &["10.96.0.1/24", "fd96::1/64"],
            "eth0",
            &["10.96.0.2/24", "fd96::2/64"],
        )?,
    })
}

fn suite() -> Suite<PortmapStage> {
    Suite::new("portmap", build).cni_env(ID, "eth0")
}

/// The main plugin's result in 1.0.0: the host veth, the container's `eth0` and one address of
/// each family on it.
fn prev_dual() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": HOST_IF, "mac": "02:00:00:00:00:01"},
            {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "@NETNS@"}
        ],
        "ips": [
            {"interface": 1, "address": "10.96.0.2/24", "gateway": "10.96.0.1"},
            {"interface": 1, "address": "fd96::2/64", "gateway": "fd96::1"}
        ],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.96.0.1"}, {"dst": "::/0"}],
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.local"]}
    })
}

/// [`prev_dual`] with the addresses of one family only.
fn prev_only(v6: bool) -> Value {
    let mut prev = prev_dual();
    if let Some(ips) = prev["ips"].as_array_mut() {
        ips.retain(|ip| {
            ip["address"]
                .as_str()
                .is_some_and(|a| a.contains(':') == v6)
        });
    }
    prev
}

fn mappings() -> Value {
    json!([
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 8443, "containerPort": 443, "protocol": "tcp", "hostIP": "10.98.0.1"},
        {"hostPort": 5353, "containerPort": 53, "protocol": "udp"},
        {"hostPort": 9000, "containerPort": 9000, "protocol": "tcp", "hostIP": "fd98::1"}
    ])
}

/// A 1.0.0 config with [`mappings`] and [`prev_dual`], and `keys` set on top.
fn conf(keys: Value) -> Value {
    let base = config(
        "portmap",
        NETWORK,
        prev_dual(),
        json!({"runtimeConfig": {"portMappings": mappings()}}),
    );
    with_keys(base, &keys)
}

/// [`conf`] with `portMappings` set to `m`.
fn mapped(m: Value, keys: Value) -> Value {
    let mut c = conf(keys);
    c["runtimeConfig"] = json!({"portMappings": m});
    c
}

/// [`conf`] in `version`, its prevResult converted.
fn conf_at(version: &str, keys: Value) -> Result<Value> {
    in_version(&conf(keys), version)
}

/// ADD (kernel compared), CHECK (from 0.4.0; HEAD's success, see [`GO_CHECK_BUG`]), DEL
/// (kernel compared).
fn lifecycle(name: &str, conf: Value) -> Case<PortmapStage> {
    differential::lifecycle(
        name,
        &conf,
        |check| check.readme(GO_CHECK_BUG, Want::Silent),
        |del| del,
    )
}

/// Fails unless the IPv4 `nat` table holds `line`.
fn nat4_has(snap: &Snapshot, pred: impl Fn(&str) -> bool, what: &str) -> Result<()> {
    let nat = snap.section("iptables nat");
    ensure!(
        nat.iter().any(|l| pred(l)),
        "no {what} in iptables nat:\n{}",
        nat.join("\n")
    );
    Ok(())
}

/// The per-attachment DNAT chain in `ns`'s IPv4 `nat` table, if there is one.
fn dnat_chain(ns: &tests::TestNetns) -> Result<Option<String>> {
    Ok(
        snapshot::iptables_save_args(ns, "iptables-save", &["-t", "nat"])?
            .iter()
            .find_map(|l| {
                l.strip_prefix(":CNI-DN-")
                    .map(|rest| format!("CNI-DN-{}", rest.split(' ').next().unwrap_or_default()))
            }),
    )
}

#[allow(clippy::too_many_lines)]
fn cases() -> Result<Vec<Case<PortmapStage>>> {
    let v4 = |keys: Value| {
        let mut c = conf(keys);
        c["prevResult"] = prev_only(false);
        c
    };
    let mut cases = skel_cases(
        &conf(json!({})),
        &[
            "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
        ],
    );

    // The validation table of reference-behaviour.md §2.1 (parsing: ADD, CHECK and DEL alike).
    cases.extend([
        Case::new("config: snat of the wrong JSON type").step(Step::add(conf(json!({"snat": "yes"})))),
        // Issue 26 item 4: Go's decoder in its corners. (a) A later `null` resets a pointer:
        // snat is nil, so true.
        Case::new("config: a later null resets snat").step(
            Step::raw(
                Some("ADD"),
                &conf(json!({"snat": false}))
                    .to_string()
                    .replacen("\"snat\":false", r#""snat":false,"SNAT":null"#, 1),
            )
            .snap(),
        ),
        // (c) A `null` element of a slice of structs is the zero struct.
        Case::new("config: a null port mapping is the zero mapping")
            .step(Step::add(mapped(json!([null]), json!({})))),
        // (d) A number no float64 holds, anywhere in prevResult.
        Case::new("prevResult: a number beyond float64").step(Step::raw(
            Some("ADD"),
            &conf(json!({}))
                .to_string()
                .replacen("\"prevResult\":{", r#""prevResult":{"x-extra":[1e400],"#, 1),
        )),
        // CHECK returns the decode error without ADD's and DEL's `failed to parse config:`.
        Case::new("config: a JSON type error on CHECK").step(Step::check(conf(json!({"snat": "yes"})))),
        Case::new("config: a JSON type error fails DEL too")
            .step(Step::del(conf(json!({"snat": "yes"}))).readme(DEL_LENIENT, Want::Silent)),
        Case::new("config: markMasqBit and externalSetMarkChain")
            .step(Step::add(conf(json!({"markMasqBit": 5, "externalSetMarkChain": "KUBE-MARK-MASQ"})))),
        Case::new("config: markMasqBit 13 and externalSetMarkChain")
            .step(Step::check(conf(json!({"markMasqBit": 13, "externalSetMarkChain": "KUBE-MARK-MASQ"})))),
        Case::new("config: markMasqBit 32").step(Step::add(conf(json!({"markMasqBit": 32})))),
        Case::new("config: markMasqBit -1").step(Step::add(conf(json!({"markMasqBit": -1})))),
        Case::new("config: markMasqBit out of range fails DEL too")
            .step(Step::del(conf(json!({"markMasqBit": 40}))).readme(DEL_LENIENT, Want::Silent)),
        Case::new("config: containerPort 0").step(Step::add(mapped(
            json!([{"hostPort": 8080, "containerPort": 0, "protocol": "tcp"}]),
            json!({}),
        ))),
        Case::new("config: hostPort 0").step(Step::add(mapped(
            json!([{"hostPort": 0, "containerPort": 80, "protocol": "tcp"}]),
            json!({}),
        ))),
        Case::new("config: containerPort is checked before hostPort").step(Step::add(mapped(
            json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}, {"hostPort": -1, "containerPort": -2, "protocol": "tcp"}]),
            json!({}),
        ))),
        Case::new("config: a bad port fails DEL too").step(
            Step::del(mapped(
                json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}, {"hostPort": -1, "containerPort": -2, "protocol": "tcp"}]),
                json!({}),
            ))
            .readme(DEL_LENIENT, Want::Silent),
        ),
        Case::new("config: iptables backend with nftables conditions").step(
            Step::add(conf(json!({"backend": "iptables", "conditionsV4": ["ip", "saddr", "192.0.2.0/24"]}))).head(
                HEAD_BACKEND,
                Want::Error {
                    code: None,
                    msg: "failed to parse config: iptables backend was requested but configuration contains nftables-specific options [conditionsV4]".into(),
                },
            ),
        ),
        // iptables reads `--dport` after `-m multiport` as `--dports`, given twice: Go's ADD
        // fails, and so must ours (written by iptables-restore, which refuses it likewise).
        Case::new("a condition the tools refuse: --dport after -m multiport").step(
            Step::add(conf(json!({"conditionsV4": ["--dport", "8080"]}))).msg_per_readme(WORK_MESSAGES),
        ),
        Case::new("config: nftables backend with iptables options").step(
            Step::add(conf(json!({"backend": "nftables", "externalSetMarkChain": "KUBE-MARK-MASQ", "conditionsV6": ["-s", "2001:db8::/64"]}))).head(
                HEAD_BACKEND,
                Want::Error {
                    code: None,
                    msg: "failed to parse config: nftables backend was requested but configuration contains iptables-specific options [externalSetMarkChain conditionsV6]".into(),
                },
            ),
        ),
        Case::new("config: unknown backend").step(Step::add(conf(json!({"backend": "pf"}))).head(
            HEAD_BACKEND,
            Want::Error { code: None, msg: "failed to parse config: unrecognized backend \"pf\"".into() },
        )),
        Case::new("prevResult: missing on ADD").step(Step::add(without(conf(json!({})), "prevResult"))),
        Case::new("prevResult: missing on ADD without mappings")
            .step(Step::add(without(conf(json!({"runtimeConfig": {}})), "prevResult"))),
        Case::new("prevResult: missing on CHECK").step(Step::check(without(conf(json!({})), "prevResult"))),
        Case::new("prevResult: of the 0.x family in a 1.0.0 config").step(
            Step::add(conf(json!({"prevResult": result_in_version(&prev_dual(), "0.4.0")?}))).head(
                HEAD_PREV_FAMILY,
                Want::Error {
                    code: None,
                    msg: "failed to parse config: could not parse prevResult: could not parse prevResult: result type supports [1.0.0 1.1.0] but unmarshalled CNIVersion is \"0.4.0\"".into(),
                },
            ),
        ),
        Case::new("prevResult: of the 1.x family in a 0.4.0 config").step(Step::add({
            let mut c = conf_at("0.4.0", json!({}))?;
            c["prevResult"] = prev_dual();
            c
        })),
        Case::new("prevResult: an unparsable address").step(Step::add(conf(json!({"prevResult": {
            "cniVersion": "1.0.0", "ips": [{"address": "10.96.0.300/24"}]
        }})))),
    ]);

    // ADD, CHECK and DEL in every version both advertise, and in 1.1.0.
    for version in tests::differential::SHARED_VERSIONS {
        cases.push(lifecycle(
            &format!("lifecycle in {version}"),
            conf_at(version, json!({}))?,
        ));
    }
    let c110 = conf(json!({"cniVersion": "1.1.0"}));
    cases.push(
        Case::new("lifecycle in 1.1.0")
            .step(Step::add(c110.clone()).go_at("1.0.0", HEAD_110).snap())
            .step(Step::check(c110.clone()).readme(GO_CHECK_BUG, Want::Silent))
            .step(Step::del(c110).go_at("1.0.0", HEAD_110).snap()),
    );

    // Options, each through ADD, CHECK and DEL.
    cases.extend([
        lifecycle("snat false", conf(json!({"snat": false}))),
        lifecycle("markMasqBit 5", conf(json!({"markMasqBit": 5}))),
        lifecycle("externalSetMarkChain", conf(json!({"externalSetMarkChain": "KUBE-MARK-MASQ"}))).setup(|s: &PortmapStage| {
            for tool in ["iptables", "ip6tables"] {
                s.ns.host.exec_ok(tool, &["-t", "nat", "-N", "KUBE-MARK-MASQ"])?;
            }
            Ok(())
        }),
        lifecycle("conditions of both families", conf(json!({
            "conditionsV4": ["-s", "192.0.2.0/24"],
            "conditionsV6": ["-s", "2001:db8::/64", "-i", "uplink0"]
        }))),
        lifecycle("a negated condition", conf(json!({"conditionsV4": ["!", "-s", "192.0.2.0/24"]}))),
        lifecycle("IPv4-only container", v4(json!({}))),
        lifecycle("IPv6-only container", conf(json!({"prevResult": prev_only(true)}))),
        lifecycle("tcp, udp and sctp", mapped(json!([
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 8080, "containerPort": 80, "protocol": "udp"},
            {"hostPort": 3868, "containerPort": 3868, "protocol": "sctp"}
        ]), json!({}))),
        lifecycle("16 ports: two multiport entry rules", mapped(
            Value::Array((0..16).map(|i| json!({"hostPort": 7000 + i, "containerPort": 80 + i, "protocol": "tcp"})).collect()),
            json!({}),
        )),
        lifecycle("hostIP 0.0.0.0 and ::", mapped(json!([
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "0.0.0.0"},
            {"hostPort": 8081, "containerPort": 81, "protocol": "tcp", "hostIP": "::"}
        ]), json!({}))),
        lifecycle("hostIP of the other family only", mapped(
            json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "fd98::1"}]),
            json!({"prevResult": prev_only(false)}),
        )),
        lifecycle("the same mapping twice", mapped(json!([
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}
        ]), json!({}))),
        // README: "protocol in any case"; the Go plugin passes it to iptables, which takes it.
        lifecycle("protocol in upper case", mapped(
            json!([{"hostPort": 8080, "containerPort": 80, "protocol": "TCP"}]),
            json!({}),
        )),
        // containerd's capitalised keys; Go's JSON decoder matches keys in any case.
        lifecycle("capitalised keys", json!({
            "cniVersion": "1.0.0", "name": NETWORK, "type": "portmap", "SNAT": false, "MarkMasqBit": 7,
            "RuntimeConfig": {"PortMappings": [{"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}]},
            "prevResult": prev_dual()
        })),
        lifecycle("a prevResult address without interface index", conf(json!({"prevResult": {
            "cniVersion": "1.0.0", "ips": [{"address": "10.96.0.2/24"}]
        }}))),
        // README: `""` means auto (podman sends it). 1.1.1 has no `backend` key, and HEAD's auto
        // is iptables here, so Go's output is the reference.
        lifecycle("backend empty string", conf(json!({"backend": ""}))),
        lifecycle("backend null", conf(json!({"backend": null}))),
        lifecycle("backend iptables", conf(json!({"backend": "iptables"}))),
    ]);
    let long_id = "c".repeat(230);
    cases.extend([
        // The entry rule's comment is cut at 255 characters.
        Case::new("a container ID of 230 characters")
            .step(
                Step::add(conf(json!({})))
                    .env("CNI_CONTAINERID", &long_id)
                    .snap(),
            )
            .step(
                Step::del(conf(json!({})))
                    .env("CNI_CONTAINERID", &long_id)
                    .snap(),
            ),
        Case::new("masqAll").step(Step::add(conf(json!({"masqAll": true}))).head(
            HEAD_MASQ_ALL,
            Want::Check(Box::new(|out, snap| {
                ensure!(out.success(), "ADD failed");
                nat4_has(
                    snap,
                    |l| {
                        l.starts_with("-A CNI-DN-")
                            && l.ends_with("-p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK")
                    },
                    "hairpin mark for every source",
                )?;
                ensure!(
                    !snap
                        .section("iptables nat")
                        .iter()
                        .any(|l| l.contains("127.0.0.1")),
                    "a localhost rule with masqAll"
                );
                Ok(())
            })),
        )),
        Case::new("backend nftables").step(Step::add(conf(json!({"backend": "nftables"}))).readme(
            NFT_LAYOUT,
            Want::Check(Box::new(|out, snap| {
                ensure!(out.success(), "ADD failed");
                ensure!(
                    !snap
                        .section("iptables nat")
                        .iter()
                        .any(|l| l.contains("CNI-")),
                    "the nftables backend made iptables rules"
                );
                ensure!(
                    snap.section("nft").iter().any(|l| l.contains("\"table\"")),
                    "no nftables table"
                );
                Ok(())
            })),
        )),
        Case::new("no mappings: prevResult passed through, nothing made")
            .step(Step::add(conf(json!({"runtimeConfig": {}}))).snap())
            .step(Step::check(conf(json!({"runtimeConfig": {}}))))
            .step(Step::del(conf(json!({"runtimeConfig": {}}))).snap()),
        Case::new("re-ADD of the same config")
            .step(Step::add(conf(json!({}))))
            .step(Step::add(conf(json!({}))).snap())
            .step(Step::del(conf(json!({}))).snap()),
        Case::new("re-ADD with other mappings")
            .step(Step::add(conf(json!({}))))
            .step(
                Step::add(mapped(
                    json!([{"hostPort": 8088, "containerPort": 88, "protocol": "tcp"}]),
                    json!({}),
                ))
                .readme(
                    READD,
                    Want::Check(Box::new(|out, snap| {
                        ensure!(out.success(), "the re-ADD failed");
                        nat4_has(
                            snap,
                            |l| l.contains("--dport 8088 -j DNAT"),
                            "the new mapping",
                        )?;
                        let old = snap
                            .section("iptables nat")
                            .iter()
                            .chain(snap.section("ip6tables nat"))
                            .any(|l| l.contains("8080") || l.contains("5353"));
                        ensure!(!old, "the old mappings are still there");
                        Ok(())
                    })),
                ),
            )
            .step(
                Step::del(mapped(
                    json!([{"hostPort": 8088, "containerPort": 88, "protocol": "tcp"}]),
                    json!({}),
                ))
                .snap(),
            ),
        Case::new("DEL twice")
            .step(Step::add(conf(json!({}))))
            .step(Step::del(conf(json!({}))))
            .step(Step::del(conf(json!({}))).snap()),
        Case::new("DEL without prevResult")
            .step(Step::add(conf(json!({}))))
            .step(Step::del(without(conf(json!({})), "prevResult")).snap()),
        Case::new("DEL without mappings")
            .step(Step::add(conf(json!({}))))
            .step(Step::del(conf(json!({"runtimeConfig": {}}))).readme(
                DEL_WITHOUT_MAPPINGS,
                Want::Check(Box::new(|out, snap| {
                    ensure!(out.success() && out.stdout.is_empty(), "DEL failed");
                    ensure!(
                        !snap
                            .section("iptables nat")
                            .iter()
                            .any(|l| l.contains("CNI-DN-")),
                        "the attachment's rules are still there"
                    );
                    Ok(())
                })),
            ))
            .step(Step::del(conf(json!({}))).snap()),
        Case::new("upgrade: Go's ADD, DEL by ours")
            .step(Step::add(conf(json!({}))).by(By::Go))
            .step(Step::del(conf(json!({}))).snap()),
        Case::new("upgrade: Go's ADD, CHECK by ours")
            .step(Step::add(conf(json!({}))).by(By::Go))
            .step(Step::check(conf(json!({}))).readme(GO_CHECK_BUG, Want::Silent)),
        Case::new("downgrade: our ADD, DEL by Go")
            .step(Step::add(conf(json!({}))))
            .step(Step::del(conf(json!({}))).by(By::Go).snap()),
        // Go's CHECK fails after its own ADD (the README's bug row); after ours it must fail the
        // same way, which it does only if the layout is the same.
        Case::new("downgrade: our ADD, CHECK by Go")
            .step(Step::add(v4(json!({}))))
            .step(Step::check(v4(json!({}))).by(By::Go)),
        Case::new("CHECK after drift: the DNAT chain flushed")
            .step(Step::add(v4(json!({}))))
            .mutate("flush the container's DNAT chain", |s: &PortmapStage| {
                if let Some(chain) = dnat_chain(&s.ns.host)? {
                    s.ns.host
                        .exec_ok("iptables", &["-t", "nat", "-F", &chain])?;
                }
                Ok(())
            })
            .step(Step::check(v4(json!({}))))
            .step(Step::del(v4(json!({}))).snap()),
        Case::new("two containers: DEL of one keeps the other's rules")
            .step(Step::add(conf(json!({}))))
            .step(
                Step::add(mapped(
                    json!([{"hostPort": 8181, "containerPort": 80, "protocol": "tcp"}]),
                    json!({"prevResult": {
                        "cniVersion": "1.0.0",
                        "interfaces": [{"name": "eth0", "sandbox": "@NETNS@"}],
                        "ips": [{"interface": 0, "address": "10.96.0.3/24"}]
                    }}),
                ))
                .env("CNI_CONTAINERID", "second")
                .snap(),
            )
            .step(Step::del(conf(json!({}))).snap()),
        Case::new("two containers on one host port")
            .step(Step::add(conf(json!({}))))
            .step(
                Step::add(conf(json!({"prevResult": {
                    "cniVersion": "1.0.0",
                    "interfaces": [{"name": "eth0", "sandbox": "@NETNS@"}],
                    "ips": [{"interface": 0, "address": "10.96.0.3/24"}]
                }})))
                .env("CNI_CONTAINERID", "second")
                .readme(
                    CONFLICTS,
                    Want::Check(Box::new(|out, _| {
                        ensure!(!out.success(), "the second ADD took the first one's port");
                        Ok(())
                    })),
                ),
            ),
        Case::new("a port above 65535").step(
            Step::add(mapped(
                json!([{"hostPort": 70000, "containerPort": 80, "protocol": "tcp"}]),
                json!({}),
            ))
            .msg_per_readme(VALIDATED),
        ),
        Case::new("a prevResult address of another interface")
            .step(Step::add(conf(json!({}))).env("CNI_IFNAME", "eth1").snap())
            .step(Step::del(conf(json!({}))).env("CNI_IFNAME", "eth1").snap()),
    ]);
    Ok(cases)
}

#[test]
fn portmap_answers_and_kernel_objects_match_the_go_plugin() -> Result<()> {
    suite().run(cases()?)
}

/// Debian's 1.1.1 configuration struct of the plugin, as Go declares it.
const PORTMAP_SCHEMA: generated::Schema = generated::Schema {
    fields: &[
        Field {
            key: "snat",
            go: Go::Ptr(&Go::Bool),
        },
        Field {
            key: "conditionsV4",
            go: Go::Ptr(&Go::Slice(&Go::Str(&["-s", "10.0.0.0/8"]))),
        },
        Field {
            key: "markMasqBit",
            go: Go::Ptr(&Go::Int(0, 31)),
        },
        Field {
            key: "externalSetMarkChain",
            go: Go::Ptr(&Go::Str(&["KUBE-MARK-MASQ"])),
        },
        Field {
            key: "runtimeConfig",
            go: Go::Struct(&[Field {
                key: "portMappings",
                go: Go::Slice(&Go::Struct(&[
                    Field {
                        key: "hostPort",
                        go: Go::Int(1, 65535),
                    },
                    Field {
                        key: "containerPort",
                        go: Go::Int(1, 65535),
                    },
                    Field {
                        key: "protocol",
                        go: Go::Str(&["tcp", "udp", "TCP"]),
                    },
                    Field {
                        key: "hostIP",
                        go: Go::Str(&["", "10.96.0.1", "fd96::1"]),
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
        plugin: "portmap",
        schema: PORTMAP_SCHEMA,
        base: |version| generated::base_in(&conf(json!({})), version),
        env: generated::decode_env(ID, "gen0"),
        known: vec![
            generated::Known {
                why: Why::Readme(VALIDATED),
                applies: |_, go, ours| {
                    // Go takes the value, or leaves it to iptables to refuse.
                    (go.success() || generated::msg(go).starts_with("unable to setup DNAT: "))
                        && ours.error().is_some_and(|e| e.code == 7)
                },
            },
            generated::Known {
                // The decode tier's ADDs of a worker share its namespace, without DELs.
                why: Why::Readme(CONFLICTS),
                applies: |_, go, ours| {
                    (go.success() || generated::msg(go).starts_with("unable to setup DNAT: "))
                        && generated::msg(ours).contains(" is already mapped by ")
                },
            },
            generated::Known {
                why: Why::Readme(FAILED_ADD),
                applies: |_, go, ours| {
                    generated::msg(go).contains("does not exist")
                        && generated::msg(ours).starts_with("unable to set up ")
                },
            },
            generated::Known {
                why: Why::Readme(EMPTY_CONDITION),
                applies: |_, go, ours| {
                    let g = generated::msg(go);
                    (go.success()
                        || g.contains("Bad argument `'")
                        || g == "must be called as chained plugin")
                        && generated::msg(ours).contains("empty iptables condition in ")
                },
            },
            generated::Known {
                why: Why::Readme(WORK_MESSAGES),
                applies: |_, go, ours| {
                    generated::msg(go).starts_with("unable to setup DNAT: running [")
                        && generated::msg(ours).starts_with("unable to set up ")
                },
            },
            generated::Known {
                why: Why::Head(HEAD_BACKEND),
                applies: |_, _, ours| {
                    let o = generated::msg(ours);
                    o.contains("nftables condition") || o.contains("iptables-specific")
                },
            },
        ],
        decoded: generated::past_decoding,
        // The stage has no chain for `externalSetMarkChain` to name, and iptables refuses
        // conditions the generator strings together at random: such an ADD fails, Go's
        // leaving what it made (the README's `FAILED_ADD` row). The kernel tier plays the
        // others.
        kernel_fits: |stdin| {
            let fits = |v: &serde_json::Value| {
                v.is_null() || v == &json!([]) || v == &json!(["-s", "10.0.0.0/8"])
            };
            serde_json::from_str::<serde_json::Value>(stdin).is_ok_and(|conf| {
                generated::go_values(&conf, "externalSetMarkChain")
                    .iter()
                    .all(|chain| chain.is_null())
                    && generated::go_values(&conf, "conditionsV4")
                        .iter()
                        .all(|c| fits(c))
            })
        },
        count: 400,
        kernel: 8,
    };
    generated::run(&plan, &suite(), |name, stdin| {
        generated::add_then_del(name, stdin, |del| del)
    })
}
