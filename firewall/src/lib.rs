//! `firewall`: a CNI meta plugin that lets a container's traffic through the host's forward
//! path and, with an ingress policy, isolates bridges from each other. A drop-in replacement
//! for the reference plugin of containernetworking/plugins; see `README.md`.
//!
//! Verbs: ADD opens forwarding for every prevResult IP (and installs the bridge's isolation
//! rules); CHECK verifies exactly this attachment's objects; DEL removes them (without
//! prevResult too, and after the netns is gone); GC removes the objects of this network whose
//! attachment is not in `cni.dev/valid-attachments`; STATUS reports whether the backend works.
//! Run by an operator as `firewall reconcile`, it puts back what something else removed of
//! the live attachments' objects ([`reconcile`]), from the record each ADD keeps under
//! `/run/cni-firewall/` (every backend); `firewall reconcile --watch` does so whenever another
//! program deletes an object of the firewall's or firewalld reloads ([`watch`]).
//!
//! Kernel objects, by backend:
//! - `iptables` (the reference's layout, `iptables-save -t filter` shows it): chains
//!   `CNI-FORWARD` and `CNI-ADMIN` (`iptables -N`), `-I FORWARD -j CNI-FORWARD`,
//!   `-I CNI-FORWARD -j CNI-ADMIN`, per IP `-A CNI-FORWARD -d IP -m conntrack --ctstate
//!   RELATED,ESTABLISHED -j ACCEPT` and `-A CNI-FORWARD -s IP -j ACCEPT`; for an ingress
//!   policy `CNI-ISOLATION-STAGE-1`/`-2` with per-bridge rules. Written by the one iptables
//!   writer (`netfilter::iptables::writer`): one nf_tables transaction per call where the
//!   tools are `iptables-nft`, else one `iptables-restore --noflush` per family; state under
//!   `/run/cni-firewall/`.
//! - `nftables` (`nft list table inet cni_firewall`): a `forward` base chain (policy accept)
//!   jumping to `admin`, `isolation` and `attachments`, whose four shared rules accept by the
//!   sets `containers4`/`containers6` (`nft add element inet cni_firewall containers4 {
//!   10.0.0.2 comment "<network>/<containerID>/<ifname>" }`): an attachment is its elements.
//!   One netlink batch per call; nothing is exec'd.
//! - `firewalld` (`firewall-cmd --zone=trusted --list-sources`): each IP is a source of the zone.

pub mod backend;
pub mod config;
pub mod error;
pub mod names;
pub mod plan;
pub mod reconcile;
pub mod watch;

use cni::conf::NetConf;
use cni::error::CniError;
use cni::operator::{OperatorCommand, OperatorError};
use cni::skel::{Call, Plugin};
use cni::types::CniResult;
use netlink::census::NetnsId;

use backend::FirewallBackend;
use backend::firewalld::{self, Firewalld};
use backend::iptables::Iptables;
use backend::nftables::Nftables;
use backend::state::State;
use cni::Attachment;
use config::{BackendChoice, Config, TeardownWire, WireConf};
use error::FirewallError;
use plan::Target;

/// How the reference leads a configuration that does not decode.
const DECODE_LEAD: &str = "failed to load netconf";

/// The versions the reference advertises.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.4.0", "1.0.0", "1.1.0"];

/// The plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Firewall;

/// The decoded call: config, keys, and who the attachment is.
struct Parsed<W> {
    conf: NetConf<W>,
    config: Config,
    owner: Attachment,
}

fn owner(call: &Call, network: &str) -> Attachment {
    Attachment {
        network: network.to_owned(),
        container_id: call.container_id.clone(),
        ifname: call.ifname.clone(),
    }
}

/// ADD, CHECK and STATUS: every key validated.
fn parse(call: &Call) -> Result<Parsed<WireConf>, CniError> {
    let conf: NetConf<WireConf> = call.conf().map_err(|e| e.with_decode_lead(DECODE_LEAD))?;
    validated(call, conf)
}

/// ADD and CHECK: the prevResult they need is looked at before the keys are validated, as the
/// reference does (its `parseConf` parses the prevResult, the backend and the policy are
/// checked later).
fn parse_chained(call: &Call) -> Result<(Parsed<WireConf>, CniResult), CniError> {
    let conf: NetConf<WireConf> = call.conf().map_err(|e| e.with_decode_lead(DECODE_LEAD))?;
    let result = required_prev_result(&conf)?;
    Ok((validated(call, conf)?, result))
}

/// A decoded configuration, its keys validated.
fn validated(call: &Call, conf: NetConf<WireConf>) -> Result<Parsed<WireConf>, CniError> {
    let config = Config::from_wire(&conf.plugin)?;
    let owner = owner(call, &conf.name);
    Ok(Parsed {
        conf,
        config,
        owner,
    })
}

/// DEL and GC: only the keys they use, none of them validated ([`Config::for_teardown`]).
fn parse_teardown(call: &Call) -> Result<Parsed<TeardownWire>, CniError> {
    let conf: NetConf<TeardownWire> = call.conf().map_err(|e| e.with_decode_lead(DECODE_LEAD))?;
    let config = Config::for_teardown(&conf.plugin);
    let owner = owner(call, &conf.name);
    Ok(Parsed {
        conf,
        config,
        owner,
    })
}

/// The backend `config` selects, in the calling thread's network namespace.
///
/// # Errors
/// When the nftables socket or the state directory cannot be opened.
pub fn backend_for(config: &Config) -> Result<Box<dyn FirewallBackend>, FirewallError> {
    Ok(backend_in(config, State::for_current_netns()?))
}

/// The backend `config` selects, keeping its state in `state`.
#[must_use]
pub fn backend_in(config: &Config, state: State) -> Box<dyn FirewallBackend> {
    let choice = match config.backend {
        BackendChoice::Auto if firewalld::is_running() => BackendChoice::Firewalld,
        BackendChoice::Auto => BackendChoice::Iptables,
        chosen => chosen,
    };
    match choice {
        BackendChoice::Nftables => Box::new(Nftables::new(config.ingress, state)),
        BackendChoice::Firewalld => Box::new(Firewalld::new(config.clone(), state)),
        BackendChoice::Iptables | BackendChoice::Auto => {
            Box::new(Iptables::new(config.clone(), state))
        }
    }
}

/// The prevResult, which ADD and CHECK need; its errors in the reference's words: the plugin
/// wraps its library's `could not parse prevResult: …` in another `could not parse prevResult: `.
fn required_prev_result(conf: &NetConf<WireConf>) -> Result<CniResult, CniError> {
    conf.prev_result()
        .map_err(|e| e.led_by("could not parse prevResult"))?
        .ok_or_else(|| FirewallError::MissingPrevResult.into())
}

impl Plugin for Firewall {
    fn name(&self) -> &'static str {
        "firewall"
    }

    fn supported_versions(&self) -> &'static [&'static str] {
        SUPPORTED_VERSIONS
    }

    // Works in the plugin's own namespace: `CNI_NETNS` is never opened, not even by the skel.
    fn uses_netns(&self) -> bool {
        false
    }

    fn add(&self, call: &Call) -> Result<CniResult, CniError> {
        let (p, result) = parse_chained(call)?;
        let mut target = Target::from_result(&result, &p.config)?;
        // Recorded with the attachment: whether it is gone is told from this, not the path.
        target.netns = call.netns.as_deref().and_then(NetnsId::of);
        backend_for(&p.config)?.add(&p.owner, &target)?;
        Ok(result)
    }

    fn check(&self, call: &Call) -> Result<(), CniError> {
        let (p, result) = parse_chained(call)?;
        let target = Target::from_result(&result, &p.config)?;
        backend_for(&p.config)?.check(&p.owner, &target)?;
        Ok(())
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        let p = parse_teardown(call)?;
        // prevResult only names the IPs (the bridge does not matter: isolation rules are
        // shared). One that does not parse is no reason to keep the attachment's objects:
        // the state and the owner comments name them too.
        let target = match p.conf.prev_result() {
            Ok(result) => result.map(|r| Target {
                ips: Target::addresses(&r),
                ..Target::default()
            }),
            Err(e) => {
                log::warn!(
                    "DEL {}: ignoring prevResult: {}",
                    crate::names::state_name(&p.owner),
                    e.msg
                );
                None
            }
        };
        backend_for(&p.config)?.del(&p.owner, target.as_ref())?;
        Ok(())
    }

    fn gc(&self, call: &Call) -> Result<(), CniError> {
        let p = parse_teardown(call)?;
        let valid = p.conf.valid_attachments.clone().unwrap_or_default();
        backend_for(&p.config)?.gc(&p.conf.name, &valid)?;
        Ok(())
    }

    fn status(&self, call: &Call) -> Result<(), CniError> {
        let p = parse(call)?;
        backend_for(&p.config)?.status()?;
        Ok(())
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
