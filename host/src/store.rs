//! A directory of JSON state files, written atomically.
//!
//! Writes go to a temporary file, then are renamed over the target, so a reader (or a DEL after
//! a plugin was killed) sees either the old file or the new one, never a half-written one.
//! Nothing is fsynced: a state file describes kernel objects (rules, links in a network
//! namespace) that a crash or reboot removes as well, so making it durable buys nothing, and it
//! costs a disk flush per write where `/run` is not a tmpfs (1-7 ms each on this machine's ext4,
//! where the firewall's ADD wrote three files). Removing a file that is already gone is not an
//! error.
//!
//! **Temporary files** live in the store's `.tmp/` subdirectory as `<hash>.<random>`: 16 hex
//! digits of the record name's FNV-1a hash (so a record name may be as long as the filesystem
//! allows), and 16 random hex digits, fresh per write. Each is created with `O_CREAT | O_EXCL | O_NOFOLLOW` (mode
//! 0600), so nothing planted there — a symlink to a file elsewhere, a hard link, a regular file —
//! is ever written through or renamed into place: a name that exists is skipped for another.
//! `.tmp/` itself is opened with `O_NOFOLLOW | O_DIRECTORY`; anything else found under that name
//! is unlinked and the directory made afresh. It holds only writes in flight and what writers
//! killed before their rename left, so [`StateStore::remove`] and [`StateStore::has_any`] list
//! it to find a name's leftovers at a cost that does not grow with the number of records.
//! `.tmp/` is made by the first write and stays: removing a directory is the slow part of a
//! write where `/run` is a disk filesystem (closing the removed directory waits for the
//! journal, about 3 ms on ext4, where firewall's ADD writes four records); only
//! [`StateStore::prune`] removes it, with the store's directory, once there is no record
//! left.
//!
//! Temporaries of earlier versions (`.<name>.tmp` beside the record) are deleted by
//! [`StateStore::remove`] too.

use std::collections::hash_map::RandomState;
use std::ffi::OsStr;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The subdirectory holding temporary files.
pub const TEMP_DIR: &str = ".tmp";

/// Hex digits of a temporary file's random suffix.
const SUFFIX_LEN: usize = 16;

/// Mode of state files: only root, which runs the plugins, reads them.
const FILE_MODE: u32 = 0o600;

/// Mode of the temporary directory.
const TEMP_DIR_MODE: u32 = 0o700;

/// How often a write starts over when a concurrent [`StateStore::remove`] or
/// [`StateStore::prune`] took the directory (or `.tmp/`) away in the middle of it.
const VANISHED_RETRIES: u32 = 8;

/// How many random names a write tries before giving up (each taken one was planted or is a
/// concurrent writer's).
const NAME_TRIES: u32 = 8;

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
    /// Something that is not a regular file where a record belongs (a FIFO, a device, a
    /// symbolic link, a directory: planted, since a store writes only regular files).
    #[error("state file {path:?} is not a regular file but {what}")]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What is there instead.
        what: &'static str,
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

    /// The temporary file earlier versions wrote `name` through, `.<name>.tmp` beside it;
    /// [`StateStore::remove`] deletes it. New writes never use it (see the module docs).
    ///
    /// # Errors
    /// As [`StateStore::path`].
    pub fn temp_path(&self, name: &str) -> Result<PathBuf, StoreError> {
        self.path(name)?;
        Ok(self.dir.join(format!(".{name}.tmp")))
    }

    /// Writes `value` as JSON (indented by two spaces) to `name`, atomically.
    ///
    /// # Errors
    /// [`StoreError::Io`] naming the file.
    pub fn write<T: Serialize>(&self, name: &str, value: &T) -> Result<(), StoreError> {
        let path = self.path(name)?;
        let bytes = serde_json::to_vec_pretty(value)
            .map_err(|source| StoreError::Corrupt { path, source })?;
        self.write_bytes(name, &bytes)
    }

    /// Writes `bytes` to `name`, atomically, mode 0600: a fresh temporary file (see the module
    /// docs) renamed over it. A directory removed by a concurrent [`StateStore::prune`] in the
    /// middle is made again.
    ///
    /// # Errors
    /// [`StoreError::Io`] naming the file.
    pub fn write_bytes(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.write_with(name, bytes, &mut std::iter::repeat_with(random_suffix))
    }

    /// [`StateStore::write_bytes`] with the temporary files' suffixes drawn from `suffixes`.
    fn write_with(
        &self,
        name: &str,
        bytes: &[u8],
        suffixes: &mut dyn Iterator<Item = String>,
    ) -> Result<(), StoreError> {
        let path = self.path(name)?;
        let mut vanished = 0;
        loop {
            match self.write_once(name, bytes, suffixes) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && vanished < VANISHED_RETRIES => {
                    vanished += 1;
                }
                Err(source) => {
                    return Err(StoreError::Io {
                        op: "write",
                        path,
                        source,
                    });
                }
                Ok(()) => return Ok(()),
            }
        }
    }

    fn write_once(
        &self,
        name: &str,
        bytes: &[u8],
        suffixes: &mut dyn Iterator<Item = String>,
    ) -> io::Result<()> {
        let dir = match open_dir(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(&self.dir)?;
                open_dir(&self.dir)?
            }
            other => other?,
        };
        let temps = open_temp_dir(&dir)?;
        let (file, temp) = create_temp(&temps, name, suffixes)?;
        let written = std::fs::File::from(file)
            .write_all(bytes)
            .and_then(|()| Ok(renameat(&temps, temp.as_str(), &dir, name)?));
        if written.is_err() {
            let _ = unlinkat(&temps, temp.as_str(), UnlinkatFlags::NoRemoveDir);
        }
        written
    }

    /// Reads `name`'s bytes; `Ok(None)` when it does not exist.
    ///
    /// # Errors
    /// [`StoreError::Io`] naming the file;
    /// [`StoreError::NotRegular`] for anything but a regular file or a directory (never
    /// followed through a symbolic link, never waited on: a FIFO is refused at once, see
    /// [`open_regular`]).
    pub fn read_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path(name)?;
        let io = |path, source| StoreError::Io {
            op: "read",
            path,
            source,
        };
        let mut file = match open_regular(&path) {
            Ok(Regular::File(file)) => file,
            Ok(Regular::Missing) => return Ok(None),
            // Not a file anyone could have planted in place of a record by accident, and none
            // that removing a record could take away: reported as it always was.
            Ok(Regular::Other("a directory")) => {
                return Err(io(path, io::Error::from_raw_os_error(libc::EISDIR)));
            }
            Ok(Regular::Other(what)) => return Err(StoreError::NotRegular { path, what }),
            Err(source) => return Err(io(path, source)),
        };
        read_whole(&mut file)
            .map(Some)
            .map_err(|source| io(path, source))
    }

    /// Reads `name`; `Ok(None)` when it does not exist.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::NotRegular`] or [`StoreError::Corrupt`] naming the
    /// file.
    pub fn read<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, StoreError> {
        let Some(bytes) = self.read_bytes(name)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| StoreError::Corrupt {
                path: self.dir.join(name),
                source,
            })
    }

    /// Reads `name` as [`StateStore::read`] does, but a file that does not parse (empty,
    /// truncated by a crash, garbage), or something planted that is no regular file (a FIFO, a
    /// symbolic link), counts as absent: it is logged at warn and removed, and
    /// `Ok(None)` returned, so a caller goes on as if it had never been written (a DEL cleans
    /// up from what the kernel shows; an ADD writes it afresh). A failure to remove it is
    /// logged too: the next write replaces it.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the file exists but cannot be read.
    pub fn read_or_discard<T: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<Option<T>, StoreError> {
        match self.read(name) {
            Err(e @ (StoreError::Corrupt { .. } | StoreError::NotRegular { .. })) => {
                log::warn!("{e}: treating it as absent and removing it");
                if let Err(e) = self.remove(name) {
                    log::warn!("{e}");
                }
                Ok(None)
            }
            other => other,
        }
    }

    /// True when `name` exists, or a temporary file of it does (left by a writer killed before
    /// its rename, or a write in flight): whether [`StateStore::remove`] has anything to do.
    /// `.tmp/` holds only such files, so this costs a listing of a few entries at most, whatever
    /// the number of records. A `.tmp/` that cannot be read counts as holding one.
    pub fn has_any(&self, name: &str) -> bool {
        let (Ok(path), Ok(legacy)) = (self.path(name), self.temp_path(name)) else {
            return false;
        };
        if [path, legacy]
            .iter()
            .any(|p| std::fs::symlink_metadata(p).is_ok())
        {
            return true;
        }
        match open_dir(&self.dir) {
            Ok(dir) => temporaries_of(&dir, name).is_ok_and(|(_, found)| !found.is_empty()),
            Err(e) => e.kind() != io::ErrorKind::NotFound,
        }
    }

    /// Removes `name`, and the temporary files of it that writers killed before their rename
    /// left; returns whether `name` existed.
    ///
    /// # Errors
    /// [`StoreError::Io`] for failures other than "not found".
    pub fn remove(&self, name: &str) -> Result<bool, StoreError> {
        let path = self.path(name)?;
        let legacy = self.temp_path(name)?;
        let io = |path: PathBuf| {
            move |source: io::Error| StoreError::Io {
                op: "remove",
                path,
                source,
            }
        };
        remove_file(&legacy).map_err(io(legacy.clone()))?;
        match open_dir(&self.dir) {
            Ok(dir) => {
                let (temps, found) =
                    temporaries_of(&dir, name).map_err(io(self.dir.join(TEMP_DIR)))?;
                if let Some(temps) = temps {
                    for temp in found {
                        match unlinkat(&temps, temp.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                            Ok(()) | Err(Errno::ENOENT) => {}
                            Err(e) => return Err(io(self.dir.join(TEMP_DIR).join(temp))(e.into())),
                        }
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io(self.dir.clone())(e)),
        }
        remove_file(&path).map_err(io(path))
    }

    /// Removes the store's directory, with an empty `.tmp/`, once it holds no records, so
    /// stores of namespaces that come and go leave nothing behind. While a record is there
    /// `.tmp/` stays too (the next write would make it again). Whether one is there is known
    /// from the first entries of the directory, whatever the number of records. A directory
    /// that is not empty (a concurrent write) or already gone is left as it is; other failures
    /// are logged.
    pub fn prune(&self) {
        match has_entries_besides_temps(&self.dir) {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    log::debug!("failed to read {}: {e}", self.dir.display());
                }
                return;
            }
        }
        let temps = self.dir.join(TEMP_DIR);
        for dir in [temps.as_path(), self.dir.as_path()] {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOTEMPTY | libc::EEXIST | libc::ENOENT | libc::ENOTDIR)
                    ) => {}
                Err(e) => log::debug!("failed to remove {}: {e}", dir.display()),
            }
        }
    }

    /// The names of the files in the store (not temporaries), sorted; empty if the directory is missing.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the directory exists but cannot be read.
    pub fn list(&self) -> Result<Vec<String>, StoreError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
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

/// The name of an attachment's record in a store, `<network>:<containerID>:<ifname>`: each part
/// with `%`, `:`, `/`, NUL and control characters written as `%XX` (two upper-case hex digits
/// of the byte), and a `.` that would start the name as `%2E` (a name starting with a dot is
/// hidden from [`StateStore::list`]). No part written so holds a bare `:`, and each is read
/// back whole from its `%XX`, so two different attachments never share a name, whatever the
/// three strings hold (a `_`-joined name does not have this: network `a_b` with container
/// `c` and network `a` with container `b_c` meet at `a_b_c`). The names of valid attachments
/// (the skel refuses `:` and `/` in all three) need no escape, and read as the three joined
/// by `:`.
pub fn attachment_name(network: &str, container_id: &str, ifname: &str) -> String {
    let mut name = attachment_prefix(network, Some(container_id));
    escape_part(ifname, &mut name);
    name
}

/// The start every [`attachment_name`] of `network` has (of its container `container_id`,
/// when given): `<network>:` or `<network>:<containerID>:`, escaped alike. A name starts with
/// it if and only if it is the name of such an attachment.
pub fn attachment_prefix(network: &str, container_id: Option<&str>) -> String {
    let mut name = String::with_capacity(network.len() + 80);
    if let Some(rest) = network.strip_prefix('.') {
        name.push_str("%2E");
        escape_part(rest, &mut name);
    } else {
        escape_part(network, &mut name);
    }
    name.push(':');
    if let Some(id) = container_id {
        escape_part(id, &mut name);
        name.push(':');
    }
    name
}

/// Appends `part` to `out`, its `%`, `:`, `/`, NUL and control characters as `%XX`.
fn escape_part(part: &str, out: &mut String) {
    use std::fmt::Write as _;
    for c in part.chars() {
        if matches!(c, '%' | ':' | '/') || c.is_ascii_control() {
            let _ = write!(out, "%{:02X}", u32::from(c));
        } else {
            out.push(c);
        }
    }
}

/// Removes a file; one that is already gone is not an error. Returns whether it existed.
fn remove_file(path: &Path) -> io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// What [`open_regular`] found at a path.
#[derive(Debug)]
pub enum Regular {
    /// A regular file, open for reading.
    File(std::fs::File),
    /// Nothing.
    Missing,
    /// Something else: `a FIFO`, `a symbolic link`, `a directory`, `a socket`, `a device`.
    Other(&'static str),
}

/// Opens `path` for reading if it is a regular file, never through a symbolic link and never
/// waiting: `O_NONBLOCK` makes the open of a FIFO return at once (without it, the open waits
/// for a writer, forever for a FIFO planted in a state directory, with the caller's lock
/// held), `O_NOCTTY` keeps a terminal from becoming ours, and the type of what was opened is
/// checked before a byte is read. On a regular file `O_NONBLOCK` changes nothing.
///
/// # Errors
/// Failures to open other than "not found", "a symbolic link" and "a FIFO without writer".
pub fn open_regular(path: &Path) -> io::Result<Regular> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Regular::Missing),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Ok(Regular::Other("a symbolic link"));
        }
        // A FIFO opened for reading never fails with O_NONBLOCK; a socket cannot be opened.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(Regular::Other("a socket")),
        Err(e) => return Err(e),
    };
    let kind = file.metadata()?.file_type();
    Ok(if kind.is_file() {
        Regular::File(file)
    } else if kind.is_fifo() {
        Regular::Other("a FIFO")
    } else if kind.is_dir() {
        Regular::Other("a directory")
    } else if kind.is_socket() {
        Regular::Other("a socket")
    } else {
        Regular::Other("a device")
    })
}

/// Everything in `file`: a record (a few hundred bytes) in one `read` and one that finds the
/// end. The standard library's `read_to_end` asks for the file's size and position first,
/// two more system calls, which a caller reading a thousand records (firewall's
/// `reconcile`) pays a thousand times.
fn read_whole(file: &mut std::fs::File) -> io::Result<Vec<u8>> {
    let mut bytes = vec![0; 4096];
    let mut filled = 0;
    loop {
        match io::Read::read(file, &mut bytes[filled..]) {
            Ok(0) => break,
            Ok(n) => {
                filled += n;
                if filled == bytes.len() {
                    bytes.resize(bytes.len() * 2, 0);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    bytes.truncate(filled);
    Ok(bytes)
}

/// The store's directory, held open so every step of a write happens in the same one.
fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    let fd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    Ok(fd)
}

/// Opens (making it if needed) `.tmp/` in `dir`, never through a symlink: anything but a
/// directory under that name is unlinked first.
fn open_temp_dir(dir: &OwnedFd) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut replaced = false;
    let mut made = false;
    loop {
        match openat(dir, TEMP_DIR, flags, Mode::empty()) {
            Ok(fd) => return Ok(fd),
            Err(Errno::ENOENT) if !made => {
                match mkdirat(dir, TEMP_DIR, Mode::from_bits_truncate(TEMP_DIR_MODE)) {
                    // EEXIST: a concurrent writer made it.
                    Ok(()) | Err(Errno::EEXIST) => made = true,
                    Err(e) => return Err(e.into()),
                }
            }
            // A symlink (ELOOP) or a file (ENOTDIR) where our directory belongs.
            Err(Errno::ELOOP | Errno::ENOTDIR) if !replaced => {
                log::warn!("replacing {TEMP_DIR}, which is not a directory, in a state store");
                unlinkat(dir, TEMP_DIR, UnlinkatFlags::NoRemoveDir)?;
                replaced = true;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether `dir` holds anything but `.tmp/` (`.`, `..` aside). Reads entries only until it
/// finds one: a store with records has one among its first few.
fn has_entries_besides_temps(dir: &Path) -> io::Result<bool> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut entries = Dir::open(dir, flags, Mode::empty())?;
    for entry in entries.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." && name != TEMP_DIR.as_bytes() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Creates a temporary file of `name` in `temps` that did not exist before, with the first
/// free suffix of `suffixes`.
fn create_temp(
    temps: &OwnedFd,
    name: &str,
    suffixes: &mut dyn Iterator<Item = String>,
) -> io::Result<(OwnedFd, String)> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    for suffix in suffixes.take(NAME_TRIES as usize) {
        let temp = temp_name(name, &suffix);
        match openat(
            temps,
            temp.as_str(),
            flags,
            Mode::from_bits_truncate(FILE_MODE),
        ) {
            Ok(fd) => return Ok((fd, temp)),
            Err(Errno::EEXIST) => log::warn!("temporary state file {temp} exists; skipping it"),
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no free temporary file name for {name} in {TEMP_DIR} after {NAME_TRIES} tries"),
    ))
}

/// `.tmp/` of `dir` (`None` when there is none, or something else is under that name) and the
/// temporary files of `name` in it.
fn temporaries_of(dir: &OwnedFd, name: &str) -> io::Result<(Option<Dir>, Vec<std::ffi::OsString>)> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut temps = match Dir::openat(dir.as_fd(), TEMP_DIR, flags, Mode::empty()) {
        Ok(d) => d,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => return Ok((None, Vec::new())),
        Err(e) => return Err(e.into()),
    };
    let mut found = Vec::new();
    for entry in temps.iter() {
        let entry = entry?;
        let file = OsStr::from_bytes(entry.file_name().to_bytes());
        if is_temporary_of(file, name) {
            found.push(file.to_os_string());
        }
    }
    Ok((Some(temps), found))
}

/// The temporary file of record `name` with random `suffix`.
fn temp_name(name: &str, suffix: &str) -> String {
    format!("{:016x}.{suffix}", fnv1a(name.as_bytes()))
}

/// 64-bit FNV-1a: a fixed function, so a later version of the plugins still finds the
/// leftovers of this one.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// True for a temporary file of `name`: its hash, a dot and 16 hex digits.
fn is_temporary_of(file: &OsStr, name: &str) -> bool {
    let prefix = format!("{:016x}.", fnv1a(name.as_bytes()));
    file.as_bytes()
        .strip_prefix(prefix.as_bytes())
        .is_some_and(|suffix| {
            suffix.len() == SUFFIX_LEN
                && suffix
                    .iter()
                    .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
        })
}

/// 64 random bits as hex: std's `RandomState` draws its keys from the kernel's random source
/// once per thread and moves them on for every new hasher, so no two writes share a suffix and
/// none can be guessed ahead.
fn random_suffix() -> String {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("{:0width$x}", hasher.finish(), width = SUFFIX_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::os::unix::fs::PermissionsExt;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Backup {
        mtu: u32,
        mac: String,
    }

    /// Every entry under `dir`, relative, sorted (directories with a trailing `/`).
    fn tree(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
                if e.file_type().unwrap().is_dir() {
                    out.push(format!("{rel}/"));
                    stack.push(e.path());
                } else {
                    out.push(rel);
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn write_read_list_and_remove_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("tuning"));
        assert_eq!(store.list().unwrap(), Vec::<String>::new());
        assert_eq!(store.read::<Backup>("c1_eth0.json").unwrap(), None);
        assert!(!store.remove("c1_eth0.json").unwrap());
        let b = Backup {
            mtu: 1500,
            mac: "02:00:00:00:00:01".into(),
        };
        store.write("c1_eth0.json", &b).unwrap();
        store.write("c2_eth0.json", &b).unwrap();
        assert_eq!(store.read::<Backup>("c1_eth0.json").unwrap(), Some(b));
        assert_eq!(store.list().unwrap(), ["c1_eth0.json", "c2_eth0.json"]);
        assert!(store.has_any("c1_eth0.json"));
        assert!(store.remove("c1_eth0.json").unwrap());
        assert!(!store.remove("c1_eth0.json").unwrap());
        assert!(!store.has_any("c1_eth0.json"));
        assert_eq!(store.list().unwrap(), ["c2_eth0.json"]);
        let mode = std::fs::metadata(store.path("c2_eth0.json").unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn overwrite_replaces_the_whole_file_and_leaves_no_temporaries_but_tmp_itself() {
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
        // `.tmp/` stays for the next write: removing a directory is what costs (module docs).
        assert_eq!(tree(dir.path()), [".tmp/", "f"]);
    }

    #[test]
    fn temporaries_get_a_fresh_random_suffix_each() {
        let a = random_suffix();
        let b = random_suffix();
        assert_ne!(a, b);
        for s in [&a, &b] {
            assert!(is_temporary_of(OsStr::new(&temp_name("n", s)), "n"), "{s}");
        }
        assert!(!is_temporary_of(OsStr::new(&temp_name("a.b", &a)), "a"));
        let hash = format!("{:016x}", fnv1a(b"a"));
        assert!(!is_temporary_of(OsStr::new(&format!("{hash}.0123")), "a"));
        assert!(!is_temporary_of(
            OsStr::new(&format!("{hash}.0123456789abcdeg")),
            "a"
        ));
        assert!(!is_temporary_of(
            OsStr::new(&format!("{hash}0123456789abcdef0")),
            "a"
        ));
        // The reference vectors of FNV-1a 64.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        // A record name as long as a file name may be still has a temporary file name.
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let long = "n".repeat(255);
        store.write(&long, &1).unwrap();
        assert_eq!(store.read::<u32>(&long).unwrap(), Some(1));
    }

    #[test]
    fn a_symlink_or_file_planted_at_the_temporary_name_is_skipped_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("s"));
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let temps = dir.path().join("s").join(TEMP_DIR);
        std::fs::create_dir_all(&temps).unwrap();
        // The next two suffixes are taken: a symlink to the victim, and a regular file (a hard
        // link would look the same).
        std::os::unix::fs::symlink(
            &victim,
            temps.join(temp_name("c1_eth0.json", "000000000000000a")),
        )
        .unwrap();
        std::fs::write(
            temps.join(temp_name("c1_eth0.json", "000000000000000b")),
            "planted",
        )
        .unwrap();
        let mut suffixes = ["000000000000000a", "000000000000000b", "000000000000000c"]
            .into_iter()
            .map(String::from);
        store
            .write_with("c1_eth0.json", b"{\"mtu\": 1}", &mut suffixes)
            .unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        let record = store.path("c1_eth0.json").unwrap();
        assert!(std::fs::symlink_metadata(&record).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&record).unwrap(), "{\"mtu\": 1}");
        assert_eq!(
            std::fs::read_to_string(temps.join(temp_name("c1_eth0.json", "000000000000000b")))
                .unwrap(),
            "planted"
        );
        // What was planted looks like leftovers of the name: remove() clears them, not their
        // targets.
        assert!(store.remove("c1_eth0.json").unwrap());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(tree(dir.path()), ["s/", "s/.tmp/", "victim"]);

        // Every name taken: the write fails and changes nothing.
        std::os::unix::fs::symlink(
            &victim,
            temps.join(temp_name("c1_eth0.json", "000000000000000a")),
        )
        .unwrap();
        let err = store
            .write_with(
                "c1_eth0.json",
                b"{}",
                &mut std::iter::repeat("000000000000000a".to_string()),
            )
            .unwrap_err();
        assert!(
            err.to_string().contains("no free temporary file name"),
            "{err}"
        );
        assert!(!record.exists());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn a_symlink_or_file_planted_at_the_temporary_directory_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let store = StateStore::new(dir.path().join("s"));
        std::fs::create_dir(store.dir()).unwrap();
        let temps = store.dir().join(TEMP_DIR);
        std::os::unix::fs::symlink(&elsewhere, &temps).unwrap();
        store.write("r", &1).unwrap();
        assert_eq!(store.read::<u32>("r").unwrap(), Some(1));
        assert_eq!(tree(&elsewhere), Vec::<String>::new());
        assert!(std::fs::symlink_metadata(&temps).unwrap().is_dir());

        std::fs::remove_dir(&temps).unwrap();
        std::fs::write(&temps, "x").unwrap();
        store.write("r", &2).unwrap();
        assert_eq!(store.read::<u32>("r").unwrap(), Some(2));
        assert_eq!(tree(dir.path()), ["elsewhere/", "s/", "s/.tmp/", "s/r"]);
        // Planted after the first write, while `.tmp/` stays: replaced all the same.
        std::fs::remove_dir(&temps).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &temps).unwrap();
        store.write("r", &3).unwrap();
        assert_eq!(store.read::<u32>("r").unwrap(), Some(3));
        assert_eq!(tree(&elsewhere), Vec::<String>::new());
        assert!(std::fs::symlink_metadata(&temps).unwrap().is_dir());
    }

    #[test]
    fn the_old_fixed_temporary_name_is_never_written_through() {
        // What the issue planted: a symlink at `.<name>.tmp`, where earlier versions wrote.
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let store = StateStore::new(dir.path().join("s"));
        std::fs::create_dir(store.dir()).unwrap();
        let legacy = store.temp_path("c1_eth0.json").unwrap();
        assert_eq!(legacy, store.dir().join(".c1_eth0.json.tmp"));
        std::os::unix::fs::symlink(&victim, &legacy).unwrap();
        store.write("c1_eth0.json", &7).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(
            std::fs::symlink_metadata(store.path("c1_eth0.json").unwrap())
                .unwrap()
                .is_file()
        );
        // remove() deletes the link itself, never its target.
        assert!(store.remove("c1_eth0.json").unwrap());
        assert!(std::fs::symlink_metadata(&legacy).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn remove_deletes_the_temporaries_a_killed_writer_left_and_only_those_of_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let temps = dir.path().join(TEMP_DIR);
        std::fs::create_dir(&temps).unwrap();
        let mine = temps.join(temp_name("c1_eth0.json", &random_suffix()));
        let theirs = temps.join(temp_name("c1_eth0.json.x", &random_suffix()));
        std::fs::write(&mine, "{\"mtu\": 15").unwrap();
        std::fs::write(&theirs, "{").unwrap();
        std::fs::write(dir.path().join(".c1_eth0.json.tmp"), "{").unwrap();
        assert!(store.has_any("c1_eth0.json"));
        assert!(!store.remove("c1_eth0.json").unwrap());
        assert!(!mine.exists() && theirs.exists());
        assert!(!dir.path().join(".c1_eth0.json.tmp").exists());
        assert!(
            !store.has_any("c1_eth0.json"),
            "only another name's temporary is in .tmp/"
        );
        assert!(store.has_any("c1_eth0.json.x"));
        assert!(!store.remove("c1_eth0.json.x").unwrap());
        assert_eq!(tree(dir.path()), [".tmp/"]);
        assert!(!store.has_any("c1_eth0.json"));
        // A leftover does not stop the next write of its name.
        std::fs::write(&mine, "{").unwrap();
        store.write("c1_eth0.json", &1).unwrap();
        assert_eq!(store.read::<u32>("c1_eth0.json").unwrap(), Some(1));
        assert!(store.temp_path("../x").is_err());
    }

    #[test]
    fn prune_removes_only_a_directory_without_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("net-1"));
        store.prune();
        store.write("a", &1).unwrap();
        store.prune();
        assert!(store.dir().exists(), "a directory with records must stay");
        assert!(
            store.dir().join(TEMP_DIR).exists(),
            "`.tmp/` must stay while there are records"
        );
        store.remove("a").unwrap();
        // A leftover temporary file is not a record, but it keeps the directory.
        let leftover = store
            .dir()
            .join(TEMP_DIR)
            .join(temp_name("a", &random_suffix()));
        std::fs::write(&leftover, "{").unwrap();
        store.prune();
        assert!(leftover.exists());
        std::fs::remove_file(&leftover).unwrap();
        store.prune();
        assert!(!store.dir().exists());
        // A write after the directory went makes it again.
        store.write("b", &2).unwrap();
        assert_eq!(store.read::<u32>("b").unwrap(), Some(2));
    }

    #[test]
    fn prune_finds_a_record_among_many_and_keeps_everything() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("s"));
        for i in 0..100 {
            store.write(&format!("r{i}"), &i).unwrap();
        }
        for i in 0..99 {
            store.remove(&format!("r{i}")).unwrap();
        }
        store.prune();
        assert_eq!(tree(store.dir()), [".tmp/", "r99"]);
        assert!(!store.has_any("r0"));
        assert!(store.has_any("r99"));
    }

    /// Runs `f` on a thread and fails if it has not returned within a minute (it would hang
    /// forever on what it guards against).
    fn returns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the read hung")
    }

    #[test]
    fn a_fifo_or_symlink_planted_at_a_record_is_refused_without_waiting_and_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "{\"mtu\": 1, \"mac\": \"m\"}").unwrap();
        let fifo = dir.path().join("r.json");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let reader = store.clone();
        let err = returns(move || reader.read::<Backup>("r.json")).unwrap_err();
        assert!(
            matches!(err, StoreError::NotRegular { what: "a FIFO", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("r.json"), "{err}");
        let reader = store.clone();
        assert_eq!(
            returns(move || reader.read_or_discard::<Backup>("r.json")).unwrap(),
            None
        );
        assert!(std::fs::symlink_metadata(&fifo).is_err(), "the FIFO stays");
        // Never read through a symbolic link either (nor is its target removed).
        std::os::unix::fs::symlink(&victim, &fifo).unwrap();
        assert!(matches!(
            store.read::<Backup>("r.json"),
            Err(StoreError::NotRegular {
                what: "a symbolic link",
                ..
            })
        ));
        assert_eq!(store.read_or_discard::<Backup>("r.json").unwrap(), None);
        assert!(victim.exists() && std::fs::symlink_metadata(&fifo).is_err());
        assert!(matches!(
            open_regular(&dir.path().join("nothing")),
            Ok(Regular::Missing)
        ));
        assert!(matches!(
            open_regular(dir.path()),
            Ok(Regular::Other("a directory"))
        ));
        assert!(matches!(open_regular(&victim), Ok(Regular::File(_))));
    }

    #[test]
    fn attachment_names_never_collide_and_valid_ones_read_plainly() {
        assert_eq!(attachment_name("net", "ctr1", "eth0"), "net:ctr1:eth0");
        assert_eq!(attachment_name("a_b", "c", "eth0.1"), "a_b:c:eth0.1");
        assert_ne!(
            attachment_name("a_b", "c", "eth0"),
            attachment_name("a", "b_c", "eth0")
        );
        assert_ne!(
            attachment_name("a", "b_c", "d"),
            attachment_name("a", "b", "c_d")
        );
        // What the skel refuses is escaped, so that even it cannot make two names meet.
        assert_eq!(attachment_name("a:b", "c", "d"), "a%3Ab:c:d");
        assert_ne!(
            attachment_name("a:b", "c", "d"),
            attachment_name("a", "b:c", "d")
        );
        assert_eq!(attachment_name("%3A", "/", "\n"), "%253A:%2F:%0A");
        assert_eq!(attachment_name(".n", "c", "."), "%2En:c:.");
        assert!(store_path_ok(&attachment_name("..", "..", "..")));
        // A prefix names exactly one network (and container).
        let name = attachment_name("a", "b", "c");
        assert!(name.starts_with(&attachment_prefix("a", None)));
        assert!(name.starts_with(&attachment_prefix("a", Some("b"))));
        assert!(!attachment_name("a:b", "c", "d").starts_with(&attachment_prefix("a", None)));
        assert!(!attachment_name("a", "bc", "d").starts_with(&attachment_prefix("a", Some("b"))));
        // Generated triples: distinct triples get distinct names.
        let parts = ["", "a", "_", "a_", "_a", ":", "%", "%3A", "a:b", ".", "/"];
        let mut seen = std::collections::HashMap::new();
        for n in parts {
            for c in parts {
                for i in parts {
                    let name = attachment_name(n, c, i);
                    if let Some(other) = seen.insert(name.clone(), (n, c, i)) {
                        panic!("{name} for both {other:?} and {:?}", (n, c, i));
                    }
                }
            }
        }
    }

    fn store_path_ok(name: &str) -> bool {
        StateStore::new("/tmp/x").path(name).is_ok()
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

    #[test]
    fn read_or_discard_treats_an_unparsable_record_as_absent_and_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        for (what, bytes) in [
            ("empty", &b""[..]),
            ("truncated", b"{\"mtu\": 1500, \"ma"),
            ("garbage", b"\x00\xff garbage"),
            ("another type", b"[1, 2]"),
        ] {
            std::fs::write(dir.path().join("r.json"), bytes).unwrap();
            assert_eq!(
                store.read_or_discard::<Backup>("r.json").unwrap(),
                None,
                "{what}"
            );
            assert!(!dir.path().join("r.json").exists(), "{what}");
        }
        assert_eq!(store.read_or_discard::<Backup>("r.json").unwrap(), None);
        let good = Backup {
            mtu: 1,
            mac: "m".into(),
        };
        store.write("r.json", &good).unwrap();
        assert_eq!(
            store.read_or_discard::<Backup>("r.json").unwrap(),
            Some(good)
        );
        // Not readable is not "corrupt": reported, not removed.
        std::fs::remove_file(dir.path().join("r.json")).unwrap();
        std::fs::create_dir(dir.path().join("r.json")).unwrap();
        assert!(matches!(
            store.read_or_discard::<Backup>("r.json"),
            Err(StoreError::Io { .. })
        ));
    }
}
