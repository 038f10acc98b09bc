//! The benchmark: our plugins against the Go reference binaries, interleaved in one run,
//! printed as a markdown table. Needs root and our release binaries beside it; run it as
//! `sudo scripts/bench.sh [--iterations N] [--sizes 0,100,1000] [--only tuning,nft]`, which
//! builds them statically linked, as they are shipped.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use tests::bench::{self, Options, SUITES};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut options = Options::default();
    let mut only: Option<Vec<String>> = None;
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
            "--only" => only = Some(value()?.split(',').map(str::to_owned).collect()),
            other => bail!("unknown argument {other:?} (--iterations N, --sizes a,b, --only x,y)"),
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
    let mut rows = Vec::new();
    for (name, suite) in SUITES {
        if only.as_ref().is_some_and(|o| !o.iter().any(|n| n == name)) {
            continue;
        }
        eprintln!("running {name} ({} iterations)", options.iterations);
        rows.extend(suite(&options).with_context(|| format!("suite {name}"))?);
    }
    print!("{}", bench::markdown(&rows));
    Ok(())
}
