//! Memory in proportion to the input (issue 21): with 16 MB of stdin of each shape of the bench's
//! memory suite (a big unknown array, deep nesting, a prevResult full of routes), every plugin's
//! ADD has at most twice the peak resident memory of the Go binary's ADD of the same input.
//!
//! Peak RSS is `wait4`'s `ru_maxrss`, which never reads below the peak RSS of the process that
//! spawned the plugin: this test process, which therefore writes the input to a file as it makes
//! it, never holding it whole, and sends the plugins' output to files. Memory is deterministic
//! enough to test; time is the bench's (`bench --only memory`).

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::fmt::Write as _;
use std::fs::File;
use std::io::{Read as _, Seek as _};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bench::memory::{Fixture, PLUGINS, Shape, write_stdin};
use bench::spawner::command;
use harness::bins::{plugin_binary, reference_binary};
use harness::process;
use host::netns::NetNs;
use serde_json::Value;

/// The stdin size the bound is asserted at.
const SIZE: usize = 16 << 20;
/// Ours / Go of the peak RSS, at most.
const LIMIT: f64 = 2.0;
/// One exec's deadline: Go takes about a second at this size, a debug build of ours longer.
const DEADLINE: Duration = Duration::from_secs(120);

/// Runs `binary` for `verb` in `host` with `stdin` and returns its peak RSS in KiB; fails
/// unless it exits 0.
fn peak_rss_kib(
    fx: &Fixture,
    host: &NetNs,
    binary: &Path,
    verb: &str,
    config: &Value,
    stdin: File,
) -> Result<u64> {
    let exec = fx.exec(binary, verb, config);
    let mut cmd = command(&exec.binary, &exec.args, &exec.env);
    let mut out = tempfile::tempfile()?;
    cmd.stdin(stdin)
        .stdout(out.try_clone()?)
        .stderr(out.try_clone()?);
    let mut child = process::spawn_in(host, &mut cmd)?;
    let reaped = process::reap(&mut child, Some(Instant::now() + DEADLINE))?;
    if !reaped.status.success() {
        let mut text = String::new();
        out.rewind()?;
        out.take(4096).read_to_string(&mut text)?;
        anyhow::bail!(
            "{} {verb} failed ({}): {text}",
            binary.display(),
            reaped.status
        );
    }
    Ok(reaped.max_rss_kib)
}

/// ADD of `binary` with `path` as stdin, then DEL with the plain config; the ADD's peak RSS.
fn add_then_del(
    fx: &Fixture,
    host: &NetNs,
    plugin: &str,
    binary: &Path,
    config: &Value,
    path: &Path,
) -> Result<u64> {
    let rss = peak_rss_kib(fx, host, binary, "ADD", config, File::open(path)?);
    let mut plain = tempfile::tempfile()?;
    serde_json::to_writer(&mut plain, config)?;
    plain.rewind()?;
    let del = peak_rss_kib(fx, host, binary, "DEL", config, plain);
    fx.settle(plugin);
    let rss = rss?;
    del?;
    Ok(rss)
}

#[test]
fn sixteen_megabytes_of_stdin_cost_every_plugin_at_most_twice_go_s_peak_memory() -> Result<()> {
    let fx = Fixture::new()?;
    let host = fx.host()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("stdin.json");
    let mut report = String::new();
    let mut over = Vec::new();
    for plugin in PLUGINS {
        let config = fx.config(plugin)?;
        let ours = plugin_binary(plugin)?;
        let go = reference_binary(plugin)?;
        for shape in Shape::ALL {
            write_stdin(&config, shape, SIZE, File::create(&path)?)?;
            let size = std::fs::metadata(&path)?.len();
            ensure!(size + (64 << 10) > SIZE as u64, "{path:?}: {size} bytes");
            let ours_kib = add_then_del(&fx, &host, plugin, &ours, &config, &path)
                .with_context(|| format!("ours, {}", shape.name()))?;
            let go_kib = add_then_del(&fx, &host, plugin, &go, &config, &path)
                .with_context(|| format!("Go, {}", shape.name()))?;
            #[allow(clippy::cast_precision_loss)]
            let ratio = ours_kib as f64 / go_kib as f64;
            let line = format!(
                "{plugin} ADD, {}, 16 MB: ours {} KiB, Go {} KiB ({ratio:.2}×)",
                shape.name(),
                ours_kib,
                go_kib
            );
            let _ = writeln!(report, "{line}");
            if ratio > LIMIT {
                over.push(line);
            }
        }
    }
    eprintln!("{report}");
    assert!(
        over.is_empty(),
        "peak RSS above {LIMIT}× Go's:\n{}\n\nall:\n{report}",
        over.join("\n")
    );
    Ok(())
}
