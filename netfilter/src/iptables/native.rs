//! The iptables tables of `iptables-nft` read and written over nf_tables netlink, as the tools
//! would, without starting them and without reading whole tables.
//!
//! Where the tools are the nf_tables variant ([`variant`]: the `*-restore` on `PATH` resolves
//! to `xtables-nft-multi`), an iptables table is an nf_tables table (`ip nat`, `ip6 filter`)
//! and each rule an nf_tables rule. [`codec`] turns a rule in the tools' words into
//! expressions that every `iptables-nft` release from 1.8.7 to 1.8.11 reads back as that
//! rule, and a listed rule in the encoding of any of those releases back into
//! `iptables-save`'s words, for the forms the plugins write: the whole of portmap's layout
//! and firewall's accepts, with the conditions a user may add (see the module for the list;
//! anything else is [`Unsupported`] and goes through `iptables-restore`). [`NativeTables`]
//! reads the chains a call needs (a rule by handle, the rules naming a chain, a chain's
//! existence) and commits a [`Transaction`] for both families at once; [`snapshot`] reads
//! chains into a [`TableDump`] for callers written against `iptables-save`'s output.
//! Kernel tests write every form once with `iptables-restore` and once natively and require
//! the same `iptables-save` lines and `iptables -C` to find ours, here and with the tools of
//! Debian 11, 12 and 13 (`tests/tests/userlands.rs`).
//!
//! `iptables-save` formats the whole table, so its cost grows with every rule in it (20–30 ms
//! at 2000 rules here), and `iptables-restore` reloads it; a call of ours reads and writes its
//! own objects only. With legacy iptables ([`Variant::Legacy`]) none of this applies: those
//! tables are x_tables, and the tools remain the only writer.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::{Family, TableDump};
use crate::nft::{Expr, Family as NftFamily, Nft, NftError, Rule, Table};

pub mod codec;
mod tables;
#[cfg(test)]
mod tests;
mod xt;

pub use codec::{Unsupported, canonical, decode, encode};
pub use tables::{
    Listed, Lookup, Missing, NativeError, NativeTables, Position, Recorded, Removal, RuleSpec,
    Transaction, writes,
};
pub use xt::MULTIPORT_MAX;

/// Which iptables the tools of a family on `PATH` are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `iptables-nft` (`xtables-nft-multi`): the tables are nf_tables tables, which this
    /// module reads and writes natively.
    Nft,
    /// `iptables-legacy` (`xtables-legacy-multi`): the kernel's x_tables, which only the
    /// tools write (`iptables-restore`).
    Legacy,
    /// A tool this module does not recognise (a wrapper script, a custom build): treated as
    /// legacy.
    Other,
    /// No `<family>-restore` on `PATH`.
    Missing,
}

/// Which iptables `<family>-restore` on `PATH` is, from the file it resolves to through any
/// chain of symlinks (Debian's alternatives: `/usr/sbin/iptables-restore` →
/// `/etc/alternatives/iptables-restore` → `/usr/sbin/iptables-nft-restore` →
/// `xtables-nft-multi`): no process is started. Resolved once per process and family.
#[must_use]
pub fn variant(family: Family) -> Variant {
    static V4: OnceLock<Variant> = OnceLock::new();
    static V6: OnceLock<Variant> = OnceLock::new();
    match family {
        Family::V4 => *V4.get_or_init(|| resolve_variant(family)),
        Family::V6 => *V6.get_or_init(|| resolve_variant(family)),
    }
}

/// Whether `<family>-restore` on `PATH` is the nf_tables variant ([`Variant::Nft`]).
#[must_use]
pub fn writes_nf_tables(family: Family) -> bool {
    variant(family) == Variant::Nft
}

fn resolve_variant(family: Family) -> Variant {
    let program = format!("{}-restore", family.prefix());
    let Some(found) = on_path(&program) else {
        return Variant::Missing;
    };
    let Ok(real) = std::fs::canonicalize(found) else {
        return Variant::Missing;
    };
    variant_of(&real)
}

/// The variant of the binary at `real` (a path without symlinks), by its name.
fn variant_of(real: &Path) -> Variant {
    match real.file_name().and_then(|n| n.to_str()) {
        Some(n) if n == "xtables-nft-multi" || n.ends_with("-nft-restore") => Variant::Nft,
        Some(n) if n == "xtables-legacy-multi" || n.ends_with("-legacy-restore") => Variant::Legacy,
        _ => Variant::Other,
    }
}

/// Where `program` is on `PATH`, if it is.
#[must_use]
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| Path::new(candidate).exists())
}

/// Which rules of a chain a read needs.
#[derive(Debug, Clone, Copy)]
pub enum Wanted<'a> {
    /// Every rule.
    All,
    /// Only the rules whose netlink encoding contains one of these byte strings (an address
    /// in network byte order, a chain name…): a rule a caller looks for necessarily contains
    /// its address or its jump target, so leaving the others out answers "is this rule
    /// there?" exactly, while a chain of thousands costs the kernel's listing but not their
    /// decoding. An empty list reads whether the chain exists and nothing else.
    Containing(&'a [Vec<u8>]),
    /// Only the first rule containing one of these byte strings, if any: the listing stops
    /// there ([`Nft::first_rule_containing`]), so a rule near the top of a chain of thousands
    /// costs a handful of rules' listing. A caller that needs every such rule wants
    /// [`Wanted::Containing`].
    FirstContaining(&'a [Vec<u8>]),
}

/// The nf_tables table `iptables-nft` keeps `family`'s iptables table `name` in: `ip NAME` or
/// `ip6 NAME`.
#[must_use]
pub fn nft_table(family: Family, name: &str) -> Table {
    Table::new(
        match family {
            Family::V4 => NftFamily::Ip,
            Family::V6 => NftFamily::Ip6,
        },
        name,
    )
}

/// The rules of `chains` in `table` of `family`, as `iptables-save` would print them, left
/// out as each chain's [`Wanted`] says; chains that do not exist are absent from the dump.
/// `None` when a rule read is not in a form [`rule_args`] knows.
///
/// # Errors
/// When nf_tables cannot be asked.
pub fn snapshot(
    family: Family,
    table: &str,
    chains: &[(&str, Wanted<'_>)],
) -> Result<Option<TableDump>, NftError> {
    let mut nft = Nft::new()?;
    let table = nft_table(family, table);
    let mut dump = TableDump::default();
    for (chain, wanted) in chains {
        let listed = match wanted {
            Wanted::All => nft.rules(&table, chain),
            Wanted::Containing(needles) => {
                let needles: Vec<&[u8]> = needles.iter().map(Vec::as_slice).collect();
                nft.rules_containing(&table, chain, &needles)
            }
            Wanted::FirstContaining(needles) => {
                let needles: Vec<&[u8]> = needles.iter().map(Vec::as_slice).collect();
                Nft::first_rule_containing(&table, chain, &needles).map(Vec::from_iter)
            }
        };
        let listed = match listed {
            Ok(listed) => listed,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        let mut rules = Vec::with_capacity(listed.len());
        for rule in listed {
            // iptables-nft keeps `-m comment` as an xtables match; a rule comment in user data
            // was written by something else.
            let args = match rule.comment {
                None => rule_args(family, &rule.exprs),
                Some(_) => None,
            };
            match args {
                Some(args) => rules.push(args),
                None => {
                    log::debug!("{table} {chain}: rule {} is not decoded", rule.handle);
                    return Ok(None);
                }
            }
        }
        dump.chains.push((*chain).to_owned());
        dump.rules.insert((*chain).to_owned(), rules);
    }
    Ok(Some(dump))
}

/// A rule's arguments as `iptables-save` prints them (without `-A CHAIN`), when the rule is
/// in one of the forms [`encode`] writes (see [`codec`]); `None` for anything else.
#[must_use]
pub fn rule_args(family: Family, exprs: &[Expr]) -> Option<Vec<String>> {
    decode(family, exprs)
}

/// The nf_tables rule that `iptables-nft` makes of `-A CHAIN <args>`, expression for
/// expression ([`encode`]); `None` for a form outside [`codec`]'s, which the caller leaves to
/// `iptables-restore`.
#[must_use]
pub fn encode_rule(family: Family, args: &[String]) -> Option<Rule> {
    encode(family, args).ok()
}
