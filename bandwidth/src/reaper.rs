//! The IFB reaper: deletes retired IFBs ("tombstones") after DEL has returned.
//!
//! Deleting a network device (`RTM_DELLINK`) waits inside the kernel for RCU grace periods and
//! for the device's last references to drop: 20–30 ms for an IFB here, most of a DEL. So DEL
//! only takes the IFB out of service (down, renamed `bwdel<index>`, alias
//! `cni-bandwidth-deleted:<time>:<owner>`, see [`crate::apply::retire_ifbs`]) and starts this
//! reaper: the plugin's own binary (`/proc/self/exe`) with [`REAPER_ARG`], stdin, stdout and
//! stderr on `/dev/null` (a runtime that reads the plugin's output to EOF must not wait for it)
//! and a process group of its own (a runtime that kills the plugin's group on a timeout must not
//! kill it). DEL does not wait for it. The reaper deletes every tombstone in its namespace and
//! exits.
//!
//! It works in the plugin's own network namespace, inherited across the exec, or, for IFBs made
//! inside a container, in the namespace whose path follows [`REAPER_ARG`]; that path is opened
//! again and accepted only if it is still the same namespace (nsfs device and inode), so a path
//! reused for another namespace in between is left alone. A reaper that dies early leaks
//! nothing for long: every ADD, DEL and GC deletes tombstones older than
//! [`crate::names::TOMBSTONE_GRACE_SECS`].

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use common::netlink::Netlink;
use common::netns::NetNs;

use crate::apply;
use crate::error::BandwidthError;

/// The first argument that turns the plugin binary into the reaper. CNI runtimes pass no
/// arguments, so it cannot be mistaken for a plugin call.
pub const REAPER_ARG: &str = "--reap-ifb-tombstones";

/// `<nsfs device>:<inode>` of a namespace handle, which identifies the namespace.
fn identity(ns: &NetNs) -> std::io::Result<String> {
    let meta = File::from(ns.as_fd().try_clone_to_owned()?).metadata()?;
    Ok(format!("{}:{}", meta.dev(), meta.ino()))
}

/// Starts a detached reaper for the plugin's own namespace (`netns` `None`) or for `netns`, and
/// returns without waiting for it.
///
/// # Errors
/// When the process cannot be started (the caller then deletes the tombstones itself).
pub fn spawn(netns: Option<&NetNs>) -> std::io::Result<()> {
    let mut cmd = common::linger::detached_self(REAPER_ARG);
    if let Some(ns) = netns {
        cmd.arg(ns.path()).arg(identity(ns)?);
    }
    let child = cmd.env_remove("CNI_COMMAND").spawn()?;
    log::debug!("started the IFB reaper, pid {}", child.id());
    // Not waited for: it is reparented when the plugin exits.
    drop(child);
    Ok(())
}

/// Runs the reaper when the process was started as one (see [`REAPER_ARG`]) and returns its
/// exit code; `None` for a normal plugin call. Called first thing by the binary's `main`.
pub fn run_if_requested() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(REAPER_ARG)) {
        return None;
    }
    let target = args.next().map(PathBuf::from).zip(args.next());
    let outcome = match &target {
        Some((path, id)) => reap_in(path, &id.to_string_lossy()),
        None => reap_here(),
    };
    Some(match outcome {
        Ok(n) => {
            log::debug!("reaper: deleted {n} retired ifb(s)");
            ExitCode::SUCCESS
        }
        Err(e) => {
            log::warn!("reaper: {e}");
            ExitCode::FAILURE
        }
    })
}

fn reap_here() -> Result<usize, BandwidthError> {
    let mut nl = Netlink::new()?;
    apply::reap(&mut nl)
}

/// Enters the namespace at `path` if it is still the one with identity `id`, and reaps there.
fn reap_in(path: &Path, id: &str) -> Result<usize, BandwidthError> {
    let ns = match NetNs::open(path) {
        Ok(ns) => ns,
        // Gone, and its tombstones with it.
        Err(e) if e.is_not_found() => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    if identity(&ns).ok().as_deref() != Some(id) {
        log::info!(
            "reaper: {} is another namespace now: nothing to do",
            path.display()
        );
        return Ok(0);
    }
    // The reaper has this one thread, so it may move itself.
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| BandwidthError::Unavailable(format!("setns {}: {e}", path.display())))?;
    reap_here()
}
