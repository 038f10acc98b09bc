//! The demo that README.md's first command runs must keep working and leave nothing behind:
//! when it ends, when its reader goes away (`demo | head`), and on SIGINT or SIGTERM.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use nix::sys::signal::Signal;
use tests::cleanup::remove_namespaces_of;
use tests::netns::{NETNS_RUN_DIR, plugin_state_dirs};
use tests::process;

/// How long a demo may run (it takes 10–20 s), or take to stop once told to.
const DEADLINE: Duration = Duration::from_secs(120);

fn demo() -> Command {
    Command::new(env!("CARGO_BIN_EXE_demo"))
}

/// Fails naming what the demo of `pid` left: its namespaces (removed now, whatever happened)
/// and the plugins' state directories of its host namespace.
fn nothing_left(pid: u32, state_dirs: &[PathBuf]) -> Result<()> {
    let namespaces = remove_namespaces_of(pid);
    let dirs: Vec<&PathBuf> = state_dirs.iter().filter(|d| d.exists()).collect();
    for dir in &dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
    ensure!(
        namespaces.is_empty() && dirs.is_empty(),
        "the demo left namespaces {namespaces:?} and state directories {dirs:?}"
    );
    Ok(())
}

#[test]
fn the_demo_runs_a_live_chain_and_cleans_up() -> Result<()> {
    let child = demo()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let out = match process::wait_with_deadline(child, Vec::new(), DEADLINE) {
        Ok(out) => out,
        Err(e) => {
            nothing_left(pid, &[])?;
            return Err(e);
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "demo failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "bridge → tuning → portmap → bandwidth → firewall → sbr",
        "  tuning     result: interface eth0 in the container, mac 02:42:0a:60:0a:63",
        "host: nftables ip cni_portmap, ports: tcp . 18080",
        "host: qdisc tbf 1: dev bwp",
        "host: iptables -A CNI-FORWARD -s 10.96.10.",
        "container: table 100: default via 10.96.10.1 dev eth0",
        "-> container :8080  HTTP 200",
        "host -> 127.0.0.1:18080 -> container :8080  HTTP 200",
        "Mbit/s into the container",
        "Mbit/s out of the container",
        "blocked while CNI-ADMIN drops it",
        "selects table 100",
        "[4] CHECK",
        "ok  every plugin verified",
        "[5] DEL",
        "every tbf and ingress qdisc are gone",
        "a second DEL succeeds too",
    ] {
        ensure!(
            stdout.contains(expected),
            "{expected:?} missing from:\n{stdout}"
        );
    }
    nothing_left(pid, &[])
}

#[test]
fn help_prints_usage_and_runs_nothing() -> Result<()> {
    let out = demo().arg("--help").output()?;
    ensure!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(stdout.starts_with("usage: demo"), "{stdout}");
    // With its reader gone at once (`demo --help | head -0`), still a quiet success.
    let mut child = demo()
        .arg("--help")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    drop(child.stdout.take());
    let reaped = process::reap(&mut child, Some(Instant::now() + DEADLINE))?;
    ensure!(reaped.status.success(), "{:?}", reaped.status);
    let out = demo().arg("--bogus").output()?;
    ensure!(out.status.code() == Some(2), "{out:?}");
    ensure!(String::from_utf8_lossy(&out.stderr).contains("usage: demo"));
    Ok(())
}

/// A running demo whose stdout is read line by line.
struct Running {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    seen: Vec<String>,
}

impl Running {
    fn start() -> Result<Running> {
        let mut child = demo()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().context("stdout")?;
        Ok(Running {
            child,
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
        })
    }

    /// Reads until a line starting with `prefix` (after leading spaces) and returns it.
    fn until(&mut self, prefix: &str) -> Result<String> {
        for line in self.lines.by_ref() {
            let line = line?;
            self.seen.push(line.clone());
            if line.trim_start().starts_with(prefix) {
                return Ok(line);
            }
        }
        bail!("the demo ended before {prefix:?}: {:#?}", self.seen)
    }

    /// The state directories of the demo's host namespace, from its name on the `host` line
    /// (read while the namespace exists).
    fn state_dirs(&mut self) -> Result<Vec<PathBuf>> {
        let line = self.until("host ")?;
        let name = line
            .split_whitespace()
            .nth(1)
            .context("no namespace name on the host line")?;
        let ino = std::fs::metadata(PathBuf::from(NETNS_RUN_DIR).join(name))?.ino();
        Ok(plugin_state_dirs(ino).to_vec())
    }

    /// Waits for the demo to end; returns its status and stderr.
    fn wait(mut self) -> Result<(std::process::ExitStatus, String)> {
        let mut stderr = self.child.stderr.take().context("stderr")?;
        drop(self.lines);
        let reaped = process::reap(&mut self.child, Some(Instant::now() + DEADLINE))?;
        let mut text = String::new();
        stderr.read_to_string(&mut text)?;
        Ok((reaped.status, text))
    }
}

/// `demo | head`: once its reader is gone the demo stops at its next line and removes
/// everything, instead of aborting on the broken pipe.
#[test]
fn a_closed_stdout_stops_the_demo_and_it_cleans_up() -> Result<()> {
    let mut run = Running::start()?;
    let pid = run.child.id();
    let dirs = run.state_dirs()?;
    // The chain's ADD has made state by then.
    run.until("[3] live traffic")?;
    let (status, stderr) = run.wait()?;
    ensure!(!status.success(), "{status:?}");
    ensure!(status.signal().is_none(), "killed by a signal: {status:?}");
    ensure!(stderr.contains("stdout was closed"), "{stderr}");
    nothing_left(pid, &dirs)
}

/// SIGINT (Ctrl-C) and SIGTERM half-way: the demo removes everything it made and dies of the
/// signal.
#[test]
fn sigint_and_sigterm_stop_the_demo_and_it_cleans_up() -> Result<()> {
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let mut run = Running::start()?;
        let pid = run.child.id();
        let dirs = run.state_dirs()?;
        run.until("[3] live traffic")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid)?), signal)?;
        // Keep reading, so the demo never blocks on a full pipe.
        let drained: Vec<String> = run.lines.by_ref().map_while(Result::ok).collect();
        let (status, stderr) = run.wait()?;
        ensure!(
            status.signal() == Some(signal as i32) || status.code() == Some(128 + signal as i32),
            "{signal}: {status:?}\n{stderr}\n{drained:#?}"
        );
        ensure!(stderr.contains("cleaned up"), "{signal}: {stderr}");
        nothing_left(pid, &dirs).with_context(|| signal.to_string())?;
    }
    Ok(())
}
