//! The layout written with the tools: per family one `iptables-save -t nat` and one
//! `iptables-restore --noflush` transaction, serialised with our own lock file. For the legacy
//! tools (x_tables, which only the tools write) and for rules the native codec does not write.
//! Each call reads and reloads the whole `nat` table, so its cost grows with every attachment
//! on the node.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use cni::conf::GcAttachment as Valid;
use host::lock::{FileLock, LockError};
use ipnet::IpNet;
use netfilter::iptables::native::{Position, RuleSpec};
use netfilter::iptables::{TableDump, restore_line};

use super::{Missing, NAT, attachment, shared_chains, skeleton};
use crate::backend::{Added, Fate, Holders};
use crate::config::{Backend, Config, IpFamily, PortMapping};
use crate::error::PortmapError;
use crate::names;
use crate::plan::Attachment;
use crate::state::State;

fn ipt_err(e: netfilter::iptables::IptablesError) -> PortmapError {
    PortmapError::Iptables(e)
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

/// Whether `spec` is in `dump`, looked up in the rule sets of the chains read so far.
fn present<'d>(
    dump: &'d TableDump,
    sets: &mut HashMap<String, HashSet<&'d [String]>>,
    spec: &RuleSpec,
) -> bool {
    sets.entry(spec.chain.clone())
        .or_insert_with(|| rule_set(dump, &spec.chain))
        .contains(spec.args.as_slice())
}

/// [`add_lines`] without the conflict check.
fn lines_unchecked(
    dump: &TableDump,
    config: &Config,
    container_id: &str,
    ip: IpNet,
) -> Result<Vec<String>, PortmapError> {
    let (chain, specs) = attachment(config, container_id, ip);
    let mut chains = shared_chains(config);
    chains.push(&chain);
    let mut lines = Vec::new();
    for chain in chains.iter().filter(|c| !dump.has_chain(c)) {
        lines.push(restore_line::<&str>("-N", chain, &[]).map_err(ipt_err)?);
    }
    // The attachment's chain and the entry chain can be long (one rule per mapping, one per
    // attachment): each rule is looked up in a set of them, not compared with every one.
    let mut sets = HashMap::new();
    // Append-unique, also against the rules of this very call.
    let mut seen: HashSet<(String, Vec<String>)> = HashSet::new();
    for spec in skeleton(config).iter().chain(&specs) {
        if present(dump, &mut sets, spec) || !seen.insert((spec.chain.clone(), spec.args.clone())) {
            continue;
        }
        let line = match spec.position {
            Position::Insert => {
                let mut with_pos = vec!["1".to_string()];
                with_pos.extend(spec.args.iter().cloned());
                restore_line("-I", &spec.chain, &with_pos)
            }
            Position::Append => restore_line("-A", &spec.chain, &spec.args),
        };
        lines.push(line.map_err(ipt_err)?);
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

/// Whether this process holds our iptables lock: a call that holds it (an ADD, around its
/// commit and its record) may remove what it made without taking it again, which `flock`
/// would refuse to the same process through another descriptor.
static HELD: AtomicBool = AtomicBool::new(false);

/// Our iptables lock, held until dropped (see [`lock`]).
#[derive(Debug)]
pub struct IptablesLock {
    _file: Option<FileLock>,
    /// Whether this guard took it (an inner guard of the same process did not).
    took: bool,
}

impl Drop for IptablesLock {
    fn drop(&mut self) {
        if self.took {
            HELD.store(false, Ordering::SeqCst);
        }
    }
}

/// Our lock around an iptables read-modify-write: a restore, and the native path's
/// check-then-append of the shared rules, its conflict check and the host-port index. A
/// process that holds it already gets it again at once. Where `/run/cni/portmap` cannot be
/// written (read-only, full), an existing lock file is locked through a read-only descriptor
/// (`flock` needs no write access), and without one the call goes on unlocked, since no other
/// call can take it there either: a DEL must still remove what it can.
///
/// # Errors
/// [`PortmapError::Lock`] when it stays held by another process (code 11) or cannot be made.
pub fn lock() -> Result<IptablesLock, PortmapError> {
    if HELD.load(Ordering::SeqCst) {
        return Ok(IptablesLock {
            _file: None,
            took: false,
        });
    }
    let wait = host::lock::DEFAULT_WAIT;
    let file = match FileLock::acquire(names::IPT_LOCK_FILE, wait) {
        Ok(lock) => Some(lock),
        Err(LockError::Open { path, source })
            if matches!(
                source.raw_os_error(),
                Some(libc::EROFS | libc::ENOSPC | libc::EDQUOT)
            ) =>
        {
            match std::fs::File::open(&path) {
                Ok(file) => Some(FileLock::acquire_file(file, path, wait)?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    log::warn!(
                        "no iptables lock: {} cannot be made: {source}",
                        path.display()
                    );
                    None
                }
                Err(e) => return Err(LockError::Open { path, source: e }.into()),
            }
        }
        Err(e) => return Err(e.into()),
    };
    HELD.store(true, Ordering::SeqCst);
    Ok(IptablesLock {
        _file: file,
        took: true,
    })
}

/// The tools of `family`.
fn tools(family: IpFamily) -> netfilter::iptables::Iptables {
    netfilter::iptables::Iptables::new(family.into())
}

/// Removes the attachment's chains in one family. When the restore is refused (a chain
/// another rule still jumps to, an operator's: `-X` fails and takes the transaction with it),
/// what can go still goes, as the reference's flush before its delete has it: the entry rules
/// and the chains' rules, so that nothing is forwarded through them; the failure is reported.
fn teardown(
    ipt: &netfilter::iptables::Iptables,
    network: &str,
    container_id: &str,
) -> Result<(), PortmapError> {
    let family = IpFamily::from(ipt.family());
    let dump = ipt.save(NAT).map_err(ipt_err)?;
    let lines = del_lines(&dump, network, container_id)?;
    let Err(refused) = ipt.restore(NAT, &lines) else {
        return Ok(());
    };
    // Only a transaction the tool refused: a missing tool, a held lock (code 11, the runtime
    // retries) or a timeout stays what it is.
    if !matches!(refused, netfilter::iptables::IptablesError::Failed { .. }) {
        return Err(ipt_err(refused));
    }
    let emptying: Vec<String> = lines
        .into_iter()
        .filter(|l| !l.starts_with("-X "))
        .collect();
    if let Err(e) = ipt.restore(NAT, &emptying) {
        log::warn!("emptying the chains of {container_id} failed too: {e}");
    }
    Err(super::teardown_error(family, &refused))
}

/// Removes the attachment's chains (the Go plugin's have the same names) in `families`:
/// tools that are missing are skipped (nothing of ours can exist without them); other
/// failures are collected.
///
/// # Errors
/// The first failure.
pub(super) fn del(
    network: &str,
    container_id: &str,
    families: &[IpFamily],
) -> Result<(), PortmapError> {
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

/// ADD: one transaction per container family, with the removal of the chains of attachments
/// it takes ports over from; a failure in the second family rolls back the first. The
/// caller holds our lock ([`lock`]).
///
/// # Errors
/// A conflict, the tools' failure.
pub(super) fn add(
    att: &Attachment,
    config: &Config,
    ips: &[IpNet],
    holders: &dyn Holders,
) -> Result<Added, PortmapError> {
    let mut done = Vec::new();
    let mut taken: Vec<State> = Vec::new();
    for ip in ips {
        let ipt = tools(IpFamily::of(ip.addr()));
        let result = ipt
            .save(NAT)
            .map_err(ipt_err)
            .and_then(|dump| add_lines_taking_over(&dump, config, &att.container_id, *ip, holders))
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
        for f in record.families().into_iter().filter(|f| !ours.contains(f)) {
            if let Err(e) = teardown(&tools(f), &record.network, &record.container_id) {
                log::warn!(
                    "failed to remove the {f:?} chain of {}: {e}",
                    record.container_id
                );
            }
        }
    }
    Ok(Added {
        taken,
        recorded: Vec::new(),
    })
}

/// What CHECK finds missing first of the attachment in `dump`: the chain, one of its rules,
/// one of its entry rules, then the shared chains and jumps they need (whatever an ADD would
/// still have to write), in that order.
///
/// # Errors
/// An argument that cannot be written in a restore script.
pub fn check_dump(
    dump: &TableDump,
    config: &Config,
    container_id: &str,
    ip: IpNet,
) -> Result<Option<Missing>, PortmapError> {
    let (chain, specs) = attachment(config, container_id, ip);
    if !dump.has_chain(&chain) {
        return Ok(Some(Missing::Chain));
    }
    let mut sets = HashMap::new();
    if let Some(spec) = specs.iter().find(|s| !present(dump, &mut sets, s)) {
        return Ok(Some(if spec.chain == chain {
            Missing::Rule(spec.args.clone())
        } else {
            Missing::Entry(spec.args.clone())
        }));
    }
    Ok(lines_unchecked(dump, config, container_id, ip)?
        .first()
        .map(|line| missing_object(line)))
}

/// CHECK of one family with its tools.
///
/// # Errors
/// The tools' failure.
pub(super) fn check(
    config: &Config,
    container_id: &str,
    ip: IpNet,
) -> Result<Option<Missing>, PortmapError> {
    let dump = tools(IpFamily::of(ip.addr())).save(NAT).map_err(ipt_err)?;
    check_dump(&dump, config, container_id, ip)
}

/// What a restore line of [`add_lines`] creates, as CHECK names it: `chain X` for `-N X`,
/// `rule -A X …` for `-A X …` and `-I X 1 …`.
fn missing_object(line: &str) -> Missing {
    if let Some(chain) = line.strip_prefix("-N ") {
        return Missing::Shared(format!("chain {chain}"));
    }
    let Some(insert) = line.strip_prefix("-I ") else {
        return Missing::Shared(format!("rule {line}"));
    };
    Missing::Shared(match insert.split_once(' ') {
        Some((chain, rest)) => format!(
            "rule -A {chain} {}",
            rest.strip_prefix("1 ").unwrap_or(rest)
        ),
        None => format!("rule {line}"),
    })
}

/// GC in `families`: tears down every `CNI-DN-` chain of `network` whose container is not
/// valid, in one restore per family.
///
/// # Errors
/// The tools' failure.
pub(super) fn gc(
    network: &str,
    valid: &[Valid],
    families: &[IpFamily],
) -> Result<(), PortmapError> {
    let _lock = lock()?;
    for f in families {
        let ipt = tools(*f);
        let dump = match ipt.save(NAT) {
            Ok(d) => d,
            Err(e) if e.is_missing() => continue,
            Err(e) => return Err(ipt_err(e)),
        };
        let comments = dump
            .rules(names::IPT_TOPLEVEL_DNAT)
            .iter()
            .filter_map(|r| opt_value(r, "--comment"));
        let mut lines = Vec::new();
        for id in super::stale_containers(comments, network, valid) {
            lines.extend(del_lines(&dump, network, &id)?);
        }
        ipt.restore(NAT, &lines).map_err(ipt_err)?;
    }
    Ok(())
}

/// Whether the IPv4 tools work.
///
/// # Errors
/// Why they do not.
pub(super) fn probe() -> Result<(), PortmapError> {
    tools(IpFamily::V4).probe().map_err(ipt_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HostIp, Proto};

    /// The restore lines that bring `dump` to the state the reference's ADD leaves: missing chains
    /// with `-N`, missing rules appended (the POSTROUTING jump inserted first).
    ///
    /// # Errors
    /// [`PortmapError::Conflict`] naming another attachment's chain that DNATs one of the ports;
    /// an argument that cannot be written in a restore script.
    fn add_lines(
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

    fn config(mappings: Vec<PortMapping>) -> Config {
        crate::config::test_config(mappings)
    }

    fn tcp(host_port: u16) -> PortMapping {
        PortMapping {
            host_port,
            container_port: 80,
            proto: Proto::Tcp,
            host_ip: HostIp::All,
        }
    }

    #[test]
    fn check_names_a_missing_shared_object_as_the_dump_shows_it() {
        assert_eq!(
            missing_object("-N CNI-HOSTPORT-MASQ"),
            Missing::Shared("chain CNI-HOSTPORT-MASQ".into())
        );
        assert_eq!(
            missing_object("-I POSTROUTING 1 -m comment --comment x -j CNI-HOSTPORT-MASQ"),
            Missing::Shared(
                "rule -A POSTROUTING -m comment --comment x -j CNI-HOSTPORT-MASQ".into()
            )
        );
        assert_eq!(
            missing_object("-A CNI-HOSTPORT-MASQ -j MASQUERADE"),
            Missing::Shared("rule -A CNI-HOSTPORT-MASQ -j MASQUERADE".into())
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
        let maps: Vec<PortMapping> = (1..=20_000).map(tcp).collect();
        let c = config(maps);
        let ip: IpNet = "10.0.0.2/24".parse().unwrap();
        let empty = applied(&[]);
        let lines = add_lines(&empty, &c, "ctr", ip).unwrap();
        // The shared chains and rules (8), the chain, 3 rules per mapping, 1 entry per 15.
        assert_eq!(lines.len(), 8 + 1 + 60_000 + 20_000_usize.div_ceil(15));
        let full = applied(&lines);
        assert_eq!(check_dump(&full, &c, "ctr", ip).unwrap(), None);
        assert!(add_lines(&full, &c, "ctr", ip).unwrap().is_empty());
    }

    #[test]
    fn add_lines_create_only_what_the_dump_lacks_and_check_names_what_is_missing() {
        let c = config(vec![tcp(8080)]);
        let ip: IpNet = "10.0.0.2/24".parse().unwrap();
        let empty = applied(&[]);
        let lines = add_lines(&empty, &c, "ctr", ip).unwrap();
        let chain = names::dnat_chain("net", "ctr");
        assert_eq!(lines[0], "-N CNI-HOSTPORT-SETMARK");
        assert!(lines.contains(&"-I POSTROUTING 1 -m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ".to_string()));
        assert!(lines.contains(&format!("-N {chain}")));
        assert_eq!(
            check_dump(&empty, &c, "ctr", ip).unwrap(),
            Some(Missing::Chain)
        );
        let full = applied(&lines);
        assert!(add_lines(&full, &c, "ctr", ip).unwrap().is_empty());
        // Without its DNAT rule, then without its entry rule, then without a shared jump.
        let without = |line: &str| {
            let kept: Vec<String> = lines
                .iter()
                .filter(|l| !l.contains(line))
                .cloned()
                .collect();
            check_dump(&applied(&kept), &c, "ctr", ip).unwrap()
        };
        assert!(
            matches!(without("-j DNAT"), Some(Missing::Rule(r)) if r.contains(&"DNAT".to_string()))
        );
        assert!(matches!(without("--dports 8080"), Some(Missing::Entry(_))));
        assert_eq!(
            without("-A OUTPUT"),
            Some(Missing::Shared(
                "rule -A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT".into()
            ))
        );
        let del = del_lines(&full, "net", "ctr").unwrap();
        assert_eq!(del.len(), 3, "{del:?}");
        assert!(del[0].starts_with("-D CNI-HOSTPORT-DNAT -p tcp"));
        assert_eq!(del[1], format!("-F {chain}"));
    }
}
