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
//! - `--only x,y`: the suites to run (tuning, bandwidth, sbr, firewall, nft, iptables-native,
//!   portmap, reconcile, memory, busy).
//! - `--memory-sizes a,b`: the stdin sizes of the memory suite, in KB or with an `M` for MB
//!   (default `1M,4M,16M`).
//! - `--memory-shapes a,b`: its stdin shapes, of `array`, `nesting`, `routes` (default all).
//! - `--busy-conntrack a,b`: the busy suite's conntrack table sizes, after its levels of 1
//!   entry (default 20000,100000).
//! - `--busy-veths N`: the veths on its bridge (default 100).
//! - `--busy-kube-rules N`: the kube-proxy-style rules in its `nat` table (default 5000).
//! - `--out DIR`: also write `DIR/BENCHMARKS.md`, the plot `DIR/bench-scale.png` (with
//!   `gnuplot`), its data and script, and every sample in `DIR/bench-data.json`.
//! - `--help`: prints this and exits.
//!
//! On SIGINT, SIGTERM or SIGHUP, and on a panic, it removes the namespaces it made before it
//! dies. `bench --spawner` is internal: the small process that runs the timed execs
//! (`bench::spawner`).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use bench::memory::Shape;
use bench::report::{self, Run};
use bench::{Options, Results, SUITES, remove_namespaces_of, spawner, targets};
use harness::cleanup;

/// What `--help` prints.
const USAGE: &str = "\
usage: bench [--iterations N] [--sizes a,b,c] [--reference-max-size N] [--only x,y]
             [--memory-sizes a,b] [--memory-shapes a,b] [--busy-conntrack a,b]
             [--busy-veths N] [--busy-kube-rules N] [--out DIR]

Times our plugins against the Go reference binaries (/usr/lib/cni), interleaved in one run, and
prints markdown: the per-verb table, the scale series and the target verdicts. Needs root and our
release binaries beside it (scripts/bench.sh builds them).

  --iterations N          timed repetitions per row (default 100)
  --sizes a,b,c           the scale series' sizes of other attachments (default 0,100,1000,5000)
  --reference-max-size N  largest size for the series that grow with N (default 1000)
  --only x,y              the suites to run: tuning, bandwidth, sbr, firewall, nft,
                          iptables-native, portmap, reconcile, memory, busy
  --memory-sizes a,b      the memory suite's stdin sizes, KB or with M for MB (default 1M,4M,16M)
  --memory-shapes a,b     its stdin shapes: array, nesting, routes (default all)
  --busy-conntrack a,b    the busy node's conntrack table sizes (default 20000,100000)
  --busy-veths N          the veths on its bridge (default 100)
  --busy-kube-rules N     the kube-proxy-style rules in its nat table (default 5000)
  --out DIR               also write DIR/BENCHMARKS.md, the plot, its data and every sample
  --help                  print this
";

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(spawner::SPAWNER_ARG) {
        return spawner::serve();
    }
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        // A reader that went away (`bench --help | head -1`) is not an error.
        let _ = std::io::stdout().write_all(USAGE.as_bytes());
        return ExitCode::SUCCESS;
    }
    let removed = cleanup::on_interrupt("bench", || {
        let _ = remove_namespaces_of(std::process::id());
    });
    if let Err(e) = removed {
        eprintln!("bench failed: {e:#}");
        return ExitCode::FAILURE;
    }
    let result = run();
    cleanup::wait_if_interrupted();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A size in KiB: `64` or `64K`, `16M` for MiB.
fn kib(text: &str) -> Result<usize> {
    let (number, scale) = match text.strip_suffix(['M', 'm']) {
        Some(n) => (n, 1024),
        None => (text.trim_end_matches(['K', 'k']), 1),
    };
    let n: usize = number
        .parse()
        .with_context(|| format!("{text:?} is not a size"))?;
    Ok(n * scale)
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
            "--memory-sizes" => {
                options.memory_sizes_kib = value()?
                    .split(',')
                    .map(kib)
                    .collect::<Result<_>>()
                    .context("--memory-sizes")?;
            }
            "--memory-shapes" => {
                options.memory_shapes = value()?
                    .split(',')
                    .map(|k| {
                        Shape::from_key(k).with_context(|| {
                            format!("--memory-shapes: no shape {k:?} (array, nesting, routes)")
                        })
                    })
                    .collect::<Result<_>>()?;
            }
            "--busy-conntrack" => {
                options.busy_conntrack = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .context("--busy-conntrack")?;
            }
            "--busy-veths" => options.busy_veths = value()?.parse().context("--busy-veths")?,
            "--busy-kube-rules" => {
                options.busy_kube_rules = value()?.parse().context("--busy-kube-rules")?;
            }
            "--out" => out = Some(PathBuf::from(value()?)),
            other => bail!("unknown argument {other:?}\n{USAGE}"),
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
        let waited = bench::wait_for_quiet()?;
        eprintln!(
            "running {name} ({} iterations; waited {:.1} s for the CPUs to be quiet)",
            options.iterations,
            waited.as_secs_f64()
        );
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
