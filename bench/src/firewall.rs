//! `firewall` against Debian's Go `firewall` (its iptables backend), dual-stack prevResult,
//! cniVersion 1.0.0.
//!
//! - Lifecycle: ADD, CHECK and DEL of ours with the iptables and with the nftables backend,
//!   each against Go, interleaved.
//! - Scale: three series, each in a host namespace of its own: `ours iptables`, `ours nftables`
//!   and `Go iptables`, each installing its N others itself (one timed ADD per attachment,
//!   round-robin across the series). At every size of [`Options::scale_sizes`] (which adds
//!   500, the size of the ADD growth targets, to the default sizes; 5000, that of the
//!   iptables DEL's, is one of them), one more ADD and its DEL of
//!   each series, interleaved. The Go series stops above [`Options::reference_max_size`]:
//!   each Go ADD runs `iptables` several times over the whole `CNI-FORWARD` chain, so its
//!   install cost grows with N; the report then notes the install time extrapolated from the
//!   measured Go ADDs.
//! - Each series also has a host namespace that never gets others: at every size above 0, the
//!   series' ADD and DEL are timed there too, in alternation with the measured ones
//!   ([`ScalePoint::alongside`]). The growth targets divide by those, not by the point at 0
//!   others timed minutes earlier: on this VM the same ADD drifted by up to 40% over a run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use harness::bins::{plugin_binary, reference_binary};
use harness::netns::{StateDirs, TestNetns};
use host::netns::NetNs;
use serde_json::{Value, json};

use crate::{
    Alongside, Exec, GO_IPTABLES, Install, Lifecycle, OURS_IPTABLES, OURS_NFTABLES, Options,
    Results, Sample, Samples, ScalePoint, cutoff_note, time_exec,
};

/// Lifecycle case of our iptables backend.
pub const CASE_IPTABLES: &str = "ours iptables vs Go iptables";
/// Lifecycle case of our nftables backend.
pub const CASE_NFTABLES: &str = "ours nftables vs Go iptables";

/// A dual-stack prevResult on bridge `cni-bench0` for address number `n` (0 is the measured
/// attachment, 1.. the others).
fn prev_result(n: usize) -> Value {
    let (hi, lo) = (n / 250, n % 250 + 2);
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{ "name": "cni-bench0" }, { "name": "veth0", "sandbox": "/x" }],
        "ips": [
            { "address": format!("10.70.{hi}.{lo}/16"), "interface": 1 },
            { "address": format!("fd70::{hi}:{lo}/64"), "interface": 1 },
        ],
    })
}

/// The config of attachment `n`. The Go plugin takes an unknown backend for auto-detection,
/// i.e. iptables here.
fn config(backend: &str, n: usize) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "bench", "type": "firewall", "backend": backend,
        "prevResult": prev_result(n),
    })
}

/// Runs the suite.
///
/// # Errors
/// When a namespace cannot be made or any exec fails.
pub fn run(options: &Options) -> Result<Results> {
    let mut results = Results::default();
    for backend in ["iptables", "nftables"] {
        let host = TestNetns::new("bench-fw")?;
        let _state = StateDirs::of(&host)?;
        results
            .rows
            .extend(rows_in(&host, backend, options.iterations)?);
    }
    let ours = plugin_binary("firewall")?;
    let reference = reference_binary("firewall")?;
    results.extend(scale(options, &ours, &reference)?);
    Ok(results)
}

/// The lifecycle rows of our `backend` against Go, `iterations` each, with `host` as the
/// plugins' host namespace (whose state directories the caller keeps).
///
/// # Errors
/// When the container cannot be made or an exec fails.
pub fn rows_in(host: &TestNetns, backend: &str, iterations: usize) -> Result<Vec<crate::Row>> {
    let case = if backend == "nftables" {
        CASE_NFTABLES
    } else {
        CASE_IPTABLES
    };
    let ctr = TestNetns::new("bench-fwc")?;
    let lifecycle = Lifecycle {
        plugin: "firewall".to_owned(),
        case: case.to_owned(),
        ours: plugin_binary("firewall")?,
        reference: reference_binary("firewall")?,
        host: host.netns()?,
        netns: ctr.path().to_owned(),
        ifname: "eth0".to_owned(),
        args: String::new(),
        config: config(backend, 0),
        check: true,
    };
    lifecycle
        .run(iterations)
        .with_context(|| format!("firewall {backend} lifecycle"))
}

/// One scale series: an implementation in its own host namespace and its installs so far,
/// and a second host namespace where it never has others (for [`ScalePoint::alongside`]).
struct Series {
    name: &'static str,
    backend: &'static str,
    binary: PathBuf,
    reference: bool,
    ns: NetNs,
    empty: NetNs,
    install: Samples,
    _state: [StateDirs; 2],
    _hosts: [TestNetns; 2],
}

impl Series {
    fn new(
        name: &'static str,
        backend: &'static str,
        binary: &Path,
        reference: bool,
    ) -> Result<Series> {
        let host = TestNetns::new("bench-fws")?;
        let empty = TestNetns::new("bench-fws0")?;
        Ok(Series {
            name,
            backend,
            binary: binary.to_owned(),
            reference,
            ns: host.netns()?,
            empty: empty.netns()?,
            install: Samples::default(),
            _state: [StateDirs::of(&host)?, StateDirs::of(&empty)?],
            _hosts: [host, empty],
        })
    }

    fn exec(&self, command: &str, id: &str, netns: &Path, n: usize) -> Exec {
        Exec::plugin(
            &self.binary,
            command,
            id,
            netns,
            "eth0",
            &config(self.backend, n),
        )
    }
}

/// The address whose accepts [`time_kernel_commits`] appends: outside every series' range.
const PROBE_V4: &str = "10.71.255.254/32";
const PROBE_V6: &str = "fd71::ffff/128";

/// The median times the kernel takes to commit one attachment's four accepts (both families,
/// one nf_tables transaction, as our iptables ADD sends them) into `CNI-FORWARD` of `ns`, and
/// to commit their deletion by handle (as our iptables DEL sends it), timed from this process
/// so that no plugin start is in them (nor the handles' look-up, nor the wait for the kernel
/// to free what was deleted).
fn time_kernel_commits(ns: &NetNs, iterations: usize) -> Result<[Duration; 2]> {
    use netfilter::iptables::{Family, native};
    use netfilter::nft::{Batch, Nft, addr_bytes};
    let accepts = |family: Family, cidr: &str| -> Result<Vec<netfilter::nft::Rule>> {
        let forms = [
            vec![
                "-d",
                cidr,
                "-m",
                "conntrack",
                "--ctstate",
                "RELATED,ESTABLISHED",
            ],
            vec!["-s", cidr],
        ];
        forms
            .into_iter()
            .map(|mut args| {
                args.extend(["-j", "ACCEPT"]);
                let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
                native::encode_rule(family, &args).context("an accept the encoder knows")
            })
            .collect()
    };
    let tables = [
        (
            native::nft_table(Family::V4, "filter"),
            accepts(Family::V4, PROBE_V4)?,
            PROBE_V4,
        ),
        (
            native::nft_table(Family::V6, "filter"),
            accepts(Family::V6, PROBE_V6)?,
            PROBE_V6,
        ),
    ];
    let mut samples = Samples::default();
    let mut deletes = Samples::default();
    ns.run(|| -> Result<()> {
        let mut nft = Nft::new()?;
        for _ in 0..=iterations {
            let mut add = Batch::new();
            for (table, rules, _) in &tables {
                for rule in rules {
                    add.add_rule(table, "CNI-FORWARD", rule);
                }
            }
            let start = Instant::now();
            nft.apply(&add)?;
            samples.push(Sample {
                elapsed: start.elapsed(),
                max_rss_kib: None,
            });
            let mut del = Batch::new();
            for (table, _, cidr) in &tables {
                let addr: std::net::IpAddr = cidr.split('/').next().unwrap_or_default().parse()?;
                let needle = addr_bytes(addr);
                for rule in nft.rules_containing(table, "CNI-FORWARD", &[&needle])? {
                    del.delete_rule(table, "CNI-FORWARD", rule.handle);
                }
            }
            let start = Instant::now();
            nft.apply(&del)?;
            deletes.push(Sample {
                elapsed: start.elapsed(),
                max_rss_kib: None,
            });
            // So that the next append is timed alone.
            crate::wait_for_nf_tables_frees()?;
        }
        Ok(())
    })??;
    // The first round warmed up.
    samples.0.remove(0);
    deletes.0.remove(0);
    Ok([samples.median(), deletes.median()])
}

/// What [`time_kernel_commits`] measured at each size (`step` `"ADD"`: the append, `"DEL"`: the
/// deletion), beside the growth of our iptables ADD or DEL (`ours_growth`: at each size above
/// 0, its median less that of the same call timed alongside with no others, in ms), for the
/// report.
fn kernel_note(step: &str, kernel: &[(usize, Duration)], ours_growth: &[(usize, f64)]) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let figures: Vec<String> = kernel
        .iter()
        .map(|(size, d)| format!("{:.2} ms at {size}", ms(*d)))
        .collect();
    let at = |points: &[(usize, Duration)], n: usize| {
        points.iter().find(|(s, _)| *s == n).map(|(_, d)| ms(*d))
    };
    let compared: Vec<String> = kernel
        .iter()
        .filter(|(size, _)| *size > 0)
        .filter_map(|(size, _)| {
            Some(format!(
                "{:+.2} ms of {:+.2} ms at {size}",
                at(kernel, *size)? - at(kernel, 0)?,
                ours_growth.iter().find(|(s, _)| s == size)?.1
            ))
        })
        .collect();
    let compared = if compared.is_empty() {
        "not measured (no size above 0)".to_owned()
    } else {
        compared.join(", ")
    };
    let figures = figures.join(", ");
    if step == "ADD" {
        format!(
            "firewall: the kernel alone takes {figures} others to commit one attachment's four \
             accepts (both families, one nf_tables transaction, timed from the bench process: \
             no plugin start in it); of the growth of our iptables ADD's median over the ADD \
             timed alongside with no others, that is {compared}. \
             The kernel re-checks every chain reachable from a base chain and re-packs a \
             changed chain whole at each commit, so any writer of the reference's iptables \
             layout (our iptables backend, iptables-restore, the Go plugin) pays this growth on \
             each ADD; the nftables backend adds set elements and no rules, so it does not."
        )
    } else {
        format!(
            "firewall: the kernel alone takes {figures} others to commit the deletion of one \
             attachment's four accepts by handle (both families, one nf_tables transaction, \
             timed from the bench process); of the growth of our iptables DEL's median over the \
             DEL timed alongside with no others, that is {compared}. \
             The kernel finds each handle by walking the chain and re-packs a changed chain \
             whole at each commit, so any deletion from the reference's layout (ours, \
             iptables-restore, the Go plugin's iptables -D) pays this growth; our DEL itself \
             reads the table's handle only, not the chain."
        )
    }
}

/// The scale series; see the module docs.
fn scale(options: &Options, ours: &Path, reference: &Path) -> Result<Results> {
    let ctr = TestNetns::new("bench-fwsc")?;
    let netns = ctr.path();
    let mut series = vec![
        Series::new(OURS_IPTABLES, "iptables", ours, false)?,
        Series::new(OURS_NFTABLES, "nftables", ours, false)?,
        Series::new(GO_IPTABLES, "iptables", reference, true)?,
    ];
    let sizes = options.scale_sizes("firewall");
    let iterations = options.scale_iterations();
    let mut results = Results::default();
    let mut kernel_append: Vec<(usize, Duration)> = Vec::new();
    let mut kernel_delete: Vec<(usize, Duration)> = Vec::new();
    let mut installed = 0;
    for &size in &sizes {
        series.retain(|s| !s.reference || size <= options.reference_max_size);
        while installed < size {
            let id = format!("other-{installed}");
            for s in &mut series {
                let timed = time_exec(&s.ns, &s.exec("ADD", &id, netns, installed + 1))
                    .with_context(|| format!("installing {id} ({})", s.name))?;
                s.install.push(timed.sample());
            }
            installed += 1;
            if installed % 500 == 0 && installed < size {
                eprintln!("  firewall: {installed}/{size} others installed");
            }
        }
        let totals: Vec<String> = series
            .iter()
            .map(|s| format!("{} {:.1} s", s.name, s.install.total().as_secs_f64()))
            .collect();
        eprintln!(
            "  firewall: {size} others installed ({})",
            totals.join(", ")
        );

        let mut add = vec![Samples::default(); series.len()];
        let mut del = add.clone();
        let mut alongside = vec![Alongside::default(); series.len()];
        // Round 0 warms up; then each round starts with the next series. Above 0 others, each
        // series' ADD and DEL are also timed in its empty namespace, first or second in turn.
        for i in 0..=iterations {
            let id = format!("bench-scale-{i}");
            for k in 0..series.len() {
                let which = (i + k) % series.len();
                let s = &series[which];
                let cycle = |ns: &NetNs| -> Result<[Sample; 2]> {
                    let a = time_exec(ns, &s.exec("ADD", &id, netns, 0))
                        .with_context(|| format!("{} ADD with {size} others", s.name))?;
                    let d = time_exec(ns, &s.exec("DEL", &id, netns, 0))
                        .with_context(|| format!("{} DEL with {size} others", s.name))?;
                    Ok([a.sample(), d.sample()])
                };
                let empty_first = size > 0 && i % 2 == 1;
                let before = if empty_first {
                    Some(cycle(&s.empty)?)
                } else {
                    None
                };
                let [a, d] = cycle(&s.ns)?;
                let after = if size > 0 && !empty_first {
                    Some(cycle(&s.empty)?)
                } else {
                    None
                };
                if i > 0 {
                    add[which].push(a);
                    del[which].push(d);
                    if let Some([a, d]) = before.or(after) {
                        alongside[which].add.push(a);
                        alongside[which].del.push(d);
                    }
                }
            }
        }
        let [append, delete] = time_kernel_commits(&series[0].ns, iterations)?;
        kernel_append.push((size, append));
        kernel_delete.push((size, delete));
        for (((s, add), del), alongside) in series.iter().zip(add).zip(del).zip(alongside) {
            results.scale.push(ScalePoint {
                suite: "firewall".to_owned(),
                series: s.name.to_owned(),
                reference: s.reference,
                others: size,
                add,
                del,
                install: Install {
                    by: if s.reference {
                        "Go firewall".to_owned()
                    } else {
                        s.name.to_owned()
                    },
                    own: true,
                    samples: s.install.clone(),
                },
                alongside: (size > 0).then_some(alongside),
            });
        }
    }
    let ours_growth = |del: bool| -> Vec<(usize, f64)> {
        results
            .scale
            .iter()
            .filter(|p| p.series == OURS_IPTABLES)
            .filter_map(|p| {
                let alongside = p.alongside.as_ref()?;
                let (grown, base) = if del {
                    (&p.del, &alongside.del)
                } else {
                    (&p.add, &alongside.add)
                };
                Some((
                    p.others,
                    (grown.median().as_secs_f64() - base.median().as_secs_f64()) * 1e3,
                ))
            })
            .collect()
    };
    let notes = [
        kernel_note("ADD", &kernel_append, &ours_growth(false)),
        kernel_note("DEL", &kernel_delete, &ours_growth(true)),
    ];
    results.notes.extend(notes);
    let go_installs = results
        .scale
        .iter()
        .filter(|p| p.reference)
        .max_by_key(|p| p.others)
        .map(|p| p.install.samples.clone())
        .unwrap_or_default();
    results.notes.extend(cutoff_note(
        "firewall",
        &format!("{GO_IPTABLES} figures"),
        "the Go firewall installs its others itself, one ADD each, which runs iptables \
         several times over the whole growing CNI-FORWARD chain",
        &sizes,
        options.reference_max_size,
        &go_installs,
    ));
    Ok(results)
}
