//! Slow kernel work that a plugin leaves to a detached child, so that its own exit does not wait
//! for it.
//!
//! The last `close(2)` of an nf_tables socket whose batch deleted rules, chains or set elements
//! waits for the kernel to free them: an RCU grace period, 3–12 ms here, more than all of a
//! DEL's own work. The objects were already deleted when the batch was acknowledged.
//! [`hand_off`] lets a child hold the socket until the plugin has exited. A runtime waits for
//! the plugin to exit, so DEL would otherwise pay for it.
//!
//! The child is a `fork(2)` of the plugin, not a new exec of its binary: no exec, no second
//! start-up. That costs a tenth of a millisecond against about half a millisecond. It is
//! detached in three ways:
//! - its stdin, stdout and stderr are on `/dev/null`: a runtime reading the plugin's output to
//!   EOF must not wait for it;
//! - every other descriptor is closed except the ones it works on: a lock file the plugin held
//!   must not stay locked by the child;
//! - it has a process group of its own, so a runtime killing the plugin's group does not kill
//!   it, which would only move the wait back.
//!
//! It is named `cni-linger` (`/proc/<pid>/comm`, what `ps` shows). The plugin does not wait for
//! it, and it is reparented when the plugin exits.
//!
//! After a fork, the child of a process with several threads may only make async-signal-safe
//! calls: another thread may have held the allocator's lock at the fork. The child here only
//! makes plain system calls on buffers prepared before the fork: no allocation, no lock, no
//! logging. So it is sound whatever threads the plugin has.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, RawFd};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::unistd::{ForkResult, Pid};

/// What the child is called in `/proc/<pid>/comm`.
pub const CHILD_NAME: &CStr = c"cni-linger";

/// Lets a detached child hold a duplicate of `fd` until this process has exited: the caller
/// drops its own descriptor as usual, and its close is then not the last one.
///
/// # Errors
/// When the pipe or the child cannot be made; the caller then simply closes the descriptor
/// itself and pays the wait.
pub fn hand_off(fd: impl AsFd) -> std::io::Result<()> {
    let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let child = detach(&[fd.as_fd(), rx.as_fd()], || {
        // The write end closes when this process exits (the child closed its own copy).
        let mut sink = [0u8; 8];
        loop {
            match nix::unistd::read(&rx, &mut sink) {
                Err(nix::errno::Errno::EINTR) => {}
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })?;
    // Never written to, and never closed before exit: that EOF releases the child.
    std::mem::forget(tx);
    log::debug!("descriptor handed to pid {child}");
    Ok(())
}

/// Forks a detached child (see the module docs) that keeps only `keep` (and stdio on
/// `/dev/null`), runs `work` and exits; returns its pid in the caller. `work` must only make
/// async-signal-safe calls.
fn detach(keep: &[BorrowedFd<'_>], work: impl FnOnce()) -> std::io::Result<Pid> {
    let mut keep: Vec<RawFd> = keep.iter().map(AsRawFd::as_raw_fd).collect();
    keep.sort_unstable();
    // SAFETY: the child runs only `child_setup` and `work`, which make plain system calls on
    // memory prepared before the fork (no allocation, no locks), then `_exit`s without
    // unwinding or running destructors.
    #[allow(unsafe_code)]
    match unsafe { nix::unistd::fork() }? {
        ForkResult::Parent { child } => Ok(child),
        ForkResult::Child => {
            child_setup(&keep);
            work();
            // SAFETY: `_exit` ends the process at once: no destructor, atexit handler or stdio
            // flush runs in the child.
            #[allow(unsafe_code)]
            unsafe {
                libc::_exit(0)
            }
        }
    }
}

/// In the child: own process group, name, stdio on `/dev/null`, and every descriptor above 2
/// closed except `keep` (sorted).
fn child_setup(keep: &[RawFd]) {
    let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
    let _ = nix::sys::prctl::set_name(CHILD_NAME);
    if let Ok(null) = nix::fcntl::open(c"/dev/null", OFlag::O_RDWR, Mode::empty()) {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
        // Closed below with the rest; no destructor may close it a second time.
        let _ = null.into_raw_fd();
    }
    let mut from: u32 = 3;
    for &fd in keep {
        let Ok(fd) = u32::try_from(fd) else { continue };
        if fd > from {
            close_range(from, fd - 1);
        }
        from = from.max(fd + 1);
    }
    close_range(from, u32::MAX);
}

fn close_range(first: u32, last: u32) {
    // SAFETY: closes descriptors of the forked child that nothing in it uses again: the
    // objects owning them are never dropped, as the child leaves through `_exit`. (The system
    // call itself: the libc crate has no `close_range` wrapper for musl.)
    #[allow(unsafe_code)]
    unsafe {
        libc::syscall(libc::SYS_close_range, first, last, 0u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn hand_off_keeps_the_descriptor_open_in_the_child() {
        let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        hand_off(&tx).unwrap();
        drop(tx);
        // The child still holds the write end (until this test process exits): no EOF yet.
        nix::fcntl::fcntl(&rx, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        let mut file = std::fs::File::from(rx);
        let err = file.read(&mut [0u8; 1]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    }
}
