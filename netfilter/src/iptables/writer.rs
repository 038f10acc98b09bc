//! The one writer of an iptables layout.
//!
//! A plugin says what one iptables table should hold, in the tools' words: per family the
//! chains and the rules ([`Part`], rules as [`RuleSpec`]s: argument lists as `iptables-save`
//! prints them, appended or inserted, their handles recorded or not), and the chains to remove
//! with the rules jumping to them ([`Unchain`]). [`Writer::choose`] picks, once per call, from
//! the tools on the node and the rules of the call, how that is written:
//!
//! - **natively** where every family's tools are `iptables-nft` ([`native::variant`]) and the
//!   native encoder takes every rule ([`native::writes`]): over nf_tables netlink, one
//!   transaction for both families, reading only the chains concerned ([`NativeTables`]);
//! - **with the tools** otherwise (the legacy tools, an unknown build, a rule the encoder does
//!   not write, such as options the tools read as abbreviations): one `iptables-save` and one
//!   `iptables-restore --noflush` per family, whose cost grows with the table.
//!
//! Both compare rules by meaning (the native side in the codec's canonical words, the tools'
//! in theirs), write only what is missing, and name what CHECK misses the same way
//! ([`Absent`]). The caller never learns which one it got; locks are the caller's.

use std::collections::{HashMap, HashSet};

use super::native::{
    self, Lookup, Missing, NativeError, NativeTables, Position, Recorded, Removal, RuleSpec,
    Variant, Wanted,
};
use super::{Family, Iptables, IptablesError, TableDump, restore_line};
use crate::nft::{Expr, LazyNft, Verdict};

/// What one family's table should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The family.
    pub family: Family,
    /// Regular chains, created when missing, in order.
    pub chains: Vec<String>,
    /// Rules, each written once when missing, in order.
    pub rules: Vec<RuleSpec>,
}

/// A chain to remove from one family's table with the rules of `from` that jump to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unchain {
    /// The family.
    pub family: Family,
    /// The chain holding the jumps.
    pub from: String,
    /// The chain to remove.
    pub chain: String,
    /// The handles of the jumps, where a caller recorded them ([`Applied::recorded`]).
    pub recorded: Option<Recorded>,
}

/// Rules to delete from one chain of one family's table ([`Writer::delete_rules`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unrule {
    /// The family.
    pub family: Family,
    /// The chain.
    pub chain: String,
    /// The rules, in the tools' words (without `-A CHAIN`): every copy of each is deleted,
    /// unless `recorded` names them.
    pub rules: Vec<Vec<String>>,
    /// The handles of exactly the copies to delete, where a caller recorded them
    /// ([`Applied::recorded`]): natively, while the table is the incarnation they were
    /// recorded in, those rules go and the chain is not listed.
    pub recorded: Option<Recorded>,
}

/// A change to one iptables table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The iptables table (`nat`, `filter`).
    pub table: String,
    /// Chains to remove first, with their jumps, in the same transaction as the parts where
    /// their family has one. A removal in a family without a part is made after the parts,
    /// on its own: its failure is logged, unless the plan is only removals.
    pub removals: Vec<Unchain>,
    /// What each family's table should hold.
    pub parts: Vec<Part>,
    /// What to remove from a family whose part was written when a later family's part
    /// fails (the tools commit per family; natively both families are one transaction).
    pub undo: Vec<Unchain>,
    /// Likewise, rules to delete from such a family: one copy of each that the write added
    /// (the rules it found in place stay; `recorded` is not used).
    pub undo_rules: Vec<Unrule>,
}

/// What [`Writer::apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Per part, what was missing and written (positions in its chains and rules).
    pub added: Vec<(Family, Missing)>,
    /// The handles of the recorded rules written, per family (natively only: the tools do
    /// not tell).
    pub recorded: Vec<Recorded>,
}

/// The first thing of a [`Part`] the table lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absent {
    /// A chain of the part.
    Chain(String),
    /// A rule of the part.
    Rule {
        /// Its position in the part's rules.
        index: usize,
        /// The rule as it was looked for, in `iptables-save`'s words.
        args: Vec<String>,
    },
}

/// A rule of a chain as far as a caller tells jumps apart: its `-m comment` and the chain it
/// jumps to, whatever wrote it (read without decoding the rest).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Jump {
    /// Its `--comment`.
    pub comment: Option<String>,
    /// The chain of its `-j CHAIN`.
    pub target: Option<String>,
}

/// A failure of the writer.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Over nf_tables.
    #[error(transparent)]
    Native(#[from] NativeError),
    /// The tools.
    #[error(transparent)]
    Tools(#[from] IptablesError),
}

/// A failed removal ([`Writer::remove_chains`]).
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    /// The removal was refused in `family` (a chain another rule still jumps to, an
    /// operator's): what could go went, as the tools' `-F` before `-X` has it.
    #[error("{cause}")]
    Refused {
        /// The family.
        family: Family,
        /// Why.
        cause: WriteError,
    },
    /// The writer could not do it (the table could not be read, the xtables lock stayed
    /// held, a tool timed out).
    #[error(transparent)]
    Failed(WriteError),
}

/// How a [`Writer`] writes.
#[derive(Debug)]
enum How<'n> {
    /// Over the call's nf_tables socket.
    Native(&'n mut LazyNft),
    /// With the tools; the tables read, per family, until the writer changes them.
    Tools(HashMap<Family, TableDump>),
}

/// The writer of one iptables table for one call.
#[derive(Debug)]
pub struct Writer<'n> {
    table: String,
    how: How<'n>,
}

impl<'n> Writer<'n> {
    /// The writer of `table` for a call touching `families` with the rules of `parts`:
    /// native where every family's tools are `iptables-nft` and the encoder takes every rule
    /// (over `nft`, the call's socket), else the tools.
    pub fn choose(nft: &'n mut LazyNft, table: &str, families: &[Family], parts: &[Part]) -> Self {
        // A removal in a family without any tools goes over nf_tables too, unless the
        // namespace holds that x_tables table: whatever iptables-nft wrote is there, and
        // nothing could remove legacy rules without the tools.
        let removing = parts.is_empty();
        let tools_nft = families
            .iter()
            .chain(parts.iter().map(|p| &p.family))
            .all(|f| match native::variant(*f) {
                Variant::Nft => true,
                Variant::Missing => removing && !legacy_table_exists(*f, table),
                Variant::Legacy | Variant::Other => false,
            });
        let refused = parts.iter().find_map(|p| {
            p.rules
                .iter()
                .find(|r| !native::writes(table, p.family, r))
                .map(|r| (p.family, r))
        });
        if let Some((family, rule)) = refused.filter(|_| tools_nft) {
            log::debug!(
                "{family} {table}: -A {} {} is not written natively: using the tools",
                rule.chain,
                rule.args.join(" ")
            );
        }
        let how = if tools_nft && refused.is_none() {
            How::Native(nft)
        } else {
            How::Tools(HashMap::new())
        };
        Writer {
            table: table.to_owned(),
            how,
        }
    }

    /// The tools' writer of `table`, whatever the node's tools are.
    #[cfg(test)]
    fn with_tools(table: &str) -> Writer<'static> {
        Writer {
            table: table.to_owned(),
            how: How::Tools(HashMap::new()),
        }
    }

    /// [`Writer::choose`] for `plan`'s families and rules.
    #[must_use]
    pub fn for_plan(nft: &'n mut LazyNft, plan: &Plan) -> Self {
        let families: Vec<Family> = plan.removals.iter().map(|r| r.family).collect();
        Writer::choose(nft, &plan.table, &families, &plan.parts)
    }

    /// The table of `family` as the tools print it, where this writer reads whole tables
    /// (the tools' way; read once per call until the writer changes it): for a caller that
    /// looks further in a table read anyway. `None` natively, where chains are read as needed.
    ///
    /// # Errors
    /// The tools' failure.
    pub fn whole_table(&mut self, family: Family) -> Result<Option<&TableDump>, WriteError> {
        match &mut self.how {
            How::Native(_) => Ok(None),
            How::Tools(dumps) => Ok(Some(dump(dumps, &self.table, family)?)),
        }
    }

    /// Whether `chain` exists in `family`'s table (a table, or an nf_tables, that is not
    /// there holds none).
    ///
    /// # Errors
    /// nf_tables failures; the tools' failure.
    pub fn chain_exists(&mut self, family: Family, chain: &str) -> Result<bool, WriteError> {
        match &mut self.how {
            How::Native(nft) => {
                let table = native::nft_table(family, &self.table);
                match nft.get().and_then(|n| n.chain_exists(&table, chain)) {
                    Ok(exists) => Ok(exists),
                    Err(e) if e.is_not_found() || e.is_unsupported() => Ok(false),
                    Err(e) => Err(NativeError::Nft(e).into()),
                }
            }
            How::Tools(dumps) => Ok(dump(dumps, &self.table, family)?.has_chain(chain)),
        }
    }

    /// Writes `plan`: its removals, and what each part's table lacks. Natively one
    /// transaction; with the tools one per family, a failure undoing ([`Plan::undo`]) the
    /// families already written.
    ///
    /// # Errors
    /// nf_tables' or the tools' refusal; nothing of the failed transaction is written.
    pub fn apply(&mut self, plan: &Plan) -> Result<Applied, WriteError> {
        let table = self.table.clone();
        match &mut self.how {
            How::Native(nft) => match apply_natively(nft, &table, plan) {
                Err(WriteError::Native(NativeError::Unsupported(e))) => {
                    // Not met where `choose` asked the encoder; the tools write what it refuses.
                    log::debug!("{table}: {e}: using the tools");
                    apply_with_tools(&mut HashMap::new(), &table, plan)
                }
                done => done,
            },
            How::Tools(dumps) => apply_with_tools(dumps, &table, plan),
        }
    }

    /// The first thing of `part` that `family`'s table lacks: its chains first, then its
    /// rules in order (a rule marked recorded is looked up by the handles of `recorded`,
    /// where they are this table's; every rule is looked for, [`Lookup::Absent`] or not).
    /// `None` when it holds all.
    ///
    /// # Errors
    /// nf_tables failures; the tools' failure.
    pub fn missing(
        &mut self,
        part: &Part,
        recorded: Option<&Recorded>,
    ) -> Result<Option<Absent>, WriteError> {
        match &mut self.how {
            How::Native(nft) => {
                let nft = nft.get().map_err(NativeError::from)?;
                let mut tables = NativeTables::on(nft, &self.table);
                let mut probe = tables.transaction();
                let chains: Vec<&str> = part.chains.iter().map(String::as_str).collect();
                let recorded: Vec<Recorded> = recorded.into_iter().cloned().collect();
                // A check looks every rule up.
                let rules: Vec<RuleSpec> = part
                    .rules
                    .iter()
                    .map(|r| match r.lookup {
                        Lookup::Absent => r.clone().looked_up(Lookup::Listed),
                        _ => r.clone(),
                    })
                    .collect();
                let missing =
                    tables.ensure_recorded(&mut probe, part.family, &chains, &rules, &recorded)?;
                if let Some(chain) = missing.chains.first() {
                    return Ok(Some(Absent::Chain(chain.clone())));
                }
                let Some(index) = missing.rules.first().copied() else {
                    return Ok(None);
                };
                let args = native::canonical(part.family, &part.rules[index].args)
                    .map_err(NativeError::from)?;
                Ok(Some(Absent::Rule { index, args }))
            }
            How::Tools(dumps) => Ok(absent_in(dump(dumps, &self.table, part.family)?, part)),
        }
    }

    /// What the tables lack of each of `parts`: its chains and rules missing (positions, as
    /// [`Applied::added`] gives them), rules compared by meaning; an empty [`Missing`] for a
    /// part the table holds whole. Each family's table is read once for all the parts: with
    /// the tools the table the writer reads anyway; natively one listing of the table
    /// (`nft list table`), decoding only the rules of the chains the parts name, where
    /// [`Writer::missing`] per part would read per part. For a caller that checks many
    /// attachments at once (`portmap reconcile`); nothing is written.
    ///
    /// # Errors
    /// nf_tables failures; the tools' failure; a rule the native side cannot read back.
    pub fn lacking(&mut self, parts: &[Part]) -> Result<Vec<Missing>, WriteError> {
        let mut wanted: HashSet<&str> = HashSet::new();
        let mut families: Vec<Family> = Vec::new();
        for part in parts {
            wanted.extend(part.chains.iter().map(String::as_str));
            wanted.extend(part.rules.iter().map(|r| r.chain.as_str()));
            if !families.contains(&part.family) {
                families.push(part.family);
            }
        }
        // Per family: whether the table exists, and the rules of each chain found.
        let mut read: HashMap<Family, TableRead> = HashMap::new();
        let native = matches!(self.how, How::Native(_));
        for family in families {
            let found = match &mut self.how {
                How::Native(nft) => read_natively(nft, &self.table, family, &wanted)?,
                How::Tools(dumps) => {
                    let dump = dump(dumps, &self.table, family)?;
                    let chains = wanted
                        .iter()
                        .filter(|c| dump.has_chain(c) || !dump.rules(c).is_empty())
                        .map(|c| ((*c).to_owned(), dump.rules(c).iter().cloned().collect()))
                        .collect();
                    (true, chains)
                }
            };
            read.insert(family, found);
        }
        // Chains read natively without a rule may exist all the same: asked once each.
        let mut empty: HashMap<(Family, String), bool> = HashMap::new();
        let mut out = Vec::with_capacity(parts.len());
        for part in parts {
            let Some((table, chains)) = read.get(&part.family) else {
                out.push(Missing::default());
                continue;
            };
            let mut missing = Missing::default();
            for chain in &part.chains {
                if chains.contains_key(chain) {
                    continue;
                }
                let exists = if native && *table {
                    let key = (part.family, chain.clone());
                    match empty.get(&key) {
                        Some(exists) => *exists,
                        None => {
                            let exists = self.chain_exists(part.family, chain)?;
                            empty.insert(key, exists);
                            exists
                        }
                    }
                } else {
                    false
                };
                if !exists {
                    missing.chains.push(chain.clone());
                }
            }
            let mut seen: HashSet<(&str, Vec<String>)> = HashSet::new();
            for (index, spec) in part.rules.iter().enumerate() {
                let set = chains.get(&spec.chain);
                // A layout that words its rules as `iptables-save` prints them is found as
                // given; only a rule not found so is read back in the codec's words.
                if set.is_some_and(|set| set.contains(&spec.args)) {
                    continue;
                }
                let want = if native {
                    native::canonical(part.family, &spec.args).map_err(NativeError::from)?
                } else {
                    spec.args.clone()
                };
                let present = set.is_some_and(|set| set.contains(&want));
                if !present && seen.insert((&spec.chain, want)) {
                    missing.rules.push(index);
                }
            }
            out.push(missing);
        }
        Ok(out)
    }

    /// The rules of `chain` in `family`'s table, as jumps ([`Jump`]); none where the chain,
    /// the table, nf_tables or the tools are missing. Reads the whole chain.
    ///
    /// # Errors
    /// nf_tables failures; the tools' failure.
    pub fn jumps(&mut self, family: Family, chain: &str) -> Result<Vec<Jump>, WriteError> {
        match &mut self.how {
            How::Native(nft) => {
                let table = native::nft_table(family, &self.table);
                match nft.get().and_then(|n| n.rules(&table, chain)) {
                    Ok(rules) => Ok(rules.iter().map(|r| jump_of(&r.exprs)).collect()),
                    Err(e) if e.is_not_found() || e.is_unsupported() => Ok(Vec::new()),
                    Err(e) => Err(NativeError::Nft(e).into()),
                }
            }
            How::Tools(dumps) => {
                let dump = match dump(dumps, &self.table, family) {
                    Ok(dump) => dump,
                    Err(e) if e.is_missing() => return Ok(Vec::new()),
                    Err(e) => return Err(e.into()),
                };
                Ok(dump
                    .rules(chain)
                    .iter()
                    .map(|r| Jump {
                        comment: opt_value(r, "--comment").map(str::to_owned),
                        target: jump_target(r).map(str::to_owned),
                    })
                    .collect())
            }
        }
    }

    /// Deletes `unrules`: natively in one transaction for both families, each by its
    /// recorded handles where they are this table's (else, or when one of them is gone,
    /// every copy found by listing the chain, the rules holding the rules' needles decoded
    /// and compared by meaning); with the tools, per family, one restore deleting one copy of
    /// each without reading the table (the copy a caller's write made), and when that is
    /// refused (a rule is absent), every copy in a fresh read; every copy in a table this
    /// writer has read already. A family whose chain holds, among the rules read, one the codec
    /// does not decode (another version's form: it might be one of them) is left to the
    /// tools, which read every form. A chain, table or nf_tables that is not there holds none.
    ///
    /// # Errors
    /// The first family's failure (the others are still tried).
    pub fn delete_rules(&mut self, unrules: &[Unrule]) -> Result<(), WriteError> {
        let table = self.table.clone();
        let tools: Vec<Family> = match &mut self.how {
            How::Native(nft) => match nft.get() {
                Ok(nft) => delete_natively(nft, &table, unrules)?,
                Err(e) if e.is_unsupported() => {
                    log::debug!("no nf_tables here, so no iptables-nft rule either: {e}");
                    return Ok(());
                }
                Err(e) => return Err(NativeError::Nft(e).into()),
            },
            How::Tools(_) => families_of_rules(unrules),
        };
        let mut first = None;
        for family in tools {
            let read = match &mut self.how {
                How::Tools(dumps) => dumps.remove(&family),
                How::Native(_) => None,
            };
            if let Err(e) = delete_with_tools(&table, family, unrules, read) {
                log::warn!("deleting {family} rules from {table}: {e}");
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Removes `removals` (the chains and the rules jumping to them; a chain that is not
    /// there is left alone, and so are families whose tools or nf_tables are missing):
    /// natively in one transaction, the jumps found by their recorded handles; with the tools
    /// one restore per family. A chain still jumped to from elsewhere (an operator's rule) is
    /// emptied and its jumps removed, and the removal is refused for it.
    ///
    /// # Errors
    /// [`RemoveError::Refused`] naming the first family refused; [`RemoveError::Failed`].
    pub fn remove_chains(&mut self, removals: &[Unchain]) -> Result<(), RemoveError> {
        let first = removals.first().map_or(Family::V4, |r| r.family);
        match &mut self.how {
            How::Native(nft) => {
                let nft = match nft.get() {
                    Ok(nft) => nft,
                    Err(e) if e.is_unsupported() => {
                        log::debug!("no nf_tables here, so no iptables-nft chain either: {e}");
                        return Ok(());
                    }
                    Err(e) => return Err(RemoveError::Failed(NativeError::Nft(e).into())),
                };
                let native: Vec<Removal<'_>> = removals
                    .iter()
                    .map(|r| Removal {
                        family: r.family,
                        from: &r.from,
                        chain: &r.chain,
                        recorded: r.recorded.as_ref(),
                    })
                    .collect();
                match NativeTables::on(nft, &self.table).remove_chains(&native) {
                    Ok(()) => Ok(()),
                    Err(NativeError::Nft(e)) if e.is_unsupported() => {
                        log::debug!("no nf_tables here, so no iptables-nft chain either: {e}");
                        Ok(())
                    }
                    // One transaction for the families: a refusal of it names the first.
                    Err(e) => Err(RemoveError::Refused {
                        family: match &e {
                            NativeError::Referenced { family, .. } => *family,
                            _ => first,
                        },
                        cause: e.into(),
                    }),
                }
            }
            How::Tools(dumps) => {
                let mut errors = Vec::new();
                for family in families_of(removals) {
                    dumps.remove(&family);
                    match teardown(&self.table, family, removals) {
                        Ok(()) => {}
                        Err(RemoveError::Failed(WriteError::Tools(e))) if e.is_missing() => {}
                        Err(e) => errors.push(e),
                    }
                }
                errors.into_iter().next().map_or(Ok(()), Err)
            }
        }
    }
}

/// The families of `removals`, each once, in order.
fn families_of(removals: &[Unchain]) -> Vec<Family> {
    let mut families = Vec::new();
    for r in removals {
        if !families.contains(&r.family) {
            families.push(r.family);
        }
    }
    families
}

/// The families of `unrules`, each once, in order.
fn families_of_rules(unrules: &[Unrule]) -> Vec<Family> {
    let mut families = Vec::new();
    for u in unrules {
        if !families.contains(&u.family) {
            families.push(u.family);
        }
    }
    families
}

/// Whether the x_tables (legacy) table `table` of `family` exists in the calling thread's
/// namespace: only then can the legacy tools hold rules that nf_tables does not list.
fn legacy_table_exists(family: Family, table: &str) -> bool {
    let names = match family {
        Family::V4 => "/proc/net/ip_tables_names",
        Family::V6 => "/proc/net/ip6_tables_names",
    };
    std::fs::read_to_string(names).is_ok_and(|s| s.lines().any(|l| l == table))
}

/// [`Writer::delete_rules`] over nf_tables: one transaction for every family it can answer
/// for, by the recorded handles and, should one of them be gone, once more by listing.
/// Returns the families left to the tools.
fn delete_natively(
    nft: &mut crate::nft::Nft,
    table: &str,
    unrules: &[Unrule],
) -> Result<Vec<Family>, WriteError> {
    let mut tables = NativeTables::on(nft, table);
    let recorded = unrules.iter().any(|u| u.recorded.is_some());
    let (tx, tools) = deletions(&mut tables, unrules, true)?;
    if tx.is_empty() {
        return Ok(tools);
    }
    match tables.commit(&tx) {
        Ok(_) => {}
        // A recorded rule is gone (deleted by hand): the transaction changed nothing.
        Err(NativeError::Nft(e)) if e.is_not_found() && recorded => {
            log::debug!("deleting by the recorded handles: {e}; looking the rules up");
            let (tx, tools) = deletions(&mut tables, unrules, false)?;
            if !tx.is_empty() {
                tables.commit(&tx)?;
            }
            return Ok(tools);
        }
        Err(e) => return Err(e.into()),
    }
    Ok(tools)
}

/// The transaction deleting `unrules` (by their recorded handles with `use_records`), and the
/// families left to the tools.
fn deletions(
    tables: &mut NativeTables<&mut crate::nft::Nft>,
    unrules: &[Unrule],
    use_records: bool,
) -> Result<(native::Transaction, Vec<Family>), WriteError> {
    let mut tx = tables.transaction();
    let mut tools: Vec<Family> = Vec::new();
    let mut handles: Vec<(Family, &str, u64)> = Vec::new();
    for u in unrules {
        if u.rules.is_empty() || tools.contains(&u.family) {
            continue;
        }
        let by_record = match u
            .recorded
            .as_ref()
            .filter(|r| use_records && r.family == u.family)
        {
            Some(r) if !r.rules.is_empty() && tables.generation(u.family)? == Some(r.table) => {
                Some(r)
            }
            _ => None,
        };
        if let Some(r) = by_record {
            handles.extend(r.rules.iter().map(|h| (u.family, u.chain.as_str(), *h)));
            continue;
        }
        let mut wanted = Vec::with_capacity(u.rules.len());
        let mut needles: Option<Vec<Vec<u8>>> = Some(Vec::new());
        for args in &u.rules {
            match native::canonical(u.family, args) {
                Ok(canonical) => wanted.push(canonical),
                Err(e) => {
                    log::debug!("{}: {e}: deleting with the tools", u.family);
                    tools.push(u.family);
                    break;
                }
            }
            let needle = RuleSpec::append(&u.chain, args).needle();
            match (&mut needles, needle.is_empty()) {
                (Some(_), true) => needles = None,
                (Some(n), false) => n.push(needle),
                (None, _) => {}
            }
        }
        if tools.contains(&u.family) {
            continue;
        }
        let read = needles.as_deref().map_or(Wanted::All, Wanted::Containing);
        let listed = match tables.rules(u.family, &u.chain, read) {
            Ok(listed) => listed.unwrap_or_default(),
            Err(NativeError::Nft(e)) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        for rule in listed {
            match &rule.args {
                Some(args) if wanted.contains(args) => {
                    handles.push((u.family, u.chain.as_str(), rule.handle));
                }
                Some(_) => {}
                None => {
                    log::debug!(
                        "{} {}: rule {} is not decoded: deleting with the tools",
                        u.family,
                        u.chain,
                        rule.handle
                    );
                    tools.push(u.family);
                    break;
                }
            }
        }
    }
    for (family, chain, handle) in handles {
        if !tools.contains(&family) {
            tx.delete_rule(family, chain, handle);
        }
    }
    Ok((tx, tools))
}

/// [`Writer::delete_rules`] with the tools for `family`: every copy in `read` (the table this
/// call read, if it did), else one copy of each without reading, and every copy in a fresh
/// read when that is refused.
fn delete_with_tools(
    table: &str,
    family: Family,
    unrules: &[Unrule],
    read: Option<TableDump>,
) -> Result<(), WriteError> {
    let ipt = Iptables::new(family);
    let mine: Vec<&Unrule> = unrules.iter().filter(|u| u.family == family).collect();
    if mine.iter().all(|u| u.rules.is_empty()) {
        return Ok(());
    }
    if let Some(dump) = read {
        return Ok(ipt.restore(table, &deletion_lines(&dump, &mine)?)?);
    }
    let mut blind = Vec::new();
    for u in &mine {
        for args in &u.rules {
            blind.push(restore_line("-D", &u.chain, args)?);
        }
    }
    match ipt.restore(table, &blind) {
        Ok(()) => return Ok(()),
        Err(e @ (IptablesError::Locked { .. } | IptablesError::Timeout { .. })) => {
            return Err(e.into());
        }
        Err(e) => log::debug!("{family}: deleting without reading refused, reading: {e}"),
    }
    let dump = ipt.save(table)?;
    Ok(ipt.restore(table, &deletion_lines(&dump, &mine)?)?)
}

/// The restore lines with which the tools' writer deletes every copy of the rules of
/// `unrules` that `dump` (a table as `iptables-save` printed it) holds.
///
/// # Errors
/// An argument that cannot be written on a restore line.
pub fn deletion_lines(dump: &TableDump, unrules: &[&Unrule]) -> Result<Vec<String>, IptablesError> {
    let mut lines = Vec::new();
    for u in unrules {
        let mut seen: HashSet<&[String]> = HashSet::new();
        for args in u.rules.iter().filter(|a| seen.insert(a.as_slice())) {
            let copies = dump.rules(&u.chain).iter().filter(|r| *r == args).count();
            for _ in 0..copies {
                lines.push(restore_line("-D", &u.chain, args)?);
            }
        }
    }
    Ok(lines)
}

/// The table of `family` as `iptables-save` prints it, read once until forgotten.
fn dump<'d>(
    dumps: &'d mut HashMap<Family, TableDump>,
    table: &str,
    family: Family,
) -> Result<&'d TableDump, IptablesError> {
    match dumps.entry(family) {
        std::collections::hash_map::Entry::Occupied(read) => Ok(read.into_mut()),
        std::collections::hash_map::Entry::Vacant(slot) => {
            Ok(slot.insert(Iptables::new(family).save(table)?))
        }
    }
}

/// A family's table as [`Writer::lacking`] reads it: whether it exists, and the rules of each
/// chain wanted that was found, in `iptables-save`'s words.
type TableRead = (bool, HashMap<String, HashSet<Vec<String>>>);

/// `family`'s table read over nf_tables for [`Writer::lacking`]: whether it exists, and the
/// rules of the chains in `wanted` that have any, in `iptables-save`'s words (a rule the codec
/// does not read, or one with a comment in user data, is not ours: left out).
fn read_natively(
    nft: &mut LazyNft,
    table: &str,
    family: Family,
    wanted: &HashSet<&str>,
) -> Result<TableRead, WriteError> {
    let nft = match nft.get() {
        Ok(nft) => nft,
        Err(e) if e.is_unsupported() => return Ok((false, HashMap::new())),
        Err(e) => return Err(NativeError::Nft(e).into()),
    };
    let t = native::nft_table(family, table);
    match nft.table_exists(&t) {
        Ok(true) => {}
        Ok(false) => return Ok((false, HashMap::new())),
        Err(e) if e.is_not_found() || e.is_unsupported() => return Ok((false, HashMap::new())),
        Err(e) => return Err(NativeError::Nft(e).into()),
    }
    let listed = nft
        .table_rules(&t, |chain| wanted.contains(chain))
        .map_err(NativeError::Nft)?;
    let mut chains: HashMap<String, HashSet<Vec<String>>> = HashMap::new();
    for (chain, rule) in listed {
        let rules = chains.entry(chain).or_default();
        if rule.comment.is_none()
            && let Some(args) = native::decode(family, &rule.exprs)
        {
            rules.insert(args);
        }
    }
    Ok((true, chains))
}

fn apply_natively(nft: &mut LazyNft, table: &str, plan: &Plan) -> Result<Applied, WriteError> {
    let nft = nft.get().map_err(NativeError::from)?;
    let mut tables = NativeTables::on(nft, table);
    let mut tx = tables.transaction();
    for r in &plan.removals {
        if !tables.chain_exists(r.family, &r.chain)? {
            continue;
        }
        for rule in tables.jumps_to(r.family, &r.from, &r.chain, r.recorded.as_ref())? {
            tx.delete_rule(r.family, &r.from, rule.handle);
        }
        tx.delete_chain(r.family, &r.chain);
    }
    let mut added = Vec::new();
    for part in &plan.parts {
        let chains: Vec<&str> = part.chains.iter().map(String::as_str).collect();
        let missing = tables.ensure(&mut tx, part.family, &chains, &part.rules)?;
        added.push((part.family, missing));
    }
    let recorded = tables.commit(&tx)?;
    Ok(Applied { added, recorded })
}

fn apply_with_tools(
    dumps: &mut HashMap<Family, TableDump>,
    table: &str,
    plan: &Plan,
) -> Result<Applied, WriteError> {
    let mut applied = Applied::default();
    let mut done: Vec<Family> = Vec::new();
    for part in &plan.parts {
        let family = part.family;
        let written = dump(dumps, table, family)
            .map_err(WriteError::from)
            .and_then(|dump| {
                let removals: Vec<&Unchain> = plan
                    .removals
                    .iter()
                    .filter(|r| r.family == family)
                    .collect();
                let mut lines = removal_lines(dump, &removals)?;
                let (ensure, missing) = ensure_lines(dump, part)?;
                lines.extend(ensure);
                Iptables::new(family).restore(table, &lines)?;
                Ok(missing)
            });
        dumps.remove(&family);
        match written {
            Ok(missing) => {
                applied.added.push((family, missing));
                done.push(family);
            }
            Err(e) => {
                for f in done {
                    if let Err(u) = undo_rules(table, plan, &applied, f) {
                        log::warn!("rollback of {f} rules failed: {u}");
                    }
                    let undo: Vec<Unchain> = plan
                        .undo
                        .iter()
                        .filter(|u| u.family == f)
                        .cloned()
                        .collect();
                    if let Err(u) = teardown(table, f, &undo) {
                        log::warn!("rollback of {f} failed: {u}");
                    }
                }
                return Err(e);
            }
        }
    }
    let only_removals = plan.parts.is_empty();
    for family in families_of(&plan.removals) {
        if plan.parts.iter().any(|p| p.family == family) {
            continue;
        }
        let removals: Vec<&Unchain> = plan
            .removals
            .iter()
            .filter(|r| r.family == family)
            .collect();
        let removed = dump(dumps, table, family)
            .map_err(WriteError::from)
            .and_then(|dump| {
                let lines = removal_lines(dump, &removals)?;
                Ok(Iptables::new(family).restore(table, &lines)?)
            });
        dumps.remove(&family);
        match removed {
            Ok(()) => {}
            Err(WriteError::Tools(e)) if e.is_missing() => {}
            Err(e) if only_removals => return Err(e),
            Err(e) => log::warn!("failed to remove {family} chains: {e}"),
        }
    }
    Ok(applied)
}

/// Deletes from `family`'s table one copy of each rule of `plan.undo_rules` that `applied`
/// says the write added there.
fn undo_rules(
    table: &str,
    plan: &Plan,
    applied: &Applied,
    family: Family,
) -> Result<(), IptablesError> {
    let added: Vec<&RuleSpec> = plan
        .parts
        .iter()
        .zip(&applied.added)
        .filter(|(part, _)| part.family == family)
        .flat_map(|(part, (_, missing))| missing.rules.iter().filter_map(|i| part.rules.get(*i)))
        .collect();
    let mut lines = Vec::new();
    for u in plan.undo_rules.iter().filter(|u| u.family == family) {
        for args in &u.rules {
            if added.iter().any(|r| r.chain == u.chain && r.args == *args) {
                lines.push(restore_line("-D", &u.chain, args)?);
            }
        }
    }
    Iptables::new(family).restore(table, &lines)
}

/// The restore lines with which the tools' writer creates what `dump` (a table as
/// `iptables-save` printed it) lacks of `part`: chains with `-N`, rules appended or inserted
/// first, each once; and what they create.
///
/// # Errors
/// An argument that cannot be written on a restore line.
pub fn ensure_lines(
    dump: &TableDump,
    part: &Part,
) -> Result<(Vec<String>, Missing), IptablesError> {
    let mut missing = Missing::default();
    let mut lines = Vec::new();
    for chain in part.chains.iter().filter(|c| !dump.has_chain(c)) {
        lines.push(restore_line::<&str>("-N", chain, &[])?);
        missing.chains.push(chain.clone());
    }
    // A chain can be long (one rule per mapping, one per attachment): each rule is looked up
    // in a set of them, not compared with every one.
    let mut sets = HashMap::new();
    // Append-unique, also against the rules of this very call.
    let mut seen: HashSet<(&str, &[String])> = HashSet::new();
    for (index, spec) in part.rules.iter().enumerate() {
        if present(dump, &mut sets, spec) || !seen.insert((&spec.chain, &spec.args)) {
            continue;
        }
        let line = match spec.position {
            Position::Insert => {
                let mut with_pos = vec!["1".to_owned()];
                with_pos.extend(spec.args.iter().cloned());
                restore_line("-I", &spec.chain, &with_pos)
            }
            Position::Append => restore_line("-A", &spec.chain, &spec.args),
        };
        lines.push(line?);
        missing.rules.push(index);
    }
    Ok((lines, missing))
}

/// The first thing of `part` that `dump` (a table as `iptables-save` printed it) lacks, as the
/// tools' writer finds it: its chains first, then its rules in order.
#[must_use]
pub fn absent_in(dump: &TableDump, part: &Part) -> Option<Absent> {
    if let Some(chain) = part.chains.iter().find(|c| !dump.has_chain(c)) {
        return Some(Absent::Chain(chain.clone()));
    }
    let mut sets = HashMap::new();
    part.rules
        .iter()
        .position(|r| !present(dump, &mut sets, r))
        .map(|index| Absent::Rule {
            index,
            args: part.rules[index].args.clone(),
        })
}

/// Whether `spec` is in `dump`, looked up in the rule sets of the chains read so far.
fn present<'d>(
    dump: &'d TableDump,
    sets: &mut HashMap<String, HashSet<&'d [String]>>,
    spec: &RuleSpec,
) -> bool {
    sets.entry(spec.chain.clone())
        .or_insert_with(|| dump.rules(&spec.chain).iter().map(Vec::as_slice).collect())
        .contains(spec.args.as_slice())
}

/// The restore lines with which the tools' writer removes `removals` from `dump`: the rules of
/// each `from` jumping to its chain, then the chain (`-F`, `-X`) where it exists.
///
/// # Errors
/// An argument that cannot be written on a restore line.
pub fn removal_lines(
    dump: &TableDump,
    removals: &[&Unchain],
) -> Result<Vec<String>, IptablesError> {
    let mut lines = Vec::new();
    for r in removals {
        for rule in dump.rules(&r.from) {
            if jump_target(rule) == Some(r.chain.as_str()) {
                lines.push(restore_line("-D", &r.from, rule)?);
            }
        }
        if dump.has_chain(&r.chain) {
            lines.push(restore_line::<&str>("-F", &r.chain, &[])?);
            lines.push(restore_line::<&str>("-X", &r.chain, &[])?);
        }
    }
    Ok(lines)
}

/// Removes the `removals` of `family` with the tools, from a fresh read. When the restore is
/// refused (a chain another rule still jumps to: `-X` fails and takes the transaction with
/// it), what can go still goes, as the tools' flush before a delete has it: the jumps and the
/// chains' rules, so that nothing goes through them; the refusal is returned.
fn teardown(table: &str, family: Family, removals: &[Unchain]) -> Result<(), RemoveError> {
    let ipt = Iptables::new(family);
    let failed = |e: IptablesError| RemoveError::Failed(e.into());
    let dump = ipt.save(table).map_err(failed)?;
    let mine: Vec<&Unchain> = removals.iter().filter(|r| r.family == family).collect();
    let lines = removal_lines(&dump, &mine).map_err(failed)?;
    let Err(refused) = ipt.restore(table, &lines) else {
        return Ok(());
    };
    // Only a transaction the tool refused: a missing tool, a held lock or a timeout stays what
    // it is.
    if !matches!(refused, IptablesError::Failed { .. }) {
        return Err(failed(refused));
    }
    let emptying: Vec<String> = lines
        .into_iter()
        .filter(|l| !l.starts_with("-X "))
        .collect();
    if let Err(e) = ipt.restore(table, &emptying) {
        let chains: Vec<&str> = mine.iter().map(|r| r.chain.as_str()).collect();
        log::warn!("emptying {} failed too: {e}", chains.join(", "));
    }
    Err(RemoveError::Refused {
        family,
        cause: refused.into(),
    })
}

/// The value after `opt` in a rule.
fn opt_value<'a>(rule: &'a [String], opt: &str) -> Option<&'a str> {
    let pos = rule.iter().position(|a| a == opt)?;
    rule.get(pos + 1).map(String::as_str)
}

/// The chain a rule in `iptables-save`'s words ends by jumping to (`… -j CHAIN`).
fn jump_target(rule: &[String]) -> Option<&str> {
    match rule {
        [.., flag, chain] if flag == "-j" => Some(chain),
        _ => None,
    }
}

/// A rule as `iptables-nft` encodes it, as far as [`Jump`] tells: its comment match and its
/// jump, whatever its other expressions.
fn jump_of(exprs: &[Expr]) -> Jump {
    let mut jump = Jump::default();
    for e in exprs {
        match e {
            Expr::XtMatch { name, info, .. } if name == "comment" => {
                let end = info.iter().position(|b| *b == 0).unwrap_or(info.len());
                jump.comment = String::from_utf8(info[..end].to_vec()).ok();
            }
            Expr::ImmediateVerdict(Verdict::Jump(chain)) => jump.target = Some(chain.clone()),
            _ => {}
        }
    }
    jump
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::CmpOp;
    use netlink_packet_netfilter::nftables::MetaKey;

    /// The expressions `nft --debug=netlink` shows for an entry rule written by `iptables-nft`
    /// 1.8.9.
    #[test]
    fn a_jump_decodes_from_iptables_nft_expressions() {
        let exprs = vec![
            Expr::Meta {
                key: MetaKey::L4Proto,
                dreg: 1,
            },
            Expr::Cmp {
                sreg: 1,
                op: CmpOp::Eq,
                data: vec![6],
            },
            Expr::XtMatch {
                name: "comment".into(),
                rev: 0,
                info: b"dnat name: \"n\" id: \"c\"\0\0\0".to_vec(),
            },
            Expr::XtMatch {
                name: "multiport".into(),
                rev: 1,
                info: vec![0u8; 48],
            },
            Expr::Counter {
                packets: 0,
                bytes: 0,
            },
            Expr::ImmediateVerdict(Verdict::Jump("CNI-DN-abc".into())),
        ];
        assert_eq!(
            jump_of(&exprs),
            Jump {
                comment: Some("dnat name: \"n\" id: \"c\"".into()),
                target: Some("CNI-DN-abc".into()),
            }
        );
    }

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn dump(text: &str) -> TableDump {
        TableDump::parse(text).unwrap()
    }

    #[test]
    fn the_tools_write_only_what_the_table_lacks_and_remove_chains_with_their_jumps() {
        let table =
            dump(":PREROUTING ACCEPT [0:0]\n:A - [0:0]\n-A PREROUTING -j A\n-A A -j ACCEPT\n");
        let part = Part {
            family: Family::V4,
            chains: vec!["A".into(), "B".into()],
            rules: vec![
                RuleSpec::append("A", &args(&["-j", "ACCEPT"])),
                RuleSpec::insert("PREROUTING", &args(&["-j", "B"])),
                RuleSpec::append("B", &args(&["-j", "RETURN"])),
                RuleSpec::append("B", &args(&["-j", "RETURN"])),
            ],
        };
        let (lines, missing) = ensure_lines(&table, &part).unwrap();
        assert_eq!(lines, ["-N B", "-I PREROUTING 1 -j B", "-A B -j RETURN"]);
        assert_eq!(missing.chains, ["B"]);
        assert_eq!(missing.rules, [1, 2]);
        let gone = Unchain {
            family: Family::V4,
            from: "PREROUTING".into(),
            chain: "A".into(),
            recorded: None,
        };
        assert_eq!(
            removal_lines(&table, &[&gone]).unwrap(),
            ["-D PREROUTING -j A", "-F A", "-X A"]
        );
    }

    #[test]
    fn a_needle_is_the_jump_target_else_a_host_address_and_a_verdict_is_no_chain() {
        let spec = |line: &str| RuleSpec::append("C", &args(&line.split(' ').collect::<Vec<_>>()));
        assert_eq!(
            spec("-m comment --comment x -j CNI-ADMIN").needle(),
            b"CNI-ADMIN"
        );
        assert_eq!(spec("-s 10.1.0.5/32 -j ACCEPT").needle(), [10, 1, 0, 5]);
        assert_eq!(
            spec("-d fd01::5/128 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT").needle(),
            "fd01::5".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(spec("-s 10.1.0.0/24 -j DROP").needle(), b"");
        assert_eq!(spec("-o br0 -j DROP").needle(), b"");
        assert_eq!(spec("-j RETURN").target_chain(), None);
        assert_eq!(spec("-j CNI-X").target_chain(), Some("CNI-X"));
    }

    #[test]
    fn the_tools_delete_every_copy_of_each_rule_and_nothing_else() {
        let table = dump(
            ":FORWARD ACCEPT [0:0]\n:C - [0:0]\n-A C -s 10.0.0.2/32 -j ACCEPT\n-A C -s 10.0.0.2/32 -j DROP\n-A C -s 10.0.0.2/32 -j ACCEPT\n-A FORWARD -s 10.0.0.2/32 -j ACCEPT\n",
        );
        let unrule = Unrule {
            family: Family::V4,
            chain: "C".into(),
            rules: vec![
                args(&["-s", "10.0.0.2/32", "-j", "ACCEPT"]),
                args(&["-s", "10.0.0.2/32", "-j", "ACCEPT"]),
                args(&["-s", "10.0.0.3/32", "-j", "ACCEPT"]),
            ],
            recorded: None,
        };
        assert_eq!(
            deletion_lines(&table, &[&unrule]).unwrap(),
            [
                "-D C -s 10.0.0.2/32 -j ACCEPT",
                "-D C -s 10.0.0.2/32 -j ACCEPT"
            ]
        );
    }

    /// The `-A CHAIN` lines of `iptables-save -t filter` in the calling thread's namespace.
    fn saved(chain: &str) -> Vec<String> {
        let out = std::process::Command::new("iptables-save")
            .args(["-t", "filter"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with(&format!("-A {chain} ")))
            .map(str::to_owned)
            .collect()
    }

    fn accepts(ip: &str) -> Vec<Vec<String>> {
        vec![
            args(&[
                "-d",
                &format!("{ip}/32"),
                "-m",
                "conntrack",
                "--ctstate",
                "RELATED,ESTABLISHED",
                "-j",
                "ACCEPT",
            ]),
            args(&["-s", &format!("{ip}/32"), "-j", "ACCEPT"]),
        ]
    }

    fn accept_plan(ip: &str, lookup: Lookup) -> Plan {
        Plan {
            table: "filter".into(),
            parts: vec![Part {
                family: Family::V4,
                chains: vec!["C".into()],
                rules: accepts(ip)
                    .iter()
                    .map(|r| RuleSpec::append_recorded("C", r).looked_up(lookup))
                    .collect(),
            }],
            ..Plan::default()
        }
    }

    #[test]
    fn rules_are_written_once_and_deleted_by_their_handles_or_every_copy_natively_and_with_the_tools()
     {
        assert!(
            native::writes_nf_tables(Family::V4),
            "this test needs iptables-nft"
        );
        crate::iptables::tests::in_new_netns(|| {
            let mut nft = LazyNft::new();
            let plan = accept_plan("10.0.0.2", Lookup::Listed);
            let mut writer = Writer::for_plan(&mut nft, &plan);
            assert!(matches!(writer.how, How::Native(_)));
            let first = writer.apply(&plan).unwrap();
            assert_eq!(first.added[0].1.rules, [0, 1]);
            assert_eq!(first.recorded[0].rules.len(), 2);
            // Looked up (the accepts by their address): not written again.
            let again = writer.apply(&plan).unwrap();
            assert!(again.added[0].1.is_empty(), "{again:?}");
            assert!(again.recorded.is_empty());
            // Not looked up: a copy, as another writer's would be; and a lookalike.
            writer
                .apply(&accept_plan("10.0.0.2", Lookup::Absent))
                .unwrap();
            Iptables::new(Family::V4)
                .restore(
                    "filter",
                    &["-A C -s 10.0.0.2/32 -m conntrack --ctstate NEW -j ACCEPT".to_owned()],
                )
                .unwrap();
            assert_eq!(saved("C").len(), 5);
            let unrule = Unrule {
                family: Family::V4,
                chain: "C".into(),
                rules: accepts("10.0.0.2"),
                recorded: first.recorded.first().cloned(),
            };
            // By the recorded handles: exactly those rules.
            writer.delete_rules(std::slice::from_ref(&unrule)).unwrap();
            assert_eq!(saved("C").len(), 3);
            // Those handles are gone: every copy, found by listing; the lookalike stays.
            writer.delete_rules(std::slice::from_ref(&unrule)).unwrap();
            assert_eq!(
                saved("C"),
                ["-A C -s 10.0.0.2/32 -m conntrack --ctstate NEW -j ACCEPT"]
            );
            // The tools: one copy each without reading; every copy once one is absent.
            writer
                .apply(&accept_plan("10.0.0.2", Lookup::Absent))
                .unwrap();
            writer
                .apply(&accept_plan("10.0.0.2", Lookup::Absent))
                .unwrap();
            let mut tools = Writer::with_tools("filter");
            tools.delete_rules(std::slice::from_ref(&unrule)).unwrap();
            assert_eq!(saved("C").len(), 3);
            let mut both = unrule.clone();
            both.rules.extend(accepts("10.0.0.3"));
            tools.delete_rules(&[both]).unwrap();
            assert_eq!(saved("C").len(), 1);
            // Nothing to delete is no error, on either writer.
            tools.delete_rules(std::slice::from_ref(&unrule)).unwrap();
            writer.delete_rules(std::slice::from_ref(&unrule)).unwrap();
        });
    }

    #[test]
    fn the_tools_undo_the_rules_a_failed_write_added_in_an_earlier_family_and_only_those() {
        crate::iptables::tests::in_new_netns(|| {
            // A rule of this plan already there: it is not this write's, and stays.
            let ipt = Iptables::new(Family::V4);
            ipt.restore(
                "filter",
                &[
                    "-N C".to_owned(),
                    "-A C -s 10.0.0.2/32 -j ACCEPT".to_owned(),
                ],
            )
            .unwrap();
            let mut plan = accept_plan("10.0.0.2", Lookup::Listed);
            // The IPv6 part refers to a chain that is neither there nor made: refused.
            plan.parts.push(Part {
                family: Family::V6,
                chains: Vec::new(),
                rules: vec![RuleSpec::append("NOWHERE", &args(&["-j", "ACCEPT"]))],
            });
            plan.undo_rules = vec![Unrule {
                family: Family::V4,
                chain: "C".into(),
                rules: accepts("10.0.0.2"),
                recorded: None,
            }];
            let mut tools = Writer::with_tools("filter");
            assert!(tools.apply(&plan).is_err());
            assert_eq!(saved("C"), ["-A C -s 10.0.0.2/32 -j ACCEPT"]);
        });
    }
}
