//! Backup files: the original values ADD replaced, which DEL puts back.
//!
//! The file is `<dataDir>/<containerID>_<ifname>.json`, as the Go plugin names it, and holds the
//! Go plugin's keys (`mac`, `promisc`, `mtu`, `allmulti`, `txQLen`, each present only when ADD
//! changed it) so either binary restores the other's file. Go ignores keys it does not know, so
//! ours ride along: `sysctls` (the original values, in the order they were set), `network`,
//! `containerID` and `ifname` (for GC, since `_` may appear in both a container ID and an
//! interface name).
//!
//! Writes are atomic (a fresh temporary file, then rename; see [`host::store`]) but not
//! fsynced: the file describes kernel state that does not survive a reboot, so durability buys
//! nothing, and `/run` is a tmpfs.

use std::path::{Path, PathBuf};

use host::lock::{DEFAULT_WAIT, FileLock};
use host::store::{StateStore, StoreError};
use serde::{Deserialize, Serialize};

use crate::error::TuningError;
use crate::names::{LOCK_FILE, backup_file_name, own_backup_file_name};

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
    /// Whether the backup records an attachment other than `container_id`'s `ifname` (only
    /// ours record one).
    pub fn names_another(&self, container_id: &str, ifname: &str) -> bool {
        match (&self.container_id, &self.ifname) {
            (Some(c), Some(i)) => c != container_id || i != ifname,
            _ => false,
        }
    }

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
        cni::decode::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// The data dir: backup files plus the lock that serialises their read-modify-write. Files are
/// written through [`StateStore`] (a fresh `O_EXCL | O_NOFOLLOW` temporary file, then a rename),
/// mode 0600 like the Go plugin's.
#[derive(Debug, Clone)]
pub struct BackupStore {
    store: StateStore,
}

impl From<StoreError> for TuningError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Io { op, path, source } => TuningError::Backup { op, path, source },
            StoreError::BadName(name) => TuningError::Backup {
                op: "name",
                path: PathBuf::from(&name),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"),
            },
            StoreError::Corrupt { path, source } => TuningError::BackupCorrupt {
                path,
                reason: source.to_string(),
            },
            StoreError::NotRegular { path, what } => TuningError::BackupCorrupt {
                path,
                reason: format!("not a regular file but {what}"),
            },
        }
    }
}

impl BackupStore {
    /// The store in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> BackupStore {
        BackupStore {
            store: StateStore::new(dir.into()),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        self.store.dir()
    }

    /// The backup file name of an attachment, `<containerID>_<ifname>.json` (the
    /// reference's; see [`BackupStore::file_of`] for the one an attachment uses).
    pub fn name(&self, container_id: &str, ifname: &str) -> String {
        backup_file_name(container_id, ifname)
    }

    /// The file that holds, or is to hold, the backup of `container_id`'s `ifname`: the
    /// reference's name ([`BackupStore::name`]), so that the Go plugin and we find each
    /// other's files, unless a backup of another attachment is there. Two attachments meet at
    /// that name (container `a_b` with interface `c`, container `a` with `b_c`); ours record
    /// their attachment, and the second then uses a name of its own
    /// ([`own_backup_file_name`], which the reference's names never are). Call it with the
    /// store's lock held.
    pub fn file_of(&self, container_id: &str, ifname: &str) -> String {
        let own = own_backup_file_name(container_id, ifname);
        if self.has_any(&own) {
            return own;
        }
        let reference = self.name(container_id, ifname);
        match self.read(&reference) {
            Ok(Some(b)) if b.names_another(container_id, ifname) => own,
            _ => reference,
        }
    }

    /// Whether a backup of `container_id`'s `ifname` may exist, under either name
    /// ([`BackupStore::file_of`]); a check without the lock, for DEL to return early.
    pub fn may_hold(&self, container_id: &str, ifname: &str) -> bool {
        self.has_any(&self.name(container_id, ifname))
            || self.has_any(&own_backup_file_name(container_id, ifname))
    }

    /// The path of backup file `name`, for messages.
    pub fn path(&self, name: &str) -> PathBuf {
        self.store.dir().join(name)
    }

    /// Takes the data dir's lock (creating the directory), held until dropped.
    ///
    /// # Errors
    /// [`TuningError::Lock`] when it cannot be created or stays contended.
    pub fn lock(&self) -> Result<FileLock, TuningError> {
        Ok(FileLock::acquire(self.dir().join(LOCK_FILE), DEFAULT_WAIT)?)
    }

    /// The lock for a DEL: as [`BackupStore::lock`], but a data dir nothing can be written to
    /// (read-only, full) does not stop it. The existing lock file is then locked through a
    /// read-only descriptor (`flock` needs no write access); without one, no writer can change a
    /// backup there either, and DEL goes on unlocked. DEL restores from what it can read and
    /// fails only on removing the file.
    ///
    /// # Errors
    /// [`TuningError::Lock`] when it stays contended or fails otherwise.
    pub fn lock_for_del(&self) -> Result<Option<FileLock>, TuningError> {
        Ok(FileLock::acquire_for_teardown(
            self.dir().join(LOCK_FILE),
            DEFAULT_WAIT,
        )?)
    }

    /// Reads a backup file; `Ok(None)` when it does not exist.
    ///
    /// # Errors
    /// [`TuningError::Backup`] when it cannot be read, [`TuningError::BackupCorrupt`] when it
    /// is not a backup object.
    pub fn read(&self, name: &str) -> Result<Option<Backup>, TuningError> {
        let Some(bytes) = self.store.read_bytes(name)? else {
            return Ok(None);
        };
        Backup::from_bytes(&bytes)
            .map(Some)
            .map_err(|reason| TuningError::BackupCorrupt {
                path: self.path(name),
                reason,
            })
    }

    /// Writes a backup file atomically.
    ///
    /// # Errors
    /// [`TuningError::Backup`] naming the file.
    pub fn write(&self, name: &str, backup: &Backup) -> Result<(), TuningError> {
        let bytes = backup.to_bytes().map_err(|e| TuningError::Backup {
            op: "encode",
            path: self.path(name),
            source: std::io::Error::other(e),
        })?;
        Ok(self.store.write_bytes(name, &bytes)?)
    }

    /// Removes a backup file and the temporary files a killed write left; a missing one is not
    /// an error.
    ///
    /// # Errors
    /// [`TuningError::Backup`] for other failures.
    pub fn remove(&self, name: &str) -> Result<(), TuningError> {
        self.store.remove(name)?;
        Ok(())
    }

    /// Whether a backup file of `name`, or a temporary file of a write killed before its
    /// rename, exists: what DEL has to look at.
    pub fn has_any(&self, name: &str) -> bool {
        self.store.has_any(name)
    }

    /// The names of every `*.json` file in the directory (none when it does not exist).
    ///
    /// # Errors
    /// [`TuningError::Backup`] when the directory exists but cannot be read.
    pub fn files(&self) -> Result<Vec<String>, TuningError> {
        let mut names = self.store.list()?;
        names.retain(|n| n.ends_with(".json"));
        Ok(names)
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
        let name = store.name("c1", "eth0");
        let path = store.path(&name);
        assert_eq!(path, dir.path().join("tuning/c1_eth0.json"));
        assert_eq!(store.read(&name).unwrap(), None);
        let b = Backup {
            mtu: Some(1400),
            ..Backup::default()
        };
        let _lock = store.lock().unwrap();
        store.write(&name, &b).unwrap();
        assert_eq!(store.read(&name).unwrap(), Some(b));
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\n \"mtu\": 1400\n}"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(dir.path().join("tuning/notes.txt"), "x").unwrap();
        assert_eq!(store.files().unwrap(), std::slice::from_ref(&name));
        store.remove(&name).unwrap();
        store.remove(&name).unwrap();
        assert!(store.files().unwrap().is_empty());
    }

    #[test]
    fn a_symlink_planted_at_the_old_temporary_name_is_not_written_through() {
        // Issue 22's repro: earlier versions wrote `.<id>_<if>.json.tmp` and renamed it.
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let store = BackupStore::new(dir.path().join("tuning"));
        std::fs::create_dir(store.dir()).unwrap();
        let name = store.name("c1", "eth0");
        let planted = store.dir().join(".c1_eth0.json.tmp");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        assert!(store.has_any(&name), "DEL must look at it");
        let b = Backup {
            mtu: Some(1500),
            ..Backup::default()
        };
        store.write(&name, &b).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(
            std::fs::symlink_metadata(store.path(&name))
                .unwrap()
                .is_file()
        );
        assert_eq!(store.read(&name).unwrap(), Some(b));
        store.remove(&name).unwrap();
        assert!(std::fs::symlink_metadata(&planted).is_err());
        assert!(!store.has_any(&name));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn a_corrupt_file_is_reported_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = BackupStore::new(dir.path());
        let name = store.name("c1", "eth0");
        std::fs::write(store.path(&name), "{not json").unwrap();
        let err = store.read(&name).unwrap_err();
        assert!(matches!(err, TuningError::BackupCorrupt { .. }));
        assert!(err.to_string().contains("c1_eth0.json"), "{err}");
    }

    #[test]
    fn an_attachment_whose_reference_name_holds_another_s_backup_uses_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = BackupStore::new(dir.path());
        let of = |id: &str, ifname: &str| Backup {
            mtu: Some(1500),
            container_id: Some(id.into()),
            ifname: Some(ifname.into()),
            ..Backup::default()
        };
        // Container `a_b` with `c` and container `a` with `b_c` meet at `a_b_c.json`.
        assert_eq!(store.name("a_b", "c"), store.name("a", "b_c"));
        assert_eq!(store.file_of("a_b", "c"), "a_b_c.json");
        store.write("a_b_c.json", &of("a_b", "c")).unwrap();
        assert_eq!(store.file_of("a_b", "c"), "a_b_c.json");
        assert_eq!(store.file_of("a", "b_c"), ":a:b_c.json");
        store.write(":a:b_c.json", &of("a", "b_c")).unwrap();
        assert!(store.may_hold("a", "b_c"));
        assert!(!store.may_hold("x", "b_c"));
        // Once the first is gone, the second keeps its own file while it has one.
        store.remove("a_b_c.json").unwrap();
        assert_eq!(store.file_of("a", "b_c"), ":a:b_c.json");
        store.remove(":a:b_c.json").unwrap();
        assert_eq!(store.file_of("a", "b_c"), "a_b_c.json");
        // The Go plugin's file names no attachment: it is taken as the name's, as Go does.
        std::fs::write(store.path("a_b_c.json"), GO_FILE).unwrap();
        assert_eq!(store.file_of("a", "b_c"), "a_b_c.json");
        assert_eq!(store.file_of("a_b", "c"), "a_b_c.json");
    }
}
