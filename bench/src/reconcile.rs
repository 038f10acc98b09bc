//! `portmap reconcile` and `firewall reconcile` (issue 27), each layout in a host namespace of
//! its own with N attachments installed by our ADDs (N of [`sizes`]: 1, 100 and 1000 in the
//! default run; the attachments share one live container namespace):
//!
//! - **after a flush**: `nft flush ruleset` (which takes the iptables-nft tables too), then
//!   one reconcile putting every attachment back, timed. Reference: the tools restoring what
//!   a save of our objects made before the flush holds (`nft -f` of `nft list table`, or
//!   `iptables-restore` of `iptables-save -t <table>`), timed alike after the same flush: what
//!   an operator's own restore of a saved ruleset costs.
//! - **nothing missing**: a reconcile with everything in place, which reads and writes
//!   nothing else. Reference: the tools' read of the same objects (`nft list table`,
//!   `iptables-save -t <table>`).
//!
//! Each step alternates ours and the reference within an iteration; the kernel's frees of
//! a flush are waited out before anything is timed ([`crate::wait_for_nf_tables_frees`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use harness::bins::plugin_binary;
use harness::netns::{StateDirs, TestNetns};
use host::netns::NetNs;
use serde_json::{Value, json};

use crate::{Exec, Options, Results, Row, Samples, time_exec};

/// The suite's name, as `--only` selects it.
pub const SUITE: &str = "reconcile";
/// The step of a reconcile after a flush.
pub const AFTER_FLUSH: &str = "after flush";
/// The step of a reconcile with nothing missing.
pub const NOTHING_MISSING: &str = "nothing missing";
/// The sizes the suite runs, when the run's largest size reaches them (1 always).
pub const SIZES: [usize; 3] = [1, 100, 1000];
/// Timed repetitions per size at most: a restore of 1000 attachments takes a fair part of a
/// second with the tools.
pub const ITERATIONS: usize = 10;

/// The cases at 1000 attachments, which the targets name.
pub const CASE_PORTMAP_NFTABLES_1000: &str = "portmap nftables, 1000 attachments";
/// See [`CASE_PORTMAP_NFTABLES_1000`].
pub const CASE_PORTMAP_IPTABLES_1000: &str = "portmap iptables, 1000 attachments";
/// See [`CASE_PORTMAP_NFTABLES_1000`].
pub const CASE_FIREWALL_NFTABLES_1000: &str = "firewall nftables, 1000 attachments";
/// See [`CASE_PORTMAP_NFTABLES_1000`].
pub const CASE_FIREWALL_IPTABLES_1000: &str = "firewall iptables, 1000 attachments";

/// The sizes of this run: those of [`SIZES`] that the largest of `--sizes` reaches, and 1.
#[must_use]
pub fn sizes(options: &Options) -> Vec<usize> {
    let largest = options.sizes.iter().copied().max().unwrap_or(0);
    SIZES
        .into_iter()
        .filter(|&s| s == 1 || s <= largest)
        .collect()
}

/// One layout of one plugin.
#[derive(Debug, Clone, Copy)]
struct Layout {
    plugin: &'static str,
    backend: &'static str,
}

impl Layout {
    /// The row's case at `n` attachments.
    fn case(self, n: usize) -> String {
        format!("{} {}, {n} attachments", self.plugin, self.backend)
    }

    /// The config of attachment `i`.
    fn config(self, i: usize, netns: &Path) -> Value {
        let (hi, lo) = (i / 250, i % 250 + 2);
        let prev = json!({
            "cniVersion": "1.0.0",
            "interfaces": [{ "name": "eth0", "sandbox": netns }],
            "ips": [{ "address": format!("10.95.{hi}.{lo}/16"), "interface": 0 }],
        });
        let mut conf = json!({
            "cniVersion": "1.0.0", "name": "benchrc", "type": self.plugin,
            "backend": self.backend, "prevResult": prev,
        });
        if self.plugin == "portmap" {
            let port = 10_000 + i;
            conf["runtimeConfig"] = json!({"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]});
        }
        conf
    }

    /// The tool saving what the layout made, and the one restoring that save.
    fn save_and_restore(self) -> (Exec, &'static str, Vec<&'static str>) {
        match (self.plugin, self.backend) {
            ("portmap", "nftables") => (
                Exec::tool("nft", &["list", "table", "ip", "cni_portmap"], Vec::new()),
                "nft",
                vec!["-f", "-"],
            ),
            ("firewall", "nftables") => (
                Exec::tool(
                    "nft",
                    &["list", "table", "inet", "cni_firewall"],
                    Vec::new(),
                ),
                "nft",
                vec!["-f", "-"],
            ),
            ("portmap", _) => (
                Exec::tool("iptables-save", &["-t", "nat"], Vec::new()),
                "iptables-restore",
                vec!["--noflush"],
            ),
            _ => (
                Exec::tool("iptables-save", &["-t", "filter"], Vec::new()),
                "iptables-restore",
                vec!["--noflush"],
            ),
        }
    }
}

/// The layouts the suite times.
const LAYOUTS: [Layout; 4] = [
    Layout {
        plugin: "portmap",
        backend: "nftables",
    },
    Layout {
        plugin: "portmap",
        backend: "iptables",
    },
    Layout {
        plugin: "firewall",
        backend: "nftables",
    },
    Layout {
        plugin: "firewall",
        backend: "iptables",
    },
];

/// Runs the suite.
///
/// # Errors
/// When a namespace cannot be made or an exec fails.
pub fn run(options: &Options) -> Result<Results> {
    let mut results = Results::default();
    let iterations = options.iterations.clamp(1, ITERATIONS);
    for layout in LAYOUTS {
        results
            .rows
            .extend(layout_rows(layout, &sizes(options), iterations)?);
    }
    Ok(results)
}

/// The rows of one layout at each of `sizes`, installing the attachments as it grows.
fn layout_rows(layout: Layout, sizes: &[usize], iterations: usize) -> Result<Vec<Row>> {
    let host = TestNetns::new("bench-rch")?;
    let _state = StateDirs::of(&host)?;
    let container = TestNetns::new("bench-rcc")?;
    let ns = host.netns()?;
    let netns = container.path().to_path_buf();
    let binary: PathBuf = plugin_binary(layout.plugin)?;
    let reconcile = Exec {
        binary: binary.clone(),
        args: vec!["reconcile".to_owned()],
        env: Vec::new(),
        stdin: Vec::new(),
        stdin_file: None,
        output_limit: None,
    };
    let (save, restorer, restore_args) = layout.save_and_restore();
    let flush = Exec::tool("nft", &["flush", "ruleset"], Vec::new());
    let mut rows = Vec::new();
    let mut installed = 0;
    for &n in sizes {
        while installed < n {
            let id = format!("rc{installed}");
            let add = Exec::plugin(
                &binary,
                "ADD",
                &id,
                &netns,
                "eth0",
                &layout.config(installed, &netns),
            );
            time_exec(&ns, &add).with_context(|| format!("{} ADD {id}", layout.plugin))?;
            installed += 1;
        }
        let saved = time_exec(&ns, &save)?.stdout;
        let restore = Exec::tool(restorer, &restore_args, saved);
        let (mut after, mut after_ref) = (Samples::default(), Samples::default());
        let (mut quiet, mut quiet_ref) = (Samples::default(), Samples::default());
        for _ in 0..iterations {
            flushed(&ns, &flush)?;
            after_ref.push(time_exec(&ns, &restore)?.sample());
            flushed(&ns, &flush)?;
            let timed = time_exec(&ns, &reconcile)?;
            let stdout = String::from_utf8_lossy(&timed.stdout);
            anyhow::ensure!(
                stdout.contains(&format!("{n} attachment(s) restored")),
                "{} reconcile after a flush of {n}: {stdout}",
                layout.plugin
            );
            after.push(timed.sample());
            quiet_ref.push(time_exec(&ns, &save)?.sample());
            let timed = time_exec(&ns, &reconcile)?;
            let stdout = String::from_utf8_lossy(&timed.stdout);
            anyhow::ensure!(
                stdout.contains("nothing missing"),
                "{} reconcile with nothing missing: {stdout}",
                layout.plugin
            );
            quiet.push(timed.sample());
        }
        let row = |step: &str, ours: Samples, reference: Samples, label: String| Row {
            suite: SUITE.to_owned(),
            case: layout.case(n),
            step: step.to_owned(),
            ours,
            reference,
            reference_label: label,
        };
        let tool = |exec: &Exec| format!("{} {}", exec.binary.display(), exec.args.join(" "));
        rows.push(row(
            AFTER_FLUSH,
            after,
            after_ref,
            format!("{} of the saved table", tool(&restore)),
        ));
        rows.push(row(NOTHING_MISSING, quiet, quiet_ref, tool(&save)));
    }
    Ok(rows)
}

/// Flushes the ruleset of `ns` and waits out the kernel's frees of it, so that no timed exec
/// pays them at its socket's close.
fn flushed(ns: &NetNs, flush: &Exec) -> Result<()> {
    time_exec(ns, flush)?;
    ns.run(crate::wait_for_nf_tables_frees)
        .context("entering the host namespace")?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sizes_follow_the_largest_requested_and_always_include_one() {
        let mut options = Options::default();
        assert_eq!(sizes(&options), [1, 100, 1000]);
        options.sizes = vec![0, 1];
        assert_eq!(sizes(&options), [1]);
        options.sizes = vec![0, 500];
        assert_eq!(sizes(&options), [1, 100]);
        assert_eq!(
            LAYOUTS.map(|l| l.case(1000)),
            [
                CASE_PORTMAP_NFTABLES_1000,
                CASE_PORTMAP_IPTABLES_1000,
                CASE_FIREWALL_NFTABLES_1000,
                CASE_FIREWALL_IPTABLES_1000
            ]
        );
    }
}
