//! The only code that touches the kernel: finding the device, programming a [`Plan`] (with
//! rollback), verifying it, removing it, garbage-collecting IFBs and probing for STATUS.

use std::os::fd::AsFd as _;

use common::netlink::tc::{INGRESS, INGRESS_HANDLE, PROTOCOL_ALL, Psched, ROOT, Tbf};
use common::netlink::{Link, LinkAlias, Netlink, NetlinkError};
use common::netns::NetNs;
use netlink_packet_route::tc::TcMirrorActionType;

use crate::error::BandwidthError;
use crate::names::{
    FILTER_CLASSID, FILTER_PRIORITY, Owner, STATUS_IFB, TBF_HANDLE, Tombstone, tombstone_alias,
    tombstone_name,
};
use crate::plan::{Device, Plan, Side};

/// A netlink handle bound to the namespace of the shaped device.
#[derive(Debug)]
pub struct Located {
    /// Host or container side.
    pub side: Side,
    /// The device.
    pub device: Device,
    /// A handle in the device's namespace.
    pub netlink: Netlink,
}

fn device_of(link: &Link) -> Device {
    Device {
        index: link.index,
        name: link.name.clone(),
        mtu: link.mtu,
    }
}

/// Finds the device to shape: the host-side peer of the container's veth when it lives in the
/// plugin's namespace ([`host_peer`]), else the container's interface itself.
///
/// # Errors
/// When the container namespace cannot be entered or `ifname` is not in it.
pub fn locate(container: &NetNs, ifname: &str) -> Result<Located, BandwidthError> {
    let mut inside = Netlink::open_in_place(container)?;
    let ctr =
        inside
            .link_by_name(ifname)
            .map_err(|source| BandwidthError::NoContainerInterface {
                ifname: ifname.to_string(),
                source,
            })?;
    if let Some((peer, host)) = host_peer(&mut inside, container, &ctr)? {
        return Ok(Located {
            side: Side::Host,
            device: device_of(&peer),
            netlink: host,
        });
    }
    log::info!(
        "{ifname} ({:?}) has no veth peer in the plugin's namespace: shaping inside the container",
        ctr.kind
    );
    Ok(Located {
        side: Side::Container,
        device: device_of(&ctr),
        netlink: inside,
    })
}

/// The host-side peer of the container's veth `ctr` (seen through `inside`, a handle in the
/// `container` namespace), with a handle in the plugin's namespace; `None` when its peer lives
/// elsewhere. Proven by namespace, not by interface indexes (which repeat across namespaces):
/// the namespace `ctr`'s peer is in (`IFLA_LINK_NETNSID`, an id of the container's) is the
/// plugin's, and the host link at the peer index is a veth whose peer is `ctr`, in the
/// container's namespace.
fn host_peer(
    inside: &mut Netlink,
    container: &NetNs,
    ctr: &Link,
) -> Result<Option<(Link, Netlink)>, BandwidthError> {
    let (Some("veth"), Some(peer_nsid), Some(peer_index)) =
        (ctr.kind.as_deref(), ctr.link_netnsid, ctr.link)
    else {
        return Ok(None);
    };
    let home = NetNs::current()?;
    // The kernel gave the peer's namespace an id in the container's when it reported `ctr`.
    if inside.nsid_of(home.as_fd())? != Some(peer_nsid) {
        return Ok(None);
    }
    let mut host = Netlink::new()?;
    let peer = match host.link_by_index(peer_index) {
        Ok(peer) => peer,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if peer.kind.as_deref() != Some("veth") || peer.link != Some(ctr.index) {
        return Ok(None);
    }
    let back = host.nsid_of(container.as_fd())?;
    Ok((back.is_some() && peer.link_netnsid == back).then_some((peer, host)))
}

/// A step of ADD to undo when a later one fails.
#[derive(Debug)]
enum Undo {
    RootQdisc(u32),
    IngressQdisc(u32),
    Filters(u32),
    Link(u32),
}

/// What [`add`] did.
#[derive(Debug)]
pub struct Added {
    /// The IFB device the plan uses, if any.
    pub ifb: Option<Link>,
    /// Left-over tombstones seen, by interface index (the caller reaps them).
    pub stale: Vec<u32>,
}

/// Programs `plan` and returns the IFB device it uses, if any. Re-running it converges: the
/// root `tbf`s are replaced, our IFB and an existing `ingress` qdisc are reused, and the
/// redirect filter at [`FILTER_PRIORITY`] is replaced. When a step fails, what this call
/// created is removed again. One dump of the namespace's IFBs finds ours and left-over
/// tombstones alike.
///
/// # Errors
/// The first failing step.
pub fn add(nl: &mut Netlink, plan: &Plan) -> Result<Added, BandwidthError> {
    let ifbs = nl.ifbs_with_aliases()?;
    let stale = stale_tombstones(&ifbs);
    let mut undo = Vec::new();
    let outcome = add_steps(nl, plan, &ifbs, &mut undo);
    if outcome.is_err() {
        for step in undo.iter().rev() {
            let result = match *step {
                Undo::RootQdisc(i) => nl.del_qdisc(i, ROOT, 0),
                Undo::IngressQdisc(i) => nl.del_qdisc(i, INGRESS, 0),
                Undo::Filters(i) => {
                    nl.del_filters(i, INGRESS_HANDLE, FILTER_PRIORITY, PROTOCOL_ALL)
                }
                Undo::Link(i) => nl.del_link(i),
            };
            if let Err(e) = result {
                log::warn!("rollback of {step:?} failed: {e}");
            }
        }
    }
    outcome.map(|ifb| Added { ifb, stale })
}

fn add_steps(
    nl: &mut Netlink,
    plan: &Plan,
    ifbs: &[LinkAlias],
    undo: &mut Vec<Undo>,
) -> Result<Option<Link>, BandwidthError> {
    let dev = &plan.device;
    if let Some((tbf, _)) = &plan.direct {
        nl.add_root_tbf(dev.index, TBF_HANDLE, tbf, true)?;
        undo.push(Undo::RootQdisc(dev.index));
    }
    let Some(redirect) = &plan.redirect else {
        return Ok(None);
    };
    let taken = |other: LinkAlias| BandwidthError::IfbNameTaken {
        name: redirect.ifb.clone(),
        what: format!(
            "kind {}, alias {:?}",
            other.link.kind.unwrap_or_default(),
            other.alias.unwrap_or_default()
        ),
    };
    let ifb = match ifbs.iter().find(|l| l.link.name == redirect.ifb) {
        Some(existing) if existing.alias.as_deref() == Some(redirect.alias.as_str()) => {
            nl.set_link(
                existing.link.index,
                &common::netlink::LinkChange {
                    mtu: Some(redirect.mtu),
                    up: Some(true),
                    ..Default::default()
                },
            )?;
            existing.link.clone()
        }
        Some(other) => return Err(taken(other.clone())),
        None => match nl.add_ifb(&redirect.ifb, redirect.mtu, None, &redirect.alias) {
            Ok(link) => {
                undo.push(Undo::Link(link.index));
                link
            }
            // Not an IFB (the dump lists only those): say what it is.
            Err(e) if e.is_exists() => {
                return Err(taken(nl.link_alias_by_name(&redirect.ifb)?));
            }
            Err(e) => return Err(e.into()),
        },
    };
    let fresh_ingress = match nl.add_ingress_qdisc(dev.index) {
        Ok(()) => {
            undo.push(Undo::IngressQdisc(dev.index));
            true
        }
        Err(e) if e.is_exists() => {
            if let Some(q) = nl.qdisc(dev.index, INGRESS)?
                && q.kind != "ingress"
            {
                return Err(BandwidthError::ForeignIngressQdisc {
                    ifname: dev.name.clone(),
                    kind: q.kind,
                });
            }
            false
        }
        Err(e) => return Err(e.into()),
    };
    // The priority is ours (as it was the reference's): a redirect left there by an earlier
    // ADD of this attachment is replaced. A qdisc this call created has no filters yet.
    if !fresh_ingress {
        match nl.del_filters(dev.index, INGRESS_HANDLE, FILTER_PRIORITY, PROTOCOL_ALL) {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    nl.add_redirect_filter(
        dev.index,
        INGRESS_HANDLE,
        FILTER_PRIORITY,
        FILTER_CLASSID,
        ifb.index,
    )?;
    undo.push(Undo::Filters(dev.index));
    nl.add_root_tbf(ifb.index, TBF_HANDLE, &redirect.tbf, true)?;
    Ok(Some(ifb))
}

/// Verifies that the kernel holds exactly what `plan` describes.
///
/// # Errors
/// [`BandwidthError::Drift`] naming the first difference.
pub fn check(nl: &mut Netlink, plan: &Plan) -> Result<(), BandwidthError> {
    let dev = &plan.device;
    if let Some((tbf, reference_buffer)) = &plan.direct {
        check_root_tbf(nl, dev.index, &dev.name, tbf, *reference_buffer)?;
    }
    let Some(redirect) = &plan.redirect else {
        return Ok(());
    };
    let mut ifb = None;
    for name in std::iter::once(&redirect.ifb).chain(&redirect.reference_ifb) {
        match nl.link_by_name(name) {
            Ok(link) if link.kind.as_deref() == Some("ifb") => {
                ifb = Some(link);
                break;
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    let ifb =
        ifb.ok_or_else(|| BandwidthError::Drift(format!("ifb device {} not found", redirect.ifb)))?;
    if nl
        .qdisc(dev.index, INGRESS)?
        .is_none_or(|q| q.kind != "ingress")
    {
        return Err(BandwidthError::Drift(format!(
            "{} has no ingress qdisc",
            dev.name
        )));
    }
    let filters = nl.filters(dev.index, INGRESS_HANDLE)?;
    let redirected = filters.iter().any(|f| {
        f.priority == FILTER_PRIORITY
            && f.protocol == PROTOCOL_ALL
            && f.mirred
                .contains(&(TcMirrorActionType::EgressRedir, ifb.index))
    });
    if !redirected {
        return Err(BandwidthError::Drift(format!(
            "{} has no filter of priority {FILTER_PRIORITY} redirecting to {}",
            dev.name, ifb.name
        )));
    }
    check_root_tbf(
        nl,
        ifb.index,
        &ifb.name,
        &redirect.tbf,
        redirect.reference_buffer,
    )
}

fn check_root_tbf(
    nl: &mut Netlink,
    index: u32,
    name: &str,
    want: &Tbf,
    reference_buffer: Option<u32>,
) -> Result<(), BandwidthError> {
    let Some(root) = nl.qdisc(index, ROOT)? else {
        return Err(BandwidthError::Drift(format!(
            "{name} has no root qdisc, want tbf"
        )));
    };
    let drift = |what: String| Err(BandwidthError::Drift(format!("{name}: {what}")));
    if root.kind != "tbf" {
        return drift(format!("root qdisc is {}, want tbf", root.kind));
    }
    if root.handle != TBF_HANDLE {
        return drift(format!("tbf has handle {:#x}, want 1:", root.handle));
    }
    let Some(got) = root.tbf else {
        return drift("tbf without parameters".into());
    };
    if got.rate != want.rate {
        return drift(format!("tbf rate is {} B/s, want {}", got.rate, want.rate));
    }
    if got.limit != want.limit {
        return drift(format!("tbf limit is {} B, want {}", got.limit, want.limit));
    }
    if got.buffer != want.buffer && Some(got.buffer) != reference_buffer {
        return drift(format!(
            "tbf buffer is {} ticks, want {}",
            got.buffer, want.buffer
        ));
    }
    if got.peakrate != 0 {
        return drift(format!(
            "tbf has a peak rate of {} B/s, want none",
            got.peakrate
        ));
    }
    Ok(())
}

fn collect(errors: &mut Vec<BandwidthError>, result: Result<(), NetlinkError>) {
    match result {
        Ok(()) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => errors.push(e.into()),
    }
}

/// Removes the shaping on the device of `located`: our redirect filter (with the `ingress`
/// qdisc when nothing else is attached to it) and the root `tbf` with our handle. Traffic is
/// unshaped when this returns; the IFB is left to [`retire_ifbs`].
pub fn remove_shaping(located: &mut Located) -> Vec<BandwidthError> {
    let mut errors = Vec::new();
    let nl = &mut located.netlink;
    let index = located.device.index;
    match nl.filters(index, INGRESS_HANDLE) {
        Ok(filters) => {
            let ours = |f: &common::netlink::tc::Filter| {
                f.priority == FILTER_PRIORITY
                    && f.mirred
                        .iter()
                        .any(|(kind, _)| *kind == TcMirrorActionType::EgressRedir)
            };
            // An ingress qdisc without any filter is what an ADD killed between creating it
            // and adding the redirect leaves: nothing else is attached to it either.
            let empty = filters.is_empty();
            if empty || filters.iter().any(ours) {
                // Deleting the ingress qdisc takes its filters along: one request when every
                // filter is at our priority (the usual case; the priority's header and hash
                // table entries are listed too), else only our priority goes.
                let ingress = nl
                    .qdisc(index, INGRESS)
                    .is_ok_and(|q| q.is_some_and(|q| q.kind == "ingress"));
                if ingress && filters.iter().all(|f| f.priority == FILTER_PRIORITY) {
                    collect(&mut errors, nl.del_qdisc(index, INGRESS, 0));
                } else if !empty {
                    collect(
                        &mut errors,
                        nl.del_filters(index, INGRESS_HANDLE, FILTER_PRIORITY, PROTOCOL_ALL),
                    );
                }
            }
        }
        // No ingress qdisc at all.
        Err(e) if e.is_not_found() || e.errno() == Some(libc::EINVAL) => {}
        Err(e) => errors.push(e.into()),
    }
    match nl.qdisc(index, ROOT) {
        Ok(Some(q)) if q.kind == "tbf" && q.handle == TBF_HANDLE => {
            collect(&mut errors, nl.del_qdisc(index, ROOT, 0));
        }
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => errors.push(e.into()),
    }
    errors
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Takes the IFB `link` out of service in one cheap request (down, renamed to a tombstone,
/// alias marking it as such and keeping its owner), for the reaper to delete. When the
/// tombstone name is taken by a foreign link, the IFB is deleted here instead (slowly).
fn retire(nl: &mut Netlink, ifb: &LinkAlias, now: u64) -> Result<(), NetlinkError> {
    let was = ifb.alias.as_deref().unwrap_or(&ifb.link.name);
    let name = tombstone_name(ifb.link.index);
    let alias = tombstone_alias(now, was);
    log::info!("retiring {} as {name} for the reaper", ifb.link.name);
    match nl.retire_link(ifb.link.index, &name, &alias) {
        Err(e) if e.is_exists() => {
            log::warn!("{name} is taken: deleting {} right away", ifb.link.name);
            nl.del_link(ifb.link.index)
        }
        other => other,
    }
}

/// What [`retire_ifbs`] found.
#[derive(Debug, Default)]
pub struct Retired {
    /// Interface indexes of the tombstones to reap: the IFBs retired now and left-over ones.
    pub tombstones: Vec<u32>,
    /// What failed.
    pub errors: Vec<BandwidthError>,
}

/// DEL's IFB step in one namespace: retires the IFBs named `names` (ours and the reference's)
/// and notes left-over tombstones, all from one dump of the IFBs.
pub fn retire_ifbs(nl: &mut Netlink, names: &[String]) -> Retired {
    let mut out = Retired::default();
    let ifbs = match nl.ifbs_with_aliases() {
        Ok(ifbs) => ifbs,
        Err(e) => {
            out.errors.push(e.into());
            return out;
        }
    };
    let now = now();
    for ifb in &ifbs {
        if names.contains(&ifb.link.name) {
            match retire(nl, ifb, now) {
                Ok(()) => out.tombstones.push(ifb.link.index),
                Err(e) if e.is_not_found() => {}
                Err(e) => out.errors.push(e.into()),
            }
        } else if tombstone(ifb).is_some_and(|t| t.is_stale(now)) {
            out.tombstones.push(ifb.link.index);
        }
    }
    out
}

fn tombstone(ifb: &LinkAlias) -> Option<Tombstone> {
    Tombstone::parse(&ifb.link.name, ifb.alias.as_deref())
}

/// Interface indexes of the left-over tombstones in `ifbs` (ADD's sweep: it then reaps them).
pub fn stale_tombstones(ifbs: &[LinkAlias]) -> Vec<u32> {
    let now = now();
    ifbs.iter()
        .filter(|ifb| tombstone(ifb).is_some_and(|t| t.is_stale(now)))
        .map(|ifb| ifb.link.index)
        .collect()
}

/// Deletes the IFB devices of `network` whose owner (from the alias) is not in `valid`, and
/// left-over tombstones of any owner.
pub fn gc(nl: &mut Netlink, network: &str, valid: &[(String, String)]) -> Vec<BandwidthError> {
    let links = match nl.ifbs_with_aliases() {
        Ok(links) => links,
        Err(e) => return vec![e.into()],
    };
    let now = now();
    let mut errors = Vec::new();
    for link in links {
        if tombstone(&link).is_some_and(|t| t.is_stale(now)) {
            log::info!("gc: deleting the left-over {}", link.link.name);
            collect(&mut errors, nl.del_link(link.link.index));
            continue;
        }
        let Some(owner) = link.alias.as_deref().and_then(Owner::parse_alias) else {
            continue;
        };
        let alive = valid
            .iter()
            .any(|(id, ifname)| *id == owner.container_id && *ifname == owner.ifname);
        if owner.network == network && !alive {
            log::info!("gc: deleting {} of {owner:?}", link.link.name);
            collect(&mut errors, nl.del_link(link.link.index));
        }
    }
    errors
}

/// STATUS: creates an IFB device with a root `tbf` in a throwaway network namespace, which
/// loads the `ifb` and `sch_tbf` modules if needed, and lets the namespace go.
///
/// The namespace's thread only opens a netlink socket there (it keeps the namespace alive)
/// and ends; the probe runs on the caller's thread. So nothing on another thread logs, and a
/// logger's stream held by the caller cannot block the probe while the caller waits for it.
///
/// # Errors
/// [`BandwidthError::Unavailable`] naming what could not be created.
pub fn probe(psched: &Psched) -> Result<(), BandwidthError> {
    let tbf = Tbf::compute(125_000, 1514, 25_000, psched)
        .map_err(|e| BandwidthError::Unavailable(e.to_string()))?;
    let unavailable = |e: &dyn std::fmt::Display| BandwidthError::Unavailable(e.to_string());
    let mut nl = common::netns::in_new_netns(Netlink::new)
        .map_err(|e| {
            BandwidthError::Unavailable(format!(
                "cannot create a network namespace to probe in: {e}"
            ))
        })?
        .map_err(|e| unavailable(&e))?;
    let ifb = nl
        .add_ifb(STATUS_IFB, 1500, None, "cni-bandwidth:status")
        .map_err(|e| unavailable(&e))?;
    nl.add_root_tbf(ifb.index, TBF_HANDLE, &tbf, false)
        .map_err(|e| unavailable(&e))
}
