//! The firewall plugin's records of a host namespace's attachments
//! (`/run/cni-firewall/<netns inode>/attachments/`), for the reconcile and watcher tests.

use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::{NetworkConfigList, TestNetns, main_plugin};

/// The directory of `host`'s records.
fn dir(host: &TestNetns) -> Result<PathBuf> {
    let ino = std::fs::metadata(host.path())?.ino();
    Ok(PathBuf::from(format!(
        "/run/cni-firewall/{ino}/attachments"
    )))
}

/// The records of the attachments of `host` (their file names: `network:container:ifname`),
/// sorted; none when nothing was ever recorded.
///
/// # Errors
/// When `host`'s namespace file cannot be read.
pub fn records(host: &TestNetns) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir(host)?)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    Ok(names)
}

/// Waits (up to 20 s) until `host` gives the namespace of the attachment recorded as
/// `record` no id any more: the kernel has destroyed it, and a reconcile proves it gone.
///
/// # Errors
/// When the record holds no namespace id, or the id stays.
pub fn wait_destroyed(host: &TestNetns, record: &str) -> Result<()> {
    let path = dir(host)?.join(record);
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let nsid = serde_json::from_str::<Value>(&text)?["made"]["netns"]["nsid"]
        .as_i64()
        .with_context(|| format!("{} records no namespace id: {text}", path.display()))?;
    crate::netns::wait_id_gone(host, nsid)
}

/// The conflist of the reconcile and watcher tests: Debian's Go `bridge` on `bridge` with
/// `host-local` over `subnets` (leases in `dir`), then our `firewall` with `backend` and
/// `ingressPolicy: same-bridge`.
pub fn same_bridge_conflist(
    network: &str,
    bridge: &str,
    subnets: &[&str],
    dir: &std::path::Path,
    backend: &str,
) -> NetworkConfigList {
    NetworkConfigList::new(
        network,
        "1.0.0",
        vec![
            main_plugin::bridge(bridge, subnets, dir),
            serde_json::json!({ "type": "firewall", "backend": backend, "ingressPolicy": "same-bridge" }),
        ],
    )
}
