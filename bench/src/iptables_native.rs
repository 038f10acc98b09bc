//! `netfilter::iptables::native` against the `iptables-restore` path it replaces, for portmap's
//! iptables layout: the ADD and DEL of one attachment (2 mappings, 8080/tcp and 53/udp, both
//! families, the shared chains present) with N other attachments of the same layout in the
//! `nat` tables, N of [`Options::scale_sizes`] (the restore path up to
//! [`Options::reference_max_size`]). Both run in this process, so their rows have no peak
//! RSS; each step opens what a plugin call opens (a netlink socket; the tools' execs), and the
//! two alternate within each iteration.
//!
//! - ours `ADD`: [`NativeTables::ensure`] of the skeleton (reads the shared chains) and of the
//!   attachment (creates its chain, rules and recorded entry rules), one commit for both
//!   families. Reference: per family `iptables-save -t nat` and one `iptables-restore
//!   --noflush` of the same rules, as portmap's iptables backend does.
//! - ours `DEL (recorded)`: the entry rules by their recorded handles, then one commit
//!   deleting them and the chain. `DEL (lookup)`: the same without records (an attachment
//!   the Go plugin made), listing `CNI-HOSTPORT-DNAT` for the rules naming the chain.
//!   Reference: per family `iptables-save -t nat` and an `iptables-restore` of `-D`, `-F`,
//!   `-X`.
//!
//! The N others are written natively, a few dozen attachments per transaction.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use harness::iptables_layout::{DNAT, SETMARK, SHARED_CHAINS, skeleton, words};
use harness::netns::TestNetns;
use netfilter::iptables::native::{NativeTables, Recorded, Removal, RuleSpec, Transaction};
use netfilter::iptables::{Family, Iptables, restore_line};

use crate::{Options, Results, Row, Samples};

const SUITE: &str = "iptables-native";
/// Attachments per transaction while installing the others.
const INSTALL_BATCH: usize = 25;
const MEASURED: usize = 0xbe_ef;

/// Attachment `n`: its chain, the chain's rules and its entry rules (recorded), for container
/// address `10.(n/65536).(n/256%256).(n%256)` or `fd00::n`.
pub(crate) fn attachment(family: Family, n: usize) -> (String, Vec<RuleSpec>) {
    let chain = format!("CNI-DN-{n:021x}");
    let (cidr, to) = match family {
        Family::V4 => {
            let ip = format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff);
            (format!("{ip}/32"), ip)
        }
        Family::V6 => {
            let ip = format!("fd00::{n:x}");
            (format!("{ip}/128"), format!("[{ip}]"))
        }
    };
    let mut rules = Vec::new();
    for (proto, port, to_port) in [("tcp", 8080, 80), ("udp", 53, 53)] {
        let base = format!("-p {proto} -m {proto} --dport {port}");
        rules.push(format!("-s {cidr} {base} -j {SETMARK}"));
        if family == Family::V4 {
            rules.push(format!("-s 127.0.0.1/32 {base} -j {SETMARK}"));
        }
        rules.push(format!("{base} -j DNAT --to-destination {to}:{to_port}"));
    }
    let mut specs: Vec<RuleSpec> = rules
        .iter()
        .map(|r| RuleSpec::append(&chain, &words(r)))
        .collect();
    for (proto, port) in [("tcp", 8080), ("udp", 53)] {
        specs.push(RuleSpec::append_recorded(
            DNAT,
            &words(&format!(
                r#"-p {proto} -m comment --comment "dnat name: \"bench\" id: \"{n}\"" -m multiport --dports {port} -j {chain}"#
            )),
        ));
    }
    (chain, specs)
}

/// Adds what the tables lack of the skeleton and of attachment `n`, both families.
fn ensure(tables: &mut NativeTables, tx: &mut Transaction, n: usize) -> Result<()> {
    for family in Family::BOTH {
        tables.ensure(tx, family, &SHARED_CHAINS, &skeleton())?;
        let (chain, specs) = attachment(family, n);
        tables.ensure(tx, family, &[&chain], &specs)?;
    }
    Ok(())
}

/// A native ADD of attachment `n`, as a plugin call makes it.
fn native_add(n: usize) -> Result<Vec<Recorded>> {
    let mut tables = NativeTables::open("nat")?;
    let mut tx = tables.transaction();
    ensure(&mut tables, &mut tx, n)?;
    Ok(tables.commit(&tx)?)
}

/// A native DEL of attachment `n`, by its records or by lookup.
fn native_del(n: usize, recorded: &[Recorded]) -> Result<()> {
    let mut tables = NativeTables::open("nat")?;
    let chains: Vec<(Family, String)> = Family::BOTH
        .iter()
        .map(|f| (*f, attachment(*f, n).0))
        .collect();
    let removals: Vec<Removal> = chains
        .iter()
        .map(|(family, chain)| Removal {
            family: *family,
            from: DNAT,
            chain,
            recorded: recorded.iter().find(|r| r.family == *family),
        })
        .collect();
    tables.remove_chains(&removals)?;
    Ok(())
}

/// The restore path's ADD of attachment `n`: per family, a save and one restore.
fn restore_add(n: usize) -> Result<()> {
    for family in Family::BOTH {
        let ipt = Iptables::new(family);
        let dump = ipt.save("nat")?;
        let (chain, specs) = attachment(family, n);
        if dump.has_chain(&chain) {
            bail!("{chain} exists before its ADD");
        }
        let mut lines = vec![restore_line::<&str>("-N", &chain, &[])?];
        for spec in specs {
            lines.push(restore_line("-A", &spec.chain, &spec.args)?);
        }
        ipt.restore("nat", &lines)?;
    }
    Ok(())
}

/// The restore path's DEL of attachment `n`: per family, a save and one restore.
fn restore_del(n: usize) -> Result<()> {
    for family in Family::BOTH {
        let ipt = Iptables::new(family);
        let dump = ipt.save("nat")?;
        let (chain, _) = attachment(family, n);
        let mut lines = Vec::new();
        for rule in dump.rules(DNAT) {
            if rule.last() == Some(&chain) {
                lines.push(restore_line("-D", DNAT, rule)?);
            }
        }
        lines.push(restore_line::<&str>("-F", &chain, &[])?);
        lines.push(restore_line::<&str>("-X", &chain, &[])?);
        ipt.restore("nat", &lines)?;
    }
    Ok(())
}

/// Installs the skeleton and attachments `0..others`.
fn install(others: usize) -> Result<()> {
    let mut tables = NativeTables::open("nat")?;
    let mut start = 0;
    loop {
        let mut tx = tables.transaction();
        for family in Family::BOTH {
            tables.ensure(&mut tx, family, &SHARED_CHAINS, &skeleton())?;
        }
        for n in start..others.min(start + INSTALL_BATCH) {
            for family in Family::BOTH {
                let (chain, specs) = attachment(family, n);
                tables.ensure(&mut tx, family, &[&chain], &specs)?;
            }
        }
        tables.commit(&tx)?;
        start += INSTALL_BATCH;
        if start >= others {
            return Ok(());
        }
    }
}

fn exists(n: usize) -> Result<bool> {
    let mut tables = NativeTables::open("nat")?;
    Ok(
        tables.chain_exists(Family::V4, &attachment(Family::V4, n).0)?
            && tables.chain_exists(Family::V6, &attachment(Family::V6, n).0)?,
    )
}

/// Runs the suite.
///
/// # Errors
/// When a namespace, the install or any timed step fails.
pub fn run(options: &Options) -> Result<Results> {
    let mut rows = Vec::new();
    for others in options.scale_sizes(SUITE) {
        let ns = TestNetns::new("bench-iptnative")?;
        ns.run(|| install(others))??;
        let with_reference = others <= options.reference_max_size;
        let (mut add, mut del_recorded, mut del_lookup): (Samples, Samples, Samples) =
            Default::default();
        let (mut restore_adds, mut restore_dels): (Samples, Samples) = Default::default();
        ns.run(|| -> Result<()> {
            let step = |samples: &mut Samples, f: &dyn Fn() -> Result<()>| -> Result<()> {
                let started = Instant::now();
                f()?;
                samples.push_time(started.elapsed());
                Ok(())
            };
            let added = |want: bool| -> Result<()> {
                if exists(MEASURED)? != want {
                    bail!("attachment present: {}, expected {want}", !want);
                }
                Ok(())
            };
            for _ in 0..options.scale_iterations() {
                let started = Instant::now();
                let recorded = native_add(MEASURED)?;
                add.push_time(started.elapsed());
                added(true)?;
                step(&mut del_recorded, &|| native_del(MEASURED, &recorded))?;
                added(false)?;
                native_add(MEASURED)?;
                step(&mut del_lookup, &|| native_del(MEASURED, &[]))?;
                added(false)?;
                if with_reference {
                    step(&mut restore_adds, &|| restore_add(MEASURED))?;
                    added(true)?;
                    step(&mut restore_dels, &|| restore_del(MEASURED))?;
                    added(false)?;
                }
            }
            Ok(())
        })
        .context("timing")??;
        let case = format!("2 mappings, both families, {others} others");
        let row = |step: &str, ours: Samples, reference: &Samples| Row {
            suite: SUITE.to_owned(),
            case: case.clone(),
            step: step.to_owned(),
            ours,
            reference: reference.clone(),
            reference_label: "iptables-save + iptables-restore".to_owned(),
        };
        rows.push(row("ADD", add, &restore_adds));
        rows.push(row("DEL (recorded)", del_recorded, &restore_dels));
        rows.push(row("DEL (lookup)", del_lookup, &restore_dels));
    }
    Ok(rows.into())
}
