//! The bench works end to end: every suite with tiny sizes, writing `BENCHMARKS.md`, the plot
//! and the raw data; and `--help` prints its usage. CI's test command never runs the real bench;
//! this proves it still runs. Nothing here looks at the timings themselves.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read as _, Seek as _};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use bench::report::{DATA_FILE, MARKDOWN_FILE, PLOT_DATA_FILE, PLOT_FILE};
use bench::targets::{self, Measure};
use bench::{
    GO_IPTABLES, OURS_IPTABLES, OURS_NFTABLES, SUITES, busy, portmap, reconcile,
    remove_namespaces_of,
};
use harness::process;
use serde_json::Value;

/// A hung bench is killed after this long. It takes about 30 s in a debug build on a quiet
/// machine, and up to 10 s more per suite on a busy one (`wait_for_quiet`).
const DEADLINE: Duration = Duration::from_secs(300);
const ITERATIONS: usize = 2;
const SIZES: [usize; 2] = [0, 1];
/// The memory suite's stdin: 16 KB, far from the sizes its targets name.
const MEMORY_SIZES: &str = "16K";
const SCALE_SUITES: [&str; 2] = ["firewall", "portmap"];
const SERIES: [&str; 3] = [OURS_NFTABLES, OURS_IPTABLES, GO_IPTABLES];
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
/// The busy node's tiny sizes: conntrack levels, veths, kube-proxy rules.
const BUSY_CONNTRACK: [usize; 1] = [20];
const BUSY_VETHS: usize = 3;
const BUSY_KUBE_RULES: usize = 40;

/// The rows of the markdown table under `heading`, as cells.
fn table(markdown: &str, heading: &str) -> Result<Vec<Vec<String>>> {
    let (_, section) = markdown
        .split_once(&format!("\n{heading}\n"))
        .with_context(|| format!("no {heading:?} in:\n{markdown}"))?;
    Ok(section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        // The header and the separator.
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect())
}

/// A figure of the tables: `1.234`, `0.250×`, `92.5 ms`, or a peak RSS at the spawner's floor,
/// `≤ 2.5`.
fn number(cell: &str) -> Result<f64> {
    cell.trim_start_matches("≤ ")
        .trim_end_matches('×')
        .trim_end_matches(" ms")
        .parse()
        .with_context(|| format!("{cell:?} is not a number"))
}

/// Nearest-rank median of the samples' nanoseconds, in ms.
fn median_ms(samples: &Value) -> Result<f64> {
    let mut v = samples["ns"]
        .as_array()
        .context("no ns")?
        .iter()
        .map(|x| x.as_u64().context("not a u64"))
        .collect::<Result<Vec<u64>>>()?;
    v.sort_unstable();
    ensure!(!v.is_empty(), "no samples");
    #[allow(clippy::cast_precision_loss)]
    Ok(v[v.len().div_ceil(2) - 1] as f64 / 1e6)
}

/// How many samples there are, checking there is an RSS entry for each.
fn count(samples: &Value) -> Result<usize> {
    let ns = samples["ns"].as_array().context("no ns")?.len();
    let rss = samples["rss_kib"].as_array().context("no rss_kib")?.len();
    ensure!(ns == rss, "{ns} times but {rss} RSS in {samples}");
    Ok(ns)
}

/// Runs the bench into `out`; returns whether it succeeded, its stdout and stderr, and the
/// namespaces it left (removed by then, whatever happened).
fn run_bench(out: &Path) -> Result<(bool, String, Vec<String>)> {
    // A file, not a pipe: nobody reads while the bench runs.
    let mut log = tempfile::tempfile()?;
    let sizes: Vec<String> = SIZES.iter().map(ToString::to_string).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--iterations", &ITERATIONS.to_string()])
        .args(["--sizes", &sizes.join(",")])
        .args(["--memory-sizes", MEMORY_SIZES])
        .args([
            "--busy-conntrack",
            &BUSY_CONNTRACK.map(|n| n.to_string()).join(","),
        ])
        .args(["--busy-veths", &BUSY_VETHS.to_string()])
        .args(["--busy-kube-rules", &BUSY_KUBE_RULES.to_string()])
        .arg("--out")
        .arg(out)
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?)
        .spawn()?;
    let pid = child.id();
    let reaped = process::reap(&mut child, Some(Instant::now() + DEADLINE));
    // Killed or not, the namespaces it made (named after its pid) go.
    let left = remove_namespaces_of(pid);
    let mut text = String::new();
    log.rewind()?;
    log.read_to_string(&mut text)?;
    let ok = match reaped {
        Ok(r) => r.status.success(),
        Err(e) => {
            let _ = write!(text, "\n(test: {e})");
            false
        }
    };
    Ok((ok, text, left))
}

#[test]
fn help_prints_the_usage_and_runs_nothing() -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--help")
        .output()?;
    ensure!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("usage: bench"),
        "{out:?}"
    );
    Ok(())
}

#[test]
fn the_bench_runs_every_suite_and_writes_a_consistent_report() -> Result<()> {
    let out = tempfile::tempdir()?;
    let (ok, log, left) = run_bench(out.path())?;
    assert!(ok, "the bench failed:\n{log}");
    assert!(
        left.is_empty(),
        "the bench left namespaces {left:?}:\n{log}"
    );

    let md = std::fs::read_to_string(out.path().join(MARKDOWN_FILE))?;
    let data: Value = serde_json::from_str(&std::fs::read_to_string(out.path().join(DATA_FILE))?)?;
    let png = std::fs::read(out.path().join(PLOT_FILE))?;
    assert!(png.starts_with(PNG_SIGNATURE), "{PLOT_FILE} is no PNG");
    assert!(md.contains(&format!("]({PLOT_FILE})")), "{md}");
    for heading in ["## Machine", "## Command", "## Targets"] {
        assert!(md.contains(heading), "{heading} missing:\n{md}");
    }

    // Per verb: every suite has rows, every cell that should be a number is one, and each
    // median is that of the raw samples.
    let verbs = table(&md, "## Per verb")?;
    for (suite, _) in SUITES.iter().filter(|(s, _)| *s != busy::SUITE) {
        assert!(
            verbs.iter().any(|r| r[0] == *suite),
            "no {suite} row:\n{md}"
        );
    }
    let json_rows = data["rows"].as_array().context("no rows")?;
    assert_eq!(json_rows.len(), verbs.len(), "{md}");
    for (row, json) in verbs.iter().zip(json_rows) {
        assert_eq!(row.len(), 11, "{row:?}");
        for (cell, key) in row.iter().zip(["suite", "case", "step"]) {
            assert_eq!(json[key], cell.as_str(), "{row:?}");
        }
        // Ours in-process (nft, iptables-native) has no RSS; every exec through the spawner has
        // one (iptables-native's reference runs the tools from the bench process: none).
        for cell in [&row[3], &row[4], &row[7], &row[8], &row[10]] {
            number(cell)?;
        }
        if row[0] != "iptables-native" {
            number(&row[9])?;
        }
        if !["nft", "iptables-native"].contains(&row[0].as_str()) {
            assert!(number(&row[5])? > 0.0, "{row:?}");
        }
        assert_eq!(count(&json["ours"])?, ITERATIONS, "{json}");
        assert_eq!(count(&json["reference"])?, ITERATIONS, "{json}");
        assert!((number(&row[3])? - median_ms(&json["ours"])?).abs() < 0.0015);
        assert!((number(&row[7])? - median_ms(&json["reference"])?).abs() < 0.0015);
    }

    // Scale: every series at every size, numbers parse, installs as many as the others.
    let scale = table(&md, "## Scale")?;
    let json_scale = data["scale"].as_array().context("no scale")?;
    assert_eq!(scale.len(), json_scale.len(), "{md}");
    assert_eq!(scale.len(), SCALE_SUITES.len() * SIZES.len() * SERIES.len());
    for suite in SCALE_SUITES {
        for size in SIZES {
            for series in SERIES {
                let at =
                    |r: &&Vec<String>| r[0] == suite && r[1] == size.to_string() && r[2] == series;
                assert!(
                    scale.iter().any(|r| at(&r)),
                    "no {suite} {size} {series}:\n{md}"
                );
            }
        }
    }
    for (row, json) in scale.iter().zip(json_scale) {
        assert_eq!(row.len(), 14, "{row:?}");
        assert_eq!(json["suite"], row[0].as_str());
        assert_eq!(json["others"].as_f64(), Some(number(&row[1])?));
        for cell in row[3..=4].iter().chain(&row[6..=7]) {
            number(cell)?;
        }
        assert!(number(&row[10])? > 0.0, "{row:?}");
        let go = row[2] == GO_IPTABLES;
        assert_eq!(row[8] == "–", go, "{row:?}");
        if !go {
            number(&row[8])?;
            number(&row[9])?;
        }
        if row[1] == "0" {
            assert_eq!(row[5], "–", "{row:?}");
            assert!(json["alongside"].is_null(), "{json}");
        } else {
            number(&row[11])?;
            number(&row[12])?;
            // Timed alongside, with no others, as often as the row itself.
            assert_eq!(count(&json["alongside"]["add"])?, ITERATIONS, "{json}");
            assert_eq!(count(&json["alongside"]["del"])?, ITERATIONS, "{json}");
            assert!((number(&row[5])? - median_ms(&json["alongside"]["add"])?).abs() < 0.0015);
        }
        assert_eq!(count(&json["add"])?, ITERATIONS, "{json}");
        assert_eq!(count(&json["del"])?, ITERATIONS, "{json}");
        let others = usize::try_from(json["others"].as_u64().context("others")?)?;
        assert_eq!(count(&json["install"]["samples"])?, others, "{json}");
        assert!((number(&row[3])? - median_ms(&json["add"])?).abs() < 0.0015);
        assert!((number(&row[6])? - median_ms(&json["del"])?).abs() < 0.0015);
    }

    // The plot's data: one block per (suite, series), one line per size, as in the JSON.
    let dat = std::fs::read_to_string(out.path().join(PLOT_DATA_FILE))?;
    let mut blocks: BTreeMap<String, usize> = BTreeMap::new();
    let mut current = None;
    for line in dat.lines().skip(1) {
        if let Some(name) = line.strip_prefix("# ") {
            current = Some(name.to_owned());
        } else if !line.is_empty() {
            *blocks
                .entry(current.clone().context("data before a block")?)
                .or_default() += 1;
        }
    }
    assert_eq!(blocks.len(), SCALE_SUITES.len() * SERIES.len(), "{dat}");
    assert!(blocks.values().all(|&n| n == SIZES.len()), "{dat}");

    // The busy node: every level, and at each the rows it must have; figures as in the JSON.
    let busy_rows = table(&md, "## Busy node")?;
    let json_busy = data["busy"].as_array().context("no busy")?;
    assert_eq!(busy_rows.len(), json_busy.len(), "{md}");
    let mut levels = vec![(1, 0), (1, BUSY_KUBE_RULES)];
    levels.extend(BUSY_CONNTRACK.map(|n| (n, BUSY_KUBE_RULES)));
    for (conntrack, kube) in levels {
        let at: Vec<&Vec<String>> = busy_rows
            .iter()
            .filter(|r| r[0] == conntrack.to_string() && r[1] == kube.to_string())
            .collect();
        let has = |suite: &str, case: &str, step: &str| {
            at.iter()
                .any(|r| r[2] == suite && r[3] == case && r[4] == step)
        };
        for case in [portmap::CASE_NFTABLES, portmap::CASE_IPTABLES] {
            for step in ["ADD", "CHECK", "DEL"] {
                assert!(
                    has("portmap", case, step),
                    "no {case} {step} at {conntrack}:\n{md}"
                );
            }
        }
        for step in ["ADD", "DEL"] {
            assert!(has("portmap", busy::CASE_KERNEL_COMMIT, step), "{md}");
        }
        assert!(
            has(busy::CONNTRACK, busy::CASE_FLUSH_BY_DUMP, "flush"),
            "{md}"
        );
        assert!(has(busy::CONNTRACK, busy::CASE_DUMP_ALL, "dump"), "{md}");
        let others = ["tuning", "bandwidth", "sbr", "firewall"];
        for suite in others {
            let present = at.iter().any(|r| r[2] == suite);
            assert_eq!(present, conntrack > 1, "{suite} at {conntrack}:\n{md}");
        }
    }
    for (row, json) in busy_rows.iter().zip(json_busy) {
        assert_eq!(row.len(), 13, "{row:?}");
        assert_eq!(json["conntrack"].as_f64(), Some(number(&row[0])?));
        assert_eq!(json["veths"].as_u64(), Some(BUSY_VETHS as u64));
        for (cell, key) in row[2..5].iter().zip(["suite", "case", "step"]) {
            assert_eq!(json[key], cell.as_str(), "{row:?}");
        }
        assert!((number(&row[5])? - median_ms(&json["ours"])?).abs() < 0.0015);
        let go = json["reference"]["ns"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
        assert_eq!(go, row[12] != "–", "{row:?}");
        if go {
            assert!((number(&row[9])? - median_ms(&json["reference"])?).abs() < 0.0015);
            assert_eq!(count(&json["reference"])?, ITERATIONS, "{json}");
        }
    }

    // Reconcile: both steps of every layout at 1 attachment, the only size this run reaches.
    for layout in [
        "portmap nftables",
        "portmap iptables",
        "firewall nftables",
        "firewall iptables",
    ] {
        for step in [reconcile::AFTER_FLUSH, reconcile::NOTHING_MISSING] {
            let case = format!("{layout}, 1 attachments");
            assert!(
                verbs
                    .iter()
                    .any(|r| r[0] == reconcile::SUITE && r[1] == case && r[2] == step),
                "no reconcile {case} {step}:\n{md}"
            );
        }
    }

    // Targets: every one is listed; every ratio and time is measured (its row exists), but
    // reconcile's at 1000 attachments; those and the growth, memory and busy targets, whose
    // sizes this run leaves out, say so.
    let targets = table(&md, "## Targets")?;
    assert_eq!(targets.len(), targets::all().count(), "{md}");
    for (row, target) in targets.iter().zip(targets::all()) {
        assert_eq!(row[0], target.describe());
        match target.measure {
            Measure::Time {
                suite: reconcile::SUITE,
                ..
            } => {
                assert!(row[3].starts_with("not measured"), "{row:?}");
            }
            Measure::Ratio { .. } | Measure::Time { .. } => {
                number(&row[1])?;
                assert!(["met", "**missed**"].contains(&row[3].as_str()), "{row:?}");
            }
            Measure::Growth { .. }
            | Measure::Memory { .. }
            | Measure::Busy { .. }
            | Measure::BusyGrowth { .. }
            | Measure::BusyUserSpace { .. } => {
                assert!(row[3].starts_with("not measured"), "{row:?}");
            }
        }
    }
    Ok(())
}
