//! Backup files: the original values ADD replaced, which DEL puts back.
//!
//! The file is `<dataDir>/<containerID>_<ifname>.json`, as the Go plugin names it, and holds the
//! Go plugin's keys (`mac`, `promisc`, `mtu`, `allmulti`, `txQLen`, each present only when ADD
//! changed it) so either binary restores the other's file. Go ignores keys it does not know, so
//! ours ride along: `sysctls` (the original values, in the order they were set), `network`,
//! `containerID` and `ifname` (for GC, since `_` may appear in both a container ID and an
//! interface name).
//!
//! Writes are atomic (temporary file, then rename) but not fsynced: the file describes kernel
//! state that does not survive a reboot, so durability buys nothing, and `/run` is a tmpfs.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use common::lock::{DEFAULT_WAIT, FileLock};
use serde::{Deserialize, Serialize};

use crate::error::TuningError;
use crate::names::{LOCK_FILE, backup_file_name};

/// One sysctl's value before ADD changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedSysctl {
    /// The path under `/proc/sys` (`net/ipv4/conf/eth0/rp_filter`).
    pub key: String,
    /// The value read before the first write.
    pub value: String,
}

/// The contents of a backup file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Backup {
    /// Original hardware address, lower-case.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Original promiscuous mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promisc: Option<bool>,
    /// Original MTU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Original all-multicast mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allmulti: Option<bool>,
    /// Original transmit queue length.
    #[serde(rename = "txQLen", skip_serializing_if = "Option::is_none")]
    pub txqlen: Option<u32>,
    /// Original sysctl values, in the order ADD set them (ours only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sysctls: Vec<SavedSysctl>,
    /// The network name (ours only; absent in the Go plugin's files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The container ID (ours only).
    #[serde(rename = "containerID", skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The interface name (ours only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
}

impl Backup {
    /// True when there is nothing to restore.
    pub fn is_empty(&self) -> bool {
        self.mac.is_none()
            && self.promisc.is_none()
            && self.mtu.is_none()
            && self.allmulti.is_none()
            && self.txqlen.is_none()
            && self.sysctls.is_empty()
    }

    /// The file's bytes: JSON indented by one space, like the Go plugin's.
    ///
    /// # Errors
    /// Never in practice (the type always serialises); kept as a result for the serializer.
    pub fn to_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(b" ");
        let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
        self.serialize(&mut ser)?;
        Ok(out)
    }

    /// Parses a file written by either plugin (keys matched case-insensitively, as Go reads).
    ///
    /// # Errors
    /// A message when the bytes are not a backup object.
    pub fn from_bytes(bytes: &[u8]) -> Result<Backup, String> {
        common::decode::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// The data dir: backup files plus the lock that serialises their read-modify-write.
#[derive(Debug, Clone)]
pub struct BackupStore {
    dir: PathBuf,
}

impl BackupStore {
    /// The store in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> BackupStore {
        BackupStore { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The backup file of an attachment.
    pub fn path(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.dir.join(backup_file_name(container_id, ifname))
    }

    /// Takes the data dir's lock (creating the directory), held until dropped.
    ///
    /// # Errors
    /// [`TuningError::Lock`] when it cannot be created or stays contended.
    pub fn lock(&self) -> Result<FileLock, TuningError> {
        Ok(FileLock::acquire(self.dir.join(LOCK_FILE), DEFAULT_WAIT)?)
    }

    /// Reads a backup file; `Ok(None)` when it does not exist.
    ///
    /// # Errors
    /// [`TuningError::Backup`] when it cannot be read, [`TuningError::BackupCorrupt`] when it
    /// is not a backup object.
    pub fn read(&self, path: &Path) -> Result<Option<Backup>, TuningError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(TuningError::Backup {
                    op: "read",
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Backup::from_bytes(&bytes)
            .map(Some)
            .map_err(|reason| TuningError::BackupCorrupt {
                path: path.to_path_buf(),
                reason,
            })
    }

    /// The temporary file a write of `path` goes through before its rename: `.<name>.tmp`,
    /// always the same (writes hold the lock), so one left by a writer killed before its rename
    /// is replaced by the next write and deleted by [`BackupStore::remove`].
    pub fn temp_path(&self, path: &Path) -> PathBuf {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        self.dir.join(format!(".{}.tmp", name.unwrap_or_default()))
    }

    /// Writes a backup file atomically, mode 0600 like the Go plugin's.
    ///
    /// # Errors
    /// [`TuningError::Backup`] naming the file.
    pub fn write(&self, path: &Path, backup: &Backup) -> Result<(), TuningError> {
        let io = |op, source| TuningError::Backup {
            op,
            path: path.to_path_buf(),
            source,
        };
        let bytes = backup
            .to_bytes()
            .map_err(|e| io("encode", std::io::Error::other(e)))?;
        std::fs::create_dir_all(&self.dir).map_err(|e| io("create the directory of", e))?;
        let tmp = self.temp_path(path);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&bytes))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("write", e));
        }
        Ok(())
    }

    /// Removes a backup file and its leftover temporary file; a missing one is not an error.
    ///
    /// # Errors
    /// [`TuningError::Backup`] for other failures.
    pub fn remove(&self, path: &Path) -> Result<(), TuningError> {
        for file in [self.temp_path(path).as_path(), path] {
            match std::fs::remove_file(file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(TuningError::Backup {
                        op: "remove",
                        path: file.to_path_buf(),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether a backup file of `path`, or the temporary file of a write killed before its
    /// rename, exists: what DEL has to look at.
    pub fn has_any(&self, path: &Path) -> bool {
        path.exists() || self.temp_path(path).exists()
    }

    /// Every `*.json` file in the directory (none when it does not exist).
    ///
    /// # Errors
    /// [`TuningError::Backup`] when the directory exists but cannot be read.
    pub fn files(&self) -> Result<Vec<PathBuf>, TuningError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(TuningError::Backup {
                    op: "list the directory of",
                    path: self.dir.clone(),
                    source,
                });
            }
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| !n.starts_with('.') && n.ends_with(".json"))
            })
            .collect();
        files.sort();
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// What Debian's Go tuning (1.1.1) wrote for mac + mtu + promisc + allmulti, byte for byte.
    const GO_FILE: &str = "{\n \"mac\": \"42:f7:63:74:5e:00\",\n \"promisc\": false,\n \"mtu\": 1500,\n \"allmulti\": false\n}";

    #[test]
    fn a_go_file_is_read() {
        let b = Backup::from_bytes(GO_FILE.as_bytes()).unwrap();
        assert_eq!(
            b,
            Backup {
                mac: Some("42:f7:63:74:5e:00".into()),
                promisc: Some(false),
                mtu: Some(1500),
                allmulti: Some(false),
                ..Backup::default()
            }
        );
        // Newer Go versions add txQLen.
        let b = Backup::from_bytes(br#"{"txQLen": 1000, "Mtu": 9000}"#).unwrap();
        assert_eq!((b.txqlen, b.mtu), (Some(1000), Some(9000)));
    }

    #[test]
    fn link_attributes_are_written_exactly_as_go_writes_them() {
        let b = Backup {
            mac: Some("42:f7:63:74:5e:00".into()),
            promisc: Some(false),
            mtu: Some(1500),
            allmulti: Some(false),
            ..Backup::default()
        };
        assert_eq!(String::from_utf8(b.to_bytes().unwrap()).unwrap(), GO_FILE);
    }

    #[test]
    fn our_extra_keys_follow_the_go_keys_and_round_trip() {
        let b = Backup {
            mtu: Some(1500),
            txqlen: Some(1000),
            sysctls: vec![SavedSysctl {
                key: "net/ipv4/conf/eth0.100/rp_filter".into(),
                value: "1".into(),
            }],
            network: Some("net1".into()),
            container_id: Some("c_1".into()),
            ifname: Some("eth0.100".into()),
            ..Backup::default()
        };
        let text = String::from_utf8(b.to_bytes().unwrap()).unwrap();
        assert!(
            text.starts_with("{\n \"mtu\": 1500,\n \"txQLen\": 1000,\n \"sysctls\": ["),
            "{text}"
        );
        assert_eq!(Backup::from_bytes(text.as_bytes()).unwrap(), b);
        assert!(!b.is_empty());
        assert!(Backup::default().is_empty());
    }

    #[test]
    fn the_store_writes_atomically_with_mode_0600_and_lists_only_backups() {
        let dir = tempfile::tempdir().unwrap();
        let store = BackupStore::new(dir.path().join("tuning"));
        assert!(store.files().unwrap().is_empty());
        let path = store.path("c1", "eth0");
        assert_eq!(store.read(&path).unwrap(), None);
        let b = Backup {
            mtu: Some(1400),
            ..Backup::default()
        };
        let _lock = store.lock().unwrap();
        store.write(&path, &b).unwrap();
        assert_eq!(store.read(&path).unwrap(), Some(b));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(dir.path().join("tuning/notes.txt"), "x").unwrap();
        assert_eq!(store.files().unwrap(), std::slice::from_ref(&path));
        store.remove(&path).unwrap();
        store.remove(&path).unwrap();
        assert!(store.files().unwrap().is_empty());
    }

    #[test]
    fn a_temporary_left_by_a_killed_write_is_replaced_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = BackupStore::new(dir.path());
        let path = store.path("c1", "eth0");
        let tmp = store.temp_path(&path);
        assert_eq!(tmp, dir.path().join(".c1_eth0.json.tmp"));
        assert!(!store.has_any(&path));
        std::fs::write(&tmp, "{\"mtu\": 15").unwrap();
        assert!(store.has_any(&path));
        store.remove(&path).unwrap();
        assert!(!tmp.exists() && !store.has_any(&path));
        std::fs::write(&tmp, "{\"mtu\": 15").unwrap();
        store.write(&path, &Backup::default()).unwrap();
        assert!(!tmp.exists() && path.exists());
    }

    #[test]
    fn a_corrupt_file_is_reported_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = BackupStore::new(dir.path());
        let path = store.path("c1", "eth0");
        std::fs::write(&path, "{not json").unwrap();
        let err = store.read(&path).unwrap_err();
        assert!(matches!(err, TuningError::BackupCorrupt { .. }));
        assert!(err.to_string().contains("c1_eth0.json"), "{err}");
    }
}
