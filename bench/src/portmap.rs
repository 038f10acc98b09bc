//! `portmap` against Debian's Go `portmap` (its default iptables backend), cniVersion 1.0.0,
//! two mappings per container (tcp 8080→80, udp 5353→53), run from a throwaway host namespace
//! with a veth to the container namespace (so the `route_localnet` lookup finds a route).
//!
//! - Lifecycle: ADD and DEL of ours with the nftables backend and with the iptables backend,
//!   each against Go. CHECK is timed on its own, repeated on one attachment: Go 1.1.1's CHECK
//!   of an IPv4 container fails at its IPv6 step after checking everything IPv4 (a Go bug, see
//!   `portmap/README.md`), so its time is that of the whole IPv4 check plus the failing lookup.
//! - Scale: with N other containers' mappings installed, one more ADD and DEL of three series,
//!   interleaved: `ours nftables`, `ours iptables` and `Go iptables`, for each size of
//!   [`Options::scale_sizes`] (which adds 1000, the size of the growth targets, when the
//!   largest requested size reaches it), with at most [`crate::SCALE_ITERATIONS`] iterations
//!   per size. All three share one host namespace, where every other container is installed
//!   twice: by our binary with the nftables backend and with the iptables backend, whose
//!   layout is the reference's. So Go's ADD and DEL run over N containers in its own layout,
//!   but Go installs none of them: its "install" figure is our iptables backend's, and the
//!   report labels it so. (Go's own installs would cost as much as its ADD at every size.)
//!   `Go iptables` stops at [`Options::reference_max_size`]: each of its ADDs and DELs execs
//!   the tools, which read the whole nat table; larger sizes have both of ours only.
//! - The kernel alone, at each size: the commit of one attachment's chain, rules and entry
//!   rules, and of their removal by handle, as our iptables backend sends them, timed from
//!   this process (no plugin start in it), and the close of the socket after the removal
//!   (which waits for the kernel to free what it deleted): what any writer of the layout
//!   pays, against which our iptables series' growth is read.
//! - A second host and container namespace pair never gets others: at every size above 0,
//!   each series' ADD and DEL are timed there too, in alternation with the measured ones
//!   ([`crate::ScalePoint::alongside`]), and the growth targets divide by those.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use harness::bins::{plugin_binary, reference_binary};
use harness::netns::{StateDirs, TestNetns, veth_pair};
use host::netns::NetNs;
use serde_json::{Value, json};

use crate::{
    Alongside, Exec, GO_IPTABLES, Install, Lifecycle, OURS_IPTABLES, OURS_NFTABLES, Options,
    Results, Row, Sample, Samples, ScalePoint, cutoff_note, run_exec, time_exec,
};

const NETWORK: &str = "bench";

/// Lifecycle case of our nftables backend.
pub const CASE_NFTABLES: &str = "2 mappings, ours nftables";
/// Lifecycle case of our iptables backend.
pub const CASE_IPTABLES: &str = "2 mappings, ours iptables";
/// Our nftables maps' elements in the cases of the listing paths (issue 22 #3).
pub const BIG_MAP: u16 = 16_000;
/// The case of a DEL without a state file among [`BIG_MAP`] elements of another owner.
pub const CASE_DEL_WITHOUT_STATE: &str = "DEL without state, 16000 elements of another owner";
/// The case of a GC of [`BIG_MAP`] stale elements.
pub const CASE_GC: &str = "GC of 16000 stale elements";
/// Timed repetitions of the big-map cases at most: each re-adds the whole map.
const BIG_MAP_ITERATIONS: usize = 10;

/// The plugin config for a container at `ip` with host ports `tcp`/`udp`.
fn config(netns: &Path, backend: Option<&str>, ip: &str, tcp: u16, udp: u16) -> Value {
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "portmap",
        "runtimeConfig": {"portMappings": [
            {"hostPort": tcp, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": udp, "containerPort": 53, "protocol": "udp"},
        ]},
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": netns}],
            "ips": [{"interface": 0, "address": format!("{ip}/16")}],
        },
    });
    if let Some(b) = backend {
        conf["backend"] = json!(b);
    }
    conf
}

fn exec(binary: &Path, command: &str, id: &str, netns: &Path, conf: &Value) -> Exec {
    Exec::plugin(binary, command, id, netns, "eth0", conf)
}

/// Like [`time_exec`], but a failure whose stdout contains `tolerated` counts as done.
fn time_exec_tolerating(ns: &NetNs, exec: &Exec, tolerated: &str) -> Result<Sample> {
    let timed = run_exec(ns, exec)?;
    let stdout = String::from_utf8_lossy(&timed.stdout);
    if !timed.status.success() && !stdout.contains(tolerated) {
        bail!("{} failed: {stdout}", exec.binary.display());
    }
    Ok(timed.sample())
}

/// The container address of the `i`th other container (10.94.1.0 onwards).
fn other_ip(i: usize) -> String {
    let n = 256 + i;
    format!("10.94.{}.{}", n / 256, n % 256)
}

/// Host ports of the `i`th other container, clear of 8080 and 5353.
fn other_ports(i: usize) -> Result<(u16, u16)> {
    let tcp = u16::try_from(10_000 + 2 * i).context("too many other containers")?;
    Ok((tcp, tcp + 1))
}

/// A host namespace (with the state directories the plugin makes there) and a container
/// namespace, joined by a veth: `veth-pm0` 10.94.0.1/16 on the host, `eth0` 10.94.0.2/16 inside.
fn host_and_container(suffix: &str) -> Result<(TestNetns, StateDirs, TestNetns)> {
    let host = TestNetns::new(&format!("benchpm-h{suffix}"))?;
    let state = StateDirs::of(&host)?;
    let container = TestNetns::new(&format!("benchpm-c{suffix}"))?;
    veth_pair(
        &host,
        "veth-pm0",
        &["10.94.0.1/16"],
        &container,
        "eth0",
        &["10.94.0.2/16"],
    )?;
    Ok((host, state, container))
}

/// Runs the suite.
///
/// # Errors
/// When a namespace cannot be made or a plugin exec fails.
pub fn run(options: &Options) -> Result<Results> {
    let (host, _state, container) = host_and_container("")?;
    let netns = container.path().to_path_buf();
    let ours = plugin_binary("portmap")?;
    let go = reference_binary("portmap")?;
    let hostns = host.netns()?;
    let mut results = Results::default();
    results.rows.extend(rows_in(
        &hostns,
        &netns,
        "10.94.0.2",
        options.iterations,
        &mut || Ok(()),
    )?);
    results
        .rows
        .extend(big_map_rows(options, &ours).context("portmap big-map cases")?);
    // Where each size's ADD and DEL are also timed with no others (ScalePoint::alongside).
    let (empty_host, _empty_state, empty_container) = host_and_container("0")?;
    let empty = (empty_host.netns()?, empty_container.path());
    results.extend(scale(
        options,
        (&hostns, &netns),
        (&empty.0, empty.1),
        &ours,
        &go,
    )?);
    Ok(results)
}

/// One untimed ADD and DEL of ours with the iptables backend for the container at `netns`
/// with address `ip`: the layout's shared chains stay, as on any node where portmap ran.
///
/// # Errors
/// When an exec fails.
pub fn make_shared_chains(host: &NetNs, netns: &Path, ip: &str) -> Result<()> {
    let ours = plugin_binary("portmap")?;
    let conf = config(netns, Some("iptables"), ip, 8080, 5353);
    for command in ["ADD", "DEL"] {
        time_exec(host, &exec(&ours, command, "bench-shared", netns, &conf))
            .with_context(|| format!("portmap {command} making the shared chains"))?;
    }
    Ok(())
}

/// The lifecycle rows (ADD and DEL of each backend against Go, then CHECK apart) of the
/// container at `netns` with address `ip`, `iterations` each, with `host` as the plugins' host
/// namespace (whose state directories the caller keeps). `iptables_between` runs after each
/// iteration of the iptables backend's lifecycle ([`Lifecycle::run_with`]).
///
/// # Errors
/// When an exec fails.
pub fn rows_in(
    host: &NetNs,
    netns: &Path,
    ip: &str,
    iterations: usize,
    iptables_between: &mut dyn FnMut() -> Result<()>,
) -> Result<Vec<Row>> {
    let ours = plugin_binary("portmap")?;
    let go = reference_binary("portmap")?;
    let mut rows = Vec::new();
    for (backend, case) in [("nftables", CASE_NFTABLES), ("iptables", CASE_IPTABLES)] {
        let conf = config(netns, Some(backend), ip, 8080, 5353);
        let lifecycle = Lifecycle {
            plugin: "portmap".into(),
            case: case.into(),
            ours: ours.clone(),
            reference: go.clone(),
            host: NetNs::open(host.path())?,
            netns: netns.to_path_buf(),
            ifname: "eth0".into(),
            args: String::new(),
            config: conf.clone(),
            check: false,
        };
        let between: &mut dyn FnMut() -> Result<()> = if backend == "iptables" {
            &mut *iptables_between
        } else {
            &mut || Ok(())
        };
        rows.extend(
            lifecycle
                .run_with(iterations, between)
                .with_context(|| format!("portmap {backend} lifecycle"))?,
        );
        rows.push(check_row(
            host,
            netns,
            [&ours, &go],
            &conf,
            iterations,
            case.to_owned(),
        )?);
    }
    Ok(rows)
}

/// The scale series; see the module docs.
/// `grown` is the host namespace where the others go and the container's path; `empty` the
/// same pair that never gets others.
fn scale(
    options: &Options,
    (host, netns): (&NetNs, &Path),
    empty: (&NetNs, &Path),
    ours: &Path,
    go: &Path,
) -> Result<Results> {
    // (series, binary, backend in the config: Go ignores the key).
    let series = [
        (OURS_NFTABLES, ours, "nftables"),
        (OURS_IPTABLES, ours, "iptables"),
        (GO_IPTABLES, go, "iptables"),
    ];
    let mut installs = [Samples::default(), Samples::default()];
    let mut results = Results {
        notes: vec![format!(
            "portmap: Go's others are written by our iptables backend, whose layout is the \
             reference's, so Go's ADD and DEL run over its own layout, but its install figures \
             are those of {OURS_IPTABLES}, not Go's."
        )],
        ..Results::default()
    };
    let sizes = options.scale_sizes("portmap");
    let mut installed = 0;
    let mut kernel: Vec<(usize, Kernel)> = Vec::new();
    for &size in &sizes {
        // Go's series stops at the reference's largest size.
        let go = size <= options.reference_max_size;
        let active = if go { series.len() } else { 2 };
        while installed < size {
            let (tcp, udp) = other_ports(installed)?;
            let ip = other_ip(installed);
            let id = format!("other-{installed}");
            for (install, backend) in installs.iter_mut().zip(["nftables", "iptables"]) {
                let conf = config(netns, Some(backend), &ip, tcp, udp);
                let timed = time_exec(host, &exec(ours, "ADD", &id, netns, &conf))
                    .with_context(|| format!("installing {id} ({backend})"))?;
                install.push(timed.sample());
            }
            installed += 1;
            if installed % 500 == 0 && installed < size {
                eprintln!("  portmap: {installed}/{size} others installed");
            }
        }
        eprintln!(
            "  portmap: {size} others installed (ours nftables {:.1} s, ours iptables {:.1} s)",
            installs[0].total().as_secs_f64(),
            installs[1].total().as_secs_f64()
        );
        kernel.push((size, time_kernel(host, options.scale_iterations())?));

        let mut add = [Samples::default(), Samples::default(), Samples::default()];
        let mut del = add.clone();
        let mut alongside = [
            Alongside::default(),
            Alongside::default(),
            Alongside::default(),
        ];
        // Round 0 warms up; then each round starts with the next series. Above 0 others, each
        // series' ADD and DEL are also timed in the empty namespace, first or second in turn.
        for i in 0..=options.scale_iterations() {
            let id = format!("bench-scale-{i}");
            for k in 0..active {
                let which = (i + k) % active;
                let (name, binary, backend) = series[which];
                let cycle = |(host, netns): (&NetNs, &Path)| -> Result<[Sample; 2]> {
                    let conf = config(netns, Some(backend), "10.94.0.2", 8080, 5353);
                    let a = time_exec(host, &exec(binary, "ADD", &id, netns, &conf))
                        .with_context(|| format!("{name} ADD with {size} others"))?;
                    let d = time_exec(host, &exec(binary, "DEL", &id, netns, &conf))
                        .with_context(|| format!("{name} DEL with {size} others"))?;
                    Ok([a.sample(), d.sample()])
                };
                let empty_first = size > 0 && i % 2 == 1;
                let before = if empty_first {
                    Some(cycle(empty)?)
                } else {
                    None
                };
                let [a, d] = cycle((host, netns))?;
                let after = if size > 0 && !empty_first {
                    Some(cycle(empty)?)
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
        for ((((name, _, _), add), del), alongside) in
            series.iter().zip(add).zip(del).zip(alongside).take(active)
        {
            let reference = *name == GO_IPTABLES;
            let (by, samples) = match *name {
                OURS_NFTABLES => (OURS_NFTABLES.to_owned(), installs[0].clone()),
                OURS_IPTABLES => (OURS_IPTABLES.to_owned(), installs[1].clone()),
                _ => (
                    format!("{OURS_IPTABLES} (Go's layout)"),
                    installs[1].clone(),
                ),
            };
            results.scale.push(ScalePoint {
                suite: "portmap".to_owned(),
                series: (*name).to_owned(),
                reference,
                others: size,
                add,
                del,
                install: Install {
                    by,
                    own: !reference,
                    samples,
                },
                alongside: (size > 0).then_some(alongside),
            });
        }
    }
    results.notes.extend(cutoff_note(
        "portmap",
        &format!("{GO_IPTABLES} figures"),
        "each of its ADDs and DELs execs the iptables tools, which read the whole nat table",
        &sizes,
        options.reference_max_size,
        &installs[1],
    ));
    results.notes.push(kernel_note(&kernel, &results.scale));
    Ok(results)
}

/// CHECK of one attachment each, repeated `iterations` times, ours and Go alternating.
fn check_row(
    host: &NetNs,
    netns: &Path,
    [ours, go]: [&PathBuf; 2],
    conf: &Value,
    iterations: usize,
    case: String,
) -> Result<Row> {
    // Both attachments stay installed while they are checked, so Go's maps other host ports:
    // our ADD and CHECK rightly refuse a host port another container's chain maps.
    let mut go_conf = conf.clone();
    go_conf["runtimeConfig"]["portMappings"][0]["hostPort"] = json!(8081);
    go_conf["runtimeConfig"]["portMappings"][1]["hostPort"] = json!(5354);
    let attachments = [
        (ours, "bench-check-ours", conf),
        (go, "bench-check-go", &go_conf),
    ];
    let mut checks = Vec::new();
    for (binary, id, conf) in attachments {
        let added = time_exec(host, &exec(binary, "ADD", id, netns, conf))?;
        let mut check = conf.clone();
        check["prevResult"] =
            serde_json::from_slice(&added.stdout).context("ADD printed no JSON result")?;
        checks.push(exec(binary, "CHECK", id, netns, &check));
    }
    let (mut ours_t, mut go_t) = (Samples::default(), Samples::default());
    for i in 0..=iterations {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let sample = if which == 0 {
                time_exec(host, &checks[0])?.sample()
            } else {
                time_exec_tolerating(host, &checks[1], "could not check ipv6 dnat: chain CNI-DN-")?
            };
            // The first round warms up.
            if i > 0 {
                if which == 0 { &mut ours_t } else { &mut go_t }.push(sample);
            }
        }
    }
    for (binary, id, conf) in attachments {
        time_exec(host, &exec(binary, "DEL", id, netns, conf))?;
    }
    Ok(Row {
        suite: "portmap".into(),
        case,
        step: "CHECK".into(),
        ours: ours_t,
        reference: go_t,
        reference_label: "Go portmap".into(),
    })
}

/// What the kernel alone takes for one attachment of the iptables layout (median): the
/// commit adding its chain, rules and entry rules, the commit removing them by handle, and the
/// close of the socket after that removal.
#[derive(Debug, Clone, Copy)]
struct Kernel {
    add: Duration,
    del: Duration,
    close: Duration,
}

/// The attachment [`time_kernel`] adds and removes: outside the others' and the series'.
const PROBE: usize = 0xfe_ed;

/// Times, in the namespace `ns` (the shared chains present), what the kernel takes to commit
/// one IPv4 attachment's chain, rules and entry rules as our iptables backend sends them, to
/// commit their removal by recorded handle, and to close the socket after it, `iterations`
/// times after a warm-up; medians.
fn time_kernel(ns: &NetNs, iterations: usize) -> Result<Kernel> {
    let [add, del, close] = kernel_samples(ns, iterations, true)?;
    Ok(Kernel {
        add: add.median(),
        del: del.median(),
        close: close.median(),
    })
}

/// The samples of [`time_kernel`]: the commits adding the attachment, those removing it, and
/// the closes after the removals; after an untimed round when `warm_up` (without, the first
/// commit finds the caches as whatever ran before left them, as a plugin's does).
///
/// # Errors
/// When a commit fails.
pub fn kernel_samples(ns: &NetNs, iterations: usize, warm_up: bool) -> Result<[Samples; 3]> {
    use netfilter::iptables::Family;
    use netfilter::iptables::native::NativeTables;
    let (mut add, mut del, mut close) =
        (Samples::default(), Samples::default(), Samples::default());
    let dnat = harness::iptables_layout::DNAT;
    ns.run(|| -> Result<()> {
        for i in usize::from(!warm_up)..=iterations {
            let mut tables = NativeTables::open("nat")?;
            let mut tx = tables.transaction();
            let (chain, specs) = crate::iptables_native::attachment(Family::V4, PROBE);
            tables.ensure(&mut tx, Family::V4, &[&chain], &specs)?;
            let start = Instant::now();
            let recorded = tables.commit(&tx)?;
            let added = start.elapsed();
            let mut tx = tables.transaction();
            let record = recorded.iter().find(|r| r.family == Family::V4);
            for rule in tables.jumps_to(Family::V4, dnat, &chain, record)? {
                tx.delete_rule(Family::V4, dnat, rule.handle);
            }
            tx.delete_chain(Family::V4, &chain);
            let start = Instant::now();
            tables.commit(&tx)?;
            let deleted = start.elapsed();
            let start = Instant::now();
            drop(tables);
            let closed = start.elapsed();
            if i > 0 {
                add.push_time(added);
                del.push_time(deleted);
                close.push_time(closed);
            }
        }
        Ok(())
    })??;
    Ok([add, del, close])
}

/// The report's note on what the kernel alone takes at each size ([`time_kernel`]), beside
/// the growth of our iptables series' ADD over the ADD timed alongside with no others.
fn kernel_note(kernel: &[(usize, Kernel)], scale: &[ScalePoint]) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let figures: Vec<String> = kernel
        .iter()
        .map(|(size, k)| {
            format!(
                "{size}: add {:.2}, remove {:.2}, close after it {:.2}",
                ms(k.add),
                ms(k.del),
                ms(k.close)
            )
        })
        .collect();
    let growth: Vec<String> = scale
        .iter()
        .filter(|p| p.series == OURS_IPTABLES)
        .filter_map(|p| {
            let along = p.alongside.as_ref()?;
            Some(format!(
                "{}: ADD {:+.2}, DEL {:+.2}",
                p.others,
                ms(p.add.median()) - ms(along.add.median()),
                ms(p.del.median()) - ms(along.del.median())
            ))
        })
        .collect();
    format!(
        "portmap: what the kernel alone takes for one attachment of the iptables layout (chain, \
         6 rules, 2 entry rules; IPv4), timed from the bench process, in ms at N others: {}. \
         A commit that adds a jump or an xtables target makes the kernel re-validate the whole \
         nat table's jump graph, so every writer of the layout (our native path, \
         iptables-restore, the Go plugin's execs) pays this growth; the close after a removal \
         waits for the kernel to free what it deleted (an RCU grace period), as every exec of \
         iptables-nft that deletes does. Our iptables series' growth over the calls timed \
         alongside with no others, in ms: {}.",
        figures.join("; "),
        if growth.is_empty() {
            "not measured (no size above 0)".to_owned()
        } else {
            growth.join("; ")
        }
    )
}

/// `count` TCP mappings from host port 40000 onwards, for the big-map cases.
fn bulk_mappings(count: u16) -> Value {
    Value::Array(
        (0..count)
            .map(|i| json!({"hostPort": 40_000 + i, "containerPort": 80, "protocol": "tcp"}))
            .collect(),
    )
}

/// The listing paths of our nftables backend at [`BIG_MAP`] elements, as a plugin call pays
/// them (issue 22 #3), in a host namespace of their own:
/// - a DEL whose state file is gone (2 mappings, among one other owner's [`BIG_MAP`]
///   elements): it finds its elements at the keys of its mappings. Reference: `nft` deleting
///   the same elements, given their keys.
/// - a GC of [`BIG_MAP`] stale elements (one owner whose state file is gone): it lists every
///   map and deletes them. Reference: `nft` flushing the maps and sets.
fn big_map_rows(options: &Options, ours: &Path) -> Result<Vec<Row>> {
    let (host, state, container) = host_and_container("b")?;
    let hostns = host.netns()?;
    let netns = container.path().to_path_buf();
    let state_dir = state
        .dirs()
        .first()
        .context("portmap's state directory")?
        .clone();
    let mut bulk = config(&netns, Some("nftables"), "10.94.0.3", 1, 2);
    bulk["runtimeConfig"]["portMappings"] = bulk_mappings(BIG_MAP);
    let measured = config(&netns, Some("nftables"), "10.94.0.2", 8080, 5353);
    let run = |command: &str, id: &str, conf: &Value| {
        time_exec(&hostns, &exec(ours, command, id, &netns, conf))
            .with_context(|| format!("{command} of {id}"))
    };
    let forget = |id: &str| -> Result<()> {
        let record = state_dir.join(format!("{NETWORK}:{id}:eth0.json"));
        std::fs::remove_file(&record).with_context(|| format!("removing {}", record.display()))
    };
    let nft = |script: String| Exec::tool("nft", &["-f", "-"], script.into_bytes());
    let delete_measured = nft(
        "delete element ip cni_portmap ports { tcp . 8080, udp . 5353 }\n\
         delete element ip cni_portmap hairpin { 10.94.0.2 . 10.94.0.2 }\n\
         delete element ip cni_portmap localhost { 10.94.0.2 }\n"
            .to_owned(),
    );
    let flush_all = nft(
        "flush map ip cni_portmap ports\nflush set ip cni_portmap hairpin\n\
         flush set ip cni_portmap localhost\n"
            .to_owned(),
    );
    let gc = json!({"cniVersion": "1.1.0", "name": NETWORK, "type": "portmap",
        "backend": "nftables", "cni.dev/valid-attachments": []});
    let (mut del, mut del_ref) = (Samples::default(), Samples::default());
    let (mut gcs, mut gc_ref) = (Samples::default(), Samples::default());
    for _ in 0..options.iterations.clamp(1, BIG_MAP_ITERATIONS) {
        run("ADD", "bulk", &bulk)?;
        // A DEL without its record among the bulk's elements, then `nft` told the keys.
        run("ADD", "measured", &measured)?;
        forget("measured")?;
        del.push(run("DEL", "measured", &measured)?.sample());
        run("ADD", "measured", &measured)?;
        del_ref.push(time_exec(&hostns, &delete_measured)?.sample());
        run("DEL", "measured", &measured)?;
        // A GC of the bulk, whose record is gone, then `nft` flushing what it made.
        forget("bulk")?;
        gcs.push(run("GC", "", &gc)?.sample());
        run("ADD", "bulk", &bulk)?;
        gc_ref.push(time_exec(&hostns, &flush_all)?.sample());
        run("DEL", "bulk", &bulk)?;
        crate::wait_for_nf_tables_frees()?;
    }
    let row = |case: &str, step: &str, ours: Samples, reference: Samples, label: &str| Row {
        suite: "portmap".to_owned(),
        case: case.to_owned(),
        step: step.to_owned(),
        ours,
        reference,
        reference_label: label.to_owned(),
    };
    Ok(vec![
        row(
            CASE_DEL_WITHOUT_STATE,
            "DEL",
            del,
            del_ref,
            "nft delete element (keys given)",
        ),
        row(CASE_GC, "GC", gcs, gc_ref, "nft flush map and sets"),
    ])
}
