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
    self, Missing, NativeError, NativeTables, Position, Recorded, Removal, RuleSpec, Variant,
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
        let tools_nft = families
            .iter()
            .chain(parts.iter().map(|p| &p.family))
            .all(|f| native::variant(*f) == Variant::Nft);
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

    /// [`Writer::choose`] for `plan`'s families and rules.
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
    /// where they are this table's). `None` when it holds all.
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
                let missing = tables.ensure_recorded(
                    &mut probe,
                    part.family,
                    &chains,
                    &part.rules,
                    &recorded,
                )?;
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
}
