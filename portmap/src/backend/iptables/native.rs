//! The layout written over nf_tables netlink where the tools are `iptables-nft`
//! ([`netfilter::iptables::native`]), on the call's socket, reading only the chains a call needs:
//!
//! - ADD: what the table lacks of the shared chains and of the attachment's chain, rules and
//!   entry rules ([`NativeTables::ensure`]), in one transaction for both families with the
//!   removal of the chains of holders taken over; the entry rules' handles come back for the
//!   state. The host-port conflict check asks the state directory's index
//!   ([`Holders::indexed`]) for each key, and the kernel whether the holder's chain exists.
//! - CHECK: the attachment's chain listed, its entry rules looked up by their recorded
//!   handles, the shared objects through `ensure` on a transaction never committed.
//! - DEL: the chains and the jumps to them removed in one transaction, the jumps found by
//!   their recorded handles ([`NativeTables::remove_chains`]).
//!
//! A rule the codec does not write (an iptables condition outside its forms) leaves the call to
//! the restore path.

use std::collections::HashSet;

use ipnet::IpNet;
use netfilter::iptables::Family;
use netfilter::iptables::native::{
    Missing as Absent, NativeError, NativeTables, Recorded, Removal, Transaction, Wanted, canonical,
};
use netfilter::nft::Nft;

use super::{Missing, NAT, attachment, dnat_rules, entry_rules, refusal, shared_chains, skeleton};
use crate::backend::{Added, Fate, Holders};
use crate::config::{Backend, Config, IpFamily};
use crate::error::PortmapError;
use crate::names;
use crate::plan::Attachment;
use crate::state::State;

/// A native failure as the plugin's error.
fn fail(e: NativeError) -> PortmapError {
    match e {
        NativeError::Nft(e) => PortmapError::Nft(e),
        e => PortmapError::Native(e),
    }
}

/// `Ok(None)` for a rule outside the codec's forms, which sends the call the restore way.
fn or_restore<T>(result: Result<T, NativeError>) -> Result<Option<T>, PortmapError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_unsupported() => Ok(None),
        Err(e) => Err(fail(e)),
    }
}

/// The holders of the attachment's host ports in `family` that the index names
/// ([`super::indexed_holders`]): gone ones (their records) to take over; a live one refuses
/// the ADD.
fn gone_holders(
    tables: &mut NativeTables<&mut Nft>,
    att: &Attachment,
    config: &Config,
    family: IpFamily,
    holders: &dyn Holders,
) -> Result<Vec<State>, PortmapError> {
    let mut gone: Vec<State> = Vec::new();
    for (holder, m) in super::indexed_holders(tables.nft(), att, config, family, holders)? {
        match holders.by_container(&holder.network, &holder.container_id) {
            Fate::Gone(records) if records.iter().all(|r| r.backend == Backend::Iptables) => {
                gone.extend(records);
            }
            _ => return Err(refusal(&m, &holder.network, &holder.container_id)),
        }
    }
    Ok(gone)
}

/// Adds to `tx` the removal of the chains of `network`'s containers `ids` in `families` and of
/// the rules jumping to them (found by listing: the rare paths of a takeover and GC).
fn remove_into(
    tables: &mut NativeTables<&mut Nft>,
    tx: &mut Transaction,
    network: &str,
    ids: &[&str],
    families: &[IpFamily],
) -> Result<(), NativeError> {
    for id in ids {
        let chain = names::dnat_chain(network, id);
        for family in families.iter().map(|f| Family::from(*f)) {
            if !tables.chain_exists(family, &chain)? {
                continue;
            }
            for rule in tables.jumps_to(family, names::IPT_TOPLEVEL_DNAT, &chain, None)? {
                tx.delete_rule(family, names::IPT_TOPLEVEL_DNAT, rule.handle);
            }
            tx.delete_chain(family, &chain);
        }
    }
    Ok(())
}

/// ADD natively, in one transaction. `Ok(None)` when a rule is outside the codec's forms:
/// nothing was changed, and the restore path is to do it.
///
/// # Errors
/// A conflict; nf_tables' refusal.
pub(super) fn add(
    nft: &mut Nft,
    att: &Attachment,
    config: &Config,
    ips: &[IpNet],
    holders: &dyn Holders,
) -> Result<Option<Added>, PortmapError> {
    let mut tables = NativeTables::on(nft, NAT);
    let mut tx = tables.transaction();
    let mut taken: Vec<State> = Vec::new();
    // Per family: how many entry rules the attachment has, and how many this call adds.
    let mut entries: Vec<(Family, usize, usize)> = Vec::new();
    for ip in ips {
        let family = IpFamily::of(ip.addr());
        for record in gone_holders(&mut tables, att, config, family, holders)? {
            if !taken.iter().any(|t| t.attachment() == record.attachment()) {
                taken.push(record);
            }
        }
    }
    let ids: Vec<&str> = taken
        .iter()
        .map(|r| r.container_id.as_str())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if let Some(t) = taken.first() {
        let network = t.network.clone();
        if or_restore(remove_into(
            &mut tables,
            &mut tx,
            &network,
            &ids,
            &IpFamily::BOTH,
        ))?
        .is_none()
        {
            return Ok(None);
        }
    }
    for ip in ips {
        let family = Family::from(IpFamily::of(ip.addr()));
        let shared = shared_chains(config);
        if or_restore(tables.ensure(&mut tx, family, &shared, &skeleton(config)))?.is_none() {
            return Ok(None);
        }
        let (chain, specs) = attachment(config, &att.container_id, *ip);
        let Some(missing) = or_restore(tables.ensure(&mut tx, family, &[&chain], &specs))? else {
            return Ok(None);
        };
        let first_entry = specs.iter().position(|s| s.recorded).unwrap_or(specs.len());
        let added = missing.rules.iter().filter(|i| **i >= first_entry).count();
        entries.push((family, specs.len() - first_entry, added));
    }
    let recorded = tables.commit(&tx).map_err(fail)?;
    // A family's handles are the record only when this call added all its entry rules.
    let recorded: Vec<Recorded> = recorded
        .into_iter()
        .filter(|r| {
            entries
                .iter()
                .any(|(f, all, added)| *f == r.family && all == added)
        })
        .collect();
    Ok(Some(Added { taken, recorded }))
}

/// What CHECK finds missing first of the attachment in `ip`'s family (as
/// [`super::restore::check_dump`] orders it). `Ok(None)` when a rule is outside the codec's
/// forms: the restore path is to check.
///
/// # Errors
/// nf_tables failures.
pub(super) fn check(
    nft: &mut Nft,
    config: &Config,
    container_id: &str,
    ip: IpNet,
    record: Option<&State>,
) -> Result<Option<Option<Missing>>, PortmapError> {
    let fam = IpFamily::of(ip.addr());
    let family = Family::from(fam);
    let mut tables = NativeTables::on(nft, NAT);
    let chain = names::dnat_chain(&config.network, container_id);
    let Some(listed) = or_restore(tables.rules(family, &chain, Wanted::All))? else {
        return Ok(None);
    };
    let Some(listed) = listed else {
        return Ok(Some(Some(Missing::Chain)));
    };
    let canonical_all =
        |rules: Vec<Vec<String>>| -> Result<Option<Vec<Vec<String>>>, PortmapError> {
            or_restore(
                rules
                    .iter()
                    .map(|r| canonical(family, r))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(NativeError::from),
            )
        };
    let have: HashSet<&Vec<String>> = listed.iter().filter_map(|r| r.args.as_ref()).collect();
    let Some(want) = canonical_all(dnat_rules(config, ip))? else {
        return Ok(None);
    };
    if let Some(rule) = want.into_iter().find(|r| !have.contains(r)) {
        return Ok(Some(Some(Missing::Rule(rule))));
    }
    let recorded = record.and_then(|r| r.recorded(fam));
    let Some(jumps) =
        or_restore(tables.jumps_to(family, names::IPT_TOPLEVEL_DNAT, &chain, recorded))?
    else {
        return Ok(None);
    };
    let have: HashSet<&Vec<String>> = jumps.iter().filter_map(|r| r.args.as_ref()).collect();
    let Some(want) = canonical_all(entry_rules(config, container_id, fam))? else {
        return Ok(None);
    };
    if let Some(rule) = want.into_iter().find(|r| !have.contains(r)) {
        return Ok(Some(Some(Missing::Entry(rule))));
    }
    // The shared objects: whatever an ADD would still write, never committed.
    let mut probe = tables.transaction();
    let specs = skeleton(config);
    let shared = shared_chains(config);
    let Some(absent) = or_restore(tables.ensure(&mut probe, family, &shared, &specs))? else {
        return Ok(None);
    };
    Ok(Some(first_shared(&absent, &specs)))
}

/// The first shared object `absent` names: a chain, else a rule of `specs`.
fn first_shared(
    absent: &Absent,
    specs: &[netfilter::iptables::native::RuleSpec],
) -> Option<Missing> {
    if let Some(chain) = absent.chains.first() {
        return Some(super::shared_missing(None, Some(chain)));
    }
    absent
        .rules
        .first()
        .map(|i| super::shared_missing(specs.get(*i), None))
}

/// Removes the chains of `network`'s container `container_id` in `families` (its
/// `CNI-DN-<hash>` and the legacy `CNI-SN-<hash>`) with the rules jumping to them, found by
/// the handles `record` holds where it has them, in one transaction.
///
/// # Errors
/// nf_tables failures other than an nf_tables the kernel does not have.
pub(super) fn remove(
    nft: &mut Nft,
    network: &str,
    container_id: &str,
    families: &[IpFamily],
    record: Option<&State>,
) -> Result<(), PortmapError> {
    let dnat = names::dnat_chain(network, container_id);
    let snat = names::legacy_snat_chain(network, container_id);
    let mut removals = Vec::new();
    for fam in families {
        removals.push(Removal {
            family: (*fam).into(),
            from: names::IPT_TOPLEVEL_DNAT,
            chain: &dnat,
            recorded: record.and_then(|r| r.recorded(*fam)),
        });
        removals.push(Removal {
            family: (*fam).into(),
            from: names::IPT_LEGACY_SNAT,
            chain: &snat,
            recorded: None,
        });
    }
    match NativeTables::on(nft, NAT).remove_chains(&removals) {
        Ok(()) => Ok(()),
        Err(NativeError::Nft(e)) if e.is_unsupported() => {
            log::debug!("no nf_tables here, so no iptables-nft chain either: {e}");
            Ok(())
        }
        // One transaction for the families: a refusal of it names the first.
        Err(e) => {
            let family = match &e {
                NativeError::Referenced { family, .. } => (*family).into(),
                _ => families.first().copied().unwrap_or(IpFamily::V4),
            };
            Err(super::teardown_error(family, &e))
        }
    }
}

/// Removes the chains of `network`'s containers `ids` in `families`, in one transaction (GC).
///
/// # Errors
/// nf_tables failures.
pub(super) fn remove_containers(
    nft: &mut Nft,
    network: &str,
    ids: &[String],
    families: &[IpFamily],
) -> Result<(), PortmapError> {
    let mut tables = NativeTables::on(nft, NAT);
    let mut tx = tables.transaction();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let done = remove_into(&mut tables, &mut tx, network, &ids, families)
        .and_then(|()| tables.commit(&tx).map(drop));
    done.map_err(fail)
}
