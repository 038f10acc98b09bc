//! File locks with a bounded wait, held for exactly as long as a [`FileLock`] value lives.
//!
//! The lock is `flock(2)` through `std::fs::File::lock`, the same mechanism the Go plugins use on
//! their state files. A lock that stays contended past the wait becomes code 11 ("try again
//! later"), so the runtime retries instead of the plugin hanging forever.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long plugins wait for a contended lock by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// A failure to take a lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file could not be opened or created.
    #[error("failed to open lock file {path:?}: {source}")]
    Open {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another holder kept the lock for the whole wait.
    #[error("lock {path:?} is held by another process; gave up after {waited:?}")]
    Timeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// flock failed for another reason.
    #[error("failed to lock {path:?}: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// An exclusive lock on a file; released when dropped.
#[derive(Debug)]
pub struct FileLock {
    file: File,
    path: PathBuf,
}

impl FileLock {
    /// Locks `path` (creating it and its directory if needed), waiting at most `wait`.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when still contended after `wait`; other variants for I/O errors.
    pub fn acquire(path: impl AsRef<Path>, wait: Duration) -> Result<FileLock, LockError> {
        let path = path.as_ref().to_path_buf();
        let open_err = |source| LockError::Open {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(open_err)?;
        }
        // O_NONBLOCK: a FIFO planted at the path must not hold the call up (an open for
        // reading and writing returns at once anyway; flock works on it as on any file).
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(open_err)?;
        FileLock::acquire_file(file, path, wait)
    }

    /// The lock of a teardown (DEL, GC), which must go on when the directory of the lock file
    /// cannot be written (read-only, full): [`FileLock::acquire`], and when it cannot open the
    /// file for that, the existing file locked through a read-only descriptor (`flock` needs no
    /// write access). `None` when there is no such file either: nothing can make it, so no call
    /// can hold it, and the teardown goes on unlocked (logged).
    ///
    /// # Errors
    /// As [`FileLock::acquire`], but for those failures to open the file for writing.
    pub fn acquire_for_teardown(
        path: impl AsRef<Path>,
        wait: Duration,
    ) -> Result<Option<FileLock>, LockError> {
        let path = path.as_ref();
        match FileLock::acquire(path, wait) {
            Ok(lock) => Ok(Some(lock)),
            Err(LockError::Open { source, .. })
                if matches!(
                    source.raw_os_error(),
                    Some(libc::EROFS | libc::ENOSPC | libc::EDQUOT)
                ) =>
            {
                // Read-only, the open of a FIFO would wait for a writer.
                let read_only = OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(path);
                match read_only {
                    Ok(file) => Ok(Some(FileLock::acquire_file(
                        file,
                        path.to_path_buf(),
                        wait,
                    )?)),
                    Err(e) => {
                        log::info!(
                            "going on without the lock {}: {source}; {e}",
                            path.display()
                        );
                        Ok(None)
                    }
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Locks an already open file (for example a directory), waiting at most `wait`.
    ///
    /// A contended lock is waited for in the kernel (a blocking `flock` on a helper thread),
    /// not polled: the kernel hands a released lock to a waiter at once, so under contention
    /// the waiters get through one after the other with no idle gap, where pollers asleep
    /// between attempts leave the lock free for whoever asks first and time out behind them.
    ///
    /// # Errors
    /// As [`FileLock::acquire`].
    pub fn acquire_file(file: File, path: PathBuf, wait: Duration) -> Result<FileLock, LockError> {
        match file.try_lock() {
            Ok(()) => return Ok(FileLock { file, path }),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(source)) => return Err(LockError::Lock { path, source }),
        }
        let start = Instant::now();
        match wait_for_lock(&file, wait) {
            Ok(true) => Ok(FileLock { file, path }),
            Ok(false) => Err(LockError::Timeout {
                path,
                waited: start.elapsed(),
            }),
            Err(source) => Err(LockError::Lock { path, source }),
        }
    }

    /// The locked path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Blocks in `flock(LOCK_EX)` on another descriptor of `file`'s open file description, on a
/// helper thread, for at most `wait`: true when the lock is taken. A waiter that outlives its
/// caller's patience takes the lock, finds no one to hand it to and drops its descriptor;
/// the caller has dropped `file` by then or drops it on its error path, so the lock, which
/// belongs to the open file description, goes with the last of the two.
fn wait_for_lock(file: &File, wait: Duration) -> std::io::Result<bool> {
    let waiter = file.try_clone()?;
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("lock-wait".to_owned())
        .spawn(move || {
            let taken = loop {
                match waiter.lock() {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    other => break other,
                }
            };
            // A send fails once the caller gave up; dropping `waiter` then leaves the lock to
            // the caller's descriptor, which is closed or about to be.
            let _ = tx.send(taken);
        })?;
    match rx.recv_timeout(wait) {
        Ok(taken) => taken.map(|()| true),
        Err(mpsc::RecvTimeoutError::Timeout) => Ok(false),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(std::io::Error::other("the lock waiter thread died"))
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Closing the file would release it too; unlocking first makes the order explicit.
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_times_out_with_code_11_and_succeeds_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.lock");
        let first = FileLock::acquire(&path, Duration::from_secs(1)).unwrap();
        let started = Instant::now();
        let err = FileLock::acquire(&path, Duration::from_millis(100)).unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("state.lock"), "{err}");
        drop(first);
        FileLock::acquire(&path, Duration::from_millis(100)).unwrap();
    }

    #[test]
    fn a_teardown_lock_on_a_writable_directory_is_the_plain_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/lock");
        let held = FileLock::acquire_for_teardown(&path, Duration::from_secs(1)).unwrap();
        assert!(held.is_some());
        let err = FileLock::acquire_for_teardown(&path, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    }

    #[test]
    fn a_waiter_gets_the_lock_when_the_holder_lets_go_within_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let first = FileLock::acquire(&path, Duration::from_secs(1)).unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(first);
        });
        let second = FileLock::acquire(&path, Duration::from_secs(5)).unwrap();
        assert_eq!(second.path(), path);
        releaser.join().unwrap();
    }

    #[test]
    fn an_unopenable_path_is_an_io_error() {
        let err =
            FileLock::acquire("/proc/no-such-dir/x.lock", Duration::from_millis(10)).unwrap_err();
        assert!(matches!(err, LockError::Open { .. }), "{err}");
    }
}
