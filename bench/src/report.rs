//! The report of a run: markdown tables (per verb, scale series, targets), the raw data as
//! JSON, the scale plot (a gnuplot data file and script, rendered to PNG by `gnuplot`), and
//! `BENCHMARKS.md` putting them together with the machine and the command that made them.
//!
//! Files written by [`write()`] into the output directory:
//!
//! | file | what |
//! | --- | --- |
//! | `BENCHMARKS.md` | intro, machine, command, the tables, the plot, the target verdicts |
//! | `bench-scale.png` | the scale series (pngcairo) |
//! | `bench-scale.dat`, `bench-scale.gp` | its data and script: `gnuplot bench-scale.gp` |
//! | `bench-data.json` | every sample (ns) and peak RSS (KiB), the verdicts, the machine |

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use harness::bins;
use serde_json::{Value, json};

use crate::busy::NodeRow;
use crate::spawner;
use crate::targets::Verdict;
use crate::{GO_IPTABLES, OURS_IPTABLES, OURS_NFTABLES, Options, Results, Row, Samples, ratio};

/// The report's markdown file.
pub const MARKDOWN_FILE: &str = "BENCHMARKS.md";
/// The plot.
pub const PLOT_FILE: &str = "bench-scale.png";
/// The plot's data, one gnuplot block per (suite, series).
pub const PLOT_DATA_FILE: &str = "bench-scale.dat";
/// The plot's gnuplot script.
pub const PLOT_SCRIPT_FILE: &str = "bench-scale.gp";
/// Every sample of the run.
pub const DATA_FILE: &str = "bench-data.json";

/// The opening of `BENCHMARKS.md`.
const INTRO: &str = "\
Our plugins against the Go reference plugins of Debian's `containernetworking-plugins`, timed in
one run by the bench (`bench/src/main.rs`), ours and Go interleaved so that machine noise
hits both alike. A figure is the wall time of one whole exec (fork, exec, plugin, exit, reap) as
a runtime pays it, measured from a thread inside the plugin's namespace; ratios are ours/Go of
the medians. Peak RSS is the largest `ru_maxrss` over a row's execs: that of the plugin or of a
program it ran (`iptables`), whichever is larger. The execs are spawned by a small process of
the bench's, whose own peak RSS is a floor under every figure (`ru_maxrss` counts the memory
the exec replaced); the tables give it. Before each exec the spawner waits, untimed, for the
kernel work earlier execs left behind: our plugins' detached children (which it inherits) have
exited, and nf_tables has freed what earlier transactions in the namespace deleted. Otherwise an
RCU grace period that a DEL left pending (3-45 ms here) lands in whichever exec comes next, ours
or Go's, as it does on a node for the next nf_tables user within that time of a DEL.

This file, `bench-scale.png` and `bench-data.json` (every sample) are written by the bench:
rerun the command below rather than editing them.
";

/// What a run produced and how it was made: everything the report needs.
#[derive(Debug)]
pub struct Run<'a> {
    /// The measurements.
    pub results: &'a Results,
    /// The verdicts of the targets of the suites run.
    pub verdicts: &'a [Verdict],
    /// The options the suites ran with.
    pub options: &'a Options,
    /// The suites run, in order.
    pub suites: &'a [&'a str],
    /// The command line that made the run.
    pub command: &'a str,
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn mib(kib: Option<u64>) -> String {
    #[allow(clippy::cast_precision_loss)]
    kib.map_or_else(|| "–".to_owned(), |k| format!("{:.1}", k as f64 / 1024.0))
}

/// A peak RSS figure in MiB, as `≤ x` when it is not above the spawner's floor: the exec then
/// read the floor at its time, and its own peak was at most that.
fn rss(kib: Option<u64>) -> String {
    match (kib, spawner::rss_floor_kib()) {
        (Some(k), Some(floor)) if k <= floor => format!("≤ {}", mib(Some(k))),
        _ => mib(kib),
    }
}

fn times(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_owned(), |r| format!("{r:.3}"))
}

/// Median and p90 in ms, or dashes when empty.
fn median_p90(s: &Samples) -> (String, String) {
    if s.is_empty() {
        ("–".to_owned(), "–".to_owned())
    } else {
        (ms(s.median()), ms(s.p90()))
    }
}

/// The per-verb rows as one markdown table (times in milliseconds, RSS in MiB).
#[must_use]
pub fn verb_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| suite | case | step | ours median ms | ours p90 ms | ours peak RSS MiB | reference | ref median ms | ref p90 ms | ref peak RSS MiB | ours/ref |\n\
         | --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n",
    );
    for row in rows {
        let (ref_median, ref_p90) = median_p90(&row.reference);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {ref_median} | {ref_p90} | {} | {} |",
            row.suite,
            row.case,
            row.step,
            ms(row.ours.median()),
            ms(row.ours.p90()),
            rss(row.ours.peak_rss_kib()),
            row.reference_label,
            rss(row.reference.peak_rss_kib()),
            times(row.ratio()),
        );
    }
    out
}

/// The busy node's rows as one markdown table, each with its level (times in milliseconds,
/// RSS in MiB).
#[must_use]
pub fn busy_table(rows: &[NodeRow]) -> String {
    let mut out = String::from(
        "| conntrack entries | kube-proxy rules | suite | case | step | ours median ms | ours p90 ms | ours peak RSS MiB | reference | ref median ms | ref p90 ms | ref peak RSS MiB | ours/ref |\n\
         | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n",
    );
    for NodeRow {
        conntrack,
        kube_rules,
        row,
        ..
    } in rows
    {
        let (ref_median, ref_p90) = median_p90(&row.reference);
        let _ = writeln!(
            out,
            "| {conntrack} | {kube_rules} | {} | {} | {} | {} | {} | {} | {} | {ref_median} | {ref_p90} | {} | {} |",
            row.suite,
            row.case,
            row.step,
            ms(row.ours.median()),
            ms(row.ours.p90()),
            rss(row.ours.peak_rss_kib()),
            row.reference_label,
            rss(row.reference.peak_rss_kib()),
            times(row.ratio()),
        );
    }
    out
}

/// The scale points as one markdown table.
#[must_use]
pub fn scale_table(results: &Results) -> String {
    let mut out = String::from(
        "| suite | others | series | ADD median ms | ADD p90 ms | ADD at 0 alongside ms | DEL median ms | DEL p90 ms | ADD ours/Go | DEL ours/Go | peak RSS MiB | install all s | ms per install | installed by |\n\
         | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for p in &results.scale {
        let go = results
            .scale
            .iter()
            .find(|g| g.reference && g.suite == p.suite && g.others == p.others);
        let (add_ratio, del_ratio) = match go {
            Some(g) if !p.reference => (ratio(&p.add, &g.add), ratio(&p.del, &g.del)),
            _ => (None, None),
        };
        let (add_median, add_p90) = median_p90(&p.add);
        let (del_median, del_p90) = median_p90(&p.del);
        let alongside = p
            .alongside
            .as_ref()
            .map_or_else(|| "–".to_owned(), |a| ms(a.add.median()));
        let peak = p.add.peak_rss_kib().max(p.del.peak_rss_kib());
        let installed = &p.install.samples;
        let (total, each) = if p.others == 0 || installed.is_empty() {
            ("–".to_owned(), "–".to_owned())
        } else {
            let total = installed.total();
            #[allow(clippy::cast_precision_loss)]
            let each = total.as_secs_f64() * 1e3 / installed.0.len() as f64;
            (format!("{:.2}", total.as_secs_f64()), format!("{each:.3}"))
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {add_median} | {add_p90} | {alongside} | {del_median} | {del_p90} | {} | {} | {} | {total} | {each} | {} |",
            p.suite,
            p.others,
            p.series,
            times(add_ratio),
            times(del_ratio),
            rss(peak),
            p.install.by,
        );
    }
    out
}

/// The verdicts as one markdown table.
#[must_use]
pub fn targets_table(verdicts: &[Verdict]) -> String {
    let mut out =
        String::from("| target | measured | limit | verdict |\n| --- | ---: | ---: | --- |\n");
    for v in verdicts {
        let unit = v.target.unit();
        let measured = v
            .value
            .as_ref()
            .map_or_else(|_| "–".to_owned(), |x| format!("{x:.3}{unit}"));
        let _ = writeln!(
            out,
            "| {} | {measured} | ≤ {}{unit} | {} |",
            v.target.describe(),
            v.target.limit,
            v.status()
        );
    }
    out
}

/// The tables, verdicts and notes: what the bench prints, and the body of `BENCHMARKS.md`.
/// `plot` is the image to show above the scale table, if any.
#[must_use]
pub fn markdown(run: &Run<'_>, plot: Option<&str>) -> String {
    let mut out = String::new();
    let o = run.options;
    let floor = spawner::rss_floor_kib().map_or_else(String::new, |kib| {
        format!(
            " Peak RSS cannot read below the peak RSS of the process spawning the execs, \
             {} MiB at most: a figure not above it is marked ≤.",
            mib(Some(kib))
        )
    });
    if !run.results.rows.is_empty() {
        let _ = writeln!(
            out,
            "## Per verb\n\nMeasured on an empty node: each suite's own throwaway host namespace, with \
         no bridge, no conntrack entry, and nothing in its tables but what the plugins write \
         (see `## Busy node` for the same rows on a node that looks like production). {} timed \
         iterations per row after one warm-up.{floor}\n\n{}",
            o.iterations,
            verb_table(&run.results.rows)
        );
    }
    if !run.results.scale.is_empty() {
        let mut run_sizes: Vec<(&str, BTreeSet<usize>)> = Vec::new();
        for p in &run.results.scale {
            match run_sizes.iter_mut().find(|(s, _)| *s == p.suite) {
                Some((_, sizes)) => {
                    sizes.insert(p.others);
                }
                None => run_sizes.push((&p.suite, BTreeSet::from([p.others]))),
            }
        }
        let run_sizes: Vec<String> = run_sizes
            .iter()
            .map(|(suite, sizes)| {
                let sizes: Vec<usize> = sizes.iter().copied().collect();
                format!("{suite} {}", join(&sizes))
            })
            .collect();
        let _ = writeln!(
            out,
            "## Scale\n\nWith N other attachments installed: one more ADD and its DEL, {} timed \
             iterations per size after one warm-up, and the total time of the N installing \
             ADDs. \"ADD at 0 alongside\" is the series' ADD \
             in a namespace with no others, timed in alternation with the row's: growth targets \
             divide by it. Sizes requested: {}; run: {} (a suite adds 0 and the sizes its \
             targets name, see `bench/src/lib.rs`).\n",
            o.scale_iterations(),
            join(&o.sizes),
            run_sizes.join("; ")
        );
        if let Some(plot) = plot {
            let _ = writeln!(
                out,
                "![one more ADD and DEL, and the install time, against the number of others installed]({plot})\n"
            );
        }
        let _ = writeln!(out, "{}", scale_table(run.results));
    }
    if !run.results.busy.is_empty() {
        let _ = writeln!(
            out,
            "## Busy node\n\nMeasured on a node that looks like production (`bench/src/busy.rs`): \
             one host namespace with a bridge and {} veths on it; from the second level on, {} \
             kube-proxy-style rules in its `nat` table (`KUBE-SERVICES` → `KUBE-SVC-…` → \
             `KUBE-SEP-…`); and the conntrack entries of each level (TCP and UDP, IPv4 and \
             IPv6, inserted over netlink). Each level is timed before the next is made: 1 \
             entry without, then with the kube-proxy rules (portmap only), then each larger \
             table (every plugin, with the configs of its own suite). Rows with no reference \
             are the kernel's share, timed from the bench process: the commit of one \
             attachment of portmap's iptables layout, and portmap's UDP conntrack flush both \
             ways the kernel offers it. At most {} timed iterations per row after one \
             warm-up.\n\n{}",
            o.busy_veths,
            o.busy_kube_rules,
            crate::busy::BUSY_ITERATIONS,
            busy_table(&run.results.busy)
        );
    }
    if !run.verdicts.is_empty() {
        let met = run
            .verdicts
            .iter()
            .filter(|v| v.met() == Some(true))
            .count();
        let missed = run
            .verdicts
            .iter()
            .filter(|v| v.met() == Some(false))
            .count();
        let _ = writeln!(
            out,
            "## Targets\n\nFrom the plugin issues (`bench/src/targets.rs`): {met} met, \
             {missed} missed, {} not measured.\n\n{}",
            run.verdicts.len() - met - missed,
            targets_table(run.verdicts)
        );
    }
    if !run.results.notes.is_empty() {
        out.push_str("## Notes\n\n");
        for note in &run.results.notes {
            let _ = writeln!(out, "- {note}");
        }
        out.push('\n');
    }
    out
}

fn join(sizes: &[usize]) -> String {
    sizes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The machine the run was made on, as (what, description) pairs; unknown items say so.
#[must_use]
pub fn machine() -> Vec<(&'static str, String)> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            matches!(key.trim(), "model name" | "Hardware" | "cpu model").then(|| value.trim())
        })
        .unwrap_or("unknown");
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let kib: u64 = m
                .lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            #[allow(clippy::cast_precision_loss)]
            Some(format!("{:.1} GiB", kib as f64 / (1024.0 * 1024.0)))
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
    let go = output(
        "dpkg-query",
        &["-W", "-f=${Version}", "containernetworking-plugins"],
    )
    .map_or_else(
        || "unknown version".to_owned(),
        |v| format!("containernetworking-plugins {v}"),
    );
    let ours = bins::plugin_dir().map_or_else(
        |_| "unknown".to_owned(),
        |d| {
            let kind = if d.ends_with("debug") {
                "debug build: not representative"
            } else {
                "release build"
            };
            format!("`{}` ({kind})", d.display())
        },
    );
    let commit = output("git", &["rev-parse", "--short", "HEAD"]).map_or_else(
        || "unknown".to_owned(),
        |c| {
            let dirty = output("git", &["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c} with uncommitted changes")
            } else {
                c
            }
        },
    );
    vec![
        ("CPU", format!("{cpu}, {cores} logical cores")),
        ("memory", memory),
        ("OS", os),
        ("kernel", kernel),
        (
            "Go plugins",
            format!("{go} in `{}`", bins::reference_dir().display()),
        ),
        (
            "iptables",
            output("iptables", &["--version"]).unwrap_or_else(|| "unknown".to_owned()),
        ),
        (
            "nftables",
            output("nft", &["--version"]).unwrap_or_else(|| "unknown".to_owned()),
        ),
        ("our plugins", ours),
        ("commit", commit),
        (
            "date",
            output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "unknown".to_owned()),
        ),
    ]
}

/// The trimmed stdout of a successful `program args`, if any.
fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success()).then_some(text)
}

fn samples_json(s: &Samples) -> Value {
    let ns: Vec<u64> =
        s.0.iter()
            .map(|x| u64::try_from(x.elapsed.as_nanos()).unwrap_or(u64::MAX))
            .collect();
    let rss: Vec<Option<u64>> = s.0.iter().map(|x| x.max_rss_kib).collect();
    json!({ "ns": ns, "rss_kib": rss })
}

/// Every sample of the run, the verdicts, the machine and the command, as JSON.
#[must_use]
pub fn json(run: &Run<'_>, machine: &[(&str, String)]) -> Value {
    let rows: Vec<Value> = run
        .results
        .rows
        .iter()
        .map(|r| {
            json!({
                "suite": r.suite, "case": r.case, "step": r.step,
                "reference_label": r.reference_label,
                "ours": samples_json(&r.ours), "reference": samples_json(&r.reference),
                "ratio": r.ratio(),
            })
        })
        .collect();
    let scale: Vec<Value> = run
        .results
        .scale
        .iter()
        .map(|p| {
            json!({
                "suite": p.suite, "series": p.series, "reference": p.reference,
                "others": p.others,
                "add": samples_json(&p.add), "del": samples_json(&p.del),
                "install": {
                    "by": p.install.by, "own": p.install.own,
                    "samples": samples_json(&p.install.samples),
                },
                "alongside": p.alongside.as_ref().map(|a| json!({
                    "add": samples_json(&a.add), "del": samples_json(&a.del),
                })),
            })
        })
        .collect();
    let busy: Vec<Value> = run
        .results
        .busy
        .iter()
        .map(|n| {
            let r = &n.row;
            json!({
                "conntrack": n.conntrack, "kube_rules": n.kube_rules, "veths": n.veths,
                "suite": r.suite, "case": r.case, "step": r.step,
                "reference_label": r.reference_label,
                "ours": samples_json(&r.ours), "reference": samples_json(&r.reference),
                "ratio": r.ratio(),
            })
        })
        .collect();
    let targets: Vec<Value> = run
        .verdicts
        .iter()
        .map(|v| {
            json!({
                "target": v.target.describe(), "limit": v.target.limit,
                "value": v.value.as_ref().ok(), "met": v.met(), "status": v.status(),
            })
        })
        .collect();
    let mut machine: serde_json::Map<String, Value> = machine
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    machine.insert(
        "spawner_peak_rss_kib".to_owned(),
        json!(spawner::rss_floor_kib()),
    );
    json!({
        "command": run.command,
        "machine": machine,
        "options": {
            "iterations": run.options.iterations,
            "sizes": run.options.sizes,
            "reference_max_size": run.options.reference_max_size,
            "scale_iterations": run.options.scale_iterations(),
            "suites": run.suites,
            "busy_conntrack": run.options.busy_conntrack,
            "busy_veths": run.options.busy_veths,
            "busy_kube_rules": run.options.busy_kube_rules,
        },
        "rows": rows,
        "scale": scale,
        "busy": busy,
        "targets": targets,
        "notes": run.results.notes,
    })
}

/// Line type of a series in the plot (colour and point shape).
fn line_type(series: &str) -> usize {
    match series {
        OURS_NFTABLES => 1,
        OURS_IPTABLES => 2,
        GO_IPTABLES => 3,
        _ => 4,
    }
}

/// A gnuplot string literal.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The plot's data file and script: one block per (suite, series) with columns others,
/// x position, ADD median and p90, DEL median and p90 (ms), install total (s; `-` where the
/// series did not install its own others, or there are none). Zero others sit one decade left
/// of the smallest other size, as the x axis is logarithmic. `None` without scale points.
#[must_use]
pub fn gnuplot(results: &Results) -> Option<(String, String)> {
    if results.scale.is_empty() {
        return None;
    }
    let sizes: BTreeSet<usize> = results.scale.iter().map(|p| p.others).collect();
    #[allow(clippy::cast_precision_loss)]
    let zero = sizes
        .iter()
        .find(|&&s| s > 0)
        .map_or(1.0, |&s| s as f64 / 10.0);
    #[allow(clippy::cast_precision_loss)]
    let x = |others: usize| {
        if others == 0 { zero } else { others as f64 }
    };
    let largest = sizes.last().map_or(zero, |&s| x(s));

    // Blocks in first-appearance order.
    let mut blocks: Vec<(&str, &str)> = Vec::new();
    for p in &results.scale {
        if !blocks.contains(&(p.suite.as_str(), p.series.as_str())) {
            blocks.push((&p.suite, &p.series));
        }
    }
    let mut data = String::from(
        "# bench scale series: others xpos add_median_ms add_p90_ms del_median_ms del_p90_ms install_total_s\n",
    );
    let mut has_install = Vec::new();
    for (suite, series) in &blocks {
        let _ = writeln!(data, "# {suite} {series}");
        let mut installs = false;
        for p in results
            .scale
            .iter()
            .filter(|p| p.suite == *suite && p.series == *series)
        {
            let install = if p.install.own && p.others > 0 && !p.install.samples.is_empty() {
                installs = true;
                format!("{:.6}", p.install.samples.total().as_secs_f64())
            } else {
                "-".to_owned()
            };
            let _ = writeln!(
                data,
                "{} {} {} {} {} {} {install}",
                p.others,
                x(p.others),
                ms(p.add.median()),
                ms(p.add.p90()),
                ms(p.del.median()),
                ms(p.del.p90()),
            );
        }
        has_install.push(installs);
        data.push_str("\n\n");
    }

    let suites: Vec<&str> = blocks.iter().fold(Vec::new(), |mut v, (s, _)| {
        if !v.contains(s) {
            v.push(*s);
        }
        v
    });
    let tics: Vec<String> = sizes.iter().map(|&s| format!("\"{s}\" {}", x(s))).collect();
    let mut script = format!(
        "# Written by the bench (bench/src/report.rs) with {PLOT_DATA_FILE}; run: gnuplot {PLOT_SCRIPT_FILE}\n\
         set terminal pngcairo size 1500,{} font 'sans,10'\n\
         set output '{PLOT_FILE}'\n\
         set datafile missing '-'\n\
         set linetype 1 lc rgb '#1b9e77' lw 2 pt 7\n\
         set linetype 2 lc rgb '#7570b3' lw 2 pt 5\n\
         set linetype 3 lc rgb '#d95f02' lw 2 pt 9\n\
         set linetype 4 lc rgb '#666666' lw 2 pt 13\n\
         set logscale xy\n\
         set grid\n\
         set key bmargin center horizontal\n\
         set bmargin 5\n\
         set xrange [{}:{}]\n\
         set xtics ({})\n\
         set xlabel 'other attachments installed'\n\
         set multiplot layout {},3 title 'With N others installed: one more ADD and DEL (median, bars to p90), and the time to install the N'\n",
        440 * suites.len() + 40,
        zero / 2.0,
        largest * 2.0,
        tics.join(", "),
        suites.len(),
    );
    for suite in &suites {
        let of_suite: Vec<(usize, &str)> = blocks
            .iter()
            .enumerate()
            .filter(|(_, (s, _))| s == suite)
            .map(|(i, (_, series))| (i, *series))
            .collect();
        for (verb, column) in [("ADD", 3), ("DEL", 5)] {
            let plots: Vec<String> = of_suite
                .iter()
                .map(|&(i, series)| {
                    format!(
                        "'{PLOT_DATA_FILE}' index {i} using 2:{column}:{column}:{} with yerrorlines lt {} title {}",
                        column + 1,
                        line_type(series),
                        quoted(series)
                    )
                })
                .collect();
            let _ = writeln!(
                script,
                "set ylabel 'ms'\nset title {}\nplot {}",
                quoted(&format!("{suite}: {verb} of one more")),
                plots.join(", \\\n     ")
            );
        }
        let plots: Vec<String> = of_suite
            .iter()
            .filter(|&&(i, _)| has_install[i])
            .map(|&(i, series)| {
                format!(
                    "'{PLOT_DATA_FILE}' index {i} using 2:7 with linespoints lt {} title {}",
                    line_type(series),
                    quoted(series)
                )
            })
            .collect();
        if plots.is_empty() {
            script.push_str("set multiplot next\n");
        } else {
            let _ = writeln!(
                script,
                "set ylabel 's'\nset title {}\nplot {}",
                quoted(&format!("{suite}: installing the N others (total)")),
                plots.join(", \\\n     ")
            );
        }
    }
    script.push_str("unset multiplot\n");
    Some((data, script))
}

/// Writes `BENCHMARKS.md`, the plot (running `gnuplot`), its data and script, and the raw
/// JSON into `dir` (created if missing).
///
/// # Errors
/// When a file cannot be written or `gnuplot` fails.
pub fn write(dir: &Path, run: &Run<'_>) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let machine = machine();
    let plot = match gnuplot(run.results) {
        Some((data, script)) => {
            std::fs::write(dir.join(PLOT_DATA_FILE), data)?;
            std::fs::write(dir.join(PLOT_SCRIPT_FILE), script)?;
            let out = Command::new("gnuplot")
                .arg(PLOT_SCRIPT_FILE)
                .current_dir(dir)
                .output()
                .context("running gnuplot (install gnuplot-nox)")?;
            if !out.status.success() {
                bail!(
                    "gnuplot {} failed: {}",
                    dir.join(PLOT_SCRIPT_FILE).display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Some(PLOT_FILE)
        }
        None => None,
    };
    let mut md = format!("# Benchmarks\n\n{INTRO}\n## Machine\n\n| | |\n| --- | --- |\n");
    for (what, description) in &machine {
        let _ = writeln!(md, "| {what} | {description} |");
    }
    let _ = writeln!(
        md,
        "\n## Command\n\n```sh\n{}\n```\n\nSuites: {}.\n",
        run.command,
        run.suites.join(", ")
    );
    md.push_str(&markdown(run, plot));
    let _ = writeln!(
        md,
        "## Raw data\n\n`{DATA_FILE}` holds every sample (ns) and peak RSS (KiB); \
         `{PLOT_DATA_FILE}` and `{PLOT_SCRIPT_FILE}` make the plot (`gnuplot {PLOT_SCRIPT_FILE}`)."
    );
    std::fs::write(dir.join(MARKDOWN_FILE), md)?;
    let data = serde_json::to_string_pretty(&json(run, &machine))?;
    std::fs::write(dir.join(DATA_FILE), data + "\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Install, Sample, ScalePoint};

    fn ms_samples(values: &[u64]) -> Samples {
        Samples(
            values
                .iter()
                .map(|&m| Sample {
                    elapsed: Duration::from_millis(m),
                    max_rss_kib: Some(2048),
                })
                .collect(),
        )
    }

    fn point(series: &str, reference: bool, others: usize, add: u64) -> ScalePoint {
        ScalePoint {
            suite: "portmap".into(),
            series: series.into(),
            reference,
            others,
            add: ms_samples(&[add]),
            del: ms_samples(&[add * 2]),
            install: Install {
                by: series.into(),
                own: !reference,
                samples: ms_samples(&vec![1; others]),
            },
            alongside: None,
        }
    }

    fn results() -> Results {
        Results {
            rows: vec![Row {
                suite: "x".into(),
                case: "c".into(),
                step: "ADD".into(),
                ours: ms_samples(&[1]),
                reference: ms_samples(&[4]),
                reference_label: "Go x".into(),
            }],
            scale: vec![
                point(OURS_NFTABLES, false, 0, 1),
                point(GO_IPTABLES, true, 0, 10),
                point(OURS_NFTABLES, false, 100, 2),
                point(GO_IPTABLES, true, 100, 40),
            ],
            notes: vec!["a note".into()],
            busy: vec![NodeRow {
                conntrack: 100_000,
                kube_rules: 5000,
                veths: 100,
                row: Row {
                    suite: "x".into(),
                    case: "c".into(),
                    step: "DEL".into(),
                    ours: ms_samples(&[3]),
                    reference: ms_samples(&[30]),
                    reference_label: "Go x".into(),
                },
            }],
        }
    }

    #[test]
    fn the_verb_table_has_times_rss_and_the_ratio() {
        let table = verb_table(&results().rows);
        assert!(
            table.contains(
                "| x | c | ADD | 1.000 | 1.000 | 2.0 | Go x | 4.000 | 4.000 | 2.0 | 0.250 |"
            ),
            "{table}"
        );
    }

    #[test]
    fn the_busy_table_gives_each_rows_level() {
        let table = busy_table(&results().busy);
        assert!(
            table.contains(
                "| 100000 | 5000 | x | c | DEL | 3.000 | 3.000 | 2.0 | Go x | 30.000 | 30.000 | 2.0 | 0.100 |"
            ),
            "{table}"
        );
    }

    #[test]
    fn the_scale_table_compares_each_series_with_go_at_the_same_size() {
        let table = scale_table(&results());
        assert!(
            table.contains(
                "| portmap | 100 | ours nftables | 2.000 | 2.000 | – | 4.000 | 4.000 | 0.050 | 0.050 | 2.0 | 0.10 | 1.000 | ours nftables |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| portmap | 0 | Go iptables | 10.000 | 10.000 | – | 20.000 | 20.000 | – | – | 2.0 | – | – | Go iptables |"),
            "{table}"
        );
    }

    #[test]
    fn the_plot_puts_zero_a_decade_left_and_leaves_foreign_installs_out() {
        let (data, script) = gnuplot(&results()).unwrap();
        assert!(data.contains("# portmap ours nftables\n0 10 1.000 1.000 2.000 2.000 -\n100 100 2.000 2.000 4.000 4.000 0.100000\n"), "{data}");
        assert!(data.contains("# portmap Go iptables\n0 10 10.000 10.000 20.000 20.000 -\n100 100 40.000 40.000 80.000 80.000 -\n"), "{data}");
        assert!(
            script.contains("set xtics (\"0\" 10, \"100\" 100)"),
            "{script}"
        );
        assert!(
            script.contains("index 1 using 2:5:5:6 with yerrorlines lt 3 title 'Go iptables'"),
            "{script}"
        );
        assert!(
            script.contains("index 0 using 2:7 with linespoints lt 1"),
            "{script}"
        );
        assert!(!script.contains("index 1 using 2:7"), "{script}");
        assert!(gnuplot(&Results::default()).is_none());
    }
}
