//! A plugin's `reconcile --watch` run as its service runs it: started in a runtime's host
//! namespace, its stderr (its log) in a file the test reads while it runs, stopped with
//! SIGTERM as systemd stops it, and killed if a test ends without stopping it.

use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::Runtime;
use crate::process::kill_and_reap;

pub use netfilter::watch::{DONE, FAILED, RECONCILING};

/// Whether the reconcile whose log starts `segment` (at its "reconciling" line) has ended.
fn ended(segment: &str) -> bool {
    segment
        .lines()
        .skip(1)
        .any(|l| l.starts_with(DONE) || l.starts_with(FAILED))
}

/// A running `<plugin> reconcile --watch`.
#[derive(Debug)]
pub struct Watcher {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Watcher {
    /// Starts `plugin reconcile --watch` in `rt`'s host namespace with `env` added, and waits
    /// (up to `ready`) until its first reconcile has finished, so that it is subscribed to
    /// everything it watches.
    ///
    /// # Errors
    /// When it cannot start, exits, or does not finish its first reconcile in time.
    pub fn start(
        rt: &Runtime,
        plugin: &str,
        env: &[(&str, &str)],
        ready: Duration,
    ) -> Result<Watcher> {
        let dir = tempfile::Builder::new().prefix("watcher").tempdir()?;
        let log = dir.path().join("stderr");
        let file = std::fs::File::create(&log)?;
        let child = rt.spawn_operator(
            plugin,
            &["reconcile", "--watch"],
            env,
            Stdio::null(),
            Stdio::from(file),
        )?;
        let mut watcher = Watcher {
            child,
            log,
            _dir: dir,
        };
        watcher
            .wait_for_reconcile(1, ready)
            .context("starting the watcher")?;
        Ok(watcher)
    }

    /// Its log so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many reconciles it has started (its first included).
    #[must_use]
    pub fn reconciles(&self) -> usize {
        self.log().matches(RECONCILING).count()
    }

    /// Its process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` until `done` holds of its log, and returns the log.
    ///
    /// # Errors
    /// When it exits first, or the time runs out (the log is in the message).
    pub fn wait_for_log(
        &mut self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log();
            if done(&log) {
                return Ok(log);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the watcher exited ({status}) before {what}:\n{log}");
            }
            if Instant::now() > deadline {
                bail!("no {what} within {timeout:?}; the watcher's log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits up to `timeout` for the reconcile numbered `n` (1: the first) to finish, and
    /// returns the log from its "reconciling" line on.
    ///
    /// # Errors
    /// As [`Watcher::wait_for_log`].
    pub fn wait_for_reconcile(&mut self, n: usize, timeout: Duration) -> Result<String> {
        let nth = |log: &str| log.match_indices(RECONCILING).nth(n - 1).map(|(i, _)| i);
        let log = self.wait_for_log(timeout, &format!("the end of reconcile {n}"), |log| {
            nth(log).is_some_and(|i| ended(&log[i..]))
        })?;
        let start = nth(&log).unwrap_or(0);
        let segment = &log[start..];
        // Up to its end line, included.
        let mut end = 0;
        for line in segment.split_inclusive('\n') {
            end += line.len();
            if line.starts_with(DONE) || line.starts_with(FAILED) {
                break;
            }
        }
        Ok(segment[..end].to_owned())
    }

    /// Its resident memory now (`VmRSS`, KiB).
    ///
    /// # Errors
    /// When `/proc/<pid>/status` cannot be read.
    pub fn rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS")
    }

    /// Sends SIGTERM, as `systemctl stop` does, and waits up to `timeout` for it to exit.
    ///
    /// # Errors
    /// When the signal cannot be sent, or it is still running at the deadline (it is killed).
    pub fn stop(mut self, timeout: Duration) -> Result<(ExitStatus, String)> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok((status, self.log()));
            }
            if Instant::now() > deadline {
                kill_and_reap(&mut self.child);
                bail!("still running {timeout:?} after SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}
