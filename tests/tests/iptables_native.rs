//! `netfilter::iptables::native` against Debian's Go `portmap` (1.1.1, its iptables layout): the
//! reference's layout for one attachment, written natively, is what the Go ADD writes (the
//! same `iptables-save` text, both families), the Go CHECK accepts it and the Go DEL removes
//! it; and what the Go ADD wrote is found, read back and removed natively. This is the
//! library level of portmap's cross-implementation tests (`portmap_reference.rs`): the rules
//! here are written by hand in `iptables-save`'s words, as portmap's iptables backend
//! computes them.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

#[cfg(test)]
#[allow(dead_code)] // each test binary uses a different part
use anyhow::{Context, Result, ensure};
use netfilter::iptables::Family;
use netfilter::iptables::native::{self, NativeTables, RuleSpec};
use serde_json::{Value, json};
use tests::iptables_layout::{DNAT, SETMARK, SHARED_CHAINS, skeleton, words};
use tests::{PluginOutput, Runtime, TestNetns, bins};

const NETWORK: &str = "nativenet";
const ID: &str = "0123456789abcdef0123456789abcdef";
/// The reference's per-attachment chain: `CNI-DN-` and SHA-512(name + id), 28 characters.
fn dnat_chain() -> Result<String> {
    let out = std::process::Command::new("sh")
        .args(["-c", &format!("printf '%s' '{NETWORK}{ID}' | sha512sum")])
        .output()?;
    let hex = String::from_utf8(out.stdout)?;
    Ok(format!(
        "CNI-DN-{}",
        hex.get(..21).context("sha512sum output")?
    ))
}

/// The mappings: on every address, on one IPv4 host address, on one IPv6 host address; TCP,
/// UDP and SCTP (an xtables match where TCP and UDP ports are native expressions).
fn mappings() -> Value {
    json!([
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 8443, "containerPort": 443, "protocol": "tcp", "hostIP": "10.98.0.1"},
        {"hostPort": 5353, "containerPort": 53, "protocol": "udp"},
        {"hostPort": 9000, "containerPort": 9000, "protocol": "sctp", "hostIP": "fd98::1"},
        {"hostPort": 3868, "containerPort": 3868, "protocol": "sctp"}
    ])
}

/// The attachment's chain rules (mapping order: hairpin mark, localhost mark for IPv4,
/// DNAT; host-address mappings of the other family left out) and its entry rules (per
/// protocol, the ports of every mapping, the other family's included, as the reference
/// does), in `iptables-save`'s words.
fn attachment(family: Family, chain: &str) -> (Vec<String>, Vec<String>) {
    let (cidr, host, v4) = match family {
        Family::V4 => ("10.96.0.0/24", "10.98.0.1/32", true),
        Family::V6 => ("fd96::/64", "fd98::1/128", false),
    };
    let to = |port: u16| match family {
        Family::V4 => format!("10.96.0.2:{port}"),
        Family::V6 => format!("[fd96::2]:{port}"),
    };
    let mut rules = Vec::new();
    let mut mapping = |dst: Option<&str>, proto: &str, port: u16, to_port: u16| {
        let d = dst.map(|d| format!("-d {d} ")).unwrap_or_default();
        let base = format!("{d}-p {proto} -m {proto} --dport {port}");
        rules.push(format!("-s {cidr} {base} -j {SETMARK}"));
        if v4 {
            rules.push(format!("-s 127.0.0.1/32 {base} -j {SETMARK}"));
        }
        rules.push(format!("{base} -j DNAT --to-destination {}", to(to_port)));
    };
    mapping(None, "tcp", 8080, 80);
    if v4 {
        mapping(Some(host), "tcp", 8443, 443);
    }
    mapping(None, "udp", 5353, 53);
    if !v4 {
        mapping(Some(host), "sctp", 9000, 9000);
    }
    mapping(None, "sctp", 3868, 3868);
    let comment = format!(r#""dnat name: \"{NETWORK}\" id: \"{ID}\"""#);
    let entries = [("sctp", "9000,3868"), ("tcp", "8080,8443"), ("udp", "5353")]
        .iter()
        .map(|(proto, ports)| {
            format!(
                "-p {proto} -m comment --comment {comment} -m multiport --dports {ports} -j {chain}"
            )
        })
        .collect();
    (rules, entries)
}

/// A host namespace with a route to the container addresses (the Go ADD looks up the host
/// interface for `route_localnet`; a veth pair stands in for the bridge), a container
/// namespace, and a runtime in the host namespace.
struct Host {
    ns: TestNetns,
    container: TestNetns,
    runtime: Runtime,
}

impl Host {
    fn new() -> Result<Host> {
        let ns = TestNetns::new("ntvhost")?;
        ns.ip(&[
            "link", "add", "ntv0", "type", "veth", "peer", "name", "ntv1",
        ])?;
        ns.ip(&["link", "set", "ntv1", "up"])?;
        ns.ip(&["addr", "add", "10.96.0.1/24", "dev", "ntv0"])?;
        ns.ip(&["addr", "add", "fd96::1/64", "dev", "ntv0", "nodad"])?;
        ns.ip(&["link", "set", "ntv0", "up"])?;
        let container = TestNetns::new("ntvctr")?;
        let runtime = Runtime::new(&ns)?;
        Ok(Host {
            ns,
            container,
            runtime,
        })
    }

    /// Runs the Go portmap's `verb` with the container's addresses of `families`; with
    /// `path`, that `PATH`.
    fn go(&self, verb: &str, families: &[Family], path: Option<&str>) -> Result<PluginOutput> {
        let ips: Vec<Value> = families
            .iter()
            .map(|f| match f {
                Family::V4 => json!({"address": "10.96.0.2/24"}),
                Family::V6 => json!({"address": "fd96::2/64"}),
            })
            .collect();
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "portmap",
            "snat": true,
            "runtimeConfig": {"portMappings": mappings()},
            "prevResult": {"cniVersion": "1.0.0", "ips": ips},
        });
        let netns = self.container.path().to_string_lossy().into_owned();
        let mut env = vec![
            ("CNI_CONTAINERID", ID),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", netns.as_str()),
            ("CNI_PATH", "/usr/lib/cni"),
        ];
        if let Some(path) = path {
            env.push(("PATH", path));
        }
        let binary = bins::reference_binary("portmap")?;
        self.runtime.exec_plugin(
            &binary.to_string_lossy(),
            Some(verb),
            &env,
            conf.to_string().as_bytes(),
        )
    }

    fn go_ok(&self, verb: &str, families: &[Family], path: Option<&str>) -> Result<()> {
        let out = self.go(verb, families, path)?;
        ensure!(
            out.status.success(),
            "Go portmap {verb}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// `iptables-save -t nat` of both families, without comments and counters.
    fn nat(&self) -> Result<Vec<String>> {
        let mut out =
            tests::snapshot::iptables_save_args(&self.ns, "iptables-save", &["-t", "nat"])?;
        out.extend(tests::snapshot::iptables_save_args(
            &self.ns,
            "ip6tables-save",
            &["-t", "nat"],
        )?);
        Ok(out)
    }

    /// Writes natively what the table lacks of the skeleton and, with `attachment`, of the
    /// attachment, both families in one transaction.
    fn native_add(&self, attachment: bool) -> Result<()> {
        let chain = dnat_chain()?;
        self.ns.run(|| -> Result<()> {
            let mut tables = NativeTables::open("nat")?;
            let mut tx = tables.transaction();
            for family in Family::BOTH {
                tables.ensure(&mut tx, family, &SHARED_CHAINS, &skeleton())?;
                if attachment {
                    let (rules, entries) = self::attachment(family, &chain);
                    let mut specs: Vec<RuleSpec> = rules
                        .iter()
                        .map(|r| RuleSpec::append(&chain, &words(r)))
                        .collect();
                    specs.extend(
                        entries
                            .iter()
                            .map(|e| RuleSpec::append_recorded(DNAT, &words(e))),
                    );
                    tables.ensure(&mut tx, family, &[&chain], &specs)?;
                }
            }
            tables.commit(&tx)?;
            Ok(())
        })?
    }

    /// The skeleton alone, as a DEL leaves it.
    fn skeleton_only() -> Result<Vec<String>> {
        let host = Host::new()?;
        host.native_add(false)?;
        host.nat()
    }
}

#[test]
fn the_native_layout_is_the_go_add_s_and_the_go_plugin_checks_and_deletes_it() -> Result<()> {
    ensure!(
        native::writes_nf_tables(Family::V4),
        "this test needs iptables-nft"
    );
    let ours = Host::new()?;
    ours.native_add(true)?;
    let theirs = Host::new()?;
    theirs.go_ok("ADD", &Family::BOTH, None)?;
    assert_eq!(ours.nat()?, theirs.nat()?);

    let tools = bins::ipv4_iptables_tools()?;
    let v4_path = tools.path().to_string_lossy().into_owned();
    ours.go_ok("CHECK", &[Family::V4], Some(&v4_path))?;
    // The CHECK looks: without one of the chain's rules it fails.
    let chain = dnat_chain()?;
    let rule = "-p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.96.0.2:80";
    let iptables = |op: &str| {
        let mut args = vec![
            "-t".to_owned(),
            "nat".to_owned(),
            op.to_owned(),
            chain.clone(),
        ];
        args.extend(words(rule));
        ours.ns.exec_ok("iptables", &args)
    };
    iptables("-D")?;
    let out = ours.go("CHECK", &[Family::V4], Some(&v4_path))?;
    ensure!(!out.status.success(), "Go CHECK passed without a DNAT rule");
    iptables("-A")?;

    ours.go_ok("DEL", &Family::BOTH, None)?;
    assert_eq!(ours.nat()?, Host::skeleton_only()?);
    Ok(())
}

#[test]
fn what_the_go_add_made_is_found_read_back_and_deleted_natively() -> Result<()> {
    let host = Host::new()?;
    host.go_ok("ADD", &Family::BOTH, None)?;
    let chain = dnat_chain()?;
    host.ns.run(|| -> Result<()> {
        let mut tables = NativeTables::open("nat")?;
        let mut tx = tables.transaction();
        for family in Family::BOTH {
            let (rules, entries) = attachment(family, &chain);
            let canonical = |lines: &[String]| -> Result<Vec<Vec<String>>> {
                Ok(lines
                    .iter()
                    .map(|l| native::canonical(family, &words(l)))
                    .collect::<Result<_, _>>()?)
            };
            let listed: Vec<Option<Vec<String>>> = tables
                .rules(family, &chain, native::Wanted::All)?
                .context("the Go ADD's chain")?
                .into_iter()
                .map(|r| r.args)
                .collect();
            let want: Vec<Option<Vec<String>>> = canonical(&rules)?.into_iter().map(Some).collect();
            ensure!(listed == want, "{family} {chain}: {listed:?}");
            let jumps = tables.jumps_to(family, DNAT, &chain, None)?;
            let found: Vec<Option<Vec<String>>> = jumps.iter().map(|r| r.args.clone()).collect();
            let want: Vec<Option<Vec<String>>> =
                canonical(&entries)?.into_iter().map(Some).collect();
            ensure!(found == want, "{family} {DNAT}: {found:?}");
            // Our ADD on top of the Go one adds nothing.
            let mut add = tables.transaction();
            tables.ensure(&mut add, family, &SHARED_CHAINS, &skeleton())?;
            let specs: Vec<RuleSpec> = rules
                .iter()
                .map(|r| RuleSpec::append(&chain, &words(r)))
                .chain(entries.iter().map(|e| RuleSpec::append(DNAT, &words(e))))
                .collect();
            tables.ensure(&mut add, family, &[&chain], &specs)?;
            ensure!(add.is_empty(), "{family}: our ADD would add {add:?}");
            for rule in jumps {
                tx.delete_rule(family, DNAT, rule.handle);
            }
            tx.delete_chain(family, &chain);
        }
        tables.commit(&tx)?;
        Ok(())
    })??;
    assert_eq!(host.nat()?, Host::skeleton_only()?);
    Ok(())
}

#[test]
fn every_form_written_natively_reads_as_this_machine_s_tools_write_it() -> Result<()> {
    ensure!(
        native::writes_nf_tables(Family::V4),
        "this test needs iptables-nft"
    );
    let ns = TestNetns::new("forms")?;
    // This machine's 1.8.9 writes ports and marks natively, where we write 1.8.7's xtables
    // matches: not expression for expression (tests/tests/userlands.rs compares with 1.8.7).
    tests::iptables_layout::forms_read_alike(&ns, &tests::iptables_layout::host_tools, false)
}
