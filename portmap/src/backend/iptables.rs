//! The iptables backend: the reference's layout in table `nat`, written with one
//! `iptables-restore --noflush` transaction per family per call.
//!
//! Rules are computed in `iptables-save`'s canonical form (addresses with their prefix,
//! `-s`/`-d` first, `-m tcp` after `-p tcp --dport`, `--dports` for multiport), so what exists
//! is recognised in the dump and only what is missing is written; the read-modify-write is
//! serialised with our own lock file.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use common::conf::Attachment as Valid;
use common::iptables::{TableDump, restore_line};
use common::lock::{FileLock, LockError};
use common::nft::{CmpOp, Expr, LazyNft, Nft, NftError, PayloadBase, Verdict};
use ipnet::IpNet;
use netlink_packet_netfilter::nftables::MetaKey;

use super::{Fate, Holders, PortmapBackend};
use crate::config::{Backend, Conditions, Config, IpFamily, PortMapping, Proto};
use crate::error::PortmapError;
use crate::names;
use crate::plan::Attachment;
use crate::state::State;

const NAT: &str = names::IPT_NAT;

fn ipt_err(e: common::iptables::IptablesError) -> PortmapError {
    PortmapError::Iptables(e)
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_string()).collect()
}

/// `1<<bit` as the reference prints it: `0x2000/0x2000`.
pub fn mark_def(bit: u32) -> String {
    let m = 1u32 << bit;
    format!("{m:#x}/{m:#x}")
}

/// An address or prefix as `iptables-save` prints it (`10.0.0.0/24`, `1.2.3.4/32`).
fn canonical_net(s: &str) -> String {
    if let Ok(net) = s.parse::<IpNet>() {
        return net.trunc().to_string();
    }
    if let Ok(a) = s.parse::<IpAddr>() {
        return IpNet::from(a).to_string();
    }
    s.to_string()
}

/// Moves `[!] -s/-d/-i/-o X` to the front (in that order), as `iptables-save` prints them.
fn canonical_conditions(conds: &[String]) -> (Vec<String>, Vec<String>) {
    let mut front: Vec<(usize, Vec<String>)> = Vec::new();
    let mut rest = Vec::new();
    let mut i = 0;
    while i < conds.len() {
        let neg = conds[i] == "!";
        let at = if neg { i + 1 } else { i };
        let opt = conds.get(at).map(String::as_str);
        let rank = match opt {
            Some("-s" | "--source" | "--src") => Some(0),
            Some("-d" | "--destination" | "--dst") => Some(1),
            Some("-i" | "--in-interface") => Some(2),
            Some("-o" | "--out-interface") => Some(3),
            _ => None,
        };
        match (rank, conds.get(at + 1)) {
            (Some(rank), Some(value)) => {
                let mut part = Vec::new();
                if neg {
                    part.push("!".to_string());
                }
                let short = ["-s", "-d", "-i", "-o"][rank];
                part.push(short.to_string());
                part.push(if rank < 2 {
                    canonical_net(value)
                } else {
                    value.clone()
                });
                front.push((rank, part));
                i = at + 2;
            }
            _ => {
                rest.push(conds[i].clone());
                i += 1;
            }
        }
    }
    front.sort_by_key(|(rank, _)| *rank);
    (front.into_iter().flat_map(|(_, p)| p).collect(), rest)
}

/// The rules of the `CNI-DN-<hash>` chain for container address `ip`, in mapping order.
pub fn dnat_rules(config: &Config, ip: IpNet) -> Vec<Vec<String>> {
    let fam = IpFamily::of(ip.addr());
    let mark_chain = config
        .external_set_mark_chain
        .clone()
        .unwrap_or_else(|| names::IPT_SETMARK.to_string());
    let mut rules = Vec::new();
    for m in config.mappings.iter().filter(|m| m.host_ip.applies_to(fam)) {
        let dst: Vec<String> = m
            .host_ip
            .addr()
            .map(|a| vec!["-d".to_string(), IpNet::from(a).to_string()])
            .unwrap_or_default();
        let port = m.host_port.to_string();
        let proto = m.proto.name();
        let tail = |more: &[&str]| {
            let mut r = dst.clone();
            r.extend(args(&["-p", proto, "-m", proto, "--dport", &port]));
            r.extend(args(more));
            r
        };
        if config.snat {
            let mut hairpin = Vec::new();
            if !config.masq_all {
                hairpin.extend(["-s".to_string(), ip.trunc().to_string()]);
            }
            hairpin.extend(tail(&["-j", &mark_chain]));
            rules.push(hairpin);
            if fam == IpFamily::V4 && !config.masq_all {
                let mut local = args(&["-s", "127.0.0.1/32"]);
                local.extend(tail(&["-j", &mark_chain]));
                rules.push(local);
            }
        }
        let to = match ip.addr() {
            IpAddr::V4(a) => format!("{a}:{}", m.container_port),
            IpAddr::V6(a) => format!("[{a}]:{}", m.container_port),
        };
        rules.push(tail(&["-j", "DNAT", "--to-destination", &to]));
    }
    rules
}

/// The entry rules in `CNI-HOSTPORT-DNAT`: per protocol (sorted), per chunk of 15 host ports
/// in mapping order (wrong-family hostIP entries included, as the reference does).
pub fn entry_rules(config: &Config, container_id: &str, fam: IpFamily) -> Vec<Vec<String>> {
    let chain = names::dnat_chain(&config.network, container_id);
    let comment = names::ipt_entry_comment(&config.network, container_id);
    let mut protos: Vec<Proto> = config.mappings.iter().map(|m| m.proto).collect();
    protos.sort_unstable();
    protos.dedup();
    let (front, rest) = match config.conditions(fam) {
        Conditions::Iptables(c) => canonical_conditions(c),
        _ => (Vec::new(), Vec::new()),
    };
    let mut rules = Vec::new();
    for proto in protos {
        let ports: Vec<String> = config
            .mappings
            .iter()
            .filter(|m| m.proto == proto)
            .map(|m| m.host_port.to_string())
            .collect();
        for chunk in ports.chunks(names::IPT_MULTIPORT_MAX) {
            let mut r = front.clone();
            r.extend(args(&[
                "-p",
                proto.name(),
                "-m",
                "comment",
                "--comment",
                &comment,
            ]));
            r.extend(args(&["-m", "multiport", "--dports", &chunk.join(",")]));
            r.extend(rest.iter().cloned());
            r.extend(args(&["-j", &chain]));
            rules.push(r);
        }
    }
    rules
}

/// The restore lines that bring `dump` to the state the reference's ADD leaves: missing chains
/// with `-N`, missing rules appended (the POSTROUTING jump inserted first).
///
/// # Errors
/// An argument that cannot be written in a restore script.
pub fn add_lines(
    dump: &TableDump,
    config: &Config,
    container_id: &str,
    ip: IpNet,
) -> Result<Vec<String>, PortmapError> {
    let fam = IpFamily::of(ip.addr());
    if let Some((chain, m)) = conflicts(dump, config, container_id, fam).first() {
        return Err(refusal(dump, chain, m));
    }
    lines_unchecked(dump, config, container_id, ip)
}

/// The restore lines of an ADD in one family, taking over the host ports of attachments
/// `holders` says are gone: their chains are removed in the same transaction. Returns the
/// lines and the records of the attachments taken over.
///
/// # Errors
/// [`PortmapError::Conflict`] naming a holder that is not gone; an argument that cannot be
/// written in a restore script.
pub fn add_lines_taking_over(
    dump: &TableDump,
    config: &Config,
    container_id: &str,
    ip: IpNet,
    holders: &dyn Holders,
) -> Result<(Vec<String>, Vec<State>), PortmapError> {
    let fam = IpFamily::of(ip.addr());
    let mut lines = Vec::new();
    let mut taken = Vec::new();
    for (chain, m) in conflicts(dump, config, container_id, fam) {
        let Some((network, id)) = entry_owner(dump, &chain)
            .filter(|(network, id)| names::dnat_chain(network, id) == chain)
        else {
            return Err(refusal(dump, &chain, m));
        };
        match holders.by_container(&network, &id) {
            Fate::Gone(records) if records.iter().all(|r| r.backend == Backend::Iptables) => {
                lines.extend(del_lines(dump, &network, &id)?);
                taken.extend(records);
            }
            _ => return Err(refusal(dump, &chain, m)),
        }
    }
    lines.extend(lines_unchecked(dump, config, container_id, ip)?);
    Ok((lines, taken))
}

/// [`add_lines`] without the conflict check.
fn lines_unchecked(
    dump: &TableDump,
    config: &Config,
    container_id: &str,
    ip: IpNet,
) -> Result<Vec<String>, PortmapError> {
    let fam = IpFamily::of(ip.addr());
    let mut lines = Vec::new();
    let mut created: Vec<String> = Vec::new();
    let mut ensure_chain = |lines: &mut Vec<String>, chain: &str| -> Result<(), PortmapError> {
        if !dump.has_chain(chain) && !created.iter().any(|c| c == chain) {
            lines.push(restore_line::<&str>("-N", chain, &[]).map_err(ipt_err)?);
            created.push(chain.to_string());
        }
        Ok(())
    };
    let chain = names::dnat_chain(&config.network, container_id);
    // The attachment's chain and the entry chain can be long (one rule per mapping, one per
    // attachment): each rule is looked up in a set of them, not compared with every one.
    let in_chain = rule_set(dump, &chain);
    let in_entry = rule_set(dump, names::IPT_TOPLEVEL_DNAT);
    let ensure_rule = |lines: &mut Vec<String>, chain: &str, rule: &[String], insert: bool| {
        let present = match chain {
            c if c == names::IPT_TOPLEVEL_DNAT => in_entry.contains(rule),
            c if c.starts_with("CNI-DN-") => in_chain.contains(rule),
            _ => dump.has_rule(chain, rule),
        };
        if present {
            return Ok(());
        }
        let line = if insert {
            let mut with_pos = vec!["1".to_string()];
            with_pos.extend(rule.iter().cloned());
            restore_line("-I", chain, &with_pos)
        } else {
            restore_line("-A", chain, rule)
        };
        lines.push(line.map_err(ipt_err)?);
        Ok::<(), PortmapError>(())
    };
    if config.snat && config.external_set_mark_chain.is_none() {
        let mark = mark_def(config.mark_masq_bit);
        ensure_chain(&mut lines, names::IPT_SETMARK)?;
        ensure_rule(
            &mut lines,
            names::IPT_SETMARK,
            &args(&[
                "-m",
                "comment",
                "--comment",
                names::IPT_SETMARK_COMMENT,
                "-j",
                "MARK",
                "--set-xmark",
                &mark,
            ]),
            false,
        )?;
        ensure_chain(&mut lines, names::IPT_MASQ)?;
        ensure_rule(
            &mut lines,
            names::IPT_MASQ,
            &args(&["-m", "mark", "--mark", &mark, "-j", "MASQUERADE"]),
            false,
        )?;
        ensure_rule(
            &mut lines,
            "POSTROUTING",
            &args(&[
                "-m",
                "comment",
                "--comment",
                names::IPT_MASQ_COMMENT,
                "-j",
                names::IPT_MASQ,
            ]),
            true,
        )?;
    }
    ensure_chain(&mut lines, names::IPT_TOPLEVEL_DNAT)?;
    for entry in ["PREROUTING", "OUTPUT"] {
        ensure_rule(
            &mut lines,
            entry,
            &args(&[
                "-m",
                "addrtype",
                "--dst-type",
                "LOCAL",
                "-j",
                names::IPT_TOPLEVEL_DNAT,
            ]),
            false,
        )?;
    }
    ensure_chain(&mut lines, &chain)?;
    // Append-unique, also against the rules of this very call.
    let mut seen: HashSet<Vec<String>> = HashSet::new();
    for rule in dnat_rules(config, ip) {
        if !seen.contains(&rule) {
            ensure_rule(&mut lines, &chain, &rule, false)?;
            seen.insert(rule);
        }
    }
    for rule in entry_rules(config, container_id, fam) {
        if !seen.contains(&rule) {
            ensure_rule(&mut lines, names::IPT_TOPLEVEL_DNAT, &rule, false)?;
            seen.insert(rule);
        }
    }
    Ok(lines)
}

/// The rules of `chain` in `dump`, for lookups.
fn rule_set<'a>(dump: &'a TableDump, chain: &str) -> HashSet<&'a [String]> {
    dump.rules(chain).iter().map(Vec::as_slice).collect()
}

/// The value after `opt` in a rule.
fn opt_value<'a>(rule: &'a [String], opt: &str) -> Option<&'a str> {
    let pos = rule.iter().position(|a| a == opt)?;
    rule.get(pos + 1).map(String::as_str)
}

/// The other attachments' `CNI-DN-` chains that DNAT one of our host ports (same protocol
/// and port, same host address or both on every address), each with the first such mapping.
fn conflicts<'c>(
    dump: &TableDump,
    config: &'c Config,
    container_id: &str,
    fam: IpFamily,
) -> Vec<(String, &'c PortMapping)> {
    let ours = names::dnat_chain(&config.network, container_id);
    // (proto, port, -d) of our mappings, as the DNAT rules of the dump spell them.
    let wanted: HashMap<(&str, String, Option<String>), &PortMapping> = config
        .mappings
        .iter()
        .filter(|m| m.host_ip.applies_to(fam))
        .map(|m| {
            let dst = m.host_ip.addr().map(|a| IpNet::from(a).to_string());
            ((m.proto.name(), m.host_port.to_string(), dst), m)
        })
        .collect();
    let mut found = Vec::new();
    for chain in dump.chains() {
        if !chain.starts_with("CNI-DN-") || *chain == ours {
            continue;
        }
        let clash = dump.rules(chain).iter().find_map(|rule| {
            if opt_value(rule, "-j") != Some("DNAT") {
                return None;
            }
            let key = (
                opt_value(rule, "-p")?,
                opt_value(rule, "--dport")?.to_string(),
                opt_value(rule, "-d").map(str::to_string),
            );
            wanted.get(&key).copied()
        });
        if let Some(m) = clash {
            found.push((chain.clone(), m));
        }
    }
    found
}

/// The entry comment of `chain` in `CNI-HOSTPORT-DNAT`, if it has one.
fn entry_comment<'d>(dump: &'d TableDump, chain: &str) -> Option<&'d str> {
    dump.rules(names::IPT_TOPLEVEL_DNAT)
        .iter()
        .find(|r| r.last().is_some_and(|c| c == chain))
        .and_then(|r| opt_value(r, "--comment"))
}

/// The (network, container ID) of `chain`, from its entry comment
/// `dnat name: "<network>" id: "<id>"` (a comment cut to 256 characters does not parse).
fn entry_owner(dump: &TableDump, chain: &str) -> Option<(String, String)> {
    let rest = entry_comment(dump, chain)?.strip_prefix("dnat name: \"")?;
    let (network, id) = rest.split_once("\" id: \"")?;
    Some((network.to_string(), id.strip_suffix('"')?.to_string()))
}

/// The refusal of mapping `m`, which `chain` holds, naming the chain's owner.
fn refusal(dump: &TableDump, chain: &str, m: &PortMapping) -> PortmapError {
    PortmapError::Conflict {
        what: m.host_port_name(),
        owner: entry_comment(dump, chain).map_or_else(
            || format!("chain {chain}"),
            |c| format!("{c} (chain {chain})"),
        ),
    }
}

/// The restore lines removing the attachment's chains (and the entry rules jumping to them),
/// including the legacy `CNI-SN-<hash>` chain. Shared chains stay.
///
/// # Errors
/// An argument that cannot be written in a restore script.
pub fn del_lines(
    dump: &TableDump,
    network: &str,
    container_id: &str,
) -> Result<Vec<String>, PortmapError> {
    let mut lines = Vec::new();
    for (entry, chain) in [
        (
            names::IPT_TOPLEVEL_DNAT,
            names::dnat_chain(network, container_id),
        ),
        (
            names::IPT_LEGACY_SNAT,
            names::legacy_snat_chain(network, container_id),
        ),
    ] {
        for rule in dump.rules(entry) {
            if rule.len() >= 2 && rule[rule.len() - 2] == "-j" && rule[rule.len() - 1] == chain {
                lines.push(restore_line("-D", entry, rule).map_err(ipt_err)?);
            }
        }
        if dump.has_chain(&chain) {
            lines.push(restore_line::<&str>("-F", &chain, &[]).map_err(ipt_err)?);
            lines.push(restore_line::<&str>("-X", &chain, &[]).map_err(ipt_err)?);
        }
    }
    Ok(lines)
}

/// Our lock around an iptables read-modify-write. Where `/run/cni/portmap` cannot be written
/// (read-only, full), an existing lock file is locked through a read-only descriptor (`flock`
/// needs no write access), and without one the call goes on unlocked, since no other call can
/// take it there either: a DEL must still remove what it can.
fn lock() -> Result<Option<FileLock>, PortmapError> {
    let wait = common::lock::DEFAULT_WAIT;
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

/// The tools of `family`.
fn tools(family: IpFamily) -> common::iptables::Iptables {
    common::iptables::Iptables::new(family.into())
}

/// Removes the attachment's chains in one family.
fn teardown(
    ipt: &common::iptables::Iptables,
    network: &str,
    container_id: &str,
) -> Result<(), PortmapError> {
    let dump = ipt.save(NAT).map_err(ipt_err)?;
    let lines = del_lines(&dump, network, container_id)?;
    ipt.restore(NAT, &lines).map_err(ipt_err)
}

/// Removes the attachment's chains (the Go plugin's have the same names) in `families`:
/// tools that are missing are skipped (nothing of ours can exist without them); other
/// failures are collected.
///
/// # Errors
/// The first failure.
pub fn del(network: &str, container_id: &str, families: &[IpFamily]) -> Result<(), PortmapError> {
    let _lock = lock()?;
    let mut errors = Vec::new();
    for f in families {
        match teardown(&tools(*f), network, container_id) {
            Ok(()) => {}
            Err(PortmapError::Iptables(e)) if e.is_missing() => {}
            Err(e) => errors.push(e),
        }
    }
    match errors.into_iter().next() {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// The reference's layout, written with `iptables-restore`.
#[derive(Debug)]
pub struct Iptables {
    nft: LazyNft,
}

impl Iptables {
    /// The backend, owning the call's nf_tables socket (for what it reads there).
    pub fn new(nft: LazyNft) -> Iptables {
        Iptables { nft }
    }
}

impl PortmapBackend for Iptables {
    fn kind(&self) -> Backend {
        Backend::Iptables
    }

    /// One transaction per container family, with the removal of the chains of attachments
    /// it takes ports over from; a failure in the second family rolls back the first.
    fn add(
        &mut self,
        att: &Attachment,
        config: &Config,
        ips: &[IpNet],
        holders: &dyn Holders,
    ) -> Result<Vec<State>, PortmapError> {
        // No host port our nftables maps hold either (no maps where nf_tables is not usable).
        if let Ok(nft) = self.nft.get() {
            for family in ips.iter().map(|ip| IpFamily::of(ip.addr())) {
                let mappings = config.mappings_for(family);
                if let Some((m, owner)) =
                    super::nftables::holder(nft, family, &att.owner(), &mappings)
                        .map_err(PortmapError::Nft)?
                {
                    return Err(PortmapError::Conflict {
                        what: m.host_port_name(),
                        owner,
                    });
                }
            }
        }
        let _lock = lock()?;
        let mut done = Vec::new();
        let mut taken: Vec<State> = Vec::new();
        for ip in ips {
            let ipt = tools(IpFamily::of(ip.addr()));
            let result = ipt
                .save(NAT)
                .map_err(ipt_err)
                .and_then(|dump| {
                    add_lines_taking_over(&dump, config, &att.container_id, *ip, holders)
                })
                .and_then(|(lines, gone)| {
                    ipt.restore(NAT, &lines).map_err(ipt_err)?;
                    Ok(gone)
                });
            match result {
                Ok(gone) => {
                    for record in gone {
                        if !taken.iter().any(|t| t.attachment() == record.attachment()) {
                            taken.push(record);
                        }
                    }
                }
                Err(e) => {
                    for ipt in &done {
                        if let Err(undo) = teardown(ipt, &config.network, &att.container_id) {
                            log::warn!("rollback of {} failed: {undo}", ipt.family());
                        }
                    }
                    return Err(e);
                }
            }
            done.push(ipt);
        }
        // The chains of the attachments taken over in families this ADD does not map.
        let ours: Vec<IpFamily> = ips.iter().map(|ip| IpFamily::of(ip.addr())).collect();
        for record in &taken {
            let rest: Vec<IpFamily> = record
                .families()
                .into_iter()
                .filter(|f| !ours.contains(f))
                .collect();
            if rest.is_empty() {
                continue;
            }
            for f in rest {
                if let Err(e) = teardown(&tools(f), &record.network, &record.container_id) {
                    log::warn!(
                        "failed to remove the {f:?} chain of {}: {e}",
                        record.container_id
                    );
                }
            }
        }
        Ok(taken)
    }

    /// The chain, each of its rules and each entry rule must exist, and the shared chains
    /// and jumps they need.
    fn check(
        &mut self,
        att: &Attachment,
        config: &Config,
        ips: &[IpNet],
    ) -> Result<(), PortmapError> {
        for ip in ips {
            let dump = tools(IpFamily::of(ip.addr())).save(NAT).map_err(ipt_err)?;
            check_dump(&dump, config, &att.container_id, *ip)?;
        }
        Ok(())
    }

    fn del(&mut self, record: &State) -> Result<(), PortmapError> {
        del(&record.network, &record.container_id, &record.families())
    }

    fn del_unrecorded(&mut self, att: &Attachment) -> Result<(), PortmapError> {
        del(&att.network, &att.container_id, &IpFamily::BOTH)
    }

    /// Tears down every `CNI-DN-` chain of `network` whose container is not valid, found by
    /// the entry rules' comments.
    fn gc(&mut self, network: &str, valid: &[Valid]) -> Result<(), PortmapError> {
        let _lock = lock()?;
        for f in IpFamily::BOTH {
            let ipt = tools(f);
            let dump = match ipt.save(NAT) {
                Ok(d) => d,
                Err(e) if e.is_missing() => continue,
                Err(e) => return Err(ipt_err(e)),
            };
            let mut lines = Vec::new();
            for id in stale_containers(&dump, network, valid) {
                lines.extend(del_lines(&dump, network, &id)?);
            }
            ipt.restore(NAT, &lines).map_err(ipt_err)?;
        }
        Ok(())
    }

    /// The IPv4 tools work.
    fn status(&mut self) -> Result<(), PortmapError> {
        tools(IpFamily::V4).probe().map_err(ipt_err)
    }

    fn into_socket(self: Box<Self>) -> LazyNft {
        self.nft
    }
}

/// Who holds one of `mappings` in the reference's layout of `family`, where the tools are
/// `iptables-nft` and so the layout is in nf_tables, read without exec: the entry rules of
/// `CNI-HOSTPORT-DNAT` name the chains that take a port (their multiport lists), and a DNAT
/// rule of such a chain with the same protocol, port and host address (or none, for both)
/// holds it. The chain `ours` is skipped. No entry chain, no holder; the legacy tools' layout
/// is not in nf_tables and is not read.
///
/// # Errors
/// nf_tables failures other than "not found".
pub fn holder_in_nf_tables<'m>(
    nft: &mut Nft,
    family: IpFamily,
    ours: &str,
    mappings: &[&'m PortMapping],
) -> Result<Option<(&'m PortMapping, String)>, NftError> {
    let table = common::iptables::native::nft_table(family.into(), NAT);
    let entries = match nft.rules(&table, names::IPT_TOPLEVEL_DNAT) {
        Ok(rules) => rules,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut looked: HashSet<String> = HashSet::new();
    for entry in entries.iter().map(|r| Entry::decode(&r.exprs)) {
        let Some(chain) = entry.chain.filter(|c| c != ours) else {
            continue;
        };
        let taken = mappings.iter().any(|m| {
            Some(m.proto.l4().number()) == entry.proto && entry.ports.contains(&m.host_port)
        });
        if !taken || !looked.insert(chain.clone()) {
            continue;
        }
        let rules = match nft.rules(&table, &chain) {
            Ok(rules) => rules,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        for dnat in rules.iter().filter_map(|r| Dnat::decode(family, &r.exprs)) {
            let held = mappings.iter().find(|m| {
                Some(m.proto.l4().number()) == dnat.proto
                    && Some(m.host_port) == dnat.port
                    && m.host_ip.addr() == dnat.daddr
            });
            if let Some(m) = held {
                let owner = match entry.comment {
                    Some(c) => format!("{c} (chain {chain})"),
                    None => format!("chain {chain}"),
                };
                return Ok(Some((m, owner)));
            }
        }
    }
    Ok(None)
}

/// An entry rule of `CNI-HOSTPORT-DNAT` as `iptables-nft` encodes it: `-p PROTO -m comment
/// --comment TEXT -m multiport --dports P,… -j CNI-DN-…`.
#[derive(Debug, Default)]
struct Entry {
    proto: Option<u8>,
    ports: Vec<u16>,
    comment: Option<String>,
    chain: Option<String>,
}

impl Entry {
    fn decode(exprs: &[Expr]) -> Entry {
        let mut entry = Entry::default();
        for (i, e) in exprs.iter().enumerate() {
            match e {
                Expr::Meta {
                    key: MetaKey::L4Proto,
                    ..
                } => entry.proto = cmp_after(exprs, i).and_then(|d| d.first().copied()),
                Expr::XtMatch { name, rev: 1, info } if name == "multiport" => {
                    entry.ports = multiport_ports(info);
                }
                Expr::XtMatch { name, info, .. } if name == "comment" => {
                    let end = info.iter().position(|b| *b == 0).unwrap_or(info.len());
                    entry.comment = String::from_utf8(info[..end].to_vec()).ok();
                }
                Expr::ImmediateVerdict(Verdict::Jump(chain)) => entry.chain = Some(chain.clone()),
                _ => {}
            }
        }
        entry
    }
}

/// The ports of an `xt_multiport_v1` (flags u8, count u8, ports u16[15] in host order, …).
fn multiport_ports(info: &[u8]) -> Vec<u16> {
    let count = info.get(1).map_or(0, |c| usize::from(*c).min(15));
    (0..count)
        .filter_map(|i| {
            let at = 2 + 2 * i;
            info.get(at..at + 2)
                .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        })
        .collect()
}

/// The comparison data of the `Cmp` right after the load at `i`.
fn cmp_after(exprs: &[Expr], i: usize) -> Option<&[u8]> {
    match exprs.get(i + 1) {
        Some(Expr::Cmp {
            op: CmpOp::Eq,
            data,
            ..
        }) => Some(data),
        _ => None,
    }
}

/// A DNAT rule of a `CNI-DN-` chain as `iptables-nft` encodes it: `[-d ADDR] -p PROTO -m PROTO
/// --dport PORT -j DNAT …`: a port match and no source match nor jump (the hairpin and
/// localhost rules of the chain match a source, or with `masqAll` jump to the mark chain).
#[derive(Debug, Default)]
struct Dnat {
    proto: Option<u8>,
    port: Option<u16>,
    daddr: Option<IpAddr>,
}

impl Dnat {
    fn decode(family: IpFamily, exprs: &[Expr]) -> Option<Dnat> {
        let (saddr, daddr, len) = match family {
            IpFamily::V4 => (12, 16, 4),
            IpFamily::V6 => (8, 24, 16),
        };
        let mut dnat = Dnat::default();
        for (i, e) in exprs.iter().enumerate() {
            match e {
                Expr::Meta {
                    key: MetaKey::L4Proto,
                    ..
                } => dnat.proto = cmp_after(exprs, i).and_then(|d| d.first().copied()),
                Expr::Payload {
                    base: PayloadBase::Network,
                    offset,
                    ..
                } if *offset == saddr => return None,
                Expr::Payload {
                    base: PayloadBase::Network,
                    offset,
                    len: l,
                    ..
                } if *offset == daddr && *l == len => {
                    dnat.daddr = cmp_after(exprs, i).and_then(|d| match d.len() {
                        4 => <[u8; 4]>::try_from(d).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(d).ok().map(IpAddr::from),
                        _ => None,
                    });
                }
                Expr::Payload {
                    base: PayloadBase::Transport,
                    offset: 2,
                    len: 2,
                    ..
                } => {
                    dnat.port = cmp_after(exprs, i)
                        .and_then(|d| <[u8; 2]>::try_from(d).ok())
                        .map(u16::from_be_bytes);
                }
                Expr::ImmediateVerdict(Verdict::Jump(_) | Verdict::Goto(_)) => return None,
                _ => {}
            }
        }
        dnat.port.is_some().then_some(dnat)
    }
}

/// CHECK of one family against its dump: the chain, each of its rules, each entry rule, and
/// the shared chains and jumps they need.
///
/// # Errors
/// [`PortmapError::Check`] naming what is missing.
pub fn check_dump(
    dump: &TableDump,
    config: &Config,
    container_id: &str,
    ip: IpNet,
) -> Result<(), PortmapError> {
    let fam = IpFamily::of(ip.addr());
    let chain = names::dnat_chain(&config.network, container_id);
    let which = if fam == IpFamily::V4 { "ipv4" } else { "ipv6" };
    if !dump.has_chain(&chain) {
        return Err(PortmapError::Check(format!(
            "could not check {which} dnat: chain {chain} not found in iptables table nat"
        )));
    }
    let in_chain = rule_set(dump, &chain);
    for rule in dnat_rules(config, ip) {
        if !in_chain.contains(rule.as_slice()) {
            return Err(PortmapError::Check(format!(
                "could not check {which} dnat: rule {rule:?} in chain {chain} not found in table nat"
            )));
        }
    }
    let in_entry = rule_set(dump, names::IPT_TOPLEVEL_DNAT);
    for rule in entry_rules(config, container_id, fam) {
        if !in_entry.contains(rule.as_slice()) {
            return Err(PortmapError::Check(format!(
                "could not check {which} dnat: rule {rule:?} in chain {} not found in table nat",
                names::IPT_TOPLEVEL_DNAT
            )));
        }
    }
    // The shared chains and jumps the attachment's rules need: whatever an ADD would still
    // have to write.
    if let Some(line) = add_lines(dump, config, container_id, ip)?.first() {
        return Err(PortmapError::Check(format!(
            "could not check {which} dnat: {} not found in table nat",
            missing_object(line)
        )));
    }
    Ok(())
}

/// What a restore line of [`add_lines`] creates, as CHECK names it: `chain X` for `-N X`,
/// `rule -A X …` for `-A X …` and `-I X 1 …`.
fn missing_object(line: &str) -> String {
    if let Some(chain) = line.strip_prefix("-N ") {
        return format!("chain {chain}");
    }
    let Some(insert) = line.strip_prefix("-I ") else {
        return format!("rule {line}");
    };
    match insert.split_once(' ') {
        Some((chain, rest)) => format!(
            "rule -A {chain} {}",
            rest.strip_prefix("1 ").unwrap_or(rest)
        ),
        None => format!("rule {line}"),
    }
}

/// The containers of `network` whose entry rules name them and that are not valid.
fn stale_containers(dump: &TableDump, network: &str, valid: &[Valid]) -> Vec<String> {
    let prefix = format!("dnat name: \"{network}\" id: \"");
    let mut stale: Vec<String> = Vec::new();
    for rule in dump.rules(names::IPT_TOPLEVEL_DNAT) {
        let Some(id) = opt_value(rule, "--comment")
            .and_then(|c| c.strip_prefix(&prefix))
            .and_then(|rest| rest.strip_suffix('"'))
        else {
            continue;
        };
        if !valid.iter().any(|a| a.container_id == id) && !stale.iter().any(|s| s == id) {
            stale.push(id.to_string());
        }
    }
    stale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HostIp, PortMapping};

    fn config(mappings: Vec<PortMapping>) -> Config {
        crate::config::test_config(mappings)
    }

    fn m(host_port: u16, container_port: u16, proto: Proto, host_ip: HostIp) -> PortMapping {
        PortMapping {
            host_port,
            container_port,
            proto,
            host_ip,
        }
    }

    fn joined(rules: &[Vec<String>]) -> Vec<String> {
        rules.iter().map(|r| r.join(" ")).collect()
    }

    #[test]
    fn mark_bits_print_like_the_reference() {
        assert_eq!(mark_def(13), "0x2000/0x2000");
        assert_eq!(mark_def(5), "0x20/0x20");
    }

    #[test]
    fn dnat_rules_cover_hairpin_localhost_and_dnat_in_save_form() {
        let c = config(vec![
            m(8080, 80, Proto::Tcp, HostIp::All),
            m(
                53,
                53,
                Proto::Udp,
                HostIp::Addr("10.1.1.1".parse().unwrap()),
            ),
            m(9, 9, Proto::Udp, HostIp::Addr("fd00::1".parse().unwrap())),
        ]);
        assert_eq!(
            joined(&dnat_rules(&c, "10.0.0.2/24".parse().unwrap())),
            [
                "-s 10.0.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK",
                "-s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK",
                "-p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.0.2:80",
                "-s 10.0.0.0/24 -d 10.1.1.1/32 -p udp -m udp --dport 53 -j CNI-HOSTPORT-SETMARK",
                "-s 127.0.0.1/32 -d 10.1.1.1/32 -p udp -m udp --dport 53 -j CNI-HOSTPORT-SETMARK",
                "-d 10.1.1.1/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.0.0.2:53",
            ]
        );
        let mut c = config(vec![m(8080, 80, Proto::Tcp, HostIp::All)]);
        c.masq_all = true;
        c.external_set_mark_chain = Some("KUBE-MARK-MASQ".into());
        assert_eq!(
            joined(&dnat_rules(&c, "fd00::2/64".parse().unwrap())),
            [
                "-p tcp -m tcp --dport 8080 -j KUBE-MARK-MASQ",
                "-p tcp -m tcp --dport 8080 -j DNAT --to-destination [fd00::2]:80",
            ]
        );
        c.snat = false;
        assert_eq!(dnat_rules(&c, "fd00::2/64".parse().unwrap()).len(), 1);
    }

    #[test]
    fn entry_rules_group_per_protocol_in_chunks_of_15_with_conditions() {
        let mut maps: Vec<PortMapping> = (1..=16)
            .map(|p| m(p, 80, Proto::Udp, HostIp::All))
            .collect();
        maps.push(m(8080, 80, Proto::Tcp, HostIp::All));
        let mut c = config(maps);
        c.conditions_v4 = Conditions::Iptables(vec![
            "-m".into(),
            "mark".into(),
            "--mark".into(),
            "0x1".into(),
            "-s".into(),
            "10.0.0.1".into(),
        ]);
        let rules = joined(&entry_rules(&c, "ctr", IpFamily::V4));
        let chain = names::dnat_chain("net", "ctr");
        assert_eq!(rules.len(), 3);
        assert_eq!(
            rules[0],
            format!(
                "-s 10.0.0.1/32 -p tcp -m comment --comment dnat name: \"net\" id: \"ctr\" -m multiport --dports 8080 -m mark --mark 0x1 -j {chain}"
            )
        );
        assert!(rules[1].contains("--dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 "));
        assert!(rules[2].contains("--dports 16 "));
    }

    #[test]
    fn check_names_a_missing_shared_object_as_the_dump_shows_it() {
        assert_eq!(
            missing_object("-N CNI-HOSTPORT-MASQ"),
            "chain CNI-HOSTPORT-MASQ"
        );
        assert_eq!(
            missing_object("-I POSTROUTING 1 -m comment --comment x -j CNI-HOSTPORT-MASQ"),
            "rule -A POSTROUTING -m comment --comment x -j CNI-HOSTPORT-MASQ"
        );
        assert_eq!(
            missing_object("-A CNI-HOSTPORT-MASQ -j MASQUERADE"),
            "rule -A CNI-HOSTPORT-MASQ -j MASQUERADE"
        );
    }

    /// The dump an `iptables-save` prints after `lines` (restore lines of [`add_lines`]) are
    /// applied to a table with only the built-in chains.
    fn applied(lines: &[String]) -> TableDump {
        let mut text = String::from(
            ":PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
        );
        for l in lines {
            if let Some(n) = l.strip_prefix("-N ") {
                text.push_str(&format!(":{n} - [0:0]\n"));
            }
        }
        for l in lines {
            if let Some(r) = l.strip_prefix("-I POSTROUTING 1 ") {
                text.push_str(&format!("-A POSTROUTING {r}\n"));
            } else if l.starts_with("-A ") {
                text.push_str(&format!("{l}\n"));
            }
        }
        TableDump::parse(&text).unwrap()
    }

    /// CHECK (and the ADD plan it shares) of an attachment with 20 000 mappings, 60 000 rules
    /// in its chain: each rule is looked up once, not compared with every other. Comparing
    /// each with each took minutes here; it finishes in well under a second.
    #[test]
    fn check_and_add_of_an_attachment_with_20000_mappings_are_linear() {
        let maps: Vec<PortMapping> = (1..=20_000)
            .map(|p| m(p, 80, Proto::Tcp, HostIp::All))
            .collect();
        let c = config(maps);
        let ip: IpNet = "10.0.0.2/24".parse().unwrap();
        let empty = applied(&[]);
        let lines = add_lines(&empty, &c, "ctr", ip).unwrap();
        // The shared chains and rules (8), the chain, 3 rules per mapping, 1 entry per 15.
        assert_eq!(lines.len(), 8 + 1 + 60_000 + 20_000_usize.div_ceil(15));
        let full = applied(&lines);
        check_dump(&full, &c, "ctr", ip).unwrap();
        assert!(add_lines(&full, &c, "ctr", ip).unwrap().is_empty());
    }

    fn meta_proto(n: u8) -> [Expr; 2] {
        [
            Expr::Meta {
                key: MetaKey::L4Proto,
                dreg: 1,
            },
            Expr::Cmp {
                sreg: 1,
                op: CmpOp::Eq,
                data: vec![n],
            },
        ]
    }

    fn payload(base: PayloadBase, offset: u32, data: &[u8]) -> [Expr; 2] {
        [
            Expr::Payload {
                base,
                offset,
                len: u32::try_from(data.len()).unwrap(),
                dreg: 1,
            },
            Expr::Cmp {
                sreg: 1,
                op: CmpOp::Eq,
                data: data.to_vec(),
            },
        ]
    }

    /// The expressions `nft --debug=netlink` shows for the reference's rules written by
    /// `iptables-nft` 1.8.9.
    #[test]
    fn the_reference_layout_decodes_from_iptables_nft_expressions() {
        let mut info = vec![0u8; 48];
        info[1] = 2;
        info[2..4].copy_from_slice(&8080u16.to_ne_bytes());
        info[4..6].copy_from_slice(&9090u16.to_ne_bytes());
        let mut exprs = meta_proto(6).to_vec();
        exprs.push(Expr::XtMatch {
            name: "comment".into(),
            rev: 0,
            info: b"dnat name: \"n\" id: \"c\"\0\0\0".to_vec(),
        });
        exprs.push(Expr::XtMatch {
            name: "multiport".into(),
            rev: 1,
            info,
        });
        exprs.push(Expr::Counter {
            packets: 0,
            bytes: 0,
        });
        exprs.push(Expr::ImmediateVerdict(Verdict::Jump("CNI-DN-abc".into())));
        let entry = Entry::decode(&exprs);
        assert_eq!(entry.proto, Some(6));
        assert_eq!(entry.ports, [8080, 9090]);
        assert_eq!(entry.comment.as_deref(), Some("dnat name: \"n\" id: \"c\""));
        assert_eq!(entry.chain.as_deref(), Some("CNI-DN-abc"));

        // -d 10.1.1.1/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.0.2:80
        let mut dnat = meta_proto(6).to_vec();
        dnat.extend(payload(PayloadBase::Network, 16, &[10, 1, 1, 1]));
        dnat.extend(payload(PayloadBase::Transport, 2, &8080u16.to_be_bytes()));
        dnat.push(Expr::Other("target".into()));
        let d = Dnat::decode(IpFamily::V4, &dnat).unwrap();
        assert_eq!(
            (d.proto, d.port, d.daddr),
            (Some(6), Some(8080), Some("10.1.1.1".parse().unwrap()))
        );
        // The hairpin rule matches a source (a /24: a 3-byte load); with masqAll it jumps to
        // the mark chain instead. Neither is a DNAT.
        let mut hairpin = meta_proto(6).to_vec();
        hairpin.extend(payload(PayloadBase::Network, 12, &[10, 0, 0]));
        hairpin.extend(payload(PayloadBase::Transport, 2, &8080u16.to_be_bytes()));
        assert!(Dnat::decode(IpFamily::V4, &hairpin).is_none());
        let mut masq_all = meta_proto(6).to_vec();
        masq_all.extend(payload(PayloadBase::Transport, 2, &8080u16.to_be_bytes()));
        masq_all.push(Expr::ImmediateVerdict(Verdict::Jump(
            names::IPT_SETMARK.into(),
        )));
        assert!(Dnat::decode(IpFamily::V4, &masq_all).is_none());
    }

    #[test]
    fn add_lines_create_only_what_the_dump_lacks() {
        let c = config(vec![m(8080, 80, Proto::Tcp, HostIp::All)]);
        let ip: IpNet = "10.0.0.2/24".parse().unwrap();
        let empty = TableDump::parse(":PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n").unwrap();
        let lines = add_lines(&empty, &c, "ctr", ip).unwrap();
        let chain = names::dnat_chain("net", "ctr");
        assert_eq!(lines[0], "-N CNI-HOSTPORT-SETMARK");
        assert!(lines.contains(&"-I POSTROUTING 1 -m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ".to_string()));
        assert!(lines.contains(&format!("-N {chain}")));
        // Applying them gives a dump in which nothing is missing any more.
        let mut text = String::from(
            ":PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
        );
        for l in &lines {
            if let Some(n) = l.strip_prefix("-N ") {
                text.push_str(&format!(":{n} - [0:0]\n"));
            }
        }
        for l in &lines {
            if let Some(r) = l.strip_prefix("-I POSTROUTING 1 ") {
                text.push_str(&format!("-A POSTROUTING {r}\n"));
            } else if l.starts_with("-A ") {
                text.push_str(&format!("{l}\n"));
            }
        }
        let full = TableDump::parse(&text).unwrap();
        assert!(add_lines(&full, &c, "ctr", ip).unwrap().is_empty());
        let del = del_lines(&full, "net", "ctr").unwrap();
        assert_eq!(del.len(), 3, "{del:?}");
        assert!(del[0].starts_with("-D CNI-HOSTPORT-DNAT -p tcp"));
        assert_eq!(del[1], format!("-F {chain}"));
    }
}
