//! Kernel tests: the layout written natively against what this machine's `iptables-restore`
//! writes, in throwaway network namespaces. Every form of the codec against each release's
//! tools from 1.8.7 to 1.8.11 is in the tests crate (`tests::iptables_layout::forms_read_alike`).

use super::*;
use crate::iptables::tests::in_new_netns;
use crate::iptables::{Iptables, restore_line, split_args};

use crate::iptables::fixtures::{DNAT, MASQ, SETMARK, skeleton};

fn words(line: &str) -> Vec<String> {
    split_args(line).unwrap()
}

/// One attachment's chain (`CNI-DN-<id>`), its rules for 8080→80/tcp on every address and
/// 53→53/udp on one host address, and its entry rules (recorded), for container address
/// `ip` (`.2` of its subnet, in the form the reference passes: with the subnet's prefix).
fn attachment(family: Family, id: &str) -> (String, Vec<RuleSpec>) {
    let chain = format!("CNI-DN-{id}");
    let (cidr, host, to80, to53) = match family {
        Family::V4 => ("10.0.0.2/24", "10.1.1.1", "10.0.0.2:80", "10.0.0.2:53"),
        Family::V6 => ("fd00::2/64", "fd01::1", "[fd00::2]:80", "[fd00::2]:53"),
    };
    let mut lines = vec![
        format!("-s {cidr} -p tcp -m tcp --dport 8080 -j {SETMARK}"),
        format!("-p tcp -m tcp --dport 8080 -j DNAT --to-destination {to80}"),
        format!("-s {cidr} -d {host} -p udp -m udp --dport 53 -j {SETMARK}"),
        format!("-d {host} -p udp -m udp --dport 53 -j DNAT --to-destination {to53}"),
    ];
    if family == Family::V4 {
        lines.insert(
            1,
            format!("-s 127.0.0.1 -p tcp -m tcp --dport 8080 -j {SETMARK}"),
        );
        lines.insert(
            4,
            format!("-s 127.0.0.1 -d {host} -p udp -m udp --dport 53 -j {SETMARK}"),
        );
    }
    let mut specs: Vec<RuleSpec> = lines
        .iter()
        .map(|l| RuleSpec::append(&chain, &words(l)))
        .collect();
    for proto in ["tcp", "udp"] {
        let port = if proto == "tcp" { 8080 } else { 53 };
        specs.push(RuleSpec::append_recorded(
            DNAT,
            &words(&format!(
                r#"-m comment --comment "dnat name: \"net\" id: \"{id}\"" -m multiport -p {proto} --destination-ports {port} -j {chain}"#
            )),
        ));
    }
    (chain, specs)
}

/// The restore lines writing the skeleton and the attachments `ids` into an empty table.
fn restore_script(family: Family, ids: &[&str]) -> Vec<String> {
    let mut lines: Vec<String> = [SETMARK, MASQ, DNAT]
        .iter()
        .map(|c| restore_line::<&str>("-N", c, &[]).unwrap())
        .collect();
    let mut specs = skeleton();
    for id in ids {
        let (chain, rules) = attachment(family, id);
        lines.push(restore_line::<&str>("-N", &chain, &[]).unwrap());
        specs.extend(rules);
    }
    for spec in specs {
        lines.push(match spec.position {
            Position::Append => restore_line("-A", &spec.chain, &spec.args).unwrap(),
            Position::Insert => {
                let mut args = vec!["1".to_owned()];
                args.extend(spec.args);
                restore_line("-I", &spec.chain, &args).unwrap()
            }
        });
    }
    lines
}

/// Adds to `tx` what the table lacks of the skeleton and of attachment `id`, both families;
/// returns what was missing of each, per family.
fn ensure_attachment(
    tables: &mut NativeTables,
    tx: &mut Transaction,
    id: &str,
) -> Vec<(Missing, Missing)> {
    Family::BOTH
        .iter()
        .map(|family| {
            let shared = tables
                .ensure(tx, *family, &[SETMARK, MASQ, DNAT], &skeleton())
                .unwrap();
            let (chain, rules) = attachment(*family, id);
            (
                shared,
                tables.ensure(tx, *family, &[&chain], &rules).unwrap(),
            )
        })
        .collect()
}

/// What another program sees of the namespace's `nat` tables: `iptables-save` of both
/// families (without comments and counters) and the nf_tables chains with their hooks.
fn seen() -> Vec<String> {
    let mut out = Vec::new();
    for family in Family::BOTH {
        let tool = format!("{family}-save");
        let saved = std::process::Command::new(&tool)
            .args(["-t", "nat"])
            .output()
            .unwrap();
        assert!(saved.status.success(), "{tool}: {saved:?}");
        for line in String::from_utf8(saved.stdout).unwrap().lines() {
            if line.starts_with('#') {
                continue;
            }
            out.push(match line.find(" [") {
                Some(i) if line.starts_with(':') => line[..i].to_owned(),
                _ => line.to_owned(),
            });
        }
    }
    let listed = std::process::Command::new("nft")
        .args(["-j", "list", "ruleset"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    // Tables and chains (rules are in the save above), in any order.
    let mut objects: Vec<String> = json["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o.get("table").is_some() || o.get("chain").is_some())
        .map(|o| {
            let mut o = o.clone();
            for v in o.as_object_mut().unwrap().values_mut() {
                v.as_object_mut().unwrap().remove("handle");
            }
            o.to_string()
        })
        .collect();
    objects.sort();
    out.extend(objects);
    out
}

#[test]
fn the_native_layout_is_what_the_restore_writes_from_an_empty_table() {
    assert!(writes_nf_tables(Family::V4), "this test needs iptables-nft");
    let by_restore = in_new_netns(|| {
        for family in Family::BOTH {
            Iptables::new(family)
                .restore("nat", &restore_script(family, &["c1"]))
                .unwrap();
        }
        seen()
    });
    let (natively, recorded) = in_new_netns(|| {
        let mut tables = NativeTables::open("nat").unwrap();
        let mut tx = tables.transaction();
        for (family, (shared, own)) in
            Family::BOTH
                .iter()
                .zip(ensure_attachment(&mut tables, &mut tx, "c1"))
        {
            let chains = [SETMARK, MASQ, DNAT, "POSTROUTING", "PREROUTING", "OUTPUT"];
            assert_eq!(shared.chains, chains, "{family}");
            assert_eq!(shared.rules, [0, 1, 2, 3, 4], "{family}");
            assert_eq!(own.chains, ["CNI-DN-c1"], "{family}");
            assert_eq!(own.rules.len(), attachment(*family, "c1").1.len());
        }
        let recorded = tables.commit(&tx).unwrap();
        // Everything is there now: a second ADD adds nothing.
        let mut again = tables.transaction();
        ensure_attachment(&mut tables, &mut again, "c1");
        assert!(again.is_empty(), "{again:?}");
        (seen(), recorded)
    });
    assert_eq!(natively, by_restore);
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    for r in &recorded {
        assert_eq!(r.rules.len(), 2, "{r:?}");
        assert_ne!(r.table, 0);
    }
}

#[test]
fn a_second_attachment_reads_the_shared_chains_and_writes_only_its_own() {
    in_new_netns(|| {
        for family in Family::BOTH {
            Iptables::new(family)
                .restore("nat", &restore_script(family, &["c1"]))
                .unwrap();
        }
        let before = seen();
        let mut tables = NativeTables::open("nat").unwrap();
        let mut tx = tables.transaction();
        for (shared, own) in ensure_attachment(&mut tables, &mut tx, "c2") {
            assert!(shared.is_empty(), "{shared:?}");
            assert_eq!(own.chains, ["CNI-DN-c2"]);
        }
        // A rule given twice (a mapping listed twice) goes in once.
        let (chain, rules) = attachment(Family::V4, "c2");
        let twice = [rules[0].clone(), rules[0].clone()];
        let mut probe = tables.transaction();
        probe.add_chain(Family::V4, &chain);
        let missing = tables.ensure(&mut probe, Family::V4, &[], &twice).unwrap();
        assert_eq!(missing.rules, [0]);
        // Per family: the chain, its rules and the two entry rules; nothing shared.
        let per_family = |f: Family| 1 + attachment(f, "c2").1.len();
        assert_eq!(
            tx.len(),
            per_family(Family::V4) + per_family(Family::V6),
            "{tx:?}"
        );
        tables.commit(&tx).unwrap();
        let both = seen();
        let by_restore = in_new_netns(|| {
            for family in Family::BOTH {
                Iptables::new(family)
                    .restore("nat", &restore_script(family, &["c1", "c2"]))
                    .unwrap();
            }
            seen()
        });
        assert_eq!(both, by_restore);
        assert_ne!(both, before);
    });
}

#[test]
fn an_attachment_is_removed_by_its_recorded_handles_or_found_by_lookup() {
    in_new_netns(|| {
        let mut tables = NativeTables::open("nat").unwrap();
        let empty = seen();
        let mut tx = tables.transaction();
        ensure_attachment(&mut tables, &mut tx, "c1");
        let first = tables.commit(&tx).unwrap();
        let skeleton_only = in_new_netns(|| {
            let mut tables = NativeTables::open("nat").unwrap();
            let mut tx = tables.transaction();
            for family in Family::BOTH {
                tables
                    .ensure(&mut tx, family, &[SETMARK, MASQ, DNAT], &skeleton())
                    .unwrap();
            }
            tables.commit(&tx).unwrap();
            seen()
        });
        let mut tx = tables.transaction();
        ensure_attachment(&mut tables, &mut tx, "c2");
        let second = tables.commit(&tx).unwrap();
        let recorded = |all: &[Recorded], f: Family| all.iter().find(|r| r.family == f).cloned();

        // Recorded handles: found without listing, equal to what was written.
        let mut tx = tables.transaction();
        for family in Family::BOTH {
            let (chain, specs) = attachment(family, "c1");
            let rec = recorded(&first, family);
            let found = tables.jumps_to(family, DNAT, &chain, rec.as_ref()).unwrap();
            let handles: Vec<u64> = found.iter().map(|r| r.handle).collect();
            assert_eq!(handles, rec.unwrap().rules, "{family}");
            let want: Vec<Vec<String>> = specs
                .iter()
                .filter(|s| s.chain == DNAT)
                .map(|s| canonical(family, &s.args).unwrap())
                .collect();
            let got: Vec<Vec<String>> = found.into_iter().map(|r| r.args.unwrap()).collect();
            assert_eq!(got, want, "{family}");
            // Handles of another attachment's rules, or of another table, are not taken for
            // this one's: the lookup finds the right ones.
            for wrong in [
                recorded(&second, family).unwrap(),
                Recorded {
                    table: rec_table(&first, family) + 1000,
                    ..recorded(&first, family).unwrap()
                },
            ] {
                let found = tables.jumps_to(family, DNAT, &chain, Some(&wrong)).unwrap();
                let handles: Vec<u64> = found.iter().map(|r| r.handle).collect();
                assert_eq!(handles, recorded(&first, family).unwrap().rules, "{family}");
            }
            for rule in tables.jumps_to(family, DNAT, &chain, None).unwrap() {
                tx.delete_rule(family, DNAT, rule.handle);
            }
            tx.delete_chain(family, &chain);
        }
        tables.commit(&tx).unwrap();
        let after_c1 = seen();
        assert!(!after_c1.iter().any(|l| l.contains("c1")), "{after_c1:#?}");
        assert!(after_c1.iter().any(|l| l.contains("c2")));

        // Without records (an attachment the Go plugin made): by lookup.
        let mut tx = tables.transaction();
        for family in Family::BOTH {
            let (chain, _) = attachment(family, "c2");
            let found = tables.jumps_to(family, DNAT, &chain, None).unwrap();
            assert_eq!(found.len(), 2, "{family}");
            for rule in found {
                tx.delete_rule(family, DNAT, rule.handle);
            }
            tx.delete_chain(family, &chain);
        }
        tables.commit(&tx).unwrap();
        assert_eq!(seen(), skeleton_only);
        assert_ne!(seen(), empty);

        // A chain still jumped to is not deleted: the whole transaction fails.
        let mut tx = tables.transaction();
        ensure_attachment(&mut tables, &mut tx, "c3");
        let third = tables.commit(&tx).unwrap();
        let mut tx = tables.transaction();
        tx.delete_chain(Family::V4, "CNI-DN-c3");
        assert!(tables.commit(&tx).is_err());

        // A jump that was not recorded, in a form the codec does not read (the Go plugin's,
        // with conditions of the user's): the removal by records is refused, the one by
        // lookup finds it too.
        let extra = words("-p tcp -m limit --limit 5/s -j CNI-DN-c3");
        for family in Family::BOTH {
            Iptables::new(family)
                .restore("nat", &[restore_line("-A", DNAT, &extra).unwrap()])
                .unwrap();
            let found = tables.jumps_to(family, DNAT, "CNI-DN-c3", None).unwrap();
            assert_eq!(found.len(), 3, "{family}: {found:?}");
            assert_eq!(found[2].args, None);
            assert_eq!(found[2].target.as_deref(), Some("CNI-DN-c3"));
        }
        let removals: Vec<Removal> = Family::BOTH
            .iter()
            .flat_map(|f| {
                let rec = third.iter().find(|r| r.family == *f);
                [
                    Removal {
                        family: *f,
                        from: DNAT,
                        chain: "CNI-DN-c3",
                        recorded: rec,
                    },
                    // Absent: left alone.
                    Removal {
                        family: *f,
                        from: "CNI-HOSTPORT-SNAT",
                        chain: "CNI-SN-c3",
                        recorded: None,
                    },
                ]
            })
            .collect();
        tables.remove_chains(&removals).unwrap();
        assert_eq!(seen(), skeleton_only);
        // Again: nothing left to remove is no error.
        tables.remove_chains(&removals).unwrap();
    });
}

#[test]
fn a_chain_an_operator_s_rule_still_jumps_to_is_emptied_and_its_entry_rules_removed() {
    in_new_netns(|| {
        let mut tables = NativeTables::open("nat").unwrap();
        let mut tx = tables.transaction();
        ensure_attachment(&mut tables, &mut tx, "c1");
        let recorded = tables.commit(&tx).unwrap();
        let skeleton_only = in_new_netns(|| {
            let mut tables = NativeTables::open("nat").unwrap();
            let mut tx = tables.transaction();
            for family in Family::BOTH {
                tables
                    .ensure(&mut tx, family, &[SETMARK, MASQ, DNAT], &skeleton())
                    .unwrap();
            }
            tables.commit(&tx).unwrap();
            seen()
        });
        // The operator's jump, in IPv4 only.
        let operator = words("-s 192.0.2.1/32 -j CNI-DN-c1");
        Iptables::new(Family::V4)
            .restore(
                "nat",
                &[restore_line("-I", "PREROUTING", &operator).unwrap()],
            )
            .unwrap();
        let removals: Vec<Removal> = Family::BOTH
            .iter()
            .map(|f| Removal {
                family: *f,
                from: DNAT,
                chain: "CNI-DN-c1",
                recorded: recorded.iter().find(|r| r.family == *f),
            })
            .collect();
        let err = tables.remove_chains(&removals).unwrap_err();
        assert!(
            matches!(&err, NativeError::Referenced { family: Family::V4, chain, .. } if chain == "CNI-DN-c1"),
            "{err}"
        );
        // What forwarded through it is gone: its rules, its entry rules, and all of IPv6's;
        // the chain stays, empty, for the operator's rule.
        let (left, rest): (Vec<String>, Vec<String>) =
            seen().into_iter().partition(|l| l.contains("CNI-DN-c1"));
        assert_eq!(rest, skeleton_only);
        assert_eq!(
            left,
            [
                ":CNI-DN-c1 -",
                "-A PREROUTING -s 192.0.2.1/32 -j CNI-DN-c1",
                r#"{"chain":{"family":"ip","table":"nat","name":"CNI-DN-c1"}}"#
            ]
        );
        // Once the operator's rule is gone, the next removal deletes the chain.
        Iptables::new(Family::V4)
            .restore(
                "nat",
                &[restore_line("-D", "PREROUTING", &operator).unwrap()],
            )
            .unwrap();
        tables.remove_chains(&removals).unwrap();
        assert_eq!(seen(), skeleton_only);
    });
}

fn rec_table(all: &[Recorded], family: Family) -> u64 {
    all.iter().find(|r| r.family == family).unwrap().table
}

#[test]
fn the_variant_is_read_from_the_binary_the_tools_resolve_to() {
    for (path, want) in [
        ("/usr/sbin/xtables-nft-multi", Variant::Nft),
        ("/sbin/iptables-nft-restore", Variant::Nft),
        ("/usr/sbin/xtables-legacy-multi", Variant::Legacy),
        ("/usr/sbin/ip6tables-legacy-restore", Variant::Legacy),
        ("/tmp/wrapper/iptables-restore", Variant::Other),
    ] {
        assert_eq!(variant_of(std::path::Path::new(path)), want, "{path}");
    }
    // This machine's: Debian's alternatives point at iptables-nft.
    assert_eq!(variant(Family::V4), Variant::Nft);
    assert_eq!(variant(Family::V6), Variant::Nft);
}
