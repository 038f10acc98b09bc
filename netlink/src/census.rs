//! Whether a network namespace recorded while it lived is gone, told from the kernel's own
//! accounts, never from a path: a path can be unmounted while the namespace lives on (a
//! process still in it, a bind mount elsewhere), and a `/proc/<pid>/ns/net` path vanishes with
//! its process while other processes keep the namespace.
//!
//! A [`Remembered`] namespace holds what identifies it:
//!
//! - its **nsid**, the id the recording namespace gives it (`RTM_GETNSID`; given then if it
//!   had none, as the kernel does itself when a link gets its peer there). The kernel forgets
//!   an id only when it destroys the namespace, and answers for none being destroyed: an id
//!   that names no namespace any more proves the namespace gone. Ids are reused, lowest first,
//!   so one that is found may be another namespace's since;
//! - its **cookie** (`SO_NETNS_COOKIE`, Linux 5.14): a number the kernel gives each network
//!   namespace and never gives again;
//! - its nsfs **device and inode**. Inode numbers are unique among the namespaces that exist
//!   but reused as soon as one is gone.
//!
//! It is [`Presence::Gone`] only on proof: its id names no namespace; or a namespace that
//! exists has its id or its inode number and another cookie (ids and inode numbers are unique
//! among existing namespaces, so the remembered one no longer exists). Such a namespace is
//! looked for at the remembered path, then in a [`Census`] of what the host's processes hold:
//! every thread's network namespace, every open descriptor of one, every bind mount of one in
//! the mount namespace of any thread. Anything else is [`Presence::Referenced`] (found, with
//! the same cookie, or one that cannot be read) or [`Presence::Unknown`] (not found, or not
//! told apart without a cookie): a live namespace is never taken for gone, also not one that
//! only a socket or a descriptor in flight keeps, which no census can see.

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::Netlink;
use host::netns::{NetNs, NsIdentity};
use serde::{Deserialize, Serialize};

/// `KCMP_FILES`: whether two tasks share one descriptor table.
const KCMP_FILES: libc::c_long = 2;

/// What became of a [`Remembered`] namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// It exists: where it was found (a path), or how it was told.
    Referenced(String),
    /// It no longer exists: the proof.
    Gone(String),
    /// Neither could be proven: why.
    Unknown(String),
}

impl Presence {
    /// Whether it is [`Presence::Gone`].
    pub fn is_gone(&self) -> bool {
        matches!(self, Presence::Gone(_))
    }
}

/// What identifies a network namespace, recorded while it lived (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remembered {
    /// Its nsfs device and inode.
    pub identity: NsIdentity,
    /// Its cookie, where the kernel has them.
    pub cookie: Option<u64>,
    /// The id the recording namespace gives it, where one could be had.
    pub nsid: Option<i32>,
}

impl Remembered {
    /// Records `ns` as the calling thread's namespace sees it (its id given now if it had
    /// none). What cannot be read is left out and logged: the namespace is then only harder
    /// to prove gone.
    ///
    /// # Errors
    /// When `fstat` of the namespace fails.
    pub fn of(ns: &NetNs) -> std::io::Result<Remembered> {
        let identity = ns.identity()?;
        let cookie = ns
            .cookie()
            .inspect_err(|e| log::info!("no cookie for {}: {e}", ns.path().display()))
            .ok()
            .flatten();
        let nsid = Netlink::new()
            .and_then(|mut nl| nl.nsid_given(ns.as_fd()))
            .inspect_err(|e| log::info!("no id for {}: {e}", ns.path().display()))
            .ok();
        Ok(Remembered {
            identity,
            cookie,
            nsid,
        })
    }

    /// What became of the namespace, asked in the namespace that recorded it: its id, then
    /// the namespace now at `path` (where it was recorded from), then the namespaces of the
    /// census `census` gives (taken only when these did not tell).
    pub fn presence<'c>(&self, path: &Path, census: impl FnOnce() -> &'c Census) -> Presence {
        let mut id_taken = false;
        if let Some(nsid) = self.nsid {
            match Netlink::new().and_then(|mut nl| nl.nsid_exists(nsid)) {
                Ok(false) => {
                    return Presence::Gone(format!("its namespace id {nsid} names none any more"));
                }
                Ok(true) => id_taken = true,
                Err(e) => log::info!("cannot look namespace id {nsid} up: {e}"),
            }
        }
        let Some(cookie) = self.cookie else {
            return Presence::Unknown("no cookie was recorded to tell it from another".into());
        };
        // The path, where it still names a namespace with the inode number.
        if std::fs::metadata(path)
            .is_ok_and(|m| (m.dev(), m.ino()) == (self.identity.dev, self.identity.ino))
        {
            return same_cookie(path, cookie);
        }
        let census = census();
        if let Some(found) = census.net.get(&self.identity.ino)
            && self.identity.dev == census.nsfs_dev
        {
            return same_cookie(found, cookie);
        }
        if let Some(nsid) = self.nsid.filter(|_| id_taken) {
            return census.holder_of_nsid(nsid, cookie);
        }
        Presence::Unknown("no namespace has its inode number".into())
    }
}

/// The owner's network namespace as ADD saw it: the `CNI_NETNS` path, and what identifies the
/// namespace whatever becomes of the path ([`Remembered`]: its nsfs device and inode, its
/// cookie, the id the plugin's namespace gives it). Whether it is gone is told from the
/// kernel's accounts of these, never from the path alone (see the module docs).
///
/// Serialised as the plugins' records keep it (portmap's state, firewall's records).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetnsId {
    /// `CNI_NETNS`.
    pub path: PathBuf,
    /// `st_dev` of the namespace's nsfs file.
    pub dev: u64,
    /// `st_ino` of the namespace's nsfs file: its inode number.
    pub ino: u64,
    /// The namespace's cookie (Linux 5.14 and later). Absent in records of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<u64>,
    /// The id the plugin's namespace gives it (`ip netns list-id`). Absent in records of
    /// earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nsid: Option<i32>,
}

impl NetnsId {
    /// The identity of the namespace at `path`, when it is one that can be opened (with the
    /// plugin's namespace giving it an id if it had none).
    #[must_use]
    pub fn of(path: &Path) -> Option<NetnsId> {
        let ns = NetNs::open(path)
            .inspect_err(|e| log::debug!("not recording the owner's namespace: {e}"))
            .ok()?;
        let remembered = Remembered::of(&ns)
            .inspect_err(|e| log::debug!("cannot identify {}: {e}", path.display()))
            .ok()?;
        Some(NetnsId {
            path: path.to_path_buf(),
            dev: remembered.identity.dev,
            ino: remembered.identity.ino,
            cookie: remembered.cookie,
            nsid: remembered.nsid,
        })
    }

    fn remembered(&self) -> Remembered {
        Remembered {
            identity: NsIdentity {
                dev: self.dev,
                ino: self.ino,
            },
            cookie: self.cookie,
            nsid: self.nsid,
        }
    }

    /// Whether the namespace is proven gone by its id alone: it recorded one, and `ids`, the
    /// ids the recording namespace gives namespaces that exist ([`Netlink::nsids`], one dump
    /// for many records), lacks it. The kernel forgets an id only when it destroys the
    /// namespace, so this holds when `ids` was read after the record was written. The first
    /// proof [`NetnsId::is_gone`] tries, for many records at the cost of one request; `false`
    /// tells nothing (no id recorded, or it is there: then only `is_gone` can tell; a dump
    /// still lists the id of a namespace being destroyed, until the kernel's cleanup of it
    /// runs, where `is_gone`'s look-up of the one id finds none).
    #[must_use]
    pub fn gone_by_id(&self, ids: &HashSet<i32>) -> bool {
        let gone = self.nsid.is_some_and(|id| !ids.contains(&id));
        if gone {
            log::info!(
                "network namespace {} is gone: its namespace id {} names none any more",
                self.path.display(),
                self.nsid.unwrap_or_default()
            );
        }
        gone
    }

    /// Whether the namespace is gone, proven by the kernel ([`Remembered::presence`]); the
    /// census is taken, once, only when the id and path do not tell. A namespace that cannot
    /// be proven gone counts as live: a live owner must never lose its ports.
    #[must_use]
    pub fn is_gone(&self, census: &OnceCell<Census>) -> bool {
        let presence = self
            .remembered()
            .presence(&self.path, || census.get_or_init(Census::take));
        match presence {
            Presence::Gone(proof) => {
                log::info!("network namespace {} is gone: {proof}", self.path.display());
                true
            }
            Presence::Referenced(at) => {
                log::debug!("network namespace {} lives: {at}", self.path.display());
                false
            }
            Presence::Unknown(why) => {
                log::info!(
                    "network namespace {} counts as live: {why}",
                    self.path.display()
                );
                false
            }
        }
    }
}

/// Whether the namespace at `path` has `cookie`: [`Presence::Referenced`] when it has, or
/// when that cannot be told; [`Presence::Gone`] when it has another (it holds a number, an id
/// or an inode, that only one existing namespace can hold: the one with `cookie` is gone).
fn same_cookie(path: &Path, cookie: u64) -> Presence {
    match NetNs::open(path).and_then(|ns| ns.cookie()) {
        Ok(Some(c)) if c != cookie => Presence::Gone(format!(
            "{} is another namespace (cookie {c}, not {cookie})",
            path.display()
        )),
        Ok(_) => Presence::Referenced(path.display().to_string()),
        Err(e) => {
            log::debug!("cannot read the cookie of {}: {e}", path.display());
            Presence::Referenced(path.display().to_string())
        }
    }
}

/// The network namespaces the host's processes hold, each with a path it can be opened by
/// (see the module docs). It reads every process's task and descriptor directories (tens of
/// milliseconds on a busy node): take one only when a decision rests on it, and once per call.
/// What cannot be read is skipped: a census only finds namespaces, it proves nothing absent.
#[derive(Debug, Default)]
pub struct Census {
    /// nsfs's device (there is one nsfs).
    nsfs_dev: u64,
    /// The inode numbers of the network namespaces found, each with the first path found.
    net: HashMap<u64, PathBuf>,
}

impl Census {
    /// Takes a census of `/proc`.
    pub fn take() -> Census {
        Census::take_from(Path::new("/proc"))
    }

    /// Takes a census of the `proc` filesystem mounted at `proc`.
    pub fn take_from(proc: &Path) -> Census {
        let mut census = Census::default();
        if let Ok(m) = std::fs::metadata(proc.join("self/ns/net")) {
            census.nsfs_dev = m.dev();
        }
        let Ok(entries) = std::fs::read_dir(proc) else {
            return census;
        };
        for entry in entries.filter_map(Result::ok) {
            let pid = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok());
            if let Some(pid) = pid {
                census.process(proc, pid);
            }
        }
        census
    }

    /// The number of network namespaces found.
    pub fn len(&self) -> usize {
        self.net.len()
    }

    /// Whether none was found.
    pub fn is_empty(&self) -> bool {
        self.net.is_empty()
    }

    /// Whether a namespace with inode number `ino` was found, and where.
    pub fn find(&self, ino: u64) -> Option<&Path> {
        self.net.get(&ino).map(PathBuf::as_path)
    }

    /// What the namespace with id `nsid` (here), which exists, tells of the one with
    /// `cookie` that had it: found among the census's with another cookie, that one is gone.
    fn holder_of_nsid(&self, nsid: i32, cookie: u64) -> Presence {
        let Ok(mut nl) = Netlink::new() else {
            return Presence::Unknown("no netlink socket to look ids up".into());
        };
        for path in self.net.values() {
            let Ok(ns) = NetNs::open(path) else {
                continue;
            };
            if nl.nsid_of(ns.as_fd()).ok().flatten() == Some(nsid) {
                return same_cookie(path, cookie);
            }
        }
        Presence::Unknown(format!(
            "namespace id {nsid} names a namespace no process shows"
        ))
    }

    fn add(&mut self, target: &[u8], path: impl FnOnce() -> PathBuf) {
        if let Some(ino) = ns_link(target, "net") {
            self.net.entry(ino).or_insert_with(path);
        }
    }

    /// The threads of process `pid`: their network namespaces, the bind mounts their mount
    /// namespaces hold, their descriptors.
    fn process(&mut self, proc: &Path, pid: i32) {
        let Ok(tasks) = std::fs::read_dir(proc.join(pid.to_string()).join("task")) else {
            return;
        };
        let mut mounts_read = Vec::new();
        for task in tasks.filter_map(Result::ok) {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let dir = task.path();
            if let Ok(target) = std::fs::read_link(dir.join("ns/net")) {
                self.add(target.as_os_str().as_bytes(), || dir.join("ns/net"));
            }
            // Each mount namespace once per process (threads rarely leave theirs).
            if let Ok(mnt) = std::fs::read_link(dir.join("ns/mnt"))
                && !mounts_read.contains(&mnt)
            {
                self.mounts(&dir);
                mounts_read.push(mnt);
            }
            if tid == pid || !shares_descriptors(pid, tid) {
                self.descriptors(&dir);
            }
        }
    }

    /// The network namespaces a task's descriptors hold.
    fn descriptors(&mut self, task: &Path) {
        let Ok(fds) = std::fs::read_dir(task.join("fd")) else {
            return;
        };
        for fd in fds.filter_map(Result::ok) {
            let path = fd.path();
            if let Ok(target) = std::fs::read_link(&path) {
                self.add(target.as_os_str().as_bytes(), || path);
            }
        }
    }

    /// The bind mounts of network namespaces in a task's mount namespace, each reached
    /// through the task's root.
    fn mounts(&mut self, task: &Path) {
        let Ok(text) = std::fs::read(task.join("mountinfo")) else {
            return;
        };
        for line in text.split(|b| *b == b'\n') {
            let Some((fields, fs)) = split_mountinfo(line) else {
                continue;
            };
            let [_, _, _, source, point, ..] = fields[..] else {
                continue;
            };
            if fs == b"nsfs" {
                let point = unescape_mountinfo(point);
                let point = point.strip_prefix(b"/").unwrap_or(&point);
                let path = task.join("root").join(std::ffi::OsStr::from_bytes(point));
                self.add(source, || path);
            }
        }
    }
}

/// The namespace of type `kind` a `readlink` of an nsfs file names (`net:[4026531840]`).
fn ns_link(target: &[u8], kind: &str) -> Option<u64> {
    let rest = target.strip_prefix(kind.as_bytes())?.strip_prefix(b":[")?;
    let digits = rest.strip_suffix(b"]")?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// A `mountinfo` line split at its ` - ` separator: the fields before it, and the filesystem
/// type after it.
fn split_mountinfo(line: &[u8]) -> Option<(Vec<&[u8]>, &[u8])> {
    let fields: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
    let dash = fields.iter().position(|f| *f == b"-")?;
    let fs = fields.get(dash + 1)?;
    Some((fields[..dash].to_vec(), fs))
}

/// A `mountinfo` path with its octal escapes (`\040` for a space) undone.
fn unescape_mountinfo(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(
                    d.iter()
                        .fold(0u8, |n, c| n.wrapping_mul(8).wrapping_add(c - b'0')),
                );
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// Whether thread `tid` of process `pid` shares its leader's descriptor table (threads made
/// by `pthread_create` always do). When it cannot be told, it does not: the table is read.
fn shares_descriptors(pid: i32, tid: i32) -> bool {
    // SAFETY: kcmp takes two pids, a type and two integers and touches no memory of ours.
    #[allow(unsafe_code)]
    let same = unsafe { libc::syscall(libc::SYS_kcmp, pid, tid, KCMP_FILES, 0, 0) };
    same == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::sync::mpsc;

    use nix::sched::{CloneFlags, setns, unshare};

    #[test]
    fn nsfs_links_and_mountinfo_fields_parse() {
        assert_eq!(ns_link(b"net:[4026531840]", "net"), Some(4_026_531_840));
        assert_eq!(ns_link(b"mnt:[4026531841]", "net"), None);
        assert_eq!(ns_link(b"net:[x]", "net"), None);
        assert_eq!(ns_link(b"socket:[12]", "net"), None);
        let line = b"611 29 0:4 net:[4026532600] /run/netns/a\\040b rw shared:5 - nsfs nsfs rw";
        let (fields, fs) = split_mountinfo(line).unwrap();
        assert_eq!(fs, b"nsfs");
        assert_eq!(fields[3], b"net:[4026532600]");
        assert_eq!(unescape_mountinfo(fields[4]), b"/run/netns/a b");
        assert_eq!(unescape_mountinfo(b"\\134x\\0"), b"\\x\\0");
        assert!(split_mountinfo(b"no separator").is_none());
    }

    /// A thread that runs `setup` and then waits until told to end.
    struct Holder {
        end: mpsc::Sender<()>,
        thread: std::thread::JoinHandle<()>,
    }

    impl Holder {
        fn start<T: Send + 'static>(setup: impl FnOnce() -> T + Send + 'static) -> (Holder, T) {
            let (end, ended) = mpsc::channel::<()>();
            let (ready, got) = mpsc::channel();
            let thread = std::thread::spawn(move || {
                ready.send(setup()).unwrap();
                let _ = ended.recv();
            });
            (Holder { end, thread }, got.recv().unwrap())
        }

        fn stop(self) {
            drop(self.end);
            self.thread.join().unwrap();
        }
    }

    /// What becomes of `ns` once it settles: a thread that was joined may hold its
    /// namespaces a moment longer, and a namespace whose last holder let go is destroyed
    /// by a kernel worker. Only whether it is gone is waited for.
    fn settled(ns: &Remembered, gone: bool) -> Presence {
        let path = Path::new("/nonexistent");
        let mut census = Census::take();
        let mut last = ns.presence(path, || &census);
        for _ in 0..400 {
            if last.is_gone() == gone {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
            census = Census::take();
            last = ns.presence(path, || &census);
        }
        last
    }

    /// Runs `f` in a namespace of its own, where the ids `Remembered::of` gives are given.
    fn isolated(f: impl FnOnce() + Send) {
        host::netns::in_new_netns(f).expect("a network namespace of our own needs root");
    }

    #[test]
    fn a_namespace_is_not_gone_while_a_thread_a_descriptor_or_a_mount_holds_it() {
        isolated(not_gone_while_held);
    }

    fn not_gone_while_held() {
        // A fresh namespace, held by nothing but this descriptor once its thread is gone.
        let file = std::thread::spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET) needs root");
            File::open("/proc/thread-self/ns/net").unwrap()
        })
        .join()
        .unwrap();
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
        let ns = NetNs::open(&path).unwrap();
        let remembered = Remembered::of(&ns).unwrap();
        assert!(remembered.nsid.is_some(), "{remembered:?}");
        assert_eq!(remembered.identity, ns.identity().unwrap());
        drop(ns);
        let p = settled(&remembered, false);
        assert!(matches!(p, Presence::Referenced(_)), "descriptor: {p:?}");
        // Found by its path as well.
        assert!(matches!(
            remembered.presence(Path::new(&path), || panic!("census taken")),
            Presence::Referenced(_)
        ));

        // A thread in it.
        let inside = File::open(&path).unwrap();
        let (holder, ()) =
            Holder::start(move || setns(inside.as_fd(), CloneFlags::CLONE_NEWNET).unwrap());
        let mount_source = File::open(&path).unwrap();
        drop(file);
        let p = settled(&remembered, false);
        assert!(matches!(p, Presence::Referenced(_)), "thread: {p:?}");
        holder.stop();

        // A bind mount of it in a private mount namespace that a thread is in.
        let (holder, ()) = Holder::start(move || {
            let dir = tempfile::tempdir().unwrap();
            let target = dir.path().join("ns");
            std::fs::write(&target, "").unwrap();
            unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS).unwrap();
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .unwrap();
            let source = format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&mount_source)
            );
            nix::mount::mount(
                Some(source.as_str()),
                &target,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .unwrap();
            drop(mount_source);
            // The directory stays: removing it would need the mount gone, and the mount goes
            // with the mount namespace.
            std::mem::forget(dir);
        });
        let p = settled(&remembered, false);
        assert!(matches!(p, Presence::Referenced(_)), "mount: {p:?}");
        holder.stop();
        // Nothing holds it now: its id names none, whatever got its inode number since.
        let p = settled(&remembered, true);
        assert!(p.is_gone(), "{p:?}");
    }

    #[test]
    fn a_namespace_with_the_remembered_inode_number_and_another_cookie_proves_it_gone() {
        isolated(another_cookie_proves_it_gone);
    }

    fn another_cookie_proves_it_gone() {
        let file = std::thread::spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET) needs root");
            File::open("/proc/thread-self/ns/net").unwrap()
        })
        .join()
        .unwrap();
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
        let ns = NetNs::open(&path).unwrap();
        let real = Remembered::of(&ns).unwrap();
        let Some(cookie) = real.cookie else {
            // A kernel without cookies (before 5.14) cannot tell two namespaces apart so.
            return;
        };
        // As if a namespace that had its inode number and no id were remembered.
        let other = Remembered {
            cookie: Some(cookie.wrapping_add(1)),
            nsid: None,
            ..real
        };
        let census = Census::take();
        assert!(census.find(real.identity.ino).is_some(), "the descriptor");
        assert!(other.presence(Path::new(&path), || &census).is_gone());
        assert!(matches!(
            real.presence(Path::new(&path), || &census),
            Presence::Referenced(_)
        ));
        // Without a cookie, another namespace at the number cannot be told from it.
        let unsure = Remembered {
            cookie: None,
            nsid: None,
            ..real
        };
        assert!(matches!(
            unsure.presence(Path::new(&path), || &census),
            Presence::Unknown(_)
        ));
        drop(file);
    }

    /// Whether `id` is gone, once the kernel has settled (a namespace whose last holder let
    /// go is destroyed by a kernel worker).
    fn settles_gone(id: &NetnsId) -> bool {
        (0..400).any(|_| {
            let gone = id.is_gone(&OnceCell::new());
            if !gone {
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            gone
        })
    }

    #[test]
    fn an_owner_is_gone_only_once_its_namespace_is_not_once_its_path_is() {
        isolated(|| {
            // A namespace X, and a process in it whose path ADD records.
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let (ready, got) = std::sync::mpsc::channel();
            let inside = std::thread::spawn(move || {
                host::netns::in_new_netns(move || {
                    let child = std::process::Command::new("sleep")
                        .arg("1000")
                        .spawn()
                        .unwrap();
                    ready.send(child).unwrap();
                    // This thread keeps X while it waits.
                    let _ = rx.recv();
                })
                .unwrap();
            });
            let mut child = got.recv().unwrap();
            let path = PathBuf::from(format!("/proc/{}/ns/net", child.id()));
            let id = NetnsId::of(&path).unwrap();
            assert!(id.nsid.is_some(), "{id:?}");
            assert!(!id.is_gone(&OnceCell::new()));
            // The process exits: its path is gone, the namespace is not (issue 26 item 3).
            child.kill().unwrap();
            child.wait().unwrap();
            assert!(!path.exists());
            let census = OnceCell::new();
            assert!(!id.is_gone(&census), "taken for gone with a thread in it");
            let ids: HashSet<i32> = Netlink::new()
                .unwrap()
                .nsids()
                .unwrap()
                .into_iter()
                .collect();
            assert!(
                ids.contains(&id.nsid.unwrap()) && !id.gone_by_id(&ids),
                "{ids:?}"
            );
            // Nothing holds it any more.
            drop(tx);
            inside.join().unwrap();
            assert!(settles_gone(&id));
            // The ids of the namespace that recorded it, in one dump, lack its id too, once
            // the kernel's cleanup has run (a dump lists the id of a namespace being
            // destroyed, which the look-up of one id does not find).
            let dumped = || -> HashSet<i32> {
                Netlink::new()
                    .unwrap()
                    .nsids()
                    .unwrap()
                    .into_iter()
                    .collect()
            };
            assert!(
                (0..400).any(|_| {
                    let gone = id.gone_by_id(&dumped());
                    if !gone {
                        std::thread::sleep(std::time::Duration::from_millis(25));
                    }
                    gone
                }),
                "{:?}",
                dumped()
            );
            // An earlier version's record tells only the path and inode: never proven gone.
            let earlier = NetnsId {
                cookie: None,
                nsid: None,
                ..id
            };
            assert!(!earlier.is_gone(&OnceCell::new()));
            // Something that is no namespace is not recorded.
            let tmp = tempfile::tempdir().unwrap();
            std::fs::write(tmp.path().join("ns"), "").unwrap();
            assert_eq!(NetnsId::of(&tmp.path().join("ns")), None);
        });
    }
}
