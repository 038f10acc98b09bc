//! Handing a descriptor whose last `close(2)` is slow to a detached process, so that the
//! plugin's own exit is not.
//!
//! An nf_tables socket whose batch deleted rules, chains or set elements makes its last close
//! wait for the kernel to finish freeing those objects: an RCU grace period, 3–12 ms here, more
//! than all of a DEL's own work. A runtime waits for the plugin to exit, and exit closes the
//! socket, so DEL would pay it. [`hand_off`] instead gives a duplicate of the descriptor to a
//! copy of the plugin's own binary (`/proc/self/exe` with [`LINGER_ARG`]) that holds it until
//! the plugin has exited (its stdin, a pipe from the plugin, reaches EOF then) and exits too:
//! the last close, and the wait, happen where nobody waits. The kernel objects were already
//! deleted when the batch was acknowledged; only their memory is freed later.
//!
//! The holder has stdout and stderr on `/dev/null` (a runtime reading the plugin's output to
//! EOF must not wait for it) and a process group of its own (a runtime killing the plugin's
//! group must not kill it, which would only move the wait back). [`crate::skel::run`] turns a
//! binary started with [`LINGER_ARG`] into the holder, so every plugin supports it.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};

/// The first argument that makes a plugin binary hold inherited descriptors until its stdin
/// closes. CNI runtimes pass no arguments, so it cannot be mistaken for a plugin call.
pub const LINGER_ARG: &str = "--cni-linger";

/// The running binary, whatever its path and even if it was replaced on disk since.
const SELF_EXE: &str = "/proc/self/exe";

/// Starts a detached holder that inherits a duplicate of `fd` and keeps it until this process
/// exits. The caller drops its own descriptor as usual; its close is then not the last one.
///
/// # Errors
/// When the descriptor cannot be duplicated or the holder cannot start; the caller then simply
/// closes the descriptor itself and pays the wait.
pub fn hand_off(fd: impl AsFd) -> std::io::Result<()> {
    // dup(2) leaves FD_CLOEXEC clear on the copy, so the holder inherits it across exec.
    let inherited = nix::unistd::dup(fd)?;
    let mut holder = detached_self(LINGER_ARG).stdin(Stdio::piped()).spawn()?;
    drop(inherited);
    // The pipe's write end must stay open until this process exits: that EOF releases the
    // holder. It is never written to, and never closed before exit.
    std::mem::forget(holder.stdin.take());
    log::debug!("descriptor handed to holder pid {}", holder.id());
    Ok(())
}

/// A command running this plugin's own binary with `arg` first, detached from the caller: stdin,
/// stdout and stderr on `/dev/null` (set stdin otherwise before spawning) and a process group
/// of its own. A plugin that starts it does not wait for it; it is reparented at exit.
pub fn detached_self(arg: &str) -> Command {
    let mut cmd = Command::new(SELF_EXE);
    cmd.arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    cmd
}

/// When the process was started as a holder ([`LINGER_ARG`]), waits for stdin to close and
/// returns the exit code; `None` for a normal plugin call.
pub fn run_if_requested() -> Option<ExitCode> {
    if std::env::args_os().nth(1).as_deref() != Some(std::ffi::OsStr::new(LINGER_ARG)) {
        return None;
    }
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
    Some(ExitCode::SUCCESS)
}
