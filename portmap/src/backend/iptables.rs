//! The iptables backend: the reference's layout in table `nat` ([`layout`]), written by the
//! one iptables writer ([`netfilter::iptables::writer`]: natively over nf_tables where the
//! tools are `iptables-nft` and the encoder takes every rule, else with `iptables-restore`),
//! under our own lock ([`lock`]).
//!
//! - ADD: under the lock, refuses a host port that our nftables maps hold
//!   ([`ports::in_maps`]) or that another attachment of the layout holds (the host-port index,
//!   [`ports::indexed_holders`], and a table the writer read whole, [`ports::table_holders`]),
//!   unless that one's namespace is gone: its chains are removed in the same write. It writes
//!   what the table lacks of the shared chains, the attachment's chain, its rules and its
//!   entry rules, then the record (with the entry rules' handles, where the writer tells
//!   them) and the index entries; a failure after the write removes what it made.
//! - CHECK: the attachment's chain, its rules and its entry rules (looked up by their
//!   recorded handles), then the shared objects, each named as the reference names it.
//! - DEL: the chains and the jumps to them removed, the jumps found by their recorded handles.

pub mod layout;
mod reconcile;

pub use reconcile::IptLacking;

use cni::Attachment;
use cni::conf::GcAttachment as Valid;
use host::lock::{FileLock, LockError};
use ipnet::IpNet;
use netfilter::iptables::Family;
use netfilter::iptables::native::Recorded;
use netfilter::iptables::writer::{Plan, RemoveError, Writer};
use netfilter::nft::LazyNft;

use super::{Add, PortmapBackend, Unrecorded};
use crate::config::{Backend, Config, IpFamily};
use crate::error::{PortmapError, write_error};
use crate::names;
use crate::ports::{self, Fate, Records};
use crate::state::{self, State};
use layout::NAT;

/// Our lock around an iptables read-modify-write (a call's conflict check, its write and its
/// index entries), held until dropped. Where `/run/cni/portmap` cannot be written (read-only,
/// full), an existing lock file is locked through a read-only descriptor (`flock` needs no
/// write access), and without one the call goes on unlocked, since no other call can take it
/// there either: a DEL must still remove what it can.
///
/// # Errors
/// [`PortmapError::Lock`] when it stays held by another process (code 11) or cannot be made.
pub fn lock() -> Result<Option<FileLock>, PortmapError> {
    let wait = host::lock::DEFAULT_WAIT;
    match FileLock::acquire(names::IPT_LOCK_FILE, wait) {
        Ok(lock) => Ok(Some(lock)),
        Err(LockError::Open { path, source })
            if matches!(
                source.raw_os_error(),
                Some(libc::EROFS | libc::ENOSPC | libc::EDQUOT)
            ) =>
        {
            match std::fs::File::open(&path) {
                Ok(file) => Ok(Some(FileLock::acquire_file(file, path, wait)?)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    log::warn!(
                        "no iptables lock: {} cannot be made: {source}",
                        path.display()
                    );
                    Ok(None)
                }
                Err(e) => Err(LockError::Open { path, source: e }.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// The families of `ips`, as the writer names them.
fn families(ips: &[IpNet]) -> Vec<Family> {
    ips.iter().map(|ip| Family::of(&ip.addr())).collect()
}

/// A removal's failure as the reference words it (`could not teardown ipv4 dnat: …`).
fn removal_error(e: RemoveError) -> PortmapError {
    match e {
        RemoveError::Refused { family, cause } => layout::teardown_error(family.into(), &cause),
        RemoveError::Failed(e) => write_error(e),
    }
}

/// Removes the chains of `network`'s container `container_id` (its `CNI-DN-<hash>`, and the
/// legacy `CNI-SN-<hash>`, with the rules jumping to them) in `families`, with the entry
/// rules' handles `record` holds. The caller holds our lock.
///
/// # Errors
/// The first failure.
pub(crate) fn remove_locked(
    nft: &mut LazyNft,
    network: &str,
    container_id: &str,
    families: &[IpFamily],
    record: Option<&State>,
) -> Result<(), PortmapError> {
    let removals = layout::unchains(network, container_id, families, record);
    let families: Vec<Family> = families.iter().map(|f| (*f).into()).collect();
    Writer::choose(nft, NAT, &families, &[])
        .remove_chains(&removals)
        .map_err(removal_error)
}

/// Removes the chains of `network`'s container `container_id` in `families`, under our lock
/// (also the Go plugin's, which have the same names: DEL's leftovers).
///
/// # Errors
/// The lock; the first failure.
pub fn remove(
    nft: &mut LazyNft,
    network: &str,
    container_id: &str,
    families: &[IpFamily],
    record: Option<&State>,
) -> Result<(), PortmapError> {
    let _lock = lock()?;
    remove_locked(nft, network, container_id, families, record)
}

/// The reference's layout.
#[derive(Debug)]
pub struct Iptables {
    nft: LazyNft,
}

impl Iptables {
    /// The backend, owning the call's nf_tables socket.
    pub fn new(nft: LazyNft) -> Iptables {
        Iptables { nft }
    }

    /// Refuses a host port of `config` that our nftables maps hold (none where nf_tables is
    /// not usable).
    fn refuse_mapped_by_nftables(
        &mut self,
        att: &Attachment,
        config: &Config,
        ips: &[IpNet],
    ) -> Result<(), PortmapError> {
        let Ok(nft) = self.nft.get() else {
            return Ok(());
        };
        for family in ips.iter().map(|ip| IpFamily::of(ip.addr())) {
            let mappings = config.mappings_for(family);
            match ports::in_maps(nft, family, &names::owner(att), &mappings) {
                Ok(Some((m, owner))) => return Err(ports::refusal(m.host_port_name(), owner)),
                Ok(None) => {}
                Err(e) if e.is_unsupported() => break,
                Err(e) => return Err(PortmapError::Nft(e)),
            }
        }
        Ok(())
    }

    /// The write of an ADD: the conflict check, then the plan with the removal of the chains
    /// of the holders taken over, written. Returns the records taken over and the handles of
    /// the entry rules, per family where this write added them all.
    fn write(
        &mut self,
        add: &Add<'_>,
        plan: &mut Plan,
    ) -> Result<(Vec<State>, Vec<Recorded>), PortmapError> {
        let Add {
            att, config, ips, ..
        } = *add;
        let records = Records::new(add.store);
        let mut writer = Writer::for_plan(&mut self.nft, plan);
        let mut taken: Vec<State> = Vec::new();
        for ip in ips {
            let family = IpFamily::of(ip.addr());
            let exists = |chain: &str| writer.chain_exists(family.into(), chain);
            let indexed = ports::indexed_holders(&records, att, config, family, exists)
                .map_err(write_error)?;
            for (holder, m) in indexed {
                match records.by_container(&holder.network, &holder.container_id) {
                    Fate::Gone(gone) if gone.iter().all(|r| r.backend == Backend::Iptables) => {
                        take(gone, &mut taken);
                    }
                    _ => {
                        return Err(ports::chain_refusal(
                            &m,
                            &holder.network,
                            &holder.container_id,
                        ));
                    }
                }
            }
            // A table read whole (the tools' way) shows the Go plugin's chains too.
            let Some(dump) = writer.whole_table(family.into()).map_err(write_error)? else {
                continue;
            };
            for (chain, m) in ports::table_holders(dump, config, &att.container_id, family) {
                let Some((network, id)) = ports::table_owner(dump, &chain) else {
                    return Err(ports::table_refusal(dump, &chain, m));
                };
                match records.by_container(&network, &id) {
                    Fate::Gone(gone) if gone.iter().all(|r| r.backend == Backend::Iptables) => {
                        take(gone, &mut taken);
                    }
                    _ => return Err(ports::table_refusal(dump, &chain, m)),
                }
            }
        }
        let mut ids: Vec<(&str, &str)> = Vec::new();
        for t in &taken {
            if !ids.contains(&(t.network.as_str(), t.container_id.as_str())) {
                ids.push((&t.network, &t.container_id));
            }
        }
        for (network, id) in ids {
            let mut removals = layout::unchains(network, id, &IpFamily::BOTH, None);
            // The jumps of a container taken over are looked up, not found by handle.
            removals.iter_mut().for_each(|r| r.recorded = None);
            plan.removals.extend(removals);
        }
        let applied = writer.apply(plan).map_err(write_error)?;
        // A family's handles are the record only when this write added all its entry rules.
        let recorded = applied
            .recorded
            .into_iter()
            .filter(|r| {
                let (Some(part), Some((_, missing))) = (
                    plan.parts.iter().find(|p| p.family == r.family),
                    applied.added.iter().find(|(f, _)| *f == r.family),
                ) else {
                    return false;
                };
                let first = part.rules.iter().position(|s| s.recorded);
                let first = first.unwrap_or(part.rules.len());
                let added = missing.rules.iter().filter(|i| **i >= first).count();
                added == part.rules.len() - first
            })
            .collect();
        Ok((taken, recorded))
    }
}

impl PortmapBackend for Iptables {
    fn kind(&self) -> Backend {
        Backend::Iptables
    }

    /// Under our lock: the conflict check, the write (one transaction natively; one per
    /// family with the tools, a failure in the second undoing the first), then the record,
    /// written once with the handles of the entry rules (an inode costs a millisecond on an
    /// ext4 `/run`), and the index entries naming it.
    fn add(&mut self, add: Add<'_>) -> Result<(), PortmapError> {
        let _lock = lock()?;
        let Add {
            store,
            att,
            config,
            ips,
            ..
        } = add;
        let mut record = add.record.clone();
        let file = state::file(att);
        self.refuse_mapped_by_nftables(att, config, ips)?;
        let mut plan = Plan {
            table: NAT.to_string(),
            removals: Vec::new(),
            parts: ips
                .iter()
                .map(|ip| layout::add_part(config, &att.container_id, *ip))
                .collect(),
            undo: layout::unchains(
                &config.network,
                &att.container_id,
                &plan_families(ips),
                None,
            ),
            undo_rules: Vec::new(),
        };
        let (taken, recorded) = self.write(&add, &mut plan)?;
        let result = (add.then)().and_then(|()| {
            ports::forget_taken(store, &taken);
            if !recorded.is_empty() {
                record
                    .iptables_rules
                    .retain(|r| recorded.iter().all(|a| a.family != r.family));
                record.iptables_rules.extend(recorded);
            }
            if add.earlier.record.as_ref() != Some(&record) || add.earlier.file != file {
                state::write(store, &file, &record)?;
            }
            // Under the lock, in the step that made the claim: the index names this ADD for
            // each key it now holds.
            ports::PortIndex::new(store).claim(&file, &record)
        });
        if let Err(e) = result {
            if let Err(e) = remove_locked(
                &mut self.nft,
                &record.network,
                &record.container_id,
                &IpFamily::BOTH,
                Some(&record),
            ) {
                log::warn!("rollback after a failed ADD failed: {e}");
            }
            ports::release(store, &record);
            super::forget(store, att);
            return Err(e);
        }
        super::forget_earlier(store, &add.earlier.file, &file);
        Ok(())
    }

    /// The chain, each of its rules and each entry rule must exist, and the shared chains
    /// and jumps they need.
    fn check(
        &mut self,
        att: &Attachment,
        config: &Config,
        ips: &[IpNet],
        record: Option<&State>,
    ) -> Result<(), PortmapError> {
        let mut parts = Vec::new();
        for ip in ips {
            parts.push(layout::own_part(config, &att.container_id, *ip));
            parts.push(layout::shared_part(config, IpFamily::of(ip.addr())));
        }
        let mut writer = Writer::choose(&mut self.nft, NAT, &families(ips), &parts);
        for (ip, pair) in ips.iter().zip(parts.chunks(2)) {
            let [own, shared] = pair else { continue };
            let fam = IpFamily::of(ip.addr());
            let recorded = record.and_then(|r| r.recorded(fam));
            let missing = match writer.missing(own, recorded).map_err(write_error)? {
                Some(absent) => Some(layout::own_missing(own, absent)),
                None => writer
                    .missing(shared, None)
                    .map_err(write_error)?
                    .map(|absent| layout::shared_absent(shared, absent)),
            };
            if let Some(missing) = missing {
                return Err(layout::check_error(
                    config,
                    &att.container_id,
                    *ip,
                    &missing,
                ));
            }
        }
        Ok(())
    }

    fn del(&mut self, record: &State) -> Result<(), PortmapError> {
        remove(
            &mut self.nft,
            &record.network,
            &record.container_id,
            &IpFamily::BOTH,
            Some(record),
        )
    }

    fn del_unrecorded(
        &mut self,
        att: &Attachment,
        _found: Unrecorded<'_>,
    ) -> Result<(), PortmapError> {
        remove(
            &mut self.nft,
            &att.network,
            &att.container_id,
            &IpFamily::BOTH,
            None,
        )
    }

    /// Tears down every `CNI-DN-` chain of `network` whose container is not valid, found by
    /// the entry rules' comments (GC reads the whole entry chain).
    fn gc(&mut self, network: &str, valid: &[Valid]) -> Result<(), PortmapError> {
        let _lock = lock()?;
        let mut writer = Writer::choose(&mut self.nft, NAT, &Family::BOTH, &[]);
        let mut comments = Vec::new();
        for family in Family::BOTH {
            let jumps = writer
                .jumps(family, names::IPT_TOPLEVEL_DNAT)
                .map_err(write_error)?;
            comments.extend(jumps.into_iter().filter_map(|j| j.comment));
        }
        let stale = layout::stale_containers(comments.iter().map(String::as_str), network, valid);
        if stale.is_empty() {
            return Ok(());
        }
        let mut plan = Plan {
            table: NAT.to_string(),
            ..Plan::default()
        };
        for id in &stale {
            plan.removals
                .extend(layout::unchains(network, id, &IpFamily::BOTH, None));
        }
        writer.apply(&plan).map(drop).map_err(write_error)
    }

    /// The IPv4 tools work.
    fn status(&mut self) -> Result<(), PortmapError> {
        netfilter::iptables::Iptables::new(Family::V4)
            .probe()
            .map_err(PortmapError::Iptables)
    }

    fn into_socket(self: Box<Self>) -> LazyNft {
        self.nft
    }
}

/// Adds `records` to `taken`, each attachment once.
fn take(records: Vec<State>, taken: &mut Vec<State>) {
    for record in records {
        if !taken.iter().any(|t| t.attachment() == record.attachment()) {
            taken.push(record);
        }
    }
}

/// The families of `ips`.
fn plan_families(ips: &[IpNet]) -> Vec<IpFamily> {
    crate::plan::families(ips)
}
