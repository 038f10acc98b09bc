//! Named network namespaces for tests, removed when dropped (also while unwinding from a panic).
//!
//! A [`TestNetns`] is what `ip netns add` makes: an empty file `/run/netns/<name>` with the
//! namespace bind-mounted on it, so its path works as `CNI_NETNS`, with `nsenter --net=<path>`
//! and with `ip netns exec` / `ip link ... netns <name>`. Commands run inside are spawned from a
//! thread that entered the namespace (never with `ip netns exec`, which also remounts `/sys`).
//! IPv6 duplicate address detection is off in every test namespace, so addresses are usable at
//! once.
//!
//! [`Topology`] builds the usual three namespaces of a chain test: a "host" where the main
//! plugin and the host-side plugins run, a "container" (`CNI_NETNS`) and a "client" joined to the
//! host by a veth for traffic from outside.

use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use host::netns::{NetNs, THREAD_NETNS};
use host::sysctl::{Sysctl, SysctlKey};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};

use crate::process;

/// Directory where `iproute2` and this harness keep named namespaces.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// Deadline of a command run with [`TestNetns::exec`].
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest prefix kept in a namespace name; the pid and a counter follow it.
const MAX_PREFIX: usize = 16;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Makes `/run/netns` (created if missing: a test may have covered `/run` in a mount namespace
/// of its own) a shared mount point of its own, as `ip netns add` does. Otherwise the first
/// tool that does (podman's netns code binds the directory onto itself when it is not a mount
/// point yet) hides the namespaces made before it under its bind mount, where their drop can
/// neither unmount nor remove them. Serialised: two binds at once would stack, the second
/// hiding what is made under the first.
fn netns_dir_mounted() -> Result<()> {
    static BINDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _binding = BINDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    std::fs::create_dir_all(NETNS_RUN_DIR)
        .with_context(|| format!("failed to create {NETNS_RUN_DIR}"))?;
    let shared = || {
        mount(
            None::<&str>,
            NETNS_RUN_DIR,
            None::<&str>,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
    };
    match shared() {
        Ok(()) => {}
        // Not a mount point yet.
        Err(nix::errno::Errno::EINVAL) => {
            let dir = Path::new(NETNS_RUN_DIR);
            crate::mounts::rbind(dir, dir)?;
            shared().with_context(|| format!("failed to make {NETNS_RUN_DIR} shared"))?;
        }
        Err(e) => return Err(e).with_context(|| format!("failed to make {NETNS_RUN_DIR} shared")),
    }
    Ok(())
}

/// A named network namespace at `/run/netns/<name>`, deleted on drop.
#[derive(Debug)]
pub struct TestNetns {
    name: String,
    path: PathBuf,
    deleted: bool,
}

impl TestNetns {
    /// Creates a fresh namespace named `<prefix>-<pid>-<n>` with `lo` up.
    ///
    /// # Errors
    /// When not running as root (`unshare`/`mount` need `CAP_SYS_ADMIN`), or `ip` fails.
    pub fn new(prefix: &str) -> Result<TestNetns> {
        let prefix: String = prefix
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(MAX_PREFIX)
            .collect();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        let path = Path::new(NETNS_RUN_DIR).join(&name);

        netns_dir_mounted()?;
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&path)
            .with_context(|| format!("failed to create mount point {}", path.display()))?;
        // From here on, Drop removes whatever exists.
        let ns = TestNetns {
            name,
            path,
            deleted: false,
        };
        let target = ns.path.clone();
        // unshare on a throwaway thread: the test's own thread keeps its namespace, and the bind
        // mount keeps the new one alive after the thread exits.
        std::thread::spawn(move || -> Result<()> {
            unshare(CloneFlags::CLONE_NEWNET)
                .context("unshare(CLONE_NEWNET) failed: creating namespaces needs root")?;
            mount(
                Some(THREAD_NETNS),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .with_context(|| format!("failed to bind-mount {THREAD_NETNS} on {target:?}"))?;
            Ok(())
        })
        .join()
        .map_err(|_| anyhow!("namespace creation thread panicked"))??;
        ns.ip(&["link", "set", "lo", "up"])?;
        // Without duplicate address detection, an IPv6 address is usable (and chosen as a
        // source) as soon as it is added: tests need not race the tentative state.
        for key in [
            "net.ipv6.conf.all.accept_dad",
            "net.ipv6.conf.default.accept_dad",
        ] {
            match ns.set_sysctl(key, "0") {
                Ok(()) => {}
                // A kernel without IPv6 has no such key, and no DAD either.
                Err(e)
                    if e.chain().any(|c| {
                        c.downcast_ref::<host::sysctl::SysctlError>()
                            .is_some_and(|s| s.is_not_found())
                    }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ns)
    }

    /// The namespace's name (as `ip netns` shows it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's path, `/run/netns/<name>` (use it as `CNI_NETNS`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the namespace.
    ///
    /// # Errors
    /// When it was deleted or cannot be opened.
    pub fn netns(&self) -> Result<NetNs> {
        if self.deleted {
            bail!("netns {} was deleted", self.name);
        }
        Ok(NetNs::open(&self.path)?)
    }

    /// Runs `f` on a thread inside the namespace and returns its result.
    ///
    /// # Errors
    /// When the namespace cannot be entered. A panic of `f` propagates.
    pub fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> Result<T> {
        Ok(self.netns()?.run(f)?)
    }

    /// Runs `program args...` inside the namespace and returns its output, whatever its exit
    /// status (killed after [`EXEC_TIMEOUT`]).
    ///
    /// # Errors
    /// When the program cannot be started or times out.
    pub fn exec<S: AsRef<OsStr>>(&self, program: &str, args: &[S]) -> Result<Output> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        self.output(&mut cmd, b"", EXEC_TIMEOUT)
    }

    /// Runs `program args...` inside the namespace, requires exit status 0 and returns stdout.
    ///
    /// # Errors
    /// When the program fails, with its stderr in the message.
    pub fn exec_ok<S: AsRef<OsStr>>(&self, program: &str, args: &[S]) -> Result<String> {
        let out = self.exec(program, args)?;
        if !out.status.success() {
            let line: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
            bail!(
                "`{program} {}` in netns {} failed ({}): {}",
                line.join(" "),
                self.name,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs a prepared command inside the namespace with `stdin`, killed after `timeout`.
    ///
    /// # Errors
    /// When the program cannot be started or times out.
    pub fn output(&self, cmd: &mut Command, stdin: &[u8], timeout: Duration) -> Result<Output> {
        process::run_in(&self.netns()?, cmd, stdin, timeout)
    }

    /// Starts a prepared command inside the namespace and returns the running child (the caller
    /// must kill and reap it, e.g. with [`process::kill_and_reap`]).
    ///
    /// # Errors
    /// When the program cannot be started.
    pub fn spawn(&self, cmd: &mut Command) -> Result<Child> {
        process::spawn_in(&self.netns()?, cmd)
    }

    /// Runs `ip args...` inside the namespace and returns its stdout.
    ///
    /// # Errors
    /// When `ip` fails.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        self.exec_ok("ip", args)
    }

    /// Runs `ip -j args...` inside the namespace and parses its JSON output.
    ///
    /// # Errors
    /// When `ip` fails or prints something that is not JSON.
    pub fn ip_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut full = vec!["-j"];
        full.extend_from_slice(args);
        let out = self.ip(&full)?;
        if out.trim().is_empty() {
            return Ok(serde_json::Value::Array(Vec::new()));
        }
        serde_json::from_str(&out).with_context(|| format!("`ip -j {}`: {out}", args.join(" ")))
    }

    /// Names of the links in the namespace.
    ///
    /// # Errors
    /// When `ip` fails.
    pub fn link_names(&self) -> Result<Vec<String>> {
        let links = self.ip_json(&["link", "show"])?;
        Ok(links
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// True when a link called `ifname` exists in the namespace.
    ///
    /// # Errors
    /// When `ip` fails.
    pub fn has_link(&self, ifname: &str) -> Result<bool> {
        Ok(self.link_names()?.iter().any(|n| n == ifname))
    }

    /// Reads a sysctl of this namespace, e.g. `net.ipv4.ip_forward` or `net/ipv4/ip_forward`.
    ///
    /// # Errors
    /// When the key does not exist.
    pub fn sysctl(&self, key: &str) -> Result<String> {
        let key = SysctlKey::parse(key)?;
        Ok(self
            .run(|| Sysctl::default().read(&key))??
            .trim()
            .to_owned())
    }

    /// Writes a sysctl of this namespace (the file is opened from inside, so it is this
    /// namespace's copy).
    ///
    /// # Errors
    /// When the key does not exist or the value is refused.
    pub fn set_sysctl(&self, key: &str, value: &str) -> Result<()> {
        let key = SysctlKey::parse(key)?;
        Ok(self.run(|| Sysctl::default().write(&key, value))??)
    }

    /// Removes the namespace now (its path disappears; further calls on it fail). Dropping it
    /// afterwards does nothing.
    ///
    /// # Errors
    /// When unmounting or removing the path fails.
    pub fn delete(&mut self) -> Result<()> {
        if self.deleted {
            return Ok(());
        }
        self.deleted = true;
        remove_plugin_state(&self.path);
        remove(&self.path)
    }
}

/// The directories our plugins keep per host namespace, named after its inode: portmap's and
/// firewall's state and locks.
pub fn plugin_state_dirs(ino: u64) -> [PathBuf; 2] {
    [
        PathBuf::from(format!("/run/cni/portmap/net-{ino}")),
        PathBuf::from(format!("/run/cni-firewall/{ino}")),
    ]
}

/// [`plugin_state_dirs`] of a host namespace, removed now (a fresh namespace may reuse the
/// inode of one whose state a killed run left) and when dropped, for tests and benches that
/// install attachments they never delete one by one.
#[derive(Debug)]
pub struct StateDirs(Vec<PathBuf>);

impl StateDirs {
    /// The state directories of `host`, emptied.
    ///
    /// # Errors
    /// When the namespace cannot be stat'ed.
    pub fn of(host: &TestNetns) -> anyhow::Result<StateDirs> {
        use std::os::unix::fs::MetadataExt as _;
        let ino = std::fs::metadata(host.path())?.ino();
        let dirs = StateDirs(plugin_state_dirs(ino).to_vec());
        dirs.remove();
        Ok(dirs)
    }

    /// portmap's, then firewall's.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.0
    }

    fn remove(&self) {
        for dir in &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for StateDirs {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Removes [`plugin_state_dirs`] of the namespace at `path`. A node's namespace lives as long as
/// the node, so nothing removes them there; a test's namespace goes away, and they go with it.
/// Called while the namespace is still mounted, so that no other namespace can have taken over
/// its inode number yet.
pub(crate) fn remove_plugin_state(path: &Path) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(ino) = std::fs::metadata(path).map(|m| m.ino()) else {
        return;
    };
    for dir in plugin_state_dirs(ino) {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => eprintln!("failed to remove {}: {e}", dir.display()),
        }
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        if let Err(e) = self.delete() {
            eprintln!("failed to remove test netns {}: {e:#}", self.name);
        }
    }
}

fn remove(path: &Path) -> Result<()> {
    match umount2(path, MntFlags::MNT_DETACH) {
        // EINVAL: not a mount point (creation failed before the mount).
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(e).with_context(|| format!("failed to unmount {path:?}")),
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("failed to remove {path:?}")),
    }
}

/// Joins namespaces `a` and `b` with a veth pair `a_if`/`b_if`, gives each end the addresses
/// listed (CIDR notation, IPv6 without duplicate address detection) and sets both ends up.
///
/// # Errors
/// When `ip` fails (e.g. a name is taken or longer than 15 bytes).
pub fn veth_pair(
    a: &TestNetns,
    a_if: &str,
    a_addrs: &[&str],
    b: &TestNetns,
    b_if: &str,
    b_addrs: &[&str],
) -> Result<()> {
    a.ip(&[
        "link",
        "add",
        a_if,
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ])?;
    for (ns, ifname, addrs) in [(a, a_if, a_addrs), (b, b_if, b_addrs)] {
        for addr in addrs {
            let mut args = vec!["addr", "add", addr, "dev", ifname];
            if addr.contains(':') {
                args.push("nodad");
            }
            ns.ip(&args)?;
        }
        ns.ip(&["link", "set", ifname, "up"])?;
    }
    Ok(())
}

/// Host-side interface of the host–client link in a [`Topology`].
pub const HOST_UPLINK_IF: &str = "uplink0";
/// Client-side interface of the host–client link in a [`Topology`].
pub const CLIENT_IF: &str = "eth0";
/// IPv4 address of the host on the client link.
pub const HOST_UPLINK_V4: &str = "10.98.0.1";
/// IPv4 address of the client.
pub const CLIENT_V4: &str = "10.98.0.2";
/// IPv6 address of the host on the client link.
pub const HOST_UPLINK_V6: &str = "fd98::1";
/// IPv6 address of the client.
pub const CLIENT_V6: &str = "fd98::2";

/// The three namespaces of a chain test.
///
/// `host` is where the main plugin (`bridge`/`ptp`) and the host-side meta plugins run, with IPv4
/// and IPv6 forwarding on; `container` is empty (give its path as `CNI_NETNS`); `client` is joined
/// to `host` by a veth ([`CLIENT_IF`] `10.98.0.2/24` `fd98::2/64` ↔ [`HOST_UPLINK_IF`]
/// `10.98.0.1/24` `fd98::1/64`) and routes everything through the host.
#[derive(Debug)]
pub struct Topology {
    /// Where plugins run.
    pub host: TestNetns,
    /// The container's namespace.
    pub container: TestNetns,
    /// An outside machine, one hop from the host.
    pub client: TestNetns,
}

impl Topology {
    /// Creates the three namespaces (named `<prefix>-host-…`, `<prefix>-ctr-…`,
    /// `<prefix>-cli-…`) and the host–client link.
    ///
    /// # Errors
    /// As [`TestNetns::new`] and [`veth_pair`].
    pub fn new(prefix: &str) -> Result<Topology> {
        let short: String = prefix.chars().take(MAX_PREFIX - 4).collect();
        let topo = Topology {
            host: TestNetns::new(&format!("{short}-host"))?,
            container: TestNetns::new(&format!("{short}-ctr"))?,
            client: TestNetns::new(&format!("{short}-cli"))?,
        };
        veth_pair(
            &topo.host,
            HOST_UPLINK_IF,
            &[
                &format!("{HOST_UPLINK_V4}/24"),
                &format!("{HOST_UPLINK_V6}/64"),
            ],
            &topo.client,
            CLIENT_IF,
            &[&format!("{CLIENT_V4}/24"), &format!("{CLIENT_V6}/64")],
        )?;
        topo.client
            .ip(&["route", "add", "default", "via", HOST_UPLINK_V4])?;
        topo.client
            .ip(&["-6", "route", "add", "default", "via", HOST_UPLINK_V6])?;
        topo.host.set_sysctl("net.ipv4.ip_forward", "1")?;
        topo.host.set_sysctl("net.ipv6.conf.all.forwarding", "1")?;
        Ok(topo)
    }
}

/// Waits (up to 20 s) until `host` gives no namespace the id `nsid` any more: the kernel has
/// destroyed the namespace that had it, and a plugin's reconcile proves it gone.
///
/// # Errors
/// When the id stays, or `ip netns list-id` fails.
pub fn wait_id_gone(host: &TestNetns, nsid: i64) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while host
        .ip(&["netns", "list-id"])?
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&nsid.to_string()))
    {
        if std::time::Instant::now() > deadline {
            bail!("namespace id {nsid} stays");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
