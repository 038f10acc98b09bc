//! The reference's iptables layout in the `filter` table.
//!
//! The read goes over nf_tables netlink where the tools are `iptables-nft`
//! ([`Tools::snapshot`]), so it neither starts a process nor grows with the other attachments'
//! rules; `iptables-save` otherwise. The tools' process starts dominate every call, so nothing
//! is exec'd that can be done without: where the tools are `iptables-nft`, an ADD appends the
//! attachment's accepts over nf_tables netlink, encoded as the tools would
//! ([`native::encode_rule`]), and records the handles the kernel gave them (and the table's),
//! so that DEL deletes them by handle without listing `CNI-FORWARD` (which grows with the
//! attachments). Only what the table lacks besides the accepts (the chains and jumps of a
//! first ADD, a new bridge's isolation rules) goes to `iptables-restore --noflush`, one
//! transaction per family. With `iptables-legacy` everything does: the families' restores run
//! concurrently, and DEL first tries its deletions blind (one restore, no save), reading the
//! table only when that transaction fails.

use std::collections::BTreeMap;
use std::net::IpAddr;

use cni::conf::GcAttachment;
use netfilter::iptables::native::{self, Wanted};
use netfilter::iptables::{Family, Iptables as Tools, IptablesError, TableDump, restore_line};
use netfilter::nft::{Batch, LazyNft, Nft, NftError, addr_bytes};

use super::state::{Accept, AttachmentState, Made, State};
use super::{FirewallBackend, Missing, Recorded, Restored};
use crate::config::Config;
use crate::error::FirewallError;
use crate::names::{CNI_FORWARD_CHAIN, FILTER_TABLE, FORWARD_CHAIN, STAGE1_CHAIN, STAGE2_CHAIN};
use crate::plan::{
    AddPlan, Target, ip_rules, iptables_add, iptables_del, iptables_lacking, iptables_missing,
};
use cni::Attachment;

/// Runs `f` on every item, concurrently when there are several (each runs its own tool
/// processes), and returns the results in order.
fn concurrently<I: Send, T: Send>(items: Vec<I>, f: impl Fn(I) -> T + Sync) -> Vec<T> {
    if items.len() < 2 {
        return items.into_iter().map(f).collect();
    }
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || f(item)))
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// Runs `f` for every family of `families`, concurrently when there are two, and returns the
/// results in the order of `families`.
fn per_family<T: Send>(families: &[Family], f: impl Fn(Family) -> T + Sync) -> Vec<(Family, T)> {
    concurrently(families.to_vec(), |family| (family, f(family)))
}

/// Deletes one copy of each accept of `ips` in `family` with one restore, without reading the
/// table; when that transaction fails (an accept is absent, so it changed nothing), reads the
/// table and deletes every copy that is there.
fn delete_accepts(family: Family, ips: &[IpAddr]) -> Result<(), FirewallError> {
    let tools = Tools::new(family);
    let mut blind = Vec::new();
    for ip in ips.iter().filter(|ip| Family::of(ip) == family) {
        for rule in ip_rules(*ip) {
            blind.push(restore_line("-D", CNI_FORWARD_CHAIN, &rule)?);
        }
    }
    if blind.is_empty() {
        return Ok(());
    }
    match tools.restore(FILTER_TABLE, &blind) {
        Ok(()) => return Ok(()),
        Err(e @ (IptablesError::Locked { .. } | IptablesError::Timeout { .. })) => {
            return Err(e.into());
        }
        Err(e) => log::debug!("{family}: blind DEL refused, reading the table: {e}"),
    }
    let dump = tools.save(FILTER_TABLE)?;
    tools.restore(FILTER_TABLE, &iptables_del(&dump, family, ips)?)?;
    Ok(())
}

/// The handles of the accepts of `ips` (all of `family`) in `CNI-FORWARD` that their ADD
/// recorded (`recorded`), when the table is still the one they were recorded in (one request,
/// whatever the length of the chain: a rule handle names the same rule for the life of its
/// table, so no rule is read). `None` when an address lacks its two handles or the table was
/// made anew (by a restore of a saved ruleset, say), and the caller looks the accepts up in
/// the chain ([`by_listing`]). A recorded rule since deleted (by hand) makes the deletion fail
/// as a whole, and the caller then looks them up too.
fn by_handle(
    nft: &mut Nft,
    family: Family,
    ips: &[IpAddr],
    recorded: &[Accept],
) -> Result<Option<Vec<u64>>, NftError> {
    let mine: Vec<&Accept> = recorded.iter().filter(|a| ips.contains(&a.ip)).collect();
    if ips
        .iter()
        .any(|ip| mine.iter().filter(|a| a.ip == *ip).count() < 2)
    {
        return Ok(None);
    }
    let table = nft.table_handle(&native::nft_table(family, FILTER_TABLE))?;
    if mine.iter().any(|a| Some(a.table) != table) {
        return Ok(None);
    }
    Ok(Some(mine.iter().map(|a| a.handle).collect()))
}

/// The handles of every copy of the accepts of `ips` (all of `family`) in `CNI-FORWARD`,
/// found by listing the chain: the rules that hold one of the addresses, decoded
/// ([`native::rule_args`]) and compared with [`ip_rules`]. `None` when such a rule does not
/// decode (a form of another iptables version: it might be one of the accepts, so the tools,
/// which know every form, must do the deletion). A chain or table that does not exist holds
/// none.
fn by_listing(nft: &mut Nft, family: Family, ips: &[IpAddr]) -> Result<Option<Vec<u64>>, NftError> {
    let table = native::nft_table(family, FILTER_TABLE);
    let needles: Vec<Vec<u8>> = ips.iter().map(|ip| addr_bytes(*ip)).collect();
    let needles: Vec<&[u8]> = needles.iter().map(Vec::as_slice).collect();
    let rules = match nft.rules_containing(&table, CNI_FORWARD_CHAIN, &needles) {
        Ok(rules) => rules,
        Err(e) if e.is_not_found() => return Ok(Some(Vec::new())),
        Err(e) => return Err(e),
    };
    let mut handles = Vec::new();
    for rule in rules {
        let Some(args) = native::rule_args(family, &rule.exprs) else {
            log::debug!(
                "{table} {CNI_FORWARD_CHAIN}: rule {} is not decoded",
                rule.handle
            );
            return Ok(None);
        };
        if ips.iter().any(|ip| ip_rules(*ip).contains(&args)) {
            handles.push(rule.handle);
        }
    }
    Ok(Some(handles))
}

/// DEL where iptables is `iptables-nft`: the accepts of `ips` are nf_tables rules in chain
/// `CNI-FORWARD` of table `ip filter` / `ip6 filter`, deleted by handle over netlink in one
/// batch for both families, with nothing exec'd. The handles are those the ADD recorded
/// ([`by_handle`]), else those a listing of the chain finds ([`by_listing`]). Returns the
/// families the caller must leave to the tools: those with a rule the decoder does not know,
/// and those where nothing was found while `iptables-legacy` may hold rules (in a family
/// whose tools are `iptables-nft`, or without a legacy `filter` table in the namespace,
/// nf_tables holds every rule there is, and an accept absent there is absent: a repeated DEL
/// then costs no exec, and a DEL on a node without the tools succeeds when there is nothing
/// to delete).
fn delete_natively(
    nft: &mut Nft,
    families: &[Family],
    ips: &[IpAddr],
    recorded: &[Accept],
) -> Result<Vec<Family>, NftError> {
    match deletions(nft, families, ips, recorded) {
        Ok(tools) => Ok(tools),
        // A recorded rule is gone (deleted by hand): the transaction changed nothing.
        Err(e) if e.is_not_found() && !recorded.is_empty() => {
            log::debug!("deleting by the recorded handles: {e}; looking the accepts up");
            deletions(nft, families, ips, &[])
        }
        Err(e) => Err(e),
    }
}

/// One try of [`delete_natively`]: by the `recorded` handles where they do, else by listing.
fn deletions(
    nft: &mut Nft,
    families: &[Family],
    ips: &[IpAddr],
    recorded: &[Accept],
) -> Result<Vec<Family>, NftError> {
    let mut batch = Batch::new();
    let mut tools = Vec::new();
    for family in families {
        let ips: Vec<IpAddr> = ips
            .iter()
            .copied()
            .filter(|ip| Family::of(ip) == *family)
            .collect();
        let handles = match by_handle(nft, *family, &ips, recorded)? {
            Some(handles) => Some(handles),
            None => by_listing(nft, *family, &ips)?,
        };
        let authoritative = || native::writes_nf_tables(*family) || !legacy_filter_exists(*family);
        match handles {
            Some(handles) if !handles.is_empty() || authoritative() => {
                let table = native::nft_table(*family, FILTER_TABLE);
                for handle in handles {
                    batch.delete_rule(&table, CNI_FORWARD_CHAIN, handle);
                }
            }
            _ => tools.push(*family),
        }
    }
    nft.apply(&batch)?;
    log::debug!(
        "deleted {} accept rule(s) over nf_tables netlink",
        batch.len()
    );
    Ok(tools)
}

/// The accepts of `plans` (in forms [`native::encode_rule`] knows), encoded as
/// `iptables-restore` would have, for one transaction of both families; `None` when a family's
/// tools are legacy or an accept has another form, and the tools must write them.
fn native_appends(plans: &[(Family, AddPlan)]) -> Option<(Batch, Vec<IpAddr>)> {
    let mut batch = Batch::new();
    let mut ips = Vec::new();
    for (family, plan) in plans {
        if plan.accepts.is_empty() {
            continue;
        }
        if !native::writes_nf_tables(*family) {
            return None;
        }
        for (ip, args) in &plan.accepts {
            let rule = native::encode_rule(*family, args)?;
            batch.add_rule_echo(
                &native::nft_table(*family, FILTER_TABLE),
                CNI_FORWARD_CHAIN,
                &rule,
            );
            ips.push(*ip);
        }
    }
    Some((batch, ips))
}

/// Whether the legacy (x_tables) `filter` table of `family` exists in the calling thread's
/// namespace: only then can `iptables-legacy` hold rules that nf_tables does not list.
fn legacy_filter_exists(family: Family) -> bool {
    let names = match family {
        Family::V4 => "/proc/net/ip_tables_names",
        Family::V6 => "/proc/net/ip6_tables_names",
    };
    std::fs::read_to_string(names).is_ok_and(|s| s.lines().any(|l| l == FILTER_TABLE))
}

/// The byte strings the rules an ADD or CHECK looks for in `CNI-FORWARD` contain: the
/// addresses of `family` (an accept compares with one) and the admin chain's name (the jump's
/// target).
fn needles(family: Family, config: &Config, target: &Target) -> Vec<Vec<u8>> {
    let mut needles: Vec<Vec<u8>> = target.ips_of(family).map(addr_bytes).collect();
    needles.push(config.admin_chain.as_bytes().to_vec());
    needles
}

/// The chains of the `filter` table an ADD or CHECK reads: of `CNI-FORWARD`, which holds two
/// accepts per attachment, only the rules that can be the ones wanted, and with `accepts`
/// false only the first rule jumping to the admin chain (an ADD that knows the accepts are
/// absent: the listing stops at the jump, near the top, so it does not grow with the other
/// attachments); of the admin chain, only whether it exists. `iptables-save`, where the
/// tools are legacy, reads everything.
fn read(
    family: Family,
    config: &Config,
    target: &Target,
    accepts: bool,
) -> Result<TableDump, IptablesError> {
    let needles = needles(family, config, target);
    let admin = [config.admin_chain.as_bytes().to_vec()];
    let cni_forward = if accepts {
        Wanted::Containing(&needles)
    } else {
        Wanted::FirstContaining(&admin)
    };
    Tools::new(family).snapshot(
        FILTER_TABLE,
        &[
            (CNI_FORWARD_CHAIN, cni_forward),
            (FORWARD_CHAIN, Wanted::All),
            (&config.admin_chain, Wanted::Containing(&[])),
            (STAGE1_CHAIN, Wanted::All),
            (STAGE2_CHAIN, Wanted::All),
        ],
    )
}

/// The chains of the `filter` table that hold what [`read`] reads, every rule of them, for
/// `reconcile`'s check of all the attachments at once (with thousands of addresses, a
/// filter by each would cost more than decoding the chain).
fn read_all(family: Family, config: &Config) -> Result<TableDump, IptablesError> {
    Tools::new(family).snapshot(
        FILTER_TABLE,
        &[
            (CNI_FORWARD_CHAIN, Wanted::All),
            (FORWARD_CHAIN, Wanted::All),
            (&config.admin_chain, Wanted::Containing(&[])),
            (STAGE1_CHAIN, Wanted::All),
            (STAGE2_CHAIN, Wanted::All),
        ],
    )
}

/// The iptables backend.
#[derive(Debug)]
pub struct Iptables {
    config: Config,
    state: State,
    /// The call's one nf_tables socket, opened on first use.
    nft: LazyNft,
}

impl Iptables {
    /// The backend for `config`, keeping its state in `state`.
    #[must_use]
    pub fn new(config: Config, state: State) -> Iptables {
        Iptables {
            config,
            state,
            nft: LazyNft::new(),
        }
    }

    /// Appends the accepts of `batch` ([`native_appends`]: both families, one transaction, for
    /// the addresses `ips` in order) over nf_tables netlink, and returns them with the handles
    /// the kernel gave them. `None` when the transaction failed (logged), and the tools must
    /// write them. That saves the restores' process
    /// starts (2 ms each) and their loads of the table, and the handles let DEL delete them
    /// without listing the chain.
    fn append_natively(&mut self, batch: &Batch, ips: Vec<IpAddr>) -> Option<Vec<Accept>> {
        if batch.is_empty() {
            return Some(Vec::new());
        }
        let appended = self.nft.get().and_then(|nft| {
            // The tables' handles before the append: should a table be made anew in between,
            // the record names the old one, and DEL looks the accepts up instead.
            let mut tables = Vec::new();
            for family in Family::BOTH {
                if ips.iter().any(|ip| Family::of(ip) == family) {
                    let table = nft.table_handle(&native::nft_table(family, FILTER_TABLE))?;
                    tables.push((family, table.unwrap_or_default()));
                }
            }
            Ok((tables, nft.apply_echo(batch)?))
        });
        match appended {
            Ok((tables, rules)) if rules.len() == ips.len() => {
                log::debug!("appended {} rule(s) over nf_tables netlink", rules.len());
                let table_of = |ip: &IpAddr| {
                    tables
                        .iter()
                        .find(|(f, _)| *f == Family::of(ip))
                        .map_or(0, |(_, t)| *t)
                };
                Some(
                    ips.into_iter()
                        .zip(rules)
                        .map(|(ip, rule)| Accept {
                            table: table_of(&ip),
                            ip,
                            handle: rule.handle,
                        })
                        .collect(),
                )
            }
            Ok((_, rules)) => {
                // Committed, but the echo does not say which rule is which: DEL looks them up.
                log::warn!(
                    "{} of {} appended rule(s) echoed; not recording handles",
                    rules.len(),
                    ips.len()
                );
                Some(Vec::new())
            }
            Err(e) => {
                log::debug!("appending over nf_tables failed ({e}); using iptables-restore");
                None
            }
        }
    }

    /// Deletes the accepts of `ips` (those no other attachment claims) in every family they
    /// belong to, by the handles in `recorded` where it can, and forgets the attachment.
    fn remove(
        &mut self,
        name: &str,
        ips: &[IpAddr],
        recorded: &[Accept],
    ) -> Result<(), FirewallError> {
        let mut mine = Vec::new();
        for ip in ips {
            if !self.state.claimed_by_other(*ip, name)? {
                mine.push(*ip);
            }
        }
        let families: Vec<Family> = Family::BOTH
            .into_iter()
            .filter(|f| mine.iter().any(|ip| Family::of(ip) == *f))
            .collect();
        if families.is_empty() {
            return self.state.forget(name, ips);
        }
        let tools = match self
            .nft
            .get()
            .and_then(|nft| delete_natively(nft, &families, &mine, recorded))
        {
            Ok(tools) => tools,
            Err(e) => {
                log::debug!("DEL {name}: over nf_tables: {e}; using iptables-restore");
                families.clone()
            }
        };
        let mut first_error = None;
        for (family, result) in per_family(&tools, |family| delete_accepts(family, &mine)) {
            if let Err(e) = result {
                log::warn!("DEL {name}: {family}: {e}");
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        self.state.forget(name, ips)
    }
}

impl FirewallBackend for Iptables {
    fn name(&self) -> &'static str {
        "iptables"
    }

    fn add(&mut self, owner: &Attachment, target: &Target) -> Result<(), FirewallError> {
        let _lock = self.state.lock()?;
        let families = target.families();
        let name = crate::names::state_name(owner);
        let existing = self.state.attachment(&name)?;
        let known = existing.is_some();
        // Every accept this backend commits is recorded first, so unless the attachment or
        // one of its addresses is recorded, its accepts are not in the table (but for copies
        // written by something else, such as the Go plugin before an upgrade for a container
        // ADDed again without a DEL, which are then duplicated).
        let accepts = known || self.state.claims_any(&target.ips)?;
        let saves = per_family(&families, |family| {
            read(family, &self.config, target, accepts)
        });
        let mut plans: Vec<(Family, AddPlan)> = Vec::new();
        for (family, dump) in saves {
            let dump: TableDump = dump?;
            if plans.is_empty() && !dump.has_chain(CNI_FORWARD_CHAIN) {
                // A namespace without our skeleton has no attachments of ours: state under
                // its inode number is a dead namespace's.
                self.state.reset()?;
            }
            plans.push((family, iptables_add(&dump, family, &self.config, target)?));
        }
        // The accepts a repeated ADD finds in place stay those of the record (those of an
        // address whose accepts are written again, after a flush, are gone).
        let rewritten = |ip: &IpAddr| {
            plans
                .iter()
                .any(|(_, p)| p.accepts.iter().any(|a| a.0 == *ip))
        };
        let kept: Vec<Accept> = existing
            .map(|e| e.accepts)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| target.ips.contains(&a.ip) && !rewritten(&a.ip))
            .collect();
        let mut record = AttachmentState {
            ips: target.ips.clone(),
            accepts: kept.clone(),
            made: Some(Made::new(self.name(), &self.config, owner, target)),
        };
        // Recorded before any rule is committed: a call killed after its commit (or an
        // `iptables-restore` it fed, finishing after it) leaves rules that only the record
        // lets a DEL without prevResult find.
        self.state.record(&name, &record)?;
        let forget = |state: &State| {
            // A first ADD leaves no record behind; a repeated one keeps its record, whose
            // earlier rules are still there.
            if !known && let Err(f) = state.forget(&name, &target.ips) {
                log::warn!("ADD rollback of the state of {name} failed: {f}");
            }
        };
        let lines: Vec<(Family, Vec<String>)> = if let Some((batch, ips)) = native_appends(&plans) {
            // The chains, jumps and isolation rules the table lacks (a first ADD on a node, a
            // new bridge) go to the tools; the accepts then over nf_tables, with handles.
            let skeleton: Vec<(Family, Vec<String>)> = plans
                .iter()
                .map(|(family, plan)| (*family, plan.skeleton_lines()))
                .filter(|(_, lines)| !lines.is_empty())
                .collect();
            let restored = concurrently(skeleton, |(family, lines)| {
                Tools::new(family).restore(FILTER_TABLE, &lines)
            });
            if let Some(e) = restored.into_iter().find_map(Result::err) {
                // Nothing of this attachment's own was written; shared objects may stay.
                forget(&self.state);
                return Err(e.into());
            }
            if let Some(appended) = self.append_natively(&batch, ips) {
                if !appended.is_empty() {
                    record.accepts.extend(appended);
                    if let Err(e) = self.state.rewrite(&name, &record) {
                        // DEL then looks the accepts up in the chain.
                        log::warn!("ADD {name}: recording the accepts' handles: {e}");
                    }
                }
                return Ok(());
            }
            let mut lines = Vec::new();
            for (family, plan) in &plans {
                lines.push((*family, plan.accept_lines()?));
            }
            lines
        } else {
            let mut lines = Vec::new();
            for (family, plan) in &plans {
                lines.push((*family, plan.lines()?));
            }
            lines
        };
        let results: Vec<(Family, Result<(), IptablesError>)> = concurrently(
            lines.into_iter().filter(|(_, l)| !l.is_empty()).collect(),
            |(family, lines)| (family, Tools::new(family).restore(FILTER_TABLE, &lines)),
        );
        if results.iter().any(|(_, r)| r.is_err()) {
            // Undo this attachment's accepts in the families that committed; the skeleton and
            // isolation rules are shared and may stay.
            for (family, result) in &results {
                if result.is_err() {
                    continue;
                }
                let undo: Result<Vec<String>, IptablesError> = plans
                    .iter()
                    .filter(|(f, _)| f == family)
                    .flat_map(|(_, plan)| &plan.accepts)
                    .map(|(_, args)| restore_line("-D", CNI_FORWARD_CHAIN, args))
                    .collect();
                let undone = undo.and_then(|undo| Tools::new(*family).restore(FILTER_TABLE, &undo));
                if let Err(u) = undone {
                    log::warn!("ADD rollback in {family} failed: {u}");
                }
            }
            if let Some(e) = results.into_iter().find_map(|(_, r)| r.err()) {
                forget(&self.state);
                return Err(e.into());
            }
        }
        Ok(())
    }

    fn check(&mut self, _owner: &Attachment, target: &Target) -> Result<(), FirewallError> {
        let families = target.families();
        let read = |family| read(family, &self.config, target, true);
        for (family, dump) in per_family(&families, read) {
            let dump = dump?;
            if let Some(missing) = iptables_missing(&dump, family, &self.config, target) {
                return Err(FirewallError::Missing {
                    msg: missing.message(),
                    details: missing.details(),
                });
            }
        }
        Ok(())
    }

    fn del(&mut self, owner: &Attachment, target: Option<&Target>) -> Result<(), FirewallError> {
        let _lock = self.state.lock_for_teardown()?;
        let name = crate::names::state_name(owner);
        let record = self.state.to_remove(&name, target)?;
        self.remove(&name, &record.ips, &record.accepts)
    }

    fn gc(&mut self, network: &str, valid: &[GcAttachment]) -> Result<(), FirewallError> {
        let _lock = self.state.lock_for_teardown()?;
        let mut first_error = None;
        for name in self.state.attachments_of(network)? {
            let live = valid.iter().any(|a| {
                crate::names::state_name(&Attachment::new(network, &a.container_id, &a.ifname))
                    == name
            });
            if live {
                continue;
            }
            let record = self.state.to_remove(&name, None)?;
            if let Err(e) = self.remove(&name, &record.ips, &record.accepts) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn missing(&mut self, attachments: &[Recorded]) -> Result<Missing, FirewallError> {
        let targets: Vec<&Target> = attachments.iter().map(|a| &a.target).collect();
        let families: Vec<Family> = Family::BOTH
            .into_iter()
            .filter(|f| targets.iter().any(|t| t.ips_of(*f).next().is_some()))
            .collect();
        let mut missing = Missing::default();
        let mut lacking: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (family, dump) in per_family(&families, |f| read_all(f, &self.config)) {
            let found = iptables_lacking(&dump?, family, &self.config, &targets);
            missing
                .shared
                .extend(found.shared.into_iter().map(|s| format!("{s} in {family}")));
            for (i, what) in found.targets {
                let all = lacking.entry(i).or_default();
                for w in what {
                    if !all.contains(&w) {
                        all.push(w);
                    }
                }
            }
        }
        missing.attachments = lacking.into_iter().collect();
        Ok(missing)
    }

    fn restore(
        &mut self,
        attachments: &[Recorded],
        missing: &Missing,
    ) -> Result<Restored, FirewallError> {
        // Through ADD's own path, one attachment at a time: it reads what its attachment
        // needs, writes what lacks (the shared chains and jumps with the first), and records
        // the new accepts' handles.
        if missing.attachments.is_empty() {
            if let Some(first) = attachments.first()
                && !missing.shared.is_empty()
            {
                self.add(&first.owner, &first.target)?;
            }
            return Ok(Vec::new());
        }
        Ok(missing
            .attachments
            .iter()
            .filter_map(|(i, _)| Some((*i, attachments.get(*i)?)))
            .map(|(i, a)| {
                (
                    i,
                    self.add(&a.owner, &a.target).err().map(|e| e.to_string()),
                )
            })
            .collect())
    }

    fn status(&mut self) -> Result<(), FirewallError> {
        // IPv4 must work; IPv6 is needed only by dual-stack attachments, so its absence is
        // logged, not fatal (the reference refuses to start without both).
        Tools::new(Family::V4)
            .probe()
            .map_err(|e| FirewallError::Unavailable {
                backend: "iptables",
                reason: e.to_string(),
            })?;
        if let Err(e) = Tools::new(Family::V6).probe() {
            log::warn!("ip6tables is not usable: {e}");
        }
        Ok(())
    }
}
