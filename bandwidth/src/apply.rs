//! The only code that touches the kernel: finding the device, programming a [`Plan`] (with
//! rollback), verifying it, removing it, garbage-collecting IFBs and probing for STATUS.

use std::os::fd::AsFd as _;

use host::netns::NetNs;
use netlink::tc::{INGRESS, INGRESS_HANDLE, PROTOCOL_ALL, Psched, ROOT, Tbf};
use netlink::{Link, LinkAlias, Netlink, NetlinkError};
use netlink_packet_route::tc::TcMirrorActionType;

use crate::error::{BandwidthError, IFB_NOT_FOUND, Step};
use crate::names::{self, FILTER_CLASSID, FILTER_PRIORITY, STATUS_IFB, TBF_HANDLE};
use crate::plan::{
    Device, Evidence, IfbChoice, IfbIdentity, Plan, Side, choose_ifb, owned, to_delete,
};

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

/// Programs `plan` and returns the IFB device it uses, if any. Re-running it converges: the
/// root `tbf`s are replaced, the attachment's IFB and an existing `ingress` qdisc are reused,
/// and the redirect filter at [`FILTER_PRIORITY`] is replaced. When a step fails, what this
/// call created is removed again.
///
/// # Errors
/// The first failing step.
pub fn add(nl: &mut Netlink, plan: &Plan) -> Result<Option<Link>, BandwidthError> {
    let mut undo = Vec::new();
    let outcome = add_steps(nl, plan, &mut undo);
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
    outcome
}

fn add_steps(
    nl: &mut Netlink,
    plan: &Plan,
    undo: &mut Vec<Undo>,
) -> Result<Option<Link>, BandwidthError> {
    let dev = &plan.device;
    if let Some((tbf, _)) = &plan.direct {
        nl.add_root_tbf(dev.index, TBF_HANDLE, tbf, true)
            .map_err(BandwidthError::step(Step::DeviceQdisc))?;
        undo.push(Undo::RootQdisc(dev.index));
    }
    let Some(redirect) = &plan.redirect else {
        return Ok(None);
    };
    let found = ifbs_named(nl, &redirect.ifb)?;
    // Only a Go-made IFB (no alias) needs the filter to tell whose it is.
    let target = if found.iter().any(|l| redirect.ifb.is_go_made(l)) {
        redirect_target(nl, dev.index)?
    } else {
        None
    };
    let ifb = match choose_ifb(&found, &redirect.ifb, target) {
        IfbChoice::Reuse(existing) => {
            nl.set_link(
                existing.link.index,
                &netlink::LinkChange {
                    mtu: Some(redirect.mtu),
                    up: Some(true),
                    ..Default::default()
                },
            )?;
            if existing.alias.is_none() {
                // The Go plugin's: from now on it names its owner, for GC and for the
                // attachment's other interfaces.
                nl.set_alias(existing.link.index, &redirect.ifb.alias)?;
            }
            existing.link.clone()
        }
        IfbChoice::Create(name) => {
            let link = nl
                .add_ifb(name, redirect.mtu, None, &redirect.ifb.alias)
                .map_err(BandwidthError::step(Step::AddIfb))?;
            undo.push(Undo::Link(link.index));
            link
        }
        IfbChoice::Taken => {
            return Err(BandwidthError::IfbNamesTaken {
                names: redirect.ifb.names.join(" and "),
                what: found
                    .iter()
                    .map(|l| {
                        format!(
                            "{}: kind {}, alias {:?}",
                            l.link.name,
                            l.link.kind.as_deref().unwrap_or("none"),
                            l.alias.as_deref().unwrap_or_default()
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
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
        Err(e) => return Err(BandwidthError::step(Step::IngressQdisc)(e)),
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
    )
    .map_err(BandwidthError::step(Step::Filter))?;
    undo.push(Undo::Filters(dev.index));
    nl.add_root_tbf(ifb.index, TBF_HANDLE, &redirect.tbf, true)
        .map_err(BandwidthError::step(Step::IfbQdisc))?;
    Ok(Some(ifb))
}

/// The links named as the attachment's IFB may be (two lookups by name: the cost does not
/// grow with other attachments' IFBs).
fn ifbs_named(nl: &mut Netlink, ifb: &IfbIdentity) -> Result<Vec<LinkAlias>, NetlinkError> {
    let mut found = Vec::new();
    for name in &ifb.names {
        match nl.link_alias_by_name(name) {
            Ok(link) => found.push(link),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(found)
}

/// True for the redirect filter this plugin (and the reference) puts on a device.
fn is_redirect(f: &netlink::tc::Filter) -> bool {
    f.priority == FILTER_PRIORITY
        && f.mirred
            .iter()
            .any(|(kind, _)| *kind == TcMirrorActionType::EgressRedir)
}

/// The interface the redirect filter in `filters` sends to, if there is one.
fn target_of(filters: &[netlink::tc::Filter]) -> Option<u32> {
    filters.iter().filter(|f| is_redirect(f)).find_map(|f| {
        f.mirred
            .iter()
            .find(|(kind, _)| *kind == TcMirrorActionType::EgressRedir)
            .map(|&(_, target)| target)
    })
}

/// Lists the filters of device `index`'s `ingress` qdisc; `None` when it has none.
fn ingress_filters(
    nl: &mut Netlink,
    index: u32,
) -> Result<Option<Vec<netlink::tc::Filter>>, NetlinkError> {
    match nl.filters(index, INGRESS_HANDLE) {
        Ok(filters) => Ok(Some(filters)),
        // No ingress qdisc at all.
        Err(e) if e.is_not_found() || e.errno() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The interface device `index`'s redirect filter sends to, if it has one.
fn redirect_target(nl: &mut Netlink, index: u32) -> Result<Option<u32>, NetlinkError> {
    Ok(ingress_filters(nl, index)?.and_then(|f| target_of(&f)))
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
    let found = ifbs_named(nl, &redirect.ifb)?;
    let target = redirect_target(nl, dev.index)?;
    let mine = owned(&found, &redirect.ifb, Evidence::Device(target));
    // A Go-made IFB the filter no longer points at may still be this attachment's: then the
    // filter is what is missing.
    let Some(named) = mine
        .first()
        .copied()
        .or_else(|| found.iter().find(|l| redirect.ifb.is_go_made(l)))
    else {
        return Err(BandwidthError::drift(
            IFB_NOT_FOUND,
            format!(
                "no ifb device of this attachment: neither {} exists with the alias {:?}",
                redirect.ifb.names.join(" nor "),
                redirect.ifb.alias
            ),
        ));
    };
    if nl
        .qdisc(dev.index, INGRESS)?
        .is_none_or(|q| q.kind != "ingress")
    {
        let msg = format!("{} has no ingress qdisc", dev.name);
        return Err(BandwidthError::drift(msg, ""));
    }
    let Some(ifb) = mine.iter().find(|l| Some(l.link.index) == target) else {
        let msg = format!(
            "{} has no filter of priority {FILTER_PRIORITY} redirecting to {}",
            dev.name, named.link.name
        );
        return Err(BandwidthError::drift(
            msg,
            format!("its redirect goes to interface index {target:?}"),
        ));
    };
    check_root_tbf(
        nl,
        ifb.link.index,
        &ifb.link.name,
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
        return Err(BandwidthError::drift(
            "Failed to find qdisc",
            format!("{name} has no root qdisc, want tbf"),
        ));
    };
    let own = |what: String| Err(BandwidthError::drift(format!("{name}: {what}"), ""));
    let reference =
        |msg: &str, what: String| Err(BandwidthError::drift(msg, format!("{name}: {what}")));
    if root.kind != "tbf" {
        return own(format!("root qdisc is {}, want tbf", root.kind));
    }
    if root.handle != TBF_HANDLE {
        return own(format!("tbf has handle {:#x}, want 1:", root.handle));
    }
    let Some(got) = root.tbf else {
        return own("tbf without parameters".into());
    };
    if got.rate != want.rate {
        return reference(
            "Rate doesn't match",
            format!("tbf rate is {} B/s, want {}", got.rate, want.rate),
        );
    }
    if got.limit != want.limit {
        return reference(
            "Limit doesn't match",
            format!("tbf limit is {} B, want {}", got.limit, want.limit),
        );
    }
    if got.buffer != want.buffer && Some(got.buffer) != reference_buffer {
        return reference(
            "Buffer doesn't match",
            format!("tbf buffer is {} ticks, want {}", got.buffer, want.buffer),
        );
    }
    if got.peakrate != 0 {
        return own(format!(
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

/// What [`remove_shaping`] saw and did.
#[derive(Debug, Default)]
pub struct Unshaped {
    /// The interface the device's redirect filter sent to, before its removal.
    pub target: Option<u32>,
    /// What failed.
    pub errors: Vec<BandwidthError>,
}

/// Removes the shaping on the device of `located`: our redirect filter (with the `ingress`
/// qdisc when nothing else is attached to it) and the root `tbf` with our handle. Traffic is
/// unshaped when this returns; the IFB is left to [`delete_ifbs`], told where the filter
/// pointed.
pub fn remove_shaping(located: &mut Located) -> Unshaped {
    let mut out = Unshaped::default();
    let nl = &mut located.netlink;
    let index = located.device.index;
    match ingress_filters(nl, index) {
        Ok(Some(filters)) => {
            out.target = target_of(&filters);
            // An ingress qdisc without any filter is what an ADD killed between creating it
            // and adding the redirect leaves: nothing else is attached to it either.
            let empty = filters.is_empty();
            if empty || out.target.is_some() {
                // Deleting the ingress qdisc takes its filters along: one request when every
                // filter is at our priority (the usual case; the priority's header and hash
                // table entries are listed too), else only our priority goes.
                let ingress = nl
                    .qdisc(index, INGRESS)
                    .is_ok_and(|q| q.is_some_and(|q| q.kind == "ingress"));
                if ingress && filters.iter().all(|f| f.priority == FILTER_PRIORITY) {
                    collect(&mut out.errors, nl.del_qdisc(index, INGRESS, 0));
                } else if !empty {
                    collect(
                        &mut out.errors,
                        nl.del_filters(index, INGRESS_HANDLE, FILTER_PRIORITY, PROTOCOL_ALL),
                    );
                }
            }
        }
        Ok(None) => {}
        Err(e) => out.errors.push(e.into()),
    }
    match nl.qdisc(index, ROOT) {
        Ok(Some(q)) if q.kind == "tbf" && q.handle == TBF_HANDLE => {
            collect(&mut out.errors, nl.del_qdisc(index, ROOT, 0));
        }
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => out.errors.push(e.into()),
    }
    out
}

/// DEL's IFB step in `nl`'s namespace: deletes the IFBs of the attachment of `ifb` there
/// ([`to_delete`], judged by `evidence`), and waits for the kernel to have done so.
pub fn delete_ifbs(nl: &mut Netlink, ifb: &IfbIdentity, evidence: Evidence) -> Vec<BandwidthError> {
    let mut errors = Vec::new();
    let found = match ifbs_named(nl, ifb) {
        Ok(found) => found,
        Err(e) => return vec![e.into()],
    };
    for link in to_delete(&found, ifb, evidence) {
        log::info!("deleting ifb {}", link.link.name);
        collect(&mut errors, nl.del_link(link.link.index));
    }
    errors
}

/// Deletes the IFB devices of `network` whose owner (from the alias) is not in `valid`.
pub fn gc(nl: &mut Netlink, network: &str, valid: &[(String, String)]) -> Vec<BandwidthError> {
    let links = match nl.ifbs_with_aliases() {
        Ok(links) => links,
        Err(e) => return vec![e.into()],
    };
    let mut errors = Vec::new();
    for link in links {
        let Some(owner) = link.alias.as_deref().and_then(names::parse_alias) else {
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
    let mut nl = host::netns::in_new_netns(Netlink::new)
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
