//! The benchmark: our plugins against the Go reference binaries, interleaved in one run,
//! printed as markdown (per-verb table, scale series, target verdicts). Needs root and our
//! release binaries beside it; run it as `scripts/bench.sh [options]`, which builds them
//! statically linked, as they are shipped. Options:
//!
//! - `--iterations N`: timed repetitions per row (default 100; the scale series take at most
//!   30 per size).
//! - `--sizes a,b,c`: the scale series' "others installed" (default 0,100,1000,5000).
//! - `--reference-max-size N`: the largest size of the series whose installs grow with N: the
//!   Go firewall's own, and portmap's iptables layout (default 1000; larger sizes get the
//!   other series only, with a note). 5000 adds over an hour to the run.
//! - `--only x,y`: the suites to run (tuning, bandwidth, sbr, firewall, nft, portmap).
//! - `--out DIR`: also write `DIR/BENCHMARKS.md`, the plot `DIR/bench-scale.png` (with
//!   `gnuplot`), its data and script, and every sample in `DIR/bench-data.json`.
//!
//! On SIGINT, SIGTERM or SIGHUP, and on a panic, it removes the namespaces it made before it
//! dies. `bench --spawner` is internal: the small process that runs the timed execs
//! (`tests::bench::spawner`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{SigSet, Signal};
use tests::bench::report::{self, Run};
use tests::bench::{Options, Results, SUITES, remove_namespaces_of, spawner, targets};

/// Set when a terminating signal arrived: the signal thread is removing the namespaces and
/// will end the process with the signal; the main thread's errors are then consequences.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(spawner::SPAWNER_ARG) {
        return spawner::serve();
    }
    if let Err(e) = clean_up_on_signals() {
        eprintln!("bench failed: {e:#}");
        return ExitCode::FAILURE;
    }
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // Release builds abort on panic: no destructor would remove the namespaces.
        let _ = remove_namespaces_of(std::process::id());
        default_hook(info);
    }));
    let result = run();
    while INTERRUPTED.load(Ordering::SeqCst) {
        std::thread::park();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Blocks the terminating signals in every thread (threads inherit the mask; spawned programs
/// get a clean one) and waits for them on a thread of its own, which removes this process's
/// namespaces and then dies of the signal.
fn clean_up_on_signals() -> Result<()> {
    let mut set = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(signal);
    }
    set.thread_block().context("blocking signals")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let Ok(signal) = set.wait() else { return };
            INTERRUPTED.store(true, Ordering::SeqCst);
            let removed = remove_namespaces_of(std::process::id());
            eprintln!(
                "bench: {signal}: removed {} namespaces, exiting",
                removed.len()
            );
            // Unblocked here and raised: the default action ends the process with the signal.
            // A shell starts background jobs with SIGINT ignored, though: then exit as a
            // shell reports a signal.
            let _ = SigSet::from(signal).thread_unblock();
            let _ = nix::sys::signal::raise(signal);
            #[allow(clippy::exit)]
            std::process::exit(128 + signal as i32);
        })
        .context("starting the signal thread")?;
    Ok(())
}

fn run() -> Result<()> {
    let mut options = Options::default();
    let mut only: Option<Vec<String>> = None;
    let mut out: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--iterations" => options.iterations = value()?.parse().context("--iterations")?,
            "--sizes" => {
                options.sizes = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .context("--sizes")?;
            }
            "--reference-max-size" => {
                options.reference_max_size = value()?.parse().context("--reference-max-size")?;
            }
            "--only" => only = Some(value()?.split(',').map(str::to_owned).collect()),
            "--out" => out = Some(PathBuf::from(value()?)),
            other => bail!(
                "unknown argument {other:?} (--iterations N, --sizes a,b, \
                 --reference-max-size N, --only x,y, --out DIR)"
            ),
        }
    }
    let unknown = only
        .iter()
        .flatten()
        .find(|n| !SUITES.iter().any(|(s, _)| s == n));
    if let Some(bad) = unknown {
        let known: Vec<_> = SUITES.iter().map(|(s, _)| *s).collect();
        bail!("no suite {bad:?}; suites: {known:?}");
    }
    let command = std::env::var("BENCH_COMMAND")
        .unwrap_or_else(|_| std::env::args().collect::<Vec<_>>().join(" "));

    let mut results = Results::default();
    let mut suites = Vec::new();
    for (name, suite) in SUITES {
        if only.as_ref().is_some_and(|o| !o.iter().any(|n| n == name)) {
            continue;
        }
        eprintln!("running {name} ({} iterations)", options.iterations);
        results.extend(suite(&options).with_context(|| format!("suite {name}"))?);
        suites.push(*name);
    }
    let verdicts = targets::evaluate(&results, &suites);
    let run = Run {
        results: &results,
        verdicts: &verdicts,
        options: &options,
        suites: &suites,
        command: &command,
    };
    print!("{}", report::markdown(&run, None));
    if let Some(dir) = out {
        report::write(&dir, &run)?;
        eprintln!(
            "wrote {} with {} and {}",
            dir.join(report::MARKDOWN_FILE).display(),
            report::PLOT_FILE,
            report::DATA_FILE
        );
    }
    Ok(())
}
