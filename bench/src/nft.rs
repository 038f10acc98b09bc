//! `netfilter::nft` against the `nft` binary: one batch adding a map element and a rule to an
//! existing table, over netlink versus `nft -f -` doing the same, interleaved in one run. The
//! `nft` exec is timed like a plugin's ([`crate::run_exec`]); ours runs in this process, so its
//! rows have no peak RSS.
//!
//! Then maps of [`MAP_SIZES`] elements with portmap-sized owner comments, as portmap's and the
//! firewall's grow with the attachments: listing one (against `nft list map`), getting one
//! element by key (against `nft get element`), and the two listing paths of the plugins, timed
//! as a plugin call pays them, from opening the socket to its close (which waits for the kernel
//! to free what was deleted, see `netfilter::nft`): a DEL without state (list, delete the two
//! elements of one owner; `nft` is given the two keys) and a GC (list, delete every element;
//! `nft` flushes the map). The plugins find what to delete by the owner in the comments,
//! which only a listing shows.

use std::net::Ipv4Addr;
use std::time::Instant;

use anyhow::{Result, bail};
use harness::netns::TestNetns;
use netfilter::nft::{
    Batch, DataType as T, Element, Family, L4Proto, Nft, Rule, Set, Table, Value,
};

use crate::{Exec, Options, Results, Row, Samples, time_exec};

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
    let skeleton = netfilter::nft::fixtures::hostport_table(&t);
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

        let nft_f = Exec::tool("nft", &["-f", "-"], nft_script(30_000 + i).into_bytes());
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
    // Every step landed: 3 elements and 3 rules per iteration, plus the skeleton's two rules.
    let elements = nft.elements(&t, "ports")?.len();
    let rules = nft.rules(&t, "hostports")?.len();
    let want = 3 * usize::from(n);
    if elements != want || rules != want + 2 {
        bail!(
            "expected {want} elements and {} rules, found {elements} and {rules}",
            want + 2
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
    let mut rows = vec![
        row("batch over netlink", apply),
        row("open socket + batch", open_apply),
    ];
    for size in MAP_SIZES {
        rows.extend(map_rows(options, &netns, size)?);
    }
    Ok(rows.into())
}

/// The sizes of the maps listed.
pub const MAP_SIZES: [u16; 3] = [500, 4_000, 16_000];
/// Timed repetitions per map size at most: a GC step re-adds the whole map before each.
const MAP_ITERATIONS: usize = 10;
/// The table of the maps.
const BIG_TABLE: &str = "cni_bench_big";

/// Element `port` of a map owned by `owner`, its comment as long as portmap's.
fn owned(port: u16, owner: &str) -> Element {
    Element::new([L4Proto::Tcp.into(), Value::Port(port)])
        .to([CTR.into(), Value::Port(80)])
        .comment(&format!("{owner}/{:064x}/eth0", u64::from(port)))
}

/// Adds elements `1..=size` of owner `gc` to map `big`.
fn fill(size: u16) -> Batch {
    let t = Table::new(Family::Ip, BIG_TABLE);
    let elements: Vec<Element> = (1..=size).map(|p| owned(p, "gc")).collect();
    let mut b = Batch::new();
    b.add_elements(&t, "big", &elements);
    b
}

/// In the namespace: opens a socket, lists map `big`, deletes the elements whose owner
/// `doomed` accepts, closes the socket; the time of it all and the number deleted.
fn delete_listed(doomed: &dyn Fn(&str) -> bool) -> Result<(std::time::Duration, usize)> {
    let t = Table::new(Family::Ip, BIG_TABLE);
    crate::wait_for_nf_tables_frees()?;
    let started = Instant::now();
    let mut nft = Nft::new()?;
    let keys: Vec<Vec<Value>> = nft
        .elements(&t, "big")?
        .into_iter()
        .filter(|e| e.comment.as_deref().is_some_and(doomed))
        .map(|e| e.key)
        .collect();
    let mut b = Batch::new();
    b.delete_elements(&t, "big", &keys);
    nft.apply(&b)?;
    drop(nft);
    Ok((started.elapsed(), keys.len()))
}

/// The rows of a map of `size` elements.
fn map_rows(options: &Options, netns: &host::netns::NetNs, size: u16) -> Result<Vec<Row>> {
    let t = Table::new(Family::Ip, BIG_TABLE);
    let mut nft = Nft::open_in(netns)?;
    let mut setup = Batch::new();
    setup.add_table(&t).add_set(
        &t,
        &Set::map(
            "big",
            &[T::InetProto, T::InetService],
            &[T::Ipv4Addr, T::InetService],
        ),
    );
    nft.apply(&setup)?;
    nft.apply(&fill(size))?;
    let nft_exec = |args: &str| Exec::tool("nft", &args.split(' ').collect::<Vec<_>>(), Vec::new());
    let list_exec = nft_exec(&format!("list map ip {BIG_TABLE} big"));
    let get_exec = nft_exec(&format!("get element ip {BIG_TABLE} big {{ tcp . 7 }}"));
    let del_exec = nft_exec(&format!(
        "delete element ip {BIG_TABLE} big {{ tcp . 60000, tcp . 60001 }}"
    ));
    let flush_exec = nft_exec(&format!("flush map ip {BIG_TABLE} big"));
    let probe = owned(7, "gc");
    let (mut list, mut list_ref) = (Samples::default(), Samples::default());
    let (mut get, mut get_ref) = (Samples::default(), Samples::default());
    let (mut del, mut del_ref) = (Samples::default(), Samples::default());
    let (mut gc, mut gc_ref) = (Samples::default(), Samples::default());
    for _ in 0..options.iterations.clamp(1, MAP_ITERATIONS) {
        let started = Instant::now();
        let listed = nft.elements(&t, "big")?;
        list.push_time(started.elapsed());
        if listed.len() != usize::from(size) {
            bail!("listed {} elements of {size}", listed.len());
        }
        list_ref.push(time_exec(netns, &list_exec)?.sample());

        let started = Instant::now();
        let found = nft.element(&t, "big", &probe.key)?;
        get.push_time(started.elapsed());
        if found.as_ref() != Some(&probe) {
            bail!("element tcp . 7 not found: {found:?}");
        }
        get_ref.push(time_exec(netns, &get_exec)?.sample());

        // One attachment's two elements among the others, deleted by owner; `nft` is told
        // the keys.
        let two = [owned(60_000, "del"), owned(60_001, "del")];
        let mut add_two = Batch::new();
        add_two.add_elements(&t, "big", &two);
        nft.apply(&add_two)?;
        let (elapsed, deleted) = netns.run(|| delete_listed(&|c| c.starts_with("del/")))??;
        if deleted != 2 {
            bail!("deleted {deleted} elements of owner del, not 2");
        }
        del.push_time(elapsed);
        nft.apply(&add_two)?;
        del_ref.push(time_exec(netns, &del_exec)?.sample());

        // Every element, by owner; `nft` flushes the map.
        let (elapsed, deleted) = netns.run(|| delete_listed(&|c| c.starts_with("gc/")))??;
        if deleted != usize::from(size) {
            bail!("GC deleted {deleted} elements of {size}");
        }
        gc.push_time(elapsed);
        nft.apply(&fill(size))?;
        gc_ref.push(time_exec(netns, &flush_exec)?.sample());
        nft.apply(&fill(size))?;
    }
    let mut drop_table = Batch::new();
    drop_table.delete_table(&t);
    nft.apply(&drop_table)?;
    let case = format!("map of {size} elements");
    let row = |step: &str, ours: Samples, reference: Samples, label: &str| Row {
        suite: "nft".to_owned(),
        case: case.clone(),
        step: step.to_owned(),
        ours,
        reference,
        reference_label: label.to_owned(),
    };
    Ok(vec![
        row("list", list, list_ref, "nft list map"),
        row("get 1 element by key", get, get_ref, "nft get element"),
        row(
            "open, list, delete 1 owner's 2, close (DEL without state)",
            del,
            del_ref,
            "nft delete element (keys given)",
        ),
        row(
            "open, list, delete all, close (GC)",
            gc,
            gc_ref,
            "nft flush map",
        ),
    ])
}
