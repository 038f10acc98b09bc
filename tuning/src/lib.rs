//! `tuning`: a chained CNI plugin that sets sysctls and link attributes of the container
//! interface, and puts them back on DEL. A drop-in replacement for the reference Go plugin; see
//! `tuning/README.md` for the config table and every difference.
//!
//! - **ADD** (inside `CNI_NETNS`): reads the live values, saves them to
//!   `<dataDir>/<containerID>_<ifname>.json` (the Go plugin's file, which either binary can
//!   restore), writes the sysctls (`sysctl -w net.ipv4.conf.eth0.rp_filter=2`) and changes the
//!   link in one netlink request (`ip link set dev eth0 address … mtu … promisc on allmulticast
//!   on txqueuelen …`). A failure rolls back what was changed. The result is the prevResult with
//!   the new MAC on the container interface.
//! - **CHECK**: every configured sysctl and attribute must still have its configured value.
//! - **DEL**: restores link attributes and sysctls from the backup and removes it; succeeds when
//!   the netns, the interface or the file is gone.
//! - **STATUS**: the data dir must be usable. **GC**: removes this network's backups of
//!   attachments no longer valid.
//!
//! Flow per verb: [`config`] (pure: keys, sources, validation) → [`plan`] (pure: what to change,
//! save, compare, restore) → [`apply`] (netlink, `/proc/sys/net`, the backup file).

pub mod apply;
pub mod backup;
pub mod config;
pub mod error;
pub mod names;
pub mod plan;

use cni::conf::NetConf;
use cni::error::{CniError, ErrorCode};
use cni::skel::{Call, Plugin};
use cni::types::CniResult;
use host::netns::NetNs;

use crate::backup::BackupStore;
use crate::config::{Allowlist, Config, DataDirKeys, TuningKeys};
use crate::error::TuningError;
use cni::Attachment;

/// The tuning plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tuning;

fn attachment(network: &str, call: &Call) -> Attachment {
    Attachment::new(network, &call.container_id, &call.ifname)
}

/// The configuration with the plugin's keys, a decode failure in the reference's words.
fn load_netconf<T: serde::de::DeserializeOwned>(call: &Call) -> Result<NetConf<T>, CniError> {
    call.conf()
        .map_err(|e| e.with_decode_lead("failed to load netconf"))
}

/// ADD and CHECK refuse a top-level `sysctl` object naming a key twice before anything else, as
/// the reference does.
fn refuse_duplicate_sysctl_keys(call: &Call) -> Result<(), TuningError> {
    match config::duplicate_sysctl_key(call.config.as_bytes()) {
        Some(key) => Err(TuningError::DuplicateSysctlKey { key }),
        None => Ok(()),
    }
}

impl Plugin for Tuning {
    fn name(&self) -> &'static str {
        "tuning"
    }

    fn supported_versions(&self) -> &'static [&'static str] {
        cni::version::ALL
    }

    fn add(&self, call: &Call) -> Result<CniResult, CniError> {
        refuse_duplicate_sysctl_keys(call)?;
        let conf: NetConf<TuningKeys> = load_netconf(call)?;
        let config = Config::load(&conf, &call.cni_args()?, &call.ifname)?;
        if let Some(allowlist) = Allowlist::load()? {
            allowlist.check(&config)?;
        }
        let mut result = conf.prev_result()?.ok_or(TuningError::MissingPrevResult)?;
        // Opened also with nothing to set, as the reference enters it whatever it sets: a
        // `CNI_NETNS` that is no namespace fails the same way.
        let ns = NetNs::open(call.netns_path()?).map_err(TuningError::Netns)?;
        if !config.is_empty() {
            let store = BackupStore::new(&config.data_dir);
            apply::add(&ns, &config, &attachment(&conf.name, call), &store)?;
        }
        if let Some(mac) = &config.mac {
            for iface in result
                .interfaces
                .iter_mut()
                .filter(|i| i.name == call.ifname)
            {
                iface.mac = Some(mac.text.clone());
            }
        }
        Ok(result)
    }

    fn check(&self, call: &Call) -> Result<(), CniError> {
        refuse_duplicate_sysctl_keys(call)?;
        let conf: NetConf<TuningKeys> = load_netconf(call)?;
        let config = Config::load(&conf, &call.cni_args()?, &call.ifname)?;
        conf.prev_result()?.ok_or(TuningError::MissingPrevResult)?;
        if config.is_empty() {
            return Ok(());
        }
        apply::check(
            &NetNs::open(call.netns_path()?).map_err(TuningError::Netns)?,
            &config,
            &call.ifname,
        )?;
        Ok(())
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        // No duplicate-key check: the reference's DEL does not make it either.
        let conf: NetConf<DataDirKeys> = load_netconf(call)?;
        let store = BackupStore::new(conf.plugin.dir());
        if !store.may_hold(&call.container_id, &call.ifname) {
            return Ok(());
        }
        let ns = match &call.netns {
            None => None,
            Some(path) => match NetNs::open(path) {
                Ok(ns) => Some(ns),
                // Gone, left behind as a plain file, or no network namespace at all
                // (`/proc/self/status`, a path with a trailing slash): nothing to restore in it.
                Err(e) if e.is_absent() => None,
                Err(e) => return Err(TuningError::Netns(e).into()),
            },
        };
        apply::del(ns.as_ref(), &attachment(&conf.name, call), &store)?;
        Ok(())
    }

    fn status(&self, call: &Call) -> Result<(), CniError> {
        let conf: NetConf<DataDirKeys> = call.conf()?;
        let store = BackupStore::new(conf.plugin.dir());
        store.lock().map(drop).map_err(|e| {
            CniError::new(
                ErrorCode::PluginNotAvailable,
                format!("tuning data dir {:?} is not usable", store.dir()),
            )
            .with_details(e.to_string())
        })
    }

    fn gc(&self, call: &Call) -> Result<(), CniError> {
        let conf: NetConf<DataDirKeys> = call.conf()?;
        let store = BackupStore::new(conf.plugin.dir());
        let files = store.files()?;
        if files.is_empty() {
            return Ok(());
        }
        let valid = conf.valid_attachments.clone().unwrap_or_default();
        let _lock = store.lock()?;
        let mut errors = Vec::new();
        for name in files {
            // Only files of this network, which only we record, are ours to judge; the Go
            // plugin's files carry no network name and are left for DEL.
            let backup = match store.read(&name) {
                Ok(Some(b)) if b.network.as_deref() == Some(conf.name.as_str()) => b,
                Ok(_) => continue,
                Err(e) => {
                    log::warn!("GC skips {name}: {e}");
                    continue;
                }
            };
            let (Some(container_id), Some(ifname)) = (backup.container_id, backup.ifname) else {
                continue;
            };
            let live = valid
                .iter()
                .any(|a| a.container_id == container_id && a.ifname == ifname);
            if !live {
                log::debug!("GC removes {}", store.path(&name).display());
                if let Err(e) = store.remove(&name) {
                    errors.push(e.to_string());
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CniError::new(ErrorCode::Io, errors.join("; ")))
        }
    }
}
