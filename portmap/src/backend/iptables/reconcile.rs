//! `portmap reconcile` of the reference's iptables layout: what table `nat` lacks of the
//! recorded attachments, found by the writer with one read of each family's table for all
//! of them ([`Writer::lacking`]), and its repair as one plan (one transaction natively, one
//! `iptables-restore` per family with the tools).

use std::collections::HashSet;

use netfilter::iptables::native::RuleSpec;
use netfilter::iptables::writer::{Part, Plan, Writer};
use netfilter::iptables::{Family, restore_line};

use super::layout::{self, NAT};
use super::{Iptables, plan_families};
use crate::backend::{Lack, Lacking};
use crate::config::IpFamily;
use crate::error::{PortmapError, write_error};
use crate::names;
use crate::state::State;

/// What the layout lacks of recorded attachments: the shared chains and rules missing, per
/// family, and per attachment its chains and rules missing, as parts the writer writes.
pub type IptLacking = Lacking<Vec<Part>, Vec<Part>>;

impl Iptables {
    /// What table `nat` lacks of `records` (each made by this layout, with the configuration
    /// it was made with: [`State::made_with`]): the shared chains and the jumps into them,
    /// each attachment's `CNI-DN-` chain, its rules and its entry rules. Nothing is written.
    ///
    /// # Errors
    /// The writer's failure to read the table.
    pub fn lacking(&mut self, records: &[State]) -> Result<IptLacking, PortmapError> {
        let mut lacking = IptLacking::default();
        let mut parts: Vec<(usize, Part)> = Vec::new();
        for (i, record) in records.iter().enumerate() {
            let Some(config) = record.made_with() else {
                lacking
                    .refused
                    .push((i, "its record does not say how its rules were made".into()));
                continue;
            };
            for ip in &record.ips {
                parts.push((i, layout::add_part(&config, &record.container_id, *ip)));
            }
        }
        if parts.is_empty() {
            return Ok(lacking);
        }
        let all: Vec<Part> = parts.iter().map(|(_, p)| p.clone()).collect();
        let families: Vec<Family> = families_of(&all);
        // Whether the rules are written natively depends on their form, not on their
        // addresses and ports: the first part of each family and the parts of attachments with
        // conditions or an external mark chain (a user's words) decide.
        let mut deciding: Vec<Part> = Vec::new();
        for (i, part) in &parts {
            let unusual = records.get(*i).is_some_and(|r| {
                r.iptables.as_ref().is_some_and(|m| {
                    m.external_set_mark_chain.is_some()
                        || !m.conditions_v4.is_empty()
                        || !m.conditions_v6.is_empty()
                })
            });
            if unusual || !deciding.iter().any(|p| p.family == part.family) {
                deciding.push(part.clone());
            }
        }
        let mut writer = Writer::choose(&mut self.nft, NAT, &families, &deciding);
        let found = writer.lacking(&all).map_err(write_error)?;
        let mut shared_seen: HashSet<(Family, String, Vec<String>)> = HashSet::new();
        for ((i, part), missing) in parts.into_iter().zip(found) {
            if missing.is_empty() {
                continue;
            }
            let Some(record) = records.get(i) else {
                continue;
            };
            let own = names::dnat_chain(&record.network, &record.container_id);
            let family = part.family;
            let fam = match IpFamily::from(family) {
                IpFamily::V4 => "ipv4",
                IpFamily::V6 => "ipv6",
            };
            let mut mine = Part {
                family,
                chains: Vec::new(),
                rules: Vec::new(),
            };
            let mut what = Vec::new();
            for chain in missing.chains {
                if chain == own {
                    what.push(format!("chain {chain} ({fam})"));
                    mine.chains.push(chain);
                } else if shared_seen.insert((family, chain.clone(), Vec::new())) {
                    lacking.shared.push(format!("chain {chain} ({fam})"));
                    shared(&mut lacking.shared_repair, family)
                        .chains
                        .push(chain);
                }
            }
            let (mut rules, mut entries) = (0, 0);
            for index in missing.rules {
                let Some(spec) = part.rules.get(index) else {
                    continue;
                };
                if spec.chain == own {
                    rules += 1;
                    mine.rules.push(spec.clone());
                } else if spec.recorded {
                    entries += 1;
                    mine.rules.push(spec.clone());
                } else if shared_seen.insert((family, spec.chain.clone(), spec.args.clone())) {
                    lacking.shared.push(format!("rule {} ({fam})", line(spec)));
                    shared(&mut lacking.shared_repair, family)
                        .rules
                        .push(spec.clone());
                }
            }
            if rules > 0 {
                what.push(format!("{rules} rule(s) of {own} ({fam})"));
            }
            if entries > 0 {
                what.push(format!(
                    "{entries} entry rule(s) in {} ({fam})",
                    names::IPT_TOPLEVEL_DNAT
                ));
            }
            if mine.chains.is_empty() && mine.rules.is_empty() {
                continue;
            }
            match lacking.attachments.iter_mut().find(|l| l.index == i) {
                Some(lack) => {
                    lack.what.extend(what);
                    lack.repair.push(mine);
                }
                None => lacking.attachments.push(Lack {
                    index: i,
                    what,
                    repair: vec![mine],
                }),
            }
        }
        Ok(lacking)
    }

    /// Puts back the shared objects `lacking` names and what the attachments at positions
    /// `live` lack, as one plan: per family the shared chains and rules first, then the
    /// attachments' (`records`, for the chains a failed family's write removes again).
    ///
    /// # Errors
    /// The writer's failure: nothing of the failed transaction is written.
    pub fn restore(
        &mut self,
        records: &[State],
        lacking: &IptLacking,
        live: &[usize],
    ) -> Result<(), PortmapError> {
        let mut parts: Vec<Part> = lacking.shared_repair.clone();
        let mut undo = Vec::new();
        for lack in lacking
            .attachments
            .iter()
            .filter(|l| live.contains(&l.index))
        {
            for part in &lack.repair {
                let merged = shared(&mut parts, part.family);
                for chain in &part.chains {
                    if !merged.chains.contains(chain) {
                        merged.chains.push(chain.clone());
                    }
                }
                merged.rules.extend(part.rules.iter().cloned());
            }
            // What a failed later family's write removes of the first: the chains it made.
            if let Some(record) = records.get(lack.index) {
                let made: Vec<&str> = lack
                    .repair
                    .iter()
                    .flat_map(|p| p.chains.iter().map(String::as_str))
                    .collect();
                if !made.is_empty() {
                    undo.extend(
                        layout::unchains(
                            &record.network,
                            &record.container_id,
                            &plan_families(&record.ips),
                            None,
                        )
                        .into_iter()
                        .filter(|u| made.contains(&u.chain.as_str())),
                    );
                }
            }
        }
        parts.retain(|p| !(p.chains.is_empty() && p.rules.is_empty()));
        if parts.is_empty() {
            return Ok(());
        }
        let plan = Plan {
            table: NAT.to_string(),
            removals: Vec::new(),
            parts,
            undo,
            // The shared rules a first family got stay: its attachments that remain need them.
            undo_rules: Vec::new(),
        };
        Writer::for_plan(&mut self.nft, &plan)
            .apply(&plan)
            .map(drop)
            .map_err(write_error)
    }
}

/// The part of `family` in `parts`, added empty where there is none.
fn shared(parts: &mut Vec<Part>, family: Family) -> &mut Part {
    let at = match parts.iter().position(|p| p.family == family) {
        Some(at) => at,
        None => {
            parts.push(Part {
                family,
                chains: Vec::new(),
                rules: Vec::new(),
            });
            parts.len() - 1
        }
    };
    &mut parts[at]
}

/// The families of `parts`, each once.
fn families_of(parts: &[Part]) -> Vec<Family> {
    let mut families = Vec::new();
    for p in parts {
        if !families.contains(&p.family) {
            families.push(p.family);
        }
    }
    families
}

/// A rule as the lines name it: its `iptables-save` line.
fn line(spec: &RuleSpec) -> String {
    restore_line("-A", &spec.chain, &spec.args)
        .unwrap_or_else(|_| format!("-A {} {}", spec.chain, spec.args.join(" ")))
}
