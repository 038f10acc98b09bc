//! Leaving nothing behind whatever ends a harness binary (the demo, the bench): a terminating
//! signal, a panic (release builds abort, so no destructor runs), or a test that kills it.
//!
//! [`on_interrupt`] blocks SIGINT, SIGTERM and SIGHUP in every thread and waits for them on a
//! thread of its own, which runs the clean-up and then ends the process with the signal; a panic
//! hook runs the same clean-up first. [`remove_namespaces_of`] finds a process's
//! [`crate::TestNetns`] by name (`<prefix>-<pid>-<n>`), so it works from another process too.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use nix::sys::signal::{SigSet, Signal};

use crate::netns::{NETNS_RUN_DIR, remove_plugin_state};

/// Set once a terminating signal arrived: the signal thread is cleaning up and will end the
/// process; the main thread's errors are then consequences of that.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Removes the namespaces a [`crate::TestNetns`] of process `pid` left in `/run/netns`, with
/// the state directories our plugins keep for each, and returns their names.
#[must_use]
pub fn remove_namespaces_of(pid: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(NETNS_RUN_DIR) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_namespace_of(&name, pid) {
            continue;
        }
        let path = entry.path();
        // While still mounted: no other namespace can have its inode number yet.
        remove_plugin_state(&path);
        let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&path);
        removed.push(name);
    }
    removed
}

/// Whether `name` is that of a [`crate::TestNetns`] made by process `pid`: `<prefix>-<pid>-<n>`.
fn is_namespace_of(name: &str, pid: u32) -> bool {
    name.rsplit_once('-').is_some_and(|(head, n)| {
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && head.ends_with(&format!("-{pid}"))
    })
}

/// Kills (SIGKILL) the running children of process `pid` (servers and tools it started in its
/// namespaces, which would otherwise keep running there) and returns how many.
pub fn kill_children_of(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for entry in entries.filter_map(Result::ok) {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if parent_of(&entry.path()) == Some(pid)
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), Signal::SIGKILL).is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// The parent pid in `/proc/<pid>/stat` (the field after the command, which may hold spaces
/// and parentheses itself).
fn parent_of(proc_dir: &Path) -> Option<u32> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `cleanup` (then ends the process with the signal) when SIGINT, SIGTERM or SIGHUP
/// arrives, and before a panic ends it. `name` prefixes the message on stderr. Call it first
/// in `main`, before any thread starts: threads inherit the blocked signals (programs it spawns
/// get a clean mask from `std::process`).
///
/// # Errors
/// When the signals cannot be blocked or the thread not started.
pub fn on_interrupt(name: &'static str, cleanup: fn()) -> Result<()> {
    let mut set = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(signal);
    }
    set.thread_block().context("blocking signals")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let Ok(signal) = set.wait() else { return };
            INTERRUPTED.store(true, Ordering::SeqCst);
            cleanup();
            eprintln!("{name}: {signal}: cleaned up, exiting");
            // Unblocked here and raised: the default action ends the process with the signal.
            // A shell starts background jobs with SIGINT ignored, though: then exit as a
            // shell reports a signal.
            let _ = SigSet::from(signal).thread_unblock();
            let _ = nix::sys::signal::raise(signal);
            #[allow(clippy::exit)]
            std::process::exit(128 + signal as i32);
        })
        .context("starting the signal thread")?;
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // Release builds abort on panic: no destructor would run.
        cleanup();
        default_hook(info);
    }));
    Ok(())
}

/// Whether a terminating signal arrived (the process is about to end).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Returns only when no signal arrived: after one, the signal thread is cleaning up and ends
/// the process, and `main` must not end it first by returning.
pub fn wait_if_interrupted() {
    while interrupted() {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_namespaces_of_the_given_pid_match() {
        assert!(is_namespace_of("benchpm-h-4242-0", 4242));
        assert!(is_namespace_of("bench-fw-4242-17", 4242));
        assert!(is_namespace_of("cnidemo-host-4242-0", 4242));
        assert!(!is_namespace_of("bench-fw-14242-17", 4242));
        assert!(!is_namespace_of("bench-fw-4242-", 4242));
        assert!(!is_namespace_of("bench-fw-4242", 4242));
        assert!(!is_namespace_of("cni-1234-5678", 4242));
    }

    #[test]
    fn children_are_found_by_their_parent_pid_and_killed() -> Result<()> {
        // A shell whose only child is a sleep: killing the shell's children (never this test
        // process's, which other tests own) lets it finish at once.
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait; echo done"])
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut out = std::io::BufReader::new(shell.stdout.take().context("stdout")?);
        let mut sleep_pid = String::new();
        std::io::BufRead::read_line(&mut out, &mut sleep_pid)?;
        let sleep_dir = Path::new("/proc").join(sleep_pid.trim());
        assert_eq!(parent_of(&sleep_dir), Some(shell.id()));
        assert_eq!(kill_children_of(shell.id()), 1);
        let reaped = crate::process::reap(
            &mut shell,
            Some(std::time::Instant::now() + std::time::Duration::from_secs(10)),
        )?;
        assert!(reaped.status.success(), "{:?}", reaped.status);
        Ok(())
    }
}
