//! Fault injection: each plugin after Debian's Go `bridge` + `host-local`, facing what goes
//! wrong on a node, with the kernel state and state files afterwards compared with the state
//! before (`tests::snapshot`, plus the container interface's attributes, the sysctls tuning
//! sets and the ingress filters of the host).
//!
//! - **The netns is deleted between ADD and DEL**: DEL (with the cached result, as a runtime
//!   sends it) succeeds and the host's netfilter state and state files are as before the ADD:
//!   portmap and firewall, both backends, and tuning's backup file.
//! - **A kernel object is removed by hand**, one case per object: CHECK fails naming it, DEL
//!   still succeeds and leaves nothing of the attachment, and the next ADD makes everything
//!   again. The objects are read from a real ADD: every rule, chain and set element it added
//!   (`nft`, `iptables-save`; the whole nft table too), bandwidth's qdiscs, filter and IFB,
//!   tuning's attributes and sysctls (put back to their original values), sbr's rules and the
//!   default route of each of its tables (what its CHECK verifies; the other routes it moves
//!   are the main plugin's). What DEL or ADD cannot do is named where it occurs (printed, and
//!   put back by the test): sbr's DEL cannot tell a table was sbr's once its rule is gone, nor
//!   give main back the default route whose moved copy was removed; portmap's nftables ADD
//!   recreates a missing table but does not repair one whose rules were removed.
//! - **The iptables tools are missing** from `PATH` (`netfilter::iptables` runs them by name): the
//!   iptables backends of portmap and firewall fail naming the missing tool and change nothing;
//!   the nftables backends ADD, CHECK and DEL with the same `PATH`.
//! - **Another process holds the plugin's lock** (the test takes the same `flock`): ADD and DEL
//!   give up after their bounded wait with code 11 naming the lock, change nothing, and work
//!   once it is released: tuning (`<dataDir>/.lock`), sbr (the container's namespace itself),
//!   firewall (`/run/cni-firewall/<netns inode>/lock`, both backends), portmap (DEL under
//!   `iptables.lock`; ADD under `nft-skeleton.lock`, which only a first ADD takes).
//! - **SIGKILL half-way through ADD**, at up to 25 kill points from 0 through a whole ADD
//!   (timed first; steps of 0.2 ms or more), for every plugin and backend: the DEL a runtime
//!   sends after a failed ADD (no prevResult) leaves exactly the state of before the ADD;
//!   tuning's DEL puts the original attributes back whatever the kill point. The DEL runs once
//!   the killed plugin's children (an `iptables-restore` it fed) have finished too.
//! - **The state directory is read-only** (a read-only bind mount: root ignores permission
//!   bits): ADD fails naming it and changes nothing; DEL fails naming it and keeps its records
//!   for the retry, which cleans up once the directory is writable: tuning's `dataDir`,
//!   portmap's `/run/cni/portmap`; portmap's failing DEL has already removed the kernel
//!   objects: it fails only on its record. Firewall's `/run/cni-firewall` (both backends): DEL
//!   removes the kernel objects all the same, and fails only on the record it cannot remove.
//! - Deterministic versions of what the cases above found: an empty ingress qdisc left by a
//!   killed bandwidth ADD, and firewall's iptables ADD killed after its rules were committed.
//! - **An ADD killed before its `iptables-restore` commits** (a wrapper that waits first): the
//!   tool dies with the plugin and commits nothing afterwards (portmap, firewall).
//! - **Lockers contending for a `FileLock`** (portmap's iptables lock): all get it within a
//!   bound a few times their summed holds.
//!
//! Covered elsewhere and not repeated: `bandwidth.rs` (DEL after the netns is gone removes the
//! IFB), `conformance.rs` (DEL of every plugin succeeds after the netns is gone; for sbr that is
//! all: what it makes lives in the container's namespace), `portmap.rs` (ADD under a held
//! iptables lock is code 11, a failing `ip6tables-restore` rolls back IPv4, STATUS without the
//! iptables tools), `firewall.rs` (DEL without the iptables tools goes over nf_tables).
//! Not applicable: bandwidth keeps no state and takes no lock (its objects are found by name);
//! sbr keeps no files.
//!
//! Every test runs in a private mount namespace with a fresh tmpfs on `/run` (the test's
//! namespaces, the plugins' state and lock files), so nothing of it can remain on the machine
//! and no other process contends for the plugins' machine-wide locks.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use host::lock::FileLock;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use serde_json::{Value, json};
use tests::mounts::{bind, with_private_mounts};
use tests::snapshot::{self, Scope, Snapshot};
use tests::{
    CniErrorObject, NetworkConfigList, PluginOutput, Runtime, RuntimeConf, TestNetns, Topology,
    bins, main_plugin, process,
};

const NETWORK: &str = "faultnet";
const CONTAINER_ID: &str = "fault-ctr";
const IFNAME: &str = "eth0";
/// Deadline of one plugin run (a contended lock makes it wait 10 s).
const PLUGIN_DEADLINE: Duration = Duration::from_secs(30);
/// How long asynchronous clean-up (a socket holder) may take.
const SETTLE: Duration = Duration::from_secs(20);
const PORTMAP_RUN: &str = "/run/cni/portmap";
const FIREWALL_RUN: &str = "/run/cni-firewall";

// ---------------------------------------------------------------------------------------------
// Isolation.

/// Runs `f` on a thread with a private mount namespace whose `/run` is a fresh tmpfs. The
/// test's namespaces (`/run/netns`), the plugins' state and lock files all live there and go
/// with the thread; the machine's mounts never see any of it.
fn isolated<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    with_private_mounts(
        || {
            mount(
                Some("tmpfs"),
                "/run",
                Some("tmpfs"),
                MsFlags::empty(),
                Some("mode=0755"),
            )
            .context("tmpfs on /run")
        },
        f,
    )
}

/// `dir` bind-mounted read-only on itself (in the calling thread's mount namespace) until
/// dropped.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn new(dir: &Path) -> Result<ReadOnly> {
        std::fs::create_dir_all(dir)?;
        bind(dir, dir, true)?;
        Ok(ReadOnly(dir.to_path_buf()))
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        if let Err(e) = umount2(&self.0, MntFlags::MNT_DETACH) {
            eprintln!("failed to unmount {}: {e}", self.0.display());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Processes.

/// Inode of the namespace (or any file) at `path`.
fn inode(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .ino())
}

/// Pids and names of the processes whose network namespace is `ns` (zombies have none).
fn processes_in(ns: &TestNetns) -> Result<Vec<String>> {
    let ino = inode(ns.path())?;
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if std::fs::metadata(entry.path().join("ns/net")).is_ok_and(|m| m.ino() == ino) {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            found.push(format!("{pid} {}", comm.trim()));
        }
    }
    Ok(found)
}

/// Waits until no process runs in any of `namespaces`: what a killed plugin started (an
/// `iptables-restore` it fed, killed with it) has finished.
fn wait_idle(namespaces: &[&TestNetns]) -> Result<()> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut left = Vec::new();
        for ns in namespaces {
            left.extend(processes_in(ns)?);
        }
        if left.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "processes still running: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------------------
// A stage: a topology, the Go bridge attached to its container, and one of our plugins run by
// hand after it.

/// What a stage compares: the host namespace with its netfilter state and the plugins' state
/// directories, the container namespace, and the container interface's attributes and the
/// sysctls the plugin may change (which the shared snapshot leaves out).
#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    host: Snapshot,
    container: Snapshot,
    attributes: Vec<String>,
}

impl State {
    fn diff(&self, later: &State) -> Vec<String> {
        let mut out: Vec<String> = self
            .host
            .diff(&later.host)
            .into_iter()
            .map(|l| format!("host {l}"))
            .collect();
        out.extend(
            self.container
                .diff(&later.container)
                .into_iter()
                .map(|l| format!("container {l}")),
        );
        for line in &self.attributes {
            if !later.attributes.contains(line) {
                out.push(format!("attributes: - {line}"));
            }
        }
        for line in &later.attributes {
            if !self.attributes.contains(line) {
                out.push(format!("attributes: + {line}"));
            }
        }
        out
    }
}

struct Stage {
    topo: Topology,
    runtime: Runtime,
    scratch: tempfile::TempDir,
    /// The bridge's result: our plugin's prevResult.
    prev: Value,
    plugin: &'static str,
    /// Our plugin's config (`name`, `cniVersion`, `type` and its keys), without prevResult.
    conf: Value,
    /// Sysctls of the container namespace to compare.
    sysctls: Vec<&'static str>,
}

impl Stage {
    /// A topology, the bridge (dual-stack) attached to its container as `eth0`, and `keys` for
    /// `plugin`. A `dataDir` key is replaced by a directory in the stage's scratch dir.
    fn new(prefix: &str, plugin: &'static str, keys: Value) -> Result<Stage> {
        let topo = Topology::new(prefix)?;
        let scratch = tempfile::tempdir()?;
        let runtime = Runtime::new(&topo.host)?;
        let main = NetworkConfigList::new(
            NETWORK,
            "1.0.0",
            vec![main_plugin::bridge(
                "faultbr0",
                &["10.93.0.0/24", "fd93::/64"],
                &scratch.path().join("ipam"),
            )],
        );
        let prev = runtime.add(
            &main,
            &RuntimeConf::new(CONTAINER_ID, topo.container.path(), IFNAME),
        )?;
        let mut conf = keys;
        conf["name"] = json!(NETWORK);
        conf["cniVersion"] = json!("1.0.0");
        conf["type"] = json!(plugin);
        if conf.get("dataDir").is_some() {
            conf["dataDir"] = json!(scratch.path().join("data"));
        }
        Ok(Stage {
            topo,
            runtime,
            scratch,
            prev,
            plugin,
            conf,
            sysctls: Vec::new(),
        })
    }

    fn data_dir(&self) -> PathBuf {
        self.scratch.path().join("data")
    }

    /// The host-side veth of the container (the bridge's result names it).
    fn host_veth(&self) -> Result<String> {
        tests::result::host_veth(&self.prev)
    }

    /// The command running `verb` on our plugin inside the host namespace, and its stdin (the
    /// config, with the bridge's result as prevResult when `with_prev`).
    fn command(
        &self,
        verb: &str,
        with_prev: bool,
        env: &[(&str, &str)],
    ) -> Result<(Command, Vec<u8>)> {
        let mut cmd = Command::new(bins::plugin_binary(self.plugin)?);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CNI_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", CONTAINER_ID)
            .env("CNI_NETNS", self.topo.container.path())
            .env("CNI_IFNAME", IFNAME)
            .env("CNI_PATH", self.runtime.cni_path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut conf = self.conf.clone();
        if with_prev {
            conf["prevResult"] = self.prev.clone();
        }
        Ok((cmd, conf.to_string().into_bytes()))
    }

    fn exec(&self, verb: &str, with_prev: bool, env: &[(&str, &str)]) -> Result<PluginOutput> {
        let (mut cmd, stdin) = self.command(verb, with_prev, env)?;
        let out = process::run_in(self.runtime.host(), &mut cmd, &stdin, PLUGIN_DEADLINE)?;
        Ok(PluginOutput {
            status: out.status,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    fn ok(&self, verb: &str, with_prev: bool, env: &[(&str, &str)]) -> Result<()> {
        let out = self.exec(verb, with_prev, env)?;
        ensure!(
            out.status.success(),
            "{} {verb}: {} {}",
            self.plugin,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// Runs `verb`, which must fail with a CNI error object; returns it.
    fn fails(&self, verb: &str, with_prev: bool, env: &[(&str, &str)]) -> Result<CniErrorObject> {
        let out = self.exec(verb, with_prev, env)?;
        ensure!(
            !out.status.success(),
            "{} {verb} succeeded: {}",
            self.plugin,
            String::from_utf8_lossy(&out.stdout)
        );
        out.error().with_context(|| {
            format!(
                "{} {verb} printed no error object: {:?} {:?}",
                self.plugin,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// The state directories of portmap and firewall for the host namespace (the lock files
    /// next to them are shared by every namespace).
    fn run_dirs(&self) -> Result<[PathBuf; 2]> {
        let ino = inode(self.topo.host.path())?;
        Ok([
            Path::new(PORTMAP_RUN).join(format!("net-{ino}")),
            Path::new(FIREWALL_RUN).join(ino.to_string()),
        ])
    }

    /// The host namespace, netfilter included, and the plugins' state directories for it.
    fn host_state(&self) -> Result<Snapshot> {
        let [portmap, firewall] = self.run_dirs()?;
        Scope::netns(&self.topo.host)
            .dir("portmap", portmap)
            .dir("firewall", firewall)
            .dir("data", self.data_dir())
            .take()
    }

    fn state(&self) -> Result<State> {
        let host = self.host_state()?;
        let container = Scope::netns(&self.topo.container)
            .without_netfilter()
            .take()?;
        let mut attributes = Vec::new();
        let link = &self.topo.container.ip_json(&["link", "show", IFNAME])?[0];
        let mut flags: Vec<&str> = link["flags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        flags.sort_unstable();
        attributes.push(format!(
            "{IFNAME} mtu={} mac={} txqlen={} flags={flags:?}",
            link["mtu"],
            link["address"],
            // `ip -j` leaves txqlen out when it is 0.
            link["txqlen"].as_u64().unwrap_or(0)
        ));
        for key in &self.sysctls {
            attributes.push(format!("{key}={}", self.topo.container.sysctl(key)?));
        }
        // The filters of every ingress qdisc of the host (the shared snapshot lists qdiscs
        // only), without the action index, which each new action gets anew.
        for qdisc in snapshot::qdiscs(&self.topo.host)? {
            let Some(dev) = qdisc["dev"].as_str().filter(|_| qdisc["kind"] == "ingress") else {
                continue;
            };
            for line in self
                .topo
                .host
                .exec_ok("tc", &["filter", "show", "dev", dev, "ingress"])?
                .lines()
                .filter(|l| l.starts_with("filter") || l.contains("mirred"))
            {
                let line = line.split(" index ").next().unwrap_or(line).trim();
                attributes.push(format!("{dev} ingress {line}"));
            }
        }
        Ok(State {
            host,
            container,
            attributes,
        })
    }

    /// Waits until the state equals `want` (DEL leaves some work to detached children), then
    /// returns; fails listing the differences at the deadline.
    fn settles_to(&self, want: &State, what: &str) -> Result<()> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let now = self.state()?;
            let diff = want.diff(&now);
            if diff.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} {what}: {} difference(s) from the expected state:\n  {}",
                    self.plugin,
                    diff.len(),
                    diff.join("\n  ")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn namespaces(&self) -> [&TestNetns; 2] {
        [&self.topo.host, &self.topo.container]
    }

    /// Every line of [`Stage::state`], for set arithmetic.
    fn all_lines(&self) -> Result<Vec<String>> {
        Ok(lines(&self.state()?))
    }

    /// The host's nftables ruleset (without handles and counter values) and iptables tables,
    /// and the files under the plugins' state directories, sorted.
    fn netfilter_lines(&self) -> Result<Vec<String>> {
        fn strip(v: &mut Value) {
            match v {
                Value::Object(map) => {
                    for key in ["handle", "packets", "bytes"] {
                        map.remove(key);
                    }
                    map.values_mut().for_each(strip);
                }
                Value::Array(items) => items.iter_mut().for_each(strip),
                _ => {}
            }
        }
        let host = &self.topo.host;
        let mut out: Vec<String> = snapshot::nft_ruleset(host)?
            .into_iter()
            .filter(|o| o.get("metainfo").is_none())
            .map(|mut o| {
                strip(&mut o);
                format!("nft {o}")
            })
            .collect();
        for tool in ["iptables-save", "ip6tables-save"] {
            out.extend(
                snapshot::iptables_save(host, tool)?
                    .into_iter()
                    .map(|l| format!("{tool} {l}")),
            );
        }
        let mut dirs: Vec<PathBuf> = self.run_dirs()?.into();
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry?.path();
                out.push(format!("file {}", path.display()));
                if path.is_dir() {
                    dirs.push(path);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// ADD then DEL once, so that the shared objects a first ADD creates and DEL keeps (nft
    /// tables, iptables chains) exist; returns the state then.
    fn warmed_up(&self) -> Result<State> {
        self.ok("ADD", true, &[])?;
        self.ok("DEL", true, &[])?;
        wait_idle(&self.namespaces())?;
        self.state()
    }
}

fn portmap_keys(backend: &str) -> Value {
    json!({"backend": backend, "runtimeConfig": {"portMappings": [
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 5353, "containerPort": 53, "protocol": "udp"},
    ]}})
}

fn firewall_keys(backend: &str) -> Value {
    json!({"backend": backend, "ingressPolicy": "same-bridge"})
}

fn bandwidth_keys() -> Value {
    json!({"ingressRate": 10_000_000, "ingressBurst": 100_000,
           "egressRate": 10_000_000, "egressBurst": 100_000})
}

const TUNED_MAC: &str = "02:42:ac:11:00:09";

fn tuning_keys() -> Value {
    json!({"dataDir": "", "mtu": 1400, "promisc": true, "allmulti": true, "txQLen": 500,
           "mac": TUNED_MAC,
           "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1",
                      "net.ipv4.conf.all.arp_announce": "2"}})
}

const TUNED_SYSCTLS: [&str; 2] = [
    "net.ipv4.conf.eth0.arp_ignore",
    "net.ipv4.conf.all.arp_announce",
];

fn tuning_stage(prefix: &str) -> Result<Stage> {
    let mut stage = Stage::new(prefix, "tuning", tuning_keys())?;
    stage.sysctls = TUNED_SYSCTLS.to_vec();
    Ok(stage)
}

/// The message and details of a CNI error, for "names the object" checks.
fn text(err: &CniErrorObject) -> String {
    format!("{} ({})", err.msg, err.details)
}

// ---------------------------------------------------------------------------------------------
// The netns is deleted between ADD and DEL.

/// ADD, delete the container's namespace, DEL (with the cached result, as a runtime sends
/// it): the host's netfilter state and the state files are as before the ADD.
fn del_after_the_netns_is_gone(stage: &mut Stage) -> Result<()> {
    let before = stage.warmed_up()?;
    stage.ok("ADD", true, &[])?;
    let added = stage.state()?;
    let host_side = |s: &State| {
        let sections = ["nftables", "iptables", "ip6tables", "files:portmap"];
        let mut lines: Vec<String> = sections
            .iter()
            .chain(&["files:firewall", "files:data"])
            .flat_map(|name| {
                s.host
                    .section(name)
                    .iter()
                    .map(move |l| format!("{name}: {l}"))
            })
            .collect();
        lines.sort();
        lines
    };
    ensure!(
        host_side(&added) != host_side(&before),
        "{} ADD left no host-side object or file",
        stage.plugin
    );
    stage.topo.container.delete()?;
    stage
        .ok("DEL", true, &[])
        .context("DEL after the netns is gone")?;
    wait_idle(&[&stage.topo.host])?;
    let deadline = Instant::now() + SETTLE;
    loop {
        let now = State {
            host: stage.host_state()?,
            ..before.clone()
        };
        if host_side(&now) == host_side(&before) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{} DEL left host-side objects: {:#?}",
            stage.plugin,
            before.host.diff(&now.host)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Again, as a runtime retrying would.
    stage.ok("DEL", true, &[])
}

#[test]
fn del_after_the_netns_is_gone_portmap_nftables() -> Result<()> {
    isolated(|| {
        del_after_the_netns_is_gone(&mut Stage::new(
            "fgpmn",
            "portmap",
            portmap_keys("nftables"),
        )?)
    })
}

#[test]
fn del_after_the_netns_is_gone_portmap_iptables() -> Result<()> {
    isolated(|| {
        del_after_the_netns_is_gone(&mut Stage::new(
            "fgpmi",
            "portmap",
            portmap_keys("iptables"),
        )?)
    })
}

#[test]
fn del_after_the_netns_is_gone_firewall_nftables() -> Result<()> {
    isolated(|| {
        del_after_the_netns_is_gone(&mut Stage::new(
            "fgfwn",
            "firewall",
            firewall_keys("nftables"),
        )?)
    })
}

#[test]
fn del_after_the_netns_is_gone_firewall_iptables() -> Result<()> {
    isolated(|| {
        del_after_the_netns_is_gone(&mut Stage::new(
            "fgfwi",
            "firewall",
            firewall_keys("iptables"),
        )?)
    })
}

#[test]
fn del_after_the_netns_is_gone_tuning_removes_the_backup() -> Result<()> {
    isolated(|| {
        let mut stage = Stage::new("fgtun", "tuning", tuning_keys())?;
        del_after_the_netns_is_gone(&mut stage)
    })
}

// ---------------------------------------------------------------------------------------------
// SIGKILL half-way through ADD.

/// Spawns ADD, kills it `delay` after the spawn returned (unless it exited before) and reaps
/// it; true when the signal ended it.
fn add_killed_after(stage: &Stage, delay: Duration) -> Result<bool> {
    let (mut cmd, stdin) = stage.command("ADD", true, &[])?;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = process::spawn_in(stage.runtime.host(), &mut cmd)?;
    let start = Instant::now();
    if let Some(mut pipe) = child.stdin.take() {
        // The config fits the pipe buffer: this never blocks.
        let _ = std::io::Write::write_all(&mut pipe, &stdin);
    }
    if let Some(rest) = delay.checked_sub(start.elapsed()) {
        std::thread::sleep(rest);
    }
    let _ = child.kill();
    let reaped = process::reap(&mut child, Some(Instant::now() + PLUGIN_DEADLINE))?;
    Ok(reaped.status.signal() == Some(libc::SIGKILL))
}

/// Wall time of a complete ADD (the median of three), each followed by a DEL.
fn full_add_time(stage: &Stage) -> Result<Duration> {
    let mut times = Vec::new();
    for _ in 0..3 {
        let (mut cmd, stdin) = stage.command("ADD", true, &[])?;
        let start = Instant::now();
        let out = process::run_in(stage.runtime.host(), &mut cmd, &stdin, PLUGIN_DEADLINE)?;
        times.push(start.elapsed());
        ensure!(
            out.status.success(),
            "ADD: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        stage.ok("DEL", false, &[])?;
        wait_idle(&stage.namespaces())?;
    }
    times.sort();
    Ok(times[1])
}

/// Kill points across a whole ADD: from 0 in steps of 0.2 ms, or of a 24th of the ADD when
/// that is longer (bounding the runtime).
fn kill_points(full: Duration) -> Vec<Duration> {
    let step = (full / 24).max(Duration::from_micros(200));
    std::iter::successors(Some(Duration::ZERO), |d| Some(*d + step))
        .take_while(|d| *d <= full)
        .collect()
}

fn sigkill_sweep(stage: &Stage) -> Result<()> {
    let full = full_add_time(stage)?;
    let before = stage.state()?;
    let points = kill_points(full);
    let mut killed = 0;
    for delay in &points {
        if add_killed_after(stage, *delay)? {
            killed += 1;
        }
        wait_idle(&stage.namespaces())?;
        // What a runtime sends after a failed ADD: no prevResult (nothing was cached).
        stage
            .ok("DEL", false, &[])
            .with_context(|| format!("DEL after a kill at {delay:?}"))?;
        stage.settles_to(&before, &format!("killed at {delay:?}, then DEL"))?;
    }
    eprintln!(
        "{}: a whole ADD takes {full:?}; {} kill points, {killed} of them before it exited",
        stage.plugin,
        points.len()
    );
    ensure!(killed > 0, "no kill landed before ADD exited");
    // A complete ADD still works afterwards, passes CHECK, and DEL cleans it up.
    stage.ok("ADD", true, &[])?;
    stage.ok("CHECK", true, &[])?;
    stage.ok("DEL", false, &[])?;
    stage.settles_to(&before, "after a whole ADD and DEL")
}

#[test]
fn sigkill_mid_add_then_del_portmap_nftables() -> Result<()> {
    isolated(|| sigkill_sweep(&Stage::new("fkpmn", "portmap", portmap_keys("nftables"))?))
}

#[test]
fn sigkill_mid_add_then_del_portmap_iptables() -> Result<()> {
    isolated(|| sigkill_sweep(&Stage::new("fkpmi", "portmap", portmap_keys("iptables"))?))
}

#[test]
fn sigkill_mid_add_then_del_firewall_nftables() -> Result<()> {
    isolated(|| sigkill_sweep(&Stage::new("fkfwn", "firewall", firewall_keys("nftables"))?))
}

#[test]
fn sigkill_mid_add_then_del_firewall_iptables() -> Result<()> {
    isolated(|| sigkill_sweep(&Stage::new("fkfwi", "firewall", firewall_keys("iptables"))?))
}

#[test]
fn sigkill_mid_add_then_del_bandwidth() -> Result<()> {
    isolated(|| sigkill_sweep(&Stage::new("fkbw", "bandwidth", bandwidth_keys())?))
}

/// The backup file is written before anything changes, so DEL restores the original link
/// attributes and sysctls whatever the kill point (the state compared includes them).
#[test]
fn sigkill_mid_add_then_del_tuning_restores_the_originals() -> Result<()> {
    isolated(|| sigkill_sweep(&tuning_stage("fktun")?))
}

#[test]
fn sigkill_mid_add_then_del_sbr() -> Result<()> {
    isolated(|| sigkill_sweep(&Stage::new("fksbr", "sbr", json!({}))?))
}

// ---------------------------------------------------------------------------------------------
// A kernel object removed by hand.

/// A step of removing an object by hand, or of putting the namespace back afterwards.
enum Step {
    /// `program args` with `stdin`, in the host (or the container) namespace.
    Exec {
        in_container: bool,
        program: String,
        args: Vec<String>,
        stdin: String,
    },
    /// Moves every route (both families) of routing table `table` of the container into
    /// main, device routes first (one main already has is only deleted from the table).
    MoveToMain { table: String },
    /// The rule of nft chain `family table chain` listed as `rule`, found by its text (an ADD
    /// that rebuilds a chain gives its rules new handles).
    NftRule {
        family: String,
        table: String,
        chain: String,
        rule: String,
    },
}

impl Step {
    fn exec(in_container: bool, program: &str, args: &[&str], stdin: String) -> Step {
        Step::Exec {
            in_container,
            program: program.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            stdin,
        }
    }

    fn run(&self, stage: &Stage) -> Result<()> {
        match self {
            Step::Exec {
                in_container,
                program,
                args,
                stdin,
            } => {
                let ns = if *in_container {
                    &stage.topo.container
                } else {
                    &stage.topo.host
                };
                let mut cmd = Command::new(program);
                cmd.args(args);
                let out = ns.output(&mut cmd, stdin.as_bytes(), PLUGIN_DEADLINE)?;
                ensure!(
                    out.status.success(),
                    "`{program} {}` failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                );
                Ok(())
            }
            Step::MoveToMain { table } => {
                let ctr = &stage.topo.container;
                for family in ["-4", "-6"] {
                    // A table without a route of the family does not exist for it.
                    let listing = ctr.exec("ip", &[family, "route", "show", "table", table])?;
                    let listing = String::from_utf8_lossy(&listing.stdout);
                    let mut routes: Vec<&str> = listing.lines().collect();
                    routes.sort_by_key(|r| r.contains(" via "));
                    for route in routes {
                        let mut del = vec![family, "route", "del"];
                        del.extend(route.split_whitespace());
                        del.extend(["table", table]);
                        ctr.ip(&del)?;
                        let mut add = vec![family, "route", "add"];
                        add.extend(route.split_whitespace());
                        let out = ctr.exec("ip", &add)?;
                        ensure!(
                            out.status.success()
                                || String::from_utf8_lossy(&out.stderr).contains("File exists"),
                            "ip {}: {}",
                            add.join(" "),
                            String::from_utf8_lossy(&out.stderr)
                        );
                    }
                }
                Ok(())
            }
            Step::NftRule {
                family,
                table,
                chain,
                rule,
            } => {
                let listing = stage
                    .topo
                    .host
                    .exec_ok("nft", &["-a", "list", "chain", family, table, chain])?;
                let handle = listing
                    .lines()
                    .filter_map(|l| l.trim().split_once(" # handle "))
                    .find(|(r, _)| r == rule)
                    .map(|(_, h)| h.to_owned())
                    .with_context(|| format!("rule `{rule}` not in {listing}"))?;
                stage.topo.host.exec_ok(
                    "nft",
                    &["delete", "rule", family, table, chain, "handle", &handle],
                )?;
                Ok(())
            }
        }
    }
}

/// One object an ADD made, how to remove it by hand, and what CHECK must then name.
struct Removal {
    /// The object, for messages.
    what: String,
    /// Removes it.
    steps: Vec<Step>,
    /// Text CHECK's error must contain, all of it (compared without quotes, brackets, commas
    /// and backslashes, which the formats of rules differ in).
    names: Vec<String>,
    /// Puts back what the main plugin made and DEL cannot know about (a route sbr had moved),
    /// after DEL, so the next case starts from a working attachment.
    reset: Vec<Step>,
    /// Why DEL leaves something of the attachment here, if it must (printed, not failed).
    del_leaves: Option<&'static str>,
    /// Why DEL cannot put back something the ADD had taken from main (printed, not failed).
    del_loses: Option<&'static str>,
}

impl Removal {
    fn new(what: impl Into<String>, names: &[&str]) -> Removal {
        Removal {
            what: what.into(),
            steps: Vec::new(),
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            reset: Vec::new(),
            del_leaves: None,
            del_loses: None,
        }
    }

    fn run(mut self, program: &str, args: &[&str]) -> Removal {
        self.steps
            .push(Step::exec(false, program, args, String::new()));
        self
    }

    fn run_in_container(mut self, program: &str, args: &[&str]) -> Removal {
        self.steps
            .push(Step::exec(true, program, args, String::new()));
        self
    }

    fn restore(mut self, tool: &str, table: &str, lines: &[String]) -> Removal {
        let script = format!("*{table}\n{}\nCOMMIT\n", lines.join("\n"));
        self.steps
            .push(Step::exec(false, tool, &["--noflush"], script));
        self
    }

    fn reset_in_container(mut self, program: &str, args: &[&str]) -> Removal {
        self.reset
            .push(Step::exec(true, program, args, String::new()));
        self
    }
}

/// `text` without quotes, brackets, commas and backslashes, whitespace collapsed.
fn normalised(text: &str) -> String {
    text.chars()
        .filter(|c| !matches!(c, '"' | '[' | ']' | ',' | '\\'))
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every line of a state, prefixed by where it is, sorted, for set arithmetic.
fn lines(state: &State) -> Vec<String> {
    let mut out = Vec::new();
    for (place, snap) in [("host", &state.host), ("container", &state.container)] {
        for name in snap.section_names() {
            for line in snap.section(name) {
                out.push(format!("{place} {name}: {line}"));
            }
        }
    }
    out.extend(state.attributes.iter().map(|a| format!("attributes: {a}")));
    out.sort();
    out
}

/// Lines of `a` that `b` lacks (counting repeats).
fn minus(a: &[String], b: &[String]) -> Vec<String> {
    let mut rest = b.to_vec();
    let mut out = Vec::new();
    for line in a {
        match rest.iter().position(|l| l == line) {
            Some(i) => {
                rest.swap_remove(i);
            }
            None => out.push(line.clone()),
        }
    }
    out
}

/// The `-A` rules and `:CHAIN` declarations `family` shows in `table` now and not in
/// `before`, each as a removal: a rule deleted, a chain flushed and deleted with the jumps to
/// it.
fn iptables_removals(
    stage: &Stage,
    family: &str,
    table: &str,
    before: &[String],
) -> Result<Vec<Removal>> {
    let restore = format!("{family}-restore");
    let after =
        snapshot::iptables_save_args(&stage.topo.host, &format!("{family}-save"), &["-t", table])?;
    let mut out = Vec::new();
    for line in minus(&after, before) {
        if let Some(rule) = line.strip_prefix("-A ") {
            let (chain, args) = rule.split_once(' ').unwrap_or((rule, ""));
            out.push(
                Removal::new(format!("{family} -t {table} rule {line}"), &[chain, args]).restore(
                    &restore,
                    table,
                    &[format!("-D {rule}")],
                ),
            );
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split(' ').next().unwrap_or_default();
            let mut script: Vec<String> = after
                .iter()
                .filter(|l| l.starts_with("-A ") && l.ends_with(&format!(" -j {chain}")))
                .map(|l| format!("-D {}", &l[3..]))
                .collect();
            script.push(format!("-F {chain}"));
            script.push(format!("-X {chain}"));
            out.push(
                Removal::new(format!("{family} -t {table} chain {chain}"), &[chain])
                    .restore(&restore, table, &script),
            );
        }
    }
    Ok(out)
}

/// The text of an nft set key as `nft -j` shows it.
fn nft_key(v: &Value) -> String {
    if let Some(val) = v.get("elem").map(|e| &e["val"]) {
        return nft_key(val);
    }
    if let Some(parts) = v.get("concat").and_then(Value::as_array) {
        return parts.iter().map(nft_key).collect::<Vec<_>>().join(" . ");
    }
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Everything in nft table `family name` (which the plugin created): the table itself, each
/// rule and each set or map element, as removals.
fn nft_removals(stage: &Stage, family: &str, table: &str) -> Result<Vec<Removal>> {
    let ns = &stage.topo.host;
    let mut out = vec![
        Removal::new(format!("table {family} {table}"), &[table])
            .run("nft", &["delete", "table", family, table]),
    ];
    let mut chain = None;
    for line in ns
        .exec_ok("nft", &["list", "table", family, table])?
        .lines()
        .map(str::trim)
    {
        if let Some(rest) = line.strip_prefix("chain ") {
            chain = rest.split(' ').next().map(str::to_owned);
        } else if line.starts_with("set ") || line.starts_with("map ") {
            chain = None;
        } else if let Some(chain) = chain
            .as_deref()
            .filter(|_| !line.is_empty() && line != "}" && !line.starts_with("type "))
        {
            let mut removal = Removal::new(
                format!("{family} {table} chain {chain} rule `{line}`"),
                &[chain, line],
            );
            removal.steps.push(Step::NftRule {
                family: family.to_owned(),
                table: table.to_owned(),
                chain: chain.to_owned(),
                rule: line.to_owned(),
            });
            out.push(removal);
        }
    }
    let doc: Value =
        serde_json::from_str(&ns.exec_ok("nft", &["-j", "list", "table", family, table])?)?;
    for obj in doc["nftables"].as_array().into_iter().flatten() {
        let Some(set) = obj.get("set").or_else(|| obj.get("map")) else {
            continue;
        };
        let name = set["name"].as_str().unwrap_or_default();
        for elem in set["elem"].as_array().into_iter().flatten() {
            let key = match elem.as_array() {
                Some(pair) => nft_key(&pair[0]),
                None => nft_key(elem),
            };
            let element = format!("{{ {key} }}");
            out.push(
                Removal::new(
                    format!("{family} {table} {name} element {element}"),
                    &[name],
                )
                .run("nft", &["delete", "element", family, table, name, &element]),
            );
        }
    }
    Ok(out)
}

/// How a test puts back shared objects that neither DEL nor the next ADD restores.
type Repair<'a> = &'a dyn Fn(&Stage) -> Result<()>;

/// What a removal case compares: [`Stage::all_lines`], or for the plugins that make only
/// netfilter objects and state files, [`Stage::netfilter_lines`] (3 execs instead of 17).
type View = fn(&Stage) -> Result<Vec<String>>;

/// For each removal, on a fresh ADD: remove the object, CHECK must fail naming it, DEL must
/// succeed and leave nothing of the attachment (the state after a whole ADD and DEL, less
/// the shared objects the removal took: DEL does not put those back). The next ADD must make
/// everything a first ADD makes (it repairs what is missing), except where `repair` says
/// how the test puts the shared objects back.
fn check_names_each_removed_object(
    stage: &Stage,
    removals: &[Removal],
    view: View,
    repair: Option<Repair<'_>>,
) -> Result<()> {
    ensure!(
        !removals.is_empty(),
        "{}: no object to remove",
        stage.plugin
    );
    stage.ok("ADD", true, &[])?;
    let added = view(stage)?;
    stage.ok("DEL", true, &[])?;
    wait_idle(&stage.namespaces())?;
    let deleted = view(stage)?;
    let mut failures = Vec::new();
    for removal in removals {
        let what = &removal.what;
        stage
            .ok("ADD", true, &[])
            .with_context(|| format!("ADD before removing {what}"))?;
        let now = view(stage)?;
        if now != added {
            bail!(
                "{} ADD before removing {what} did not make what a first ADD makes: \
                 missing {:#?}, extra {:#?}",
                stage.plugin,
                minus(&added, &now),
                minus(&now, &added)
            );
        }
        for step in &removal.steps {
            step.run(stage)
                .with_context(|| format!("removing {what} by hand"))?;
        }
        let taken = minus(&added, &view(stage)?);
        ensure!(!taken.is_empty(), "removing {what} changed nothing");
        // A shared object stays after a DEL; the attachment's own do not.
        let shared = taken.iter().any(|l| deleted.contains(l));
        let check = stage.exec("CHECK", true, &[])?;
        match check.error() {
            _ if check.status.success() => failures.push(format!("CHECK passed without {what}")),
            Some(err) => {
                let said = normalised(&text(&err));
                let unnamed: Vec<&String> = removal
                    .names
                    .iter()
                    .filter(|n| !said.contains(&normalised(n)))
                    .collect();
                if !unnamed.is_empty() {
                    failures.push(format!(
                        "CHECK without {what} does not say {unnamed:?}: {}",
                        text(&err)
                    ));
                }
            }
            None => failures.push(format!(
                "CHECK without {what} printed no error object: {:?}",
                String::from_utf8_lossy(&check.stdout)
            )),
        }
        if let Err(e) = stage.ok("DEL", true, &[]) {
            failures.push(format!("DEL without {what}: {e:#}"));
            continue;
        }
        wait_idle(&stage.namespaces())?;
        let now = view(stage)?;
        let left = minus(&now, &deleted);
        let gone = minus(&deleted, &now);
        if !left.is_empty() {
            match removal.del_leaves {
                Some(why) => eprintln!(
                    "{}: DEL without {what} leaves {left:?}: {why}",
                    stage.plugin
                ),
                None => failures.push(format!("DEL without {what} left {left:#?}")),
            }
        }
        if !shared && !gone.is_empty() {
            match removal.del_loses {
                Some(why) => eprintln!(
                    "{}: DEL without {what} does not put back {gone:?}: {why}",
                    stage.plugin
                ),
                None => failures.push(format!("DEL without {what} also removed {gone:#?}")),
            }
        }
        if now != deleted {
            for step in &removal.reset {
                step.run(stage)?;
            }
            if let Some(repair) = repair {
                repair(stage)?;
            }
        }
    }
    eprintln!(
        "{}: {} objects removed by hand, one at a time",
        stage.plugin,
        removals.len()
    );
    ensure!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        removals.len(),
        failures.join("\n")
    );
    Ok(())
}

/// A fresh stage's ADD and what it made, the netfilter removals `enumerate` finds, and DEL.
fn removals_of_first_add(
    stage: &Stage,
    enumerate: impl Fn(&Stage) -> Result<Vec<Removal>>,
) -> Result<Vec<Removal>> {
    stage.ok("ADD", true, &[])?;
    let removals = enumerate(stage)?;
    stage.ok("DEL", true, &[])?;
    wait_idle(&stage.namespaces())?;
    Ok(removals)
}

#[test]
fn check_names_each_removed_object_portmap_nftables() -> Result<()> {
    isolated(|| {
        let stage = Stage::new("fopmn", "portmap", portmap_keys("nftables"))?;
        let removals = removals_of_first_add(&stage, |stage| {
            let mut all = nft_removals(stage, "ip", "cni_portmap")?;
            all.extend(nft_removals(stage, "ip6", "cni_portmap")?);
            Ok(all)
        })?;
        // An ADD recreates a missing table but does not repair one whose rules were removed
        // (that would cost every ADD a listing of four chains per family): the test deletes
        // the damaged tables, which hold nothing of any attachment after the DEL.
        let repair = |stage: &Stage| -> Result<()> {
            for family in ["ip", "ip6"] {
                stage
                    .topo
                    .host
                    .exec("nft", &["delete", "table", family, "cni_portmap"])?;
            }
            Ok(())
        };
        check_names_each_removed_object(&stage, &removals, Stage::netfilter_lines, Some(&repair))
    })
}

#[test]
fn check_names_each_removed_object_portmap_iptables() -> Result<()> {
    isolated(|| {
        let stage = Stage::new("fopmi", "portmap", portmap_keys("iptables"))?;
        let nat = |tool: &str| snapshot::iptables_save_args(&stage.topo.host, tool, &["-t", "nat"]);
        let (v4, v6) = (nat("iptables-save")?, nat("ip6tables-save")?);
        let removals = removals_of_first_add(&stage, |stage| {
            let mut all = iptables_removals(stage, "iptables", "nat", &v4)?;
            all.extend(iptables_removals(stage, "ip6tables", "nat", &v6)?);
            Ok(all)
        })?;
        check_names_each_removed_object(&stage, &removals, Stage::netfilter_lines, None)
    })
}

#[test]
fn check_names_each_removed_object_firewall_nftables() -> Result<()> {
    isolated(|| {
        let stage = Stage::new("fofwn", "firewall", firewall_keys("nftables"))?;
        let removals =
            removals_of_first_add(&stage, |stage| nft_removals(stage, "inet", "cni_firewall"))?;
        check_names_each_removed_object(&stage, &removals, Stage::netfilter_lines, None)
    })
}

#[test]
fn check_names_each_removed_object_firewall_iptables() -> Result<()> {
    isolated(|| {
        let stage = Stage::new("fofwi", "firewall", firewall_keys("iptables"))?;
        let filter =
            |tool: &str| snapshot::iptables_save_args(&stage.topo.host, tool, &["-t", "filter"]);
        let (v4, v6) = (filter("iptables-save")?, filter("ip6tables-save")?);
        let removals = removals_of_first_add(&stage, |stage| {
            let mut all = iptables_removals(stage, "iptables", "filter", &v4)?;
            all.extend(iptables_removals(stage, "ip6tables", "filter", &v6)?);
            Ok(all)
        })?;
        check_names_each_removed_object(&stage, &removals, Stage::netfilter_lines, None)
    })
}

#[test]
fn check_names_each_removed_object_bandwidth() -> Result<()> {
    isolated(|| {
        let stage = Stage::new("fobw", "bandwidth", bandwidth_keys())?;
        let veth = stage.host_veth()?;
        let ifb = bandwidth::names::reference_ifb_name(NETWORK, CONTAINER_ID);
        let removals = [
            Removal::new(format!("root tbf of {veth}"), &[&veth, "root qdisc"])
                .run("tc", &["qdisc", "del", "dev", &veth, "root"]),
            Removal::new(
                format!("ingress qdisc of {veth}"),
                &[&veth, "ingress qdisc"],
            )
            .run("tc", &["qdisc", "del", "dev", &veth, "ingress"]),
            Removal::new(
                format!("redirect filter of {veth}"),
                &[&veth, "filter", &ifb],
            )
            .run(
                "tc",
                &["filter", "del", "dev", &veth, "ingress", "prio", "1"],
            ),
            Removal::new(format!("IFB {ifb}"), &[&ifb, "not found"])
                .run("ip", &["link", "del", &ifb]),
            Removal::new(format!("root tbf of {ifb}"), &[&ifb, "root qdisc"])
                .run("tc", &["qdisc", "del", "dev", &ifb, "root"]),
        ];
        check_names_each_removed_object(&stage, &removals, Stage::all_lines, None)
    })
}

/// Each attribute and sysctl tuning set, put back by hand to its original value.
#[test]
fn check_names_each_reverted_attribute_tuning() -> Result<()> {
    isolated(|| {
        let stage = tuning_stage("fotun")?;
        let link = &stage.topo.container.ip_json(&["link", "show", IFNAME])?[0];
        let mac = link["address"].as_str().unwrap_or_default().to_owned();
        let mtu = link["mtu"].to_string();
        let txqlen = link["txqlen"].as_u64().unwrap_or(0).to_string();
        let set = |what: &str, names: &[&str], args: &[&str]| {
            let mut all = vec!["link", "set", IFNAME];
            all.extend_from_slice(args);
            Removal::new(what, names).run_in_container("ip", &all)
        };
        let removals = [
            set("MTU 1400", &["mtu", "1400"], &["mtu", &mtu]),
            set(
                &format!("MAC {TUNED_MAC}"),
                &["mac", TUNED_MAC],
                &["address", &mac],
            ),
            set("promiscuous mode", &["promisc"], &["promisc", "off"]),
            set(
                "all-multicast mode",
                &["allmulti"],
                &["allmulticast", "off"],
            ),
            set(
                "txqueuelen 500",
                &["txqueuelen", "500"],
                &["txqueuelen", &txqlen],
            ),
            Removal::new("arp_ignore 1", &["net.ipv4.conf.eth0.arp_ignore"])
                .run_in_container("sysctl", &["-w", "net.ipv4.conf.eth0.arp_ignore=0"]),
            Removal::new("arp_announce 2", &["net.ipv4.conf.all.arp_announce"])
                .run_in_container("sysctl", &["-w", "net.ipv4.conf.all.arp_announce=0"]),
        ];
        check_names_each_removed_object(&stage, &removals, Stage::all_lines, None)
    })
}

/// sbr's rules and the default route of each of its tables: what its CHECK verifies (the
/// other routes it moved into a table are the main plugin's, and CHECK does not know them).
#[test]
fn check_names_each_removed_object_sbr() -> Result<()> {
    isolated(|| {
        let stage = Stage::new("fosbr", "sbr", json!({}))?;
        let families = ["-4", "-6"];
        let rules_before: Vec<String> = families
            .iter()
            .map(|f| stage.topo.container.ip(&[f, "rule"]))
            .collect::<Result<_>>()?;
        let removals = removals_of_first_add(&stage, |stage| {
            let ctr = &stage.topo.container;
            let mut out = Vec::new();
            for (fam, before) in families.iter().zip(&rules_before) {
                for line in ctr.ip(&[fam, "rule"])?.lines() {
                    if before.lines().any(|l| l == line) {
                        continue;
                    }
                    let (pref, rule) = line.split_once(':').context("an ip rule line")?;
                    let words: Vec<&str> = rule.split_whitespace().collect();
                    let (from, table) = (words[1], words[words.len() - 1]);
                    let mut removal =
                        Removal::new(format!("rule {}", rule.trim()), &["rule", from])
                            .run_in_container("ip", &[fam, "rule", "del", "pref", pref.trim()]);
                    let why = "once its rule is gone DEL cannot tell the table was sbr's, so \
                               it is neither emptied nor moved back into main";
                    removal.del_leaves = Some(why);
                    removal.del_loses = Some(why);
                    removal.reset.push(Step::MoveToMain {
                        table: table.to_owned(),
                    });
                    out.push(removal);
                }
                for line in ctr.ip(&[fam, "route", "show", "table", "all"])?.lines() {
                    let Some((route, table)) = line.split_once(" table ") else {
                        continue;
                    };
                    let table = table.split_whitespace().next().unwrap_or_default();
                    if matches!(table, "local" | "main") || !route.starts_with("default ") {
                        continue;
                    }
                    let mut del = vec![*fam, "route", "del"];
                    del.extend(line.split_whitespace());
                    let mut add = vec![*fam, "route", "add"];
                    add.extend(route.split_whitespace());
                    let mut removal = Removal::new(format!("route {line}"), &["route", route])
                        .run_in_container("ip", &del)
                        .reset_in_container("ip", &add);
                    removal.del_loses = Some(
                        "the route was main's default route, which ADD moved into the table: \
                         DEL cannot move back what is gone",
                    );
                    out.push(removal);
                }
            }
            Ok(out)
        })?;
        check_names_each_removed_object(&stage, &removals, Stage::all_lines, None)
    })
}

// ---------------------------------------------------------------------------------------------
// The iptables tools are missing.

/// An empty directory: as `PATH`, no tool is found (`netfilter::iptables` runs them by name).
fn empty_path() -> Result<(tempfile::TempDir, String)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().to_string_lossy().into_owned();
    Ok((dir, path))
}

/// The iptables backend without its tools: ADD fails naming the missing tool and changes
/// nothing (after a first ADD and DEL with the tools, so the shared chains exist, as on a node
/// that lost them); CHECK fails too. The nftables backend with the same `PATH`: ADD, CHECK and
/// DEL work and DEL leaves the state of before.
fn without_iptables_tools(plugin: &'static str, keys: fn(&str) -> Value) -> Result<()> {
    let (_dir, path) = empty_path()?;
    let env = [("PATH", path.as_str())];

    let ipt = Stage::new("fnoipt", plugin, keys("iptables"))?;
    let before = ipt.warmed_up()?;
    let err = ipt.fails("ADD", true, &env)?;
    let said = text(&err);
    ensure!(
        said.contains("tables-") && said.contains("not available"),
        "{plugin} ADD without the iptables tools does not say which is missing: {said}"
    );
    wait_idle(&ipt.namespaces())?;
    let diff = before.diff(&ipt.state()?);
    ensure!(
        diff.is_empty(),
        "{plugin} ADD without the iptables tools changed: {diff:#?}"
    );
    // The DEL a runtime sends after the failed ADD: there is nothing to remove.
    ipt.ok("DEL", true, &env)
        .context("DEL without the iptables tools after a failed ADD")?;
    let err = ipt.fails("CHECK", true, &env)?;
    ensure!(
        text(&err).contains("tables"),
        "{plugin} CHECK: {}",
        text(&err)
    );

    let nft = Stage::new("fnoiptn", plugin, keys("nftables"))?;
    let before = nft.warmed_up()?;
    nft.ok("ADD", true, &env)?;
    ensure!(
        !before.diff(&nft.state()?).is_empty(),
        "{plugin} nftables ADD changed nothing"
    );
    nft.ok("CHECK", true, &env)?;
    nft.ok("DEL", true, &env)?;
    wait_idle(&nft.namespaces())?;
    nft.settles_to(&before, "nftables ADD and DEL without the iptables tools")
}

#[test]
fn without_iptables_tools_portmap_fails_clearly_and_nftables_works() -> Result<()> {
    isolated(|| without_iptables_tools("portmap", portmap_keys))
}

#[test]
fn without_iptables_tools_firewall_fails_clearly_and_nftables_works() -> Result<()> {
    isolated(|| without_iptables_tools("firewall", firewall_keys))
}

// ---------------------------------------------------------------------------------------------
// Another process holds the plugin's lock.

/// A lock of a plugin and the verbs that wait for it.
struct Contended {
    stage: Stage,
    /// The lock file (for sbr: the container's namespace, which it locks itself).
    lock: PathBuf,
    /// Whether an ADD is made first (so that DEL has something to do under the lock).
    add_first: bool,
    /// The verbs that must give up with code 11 while the lock is held.
    verbs: &'static [&'static str],
}

impl Contended {
    /// Holds the lock, runs the verbs concurrently (each bounded by the plugin's own wait and
    /// by the process deadline), and returns how they ended; then releases the lock.
    fn under_held_lock(&self) -> Result<Vec<(&'static str, Result<CniErrorObject>)>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(self.stage.plugin != "sbr")
            .create(self.stage.plugin != "sbr")
            .truncate(false)
            .open(&self.lock)
            .with_context(|| format!("open {}", self.lock.display()))?;
        let _held = FileLock::acquire_file(file, self.lock.clone(), Duration::from_secs(1))
            .with_context(|| format!("the test could not take {}", self.lock.display()))?;
        Ok(std::thread::scope(|s| {
            let runs: Vec<_> = self
                .verbs
                .iter()
                .map(|verb| (*verb, s.spawn(|| self.stage.fails(verb, true, &[]))))
                .collect();
            runs.into_iter()
                .map(|(verb, run)| {
                    let ended = run
                        .join()
                        .unwrap_or_else(|_| Err(anyhow!("{verb} panicked")));
                    (verb, ended)
                })
                .collect()
        }))
    }

    fn run(&self) -> Result<()> {
        let stage = &self.stage;
        if self.add_first {
            stage.ok("ADD", true, &[])?;
        }
        wait_idle(&stage.namespaces())?;
        let before = stage.state()?;
        let lock = self.lock.to_string_lossy().into_owned();
        for (verb, ended) in self.under_held_lock()? {
            let err =
                ended.with_context(|| format!("{} {verb} under a held lock", stage.plugin))?;
            ensure!(
                err.code == 11 && text(&err).contains(&lock),
                "{} {verb} under the held lock {lock}: code {}, {}",
                stage.plugin,
                err.code,
                text(&err)
            );
        }
        let diff = before.diff(&stage.state()?);
        ensure!(
            diff.is_empty(),
            "{} calls that gave up on the lock changed: {diff:#?}",
            stage.plugin
        );
        // Released: everything works.
        stage.ok("ADD", true, &[])?;
        stage.ok("CHECK", true, &[])?;
        stage.ok("DEL", true, &[])?;
        Ok(())
    }
}

/// Every plugin's lock held by the test at once (they are independent: each stage has its
/// own namespaces, and the private `/run` its own lock files), so the bounded waits overlap.
/// Bandwidth takes no lock. Portmap's nftables backend locks only while creating its
/// skeleton, so its ADD on a fresh namespace is the case; its DEL never waits. Portmap's
/// iptables ADD under its lock is `portmap.rs`'s case; its DEL, written natively where the
/// tools are `iptables-nft` (one nf_tables transaction, its own chain), takes no lock either.
#[test]
fn a_held_lock_makes_add_and_del_give_up_with_code_11_and_change_nothing() -> Result<()> {
    isolated(|| {
        let firewall_lock = |stage: &Stage| -> Result<PathBuf> {
            Ok(PathBuf::from(FIREWALL_RUN)
                .join(inode(stage.topo.host.path())?.to_string())
                .join("lock"))
        };
        let tuning = tuning_stage("flktun")?;
        let sbr = Stage::new("flksbr", "sbr", json!({}))?;
        let fw_nft = Stage::new("flkfwn", "firewall", firewall_keys("nftables"))?;
        let fw_ipt = Stage::new("flkfwi", "firewall", firewall_keys("iptables"))?;
        let pm_nft = Stage::new("flkpmn", "portmap", portmap_keys("nftables"))?;
        std::fs::create_dir_all(PORTMAP_RUN)?;
        for stage in [&fw_nft, &fw_ipt] {
            std::fs::create_dir_all(firewall_lock(stage)?.parent().context("lock dir")?)?;
        }
        let cases = [
            Contended {
                lock: tuning.data_dir().join(".lock"),
                stage: tuning,
                add_first: true,
                verbs: &["ADD", "DEL"],
            },
            Contended {
                lock: sbr.topo.container.path().to_path_buf(),
                stage: sbr,
                add_first: true,
                verbs: &["ADD", "DEL"],
            },
            Contended {
                lock: firewall_lock(&fw_nft)?,
                stage: fw_nft,
                add_first: true,
                verbs: &["ADD", "DEL"],
            },
            Contended {
                lock: firewall_lock(&fw_ipt)?,
                stage: fw_ipt,
                add_first: true,
                verbs: &["ADD", "DEL"],
            },
            Contended {
                lock: PathBuf::from(PORTMAP_RUN).join("nft-skeleton.lock"),
                stage: pm_nft,
                add_first: false,
                verbs: &["ADD"],
            },
        ];
        std::fs::create_dir_all(cases[0].stage.data_dir())?;
        let failures: Vec<String> = std::thread::scope(|s| {
            let runs: Vec<_> = cases.iter().map(|c| s.spawn(|| c.run())).collect();
            runs.into_iter()
                .filter_map(|run| match run.join() {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(format!("{e:#}")),
                    Err(_) => Some("a case panicked".to_owned()),
                })
                .collect()
        });
        ensure!(failures.is_empty(), "{}", failures.join("\n"));
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// The state directory is read-only.

/// ADD with `dir` read-only fails naming it and changes nothing; after an ADD with it
/// writable, DEL with it read-only undoes what it made and can identify (portmap's rules and
/// elements, tuning's attributes and sysctls from the readable backup, firewall's accepts
/// and elements), and fails only on the record it could not remove (code 5), which it keeps
/// for the retry; the retry with it writable leaves the state of before the ADD.
fn read_only_state_dir(stage: &Stage, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let before = stage.warmed_up()?;
    let said = |err: &CniErrorObject| {
        let said = text(err);
        ensure!(
            said.contains(&*dir.to_string_lossy()) && said.contains("Read-only file system"),
            "{} does not name the read-only {}: {said}",
            stage.plugin,
            dir.display()
        );
        Ok(())
    };
    {
        let _ro = ReadOnly::new(dir)?;
        said(&stage.fails("ADD", true, &[])?)?;
    }
    wait_idle(&stage.namespaces())?;
    let diff = before.diff(&stage.state()?);
    ensure!(
        diff.is_empty(),
        "{} ADD into a read-only {} changed: {diff:#?}",
        stage.plugin,
        dir.display()
    );
    stage.ok("ADD", true, &[])?;
    let added = stage.state()?;
    {
        let _ro = ReadOnly::new(dir)?;
        let err = stage.fails("DEL", true, &[])?;
        said(&err)?;
        ensure!(
            err.code == 5,
            "{} DEL into a read-only {}: {err:?}",
            stage.plugin,
            dir.display()
        );
        // What DEL needs for its retry is still there.
        let now = stage.state()?;
        for name in ["files:portmap", "files:firewall", "files:data"] {
            ensure!(
                now.host.section(name) == added.host.section(name),
                "{} DEL into a read-only {} lost {name}",
                stage.plugin,
                dir.display()
            );
        }
        {
            ensure!(
                now.attributes == before.attributes,
                "{} DEL into a read-only {} did not restore what it could: {:#?}",
                stage.plugin,
                dir.display(),
                before.diff(&now)
            );
        }
        for name in ["nftables", "iptables", "ip6tables"] {
            ensure!(
                now.host.section(name) == before.host.section(name),
                "{} DEL into a read-only {} left {name} objects: {:#?}",
                stage.plugin,
                dir.display(),
                before.host.diff(&now.host)
            );
        }
    }
    stage.ok("DEL", true, &[])?;
    wait_idle(&stage.namespaces())?;
    stage.settles_to(&before, "DEL retried on a writable state directory")
}

/// tuning's `dataDir`: ADD cannot save the originals, so it changes nothing; DEL reads the
/// backup (locking the existing lock file read-only), restores every attribute and sysctl,
/// and fails only on removing the backup, which the retry removes.
#[test]
fn read_only_data_dir_tuning() -> Result<()> {
    isolated(|| {
        let stage = tuning_stage("frotun")?;
        read_only_state_dir(&stage, &stage.data_dir())
    })
}

/// tuning's `dataDir` full (a small tmpfs, filled up) and without a lock file (as after the Go
/// plugin's ADD, which takes none): DEL cannot create the lock, and still restores everything
/// and removes the backup (removing needs no space).
#[test]
fn full_data_dir_tuning_del_restores_and_removes_the_backup() -> Result<()> {
    isolated(|| {
        let stage = tuning_stage("ffultun")?;
        let dir = stage.data_dir();
        std::fs::create_dir_all(&dir)?;
        mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            MsFlags::empty(),
            // Four inodes: the directory, the lock, `.tmp/` and the temporary file of ADD's write.
            Some("size=256k,nr_inodes=4,mode=0755"),
        )
        .context("a small tmpfs on the data dir")?;
        let result = (|| {
            let before = stage.warmed_up()?;
            stage.ok("ADD", true, &[])?;
            std::fs::remove_file(dir.join(".lock"))?;
            // Fill it: a file as large as the space left, then files until no inode is left.
            let mut filler = std::fs::File::create(dir.join("filler"))?;
            let chunk = vec![0_u8; 4096];
            let full = loop {
                match std::io::Write::write_all(&mut filler, &chunk) {
                    Ok(()) => {}
                    Err(e) => break e,
                }
            };
            ensure!(full.raw_os_error() == Some(libc::ENOSPC), "{full}");
            drop(filler);
            let mut fillers = vec!["filler".to_string()];
            let full = loop {
                let name = format!("filler-{}", fillers.len());
                match std::fs::File::create(dir.join(&name)) {
                    Ok(_) => fillers.push(name),
                    Err(e) => break e,
                }
            };
            ensure!(full.raw_os_error() == Some(libc::ENOSPC), "{full}");
            stage.ok("DEL", true, &[])?;
            let now = stage.state()?;
            ensure!(
                now.attributes == before.attributes,
                "DEL into a full data dir did not restore: {:#?}",
                before.diff(&now)
            );
            let mut left: Vec<String> = std::fs::read_dir(&dir)?
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                // The store keeps its temporaries directory while other files are there.
                .filter(|name| name != host::store::TEMP_DIR)
                .collect();
            left.sort();
            ensure!(left == fillers, "left in the data dir: {left:?}");
            Ok(())
        })();
        let _ = umount2(&dir, MntFlags::MNT_DETACH);
        result
    })
}

#[test]
fn read_only_state_dir_portmap_both_backends() -> Result<()> {
    isolated(|| {
        for backend in ["nftables", "iptables"] {
            let stage = Stage::new("fropm", "portmap", portmap_keys(backend))?;
            read_only_state_dir(&stage, Path::new(PORTMAP_RUN))
                .with_context(|| format!("backend {backend}"))?;
        }
        Ok(())
    })
}

/// Both backends keep their records there (for DEL without prevResult, and for
/// `reconcile`) and their lock: DEL removes the accepts or elements all the same, and fails
/// on the record.
#[test]
fn read_only_state_dir_firewall_both_backends() -> Result<()> {
    isolated(|| {
        for backend in ["nftables", "iptables"] {
            let stage = Stage::new("frofw", "firewall", firewall_keys(backend))?;
            read_only_state_dir(&stage, Path::new(FIREWALL_RUN))
                .with_context(|| format!("backend {backend}"))?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Regressions found by the cases above, made deterministic.

/// An ADD killed between creating the ingress qdisc and adding its redirect filter leaves an
/// empty ingress qdisc on the host veth; DEL removes it.
#[test]
fn bandwidth_del_removes_an_ingress_qdisc_a_killed_add_left_empty() -> Result<()> {
    isolated(|| {
        let stage = Stage::new("fbwempty", "bandwidth", bandwidth_keys())?;
        let before = stage.state()?;
        let veth = stage.host_veth()?;
        stage
            .topo
            .host
            .exec_ok("tc", &["qdisc", "add", "dev", &veth, "ingress"])?;
        stage.ok("DEL", false, &[])?;
        stage.settles_to(&before, "DEL of an empty ingress qdisc")
    })
}

/// firewall's iptables ADD killed after its rules were committed (here: while its
/// `iptables-restore`, a wrapper that commits and then waits, has not exited yet): the DEL a
/// runtime sends then (no prevResult) finds the rules through the attachment's record.
#[test]
fn firewall_iptables_del_finds_the_rules_of_an_add_killed_after_its_commit() -> Result<()> {
    isolated(|| {
        let stage = Stage::new("fkfwcommit", "firewall", firewall_keys("iptables"))?;
        let before = stage.warmed_up()?;
        let tools = WrappedRestore::new(|real, marker| {
            format!("{real} \"$@\" || exit $?\n: > {marker}\n/bin/sleep 1\n")
        })?;
        let mut child = tools.start_add(&stage)?;
        tools.wait_for(&["iptables", "ip6tables"])?;
        kill_and_reap(&mut child)?;
        wait_idle(&stage.namespaces())?;
        let rules = stage
            .topo
            .host
            .exec_ok("iptables-save", &["-t", "filter"])?;
        ensure!(
            rules.contains("10.93.0.2"),
            "the ADD committed nothing: {rules}"
        );
        stage.ok("DEL", false, &[])?;
        stage.settles_to(&before, "DEL after an ADD killed after its commit")
    })
}

/// An ADD killed while its `iptables-restore` has not committed yet (a wrapper that waits,
/// then runs the real tool on the script the plugin already wrote into its stdin): the tool
/// dies with the plugin, so nothing is committed once the plugin is gone, where an orphaned
/// tool would commit half an ADD that no DEL follows. portmap and firewall, iptables backends.
#[test]
fn an_iptables_restore_dies_with_the_plugin_that_started_it() -> Result<()> {
    isolated(|| {
        for (plugin, keys) in [
            ("portmap", portmap_keys("iptables")),
            ("firewall", firewall_keys("iptables")),
        ] {
            let stage = Stage::new("fkrestore", plugin, keys)?;
            stage.warmed_up()?;
            let tools = WrappedRestore::new(|real, marker| {
                format!(": > {marker}\n/bin/sleep 1\nexec {real} \"$@\"\n")
            })?;
            let mut child = tools.start_add(&stage)?;
            let family = tools.wait_for_any(&["iptables", "ip6tables"])?;
            kill_and_reap(&mut child)?;
            let at_kill = stage.netfilter_lines()?;
            // The wrapper's sleep, and today a tool committing after it, run to their end.
            wait_idle(&stage.namespaces())?;
            let later = stage.netfilter_lines()?;
            let (gone, added) = snapshot::multiset_difference(&at_kill, &later);
            let changes: Vec<String> = gone
                .iter()
                .map(|l| format!("- {l}"))
                .chain(added.iter().map(|l| format!("+ {l}")))
                .collect();
            ensure!(
                changes.is_empty(),
                "{plugin}: the {family}-restore of a killed ADD changed the host afterwards:\n  {}",
                changes.join("\n  ")
            );
        }
        Ok(())
    })
}

/// portmap's iptables lock (any [`FileLock`]) under contention: lockers that arrive together
/// and each hold it a moment all get it within a bound a few times their summed holds, one
/// at a time. Waiters that poll sleep between attempts with the lock free, and the last ones
/// time out behind the others.
#[test]
fn contended_lockers_all_get_the_lock_within_their_bound() -> Result<()> {
    const LOCKERS: usize = 10;
    const HOLD: Duration = Duration::from_millis(5);
    const BOUND: Duration = Duration::from_millis(150);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("iptables.lock");
    let start = std::sync::Barrier::new(LOCKERS);
    let holders = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Result<Duration>> = std::thread::scope(|scope| {
        let lockers: Vec<_> = (0..LOCKERS)
            .map(|_| {
                scope.spawn(|| -> Result<Duration> {
                    start.wait();
                    let asked = Instant::now();
                    let lock = FileLock::acquire(&path, BOUND)?;
                    let waited = asked.elapsed();
                    let others = holders.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    std::thread::sleep(HOLD);
                    holders.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    drop(lock);
                    ensure!(others == 0, "{others} other holder(s) at the same time");
                    Ok(waited)
                })
            })
            .collect();
        lockers
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow!("a locker panicked")))
            })
            .collect()
    });
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| format!("{e:#}")))
        .collect();
    ensure!(
        failed.is_empty(),
        "{} of {LOCKERS} lockers failed: {failed:?}",
        failed.len()
    );
    Ok(())
}

/// A directory of iptables tools for a plugin's `PATH`: the real ones, but `iptables-restore`
/// and `ip6tables-restore` wrapped in a script, each of which leaves a marker
/// (`<marker>.<family>`) where its body says.
struct WrappedRestore {
    dir: tempfile::TempDir,
}

impl WrappedRestore {
    /// `body(real tool, marker)` is the script after `#!/bin/sh`.
    fn new(body: impl Fn(&str, &str) -> String) -> Result<WrappedRestore> {
        let dir = tempfile::tempdir()?;
        for family in ["iptables", "ip6tables"] {
            for tool in [family.to_owned(), format!("{family}-save")] {
                std::os::unix::fs::symlink(bins::on_path(&tool)?, dir.path().join(&tool))?;
            }
            let restore = format!("{family}-restore");
            let marker = dir.path().join(format!("marker.{family}"));
            let script = format!(
                "#!/bin/sh\n{}",
                body(
                    &bins::on_path(&restore)?.display().to_string(),
                    &marker.display().to_string()
                )
            );
            let path = dir.path().join(&restore);
            std::fs::write(&path, script)?;
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        }
        Ok(WrappedRestore { dir })
    }

    fn marker(&self, family: &str) -> PathBuf {
        self.dir.path().join(format!("marker.{family}"))
    }

    /// Starts the stage's ADD with these tools first (and only) on `PATH`.
    fn start_add(&self, stage: &Stage) -> Result<std::process::Child> {
        let path = self.dir.path().to_string_lossy().into_owned();
        let (mut cmd, stdin) = stage.command("ADD", true, &[("PATH", &path)])?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = process::spawn_in(stage.runtime.host(), &mut cmd)?;
        if let Some(mut pipe) = child.stdin.take() {
            std::io::Write::write_all(&mut pipe, &stdin)?;
        }
        Ok(child)
    }

    /// Waits until the wrappers of all `families` left their marker.
    fn wait_for(&self, families: &[&str]) -> Result<()> {
        let deadline = Instant::now() + PLUGIN_DEADLINE;
        while !families.iter().all(|f| self.marker(f).exists()) {
            ensure!(
                Instant::now() < deadline,
                "the wrapped restores never left {families:?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Waits until the wrapper of one of `families` left its marker; returns that family.
    fn wait_for_any<'a>(&self, families: &[&'a str]) -> Result<&'a str> {
        let deadline = Instant::now() + PLUGIN_DEADLINE;
        loop {
            if let Some(family) = families.iter().find(|f| self.marker(f).exists()) {
                return Ok(family);
            }
            ensure!(
                Instant::now() < deadline,
                "no wrapped restore of {families:?} started"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// SIGKILLs a plugin and reaps it; fails if it had exited on its own before.
fn kill_and_reap(child: &mut std::process::Child) -> Result<()> {
    let _ = child.kill();
    let reaped = process::reap(child, Some(Instant::now() + PLUGIN_DEADLINE))?;
    ensure!(
        reaped.status.signal() == Some(libc::SIGKILL),
        "the plugin exited before the kill: {:?}",
        reaped.status
    );
    Ok(())
}
