//! What to program, from the config and the facts observed in the kernel (pure).
//!
//! Shaping always takes two mechanisms on one device: a root `tbf` shapes what the device
//! *sends*, and an `ingress` qdisc with a redirect to an IFB device (whose root `tbf` shapes)
//! handles what it *receives*. Which direction of the container each one serves depends on
//! where the device is:
//!
//! | device | root `tbf` shapes | IFB `tbf` shapes |
//! | --- | --- | --- |
//! | host-side veth peer ([`Side::Host`], as the reference) | traffic into the container | traffic out of it |
//! | the container's own interface ([`Side::Container`], when there is no host-side veth) | traffic out of the container | traffic into it |

use netlink::LinkAlias;
use netlink::tc::{Psched, Tbf, TbfError};

use crate::config::{Config, Limit};
use crate::error::BandwidthError;
use cni::Attachment;

use crate::names::{self, ETHERNET_HEADER};

/// Milliseconds of traffic at the configured rate a derived burst holds.
pub const DERIVED_BURST_MS: u64 = 10;

/// Where the shaped device lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The host-side peer of the container's veth, in the plugin's namespace.
    Host,
    /// The container's interface itself, inside the container namespace.
    Container,
}

/// The device shaping is attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Interface index in its namespace.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Its MTU.
    pub mtu: u32,
}

/// How an attachment's IFB is named and recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfbIdentity {
    /// The names it may have: the reference's first, then the fallback ([`names::ifb_names`]).
    pub names: [String; 2],
    /// The alias recording the owner, which every IFB this plugin makes carries.
    pub alias: String,
}

impl IfbIdentity {
    /// The identity of `owner`'s IFB.
    pub fn of(owner: &Attachment) -> IfbIdentity {
        IfbIdentity {
            names: names::ifb_names(owner),
            alias: names::alias(owner),
        }
    }

    /// True when `link` is an IFB the Go plugin made for this attachment's network and
    /// container: the reference name, kind `ifb`, no alias, up (it creates its IFBs up).
    /// Which interface of the container it serves only the redirect filter pointing at it can
    /// tell ([`Evidence`]).
    pub fn is_go_made(&self, link: &LinkAlias) -> bool {
        is_ifb(link) && link.alias.is_none() && link.link.up && link.link.name == self.names[0]
    }

    /// True when `link` is an IFB an ADD of ours was killed in the middle of making: one of
    /// the names, kind `ifb`, down and without an alias ([`Netlink::add_ifb`] sets the alias
    /// and `up` in one request). No filter points at it yet, so it shapes nothing; DEL
    /// deletes it, ADD leaves it to a DEL (a concurrent ADD may still be making it).
    ///
    /// [`Netlink::add_ifb`]: netlink::Netlink::add_ifb
    pub fn is_half_made(&self, link: &LinkAlias) -> bool {
        is_ifb(link)
            && link.alias.is_none()
            && !link.link.up
            && self.names.contains(&link.link.name)
    }

    /// True when `link` is an IFB whose alias names this attachment.
    pub fn is_aliased(&self, link: &LinkAlias) -> bool {
        is_ifb(link) && link.alias.as_deref() == Some(self.alias.as_str())
    }
}

fn is_ifb(link: &LinkAlias) -> bool {
    link.link.kind.as_deref() == Some("ifb")
}

/// What tells which attachment a Go-made IFB (one without our alias) belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// The shaped device is known; its redirect filter points at this interface index, or it
    /// has none.
    Device(Option<u32>),
    /// The container namespace or its interface is gone (or cannot be entered), so no filter
    /// can tell.
    Gone,
}

/// The IFBs among `found` (the links under the attachment's names) that belong to the
/// attachment of `ifb`: those whose alias names it, and a Go-made one
/// ([`IfbIdentity::is_go_made`]) when the device's redirect filter points at it or, with the
/// device gone, when no IFB carries the attachment's alias. An attachment has one IFB at most
/// (ADD adopts a Go-made one by giving it the alias), so a Go-made IFB next to an aliased one
/// belongs to another interface of the container. With the device known but not pointing at
/// it, a Go-made IFB is never taken: it may shape another interface of the container.
pub fn owned<'a>(
    found: &'a [LinkAlias],
    ifb: &IfbIdentity,
    evidence: Evidence,
) -> Vec<&'a LinkAlias> {
    let aliased: Vec<&LinkAlias> = found.iter().filter(|l| ifb.is_aliased(l)).collect();
    let go_made = found
        .iter()
        .filter(|l| ifb.is_go_made(l))
        .filter(|l| match evidence {
            Evidence::Device(target) => target == Some(l.link.index),
            Evidence::Gone => aliased.is_empty(),
        });
    let mut owned = aliased.clone();
    owned.extend(go_made);
    owned
}

/// What DEL deletes of `found` (the links under the attachment's names): the attachment's
/// IFBs ([`owned`]) and those an ADD of the container's interfaces on the network left half-made
/// ([`IfbIdentity::is_half_made`]).
pub fn to_delete<'a>(
    found: &'a [LinkAlias],
    ifb: &IfbIdentity,
    evidence: Evidence,
) -> Vec<&'a LinkAlias> {
    let mut doomed = owned(found, ifb, evidence);
    doomed.extend(found.iter().filter(|l| ifb.is_half_made(l)));
    doomed
}

/// Which IFB an ADD uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfbChoice<'a> {
    /// The attachment's existing IFB (from an earlier ADD, ours or the Go plugin's).
    Reuse(&'a LinkAlias),
    /// A new IFB with this name: the reference's, or the fallback when another link holds it.
    Create(&'a str),
    /// Both names are held by links that are not this attachment's.
    Taken,
}

/// Picks the IFB of an ADD from `found` (the links under the attachment's names) and the
/// device's redirect target (`redirect`, read when a Go-made IFB is among them): the
/// attachment's own IFB if it has one (the one the filter points at first), else the first
/// free name.
pub fn choose_ifb<'a>(
    found: &'a [LinkAlias],
    ifb: &'a IfbIdentity,
    redirect: Option<u32>,
) -> IfbChoice<'a> {
    let mine = owned(found, ifb, Evidence::Device(redirect));
    if let Some(existing) = mine
        .iter()
        .find(|l| Some(l.link.index) == redirect)
        .or_else(|| mine.first())
    {
        return IfbChoice::Reuse(existing);
    }
    ifb.names
        .iter()
        .find(|name| !found.iter().any(|l| l.link.name == **name))
        .map_or(IfbChoice::Taken, |name| IfbChoice::Create(name))
}

/// The IFB half: an `ingress` qdisc and redirect filter on the device, an IFB with a `tbf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// The IFB's names and alias.
    pub ifb: IfbIdentity,
    /// The IFB's MTU (the device's).
    pub mtu: u32,
    /// The IFB's root `tbf`.
    pub tbf: Tbf,
    /// The buffer the Go plugin would compute for the same values (accepted by CHECK).
    pub reference_buffer: Option<u32>,
}

/// Everything ADD programs and CHECK verifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Where the device is.
    pub side: Side,
    /// The shaped device.
    pub device: Device,
    /// The device's root `tbf`, with the Go plugin's buffer for the same values.
    pub direct: Option<(Tbf, Option<u32>)>,
    /// The redirect to an IFB.
    pub redirect: Option<Redirect>,
}

/// The burst, in bytes, used for a sentinel burst: `DERIVED_BURST_MS` (10 ms) of traffic at
/// the rate, rounded up, and never less than one full-size frame (MTU + 14 bytes of Ethernet
/// header), since a bucket smaller than a frame never lets that frame pass.
pub fn derived_burst_bytes(rate_bytes: u64, mtu: u32) -> u32 {
    let at_rate = rate_bytes.saturating_mul(DERIVED_BURST_MS).div_ceil(1000);
    let frame = u64::from(mtu) + u64::from(ETHERNET_HEADER);
    u32::try_from(at_rate.max(frame)).unwrap_or(u32::MAX)
}

/// The effective burst in bytes of `limit` on a device with `mtu`.
pub fn burst_bytes(limit: &Limit, mtu: u32, derive_sentinel: bool) -> u32 {
    if limit.sentinel && derive_sentinel {
        derived_burst_bytes(limit.rate_bytes(), mtu)
    } else {
        // Validation keeps bursts below 4 GB.
        u32::try_from(limit.burst / 8).unwrap_or(u32::MAX)
    }
}

fn tbf(
    limit: &Limit,
    mtu: u32,
    config: &Config,
    psched: &Psched,
) -> Result<(Tbf, Option<u32>), BandwidthError> {
    let burst = burst_bytes(limit, mtu, config.derive_sentinel_burst);
    let tbf = Tbf::compute(limit.rate_bytes(), burst, config.latency_us, psched).map_err(|e| {
        let field = match e {
            TbfError::ZeroRate | TbfError::LimitOverflow => &limit.rate_field,
            TbfError::ZeroBurst | TbfError::BufferOverflow => &limit.burst_field,
        };
        BandwidthError::config(
            format!(
                "{field}: {} {} bits/s with {} {} bits cannot be shaped",
                limit.rate_field, limit.rate, limit.burst_field, limit.burst
            ),
            e.to_string(),
        )
    })?;
    let reference = Tbf::reference_buffer(limit.rate_bytes(), burst, psched);
    Ok((tbf, reference))
}

/// Plans the shaping of `config` on `device` at `side` for `owner`.
///
/// # Errors
/// Code 7 naming the fields when a limit overflows the kernel's 32-bit fields.
pub fn plan(
    config: &Config,
    side: Side,
    device: Device,
    owner: &Attachment,
    psched: &Psched,
) -> Result<Plan, BandwidthError> {
    let (direct_limit, redirect_limit) = match side {
        Side::Host => (&config.ingress, &config.egress),
        Side::Container => (&config.egress, &config.ingress),
    };
    let direct = direct_limit
        .as_ref()
        .map(|l| tbf(l, device.mtu, config, psched))
        .transpose()?;
    let redirect = match redirect_limit {
        Some(l) => {
            let (tbf, reference_buffer) = tbf(l, device.mtu, config, psched)?;
            Some(Redirect {
                ifb: IfbIdentity::of(owner),
                mtu: device.mtu,
                tbf,
                reference_buffer,
            })
        }
        None => None,
    };
    Ok(Plan {
        side,
        device,
        direct,
        redirect,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psched() -> Psched {
        Psched::parse("000003e8 00000040 000f4240 3b9aca00").unwrap()
    }

    fn limit(rate: u64, burst: u64, sentinel: bool) -> Limit {
        Limit {
            rate,
            burst,
            sentinel,
            rate_field: "ingressRate".into(),
            burst_field: "ingressBurst".into(),
        }
    }

    fn config(ingress: Option<Limit>, egress: Option<Limit>) -> Config {
        Config {
            ingress,
            egress,
            latency_us: 25_000,
            derive_sentinel_burst: true,
        }
    }

    fn owner() -> Attachment {
        Attachment {
            network: "net".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
        }
    }

    fn device() -> Device {
        Device {
            index: 7,
            name: "veth1".into(),
            mtu: 1500,
        }
    }

    #[test]
    fn derived_bursts_hold_10_ms_and_at_least_one_frame() {
        // 10 Mbit/s: 1.25 MB/s for 10 ms.
        assert_eq!(derived_burst_bytes(1_250_000, 1500), 12_500);
        // 1 Mbit/s: 1250 B would not pass a full frame.
        assert_eq!(derived_burst_bytes(125_000, 1500), 1514);
        assert_eq!(derived_burst_bytes(125_000, 9000), 9014);
        assert_eq!(derived_burst_bytes(u64::MAX, 1500), u32::MAX);
        let sentinel = limit(10_000_000, u64::from(u32::MAX), true);
        assert_eq!(burst_bytes(&sentinel, 1500, true), 12_500);
        assert_eq!(burst_bytes(&sentinel, 1500, false), 536_870_911);
        assert_eq!(
            burst_bytes(&limit(10_000_000, 80_000, false), 1500, true),
            10_000
        );
    }

    #[test]
    fn host_side_shapes_ingress_on_the_veth_and_egress_on_the_ifb() {
        let c = config(Some(limit(8000, 80, false)), Some(limit(16, 8, false)));
        let p = plan(&c, Side::Host, device(), &owner(), &psched()).unwrap();
        let (direct, _) = p.direct.unwrap();
        assert_eq!((direct.rate, direct.limit), (1000, 35));
        let r = p.redirect.unwrap();
        assert_eq!((r.tbf.rate, r.tbf.limit), (2, 1));
        assert_eq!(r.ifb.names, names::ifb_names(&owner()));
        assert_eq!(r.ifb.alias, "cni-bandwidth:net:c1:eth0");
        assert_eq!(r.mtu, 1500);
    }

    #[test]
    fn container_side_swaps_the_mechanisms() {
        let c = config(Some(limit(8000, 80, false)), None);
        let p = plan(&c, Side::Container, device(), &owner(), &psched()).unwrap();
        assert!(p.direct.is_none());
        let r = p.redirect.unwrap();
        assert_eq!(r.tbf.rate, 1000);
        assert_eq!(r.ifb, IfbIdentity::of(&owner()));
        let c = config(None, Some(limit(8000, 80, false)));
        let p = plan(&c, Side::Container, device(), &owner(), &psched()).unwrap();
        assert!(p.redirect.is_none());
        assert_eq!(p.direct.unwrap().0.rate, 1000);
    }

    #[test]
    fn a_sentinel_burst_is_replaced_unless_turned_off() {
        let mut c = config(Some(limit(10_000_000, 4_294_967_295, true)), None);
        let p = plan(&c, Side::Host, device(), &owner(), &psched()).unwrap();
        let (tbf, _) = p.direct.unwrap();
        // 12500 B at 1.25 MB/s = 10 ms = 156250 ticks.
        assert_eq!(tbf.buffer, 156_250);
        assert_eq!(tbf.limit, 31_250 + 12_500);
        // Without derivation, MaxUint32 bits at 10 Mbit/s is 429 s of burst: beyond the
        // kernel's 32-bit tick field, which the Go plugin silently truncates.
        c.derive_sentinel_burst = false;
        let err = cni::error::CniError::from(
            plan(&c, Side::Host, device(), &owner(), &psched()).unwrap_err(),
        );
        assert_eq!(err.code, cni::error::ErrorCode::InvalidConfig);
        assert!(err.msg.starts_with("ingressBurst"), "{err:?}");
        assert!(err.details.contains("2^32"), "{err:?}");
    }

    fn link(index: u32, name: &str, kind: &str, alias: Option<&str>) -> LinkAlias {
        LinkAlias {
            link: netlink::Link {
                index,
                name: name.into(),
                mac: None,
                mtu: 1500,
                txqlen: 0,
                up: true,
                promisc: false,
                allmulti: false,
                link: None,
                link_netnsid: None,
                kind: Some(kind.into()),
                master: None,
            },
            alias: alias.map(str::to_owned),
        }
    }

    fn other_ifname() -> Attachment {
        Attachment {
            ifname: "net1".into(),
            ..owner()
        }
    }

    #[test]
    fn an_add_takes_the_reference_name_and_the_fallback_only_when_another_attachment_holds_it() {
        let me = IfbIdentity::of(&owner());
        let [reference, fallback] = me.names.clone();
        // Nothing there: the reference's name.
        assert_eq!(choose_ifb(&[], &me, None), IfbChoice::Create(&reference));
        // Ours already (a repeated ADD): reused, under either name.
        let found = [link(5, &reference, "ifb", Some(&me.alias))];
        assert_eq!(choose_ifb(&found, &me, None), IfbChoice::Reuse(&found[0]));
        let found = [link(6, &fallback, "ifb", Some(&me.alias))];
        assert_eq!(choose_ifb(&found, &me, None), IfbChoice::Reuse(&found[0]));
        // Another interface of the container holds the reference name, by alias or as the Go
        // plugin made it (no alias, our device's filter not pointing at it): the fallback.
        let theirs = IfbIdentity::of(&other_ifname());
        for found in [
            [link(5, &reference, "ifb", Some(&theirs.alias))],
            [link(5, &reference, "ifb", None)],
            [link(5, &reference, "dummy", Some(&me.alias))],
        ] {
            assert_eq!(choose_ifb(&found, &me, None), IfbChoice::Create(&fallback));
            assert_eq!(
                choose_ifb(&found, &me, Some(9)),
                IfbChoice::Create(&fallback)
            );
        }
        // A Go-made IFB our device's filter points at is ours (an upgrade's re-ADD).
        let found = [link(5, &reference, "ifb", None)];
        assert_eq!(
            choose_ifb(&found, &me, Some(5)),
            IfbChoice::Reuse(&found[0])
        );
        // Both names held by others.
        let found = [
            link(5, &reference, "ifb", None),
            link(6, &fallback, "ifb", Some("cni-bandwidth:x:y:z")),
        ];
        assert_eq!(choose_ifb(&found, &me, None), IfbChoice::Taken);
    }

    #[test]
    fn an_ifb_left_half_made_by_a_killed_add_is_deleted_by_del_and_left_alone_by_add() {
        let me = IfbIdentity::of(&owner());
        let [reference, fallback] = me.names.clone();
        let mut half = link(5, &reference, "ifb", None);
        half.link.up = false;
        let found = [half.clone()];
        // Not Go's (down), not ours by alias: an ADD takes the other name.
        assert!(!me.is_go_made(&half));
        assert_eq!(
            choose_ifb(&found, &me, Some(5)),
            IfbChoice::Create(&fallback)
        );
        for evidence in [
            Evidence::Gone,
            Evidence::Device(None),
            Evidence::Device(Some(7)),
        ] {
            assert!(owned(&found, &me, evidence).is_empty(), "{evidence:?}");
            let doomed: Vec<u32> = to_delete(&found, &me, evidence)
                .iter()
                .map(|l| l.link.index)
                .collect();
            assert_eq!(doomed, [5], "{evidence:?}");
        }
        // Only under the attachment's names.
        let mut elsewhere = link(6, "bwp000000000000", "ifb", None);
        elsewhere.link.up = false;
        assert!(to_delete(&[elsewhere], &me, Evidence::Gone).is_empty());
        // With the aliased IFB next to it, both go.
        let found = [half, link(6, &fallback, "ifb", Some(&me.alias))];
        assert_eq!(to_delete(&found, &me, Evidence::Device(Some(6))).len(), 2);
    }

    #[test]
    fn a_go_made_ifb_is_the_attachments_when_its_filter_points_there_or_nothing_can_tell() {
        let me = IfbIdentity::of(&owner());
        let [reference, fallback] = me.names.clone();
        let go = link(5, &reference, "ifb", None);
        let aliased = link(6, &fallback, "ifb", Some(&me.alias));
        let names = |v: Vec<&LinkAlias>| v.iter().map(|l| l.link.index).collect::<Vec<_>>();
        let found = [go.clone()];
        assert_eq!(names(owned(&found, &me, Evidence::Device(Some(5)))), [5]);
        assert!(owned(&found, &me, Evidence::Device(Some(7))).is_empty());
        assert!(owned(&found, &me, Evidence::Device(None)).is_empty());
        // Container gone: the Go plugin's DEL would delete that name; so do we.
        assert_eq!(names(owned(&found, &me, Evidence::Gone)), [5]);
        // But not when the attachment has its own (aliased) IFB: the Go-made one is then
        // another interface's.
        let found = [go.clone(), aliased.clone()];
        assert_eq!(names(owned(&found, &me, Evidence::Gone)), [6]);
        assert_eq!(names(owned(&found, &me, Evidence::Device(Some(6)))), [6]);
        // Another attachment's, by alias, is never ours; nor is a non-IFB.
        let found = [
            link(
                5,
                &reference,
                "ifb",
                Some(&IfbIdentity::of(&other_ifname()).alias),
            ),
            link(6, &fallback, "veth", Some(&me.alias)),
        ];
        for evidence in [
            Evidence::Gone,
            Evidence::Device(Some(5)),
            Evidence::Device(None),
        ] {
            assert!(owned(&found, &me, evidence).is_empty(), "{evidence:?}");
        }
    }
}
