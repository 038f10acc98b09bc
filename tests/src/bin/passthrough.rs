//! `passthrough`: a minimal chained plugin that exists only to exercise `common` and the harness
//! before the real plugins land. It is never installed.
//!
//! - ADD: needs a prevResult; looks up `CNI_IFNAME` inside `CNI_NETNS` over netlink and records
//!   `{network, containerID, ifname, mac}` in `<dataDir>/<network>_<containerID>_<ifname>.json`
//!   (default dataDir `/run/cni/passthrough`), under a lock; prints the prevResult unchanged.
//! - CHECK: needs a prevResult; the record must exist and the interface must still have the
//!   recorded MAC.
//! - DEL: removes the record; idempotent, needs neither netns nor prevResult.
//! - GC: removes this network's records whose attachment is not in `cni.dev/valid-attachments`.
//! - STATUS: the data dir must be usable (code 50 otherwise).

use std::path::PathBuf;
use std::process::ExitCode;

use cni::conf::NetConf;
use cni::error::{CniError, ErrorCode};
use cni::skel::{self, Call, Plugin};
use cni::types::CniResult;
use host::lock::{DEFAULT_WAIT, FileLock};
use host::netns::NetNs;
use host::store::StateStore;
use netlink::Netlink;
use serde::{Deserialize, Serialize};

const DEFAULT_DATA_DIR: &str = "/run/cni/passthrough";

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PassthroughConf {
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Record {
    network: String,
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
    mac: Option<String>,
}

fn record_name(network: &str, container_id: &str, ifname: &str) -> String {
    format!("{network}_{container_id}_{ifname}.json")
}

struct Setup {
    conf: NetConf<PassthroughConf>,
    store: StateStore,
}

impl Setup {
    fn load(call: &Call) -> Result<Setup, CniError> {
        let conf: NetConf<PassthroughConf> = call.conf()?;
        let dir = conf
            .plugin
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        Ok(Setup {
            conf,
            store: StateStore::new(dir),
        })
    }

    fn lock(&self) -> Result<FileLock, CniError> {
        FileLock::acquire(self.store.dir().join(".lock"), DEFAULT_WAIT)
            .map_err(|e| CniError::from_error(ErrorCode::TryAgainLater, &e))
    }

    fn record(&self, call: &Call) -> String {
        record_name(&self.conf.name, &call.container_id, &call.ifname)
    }

    fn require_prev_result(&self) -> Result<CniResult, CniError> {
        self.conf.prev_result()?.ok_or_else(|| {
            CniError::invalid_config("must be called as a chained plugin: prevResult is missing")
        })
    }
}

fn store_error(e: host::store::StoreError) -> CniError {
    CniError::from_error(ErrorCode::Io, &e)
}

fn container_mac(call: &Call) -> Result<Option<String>, CniError> {
    let ns = NetNs::open(call.netns_path()?).map_err(|e| {
        CniError::from_error(ErrorCode::InvalidNetns, &e).reworded_as(e.reference_msg())
    })?;
    let mut nl =
        Netlink::open_in(&ns).map_err(|e| CniError::from_error(ErrorCode::Internal, &e))?;
    let link = nl.link_by_name(&call.ifname).map_err(|e| {
        let code = if e.is_not_found() {
            ErrorCode::UnknownContainer
        } else {
            ErrorCode::Internal
        };
        CniError::from_error(code, &e)
    })?;
    Ok(link.mac_string())
}

struct Passthrough;

impl Plugin for Passthrough {
    fn name(&self) -> &'static str {
        "passthrough"
    }

    fn supported_versions(&self) -> &'static [&'static str] {
        cni::version::ALL
    }

    fn add(&self, call: &Call) -> Result<CniResult, CniError> {
        let setup = Setup::load(call)?;
        let prev = setup.require_prev_result()?;
        let mac = container_mac(call)?;
        let _lock = setup.lock()?;
        let record = Record {
            network: setup.conf.name.clone(),
            container_id: call.container_id.clone(),
            ifname: call.ifname.clone(),
            mac,
        };
        setup
            .store
            .write(&setup.record(call), &record)
            .map_err(store_error)?;
        Ok(prev)
    }

    fn check(&self, call: &Call) -> Result<(), CniError> {
        let setup = Setup::load(call)?;
        setup.require_prev_result()?;
        let name = setup.record(call);
        let record: Record = setup
            .store
            .read(&name)
            .map_err(store_error)?
            .ok_or_else(|| CniError::internal(format!("record {name} is missing")))?;
        let mac = container_mac(call)?;
        if mac != record.mac {
            return Err(CniError::internal(format!(
                "interface {} has MAC {mac:?}, recorded {:?}",
                call.ifname, record.mac
            )));
        }
        Ok(())
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        let setup = Setup::load(call)?;
        let _lock = setup.lock()?;
        setup
            .store
            .remove(&setup.record(call))
            .map_err(store_error)?;
        Ok(())
    }

    fn gc(&self, call: &Call) -> Result<(), CniError> {
        let setup = Setup::load(call)?;
        let valid = setup.conf.valid_attachments.clone().unwrap_or_default();
        let _lock = setup.lock()?;
        let keep: Vec<String> = valid
            .iter()
            .map(|a| record_name(&setup.conf.name, &a.container_id, &a.ifname))
            .collect();
        let prefix = format!("{}_", setup.conf.name);
        for name in setup.store.list().map_err(store_error)? {
            if name.starts_with(&prefix) && !keep.contains(&name) {
                // Only records of this network, written by us, are ours to remove.
                let ours: Option<Record> = setup.store.read(&name).ok().flatten();
                if ours.is_some_and(|r| r.network == setup.conf.name) {
                    setup.store.remove(&name).map_err(store_error)?;
                }
            }
        }
        Ok(())
    }

    fn status(&self, call: &Call) -> Result<(), CniError> {
        let setup = Setup::load(call)?;
        setup.lock().map(drop).map_err(|e| {
            CniError::new(
                ErrorCode::PluginNotAvailable,
                format!("data dir {:?} is not usable", setup.store.dir()),
            )
            .with_details(e.msg)
        })
    }
}

fn main() -> ExitCode {
    cni::logging::init("passthrough");
    skel::run(&Passthrough)
}
