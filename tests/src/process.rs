//! Child processes started inside a network namespace, always waited for with a deadline.
//!
//! A child inherits the network namespace of the thread that forks it, so [`spawn_in`] forks
//! from inside [`NetNs::run`]. Nothing here ever waits without a bound: a child still running at
//! its deadline is killed and reported as timed out.

use std::io::{self, Read, Write};
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use host::netns::NetNs;

/// How often a running child is polled for exit.
const POLL: Duration = Duration::from_millis(5);

/// How long output is still collected after the child exited.
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// `ETXTBSY`: another thread of this process forked while a freshly written script was still
/// open for writing, so the fork holds a write descriptor until it execs. Retry a few times.
const TEXT_FILE_BUSY_RETRIES: u32 = 50;

/// Spawns `cmd` from a thread inside `ns`, so the child runs in that network namespace.
///
/// # Errors
/// When the namespace cannot be entered or the program cannot be started.
pub fn spawn_in(ns: &NetNs, cmd: &mut Command) -> Result<Child> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let spawned = ns.run(|| {
        let mut attempt = 0;
        loop {
            match cmd.spawn() {
                Err(e)
                    if e.raw_os_error() == Some(libc::ETXTBSY)
                        && attempt < TEXT_FILE_BUSY_RETRIES =>
                {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => return other,
            }
        }
    })?;
    spawned.with_context(|| format!("failed to start {program} in netns {:?}", ns.path()))
}

/// Runs `cmd` inside `ns` with `stdin` as its standard input, collects stdout and stderr, and
/// kills it if it has not exited within `timeout`.
///
/// # Errors
/// When the child cannot be started, or is still running at the deadline (it is killed then).
pub fn run_in(ns: &NetNs, cmd: &mut Command, stdin: &[u8], timeout: Duration) -> Result<Output> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = spawn_in(ns, cmd)?;
    let program = cmd.get_program().to_string_lossy().into_owned();
    wait_with_deadline(child, stdin.to_vec(), timeout)
        .with_context(|| format!("{program} in netns {:?}", ns.path()))
}

/// Runs `plugin` inside `ns` with the `CNI_*` variables of `env` (every other one removed) and
/// `stdin`, under `subreaper` (`tests/src/bin/subreaper.rs`: `env!("CARGO_BIN_EXE_subreaper")`
/// in a test), which reports whatever the plugin leaves behind, still running or unreaped.
/// Returns whether the plugin succeeded, and that report (empty when it left nothing).
///
/// # Errors
/// When it cannot be run, or is still running after 30 s.
pub fn run_under_subreaper(
    subreaper: &std::path::Path,
    ns: &NetNs,
    plugin: &std::path::Path,
    env: &[(&str, &str)],
    stdin: &[u8],
) -> Result<(bool, String)> {
    let mut cmd = Command::new(subreaper);
    cmd.arg(plugin);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CNI_") {
            cmd.env_remove(key);
        }
    }
    for (key, value) in env {
        cmd.env(key, value);
    }
    let done = run_in(ns, &mut cmd, stdin, Duration::from_secs(30))?;
    let report = String::from_utf8_lossy(&done.stderr)
        .lines()
        .filter(|l| l.starts_with("subreaper: left"))
        .collect::<Vec<_>>()
        .join("\n");
    Ok((done.status.success(), report))
}

/// Feeds `stdin` to a child whose three standard streams are pipes, drains its output and waits
/// for it until `timeout`, killing it then.
///
/// # Errors
/// When the child is still running at the deadline, or waiting on it fails.
pub fn wait_with_deadline(mut child: Child, stdin: Vec<u8>, timeout: Duration) -> Result<Output> {
    // Writer and readers run on their own threads: a child that fills a pipe while we are
    // blocked on another one would otherwise deadlock.
    // The writer is detached, never joined: a child may exit without reading its input (EPIPE
    // then), or leave a grandchild holding the pipe.
    if let Some(mut pipe) = child.stdin.take() {
        std::thread::spawn(move || {
            let _ = pipe.write_all(&stdin);
        });
    }
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);

    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().context("failed to wait for child")? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(POLL);
    };
    let stdout = collect(stdout);
    let stderr = collect(stderr);
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => bail!(
            "timed out after {timeout:?} and was killed; stdout: {:?}; stderr: {:?}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// Kills a child if it still runs and reaps it.
pub fn kill_and_reap(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = child.kill();
    child.wait().ok()
}

/// A child that exited: its status and the peak resident set size the kernel recorded for it.
#[derive(Debug, Clone, Copy)]
pub struct Reaped {
    /// How it exited.
    pub status: ExitStatus,
    /// `ru_maxrss`: the most memory it ever had resident, in KiB.
    pub max_rss_kib: u64,
}

/// Reaps `child` with `wait4`, which also reports its peak RSS (std's `wait` drops it). With a
/// `deadline`, polls and kills the child when it passes (an error then); without one, blocks
/// until it exits, which only the bench does, on plugin execs it times to the microsecond.
/// `child` must not have been waited for already.
///
/// # Errors
/// When waiting fails or the deadline passes.
pub fn reap(child: &mut Child, deadline: Option<Instant>) -> io::Result<Reaped> {
    let pid = libc::pid_t::try_from(child.id()).map_err(io::Error::other)?;
    let flags = if deadline.is_some() { libc::WNOHANG } else { 0 };
    loop {
        if let Some((status, usage)) = wait4(pid, flags)? {
            return Ok(Reaped {
                status: ExitStatus::from_raw(status),
                max_rss_kib: u64::try_from(usage.ru_maxrss).unwrap_or(0),
            });
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let _ = child.kill();
            let _ = wait4(pid, 0);
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("pid {pid} still ran at its deadline and was killed"),
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `wait4(pid, flags)`: the raw status and resource usage, or `None` when `WNOHANG` found the
/// child still running.
#[allow(unsafe_code)]
fn wait4(pid: libc::pid_t, flags: libc::c_int) -> io::Result<Option<(i32, libc::rusage)>> {
    let mut status = 0;
    // SAFETY: `rusage` is a plain C struct of integers, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both out-pointers are valid, exclusive and live for the whole call.
        let reaped = unsafe { libc::wait4(pid, &raw mut status, flags, &raw mut usage) };
        match reaped {
            -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            -1 => return Err(io::Error::last_os_error()),
            0 => return Ok(None),
            _ => return Ok(Some((status, usage))),
        }
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

/// Output of an exited child; bounded because a grandchild it left behind may still hold the
/// pipe open (its reader thread is then abandoned, not joined).
fn collect(rx: Option<Receiver<Vec<u8>>>) -> Vec<u8> {
    rx.and_then(|rx| rx.recv_timeout(PIPE_GRACE).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reap_reports_status_and_peak_rss() -> Result<()> {
        let mut child = Command::new("sh").args(["-c", "exit 3"]).spawn()?;
        let reaped = reap(&mut child, None)?;
        assert_eq!(reaped.status.code(), Some(3));
        assert!(reaped.max_rss_kib > 0, "{reaped:?}");
        Ok(())
    }

    #[test]
    fn reap_kills_a_child_at_its_deadline() -> Result<()> {
        let mut child = Command::new("sleep").arg("5").spawn()?;
        let started = Instant::now();
        let err = reap(&mut child, Some(started + Duration::from_millis(50)))
            .err()
            .context("sleep 5 was reaped before its deadline")?;
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            child.try_wait().is_err(),
            "the killed child was already reaped"
        );
        Ok(())
    }
}
