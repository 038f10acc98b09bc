//! Network namespaces: open one by path and run code inside it on a throwaway thread.
//!
//! `setns(2)` switches only the calling thread, and a thread that fails to switch back would
//! leave the rest of the plugin in the wrong namespace. So nothing here ever switches back:
//! [`NetNs::run`] spawns a scoped thread, enters the namespace there, runs the closure and lets
//! the thread exit. Sockets and `/proc/sys/net` files opened by the closure stay bound to the
//! namespace after the thread is gone, so the usual pattern is "open inside, use outside".

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};
use nix::sys::statfs::{NSFS_MAGIC, PROC_SUPER_MAGIC, fstatfs};

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
    /// The path exists but is not a network namespace.
    #[error("failed to open netns {path:?}: not a network namespace")]
    NotNetns {
        /// The netns path.
        path: PathBuf,
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
    /// # Errors
    /// [`NetnsError::Open`] when the path cannot be opened, [`NetnsError::NotNetns`] when it is
    /// not a namespace file.
    pub fn open(path: impl AsRef<Path>) -> Result<NetNs, NetnsError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| NetnsError::Open {
            path: path.clone(),
            source,
        })?;
        let fs = fstatfs(file.as_fd()).map_err(|e| NetnsError::Open {
            path: path.clone(),
            source: e.into(),
        })?;
        let fs_type = fs.filesystem_type();
        if fs_type != NSFS_MAGIC && fs_type != PROC_SUPER_MAGIC {
            return Err(NetnsError::NotNetns { path });
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
    fn run_refuses_a_namespace_fd_of_another_kind() {
        let uts = NetNs::open("/proc/thread-self/ns/uts").unwrap();
        let err = uts.run(|| ()).unwrap_err();
        assert!(matches!(err, NetnsError::NotNetns { .. }), "{err}");
    }
}
