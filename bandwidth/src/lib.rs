//! `bandwidth`: token-bucket shaping of a container's traffic, a drop-in replacement for the
//! CNI reference plugin of the same name (see `README.md`).
//!
//! Chained after a main plugin, it limits the rate of traffic into the container (`ingressRate`,
//! `ingressBurst`) and out of it (`egressRate`, `egressBurst`), in bits per second and bits,
//! from the config or from `runtimeConfig.bandwidth`. Everything is programmed over netlink;
//! nothing is exec'd.
//!
//! Verbs:
//! - **ADD** shapes, on the host-side veth peer of `CNI_IFNAME` (or, without one, on the
//!   container interface inside the container), and returns `prevResult` with the IFB appended
//!   when one is used. A failing ADD leaves nothing behind.
//! - **CHECK** verifies the qdisc kinds and parameters, the redirect filter and the IFB.
//! - **DEL** removes all of it, also what the Go plugin created; idempotent, needs neither the
//!   netns nor `prevResult`. The shaping goes at once; the IFB is retired (down, renamed
//!   `bwdel<index>`) and deleted by a detached child ([`reap`]), because the kernel takes
//!   20–30 ms to delete a device.
//! - **GC** deletes this network's IFBs whose owner (in the alias) is not a valid attachment,
//!   and left-over tombstones (as does every ADD and DEL, through [`reap`]).
//! - **STATUS** creates an IFB with a `tbf` in a throwaway namespace.
//!
//! Kernel objects (host side), with their CLI equivalents:
//! - `tc qdisc replace dev <veth> root handle 1: tbf rate … burst … latency …` (ingress);
//! - `ip link add bwp<hash> mtu <veth mtu> type ifb; ip link set bwp<hash> up alias
//!   cni-bandwidth:<network>:<container id>:<ifname>`;
//! - `tc qdisc add dev <veth> ingress`;
//! - `tc filter add dev <veth> parent ffff: protocol all prio 1 u32 match u32 0 0 classid 1:1
//!   action mirred egress redirect dev bwp<hash>`;
//! - `tc qdisc replace dev bwp<hash> root handle 1: tbf rate … burst … latency …` (egress);
//! - DEL: `ip link set dev bwp<hash> down name bwdel<ifindex> alias
//!   cni-bandwidth-deleted:<unix time>:<former alias>`, then (reaper) `ip link del bwdel<ifindex>`.

pub mod apply;
pub mod config;
pub mod error;
pub mod names;
pub mod plan;

use common::conf::NetConf;
use common::error::CniError;
use common::netlink::tc::Psched;
use common::netlink::{Netlink, OpenError};
use common::skel::{Call, Plugin};
use common::types::{CniResult, Interface};

use crate::apply::Located;
use crate::config::{BandwidthKeys, Config};
use crate::error::BandwidthError;
use crate::names::{Owner, ifb_name, reference_ifb_name};
use crate::plan::{Plan, Side};

/// The versions the reference advertises (`VersionsStartingFrom("0.3.0")`).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bandwidth;

fn owner(call: &Call, conf: &NetConf<BandwidthKeys>) -> Owner {
    Owner {
        network: conf.name.clone(),
        container_id: call.container_id.clone(),
        ifname: call.ifname.clone(),
    }
}

/// Deletes the tombstones `indexes` in `nl`'s namespace (the plugin's own or a container's)
/// from a detached child, the *reaper* ([`Netlink::del_links_detached`]): the kernel takes
/// 20–30 ms per device, which DEL does not wait for.
fn reap(nl: &mut Netlink, indexes: &[u32]) {
    if let Err(e) = nl.del_links_detached(indexes) {
        log::warn!("{e}");
    }
}

/// Locates the device and plans the shaping of `config` for this call.
fn locate_and_plan(
    call: &Call,
    conf: &NetConf<BandwidthKeys>,
    config: &Config,
) -> Result<(Located, Plan), CniError> {
    let ns = call.open_netns()?;
    let psched = Psched::read().map_err(BandwidthError::Psched)?;
    let located = apply::locate(&ns, &call.ifname)?;
    let plan = plan::plan(
        config,
        located.side,
        located.device.clone(),
        &owner(call, conf),
        &psched,
    )?;
    Ok((located, plan))
}

impl Plugin for Bandwidth {
    fn name(&self) -> &'static str {
        "bandwidth"
    }

    fn supported_versions(&self) -> &'static [&'static str] {
        SUPPORTED_VERSIONS
    }

    fn add(&self, call: &Call) -> Result<CniResult, CniError> {
        let conf = call.conf::<BandwidthKeys>()?;
        let config = Config::from_conf(&conf)?;
        let mut result = conf
            .prev_result()?
            .ok_or(BandwidthError::NotChained("ADD"))?;
        if config.is_empty() {
            return Ok(result);
        }
        let (mut located, plan) = locate_and_plan(call, &conf, &config)?;
        let added = apply::add(&mut located.netlink, &plan)?;
        reap(&mut located.netlink, &added.stale);
        if let Some(ifb) = added.ifb {
            result.interfaces.push(Interface {
                name: ifb.name.clone(),
                mac: ifb.mac_string(),
                sandbox: (plan.side == Side::Container)
                    .then(|| {
                        call.netns
                            .as_ref()
                            .map(|p| p.to_string_lossy().into_owned())
                    })
                    .flatten(),
                ..Interface::default()
            });
        }
        Ok(result)
    }

    fn check(&self, call: &Call) -> Result<(), CniError> {
        let conf = call.conf::<BandwidthKeys>()?;
        let config = Config::from_conf(&conf)?;
        conf.prev_result()?
            .ok_or(BandwidthError::NotChained("CHECK"))?;
        if config.is_empty() {
            return Ok(());
        }
        let (mut located, plan) = locate_and_plan(call, &conf, &config)?;
        Ok(apply::check(&mut located.netlink, &plan)?)
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        // The limits are not needed (nor validated): DEL removes whatever exists by name.
        let conf = call.conf::<serde::de::IgnoredAny>()?;
        let owner = Owner {
            network: conf.name.clone(),
            container_id: call.container_id.clone(),
            ifname: call.ifname.clone(),
        };
        let ifbs = [
            ifb_name(&owner),
            reference_ifb_name(&owner.network, &owner.container_id),
        ];
        let mut errors = Vec::new();
        let mut host = None;
        match call.open_netns() {
            Ok(ns) => match apply::locate(&ns, &call.ifname) {
                Ok(mut located) => {
                    errors.extend(apply::remove_shaping(&mut located));
                    match located.side {
                        Side::Host => host = Some(located.netlink),
                        Side::Container => {
                            let retired = apply::retire_ifbs(&mut located.netlink, &ifbs);
                            errors.extend(retired.errors);
                            reap(&mut located.netlink, &retired.tombstones);
                        }
                    }
                }
                Err(BandwidthError::NoContainerInterface { .. }) => {}
                // Opened but not entered: not a network namespace (`/proc/self/status`,
                // another kind of namespace). Nothing to do in there; the plugin's namespace is
                // cleaned up all the same.
                Err(e @ (BandwidthError::Netns(_) | BandwidthError::Open(OpenError::Netns(_)))) => {
                    log::info!("DEL without the container namespace: {e}")
                }
                Err(e) => errors.push(e),
            },
            // Gone with its namespace: the veth pair and anything inside went with it.
            Err(e) => log::debug!("DEL without the container namespace: {e}"),
        }
        // The IFBs in the plugin's namespace (also after a container-side ADD: one named ours
        // or the reference's way may be left from a host-side one).
        match host.map_or_else(Netlink::new, Ok) {
            Ok(mut host) => {
                let retired = apply::retire_ifbs(&mut host, &ifbs);
                errors.extend(retired.errors);
                reap(&mut host, &retired.tombstones);
            }
            Err(e) => errors.push(e.into()),
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0).into()),
            _ => Err(BandwidthError::Several(errors).into()),
        }
    }

    fn gc(&self, call: &Call) -> Result<(), CniError> {
        let conf = call.conf::<serde::de::IgnoredAny>()?;
        let Some(valid) = &conf.valid_attachments else {
            log::warn!("GC without cni.dev/valid-attachments: nothing is collected");
            return Ok(());
        };
        let valid: Vec<(String, String)> = valid
            .iter()
            .map(|a| (a.container_id.clone(), a.ifname.clone()))
            .collect();
        let mut host = Netlink::new().map_err(BandwidthError::from)?;
        let mut errors = apply::gc(&mut host, &conf.name, &valid);
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0).into()),
            _ => Err(BandwidthError::Several(errors).into()),
        }
    }

    fn status(&self, _call: &Call) -> Result<(), CniError> {
        let psched = Psched::read().map_err(|e| {
            BandwidthError::Unavailable(format!(
                "cannot read {}: {e}",
                common::netlink::tc::PSCHED_PATH
            ))
        })?;
        Ok(apply::probe(&psched)?)
    }
}
