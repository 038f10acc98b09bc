//! Private mount namespaces, for tests that change mounts (a tmpfs on `/run`, an overlay on
//! `/etc`, a read-only bind) without the machine seeing any of it.

use std::path::Path;

use anyhow::{Context, Result};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

/// Runs `setup`, then `f`, on a thread with a mount namespace of its own in which `/` is
/// private, so nothing mounted there propagates back to the machine. Plugins and tools
/// spawned from the thread (and threads it starts) inherit the namespace; it goes away with
/// the last of them. A panic in `setup` or `f` is resumed in the caller, message and all.
///
/// # Errors
/// `setup`'s or `f`'s, or the namespace cannot be made (it needs root).
pub fn with_private_mounts<T: Send>(
    setup: impl FnOnce() -> Result<()> + Send,
    f: impl FnOnce() -> Result<T> + Send,
) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| -> Result<T> {
            unshare(CloneFlags::CLONE_NEWNS).context("unshare(CLONE_NEWNS) needs root")?;
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .context("make / private")?;
            setup()?;
            f()
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Bind-mounts `from` on `to` (in the calling thread's mount namespace), read-only if asked.
///
/// # Errors
/// The mount's.
pub fn bind(from: &Path, to: &Path, read_only: bool) -> Result<()> {
    mount(Some(from), to, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_context(|| format!("bind {} on {}", from.display(), to.display()))?;
    if read_only {
        mount(
            None::<&str>,
            to,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .with_context(|| format!("remount {} read-only", to.display()))?;
    }
    Ok(())
}

/// Bind-mounts `from` on `to` with every mount below it (`mount --rbind`).
///
/// # Errors
/// The mount's.
pub fn rbind(from: &Path, to: &Path) -> Result<()> {
    mount(
        Some(from),
        to,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .with_context(|| format!("bind {} on {}", from.display(), to.display()))
}
