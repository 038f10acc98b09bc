//! A directory of JSON state files, written atomically.
//!
//! Writes go to a temporary file in the same directory, then are renamed over the target, so a
//! reader (or a DEL after a plugin was killed) sees either the old file or the new one, never a
//! half-written one. Nothing is fsynced: a state file describes kernel objects (rules, links in
//! a network namespace) that a crash or reboot removes as well, so making it durable buys
//! nothing, and it costs a disk flush per write where `/run` is not a tmpfs (1-7 ms each on
//! this machine's ext4, where the firewall's ADD wrote three files). Removing a file that is already gone is not an error. The temporary
//! file of a name is always the same ([`StateStore::temp_path`]): a writer killed before its
//! rename leaves it behind, the next write of the name replaces it and [`StateStore::remove`]
//! deletes it. Callers serialise writes of one name (two writers would share the temporary).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A state store failure, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file name that would leave the directory.
    #[error("invalid state file name {0:?}")]
    BadName(String),
    /// An I/O failure on a file.
    #[error("failed to {op} state file {path:?}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file that is not the JSON we expect.
    #[error("state file {path:?} is not valid: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// JSON files in one directory.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    /// A store in `dir` (created on first write).
    pub fn new(dir: impl AsRef<Path>) -> Self {
        StateStore {
            dir: dir.as_ref().to_path_buf(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of file `name`.
    ///
    /// # Errors
    /// [`StoreError::BadName`] for an empty name, `.`/`..`, or one containing `/` or NUL.
    pub fn path(&self, name: &str) -> Result<PathBuf, StoreError> {
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(StoreError::BadName(name.to_string()));
        }
        Ok(self.dir.join(name))
    }

    /// The temporary file a write of `name` goes through before its rename: `.<name>.tmp`.
    ///
    /// # Errors
    /// As [`StateStore::path`].
    pub fn temp_path(&self, name: &str) -> Result<PathBuf, StoreError> {
        self.path(name)?;
        Ok(self.dir.join(format!(".{name}.tmp")))
    }

    /// Writes `value` as JSON to `name`, atomically.
    ///
    /// # Errors
    /// [`StoreError::Io`] naming the file.
    pub fn write<T: Serialize>(&self, name: &str, value: &T) -> Result<(), StoreError> {
        let path = self.path(name)?;
        let bytes = serde_json::to_vec_pretty(value).map_err(|source| StoreError::Corrupt {
            path: path.clone(),
            source,
        })?;
        let io = |op, source| StoreError::Io {
            op,
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| io("create the directory of", e))?;
        let tmp = self.temp_path(name)?;
        let result = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&bytes)?;
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("write", e));
        }
        Ok(())
    }

    /// Reads `name`; `Ok(None)` when it does not exist.
    ///
    /// # Errors
    /// [`StoreError::Io`] or [`StoreError::Corrupt`] naming the file.
    pub fn read<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, StoreError> {
        let path = self.path(name)?;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StoreError::Io {
                    op: "read",
                    path,
                    source,
                });
            }
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| StoreError::Corrupt { path, source })
    }

    /// Removes `name`, and the temporary file a writer killed before its rename left; returns
    /// whether `name` existed.
    ///
    /// # Errors
    /// [`StoreError::Io`] for failures other than "not found".
    pub fn remove(&self, name: &str) -> Result<bool, StoreError> {
        let path = self.path(name)?;
        let tmp = self.temp_path(name)?;
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(StoreError::Io {
                    op: "remove",
                    path: tmp,
                    source,
                });
            }
        }
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(StoreError::Io {
                op: "remove",
                path,
                source,
            }),
        }
    }

    /// The names of the files in the store (not temporaries), sorted; empty if the directory is missing.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the directory exists but cannot be read.
    pub fn list(&self) -> Result<Vec<String>, StoreError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(StoreError::Io {
                    op: "list",
                    path: self.dir.clone(),
                    source,
                });
            }
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Backup {
        mtu: u32,
        mac: String,
    }

    #[test]
    fn write_read_list_and_remove_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("tuning"));
        assert_eq!(store.list().unwrap(), Vec::<String>::new());
        assert_eq!(store.read::<Backup>("c1_eth0.json").unwrap(), None);
        let b = Backup {
            mtu: 1500,
            mac: "02:00:00:00:00:01".into(),
        };
        store.write("c1_eth0.json", &b).unwrap();
        store.write("c2_eth0.json", &b).unwrap();
        assert_eq!(store.read::<Backup>("c1_eth0.json").unwrap(), Some(b));
        assert_eq!(store.list().unwrap(), ["c1_eth0.json", "c2_eth0.json"]);
        assert!(store.remove("c1_eth0.json").unwrap());
        assert!(!store.remove("c1_eth0.json").unwrap());
        assert_eq!(store.list().unwrap(), ["c2_eth0.json"]);
    }

    #[test]
    fn remove_deletes_the_temporary_of_a_writer_killed_before_its_rename() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let tmp = store.temp_path("c1_eth0.json").unwrap();
        assert_eq!(tmp, dir.path().join(".c1_eth0.json.tmp"));
        std::fs::write(&tmp, "{\"mtu\": 15").unwrap();
        assert!(!store.remove("c1_eth0.json").unwrap());
        assert!(!tmp.exists());
        // A leftover temporary is replaced by the next write of its name.
        std::fs::write(&tmp, "{\"mtu\": 15").unwrap();
        store.write("c1_eth0.json", &1).unwrap();
        assert!(!tmp.exists());
        assert_eq!(store.read::<u32>("c1_eth0.json").unwrap(), Some(1));
        assert!(store.temp_path("../x").is_err());
    }

    #[test]
    fn overwrite_replaces_the_whole_file_and_leaves_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        store
            .write(
                "f",
                &Backup {
                    mtu: 9000,
                    mac: "a".repeat(100),
                },
            )
            .unwrap();
        store
            .write(
                "f",
                &Backup {
                    mtu: 1,
                    mac: "b".into(),
                },
            )
            .unwrap();
        assert_eq!(store.read::<Backup>("f").unwrap().unwrap().mtu, 1);
        let all: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(all.len(), 1);
    }

    #[test]
    fn names_that_escape_the_directory_are_refused() {
        let store = StateStore::new("/tmp/x");
        for name in ["", ".", "..", "../etc/passwd", "a/b"] {
            assert!(
                matches!(store.path(name), Err(StoreError::BadName(_))),
                "{name}"
            );
        }
    }

    #[test]
    fn a_corrupt_file_is_reported_with_its_path_and_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad.json"), "{half").unwrap();
        let store = StateStore::new(dir.path());
        let err = store.read::<Backup>("bad.json").unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }));
        assert!(err.to_string().contains("bad.json"));
        assert!(dir.path().join("bad.json").exists());
    }
}
