//! `portmap`: forwards host ports to a container (DNAT), with masquerading for hairpin and
//! localhost traffic, as a chained CNI plugin. A drop-in for the reference plugin; see
//! `portmap/README.md`.
//!
//! Verbs: ADD programs the mappings of `runtimeConfig.portMappings` for the container addresses
//! of `prevResult`; CHECK verifies exactly them; DEL removes them (also without
//! `runtimeConfig`/`prevResult`, and the Go plugin's rules of the attachment); GC removes those of
//! attachments not in `cni.dev/valid-attachments`; STATUS probes the backend. Run by an
//! operator as `portmap reconcile`, it puts back what something else removed of the live
//! attachments' mappings, from their records ([`reconcile`]).
//!
//! Kernel objects:
//! - nftables backend (default): tables `ip cni_portmap` / `ip6 cni_portmap` with maps
//!   `ports`, `hostip_ports`, `gated_ports`, `gated_hostip_ports`, sets `hairpin`,
//!   `localhost`, `masq_all` and chains `prerouting`, `output`, `postrouting`, `hostports`,
//!   `gate_<hash>` (`nft list table ip cni_portmap`); elements are commented
//!   `network/containerID/ifname`.
//! - iptables backend: the reference's `nat` chains `CNI-HOSTPORT-DNAT`, `CNI-DN-<hash>`,
//!   `CNI-HOSTPORT-SETMARK`, `CNI-HOSTPORT-MASQ` (`iptables-save -t nat`), written over
//!   nf_tables netlink where the tools are `iptables-nft`, else with `iptables-restore`.
//! - `net.ipv4.conf.<host if>.route_localnet = 1` when `snat` (IPv4); UDP conntrack entries of
//!   the mapped host ports are deleted on ADD and DEL (`conntrack -D -p udp --dport N`); see
//!   [`node`].
//! - state files under `/run/cni/portmap/` ([`state`]), and the iptables layout's host-port
//!   index beside them ([`ports`]).
//!
//! Each verb reads its configuration ([`config`]), plans what it maps ([`plan`]: the same for
//! both layouts) and leaves the change to the [`backend::PortmapBackend`] that
//! [`backend::select`] picks, which renders the plan in its layout, answers who holds a host
//! port through [`ports`], and owns its lock, the order of its record and its rollback; DEL
//! also removes what the Go plugin made for the attachment ([`leftovers`]).

pub mod backend;
pub mod config;
pub mod error;
pub mod leftovers;
pub mod names;
pub mod node;
pub mod plan;
pub mod ports;
pub mod reconcile;
pub mod state;
pub mod watch;

use cni::Attachment;
use cni::conf::NetConf;
use cni::error::{CniError, ErrorCode};
use cni::operator::{OperatorCommand, OperatorError};
use cni::skel::{Call, Plugin};
use cni::types::CniResult;
use netfilter::nft::LazyNft;

use crate::backend::select;
use crate::config::{Config, PortmapKeys};
use crate::error::PortmapError;

/// The plugin.
#[derive(Debug, Clone, Copy)]
pub struct Portmap;

struct Loaded {
    config: Config,
    prev: Option<CniResult>,
    att: Attachment,
}

/// The configuration, as the reference's `parseConfig` reads it: decoded, its prevResult
/// parsed, then validated, each failure worded as the reference words it for the verb.
fn load(call: &Call) -> Result<Loaded, CniError> {
    let worded = |e: CniError| error::config_error(call.command, e);
    let decode = |e: CniError| worded(config::decode_error(e));
    let conf: NetConf<PortmapKeys> = call.conf().map_err(decode)?;
    let prev = config::prev_result(&conf).map_err(worded)?;
    let config = config::parse(&conf).map_err(|e| match e.code {
        ErrorCode::Decode => decode(e),
        _ => worded(e),
    })?;
    Ok(Loaded {
        att: Attachment::new(&conf.name, &call.container_id, &call.ifname),
        config,
        prev,
    })
}

fn add(call: &Call) -> Result<CniResult, CniError> {
    let Loaded { config, prev, att } = load(call)?;
    let prev = error::require_prev(prev, call.command)?;
    let ips = plan::mapped_ips(&config, &prev, &call.ifname);
    if ips.is_empty() {
        return Ok(prev);
    }
    let mut nft = LazyNft::new();
    let kind = select::select(&config, &mut nft);
    // What identifies the owner's namespace, to tell later whether it is gone (opened, never
    // entered for work: a socket made inside tells its cookie).
    let netns = call.netns.as_deref().and_then(state::NetnsId::of);
    select::add(nft, kind, &att, &config, &ips, netns)?;
    node::flush_udp(&config.mappings, &plan::families(&ips));
    Ok(prev)
}

fn check(call: &Call) -> Result<(), CniError> {
    let Loaded { config, prev, att } = load(call)?;
    let prev = error::require_prev(prev, call.command)?;
    let ips = plan::mapped_ips(&config, &prev, &call.ifname);
    if ips.is_empty() {
        return Ok(());
    }
    let recorded = state::locate(&state::store()?, &att)?.record.found();
    let mut nft = LazyNft::new();
    // The backend that made it, when we did; else what ADD would pick (the Go plugin's
    // default, iptables, where its tools work).
    let kind = match &recorded {
        Some(s) => s.backend,
        None => select::select(&config, &mut nft),
    };
    select::open(kind, nft).check(&att, &config, &ips, recorded.as_ref())?;
    Ok(())
}

fn del(call: &Call) -> Result<(), CniError> {
    // Only what DEL needs: a container made before an upgrade, or with a config that changed
    // since, must still be deletable.
    let conf: NetConf<serde::de::IgnoredAny> = call.conf()?;
    let att = Attachment::new(&conf.name, &call.container_id, &call.ifname);
    let errors = select::del(&att, &config::del_mappings(&conf))?;
    error::all(errors)
}

fn gc(call: &Call) -> Result<(), CniError> {
    let conf: NetConf<PortmapKeys> = call.conf()?;
    let config = config::parse(&conf)?;
    let valid = conf.valid_attachments.clone().unwrap_or_default();
    let mut nft = LazyNft::new();
    let kind = select::select(&config, &mut nft);
    error::all(select::gc(nft, kind, &state::store()?, &conf.name, &valid))
}

fn status(call: &Call) -> Result<(), CniError> {
    let conf: NetConf<PortmapKeys> = call.conf()?;
    let config = config::parse(&conf)?;
    let mut nft = LazyNft::new();
    let kind = select::select(&config, &mut nft);
    select::open(kind, nft)
        .status()
        .map_err(|e| PortmapError::Unavailable(e.to_string()))?;
    Ok(())
}

impl Plugin for Portmap {
    fn name(&self) -> &'static str {
        "portmap"
    }

    fn supported_versions(&self) -> &'static [&'static str] {
        cni::version::ALL
    }

    // Works in the plugin's own namespace: the skel does not open `CNI_NETNS`; ADD opens it
    // only to record what identifies it (`state::NetnsId`).
    fn uses_netns(&self) -> bool {
        false
    }

    fn add(&self, call: &Call) -> Result<CniResult, CniError> {
        add(call)
    }

    fn check(&self, call: &Call) -> Result<(), CniError> {
        check(call)
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        del(call)
    }

    fn status(&self, call: &Call) -> Result<(), CniError> {
        status(call)
    }

    fn gc(&self, call: &Call) -> Result<(), CniError> {
        gc(call)
    }

    fn operator_commands(&self) -> &'static [OperatorCommand] {
        &[reconcile::COMMAND]
    }

    fn operate(
        &self,
        command: &str,
        args: &[String],
        out: &mut dyn std::io::Write,
    ) -> Result<(), OperatorError> {
        match command {
            "reconcile" => reconcile::command(args, out),
            other => Err(OperatorError::usage(format!("unknown command {other:?}"))),
        }
    }
}
