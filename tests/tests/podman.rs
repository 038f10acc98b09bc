//! podman end to end: Debian's unmodified podman 4.3 (CNI backend, runc, conmon) as the
//! runtime, with our plugins first in its `cni_plugin_dirs` and Debian's Go `bridge` and
//! `host-local` found after them in `/usr/lib/cni`.
//!
//! Every podman command runs as `nsenter --net=<test netns> podman …`, so podman's "host" is a
//! throwaway namespace: the bridge, the veths, the port mappings and the firewall rules appear
//! there, never in the machine's own namespace (`ip netns exec` is avoided: it remounts `/sys`,
//! which breaks podman's cgroups). podman reads a private `containers.conf` (`CONTAINERS_CONF`):
//! CNI backend, cgroupfs, file event log, k8s-file container logs, file locks, a private network
//! config dir, temp dirs; storage is vfs under private `--root`/`--runroot`; the image is a
//! busybox-static rootfs imported from a tarball, so nothing is pulled. Containers run under a
//! cgroup parent of their own test.
//!
//! What proves that our binaries ran and not the Go ones next to `bridge`: podman passes its
//! environment to the plugins (and `conmon_env_vars` to the `podman container cleanup` that
//! conmon starts), so `CNI_LOG_FILE` collects a line per verb from each of our plugins, which the
//! Go plugins never write; and the state only ours keeps: `portmap`'s record of the
//! attachment (it makes the reference's iptables layout, as the Go plugin does, so the
//! layout alone proves nothing), `firewall`'s state files, our IFB name (the Go name hashes no
//! interface name), and `tuning`'s backup of a sysctl-only config (the Go plugin writes none).
//!
//! podman itself, as root in the machine's mount namespace, writes a few machine-wide paths:
//! `/run/netns/netns-<uuid>`, `/var/lib/cni/{networks,results}`, runc's `/run/runc/<id>`,
//! c/image's blob info cache under `/var/lib/containers/cache`, cgroups. Each test removes what
//! is its own (also on failure, in `Drop`), and the last podman test of the process removes the
//! shared directories that did not exist before the first one started.
//! `DBUS_SYSTEM_BUS_ADDRESS` points at a socket that does not exist, so `firewall`'s auto backend
//! can never reach a firewalld of the machine.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

// `#[cfg(test)]` so that the workspace lints treat the helpers as test code.
#[cfg(test)]
mod podman {
    use std::cell::RefCell;
    use std::collections::{BTreeMap, BTreeSet};
    use std::fmt::Write as _;
    use std::fs;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::os::unix::fs::MetadataExt as _;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output, Stdio};
    use std::sync::{Mutex, PoisonError};
    use std::time::{Duration, Instant};

    use anyhow::{Context, Result, bail, ensure};
    use bandwidth::names::{self, reference_ifb_name};
    use cni::Attachment;
    use host::netns::NetNs;
    use nix::mount::{MntFlags, umount2};
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use serde_json::{Value, json};
    use tests::traffic::http_get;
    use tests::{TestNetns, bins, process, veth_pair};

    /// The image every container runs, imported from a tarball of busybox-static.
    const IMAGE: &str = "localhost/cni-e2e-busybox:latest";
    /// Where busybox-static installs the binary.
    const BUSYBOX: &str = "/bin/busybox";
    /// The applets the containers use.
    const APPLETS: [&str; 4] = ["sh", "httpd", "echo", "cat"];
    /// Deadline of one podman command (they take well under a second here).
    const PODMAN_TIMEOUT: Duration = Duration::from_secs(60);
    /// How long a freshly started httpd may take to answer through its port mapping.
    const HTTP_DEADLINE: Duration = Duration::from_secs(20);
    /// Deadline of one HTTP exchange.
    const HTTP_TIMEOUT: Duration = Duration::from_secs(2);
    /// How long processes of a removed container (conmon, `podman container cleanup`) may
    /// take to finish. Generous: this is not a timing assertion.
    const SETTLE_DEADLINE: Duration = Duration::from_secs(30);
    /// The container interface podman asks for.
    const IFNAME: &str = "eth0";
    /// The host port of the container under test, and of a neighbour that stays.
    const WEB_PORT: u16 = 8080;
    const KEEPER_PORT: u16 = 8081;
    /// The plugins of podman's own conflist, in order.
    const PODMAN_CHAIN: [&str; 4] = ["bridge", "portmap", "firewall", "tuning"];
    /// Our plugins in podman's conflist (the other one, `bridge`, is Debian's Go plugin).
    const OURS_IN_PODMAN_CHAIN: [&str; 3] = ["portmap", "firewall", "tuning"];
    /// The chain of the second case: podman's plus `bandwidth` and `sbr`.
    const OURS_IN_FULL_CHAIN: [&str; 5] = ["portmap", "firewall", "tuning", "bandwidth", "sbr"];

    const INGRESS_RATE: u64 = 8_000_000;
    const INGRESS_BURST: u64 = 80_000;
    const EGRESS_RATE: u64 = 12_000_000;
    const EGRESS_BURST: u64 = 120_000;
    /// The sysctl the second case's `tuning` sets (a sysctl-only config).
    const TUNED_SYSCTL: &str = "net.ipv4.conf.IFNAME.arp_filter";
    /// The routing table `sbr` picks first.
    const SBR_TABLE: &str = "100";

    /// Machine-wide paths podman or the plugins create on first use, deepest first. Each one
    /// that did not exist when the first podman test of this process started is removed when the
    /// last one ends.
    const SHARED_PATHS: [&str; 11] = [
        "/var/lib/containers/cache/blob-info-cache-v1.boltdb",
        "/var/lib/containers/cache",
        "/var/lib/containers",
        "/var/lib/cni/results",
        "/var/lib/cni/networks",
        "/var/lib/cni",
        "/run/runc",
        "/run/cni/tuning",
        "/run/cni/portmap",
        "/run/cni",
        "/run/cni-firewall",
    ];
    /// Lock files the plugins keep in their state directories: a directory holding nothing else
    /// is empty as far as state goes.
    const LOCK_FILES: [&str; 4] = [".lock", "lock", "iptables.lock", "nft-skeleton.lock"];
    /// libcni's result cache, tuning's backups, runc's state: shared by all networks.
    const RESULTS_DIR: &str = "/var/lib/cni/results";
    const NETWORKS_DIR: &str = "/var/lib/cni/networks";
    const TUNING_DIR: &str = "/run/cni/tuning";
    const RUNC_DIR: &str = "/run/runc";
    const NETNS_DIR: &str = "/run/netns";
    const PORTMAP_DIR: &str = "/run/cni/portmap";
    const FIREWALL_DIR: &str = "/run/cni-firewall";
    /// The machine's CNI config dir, which podman must leave alone.
    const SYSTEM_CNI_CONF_DIR: &str = "/etc/cni/net.d";

    /// How many podman tests run, and which shared paths were absent before the first started.
    struct SharedState {
        users: usize,
        absent: Vec<&'static str>,
    }

    static SHARED: Mutex<SharedState> = Mutex::new(SharedState {
        users: 0,
        absent: Vec::new(),
    });

    /// Holds the machine-wide paths of [`SHARED_PATHS`] for one test; the last holder removes
    /// those that were absent before the first one.
    struct SharedPaths;

    impl SharedPaths {
        fn acquire() -> SharedPaths {
            let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
            if shared.users == 0 {
                shared.absent = SHARED_PATHS
                    .into_iter()
                    .filter(|p| fs::symlink_metadata(p).is_err())
                    .collect();
            }
            shared.users += 1;
            SharedPaths
        }
    }

    impl Drop for SharedPaths {
        fn drop(&mut self) {
            let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
            shared.users -= 1;
            if shared.users == 0 {
                for path in &shared.absent {
                    remove_created(Path::new(path));
                }
            }
        }
    }

    /// Removes a file, or a directory holding at most the plugins' lock files; anything else in
    /// it belongs to someone else, so the directory stays (and is reported).
    fn remove_created(path: &Path) {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return;
        };
        if !meta.is_dir() {
            let _ = fs::remove_file(path);
            return;
        }
        let names = dir_names(path);
        if names.iter().all(|n| LOCK_FILES.contains(&n.as_str())) {
            for name in &names {
                let _ = fs::remove_file(path.join(name));
            }
            if let Err(e) = fs::remove_dir(path) {
                eprintln!("failed to remove {}: {e}", path.display());
            }
        } else {
            eprintln!("left {} in place: it holds {names:?}", path.display());
        }
    }

    /// Names in a directory, sorted; none when it does not exist.
    fn dir_names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Every path below `dir` (relative, sorted, directories marked with a trailing `/`).
    fn tree(dir: &Path) -> Vec<String> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
            for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(format!("{rel}/"));
                    walk(root, &path, out);
                } else {
                    out.push(rel);
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    /// `(mount point, filesystem type)` of every mount of this process's mount namespace.
    fn mounts() -> Vec<(PathBuf, String)> {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        info.lines()
            .filter_map(|line| {
                let point = line.split(' ').nth(4)?;
                let fstype = line.split(" - ").nth(1)?.split(' ').next()?;
                Some((PathBuf::from(unescape_mount(point)), fstype.to_owned()))
            })
            .collect()
    }

    /// Undoes mountinfo's octal escapes (`\040` for a space).
    fn unescape_mount(field: &str) -> String {
        let bytes = field.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let octal = bytes.get(i + 1..i + 4).and_then(|d| {
                std::str::from_utf8(d)
                    .ok()
                    .and_then(|d| u8::from_str_radix(d, 8).ok())
            });
            match (bytes[i], octal) {
                (b'\\', Some(b)) => {
                    out.push(b);
                    i += 4;
                }
                (b, _) => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The cgroup directory `parent` in every mounted cgroup hierarchy (v1 controllers and v2).
    fn cgroup_dirs(parent: &str) -> Vec<PathBuf> {
        let rel = parent.trim_start_matches('/');
        mounts()
            .into_iter()
            .filter(|(_, fstype)| fstype == "cgroup" || fstype == "cgroup2")
            .map(|(point, _)| point.join(rel))
            .filter(|dir| dir.is_dir())
            .collect()
    }

    /// Pids of the processes whose command line contains `needle`.
    fn pids_mentioning(needle: &str) -> Vec<i32> {
        let me = std::process::id();
        fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| u32::try_from(*pid).is_ok_and(|p| p != me))
            .filter(|pid| {
                fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(needle)
                })
            })
            .collect()
    }

    /// True when `line` names the container ID or its address (not as part of a longer one).
    fn mentions(line: &str, id: &str, ip: Ipv4Addr) -> bool {
        let ip = ip.to_string();
        line.contains(id)
            || line.match_indices(&ip).any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = line[at + ip.len()..].chars().next();
                !before.is_some_and(|c| c.is_ascii_digit() || c == '.')
                    && !after.is_some_and(|c| c.is_ascii_digit())
            })
    }

    /// A container started by [`Fixture::run_web`].
    #[derive(Debug, Clone)]
    struct Container {
        id: String,
        ip: Ipv4Addr,
        gateway: Ipv4Addr,
        sandbox: PathBuf,
        /// What its httpd serves.
        token: String,
    }

    /// Kernel and file state of one test, section by section, for before/after comparisons.
    #[derive(Debug, PartialEq, Eq)]
    struct Snapshot(BTreeMap<&'static str, Vec<String>>);

    impl Snapshot {
        /// Lines of every section that name `id` or `ip`.
        fn mentioning(&self, id: &str, ip: Ipv4Addr) -> Vec<String> {
            self.0
                .iter()
                .flat_map(|(section, lines)| {
                    lines
                        .iter()
                        .filter(|l| mentions(l, id, ip))
                        .map(move |l| format!("{section}: {l}"))
                })
                .collect()
        }

        /// The lines that differ, per section.
        fn diff(&self, after: &Snapshot) -> String {
            let mut out = String::new();
            for (section, lines) in &self.0 {
                let before: BTreeSet<_> = lines.iter().collect();
                let now: BTreeSet<_> = after.0.get(section).into_iter().flatten().collect();
                for gone in before.difference(&now) {
                    let _ = writeln!(out, "- {section}: {gone}");
                }
                for new in now.difference(&before) {
                    let _ = writeln!(out, "+ {section}: {new}");
                }
            }
            out
        }
    }

    /// One test's private podman: its namespaces, directories, network and cgroup parent.
    /// Dropping it removes everything podman and the plugins made for it, also on failure.
    struct Fixture {
        /// The namespace podman runs in: the "machine" of the containers.
        host: TestNetns,
        /// An outside machine one hop from `host`.
        client: TestNetns,
        /// containers.conf, storage, runroot, podman's temp dir, network configs, image, log.
        dir: tempfile::TempDir,
        network: String,
        /// podman's conflist as `podman network create` wrote it.
        podman_conflist: Value,
        /// The bridge podman picked (`cni-podmanN`).
        bridge: String,
        /// The links of the machine's own namespace when the fixture was made.
        machine_links: BTreeSet<String>,
        /// The host's address on the client link.
        uplink: Ipv4Addr,
        /// 10.93.`index`.0/24 is the network's subnet.
        index: u8,
        cgroup_parent: String,
        /// The nsfs inode of `host`, which names the plugins' per-namespace state dirs.
        host_inode: u64,
        /// IDs and sandboxes of every container started, for snapshots and cleanup.
        containers: RefCell<Vec<Container>>,
        _shared: SharedPaths,
    }

    impl Fixture {
        /// A fresh podman setup named after `case` (a few letters), with the image imported and
        /// a network created by podman in subnet 10.93.`index` (10.94.`index` is the client
        /// link).
        fn new(case: &str, index: u8) -> Result<Fixture> {
            for plugin in OURS_IN_FULL_CHAIN {
                bins::plugin_binary(plugin)?;
            }
            for plugin in ["bridge", "host-local"] {
                bins::reference_binary(plugin)?;
            }
            // Before any podman runs: which machine-wide paths are absent now.
            let shared = SharedPaths::acquire();
            let host = TestNetns::new(&format!("pm{case}-host"))?;
            let client = TestNetns::new(&format!("pm{case}-cli"))?;
            let uplink = Ipv4Addr::new(10, 94, index, 1);
            veth_pair(
                &host,
                "uplink0",
                &[&format!("{uplink}/24")],
                &client,
                "eth0",
                &[&format!("10.94.{index}.2/24")],
            )?;
            client.ip(&["route", "add", "default", "via", &uplink.to_string()])?;
            host.set_sysctl("net.ipv4.ip_forward", "1")?;
            let host_inode = fs::metadata(host.path())?.ino();
            let pid = std::process::id();
            let mut fixture = Fixture {
                host,
                client,
                dir: tempfile::Builder::new()
                    .prefix("cni-e2e-podman-")
                    .tempdir()?,
                network: format!("cnie2e-{case}-{pid}"),
                podman_conflist: Value::Null,
                bridge: String::new(),
                machine_links: machine_links()?,
                uplink,
                index,
                cgroup_parent: format!("/cni-e2e-podman-{case}-{pid}"),
                host_inode,
                containers: RefCell::new(Vec::new()),
                _shared: shared,
            };
            fixture.write_config()?;
            fixture.import_image()?;
            fixture.podman_conflist = fixture.create_network()?;
            fixture.bridge = fixture.podman_conflist["plugins"][0]["bridge"]
                .as_str()
                .context("no bridge name")?
                .to_owned();
            Ok(fixture)
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        fn log_file(&self) -> PathBuf {
            self.path("cni.log")
        }

        /// Env of podman and of conmon (and so of `podman container cleanup`), which podman and
        /// libcni pass on to the plugins.
        fn plugin_env(&self) -> Vec<(String, String)> {
            vec![
                ("CNI_LOG_FILE".into(), self.log_file().display().to_string()),
                ("CNI_LOG_LEVEL".into(), "debug".into()),
                (
                    "DBUS_SYSTEM_BUS_ADDRESS".into(),
                    format!("unix:path={}", self.path("no-system-bus").display()),
                ),
            ]
        }

        fn write_config(&self) -> Result<()> {
            for sub in ["root", "runroot", "tmp", "copytmp", "networks"] {
                fs::create_dir_all(self.path(sub))?;
            }
            let q = |p: PathBuf| format!("{:?}", p.display().to_string());
            let conmon_env: Vec<String> = self
                .plugin_env()
                .into_iter()
                .map(|(k, v)| format!("{:?}", format!("{k}={v}")))
                .collect();
            let ours = bins::plugin_dir()?;
            let conf = format!(
                "[containers]\n\
                 log_driver = \"k8s-file\"\n\
                 [network]\n\
                 network_backend = \"cni\"\n\
                 cni_plugin_dirs = [{ours}, {reference}]\n\
                 network_config_dir = {networks}\n\
                 [engine]\n\
                 cgroup_manager = \"cgroupfs\"\n\
                 events_logger = \"file\"\n\
                 events_logfile_path = {events}\n\
                 tmp_dir = {tmp}\n\
                 image_copy_tmp_dir = {copytmp}\n\
                 lock_type = \"file\"\n\
                 runtime = \"runc\"\n\
                 conmon_env_vars = [{conmon_env}]\n",
                ours = q(ours),
                reference = q(bins::reference_dir()),
                networks = q(self.path("networks")),
                events = q(self.path("tmp/events.log")),
                tmp = q(self.path("tmp")),
                copytmp = q(self.path("copytmp")),
                conmon_env = conmon_env.join(", "),
            );
            fs::write(self.path("containers.conf"), conf)?;
            let storage = format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = {}\nrunroot = {}\n",
                q(self.path("root")),
                q(self.path("runroot"))
            );
            fs::write(self.path("storage.conf"), storage)?;
            Ok(())
        }

        /// Runs `podman <args>` inside `host` and returns its output, whatever its status.
        fn podman_output(&self, args: &[&str]) -> Result<Output> {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net={}", self.host.path().display()))
                .arg("podman")
                .arg("--root")
                .arg(self.path("root"))
                .arg("--runroot")
                .arg(self.path("runroot"))
                .args(["--storage-driver", "vfs", "--runtime", "runc"])
                .args(args)
                .env("CONTAINERS_CONF", self.path("containers.conf"))
                .env("CONTAINERS_STORAGE_CONF", self.path("storage.conf"))
                // c/image stages big files in $TMPDIR (default /var/tmp).
                .env("TMPDIR", self.path("copytmp"))
                .envs(self.plugin_env())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let child = cmd
                .spawn()
                .context("failed to start `nsenter … podman` (scripts/setup.sh installs podman)")?;
            process::wait_with_deadline(child, Vec::new(), PODMAN_TIMEOUT)
                .with_context(|| format!("podman {}", args.join(" ")))
        }

        /// Runs `podman <args>` inside `host`, requires success and returns stdout.
        fn podman(&self, args: &[&str]) -> Result<String> {
            let out = self.podman_output(args)?;
            ensure!(
                out.status.success(),
                "`podman {}` failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        }

        /// A busybox-static rootfs (`/bin/busybox`, applet links, `/www`) tarred and imported.
        fn import_image(&self) -> Result<()> {
            let rootfs = self.path("rootfs");
            fs::create_dir_all(rootfs.join("bin"))?;
            fs::create_dir_all(rootfs.join("www"))?;
            fs::copy(BUSYBOX, rootfs.join("bin/busybox")).with_context(|| {
                format!("failed to copy {BUSYBOX} (scripts/setup.sh installs busybox-static)")
            })?;
            for applet in APPLETS {
                std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
            }
            let tarball = self.path("image.tar");
            let out = Command::new("tar")
                .arg("-C")
                .arg(&rootfs)
                .arg("-cf")
                .arg(&tarball)
                .arg(".")
                .output()
                .context("failed to run tar")?;
            ensure!(out.status.success(), "tar failed: {out:?}");
            self.podman(&["import", &tarball.display().to_string(), IMAGE])?;
            Ok(())
        }

        /// `podman network create` of this fixture's network; returns podman's conflist as it
        /// wrote it, after checking its plugin chain is podman's usual one.
        fn create_network(&self) -> Result<Value> {
            self.podman(&[
                "network",
                "create",
                "--disable-dns",
                "--subnet",
                &format!("10.93.{}.0/24", self.index),
                &self.network,
            ])?;
            let conflist: Value = serde_json::from_str(&fs::read_to_string(self.conflist_path())?)?;
            let types: Vec<&str> = conflist["plugins"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["type"].as_str())
                .collect();
            ensure!(types == PODMAN_CHAIN, "podman wrote {conflist:#}");
            ensure!(
                conflist["plugins"][1]["capabilities"]["portMappings"] == json!(true)
                    && conflist["plugins"][2]["backend"] == json!(""),
                "podman wrote {conflist:#}"
            );
            Ok(conflist)
        }

        fn conflist_path(&self) -> PathBuf {
            self.path("networks")
                .join(format!("{}.conflist", self.network))
        }

        /// `podman run -d -p <port>:80 … httpd` serving a page that names the container.
        fn run_web(&self, name: &str, port: u16) -> Result<Container> {
            let token = format!("{name} on {} says hello", self.network);
            let script = format!("echo '{token}' > /www/index.html && exec httpd -f -p 80 -h /www");
            let publish = format!("{port}:80");
            let stdout = self.podman(&[
                "run",
                "-d",
                "--name",
                name,
                "--network",
                &self.network,
                "-p",
                &publish,
                // podman's default rlimits (nofile 1048576) are above what the CI VM allows.
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                "--cgroup-parent",
                &self.cgroup_parent,
                IMAGE,
                "sh",
                "-c",
                &script,
            ])?;
            let id = stdout
                .lines()
                .last()
                .context("podman run printed no ID")?
                .trim()
                .to_owned();
            let inspect: Value = serde_json::from_str(&self.podman(&["inspect", &id])?)?;
            let settings = &inspect[0]["NetworkSettings"];
            let sandbox = PathBuf::from(
                settings["SandboxKey"]
                    .as_str()
                    .with_context(|| format!("no SandboxKey: {settings}"))?,
            );
            let net = &settings["Networks"][&self.network];
            let addr = |key: &str| -> Result<Ipv4Addr> {
                net[key]
                    .as_str()
                    .with_context(|| format!("no {key}: {settings}"))?
                    .parse()
                    .with_context(|| format!("bad {key}: {settings}"))
            };
            let container = Container {
                id,
                ip: addr("IPAddress")?,
                gateway: addr("Gateway")?,
                sandbox,
                token,
            };
            self.containers.borrow_mut().push(container.clone());
            Ok(container)
        }

        /// `podman rm -f -t 0`, then waits until the container's processes (conmon, `podman
        /// container cleanup`) have exited.
        fn remove(&self, ctr: &Container) -> Result<()> {
            self.podman(&["rm", "-f", "-t", "0", &ctr.id])?;
            let deadline = Instant::now() + SETTLE_DEADLINE;
            loop {
                let pids = pids_mentioning(&ctr.id);
                if pids.is_empty() {
                    return Ok(());
                }
                ensure!(
                    Instant::now() < deadline,
                    "after podman rm: processes {pids:?} still run"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }

        /// GETs `/` from `from` to `addr` until it serves `ctr`'s page.
        fn wait_http(&self, from: &TestNetns, addr: SocketAddr, ctr: &Container) -> Result<()> {
            let deadline = Instant::now() + HTTP_DEADLINE;
            loop {
                let last = match http_get(from, addr, "/", HTTP_TIMEOUT) {
                    Ok(r) if r.status == 200 && r.body.trim() == ctr.token => return Ok(()),
                    Ok(r) => format!("{} {:?}", r.status, r.body),
                    Err(e) => format!("{e:#}"),
                };
                if Instant::now() >= deadline {
                    bail!(
                        "{addr} from netns {} never served {:?}; last: {last}",
                        from.name(),
                        ctr.token
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }

        /// HTTP to `ctr`'s host port through the uplink address, from the client (prerouting)
        /// and from the host itself (output), and through 127.0.0.1 from the host.
        fn check_port_mapping(&self, ctr: &Container, port: u16) -> Result<()> {
            let uplink = SocketAddr::from((self.uplink, port));
            self.wait_http(&self.client, uplink, ctr)?;
            self.wait_http(&self.host, uplink, ctr)?;
            self.wait_http(
                &self.host,
                SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                ctr,
            )
        }

        /// The lines of our plugins' log naming `verb` for `id`.
        fn logged(&self, verb: &str, id: &str) -> Result<Vec<String>> {
            let log = fs::read_to_string(self.log_file()).unwrap_or_default();
            Ok(log
                .lines()
                .filter(|l| l.contains(&format!(" {verb} container={id} ")))
                .map(str::to_owned)
                .collect())
        }

        /// Our `plugins` each logged `verb` for `id`, in this order.
        fn ensure_logged_in_order(&self, plugins: &[&str], verb: &str, id: &str) -> Result<()> {
            let lines = self.logged(verb, id)?;
            let mut at = Vec::new();
            for plugin in plugins {
                let prefix = format!("{plugin}[");
                let pos = lines
                    .iter()
                    .position(|l| l.starts_with(&prefix))
                    .with_context(|| {
                        format!(
                            "our {plugin} logged no {verb} for {id} in {}: {lines:#?}",
                            self.log_file().display()
                        )
                    })?;
                at.push(pos);
            }
            ensure!(
                at.windows(2).all(|w| w[0] < w[1]),
                "{verb} not in the order {plugins:?}: {lines:#?}"
            );
            Ok(())
        }

        /// The state dirs the plugins keep per host namespace.
        fn namespace_state_dirs(&self) -> [PathBuf; 2] {
            [
                Path::new(PORTMAP_DIR).join(format!("net-{}", self.host_inode)),
                Path::new(FIREWALL_DIR).join(self.host_inode.to_string()),
            ]
        }

        fn snapshot(&self) -> Result<Snapshot> {
            let mut s = BTreeMap::new();
            let nft = self.host.exec_ok("nft", &["-s", "list", "ruleset"])?;
            s.insert("nft", nonempty_lines(&nft));
            let mut iptables = Vec::new();
            for tool in ["iptables-save", "ip6tables-save"] {
                let dump = self.host.exec_ok(tool, &[] as &[&str])?;
                iptables.extend(dump.lines().filter(|l| !l.starts_with('#')).map(|l| {
                    match l.find(" [") {
                        Some(i) if l.starts_with(':') => format!("{tool} {}", &l[..i]),
                        _ => format!("{tool} {l}"),
                    }
                }));
            }
            s.insert("iptables", iptables);
            let mut links = self.host.link_names()?;
            links.sort();
            s.insert("links", links);
            let qdiscs: Value =
                serde_json::from_str(&self.host.exec_ok("tc", &["-j", "qdisc", "show"])?)?;
            let qdiscs = qdiscs
                .as_array()
                .into_iter()
                .flatten()
                .map(|q| format!("{} {} {} {}", q["dev"], q["kind"], q["handle"], q["parent"]))
                .collect();
            s.insert("qdiscs", qdiscs);
            let mut state = Vec::new();
            for dir in self.namespace_state_dirs() {
                state.extend(
                    tree(&dir)
                        .into_iter()
                        .map(|p| format!("{}/{p}", dir.display())),
                );
            }
            let ipam = Path::new(NETWORKS_DIR).join(&self.network);
            state.extend(
                tree(&ipam)
                    .into_iter()
                    .map(|p| format!("{}/{p}", ipam.display())),
            );
            s.insert("state", state);
            // Shared directories: only the entries of this test's containers.
            let containers = self.containers.borrow();
            let ours = |name: &str| {
                containers.iter().any(|c| {
                    name.contains(&c.id) || c.sandbox.file_name().is_some_and(|f| f == name)
                })
            };
            let mut shared = Vec::new();
            for dir in [RESULTS_DIR, TUNING_DIR, RUNC_DIR, NETNS_DIR] {
                shared.extend(
                    dir_names(Path::new(dir))
                        .into_iter()
                        .filter(|n| ours(n))
                        .map(|n| format!("{dir}/{n}")),
                );
            }
            s.insert("shared", shared);
            let mut cgroups = Vec::new();
            for dir in cgroup_dirs(&self.cgroup_parent) {
                cgroups.extend(
                    tree(&dir)
                        .into_iter()
                        .filter(|p| p.ends_with('/'))
                        .map(|p| format!("{}/{p}", dir.display())),
                );
            }
            s.insert("cgroups", cgroups);
            s.insert("etc-cni", dir_names(Path::new(SYSTEM_CNI_CONF_DIR)));
            Ok(Snapshot(s))
        }

        /// After `podman rm` of `ctr`: nothing of it is left anywhere.
        fn ensure_gone(&self, ctr: &Container) -> Result<Snapshot> {
            let after = self.snapshot()?;
            let left = after.mentioning(&ctr.id, ctr.ip);
            ensure!(left.is_empty(), "left after podman rm: {left:#?}");
            ensure!(
                !ctr.sandbox.exists(),
                "{} still exists",
                ctr.sandbox.display()
            );
            Ok(after)
        }

        /// While `ctr` runs: the objects the CNI runtime and our plugins made for it.
        fn ensure_attached(&self, ctr: &Container, port: u16) -> Result<()> {
            ensure!(ctr.sandbox.exists(), "no {}", ctr.sandbox.display());
            let cache =
                Path::new(RESULTS_DIR).join(format!("{}-{}-{IFNAME}", self.network, ctr.id));
            ensure!(
                cache.exists(),
                "libcni cached no result at {}",
                cache.display()
            );
            // portmap: the reference's layout (auto picks iptables, as Go does), and our
            // record of it, which the Go plugin keeps none of.
            let nat = self.host.exec_ok("iptables-save", &["-t", "nat"])?;
            let dnat = format!("--dport {port} -j DNAT --to-destination {}:80", ctr.ip);
            ensure!(nat.contains(&dnat), "no {dnat:?} in the nat table: {nat}");
            let record = Path::new(PORTMAP_DIR)
                .join(format!("net-{}", self.host_inode))
                .join(format!("{}:{}:{IFNAME}.json", self.network, ctr.id));
            ensure!(record.exists(), "no {}", record.display());
            // firewall's state file: Go's firewall keeps none.
            let attachment = Path::new(FIREWALL_DIR)
                .join(self.host_inode.to_string())
                .join("attachments")
                .join(format!("{}:{}:{IFNAME}", self.network, ctr.id));
            ensure!(attachment.exists(), "no {}", attachment.display());
            // cgroupfs under our parent (no systemd scope), events in podman's file (no journald).
            let cgroups = cgroup_dirs(&self.cgroup_parent);
            ensure!(
                !cgroups.is_empty()
                    && cgroups
                        .iter()
                        .any(|d| d.join(format!("libpod-{}", ctr.id)).is_dir()),
                "the container has no cgroup under {} in {cgroups:?}",
                self.cgroup_parent
            );
            let events = fs::read_to_string(self.path("tmp/events.log"))?;
            ensure!(
                events.contains(&ctr.id),
                "no events of {} in the file",
                ctr.id
            );
            // The bridge and veths are in podman's namespace, not in the one the tests run in.
            ensure!(
                self.host.has_link(&self.bridge)?,
                "no {} in the test netns",
                self.bridge
            );
            let new_on_machine: BTreeSet<String> = machine_links()?
                .difference(&self.machine_links)
                .cloned()
                .collect();
            let ours: BTreeSet<String> = self.host.link_names()?.into_iter().collect();
            let leaked: Vec<_> = new_on_machine.intersection(&ours).collect();
            ensure!(
                leaked.is_empty(),
                "{leaked:?} appeared in the machine's own namespace"
            );
            Ok(())
        }
    }

    /// Link names of the namespace the tests run in (the machine's own); only read.
    fn machine_links() -> Result<BTreeSet<String>> {
        let out = Command::new("ip").args(["-j", "link", "show"]).output()?;
        ensure!(out.status.success(), "ip -j link show: {out:?}");
        let links: Value = serde_json::from_slice(&out.stdout)?;
        Ok(as_list(&links)
            .iter()
            .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
            .collect())
    }

    fn nonempty_lines(text: &str) -> Vec<String> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect()
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            // podman removes what it can; what is left is removed by hand.
            let _ = self.podman_output(&["rm", "-af", "-t", "0"]);
            let _ = self.podman_output(&["network", "rm", "-f", &self.network]);
            let dir = format!("{}/", self.dir.path().display());
            let ids: Vec<String> = self
                .containers
                .borrow()
                .iter()
                .map(|c| c.id.clone())
                .collect();
            // Our processes: conmon and `podman container cleanup` name our directory or a
            // container ID; container processes sit in our cgroups. They get a moment to finish
            // on their own, then are killed by pid.
            let ours = || {
                let mut pids: BTreeSet<i32> = pids_mentioning(&dir).into_iter().collect();
                for id in &ids {
                    pids.extend(pids_mentioning(id));
                }
                for cg in cgroup_dirs(&self.cgroup_parent) {
                    for procs in tree(&cg).iter().filter(|p| p.ends_with("cgroup.procs")) {
                        let text = fs::read_to_string(cg.join(procs)).unwrap_or_default();
                        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
                    }
                }
                pids
            };
            let started = Instant::now();
            loop {
                let pids = ours();
                let waited = started.elapsed();
                if pids.is_empty() || waited >= Duration::from_secs(15) {
                    break;
                }
                if waited >= Duration::from_secs(5) {
                    for pid in pids {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            for ctr in self.containers.borrow().iter() {
                if ctr.sandbox.exists() {
                    let _ = umount2(&ctr.sandbox, MntFlags::MNT_DETACH);
                    let _ = fs::remove_file(&ctr.sandbox);
                }
                let _ = fs::remove_file(
                    Path::new(TUNING_DIR).join(format!("{}_{IFNAME}.json", ctr.id)),
                );
                let _ = fs::remove_dir_all(Path::new(RUNC_DIR).join(&ctr.id));
            }
            let _ = fs::remove_dir_all(Path::new(NETWORKS_DIR).join(&self.network));
            for name in dir_names(Path::new(RESULTS_DIR)) {
                if name.starts_with(&format!("{}-", self.network)) {
                    let _ = fs::remove_file(Path::new(RESULTS_DIR).join(name));
                }
            }
            // Keyed by our namespace's inode, which no other live namespace has.
            for state in self.namespace_state_dirs() {
                let _ = fs::remove_dir_all(state);
            }
            for cg in cgroup_dirs(&self.cgroup_parent) {
                let mut dirs: Vec<PathBuf> = tree(&cg)
                    .iter()
                    .filter(|p| p.ends_with('/'))
                    .map(|p| cg.join(p))
                    .collect();
                dirs.push(cg.clone());
                // Deepest first; a cgroup whose last task just exited may be busy a moment.
                dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
                for d in dirs {
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while let Err(e) = fs::remove_dir(&d) {
                        if Instant::now() >= deadline {
                            eprintln!("failed to remove cgroup {}: {e}", d.display());
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            // Mounts podman may have left under our directory (container shm), deepest first.
            let mut under: Vec<PathBuf> = mounts()
                .into_iter()
                .map(|(point, _)| point)
                .filter(|p| p.starts_with(self.dir.path()))
                .collect();
            under.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for point in under {
                let _ = umount2(&point, MntFlags::MNT_DETACH);
            }
            // Then the fields drop: the namespaces, the directory, and the shared paths.
        }
    }

    fn tc_json(ns: &TestNetns, args: &[&str]) -> Result<Value> {
        let mut all = vec!["-j"];
        all.extend_from_slice(args);
        Ok(serde_json::from_str(&ns.exec_ok("tc", &all)?)?)
    }

    /// `ip -j <args>` run inside a namespace given by handle.
    fn ip_json_in(ns: &NetNs, args: &[&str]) -> Result<Value> {
        let mut cmd = Command::new("ip");
        cmd.arg("-j").args(args);
        let out = process::run_in(ns, &mut cmd, b"", Duration::from_secs(10))?;
        ensure!(out.status.success(), "ip -j {}: {out:?}", args.join(" "));
        let text = String::from_utf8_lossy(&out.stdout);
        if text.trim().is_empty() {
            return Ok(json!([]));
        }
        Ok(serde_json::from_str(&text)?)
    }

    fn as_list(v: &Value) -> Vec<Value> {
        v.as_array().cloned().unwrap_or_default()
    }

    /// podman's own conflist (`podman network create`: bridge → portmap → firewall with
    /// `backend: ""` → tuning) runs our portmap, firewall and tuning: HTTP reaches the container
    /// through its host port from outside, from the host's own address and from 127.0.0.1, and
    /// `podman rm` leaves the state exactly as it was before the container started, while a
    /// neighbour on the same network keeps its mapping.
    #[test]
    fn podman_own_conflist_maps_ports_and_rm_leaves_nothing() -> Result<()> {
        let fx = Fixture::new("pm", 1)?;

        // A neighbour sets up the shared objects (bridge, tables, chains) first.
        let keeper = fx.run_web("keeper", KEEPER_PORT)?;
        fx.wait_http(
            &fx.client,
            SocketAddr::from((fx.uplink, KEEPER_PORT)),
            &keeper,
        )?;
        let before = fx.snapshot()?;

        let web = fx.run_web("web", WEB_PORT)?;
        ensure!(web.gateway == Ipv4Addr::new(10, 93, 1, 1), "{web:?}");
        fx.check_port_mapping(&web, WEB_PORT)?;
        fx.ensure_attached(&web, WEB_PORT)?;
        fx.ensure_logged_in_order(&OURS_IN_PODMAN_CHAIN, "ADD", &web.id)?;
        let running = fx.snapshot()?;
        ensure!(
            !running.mentioning(&web.id, web.ip).is_empty(),
            "the snapshot sees nothing of the running container: {running:#?}"
        );

        fx.remove(&web)?;
        let mut reverse = OURS_IN_PODMAN_CHAIN;
        reverse.reverse();
        fx.ensure_logged_in_order(&reverse, "DEL", &web.id)?;
        let after = fx.ensure_gone(&web)?;
        ensure!(
            after == before,
            "podman rm changed the state:\n{}",
            before.diff(&after)
        );
        // The neighbour's mapping is untouched.
        fx.check_port_mapping(&keeper, KEEPER_PORT)?;
        Ok(())
    }

    /// podman's conflist with `tuning` given a sysctl and `bandwidth` (static rates) and `sbr`
    /// appended: while the container runs, the host veth and our IFB carry TBFs of the configured
    /// rates, the sysctl is set with our backup file, and sbr's rule and table are in the
    /// container's namespace; `podman rm` takes all of it away (sbr's rule is checked in the
    /// container namespace held open past its deletion).
    #[test]
    fn podman_runs_bandwidth_and_sbr_appended_to_its_conflist() -> Result<()> {
        let fx = Fixture::new("bw", 2)?;
        let mut conflist = fx.podman_conflist.clone();
        let plugins = conflist["plugins"].as_array_mut().context("no plugins")?;
        plugins[3]["sysctl"] = json!({ TUNED_SYSCTL: "1" });
        plugins.push(json!({
            "type": "bandwidth",
            "ingressRate": INGRESS_RATE, "ingressBurst": INGRESS_BURST,
            "egressRate": EGRESS_RATE, "egressBurst": EGRESS_BURST,
        }));
        plugins.push(json!({"type": "sbr"}));
        fs::write(fx.conflist_path(), serde_json::to_string_pretty(&conflist)?)?;

        let web = fx.run_web("web", WEB_PORT)?;
        let ctr_ns = NetNs::open(&web.sandbox)?;
        fx.wait_http(&fx.client, SocketAddr::from((fx.uplink, WEB_PORT)), &web)?;
        fx.ensure_attached(&web, WEB_PORT)?;
        fx.ensure_logged_in_order(&OURS_IN_FULL_CHAIN, "ADD", &web.id)?;

        // bandwidth: ingress TBF on the host veth, egress through our IFB.
        let veths = fx.host.ip_json(&["link", "show", "master", &fx.bridge])?;
        let veth = match as_list(&veths).as_slice() {
            [one] => one["ifname"].as_str().context("no ifname")?.to_owned(),
            other => bail!("want one port on {}: {other:?}", fx.bridge),
        };
        let owner = Attachment {
            network: fx.network.clone(),
            container_id: web.id.clone(),
            ifname: IFNAME.to_owned(),
        };
        // The reference's name.
        let ifb = reference_ifb_name(&fx.network, &web.id);
        ensure!(
            fx.host.has_link(&ifb)?,
            "no IFB {ifb}: {:?}",
            fx.host.link_names()?
        );
        let alias = fx.host.ip_json(&["link", "show", "dev", &ifb])?;
        ensure!(
            alias[0]["ifalias"] == json!(names::alias(&owner)),
            "{alias}"
        );
        for (dev, rate, burst) in [
            (&veth, INGRESS_RATE, INGRESS_BURST),
            (&ifb, EGRESS_RATE, EGRESS_BURST),
        ] {
            let root = tc_json(&fx.host, &["qdisc", "show", "dev", dev, "root"])?;
            let tbf = &root[0];
            ensure!(
                tbf["kind"] == "tbf"
                    && tbf["options"]["rate"] == json!(rate / 8)
                    && tbf["options"]["burst"] == json!(burst / 8),
                "{dev}: want tbf rate {rate} bit/s burst {burst} bit: {root}"
            );
        }
        let filters = tc_json(&fx.host, &["filter", "show", "dev", &veth, "ingress"])?;
        ensure!(
            filters
                .to_string()
                .contains(&format!("\"to_dev\":\"{ifb}\"")),
            "no redirect from {veth} to {ifb}: {filters}"
        );

        // tuning: the sysctl, and our backup of its old value (Go backs up no sysctl).
        let sysctl = TUNED_SYSCTL.replace("IFNAME", IFNAME).replace('.', "/");
        let value = ctr_ns.run(|| fs::read_to_string(format!("/proc/sys/{sysctl}")))??;
        ensure!(value.trim() == "1", "{sysctl} = {value}");
        let backup = Path::new(TUNING_DIR).join(format!("{}_{IFNAME}.json", web.id));
        let saved = fs::read_to_string(&backup)
            .with_context(|| format!("no tuning backup {}", backup.display()))?;
        ensure!(saved.contains(&sysctl), "{}: {saved}", backup.display());

        // sbr: a rule from the container's address to table 100, which holds the default route.
        let ip = web.ip.to_string();
        let sbr_rule = |rules: &Value| {
            as_list(rules)
                .iter()
                .any(|r| r["src"] == json!(ip) && r["table"] == json!(SBR_TABLE))
        };
        let rules = ip_json_in(&ctr_ns, &["rule", "show"])?;
        ensure!(
            sbr_rule(&rules),
            "no rule from {ip} to table {SBR_TABLE}: {rules}"
        );
        let table = ip_json_in(&ctr_ns, &["route", "show", "table", SBR_TABLE])?;
        ensure!(
            as_list(&table).iter().any(|r| r["dst"] == "default"
                && r["gateway"] == json!(web.gateway.to_string())
                && r["dev"] == IFNAME),
            "no default via {} in table {SBR_TABLE}: {table}",
            web.gateway
        );
        let main = ip_json_in(&ctr_ns, &["route", "show", "table", "main"])?;
        ensure!(
            !as_list(&main).iter().any(|r| r["dst"] == "default"),
            "sbr left the default route in main: {main}"
        );

        fx.remove(&web)?;
        let mut reverse = OURS_IN_FULL_CHAIN;
        reverse.reverse();
        fx.ensure_logged_in_order(&reverse, "DEL", &web.id)?;
        fx.ensure_gone(&web)?;
        let links = fx.host.link_names()?;
        ensure!(
            !links.iter().any(|l| l.starts_with("bwp")),
            "IFBs left: {links:?}"
        );
        let qdiscs = tc_json(&fx.host, &["qdisc", "show"])?;
        ensure!(
            as_list(&qdiscs).iter().all(|q| q["kind"] == "noqueue"),
            "qdiscs left: {qdiscs}"
        );
        ensure!(!backup.exists(), "{} left", backup.display());
        // The namespace is held open: sbr's DEL, not its deletion, removed the rule.
        let rules = ip_json_in(&ctr_ns, &["rule", "show"])?;
        ensure!(!sbr_rule(&rules), "sbr's rule left: {rules}");
        let table = ip_json_in(&ctr_ns, &["route", "show", "table", SBR_TABLE])?;
        ensure!(
            as_list(&table).is_empty(),
            "table {SBR_TABLE} left: {table}"
        );
        Ok(())
    }
}
