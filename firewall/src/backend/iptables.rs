//! The reference's iptables layout in the `filter` table, written with one
//! `iptables-restore --noflush` transaction per family per call after one read of the chains
//! involved.
//!
//! The read goes over nf_tables netlink where the tools are `iptables-nft`
//! ([`Tools::snapshot`]), so it neither starts a process nor grows with the other attachments'
//! rules; `iptables-save` otherwise. The tools' process starts dominate every call, so nothing
//! is exec'd that can be done without: where the tools are `iptables-nft`, an ADD that only
//! appends an attachment's accepts (every ADD once a node has the skeleton) writes them over
//! nf_tables netlink, encoded as the tools would ([`native::encode_rule`]), and DEL deletes
//! by handle the same way. Otherwise the families' restores run concurrently, never without
//! lines or for a family without addresses, and DEL first tries its deletions blind (one
//! restore, no save), reading the table only when that transaction fails.

use std::net::IpAddr;

use common::conf::Attachment;
use common::iptables::native::{self, Wanted};
use common::iptables::{Family, Iptables as Tools, IptablesError, TableDump, restore_line};
use common::nft::{Batch, Nft, addr_bytes};

use super::state::State;
use super::{FirewallBackend, Owner};
use crate::config::Config;
use crate::error::FirewallError;
use crate::names::{CNI_FORWARD_CHAIN, FILTER_TABLE, FORWARD_CHAIN, STAGE1_CHAIN, STAGE2_CHAIN};
use crate::plan::{AddPlan, Target, ip_rules, iptables_add, iptables_del, iptables_missing};

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

/// DEL's fast path where iptables is `iptables-nft`: the accept rules of `ips` are nf_tables
/// rules in chain `CNI-FORWARD` of table `ip filter` / `ip6 filter`, found by their
/// expressions and deleted by handle over netlink in one batch for both families, with nothing
/// exec'd. The deletion is what `iptables-restore` would commit, without its process starts,
/// its cache of the whole table (which grows with the attachments) and, above all, its wait at
/// exit for the kernel to free the deleted rules (13 ms or more here): the socket goes to a
/// detached child ([`common::linger::hand_off`]).
///
/// Every rule of the chain that holds one of the addresses must decode
/// ([`native::rule_args`]); the accepts are those equal to [`ip_rules`]. Returns true when it is done: it deleted the accepts, or found none while, in every
/// family, the tools are `iptables-nft` ([`native::writes_nf_tables`]) or no legacy `filter`
/// table exists in the namespace, so that nf_tables holds every rule there is and an accept
/// absent there is absent (a repeated DEL then costs no exec and no read of the whole table,
/// and a DEL on a node without the tools succeeds when there is nothing to delete). False when
/// the caller must go the tools' way: a rule did not decode, or nothing was found while
/// `iptables-legacy` may hold rules.
fn delete_accepts_nft(families: &[Family], ips: &[IpAddr]) -> Result<bool, FirewallError> {
    let authoritative = families
        .iter()
        .all(|f| native::writes_nf_tables(*f) || !legacy_filter_exists(*f));
    let mut nft = Nft::new()?;
    let mut batch = Batch::new();
    let mut found = 0;
    for family in families {
        let table = native::nft_table(*family, FILTER_TABLE);
        let needles: Vec<Vec<u8>> = ips
            .iter()
            .filter(|ip| Family::of(ip) == *family)
            .map(|ip| addr_bytes(*ip))
            .collect();
        let needles: Vec<&[u8]> = needles.iter().map(Vec::as_slice).collect();
        // Only the rules holding one of the addresses can be their accepts.
        let rules = match nft.rules_containing(&table, CNI_FORWARD_CHAIN, &needles) {
            Ok(rules) => rules,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        for rule in rules {
            let Some(args) = native::rule_args(*family, &rule.exprs) else {
                // Not a form this decoder knows (another iptables version?): it might be one
                // of the accepts, so the tools, which know every form, do the deletion.
                log::debug!(
                    "{table} {CNI_FORWARD_CHAIN}: rule {} is not decoded",
                    rule.handle
                );
                return Ok(false);
            };
            let mine = ips
                .iter()
                .filter(|ip| Family::of(ip) == *family)
                .any(|ip| ip_rules(*ip).contains(&args));
            if mine {
                batch.delete_rule(&table, CNI_FORWARD_CHAIN, rule.handle);
                found += 1;
            }
        }
    }
    if found == 0 {
        return Ok(authoritative);
    }
    nft.apply(&batch)?;
    log::debug!("deleted {found} accept rule(s) over nf_tables netlink");
    if let Err(e) = common::linger::hand_off(&nft) {
        log::debug!("closing the nf_tables socket at exit: {e}");
    }
    Ok(true)
}

/// ADD's fast path where the tools are `iptables-nft` and the plans only append accepts to
/// `CNI-FORWARD` (every ADD once the node has the skeleton), in forms
/// [`native::encode_rule`] knows: the rules go in over nf_tables netlink, encoded as
/// `iptables-restore` would have, both families in one transaction. That saves the restores'
/// process starts (2 ms each, and competing for the CPU with the reads) and their loads of the
/// table. Returns false when the caller must run the restores: a family's tools are legacy,
/// the plan writes anything else (the first ADD on a node creates chains and jumps), or the
/// transaction failed (logged).
fn append_natively(plans: &[(Family, AddPlan)]) -> bool {
    let mut batch = Batch::new();
    for (family, plan) in plans {
        if !plan.only_appends_accepts()
            || (!plan.accepts.is_empty() && !native::writes_nf_tables(*family))
        {
            return false;
        }
        for args in &plan.accepts {
            let Some(rule) = native::encode_rule(*family, args) else {
                return false;
            };
            batch.add_rule(
                &native::nft_table(*family, FILTER_TABLE),
                CNI_FORWARD_CHAIN,
                &rule,
            );
        }
    }
    if batch.is_empty() {
        return true;
    }
    match Nft::new().and_then(|mut nft| nft.apply(&batch)) {
        Ok(()) => {
            log::debug!("appended {} rule(s) over nf_tables netlink", batch.len());
            true
        }
        Err(e) => {
            log::debug!("appending over nf_tables failed ({e}); using iptables-restore");
            false
        }
    }
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

/// The iptables backend.
#[derive(Debug)]
pub struct Iptables {
    config: Config,
    state: State,
}

impl Iptables {
    /// The backend for `config`, keeping its state in `state`.
    #[must_use]
    pub fn new(config: Config, state: State) -> Iptables {
        Iptables { config, state }
    }

    /// Deletes the accepts of `ips` (those no other attachment claims) in every family they
    /// belong to, and forgets the attachment.
    fn remove(&self, name: &str, ips: &[IpAddr]) -> Result<(), FirewallError> {
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
        match delete_accepts_nft(&families, &mine) {
            Ok(true) => return self.state.forget(name, ips),
            Ok(false) => {}
            Err(e) => log::debug!("DEL {name}: over nf_tables: {e}; using iptables-restore"),
        }
        let mut first_error = None;
        for (family, result) in per_family(&families, |family| delete_accepts(family, &mine)) {
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

    fn add(&mut self, owner: &Owner, target: &Target) -> Result<(), FirewallError> {
        let _lock = self.state.lock()?;
        let families = target.families();
        let name = owner.state_name();
        let known = self.state.attachment(&name)?.is_some();
        // Every accept this backend commits is recorded first, so unless the attachment or
        // one of its addresses is recorded, its accepts are not in the table (but for copies
        // written by something else, such as the Go plugin before an upgrade for a container
        // ADDed again without a DEL, which are then duplicated; DEL removes every copy).
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
        // Recorded before any rule is committed: a call killed after its commit (or an
        // `iptables-restore` it fed, finishing after it) leaves rules that only the record
        // lets a DEL without prevResult find.
        self.state.record(&name, &target.ips)?;
        if append_natively(&plans) {
            return Ok(());
        }
        let results: Vec<(Family, Result<(), IptablesError>)> =
            concurrently(plans.iter().collect(), |(family, plan)| {
                let result = plan
                    .lines()
                    .and_then(|lines| Tools::new(*family).restore(FILTER_TABLE, &lines));
                (*family, result)
            });
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
                    .map(|args| restore_line("-D", CNI_FORWARD_CHAIN, args))
                    .collect();
                let undone = undo.and_then(|undo| Tools::new(*family).restore(FILTER_TABLE, &undo));
                if let Err(u) = undone {
                    log::warn!("ADD rollback in {family} failed: {u}");
                }
            }
            if let Some(e) = results.into_iter().find_map(|(_, r)| r.err()) {
                // A first ADD leaves no record behind; a repeated one keeps its record, whose
                // earlier rules are still there.
                if !known && let Err(f) = self.state.forget(&name, &target.ips) {
                    log::warn!("ADD rollback of the state of {name} failed: {f}");
                }
                return Err(e.into());
            }
        }
        Ok(())
    }

    fn check(&mut self, _owner: &Owner, target: &Target) -> Result<(), FirewallError> {
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

    fn del(&mut self, owner: &Owner, target: Option<&Target>) -> Result<(), FirewallError> {
        let _lock = self.state.lock()?;
        let name = owner.state_name();
        let ips = self.state.ips_to_remove(&name, target)?;
        self.remove(&name, &ips)
    }

    fn gc(&mut self, network: &str, valid: &[Attachment]) -> Result<(), FirewallError> {
        let _lock = self.state.lock()?;
        let mut first_error = None;
        for name in self.state.attachments_of(network)? {
            let live = valid
                .iter()
                .any(|a| crate::names::state_name(network, &a.container_id, &a.ifname) == name);
            if live {
                continue;
            }
            let ips = self
                .state
                .attachment(&name)?
                .map(|s| s.ips)
                .unwrap_or_default();
            if let Err(e) = self.remove(&name, &ips) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
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
