//! Packaging: `make install`, the image's installer (`deploy/install.sh`), and the example
//! conflists of `deploy/examples/`, run with our plugins.
//!
//! `make install` and `install.sh` are run on the binaries cargo built for this test run (the
//! release build takes minutes, and the recipe does not depend on which build it copies). The
//! flannel and calico examples are run with Go `bridge` + `host-local` in place of their main
//! plugin, which cannot run here; everything after the main plugin is run exactly as written.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use tests::bins::{META_PLUGINS, plugin_dir};
use tests::netns::HOST_UPLINK_V4;
use tests::traffic::{TcpServer, http_get};
use tests::{NetworkConfigList, Runtime, RuntimeConf, Topology, main_plugin};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_owned)
}

fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    Ok(out)
}

/// What a plugin binary answers to VERSION.
fn version_of(binary: &Path) -> Result<String> {
    let mut child = Command::new(binary)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("{}", binary.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, br#"{"cniVersion":"1.1.0"}"#)?;
    }
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "{} VERSION failed", binary.display());
    Ok(String::from_utf8(out.stdout)?)
}

/// Every plugin is in `dir`, executable, the same program as the one built, and no temporary
/// file is left beside them.
fn assert_installed(dir: &Path) -> Result<()> {
    for plugin in META_PLUGINS {
        let installed = dir.join(plugin);
        let mode = std::fs::metadata(&installed)
            .with_context(|| format!("{} was not installed", installed.display()))?
            .permissions()
            .mode();
        ensure!(mode & 0o777 == 0o755, "{plugin} has mode {mode:o}");
        ensure!(
            std::fs::read(&installed)? == std::fs::read(plugin_dir()?.join(plugin))?,
            "{plugin} differs from the binary built"
        );
        ensure!(version_of(&installed)?.contains("supportedVersions"));
    }
    let strays: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    ensure!(strays.is_empty(), "left behind: {strays:?}");
    Ok(())
}

#[test]
fn make_install_puts_the_plugins_under_destdir_and_bindir() -> Result<()> {
    let stage = tempfile::tempdir()?;
    // An older plugin already there is replaced.
    let bindir = stage.path().join("opt/cni/bin");
    std::fs::create_dir_all(&bindir)?;
    std::fs::write(bindir.join("portmap"), "old")?;
    let out = run(Command::new("make")
        .current_dir(repo())
        // `build` is the release build; this test installs the binaries built for it instead.
        .args(["-s", "-o", "build", "install"])
        .arg(format!("RELEASE_DIR={}", plugin_dir()?.display()))
        .arg(format!("DESTDIR={}", stage.path().display())))?;
    ensure!(
        out.status.success(),
        "make install failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_installed(&bindir)?;

    let out = run(Command::new("make")
        .current_dir(repo())
        .args(["-s", "-o", "build", "install", "BINDIR=/usr/libexec/cni"])
        .arg(format!("RELEASE_DIR={}", plugin_dir()?.display()))
        .arg(format!("DESTDIR={}", stage.path().display())))?;
    ensure!(out.status.success());
    assert_installed(&stage.path().join("usr/libexec/cni"))
}

/// `make install-units` writes the repair units of `deploy/systemd/` under DESTDIR, with BINDIR
/// for the plugins' directory, and systemd finds nothing wrong in them (`systemd-analyze
/// verify`: syntax, dependencies, executables) for either plugin.
#[test]
fn make_install_units_writes_units_systemd_verifies_with_bindir_for_the_plugins() -> Result<()> {
    let stage = tempfile::tempdir()?;
    let bindir = plugin_dir()?;
    let out = run(Command::new("make")
        .current_dir(repo())
        .args(["-s", "install-units"])
        .arg(format!("BINDIR={}", bindir.display()))
        .arg(format!("DESTDIR={}", stage.path().display())))?;
    ensure!(
        out.status.success(),
        "make install-units failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unitdir = stage.path().join("etc/systemd/system");
    let mut names: Vec<String> = std::fs::read_dir(&unitdir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    ensure!(
        names == ["cni-reconcile-watch@.service", "cni-reconcile@.service"],
        "{names:?}"
    );
    for (unit, command) in [
        ("cni-reconcile@.service", "reconcile"),
        ("cni-reconcile-watch@.service", "reconcile --watch"),
    ] {
        let path = unitdir.join(unit);
        let mode = std::fs::metadata(&path)?.permissions().mode();
        ensure!(mode & 0o777 == 0o644, "{unit} has mode {mode:o}");
        let text = std::fs::read_to_string(&path)?;
        let exec = format!("ExecStart={}/%i {command}\n", bindir.display());
        ensure!(text.contains(&exec), "{unit} lacks {exec:?}: {text}");
        ensure!(!text.contains("/opt/cni/bin/"), "{unit}: {text}");
    }
    let instances: Vec<PathBuf> = ["cni-reconcile@", "cni-reconcile-watch@"]
        .iter()
        .flat_map(|u| ["portmap", "firewall"].map(|p| unitdir.join(format!("{u}{p}.service"))))
        .collect();
    let out = run(Command::new("systemd-analyze")
        .arg("verify")
        .args(&instances))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
    Ok(())
}

#[test]
fn the_image_installer_copies_every_plugin_and_refuses_one_that_does_not_run() -> Result<()> {
    let dest = tempfile::tempdir()?;
    let installer = repo().join("deploy/install.sh");
    let out = run(Command::new("sh")
        .arg(&installer)
        .arg(dest.path())
        .env("CNI_META_PLUGINS_SRC", plugin_dir()?))?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_installed(dest.path())?;

    // A source whose tuning cannot run: portmap is replaced, tuning is not, and the installer
    // fails naming it.
    let broken = tempfile::tempdir()?;
    for plugin in META_PLUGINS {
        std::fs::copy(plugin_dir()?.join(plugin), broken.path().join(plugin))?;
    }
    std::fs::write(broken.path().join("tuning"), "#!/bin/sh\nexit 1\n")?;
    std::fs::set_permissions(
        broken.path().join("tuning"),
        std::fs::Permissions::from_mode(0o755),
    )?;
    std::fs::write(dest.path().join("portmap"), "old")?;
    let out = run(Command::new("sh")
        .arg(&installer)
        .arg(dest.path())
        .env("CNI_META_PLUGINS_SRC", broken.path()))?;
    ensure!(
        !out.status.success(),
        "a plugin that cannot run was installed"
    );
    ensure!(String::from_utf8_lossy(&out.stderr).contains("tuning does not run"));
    ensure!(std::fs::read(dest.path().join("portmap"))? != b"old");
    assert_installed(dest.path())
}

/// An example conflist, with its main plugin replaced by Go `bridge` + `host-local` (over
/// `subnet`, state in `scratch`) unless it is `bridge` already.
fn example(name: &str, bridge: &str, subnet: &str, scratch: &Path) -> Result<NetworkConfigList> {
    let path = repo().join("deploy/examples").join(name);
    let mut conf: Value = serde_json::from_slice(&std::fs::read(&path)?)
        .with_context(|| format!("{} is not JSON", path.display()))?;
    let ipam_dir = scratch.join("ipam");
    let main = &mut conf["plugins"][0];
    if main["type"] == "bridge" {
        main["bridge"] = json!(bridge);
        main["ipam"]["ranges"] = json!([[{ "subnet": subnet }]]);
        main["ipam"]["dataDir"] = json!(ipam_dir);
    } else {
        *main = main_plugin::bridge(bridge, &[subnet], &ipam_dir);
    }
    // tuning's backups go where this test can see them.
    for plugin in conf["plugins"].as_array_mut().into_iter().flatten() {
        if plugin["type"] == "tuning" {
            plugin["dataDir"] = json!(scratch.join("tuning"));
        }
    }
    NetworkConfigList::from_value(&conf)
}

/// ADD (with port mappings and bandwidth limits as a runtime passes them), HTTP through the host
/// port, CHECK where the version has it, DEL, and nothing of the attachment left.
fn run_example(name: &str, bridge: &str, subnet: &str, host_port: u16) -> Result<()> {
    let topo = Topology::new("pkgex")?;
    let scratch = tempfile::tempdir()?;
    let list = example(name, bridge, subnet, scratch.path())?;
    let runtime = Runtime::new(&topo.host)?;
    let rt = RuntimeConf::new("example-1", topo.container.path(), "eth0")
        .with_capability(
            "portMappings",
            json!([{ "hostPort": host_port, "containerPort": 80, "protocol": "tcp" }]),
        )
        .with_capability(
            "bandwidth",
            json!({ "ingressRate": 20_000_000, "ingressBurst": 200_000,
                    "egressRate": 20_000_000, "egressBurst": 200_000 }),
        );
    let result = runtime.add(&list, &rt)?;
    let _web = TcpServer::http(
        &topo.container,
        SocketAddr::from(([0, 0, 0, 0], 80)),
        "example\n",
    )?;
    let mapped: SocketAddr = format!("{HOST_UPLINK_V4}:{host_port}").parse()?;
    let reply = http_get(&topo.client, mapped, "/", Duration::from_secs(3))
        .with_context(|| format!("{name}: HTTP through the mapped port"))?;
    ensure!(reply.status == 200 && reply.body == "example\n");
    let ifb = result["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["name"].as_str())
        .find(|n| n.starts_with("bwp"))
        .with_context(|| format!("{name}: bandwidth made no IFB: {result}"))?
        .to_owned();
    ensure!(topo.host.has_link(&ifb)?);
    if list.cni_version.as_str() >= "0.4.0" {
        runtime.check(&list, &rt)?;
    }
    runtime.del(&list, &rt)?;
    ensure!(!topo.host.has_link(&ifb)?, "{name}: the IFB is left");
    let ruleset = topo.host.exec_ok("nft", &["list", "ruleset"])?;
    ensure!(
        !ruleset.contains("example-1"),
        "{name}: elements left:\n{ruleset}"
    );
    let leftovers = std::fs::read_dir(scratch.path().join("tuning"))
        .map(|d| d.count())
        .unwrap_or(0);
    ensure!(
        leftovers == 0,
        "{name}: tuning left {leftovers} backup file(s)"
    );
    Ok(())
}

#[test]
fn the_bridge_example_runs_as_written() -> Result<()> {
    run_example("bridge.conflist", "cni-pkgex0", "10.91.0.0/24", 18091)
}

#[test]
fn the_bridge_nftables_example_runs_as_written() -> Result<()> {
    run_example(
        "bridge-nftables.conflist",
        "cni-pkgex3",
        "10.91.3.0/24",
        18094,
    )
}

#[test]
fn the_k3s_flannel_example_runs_after_a_stand_in_main_plugin() -> Result<()> {
    run_example("k3s-flannel.conflist", "cni-pkgex1", "10.91.1.0/24", 18092)
}

#[test]
fn the_calico_example_runs_after_a_stand_in_main_plugin() -> Result<()> {
    run_example("calico.conflist", "cni-pkgex2", "10.91.2.0/24", 18093)
}
