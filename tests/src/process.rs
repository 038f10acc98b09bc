//! Child processes started inside a network namespace, always waited for with a deadline.
//!
//! A child inherits the network namespace of the thread that forks it, so [`spawn_in`] forks
//! from inside [`NetNs::run`]. Nothing here ever waits without a bound: a child still running at
//! its deadline is killed and reported as timed out.

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use common::netns::NetNs;

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
