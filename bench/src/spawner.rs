//! The spawner: a small process of its own that runs the bench's timed execs.
//!
//! A child's `ru_maxrss` is at least the peak RSS of the process that spawned it: `exec`
//! records the high-water mark of the memory it replaces, which for a `vfork`-style spawn is
//! the spawner's own. Spawned from the bench (several MiB after a few suites), every plugin
//! would show the bench's footprint. So the bench starts its own binary once more as a
//! spawner (`bench --spawner`, [`serve`]), which stays small (about 1.5 MiB in a release
//! build), and hands it each exec over a pipe, one JSON line each way. The spawner enters the
//! namespace, times spawn to reap exactly as the bench did, and answers with the time, the
//! child's `ru_maxrss`, its output and its own peak RSS ([`rss_floor_kib`]): the floor below
//! which a plugin's figure cannot go.
//!
//! Before each exec it waits, untimed, for the kernel work earlier execs left behind
//! ([`settle`]), so that every timing is of one exec's own work: on this 2-core machine a
//! grace period left over from the previous DEL otherwise lands in whichever exec comes next,
//! ours or Go's, and moves medians by several milliseconds.
//!
//! The spawner exits when the bench closes its end (the bench exiting, however it does).

use std::io::{BufRead as _, BufReader, Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use harness::process;
use host::netns::NetNs;
use serde::{Deserialize, Serialize};

use crate::{Exec, Timed};

/// The argument that makes the bench binary a spawner.
pub const SPAWNER_ARG: &str = "--spawner";

/// One exec, bench to spawner.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    netns: PathBuf,
    stdin: Vec<u8>,
    stdin_file: Option<PathBuf>,
    output_limit: Option<usize>,
}

/// Its outcome, spawner to bench.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Response {
    error: Option<String>,
    elapsed_ns: u64,
    max_rss_kib: u64,
    /// The raw wait status.
    status: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// The spawner's own peak RSS (`VmHWM`) after the exec.
    spawner_hwm_kib: Option<u64>,
}

/// The bench's end of the spawner.
#[derive(Debug)]
struct Spawner {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
}

static SPAWNER: Mutex<Option<Spawner>> = Mutex::new(None);
static FLOOR_KIB: AtomicU64 = AtomicU64::new(0);

/// The largest peak RSS the spawner reported so far, in KiB: no plugin's figure is below it.
#[must_use]
pub fn rss_floor_kib() -> Option<u64> {
    Some(FLOOR_KIB.load(Ordering::Relaxed)).filter(|&k| k > 0)
}

/// Runs `exec` in the namespace `ns` through the spawner (started on first use), whatever its
/// exit status.
///
/// # Errors
/// When the spawner cannot be started or talked to, or the binary cannot start.
pub fn run(ns: &NetNs, exec: &Exec) -> Result<Timed> {
    let request = Request {
        binary: exec.binary.clone(),
        args: exec.args.clone(),
        env: exec.env.clone(),
        netns: ns.path().to_owned(),
        stdin: exec.stdin.clone(),
        stdin_file: exec.stdin_file.clone(),
        output_limit: exec.output_limit,
    };
    let mut line = serde_json::to_string(&request)?;
    line.push('\n');
    let mut guard = SPAWNER
        .lock()
        .map_err(|_| anyhow!("the spawner's lock is poisoned"))?;
    if guard.is_none() {
        *guard = Some(Spawner::start()?);
    }
    let spawner = guard.as_mut().context("no spawner")?;
    spawner
        .to
        .write_all(line.as_bytes())
        .context("writing to the spawner")?;
    let mut answer = String::new();
    spawner
        .from
        .read_line(&mut answer)
        .context("reading from the spawner")?;
    if answer.is_empty() {
        let status = spawner.child.try_wait().ok().flatten();
        *guard = None;
        bail!("the spawner exited ({status:?})");
    }
    let response: Response = serde_json::from_str(&answer).context("the spawner's answer")?;
    if let Some(error) = response.error {
        bail!("{}: {error}", exec.binary.display());
    }
    if let Some(hwm) = response.spawner_hwm_kib {
        FLOOR_KIB.fetch_max(hwm, Ordering::Relaxed);
    }
    Ok(Timed {
        elapsed: Duration::from_nanos(response.elapsed_ns),
        max_rss_kib: response.max_rss_kib,
        status: ExitStatus::from_raw(response.status),
        stdout: response.stdout,
        stderr: response.stderr,
    })
}

impl Spawner {
    fn start() -> Result<Spawner> {
        let exe = std::env::current_exe().context("locating the bench binary")?;
        let mut child = Command::new(&exe)
            .arg(SPAWNER_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} {SPAWNER_ARG}", exe.display()))?;
        let to = child.stdin.take().context("spawner stdin")?;
        let from = BufReader::new(child.stdout.take().context("spawner stdout")?);
        Ok(Spawner { child, to, from })
    }
}

/// The spawner's main loop: one request per line on stdin, one answer per line on stdout,
/// until stdin closes.
#[must_use]
pub fn serve() -> ExitCode {
    // Our plugins leave no process behind (tests/tests/conformance.rs checks it); anything a
    // plugin did leave would become the spawner's when its plugin exits, for `settle` to reap,
    // so that no timing ever includes it.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("bench spawner: cannot become a child subreaper: {e}");
        return ExitCode::FAILURE;
    }
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lines() {
        let Ok(line) = line else { break };
        let response = serde_json::from_str::<Request>(&line)
            .map_err(anyhow::Error::from)
            .and_then(|request| exec(&request))
            .unwrap_or_else(|e| Response {
                error: Some(format!("{e:#}")),
                ..Response::default()
            });
        let Ok(mut answer) = serde_json::to_vec(&response) else {
            return ExitCode::FAILURE;
        };
        answer.push(b'\n');
        if stdout
            .write_all(&answer)
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// The command of an exec: `binary` with `args`, and of the environment's `CNI_*` variables
/// only those of `env`.
#[must_use]
pub fn command(binary: &Path, args: &[String], env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(binary);
    cmd.args(args);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CNI_") {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// Runs one request: enter the namespace, spawn, reap, collect.
fn exec(request: &Request) -> Result<Response> {
    let ns = NetNs::open(&request.netns)?;
    let mut cmd = command(&request.binary, &request.args, &request.env);
    // Unlinked files, not pipes, hold the plugin's stdio: the timed span is then one spawn and
    // one reap, with no wake-ups of this process while the plugin writes (each a context
    // switch on a 2-core machine, charged to whichever plugin runs).
    let stdin = match &request.stdin_file {
        Some(path) => std::fs::File::open(path)
            .with_context(|| format!("opening {} for stdin", path.display()))?,
        None => {
            let mut stdin = tempfile::tempfile()?;
            stdin.write_all(&request.stdin)?;
            stdin.seek(SeekFrom::Start(0))?;
            stdin
        }
    };
    let mut stdout = tempfile::tempfile()?;
    let mut stderr = tempfile::tempfile()?;
    cmd.stdin(stdin)
        .stdout(stdout.try_clone()?)
        .stderr(stderr.try_clone()?);
    let (elapsed, reaped) = ns.run_in_place(|| -> Result<_> {
        settle()?;
        let started = Instant::now();
        let mut child = cmd.spawn()?;
        // No deadline: a blocking wait4, so the reap adds no polling delay to the timing.
        let reaped = process::reap(&mut child, None)?;
        Ok((started.elapsed(), reaped))
    })??;
    let mut response = Response {
        elapsed_ns: u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
        max_rss_kib: reaped.max_rss_kib,
        status: reaped.status.into_raw(),
        spawner_hwm_kib: own_peak_rss_kib(),
        ..Response::default()
    };
    let limit = u64::try_from(request.output_limit.unwrap_or(usize::MAX)).unwrap_or(u64::MAX);
    stdout.seek(SeekFrom::Start(0))?;
    (&mut stdout)
        .take(limit)
        .read_to_end(&mut response.stdout)?;
    stderr.seek(SeekFrom::Start(0))?;
    (&mut stderr)
        .take(limit)
        .read_to_end(&mut response.stderr)?;
    Ok(response)
}

/// How long [`settle`] waits at most for a process an exec left behind (none of ours does).
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);

/// Waits, in the calling thread's namespace, until the kernel work that earlier execs left
/// behind is done:
/// - any process an exec left behind (ours leave none; a reference binary's `iptables` child
///   could): the spawner, a child subreaper, inherits it when its parent exits, and reaps it
///   here. (The spawner has no other children between execs.)
/// - what nf_tables still has to free in the namespace ([`crate::wait_for_nf_tables_frees`]).
fn settle() -> Result<()> {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    loop {
        match nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            Err(nix::errno::Errno::ECHILD) => break,
            Ok(nix::sys::wait::WaitStatus::StillAlive) => {
                if Instant::now() > deadline {
                    bail!("a process an exec left still ran {SETTLE_DEADLINE:?} after it");
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            Err(nix::errno::Errno::EINTR) | Ok(_) => {}
            Err(e) => return Err(e).context("reaping detached children"),
        }
    }
    crate::wait_for_nf_tables_frees()
}

/// `VmHWM` of this process, in KiB.
fn own_peak_rss_kib() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
