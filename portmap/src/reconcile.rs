//! `portmap reconcile`: puts back what something else removed of the live attachments'
//! mappings (`firewall-cmd --reload`, `systemctl restart nftables`, `nft flush ruleset`,
//! `iptables -t nat -F`, an `iptables-restore` of an older save), from the records every ADD
//! keeps ([`crate::state`]).
//!
//! Run by an operator or a unit as root in the namespace the plugin runs in (the host's), it
//! holds our iptables lock (so no ADD or DEL of that layout interleaves) and:
//!
//! 1. reads every record of the namespace;
//! 2. proves, with one dump of the namespace ids
//!    ([`NetnsId::gone_by_id`](netlink::census::NetnsId::gone_by_id)), which owners'
//!    namespaces are gone, and removes those attachments as DEL would (objects, index entries
//!    and record);
//! 3. asks each layout what is missing of all its attachments at once, with one read of its
//!    own objects and nothing written (the nftables layout: `Nftables::lacking`, the table,
//!    each map and set and the skeleton's chains listed once per family; the iptables layout:
//!    `Iptables::lacking`, table `nat` read once per family by the writer); an attachment
//!    found lacking is first proven alive or gone in full
//!    ([`NetnsId::is_gone`](netlink::census::NetnsId::is_gone): a dead one is removed, never
//!    brought back);
//! 4. has each layout put back what is missing of the live ones and of the shared objects,
//!    in one transaction (one per family with the iptables tools), adding nothing that is
//!    there and touching no other program's objects. Unlike ADD, it flushes no conntrack
//!    entries: the mappings are the ones the entries were made through.
//!
//! It prints one line per attachment restored or removed and a summary; with nothing missing
//! and nobody gone it writes nothing at all. Exit status 0 on success, 1 when something could
//! not be restored or read (with the reason on stderr).

use std::cell::OnceCell;
use std::collections::HashSet;
use std::io::Write;

use cni::operator::{OperatorCommand, OperatorError};
pub use cni::reconcile::Report;
use cni::reconcile::who;
use host::store::StateStore;
use netfilter::nft::LazyNft;
use netlink::Netlink;
use netlink::census::Census;

use crate::backend::iptables::{self, Iptables};
use crate::backend::nftables::Nftables;
use crate::backend::{Lacking, PortmapBackend};
use crate::config::{Backend, IpFamily};
use crate::error::PortmapError;
use crate::ports;
use crate::state::{self, State};

/// The command, as `portmap --help` lists it.
pub const COMMAND: OperatorCommand = OperatorCommand {
    name: "reconcile",
    options: "[--watch]",
    summary: "put back what is missing of every live attachment's port mappings",
    help: "Puts back what something else removed of the port mappings of the live \
attachments of this network namespace (firewall-cmd --reload, a restart of nftables.service, \
nft flush ruleset, iptables -t nat -F, an iptables-restore of an older save), from the records \
each ADD keeps under /run/cni/portmap: for the nftables layout the tables, chains, maps and \
sets of ip/ip6 cni_portmap and each attachment's elements; for the iptables layout the chains \
CNI-HOSTPORT-DNAT, CNI-HOSTPORT-SETMARK and CNI-HOSTPORT-MASQ with the jumps from PREROUTING, \
OUTPUT and POSTROUTING, and each attachment's CNI-DN- chain, its rules and its entry rules. \
Everything missing goes back in one transaction per layout; nothing that is there is added \
again, and no other program's rules are touched. An attachment whose network namespace is \
proven gone (by the kernel's own ids, never by its path) is removed as DEL would, with its \
record and host-port index entries, not restored. A host port another attachment holds now \
is not taken back. iptables records of earlier versions, which do not say how their rules \
were made, are left alone.

Run it as root in the network namespace the plugin runs in (the host's). It prints one line \
per attachment restored or removed, and a summary; with nothing missing it writes nothing.

--watch  Keep running: reconcile at once, then again whenever another program deletes an \
object of portmap's (nf_tables events: nft flush ruleset, a restart of nftables.service, \
iptables-nft -t nat -F or -X, an iptables-restore, firewalld's iptables backend's reload), once \
the burst has settled (100 ms without a new one, at most 500 ms after the first). It ignores \
its own changes and the plugin's own ADD, DEL and GC, logs what it does on stderr, and stops on \
SIGTERM or SIGINT with status 0. Changes made with the legacy iptables tools make no event. \
Meant for a service (deploy/systemd/cni-reconcile-watch@.service), never started by the \
plugin itself.

Exit status: 0 when everything missing was restored (with --watch: when stopped by a signal), \
1 otherwise (the reason on stderr), 2 for a wrong command line.",
};

/// Runs `portmap reconcile` with the arguments after the command.
///
/// # Errors
/// An option it does not take; a failure to read the records or the tables; attachments it
/// could not restore.
pub fn command(args: &[String], out: &mut dyn Write) -> Result<(), OperatorError> {
    match args {
        [] => {}
        [watch] if watch == "--watch" => {
            return crate::watch::command(&mut |out| {
                reconcile(out).map_err(|e| e.to_string())?.outcome()
            });
        }
        [arg, ..] => return Err(OperatorError::usage(format!("unknown argument {arg:?}"))),
    }
    let report = reconcile(out).map_err(|e| OperatorError::failed(e.to_string()))?;
    cni::reconcile::finish(&report, out)
}

/// Reconciles the calling thread's namespace, printing a line per attachment restored or
/// removed on `out`.
///
/// # Errors
/// When the records cannot be read, or our iptables lock taken. A layout whose objects
/// cannot be read, and attachments that cannot be restored or removed, are in the report's
/// failures.
pub fn reconcile(out: &mut dyn Write) -> Result<Report, PortmapError> {
    let store = state::store()?;
    if store.list().map_err(PortmapError::Store)?.is_empty() {
        // Nothing recorded: not even the lock file is made.
        return Ok(Report::default());
    }
    // The iptables layout's ADD and DEL hold it from their conflict check to their record:
    // no record read under it is half-made or half-removed.
    let _lock = iptables::lock()?;
    let mut report = Report::default();
    let records = read_records(&store, &store.list().map_err(PortmapError::Store)?)?;
    // Read after the records: an id missing here was forgotten after its record was written.
    let ids: HashSet<i32> = Netlink::new()
        .and_then(|mut nl| nl.nsids())
        .map(|ids| ids.into_iter().collect())
        .unwrap_or_else(|e| {
            log::warn!("cannot list the namespace ids: {e}");
            HashSet::new()
        });
    let mut nft_made = Vec::new();
    let mut ipt_made = Vec::new();
    let mut dropped_any = false;
    for record in records {
        if record.netns.as_ref().is_some_and(|n| n.gone_by_id(&ids)) {
            remove_gone(&store, &record, out, &mut report);
            dropped_any = true;
            continue;
        }
        match record.backend {
            Backend::Nftables => nft_made.push(record),
            Backend::Iptables if record.made_with().is_none() => {
                log::info!(
                    "{}: recorded by an earlier version, which does not say how its rules were made; left alone",
                    who(&record.attachment())
                );
                report.unknown += 1;
            }
            Backend::Iptables => ipt_made.push(record),
        }
    }
    let census = OnceCell::new();
    let mut run = Run {
        store: &store,
        census: &census,
        out,
        report: &mut report,
        dropped_any: false,
    };
    if !nft_made.is_empty() {
        let mut be = Nftables::new(LazyNft::new());
        let lacking = be.lacking(&nft_made);
        let restored = run.settle("nftables", &nft_made, lacking, |lacking, live| {
            be.restore(lacking, live)
        });
        // A DEL of this layout takes no lock: one that ran between the read and the write
        // has its elements back, which go again.
        for i in restored {
            let Some(record) = nft_made.get(i) else {
                continue;
            };
            if state::record_of(&store, &record.attachment()).is_none()
                && let Err(e) = be.del(record)
            {
                log::warn!(
                    "{} was deleted while it was restored; removing its elements again failed: {e}",
                    who(&record.attachment())
                );
            }
        }
    }
    if !ipt_made.is_empty() {
        let mut be = Iptables::new(LazyNft::new());
        let lacking = be.lacking(&ipt_made);
        run.settle("iptables", &ipt_made, lacking, |lacking, live| {
            be.restore(&ipt_made, lacking, live)
        });
    }
    if dropped_any || run.dropped_any {
        ports::PortIndex::new(&store).sweep();
        store.prune();
    }
    Ok(report)
}

/// The records `names` of `store`, read on two threads: a thousand records are a thousand
/// opens and reads, the most of a reconcile with nothing missing. A file that does not parse
/// is discarded as DEL does ([`StateStore::read_or_discard`]).
///
/// # Errors
/// A record that exists but cannot be read.
fn read_records(store: &StateStore, names: &[String]) -> Result<Vec<State>, PortmapError> {
    let read = |names: &[String]| -> Result<Vec<State>, PortmapError> {
        let mut records = Vec::with_capacity(names.len());
        for name in names {
            if let Some(record) = store
                .read_or_discard::<State>(name)
                .map_err(PortmapError::Store)?
            {
                records.push(record);
            }
        }
        Ok(records)
    };
    if names.len() < 64 {
        return read(names);
    }
    let (first, second) = names.split_at(names.len() / 2);
    let (a, b) = std::thread::scope(|scope| {
        let other = scope.spawn(|| read(second));
        let mine = read(first);
        (mine, other.join())
    });
    let mut records = a?;
    match b {
        Ok(b) => records.extend(b?),
        Err(_) => return read(second).map(|b| [records, b].concat()),
    }
    Ok(records)
}

/// One reconcile's progress.
struct Run<'r> {
    store: &'r StateStore,
    census: &'r OnceCell<Census>,
    out: &'r mut dyn Write,
    report: &'r mut Report,
    dropped_any: bool,
}

impl Run<'_> {
    /// Settles the `records` of one layout from what it lacks of them: those that lack
    /// something are first proven alive (a dead one is removed, never brought back), then
    /// what the live ones and the shared objects lack is put back by `restore` in one
    /// transaction. Returns the positions of the attachments restored.
    fn settle<S, A>(
        &mut self,
        layout: &str,
        records: &[State],
        lacking: Result<Lacking<S, A>, PortmapError>,
        restore: impl FnOnce(&Lacking<S, A>, &[usize]) -> Result<(), PortmapError>,
    ) -> Vec<usize> {
        let lacking = match lacking {
            Ok(lacking) => lacking,
            Err(e) => {
                self.report.failed.push(format!(
                    "{} attachment(s) of the {layout} layout: {e}",
                    records.len()
                ));
                return Vec::new();
            }
        };
        self.report.in_place += records.len() - lacking.attachments.len() - lacking.refused.len();
        for (i, why) in &lacking.refused {
            if let Some(record) = records.get(*i) {
                self.report
                    .failed
                    .push(format!("{} ({layout}): {why}", who(&record.attachment())));
            }
        }
        let mut live = Vec::new();
        for lack in &lacking.attachments {
            let Some(record) = records.get(lack.index) else {
                continue;
            };
            if record
                .netns
                .as_ref()
                .is_some_and(|n| n.is_gone(self.census))
            {
                remove_gone(self.store, record, self.out, self.report);
                self.dropped_any = true;
            } else {
                live.push(lack.index);
            }
        }
        if live.is_empty() && lacking.shared.is_empty() {
            return Vec::new();
        }
        if let Err(e) = restore(&lacking, &live) {
            for i in &live {
                if let Some(record) = records.get(*i) {
                    self.report
                        .failed
                        .push(format!("{} ({layout}): {e}", who(&record.attachment())));
                }
            }
            if live.is_empty() {
                self.report
                    .failed
                    .push(format!("shared objects of the {layout} layout: {e}"));
            }
            return Vec::new();
        }
        if !lacking.shared.is_empty() {
            self.report.shared = true;
            let _ = writeln!(
                self.out,
                "restored shared objects ({layout}): {}",
                lacking.shared.join(", ")
            );
        }
        for lack in lacking
            .attachments
            .iter()
            .filter(|l| live.contains(&l.index))
        {
            if let Some(record) = records.get(lack.index) {
                self.report.restored += 1;
                let _ = writeln!(
                    self.out,
                    "restored {} ({layout}): {}",
                    who(&record.attachment()),
                    lack.what.join(", ")
                );
            }
        }
        live
    }
}

/// Removes an attachment whose namespace is gone, as its DEL would: its objects, through the
/// layout that made them (our iptables lock is held), then its index entries and its record.
fn remove_gone(store: &StateStore, record: &State, out: &mut dyn Write, report: &mut Report) {
    let att = record.attachment();
    let (layout, removed) = match record.backend {
        Backend::Nftables => ("nftables", Nftables::new(LazyNft::new()).del(record)),
        Backend::Iptables => (
            "iptables",
            iptables::remove_locked(
                &mut LazyNft::new(),
                &record.network,
                &record.container_id,
                &IpFamily::BOTH,
                Some(record),
            ),
        ),
    };
    let removed = removed.and_then(|()| {
        ports::release(store, record);
        state::remove_record(store, &att)
    });
    match removed {
        Ok(()) => {
            report.dropped += 1;
            let path = record
                .netns
                .as_ref()
                .map(|n| n.path.display().to_string())
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "removed {} ({layout}): its network namespace {path} is gone",
                who(&att)
            );
        }
        Err(e) => report.failed.push(format!(
            "{} ({layout}): removing it (its network namespace is gone): {e}",
            who(&att)
        )),
    }
}
