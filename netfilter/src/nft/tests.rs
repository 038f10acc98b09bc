//! Kernel tests (each in a fresh network namespace) and golden-byte tests.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_core::{Emitable, ParseableParametrized};
use netlink_packet_netfilter::nftables::{
    ExpressionAttribute, Expressions, ListAttribute, Lookup, NfTablesMessage, RuleAttribute,
    RuleMessage,
};
use std::process::Command;

use super::DataType as T;
use super::Selector::*;
use super::*;

/// Runs `body` on a thread in a fresh network namespace of its own.
fn in_fresh_netns<T: Send>(body: impl FnOnce() -> T + Send) -> T {
    host::netns::in_new_netns(body).expect("a fresh network namespace needs root")
}

/// `nft ARGS` in the calling thread's namespace (children inherit the thread's netns).
fn nft(args: &[&str]) -> String {
    let out = Command::new("nft").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn v4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Golden bytes: our NFT_MSG_NEWRULE payloads against what `nft` 1.0.6 sends for the same rule.

/// Every golden case: file stem, table family, chain, and the rule built with our API.
fn golden_cases() -> Vec<(&'static str, Family, &'static str, Rule)> {
    use super::L4Proto as P;
    let ip = Family::Ip;
    let ip6 = Family::Ip6;
    let inet = Family::Inet;
    vec![
        (
            "fib_local_jump",
            ip,
            "pre",
            Rule::new().fib_daddr_local().jump("c").comment("enter"),
        ),
        (
            "dnat_map_hostip",
            ip,
            "c",
            Rule::new().dnat_map(
                NfProto::Ipv4,
                &[IpDaddr, MetaL4proto, ThDport],
                "hostip_ports",
            ),
        ),
        (
            "dnat_map_ports",
            ip,
            "c",
            Rule::new().dnat_map(NfProto::Ipv4, &[MetaL4proto, ThDport], "ports"),
        ),
        (
            "dnat_to_addr_port",
            ip,
            "c",
            Rule::new()
                .daddr(v4("192.168.1.1"))
                .dport(P::Tcp, 8080)
                .dnat_to(v4("10.0.0.2").into(), Some(80)),
        ),
        (
            "snat_to_addr_port",
            ip,
            "post",
            Rule::new()
                .saddr(net("10.0.0.0/8"))
                .dport(P::Udp, 53)
                .snat_to(v4("1.2.3.4").into(), Some(99)),
        ),
        (
            "masq_pairs",
            ip,
            "post",
            Rule::new()
                .in_set(&[IpSaddr, IpDaddr], "pairs")
                .masquerade(),
        ),
        (
            "masq_oifname_ct_status",
            ip,
            "post",
            Rule::new()
                .oifname("eth0")
                .ct_status(CtStatusFlags::DNAT)
                .masquerade(),
        ),
        (
            "ct_state_counter_accept",
            ip,
            "c",
            Rule::new()
                .ct_state(CtStateFlags::ESTABLISHED | CtStateFlags::RELATED)
                .counter()
                .accept(),
        ),
        ("ct_mark_drop", ip, "c", Rule::new().ct_mark(0x10).drop()),
        (
            "iifname_mark_mask_return",
            ip,
            "c",
            Rule::new()
                .iifname("veth0")
                .mark_masked(0x2000, 0x2000)
                .ret(),
        ),
        (
            "saddr_set_goto",
            ip,
            "c",
            Rule::new().in_set(&[IpSaddr], "allowed").goto("c2"),
        ),
        (
            "l4proto_vmap",
            ip,
            "c",
            Rule::new().vmap(&[MetaL4proto], "vm"),
        ),
        ("mark_counter", ip, "c", Rule::new().mark(1).counter()),
        (
            "dnat6_map_hostip",
            ip6,
            "c",
            Rule::new().dnat_map(
                NfProto::Ipv6,
                &[Ip6Daddr, MetaL4proto, ThDport],
                "hostip_ports",
            ),
        ),
        (
            "dnat6_map_ports",
            ip6,
            "c",
            Rule::new().dnat_map(NfProto::Ipv6, &[MetaL4proto, ThDport], "ports"),
        ),
        (
            "dnat6_to_addr_port",
            ip6,
            "c",
            Rule::new()
                .daddr(v6("fd00::1"))
                .dport(P::Tcp, 8080)
                .dnat_to(v6("fd00::2").into(), Some(80)),
        ),
        (
            "masq6_prefix",
            ip6,
            "post",
            Rule::new().saddr(net("fd00::/64")).masquerade(),
        ),
        (
            "inet_saddr_accept_comment",
            inet,
            "fw",
            Rule::new()
                .saddr(v4("10.88.0.5"))
                .accept()
                .comment("net/ctr/eth0"),
        ),
        (
            "inet_oif_daddr_ct_accept",
            inet,
            "fw",
            Rule::new()
                .oifname("cni0")
                .daddr(net("10.88.0.0/16"))
                .ct_state(CtStateFlags::ESTABLISHED | CtStateFlags::RELATED)
                .accept(),
        ),
        (
            "inet_ip6_daddr_jump",
            inet,
            "fw",
            Rule::new().daddr(v6("fd00::5")).jump("admin"),
        ),
        (
            "inet_nfproto_return",
            inet,
            "fw",
            Rule::new().nfproto(NfProto::Ipv6).ret(),
        ),
        (
            "prefix_unaligned_accept",
            ip,
            "c",
            Rule::new()
                .saddr(net("10.16.0.0/12"))
                .daddr(net("10.0.16.0/20"))
                .accept(),
        ),
        (
            "inet_prefix6_unaligned_drop",
            inet,
            "fw",
            Rule::new().saddr(net("fd00::/60")).drop(),
        ),
    ]
}

fn read_golden(stem: &str) -> (String, Vec<u8>) {
    let path = format!("{}/testdata/nft/{stem}.golden", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let hex: String = text.lines().filter(|l| !l.starts_with('#')).collect();
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    (text, bytes)
}

fn emit(msg: &netlink_packet_netfilter::NetfilterMessage) -> Vec<u8> {
    let mut out = vec![0u8; msg.buffer_len()];
    msg.emit(&mut out);
    out
}

/// `nft` also names a looked-up set by its transaction id (`NFTA_LOOKUP_SET_ID`), which the
/// kernel ignores when the name resolves; drop it from nft's bytes before comparing.
fn without_lookup_set_ids(payload: &[u8]) -> Vec<u8> {
    const NFT_MSG_NEWRULE: u8 = 6;
    let mut msg = NfTablesMessage::parse_with_param(&payload[4..], NFT_MSG_NEWRULE).unwrap();
    let NfTablesMessage::NewRule(RuleMessage { attributes }) = &mut msg else {
        panic!("not a rule")
    };
    for attr in attributes.iter_mut() {
        let RuleAttribute::Expressions(list) = attr else {
            continue;
        };
        for elem in list.iter_mut() {
            let ListAttribute::Element(parts) = elem else {
                continue;
            };
            for part in parts.iter_mut() {
                if let ExpressionAttribute::Data(Expressions::Lookup(l)) = part {
                    l.retain(|a| !matches!(a, Lookup::SetId(_)));
                }
            }
        }
    }
    let family = Family::from_code(payload[0]).unwrap();
    emit(&batch::nft_message(family, msg))
}

#[test]
fn rules_encode_to_the_bytes_nft_sends() {
    for (stem, family, chain, rule) in golden_cases() {
        let (text, golden) = read_golden(stem);
        let table = Table::new(family, "t");
        let ours = emit(&batch::nft_message(
            family,
            batch::rule_message(&table, chain, &rule).unwrap(),
        ));
        let want = if text.contains("[ lookup") {
            without_lookup_set_ids(&golden)
        } else {
            golden
        };
        assert_eq!(hex(&ours), hex(&want), "{stem}: {}\n{text}", rule.to_nft());
        // The first comment line holds the nft command; our text must be what nft was given.
        let command = text.lines().next().unwrap();
        assert!(
            command.contains(&rule.to_nft()),
            "{stem}: {} vs {command}",
            rule.to_nft()
        );
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------------------
// Kernel tests: each in a fresh network namespace, read back with `nft` and our own listing.

/// The `nft list table` text, one trimmed non-empty line per entry.
fn listed(table: &str) -> Vec<String> {
    let args: Vec<&str> = ["list", "table"]
        .into_iter()
        .chain(table.split(' '))
        .collect();
    nft(&args)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Handle and comment of every rule of `chain`, from `nft -j list ruleset`.
fn json_rules(family: &str, table: &str, chain: &str) -> Vec<(u64, Option<String>)> {
    let v: serde_json::Value = serde_json::from_str(&nft(&["-j", "list", "ruleset"])).unwrap();
    v["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.get("rule"))
        .filter(|r| r["family"] == family && r["table"] == table && r["chain"] == chain)
        .map(|r| {
            (
                r["handle"].as_u64().unwrap(),
                r["comment"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn hostport_table() -> (Table, Batch) {
    use super::L4Proto as P;
    let t = Table::new(Family::Ip, "cni_test");
    // The shared fixture, and what the golden listing below adds to it.
    let mut b = super::fixtures::hostport_table(&t);
    b.add_set(&t, &Set::new("hairpins", &[T::Ipv4Addr, T::Ipv4Addr]))
        .add_set(&t, &Set::verdict_map("by_proto", &[T::InetProto]))
        .add_chain(
            &t,
            &Chain::base(
                "output",
                ChainType::Nat,
                ChainHook::Output,
                priority::DSTNAT,
            ),
        )
        .add_chain(
            &t,
            &Chain::base(
                "postrouting",
                ChainType::Nat,
                ChainHook::Postrouting,
                priority::SRCNAT,
            ),
        )
        .add_rule(
            &t,
            "output",
            &Rule::new().fib_daddr_local().goto("hostports"),
        )
        .add_rule(
            &t,
            "hostports",
            &Rule::new()
                .daddr(v4("192.168.1.1"))
                .dport(P::Sctp, 9000)
                .dnat_to(v4("10.0.0.9").into(), Some(90)),
        )
        .add_rule(
            &t,
            "postrouting",
            &Rule::new()
                .in_set(&[IpSaddr, IpDaddr], "hairpins")
                .masquerade(),
        )
        .add_rule(
            &t,
            "postrouting",
            &Rule::new()
                .saddr(v4("127.0.0.1"))
                .ct_status(CtStatusFlags::DNAT)
                .counter()
                .masquerade(),
        )
        .add_rule(
            &t,
            "postrouting",
            &Rule::new()
                .saddr(net("10.16.0.0/12"))
                .dport(P::Udp, 53)
                .snat_to(v4("1.2.3.4").into(), Some(99)),
        )
        .add_rule(
            &t,
            "postrouting",
            &Rule::new().vmap(&[MetaL4proto], "by_proto"),
        )
        .add_elements(
            &t,
            "ports",
            &[
                Element::new([P::Tcp.into(), Value::Port(8080)])
                    .to([v4("10.0.0.2").into(), Value::Port(80)])
                    .comment("net/ctr1/eth0"),
                Element::new([P::Udp.into(), Value::Port(5353)])
                    .to([v4("10.0.0.3").into(), Value::Port(53)])
                    .comment("net/ctr2/eth0"),
            ],
        )
        .add_elements(
            &t,
            "hostip_ports",
            &[
                Element::new([v4("192.168.1.1").into(), P::Tcp.into(), Value::Port(443)])
                    .to([v4("10.0.0.2").into(), Value::Port(8443)])
                    .comment("net/ctr1/eth0"),
            ],
        )
        .add_elements(
            &t,
            "hairpins",
            &[Element::new([v4("10.0.0.2").into(), v4("10.0.0.2").into()])],
        )
        .add_elements(
            &t,
            "by_proto",
            &[Element::new([P::Tcp.into()]).to_verdict(Verdict::Return)],
        );
    (t, b)
}

#[test]
fn a_portmap_style_table_applies_in_one_batch_and_lists_as_its_nft_text() {
    in_fresh_netns(|| {
        let (t, batch) = hostport_table();
        let mut nl = Nft::new().unwrap();
        nl.apply(&batch).unwrap();
        assert_eq!(
            listed("ip cni_test"),
            lines(
                r#"
table ip cni_test {
    map hostip_ports {
        type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
        elements = { 192.168.1.1 . tcp . 443 comment "net/ctr1/eth0" : 10.0.0.2 . 8443 }
    }
    map ports {
        type inet_proto . inet_service : ipv4_addr . inet_service
        elements = { tcp . 8080 comment "net/ctr1/eth0" : 10.0.0.2 . 80,
                     udp . 5353 comment "net/ctr2/eth0" : 10.0.0.3 . 53 }
    }
    set hairpins {
        type ipv4_addr . ipv4_addr
        elements = { 10.0.0.2 . 10.0.0.2 }
    }
    map by_proto {
        type inet_proto : verdict
        elements = { tcp : return }
    }
    chain hostports {
        dnat ip to ip daddr . meta l4proto . th dport map @hostip_ports comment "by host ip"
        dnat ip to meta l4proto . th dport map @ports
        ip daddr 192.168.1.1 sctp dport 9000 dnat to 10.0.0.9:90
    }
    chain prerouting {
        type nat hook prerouting priority dstnat; policy accept;
        fib daddr type local jump hostports
    }
    chain output {
        type nat hook output priority -100; policy accept;
        fib daddr type local goto hostports
    }
    chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr . ip daddr @hairpins masquerade
        ip saddr 127.0.0.1 ct status dnat counter packets 0 bytes 0 masquerade
        ip saddr 10.16.0.0/12 udp dport 53 snat to 1.2.3.4:99
        meta l4proto vmap @by_proto
    }
}"#
            )
        );
        // Our listing agrees with nft's JSON on handles and comments, and with the builders.
        let ours = nl.rules(&t, "hostports").unwrap();
        let theirs = json_rules("ip", "cni_test", "hostports");
        assert_eq!(
            ours.iter()
                .map(|r| (r.handle, r.comment.clone()))
                .collect::<Vec<_>>(),
            theirs
        );
        assert_eq!(ours[0].comment.as_deref(), Some("by host ip"));
        assert!(
            ours[0].is(
                &Rule::new()
                    .dnat_map(
                        NfProto::Ipv4,
                        &[IpDaddr, MetaL4proto, ThDport],
                        "hostip_ports"
                    )
                    .comment("by host ip"),
                Family::Ip
            )
        );
        let post = nl.rules(&t, "postrouting").unwrap();
        assert!(
            post[1].is(
                &Rule::new()
                    .saddr(v4("127.0.0.1"))
                    .ct_status(CtStatusFlags::DNAT)
                    .counter()
                    .masquerade(),
                Family::Ip
            )
        );
        assert!(!post[1].is(&Rule::new().masquerade(), Family::Ip));
        // Declaring the skeleton again is not an error and changes nothing but appends rules.
        let mut again = Batch::new();
        again
            .add_table(&t)
            .add_set(&t, &Set::new("hairpins", &[T::Ipv4Addr, T::Ipv4Addr]))
            .add_chain(&t, &Chain::regular("hostports"))
            .add_chain(
                &t,
                &Chain::base(
                    "output",
                    ChainType::Nat,
                    ChainHook::Output,
                    priority::DSTNAT,
                ),
            );
        nl.apply(&again).unwrap();
        assert_eq!(nl.rules(&t, "hostports").unwrap(), ours);
    });
}

#[test]
fn a_firewall_style_inet_table_lists_rules_with_handles_and_deletes_by_handle() {
    in_fresh_netns(|| {
        let t = Table::new(Family::Inet, "cni_fw");
        let mut nl = Nft::new().unwrap();
        let mut b = Batch::new();
        b.add_table(&t)
            .add_chain(
                &t,
                &Chain::base(
                    "forward",
                    ChainType::Filter,
                    ChainHook::Forward,
                    priority::FILTER,
                ),
            )
            .add_chain(&t, &Chain::regular("admin"))
            .add_chain(&t, &Chain::regular("attachments"))
            .add_rule(&t, "forward", &Rule::new().jump("attachments"))
            .insert_rule(&t, "forward", &Rule::new().jump("admin"))
            .add_rule(
                &t,
                "attachments",
                &Rule::new()
                    .oifname("cni0")
                    .daddr(v4("10.88.0.5"))
                    .ct_state(CtStateFlags::ESTABLISHED | CtStateFlags::RELATED)
                    .accept()
                    .comment("net/ctr1/eth0"),
            )
            .add_rule(
                &t,
                "attachments",
                &Rule::new()
                    .iifname("cni0")
                    .saddr(v4("10.88.0.5"))
                    .accept()
                    .comment("net/ctr1/eth0"),
            )
            .add_rule(
                &t,
                "attachments",
                &Rule::new()
                    .saddr(v6("fd00::5"))
                    .daddr(net("fd00:1::/60"))
                    .accept()
                    .comment("net/ctr1/eth0"),
            )
            .add_rule(
                &t,
                "attachments",
                &Rule::new()
                    .nfproto(NfProto::Ipv4)
                    .mark_masked(0x2000, 0x2000)
                    .ct_mark(7)
                    .counter()
                    .drop()
                    .comment("net/ctr2/eth0"),
            )
            .add_rule(&t, "admin", &Rule::new().mark(0x10).ret());
        nl.apply(&b).unwrap();
        assert_eq!(
            listed("inet cni_fw"),
            lines(
                r#"
table inet cni_fw {
    chain forward {
        type filter hook forward priority filter; policy accept;
        jump admin
        jump attachments
    }
    chain admin {
        meta mark 0x00000010 return
    }
    chain attachments {
        oifname "cni0" ip daddr 10.88.0.5 ct state established,related accept comment "net/ctr1/eth0"
        iifname "cni0" ip saddr 10.88.0.5 accept comment "net/ctr1/eth0"
        ip6 saddr fd00::5 ip6 daddr fd00:1::/60 accept comment "net/ctr1/eth0"
        meta nfproto ipv4 meta mark & 0x00002000 == 0x00002000 ct mark 0x00000007 counter packets 0 bytes 0 drop comment "net/ctr2/eth0"
    }
}"#
            )
        );
        let rules = nl.rules(&t, "attachments").unwrap();
        let json = json_rules("inet", "cni_fw", "attachments");
        assert_eq!(
            rules
                .iter()
                .map(|r| (r.handle, r.comment.clone()))
                .collect::<Vec<_>>(),
            json
        );
        // Delete this attachment's rules by handle, in one batch.
        let mut del = Batch::new();
        for r in rules
            .iter()
            .filter(|r| r.comment.as_deref() == Some("net/ctr1/eth0"))
        {
            del.delete_rule(&t, "attachments", r.handle);
        }
        assert_eq!(del.len(), 3);
        nl.apply(&del).unwrap();
        let left = nl.rules(&t, "attachments").unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].comment.as_deref(), Some("net/ctr2/eth0"));
        assert_eq!(json_rules("inet", "cni_fw", "attachments").len(), 1);
        // Deleting a handle that is gone names it and reports ENOENT.
        let mut gone = Batch::new();
        gone.delete_rule(&t, "attachments", rules[0].handle);
        let err = nl.apply(&gone).unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert_eq!(
            err.failed_object(),
            Some(
                format!(
                    "delete rule inet cni_fw attachments handle {}",
                    rules[0].handle
                )
                .as_str()
            )
        );
        // Flushing empties the chain and keeps it.
        let mut flush = Batch::new();
        flush.flush_chain(&t, "attachments");
        nl.apply(&flush).unwrap();
        assert!(nl.rules(&t, "attachments").unwrap().is_empty());
        assert!(nl.chain_exists(&t, "attachments").unwrap());
    });
}

#[test]
fn ip6_tables_carry_dnat_maps_and_elements_are_found_listed_and_deleted_by_key() {
    use super::L4Proto as P;
    in_fresh_netns(|| {
        let t = Table::new(Family::Ip6, "cni_test");
        let mut nl = Nft::new().unwrap();
        let key = |port| vec![v6("fd00::1").into(), P::Tcp.into(), Value::Port(port)];
        let mut b = Batch::new();
        b.add_table(&t)
            .add_set(
                &t,
                &Set::map(
                    "hostip_ports",
                    &[T::Ipv6Addr, T::InetProto, T::InetService],
                    &[T::Ipv6Addr, T::InetService],
                ),
            )
            .add_chain(
                &t,
                &Chain::base(
                    "prerouting",
                    ChainType::Nat,
                    ChainHook::Prerouting,
                    priority::DSTNAT,
                ),
            )
            .add_rule(
                &t,
                "prerouting",
                &Rule::new().fib_daddr_local().dnat_map(
                    NfProto::Ipv6,
                    &[Ip6Daddr, MetaL4proto, ThDport],
                    "hostip_ports",
                ),
            )
            .add_rule(
                &t,
                "prerouting",
                &Rule::new()
                    .daddr(v6("fd00::2"))
                    .dport(P::Tcp, 81)
                    .dnat_to(v6("fd00::9").into(), Some(8081)),
            )
            .add_elements(
                &t,
                "hostip_ports",
                &[
                    Element::new(key(80))
                        .to([v6("fd00::10").into(), Value::Port(8080)])
                        .comment("a"),
                    Element::new(key(443))
                        .to([v6("fd00::11").into(), Value::Port(8443)])
                        .comment("b"),
                ],
            );
        nl.apply(&b).unwrap();
        assert_eq!(
            listed("ip6 cni_test"),
            lines(
                r#"
table ip6 cni_test {
    map hostip_ports {
        type ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service
        elements = { fd00::1 . tcp . 80 comment "a" : fd00::10 . 8080,
                     fd00::1 . tcp . 443 comment "b" : fd00::11 . 8443 }
    }
    chain prerouting {
        type nat hook prerouting priority dstnat; policy accept;
        fib daddr type local dnat ip6 to ip6 daddr . meta l4proto . th dport map @hostip_ports
        ip6 daddr fd00::2 tcp dport 81 dnat to [fd00::9]:8081
    }
}"#
            )
        );
        let mut all = nl.elements(&t, "hostip_ports").unwrap();
        all.sort_by_key(|e| e.comment.clone());
        assert_eq!(
            all,
            [
                Element::new(key(80))
                    .to([v6("fd00::10").into(), Value::Port(8080)])
                    .comment("a"),
                Element::new(key(443))
                    .to([v6("fd00::11").into(), Value::Port(8443)])
                    .comment("b"),
            ]
        );
        assert_eq!(
            nl.element(&t, "hostip_ports", &key(443)).unwrap(),
            Some(all[1].clone())
        );
        assert_eq!(nl.element(&t, "hostip_ports", &key(444)).unwrap(), None);
        // Same key, other data: the kernel refuses, naming the object.
        let mut clash = Batch::new();
        clash.add_elements(
            &t,
            "hostip_ports",
            &[Element::new(key(80)).to([v6("fd00::99").into(), Value::Port(1)])],
        );
        let err = nl.apply(&clash).unwrap_err();
        assert_eq!(err.errno(), Some(libc::EEXIST), "{err}");
        assert_eq!(
            err.failed_object(),
            Some("add 1 element(s) to ip6 cni_test hostip_ports")
        );
        // Re-adding the identical element is fine.
        let mut same = Batch::new();
        same.add_elements(&t, "hostip_ports", &all[..1]);
        nl.apply(&same).unwrap();
        // Delete by key.
        let mut del = Batch::new();
        del.delete_elements(&t, "hostip_ports", &[key(80)]);
        nl.apply(&del).unwrap();
        assert_eq!(nl.elements(&t, "hostip_ports").unwrap(), [all[1].clone()]);
        assert!(!nft(&["list", "map", "ip6", "cni_test", "hostip_ports"]).contains(" 80 "));
        let err = nl.apply(&del).unwrap_err();
        assert!(err.is_not_found(), "{err}");
    });
}

#[test]
fn a_batch_is_all_or_nothing_and_its_error_names_the_refused_object() {
    in_fresh_netns(|| {
        let t = Table::new(Family::Ip, "atomic");
        let mut nl = Nft::new().unwrap();
        let mut b = Batch::new();
        b.add_table(&t)
            .add_chain(&t, &Chain::regular("c"))
            .add_rule(&t, "c", &Rule::new().accept())
            .add_rule(&t, "c", &Rule::new().jump("missing"))
            .add_rule(&t, "c", &Rule::new().drop());
        let err = nl.apply(&b).unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert!(
            matches!(err, NftError::Rejected { index: Some(3), .. }),
            "{err:?}"
        );
        assert_eq!(
            err.failed_object(),
            Some("add rule ip atomic c jump missing")
        );
        assert!(err.to_string().contains("jump missing"), "{err}");
        // Nothing of the batch exists.
        assert!(!nl.table_exists(&t).unwrap());
        assert_eq!(nft(&["list", "ruleset"]), "");
        // Rules that cannot be encoded for the family are refused before anything is sent.
        let mut bad = Batch::new();
        bad.add_table(&t)
            .add_chain(&t, &Chain::regular("c"))
            .add_rule(&t, "c", &Rule::new().daddr(v6("fd00::1")).accept());
        let err = nl.apply(&bad).unwrap_err();
        assert!(matches!(err, NftError::Invalid { .. }), "{err:?}");
        assert!(err.to_string().contains("ip6 daddr"), "{err}");
        for rule in [
            Rule::new().iifname("a-name-that-is-too-long").accept(),
            Rule::new().accept().comment(&"x".repeat(COMMENT_MAX + 1)),
        ] {
            let mut bad = Batch::new();
            bad.add_rule(&t, "c", &rule);
            assert!(matches!(nl.apply(&bad), Err(NftError::Invalid { .. })));
        }
        assert!(!nl.table_exists(&t).unwrap());
    });
}

#[test]
fn listing_what_does_not_exist_reports_not_found() {
    in_fresh_netns(|| {
        let t = Table::new(Family::Ip, "nothing");
        let mut nl = Nft::new().unwrap();
        assert!(nl.rules(&t, "c").unwrap_err().is_not_found());
        assert!(nl.elements(&t, "m").unwrap_err().is_not_found());
        assert!(
            nl.element(&t, "m", &[Value::Port(1)])
                .unwrap_err()
                .is_not_found()
        );
        assert!(!nl.table_exists(&t).unwrap());
        assert!(!nl.chain_exists(&t, "c").unwrap());
        let mut b = Batch::new();
        b.add_table(&t).add_chain(&t, &Chain::regular("c"));
        nl.apply(&b).unwrap();
        assert!(nl.rules(&t, "c").unwrap().is_empty());
        assert!(nl.rules(&t, "other").unwrap_err().is_not_found());
        let mut del = Batch::new();
        del.delete_table(&t);
        nl.apply(&del).unwrap();
        assert!(!nl.table_exists(&t).unwrap());
    });
}

#[test]
fn a_handle_opened_in_a_namespace_stays_bound_to_it() {
    let ns = in_fresh_netns(|| host::netns::NetNs::current().unwrap());
    let t = Table::new(Family::Inet, "bound");
    let mut inside = Nft::open_in(&ns).unwrap();
    let mut b = Batch::new();
    b.add_table(&t);
    inside.apply(&b).unwrap();
    assert!(inside.table_exists(&t).unwrap());
    // Checked from a fresh namespace: the table is not anywhere else.
    assert!(!in_fresh_netns(|| Nft::new()
        .unwrap()
        .table_exists(&t)
        .unwrap()));
}

// ---------------------------------------------------------------------------------------------
// Size limits, refusals that show a missing kernel feature, and checks without a commit.

/// The keys of `n` distinct `inet_proto . inet_service` elements.
fn port_keys(n: u16) -> Vec<Vec<Value>> {
    (1..=n)
        .map(|p| vec![L4Proto::Tcp.into(), Value::Port(p)])
        .collect()
}

#[test]
fn element_lists_longer_than_an_attribute_are_split_into_messages_of_one_operation() {
    let t = Table::new(Family::Ip, "t");
    let keys = port_keys(10_000);
    let mut b = Batch::new();
    b.add_table(&t).delete_elements(&t, "m", &keys);
    let encoded = b.encode().unwrap();
    assert!(encoded.len() > 3, "{} messages", encoded.len());
    assert_eq!(encoded[0].op, 0);
    let mut listed = 0;
    for e in &encoded[1..] {
        assert_eq!(e.op, 1);
        // Every attribute's u16 length is the real one: the walk covers each message whole.
        let mut attrs = 0;
        for (kind, value) in raw::attributes(e.msg.attrs()) {
            attrs += (value.len() + 4 + 3) & !3;
            if kind == 3 {
                assert!(value.len() + 4 <= batch::ATTR_MAX);
                listed += raw::attributes(value).count();
            }
        }
        assert_eq!(attrs, e.msg.attrs().len());
    }
    assert_eq!(listed, keys.len());
    // Only the last message asks for an ACK.
    let acks: Vec<bool> = encoded
        .iter()
        .map(|e| e.flags & netlink_packet_core::NLM_F_ACK != 0)
        .collect();
    assert_eq!(acks.iter().filter(|a| **a).count(), 1);
    assert!(acks[acks.len() - 1]);
}

#[test]
fn an_attribute_too_long_for_netlink_is_refused_before_anything_is_sent() {
    let t = Table::new(Family::Ip, "t");
    let mut b = Batch::new();
    b.add_rule(
        &t,
        "c",
        &Rule::new().xt_match("comment", 0, vec![b'x'; 70_000]),
    );
    let err = b.encode().unwrap_err();
    assert_eq!(err.object, "add rule ip t c xt match \"comment\"");
    assert!(err.reason.contains("65535"), "{}", err.reason);
    let err = in_fresh_netns(|| Nft::new().unwrap().apply(&b).unwrap_err());
    assert!(matches!(err, NftError::Invalid { .. }), "{err:?}");
}

#[test]
fn a_refusal_at_an_unknown_expression_names_it_and_one_at_a_missing_chain_does_not() {
    // The kernel's extended ACK points at the expression: the second one here.
    let t = Table::new(Family::Ip, "t");
    let mut b = Batch::new();
    b.add_rule(
        &t,
        "c",
        &Rule::new()
            .counter()
            .expr(Expr::Other("nosuchexpr".into()))
            .jump("c2"),
    );
    let encoded = b.encode().unwrap();
    let msg = &encoded[0].msg;
    let offset_of = |name: &[u8]| {
        // The expression's NFTA_LIST_ELEM starts 8 bytes before its name's value.
        16 + memchr::memmem::find(&msg.payload, name).unwrap() - 8
    };
    assert_eq!(
        raw::missing_feature(msg, offset_of(b"nosuchexpr")).as_deref(),
        Some("expression \"nosuchexpr\"")
    );
    // nf_tables always has `immediate`: refused there, the jump's chain is what is missing.
    assert_eq!(raw::missing_feature(msg, offset_of(b"immediate")), None);
    assert_eq!(raw::missing_feature(msg, 16 + 4 + 1), None);

    in_fresh_netns(|| {
        let mut nl = Nft::new().unwrap();
        let mut base = Batch::new();
        base.add_table(&t).add_chain(&t, &Chain::regular("c"));
        let mut unknown = base.clone();
        unknown.add_rule(
            &t,
            "c",
            &Rule::new().counter().expr(Expr::Other("nosuchexpr".into())),
        );
        let err = nl.apply(&unknown).unwrap_err();
        assert_eq!(err.errno(), Some(libc::ENOENT), "{err}");
        assert_eq!(err.missing_feature(), Some("expression \"nosuchexpr\""));
        assert!(err.is_unsupported() && !err.is_not_found(), "{err}");
        assert!(err.to_string().contains("nosuchexpr"), "{err}");

        let mut dangling = base.clone();
        dangling.add_rule(&t, "c", &Rule::new().jump("nowhere"));
        let err = nl.apply(&dangling).unwrap_err();
        assert_eq!(err.missing_feature(), None, "{err}");
        assert!(err.is_not_found() && !err.is_unsupported(), "{err}");
        assert_eq!(nft(&["list", "ruleset"]), "");
    });
}

#[test]
fn a_checked_batch_changes_nothing_and_reports_what_the_kernel_would_refuse() {
    in_fresh_netns(|| {
        let (t, skeleton) = hostport_table();
        let mut nl = Nft::new().unwrap();
        assert!(nl.is_available().unwrap());
        nl.validate(&skeleton).unwrap();
        assert_eq!(nft(&["list", "ruleset"]), "");
        let mut bad = skeleton.clone();
        bad.add_rule(&t, "hostports", &Rule::new().jump("nowhere"));
        let err = nl.validate(&bad).unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert_eq!(
            err.failed_object(),
            Some(format!("add rule {t} hostports jump nowhere").as_str())
        );
        assert_eq!(nft(&["list", "ruleset"]), "");
        // The same batch applies afterwards.
        nl.apply(&skeleton).unwrap();
        assert!(nl.table_exists(&t).unwrap());
    });
}

#[test]
fn the_probe_finds_only_the_features_the_kernel_lacks_and_creates_nothing() {
    in_fresh_netns(|| {
        let mut nl = Nft::new().unwrap();
        let all = [
            Feature::Fib,
            Feature::Nat,
            Feature::Masquerade,
            Feature::Ct,
            Feature::Counter,
            Feature::NatChain,
            Feature::Expression("nosuchexpr"),
            Feature::Expression("fib"),
            Feature::Expression("lookup"),
        ];
        for family in [Family::Ip, Family::Ip6, Family::Inet] {
            assert_eq!(
                nl.missing_features(family, &all).unwrap(),
                [Feature::Expression("nosuchexpr")],
                "{family:?}"
            );
        }
        assert_eq!(
            Feature::Expression("nosuchexpr").describe(),
            "expression \"nosuchexpr\""
        );
        assert_eq!(Feature::NatChain.describe(), "chain type \"nat\"");
        assert!(nl.missing_features(Family::Ip, &[]).unwrap().is_empty());
        assert_eq!(nft(&["list", "ruleset"]), "");
    });
}

#[test]
fn errors_meaning_no_nf_tables_are_unsupported_and_others_are_not() {
    let os = io::Error::from_raw_os_error;
    let request = |errno| NftError::Request {
        op: "look up table ip t".into(),
        source: os(errno),
    };
    let whole = |errno| NftError::Rejected {
        object: "commit the transaction".into(),
        index: None,
        feature: None,
        source: os(errno),
    };
    assert!(NftError::Open(os(libc::EPROTONOSUPPORT)).is_absent());
    assert!(NftError::Open(os(libc::EPROTONOSUPPORT)).is_unsupported());
    assert!(NftError::Open(os(libc::EAFNOSUPPORT)).is_unsupported());
    assert!(!NftError::Open(os(libc::EMFILE)).is_unsupported());
    // By their errno alone, refusals say nothing of nf_tables being there: a present one
    // answers EINVAL to what it finds malformed ([`NftError::absent_when`] tells them apart).
    for errno in [libc::EINVAL, libc::EOPNOTSUPP, libc::ENOENT, libc::EPERM] {
        assert!(!request(errno).is_unsupported(), "{errno}");
        assert!(!request(errno).is_absent(), "{errno}");
    }
    assert!(request(libc::ENOENT).is_not_found());
    assert!(!whole(libc::EOPNOTSUPP).is_unsupported());
    assert!(!whole(libc::ENOMEM).is_unsupported());
    let absent = NftError::Absent {
        op: "look up table ip t".into(),
        source: os(libc::EINVAL),
    };
    assert!(absent.is_absent() && absent.is_unsupported() && !absent.is_not_found());
    assert_eq!(absent.errno(), Some(libc::EINVAL));
    assert_eq!(
        absent.to_string(),
        "nftables: failed to look up table ip t: Invalid argument (os error 22)"
    );
    let at_rule = |feature: Option<&str>| NftError::Rejected {
        object: "add rule ip t c fib daddr type local".into(),
        index: Some(2),
        feature: feature.map(String::from),
        source: os(libc::ENOENT),
    };
    assert!(at_rule(Some("expression \"fib\"")).is_unsupported());
    assert!(!at_rule(Some("expression \"fib\"")).is_not_found());
    assert!(!at_rule(None).is_unsupported());
    assert!(at_rule(None).is_not_found());
    assert!(
        at_rule(Some("expression \"fib\""))
            .to_string()
            .ends_with("(the kernel has no nf_tables expression \"fib\")")
    );
}

/// The shapes of nfnetlink's answers where the kernel lacks nf_tables (`nfnetlink_rcv_msg`:
/// EINVAL to a request; `nfnetlink_rcv_batch`: EOPNOTSUPP at the batch's begin, which
/// `rejected` reports for the transaction as a whole), told from a present nf_tables refusing
/// a malformed message by the ruleset's generation: refused with EINVAL too, or given.
#[test]
fn a_refusal_is_absence_only_where_the_generation_is_refused_too() {
    let os = io::Error::from_raw_os_error;
    let request = |errno| NftError::Request {
        op: "look up set inet t s".into(),
        source: os(errno),
    };
    let batch = |index, errno| NftError::Rejected {
        object: "commit the transaction".into(),
        index,
        feature: None,
        source: os(errno),
    };
    let refused = || Some(libc::EINVAL);
    let given = || None;
    let never = || -> Option<i32> { panic!("the generation was asked for") };

    let err = request(libc::EINVAL).absent_when(refused);
    assert!(matches!(&err, NftError::Absent { op, .. } if op == "look up set inet t s"));
    assert!(err.is_absent() && err.is_unsupported(), "{err}");
    assert_eq!(err.errno(), Some(libc::EINVAL));
    let err = batch(None, libc::EOPNOTSUPP).absent_when(refused);
    assert!(matches!(&err, NftError::Absent { op, .. } if op == "commit the transaction"));
    assert!(err.is_unsupported(), "{err}");

    // nf_tables is there: a malformed request, a commit it refuses.
    let err = request(libc::EINVAL).absent_when(given);
    assert!(matches!(err, NftError::Request { .. }) && !err.is_unsupported());
    let err = batch(None, libc::EOPNOTSUPP).absent_when(given);
    assert!(matches!(err, NftError::Rejected { .. }) && !err.is_unsupported());
    // The generation refused otherwise (EPERM: not allowed to ask) says nothing either.
    let err = request(libc::EINVAL).absent_when(|| Some(libc::EPERM));
    assert!(!err.is_absent(), "{err}");

    // Other shapes are never absence, and cost no question.
    for err in [
        request(libc::ENOENT),
        request(libc::EOPNOTSUPP),
        request(libc::EPERM),
        batch(None, libc::EINVAL),
        batch(None, libc::ENOMEM),
        batch(Some(3), libc::EOPNOTSUPP),
        NftError::Open(os(libc::EMFILE)),
    ] {
        let shown = err.to_string();
        assert!(!err.absent_when(never).is_absent(), "{shown}");
    }
}

/// On this kernel, which has nf_tables, a request nf_tables refuses with EINVAL (a table
/// lookup without a name) stays the refusal it is: the generation is given.
#[test]
fn a_malformed_request_of_a_present_nf_tables_is_not_absence() {
    in_fresh_netns(|| {
        let mut nl = Nft::new().unwrap();
        let msg = NfTablesMessage::GetTable(TableMessage { attributes: vec![] });
        let err = nl
            .request(
                &|| "look up a table without a name".into(),
                Family::Ip,
                msg,
                false,
            )
            .unwrap_err();
        assert!(matches!(err, NftError::Request { .. }), "{err:?}");
        assert_eq!(err.errno(), Some(libc::EINVAL), "{err}");
        assert!(!err.is_unsupported(), "{err}");
        assert_eq!(nl.absent, Some(false));
        assert!(nl.is_available().unwrap());
    });
}

#[test]
fn sets_maps_and_verdict_maps_list_back_as_added_from_their_bytes() {
    in_fresh_netns(|| {
        use super::L4Proto as P;
        let t = Table::new(Family::Inet, "lists");
        let pairs = [
            Element::new([v4("10.0.0.2").into(), v4("10.0.0.2").into()]),
            Element::new([v4("10.0.0.3").into(), v4("10.0.0.3").into()]).comment("two"),
        ];
        let verdicts = [
            Element::new([P::Tcp.into()]).to_verdict(Verdict::Goto("gate".into())),
            Element::new([P::Udp.into()]).to_verdict(Verdict::Jump("gate".into())),
            Element::new([P::Sctp.into()]).to_verdict(Verdict::Return),
            Element::new([P::Other(1).into()]).to_verdict(Verdict::Accept),
            Element::new([P::Other(2).into()])
                .to_verdict(Verdict::Drop)
                .comment("x".repeat(COMMENT_MAX).as_str()),
        ];
        let mapped = [
            Element::new([v6("fd00::1").into(), P::Udp.into(), Value::Port(53)])
                .to([v6("fd00::2").into(), Value::Port(5353)])
                .comment("net/ctr/eth0"),
        ];
        let mut b = Batch::new();
        b.add_table(&t)
            .add_chain(&t, &Chain::regular("gate"))
            .add_set(&t, &Set::new("pairs", &[T::Ipv4Addr, T::Ipv4Addr]))
            .add_set(&t, &Set::verdict_map("verdicts", &[T::InetProto]))
            .add_set(
                &t,
                &Set::map(
                    "mapped",
                    &[T::Ipv6Addr, T::InetProto, T::InetService],
                    &[T::Ipv6Addr, T::InetService],
                ),
            )
            .add_elements(&t, "pairs", &pairs)
            .add_elements(&t, "verdicts", &verdicts)
            .add_elements(&t, "mapped", &mapped);
        let mut nl = Nft::new().unwrap();
        nl.apply(&b).unwrap();
        let sorted = |mut v: Vec<Element>| {
            v.sort_by_key(|e| format!("{:?}", e.key));
            v
        };
        assert_eq!(
            sorted(nl.elements(&t, "pairs").unwrap()),
            sorted(pairs.to_vec())
        );
        assert_eq!(
            sorted(nl.elements(&t, "verdicts").unwrap()),
            sorted(verdicts.to_vec())
        );
        assert_eq!(nl.elements(&t, "mapped").unwrap(), mapped);
        for e in verdicts.iter().chain(&pairs).chain(&mapped) {
            let set = match (&e.data, e.key.len()) {
                (Some(ElementData::Verdict(_)), _) => "verdicts",
                (None, _) => "pairs",
                _ => "mapped",
            };
            assert_eq!(nl.element(&t, set, &e.key).unwrap().as_ref(), Some(e));
        }
    });
}

#[test]
fn a_lazy_handle_opens_one_socket_on_first_use_and_keeps_it() {
    use std::os::fd::{AsFd, AsRawFd};
    in_fresh_netns(|| {
        let mut lazy = LazyNft::new();
        assert!(lazy.opened().is_none());
        let fd = lazy.get().unwrap().as_fd().as_raw_fd();
        let mut b = Batch::new();
        b.add_table(&Table::new(Family::Ip, "lazy"));
        lazy.get().unwrap().apply(&b).unwrap();
        assert_eq!(lazy.get().unwrap().as_fd().as_raw_fd(), fd);
        assert_eq!(lazy.opened().unwrap().as_fd().as_raw_fd(), fd);
        let mut given = LazyNft::from(Nft::new().unwrap());
        assert!(given.opened().is_some());
    });
}

// ---------------------------------------------------------------------------------------------
// Removal by expiry: `flags timeout` sets, elements updated to a 1 ms timeout.

/// The attributes of element list entries of an encoded element message, each as
/// `(attribute type, value)` pairs.
fn encoded_elements(msg: &raw::RawMsg) -> Vec<Vec<(u16, Vec<u8>)>> {
    raw::attributes(msg.attrs())
        .filter(|(k, _)| *k == 3) // NFTA_SET_ELEM_LIST_ELEMENTS
        .flat_map(|(_, list)| raw::attributes(list))
        .map(|(_, elem)| {
            raw::attributes(elem)
                .map(|(k, v)| (k, v.to_vec()))
                .collect()
        })
        .collect()
}

#[test]
fn an_expiry_is_an_update_of_key_and_data_with_a_1ms_timeout_and_no_comment() {
    use super::L4Proto as P;
    use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
    let t = Table::new(Family::Ip, "cni_test");
    let element = Element::new([P::Tcp.into(), Value::Port(8080)])
        .to([v4("10.0.0.2").into(), Value::Port(80)])
        .comment("owner");
    let mut b = Batch::new();
    b.expire_elements(&t, "ports", std::slice::from_ref(&element));
    let encoded = b.encode().unwrap();
    assert_eq!(encoded.len(), 1);
    let msg = &encoded[0];
    assert_eq!(msg.msg.nft_kind(), Some(raw::NFT_MSG_NEWSETELEM));
    assert_eq!(msg.flags & (NLM_F_EXCL | NLM_F_CREATE), 0);
    let raw = raw::set_elements(msg.msg.attrs()).collect::<Vec<_>>();
    assert_eq!(raw.len(), 1);
    assert_eq!(raw[0].key, Some(&[6, 0, 0, 0, 0x1f, 0x90, 0, 0][..]));
    assert_eq!(raw[0].data, Some(&[10, 0, 0, 2, 0, 80, 0, 0][..]));
    assert_eq!(raw[0].userdata, None);
    let attrs = &encoded_elements(&msg.msg)[0];
    // NFTA_SET_ELEM_TIMEOUT: big-endian milliseconds.
    assert_eq!(
        attrs.iter().find(|(k, _)| *k == 4).map(|(_, v)| v.clone()),
        Some(1u64.to_be_bytes().to_vec())
    );
    assert!(b.describe(0).contains("expire 1 element(s)"));
    // An addition of the same element keeps its comment, sends no timeout, and creates.
    let mut add = Batch::new();
    add.add_elements(&t, "ports", std::slice::from_ref(&element));
    let added = add.encode().unwrap();
    assert_ne!(added[0].flags & NLM_F_CREATE, 0);
    assert!(
        !encoded_elements(&added[0].msg)[0]
            .iter()
            .any(|(k, _)| *k == 4)
    );
}

#[test]
fn sets_with_timeout_carry_the_flag_and_say_so() {
    let t = Table::new(Family::Ip, "cni_test");
    let map = Set::map("m", &[T::InetService], &[T::Ipv4Addr]).with_timeout();
    let set = Set::new("s", &[T::Ipv4Addr]).with_timeout();
    assert_eq!(
        map.to_nft(),
        "map m { type inet_service : ipv4_addr; flags timeout; }"
    );
    assert_eq!(set.to_nft(), "set s { type ipv4_addr; flags timeout; }");
    let plain = Set::new("p", &[T::Ipv4Addr]);
    let mut b = Batch::new();
    b.add_set(&t, &map).add_set(&t, &set).add_set(&t, &plain);
    let flags: Vec<u32> = b
        .encode()
        .unwrap()
        .iter()
        .map(|e| {
            let v = raw::attributes(e.msg.attrs())
                .find(|(k, _)| *k == 3) // NFTA_SET_FLAGS
                .map(|(_, v)| v.to_vec())
                .unwrap();
            u32::from_be_bytes(v.try_into().unwrap())
        })
        .collect();
    // NFT_SET_MAP 0x8, NFT_SET_TIMEOUT 0x10.
    assert_eq!(flags, [0x18, 0x10, 0]);
}

#[test]
fn expiries_become_deletions_of_their_keys_where_asked() {
    let t = Table::new(Family::Ip, "cni_test");
    let a = Element::new([Value::Port(1)]).comment("a");
    let b = Element::new([Value::Port(2)]);
    let mut batch = Batch::new();
    batch
        .expire_elements(&t, "timed", std::slice::from_ref(&a))
        .expire_elements(&t, "plain", std::slice::from_ref(&b))
        .add_elements(&t, "other", std::slice::from_ref(&a));
    assert_eq!(
        batch.expiring_sets().map(|(_, s)| s).collect::<Vec<_>>(),
        ["timed", "plain"]
    );
    assert_eq!(
        batch.last_expiring().map(|(_, s, e)| (s, e)),
        Some(("plain", &b))
    );
    assert!(batch.deleting_expiries(&|_, _| true).is_none());
    let mut want = Batch::new();
    want.expire_elements(&t, "timed", std::slice::from_ref(&a))
        .delete_elements(&t, "plain", std::slice::from_ref(&b.key))
        .add_elements(&t, "other", std::slice::from_ref(&a));
    assert_eq!(batch.deleting_expiries(&|_, s| s == "timed"), Some(want));
    let mut deletions = Batch::new();
    deletions
        .delete_elements(&t, "timed", std::slice::from_ref(&a.key))
        .delete_elements(&t, "plain", std::slice::from_ref(&b.key));
    assert_eq!(batch.expiries_as_deletions(), deletions);
}

/// Whether the running kernel applies a timeout given to an existing set element (6.5 and
/// later; older ones accept it and change nothing).
fn updates_element_timeouts() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    (major, minor) >= (6, 5)
}

#[test]
fn expired_elements_are_gone_at_once_their_keys_free_and_plain_sets_delete_instead() {
    use super::L4Proto as P;
    in_fresh_netns(|| {
        let t = Table::new(Family::Ip, "cni_test");
        let key = |port| vec![P::Tcp.into(), Value::Port(port)];
        let mapped = |port, to: &str| {
            Element::new(key(port))
                .to([v4(to).into(), Value::Port(80)])
                .comment("owner")
        };
        let timed = Set::map(
            "timed",
            &[T::InetProto, T::InetService],
            &[T::Ipv4Addr, T::InetService],
        )
        .with_timeout();
        let plain = Set::new("plain", &[T::Ipv4Addr]);
        let addr = Element::new([v4("10.0.0.9").into()]).comment("owner");
        let mut b = Batch::new();
        b.add_table(&t)
            .add_set(&t, &timed)
            .add_set(&t, &plain)
            .add_elements(&t, "timed", &[mapped(1, "10.0.0.1"), mapped(2, "10.0.0.2")])
            .add_elements(&t, "plain", std::slice::from_ref(&addr));
        let mut nl = Nft::new().unwrap();
        nl.apply(&b).unwrap();
        assert!(nft(&["list", "map", "ip", "cni_test", "timed"]).contains("flags timeout"));
        // What we add has no timeout.
        assert_eq!(
            nl.element(&t, "timed", &key(1)).unwrap(),
            Some(mapped(1, "10.0.0.1"))
        );

        let mut del = Batch::new();
        del.expire_elements(&t, "timed", &[mapped(1, "10.0.0.1")])
            .expire_elements(&t, "plain", std::slice::from_ref(&addr));
        nl.apply(&del).unwrap();
        // The commit returns once the kernel no longer matches the expired element.
        assert_eq!(nl.element(&t, "timed", &key(1)).unwrap(), None);
        assert_eq!(nl.elements(&t, "timed").unwrap(), [mapped(2, "10.0.0.2")]);
        let listed = nft(&["list", "map", "ip", "cni_test", "timed"]);
        assert!(!listed.contains("10.0.0.1"), "{listed}");
        assert!(listed.contains("10.0.0.2"), "{listed}");
        // The set without `flags timeout` had its element deleted instead.
        assert_eq!(nl.elements(&t, "plain").unwrap(), []);
        assert!(!nft(&["list", "set", "ip", "cni_test", "plain"]).contains("10.0.0.9"));

        // Caught while still expiring (another call's DEL between its commit and the end of
        // its wait, or killed there), the element blocks other data at its key (EEXIST); once
        // waited out, the key is free.
        let mut expiring = None;
        for _ in 0..50 {
            let mut put = Batch::new();
            put.add_elements(&t, "timed", &[mapped(3, "10.0.0.3")]);
            nl.apply(&put).unwrap();
            let mut del = Batch::new();
            del.expire_elements(&t, "timed", &[mapped(3, "10.0.0.3")]);
            nl.transact_unsettled(&del, true).unwrap();
            expiring = nl.element(&t, "timed", &key(3)).unwrap();
            if expiring.is_some() {
                break;
            }
            std::thread::sleep(EXPIRY_WAIT_MAX);
        }
        let expiring = expiring.expect("an expired element seen before its tick ended");
        if updates_element_timeouts() {
            assert!(expiring.is_expiring() && expiring.expires <= Some(EXPIRY_WAIT_MAX));
            assert_eq!(nl.element_settled(&t, "timed", &key(3)).unwrap(), None);
        } else {
            // Before 6.5 the kernel accepts the timeout and keeps the element as it was: the
            // deletion `Nft::apply` sends after its lookup is what frees the key there.
            assert_eq!(expiring, mapped(3, "10.0.0.3"));
            let mut del = Batch::new();
            del.expire_elements(&t, "timed", &[mapped(3, "10.0.0.3")]);
            nl.apply(&del).unwrap();
            assert_eq!(nl.element(&t, "timed", &key(3)).unwrap(), None);
        }
        let mut other = Batch::new();
        other.add_elements(&t, "timed", &[mapped(3, "10.0.0.4")]);
        nl.apply(&other).unwrap();
        assert_eq!(
            nl.element(&t, "timed", &key(3)).unwrap(),
            Some(mapped(3, "10.0.0.4"))
        );
        // Settling an element without timeout returns it as it is.
        assert_eq!(
            nl.element_settled(&t, "timed", &key(3)).unwrap(),
            Some(mapped(3, "10.0.0.4"))
        );

        // The key is free: added again, with other data, it stays (no timeout inherited).
        let mut again = Batch::new();
        again.add_elements(&t, "timed", &[mapped(1, "10.0.0.7")]);
        nl.apply(&again).unwrap();
        std::thread::sleep(EXPIRY_WAIT_MAX);
        assert_eq!(
            nl.element(&t, "timed", &key(1)).unwrap(),
            Some(mapped(1, "10.0.0.7"))
        );
        // A fresh handle (no cached set flags) sees the same.
        let mut fresh = Nft::new().unwrap();
        assert_eq!(
            fresh.element(&t, "timed", &key(1)).unwrap(),
            Some(mapped(1, "10.0.0.7"))
        );
        assert_eq!(fresh.elements(&t, "timed").unwrap().len(), 3);
    });
}
