//! Benchmarks: our plugins against the Go reference binaries, interleaved in one run.
//!
//! Each suite ([`SUITES`]) prepares its own throwaway namespaces and returns [`Results`]:
//!
//! - [`Row`]s, one per (case, verb): the median and p90 of ours and of the reference, the peak
//!   RSS of each, and their ratio. Timings are wall-clock times of a whole exec (fork, exec,
//!   plugin, exit), measured from the thread inside the namespace the plugin runs in, exactly as
//!   a runtime pays them; ours and the reference alternate within each iteration so that
//!   machine noise hits both alike. The peak RSS is the child's `ru_maxrss` from `wait4`: the
//!   most memory the plugin, or any program it ran and reaped (`iptables`), had resident. The
//!   execs run from a small [`spawner`] process, as `ru_maxrss` is never below the peak RSS
//!   of the process that spawned the child.
//! - [`ScalePoint`]s (`portmap` and `firewall`): with N other attachments installed, for each
//!   size N of [`Options::scale_sizes`], the ADD and DEL of one more attachment (ADD then DEL,
//!   [`Options::scale_iterations`] times, the series interleaved) and the total wall time of
//!   the N installing ADDs. A series is one implementation: `ours nftables`, `ours iptables`
//!   or `Go iptables`. Each suite's module docs say who installs the others of each series.
//! - Notes: the sizes a series left out, and why; who installed Go portmap's others.
//!
//! **Sizes.** `--sizes` (default 0, 100, 1000, 5000) is the scale series. Targets that name a
//! size ([`targets::TARGETS`]: firewall ADD at 500 others and its iptables DEL at 5000,
//! portmap ADD and DEL at 1000) are
//! evaluated at exactly that size against 0, never at a neighbour: a scale suite always runs 0,
//! and adds each size its targets name when the largest requested size reaches it. So the
//! default run times firewall at 0, 100, 500, 1000, 5000; `--sizes 0,500` evaluates the
//! firewall target and reports the portmap one as not measured.
//!
//! **Sizes left out.** Some series install their N others one ADD at a time over a ruleset
//! that every ADD rereads, so the install cost grows with N and the total with N²:
//! the Go firewall installs its own others (each Go ADD runs `iptables` several times over the
//! whole `CNI-FORWARD` chain). Measured on the 2-core dev machine, 5000 of them take about 40
//! minutes, against about 20 minutes for the whole default run without them; and each call
//! of Go portmap over 5000 attachments takes seconds. `--reference-max-size`
//! ([`Options::reference_max_size`], default 1000) caps the sizes of those series: above it
//! firewall and portmap have no `Go iptables` point; the report notes which sizes are left
//! out and the install time they would have taken, extrapolated from the measured installing
//! ADDs. Our iptables backends (firewall's, and portmap's written natively over nf_tables)
//! install their 5000 in minutes, so they run at every size. Go portmap's others are the
//! iptables layout our iptables backend writes, so its install figure is ours, and the
//! report says so.
//!
//! [`targets`] holds the ratio targets of the plugin issues; [`report`] turns [`Results`] into
//! the markdown tables, the target verdicts, the raw JSON and the gnuplot plot of
//! `BENCHMARKS.md`. Nothing here asserts a timing: the bench reports, tests never time.

pub mod bandwidth;
pub mod busy;
pub mod firewall;
pub mod iptables_native;
pub mod memory;
pub mod nft;
pub mod portmap;
pub mod reconcile;
pub mod report;
pub mod sbr;
pub mod spawner;
pub mod targets;
pub mod tuning;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use host::netns::NetNs;
use serde_json::Value;

/// Timed repetitions of one more ADD and DEL per scale size at most: Go's calls over thousands
/// of chains take a second or more each.
pub const SCALE_ITERATIONS: usize = 30;

/// The default sizes of the scale series.
pub const DEFAULT_SIZES: [usize; 4] = [0, 100, 1000, 5000];

/// The default of [`Options::reference_max_size`]: the Go firewall's own installs up to 1000
/// others take a few minutes; 5000 would take about 40 more, and Go portmap's calls over 5000
/// attachments a few seconds each (see the module docs).
pub const DEFAULT_REFERENCE_MAX_SIZE: usize = 1000;

/// Scale series of our nftables backend.
pub const OURS_NFTABLES: &str = "ours nftables";
/// Scale series of our iptables backend.
pub const OURS_IPTABLES: &str = "ours iptables";
/// Scale series of the Go plugin (iptables, its default backend).
pub const GO_IPTABLES: &str = "Go iptables";

/// Options shared by every suite.
#[derive(Debug, Clone)]
pub struct Options {
    /// Timed repetitions of each measured step.
    pub iterations: usize,
    /// Scale: the sizes of "other attachments installed" series, for suites that have one.
    pub sizes: Vec<usize>,
    /// The largest size of the series whose installs or calls grow with N (the Go firewall's
    /// own, and portmap's `Go iptables`); larger sizes have no point of those series.
    pub reference_max_size: usize,
    /// The stdin sizes of the memory suite, in KiB.
    pub memory_sizes_kib: Vec<usize>,
    /// The stdin shapes of the memory suite.
    pub memory_shapes: Vec<memory::Shape>,
    /// The busy suite's conntrack table sizes, after its levels of 1 entry.
    pub busy_conntrack: Vec<usize>,
    /// The veths on the busy node's bridge.
    pub busy_veths: usize,
    /// The kube-proxy-style rules in the busy node's `nat` table.
    pub busy_kube_rules: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            iterations: 100,
            sizes: DEFAULT_SIZES.to_vec(),
            reference_max_size: DEFAULT_REFERENCE_MAX_SIZE,
            memory_sizes_kib: memory::DEFAULT_SIZES_KIB.to_vec(),
            memory_shapes: memory::Shape::ALL.to_vec(),
            busy_conntrack: busy::DEFAULT_CONNTRACK.to_vec(),
            busy_veths: busy::DEFAULT_VETHS,
            busy_kube_rules: busy::DEFAULT_KUBE_RULES,
        }
    }
}

impl Options {
    /// The sizes `suite`'s scale series runs: [`Options::sizes`], 0, and every size a target of
    /// `suite` names that the largest requested size reaches; sorted, without duplicates.
    #[must_use]
    pub fn scale_sizes(&self, suite: &str) -> Vec<usize> {
        let largest = self.sizes.iter().copied().max().unwrap_or(0);
        let mut sizes = self.sizes.clone();
        sizes.push(0);
        sizes.extend(
            targets::scale_sizes_of(suite)
                .into_iter()
                .filter(|&s| s <= largest),
        );
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    /// Timed repetitions per scale size: [`Options::iterations`], at most [`SCALE_ITERATIONS`].
    #[must_use]
    pub fn scale_iterations(&self) -> usize {
        self.iterations.clamp(1, SCALE_ITERATIONS)
    }
}

/// What a suite measured.
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// Ours against the reference, per case and verb.
    pub rows: Vec<Row>,
    /// Points of the scale series.
    pub scale: Vec<ScalePoint>,
    /// Remarks for the report (sizes without a Go point, and why).
    pub notes: Vec<String>,
    /// Rows measured on the busy node ([`busy`]), each with the node's state.
    pub busy: Vec<busy::NodeRow>,
}

impl Results {
    /// Appends `other`'s rows, points, notes and busy-node rows.
    pub fn extend(&mut self, other: Results) {
        self.rows.extend(other.rows);
        self.scale.extend(other.scale);
        self.notes.extend(other.notes);
        self.busy.extend(other.busy);
    }
}

impl From<Vec<Row>> for Results {
    fn from(rows: Vec<Row>) -> Results {
        Results {
            rows,
            ..Results::default()
        }
    }
}

/// A suite: its name (what `--only` selects) and the function running it.
pub type Suite = (&'static str, fn(&Options) -> Result<Results>);

/// Every suite, in report order. Each plugin issue adds its own module and one entry here.
pub const SUITES: &[Suite] = &[
    ("tuning", tuning::run),
    ("bandwidth", bandwidth::run),
    ("sbr", sbr::run),
    ("firewall", firewall::run),
    ("nft", nft::run),
    ("iptables-native", iptables_native::run),
    ("portmap", portmap::run),
    (reconcile::SUITE, reconcile::run),
    ("memory", memory::run),
    (busy::SUITE, busy::run),
];

/// One timed step: its wall time and, for an exec, the child's peak RSS.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// Wall time.
    pub elapsed: Duration,
    /// `ru_maxrss` of the exec in KiB; `None` for in-process steps.
    pub max_rss_kib: Option<u64>,
}

/// Timings of one implementation for one step.
#[derive(Debug, Clone, Default)]
pub struct Samples(pub Vec<Sample>);

impl Samples {
    /// Adds one sample.
    pub fn push(&mut self, sample: Sample) {
        self.0.push(sample);
    }

    /// Adds one timing of an in-process step (no RSS).
    pub fn push_time(&mut self, elapsed: Duration) {
        self.0.push(Sample {
            elapsed,
            max_rss_kib: None,
        });
    }

    /// True without samples.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `q` quantile (0.0..=1.0) of the times, nearest-rank; zero when empty.
    #[must_use]
    pub fn quantile(&self, q: f64) -> Duration {
        let mut sorted: Vec<Duration> = self.0.iter().map(|s| s.elapsed).collect();
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

    /// The sum of the times.
    #[must_use]
    pub fn total(&self) -> Duration {
        self.0.iter().map(|s| s.elapsed).sum()
    }

    /// The largest peak RSS of the execs, in KiB; `None` when no sample has one.
    #[must_use]
    pub fn peak_rss_kib(&self) -> Option<u64> {
        self.0.iter().filter_map(|s| s.max_rss_kib).max()
    }
}

/// One line of the report: a case and verb, ours against the reference.
#[derive(Debug, Clone)]
pub struct Row {
    /// The plugin or module measured (`tuning`, `nft`, …).
    pub suite: String,
    /// What was set up (`mac+mtu+2 sysctls`, `2 mappings, ours nftables`, …).
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
        ratio(&self.ours, &self.reference)
    }
}

/// `ours` / `reference` of the medians; `None` when either is empty or the reference is zero.
#[must_use]
pub fn ratio(ours: &Samples, reference: &Samples) -> Option<f64> {
    let r = reference.median();
    (!ours.is_empty() && !reference.is_empty() && !r.is_zero())
        .then(|| ours.median().as_secs_f64() / r.as_secs_f64())
}

/// The N others of a scale point: who installed them and how long that took.
#[derive(Debug, Clone)]
pub struct Install {
    /// Who ran the N ADDs (`ours nftables`, `Go firewall`, `ours iptables (Go's layout)`).
    pub by: String,
    /// Whether the series' own implementation installed them (false for Go portmap, whose
    /// layout our iptables backend writes).
    pub own: bool,
    /// One sample per installing ADD, in order; their sum is the total install time.
    pub samples: Samples,
}

/// One size of a scale series: one implementation with `others` attachments installed.
#[derive(Debug, Clone)]
pub struct ScalePoint {
    /// `portmap` or `firewall`.
    pub suite: String,
    /// The implementation ([`OURS_NFTABLES`], [`OURS_IPTABLES`], [`GO_IPTABLES`]).
    pub series: String,
    /// Whether this series is the Go plugin.
    pub reference: bool,
    /// Other attachments installed.
    pub others: usize,
    /// ADD of one more.
    pub add: Samples,
    /// DEL of that one more.
    pub del: Samples,
    /// The N installing ADDs.
    pub install: Install,
    /// The same ADD and DEL timed in alternation with these, in a namespace of the series
    /// with no other attachment: the base a growth target divides by, free of the drift of
    /// a machine between sizes measured minutes apart. `None` where the suite has none.
    pub alongside: Option<Alongside>,
}

/// ADD and DEL of a scale series with no others, timed alongside a size (see
/// [`ScalePoint::alongside`]).
#[derive(Debug, Clone, Default)]
pub struct Alongside {
    /// ADD.
    pub add: Samples,
    /// DEL.
    pub del: Samples,
}

/// For the bench's signal and panic paths and for the test that runs the bench, which must
/// leave nothing behind whatever happens.
pub use harness::cleanup::remove_namespaces_of;

/// Waits until nf_tables has freed what earlier transactions in the calling thread's namespace
/// deleted, ours or Go's. Until then the next nf_tables socket closed in the namespace, and the
/// next rule added with an xtables match, wait for it: an RCU grace period, 3–45 ms here, that
/// would land in whichever timed step comes next. Closing a socket of our own waits here
/// instead (the kernel flushes its deferred frees when a bound nf_tables socket is released).
///
/// # Errors
/// When no nf_tables socket can be opened.
pub fn wait_for_nf_tables_frees() -> Result<()> {
    drop(netfilter::nft::Nft::new().context("an nf_tables socket to wait for the kernel's frees")?);
    Ok(())
}

/// Waits (at most 10 s) until the machine's CPUs are at most 15% busy over a quarter second:
/// the kernel tears down an earlier suite's namespaces (thousands of rules and elements) in
/// its own workers after they are deleted, and a suite timed meanwhile shares the CPUs with
/// that work. Returns how long it waited.
///
/// # Errors
/// `/proc/stat` cannot be read.
pub fn wait_for_quiet() -> Result<std::time::Duration> {
    /// Busy and total jiffies of all CPUs.
    fn jiffies() -> Result<(u64, u64)> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let line = stat.lines().next().context("/proc/stat is empty")?;
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        let total: u64 = fields.iter().sum();
        // idle and iowait
        let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
        Ok((total - idle, total))
    }
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(10) {
        let (busy0, total0) = jiffies()?;
        std::thread::sleep(std::time::Duration::from_millis(250));
        let (busy1, total1) = jiffies()?;
        let total = total1.saturating_sub(total0).max(1);
        if busy1.saturating_sub(busy0) * 100 / total <= 15 {
            break;
        }
    }
    Ok(started.elapsed())
}

/// One exec of a plugin binary: its path, `CNI_*` environment and stdin.
#[derive(Debug, Clone)]
pub struct Exec {
    /// The binary.
    pub binary: PathBuf,
    /// Its arguments (none for a plugin).
    pub args: Vec<String>,
    /// `CNI_COMMAND`, `CNI_CONTAINERID`, … (every other `CNI_*` variable is removed).
    pub env: Vec<(String, String)>,
    /// The config on stdin.
    pub stdin: Vec<u8>,
    /// A file to read stdin from instead of [`Exec::stdin`]: megabytes of input reach the
    /// plugin without passing through the spawner, whose peak RSS stays a low floor.
    pub stdin_file: Option<PathBuf>,
    /// Keep at most this many bytes of stdout and stderr (the spawner holds what it keeps).
    pub output_limit: Option<usize>,
}

impl Exec {
    /// An exec of a tool (`nft`, …) by name on `PATH`, with `args` and `stdin`.
    #[must_use]
    pub fn tool(binary: &str, args: &[&str], stdin: Vec<u8>) -> Exec {
        Exec {
            binary: PathBuf::from(binary),
            args: args.iter().map(|&a| a.to_owned()).collect(),
            env: Vec::new(),
            stdin,
            stdin_file: None,
            output_limit: None,
        }
    }

    /// A plugin exec with the usual `CNI_*` variables and `conf` on stdin (`CNI_PATH` points
    /// nowhere: a meta plugin delegates to nothing).
    #[must_use]
    pub fn plugin(
        binary: &Path,
        command: &str,
        container_id: &str,
        netns: &Path,
        ifname: &str,
        conf: &Value,
    ) -> Exec {
        let env = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container_id),
            ("CNI_NETNS", &netns.to_string_lossy()),
            ("CNI_IFNAME", ifname),
            ("CNI_PATH", "/nonexistent"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        Exec {
            binary: binary.to_owned(),
            args: Vec::new(),
            env,
            stdin: serde_json::to_vec(conf).unwrap_or_default(),
            stdin_file: None,
            output_limit: None,
        }
    }
}

/// A finished exec: how long it took, its peak RSS, and what it printed.
#[derive(Debug)]
pub struct Timed {
    /// Wall time from before the fork to after the reap.
    pub elapsed: Duration,
    /// `ru_maxrss` in KiB: the peak RSS of the plugin and of the children it reaped.
    pub max_rss_kib: u64,
    /// How it exited.
    pub status: ExitStatus,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
}

impl Timed {
    /// Its time and peak RSS.
    #[must_use]
    pub fn sample(&self) -> Sample {
        Sample {
            elapsed: self.elapsed,
            max_rss_kib: Some(self.max_rss_kib),
        }
    }
}

/// Runs `exec` inside `ns` and times it, whatever its exit status. The exec goes through the
/// [`spawner`], whose small footprint keeps the peak RSS the plugin's own.
///
/// # Errors
/// When the binary cannot start or be waited for.
pub fn run_exec(ns: &NetNs, exec: &Exec) -> Result<Timed> {
    spawner::run(ns, exec)
}

/// Runs `exec` inside `ns` and times it. A failing exit is an error carrying the
/// plugin's stdout and stderr, so a bench never reports the speed of an error path.
///
/// # Errors
/// When the binary cannot start or exits non-zero.
pub fn time_exec(ns: &NetNs, exec: &Exec) -> Result<Timed> {
    let timed = run_exec(ns, exec)?;
    if !timed.status.success() {
        bail!(
            "{} {:?} failed ({}): stdout {} stderr {}",
            exec.binary.display(),
            exec.env,
            timed.status,
            String::from_utf8_lossy(&timed.stdout),
            String::from_utf8_lossy(&timed.stderr)
        );
    }
    Ok(timed)
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
        let mut exec = Exec::plugin(
            binary,
            command,
            container_id,
            &self.netns,
            &self.ifname,
            config,
        );
        exec.env.push(("CNI_ARGS".to_owned(), self.args.clone()));
        exec
    }

    /// One ADD, CHECK, DEL of `binary`, timed (for suites that settle state between cycles).
    /// CHECK's sample is empty when the case does not time it.
    ///
    /// # Errors
    /// When any exec fails.
    pub fn cycle(&self, binary: &Path, container_id: &str) -> Result<[Sample; 3]> {
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
            .sample()
        } else {
            Sample::default()
        };
        let del = time_exec(
            &self.host,
            &self.exec(binary, "DEL", container_id, &self.config),
        )?;
        Ok([add.sample(), check, del.sample()])
    }

    /// Runs `iterations` lifecycles of each binary, alternating which goes first, and returns
    /// one row per verb. Each cycle uses a fresh container ID.
    ///
    /// # Errors
    /// When any exec fails.
    pub fn run(&self, iterations: usize) -> Result<Vec<Row>> {
        self.run_with(iterations, &mut || Ok(()))
    }

    /// [`Lifecycle::run`], calling `between` after each iteration's two cycles: a step timed
    /// apart under the same conditions as the cycles (caches, the machine's drift).
    ///
    /// # Errors
    /// When any exec, or `between`, fails.
    pub fn run_with(
        &self,
        iterations: usize,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<Row>> {
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
            between()?;
        }
        Ok(self.rows(ours, reference))
    }

    /// The ADD, CHECK (when timed) and DEL rows of this case from per-verb samples.
    #[must_use]
    pub fn rows(&self, ours: [Samples; 3], reference: [Samples; 3]) -> Vec<Row> {
        ["ADD", "CHECK", "DEL"]
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
            .collect()
    }
}

/// Fits `t = a + b·n` by least squares to the (n, t) pairs, in seconds; `None` with fewer than
/// two distinct n.
#[must_use]
pub fn fit_line(points: &[(usize, Duration)]) -> Option<(f64, f64)> {
    #[allow(clippy::cast_precision_loss)]
    let xy: Vec<(f64, f64)> = points
        .iter()
        .map(|&(n, t)| (n as f64, t.as_secs_f64()))
        .collect();
    #[allow(clippy::cast_precision_loss)]
    let len = xy.len() as f64;
    let mean_x = xy.iter().map(|p| p.0).sum::<f64>() / len;
    let mean_y = xy.iter().map(|p| p.1).sum::<f64>() / len;
    let sxx: f64 = xy.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = xy.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    if xy.len() < 2 || sxx == 0.0 {
        return None;
    }
    let b = sxy / sxx;
    Some((mean_y - b * mean_x, b))
}

/// The report's note on the sizes of `suite`'s scale series above `max`
/// (`--reference-max-size`), which have no `left_out`: which sizes, `why`, and the install time
/// they would have needed, extrapolated from a line fitted to the measured installing ADDs
/// `installs` (in install order). `None` when no size is above `max`.
#[must_use]
pub fn cutoff_note(
    suite: &str,
    left_out: &str,
    why: &str,
    sizes: &[usize],
    max: usize,
    installs: &Samples,
) -> Option<String> {
    let skipped: Vec<String> = sizes
        .iter()
        .filter(|&&s| s > max)
        .map(ToString::to_string)
        .collect();
    let largest = *sizes.last()?;
    if skipped.is_empty() {
        return None;
    }
    let mut note = format!(
        "{suite}: no {left_out} at {} others: {why}, and sizes above --reference-max-size {max} \
         are left out so that a full run stays within about 30 minutes.",
        skipped.join(", ")
    );
    let points: Vec<(usize, Duration)> = installs
        .0
        .iter()
        .enumerate()
        .map(|(n, s)| (n, s.elapsed))
        .collect();
    if let Some((a, b)) = fit_line(&points) {
        let _ = write!(
            note,
            " A line fitted to the {} measured installing ADDs ({:.1} ms + {:.4} ms per other \
             installed) puts installing {largest} at about {:.0} minutes.",
            points.len(),
            a * 1e3,
            b * 1e3,
            extrapolated_install(a, b, largest).as_secs_f64() / 60.0
        );
    }
    Some(note)
}

/// The time `count` ADDs take when the nth (from 0) costs `a + b·n` seconds.
#[must_use]
pub fn extrapolated_install(a: f64, b: f64, count: usize) -> Duration {
    #[allow(clippy::cast_precision_loss)]
    let n = count as f64;
    Duration::from_secs_f64((a * n + b * n * (n - 1.0) / 2.0).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(ms: &[u64]) -> Samples {
        Samples(
            ms.iter()
                .map(|&m| Sample {
                    elapsed: Duration::from_millis(m),
                    max_rss_kib: Some(m * 1024),
                })
                .collect(),
        )
    }

    #[test]
    fn quantiles_use_nearest_rank() {
        let s = samples(&(1..=10).collect::<Vec<_>>());
        assert_eq!(s.median(), Duration::from_millis(5));
        assert_eq!(s.p90(), Duration::from_millis(9));
        assert_eq!(s.total(), Duration::from_millis(55));
        assert_eq!(s.peak_rss_kib(), Some(10 * 1024));
        assert_eq!(Samples::default().median(), Duration::ZERO);
        assert_eq!(Samples::default().peak_rss_kib(), None);
    }

    #[test]
    fn ratio_is_of_medians_and_absent_without_reference() {
        let row = Row {
            suite: "x".into(),
            case: "c".into(),
            step: "ADD".into(),
            ours: samples(&[1]),
            reference: samples(&[4]),
            reference_label: "Go x".into(),
        };
        assert_eq!(row.ratio(), Some(0.25));
        let alone = Row {
            reference: Samples::default(),
            ..row
        };
        assert_eq!(alone.ratio(), None);
    }

    #[test]
    fn scale_sizes_add_zero_and_the_target_sizes_the_largest_size_reaches() {
        let options = |sizes: &[usize]| Options {
            sizes: sizes.to_vec(),
            ..Options::default()
        };
        assert_eq!(
            Options::default().scale_sizes("firewall"),
            [0, 100, 500, 1000, 5000]
        );
        assert_eq!(
            Options::default().scale_sizes("portmap"),
            [0, 100, 1000, 5000]
        );
        assert_eq!(options(&[0, 1]).scale_sizes("firewall"), [0, 1]);
        assert_eq!(options(&[500]).scale_sizes("portmap"), [0, 500]);
        assert_eq!(
            options(&[600, 100]).scale_sizes("firewall"),
            [0, 100, 500, 600]
        );
    }

    #[test]
    fn a_line_fits_linear_install_costs_and_extrapolates_their_sum() {
        let points: Vec<_> = (0..10)
            .map(|n| (n, Duration::from_millis(10 + 2 * n as u64)))
            .collect();
        let (a, b) = fit_line(&points).unwrap();
        assert!(
            (a - 0.010).abs() < 1e-9 && (b - 0.002).abs() < 1e-9,
            "{a} {b}"
        );
        let total: Duration = points.iter().map(|p| p.1).sum();
        let estimate = extrapolated_install(a, b, 10);
        assert!(
            estimate.abs_diff(total) < Duration::from_micros(1),
            "{estimate:?}"
        );
        assert_eq!(fit_line(&points[..1]), None);
    }
}
