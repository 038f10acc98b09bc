//! Other nodes' userlands on this kernel: Debian 11, 12 and 13 root filesystems with their own
//! `iptables` (1.8.7, 1.8.9, 1.8.11), `nft`, `iproute2` and Go `containernetworking-plugins`
//! (0.9.0, 1.1.1, 1.1.1), in which our plugins run as they would on such a node: with that
//! release's tools on `PATH`.
//!
//! # The root filesystems
//!
//! [`rootfs`] makes each with `debootstrap` from Debian's archive the first time it is asked
//! for (about 30 s each), into a cache outside the checkout (`/var/cache/cni-rs/userlands`,
//! or [`CACHE_ENV`]), and finds it there afterwards: a warm run costs a stamp file's read. The
//! stamp names the release and the packages, so a change of either makes the cache anew.
//! Concurrent runs wait for one another on a lock file. [`MIRROR_ENV`] names another mirror
//! than `debootstrap`'s default.
//!
//! # A node
//!
//! [`with_node`] runs a closure on a thread with a private mount namespace in which the
//! cached tree is the lower layer of an overlay, so nothing a test does reaches the cache:
//! the flavour ([`Flavour`]: `update-alternatives`, as an operator switches it), IPAM and
//! plugin state, our plugins' lock files. Inside, `/proc`, `/sys`, `/dev` and `/run/netns` are
//! the machine's, `/run` and `/tmp` are empty, and our plugins are this build's binaries under
//! `/opt/cni-rs/bin`. The machine's debug build links this machine's glibc, which Debian 11's
//! cannot run, so each is started by a two-line script through this machine's dynamic loader
//! and C library (bound read-only at `/run/host-lib`); a static release binary carries its C
//! library the same way. Everything else the plugin touches is the node's: the `iptables`,
//! `iptables-save`, `iptables-restore` and `nft` it finds on `PATH` and runs are that
//! release's, with that release's libraries and extensions.
//!
//! Tools run through [`Node::command`] (`chroot` into the node, Debian's `PATH`), inside a
//! test's network namespace; plugins through the [`Runtime`] of [`Node::runtime`], whose
//! search directories are the node's `/opt/cni-rs/bin` (ours) and `/usr/lib/cni` (Go).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use nix::mount::{MsFlags, mount};

use crate::bins;
use crate::mounts;
use crate::netns::TestNetns;
use crate::process;
use crate::runtime::Runtime;

/// Where the root filesystems are cached, when set; else [`DEFAULT_CACHE`].
pub const CACHE_ENV: &str = "CNI_RS_USERLAND_CACHE";

/// The cache outside the checkout.
pub const DEFAULT_CACHE: &str = "/var/cache/cni-rs/userlands";

/// The Debian mirror `debootstrap` fetches from, when set; else its own default, Debian's
/// archive.
pub const MIRROR_ENV: &str = "CNI_RS_DEBIAN_MIRROR";

/// The packages each root filesystem holds besides Debian's minimal base.
pub const PACKAGES: [&str; 4] = [
    "iptables",
    "nftables",
    "iproute2",
    "containernetworking-plugins",
];

/// Debian's `PATH` for root, the one plugins and tools see on the node.
pub const NODE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where our plugins are on the node.
pub const OUR_DIR: &str = "/opt/cni-rs/bin";

/// Where the Go plugins are on the node (Debian's package).
pub const GO_DIR: &str = "/usr/lib/cni";

/// How long one `debootstrap` may take.
const DEBOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(900);

/// How long a tool run in the node may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// One Debian release and what it ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// The codename (`bullseye`): the suite `debootstrap` fetches.
    pub codename: &'static str,
    /// Debian's version number.
    pub debian: &'static str,
    /// Its `iptables`.
    pub iptables: &'static str,
    /// Its Go `containernetworking-plugins`.
    pub go_plugins: &'static str,
    /// The newest CNI version its Go plugins speak.
    pub cni_version: &'static str,
}

/// Debian 11, 12 and 13.
pub const RELEASES: [Release; 3] = [BULLSEYE, BOOKWORM, TRIXIE];

/// Debian 11: iptables 1.8.7, Go plugins 0.9.0 (CNI up to 0.4.0).
pub const BULLSEYE: Release = Release {
    codename: "bullseye",
    debian: "11",
    iptables: "1.8.7",
    go_plugins: "0.9.0",
    cni_version: "0.4.0",
};

/// Debian 12: iptables 1.8.9, Go plugins 1.1.1 (CNI up to 1.0.0).
pub const BOOKWORM: Release = Release {
    codename: "bookworm",
    debian: "12",
    iptables: "1.8.9",
    go_plugins: "1.1.1",
    cni_version: "1.0.0",
};

/// Debian 13: iptables 1.8.11, Go plugins 1.1.1 (CNI up to 1.0.0).
pub const TRIXIE: Release = Release {
    codename: "trixie",
    debian: "13",
    iptables: "1.8.11",
    go_plugins: "1.1.1",
    cni_version: "1.0.0",
};

/// Which iptables the node's `iptables` is (Debian's alternatives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// `iptables-nft` (Debian's default since 10).
    Nft,
    /// `iptables-legacy`.
    Legacy,
}

impl Flavour {
    /// Both, the default first.
    pub const BOTH: [Flavour; 2] = [Flavour::Nft, Flavour::Legacy];

    /// `nft` or `legacy`, as the alternatives name them.
    pub fn name(self) -> &'static str {
        match self {
            Flavour::Nft => "nft",
            Flavour::Legacy => "legacy",
        }
    }
}

impl std::fmt::Display for Flavour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn cache_dir() -> PathBuf {
    std::env::var_os(CACHE_ENV).map_or_else(|| PathBuf::from(DEFAULT_CACHE), PathBuf::from)
}

/// What the stamp of a complete root filesystem of `release` says.
fn stamp_text(release: &Release) -> String {
    format!(
        "debootstrap --variant=minbase --include={} {}\n",
        PACKAGES.join(","),
        release.codename
    )
}

/// The root filesystem of `release`, from the cache, made there first when it is missing or
/// was made for other packages.
///
/// # Errors
/// When `debootstrap` is missing or fails (Debian's archive unreachable), or the cache cannot
/// be written.
pub fn rootfs(release: &Release) -> Result<PathBuf> {
    let cache = cache_dir();
    let dir = cache.join(release.codename);
    let stamp = dir.join(".cni-rs-userland");
    let want = stamp_text(release);
    let complete = || std::fs::read_to_string(&stamp).is_ok_and(|s| s == want);
    if complete() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&cache)
        .with_context(|| format!("failed to create {}", cache.display()))?;
    let _lock = host::lock::FileLock::acquire(
        cache.join(format!("{}.lock", release.codename)),
        DEBOOTSTRAP_TIMEOUT,
    )
    .context("waiting for another run making the same root filesystem")?;
    if complete() {
        return Ok(dir);
    }
    let debootstrap = bins::on_path("debootstrap")
        .context("debootstrap makes the Debian root filesystems: run scripts/setup.sh")?;
    let partial = cache.join(format!("{}.partial", release.codename));
    for stale in [&partial, &dir] {
        if stale.exists() {
            std::fs::remove_dir_all(stale)
                .with_context(|| format!("failed to remove {}", stale.display()))?;
        }
    }
    let mirror = std::env::var_os(MIRROR_ENV);
    eprintln!(
        "userland: making the Debian {} ({}) root filesystem in {}",
        release.debian,
        release.codename,
        dir.display()
    );
    let started = std::time::Instant::now();
    let mut cmd = Command::new(&debootstrap);
    cmd.args([
        "--variant=minbase",
        &format!("--include={}", PACKAGES.join(",")),
        release.codename,
    ])
    .arg(&partial);
    if let Some(mirror) = &mirror {
        cmd.arg(mirror);
    }
    let child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {}", debootstrap.display()))?;
    let out = process::wait_with_deadline(child, Vec::new(), DEBOOTSTRAP_TIMEOUT)?;
    if !out.status.success() {
        let log = std::fs::read_to_string(partial.join("debootstrap/debootstrap.log"))
            .unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        bail!(
            "debootstrap of {} failed ({}): {}{}\n{}",
            release.codename,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    std::fs::write(partial.join(".cni-rs-userland"), &want)?;
    std::fs::rename(&partial, &dir)
        .with_context(|| format!("failed to move {} into place", partial.display()))?;
    eprintln!(
        "userland: {} ready in {:.0?}",
        release.codename,
        started.elapsed()
    );
    Ok(dir)
}

/// A node of `release` with `flavour` iptables, mounted for the duration of [`with_node`].
#[derive(Debug)]
pub struct Node {
    release: Release,
    flavour: Flavour,
    root: PathBuf,
}

/// Runs `f` with a node of `release` whose `iptables` is `flavour`, on a thread with a private
/// mount namespace (see the module doc). The network namespaces the node's plugins and tools
/// work in must exist before: the node sees `/run/netns` as it was when it was mounted.
///
/// # Errors
/// The root filesystem's ([`rootfs`]), a mount's, or `f`'s.
pub fn with_node<T: Send>(
    release: Release,
    flavour: Flavour,
    f: impl FnOnce(&Node) -> Result<T> + Send,
) -> Result<T> {
    let lower = rootfs(&release)?;
    let scratch = tempfile::Builder::new()
        .prefix(&format!("cni-rs-node-{}-", release.codename))
        .tempdir()
        .context("failed to create the node's scratch dir")?;
    let top = scratch.path().to_path_buf();
    mounts::with_private_mounts(
        || Ok(()),
        || {
            let node = Node::mount(release, flavour, &lower, &top)?;
            f(&node)
        },
    )
}

impl Node {
    /// Mounts the overlay and what the node sees under `top` (in the calling thread's private
    /// mount namespace) and selects `flavour`.
    fn mount(release: Release, flavour: Flavour, lower: &Path, top: &Path) -> Result<Node> {
        mount(
            Some("tmpfs"),
            top,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("mode=0755"),
        )
        .context("tmpfs for the node's overlay")?;
        let (upper, work, root) = (top.join("upper"), top.join("work"), top.join("root"));
        for dir in [&upper, &work, &root] {
            std::fs::create_dir(dir)?;
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        mount(
            Some("overlay"),
            &root,
            Some("overlay"),
            MsFlags::empty(),
            Some(options.as_str()),
        )
        .with_context(|| format!("overlay on {}", lower.display()))?;
        let inside = |path: &str| root.join(path.trim_start_matches('/'));
        for dir in ["/proc", "/sys", "/dev"] {
            mounts::rbind(Path::new(dir), &inside(dir))?;
        }
        for dir in ["/run", "/tmp"] {
            mount(
                Some("tmpfs"),
                &inside(dir),
                Some("tmpfs"),
                MsFlags::empty(),
                Some("mode=0755"),
            )
            .with_context(|| format!("tmpfs on the node's {dir}"))?;
        }
        for dir in ["/run/netns", "/run/host-lib", "/run/cni-rs-build"] {
            std::fs::create_dir_all(inside(dir))?;
        }
        if Path::new(crate::netns::NETNS_RUN_DIR).exists() {
            mounts::rbind(
                Path::new(crate::netns::NETNS_RUN_DIR),
                &inside("/run/netns"),
            )?;
        }
        let host_lib = host_lib_dir()?;
        mounts::bind(&host_lib, &inside("/run/host-lib"), true)?;
        let build = bins::plugin_dir()?;
        mounts::bind(&build, &inside("/run/cni-rs-build"), true)?;
        let ours = inside(OUR_DIR);
        std::fs::create_dir_all(&ours)?;
        for plugin in bins::META_PLUGINS {
            let script = ours.join(plugin);
            std::fs::write(
                &script,
                format!(
                    "#!/bin/sh\n\
                     exec /run/host-lib/{LOADER} --library-path /run/host-lib \
                     /run/cni-rs-build/{plugin} \"$@\"\n"
                ),
            )?;
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
        }
        let node = Node {
            release,
            flavour,
            root,
        };
        for tool in ["iptables", "ip6tables"] {
            let alternative = format!("/usr/sbin/{tool}-{}", flavour.name());
            let out = node.run(
                None,
                "update-alternatives",
                &["--set", tool, &alternative],
                b"",
            )?;
            ensure!(
                out.status.success(),
                "update-alternatives --set {tool} {alternative}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(node)
    }

    /// The release.
    pub fn release(&self) -> Release {
        self.release
    }

    /// The iptables flavour.
    pub fn flavour(&self) -> Flavour {
        self.flavour
    }

    /// The node's `/`, as this process sees it (inside [`with_node`] only).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `path` of the node, as this process sees it.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// `program` of the node (found on the node's `PATH`) with `args`, run in the node:
    /// `chroot` into it, with Debian's `PATH` and no `CNI_*` variable.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("/usr/sbin/chroot");
        cmd.arg(&self.root).arg(program).args(args);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CNI_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("PATH", NODE_PATH);
        cmd
    }

    /// Runs `program` of the node with `args` and `stdin` in `ns` (the node's own network
    /// namespace is never used: `None` runs it where the calling thread is, for commands that
    /// touch no network state).
    ///
    /// # Errors
    /// When it cannot be started or does not finish in time; a failure exit is not an error.
    pub fn run(
        &self,
        ns: Option<&TestNetns>,
        program: &str,
        args: &[&str],
        stdin: &[u8],
    ) -> Result<Output> {
        let mut cmd = self.command(program, args);
        let what = format!("{} {program} {}", self.release.codename, args.join(" "));
        match ns {
            Some(ns) => process::run_in(&ns.netns()?, &mut cmd, stdin, TOOL_TIMEOUT),
            None => {
                cmd.stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped());
                let child = cmd.spawn()?;
                process::wait_with_deadline(child, stdin.to_vec(), TOOL_TIMEOUT)
            }
        }
        .with_context(|| what)
    }

    /// As [`Node::run`] in `ns`, failing unless it succeeds; returns stdout.
    ///
    /// # Errors
    /// When it fails, with what it printed.
    pub fn run_ok(&self, ns: &TestNetns, program: &str, args: &[&str]) -> Result<String> {
        let out = self.run(Some(ns), program, args, b"")?;
        ensure!(
            out.status.success(),
            "{} {program} {}: {}{}",
            self.release.codename,
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `table` of `tool` (`iptables`, `ip6tables`) in `ns` as the node's `<tool>-save` prints
    /// it: the chain declarations without counters and the rules, in order.
    ///
    /// # Errors
    /// When the tool fails.
    pub fn save(&self, ns: &TestNetns, tool: &str, table: &str) -> Result<Vec<String>> {
        let text = self.run_ok(ns, &format!("{tool}-save"), &["-t", table])?;
        Ok(saved_lines(&text))
    }

    /// `iptables-save | iptables-restore` of both families in `ns`, with the node's tools.
    ///
    /// # Errors
    /// When either fails.
    pub fn save_restore(&self, ns: &TestNetns) -> Result<()> {
        for tool in ["iptables", "ip6tables"] {
            let saved = self.run_ok(ns, &format!("{tool}-save"), &[])?;
            let out = self.run(Some(ns), &format!("{tool}-restore"), &[], saved.as_bytes())?;
            ensure!(
                out.status.success(),
                "{tool}-restore of its own save: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// A runtime running plugins in `host` inside the node, ours from [`OUR_DIR`] and the Go
    /// ones from [`GO_DIR`] (only the Go ones when `go_only`).
    ///
    /// # Errors
    /// The runtime's.
    pub fn runtime(&self, host: &TestNetns, go_only: bool) -> Result<Runtime> {
        let dirs = if go_only {
            vec![PathBuf::from(GO_DIR)]
        } else {
            vec![PathBuf::from(OUR_DIR), PathBuf::from(GO_DIR)]
        };
        Ok(Runtime::new(host)?
            .with_bin_dir(OUR_DIR)
            .with_plugin_dirs(dirs)
            .in_root(&self.root)
            .with_env("PATH", NODE_PATH))
    }
}

/// The dynamic loader of this machine's C library, in [`host_lib_dir`].
const LOADER: &str = "ld-linux-x86-64.so.2";

/// The directory holding this machine's dynamic loader and C library.
fn host_lib_dir() -> Result<PathBuf> {
    let dir = PathBuf::from("/usr/lib/x86_64-linux-gnu");
    ensure!(
        dir.join(LOADER).exists() && dir.join("libc.so.6").exists(),
        "{} holds no {LOADER} and libc.so.6: the userland nodes run this machine's build \
         through its loader, on x86-64 Debian or Ubuntu",
        dir.display()
    );
    Ok(dir)
}

/// `iptables-save` output as compared: chain declarations (`:NAME POLICY`, no counters) and
/// rules, without comments, table headers and `COMMIT`.
pub fn saved_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with(':') || l.starts_with("-A "))
        .map(|l| match l.strip_prefix(':') {
            Some(decl) => {
                let mut words = decl.split_whitespace();
                format!(
                    ":{} {}",
                    words.next().unwrap_or_default(),
                    words.next().unwrap_or_default()
                )
            }
            None => l.to_owned(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_lines_keep_chains_without_counters_and_rules() {
        let text = "# Generated by iptables-save v1.8.7 on x\n*nat\n:PREROUTING ACCEPT [3:180]\n\
                    :CNI-DN-x - [0:0]\n-A CNI-DN-x -p tcp -m tcp --dport 80 -j RETURN\nCOMMIT\n";
        assert_eq!(
            saved_lines(text),
            [
                ":PREROUTING ACCEPT",
                ":CNI-DN-x -",
                "-A CNI-DN-x -p tcp -m tcp --dport 80 -j RETURN"
            ]
        );
    }

    #[test]
    fn each_release_s_stamp_names_it_and_the_packages() {
        assert_eq!(
            stamp_text(&BULLSEYE),
            "debootstrap --variant=minbase --include=iptables,nftables,iproute2,containernetworking-plugins bullseye\n"
        );
    }
}
