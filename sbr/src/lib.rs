//! `sbr`: source-based routing for one container interface, a drop-in replacement for the CNI
//! reference `sbr` plugin. Chained after a main plugin, it makes traffic from each of the
//! interface's addresses leave through that interface, whatever the main table says.
//!
//! - **ADD** (inside `CNI_NETNS`, under a lock on the namespace): for each prevResult address of
//!   `CNI_IFNAME`, a table (the first free from 100, or the configured `table`) and a rule
//!   `ip rule add from <ip>/32|/128 lookup <table>`; without `table` the interface's main-table
//!   routes move into it (`ip route replace … table <table>`, then `ip route del …`), plus
//!   `default via <gateway>` (`gateways` or the prevResult's). `addSourceHints` keeps
//!   `<subnet> dev <if> src <ip> scope link` in main. Prints the prevResult. Rolls back on failure.
//! - **CHECK**: every rule, the address and the table's default route (or a route through the
//!   interface) are there; with `table`, also the prevResult routes naming it.
//! - **DEL**: removes the rules of the interface's addresses and the tables only they used,
//!   putting the interface's routes back in main; succeeds when the namespace is gone.
//! - **STATUS** is always ready; **GC** has nothing to collect (everything lives in the
//!   container's namespace and goes with it).
//!
//! Kernel objects: policy rules (`ip rule`), routes in tables ≥ 100 and in main (`ip route`).
//! See `sbr/README.md` for the configuration and every difference from the Go plugin.

pub mod apply;
pub mod config;
pub mod error;
pub mod names;
pub mod plan;

use cni::conf::NetConf;
use cni::error::CniError;
use cni::skel::{Call, Plugin};
use cni::types::CniResult;
use host::netns::NetNs;

use crate::config::{Config, DelKeys, SbrKeys, select_ips};
use crate::error::SbrError;

/// The versions the reference lists (`version.All`).
pub const SUPPORTED_VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The sbr plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sbr;

/// The configuration with the plugin's keys, a decode failure in the reference's words.
fn load_conf<T: serde::de::DeserializeOwned>(call: &Call) -> Result<NetConf<T>, CniError> {
    call.conf()
        .map_err(|e| e.with_decode_lead("failed to parse network configuration"))
}

/// ADD's and CHECK's inputs, checked in the reference's order: the prevResult and its
/// addresses first, then the plugin's keys (which it validates only once in the namespace).
fn load(call: &Call) -> Result<(Config, CniResult, Vec<cni::types::IpConfig>), CniError> {
    let conf: NetConf<SbrKeys> = load_conf(call)?;
    let prev = conf.prev_result()?.ok_or(SbrError::NotChained)?;
    let ips = select_ips(&prev, &call.ifname)?;
    let config = Config::from_keys(&conf.plugin)?;
    Ok((config, prev, ips))
}

impl Plugin for Sbr {
    fn name(&self) -> &'static str {
        "sbr"
    }

    fn supported_versions(&self) -> &'static [&'static str] {
        SUPPORTED_VERSIONS
    }

    fn add(&self, call: &Call) -> Result<CniResult, CniError> {
        let (config, prev, ips) = load(call)?;
        let ns = NetNs::open(call.netns_path()?).map_err(SbrError::Netns)?;
        apply::add(&ns, &call.ifname, &config, &ips, &prev.routes)?;
        Ok(prev)
    }

    fn check(&self, call: &Call) -> Result<(), CniError> {
        let (config, prev, ips) = load(call)?;
        let ns = NetNs::open(call.netns_path()?).map_err(SbrError::Netns)?;
        Ok(apply::check(
            &ns,
            &call.ifname,
            &config,
            &ips,
            &prev.routes,
        )?)
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        // Only `table`: `gateways` and `addSourceHints` change nothing DEL does, and a
        // `table` ADD would refuse (254) is still where the reference's ADD put rules.
        let conf: NetConf<DelKeys> = load_conf(call)?;
        let table = match conf.plugin.table.map(u32::try_from) {
            None => None,
            Some(Ok(table)) => Some(table),
            Some(Err(_)) => {
                log::info!(
                    "table {:?} names no routing table: nothing to remove",
                    conf.plugin.table
                );
                return Ok(());
            }
        };
        // DEL must get through: a prevResult that does not parse only costs its addresses;
        // the interface's own addresses still find the rules.
        let prev_ips = match conf.prev_result() {
            Ok(Some(prev)) => select_ips(&prev, &call.ifname)
                .unwrap_or_default()
                .into_iter()
                .map(|ip| ip.address.addr())
                .collect(),
            Ok(None) => Vec::new(),
            Err(e) => {
                log::warn!("ignoring prevResult on DEL: {e}");
                Vec::new()
            }
        };
        Ok(apply::del(
            call.netns.as_deref(),
            &call.ifname,
            table,
            &prev_ips,
        )?)
    }
}
