//! The per-attachment state file: what ADD programmed, so DEL works without `runtimeConfig`
//! or `prevResult` and without listing whole maps.
//!
//! Files live under `/run/cni/portmap/net-<inode>/` (tmpfs: gone on reboot, like the kernel
//! state they describe), one directory per network namespace the plugin runs in.

use std::os::unix::fs::MetadataExt;

use common::store::StateStore;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::config::{
    Backend, BackendChoice, Conditions, Config, DEFAULT_MARK_MASQ_BIT, IpFamily, NftCondition,
    PortMapping,
};
use crate::error::PortmapError;
use crate::names;
use crate::plan::Attachment;

/// What ADD recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// The backend that programmed the attachment.
    pub backend: Backend,
    /// Network name.
    pub network: String,
    /// Container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
    /// The container addresses mapped to.
    pub ips: Vec<IpNet>,
    /// The mappings.
    pub mappings: Vec<PortMapping>,
    /// `snat`.
    pub snat: bool,
    /// `masqAll`.
    #[serde(rename = "masqAll")]
    pub masq_all: bool,
    /// nftables `conditionsV4`.
    #[serde(rename = "conditionsV4", default)]
    pub conditions_v4: Vec<NftCondition>,
    /// nftables `conditionsV6`.
    #[serde(rename = "conditionsV6", default)]
    pub conditions_v6: Vec<NftCondition>,
}

impl State {
    /// The record of an ADD.
    pub fn new(backend: Backend, config: &Config, att: &Attachment, ips: &[IpNet]) -> State {
        let nft = |c: &Conditions| match c {
            Conditions::Nftables(v) => v.clone(),
            _ => Vec::new(),
        };
        State {
            backend,
            network: att.network.clone(),
            container_id: att.container_id.clone(),
            ifname: att.ifname.clone(),
            ips: ips.to_vec(),
            mappings: config.mappings.clone(),
            snat: config.snat,
            masq_all: config.masq_all,
            conditions_v4: nft(&config.conditions_v4),
            conditions_v6: nft(&config.conditions_v6),
        }
    }

    /// The configuration the record was made with, as far as removing it needs: the
    /// mappings, `snat`, `masqAll` and the nftables conditions (a DEL is planned from the
    /// record alone, whatever the DEL's own config says).
    pub fn config(&self) -> Config {
        let conditions = |c: &[NftCondition]| {
            if c.is_empty() {
                Conditions::None
            } else {
                Conditions::Nftables(c.to_vec())
            }
        };
        Config {
            network: self.network.clone(),
            backend: BackendChoice::Fixed(self.backend),
            snat: self.snat,
            masq_all: self.masq_all,
            mark_masq_bit: DEFAULT_MARK_MASQ_BIT,
            external_set_mark_chain: None,
            conditions_v4: conditions(&self.conditions_v4),
            conditions_v6: conditions(&self.conditions_v6),
            mappings: self.mappings.clone(),
        }
    }

    /// The families of the recorded container addresses.
    pub fn families(&self) -> Vec<IpFamily> {
        self.ips.iter().map(|ip| IpFamily::of(ip.addr())).collect()
    }

    /// The attachment it belongs to.
    pub fn attachment(&self) -> Attachment {
        Attachment {
            network: self.network.clone(),
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone(),
        }
    }
}

/// What an attachment's state file gave.
#[derive(Debug)]
pub enum Record {
    /// No file.
    Absent,
    /// The record.
    Found(State),
    /// A file that did not parse (empty, truncated by a crash, garbage): it was logged and
    /// removed, and the attachment's objects must be found from the kernel's owner comments.
    Discarded,
}

impl Record {
    /// The record, if there was a valid one.
    pub fn found(self) -> Option<State> {
        match self {
            Record::Found(s) => Some(s),
            Record::Absent | Record::Discarded => None,
        }
    }
}

/// Reads the state file `name`: a file that does not parse counts as absent (it would
/// otherwise fail every DEL and re-ADD of the attachment for good), and is removed.
///
/// # Errors
/// When the file exists but cannot be read.
pub fn read(store: &StateStore, name: &str) -> Result<Record, PortmapError> {
    match store.read::<State>(name) {
        Ok(Some(s)) => Ok(Record::Found(s)),
        Ok(None) => Ok(Record::Absent),
        Err(common::store::StoreError::Corrupt { path, source }) => {
            log::warn!(
                "state file {} does not parse ({source}): treated as absent and removed",
                path.display()
            );
            if let Err(e) = store.remove(name) {
                log::warn!("failed to remove {}: {e}", path.display());
            }
            Ok(Record::Discarded)
        }
        Err(e) => Err(PortmapError::Store(e)),
    }
}

/// The store of the namespace this process runs in.
///
/// # Errors
/// When the namespace cannot be identified.
pub fn store() -> Result<StateStore, PortmapError> {
    let ino = std::fs::metadata("/proc/self/ns/net")
        .map_err(|e| {
            PortmapError::Store(common::store::StoreError::Io {
                op: "identify the network namespace of",
                path: "/proc/self/ns/net".into(),
                source: e,
            })
        })?
        .ino();
    Ok(StateStore::new(
        std::path::Path::new(names::STATE_DIR).join(format!("net-{ino}")),
    ))
}

/// The file name of an attachment's state.
pub fn file(att: &Attachment) -> String {
    names::state_file(&att.network, &att.container_id, &att.ifname)
}

/// Writes `state` to `name`, atomically (a temporary file renamed over it) but without
/// `fsync`: the file describes kernel objects that a crash or reboot removes as well, so
/// making it durable buys nothing and costs a disk flush where `/run` is not a tmpfs. A
/// concurrent DEL may remove the (then empty) directory between its creation and the write,
/// so a vanished directory is retried a few times.
///
/// # Errors
/// The store's failure.
pub fn write(store: &StateStore, name: &str, state: &State) -> Result<(), PortmapError> {
    let path = store.path(name).map_err(PortmapError::Store)?;
    let bytes = serde_json::to_vec_pretty(state).map_err(|source| {
        PortmapError::Store(common::store::StoreError::Corrupt {
            path: path.clone(),
            source,
        })
    })?;
    let tmp = store.temp_path(name).map_err(PortmapError::Store)?;
    let mut tries = 0;
    loop {
        let result = std::fs::create_dir_all(store.dir())
            .and_then(|()| std::fs::write(&tmp, &bytes))
            .and_then(|()| std::fs::rename(&tmp, &path));
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 3 => tries += 1,
            Err(source) => {
                let _ = std::fs::remove_file(&tmp);
                // The directory this write may have created must not outlive the failed ADD.
                prune(store);
                return Err(PortmapError::Store(common::store::StoreError::Io {
                    op: "write",
                    path,
                    source,
                }));
            }
        }
    }
}

/// Removes the store's directory once it holds no state, so namespaces that come and go leave
/// nothing under `/run/cni/portmap`. A directory that is not empty (a concurrent ADD wrote to
/// it) or already gone is left as it is.
pub fn prune(store: &StateStore) {
    match std::fs::remove_dir(store.dir()) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTEMPTY | libc::EEXIST | libc::ENOENT)
            ) => {}
        Err(e) => log::debug!("failed to remove {}: {e}", store.dir().display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_prune_removes_only_an_empty_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::new(tmp.path().join("net-1"));
        store.write("a.json", &1).unwrap();
        let att = Attachment {
            network: "n".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
        };
        let config = crate::config::Config {
            network: "n".into(),
            backend: crate::config::BackendChoice::Auto,
            snat: true,
            masq_all: false,
            mark_masq_bit: 13,
            external_set_mark_chain: None,
            conditions_v4: Conditions::None,
            conditions_v6: Conditions::None,
            mappings: Vec::new(),
        };
        let st = State::new(Backend::Nftables, &config, &att, &[]);
        write(&store, "b.json", &st).unwrap();
        assert_eq!(store.read::<State>("b.json").unwrap(), Some(st));
        assert_eq!(store.list().unwrap(), ["a.json", "b.json"]);
        store.remove("b.json").unwrap();
        prune(&store);
        assert!(store.dir().exists(), "a directory with state must stay");
        store.remove("a.json").unwrap();
        prune(&store);
        assert!(!store.dir().exists());
        prune(&store);
    }

    #[test]
    fn a_failed_write_leaves_no_directory_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::new(tmp.path().join("net-1"));
        let att = Attachment {
            network: "n".into(),
            container_id: "c".repeat(300),
            ifname: "eth0".into(),
        };
        let config = crate::config::Config {
            network: "n".into(),
            backend: crate::config::BackendChoice::Auto,
            snat: true,
            masq_all: false,
            mark_masq_bit: 13,
            external_set_mark_chain: None,
            conditions_v4: Conditions::None,
            conditions_v6: Conditions::None,
            mappings: Vec::new(),
        };
        let st = State::new(Backend::Nftables, &config, &att, &[]);
        // Longer than a file name may be (NAME_MAX, 255 bytes).
        let err = write(&store, &file(&att), &st).unwrap_err();
        assert!(err.to_string().contains("failed to write"), "{err}");
        assert!(
            !store.dir().exists(),
            "{} left behind",
            store.dir().display()
        );
    }
}
