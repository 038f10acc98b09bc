//! `passthrough`: a minimal chained CNI plugin written against the `cni` crate alone, and the
//! plugin the workspace's conformance suite (`tests/tests/conformance.rs`) runs beside the real
//! ones. It is never installed.
//!
//! It keeps one record per attachment and never touches the container's namespace:
//!
//! - ADD: needs a `prevResult`; records what it says about the attachment (the MAC of the
//!   container interface `CNI_IFNAME`, the addresses) in
//!   `<dataDir>/<network>/<containerID>:<ifname>.json` (default dataDir `/run/cni/passthrough`)
//!   and prints the `prevResult` unchanged, in the config's `cniVersion`.
//! - CHECK: needs a `prevResult`; the record must exist and agree with it.
//! - DEL: removes the record; idempotent, needs neither netns nor `prevResult`.
//! - GC: removes this network's records whose attachment is not in
//!   `cni.dev/valid-attachments`.
//! - STATUS: the data dir must be usable (code 50 otherwise).
//!
//! Records are written to a temporary file and renamed over the old one, so a reader never
//! sees half a record; every change holds an exclusive `flock` on `<dataDir>/.lock` for a
//! bounded time (code 11, "try again later", when it cannot be had).
//!
//! Build and try it (`cargo build -p cni --example passthrough`):
//!
//! ```sh
//! echo '{"cniVersion":"1.1.0","name":"net","type":"passthrough","dataDir":"/tmp/pt",
//!        "prevResult":{"cniVersion":"1.1.0","ips":[{"address":"10.0.0.2/24"}]}}' |
//!   CNI_COMMAND=ADD CNI_CONTAINERID=c1 CNI_NETNS=/run/netns/c1 CNI_IFNAME=eth0 \
//!   target/debug/examples/passthrough
//! ```

#![no_main]

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{ErrorKind, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cni::conf::NetConf;
use cni::error::{CniError, ErrorCode};
use cni::skel::{Call, Plugin};
use cni::types::CniResult;
use cni::{Attachment, version};
use serde::{Deserialize, Serialize};

cni::plugin_main!("passthrough", Passthrough);

/// Where records go when the config has no `dataDir`.
const DEFAULT_DATA_DIR: &str = "/run/cni/passthrough";

/// How long a call waits for another one's lock before it answers code 11.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// The plugin's own keys; `NetConf` decodes them beside the spec's, as Go decodes a plugin's
/// struct that embeds `types.NetConf`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PassthroughConf {
    data_dir: Option<PathBuf>,
}

/// What ADD recorded of one attachment.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Record {
    network: String,
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
    /// The MAC the `prevResult` gives the container interface, if it lists it.
    mac: Option<String>,
    /// Every address of the `prevResult`, as it prints them (`10.0.0.2/24`).
    ips: Vec<String>,
}

impl Record {
    /// What `prev` says about `attachment`.
    fn of(attachment: &Attachment, prev: &CniResult) -> Record {
        let mac = prev
            .interfaces
            .iter()
            .find(|i| i.name == attachment.ifname && i.sandbox.is_some())
            .and_then(|i| i.mac.clone());
        Record {
            network: attachment.network.clone(),
            container_id: attachment.container_id.clone(),
            ifname: attachment.ifname.clone(),
            mac,
            ips: prev.ips.iter().map(|ip| ip.address.to_string()).collect(),
        }
    }

    fn attachment(&self) -> Attachment {
        Attachment::new(&self.network, &self.container_id, &self.ifname)
    }

    /// What CHECK compares, in words.
    fn describe(&self) -> String {
        format!(
            "MAC {}, addresses [{}]",
            self.mac.as_deref().unwrap_or("none"),
            self.ips.join(", ")
        )
    }
}

/// One call's configuration and the directory of its network's records.
struct Setup {
    conf: NetConf<PassthroughConf>,
    data_dir: PathBuf,
}

impl Setup {
    fn load(call: &Call) -> Result<Setup, CniError> {
        let conf: NetConf<PassthroughConf> = call.conf()?;
        let data_dir = conf
            .plugin
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        Ok(Setup { conf, data_dir })
    }

    /// The skel has checked the network name, container ID and interface name: none holds a
    /// `/`, container IDs and network names hold no `:`, so the path is the attachment's own.
    fn network_dir(&self) -> PathBuf {
        self.data_dir.join(&self.conf.name)
    }

    fn record_path(&self, call: &Call) -> PathBuf {
        self.network_dir()
            .join(format!("{}:{}.json", call.container_id, call.ifname))
    }

    fn attachment(&self, call: &Call) -> Attachment {
        Attachment::new(&self.conf.name, &call.container_id, &call.ifname)
    }

    fn require_prev_result(&self) -> Result<CniResult, CniError> {
        self.conf.prev_result()?.ok_or_else(|| {
            CniError::invalid_config("must be called as a chained plugin: prevResult is missing")
        })
    }

    /// An exclusive lock on the data dir, held until the returned file is dropped.
    fn lock(&self) -> Result<File, CniError> {
        std::fs::create_dir_all(&self.data_dir)
            .map_err(|e| io_error("create", &self.data_dir, &e))?;
        let path = self.data_dir.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_error("open", &path, &e))?;
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(CniError::new(
                        ErrorCode::TryAgainLater,
                        format!("{} is locked by another call", path.display()),
                    ));
                }
                Err(TryLockError::Error(e)) => return Err(io_error("lock", &path, &e)),
            }
        }
    }
}

/// Code 5 naming what failed on which path; the system's words in the details.
fn io_error(what: &str, path: &Path, e: &std::io::Error) -> CniError {
    CniError::new(
        ErrorCode::Io,
        format!("failed to {what} {}", path.display()),
    )
    .with_details(e.to_string())
}

/// The record at `path`, `None` when there is none.
fn read_record(path: &Path) -> Result<Option<Record>, CniError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("read", path, &e)),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        CniError::internal(format!("record {} is corrupt", path.display()))
            .with_details(e.to_string())
    })
}

/// Writes `record` to `path` whole or not at all: a temporary file beside it, flushed to disk,
/// renamed over it.
fn write_record(path: &Path, record: &Record) -> Result<(), CniError> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, &e))?;
    let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
    let bytes = serde_json::to_vec(record).map_err(|e| {
        CniError::internal("failed to encode the record").with_details(e.to_string())
    })?;
    let written = File::create(&tmp).and_then(|mut f| {
        f.write_all(&bytes)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_error("write", path, &e));
    }
    Ok(())
}

/// Removes `path`; a missing file is already removed.
fn remove_record(path: &Path) -> Result<(), CniError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(io_error("remove", path, &e)),
        _ => Ok(()),
    }
}

struct Passthrough;

impl Plugin for Passthrough {
    fn name(&self) -> &'static str {
        "passthrough"
    }

    fn supported_versions(&self) -> &'static [&'static str] {
        version::ALL
    }

    /// The skel then never looks at `CNI_NETNS` beyond its presence.
    fn uses_netns(&self) -> bool {
        false
    }

    fn add(&self, call: &Call) -> Result<CniResult, CniError> {
        let setup = Setup::load(call)?;
        let prev = setup.require_prev_result()?;
        let record = Record::of(&setup.attachment(call), &prev);
        let _lock = setup.lock()?;
        write_record(&setup.record_path(call), &record)?;
        Ok(prev)
    }

    fn check(&self, call: &Call) -> Result<(), CniError> {
        let setup = Setup::load(call)?;
        let prev = setup.require_prev_result()?;
        let path = setup.record_path(call);
        let recorded = read_record(&path)?.ok_or_else(|| {
            CniError::internal(format!(
                "no record of this attachment at {}",
                path.display()
            ))
        })?;
        let now = Record::of(&setup.attachment(call), &prev);
        if now != recorded {
            let details = format!(
                "recorded {}; the prevResult gives {}",
                recorded.describe(),
                now.describe()
            );
            let msg = "prevResult differs from what ADD recorded";
            return Err(CniError::internal(msg).with_details(details));
        }
        Ok(())
    }

    fn del(&self, call: &Call) -> Result<(), CniError> {
        let setup = Setup::load(call)?;
        let _lock = setup.lock()?;
        remove_record(&setup.record_path(call))
    }

    fn gc(&self, call: &Call) -> Result<(), CniError> {
        let setup = Setup::load(call)?;
        let valid = setup.conf.valid_attachments.clone().unwrap_or_default();
        let _lock = setup.lock()?;
        let dir = setup.network_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error("list", &dir, &e)),
        };
        for entry in entries {
            let path = entry.map_err(|e| io_error("list", &dir, &e))?.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            // Only records of this network that parse are ours to judge.
            let Ok(Some(record)) = read_record(&path) else {
                continue;
            };
            if record.network == setup.conf.name && !record.attachment().is_among(&valid) {
                remove_record(&path)?;
            }
        }
        Ok(())
    }

    fn status(&self, call: &Call) -> Result<(), CniError> {
        let setup = Setup::load(call)?;
        setup.lock().map(drop).map_err(|e| {
            CniError::new(
                ErrorCode::PluginNotAvailable,
                format!("data dir {} is not usable", setup.data_dir.display()),
            )
            .with_details(e.to_string())
        })
    }
}
