//! Network namespaces: open one by path and run code inside it on a throwaway thread.
//!
//! `setns(2)` switches only the calling thread, and a thread that fails to switch back would
//! leave the rest of the plugin in the wrong namespace. So nothing here ever switches back:
//! [`NetNs::run`] spawns a scoped thread, enters the namespace there, runs the closure and lets
//! the thread exit. Sockets and `/proc/sys/net` files opened by the closure stay bound to the
//! namespace after the thread is gone, so the usual pattern is "open inside, use outside".

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sched::{CloneFlags, setns};
use nix::sys::stat::Mode;
use nix::sys::statfs::{NSFS_MAGIC, PROC_SUPER_MAGIC, fstatfs};

use gostr::go_errno;

/// Path of the calling thread's own network namespace (`/proc/self` would name the main thread's).
pub const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// Errors from opening or entering a network namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The path could not be opened.
    #[error("failed to open netns {path:?}: {source}")]
    Open {
        /// The netns path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The path exists but is not a network namespace: a file of another filesystem (`magic`,
    /// its type in hex), or a namespace of another kind or another file of `/proc`.
    #[error("failed to open netns {path:?}: not a network namespace")]
    NotNetns {
        /// The netns path.
        path: PathBuf,
        /// The filesystem type when it is neither nsfs nor procfs.
        magic: Option<String>,
    },
    /// `setns` failed.
    #[error("failed to enter netns {path:?}: {source}")]
    Enter {
        /// The netns path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A fresh namespace could not be created (`unshare` needs `CAP_SYS_ADMIN`).
    #[error("failed to create a network namespace: {source}")]
    Create {
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The worker thread could not be started.
    #[error("failed to start a thread for netns {path:?}: {source}")]
    Thread {
        /// The netns path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl NetnsError {
    /// True when the namespace does not exist (any more): the path is missing.
    pub fn is_not_found(&self) -> bool {
        matches!(self, NetnsError::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// True when the path names no network namespace at all: missing, a path through a
    /// non-directory (`/run/netns/x/`), or a file that is no network namespace (the empty file
    /// the Go sbr leaves at a vanished `/run/netns` path, `/proc/self/status`, another kind of
    /// namespace). A DEL has nothing to remove in it then.
    pub fn is_absent(&self) -> bool {
        match self {
            NetnsError::Open { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
            }
            NetnsError::NotNetns { .. } => true,
            _ => false,
        }
    }

    /// True when the failure is ours (no thread or namespace of our own could be made), not
    /// the named namespace's: a plugin reports it as an internal error, the others as an
    /// invalid `CNI_NETNS`.
    pub fn is_internal(&self) -> bool {
        matches!(self, NetnsError::Thread { .. } | NetnsError::Create { .. })
    }

    /// The reference's message for the same failure (its `ns` package's words).
    pub fn reference_msg(&self) -> Option<String> {
        let switching = |path: &Path, cause: &str| {
            let p = path.display();
            format!("error switching to ns {p}: Error switching to ns {p}: {cause}")
        };
        Some(match self {
            NetnsError::Open { path, source } => format!(
                "failed to Statfs {}: {}",
                gostr::go_quote(&path.to_string_lossy()),
                go_errno(source)
            ),
            NetnsError::NotNetns {
                path,
                magic: Some(magic),
            } => format!(
                "unknown FS magic on {}: {magic}",
                gostr::go_quote(&path.to_string_lossy())
            ),
            NetnsError::NotNetns { path, magic: None } => switching(path, "invalid argument"),
            NetnsError::Enter { path, source } => switching(path, &go_errno(source)),
            NetnsError::Create { .. } | NetnsError::Thread { .. } => return None,
        })
    }
}

/// A namespace's identity: the device and inode of its nsfs file (`stat` of
/// `/proc/<pid>/ns/net`, of a bind mount of it, or `fstat` of an open descriptor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NsIdentity {
    /// `st_dev`: nsfs's device.
    pub dev: u64,
    /// `st_ino`: the namespace's inode number.
    pub ino: u64,
}

/// An open network namespace, held by file descriptor so it cannot vanish while in use.
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
}

impl NetNs {
    /// Opens the network namespace at `path` (a bind mount such as `/run/netns/x`, or
    /// `/proc/<pid>/ns/net`) and checks that it is one.
    ///
    /// The path is first opened with `O_PATH`, which never blocks (a FIFO would, until a
    /// writer came) and has no side effect (as opening a device can), and its filesystem
    /// checked; only an nsfs or procfs file is then opened for real, through that descriptor,
    /// and asked its namespace type (`NS_GET_NSTYPE`), so another kind of namespace
    /// (`/proc/self/ns/uts`) or file of `/proc` (`/proc/self/status`) is refused here.
    ///
    /// # Errors
    /// [`NetnsError::Open`] when the path cannot be opened, [`NetnsError::NotNetns`] when it is
    /// not a network namespace file.
    pub fn open(path: impl AsRef<Path>) -> Result<NetNs, NetnsError> {
        let path = path.as_ref().to_path_buf();
        let open_err = |e: nix::errno::Errno| NetnsError::Open {
            path: path.clone(),
            source: e.into(),
        };
        let probe = nix::fcntl::open(
            path.as_path(),
            OFlag::O_PATH | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(open_err)?;
        let fs_type = fstatfs(&probe).map_err(open_err)?.filesystem_type();
        if fs_type != NSFS_MAGIC && fs_type != PROC_SUPER_MAGIC {
            return Err(NetnsError::NotNetns {
                path,
                magic: Some(format!("{:x}", fs_type.0)),
            });
        }
        // The file the probe found, whatever the path names by now.
        let file =
            File::open(format!("/proc/self/fd/{}", probe.as_raw_fd())).map_err(|source| {
                NetnsError::Open {
                    path: path.clone(),
                    source,
                }
            })?;
        match namespace_type(&file) {
            Ok(t) if t == libc::CLONE_NEWNET => {}
            // Kernels before 4.11 lack the request; setns tells later.
            Err(nix::errno::Errno::ENOTTY) if fs_type == NSFS_MAGIC => {}
            _ => return Err(NetnsError::NotNetns { path, magic: None }),
        }
        Ok(NetNs { file, path })
    }

    /// Opens the calling thread's current network namespace.
    ///
    /// # Errors
    /// As [`NetNs::open`].
    pub fn current() -> Result<NetNs, NetnsError> {
        NetNs::open(THREAD_NETNS)
    }

    /// The path this namespace was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when both handles name the same namespace (same nsfs device and inode).
    pub fn is_same(&self, other: &NetNs) -> bool {
        match (self.file.metadata(), other.file.metadata()) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }

    /// Runs `f` on a new thread that has entered this namespace, and returns its result.
    ///
    /// The calling thread never changes namespace. Anything the closure opens (netlink
    /// sockets, `/proc/sys/net/...` files, listening sockets, child processes it spawns) is bound
    /// to this namespace. A panic in `f` is propagated to the caller.
    ///
    /// # Errors
    /// [`NetnsError::Enter`] when `setns` fails (an fd that is some other kind of namespace gives
    /// [`NetnsError::NotNetns`]), [`NetnsError::Thread`] when no thread could be started.
    pub fn run<T, F>(&self, f: F) -> Result<T, NetnsError>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        std::thread::scope(|scope| {
            let handle = std::thread::Builder::new()
                .name("netns".into())
                .spawn_scoped(scope, || {
                    setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|errno| {
                        if errno == nix::errno::Errno::EINVAL {
                            NetnsError::NotNetns {
                                path: self.path.clone(),
                                magic: None,
                            }
                        } else {
                            NetnsError::Enter {
                                path: self.path.clone(),
                                source: errno.into(),
                            }
                        }
                    })?;
                    Ok(f())
                })
                .map_err(|source| NetnsError::Thread {
                    path: self.path.clone(),
                    source,
                })?;
            match handle.join() {
                Ok(result) => result,
                Err(payload) => std::panic::resume_unwind(payload),
            }
        })
    }
}

impl NetNs {
    /// Runs `f` on the calling thread moved into this namespace, then moves the thread back.
    ///
    /// [`NetNs::run`] costs a thread start and join: two scheduler hand-offs, which a busy
    /// node stretches to milliseconds. A plugin's single-threaded main path uses this instead;
    /// anything `f` opens stays bound to this namespace, as with [`NetNs::run`]. The thread is
    /// moved back also when `f` panics.
    ///
    /// # Errors
    /// [`NetnsError::Enter`] when `setns` fails (the thread has not moved then).
    ///
    /// # Panics
    /// When the thread cannot return to its namespace (setns to a namespace it was just in,
    /// held open, does not fail in practice): going on there would program the wrong one.
    pub fn run_in_place<T>(&self, f: impl FnOnce() -> T) -> Result<T, NetnsError> {
        let home = NetNs::current()?;
        if self.is_same(&home) {
            return Ok(f());
        }
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|errno| NetnsError::Enter {
            path: self.path.clone(),
            source: errno.into(),
        })?;
        let _back = ReturnTo(home);
        Ok(f())
    }
}

impl NetNs {
    /// The namespace's identity: the device and inode of its nsfs file.
    ///
    /// # Errors
    /// When `fstat` fails.
    pub fn identity(&self) -> std::io::Result<NsIdentity> {
        let meta = self.file.metadata()?;
        Ok(NsIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// The namespace's cookie (`SO_NETNS_COOKIE`, Linux 5.14): a 64-bit number the kernel
    /// gives each network namespace it makes and never gives again, where inode numbers are
    /// reused as soon as a namespace is gone. Read from a socket made inside on the calling
    /// thread ([`NetNs::run_in_place`]); `None` where the kernel has no such option.
    ///
    /// # Errors
    /// When the namespace cannot be entered or no socket made in it.
    pub fn cookie(&self) -> Result<Option<u64>, NetnsError> {
        let socket = self.run_in_place(|| {
            nix::sys::socket::socket(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::Datagram,
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
                None,
            )
        })?;
        let socket = socket.map_err(|e| NetnsError::Enter {
            path: self.path.clone(),
            source: e.into(),
        })?;
        match netns_cookie(&socket) {
            Ok(cookie) => Ok(Some(cookie)),
            Err(nix::errno::Errno::ENOPROTOOPT) => Ok(None),
            Err(e) => Err(NetnsError::Enter {
                path: self.path.clone(),
                source: e.into(),
            }),
        }
    }
}

/// `SO_NETNS_COOKIE` (`asm-generic/socket.h`, which x86, arm, riscv, powerpc and s390 use).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The cookie of the network namespace `socket` was made in.
#[allow(unsafe_code)]
fn netns_cookie(socket: &impl AsRawFd) -> Result<u64, nix::errno::Errno> {
    let mut cookie: u64 = 0;
    let mut len: libc::socklen_t = 8;
    // SAFETY: the descriptor is open for the whole call; the kernel writes at most `len` bytes
    // (8) to `cookie`, a u64 that outlives the call, and stores the size written in `len`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            std::ptr::from_mut(&mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(cookie)
    }
}

/// Moves the calling thread back into its namespace when dropped.
struct ReturnTo(NetNs);

impl Drop for ReturnTo {
    fn drop(&mut self) {
        if let Err(errno) = setns(self.0.file.as_fd(), CloneFlags::CLONE_NEWNET) {
            // Documented on run_in_place: continuing in the wrong namespace is worse.
            #[allow(clippy::panic)]
            {
                panic!("cannot return to netns {:?}: {errno}", self.0.path);
            }
        }
    }
}

/// Runs `f` on a thread of its own inside a fresh, empty network namespace (only `lo`, down),
/// which the kernel tears down when the thread ends unless `f` keeps a handle to it. Nothing
/// `f` creates can reach the caller's namespace: STATUS probes and kernel tests use it.
/// A panic in `f` is propagated to the caller.
///
/// # Errors
/// [`NetnsError::Create`] when the namespace cannot be made, [`NetnsError::Thread`] when no
/// thread could be started.
pub fn in_new_netns<T, F>(f: F) -> Result<T, NetnsError>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("new-netns".into())
            .spawn_scoped(scope, || {
                nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(|errno| {
                    NetnsError::Create {
                        source: errno.into(),
                    }
                })?;
                Ok(f())
            })
            .map_err(|source| NetnsError::Thread {
                path: PathBuf::from("(new)"),
                source,
            })?;
        match handle.join() {
            Ok(result) => result,
            Err(payload) => std::panic::resume_unwind(payload),
        }
    })
}

/// The kind of namespace `file` is (`CLONE_NEWNET`, `CLONE_NEWUTS`…): `ioctl(NS_GET_NSTYPE)`.
#[allow(unsafe_code)]
fn namespace_type(file: &File) -> Result<libc::c_int, nix::errno::Errno> {
    // SAFETY: the descriptor is open for the whole call (borrowed from `file`); the request
    // takes no argument and writes no memory of ours.
    let t = unsafe { libc::ioctl(file.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if t < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(t)
    }
}

impl AsFd for NetNs {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn open_rejects_a_regular_file_as_not_a_netns() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"x").unwrap();
        let err = NetNs::open(f.path()).unwrap_err();
        assert!(matches!(err, NetnsError::NotNetns { .. }), "{err}");
        assert!(err.to_string().contains("not a network namespace"), "{err}");
    }

    #[test]
    fn open_reports_a_missing_path_as_not_found() {
        let err = NetNs::open("/run/netns/does-not-exist-cni-test").unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert!(err.to_string().contains("does-not-exist-cni-test"));
    }

    #[test]
    fn current_is_same_as_itself_and_not_as_a_new_namespace() {
        let here = NetNs::current().unwrap();
        assert!(here.is_same(&NetNs::current().unwrap()));
        // Make a fresh namespace on a thread of our own and keep a handle to it.
        let other = in_new_netns(|| NetNs::current().unwrap()).unwrap();
        assert!(!here.is_same(&other));
    }

    #[test]
    fn run_in_place_moves_the_thread_there_and_back_also_on_panic() {
        let before = NetNs::current().unwrap();
        let other = in_new_netns(|| NetNs::current().unwrap()).unwrap();
        let inside = other.run_in_place(|| NetNs::current().unwrap()).unwrap();
        assert!(inside.is_same(&other));
        assert!(NetNs::current().unwrap().is_same(&before));
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            other.run_in_place(|| panic!("inside")).unwrap();
        }));
        assert!(caught.is_err());
        assert!(NetNs::current().unwrap().is_same(&before));
    }

    #[test]
    fn run_enters_the_namespace_and_leaves_the_caller_where_it_was() {
        let before = NetNs::current().unwrap();
        let other = in_new_netns(|| NetNs::current().unwrap()).unwrap();
        let inside = other.run(|| NetNs::current().unwrap()).unwrap();
        assert!(inside.is_same(&other));
        assert!(NetNs::current().unwrap().is_same(&before));
        // A fresh namespace has only loopback: its sysctl tree says so from inside.
        let ifaces = other
            .run(|| {
                std::fs::read_dir("/proc/sys/net/ipv4/conf")
                    .unwrap()
                    .count()
            })
            .unwrap();
        // all, default, lo
        assert_eq!(ifaces, 3);
    }

    #[test]
    fn run_propagates_a_panic_of_the_closure() {
        let here = NetNs::current().unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            here.run(|| panic!("boom")).unwrap();
        }));
        assert!(caught.is_err());
    }

    #[test]
    fn open_refuses_what_opens_but_is_no_network_namespace_with_the_references_words() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let trailing = format!("{}/", file.display());
        // (path, reference msg)
        let cases = [
            (
                "/proc/self/ns/uts".to_string(),
                "error switching to ns /proc/self/ns/uts: Error switching to ns \
                 /proc/self/ns/uts: invalid argument"
                    .to_string(),
            ),
            (
                "/proc/self/status".to_string(),
                "error switching to ns /proc/self/status: Error switching to ns \
                 /proc/self/status: invalid argument"
                    .to_string(),
            ),
            (
                trailing.clone(),
                format!("failed to Statfs \"{trailing}\": not a directory"),
            ),
            (
                "/run/netns/cni-test-no-such-ns".to_string(),
                "failed to Statfs \"/run/netns/cni-test-no-such-ns\": no such file or directory"
                    .to_string(),
            ),
        ];
        for (path, msg) in cases {
            let err = NetNs::open(&path).unwrap_err();
            assert!(err.is_absent(), "{path}: {err}");
            assert!(!err.is_internal(), "{path}");
            assert_eq!(err.reference_msg().as_deref(), Some(msg.as_str()));
            assert!(err.to_string().contains(&path), "{err}");
        }
        // A regular file elsewhere: its filesystem's magic, as Go prints it.
        let err = NetNs::open(&file).unwrap_err();
        assert!(
            matches!(err, NetnsError::NotNetns { magic: Some(_), .. }),
            "{err}"
        );
        assert!(
            err.reference_msg()
                .unwrap_or_default()
                .starts_with(&format!("unknown FS magic on \"{}\": ", file.display()))
        );
    }

    #[test]
    fn open_never_blocks_on_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        // Detached: if open blocked, the test fails at the deadline instead of hanging.
        std::thread::spawn(move || {
            let _ = tx.send(NetNs::open(&path).map(|_| ()));
        });
        let result = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("NetNs::open of a FIFO blocked");
        let err = result.unwrap_err();
        assert!(
            matches!(err, NetnsError::NotNetns { .. }) && err.is_absent(),
            "{err}"
        );
    }

    #[test]
    fn a_network_namespace_opens_through_any_of_its_paths() {
        let here = NetNs::open("/proc/self/ns/net").unwrap();
        assert!(here.is_same(&NetNs::open("/proc/thread-self/ns/net").unwrap()));
        assert_eq!(here.path(), Path::new("/proc/self/ns/net"));
    }
}
