//! `common::nft` against the `nft` binary: one batch adding a map element and a rule to an
//! existing table, over netlink versus `nft -f -` doing the same, interleaved in one run. The
//! `nft` exec is timed like a plugin's ([`super::run_exec`]); ours runs in this process, so its
//! rows have no peak RSS.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use common::nft::{
    Batch, Chain, ChainHook, ChainType, DataType as T, Element, Family, L4Proto, NfProto, Nft,
    Rule, Selector, Set, Table, Value, priority,
};

use super::{Exec, Options, Results, Row, Samples, time_exec};
use crate::netns::TestNetns;

const TABLE: &str = "cni_bench";
const CTR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// The element and rule our batch adds for `port`.
fn our_batch(t: &Table, port: u16) -> Batch {
    let mut b = Batch::new();
    b.add_elements(
        t,
        "ports",
        &[Element::new([L4Proto::Tcp.into(), Value::Port(port)])
            .to([CTR.into(), Value::Port(80)])
            .comment("bench/ctr/eth0")],
    )
    .add_rule(
        t,
        "hostports",
        &Rule::new()
            .daddr(Ipv4Addr::new(10, 9, 0, 1))
            .dport(L4Proto::Tcp, port)
            .dnat_to(CTR.into(), Some(80))
            .comment("bench/ctr/eth0"),
    );
    b
}

/// The same as `nft` text.
fn nft_script(port: u16) -> String {
    format!(
        "add element ip {TABLE} ports {{ tcp . {port} comment \"bench/ctr/eth0\" : {CTR} . 80 }}\n\
         add rule ip {TABLE} hostports ip daddr 10.9.0.1 tcp dport {port} dnat to {CTR}:80 comment \"bench/ctr/eth0\"\n"
    )
}

/// Runs the suite.
///
/// # Errors
/// When the namespace, the skeleton or any timed step fails.
pub fn run(options: &Options) -> Result<Results> {
    let ns = TestNetns::new("bench-nft")?;
    let netns = ns.netns()?;
    let t = Table::new(Family::Ip, TABLE);
    let mut skeleton = Batch::new();
    skeleton
        .add_table(&t)
        .add_set(
            &t,
            &Set::map(
                "ports",
                &[T::InetProto, T::InetService],
                &[T::Ipv4Addr, T::InetService],
            ),
        )
        .add_chain(&t, &Chain::regular("hostports"))
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
            "hostports",
            &Rule::new().dnat_map(
                NfProto::Ipv4,
                &[Selector::MetaL4proto, Selector::ThDport],
                "ports",
            ),
        );
    let mut nft = Nft::open_in(&netns)?;
    nft.apply(&skeleton)?;

    let mut apply = Samples::default();
    let mut open_apply = Samples::default();
    let mut exec = Samples::default();
    let n = u16::try_from(options.iterations.min(10_000)).unwrap_or(10_000);
    for i in 0..n {
        // Distinct ports per step, so every step really adds something.
        let batch = our_batch(&t, 10_000 + i);
        let started = Instant::now();
        nft.apply(&batch)?;
        apply.push_time(started.elapsed());

        let nft_f = Exec {
            binary: PathBuf::from("nft"),
            args: vec!["-f".to_owned(), "-".to_owned()],
            env: Vec::new(),
            stdin: nft_script(30_000 + i).into_bytes(),
        };
        let sample = time_exec(&netns, &nft_f)?.sample();
        exec.push(sample);

        // A plugin call opens its socket too: time that path as well.
        let batch = our_batch(&t, 20_000 + i);
        let elapsed = netns.run(|| -> Result<_> {
            let started = Instant::now();
            let mut fresh = Nft::new()?;
            fresh.apply(&batch)?;
            Ok(started.elapsed())
        })??;
        open_apply.push_time(elapsed);
    }
    // Every step landed: 3 elements and 3 rules per iteration, plus the skeleton's rule.
    let elements = nft.elements(&t, "ports")?.len();
    let rules = nft.rules(&t, "hostports")?.len();
    let want = 3 * usize::from(n);
    if elements != want || rules != want + 1 {
        bail!(
            "expected {want} elements and {} rules, found {elements} and {rules}",
            want + 1
        );
    }
    let row = |step: &str, ours: Samples| Row {
        suite: "nft".to_owned(),
        case: "1 map element + 1 rule into an existing table".to_owned(),
        step: step.to_owned(),
        ours,
        reference: exec.clone(),
        reference_label: "nft -f".to_owned(),
    };
    Ok(vec![
        row("batch over netlink", apply),
        row("open socket + batch", open_apply),
    ]
    .into())
}
