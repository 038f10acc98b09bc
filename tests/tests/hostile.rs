//! Bad input and hostile values, against the real plugin binaries.
//!
//! Every plugin binary of the workspace is fed input a runtime, a careless operator or an
//! attacker controlling a config could send, and must either work (then CHECK ends cleanly, DEL
//! with the same input works, and nothing is left behind) or fail cleanly: exit status 1 and
//! stdout exactly one CNI error object (`cniVersion`, an integer `code` the plugins document, a
//! non-empty `msg`), never a signal (a release build aborts on panic, printing no JSON),
//! another exit status or a panic message. A failure changes nothing: the kernel state of both
//! namespaces and the files the plugins keep are compared with the state before.
//!
//! - The property tests (one per plugin) generate cases with proptest from a valid config of the
//!   plugin, with a prevResult of each cniVersion's shape (0.1.0/0.2.0 `ip4`/`ip6`, 0.3.0–0.4.0
//!   `interfaces`/`ips` with `version`, 1.x without), and mutate it: keys dropped, values
//!   replaced by other types, out-of-range, negative, fractional, huge or unicode values, raw
//!   number text, truncated or byte-corrupted JSON, wrong-shape prevResults, junk capabilities,
//!   `runtimeConfig`, `args`, `CNI_ARGS` and environment. Each case runs ADD (and then CHECK and
//!   DEL when it worked), or DEL, CHECK, STATUS or GC alone; the state is compared after each
//!   case, except that refusals at the input checks (codes 1, 4, 6) share one comparison per
//!   eight (the failure then lists all eight). The seed is fixed (set
//!   `HOSTILE_SEED` to explore others, `HOSTILE_CASES` for more cases); a failure prints the
//!   case, shrunk, with the exact stdin and environment.
//! - The named tests go through the hostile values of the issue one by one: sysctl keys that
//!   climb out of `/proc/sys/net`, interface names with `/`, MACs of the wrong length, huge,
//!   negative and fractional numbers, 1000-character container IDs and network names (worked
//!   with shortened kernel names, or refused without leftovers), deeply nested JSON, and 10 MB
//!   of stdin.
//!
//! Plugins run inside a throwaway host namespace joined by a veth (`veth-hst` ↔ `eth0`) to a
//! throwaway container namespace, so valid cases reach the kernel. All of it runs in a private
//! mount namespace whose `/run` is an empty tmpfs except `/run/netns`: the plugins' state and
//! lock files under `/run` are part of the snapshot and vanish with the test.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as ProptestConfig, RngSeed, TestCaseError, TestRunner};
use serde_json::{Value, json};
use tests::mounts::{rbind, with_private_mounts};
use tests::netns::NETNS_RUN_DIR;
use tests::{TestNetns, veth_pair};

// ---------------------------------------------------------------------------------------------
// The namespaces, the private /run, and the plugins

/// Host side of the veth; listed in prevResult without a sandbox, as `bridge`/`ptp` list theirs.
const HOST_VETH: &str = "veth-hst";
/// Container side of the veth: `CNI_IFNAME`.
const CTR_IF: &str = "eth0";
const HOST_V4: &str = "10.77.0.1";
const CTR_V4: &str = "10.77.0.2";
const HOST_V6: &str = "fd77::1";
const CTR_V6: &str = "fd77::2";
/// `CNI_CONTAINERID` unless a case changes it.
const CONTAINER_ID: &str = "hostile-ctr";
/// The network name unless a case changes it.
const NETWORK: &str = "hostile";
/// Every spec version.
const ALL_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The codes our plugins print (see each README): the spec's 1–7 and 11, libcni's 8 (netns)
/// and 999 (internal: a kernel or tool failure, CHECK drift), and 50 (STATUS: unavailable).
const DOCUMENTED_CODES: [u64; 11] = [1, 2, 3, 4, 5, 6, 7, 8, 11, 50, 999];

/// Deadline of one plugin or tool execution: a hang shows as a harness error naming the case.
/// Generous, because every netlink dump waits for the kernel's RTNL lock, which namespace
/// teardown (also of earlier tests, in the background) can hold for seconds.
const PLUGIN_DEADLINE: Duration = Duration::from_secs(120);
/// How long the kernel may take to settle a namespace (IPv6 addresses leaving their tentative
/// state) before a snapshot; milliseconds, unless namespace teardown holds the RTNL lock.
const SETTLE_DEADLINE: Duration = Duration::from_secs(60);

/// One plugin binary under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plugin {
    Portmap,
    Tuning,
    Bandwidth,
    Firewall,
    Sbr,
}

const PLUGINS: [Plugin; 5] = [
    Plugin::Portmap,
    Plugin::Tuning,
    Plugin::Bandwidth,
    Plugin::Firewall,
    Plugin::Sbr,
];

impl Plugin {
    fn name(self) -> &'static str {
        match self {
            Plugin::Portmap => "portmap",
            Plugin::Tuning => "tuning",
            Plugin::Bandwidth => "bandwidth",
            Plugin::Firewall => "firewall",
            Plugin::Sbr => "sbr",
        }
    }

    fn versions(self) -> &'static [&'static str] {
        match self {
            Plugin::Bandwidth => bandwidth::SUPPORTED_VERSIONS,
            Plugin::Firewall => &["0.4.0", "1.0.0", "1.1.0"],
            _ => &ALL_VERSIONS,
        }
    }

    /// The plugin's own keys of valid configs that reach the kernel with the fixture's
    /// prevResult; the fuzzer starts from each of them.
    fn variants(self, scratch: &Path) -> Vec<Value> {
        let data_dir = scratch.join("tuning");
        match self {
            Plugin::Portmap => {
                let mappings = json!([
                    {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"},
                    {"hostPort": 15353, "containerPort": 53, "protocol": "udp", "hostIP": HOST_V4},
                ]);
                vec![
                    json!({"backend": "nftables", "capabilities": {"portMappings": true},
                           "runtimeConfig": {"portMappings": mappings}}),
                    json!({"backend": "iptables", "snat": true, "markMasqBit": 13,
                           "conditionsV4": ["-s", "10.0.0.0/8"],
                           "runtimeConfig": {"portMappings": mappings}}),
                    json!({"backend": "nftables", "masqAll": true, "snat": true,
                           "conditionsV4": ["ip saddr 10.0.0.0/8"],
                           "runtimeConfig": {"portMappings": mappings}}),
                ]
            }
            Plugin::Tuning => vec![
                json!({"dataDir": data_dir, "mtu": 1400, "txQLen": 500, "promisc": true,
                       "allmulti": true, "mac": "02:11:22:33:44:55",
                       "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1",
                                  "net/ipv6/conf/IFNAME/accept_ra": "0"}}),
                json!({"dataDir": data_dir, "sysctl": {"net.ipv4.conf.IFNAME.arp_announce": "2"},
                       "capabilities": {"mac": true},
                       "runtimeConfig": {"mac": "02:11:22:33:44:66"},
                       "args": {"cni": {"mtu": 1300, "txQLen": 100, "allmulti": false,
                                        "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "2"}}}}),
                // The default dataDir (in the private /run).
                json!({"mtu": 1450, "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2"}}),
            ],
            Plugin::Bandwidth => vec![
                json!({"ingressRate": 8_000_000, "ingressBurst": 80_000,
                       "egressRate": 4_000_000, "egressBurst": 40_000}),
                json!({"capabilities": {"bandwidth": true},
                       "runtimeConfig": {"bandwidth": {"ingressRate": 1_000_000,
                           "ingressBurst": 4_294_967_295_u64, "egressRate": 2_000_000,
                           "egressBurst": 2_147_483_647}}}),
            ],
            Plugin::Firewall => vec![
                json!({"backend": "iptables", "iptablesAdminChainName": "CNI-ADMIN"}),
                json!({"backend": "nftables", "ingressPolicy": "open"}),
            ],
            Plugin::Sbr => vec![
                json!({}),
                json!({"table": 1000}),
                json!({"gateways": [HOST_V4, HOST_V6], "addSourceHints": true}),
            ],
        }
    }

    /// JSON pointers the mutations aim at besides random nodes: the plugin's keys and
    /// capabilities, present in a variant or not.
    fn known_paths(self) -> &'static [&'static str] {
        match self {
            Plugin::Portmap => &[
                "/backend",
                "/snat",
                "/masqAll",
                "/markMasqBit",
                "/externalSetMarkChain",
                "/conditionsV4",
                "/conditionsV4/0",
                "/conditionsV6",
                "/runtimeConfig/portMappings",
                "/runtimeConfig/portMappings/0",
                "/runtimeConfig/portMappings/0/hostPort",
                "/runtimeConfig/portMappings/0/containerPort",
                "/runtimeConfig/portMappings/0/protocol",
                "/runtimeConfig/portMappings/0/hostIP",
                "/runtimeConfig/portMappings/1/hostPort",
                "/runtimeConfig/portMappings/1/hostIP",
            ],
            Plugin::Tuning => &[
                "/mtu",
                "/txQLen",
                "/promisc",
                "/allmulti",
                "/mac",
                "/sysctl",
                "/sysctl/net.ipv4.conf.IFNAME.arp_ignore",
                "/runtimeConfig/mac",
                "/args/cni/mac",
                "/args/cni/mtu",
                "/args/cni/txQLen",
                "/args/cni/promisc",
                "/args/cni/allmulti",
                "/args/cni/sysctl",
                "/args/cni/sysctl/net.ipv4.conf.IFNAME.arp_ignore",
                "/dataDir",
            ],
            Plugin::Bandwidth => &[
                "/ingressRate",
                "/ingressBurst",
                "/egressRate",
                "/egressBurst",
                "/latencyMs",
                "/deriveSentinelBurst",
                "/runtimeConfig/bandwidth",
                "/runtimeConfig/bandwidth/ingressRate",
                "/runtimeConfig/bandwidth/ingressBurst",
                "/runtimeConfig/bandwidth/egressRate",
                "/runtimeConfig/bandwidth/egressBurst",
            ],
            Plugin::Firewall => &[
                "/backend",
                "/iptablesAdminChainName",
                "/firewalldZone",
                "/ingressPolicy",
            ],
            Plugin::Sbr => &["/table", "/gateways", "/gateways/0", "/addSourceHints"],
        }
    }
}

/// Envelope and prevResult paths every plugin reads.
const COMMON_PATHS: &[&str] = &[
    "/cniVersion",
    "/name",
    "/type",
    "/capabilities",
    "/runtimeConfig",
    "/args",
    "/args/cni",
    "/cni.dev/valid-attachments",
    "/prevResult",
    "/prevResult/cniVersion",
    "/prevResult/interfaces",
    "/prevResult/interfaces/0",
    "/prevResult/interfaces/0/name",
    "/prevResult/interfaces/1/name",
    "/prevResult/interfaces/1/mac",
    "/prevResult/interfaces/1/sandbox",
    "/prevResult/interfaces/1/mtu",
    "/prevResult/ips",
    "/prevResult/ips/0",
    "/prevResult/ips/0/address",
    "/prevResult/ips/0/interface",
    "/prevResult/ips/0/gateway",
    "/prevResult/ips/0/version",
    "/prevResult/ips/1/address",
    "/prevResult/ips/1/interface",
    "/prevResult/routes",
    "/prevResult/routes/0/dst",
    "/prevResult/routes/0/gw",
    "/prevResult/routes/0/priority",
    "/prevResult/routes/0/table",
    "/prevResult/routes/0/mtu",
    "/prevResult/ip4",
    "/prevResult/ip4/ip",
    "/prevResult/ip4/gateway",
    "/prevResult/ip4/routes/0/dst",
    "/prevResult/ip6/ip",
    "/prevResult/dns",
];

/// Runs `f` on a thread with a private mount namespace whose `/run` is an empty tmpfs holding
/// only `/run/netns/<name>` of the namespaces given (bound from the real ones): plugins and
/// `ip` see no other test's namespaces, and the plugins' files under `/run` stay in the test.
/// Threads and processes started from the thread (plugin execs, their detached helpers)
/// inherit the mount namespace; it goes away with the last of them.
fn with_private_run<T: Send>(
    namespaces: &[&TestNetns],
    f: impl FnOnce() -> Result<T> + Send,
) -> Result<T> {
    let keep = tempfile::tempdir().context("tempdir for /run/netns")?;
    let keep_path = keep.path().to_path_buf();
    let names: Vec<String> = namespaces.iter().map(|n| n.name().to_owned()).collect();
    let setup = || -> Result<()> {
        rbind(Path::new(NETNS_RUN_DIR), &keep_path)?;
        mount(
            Some("tmpfs"),
            "/run",
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=755,size=64m"),
        )
        .context("tmpfs on /run")?;
        std::fs::create_dir(NETNS_RUN_DIR).context("mkdir /run/netns")?;
        for name in &names {
            let target = Path::new(NETNS_RUN_DIR).join(name);
            std::fs::write(&target, "").context("mount point in /run/netns")?;
            rbind(&keep_path.join(name), &target)?;
        }
        umount2(&keep_path, MntFlags::MNT_DETACH).context("unmount the aside copy")?;
        Ok(())
    };
    with_private_mounts(setup, f)
}

/// A host namespace where the plugins run, a container namespace joined to it by a veth, and
/// a scratch directory for tuning's backups and junk `CNI_NETNS` targets.
struct Fixture {
    host: TestNetns,
    container: TestNetns,
    scratch: tempfile::TempDir,
    host_mac: String,
    ctr_mac: String,
}

impl Fixture {
    fn new() -> Result<Fixture> {
        let host = TestNetns::new("hostile-h")?;
        let container = TestNetns::new("hostile-c")?;
        veth_pair(
            &host,
            HOST_VETH,
            &[&format!("{HOST_V4}/24"), &format!("{HOST_V6}/64")],
            &container,
            CTR_IF,
            &[&format!("{CTR_V4}/24"), &format!("{CTR_V6}/64")],
        )?;
        container.ip(&["route", "add", "default", "via", HOST_V4])?;
        container.ip(&["-6", "route", "add", "default", "via", HOST_V6])?;
        let mac = |ns: &TestNetns, ifname: &str| -> Result<String> {
            let links = ns.ip_json(&["link", "show", "dev", ifname])?;
            links[0]["address"]
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("no MAC for {ifname}: {links}"))
        };
        // The IPv6 addresses (link-local ones too, and their `local` routes) settle once both
        // ends have a carrier, DAD being off: the baseline must not catch them half-way.
        let deadline = Instant::now() + SETTLE_DEADLINE;
        for ns in [&host, &container] {
            while !ns
                .ip(&["-6", "addr", "show", "tentative"])?
                .trim()
                .is_empty()
            {
                ensure!(
                    Instant::now() < deadline,
                    "IPv6 addresses in {} still tentative after {SETTLE_DEADLINE:?}",
                    ns.name()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let host_mac = mac(&host, HOST_VETH)?;
        let ctr_mac = mac(&container, CTR_IF)?;
        let scratch = tempfile::tempdir()?;
        std::fs::write(scratch.path().join("not-a-netns"), "a regular file")?;
        Ok(Fixture {
            host,
            container,
            scratch,
            host_mac,
            ctr_mac,
        })
    }

    fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    fn ctr_path(&self) -> String {
        self.container.path().to_string_lossy().into_owned()
    }

    /// A prevResult of `version`'s shape: both veth ends, the container's addresses and
    /// default routes.
    fn prev_result(&self, version: &str) -> Value {
        match version {
            "0.1.0" | "0.2.0" => json!({
                "cniVersion": version,
                "ip4": {"ip": format!("{CTR_V4}/24"), "gateway": HOST_V4,
                        "routes": [{"dst": "0.0.0.0/0", "gw": HOST_V4}]},
                "ip6": {"ip": format!("{CTR_V6}/64"), "gateway": HOST_V6,
                        "routes": [{"dst": "::/0"}]},
                "dns": {},
            }),
            _ => {
                let versioned = matches!(version, "0.3.0" | "0.3.1" | "0.4.0");
                let ip = |family: &str, address: String, gateway: &str| {
                    let mut ip = json!({"interface": 1, "address": address, "gateway": gateway});
                    if versioned {
                        ip["version"] = json!(family);
                    }
                    ip
                };
                json!({
                    "cniVersion": version,
                    "interfaces": [
                        {"name": HOST_VETH, "mac": self.host_mac},
                        {"name": CTR_IF, "mac": self.ctr_mac, "sandbox": self.ctr_path()},
                    ],
                    "ips": [ip("4", format!("{CTR_V4}/24"), HOST_V4),
                            ip("6", format!("{CTR_V6}/64"), HOST_V6)],
                    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
                    "dns": {},
                })
            }
        }
    }

    /// The full config of `plugin`'s `variant` in `version`, with a prevResult.
    fn config(&self, plugin: Plugin, variant: usize, version: &str) -> Value {
        let variants = plugin.variants(self.scratch());
        let mut conf = variants[variant % variants.len()].clone();
        conf["cniVersion"] = json!(version);
        conf["name"] = json!(NETWORK);
        conf["type"] = json!(plugin.name());
        conf["prevResult"] = self.prev_result(version);
        conf
    }

    /// The environment of a normal call of `verb`.
    fn env(&self, verb: &str) -> Env {
        let mut env = Env::default();
        env.set("CNI_COMMAND", verb);
        if matches!(verb, "ADD" | "CHECK" | "DEL") {
            env.set("CNI_CONTAINERID", CONTAINER_ID);
            env.set("CNI_NETNS", &self.ctr_path());
            env.set("CNI_IFNAME", CTR_IF);
        }
        env.set("CNI_PATH", "/usr/lib/cni");
        env
    }

    /// Runs `plugin` in the host namespace with exactly the `CNI_*` variables of `env`.
    fn exec(&self, plugin: Plugin, env: &Env, stdin: &[u8]) -> Result<Ran> {
        let mut cmd = Command::new(tests::bins::plugin_binary(plugin.name())?);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CNI_") {
                cmd.env_remove(key);
            }
        }
        cmd.envs(env.0.iter().map(|(k, v)| (k, v)));
        run_in(&self.host, &mut cmd, stdin)
    }

    /// ADD, CHECK and DEL of every variant of `plugins` in 1.0.0, which must all work: the
    /// shared objects plugins create once (nftables tables, iptables chains, lock files) exist
    /// from then on, so what a case leaves behind is its own. Twice, and the second round must
    /// end where the first did (ADD + DEL is a round trip, and the snapshot is stable).
    fn warm_up(&self, plugins: &[Plugin]) -> Result<Snapshot> {
        let mut rounds = Vec::new();
        for _ in 0..2 {
            for &plugin in plugins {
                for variant in 0..plugin.variants(self.scratch()).len() {
                    let stdin = self.config(plugin, variant, "1.0.0").to_string();
                    for verb in ["ADD", "CHECK", "DEL"] {
                        let out = self.exec(plugin, &self.env(verb), stdin.as_bytes())?;
                        ensure!(
                            out.status.success(),
                            "warm-up {verb} of {} variant {variant} failed: {}\nstdin: {stdin}",
                            plugin.name(),
                            output_text(&out)
                        );
                    }
                }
            }
            rounds.push(self.snapshot()?);
        }
        let diff = rounds[0].diff(&rounds[1]);
        ensure!(
            diff.is_empty(),
            "a second ADD/CHECK/DEL round did not end where the first did:\n{diff}"
        );
        rounds.pop().context("no round")
    }

    /// What the plugins could have changed: links with their attributes, addresses, routes,
    /// rules, qdiscs and filters, the nftables ruleset (which holds iptables-nft's rules too)
    /// and `iptables-save` of the host, every readable sysctl under `/proc/sys/net` of both
    /// namespaces, and the files under the private `/run` and the scratch directory.
    fn snapshot(&self) -> Result<Snapshot> {
        let mut host = Snapshot::default();
        let mut ctr = Snapshot::default();
        std::thread::scope(|s| -> Result<()> {
            let other = s.spawn(|| snapshot_netns(&self.container, "ctr", &mut ctr));
            snapshot_netns(&self.host, "host", &mut host)?;
            other
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })?;
        host.0.append(&mut ctr.0);
        host.0.insert(
            "files /run".into(),
            tree(Path::new("/run"), &[Path::new(NETNS_RUN_DIR)])?,
        );
        host.0
            .insert("files scratch".into(), tree(self.scratch(), &[])?);
        Ok(host)
    }
}

/// A process environment for one exec, in a stable order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Env(Vec<(String, String)>);

impl Env {
    fn set(&mut self, key: &str, value: &str) {
        self.unset(key);
        self.0.push((key.to_owned(), value.to_owned()));
    }

    fn unset(&mut self, key: &str) {
        self.0.retain(|(k, _)| k != key);
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl fmt::Display for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in &self.0 {
            write!(f, "{k}={} ", shorten(v, 200))?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshots

/// Named sections of normalised lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Snapshot(BTreeMap<String, Vec<String>>);

impl Snapshot {
    /// Lines only in `self` (`-`) or only in `after` (`+`), per section; empty when equal.
    fn diff(&self, after: &Snapshot) -> String {
        let mut out = String::new();
        let empty = Vec::new();
        let mut sections: Vec<&String> = self.0.keys().chain(after.0.keys()).collect();
        sections.sort();
        sections.dedup();
        for section in sections {
            let a = self.0.get(section).unwrap_or(&empty);
            let b = after.0.get(section).unwrap_or(&empty);
            if a == b {
                continue;
            }
            out.push_str(&format!("[{section}]\n"));
            let gone: Vec<&String> = a.iter().filter(|l| !b.contains(l)).collect();
            let new: Vec<&String> = b.iter().filter(|l| !a.contains(l)).collect();
            for l in &gone {
                out.push_str(&format!("- {l}\n"));
            }
            for l in &new {
                out.push_str(&format!("+ {l}\n"));
            }
            if gone.is_empty() && new.is_empty() {
                out.push_str("  (same lines, another order)\n");
            }
        }
        out
    }
}

/// What one namespace holds, section by section (`@@ <section>` lines between them), read by
/// one shell with as few processes as the tools allow (`ip` and `tc` take batches). The
/// iptables rules are in the nftables ruleset when iptables is `iptables-nft`; otherwise
/// `$SAVE` asks for `iptables-save` too.
const NETNS_SNAPSHOT_SCRIPT: &str = r#"
exec 2>&1
echo '@@ links, addresses, routes, rules'
printf 'link show\naddr show\nroute show table all\nrule show\n' | ip -d -b -
echo '@@ ipv6 rules'; ip -6 rule show
echo '@@ qdiscs, filters'
for dev in $(ip -o link show | sed -n 's/^[0-9]*: \([^:@]*\).*/\1/p'); do
    printf 'filter show dev %s\nfilter show dev %s ingress\n' "$dev" "$dev"
done | { echo 'qdisc show'; cat; } | tc -force -b -
echo '@@ nftables'; nft -s list ruleset
if [ -n "$SAVE" ]; then
    echo '@@ iptables'; iptables-save | grep -v '^#' | sed 's/ \[[0-9]*:[0-9]*\]$//'
    echo '@@ ip6tables'; ip6tables-save | grep -v '^#' | sed 's/ \[[0-9]*:[0-9]*\]$//'
fi
"#;

/// True when `iptables` is the legacy one, whose rules `nft` does not show.
fn iptables_is_legacy() -> bool {
    static LEGACY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LEGACY.get_or_init(|| {
        Command::new("iptables")
            .arg("-V")
            .output()
            .is_ok_and(|out| !String::from_utf8_lossy(&out.stdout).contains("nf_tables"))
    })
}

/// Adds the sections of `ns` to `snap`, as `<label> <section>`.
fn snapshot_netns(ns: &TestNetns, label: &str, snap: &mut Snapshot) -> Result<()> {
    let mut sh = Command::new("sh");
    sh.args(["-c", NETNS_SNAPSHOT_SCRIPT]);
    if label == "host" && iptables_is_legacy() {
        sh.env("SAVE", "1");
    }
    let (ran, sysctls) = std::thread::scope(|s| {
        let sysctls = s.spawn(|| {
            ns.run(|| {
                let mut lines = Vec::new();
                read_sysctls(Path::new("/proc/sys/net"), &mut lines);
                lines
            })
        });
        let ran = run_in(ns, &mut sh, b"");
        let sysctls = sysctls
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (ran, sysctls)
    });
    let ran = ran?;
    snap.0.insert(format!("{label} sysctls"), sysctls?);
    let text = String::from_utf8_lossy(&ran.stdout);
    let mut section = format!("{label} -");
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("@@ ") {
            section = format!("{label} {name}");
            snap.0.entry(section.clone()).or_default();
        } else {
            snap.0
                .entry(section.clone())
                .or_default()
                .push(line.to_owned());
        }
    }
    Ok(())
}

/// A finished process: its status and output.
struct Ran {
    status: std::process::ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Runs `cmd` inside `ns` with `stdin`, waited for without a poll interval of more than a
/// fraction of a millisecond, and killed at [`PLUGIN_DEADLINE`] (an error then).
fn run_in(ns: &TestNetns, cmd: &mut Command, stdin: &[u8]) -> Result<Ran> {
    use std::io::{Read, Write};
    use std::process::Stdio;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = tests::process::spawn_in(&ns.netns()?, cmd)?;
    let program = cmd.get_program().to_string_lossy().into_owned();
    // The writer is detached: a child may exit without reading all its input.
    if let Some(mut pipe) = child.stdin.take() {
        let input = stdin.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(mut pipe) = pipe {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = pipe.read_to_end(&mut buf);
                let _ = tx.send(buf);
            });
        }
        rx
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let reaped = tests::process::reap(&mut child, Some(Instant::now() + PLUGIN_DEADLINE));
    // Bounded: a grandchild left holding the pipe must not stall the test.
    let collect = |rx: std::sync::mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(Duration::from_secs(2)).unwrap_or_default()
    };
    let (stdout, stderr) = (collect(stdout), collect(stderr));
    let reaped = reaped.with_context(|| {
        format!(
            "{program} in {}; its stdout: {:?}; stderr: {:?}",
            ns.name(),
            shorten(&String::from_utf8_lossy(&stdout), 3000),
            shorten(&String::from_utf8_lossy(&stderr), 3000)
        )
    })?;
    Ok(Ran {
        status: reaped.status,
        stdout,
        stderr,
    })
}

/// Sysctls that change without anyone writing them.
const VOLATILE_SYSCTLS: [&str; 1] = ["nf_conntrack_count"];

/// Every readable file under `dir` as `path=value` (write-only and unreadable ones skipped).
fn read_sysctls(dir: &Path, lines: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<std::fs::DirEntry> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            read_sysctls(&path, lines);
        } else if !VOLATILE_SYSCTLS.iter().any(|v| entry.file_name() == *v)
            && let Ok(value) = std::fs::read_to_string(&path)
        {
            lines.push(format!("{}={}", path.display(), value.trim_end()));
        }
    }
}

/// Every file and directory under `root` (except `skip`), with the content of files.
fn tree(root: &Path, skip: &[&Path]) -> Result<Vec<String>> {
    fn walk(dir: &Path, root: &Path, skip: &[&Path], out: &mut Vec<String>) -> Result<()> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("read {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for path in entries {
            if skip.contains(&path.as_path()) {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap_or(&path).display();
            let meta = std::fs::symlink_metadata(&path)?;
            if meta.is_dir() {
                out.push(format!("{rel}/"));
                walk(&path, root, skip, out)?;
            } else {
                let content = std::fs::read(&path).unwrap_or_default();
                let text = String::from_utf8_lossy(&content);
                out.push(format!(
                    "{rel}: {}",
                    shorten(&text, 2000).replace('\n', " ")
                ));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, root, skip, &mut out)?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Judging one execution

/// What a clean execution printed.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// Exit status 0 and the result (ADD, VERSION) or `None` (nothing printed).
    Worked(Option<Value>),
    /// Exit status 1 and this error object.
    Failed { code: u64, msg: String },
}

impl Verdict {
    fn worked(&self) -> bool {
        matches!(self, Verdict::Worked(_))
    }

    fn code(&self) -> Option<u64> {
        match self {
            Verdict::Failed { code, .. } => Some(*code),
            Verdict::Worked(_) => None,
        }
    }

    /// `ok` or the code, for the outcome tallies.
    fn short(&self) -> String {
        match self {
            Verdict::Failed { code, .. } => code.to_string(),
            Verdict::Worked(_) => "ok".to_owned(),
        }
    }
}

/// Checks that an execution of `verb` ended cleanly: no signal, no panic, exit 0 with a result
/// (ADD, VERSION) or nothing (the other verbs), or exit 1 with exactly one error object.
fn judge(out: &Ran, verb: &str) -> Result<Verdict> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    for sign in ["panicked at", "stack overflow", "RUST_BACKTRACE"] {
        ensure!(
            !stderr.contains(sign),
            "panic on stderr: {}",
            shorten(&stderr, 4000)
        );
    }
    if let Some(signal) = out.status.signal() {
        bail!("killed by signal {signal} (a panic aborts with SIGABRT = 6)");
    }
    let doc = || -> Result<Value> {
        serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "stdout is not exactly one JSON document: {:?}",
                shorten(&String::from_utf8_lossy(&out.stdout), 2000)
            )
        })
    };
    match out.status.code() {
        Some(0) if matches!(verb, "ADD" | "VERSION") => {
            let result = doc()?;
            ensure!(
                result.get("cniVersion").is_some_and(Value::is_string),
                "{verb} result has no string cniVersion: {}",
                shorten(&result.to_string(), 2000)
            );
            Ok(Verdict::Worked(Some(result)))
        }
        Some(0) => {
            ensure!(
                out.stdout.is_empty(),
                "{verb} succeeded but printed {:?}",
                shorten(&String::from_utf8_lossy(&out.stdout), 2000)
            );
            Ok(Verdict::Worked(None))
        }
        Some(1) => {
            let err = doc()?;
            let obj = err
                .as_object()
                .with_context(|| format!("error is not a JSON object: {err}"))?;
            for key in obj.keys() {
                ensure!(
                    matches!(key.as_str(), "cniVersion" | "code" | "msg" | "details"),
                    "unexpected key {key:?} in the error object {err}"
                );
            }
            ensure!(
                obj.get("cniVersion").is_some_and(Value::is_string),
                "error object without a string cniVersion: {err}"
            );
            let code = obj
                .get("code")
                .and_then(Value::as_u64)
                .with_context(|| format!("error object without an integer code: {err}"))?;
            ensure!(
                DOCUMENTED_CODES.contains(&code),
                "code {code} is not one the plugins document: {err}"
            );
            let msg = obj
                .get("msg")
                .and_then(Value::as_str)
                .filter(|m| !m.is_empty())
                .with_context(|| format!("error object without a msg: {err}"))?;
            ensure!(
                obj.get("details").is_none_or(Value::is_string),
                "details is not a string: {err}"
            );
            Ok(Verdict::Failed {
                code,
                msg: msg.to_owned(),
            })
        }
        other => bail!("exit status {other:?}, neither 0 nor 1"),
    }
}

fn output_text(out: &Ran) -> String {
    format!(
        "{}; stdout {:?}; stderr {:?}",
        out.status,
        shorten(&String::from_utf8_lossy(&out.stdout), 3000),
        shorten(&String::from_utf8_lossy(&out.stderr), 3000)
    )
}

/// `s` cut to about `max` bytes (at a character boundary), saying how long it was.
fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &s[..end], s.len())
}

/// Runs one call and judges it; the error names the call completely.
fn call(fx: &Fixture, plugin: Plugin, env: &Env, stdin: &[u8]) -> Result<Verdict> {
    let verb = env.get("CNI_COMMAND").unwrap_or("");
    let describe = || {
        format!(
            "{} {verb}\nenv: {env}\nstdin: {}",
            plugin.name(),
            shorten(&String::from_utf8_lossy(stdin), 6000)
        )
    };
    let out = fx
        .exec(plugin, env, stdin)
        .with_context(|| format!("harness failure running {}", describe()))?;
    judge(&out, verb).with_context(|| format!("{}\noutput: {}", describe(), output_text(&out)))
}

// ---------------------------------------------------------------------------------------------
// Generated cases

/// A value put into the config.
#[derive(Clone)]
enum Junk {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    /// A long string: `count` times `unit`.
    Repeat(&'static str, usize),
    /// JSON text a `Value` cannot hold (`1e400`, 2^64, `-0`), spliced into the serialised
    /// config.
    Raw(&'static str),
    Array(Vec<Junk>),
    Object(Vec<(String, Junk)>),
    /// `depth` nested arrays around `1`.
    Nested(usize),
}

impl fmt::Debug for Junk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Junk::Null => write!(f, "null"),
            Junk::Bool(b) => write!(f, "{b}"),
            Junk::Int(n) => write!(f, "{n}"),
            Junk::UInt(n) => write!(f, "{n}u"),
            Junk::Float(x) => write!(f, "{x:?}f"),
            Junk::Str(s) => write!(f, "{s:?}"),
            Junk::Repeat(unit, n) => write!(f, "{unit:?}×{n}"),
            Junk::Raw(text) => write!(f, "raw({text})"),
            Junk::Array(items) => f.debug_list().entries(items).finish(),
            Junk::Object(entries) => f
                .debug_map()
                .entries(entries.iter().map(|(k, v)| (k, v)))
                .finish(),
            Junk::Nested(depth) => write!(f, "nested[{depth}]"),
        }
    }
}

/// Marks where raw text goes: a string no generated value contains.
const RAW_MARK: &str = "\u{1}raw\u{1}";

impl Junk {
    /// The value; raw text becomes a marker string replaced after serialisation.
    fn to_value(&self, raws: &mut Vec<String>) -> Value {
        match self {
            Junk::Null => Value::Null,
            Junk::Bool(b) => json!(b),
            Junk::Int(n) => json!(n),
            Junk::UInt(n) => json!(n),
            Junk::Float(x) => serde_json::Number::from_f64(*x).map_or(Value::Null, Value::Number),
            Junk::Str(s) => json!(s),
            Junk::Repeat(unit, n) => json!(unit.repeat(*n)),
            Junk::Raw(text) => {
                raws.push((*text).to_owned());
                json!(format!("{RAW_MARK}{}", raws.len() - 1))
            }
            Junk::Array(items) => Value::Array(items.iter().map(|j| j.to_value(raws)).collect()),
            Junk::Object(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_value(raws)))
                    .collect(),
            ),
            // As text: a `Value` this deep would overflow the test's own stack (serde_json
            // recurses to print and drop it).
            Junk::Nested(depth) => {
                raws.push(format!("{}1{}", "[".repeat(*depth), "]".repeat(*depth)));
                json!(format!("{RAW_MARK}{}", raws.len() - 1))
            }
        }
    }
}

/// Numbers at and around every limit the plugins have: ports, MTUs, bits, tables, u32, i64.
const NUMBERS: [i64; 26] = [
    0,
    -1,
    1,
    7,
    8,
    13,
    31,
    32,
    67,
    68,
    100,
    253,
    254,
    255,
    1500,
    65_535,
    65_536,
    70_000,
    2_147_483_647,
    2_147_483_648,
    4_294_967_295,
    4_294_967_296,
    4_294_968_696, // 2^32 + 1400: an MTU that wraps to 1400 in a careless u32 cast
    9_007_199_254_740_993,
    i64::MAX,
    i64::MIN,
];

const FLOATS: [f64; 9] = [
    0.5,
    1.5,
    -1.5,
    1400.0,
    8080.0,
    1e308,
    -1e308,
    1e-300,
    18_446_744_073_709_551_616.0,
];

const RAWS: [&str; 7] = [
    "1e400",
    "-0",
    "18446744073709551616",
    "-9223372036854775809",
    "123456789012345678901234567890",
    "1.0e2",
    "-0.0",
];

/// Strings aimed at what the plugins parse: names, paths, addresses, MACs, protocols.
const STRINGS: [&str; 58] = [
    "",
    " ",
    "a",
    "-1",
    "1.5",
    "80",
    "true",
    "null",
    "IFNAME",
    "lo",
    "eth0",
    HOST_VETH,
    "../../etc/passwd",
    "a/b",
    "eth0/../lo",
    "net/../../kernel/hostname",
    "net.ipv4.conf.IFNAME.../../../../kernel/hostname",
    "net.ipv4.conf.all.forwarding",
    "net.ipv4.ip_forward",
    "net.core.somaxconn",
    "kernel.hostname",
    "net.ipv4.conf.IFNAME.rp_filter",
    "é",
    "\u{202e}evil",
    "\0",
    "\n",
    "💥",
    "tcp",
    "udp",
    "sctp",
    "TCP",
    "icmp",
    "nftables",
    "iptables",
    "firewalld",
    "same-bridge",
    "isolated",
    "zz:zz:zz:zz:zz:zz",
    "02:11:22:33:44",
    "02:11:22:33:44:55:66",
    "02:11:22:33:44:55:66:77",
    "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01",
    "01:00:5e:00:00:01",
    "00:00:00:00:00:00",
    "ff:ff:ff:ff:ff:ff",
    "10.77.0.300/24",
    "10.77.0.2/33",
    "::/129",
    "10.77.0.2",
    "fd77::2/64",
    "0.0.0.0/0",
    "::",
    "10.0.0.5/24",
    " 10.77.0.1",
    "1.2.3.4/24 junk",
    "CNI-FORWARD",
    "-j ACCEPT",
    "ip saddr 1.2.3.4 accept; flush ruleset",
];

/// Object keys inserted by mutations: the plugins' keys in other spellings, and noise.
const KEYS: [&str; 14] = [
    "mtu",
    "MTU",
    "Mac",
    "cniVersion",
    "CNIVersion",
    "name",
    "prevResult",
    "portMappings",
    "bandwidth",
    "sysctl",
    "net.ipv4.conf.IFNAME.arp_filter",
    "hostPort",
    "ingressRate",
    "x",
];

fn junk_leaf() -> impl Strategy<Value = Junk> {
    prop_oneof![
        1 => Just(Junk::Null),
        1 => any::<bool>().prop_map(Junk::Bool),
        4 => proptest::sample::select(&NUMBERS[..]).prop_map(Junk::Int),
        1 => any::<i64>().prop_map(Junk::Int),
        1 => any::<u64>().prop_map(Junk::UInt),
        2 => proptest::sample::select(&FLOATS[..]).prop_map(Junk::Float),
        1 => proptest::sample::select(&RAWS[..]).prop_map(Junk::Raw),
        5 => proptest::sample::select(&STRINGS[..]).prop_map(|s| Junk::Str(s.to_owned())),
        1 => "\\PC{0,24}".prop_map(Junk::Str),
        1 => (proptest::sample::select(&["a", "é", "../", "0"][..]), 200usize..70_000)
            .prop_map(|(u, n)| Junk::Repeat(u, n)),
        1 => proptest::sample::select(&[130usize, 5_000][..]).prop_map(Junk::Nested),
    ]
}

fn junk() -> impl Strategy<Value = Junk> {
    junk_leaf().prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Junk::Array),
            proptest::collection::vec(
                (
                    proptest::sample::select(&KEYS[..]).prop_map(str::to_owned),
                    inner
                ),
                0..3
            )
            .prop_map(Junk::Object),
        ]
    })
}

/// Where a mutation applies.
#[derive(Debug, Clone)]
enum Target {
    /// Any node of the config (root excluded), picked from all of them.
    Any(Index),
    /// One of the plugin's or the envelope's known paths, created when missing.
    Known(Index),
}

/// One change to the config.
#[derive(Debug, Clone)]
enum Mutation {
    Remove(Target),
    Replace(Target, Junk),
    /// A new key (or array element) inside the node at the target.
    Insert(Target, &'static str, Junk),
}

/// A change to the serialised config.
#[derive(Debug, Clone)]
enum TextMutation {
    Truncate(Index),
    InsertBytes(Index, &'static [u8]),
    /// The sysctl object's first key once more (tuning refuses duplicated sysctl keys).
    DuplicateKey,
}

const BYTES: [&[u8]; 6] = [b"\xff", b"\0", b"}", b"{\"", b",", b"\"\\u"];

/// A change to the environment.
#[derive(Debug, Clone)]
enum EnvMutation {
    Set(&'static str, EnvValue),
    Unset(&'static str),
}

#[derive(Debug, Clone)]
enum EnvValue {
    Text(&'static str),
    Repeat(&'static str, usize),
    /// A path in the fixture: the scratch dir, a regular file there, the host namespace.
    Scratch,
    RegularFile,
    HostNetns,
}

const ENV_KEYS: [&str; 6] = [
    "CNI_IFNAME",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_ARGS",
    "CNI_PATH",
    "CNI_NETNS_OVERRIDE",
];

const ENV_TEXTS: [&str; 27] = [
    "",
    "lo",
    HOST_VETH,
    "nonexist0",
    "eth0.100",
    "a/b",
    "..",
    "sixteen-chars-xx",
    "eth 0",
    "é",
    "-leading-dash",
    "has;semicolon",
    "/nonexistent/netns",
    "/proc/self/ns/net",
    "IgnoreUnknown=1",
    "IgnoreUnknown=1;MAC=02:00:00:00:00:01",
    "MAC=zz",
    "IgnoreUnknown=1;MAC=02:11:22:33:44",
    "a",
    "=",
    ";",
    "K8S_POD_NAME=web",
    "IgnoreUnknown=maybe",
    "IgnoreUnknown=1;K8S_POD_NAME=web;",
    "::::",
    "1",
    "true",
];

fn env_mutation() -> impl Strategy<Value = EnvMutation> {
    let key = proptest::sample::select(&ENV_KEYS[..]);
    prop_oneof![
        6 => (key.clone(), proptest::sample::select(&ENV_TEXTS[..]))
            .prop_map(|(k, v)| EnvMutation::Set(k, EnvValue::Text(v))),
        1 => (key.clone(), proptest::sample::select(&["a", "x=y;"][..]), 16usize..2000)
            .prop_map(|(k, u, n)| EnvMutation::Set(k, EnvValue::Repeat(u, n))),
        1 => Just(EnvMutation::Set("CNI_NETNS", EnvValue::Scratch)),
        1 => Just(EnvMutation::Set("CNI_NETNS", EnvValue::RegularFile)),
        1 => Just(EnvMutation::Set("CNI_NETNS", EnvValue::HostNetns)),
        2 => key.prop_map(EnvMutation::Unset),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let target = prop_oneof![
        any::<Index>().prop_map(Target::Any),
        any::<Index>().prop_map(Target::Known),
    ];
    prop_oneof![
        2 => target.clone().prop_map(Mutation::Remove),
        6 => (target.clone(), junk()).prop_map(|(t, j)| Mutation::Replace(t, j)),
        1 => (target, proptest::sample::select(&KEYS[..]), junk())
            .prop_map(|(t, k, j)| Mutation::Insert(t, k, j)),
    ]
}

fn text_mutation() -> impl Strategy<Value = TextMutation> {
    prop_oneof![
        any::<Index>().prop_map(TextMutation::Truncate),
        (any::<Index>(), proptest::sample::select(&BYTES[..]))
            .prop_map(|(i, b)| TextMutation::InsertBytes(i, b)),
        Just(TextMutation::DuplicateKey),
    ]
}

/// One generated case.
#[derive(Debug, Clone)]
struct Case {
    version: &'static str,
    verb: &'static str,
    variant: usize,
    mutations: Vec<Mutation>,
    text: Option<TextMutation>,
    env: Vec<EnvMutation>,
}

fn case(plugin: Plugin) -> impl Strategy<Value = Case> {
    let verb = prop_oneof![
        14 => Just("ADD"),
        3 => Just("DEL"),
        2 => Just("CHECK"),
        1 => Just("STATUS"),
        1 => Just("GC"),
    ];
    let version = prop_oneof![
        9 => proptest::sample::select(plugin.versions()),
        1 => proptest::sample::select(&ALL_VERSIONS[..]),
    ];
    (
        version,
        verb,
        0usize..3,
        proptest::collection::vec(mutation(), 0..4),
        proptest::option::weighted(0.05, text_mutation()),
        proptest::collection::vec(env_mutation(), 0..2),
        proptest::bool::weighted(0.6),
    )
        .prop_map(
            |(version, verb, variant, mutations, text, env, env_kept)| Case {
                version,
                verb,
                variant,
                mutations,
                text,
                env: if env_kept { Vec::new() } else { env },
            },
        )
}

/// All JSON pointers of `value`'s nodes below the root.
fn pointers(value: &Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let p = format!("{prefix}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(v, &p, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let p = format!("{prefix}/{i}");
                out.push(p.clone());
                pointers(v, &p, out);
            }
        }
        _ => {}
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// The node at `pointer`, created (objects, or arrays for numeric tokens) when missing.
fn ensure_node<'a>(root: &'a mut Value, pointer: &str) -> &'a mut Value {
    let mut node = root;
    for token in pointer.split('/').skip(1) {
        let key = unescape(token);
        if !node.is_object() && !node.is_array() {
            *node = if key.parse::<usize>().is_ok() {
                json!([])
            } else {
                json!({})
            };
        }
        node = match node {
            Value::Array(items) => {
                let i = key.parse::<usize>().unwrap_or(items.len());
                if i >= items.len() {
                    items.push(Value::Null);
                    let last = items.len() - 1;
                    &mut items[last]
                } else {
                    &mut items[i]
                }
            }
            Value::Object(map) => map.entry(key).or_insert(Value::Null),
            _ => unreachable_node(),
        };
    }
    node
}

/// `ensure_node` makes every node an object or an array before indexing it.
fn unreachable_node() -> ! {
    panic!("a scalar node was indexed")
}

fn remove_node(root: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let key = unescape(last);
    match root.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.shift_remove(&key);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = key.parse::<usize>()
                && i < items.len()
            {
                items.remove(i);
            }
        }
        _ => {}
    }
}

/// Values tuning's `dataDir` may take: it is a directory the plugin writes into, so junk
/// strings (`/`, `../..`) would write outside the test's files.
fn safe_data_dir(fx: &Fixture, junk: &Junk) -> Value {
    match junk {
        Junk::Str(_) | Junk::Repeat(..) | Junk::Raw(_) => {
            json!(fx.scratch().join("tuning").join("sub dir é"))
        }
        Junk::Bool(b) => json!(b),
        Junk::Int(n) => json!(n),
        _ => Value::Null,
    }
}

impl Case {
    /// The stdin and environment of the case.
    fn build(&self, fx: &Fixture, plugin: Plugin) -> (Vec<u8>, Env) {
        let mut conf = fx.config(plugin, self.variant, self.version);
        let mut raws = Vec::new();
        for m in &self.mutations {
            let target = match m {
                Mutation::Remove(t) | Mutation::Replace(t, _) | Mutation::Insert(t, ..) => t,
            };
            let pointer = match target {
                Target::Any(i) => {
                    let mut all = Vec::new();
                    pointers(&conf, "", &mut all);
                    if all.is_empty() {
                        continue;
                    }
                    all[i.index(all.len())].clone()
                }
                Target::Known(i) => {
                    let known: Vec<&str> = COMMON_PATHS
                        .iter()
                        .chain(plugin.known_paths())
                        .copied()
                        .collect();
                    known[i.index(known.len())].to_owned()
                }
            };
            let protected = pointer == "/dataDir" || pointer.starts_with("/dataDir/");
            match m {
                Mutation::Remove(_) => remove_node(&mut conf, &pointer),
                Mutation::Replace(_, junk) if protected => {
                    *ensure_node(&mut conf, &pointer) = safe_data_dir(fx, junk);
                }
                Mutation::Replace(_, junk) => {
                    *ensure_node(&mut conf, &pointer) = junk.to_value(&mut raws);
                }
                Mutation::Insert(..) if protected => {}
                Mutation::Insert(_, key, junk) => {
                    let value = junk.to_value(&mut raws);
                    match ensure_node(&mut conf, &pointer) {
                        Value::Object(map) => {
                            map.insert((*key).to_owned(), value);
                        }
                        Value::Array(items) => items.push(value),
                        scalar => *scalar = json!({ *key: value }),
                    }
                }
            }
        }
        let mut text = conf.to_string();
        for (i, raw) in raws.iter().enumerate() {
            let mark = serde_json::to_string(&format!("{RAW_MARK}{i}")).unwrap_or_default();
            text = text.replacen(&mark, raw, 1);
        }
        let mut stdin = text.into_bytes();
        match &self.text {
            None => {}
            Some(TextMutation::Truncate(i)) => stdin.truncate(i.index(stdin.len().max(1))),
            Some(TextMutation::InsertBytes(i, bytes)) => {
                let at = i.index(stdin.len() + 1);
                stdin.splice(at..at, bytes.iter().copied());
            }
            Some(TextMutation::DuplicateKey) => {
                let text = String::from_utf8_lossy(&stdin).into_owned();
                if let Some(at) = text.find("\"sysctl\":{") {
                    let start = at + "\"sysctl\":{".len();
                    let rest = &text[start..];
                    if let Some(end) = rest.find(',').or_else(|| rest.find('}')) {
                        let entry = &rest[..end];
                        if !entry.is_empty() {
                            stdin = format!("{}{entry},{rest}", &text[..start]).into_bytes();
                        }
                    }
                }
            }
        }
        let mut env = fx.env(self.verb);
        for m in &self.env {
            match m {
                EnvMutation::Unset(key) => env.unset(key),
                EnvMutation::Set(key, value) => {
                    let value = match value {
                        EnvValue::Text(t) => (*t).to_owned(),
                        EnvValue::Repeat(u, n) => u.repeat(*n),
                        EnvValue::Scratch => fx.scratch().to_string_lossy().into_owned(),
                        EnvValue::RegularFile => fx
                            .scratch()
                            .join("not-a-netns")
                            .to_string_lossy()
                            .into_owned(),
                        EnvValue::HostNetns => fx.host.path().to_string_lossy().into_owned(),
                    };
                    // With the override, the host's own namespace would be a valid target:
                    // the runtime decides that, never a config; keep the guard on.
                    if *key == "CNI_NETNS_OVERRIDE" && is_truthy(&value) {
                        continue;
                    }
                    env.set(key, &value);
                }
            }
        }
        (stdin, env)
    }
}

fn is_truthy(s: &str) -> bool {
    s == "1" || s.eq_ignore_ascii_case("true")
}

/// The verbs a runtime sends after an ADD that worked, with the same config.
fn follow_up(version: &str) -> &'static [&'static str] {
    if matches!(version, "0.1.0" | "0.2.0" | "0.3.0" | "0.3.1") {
        &["DEL"]
    } else {
        &["CHECK", "DEL"]
    }
}

/// The cases of one property test: `HOSTILE_CASES`, else a count that keeps this file near a
/// minute on a 2-core machine (a case costs one or a few execs and one snapshot).
fn case_count() -> u32 {
    std::env::var("HOSTILE_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

const DEFAULT_CASES: u32 = 120;

/// The seed: `HOSTILE_SEED`, else fixed, so CI runs the same cases every time.
fn seed() -> u64 {
    std::env::var("HOSTILE_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0x00c0_ffee)
}

/// Input refusals by code: version (1), environment (4), decoding (6). The skel and the
/// config decoders give them before a plugin acts, so the state after such cases is compared
/// [`BATCH`] at a time; after every other case (a refusal while acting, or an ADD that worked
/// and its CHECK and DEL) it is compared at once.
const EARLY_CODES: [u64; 3] = [1, 4, 6];

/// How many early refusals share one state comparison.
const BATCH: usize = 8;

/// The state of a property test between cases.
struct Fuzz {
    /// The state every case must leave.
    baseline: Snapshot,
    /// Early refusals not compared yet, described.
    pending: Vec<String>,
    /// Outcome tallies (`ADD 6`, `ADD ok, CHECK ok, DEL ok`, …), printed at the end.
    counts: BTreeMap<String, u32>,
}

impl Fuzz {
    /// Compares the state with the baseline on behalf of the pending cases and `current`.
    fn compare(&mut self, fx: &Fixture, current: Option<String>) -> Result<()> {
        let after = fx.snapshot()?;
        let diff = self.baseline.diff(&after);
        let blamed: Vec<String> = self.pending.drain(..).chain(current).collect();
        if diff.is_empty() {
            return Ok(());
        }
        // Later (shrunk) cases compare with the state these left.
        self.baseline = after;
        bail!(
            "the kernel or the plugin files changed:\n{diff}\nafter {} case(s):\n\n{}",
            blamed.len(),
            blamed.join("\n\n")
        )
    }
}

/// Runs the generated cases of `plugin`; panics with the (shrunk) failing case.
fn fuzz(plugin: Plugin) {
    let outcome = Fixture::new().and_then(|fx| {
        with_private_run(&[&fx.host, &fx.container], || {
            let state = RefCell::new(Fuzz {
                baseline: fx.warm_up(&[plugin])?,
                pending: Vec::new(),
                counts: BTreeMap::new(),
            });
            let config = ProptestConfig {
                cases: case_count(),
                failure_persistence: None,
                rng_seed: RngSeed::Fixed(seed()),
                max_shrink_iters: 100,
                ..ProptestConfig::default()
            };
            let mut runner = TestRunner::new(config);
            let result = runner.run(&case(plugin), |case| {
                run_case(&fx, plugin, &case, &mut state.borrow_mut())
                    .map_err(|e| TestCaseError::fail(format!("{e:#}")))
            });
            let mut state = state.into_inner();
            eprintln!(
                "{}: {} cases (seed {}), outcomes {:?}",
                plugin.name(),
                case_count(),
                seed(),
                state.counts
            );
            let rerun = format!(
                "seed {}; rerun with HOSTILE_SEED={} cargo test -p tests --test hostile {}",
                seed(),
                seed(),
                plugin.name()
            );
            result.map_err(|e| anyhow!("{}: {e}\n({rerun})", plugin.name()))?;
            state
                .compare(&fx, None)
                .with_context(|| format!("{} ({rerun})", plugin.name()))
        })
    });
    if let Err(e) = outcome {
        panic!("{e:#}");
    }
}

/// One case: its verb (and after an ADD that worked, CHECK and DEL), each clean; then the
/// state must be the baseline.
fn run_case(fx: &Fixture, plugin: Plugin, case: &Case, state: &mut Fuzz) -> Result<()> {
    let (stdin, env) = case.build(fx, plugin);
    let describe = |verdict: &Verdict| {
        format!(
            "{} {} ({verdict:?})\nenv: {env}\nstdin: {}",
            plugin.name(),
            case.verb,
            shorten(&String::from_utf8_lossy(&stdin), 6000)
        )
    };
    let verdict = call(fx, plugin, &env, &stdin)?;
    let mut tally = format!("{} {}", case.verb, verdict.short());
    if case.verb == "ADD" && verdict.worked() {
        for verb in follow_up(case.version) {
            let mut env = env.clone();
            env.set("CNI_COMMAND", verb);
            let v = call(fx, plugin, &env, &stdin)
                .with_context(|| format!("{verb} after an ADD that worked"))?;
            ensure!(
                v.worked() || *verb != "DEL",
                "DEL with the input of an ADD that worked failed: {v:?}\n{}",
                describe(&verdict)
            );
            tally.push_str(&format!(", {verb} {}", v.short()));
        }
    }
    *state.counts.entry(tally).or_default() += 1;
    if verdict.code().is_some_and(|c| EARLY_CODES.contains(&c)) && state.pending.len() + 1 < BATCH {
        state.pending.push(describe(&verdict));
        return Ok(());
    }
    state.compare(fx, Some(describe(&verdict)))
}

#[test]
fn portmap_survives_generated_hostile_input() {
    fuzz(Plugin::Portmap);
}

#[test]
fn tuning_survives_generated_hostile_input() {
    fuzz(Plugin::Tuning);
}

#[test]
fn bandwidth_survives_generated_hostile_input() {
    fuzz(Plugin::Bandwidth);
}

#[test]
fn firewall_survives_generated_hostile_input() {
    fuzz(Plugin::Firewall);
}

#[test]
fn sbr_survives_generated_hostile_input() {
    fuzz(Plugin::Sbr);
}

// ---------------------------------------------------------------------------------------------
// Hand-picked hostile values

/// What a hostile call may do.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Fail with one of these codes.
    Refused(&'static [u64]),
    /// Fail with one of these codes, or work; then CHECK (which may find the kernel holding
    /// something else than configured, as the reference's does) ends cleanly and DEL works.
    WorksOrRefused(&'static [u64]),
    /// Work; then CHECK and DEL work too.
    Works,
}

/// One hand-picked hostile call.
struct Hostile {
    what: String,
    plugin: Plugin,
    stdin: Stdin,
    env: Env,
    expect: Expect,
}

/// A case's stdin: bytes, or made when the case runs (ten megabytes each would otherwise all
/// sit in memory together).
enum Stdin {
    Bytes(Vec<u8>),
    Made(Box<dyn Fn() -> Vec<u8> + Send + Sync>),
}

impl Stdin {
    fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            Stdin::Bytes(b) => std::borrow::Cow::Borrowed(b),
            Stdin::Made(make) => std::borrow::Cow::Owned(make()),
        }
    }
}

impl Hostile {
    /// `plugin`'s ADD of `conf` (a full config) with the normal environment.
    fn add(
        fx: &Fixture,
        what: impl Into<String>,
        plugin: Plugin,
        conf: &Value,
        expect: Expect,
    ) -> Hostile {
        Hostile {
            what: what.into(),
            plugin,
            stdin: Stdin::Bytes(conf.to_string().into_bytes()),
            env: fx.env("ADD"),
            expect,
        }
    }

    fn with_env(mut self, key: &str, value: &str) -> Hostile {
        self.env.set(key, value);
        self
    }

    fn verb(&self) -> &str {
        self.env.get("CNI_COMMAND").unwrap_or("")
    }
}

/// `conf` with `value` at `pointer` (created when missing).
fn with(conf: &Value, pointer: &str, value: Value) -> Value {
    let mut conf = conf.clone();
    *ensure_node(&mut conf, pointer) = value;
    conf
}

/// `conf` serialised with the JSON text `raw` at `pointer` (numbers a `Value` cannot hold).
fn with_raw(conf: &Value, pointer: &str, raw: &str) -> Vec<u8> {
    let marked = with(conf, pointer, json!(RAW_MARK));
    let mark = serde_json::to_string(RAW_MARK).unwrap_or_default();
    marked.to_string().replacen(&mark, raw, 1).into_bytes()
}

/// Runs every case of `cases` (built once the private `/run` is in place) after a warm-up of
/// the plugins they use, each judged, with the state compared to the warm baseline after each
/// ADD; fails listing every case that broke the rules.
fn run_hostile(build: impl FnOnce(&Fixture) -> Result<Vec<Hostile>> + Send) {
    let outcome = Fixture::new().and_then(|fx| {
        with_private_run(&[&fx.host, &fx.container], || {
            let cases = build(&fx)?;
            let mut plugins: Vec<Plugin> = cases.iter().map(|c| c.plugin).collect();
            plugins.dedup();
            plugins.sort_by_key(|p| p.name());
            plugins.dedup();
            let mut baseline = fx.warm_up(&plugins)?;
            let mut failures = Vec::new();
            for case in &cases {
                if let Err(e) = run_one(&fx, case, &mut baseline) {
                    failures.push(format!(
                        "{} ({} {}): {e:#}",
                        case.what,
                        case.plugin.name(),
                        case.verb()
                    ));
                }
            }
            // DEL with each input after its ADD, as a runtime does after a failed ADD: clean, and
            // together changing nothing either.
            // (Not the made ones: ten megabytes each, and their DEL already ran.)
            for case in cases.iter().filter(|c| c.verb() == "ADD") {
                let Stdin::Bytes(stdin) = &case.stdin else {
                    continue;
                };
                let mut env = case.env.clone();
                env.set("CNI_COMMAND", "DEL");
                if let Err(e) = call(&fx, case.plugin, &env, stdin) {
                    failures.push(format!("{} ({} DEL): {e:#}", case.what, case.plugin.name()));
                }
            }
            let diff = baseline.diff(&fx.snapshot()?);
            if !diff.is_empty() {
                failures.push(format!(
                    "the DELs after the hostile ADDs changed the state:\n{diff}"
                ));
            }
            eprintln!("{} hostile cases", cases.len());
            ensure!(
                failures.is_empty(),
                "{} of {} cases broke the rules:\n\n{}",
                failures.len(),
                cases.len(),
                failures.join("\n\n")
            );
            Ok(())
        })
    });
    if let Err(e) = outcome {
        panic!("{e:#}");
    }
}

/// Runs `case`, then the follow-ups of an ADD that worked; the state must then be `baseline`
/// (which becomes the state found, so one failure does not spill into the next cases).
fn run_one(fx: &Fixture, case: &Hostile, baseline: &mut Snapshot) -> Result<()> {
    let stdin = case.stdin.bytes();
    let verdict = call(fx, case.plugin, &case.env, &stdin)?;
    let mut problems = Vec::new();
    match (case.expect, &verdict) {
        (Expect::Refused(codes) | Expect::WorksOrRefused(codes), Verdict::Failed { code, msg }) => {
            if !codes.contains(code) {
                problems.push(format!("code {code} ({msg}), expected one of {codes:?}"));
            }
        }
        (Expect::Works, Verdict::Failed { code, msg }) => {
            problems.push(format!("refused with code {code}: {msg}"));
        }
        (expect, Verdict::Worked(_)) => {
            if matches!(expect, Expect::Refused(_)) {
                problems.push("accepted".to_owned());
            }
            if case.verb() == "ADD" {
                // Made inputs are the ten-megabyte ones: DEL alone, each call parses them.
                let follow: &[&str] = match &case.stdin {
                    Stdin::Made(_) => &["DEL"],
                    Stdin::Bytes(bytes) => follow_up(
                        serde_json::from_slice::<Value>(bytes)
                            .ok()
                            .and_then(|c| c["cniVersion"].as_str().map(str::to_owned))
                            .as_deref()
                            .unwrap_or_default(),
                    ),
                };
                // Also after an ADD that should have failed: what it did must go again.
                for verb in follow {
                    let mut env = case.env.clone();
                    env.set("CNI_COMMAND", verb);
                    let v = call(fx, case.plugin, &env, &stdin)?;
                    if !v.worked() && (*verb == "DEL" || matches!(expect, Expect::Works)) {
                        problems.push(format!("ADD worked but {verb} failed: {v:?}"));
                    }
                }
            }
        }
    }
    let after = fx.snapshot()?;
    let diff = baseline.diff(&after);
    if !diff.is_empty() {
        problems.push(format!("{verdict:?} and the state changed:\n{diff}"));
        *baseline = after;
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// Config errors: decoding (6) or validation (7).
const CONFIG_CODES: &[u64] = &[6, 7];

#[test]
fn sysctl_keys_climbing_out_of_proc_sys_net_are_refused() {
    run_hostile(|fx| {
        let canary = fx.scratch().join("canary");
        std::fs::write(&canary, "untouched")?;
        let canary = canary.to_string_lossy().into_owned();
        // Whatever a broken plugin wrote there would change nothing: the current hostname.
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")?
            .trim()
            .to_owned();
        let base = fx.config(Plugin::Tuning, 0, "1.0.0");
        let mut cases = Vec::new();
        for (key, value) in [
            ("net/../kernel/hostname".to_owned(), hostname.clone()),
            (
                "net.ipv4.conf.IFNAME.arp_ignore/../../../../../kernel/hostname".to_owned(),
                hostname.clone(),
            ),
            (
                "net/ipv4/conf/eth0/../../../../../../../../proc/sys/kernel/hostname".to_owned(),
                hostname.clone(),
            ),
            (
                "/proc/sys/net/../kernel/hostname".to_owned(),
                hostname.clone(),
            ),
            ("kernel.hostname".to_owned(), hostname.clone()),
            (format!("../../..{canary}"), "written".to_owned()),
            (format!("net/../../..{canary}"), "written".to_owned()),
            (
                format!("net/ipv4/../../../..{canary}"),
                "written".to_owned(),
            ),
            (
                format!("net/IFNAME/../../../..{canary}"),
                "written".to_owned(),
            ),
            ("net".to_owned(), "1".to_owned()),
            ("net/ipv4/conf/IFNAME".to_owned(), "1".to_owned()),
            (
                "net.ipv4.conf.IFNAME..arp_ignore".to_owned(),
                "1".to_owned(),
            ),
            ("".to_owned(), "1".to_owned()),
        ] {
            for (source, pointer) in [
                ("sysctl", "/sysctl"),
                ("args.cni.sysctl", "/args/cni/sysctl"),
            ] {
                let conf = with(&base, pointer, json!({ key.clone(): value.clone() }));
                cases.push(Hostile::add(
                    fx,
                    format!("{source} key {key:?}"),
                    Plugin::Tuning,
                    &conf,
                    Expect::Refused(&[7]),
                ));
            }
        }
        // Values that are not one line: refused, or written and then restored by DEL.
        for value in ["1\n0", "1\0", "2 junk", ""] {
            let conf = with(
                &base,
                "/sysctl",
                json!({"net.ipv4.conf.IFNAME.arp_ignore": value}),
            );
            cases.push(Hostile::add(
                fx,
                format!("sysctl value {value:?}"),
                Plugin::Tuning,
                &conf,
                Expect::WorksOrRefused(&[7, 999]),
            ));
        }
        Ok(cases)
    });
}

#[test]
fn interface_names_with_a_slash_are_refused_by_every_plugin() {
    run_hostile(|fx| {
        let mut cases = Vec::new();
        for plugin in PLUGINS {
            let conf = fx.config(plugin, 0, "1.0.0");
            for ifname in ["a/b", "../eth0", "/", ".."] {
                for verb in ["ADD", "CHECK", "DEL"] {
                    cases.push(
                        Hostile::add(
                            fx,
                            format!("CNI_IFNAME {ifname:?}"),
                            plugin,
                            &conf,
                            Expect::Refused(&[4]),
                        )
                        .with_env("CNI_COMMAND", verb)
                        .with_env("CNI_IFNAME", ifname),
                    );
                }
            }
            // Names with a slash in prevResult: never used as paths.
            for (pointer, name) in [
                ("/prevResult/interfaces/0/name", format!("../{HOST_VETH}")),
                ("/prevResult/interfaces/1/name", "eth0/../lo".to_owned()),
                // Another namespace than CNI_NETNS (a throwaway one: the snapshot shows
                // whether a plugin acted there).
                (
                    "/prevResult/interfaces/1/sandbox",
                    fx.host.path().to_string_lossy().into_owned(),
                ),
            ] {
                cases.push(Hostile::add(
                    fx,
                    format!("prevResult {pointer} {name:?}"),
                    plugin,
                    &with(&conf, pointer, json!(name)),
                    Expect::WorksOrRefused(&[6, 7, 999]),
                ));
            }
        }
        Ok(cases)
    });
}

#[test]
fn macs_of_the_wrong_length_are_refused() {
    run_hostile(|fx| {
        // mtu, sysctls and the rest of variant 0 come with each MAC: a refusal undoes them all.
        let base = fx.config(Plugin::Tuning, 0, "1.0.0");
        let mut cases = Vec::new();
        let wrong_length = [
            "02:11:22:33:44",
            "02:11:22:33:44:55:66",
            "02:11:22:33:44:55:66:77",
            "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01",
            "02:11:22:33:44:5",
            "02:11:22:33:44:555",
            "0211.2233.44",
            "02-11-22-33-44",
            "02:11:22:33:44:55:",
        ];
        // The right length, but no unicast address a veth takes.
        let unusable = [
            "01:00:5e:00:00:01",
            "00:00:00:00:00:00",
            "ff:ff:ff:ff:ff:ff",
        ];
        for (list, codes) in [
            (&wrong_length[..], &[7u64][..]),
            (&unusable[..], &[7, 999][..]),
        ] {
            let codes: &'static [u64] = if codes.len() == 1 { &[7] } else { &[7, 999] };
            for mac in list {
                cases.push(Hostile::add(
                    fx,
                    format!("mac {mac:?}"),
                    Plugin::Tuning,
                    &with(&base, "/mac", json!(mac)),
                    Expect::Refused(codes),
                ));
                let runtime = with(
                    &with(&base, "/capabilities", json!({"mac": true})),
                    "/runtimeConfig/mac",
                    json!(mac),
                );
                cases.push(Hostile::add(
                    fx,
                    format!("runtimeConfig.mac {mac:?}"),
                    Plugin::Tuning,
                    &runtime,
                    Expect::Refused(codes),
                ));
                cases.push(Hostile::add(
                    fx,
                    format!("args.cni.mac {mac:?}"),
                    Plugin::Tuning,
                    &with(&base, "/args/cni/mac", json!(mac)),
                    Expect::Refused(codes),
                ));
                cases.push(
                    Hostile::add(
                        fx,
                        format!("CNI_ARGS MAC={mac}"),
                        Plugin::Tuning,
                        &base,
                        Expect::Refused(codes),
                    )
                    .with_env("CNI_ARGS", &format!("IgnoreUnknown=1;MAC={mac}")),
                );
            }
        }
        Ok(cases)
    });
}

/// `(pointer, raw JSON number)` pairs, each refused with one of `codes`, for `plugin`'s
/// `variant`.
fn number_cases(
    fx: &Fixture,
    plugin: Plugin,
    variant: usize,
    numbers: &[(&str, &str)],
    expect: Expect,
) -> Vec<Hostile> {
    let base = fx.config(plugin, variant, "1.0.0");
    numbers
        .iter()
        .map(|(pointer, raw)| Hostile {
            what: format!("{pointer} = {raw}"),
            plugin,
            stdin: Stdin::Bytes(with_raw(&base, pointer, raw)),
            env: fx.env("ADD"),
            expect,
        })
        .collect()
}

/// Negative, fractional and out-of-range numbers, as decimal text, and ones that wrap to a
/// valid value in a careless cast (2^32 + a valid value).
#[test]
fn huge_negative_and_fractional_numbers_are_refused() {
    run_hostile(|fx| {
        let refused = Expect::Refused(CONFIG_CODES);
        let mut cases = Vec::new();
        let rates = ["-1", "1.5", "8000000.0", "18446744073709551616", "1e400"];
        for key in ["ingressRate", "ingressBurst", "egressRate", "egressBurst"] {
            let pairs: Vec<(String, &str)> =
                rates.iter().map(|r| (format!("/{key}"), *r)).collect();
            let pairs: Vec<(&str, &str)> = pairs.iter().map(|(p, r)| (p.as_str(), *r)).collect();
            cases.extend(number_cases(fx, Plugin::Bandwidth, 0, &pairs, refused));
            let runtime: Vec<(String, &str)> = rates
                .iter()
                .map(|r| (format!("/runtimeConfig/bandwidth/{key}"), *r))
                .collect();
            let runtime: Vec<(&str, &str)> =
                runtime.iter().map(|(p, r)| (p.as_str(), *r)).collect();
            cases.extend(number_cases(fx, Plugin::Bandwidth, 1, &runtime, refused));
        }
        cases.extend(number_cases(
            fx,
            Plugin::Bandwidth,
            0,
            &[
                // A burst of 4 GiB or more does not fit the kernel's 32-bit buffer.
                ("/ingressBurst", "34359738368"),
                ("/egressBurst", "18446744073709551615"),
                ("/latencyMs", "-1"),
                ("/latencyMs", "2.5"),
                ("/latencyMs", "1000000000000"),
            ],
            refused,
        ));
        // Extreme but well-formed rates: shaped (64-bit rates exist) or refused, never garbage.
        cases.extend(number_cases(
            fx,
            Plugin::Bandwidth,
            0,
            &[
                ("/ingressRate", "18446744073709551615"),
                ("/egressRate", "18446744073709551615"),
                ("/ingressRate", "1"),
                ("/egressRate", "7"),
            ],
            Expect::WorksOrRefused(&[7]),
        ));
        cases.extend(number_cases(
            fx,
            Plugin::Tuning,
            0,
            &[
                ("/mtu", "-1"),
                ("/mtu", "1.5"),
                ("/mtu", "1400.0"),
                ("/mtu", "67"),
                ("/mtu", "70000"),
                ("/mtu", "4294968696"),
                ("/mtu", "1e400"),
                ("/txQLen", "-1"),
                ("/txQLen", "1.5"),
                ("/txQLen", "4294967296"),
                ("/txQLen", "4294967796"),
                ("/txQLen", "9223372036854775807"),
                ("/txQLen", "18446744073709551616"),
                ("/args/cni/mtu", "-1"),
                ("/args/cni/mtu", "4294968696"),
                ("/args/cni/txQLen", "-5"),
            ],
            refused,
        ));
        for backend in [0, 1] {
            cases.extend(number_cases(
                fx,
                Plugin::Portmap,
                backend,
                &[
                    ("/runtimeConfig/portMappings/0/hostPort", "0"),
                    ("/runtimeConfig/portMappings/0/hostPort", "-1"),
                    ("/runtimeConfig/portMappings/0/hostPort", "65536"),
                    ("/runtimeConfig/portMappings/0/hostPort", "70000"),
                    ("/runtimeConfig/portMappings/0/hostPort", "1.5"),
                    ("/runtimeConfig/portMappings/0/hostPort", "8080.0"),
                    ("/runtimeConfig/portMappings/0/hostPort", "4294967376"),
                    ("/runtimeConfig/portMappings/0/hostPort", "1e400"),
                    ("/runtimeConfig/portMappings/1/containerPort", "0"),
                    ("/runtimeConfig/portMappings/1/containerPort", "-53"),
                    ("/runtimeConfig/portMappings/1/containerPort", "70000"),
                    ("/runtimeConfig/portMappings/1/containerPort", "4294967349"),
                    ("/markMasqBit", "32"),
                    ("/markMasqBit", "-1"),
                    ("/markMasqBit", "1.5"),
                    ("/markMasqBit", "4294967309"),
                ],
                refused,
            ));
        }
        cases.extend(number_cases(
            fx,
            Plugin::Sbr,
            1,
            &[
                ("/table", "0"),
                ("/table", "-1"),
                ("/table", "1.5"),
                ("/table", "253"),
                ("/table", "254"),
                ("/table", "255"),
                ("/table", "4294967296"),
                ("/table", "4294968296"),
                ("/table", "9223372036854775807"),
                ("/table", "1e400"),
            ],
            refused,
        ));
        // prevResult numbers: route priorities, tables, MTUs, interface indexes. Ignored or
        // refused, never wrapped into something else.
        for plugin in PLUGINS {
            cases.extend(number_cases(
                fx,
                plugin,
                0,
                &[
                    ("/prevResult/routes/0/priority", "-1"),
                    ("/prevResult/routes/0/priority", "1099511627776"),
                    ("/prevResult/routes/0/priority", "1.5"),
                    ("/prevResult/routes/0/table", "-5"),
                    ("/prevResult/routes/0/table", "4294967296"),
                    ("/prevResult/routes/0/mtu", "-1"),
                    ("/prevResult/routes/0/advmss", "1.5"),
                    ("/prevResult/routes/0/scope", "300"),
                    ("/prevResult/interfaces/1/mtu", "-1"),
                    ("/prevResult/ips/0/interface", "-1"),
                    ("/prevResult/ips/0/interface", "99"),
                    ("/prevResult/ips/0/interface", "1.5"),
                    ("/prevResult/ips/0/interface", "4294967297"),
                ],
                Expect::WorksOrRefused(CONFIG_CODES),
            ));
        }
        Ok(cases)
    });
}

/// What a name longer than the kernel's or the filesystem's limits gets: shortened (hashed)
/// names that work, or a clean refusal. Today portmap, firewall and tuning refuse with their
/// state-file error (the file name would exceed 255 bytes: 5 or 999) and bandwidth with the
/// kernel's refusal of its IFB alias (999); sbr, which names nothing, works.
const LONG_NAMES: Expect = Expect::WorksOrRefused(&[5, 7, 999]);

/// A container ID or network name of `len` characters the spec allows.
fn long_name(len: usize) -> String {
    "a1b2c3d4e5f6-_.".chars().cycle().take(len).collect()
}

#[test]
fn very_long_container_ids_and_network_names_work_or_fail_cleanly() {
    run_hostile(|fx| {
        let mut cases = Vec::new();
        for plugin in PLUGINS {
            for variant in 0..plugin.variants(fx.scratch()).len() {
                let conf = fx.config(plugin, variant, "1.0.0");
                let id = long_name(1000);
                cases.push(
                    Hostile::add(
                        fx,
                        format!("variant {variant}, 1000-character container ID"),
                        plugin,
                        &conf,
                        LONG_NAMES,
                    )
                    .with_env("CNI_CONTAINERID", &id),
                );
                cases.push(Hostile::add(
                    fx,
                    format!("variant {variant}, 1000-character network name"),
                    plugin,
                    &with(&conf, "/name", json!(long_name(1000))),
                    LONG_NAMES,
                ));
            }
        }
        Ok(cases)
    });
}

/// `depth` nested arrays (or objects) as JSON text.
fn nested(depth: usize, objects: bool) -> String {
    if objects {
        format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
    } else {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }
}

#[test]
fn nesting_is_accepted_to_go_s_limit_and_refused_past_it_without_a_stack_overflow() {
    // Go's decoder takes 10 000 levels of arrays and objects (the config's own object counts)
    // and refuses the 10 001st with a syntax error; both without recursion here.
    const GO_LIMIT: usize = 10_000;
    run_hostile(|fx| {
        let mut cases = Vec::new();
        for plugin in PLUGINS {
            let conf = fx.config(plugin, 0, "1.0.0");
            for (what, stdin) in [
                ("100000 nested arrays", nested(100_000, false).into_bytes()),
                // (Objects: `{"a":` × 100000 starts with `{` too; run as a whole stdin below.)
                (
                    "an unclosed nest of 1000000 arrays",
                    "[".repeat(1_000_000).into_bytes(),
                ),
                (
                    "100000 nested arrays in an ignored key",
                    with_raw(&conf, "/x", &nested(100_000, false)),
                ),
                (
                    "one level past Go's limit in an ignored key",
                    with_raw(&conf, "/x", &nested(GO_LIMIT, false)),
                ),
                (
                    "100000 nested arrays in prevResult",
                    with_raw(&conf, "/prevResult/interfaces/0/x", &nested(100_000, false)),
                ),
            ] {
                // The whole of stdin nested: every verb's first read; inside a config: ADD.
                let verbs: &[&str] = if stdin.first() == Some(&b'{') {
                    &["ADD"]
                } else {
                    &["ADD", "DEL", "VERSION"]
                };
                for verb in verbs {
                    cases.push(Hostile {
                        what: what.to_owned(),
                        plugin,
                        stdin: Stdin::Bytes(stdin.clone()),
                        env: fx.env(verb),
                        expect: Expect::Refused(&[6]),
                    });
                }
            }
            cases.push(Hostile {
                what: "100000 nested objects".to_owned(),
                plugin,
                stdin: Stdin::Bytes(nested(100_000, true).into_bytes()),
                env: fx.env("DEL"),
                expect: Expect::Refused(&[6]),
            });
            // Within the limit, where no plugin reads: as Go, the call works.
            for (what, stdin) in [
                (
                    "Go's limit of nested arrays in an ignored key",
                    with_raw(&conf, "/x", &nested(GO_LIMIT - 1, false)),
                ),
                (
                    "Go's limit of nested objects in args",
                    with_raw(&conf, "/args/cni/x", &nested(GO_LIMIT - 3, true)),
                ),
                (
                    "Go's limit of nested objects in prevResult",
                    with_raw(&conf, "/prevResult/x", &nested(GO_LIMIT - 2, true)),
                ),
            ] {
                cases.push(Hostile {
                    what: what.to_owned(),
                    plugin,
                    stdin: Stdin::Bytes(stdin),
                    env: fx.env("ADD"),
                    expect: Expect::Works,
                });
            }
            // Within the limit where a plugin reads: a decode error, however deep.
            cases.push(Hostile {
                what: "Go's limit of nested arrays as prevResult's routes".to_owned(),
                plugin,
                stdin: Stdin::Bytes(with_raw(
                    &conf,
                    "/prevResult/routes",
                    &nested(GO_LIMIT - 2, false),
                )),
                env: fx.env("ADD"),
                expect: Expect::Refused(&[6]),
            });
        }
        // tuning keeps its sysctl values untyped: refused before a tree that deep is built.
        let conf = fx.config(Plugin::Tuning, 0, "1.0.0");
        for (what, raw) in [
            ("arrays", nested(GO_LIMIT - 2, false)),
            ("objects", nested(GO_LIMIT - 2, true)),
        ] {
            cases.push(Hostile {
                what: format!("Go's limit of nested {what} as a sysctl value"),
                plugin: Plugin::Tuning,
                stdin: Stdin::Bytes(with_raw(&conf, "/sysctl/net.ipv4.conf.IFNAME.x", &raw)),
                env: fx.env("ADD"),
                expect: Expect::Refused(&[6]),
            });
        }
        Ok(cases)
    });
}

/// Ten megabytes.
const TEN_MB: usize = 10 << 20;
/// One megabyte.
const ONE_MB: usize = 1 << 20;

#[test]
fn ten_megabytes_of_stdin_are_refused_or_ignored_without_a_hang() {
    run_hostile(|fx| {
        type Make = fn(&Value) -> Vec<u8>;
        let refused: [(&str, Make); 2] = [
            ("10 MB of garbage", |_| vec![b'x'; TEN_MB]),
            ("the config and 10 MB of garbage after it", |conf| {
                [conf.to_string().as_bytes(), &vec![b'x'; TEN_MB]].concat()
            }),
        ];
        // Read as Go's decoder reads them: the config is all that counts.
        let ignored: [(&str, Make); 4] = [
            ("10 MB of whitespace before the config", |conf| {
                [&vec![b' '; TEN_MB][..], conf.to_string().as_bytes()].concat()
            }),
            ("a 10 MB string in an ignored key", |conf| {
                with_raw(conf, "/x", &format!("\"{}\"", "x".repeat(TEN_MB)))
            }),
            ("a 10 MB array of zeros in an ignored key", |conf| {
                with_raw(conf, "/x", &format!("[{}0]", "0,".repeat(TEN_MB / 2)))
            }),
            ("a 10 MB string in prevResult", |conf| {
                with_raw(
                    conf,
                    "/prevResult/x",
                    &format!("\"{}\"", "x".repeat(TEN_MB)),
                )
            }),
        ];
        let mut cases = Vec::new();
        for plugin in PLUGINS {
            // A version whose ADD is followed by DEL alone where the plugin has one: each
            // call parses the ten megabytes again.
            let version = plugin.versions()[0];
            let conf = fx.config(plugin, 0, version);
            for (list, expect) in [
                (&refused[..], Expect::Refused(&[6])),
                (&ignored[..], Expect::Works),
            ] {
                for &(what, make) in list {
                    let conf = conf.clone();
                    cases.push(Hostile {
                        what: what.to_owned(),
                        plugin,
                        stdin: Stdin::Made(Box::new(move || make(&conf))),
                        env: fx.env("ADD"),
                        expect,
                    });
                }
            }
            // A name that valid is used everywhere (state files, aliases, messages that quote
            // it): one megabyte already takes seconds of a debug build per call.
            let conf = conf.clone();
            cases.push(Hostile {
                what: "a 1 MB network name".to_owned(),
                plugin,
                stdin: Stdin::Made(Box::new(move || {
                    with_raw(&conf, "/name", &format!("\"{}\"", "n".repeat(ONE_MB)))
                })),
                env: fx.env("ADD"),
                expect: LONG_NAMES,
            });
            cases.push(Hostile {
                what: "VERSION with a 10 MB string".to_owned(),
                plugin,
                stdin: Stdin::Made(Box::new(|| {
                    format!(r#"{{"cniVersion":"1.0.0","x":"{}"}}"#, "x".repeat(TEN_MB)).into_bytes()
                })),
                env: fx.env("VERSION"),
                expect: Expect::Works,
            });
        }
        Ok(cases)
    });
}
