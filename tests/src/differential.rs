//! Differential testing: the same calls (stdin and environment, good and bad) to Debian's Go
//! plugin (`/usr/lib/cni/<plugin>`, version 1.1.1) and to ours, and everything observable
//! compared.
//!
//! # Shape
//!
//! A suite (`tests/tests/diff_<plugin>.rs`) is a [`Suite`] (the plugin, the base environment, a
//! builder of one side's namespaces) and a table of named [`Case`]s. A case is a sequence of
//! [`Step`]s (one plugin call each) and mutations (drift made by hand). [`Suite::run`] plays every
//! case twice, on the **Go side** with Debian's binary and on **our side** with ours, and after
//! each step compares:
//!
//! - success or failure (exit status 0 or not);
//! - for failures, the error `msg` word for word (unless the step cites the row of the plugin's
//!   README differences table that allows another one) and the `code` where Go's is one of the
//!   skel's codes 1, 4, 6 and 7 (Go emits 999 for every plugin error, where we emit the spec's
//!   code: that difference is documented, so a Go 999 is not compared);
//! - for successes, stdout: both empty, or both the same result as JSON values (Debian's 1.1.1
//!   library prints 1.x results in struct order where the reference we follow sorts the keys),
//!   and byte for byte for 0.x results (both libraries print those in struct order);
//! - where the step asks, the kernel objects of both sides ([`Stage::snapshot`]), section by
//!   section, line by line.
//!
//! Every difference of every case is collected; at the end the run fails listing each differing
//! case by name with a readable diff (Go's lines `-`, ours `+`). `DIFF_CASE=<text>` runs only the
//! cases whose name contains `<text>`; `DIFF_WORKERS=<n>` runs `n` cases at a time (default 2).
//! A step in which one side succeeds and the other fails ends its case: the sides no longer
//! hold the same state.
//!
//! # Where Go 1.1.1 is not the reference
//!
//! The reference we follow is upstream HEAD (`reference-behaviour.md`); Debian ships 1.1.1.
//! Where they differ (1.1.1 advertises no `1.1.0`, lacks options HEAD has, has CHECK bugs), a
//! step says why and checks HEAD's behaviour instead of Go's output: [`Expect::GoAt`] runs the Go
//! side at another version and compares (for `1.1.0`, whose results only differ from `1.0.0` in
//! `cniVersion`), [`Expect::Literal`] checks ours against a literal from
//! `reference-behaviour.md` ([`Why::Head`]) or from the plugin's README ([`Why::Readme`]) and does
//! not run the Go side at all; a literal step that asks for a snapshot compares ours with the
//! Go side as it stands, which did not run the step: that checks that a refused call changed
//! nothing. Every README row cited must be found in the README, so a case cannot lean on a row
//! that does not exist: in the plugin README's differences table, or, for the protocol rows
//! every plugin shares (the skel's), in the top-level README's table "Differences from the Go
//! skel" ([`SKEL_DIFFERENCES`]). One difference is taken care of for every call: a 1.x result
//! Go printed with an empty `"dns": {}` is compared without it, as HEAD prints it
//! (`reference-behaviour.md` §1.8).
//!
//! # Fresh namespaces per side
//!
//! Each side of each case runs in namespaces of its own, built the same way by the suite's
//! builder, and the two sides run at the same time. Not one set of namespaces used by one
//! implementation after the other, because:
//!
//! - both sides start from the same state by construction. With shared namespaces the second
//!   side would start from what the first one's DEL left, and DEL is under test: a leftover of
//!   one implementation would show up as a difference of the other, or worse, hide one;
//! - a case may leave anything behind (a failing ADD, a DEL that is not run), and the next case
//!   is not affected;
//! - the sides run concurrently, which halves the wall time on a 2-core machine.
//!
//! The cost is that values tied to one namespace differ between the sides, and are masked only
//! where they appear: the namespace paths and scratch directories a stage names in
//! [`Stage::vars`] (substituted into stdin and environment, and back into placeholders in what the
//! plugins print), and the MACs of links the plugin creates ([`Stage::masks_of`]). Interface
//! indexes are left out of snapshots. Hash-named chains and links are not masked: both sides use
//! the same network name and container ID, so their names must be equal.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::bins;
use crate::netns::{TestNetns, veth_pair};
use crate::runtime::{CniErrorObject, Runtime};
use crate::snapshot::Snapshot;

/// The CNI versions both Debian's Go plugins (1.1.1) and ours advertise, oldest first (each
/// plugin from its own minimum).
pub const SHARED_VERSIONS: [&str; 6] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// The error codes Go's skel emits (versions, environment, decoding, the network name), which
/// ours must match; every other Go error is 999.
pub const SKEL_CODES: [u64; 4] = [1, 4, 6, 7];

/// The heading of the top-level README's table of the protocol differences all plugins share
/// (one skel); rows cited from it count as rows of every plugin's README.
pub const SKEL_DIFFERENCES: &str = "### Differences from the Go skel";

/// Runs only the cases whose name contains this variable's value.
pub const CASE_FILTER_ENV: &str = "DIFF_CASE";

/// Cases run at the same time (each runs its two sides at the same time).
pub const WORKERS_ENV: &str = "DIFF_WORKERS";

/// One of the two implementations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Impl {
    /// Debian's Go plugin.
    Go,
    /// Ours.
    Ours,
}

impl Impl {
    /// The path of this implementation's binary of `plugin`.
    ///
    /// # Errors
    /// When it is missing (ours not built, Debian's package not installed).
    pub fn binary(self, plugin: &str) -> Result<PathBuf> {
        match self {
            Impl::Go => bins::reference_binary(plugin),
            Impl::Ours => bins::plugin_binary(plugin),
        }
    }

    /// The other one.
    pub fn other(self) -> Impl {
        match self {
            Impl::Go => Impl::Ours,
            Impl::Ours => Impl::Go,
        }
    }
}

impl fmt::Display for Impl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Impl::Go => "Go",
            Impl::Ours => "ours",
        })
    }
}

/// Who makes a call, relative to the side it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// The side's own implementation: Go on the Go side, ours on our side.
    Subject,
    /// The other implementation on each side (a DEL of what the other one made).
    Other,
    /// Go on both sides (e.g. an ADD that ours must then CHECK or DEL, upgrade-safety).
    Go,
    /// Ours on both sides (e.g. an ADD that Go must then CHECK or DEL).
    Ours,
}

impl By {
    /// The implementation making the call on `side`.
    pub fn on(self, side: Impl) -> Impl {
        match self {
            By::Subject => side,
            By::Other => side.other(),
            By::Go => Impl::Go,
            By::Ours => Impl::Ours,
        }
    }
}

/// One side's namespaces and the readings of their kernel objects.
pub trait Stage: Send + Sync {
    /// The runtime whose namespace the plugins run in.
    fn runtime(&self) -> &Runtime;

    /// `(placeholder, value)` pairs: each placeholder in a step's stdin and environment is
    /// replaced by the value of this side, and each value in what a plugin prints is replaced by
    /// its placeholder (e.g. `("@NETNS@", "/run/netns/diff-ctr-4711-3")`).
    fn vars(&self) -> Vec<(String, String)>;

    /// The kernel objects the plugin may have made or changed, normalised.
    ///
    /// # Errors
    /// When a tool fails.
    fn snapshot(&self) -> Result<Snapshot>;

    /// `(value, placeholder)` pairs masking what differs between the sides in a plugin's output
    /// (`json`, its stdout) although both did the same: MACs of links the plugin created.
    fn masks_of(&self, json: &Value) -> Vec<(String, String)> {
        let _ = json;
        Vec::new()
    }
}

/// What a step's plugin reads on stdin.
#[derive(Debug, Clone)]
pub enum Stdin {
    /// A JSON config (placeholders substituted in its text).
    Json(Value),
    /// Raw text (e.g. broken JSON).
    Raw(String),
}

/// Why a step checks ours against a literal instead of Go's output.
#[derive(Debug, Clone, Copy)]
pub enum Why {
    /// Debian's 1.1.1 differs from the reference (upstream HEAD); what HEAD does.
    Head(&'static str),
    /// A row of the plugin README's differences table, or of the top-level README's skel
    /// table (quoted; it must be found there).
    Readme(&'static str),
}

/// A check of our outcome (and of our snapshot taken right after it).
pub type CheckFn = Box<dyn Fn(&Outcome, &Snapshot) -> Result<()> + Send + Sync>;

/// What ours must do in a [`Expect::Literal`] step.
pub enum Want {
    /// Succeed, printing nothing.
    Silent,
    /// Succeed, printing this result (compared as JSON; placeholders allowed).
    Result(Value),
    /// Fail with this message (exactly) and, when given, this code.
    Error {
        /// The code, when it is fixed.
        code: Option<u64>,
        /// The message.
        msg: String,
    },
    /// Pass this check.
    Check(CheckFn),
}

impl fmt::Debug for Want {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Want::Silent => f.write_str("Silent"),
            Want::Result(v) => write!(f, "Result({v})"),
            Want::Error { code, msg } => write!(f, "Error({code:?}, {msg:?})"),
            Want::Check(_) => f.write_str("Check(..)"),
        }
    }
}

/// How a step is judged.
#[derive(Debug)]
pub enum Expect {
    /// Everything as the Go side.
    Go,
    /// Everything as the Go side but the message, which a README row lets differ.
    GoExceptMsg(&'static str),
    /// As the Go side running the same step at `version` (its result's `cniVersion` becomes the
    /// step's), because 1.1.1 refuses the step's version where HEAD takes it (`why`).
    GoAt {
        /// The version the Go side runs instead.
        version: &'static str,
        /// Why (HEAD's behaviour this stands for).
        why: &'static str,
    },
    /// Ours against a literal; the Go side does not run this step (so a literal step should
    /// change nothing on our side, or be among the last steps of its case).
    Literal {
        /// Where the literal comes from.
        why: Why,
        /// What ours must do.
        want: Want,
    },
}

/// One plugin call.
#[derive(Debug)]
pub struct Step {
    by: By,
    command: Option<String>,
    stdin: Stdin,
    env: Vec<(String, Option<String>)>,
    expect: Expect,
    snapshot: bool,
    exceptions: Vec<Exception>,
}

impl Step {
    /// `command` with the config `conf`, made by the side's own implementation, judged against
    /// the Go side, no snapshot.
    pub fn call(command: &str, conf: Value) -> Step {
        Step {
            by: By::Subject,
            command: Some(command.to_owned()),
            stdin: Stdin::Json(conf),
            env: Vec::new(),
            expect: Expect::Go,
            snapshot: false,
            exceptions: Vec::new(),
        }
    }

    /// ADD with `conf`.
    pub fn add(conf: Value) -> Step {
        Step::call("ADD", conf)
    }

    /// CHECK with `conf`.
    pub fn check(conf: Value) -> Step {
        Step::call("CHECK", conf)
    }

    /// DEL with `conf`.
    pub fn del(conf: Value) -> Step {
        Step::call("DEL", conf)
    }

    /// `command` (none: `CNI_COMMAND` unset) with raw `stdin`.
    pub fn raw(command: Option<&str>, stdin: &str) -> Step {
        Step {
            command: command.map(str::to_owned),
            stdin: Stdin::Raw(stdin.to_owned()),
            ..Step::call("", Value::Null)
        }
    }

    /// Made by `by` instead of the side's own implementation.
    #[must_use]
    pub fn by(mut self, by: By) -> Step {
        self.by = by;
        self
    }

    /// Sets an environment variable (placeholders substituted).
    #[must_use]
    pub fn env(mut self, key: &str, value: &str) -> Step {
        self.env.push((key.to_owned(), Some(value.to_owned())));
        self
    }

    /// Unsets an environment variable of the suite's base environment.
    #[must_use]
    pub fn unset(mut self, key: &str) -> Step {
        self.env.push((key.to_owned(), None));
        self
    }

    /// Compares the kernel objects of both sides after this step.
    #[must_use]
    pub fn snap(mut self) -> Step {
        self.snapshot = true;
        self
    }

    /// Compares the kernel objects of both sides after this step, leaving out the lines of the
    /// sections whose name starts with `section` that contain `containing`, as the README row
    /// `readme` allows (e.g. what ours restores on DEL and Go leaves).
    #[must_use]
    pub fn snap_except(mut self, section: &str, containing: &str, readme: &'static str) -> Step {
        self.snapshot = true;
        self.exceptions.push(Exception {
            section: section.to_owned(),
            containing: containing.to_owned(),
            readme,
        });
        self
    }

    /// Judged by `expect`.
    #[must_use]
    pub fn expect(mut self, expect: Expect) -> Step {
        self.expect = expect;
        self
    }

    /// As the Go side but the message, per the README row `row`.
    #[must_use]
    pub fn msg_per_readme(self, row: &'static str) -> Step {
        self.expect(Expect::GoExceptMsg(row))
    }

    /// HEAD differs from 1.1.1 (`why`): ours must do `want`.
    #[must_use]
    pub fn head(self, why: &'static str, want: Want) -> Step {
        self.expect(Expect::Literal {
            why: Why::Head(why),
            want,
        })
    }

    /// The README row `row` lets ours differ: ours must do `want`.
    #[must_use]
    pub fn readme(self, row: &'static str, want: Want) -> Step {
        self.expect(Expect::Literal {
            why: Why::Readme(row),
            want,
        })
    }

    /// HEAD takes this step's version where 1.1.1 refuses it (`why`): compared with the Go side
    /// running it at `version`.
    #[must_use]
    pub fn go_at(self, version: &'static str, why: &'static str) -> Step {
        self.expect(Expect::GoAt { version, why })
    }

    fn label(&self) -> String {
        let command = self.command.as_deref().unwrap_or("<no CNI_COMMAND>");
        match self.by {
            By::Subject => command.to_owned(),
            By::Other => format!("{command} by the other implementation"),
            By::Go => format!("{command} by Go"),
            By::Ours => format!("{command} by ours"),
        }
    }

    fn is_literal(&self) -> bool {
        matches!(self.expect, Expect::Literal { .. })
    }

    fn readme_rows(&self) -> Vec<&'static str> {
        let mut rows: Vec<&'static str> = self.exceptions.iter().map(|e| e.readme).collect();
        match &self.expect {
            Expect::GoExceptMsg(row)
            | Expect::Literal {
                why: Why::Readme(row),
                ..
            } => rows.push(row),
            _ => {}
        }
        rows
    }
}

/// A change made by hand on both sides between steps (drift before a CHECK, a second
/// attachment, a link removed).
pub type MutateFn<S> = Box<dyn Fn(&S) -> Result<()> + Send + Sync>;

enum Action<S> {
    Call(Box<Step>),
    Mutate(String, MutateFn<S>),
}

/// Lines of a snapshot section left out of the comparison because a README row lets them
/// differ.
#[derive(Debug, Clone)]
pub struct Exception {
    section: String,
    containing: String,
    readme: &'static str,
}

impl Exception {
    fn applies(&self, section: &str, line: &str) -> bool {
        section.starts_with(&self.section) && line.contains(&self.containing)
    }
}

/// A named sequence of steps, played on both sides.
pub struct Case<S> {
    name: String,
    setup: Vec<MutateFn<S>>,
    actions: Vec<Action<S>>,
    exceptions: Vec<Exception>,
}

impl<S> fmt::Debug for Case<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish()
    }
}

impl<S: Stage> Case<S> {
    /// An empty case called `name` (unique in its suite).
    pub fn new(name: impl Into<String>) -> Case<S> {
        Case {
            name: name.into(),
            setup: Vec::new(),
            actions: Vec::new(),
            exceptions: Vec::new(),
        }
    }

    /// Runs `f` on both stages before the first step.
    #[must_use]
    pub fn setup(mut self, f: impl Fn(&S) -> Result<()> + Send + Sync + 'static) -> Case<S> {
        self.setup.push(Box::new(f));
        self
    }

    /// Appends a step.
    #[must_use]
    pub fn step(mut self, step: Step) -> Case<S> {
        self.actions.push(Action::Call(Box::new(step)));
        self
    }

    /// Appends `f`, run on both stages (`what` names it in the report).
    #[must_use]
    pub fn mutate(
        mut self,
        what: &str,
        f: impl Fn(&S) -> Result<()> + Send + Sync + 'static,
    ) -> Case<S> {
        self.actions
            .push(Action::Mutate(what.to_owned(), Box::new(f)));
        self
    }

    /// Leaves out of every snapshot comparison of this case the lines of the sections whose
    /// name starts with `section` that contain `containing`, as the README row `readme` allows.
    #[must_use]
    pub fn except(mut self, section: &str, containing: &str, readme: &'static str) -> Case<S> {
        self.exceptions.push(Exception {
            section: section.to_owned(),
            containing: containing.to_owned(),
            readme,
        });
        self
    }

    /// The case's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn steps(&self) -> impl Iterator<Item = &Step> {
        self.actions.iter().filter_map(|a| match a {
            Action::Call(step) => Some(step.as_ref()),
            Action::Mutate(..) => None,
        })
    }

    fn readme_rows(&self) -> Vec<&'static str> {
        let mut rows: Vec<&'static str> = self.steps().flat_map(Step::readme_rows).collect();
        rows.extend(self.exceptions.iter().map(|e| e.readme));
        rows
    }

    /// Whether the Go side is needed: it runs a step, or a literal step compares its snapshot
    /// with it (a case of literal steps only, without snapshots, builds no Go stage).
    fn needs_go(&self) -> bool {
        self.steps().any(|s| !s.is_literal() || s.snapshot)
    }
}

/// What one call did, with namespace-specific values masked.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Who made it.
    pub by: Impl,
    /// The exit status (`None`: killed by a signal).
    pub exit: Option<i32>,
    /// Stdout, masked.
    pub stdout: String,
    /// Stderr, masked.
    pub stderr: String,
    /// Stdout as JSON when it is JSON, masked (and, for [`Expect::GoAt`], in the step's version).
    pub json: Option<Value>,
}

impl Outcome {
    /// Exit status 0.
    pub fn success(&self) -> bool {
        self.exit == Some(0)
    }

    /// The error object printed, if any.
    pub fn error(&self) -> Option<CniErrorObject> {
        self.json
            .as_ref()
            .and_then(|j| serde_json::from_value(j.clone()).ok())
    }

    fn describe(&self) -> String {
        let exit = self
            .exit
            .map_or_else(|| "killed".to_owned(), |c| format!("exit {c}"));
        if self.success() {
            return if self.stdout.trim().is_empty() {
                format!("succeeded ({exit}), silent")
            } else {
                format!("succeeded ({exit})")
            };
        }
        match self.error() {
            Some(e) if e.details.is_empty() => {
                format!("failed ({exit}), code {}: {:?}", e.code, e.msg)
            }
            Some(e) => format!(
                "failed ({exit}), code {}: {:?} (details {:?})",
                e.code, e.msg, e.details
            ),
            None => format!(
                "failed ({exit}) without an error object; stdout {:?}, stderr {:?}",
                shorten(&self.stdout),
                shorten(&self.stderr)
            ),
        }
    }
}

fn shorten(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// A plugin, its base environment and its stage builder.
pub struct Suite<S> {
    plugin: &'static str,
    env: Vec<(String, String)>,
    build: Box<dyn Fn(Impl) -> Result<S> + Send + Sync>,
}

impl<S> fmt::Debug for Suite<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Suite")
            .field("plugin", &self.plugin)
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

/// The outcome of one case: its differences, or the harness error that stopped it.
#[derive(Debug)]
struct CaseReport {
    name: String,
    problems: Vec<String>,
    seconds: f64,
}

impl<S: Stage> Suite<S> {
    /// The suite of `plugin`, whose sides are built by `build` (called once per side and case,
    /// with the side's implementation).
    pub fn new(
        plugin: &'static str,
        build: impl Fn(Impl) -> Result<S> + Send + Sync + 'static,
    ) -> Suite<S> {
        Suite {
            plugin,
            env: Vec::new(),
            build: Box::new(build),
        }
    }

    /// The CNI variables of an attachment `container_id`/`ifname` in the stage's container
    /// namespace (`@NETNS@`), with `CNI_PATH` the Go plugins' directory.
    #[must_use]
    pub fn cni_env(self, container_id: &str, ifname: &str) -> Suite<S> {
        let cni_path = bins::reference_dir();
        self.env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", "@NETNS@")
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", &cni_path.to_string_lossy())
    }

    /// Adds a variable to the base environment of every call (placeholders substituted).
    #[must_use]
    pub fn env(mut self, key: &str, value: &str) -> Suite<S> {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Plays every case (those matching `$DIFF_CASE`) on both sides.
    ///
    /// # Errors
    /// When a case cites a README row the README lacks, two cases share a name, or any case
    /// differs or fails to run: the message lists every such case with its differences.
    pub fn run(&self, cases: Vec<Case<S>>) -> Result<()> {
        self.validate(&cases)?;
        let filter = std::env::var(CASE_FILTER_ENV).unwrap_or_default();
        let cases: Vec<Case<S>> = cases
            .into_iter()
            .filter(|c| c.name.contains(&filter))
            .collect();
        let workers = std::env::var(WORKERS_ENV)
            .ok()
            .and_then(|w| w.parse::<usize>().ok())
            .unwrap_or(2)
            .clamp(1, 16);
        let started = Instant::now();
        let next = AtomicUsize::new(0);
        let reports: Mutex<Vec<(usize, CaseReport)>> = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(case) = cases.get(i) else { break };
                        let report = self.run_case(case);
                        let verdict = if report.problems.is_empty() {
                            "same"
                        } else {
                            "DIFFERS"
                        };
                        eprintln!(
                            "diff {} {:>3} {:<7} {:>5.2}s {}",
                            self.plugin,
                            i + 1,
                            verdict,
                            report.seconds,
                            report.name
                        );
                        if let Ok(mut all) = reports.lock() {
                            all.push((i, report));
                        }
                    }
                });
            }
        });
        let mut reports = reports
            .into_inner()
            .map_err(|_| anyhow!("a case runner panicked"))?;
        reports.sort_by_key(|(i, _)| *i);
        let failing: Vec<&CaseReport> = reports
            .iter()
            .map(|(_, r)| r)
            .filter(|r| !r.problems.is_empty())
            .collect();
        eprintln!(
            "diff {}: {} cases, {} differ, {:.1}s",
            self.plugin,
            reports.len(),
            failing.len(),
            started.elapsed().as_secs_f64()
        );
        if failing.is_empty() {
            return Ok(());
        }
        let mut text = format!(
            "{} of {} {} cases differ from the reference:\n",
            failing.len(),
            reports.len(),
            self.plugin
        );
        for report in failing {
            text.push_str(&format!("\n=== {}\n", report.name));
            for problem in &report.problems {
                for (n, line) in problem.lines().enumerate() {
                    text.push_str(if n == 0 { "  * " } else { "    " });
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
        bail!("{text}")
    }

    /// Unique names, and every README row cited found in `<plugin>/README.md`'s differences
    /// or in the top-level README's [`SKEL_DIFFERENCES`].
    fn validate(&self, cases: &[Case<S>]) -> Result<()> {
        let mut names = BTreeSet::new();
        for case in cases {
            if !names.insert(case.name.as_str()) {
                bail!("two {} cases are called {:?}", self.plugin, case.name);
            }
        }
        let rows = DifferenceRows::of(self.plugin)?;
        for case in cases {
            for row in case.readme_rows() {
                if !rows.has(row) {
                    bail!(
                        "case {:?} cites a row that is neither in {}'s differences table nor in the top-level README's {SKEL_DIFFERENCES:?}: {row:?}",
                        case.name,
                        readme(self.plugin).display(),
                    );
                }
            }
        }
        Ok(())
    }

    fn run_case(&self, case: &Case<S>) -> CaseReport {
        let started = Instant::now();
        let problems = match self.play(case) {
            Ok(problems) => problems,
            Err(e) => vec![format!("the case could not run: {e:#}")],
        };
        CaseReport {
            name: case.name.clone(),
            problems,
            seconds: started.elapsed().as_secs_f64(),
        }
    }

    /// Builds both stages and plays the case; the differences found.
    fn play(&self, case: &Case<S>) -> Result<Vec<String>> {
        let (go, ours) = std::thread::scope(|scope| {
            let go = case
                .needs_go()
                .then(|| scope.spawn(|| (self.build)(Impl::Go)));
            let ours = (self.build)(Impl::Ours);
            let go = go
                .map(|h| {
                    h.join()
                        .map_err(|_| anyhow!("building the Go stage panicked"))
                })
                .transpose();
            (go, ours)
        });
        let go: Option<S> = go?.transpose().context("building the Go side")?;
        let ours = ours.context("building our side")?;
        for setup in &case.setup {
            if let Some(go) = &go {
                setup(go).context("setup of the Go side")?;
            }
            setup(&ours).context("setup of our side")?;
        }
        let mut problems = Vec::new();
        for (n, action) in case.actions.iter().enumerate() {
            let n = n + 1;
            match action {
                Action::Mutate(what, f) => {
                    if let Some(go) = &go {
                        f(go).with_context(|| format!("action {n} ({what}) on the Go side"))?;
                    }
                    f(&ours).with_context(|| format!("action {n} ({what}) on our side"))?;
                }
                Action::Call(step) => {
                    let (found, diverged) = self
                        .play_step(step, go.as_ref(), &ours, &case.exceptions)
                        .with_context(|| format!("step {n} ({})", step.label()))?;
                    problems.extend(
                        found
                            .into_iter()
                            .map(|p| format!("step {n} ({}): {p}", step.label())),
                    );
                    if diverged {
                        if n < case.actions.len() {
                            problems.push(format!(
                                "steps after {n} not run: the sides diverged (one failed, the other succeeded)"
                            ));
                        }
                        break;
                    }
                }
            }
        }
        Ok(problems)
    }

    /// Plays one step on both sides; the differences, and whether the sides diverged (one
    /// succeeded where the other failed, so later steps would compare different states).
    fn play_step(
        &self,
        step: &Step,
        go: Option<&S>,
        ours: &S,
        exceptions: &[Exception],
    ) -> Result<(Vec<String>, bool)> {
        let exceptions: Vec<Exception> =
            exceptions.iter().chain(&step.exceptions).cloned().collect();
        let exceptions = exceptions.as_slice();
        if let Expect::Literal { want, .. } = &step.expect {
            let outcome = self.exec(ours, step, Impl::Ours, None)?;
            let snapshot = ours.snapshot()?;
            let mut problems = check_literal(want, &outcome, &snapshot);
            let diverged = !problems.is_empty();
            if step.snapshot {
                let go = go.context("a literal step compares snapshots with the Go side, which this case does not build")?;
                problems.extend(compare_snapshots(&go.snapshot()?, &snapshot, exceptions));
            }
            return Ok((problems, diverged));
        }
        let go = go.context("no Go stage")?;
        let go_at = match &step.expect {
            Expect::GoAt { version, .. } => Some(*version),
            _ => None,
        };
        let (go_out, our_out) = std::thread::scope(|scope| {
            let g = scope.spawn(|| self.exec(go, step, Impl::Go, go_at));
            let o = self.exec(ours, step, Impl::Ours, None);
            (g.join(), o)
        });
        let go_out = go_out.map_err(|_| anyhow!("the Go side panicked"))??;
        let our_out = our_out?;
        let msg_exception = matches!(step.expect, Expect::GoExceptMsg(_));
        let mut problems = compare_outcomes(&go_out, &our_out, msg_exception);
        let diverged = go_out.success() != our_out.success();
        if step.snapshot {
            let (go_snap, our_snap) = std::thread::scope(|scope| {
                let g = scope.spawn(|| go.snapshot());
                let o = ours.snapshot();
                (g.join(), o)
            });
            let go_snap = go_snap.map_err(|_| anyhow!("the Go snapshot panicked"))??;
            problems.extend(compare_snapshots(&go_snap, &our_snap?, exceptions));
        }
        Ok((problems, diverged))
    }

    /// Runs `step` on the stage of `side`.
    fn exec(&self, stage: &S, step: &Step, side: Impl, go_at: Option<&str>) -> Result<Outcome> {
        let by = step.by.on(side);
        let binary = by.binary(self.plugin)?;
        let vars = stage.vars();
        let fill = |text: &str| {
            vars.iter()
                .fold(text.to_owned(), |acc, (placeholder, value)| {
                    acc.replace(placeholder.as_str(), value)
                })
        };
        let mut env: Vec<(String, String)> = self.env.clone();
        for (key, value) in &step.env {
            env.retain(|(k, _)| k != key);
            if let Some(value) = value {
                env.push((key.clone(), value.clone()));
            }
        }
        let env: Vec<(String, String)> = env.into_iter().map(|(k, v)| (k, fill(&v))).collect();
        let env_refs: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (stdin, step_version) = match &step.stdin {
            Stdin::Json(conf) => {
                let mut conf = conf.clone();
                let version = conf["cniVersion"].as_str().map(str::to_owned);
                if let Some(at) = go_at {
                    // The prevResult of the step's version goes along (same era).
                    if conf["prevResult"]["cniVersion"] == conf["cniVersion"] {
                        conf["prevResult"]["cniVersion"] = Value::String(at.to_owned());
                    }
                    conf["cniVersion"] = Value::String(at.to_owned());
                }
                (conf.to_string(), version)
            }
            Stdin::Raw(text) => (text.clone(), None),
        };
        let out = stage.runtime().exec_plugin(
            &binary.to_string_lossy(),
            step.command.as_deref(),
            &env_refs,
            fill(&stdin).as_bytes(),
        )?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut masks: Vec<(String, String)> = vars
            .iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(placeholder, value)| (value.clone(), placeholder.clone()))
            .collect();
        if let Ok(json) = serde_json::from_str::<Value>(&stdout) {
            masks.extend(stage.masks_of(&json));
        }
        // The longest value first: a namespace's name is part of its path.
        masks.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        let mask = |text: &str| {
            masks
                .iter()
                .fold(text.to_owned(), |acc, (value, placeholder)| {
                    acc.replace(value.as_str(), placeholder)
                })
        };
        let stdout = mask(&stdout);
        let mut json = serde_json::from_str::<Value>(&stdout).ok();
        if by == Impl::Go {
            json = json.as_ref().map(as_head_prints);
        }
        if let (Some(_), Some(json), Some(version)) = (go_at, json.as_mut(), step_version)
            && json.get("cniVersion").is_some()
        {
            json["cniVersion"] = Value::String(version);
        }
        Ok(Outcome {
            by,
            exit: out.status.code(),
            stdout,
            stderr: mask(&String::from_utf8_lossy(&out.stderr)),
            json,
        })
    }
}

/// The rows of the differences tables a plugin's differences may cite: its README's, and the
/// top-level README's [`SKEL_DIFFERENCES`], each with whitespace runs collapsed (a README wraps
/// its lines).
#[derive(Debug)]
pub struct DifferenceRows {
    plugin: String,
    skel: String,
}

impl DifferenceRows {
    /// The tables `plugin` may cite.
    ///
    /// # Errors
    /// A README that cannot be read.
    pub fn of(plugin: &str) -> Result<DifferenceRows> {
        let read = |path: &Path| {
            std::fs::read_to_string(path)
                .with_context(|| format!("failed to read {}", path.display()))
        };
        let plugin_readme = read(&readme(plugin))?;
        let top = read(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("README.md"),
        )?;
        Ok(DifferenceRows {
            plugin: collapse(
                plugin_readme
                    .split_once("## Differences")
                    .map_or("", |(_, rest)| rest),
            ),
            skel: collapse(top.split_once(SKEL_DIFFERENCES).map_or("", |(_, rest)| {
                rest.split("\n## ").next().unwrap_or_default()
            })),
        })
    }

    /// Whether `row` (a part of a row's text) is in one of the tables.
    pub fn has(&self, row: &str) -> bool {
        let row = collapse(row);
        self.plugin.contains(&row) || self.skel.contains(&row)
    }
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// MAC of the host end of [`Namespaces`]' veth.
pub const HOST_MAC: &str = "02:00:00:00:00:01";
/// MAC of the container end of [`Namespaces`]' veth.
pub const CONTAINER_MAC: &str = "02:00:00:00:00:02";

/// The usual stage: a host namespace where the plugins run and a container namespace (the
/// `CNI_NETNS`, placeholder `@NETNS@`), joined by a veth whose ends have fixed MACs
/// ([`HOST_MAC`], [`CONTAINER_MAC`]), so both sides' results and links are alike.
#[derive(Debug)]
pub struct Namespaces {
    /// Where the plugins run.
    pub host: TestNetns,
    /// The container's namespace.
    pub container: TestNetns,
    /// The runtime running plugins in `host`.
    pub runtime: Runtime,
}

impl Namespaces {
    /// Namespaces `<prefix>-h…` and `<prefix>-c…` joined by `host_if` ↔ `container_if` with the
    /// addresses given (CIDR), both ends up.
    ///
    /// # Errors
    /// When a namespace or the veth cannot be made.
    pub fn new(
        prefix: &str,
        host_if: &str,
        host_addrs: &[&str],
        container_if: &str,
        container_addrs: &[&str],
    ) -> Result<Namespaces> {
        let host = TestNetns::new(&format!("{prefix}-h"))?;
        let container = TestNetns::new(&format!("{prefix}-c"))?;
        veth_pair(
            &host,
            host_if,
            host_addrs,
            &container,
            container_if,
            container_addrs,
        )?;
        host.ip(&["link", "set", "dev", host_if, "address", HOST_MAC])?;
        container.ip(&["link", "set", "dev", container_if, "address", CONTAINER_MAC])?;
        Ok(Namespaces {
            runtime: Runtime::new(&host)?,
            host,
            container,
        })
    }

    /// `@NETNS@` (the container namespace's path) and `@HOSTNS@` (the host's).
    pub fn vars(&self) -> Vec<(String, String)> {
        vec![
            (
                "@NETNS@".to_owned(),
                self.container.path().to_string_lossy().into_owned(),
            ),
            (
                "@HOSTNS@".to_owned(),
                self.host.path().to_string_lossy().into_owned(),
            ),
        ]
    }
}

/// The rows of the top-level README's [`SKEL_DIFFERENCES`] the skel cases cite.
const SKEL_CNI_PATH: &str = "`CNI_PATH` required for ADD/CHECK/DEL/GC/STATUS";
const SKEL_VERSION_REPLY: &str = "VERSION ignores stdin and always answers `1.1.0`";

/// The cases of the skel's environment and protocol errors, once per plugin: `conf` is a valid
/// config of the plugin in 1.0.0 (its ADD must need no particular state), `versions` what the
/// plugin advertises at HEAD (`reference-behaviour.md` §1.1; 1.1.1 stops at 1.0.0, so the VERSION
/// reply is a literal).
pub fn skel_cases<S: Stage>(conf: &Value, versions: &[&str]) -> Vec<Case<S>> {
    let with = |key: &str, value: Value| {
        let mut c = conf.clone();
        match value {
            Value::Null => {
                if let Some(o) = c.as_object_mut() {
                    o.remove(key);
                }
            }
            v => c[key] = v,
        }
        c
    };
    // Ours answers in the caller's version, HEAD's Go in 1.1.0 (the README's skel row).
    let version_reply = serde_json::json!({"cniVersion": "0.3.1", "supportedVersions": versions});
    vec![
        Case::new("skel: required env variables missing").step(
            Step::add(conf.clone())
                .unset("CNI_CONTAINERID")
                .unset("CNI_NETNS")
                .unset("CNI_IFNAME"),
        ),
        Case::new("skel: CNI_PATH missing on DEL").step(
            Step::del(conf.clone())
                .unset("CNI_PATH")
                .readme(SKEL_CNI_PATH, Want::Silent),
        ),
        Case::new("skel: invalid characters in containerID")
            .step(Step::add(conf.clone()).env("CNI_CONTAINERID", "-bad/id")),
        Case::new("skel: interface name too long")
            .step(Step::add(conf.clone()).env("CNI_IFNAME", "abcdefghijklmnop")),
        Case::new("skel: interface name is a dot")
            .step(Step::del(conf.clone()).env("CNI_IFNAME", ".")),
        Case::new("skel: interface name with a colon")
            .step(Step::del(conf.clone()).env("CNI_IFNAME", "eth0:1")),
        Case::new("skel: truncated JSON").step(Step::raw(Some("ADD"), "{\"cniVersion\":")),
        Case::new("skel: not a JSON object").step(Step::raw(Some("ADD"), "[1]")),
        Case::new("skel: name of the wrong JSON type")
            .step(Step::add(with("name", serde_json::json!(5)))),
        Case::new("skel: cniVersion of the wrong JSON type")
            .step(Step::del(with("cniVersion", serde_json::json!(5)))),
        // Past the skel: the plugin's decode, led by the plugin's words, naming its Go struct.
        Case::new("skel: an envelope key of the wrong JSON type")
            .step(Step::add(with("ipam", serde_json::json!("host-local")))),
        Case::new("skel: an envelope key of the wrong JSON type, nested").step(Step::add(with(
            "dns",
            serde_json::json!({"nameservers": "10.0.0.53"}),
        ))),
        Case::new("skel: missing network name").step(Step::add(with("name", Value::Null))),
        Case::new("skel: invalid network name")
            .step(Step::del(with("name", Value::String("a b".into())))),
        Case::new("skel: unsupported cniVersion")
            .step(Step::add(with("cniVersion", Value::String("0.9.0".into())))),
        Case::new("skel: unparsable cniVersion").step(Step::del(with(
            "cniVersion",
            Value::String("1.0.0.0".into()),
        ))),
        Case::new("skel: CHECK below 0.4.0").step(Step::check(with(
            "cniVersion",
            Value::String("0.3.1".into()),
        ))),
        Case::new("skel: unknown CNI_COMMAND").step(Step::call("FOO", conf.clone())),
        Case::new("skel: no CNI_COMMAND prints the about text on stderr only")
            .step(Step::raw(None, "")),
        Case::new("skel: VERSION").step(
            Step::call("VERSION", serde_json::json!({"cniVersion": "0.3.1"}))
                .readme(SKEL_VERSION_REPLY, Want::Result(version_reply)),
        ),
    ]
}

/// A 1.0.0 config of `plugin` on `network` with `prev` as its prevResult, and `keys` set on top
/// (a `null` value stays `null`; [`without`] removes a key).
pub fn config(plugin: &str, network: &str, prev: Value, keys: Value) -> Value {
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": network,
        "type": plugin,
        "prevResult": prev,
    });
    with_keys(conf, &keys)
}

/// `conf` with each key of the object `keys` set to its value (a `null` value stays `null`).
pub fn with_keys(mut conf: Value, keys: &Value) -> Value {
    for (k, v) in keys.as_object().into_iter().flatten() {
        conf[k] = v.clone();
    }
    conf
}

/// `conf` in `version`, its prevResult converted to that version ([`result_in_version`]).
///
/// # Errors
/// When the prevResult cannot be converted.
pub fn in_version(conf: &Value, version: &str) -> Result<Value> {
    let mut conf = conf.clone();
    if conf.get("prevResult").is_some() {
        conf["prevResult"] = result_in_version(&conf["prevResult"], version)?;
    }
    conf["cniVersion"] = Value::String(version.to_owned());
    Ok(conf)
}

/// `conf` without `key`.
pub fn without(mut conf: Value, key: &str) -> Value {
    if let Some(o) = conf.as_object_mut() {
        o.remove(key);
    }
    conf
}

/// The case `name`: ADD with the kernel compared, CHECK when `conf`'s version allows it
/// (0.4.0 on), DEL with the kernel compared; `check` and `del` adjust those two steps (a README
/// row, an exception).
pub fn lifecycle<S: Stage>(
    name: &str,
    conf: &Value,
    check: impl FnOnce(Step) -> Step,
    del: impl FnOnce(Step) -> Step,
) -> Case<S> {
    let version = conf["cniVersion"].as_str().unwrap_or_default();
    let mut case = Case::new(name).step(Step::add(conf.clone()).snap());
    if ["0.4.0", "1.0.0", "1.1.0"].contains(&version) {
        case = case.step(check(Step::check(conf.clone())));
    }
    case.step(del(Step::del(conf.clone()).snap()))
}

/// `<workspace>/<plugin>/README.md`.
pub fn readme(plugin: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(plugin)
        .join("README.md")
}

/// The differences between Go's call and ours (see the module docs).
pub fn compare_outcomes(go: &Outcome, ours: &Outcome, msg_exception: bool) -> Vec<String> {
    if go.success() != ours.success() {
        return vec![format!(
            "Go {} where ours {}",
            go.describe(),
            ours.describe()
        )];
    }
    let mut problems = Vec::new();
    if !go.success() {
        match (go.error(), ours.error()) {
            (Some(g), Some(o)) => {
                if g.msg != o.msg && !msg_exception {
                    problems.push(format!("msg differs:\n- {:?}\n+ {:?}", g.msg, o.msg));
                }
                if SKEL_CODES.contains(&g.code) && g.code != o.code {
                    problems.push(format!(
                        "code differs: Go {} ({:?}), ours {} ({:?})",
                        g.code, g.msg, o.code, o.msg
                    ));
                }
            }
            _ => {
                if go.describe() != ours.describe() {
                    problems.push(format!(
                        "Go {} where ours {}",
                        go.describe(),
                        ours.describe()
                    ));
                }
            }
        }
        return problems;
    }
    let (g, o) = (go.stdout.trim(), ours.stdout.trim());
    if g.is_empty() || o.is_empty() {
        if g.is_empty() != o.is_empty() {
            problems.push(format!(
                "stdout differs:\n- {:?}\n+ {:?}",
                shorten(g),
                shorten(o)
            ));
        }
        return problems;
    }
    match (&go.json, &ours.json) {
        (Some(gj), Some(oj)) if gj != oj => {
            problems.push(format!(
                "result differs:\n{}",
                line_diff(&pretty_lines(gj), &pretty_lines(oj)).join("\n")
            ));
        }
        (Some(gj), Some(_)) => {
            let zero_x = gj["cniVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("0."));
            if zero_x && go.stdout != ours.stdout {
                problems.push(format!(
                    "same result, printed differently (0.x results are printed in struct order by both libraries):\n{}",
                    line_diff(&text_lines(&go.stdout), &text_lines(&ours.stdout)).join("\n")
                ));
            }
        }
        _ => {
            if g != o {
                problems.push(format!(
                    "stdout differs (not both JSON):\n{}",
                    line_diff(&text_lines(g), &text_lines(o)).join("\n")
                ));
            }
        }
    }
    problems
}

/// The differences between our outcome (and snapshot) and a literal.
pub fn check_literal(want: &Want, ours: &Outcome, snapshot: &Snapshot) -> Vec<String> {
    match want {
        Want::Silent => {
            if ours.success() && ours.stdout.trim().is_empty() {
                Vec::new()
            } else {
                vec![format!("ours {}, want a silent success", ours.describe())]
            }
        }
        Want::Result(want) => match (&ours.json, ours.success()) {
            (Some(got), true) if got == want => Vec::new(),
            (Some(got), true) => vec![format!(
                "result differs from the literal:\n{}",
                line_diff(&pretty_lines(want), &pretty_lines(got)).join("\n")
            )],
            _ => vec![format!("ours {}, want a result", ours.describe())],
        },
        Want::Error { code, msg } => match ours.error() {
            Some(e) if !ours.success() && &e.msg == msg && code.is_none_or(|c| c == e.code) => {
                Vec::new()
            }
            _ => vec![format!(
                "ours {}, want failure{} {msg:?}",
                ours.describe(),
                code.map(|c| format!(" code {c}")).unwrap_or_default()
            )],
        },
        Want::Check(check) => match check(ours, snapshot) {
            Ok(()) => Vec::new(),
            Err(e) => vec![format!("ours {}: {e:#}", ours.describe())],
        },
    }
}

/// The differences between two snapshots, per section, without the excepted lines.
pub fn compare_snapshots(go: &Snapshot, ours: &Snapshot, exceptions: &[Exception]) -> Vec<String> {
    let names: BTreeSet<&str> = go.section_names().chain(ours.section_names()).collect();
    let mut problems = Vec::new();
    for name in names {
        let keep = |lines: &[String]| -> Vec<String> {
            lines
                .iter()
                .filter(|l| !exceptions.iter().any(|e| e.applies(name, l)))
                .cloned()
                .collect()
        };
        let (g, o) = (keep(go.section(name)), keep(ours.section(name)));
        if g != o {
            problems.push(format!(
                "kernel state `{name}` differs:\n{}",
                line_diff(&g, &o).join("\n")
            ));
        }
    }
    problems
}

/// A result Debian's 1.1.1 printed, as HEAD prints the same result: HEAD leaves an empty `dns`
/// out of 1.x results (`reference-behaviour.md` §1.8), 1.1.1 prints `"dns": {}`.
pub fn as_head_prints(result: &Value) -> Value {
    let mut result = result.clone();
    let one_x = result["cniVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with("1."));
    if one_x
        && result["dns"] == serde_json::json!({})
        && let Some(o) = result.as_object_mut()
    {
        o.remove("dns");
    }
    result
}

/// `value` pretty-printed with the keys of every object sorted (so a diff shows values, not
/// key order, which JSON equality ignores).
fn pretty_lines(value: &Value) -> Vec<String> {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&map[k])))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    text_lines(&serde_json::to_string_pretty(&sorted(value)).unwrap_or_default())
}

fn text_lines(text: &str) -> Vec<String> {
    text.lines().map(str::to_owned).collect()
}

/// Lines of context kept around each change in [`line_diff`].
const CONTEXT: usize = 2;

/// A unified-style diff of `a` (lines `-`) and `b` (lines `+`), with [`CONTEXT`] lines of
/// context (`  `) around changes and `…` between hunks; empty when equal.
pub fn line_diff(a: &[String], b: &[String]) -> Vec<String> {
    #[derive(Clone, Copy, PartialEq)]
    enum Op {
        Same,
        Del,
        Add,
    }
    let (n, m) = (a.len(), b.len());
    // lcs[i][j]: length of the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(Op, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((Op::Same, &a[i]));
            i += 1;
            j += 1;
        } else if j == m || (i < n && lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push((Op::Del, &a[i]));
            i += 1;
        } else {
            ops.push((Op::Add, &b[j]));
            j += 1;
        }
    }
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, (op, _))| *op != Op::Same)
        .map(|(k, _)| k)
        .collect();
    let near = |k: usize| {
        changed
            .iter()
            .any(|&c| k + CONTEXT >= c && k <= c + CONTEXT)
    };
    let mut out = Vec::new();
    let mut skipped = false;
    for (k, (op, line)) in ops.iter().enumerate() {
        if !near(k) {
            skipped = true;
            continue;
        }
        if skipped && !out.is_empty() {
            out.push("  …".to_owned());
        }
        skipped = false;
        let sign = match op {
            Op::Same => ' ',
            Op::Del => '-',
            Op::Add => '+',
        };
        out.push(format!("{sign} {line}"));
    }
    out
}

/// The prevResult `result` (any version) as a plugin of `version` would print it, converted by
/// `cni::types` (so both sides get the same input in every version).
///
/// # Errors
/// When `result` does not parse or cannot be converted (0.x without addresses).
pub fn result_in_version(result: &Value, version: &str) -> Result<Value> {
    let (_, model) = cni::types::CniResult::parse(result)?;
    Ok(serde_json::from_str(&model.to_json(version)?)?)
}

/// Renames hash-named chains (`CNI-<hex>`, `CNI-DN-<hex>`, …: a `CNI-` name whose last part is
/// at least 16 hex digits) to `CNI-<#n>` numbered in order of first appearance, so two
/// snapshots whose chains are named after different container IDs compare. Only for
/// comparisons where the IDs differ or the names are not ours to choose (the main plugin's).
pub fn normalise_hash_chains(lines: &[String]) -> Vec<String> {
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    lines
        .iter()
        .map(|line| {
            line.split(' ')
                .map(|word| {
                    let trimmed = word.trim_matches(|c: char| c == '"' || c == ':');
                    let is_hash = trimmed.starts_with("CNI-")
                        && trimmed.rsplit('-').next().is_some_and(|h| {
                            h.len() >= 16 && h.chars().all(|c| c.is_ascii_hexdigit())
                        });
                    if !is_hash {
                        return word.to_owned();
                    }
                    let n = names.len();
                    let alias = names
                        .entry(trimmed.to_owned())
                        .or_insert_with(|| format!("CNI-<#{n}>"))
                        .clone();
                    word.replace(trimmed, &alias)
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn line_diff_marks_changes_with_context_and_elides_the_rest() {
        let a = lines("a\nb\nc\nd\ne\nf\ng\nh\ni");
        let b = lines("a\nb\nc\nD\ne\nf\ng\nh\ni\nj");
        assert_eq!(
            line_diff(&a, &b),
            lines("  b\n  c\n- d\n+ D\n  e\n  f\n  …\n  h\n  i\n+ j")
        );
        assert!(line_diff(&a, &a).is_empty());
    }

    #[test]
    fn hash_chains_are_numbered_in_order_of_first_appearance() {
        let a = lines(
            ":CNI-DN-e9bdf4710a2662c2ad7b2 - \n-A POSTROUTING -s 10.88.0.2/32 -m comment --comment \"name: \\\"podman\\\" id: \\\"x\\\"\" -j CNI-8b9e5b1fa2e0a1d1f6e4a3b2\n-A CNI-HOSTPORT-DNAT -j CNI-DN-e9bdf4710a2662c2ad7b2",
        );
        assert_eq!(
            normalise_hash_chains(&a),
            lines(
                ":CNI-<#0> - \n-A POSTROUTING -s 10.88.0.2/32 -m comment --comment \"name: \\\"podman\\\" id: \\\"x\\\"\" -j CNI-<#1>\n-A CNI-HOSTPORT-DNAT -j CNI-<#0>"
            )
        );
    }

    fn outcome(exit: i32, stdout: &str) -> Outcome {
        Outcome {
            by: Impl::Go,
            exit: Some(exit),
            stdout: stdout.to_owned(),
            stderr: String::new(),
            json: serde_json::from_str(stdout).ok(),
        }
    }

    #[test]
    fn a_go_999_is_not_compared_but_skel_codes_and_messages_are() {
        let go = outcome(1, r#"{"code": 999, "msg": "x"}"#);
        let ours = outcome(1, r#"{"code": 7, "msg": "x"}"#);
        assert!(compare_outcomes(&go, &ours, false).is_empty());
        let go = outcome(1, r#"{"code": 4, "msg": "x"}"#);
        assert_eq!(compare_outcomes(&go, &ours, false).len(), 1);
        let ours = outcome(1, r#"{"code": 4, "msg": "y"}"#);
        assert_eq!(compare_outcomes(&go, &ours, false).len(), 1);
        assert!(compare_outcomes(&go, &ours, true).is_empty());
        assert_eq!(compare_outcomes(&go, &outcome(0, ""), false).len(), 1);
    }

    #[test]
    fn results_compare_as_json_and_0x_results_byte_for_byte() {
        let go = outcome(0, "{\n    \"cniVersion\": \"1.0.0\",\n    \"ips\": []\n}");
        let ours = outcome(0, "{\n    \"ips\": [],\n    \"cniVersion\": \"1.0.0\"\n}");
        assert!(compare_outcomes(&go, &ours, false).is_empty());
        let go = outcome(0, "{\n    \"cniVersion\": \"0.4.0\",\n    \"dns\": {}\n}");
        let ours = outcome(0, "{\n    \"dns\": {},\n    \"cniVersion\": \"0.4.0\"\n}");
        assert_eq!(compare_outcomes(&go, &ours, false).len(), 1);
    }
}
