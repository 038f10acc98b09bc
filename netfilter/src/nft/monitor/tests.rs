//! Decoding and grouping from bytes, the debounce, and kernel tests in fresh namespaces.

use std::process::Command;
use std::time::{Duration, Instant};

use super::*;
use crate::nft::{Batch, Chain, ChainHook, ChainType, DataType, Nft, Rule, Set, Table};

// ---------------------------------------------------------------------------------------------
// Bytes: messages built as the kernel lays them out.

/// A netlink attribute (padded to 4 bytes).
fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = u16::try_from(4 + value.len()).unwrap();
    let mut out = [len.to_ne_bytes(), kind.to_ne_bytes()].concat();
    out.extend_from_slice(value);
    out.resize((out.len() + 3) & !3, 0);
    out
}

fn name(kind: u16, s: &str) -> Vec<u8> {
    attr(kind, format!("{s}\0").as_bytes())
}

/// An nf_tables message: `msg` (`NFT_MSG_*`), the family, the generation's low bits, the
/// sending socket's port id and the attributes.
fn message(msg: u16, family: u8, generation: u32, port: u32, attrs: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = attrs.concat();
    let len = u32::try_from(16 + 4 + body.len()).unwrap();
    let mut out = Vec::new();
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
    out.extend_from_slice(&0u16.to_ne_bytes());
    out.extend_from_slice(&7u32.to_ne_bytes());
    out.extend_from_slice(&port.to_ne_bytes());
    out.push(family);
    out.push(0);
    out.extend_from_slice(&u16::try_from(generation & 0xffff).unwrap().to_be_bytes());
    out.extend_from_slice(&body);
    out
}

fn del_rule(generation: u32, table: &str, chain: &str, handle: u64) -> Vec<u8> {
    message(
        8,
        2,
        generation,
        4242,
        &[
            name(1, table),
            name(2, chain),
            attr(3, &handle.to_be_bytes()),
        ],
    )
}

fn del_table(generation: u32, table: &str) -> Vec<u8> {
    message(
        2,
        1,
        generation,
        4242,
        &[name(1, table), attr(4, &9u64.to_be_bytes())],
    )
}

fn new_gen(generation: u32, pid: u32, comm: &str) -> Vec<u8> {
    message(
        NFT_MSG_NEWGEN,
        0,
        generation,
        4242,
        &[
            attr(NFTA_GEN_ID, &generation.to_be_bytes()),
            attr(NFTA_GEN_PROC_PID, &pid.to_be_bytes()),
            name(NFTA_GEN_PROC_NAME, comm),
        ],
    )
}

/// A monitor that is never read from the kernel: datagrams are fed by hand.
fn offline() -> Monitor {
    host::netns::in_new_netns(Monitor::new)
        .expect("a fresh network namespace needs root")
        .expect("an nf_tables monitor")
}

fn drain(monitor: &mut Monitor) -> Vec<Report> {
    monitor.ready.drain(..).collect()
}

fn transaction(report: &Report) -> &Transaction {
    match report {
        Report::Transaction(t) => t,
        Report::Lost => panic!("a transaction, not {report:?}"),
    }
}

#[test]
fn events_are_grouped_until_their_generation_closes_them_with_pid_and_name() {
    let mut m = offline();
    let now = Instant::now();
    let datagram = [
        del_rule(70_001, "cni", "fwd", 5),
        del_table(70_001, "cni"),
        new_gen(70_001, 1234, "nft"),
    ]
    .concat();
    m.read_datagram(&datagram, now);
    let reports = drain(&mut m);
    assert_eq!(reports.len(), 1, "{reports:?}");
    let t = transaction(&reports[0]);
    assert_eq!(t.generation, Some(70_001));
    assert_eq!(t.pid, Some(1234));
    assert_eq!(t.process.as_deref(), Some("nft"));
    assert_eq!(t.port_id, Some(4242));
    assert_eq!(
        t.events,
        vec![
            Event {
                kind: ObjectKind::Rule,
                change: Change::Deleted,
                family_code: 2,
                table: "cni".into(),
                chain: Some("fwd".into()),
                name: None,
                handle: Some(5),
                generation16: (70_001u32 & 0xffff) as u16,
            },
            Event {
                kind: ObjectKind::Table,
                change: Change::Deleted,
                family_code: 1,
                table: "cni".into(),
                chain: None,
                name: None,
                handle: Some(9),
                generation16: (70_001u32 & 0xffff) as u16,
            },
        ]
    );
    assert!(t.deletes_in(&Table::new(Family::Inet, "cni")));
    assert!(!t.deletes_in(&Table::new(Family::Ip, "other")));
}

#[test]
fn a_transaction_split_across_datagrams_is_returned_once_complete() {
    let mut m = offline();
    let now = Instant::now();
    m.read_datagram(&del_rule(8, "t", "c", 1), now);
    assert!(drain(&mut m).is_empty(), "no NEWGEN yet");
    m.read_datagram(
        &[del_rule(8, "t", "c", 2), new_gen(8, 1, "x")].concat(),
        now,
    );
    let reports = drain(&mut m);
    assert_eq!(reports.len(), 1);
    assert_eq!(transaction(&reports[0]).events.len(), 2);
}

#[test]
fn events_whose_generation_never_closed_are_reported_apart_without_an_author() {
    let mut m = offline();
    let now = Instant::now();
    // Generation 3's NEWGEN was lost; generation 4 follows.
    let datagram = [
        del_rule(3, "t", "c", 1),
        del_rule(4, "t", "c", 2),
        new_gen(4, 99, "iptables-nft-re"),
    ]
    .concat();
    m.read_datagram(&datagram, now);
    let reports = drain(&mut m);
    assert_eq!(reports.len(), 2, "{reports:?}");
    let (lost, closed) = (transaction(&reports[0]), transaction(&reports[1]));
    assert_eq!((lost.generation, lost.pid), (None, None));
    assert_eq!(lost.events[0].handle, Some(1));
    assert_eq!(closed.generation, Some(4));
    assert_eq!(closed.events.len(), 1);
    assert_eq!(closed.events[0].handle, Some(2));

    // And a NEWGEN of another generation than the pending events'.
    m.read_datagram(
        &[del_rule(5, "t", "c", 3), new_gen(6, 7, "nft")].concat(),
        now,
    );
    let reports = drain(&mut m);
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert_eq!(transaction(&reports[0]).generation, None);
    assert_eq!(transaction(&reports[1]).generation, Some(6));
    assert!(transaction(&reports[1]).events.is_empty());
}

#[test]
fn every_object_kind_decodes_with_its_names_and_unknown_messages_are_skipped() {
    use {Change::*, ObjectKind::*};
    // NFT_MSG_*, what it is, and the attributes of its chain's and its own name.
    let cases = [
        (0, Table, New, None, None),
        (26, Table, Deleted, None, None),
        (3, Chain, New, Some(3), None),
        (5, Chain, Deleted, Some(3), None),
        (27, Chain, Deleted, Some(3), None),
        (6, Rule, New, Some(2), None),
        (8, Rule, Deleted, Some(2), None),
        (9, Set, New, None, Some(2)),
        (11, Set, Deleted, None, Some(2)),
        (12, SetElement, New, None, Some(2)),
        (14, SetElement, Deleted, None, Some(2)),
        (30, SetElement, Deleted, None, Some(2)),
        (18, Object, New, None, Some(2)),
        (20, Object, Deleted, None, Some(2)),
        (22, Flowtable, New, None, Some(2)),
        (32, Flowtable, Deleted, None, Some(2)),
    ];
    let mut m = offline();
    for (msg, kind, change, chain, object) in cases {
        let mut attrs = vec![name(1, "t")];
        attrs.extend(chain.map(|k| name(k, "c")));
        attrs.extend(object.map(|k| name(k, "o")));
        let datagram = [
            message(msg, 10, 1, 1, &attrs),
            // A GETTABLE is not an event.
            message(1, 10, 1, 1, &[name(1, "t")]),
            new_gen(1, 1, "x"),
        ]
        .concat();
        m.read_datagram(&datagram, Instant::now());
        let reports = drain(&mut m);
        let t = transaction(&reports[0]);
        assert_eq!(t.events.len(), 1, "message {msg}: {t:?}");
        let e = &t.events[0];
        assert_eq!((e.kind, e.change), (kind, change), "message {msg}");
        assert_eq!(e.table, "t");
        assert_eq!(e.family(), Some(Family::Ip6));
        assert_eq!(e.chain.as_deref(), chain.map(|_| "c"), "message {msg}");
        assert_eq!(e.name.as_deref(), object.map(|_| "o"), "message {msg}");
    }
}

#[test]
fn a_malformed_message_ends_the_datagram_as_lost_events() {
    let mut m = offline();
    let mut datagram = del_rule(1, "t", "c", 1);
    // Its length claims more than the datagram holds.
    datagram[0..4].copy_from_slice(&4096u32.to_ne_bytes());
    m.read_datagram(&datagram, Instant::now());
    assert_eq!(drain(&mut m), vec![Report::Lost]);
}

// ---------------------------------------------------------------------------------------------
// The debounce.

#[test]
fn the_debounce_fires_after_the_quiet_interval_but_never_later_than_the_max_delay() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let quiet = ms(100);
    let max = ms(1000);
    // (event offsets in ms, expected fire offset in ms)
    let cases: &[(&[u64], Option<u64>)] = &[
        (&[], None),
        (&[0], Some(100)),
        (&[0, 50, 90], Some(190)),
        (&[90, 0, 50], Some(190)),
        // A steady stream: every 50 ms for 2 s still fires at the max delay.
        (&[0, 50, 100, 150, 200, 950, 1000, 1050], Some(1000)),
        (&[500, 700], Some(800)),
    ];
    for (offsets, want) in cases {
        let times: Vec<Instant> = offsets.iter().map(|o| t0 + ms(*o)).collect();
        let want = want.map(|o| t0 + ms(o));
        assert_eq!(Debounce::fire_at(quiet, max, &times), want, "{offsets:?}");
        let mut d = Debounce::new(quiet, max);
        for t in &times {
            d.note(*t);
        }
        assert_eq!(d.deadline(), want, "{offsets:?}");
    }
}

#[test]
fn the_debounce_waits_fires_once_and_starts_over() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut d = Debounce::new(ms(100), ms(1000));
    assert_eq!(d.wait(t0), None, "nothing noted: wait for ever");
    assert!(!d.fire(t0));
    d.note(t0);
    assert_eq!(d.wait(t0 + ms(30)), Some(ms(70)));
    assert!(!d.fire(t0 + ms(99)));
    d.note(t0 + ms(60));
    assert!(!d.fire(t0 + ms(100)), "the later event moved the deadline");
    assert_eq!(d.wait(t0 + ms(200)), Some(Duration::ZERO));
    assert!(d.fire(t0 + ms(160)));
    assert!(!d.fire(t0 + ms(5000)), "fired once: forgotten");
    assert_eq!(d.deadline(), None);
    d.note(t0 + ms(6000));
    assert_eq!(d.deadline(), Some(t0 + ms(6100)));
}

// ---------------------------------------------------------------------------------------------
// Kernel tests, each in a fresh network namespace.

fn in_fresh_netns<T: Send>(body: impl FnOnce() -> T + Send) -> T {
    host::netns::in_new_netns(body).expect("a fresh network namespace needs root")
}

/// Runs `nft ARGS` in the calling thread's namespace and returns its pid.
fn nft(args: &[&str]) -> u32 {
    let mut child = Command::new("nft").args(args).spawn().unwrap();
    let pid = child.id();
    let status = child.wait().unwrap();
    assert!(status.success(), "nft {args:?}: {status}");
    pid
}

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

/// The next transaction (not [`Report::Lost`]) within [`WAIT`].
fn next_transaction(m: &mut Monitor) -> Transaction {
    match m.next(WAIT).unwrap() {
        Some(Report::Transaction(t)) => t,
        other => panic!("a transaction, not {other:?}"),
    }
}

/// `table ip t`: a base chain with a rule, a regular chain, a set with an element.
fn layout() -> (Table, Batch) {
    let t = Table::new(Family::Ip, "t");
    let mut b = Batch::new();
    b.add_table(&t)
        .add_chain(
            &t,
            &Chain::base("input", ChainType::Filter, ChainHook::Input, 0),
        )
        .add_chain(&t, &Chain::regular("c"))
        .add_rule(&t, "input", &Rule::new().counter().jump("c"))
        .add_set(&t, &Set::new("s", &[DataType::InetService]))
        .add_elements(
            &t,
            "s",
            &[crate::nft::Element::new([crate::nft::Value::Port(80)])],
        );
    (t, b)
}

fn kinds(t: &Transaction) -> Vec<(ObjectKind, Change, Option<&str>, Option<&str>)> {
    t.events
        .iter()
        .map(|e| (e.kind, e.change, e.chain.as_deref(), e.name.as_deref()))
        .collect()
}

#[test]
fn our_transactions_are_ours_and_a_table_deleted_by_nft_names_nft_and_its_pid() {
    in_fresh_netns(|| {
        let mut monitor = Monitor::new().unwrap();
        assert!(monitor.set_receive_buffer(RECEIVE_BUFFER).unwrap() >= RECEIVE_BUFFER);
        let mut nft_handle = Nft::new().unwrap();
        let (t, batch) = layout();
        nft_handle.apply(&batch).unwrap();

        let ours = next_transaction(&mut monitor);
        assert!(ours.is_by_this_process(), "{ours:?}");
        assert_eq!(
            ours.pid,
            Some(nix::unistd::gettid().as_raw().cast_unsigned())
        );
        // The committing thread's comm: `in_new_netns` names its thread.
        assert_eq!(ours.process.as_deref(), Some("new-netns"));
        assert_eq!(ours.port_id, Some(port_id(&nft_handle).unwrap()));
        assert_ne!(ours.port_id, Some(monitor.port_id().unwrap()));
        use {Change::New, ObjectKind::*};
        assert_eq!(
            kinds(&ours),
            vec![
                (Table, New, None, None),
                (Chain, New, Some("input"), None),
                (Chain, New, Some("c"), None),
                (Rule, New, Some("input"), None),
                (Set, New, None, Some("s")),
                (SetElement, New, None, Some("s")),
            ]
        );
        assert_eq!(ours.deletions().count(), 0);
        assert!(ours.events.iter().all(|e| e.is_in(&t)));

        let pid = nft(&["delete", "table", "ip", "t"]);
        let theirs = next_transaction(&mut monitor);
        assert!(!theirs.is_by_this_process(), "{theirs:?}");
        assert_eq!(theirs.pid, Some(pid));
        assert_eq!(theirs.process.as_deref(), Some("nft"));
        assert_ne!(theirs.port_id, ours.port_id);
        assert_eq!(theirs.generation, ours.generation.map(|g| g + 1));
        assert!(theirs.deletes_in(&t));
        use Change::Deleted;
        let mut seen = kinds(&theirs);
        seen.sort_by_key(|k| format!("{k:?}"));
        let mut want = vec![
            (Rule, Deleted, Some("input"), None),
            (Set, Deleted, None, Some("s")),
            (Chain, Deleted, Some("input"), None),
            (Chain, Deleted, Some("c"), None),
            (Table, Deleted, None, None),
        ];
        want.sort_by_key(|k| format!("{k:?}"));
        assert_eq!(seen, want, "the table's objects, without element events");
        assert_eq!(
            theirs.events.last().map(|e| e.kind),
            Some(Table),
            "the table goes last"
        );
        assert_eq!(monitor.next(Some(Duration::from_millis(50))).unwrap(), None);
    });
}

#[test]
fn a_flush_of_the_ruleset_reports_every_table_of_every_family() {
    in_fresh_netns(|| {
        let mut monitor = Monitor::new().unwrap();
        nft(&[
            "add table ip a; add chain ip a c; add table ip6 b; add table inet c; \
             add chain inet c x { type filter hook forward priority 0; }",
        ]);
        let added = next_transaction(&mut monitor);
        assert_eq!(added.events.len(), 5, "{added:?}");
        nft(&["flush", "ruleset"]);
        let flushed = next_transaction(&mut monitor);
        let mut tables: Vec<(Option<Family>, &str)> = flushed
            .deletions()
            .filter(|e| e.kind == ObjectKind::Table)
            .map(|e| (e.family(), e.table.as_str()))
            .collect();
        tables.sort_by_key(|(_, name)| *name);
        assert_eq!(
            tables,
            vec![
                (Some(Family::Ip), "a"),
                (Some(Family::Ip6), "b"),
                (Some(Family::Inet), "c"),
            ]
        );
        assert_eq!(flushed.deletions().count(), 5);
    });
}

#[test]
fn a_monitor_sees_only_its_own_namespace() {
    in_fresh_netns(|| {
        let mut monitor = Monitor::new().unwrap();
        in_fresh_netns(|| nft(&["add", "table", "ip", "elsewhere"]));
        assert_eq!(
            monitor.next(Some(Duration::from_millis(200))).unwrap(),
            None
        );
        // Opened from another thread into this namespace, it sees this one's.
        let here = host::netns::NetNs::current().unwrap();
        let mut other = Monitor::open_in(&here).unwrap();
        nft(&["add", "table", "ip", "here"]);
        for m in [&mut monitor, &mut other] {
            let t = next_transaction(m);
            assert_eq!(t.events[0].table, "here");
        }
    });
}

#[test]
fn an_overrun_receive_buffer_reports_lost_events_and_the_monitor_goes_on() {
    in_fresh_netns(|| {
        let mut monitor = Monitor::new().unwrap();
        // The smallest buffer the kernel allows: a few kilobytes.
        let small = monitor.set_receive_buffer(0).unwrap();
        assert!(small < 16 * 1024, "{small}");
        let t = Table::new(Family::Ip, "big");
        let mut batch = Batch::new();
        batch.add_table(&t).add_chain(&t, &Chain::regular("c"));
        for i in 0..500 {
            batch.add_rule(
                &t,
                "c",
                &Rule::new().counter().comment(&format!("rule {i}")),
            );
        }
        Nft::new().unwrap().apply(&batch).unwrap();

        let mut reports = Vec::new();
        while let Some(report) = monitor.next(Some(Duration::from_millis(200))).unwrap() {
            reports.push(report);
        }
        assert!(reports.contains(&Report::Lost), "{reports:?}");
        let seen: usize = reports
            .iter()
            .filter_map(|r| match r {
                Report::Transaction(t) => Some(t.events.len()),
                Report::Lost => None,
            })
            .sum();
        assert!(seen < 502, "{seen} events of 502 fit a small buffer");

        monitor.set_receive_buffer(RECEIVE_BUFFER).unwrap();
        let pid = nft(&["delete", "table", "ip", "big"]);
        // Events of the overrun transaction whose NEWGEN was dropped come first, on their
        // own, once the deletion's show that their generation ended.
        let deleted = loop {
            let t = next_transaction(&mut monitor);
            if t.generation.is_some() {
                break t;
            }
            assert!(t.pid.is_none() && t.port_id.is_none(), "{t:?}");
            assert!(t.events.iter().all(|e| e.change == Change::New), "{t:?}");
        };
        assert_eq!(deleted.pid, Some(pid));
        assert_eq!(deleted.deletions().count(), 502);
    });
}

#[test]
fn a_zero_timeout_reads_what_is_queued_without_waiting_and_commits_are_noted_by_port_id() {
    in_fresh_netns(|| {
        let mut monitor = Monitor::new().unwrap();
        assert_eq!(monitor.next(Some(Duration::ZERO)).unwrap(), None);
        crate::nft::committers::start();
        let mut handle = Nft::new().unwrap();
        let (_, batch) = layout();
        handle.apply(&batch).unwrap();
        nft(&["delete", "table", "ip", "t"]);
        // Both transactions are queued before the commits return: read without waiting.
        let ours = match monitor.next(Some(Duration::ZERO)).unwrap() {
            Some(Report::Transaction(t)) => t,
            other => panic!("our transaction, not {other:?}"),
        };
        let theirs = match monitor.next(Some(Duration::ZERO)).unwrap() {
            Some(Report::Transaction(t)) => t,
            other => panic!("nft's transaction, not {other:?}"),
        };
        assert_eq!(monitor.next(Some(Duration::ZERO)).unwrap(), None);
        // Other tests of this process may commit meanwhile: ours is among those noted, nft's
        // (another process) is not.
        let noted = crate::nft::committers::take();
        assert!(noted.contains(&ours.port_id.unwrap()), "{noted:?} {ours:?}");
        assert!(!noted.contains(&theirs.port_id.unwrap()), "{noted:?}");
        assert_eq!(theirs.process.as_deref(), Some("nft"));
    });
}
