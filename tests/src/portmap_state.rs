//! The portmap plugin's records of a host namespace's attachments and its host-port index
//! (`/run/cni/portmap/net-<netns inode>/`), for the reconcile and watcher tests.

use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::TestNetns;

/// The state directory of `host`.
///
/// # Errors
/// When `host`'s namespace file cannot be read.
pub fn dir(host: &TestNetns) -> Result<PathBuf> {
    let ino = std::fs::metadata(host.path())?.ino();
    Ok(PathBuf::from(format!("/run/cni/portmap/net-{ino}")))
}

/// The entries of `host`'s state directory that `keep` accepts, sorted; none when nothing was
/// ever recorded.
fn entries(host: &TestNetns, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir(host)?)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| keep(n))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    Ok(names)
}

/// The records of `host`'s attachments (their file names; the index entries aside).
///
/// # Errors
/// When `host`'s namespace file cannot be read.
pub fn records(host: &TestNetns) -> Result<Vec<String>> {
    entries(host, |n| !n.starts_with('.'))
}

/// The host-port index entries of `host` (`.port-v4-tcp-8080`…).
///
/// # Errors
/// When `host`'s namespace file cannot be read.
pub fn index(host: &TestNetns) -> Result<Vec<String>> {
    entries(host, |n| n.starts_with(".port-"))
}

/// Waits (up to 20 s) until `host` gives the namespace of container `id`'s attachment no id
/// any more: the kernel has destroyed it, and a reconcile proves it gone.
///
/// # Errors
/// When no record names the container, it holds no namespace id, or the id stays.
pub fn wait_destroyed(host: &TestNetns, id: &str) -> Result<()> {
    let dir = dir(host)?;
    let record = records(host)?
        .iter()
        .filter_map(|n| std::fs::read_to_string(dir.join(n)).ok())
        .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
        .find(|r| r["containerID"] == id)
        .with_context(|| format!("no record of {id} in {}", dir.display()))?;
    let nsid = record["netns"]["nsid"]
        .as_i64()
        .with_context(|| format!("the record of {id} has no namespace id: {record}"))?;
    crate::netns::wait_id_gone(host, nsid)
}
