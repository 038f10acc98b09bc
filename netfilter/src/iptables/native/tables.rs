//! Reading and writing one iptables table (`nat`, `filter`) of both families over nf_tables
//! netlink, as `iptables-nft` keeps it, a chain or a rule at a time.
//!
//! A caller builds a [`Transaction`] (chains to create, rules to append or insert in
//! `iptables-save`'s words, rules to delete by handle, chains to flush and delete), lets
//! [`NativeTables::ensure`] add what the kernel lacks of a layout reading only the chains
//! concerned, and commits it with [`NativeTables::commit`]: one nfnetlink batch for both
//! families, all of it or nothing. Rules appended with [`Transaction::append_recorded`] come
//! back with their handles ([`Recorded`]), so that a later call finds them with one lookup
//! each ([`NativeTables::jumps_to`]) instead of listing a chain that grows with every
//! attachment on the node.
//!
//! Only for tools that are `iptables-nft` ([`super::variant`]): with legacy iptables the
//! kernel tables are not nf_tables at all, and the caller keeps `iptables-restore`.

use std::borrow::BorrowMut;
use std::collections::HashSet;

use super::codec::{Unsupported, canonical, encode};
use super::{Family, Wanted, nft_table};
use crate::nft::{
    Batch, Chain, ChainHook, ChainType, Expr, Nft, NftError, Table, Verdict, priority,
};

/// A failure of a native read or write.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// nf_tables refused a request or the batch.
    #[error(transparent)]
    Nft(#[from] NftError),
    /// A rule is outside the forms written natively: write it with `iptables-restore`.
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    /// A chain to remove is still jumped to by a rule the removal does not delete (an
    /// operator's): the removal's jumps and the chain's rules were removed, the chain is left
    /// empty.
    #[error(
        "{family} chain {chain} in table {table} is still jumped to by another rule (Device or resource busy): its rules and the entry rules jumping to it are removed, the chain is left empty"
    )]
    Referenced {
        /// The family.
        family: Family,
        /// The iptables table.
        table: String,
        /// The chain.
        chain: String,
    },
    /// A rule was to go into a chain that neither exists nor is created.
    #[error("{family} table {table} has no chain {chain}")]
    NoChain {
        /// The family.
        family: Family,
        /// The iptables table.
        table: String,
        /// The chain.
        chain: String,
    },
}

impl NativeError {
    /// Whether the native path does not apply and `iptables-restore` should do the work.
    #[must_use]
    pub fn is_unsupported(&self) -> bool {
        matches!(self, NativeError::Unsupported(_))
    }
}

/// Where [`NativeTables::ensure`] puts a missing rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// At the end (`-A CHAIN`).
    Append,
    /// First (`-I CHAIN 1`).
    Insert,
}

/// How [`NativeTables::ensure`] looks a rule up in its chain (the tools, which read the
/// whole table, compare every rule whatever this says).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Lookup {
    /// Among the rules of the chain that hold its needle ([`RuleSpec::needle`]; every rule
    /// of the chain for a rule without one), listed once per chain for all such rules.
    #[default]
    Listed,
    /// Only the first rule of the chain that holds its needle, the listing stopping there: for
    /// a rule a layout inserts first in a chain that grows with the attachments (its leading
    /// jump), where a caller knows no earlier rule holds the needle.
    First,
    /// Not looked for: the caller knows from its own records that it is absent (an
    /// attachment's rule its state does not know), and it is written.
    Absent,
}

/// A rule a layout wants in a chain, in `iptables-save`'s words (or any the tools take).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// The chain.
    pub chain: String,
    /// The rule's arguments, without `-A CHAIN`.
    pub args: Vec<String>,
    /// Where it goes when missing.
    pub position: Position,
    /// Whether its handle is returned by [`NativeTables::commit`] when it is appended
    /// ([`Transaction::append_recorded`]).
    pub recorded: bool,
    /// How it is looked up natively.
    pub lookup: Lookup,
}

impl RuleSpec {
    /// `-A CHAIN ARGS…`.
    #[must_use]
    pub fn append(chain: &str, args: &[String]) -> RuleSpec {
        RuleSpec {
            chain: chain.to_owned(),
            args: args.to_vec(),
            position: Position::Append,
            recorded: false,
            lookup: Lookup::Listed,
        }
    }

    /// `-A CHAIN ARGS…`, its handle returned by [`NativeTables::commit`] when it is added.
    #[must_use]
    pub fn append_recorded(chain: &str, args: &[String]) -> RuleSpec {
        RuleSpec {
            recorded: true,
            ..RuleSpec::append(chain, args)
        }
    }

    /// `-I CHAIN 1 ARGS…`.
    #[must_use]
    pub fn insert(chain: &str, args: &[String]) -> RuleSpec {
        RuleSpec {
            position: Position::Insert,
            ..RuleSpec::append(chain, args)
        }
    }

    /// The same rule, looked up as `lookup` says.
    #[must_use]
    pub fn looked_up(self, lookup: Lookup) -> RuleSpec {
        RuleSpec { lookup, ..self }
    }

    /// The chain this rule jumps or goes to, if any (a verdict is not a chain).
    pub(crate) fn target_chain(&self) -> Option<&str> {
        let n = self.args.len();
        match self.args.get(n.wrapping_sub(2)..) {
            Some([flag, chain])
                if matches!(flag.as_str(), "-j" | "-g")
                    && !matches!(chain.as_str(), "ACCEPT" | "DROP" | "RETURN" | "QUEUE") =>
            {
                Some(chain)
            }
            _ => None,
        }
    }

    /// Bytes that the rule's netlink encoding necessarily holds, by which a listing of a
    /// long chain picks the rules that can be it: the chain it jumps to (or the extension
    /// target it names), else the address of its first host-wide `-s` or `-d` (`/32`,
    /// `/128`: compared whole), in network byte order; empty when it has neither (every rule
    /// of the chain is read).
    #[must_use]
    pub fn needle(&self) -> Vec<u8> {
        if let Some(chain) = self.target_chain() {
            return chain.as_bytes().to_vec();
        }
        let address = self
            .args
            .windows(2)
            .filter(|w| matches!(w[0].as_str(), "-s" | "-d"))
            .find_map(|w| host_address(&w[1]));
        match address {
            Some(std::net::IpAddr::V4(v4)) => v4.octets().to_vec(),
            Some(std::net::IpAddr::V6(v6)) => v6.octets().to_vec(),
            None => Vec::new(),
        }
    }
}

/// The address of `10.0.0.2`, `10.0.0.2/32`, `fd00::2/128`: one host, compared whole.
fn host_address(word: &str) -> Option<std::net::IpAddr> {
    let (addr, prefix) = match word.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (word, None),
    };
    let ip: std::net::IpAddr = addr.parse().ok()?;
    let full = if ip.is_ipv4() { "32" } else { "128" };
    prefix.is_none_or(|p| p == full).then_some(ip)
}

/// What [`NativeTables::ensure`] found missing and added to the transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Missing {
    /// The chains created (regular and built-in), in the order they were found missing.
    pub chains: Vec<String>,
    /// The positions, in the `rules` given, of the rules added.
    pub rules: Vec<usize>,
}

impl Missing {
    /// Whether nothing was missing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.rules.is_empty()
    }
}

/// A rule as listed: its handle, the chain it jumps or goes to, and its arguments in
/// `iptables-save`'s words when it is in a form the codec reads (`None` for any other: not a
/// rule this module wrote).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The handle, for [`Transaction::delete_rule`].
    pub handle: u64,
    /// The chain of its `-j CHAIN` or `-g CHAIN`, whatever its other expressions.
    pub target: Option<String>,
    /// The arguments, without `-A CHAIN`.
    pub args: Option<Vec<String>>,
}

/// The handles of rules appended with [`Transaction::append_recorded`] in one family's
/// table, and which incarnation of the table they belong to (its handle: a table deleted and
/// made again numbers its rules anew). For a caller's state, to find the rules again with
/// [`NativeTables::jumps_to`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Recorded {
    /// The family.
    pub family: Family,
    /// The nf_tables handle of the table.
    pub table: u64,
    /// The rule handles, in the order the rules were appended.
    pub rules: Vec<u64>,
}

/// A chain to remove with the rules that jump to it ([`NativeTables::remove_chains`]).
#[derive(Debug, Clone, Copy)]
pub struct Removal<'a> {
    /// The family.
    pub family: Family,
    /// The chain holding the jumps (`CNI-HOSTPORT-DNAT`).
    pub from: &'a str,
    /// The chain to remove (`CNI-DN-…`).
    pub chain: &'a str,
    /// The jumps' handles recorded when they were added, if any.
    pub recorded: Option<&'a Recorded>,
}

/// Changes to the iptables tables of both families, committed as one nf_tables transaction.
/// It travels in one netlink datagram, so it holds what one call changes (an attachment's
/// chains and rules), not thousands of rules: past the socket's send buffer the kernel
/// refuses it (`EMSGSIZE`).
#[derive(Debug, Clone)]
pub struct Transaction {
    table: String,
    batch: Batch,
    /// The family of each recorded rule, in batch order.
    recorded: Vec<Family>,
    /// What the batch creates: (family, chain), and the tables ("" as chain).
    created: HashSet<(Family, String)>,
}

impl Transaction {
    /// An empty transaction on the iptables table `table` (`nat`, `filter`).
    #[must_use]
    pub fn new(table: &str) -> Transaction {
        Transaction {
            table: table.to_owned(),
            batch: Batch::new(),
            recorded: Vec::new(),
            created: HashSet::new(),
        }
    }

    /// Whether there is nothing to commit.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// The number of nf_tables operations.
    #[must_use]
    pub fn len(&self) -> usize {
        self.batch.len()
    }

    fn nft(&self, family: Family) -> Table {
        nft_table(family, &self.table)
    }

    fn creates(&self, family: Family, chain: &str) -> bool {
        self.created.contains(&(family, chain.to_owned()))
    }

    fn add_table(&mut self, family: Family) {
        if self.created.insert((family, String::new())) {
            self.batch.add_table(&self.nft(family));
        }
    }

    /// `-N CHAIN` (adding a chain that exists is not an error).
    pub fn add_chain(&mut self, family: Family, chain: &str) -> &mut Transaction {
        if self.created.insert((family, chain.to_owned())) {
            let table = self.nft(family);
            self.batch.add_chain(&table, &Chain::regular(chain));
        }
        self
    }

    /// A built-in chain (`PREROUTING`, …) as `iptables-nft` creates it on first use.
    fn add_builtin(&mut self, family: Family, chain: &str) -> Result<(), Unsupported> {
        let base = builtin(&self.table, chain).ok_or_else(|| Unsupported {
            rule: format!("-t {} {chain}", self.table),
            reason: "not a built-in chain of a table written natively".to_owned(),
        })?;
        if self.created.insert((family, chain.to_owned())) {
            let table = self.nft(family);
            self.batch.add_chain(&table, &base);
        }
        Ok(())
    }

    fn rule(&self, family: Family, args: &[String]) -> Result<crate::nft::Rule, Unsupported> {
        encodable(&self.table, family, args)
    }

    /// `-A CHAIN ARGS…`.
    ///
    /// # Errors
    /// [`Unsupported`] for a rule outside the codec's forms.
    pub fn append(
        &mut self,
        family: Family,
        chain: &str,
        args: &[String],
    ) -> Result<&mut Transaction, Unsupported> {
        self.add(family, chain, args, Placement::Append)
    }

    /// `-A CHAIN ARGS…`, with the rule's handle returned by [`NativeTables::commit`].
    ///
    /// # Errors
    /// [`Unsupported`] for a rule outside the codec's forms.
    pub fn append_recorded(
        &mut self,
        family: Family,
        chain: &str,
        args: &[String],
    ) -> Result<&mut Transaction, Unsupported> {
        self.add(family, chain, args, Placement::AppendRecorded)
    }

    /// `-I CHAIN 1 ARGS…`.
    ///
    /// # Errors
    /// [`Unsupported`] for a rule outside the codec's forms.
    pub fn insert(
        &mut self,
        family: Family,
        chain: &str,
        args: &[String],
    ) -> Result<&mut Transaction, Unsupported> {
        self.add(family, chain, args, Placement::Insert)
    }

    fn add(
        &mut self,
        family: Family,
        chain: &str,
        args: &[String],
        placement: Placement,
    ) -> Result<&mut Transaction, Unsupported> {
        let rule = self.rule(family, args)?;
        let table = self.nft(family);
        match placement {
            Placement::Append => self.batch.add_rule(&table, chain, &rule),
            Placement::AppendRecorded => {
                self.recorded.push(family);
                self.batch.add_rule_echo(&table, chain, &rule)
            }
            Placement::Insert => self.batch.insert_rule(&table, chain, &rule),
        };
        Ok(self)
    }

    /// Deletes the rule with `handle` from `chain` (the transaction fails if it is gone).
    pub fn delete_rule(&mut self, family: Family, chain: &str, handle: u64) -> &mut Transaction {
        let table = self.nft(family);
        self.batch.delete_rule(&table, chain, handle);
        self
    }

    /// `-F CHAIN`.
    pub fn flush_chain(&mut self, family: Family, chain: &str) -> &mut Transaction {
        let table = self.nft(family);
        self.batch.flush_chain(&table, chain);
        self
    }

    /// `-F CHAIN` then `-X CHAIN` (the transaction fails if a rule still jumps to it).
    pub fn delete_chain(&mut self, family: Family, chain: &str) -> &mut Transaction {
        let table = self.nft(family);
        self.batch.flush_chain(&table, chain);
        self.batch.delete_chain(&table, chain);
        self
    }
}

/// The nf_tables rule `iptables-nft` makes of `-A CHAIN <args>` in iptables table `table`.
fn encodable(
    table: &str,
    family: Family,
    args: &[String],
) -> Result<crate::nft::Rule, Unsupported> {
    // The tools refuse DROP in nat; so must we, or our table would hold what theirs cannot.
    if table == "nat" && args.last().is_some_and(|a| a == "DROP") {
        return Err(Unsupported {
            rule: args.join(" "),
            reason: "DROP in table nat".to_owned(),
        });
    }
    encode(family, args)
}

/// Whether a rule `spec` of iptables table `table` is written natively: the codec encodes it
/// and reads it back in `iptables-save`'s words (the writer chooses the tools otherwise).
#[must_use]
pub fn writes(table: &str, family: Family, spec: &RuleSpec) -> bool {
    encodable(table, family, &spec.args).is_ok() && canonical(family, &spec.args).is_ok()
}

/// How [`NativeTables::ensure_recorded`] read a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Read {
    /// The rules holding one of the needles of the rules listed in it (or all).
    Listing,
    /// The first rule holding this needle.
    First(Vec<u8>),
    /// The recorded rules jumping to this chain, by their handles.
    Handles(String),
}

/// Where [`Transaction::add`] puts a rule.
#[derive(Debug, Clone, Copy)]
enum Placement {
    Append,
    AppendRecorded,
    Insert,
}

/// The built-in chain `chain` of iptables table `table`, as `iptables-nft` declares it.
fn builtin(table: &str, chain: &str) -> Option<Chain> {
    let (kind, hook, prio) = match (table, chain) {
        ("nat", "PREROUTING") => (ChainType::Nat, ChainHook::Prerouting, priority::DSTNAT),
        ("nat", "INPUT") => (ChainType::Nat, ChainHook::Input, priority::SRCNAT),
        ("nat", "OUTPUT") => (ChainType::Nat, ChainHook::Output, priority::DSTNAT),
        ("nat", "POSTROUTING") => (ChainType::Nat, ChainHook::Postrouting, priority::SRCNAT),
        ("filter", "INPUT") => (ChainType::Filter, ChainHook::Input, priority::FILTER),
        ("filter", "FORWARD") => (ChainType::Filter, ChainHook::Forward, priority::FILTER),
        ("filter", "OUTPUT") => (ChainType::Filter, ChainHook::Output, priority::FILTER),
        _ => return None,
    };
    Some(Chain::base(chain, kind, hook, prio))
}

/// The iptables table `name` of both families, read and written over nf_tables netlink in
/// the network namespace of the thread that opened it: over a socket of its own
/// ([`NativeTables::open`]), or over a caller's ([`NativeTables::on`], for a plugin call that
/// keeps one socket for all its nf_tables work).
#[derive(Debug)]
pub struct NativeTables<N: BorrowMut<Nft> = Nft> {
    nft: N,
    name: String,
}

impl NativeTables {
    /// The table `name` (`nat`, `filter`) in the calling thread's namespace.
    ///
    /// # Errors
    /// When the netfilter socket cannot be opened.
    pub fn open(name: &str) -> Result<NativeTables, NativeError> {
        Ok(NativeTables {
            nft: Nft::new()?,
            name: name.to_owned(),
        })
    }
}

impl<'a> NativeTables<&'a mut Nft> {
    /// The table `name` over the caller's socket `nft`, in its namespace.
    #[must_use]
    pub fn on(nft: &'a mut Nft, name: &str) -> NativeTables<&'a mut Nft> {
        NativeTables {
            nft,
            name: name.to_owned(),
        }
    }
}

impl<N: BorrowMut<Nft>> NativeTables<N> {
    /// The socket, for other nf_tables work of the same call.
    pub fn nft(&mut self) -> &mut Nft {
        self.nft.borrow_mut()
    }

    /// A new transaction on this table.
    #[must_use]
    pub fn transaction(&self) -> Transaction {
        Transaction::new(&self.name)
    }

    fn nft_table(&self, family: Family) -> Table {
        nft_table(family, &self.name)
    }

    /// Whether `chain` exists in `family`'s table.
    ///
    /// # Errors
    /// nf_tables failures other than a missing table.
    pub fn chain_exists(&mut self, family: Family, chain: &str) -> Result<bool, NativeError> {
        let table = self.nft_table(family);
        Ok(self.nft().chain_exists(&table, chain)?)
    }

    /// The handle of `family`'s table (see [`Recorded::table`]), `None` when it does not
    /// exist.
    ///
    /// # Errors
    /// nf_tables failures other than a missing table.
    pub fn generation(&mut self, family: Family) -> Result<Option<u64>, NativeError> {
        let table = self.nft_table(family);
        Ok(self.nft().table_handle(&table)?)
    }

    /// The rules of `chain` that `wanted` asks for, in order; `None` when the chain does not
    /// exist.
    ///
    /// # Errors
    /// nf_tables failures other than a missing chain.
    pub fn rules(
        &mut self,
        family: Family,
        chain: &str,
        wanted: Wanted<'_>,
    ) -> Result<Option<Vec<Listed>>, NativeError> {
        let table = self.nft_table(family);
        let listed = match wanted {
            Wanted::All => self.nft().rules(&table, chain),
            Wanted::Containing(needles) => {
                let needles: Vec<&[u8]> = needles.iter().map(Vec::as_slice).collect();
                self.nft().rules_containing(&table, chain, &needles)
            }
            Wanted::FirstContaining(needles) => {
                let needles: Vec<&[u8]> = needles.iter().map(Vec::as_slice).collect();
                Nft::first_rule_containing(&table, chain, &needles).map(Vec::from_iter)
            }
        };
        match listed {
            Ok(listed) => Ok(Some(
                listed
                    .iter()
                    .map(|rule| listed_rule(family, rule))
                    .collect(),
            )),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The rule with `handle` in `chain`, if it exists (one lookup; the chain is not listed).
    ///
    /// # Errors
    /// nf_tables failures other than a missing table, chain or rule.
    pub fn rule(
        &mut self,
        family: Family,
        chain: &str,
        handle: u64,
    ) -> Result<Option<Listed>, NativeError> {
        let table = self.nft_table(family);
        Ok(self
            .nft()
            .rule(&table, chain, handle)?
            .map(|rule| listed_rule(family, &rule)))
    }

    /// Adds to `tx` what `family`'s table lacks of a layout: the regular `chains`, the
    /// built-in chains the `rules` go into (and the table), and the `rules` themselves
    /// (compared in `iptables-save`'s words; a rule present, or given twice, is added once at
    /// most). Returns what
    /// was missing, for a CHECK to name. Reads only what it must: nothing of a chain it
    /// creates, nor for a rule that jumps to a chain it creates (no rule can jump to a chain
    /// that does not exist yet); otherwise the rules of the chain that contain the jump's
    /// target (a built-in chain holds a handful), or all of a chain without jumps.
    ///
    /// # Errors
    /// [`NativeError::Unsupported`] for a rule outside the codec's forms or a built-in chain
    /// it does not know, [`NativeError::NoChain`] for a rule into a chain that is neither
    /// there nor among `chains`, nf_tables failures.
    pub fn ensure(
        &mut self,
        tx: &mut Transaction,
        family: Family,
        chains: &[&str],
        rules: &[RuleSpec],
    ) -> Result<Missing, NativeError> {
        self.ensure_recorded(tx, family, chains, rules, &[])
    }

    /// [`NativeTables::ensure`], where the rules of `rules` marked recorded are looked up by
    /// the handles `recorded` holds for `family` ([`NativeTables::jumps_to`]) instead of by
    /// listing their chain.
    ///
    /// # Errors
    /// As [`NativeTables::ensure`].
    pub fn ensure_recorded(
        &mut self,
        tx: &mut Transaction,
        family: Family,
        chains: &[&str],
        rules: &[RuleSpec],
        recorded: &[Recorded],
    ) -> Result<Missing, NativeError> {
        let recorded = recorded.iter().find(|r| r.family == family);
        let mut missing = Missing::default();
        let mut present: HashSet<String> = HashSet::new();
        // Whether the chain is there, creating the table in `tx` the first time one is not.
        let mut exists = |tables: &mut Self, tx: &mut Transaction, chain: &str| {
            if tx.creates(family, chain) {
                return Ok::<_, NativeError>(false);
            }
            if present.contains(chain) {
                return Ok(true);
            }
            if !tx.creates(family, "") && tables.chain_exists(family, chain)? {
                present.insert(chain.to_owned());
                return Ok(true);
            }
            if !tx.creates(family, "")
                && !{
                    let table = tables.nft_table(family);
                    tables.nft().table_exists(&table)?
                }
            {
                tx.add_table(family);
            }
            Ok(false)
        };
        for chain in chains {
            if !exists(self, tx, chain)? {
                tx.add_chain(family, chain);
                missing.chains.push((*chain).to_owned());
            }
        }
        // A recorded rule that jumps is looked up by its handles: its chain is not listed.
        let by_handle = |spec: &RuleSpec| spec.recorded && recorded.is_some();
        // What one listing of each chain reads for the rules looked up in it (`None`: every
        // rule, for a rule without a needle).
        let mut listings: Vec<(&str, Option<Vec<Vec<u8>>>)> = Vec::new();
        for spec in rules {
            let needle = spec.needle();
            let listed = match spec.lookup {
                Lookup::Absent => false,
                Lookup::First => needle.is_empty(),
                Lookup::Listed => !(by_handle(spec) && spec.target_chain().is_some()),
            };
            if !listed {
                continue;
            }
            let at = match listings.iter().position(|(c, _)| *c == spec.chain) {
                Some(at) => at,
                None => {
                    listings.push((&spec.chain, Some(Vec::new())));
                    listings.len() - 1
                }
            };
            match (&mut listings[at].1, needle.is_empty()) {
                (Some(_), true) => listings[at].1 = None,
                (Some(needles), false) if !needles.contains(&needle) => needles.push(needle),
                _ => {}
            }
        }
        // The rules read so far (their arguments, for lookups: a chain may hold thousands),
        // per chain and way of reading it.
        let mut read: Vec<(String, Read, HashSet<Vec<String>>)> = Vec::new();
        // The rules added by this call: a rule given twice goes in once, as the tools'
        // check-then-append does.
        let mut added: HashSet<(&str, Vec<String>)> = HashSet::new();
        for (index, spec) in rules.iter().enumerate() {
            let want = canonical(family, &spec.args)?;
            if added.contains(&(spec.chain.as_str(), want.clone())) {
                continue;
            }
            let chain_new = if tx.creates(family, &spec.chain) {
                true
            } else if exists(self, tx, &spec.chain)? {
                false
            } else if builtin(&tx.table, &spec.chain).is_some() {
                tx.add_builtin(family, &spec.chain)?;
                missing.chains.push(spec.chain.clone());
                true
            } else {
                return Err(NativeError::NoChain {
                    family,
                    table: tx.table.clone(),
                    chain: spec.chain.clone(),
                });
            };
            let target = spec.target_chain();
            let absent = if chain_new
                || target.is_some_and(|t| tx.creates(family, t))
                || spec.lookup == Lookup::Absent
            {
                true
            } else {
                let needle = spec.needle();
                let key = match (target.filter(|_| by_handle(spec)), spec.lookup) {
                    (Some(target), _) => Read::Handles(target.to_owned()),
                    (None, Lookup::First) if !needle.is_empty() => Read::First(needle),
                    _ => Read::Listing,
                };
                let at = match read
                    .iter()
                    .position(|(c, k, _)| *c == spec.chain && *k == key)
                {
                    Some(at) => at,
                    None => {
                        let listed = match &key {
                            Read::Handles(target) => {
                                self.jumps_to(family, &spec.chain, target, recorded)?
                            }
                            Read::First(needle) => {
                                let needles = [needle.clone()];
                                let wanted = Wanted::FirstContaining(&needles);
                                self.rules(family, &spec.chain, wanted)?.unwrap_or_default()
                            }
                            Read::Listing => {
                                let needles = listings
                                    .iter()
                                    .find(|(c, _)| *c == spec.chain)
                                    .and_then(|(_, n)| n.as_deref());
                                let wanted = needles.map_or(Wanted::All, Wanted::Containing);
                                self.rules(family, &spec.chain, wanted)?.unwrap_or_default()
                            }
                        };
                        let args = listed.into_iter().filter_map(|r| r.args).collect();
                        read.push((spec.chain.clone(), key, args));
                        read.len() - 1
                    }
                };
                !read[at].2.contains(&want)
            };
            if absent {
                let placement = match spec.position {
                    Position::Append if spec.recorded => Placement::AppendRecorded,
                    Position::Append => Placement::Append,
                    Position::Insert => Placement::Insert,
                };
                tx.add(family, &spec.chain, &spec.args, placement)?;
                missing.rules.push(index);
                added.insert((&spec.chain, want));
            }
        }
        Ok(missing)
    }

    /// The rules of `from` that jump (or go) to `target`. With `recorded` handles of this
    /// table's incarnation, each is looked up by handle and the chain is not listed; when one
    /// of them is gone or no longer such a jump (or the table was made anew), the rules are
    /// found by listing `from` instead, decoding only those that name `target`. A jump in a
    /// form the codec does not read (an entry rule with conditions outside its forms, written
    /// by the Go plugin) is returned with `args: None`: a caller deleting the chain deletes it
    /// too.
    ///
    /// # Errors
    /// nf_tables failures.
    pub fn jumps_to(
        &mut self,
        family: Family,
        from: &str,
        target: &str,
        recorded: Option<&Recorded>,
    ) -> Result<Vec<Listed>, NativeError> {
        let is_jump = |r: &Listed| r.target.as_deref() == Some(target);
        if let Some(recorded) = recorded.filter(|r| r.family == family && !r.rules.is_empty())
            && self.generation(family)? == Some(recorded.table)
        {
            let mut found = Vec::with_capacity(recorded.rules.len());
            for handle in &recorded.rules {
                match self.rule(family, from, *handle)? {
                    Some(rule) if is_jump(&rule) => found.push(rule),
                    _ => {
                        found.clear();
                        break;
                    }
                }
            }
            if !found.is_empty() {
                return Ok(found);
            }
        }
        let needles = [target.as_bytes().to_vec()];
        let listed = self
            .rules(family, from, Wanted::Containing(&needles))?
            .unwrap_or_default();
        Ok(listed.into_iter().filter(is_jump).collect())
    }

    /// Removes each of `removals` (its chain and the rules of its `from` that jump to it), in
    /// one transaction for all: a chain that does not exist is left alone (no rule can jump to
    /// it), the jumps are found by their recorded handles ([`NativeTables::jumps_to`]), and when
    /// the kernel refuses the transaction because a chain is still jumped to (a jump that was
    /// not recorded: another implementation's, another call's) or a rule is gone, it is made
    /// again from lookups and committed once more. When a chain is jumped to from elsewhere
    /// too (an operator's rule, which the kernel does not let it outlive), what can go still
    /// goes, as the tools' `-F` before `-X` would have it: the jumps found and every chain's
    /// rules, so that nothing is forwarded through them any more; the chains are then deleted
    /// one by one, and those still jumped to are left empty.
    ///
    /// # Errors
    /// [`NativeError::Referenced`] for the first chain left empty; nf_tables failures.
    pub fn remove_chains(&mut self, removals: &[Removal<'_>]) -> Result<(), NativeError> {
        let busy =
            |e: &NativeError| matches!(e, NativeError::Nft(e) if e.errno() == Some(libc::EBUSY));
        let tx = self.removal(removals, true, true)?;
        let refused = match self.commit(&tx) {
            Ok(_) => return Ok(()),
            Err(NativeError::Nft(e))
                if matches!(e.errno(), Some(libc::EBUSY | libc::ENOENT))
                    && removals.iter().any(|r| r.recorded.is_some()) =>
            {
                log::debug!("removal by recorded handles refused ({e}); looking the jumps up");
                let tx = self.removal(removals, false, true)?;
                match self.commit(&tx) {
                    Ok(_) => return Ok(()),
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        if !busy(&refused) {
            return Err(refused);
        }
        log::debug!("removal refused ({refused}): a chain is jumped to from elsewhere");
        let tx = self.removal(removals, false, false)?;
        self.commit(&tx)?;
        let mut left = None;
        for r in removals {
            if !self.chain_exists(r.family, r.chain)? {
                continue;
            }
            let mut tx = self.transaction();
            tx.delete_chain(r.family, r.chain);
            match self.commit(&tx) {
                Ok(_) => {}
                Err(e) if busy(&e) => {
                    left.get_or_insert_with(|| NativeError::Referenced {
                        family: r.family,
                        table: self.name.clone(),
                        chain: r.chain.to_owned(),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        left.map_or(Ok(()), Err)
    }

    /// The transaction removing `removals`' jumps (by their recorded handles with
    /// `use_records`) and emptying their chains, and deleting the chains with `delete`.
    fn removal(
        &mut self,
        removals: &[Removal<'_>],
        use_records: bool,
        delete: bool,
    ) -> Result<Transaction, NativeError> {
        let mut tx = self.transaction();
        for r in removals {
            if !self.chain_exists(r.family, r.chain)? {
                continue;
            }
            let recorded = r.recorded.filter(|_| use_records);
            for rule in self.jumps_to(r.family, r.from, r.chain, recorded)? {
                tx.delete_rule(r.family, r.from, rule.handle);
            }
            if delete {
                tx.delete_chain(r.family, r.chain);
            } else {
                tx.flush_chain(r.family, r.chain);
            }
        }
        Ok(tx)
    }

    /// Commits `tx` as one transaction (both families): all of it or nothing. Returns the
    /// handles of the rules appended with [`Transaction::append_recorded`], per family.
    ///
    /// # Errors
    /// The kernel's refusal, naming the operation.
    pub fn commit(&mut self, tx: &Transaction) -> Result<Vec<Recorded>, NativeError> {
        let echoed = self.nft().apply_echo(&tx.batch)?;
        let mut out: Vec<Recorded> = Vec::new();
        for (rule, family) in echoed.iter().zip(&tx.recorded) {
            match out.iter_mut().find(|r| r.family == *family) {
                Some(r) => r.rules.push(rule.handle),
                None => out.push(Recorded {
                    family: *family,
                    table: 0,
                    rules: vec![rule.handle],
                }),
            }
        }
        for recorded in &mut out {
            recorded.table = self.generation(recorded.family)?.unwrap_or(0);
        }
        Ok(out)
    }
}

fn listed_rule(family: Family, rule: &crate::nft::ListedRule) -> Listed {
    // iptables-nft keeps `-m comment` as an xtables match; a rule comment in user data was
    // written by something else.
    let args = match rule.comment {
        None => super::codec::decode(family, &rule.exprs),
        Some(_) => None,
    };
    let target = match rule.exprs.last() {
        Some(Expr::ImmediateVerdict(Verdict::Jump(chain) | Verdict::Goto(chain))) => {
            Some(chain.clone())
        }
        _ => None,
    };
    Listed {
        handle: rule.handle,
        target,
        args,
    }
}
