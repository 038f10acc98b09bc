//! The reference's iptables layout in the `filter` table ([`iptables_part`]: `CNI-FORWARD`,
//! the admin chain, the isolation chains, the jumps to them and each attachment's accepts),
//! written by the one iptables writer ([`netfilter::iptables::writer`]), chosen once per call
//! from the tools on the node: natively over nf_tables where they are `iptables-nft` (one
//! transaction for both families, reading only the chains concerned, nothing exec'd), else
//! with `iptables-save` and `iptables-restore`. Under the namespace's lock ([`State`]).
//!
//! - ADD: records the attachment, then writes what the table lacks of its part in each
//!   family; the handles the kernel gave the accepts appended natively go into the record, so
//!   that DEL deletes them without listing `CNI-FORWARD` (which grows with the attachments).
//!   An ADD whose addresses the state does not know does not look for its accepts (nor for
//!   the admin jump beyond the first rule naming the admin chain).
//! - CHECK: the writer's first absent chain or rule of each family's part, named as the
//!   reference names it.
//! - DEL, GC: the accepts of the addresses no newer attachment claims, by their recorded
//!   handles where they still name them, else every copy; chains, jumps and isolation rules
//!   are shared and stay.

use std::collections::BTreeMap;
use std::net::IpAddr;

use cni::Attachment;
use cni::conf::GcAttachment;
use netfilter::iptables::native::{self, Wanted};
use netfilter::iptables::writer::{Applied, Part, Plan, Writer};
use netfilter::iptables::{Family, Iptables as Tools, IptablesError, TableDump};
use netfilter::nft::LazyNft;

use super::state::{Accept, AttachmentState, Made, State};
use super::{FirewallBackend, Missing, Recorded, Restored};
use crate::config::Config;
use crate::error::FirewallError;
use crate::names::{CNI_FORWARD_CHAIN, FILTER_TABLE, FORWARD_CHAIN, STAGE1_CHAIN, STAGE2_CHAIN};
use crate::plan::{
    Target, accept_ips, iptables_lacking, iptables_missing, iptables_part, iptables_unrule,
};

/// The handles ADD recorded for the accepts of `ips` in `family` (`recorded`), when each
/// address of the family has its two, all in one incarnation of the table; `None` otherwise,
/// and DEL looks them up in the chain.
fn recorded_of(family: Family, ips: &[IpAddr], recorded: &[Accept]) -> Option<native::Recorded> {
    let ips: Vec<IpAddr> = ips
        .iter()
        .copied()
        .filter(|ip| Family::of(ip) == family)
        .collect();
    let mine: Vec<&Accept> = recorded.iter().filter(|a| ips.contains(&a.ip)).collect();
    if ips
        .iter()
        .any(|ip| mine.iter().filter(|a| a.ip == *ip).count() < 2)
    {
        return None;
    }
    let table = mine.first()?.table;
    if mine.iter().any(|a| a.table != table) {
        return None;
    }
    Some(native::Recorded {
        family,
        table,
        rules: mine.iter().map(|a| a.handle).collect(),
    })
}

/// The accepts `applied` appended with their handles (natively), each with its address (the
/// parts' recorded rules are the accepts of [`accept_ips`], in order). None when a family's
/// handles do not match the accepts it added: DEL then looks them up.
fn appended(plan: &Plan, applied: &Applied, target: &Target) -> Vec<Accept> {
    let mut accepts = Vec::new();
    for recorded in &applied.recorded {
        let family = recorded.family;
        let (Some(part), Some((_, added))) = (
            plan.parts.iter().find(|p| p.family == family),
            applied.added.iter().find(|(f, _)| *f == family),
        ) else {
            continue;
        };
        let ips = accept_ips(family, target);
        let accept_rules: Vec<usize> = (0..part.rules.len())
            .filter(|i| part.rules[*i].recorded)
            .collect();
        let added: Vec<IpAddr> = added
            .rules
            .iter()
            .filter_map(|i| accept_rules.iter().position(|r| r == i))
            .filter_map(|k| ips.get(k).copied())
            .collect();
        if added.len() != recorded.rules.len() {
            // Committed, but the echo does not say which rule is which: DEL looks them up.
            log::warn!(
                "{} of {} appended {family} rule(s) echoed; not recording handles",
                recorded.rules.len(),
                added.len()
            );
            return Vec::new();
        }
        accepts.extend(
            added
                .into_iter()
                .zip(&recorded.rules)
                .map(|(ip, handle)| Accept {
                    ip,
                    handle: *handle,
                    table: recorded.table,
                }),
        );
    }
    accepts
}

/// The addresses whose accepts `applied` added (natively or with the tools).
fn added_accepts(plan: &Plan, applied: &Applied, target: &Target) -> Vec<IpAddr> {
    let mut ips = Vec::new();
    for (part, (family, added)) in plan.parts.iter().zip(&applied.added) {
        let accept_ips = accept_ips(*family, target);
        let accept_rules: Vec<usize> = (0..part.rules.len())
            .filter(|i| part.rules[*i].recorded)
            .collect();
        ips.extend(
            added
                .rules
                .iter()
                .filter_map(|i| accept_rules.iter().position(|r| r == i))
                .filter_map(|k| accept_ips.get(k).copied()),
        );
    }
    ips
}

/// The chains of the `filter` table that hold the layout, every rule of them, for
/// `reconcile`'s check of all the attachments at once (with thousands of addresses, a
/// filter by each would cost more than decoding the chain): read over nf_tables where the
/// tools are `iptables-nft`, else with `iptables-save`.
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
        let unrules: Vec<_> = families
            .iter()
            .map(|f| iptables_unrule(*f, &mine, recorded_of(*f, &mine, recorded)))
            .collect();
        Writer::choose(&mut self.nft, FILTER_TABLE, &families, &[])
            .delete_rules(&unrules)
            .inspect_err(|e| log::warn!("DEL {name}: {e}"))?;
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
        let fresh = !(known || self.state.claims_any(&target.ips)?);
        let plan = Plan {
            table: FILTER_TABLE.to_owned(),
            parts: families
                .iter()
                .map(|f| iptables_part(*f, &self.config, target, fresh))
                .collect(),
            // The skeleton and isolation rules are shared and may stay.
            undo_rules: families
                .iter()
                .map(|f| iptables_unrule(*f, &target.ips, None))
                .collect(),
            ..Plan::default()
        };
        let made = Made::new(self.name(), &self.config, owner, target);
        let mut writer = Writer::for_plan(&mut self.nft, &plan);
        if let Some(first) = families.first()
            && !writer.chain_exists(*first, CNI_FORWARD_CHAIN)?
        {
            // A namespace without our skeleton has no attachments of ours: state under its
            // inode number is a dead namespace's.
            self.state.reset()?;
        }
        // The accepts a repeated ADD finds in place stay those of the record (those of an
        // address whose accepts are written again, after a flush, are dropped below).
        let kept: Vec<Accept> = existing
            .map(|e| e.accepts)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| target.ips.contains(&a.ip))
            .collect();
        let mut record = AttachmentState {
            ips: target.ips.clone(),
            accepts: kept,
            made: Some(made),
        };
        // Recorded before any rule is committed: a call killed after its commit (or an
        // `iptables-restore` it fed, finishing after it) leaves rules that only the record
        // lets a DEL without prevResult find (a stale handle kept meanwhile names nothing,
        // and DEL then looks the accepts up).
        self.state.record(&name, &record)?;
        if families.is_empty() {
            return Ok(());
        }
        let applied = match writer.apply(&plan) {
            Ok(applied) => applied,
            Err(e) => {
                // Nothing of this attachment's own was written. A first ADD leaves no record
                // behind; a repeated one keeps its record, whose earlier rules are still there.
                if !known && let Err(f) = self.state.forget(&name, &target.ips) {
                    log::warn!("ADD rollback of the state of {name} failed: {f}");
                }
                return Err(e.into());
            }
        };
        let rewritten = added_accepts(&plan, &applied, target);
        let appended = appended(&plan, &applied, target);
        let stale = record.accepts.iter().any(|a| rewritten.contains(&a.ip));
        if stale || !appended.is_empty() {
            record.accepts.retain(|a| !rewritten.contains(&a.ip));
            record.accepts.extend(appended);
            if let Err(e) = self.state.rewrite(&name, &record) {
                // DEL then looks the accepts up in the chain.
                log::warn!("ADD {name}: recording the accepts' handles: {e}");
            }
        }
        Ok(())
    }

    fn check(&mut self, _owner: &Attachment, target: &Target) -> Result<(), FirewallError> {
        let families = target.families();
        let parts: Vec<Part> = families
            .iter()
            .map(|f| iptables_part(*f, &self.config, target, false))
            .collect();
        let mut writer = Writer::choose(&mut self.nft, FILTER_TABLE, &families, &parts);
        for part in &parts {
            if let Some(missing) = iptables_missing(part, |p| writer.missing(p, None))? {
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
        for family in families {
            let found = iptables_lacking(
                &read_all(family, &self.config)?,
                family,
                &self.config,
                &targets,
            );
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
