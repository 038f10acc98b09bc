//! `portmap reconcile` of our map layout: what the tables lack of the recorded attachments,
//! found with one read of our own objects per family (the table, each map and set listed
//! once, the skeleton's chains listed), and its repair in one transaction for both families.

use std::collections::HashMap;

use netfilter::nft::{Batch, Element, Value};

use super::layout::{self, NftOp, NftPlan, Observed};
use super::{
    Nftables, add_ops, nft_err, plans_of, skeleton_chains, skeleton_rules, skeleton_sets, table,
};
use crate::backend::{Lack, Lacking};
use crate::config::IpFamily;
use crate::error::PortmapError;
use crate::names;
use crate::state::State;

/// What one family's skeleton lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkeletonRepair {
    /// The table's family.
    family: IpFamily,
    /// The table itself is missing.
    table: bool,
    /// The maps and sets missing.
    sets: Vec<String>,
    /// The chains missing.
    chains: Vec<String>,
    /// The chains whose rules are written again, in order (flushed first where they exist).
    rewrite: Vec<&'static str>,
}

/// What our map layout lacks of recorded attachments: per family the skeleton's repair, per
/// attachment the operations that put its elements (and gate chain) back.
pub type NftLacking = Lacking<Vec<SkeletonRepair>, Vec<NftOp>>;

/// What the kernel holds of one family's table, as read once.
#[derive(Debug, Default)]
struct Read {
    /// The table exists.
    table: bool,
    /// The elements of every map and set, by set and key; elements expiring (a DEL's) are
    /// left out.
    elements: HashMap<String, HashMap<Vec<Value>, Element>>,
}

impl Nftables {
    /// What our tables lack of `records` (each made by this layout): the skeleton of the
    /// families they need, and each attachment's elements and gate chain, compared with what
    /// its ADD makes ([`layout::nft_add`] against what the kernel holds at its keys). An
    /// attachment whose host port another owner holds now is refused, not restored. Nothing
    /// is written.
    ///
    /// # Errors
    /// nf_tables failures.
    pub fn lacking(&mut self, records: &[State]) -> Result<NftLacking, PortmapError> {
        let mut lacking = NftLacking::default();
        let mut plans: Vec<(usize, Vec<(IpFamily, NftPlan)>)> = Vec::new();
        for (i, record) in records.iter().enumerate() {
            match plans_of(record) {
                Ok(p) => plans.push((i, p)),
                Err(e) => lacking.refused.push((i, e.to_string())),
            }
        }
        let mut families: Vec<IpFamily> = Vec::new();
        for (_, p) in &plans {
            for (f, _) in p {
                if !families.contains(f) {
                    families.push(*f);
                }
            }
        }
        families.sort();
        let mut read: HashMap<IpFamily, Read> = HashMap::new();
        for family in families {
            let (found, repair) = self.read_family(family)?;
            if let Some(repair) = repair {
                lacking.shared.extend(describe_skeleton(&repair));
                lacking.shared_repair.push(repair);
            }
            read.insert(family, found);
        }
        for (i, plans) in plans {
            let Some(record) = records.get(i) else {
                continue;
            };
            let owner = names::owner(&record.attachment());
            let mut ops = Vec::new();
            let mut refused = None;
            for (family, plan) in &plans {
                let Some(found) = read.get(family) else {
                    continue;
                };
                let seen = self.observed(*family, plan, found)?;
                match layout::nft_add(&owner, &[(*family, plan.clone())], &seen, &[]) {
                    // A gate chain that is there is left as it is.
                    Ok(mut add) => {
                        add.retain(|op| {
                            !matches!(op, NftOp::PutChain { family, chain, .. }
                                if seen.has_chain(*family, chain))
                        });
                        ops.extend(add);
                    }
                    Err(e) => refused = Some(e.to_string()),
                }
            }
            if let Some(why) = refused {
                lacking.refused.push((i, why));
            } else if !ops.is_empty() {
                lacking.attachments.push(Lack {
                    index: i,
                    what: describe(&ops),
                    repair: ops,
                });
            }
        }
        Ok(lacking)
    }

    /// Reads what `family`'s table holds, and what its skeleton lacks.
    fn read_family(
        &mut self,
        family: IpFamily,
    ) -> Result<(Read, Option<SkeletonRepair>), PortmapError> {
        let t = table(family);
        let nft = self.nft()?;
        let mut repair = SkeletonRepair {
            family,
            table: false,
            sets: Vec::new(),
            chains: Vec::new(),
            rewrite: Vec::new(),
        };
        let mut found = Read::default();
        if !nft.table_exists(&t).map_err(nft_err)? {
            repair.table = true;
            repair.sets = skeleton_sets(family).into_iter().map(|s| s.name).collect();
            repair.chains = skeleton_chains().into_iter().map(|c| c.name).collect();
            repair.rewrite = skeleton_order(family);
            return Ok((found, Some(repair)));
        }
        found.table = true;
        for set in skeleton_sets(family) {
            match nft.elements(&t, &set.name) {
                Ok(elements) => {
                    let by_key = found.elements.entry(set.name.clone()).or_default();
                    for e in elements.into_iter().filter(|e| !e.is_expiring()) {
                        by_key.insert(e.key.clone(), e);
                    }
                }
                Err(e) if e.is_not_found() => repair.sets.push(set.name),
                Err(e) => return Err(nft_err(e)),
            }
        }
        let rules = skeleton_rules(family);
        for chain in skeleton_order(family) {
            let have = match nft.rules(&t, chain) {
                Ok(have) => have,
                Err(e) if e.is_not_found() => {
                    repair.chains.push(chain.to_string());
                    repair.rewrite.push(chain);
                    continue;
                }
                Err(e) => return Err(nft_err(e)),
            };
            let want: Vec<_> = rules.iter().filter(|(c, _)| *c == chain).collect();
            // Ours alone, in order: anything else is written again.
            let whole = have.len() == want.len()
                && have.iter().zip(&want).all(|(h, (_, r))| h.is(r, t.family));
            if !whole {
                repair.rewrite.push(chain);
            }
        }
        let lacks =
            !(repair.sets.is_empty() && repair.chains.is_empty() && repair.rewrite.is_empty());
        Ok((found, lacks.then_some(repair)))
    }

    /// What the kernel holds at the keys of `plan` (from `found`, read once) and its gate
    /// chain (looked up: only attachments with conditions have one).
    fn observed(
        &mut self,
        family: IpFamily,
        plan: &NftPlan,
        found: &Read,
    ) -> Result<Observed, PortmapError> {
        let mut seen = Observed::default();
        for (set, key) in layout::lookups(plan) {
            if seen.element(family, set, key).is_some() {
                continue;
            }
            if let Some(e) = found.elements.get(set).and_then(|by_key| by_key.get(key)) {
                seen.elements.push((family, set, e.clone()));
            }
        }
        if let Some((chain, _)) = &plan.gate
            && found.table
            && self
                .nft()?
                .chain_exists(&table(family), chain)
                .map_err(nft_err)?
        {
            seen.chains.push((family, chain.clone()));
        }
        Ok(seen)
    }

    /// Puts back, in one transaction, the shared objects `lacking` names and what the
    /// attachments at positions `live` lack.
    ///
    /// # Errors
    /// The kernel's refusal: nothing of it is written.
    pub fn restore(&mut self, lacking: &NftLacking, live: &[usize]) -> Result<(), PortmapError> {
        let mut batch = Batch::new();
        for repair in &lacking.shared_repair {
            repair_skeleton(&mut batch, repair);
        }
        for lack in lacking
            .attachments
            .iter()
            .filter(|l| live.contains(&l.index))
        {
            add_ops(&mut batch, &lack.repair);
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.nft()?.apply(&batch).map_err(nft_err)
    }
}

/// The skeleton's chains of `family` in the order their rules are made.
fn skeleton_order(family: IpFamily) -> Vec<&'static str> {
    let mut chains: Vec<&'static str> = Vec::new();
    for (chain, _) in skeleton_rules(family) {
        if !chains.contains(&chain) {
            chains.push(chain);
        }
    }
    chains
}

/// Adds to `batch` what `repair` puts back of a family's skeleton: the table, the sets and
/// chains missing, and the rules of the chains written again (emptied first where they
/// exist, so that nothing is there twice and the order is the layout's).
fn repair_skeleton(batch: &mut Batch, repair: &SkeletonRepair) {
    let t = table(repair.family);
    if repair.table {
        batch.add_table(&t);
    }
    for set in skeleton_sets(repair.family) {
        if repair.sets.contains(&set.name) {
            batch.add_set(&t, &set);
        }
    }
    for chain in skeleton_chains() {
        if repair.chains.contains(&chain.name) {
            batch.add_chain(&t, &chain);
        }
    }
    let rules = skeleton_rules(repair.family);
    for chain in &repair.rewrite {
        if !repair.chains.iter().any(|c| c == chain) {
            batch.flush_chain(&t, chain);
        }
        for (c, rule) in &rules {
            if c == chain {
                batch.add_rule(&t, chain, rule);
            }
        }
    }
}

/// What a skeleton's repair restores, as the lines name it.
fn describe_skeleton(repair: &SkeletonRepair) -> Vec<String> {
    let t = table(repair.family);
    if repair.table {
        return vec![format!("table {t}")];
    }
    let mut what: Vec<String> = repair.sets.iter().map(|s| format!("set {t} {s}")).collect();
    what.extend(repair.chains.iter().map(|c| format!("chain {t} {c}")));
    what.extend(
        repair
            .rewrite
            .iter()
            .filter(|c| !repair.chains.iter().any(|m| m == *c))
            .map(|c| format!("rules of chain {t} {c}")),
    );
    what
}

/// What an attachment's operations restore, as the lines name it: the maps and sets its
/// elements go into, and its gate chain.
fn describe(ops: &[NftOp]) -> Vec<String> {
    let mut what: Vec<String> = Vec::new();
    let mut push = |s: String| {
        if !what.contains(&s) {
            what.push(s);
        }
    };
    for op in ops {
        match op {
            NftOp::AddElement { family, set, .. } => {
                push(format!("elements of {} {set}", table(*family)));
            }
            NftOp::PutChain { family, chain, .. } => {
                push(format!("chain {} {chain}", table(*family)));
            }
            NftOp::DelElement { .. } | NftOp::DelChain { .. } => {}
        }
    }
    what
}
