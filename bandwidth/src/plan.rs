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

use common::netlink::tc::{Psched, Tbf, TbfError};

use crate::config::{Config, Limit};
use crate::error::BandwidthError;
use crate::names::{ETHERNET_HEADER, Owner, ifb_name, reference_ifb_name};

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

/// The IFB half: an `ingress` qdisc and redirect filter on the device, an IFB with a `tbf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// Our IFB name.
    pub ifb: String,
    /// The name the Go plugin would have used, looked for by CHECK and DEL (host side only).
    pub reference_ifb: Option<String>,
    /// The alias recording the owner.
    pub alias: String,
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
        BandwidthError::Config(format!(
            "{field}: {} {} bits/s with {} {} bits cannot be shaped: {e}",
            limit.rate_field, limit.rate, limit.burst_field, limit.burst
        ))
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
    owner: &Owner,
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
                ifb: ifb_name(owner),
                reference_ifb: (side == Side::Host)
                    .then(|| reference_ifb_name(&owner.network, &owner.container_id)),
                alias: owner.alias(),
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

    fn owner() -> Owner {
        Owner {
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
        assert_eq!(r.ifb, ifb_name(&owner()));
        assert_eq!(
            r.reference_ifb.as_deref(),
            Some(reference_ifb_name("net", "c1").as_str())
        );
        assert_eq!(r.alias, "cni-bandwidth:net:c1:eth0");
        assert_eq!(r.mtu, 1500);
    }

    #[test]
    fn container_side_swaps_the_mechanisms_and_has_no_reference_ifb() {
        let c = config(Some(limit(8000, 80, false)), None);
        let p = plan(&c, Side::Container, device(), &owner(), &psched()).unwrap();
        assert!(p.direct.is_none());
        let r = p.redirect.unwrap();
        assert_eq!(r.tbf.rate, 1000);
        assert_eq!(r.reference_ifb, None);
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
        let err = plan(&c, Side::Host, device(), &owner(), &psched()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("ingressBurst"), "{msg}");
        assert!(msg.contains("2^32"), "{msg}");
    }
}
