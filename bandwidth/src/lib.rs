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
//!   netns nor `prevResult`, and returns when the kernel has deleted the IFB.
//! - **GC** deletes this network's IFBs whose owner (in the alias) is not a valid attachment.
//! - **STATUS** creates an IFB with a `tbf` in a throwaway namespace.
//!
//! Kernel objects (host side), with their CLI equivalents:
//! - `tc qdisc replace dev <veth> root handle 1: tbf rate … burst … latency …` (ingress);
//! - `ip link add bwp<hash> mtu <veth mtu> type ifb; ip link set bwp<hash> up alias
//!   cni-bandwidth:<network>:<container id>:<ifname>`, named as the reference names it
//!   ([`names::reference_ifb_name`]) unless another interface of the container holds that name;
//! - `tc qdisc add dev <veth> ingress`;
//! - `tc filter add dev <veth> parent ffff: protocol all prio 1 u32 match u32 0 0 classid 1:1
//!   action mirred egress redirect dev bwp<hash> action mirred egress redirect dev bwp<hash>
//!   pass` (the reference's two actions; the first steals every packet);
//! - `tc qdisc replace dev bwp<hash> root handle 1: tbf rate … burst … latency …` (egress);
//! - DEL: `tc qdisc del dev <veth> ingress; tc qdisc del dev <veth> root; ip link del bwp<hash>`.

pub mod apply;
pub mod config;
pub mod error;
pub mod names;
pub mod plan;

use cni::conf::NetConf;
use cni::error::CniError;
use cni::skel::{Call, Plugin};
use cni::types::{CniResult, Interface};
use host::netns::NetNs;
use netlink::tc::Psched;
use netlink::{Netlink, OpenError};

use crate::apply::Located;
use crate::config::{BandwidthKeys, Config};
use crate::error::BandwidthError;
use crate::plan::{Evidence, IfbIdentity, Plan, Side};
use cni::Attachment;

/// The versions the reference advertises (`VersionsStartingFrom("0.3.0")`).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bandwidth;

fn owner<T>(call: &Call, conf: &NetConf<T>) -> Attachment {
    Attachment {
        network: conf.name.clone(),
        container_id: call.container_id.clone(),
        ifname: call.ifname.clone(),
    }
}

/// The configuration, decode errors in the reference's words (`failed to parse network
/// configuration: …`).
fn conf<T: serde::de::DeserializeOwned>(call: &Call) -> Result<NetConf<T>, CniError> {
    call.conf()
        .map_err(|e| e.with_decode_lead("failed to parse network configuration"))
}

/// The prevResult, its errors in the reference's words: the plugin wraps its library's
/// `could not parse prevResult: …` in another `could not parse prevResult: `.
fn prev_result<T>(conf: &NetConf<T>) -> Result<Option<CniResult>, CniError> {
    conf.prev_result()
        .map_err(|e| e.led_by("could not parse prevResult"))
}

/// The device of this attachment, for DEL: `None` when there is none to clean up, because the
/// container namespace is gone (the veth pair and anything inside went with it), `CNI_NETNS`
/// names something that is no network namespace, or the interface is gone.
fn locate_for_del(call: &Call) -> Result<Option<Located>, BandwidthError> {
    let opened = call
        .netns_path()
        .map_err(|e| e.msg)
        .and_then(|path| NetNs::open(path).map_err(|e| e.to_string()));
    let ns = match opened {
        Ok(ns) => ns,
        Err(e) => {
            log::info!("DEL without the container namespace: {e}");
            return Ok(None);
        }
    };
    match apply::locate(&ns, &call.ifname) {
        Ok(located) => Ok(Some(located)),
        Err(BandwidthError::NoContainerInterface { .. }) => Ok(None),
        // Opened but not entered: not a network namespace (`/proc/self/status`, another kind
        // of namespace).
        Err(e @ (BandwidthError::Netns(_) | BandwidthError::Open(OpenError::Netns(_)))) => {
            log::info!("DEL without the container namespace: {e}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Locates the device and plans the shaping of `config` for this call.
fn locate_and_plan(
    call: &Call,
    conf: &NetConf<BandwidthKeys>,
    config: &Config,
) -> Result<(Located, Plan), CniError> {
    let ns = NetNs::open(call.netns_path()?).map_err(BandwidthError::OpenNetns)?;
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
        let conf = conf::<BandwidthKeys>(call)?;
        let config = Config::from_conf(&conf)?;
        let mut result = prev_result(&conf)?.ok_or(BandwidthError::NotChained("ADD"))?;
        if config.is_empty() {
            return Ok(result);
        }
        let (mut located, plan) = locate_and_plan(call, &conf, &config)?;
        if let Some(ifb) = apply::add(&mut located.netlink, &plan)? {
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
        let conf = conf::<BandwidthKeys>(call)?;
        let config = Config::from_conf(&conf)?;
        prev_result(&conf)?.ok_or(BandwidthError::NotChained("CHECK"))?;
        if config.is_empty() {
            return Ok(());
        }
        let (mut located, plan) = locate_and_plan(call, &conf, &config)?;
        Ok(apply::check(&mut located.netlink, &plan)?)
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        // The limits are not needed (nor validated): DEL removes whatever exists.
        let conf = conf::<serde::de::IgnoredAny>(call)?;
        let ifb = IfbIdentity::of(&owner(call, &conf));
        let mut errors = Vec::new();
        let mut host = None;
        // In the plugin's namespace, a Go-made IFB is this attachment's when the host veth's
        // filter points at it; with no container (interface) to ask, when no IFB carries this
        // attachment's alias.
        let mut host_evidence = Evidence::Gone;
        match locate_for_del(call) {
            Ok(Some(mut located)) => {
                let unshaped = apply::remove_shaping(&mut located);
                errors.extend(unshaped.errors);
                let evidence = Evidence::Device(unshaped.target);
                match located.side {
                    Side::Host => {
                        host_evidence = evidence;
                        host = Some(located.netlink);
                    }
                    Side::Container => {
                        errors.extend(apply::delete_ifbs(&mut located.netlink, &ifb, evidence));
                        // No host veth: a Go-made IFB in the plugin's namespace is another
                        // interface's.
                        host_evidence = Evidence::Device(None);
                    }
                }
            }
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
        match host.map_or_else(Netlink::new, Ok) {
            Ok(mut host) => errors.extend(apply::delete_ifbs(&mut host, &ifb, host_evidence)),
            Err(e) => errors.push(e.into()),
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0).into()),
            _ => Err(BandwidthError::Several(errors).into()),
        }
    }

    fn gc(&self, call: &Call) -> Result<(), CniError> {
        let conf = conf::<serde::de::IgnoredAny>(call)?;
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
            BandwidthError::Unavailable(format!("cannot read {}: {e}", netlink::tc::PSCHED_PATH))
        })?;
        Ok(apply::probe(&psched)?)
    }
}
