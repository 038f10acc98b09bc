//! Benchmarks: our plugins against the Go reference binaries, interleaved in one run.
//!
//! Each suite ([`SUITES`]) prepares its own throwaway namespaces and returns [`Row`]s: one per
//! (case, verb), with the median and p90 of ours and of the reference and their ratio. The
//! `bench` binary runs the suites and prints one markdown table. Timings are wall-clock times of
//! a whole exec (fork, exec, plugin, exit), measured from a thread inside the namespace the
//! plugin runs in, exactly as a runtime pays them; ours and the reference alternate within each
//! iteration so that machine noise hits both alike.
//!
//! Nothing here asserts a timing: the bench reports, tests never time.

pub mod bandwidth;
pub mod firewall;
pub mod nft;
pub mod portmap;
pub mod sbr;
pub mod tuning;

use std::fmt::Write as _;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use common::netns::NetNs;
use serde_json::Value;

/// Options shared by every suite.
#[derive(Debug, Clone)]
pub struct Options {
    /// Timed repetitions of each measured step.
    pub iterations: usize,
    /// Scale: the sizes of "other attachments installed" series, for suites that have one.
    pub sizes: Vec<usize>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            iterations: 100,
            sizes: vec![0, 100, 1000],
        }
    }
}

/// A suite: its name (what `--only` selects) and the function running it.
pub type Suite = (&'static str, fn(&Options) -> Result<Vec<Row>>);

/// Every suite, in report order. Each plugin issue adds its own module and one entry here.
pub const SUITES: &[Suite] = &[
    ("tuning", tuning::run),
    ("bandwidth", bandwidth::run),
    ("sbr", sbr::run),
    ("firewall", firewall::run),
    ("nft", nft::run),
    ("portmap", portmap::run),
];

/// Timings of one implementation for one step.
#[derive(Debug, Clone, Default)]
pub struct Samples(pub Vec<Duration>);

impl Samples {
    /// Adds one timing.
    pub fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    /// The `q` quantile (0.0..=1.0), nearest-rank; zero when empty.
    #[must_use]
    pub fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.0.clone();
        sorted.sort_unstable();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    /// The median.
    #[must_use]
    pub fn median(&self) -> Duration {
        self.quantile(0.5)
    }

    /// The 90th percentile.
    #[must_use]
    pub fn p90(&self) -> Duration {
        self.quantile(0.9)
    }
}

/// One line of the report: a case and verb, ours against the reference.
#[derive(Debug, Clone)]
pub struct Row {
    /// The plugin or module measured (`tuning`, `nft`, …).
    pub suite: String,
    /// What was set up (`mac+mtu+2 sysctls`, `1000 others`, …).
    pub case: String,
    /// The step timed (`ADD`, `CHECK`, `DEL`, `batch`, …).
    pub step: String,
    /// Our timings.
    pub ours: Samples,
    /// The reference's timings (the Go binary, or the `nft` exec); empty when there is none.
    pub reference: Samples,
    /// What the reference column is (`Go portmap`, `nft -f`).
    pub reference_label: String,
}

impl Row {
    /// Ours / reference, of the medians; `None` without reference samples.
    #[must_use]
    pub fn ratio(&self) -> Option<f64> {
        let reference = self.reference.median();
        (!self.reference.0.is_empty() && !reference.is_zero())
            .then(|| self.ours.median().as_secs_f64() / reference.as_secs_f64())
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// The rows as one markdown table (times in milliseconds).
#[must_use]
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| suite | case | step | ours median ms | ours p90 ms | reference | ref median ms | ref p90 ms | ours/ref |\n\
         | --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: |\n",
    );
    for row in rows {
        let (ref_median, ref_p90) = if row.reference.0.is_empty() {
            ("–".to_owned(), "–".to_owned())
        } else {
            (ms(row.reference.median()), ms(row.reference.p90()))
        };
        let ratio = row
            .ratio()
            .map_or_else(|| "–".to_owned(), |r| format!("{r:.3}"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {ref_median} | {ref_p90} | {ratio} |",
            row.suite,
            row.case,
            row.step,
            ms(row.ours.median()),
            ms(row.ours.p90()),
            row.reference_label,
        );
    }
    out
}

/// One exec of a plugin binary: its path, `CNI_*` environment and stdin.
#[derive(Debug, Clone)]
pub struct Exec {
    /// The binary.
    pub binary: PathBuf,
    /// `CNI_COMMAND`, `CNI_CONTAINERID`, … (every other `CNI_*` variable is removed).
    pub env: Vec<(String, String)>,
    /// The config on stdin.
    pub stdin: Vec<u8>,
}

/// What a timed exec printed and how long it took.
#[derive(Debug)]
pub struct Timed {
    /// Wall time from before the fork to after the reap.
    pub elapsed: Duration,
    /// Standard output.
    pub stdout: Vec<u8>,
}

/// Runs `exec` inside `ns` and times it, whatever its exit status.
///
/// # Errors
/// When the binary cannot start or be waited for.
pub fn run_exec(ns: &NetNs, exec: &Exec) -> Result<(Duration, Output)> {
    let mut cmd = Command::new(&exec.binary);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CNI_") {
            cmd.env_remove(key);
        }
    }
    // Unlinked files, not pipes, hold the plugin's stdio: the timed span is then one spawn and
    // one reap, with no wake-ups of this thread while the plugin writes (each a context switch
    // on a 2-core machine, charged to whichever plugin runs).
    let mut stdin = tempfile::tempfile()?;
    stdin.write_all(&exec.stdin)?;
    stdin.seek(SeekFrom::Start(0))?;
    let mut stdout = tempfile::tempfile()?;
    let mut stderr = tempfile::tempfile()?;
    cmd.envs(exec.env.iter().map(|(k, v)| (k, v)))
        .stdin(stdin)
        .stdout(stdout.try_clone()?)
        .stderr(stderr.try_clone()?);
    let (elapsed, status) = ns.run_in_place(|| -> std::io::Result<_> {
        let started = Instant::now();
        let status = cmd.spawn()?.wait()?;
        Ok((started.elapsed(), status))
    })??;
    let mut out = Output {
        status,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    stdout.seek(SeekFrom::Start(0))?;
    stdout.read_to_end(&mut out.stdout)?;
    stderr.seek(SeekFrom::Start(0))?;
    stderr.read_to_end(&mut out.stderr)?;
    Ok((elapsed, out))
}

/// Runs `exec` inside `ns` and times it. A failing exit is an error carrying the
/// plugin's stdout and stderr, so a bench never reports the speed of an error path.
///
/// # Errors
/// When the binary cannot start or exits non-zero.
pub fn time_exec(ns: &NetNs, exec: &Exec) -> Result<Timed> {
    let (elapsed, out) = run_exec(ns, exec)?;
    if !out.status.success() {
        bail!(
            "{} {:?} failed ({}): stdout {} stderr {}",
            exec.binary.display(),
            exec.env,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(Timed {
        elapsed,
        stdout: out.stdout,
    })
}

/// A plugin lifecycle case: one plugin config (with `prevResult`) run ADD → CHECK → DEL.
#[derive(Debug)]
pub struct Lifecycle {
    /// The plugin name (`tuning`).
    pub plugin: String,
    /// What this case sets up, for the report.
    pub case: String,
    /// Our binary and the reference binary.
    pub ours: PathBuf,
    /// The Go binary.
    pub reference: PathBuf,
    /// The namespace the runtime runs in (the plugin's host side).
    pub host: NetNs,
    /// `CNI_NETNS`.
    pub netns: PathBuf,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`.
    pub args: String,
    /// The plugin config, with `prevResult` for ADD; CHECK gets ADD's result as `prevResult`.
    pub config: Value,
    /// Whether to time CHECK (needs a cniVersion ≥ 0.4.0).
    pub check: bool,
}

impl Lifecycle {
    fn exec(&self, binary: &Path, command: &str, container_id: &str, config: &Value) -> Exec {
        let env = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container_id),
            ("CNI_NETNS", &self.netns.to_string_lossy()),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_ARGS", &self.args),
            ("CNI_PATH", "/nonexistent"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        Exec {
            binary: binary.to_owned(),
            env,
            stdin: serde_json::to_vec(config).unwrap_or_default(),
        }
    }

    /// One ADD, CHECK, DEL of `binary`, timed (for suites that settle state between cycles).
    ///
    /// # Errors
    /// When any exec fails.
    pub fn cycle(&self, binary: &Path, container_id: &str) -> Result<[Duration; 3]> {
        let add = time_exec(
            &self.host,
            &self.exec(binary, "ADD", container_id, &self.config),
        )?;
        let check = if self.check {
            let mut config = self.config.clone();
            let result: Value =
                serde_json::from_slice(&add.stdout).context("ADD printed no JSON result")?;
            if let Some(object) = config.as_object_mut() {
                object.insert("prevResult".to_owned(), result);
            }
            time_exec(
                &self.host,
                &self.exec(binary, "CHECK", container_id, &config),
            )?
            .elapsed
        } else {
            Duration::ZERO
        };
        let del = time_exec(
            &self.host,
            &self.exec(binary, "DEL", container_id, &self.config),
        )?;
        Ok([add.elapsed, check, del.elapsed])
    }

    /// Runs `iterations` lifecycles of each binary, alternating which goes first, and returns
    /// one row per verb. Each cycle uses a fresh container ID.
    ///
    /// # Errors
    /// When any exec fails.
    pub fn run(&self, iterations: usize) -> Result<Vec<Row>> {
        let mut ours = [Samples::default(), Samples::default(), Samples::default()];
        let mut reference = ours.clone();
        // One untimed warm-up each, so page cache and lazy kernel module loads don't count.
        self.cycle(&self.ours, "bench-warmup-ours")?;
        self.cycle(&self.reference, "bench-warmup-ref")?;
        for i in 0..iterations {
            let order = if i % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for is_ours in order {
                let (binary, samples) = if is_ours {
                    (&self.ours, &mut ours)
                } else {
                    (&self.reference, &mut reference)
                };
                let times = self.cycle(binary, &format!("bench-{i}"))?;
                for (s, t) in samples.iter_mut().zip(times) {
                    s.push(t);
                }
            }
        }
        let verbs = ["ADD", "CHECK", "DEL"];
        Ok(verbs
            .into_iter()
            .zip(ours.into_iter().zip(reference))
            .filter(|(verb, _)| self.check || *verb != "CHECK")
            .map(|(verb, (ours, reference))| Row {
                suite: self.plugin.clone(),
                case: self.case.clone(),
                step: verb.to_owned(),
                ours,
                reference,
                reference_label: format!("Go {}", self.plugin),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let s = Samples((1..=10).map(Duration::from_millis).collect());
        assert_eq!(s.median(), Duration::from_millis(5));
        assert_eq!(s.p90(), Duration::from_millis(9));
        assert_eq!(Samples::default().median(), Duration::ZERO);
    }

    #[test]
    fn ratio_is_of_medians_and_absent_without_reference() {
        let row = Row {
            suite: "x".into(),
            case: "c".into(),
            step: "ADD".into(),
            ours: Samples(vec![Duration::from_millis(1)]),
            reference: Samples(vec![Duration::from_millis(4)]),
            reference_label: "Go x".into(),
        };
        assert_eq!(row.ratio(), Some(0.25));
        let table = markdown(std::slice::from_ref(&row));
        assert!(table.contains("| x | c | ADD | 1.000 | 1.000 | Go x | 4.000 | 4.000 | 0.250 |"));
        let alone = Row {
            reference: Samples::default(),
            ..row
        };
        assert_eq!(alone.ratio(), None);
    }
}
