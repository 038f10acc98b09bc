//! A chain driver for the reliability tests: ADD, CHECK and DEL of a conflist plugin by plugin,
//! as [`Runtime`] does (same stdin from [`build_plugin_config`], same environment, `prevResult`
//! chaining, DEL in reverse with the final ADD result), with two additions:
//!
//! - a plugin that fails with CNI code 11 (try again later: a bounded lock wait expired) is
//!   run again with the same input, at most [`Chain::with_max_attempts`] times in all, and
//!   every such retry is counted; any other failure, and any failure that is not a CNI error
//!   object on stdout, is an error;
//! - optionally ([`Chain::measuring_rss`]) every execution is forked (not `posix_spawn`ed, so
//!   that `ru_maxrss` is the plugin's own and not this test process's) and reaped with
//!   `wait4`, recording the plugin's peak RSS and wall time; a plugin still running near its
//!   deadline is reported with its kernel stacks.
//!
//! Unlike [`Runtime`] it keeps no result cache: [`Chain::add`] returns the final result and
//! the caller passes it to CHECK and DEL. Used by the `concurrency` and `soak` tests.

use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::runtime::{build_plugin_config, plugin_type};
use crate::{CniErrorObject, NetworkConfigList, Runtime, RuntimeConf, process};

/// CNI's "try again later".
pub const TRY_AGAIN_LATER: u64 = 11;

/// Attempts per plugin call unless set with [`Chain::with_max_attempts`].
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// One plugin execution's peak resident set size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssSample {
    /// The plugin's `type`.
    pub plugin: String,
    /// `CNI_COMMAND`.
    pub command: String,
    /// `ru_maxrss`, KiB.
    pub max_rss_kib: u64,
    /// From spawn to reaping (for reports only; tests never assert timings).
    pub elapsed: Duration,
}

/// Drives one conflist through one runtime's host namespace; shareable between threads.
#[derive(Debug)]
pub struct Chain<'a> {
    runtime: &'a Runtime,
    list: &'a NetworkConfigList,
    max_attempts: u32,
    measure: bool,
    timeout: Duration,
    retries: AtomicU64,
    retried: Mutex<Vec<String>>,
    samples: Mutex<Vec<RssSample>>,
}

impl<'a> Chain<'a> {
    /// A driver of `list` running plugins as `runtime` would.
    pub fn new(runtime: &'a Runtime, list: &'a NetworkConfigList) -> Chain<'a> {
        Chain {
            runtime,
            list,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            measure: false,
            timeout: runtime.timeout(),
            retries: AtomicU64::new(0),
            retried: Mutex::new(Vec::new()),
            samples: Mutex::new(Vec::new()),
        }
    }

    /// Runs a plugin at most `n` times when it keeps answering code 11.
    #[must_use]
    pub fn with_max_attempts(mut self, n: u32) -> Chain<'a> {
        self.max_attempts = n.max(1);
        self
    }

    /// Records the peak RSS of every execution (see [`Chain::take_rss_samples`]).
    #[must_use]
    pub fn measuring_rss(mut self) -> Chain<'a> {
        self.measure = true;
        self
    }

    /// Sets the deadline of one execution measured with [`Chain::measuring_rss`] (default the
    /// runtime's, as unmeasured executions have).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Chain<'a> {
        self.timeout = timeout;
        self
    }

    /// The conflist.
    pub fn list(&self) -> &NetworkConfigList {
        self.list
    }

    /// How many code-11 answers were retried so far.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// One line per retried code-11 answer: plugin, verb, container and message.
    pub fn retried(&self) -> Vec<String> {
        self.retried.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The RSS samples recorded since the last call, in execution order.
    pub fn take_rss_samples(&self) -> Vec<RssSample> {
        self.samples
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }

    /// ADD through the list; returns the last plugin's result.
    ///
    /// # Errors
    /// The first failure that is not a retried code 11 (later plugins are not run).
    pub fn add(&self, rt: &RuntimeConf) -> Result<Value> {
        let mut prev: Option<Value> = None;
        for plugin in &self.list.plugins {
            let conf = build_plugin_config(self.list, plugin, prev.as_ref(), &rt.capability_args)?;
            let stdout = self.invoke(plugin, "ADD", rt, &conf)?;
            let result: Value = serde_json::from_slice(&stdout).with_context(|| {
                format!(
                    "{} ADD of {} printed no JSON: {:?}",
                    plugin_type(plugin).unwrap_or_default(),
                    rt.container_id,
                    String::from_utf8_lossy(&stdout)
                )
            })?;
            prev = Some(result);
        }
        prev.context("the conflist has no plugins")
    }

    /// CHECK through the list with `result` (of [`Chain::add`]) as `prevResult`.
    ///
    /// # Errors
    /// The first failure that is not a retried code 11.
    pub fn check(&self, rt: &RuntimeConf, result: &Value) -> Result<()> {
        for plugin in &self.list.plugins {
            let conf = build_plugin_config(self.list, plugin, Some(result), &rt.capability_args)?;
            self.invoke(plugin, "CHECK", rt, &conf)?;
        }
        Ok(())
    }

    /// DEL through the list in reverse with `result` (of [`Chain::add`]) as `prevResult`.
    ///
    /// # Errors
    /// The first failure that is not a retried code 11 (earlier plugins are not run).
    pub fn del(&self, rt: &RuntimeConf, result: Option<&Value>) -> Result<()> {
        for plugin in self.list.plugins.iter().rev() {
            let conf = build_plugin_config(self.list, plugin, result, &rt.capability_args)?;
            self.invoke(plugin, "DEL", rt, &conf)?;
        }
        Ok(())
    }

    /// Runs one plugin until it succeeds, fails with something else than code 11, or has
    /// been tried `max_attempts` times; returns its stdout.
    fn invoke(
        &self,
        plugin: &Value,
        command: &str,
        rt: &RuntimeConf,
        conf: &Value,
    ) -> Result<Vec<u8>> {
        let kind = plugin_type(plugin)?;
        let path = self.runtime.find_plugin(kind)?;
        let stdin = serde_json::to_vec(conf)?;
        let mut attempt = 1;
        loop {
            let (status, stdout, stderr) = self.exec(&path, kind, command, rt, &stdin)?;
            if status.success() {
                return Ok(stdout);
            }
            let stderr = String::from_utf8_lossy(&stderr);
            let Some(error) = CniErrorObject::parse(&stdout) else {
                bail!(
                    "{kind} {command} of {} failed ({status}) without a CNI error: stdout {:?}, stderr {stderr}",
                    rt.container_id,
                    String::from_utf8_lossy(&stdout)
                );
            };
            if error.code == TRY_AGAIN_LATER && attempt < self.max_attempts {
                self.retries.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut log) = self.retried.lock() {
                    log.push(format!(
                        "{kind} {command} of {} (attempt {attempt}): {}",
                        rt.container_id, error.msg
                    ));
                }
                std::thread::sleep(Duration::from_millis(50) * attempt);
                attempt += 1;
                continue;
            }
            bail!(
                "{kind} {command} of {} failed after {attempt} attempt(s), code {}: {} ({}); stderr: {stderr}",
                rt.container_id,
                error.code,
                error.msg,
                error.details
            );
        }
    }

    /// Runs `path` once in the runtime's host namespace; returns status, stdout and stderr.
    fn exec(
        &self,
        path: &Path,
        kind: &str,
        command: &str,
        rt: &RuntimeConf,
        stdin: &[u8],
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>)> {
        let netns = rt.netns.to_string_lossy().into_owned();
        let cni_args = rt.cni_args();
        let cni_path = self.runtime.cni_path().to_string_lossy().into_owned();
        let env = [
            ("CNI_CONTAINERID", rt.container_id.as_str()),
            ("CNI_NETNS", netns.as_str()),
            ("CNI_IFNAME", rt.ifname.as_str()),
            ("CNI_ARGS", cni_args.as_str()),
            ("CNI_PATH", cni_path.as_str()),
        ];
        if !self.measure {
            let path = path.to_string_lossy();
            let out = self
                .runtime
                .exec_plugin(&path, Some(command), &env, stdin)?;
            return Ok((out.status, out.stdout, out.stderr));
        }
        let mut cmd = Command::new(path);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CNI_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("CNI_COMMAND", command).envs(env);
        // `ru_maxrss` is at least the RSS of the address space that `execve` replaced. std
        // spawns with `posix_spawn`, whose child execs from this process's own address space,
        // so every plugin would report this whole test process's peak, file pages included.
        // std documents that a `pre_exec` closure runs in the child after a `fork`: the copy
        // that exec replaces then holds only this process's anonymous pages, well below a
        // plugin's own peak.
        // SAFETY: the closure does nothing, so it cannot break the forked child.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| Ok(()));
        }
        // Files, not pipes: a grandchild that outlived the plugin must not keep a reader waiting, and nothing has to be drained while the child runs.
        let mut stdout = tempfile::tempfile()?;
        let mut stderr = tempfile::tempfile()?;
        cmd.stdin(Stdio::piped())
            .stdout(stdout.try_clone()?)
            .stderr(stderr.try_clone()?);
        let started = Instant::now();
        let mut child = process::spawn_in(self.runtime.host(), &mut cmd)?;
        if let Some(mut pipe) = child.stdin.take() {
            let input = stdin.to_vec();
            // Detached: a plugin may exit without reading its input.
            std::thread::spawn(move || {
                let _ = pipe.write_all(&input);
            });
        }
        let pid = child.id();
        let (done, watchdog) = std::sync::mpsc::channel::<()>();
        let timeout = self.timeout;
        // Shortly before the deadline, what the still running plugin is doing, for the error.
        let state = std::thread::spawn(move || {
            let early = timeout.saturating_sub(Duration::from_secs(1));
            match watchdog.recv_timeout(early) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Some(process_state(pid)),
                _ => None,
            }
        });
        let reaped = process::reap(&mut child, Some(Instant::now() + timeout));
        let _ = done.send(());
        let state = state.join().ok().flatten().unwrap_or_default();
        let reaped =
            reaped.with_context(|| format!("{kind} {command} of {}{state}", rt.container_id))?;
        if let Ok(mut samples) = self.samples.lock() {
            samples.push(RssSample {
                plugin: kind.to_owned(),
                command: command.to_owned(),
                max_rss_kib: reaped.max_rss_kib,
                elapsed: started.elapsed(),
            });
        }
        let mut out = Vec::new();
        stdout.seek(SeekFrom::Start(0))?;
        stdout.read_to_end(&mut out)?;
        let mut err = Vec::new();
        stderr.seek(SeekFrom::Start(0))?;
        stderr.read_to_end(&mut err)?;
        Ok((reaped.status, out, err))
    }
}

/// `/proc/<pid>`'s state, wait channel and kernel stack of each thread, on one line each.
fn process_state(pid: u32) -> String {
    let dir = format!("/proc/{pid}");
    let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::from("; before the deadline it was:");
    let status = read(format!("{dir}/status"));
    for line in status
        .lines()
        .filter(|l| l.starts_with("Name:") || l.starts_with("State:"))
    {
        out.push_str(&format!(" {}", line.replace('\t', " ")));
    }
    let tasks = std::fs::read_dir(format!("{dir}/task"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    for task in tasks {
        let stack: Vec<String> = read(format!("{}/stack", task.display()))
            .lines()
            .map(|l| l.split_whitespace().last().unwrap_or_default().to_owned())
            .collect();
        out.push_str(&format!(
            "\n  task {}: wchan {} stack {}",
            task.display(),
            read(format!("{}/wchan", task.display())),
            stack.join(" < ")
        ));
    }
    out
}
