//! Where the plugin binaries are: ours in cargo's target directory, the Go reference plugins in
//! `/usr/lib/cni` (Debian's `containernetworking-plugins`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Overrides the directory of our plugin binaries.
pub const BIN_DIR_ENV: &str = "CNI_TEST_BIN_DIR";
/// Overrides the directory of the Go reference plugins.
pub const REFERENCE_DIR_ENV: &str = "CNI_REFERENCE_DIR";
/// Where Debian installs the Go reference plugins.
pub const DEFAULT_REFERENCE_DIR: &str = "/usr/lib/cni";
/// The plugins this project replaces; the runtime never silently falls back to the Go binary of
/// one of these when ours is missing.
pub const META_PLUGINS: [&str; 5] = ["portmap", "tuning", "bandwidth", "firewall", "sbr"];

/// Directory of our plugin binaries: `$CNI_TEST_BIN_DIR`, else the cargo profile directory
/// (`target/<profile>`) of the running test executable.
///
/// # Errors
/// When the running executable cannot be located.
pub fn plugin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("failed to locate the test executable")?;
    profile_dir_of(&exe)
}

/// Directory of the Go reference plugins: `$CNI_REFERENCE_DIR`, else `/usr/lib/cni`.
pub fn reference_dir() -> PathBuf {
    std::env::var_os(REFERENCE_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_REFERENCE_DIR), PathBuf::from)
}

/// Path of our binary `name`, which must exist.
///
/// # Errors
/// When it is missing or not executable, telling how to build it.
pub fn plugin_binary(name: &str) -> Result<PathBuf> {
    let path = plugin_dir()?.join(name);
    require_executable(
        &path,
        "run `cargo build --workspace --bins` first, or set CNI_TEST_BIN_DIR",
    )?;
    Ok(path)
}

/// Path of the example binary `name` of a workspace crate (`target/<profile>/examples/<name>`,
/// e.g. the `cni` crate's `passthrough`), which must exist.
///
/// # Errors
/// When it is missing or not executable, telling how to build it.
pub fn example_binary(name: &str) -> Result<PathBuf> {
    let path = plugin_dir()?.join("examples").join(name);
    require_executable(
        &path,
        "run `cargo build --workspace --bins --examples` first, or set CNI_TEST_BIN_DIR",
    )?;
    Ok(path)
}

/// Path of the Go reference plugin `name`, which must exist.
///
/// # Errors
/// When it is missing or not executable, telling where it comes from.
pub fn reference_binary(name: &str) -> Result<PathBuf> {
    let path = reference_dir().join(name);
    require_executable(
        &path,
        "install Debian's containernetworking-plugins, or set CNI_REFERENCE_DIR",
    )?;
    Ok(path)
}

/// The absolute path of `tool` on this process's `PATH` (for a test that builds a `PATH` of
/// its own from some of the machine's tools).
///
/// # Errors
/// When no directory of `PATH` holds it.
pub fn on_path(tool: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|p| p.exists())
        .with_context(|| format!("{tool} is not on PATH"))
}

/// Fails with a message naming `path` and `hint` unless `path` is an executable file.
///
/// # Errors
/// When `path` is missing, not a file or not executable.
pub fn require_executable(path: &Path, hint: &str) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => Ok(()),
        Ok(_) => bail!("{} is not an executable file: {hint}", path.display()),
        Err(e) => bail!("plugin binary {} not found ({e}): {hint}", path.display()),
    }
}

/// The cargo profile directory holding the binaries built alongside `exe`: integration tests
/// and benches live in `target/<profile>/deps`, examples in `target/<profile>/examples`.
///
/// # Errors
/// When `exe` has no parent directory.
pub fn profile_dir_of(exe: &Path) -> Result<PathBuf> {
    let dir = exe
        .parent()
        .with_context(|| format!("{} has no parent directory", exe.display()))?;
    let nested = matches!(
        dir.file_name().and_then(|n| n.to_str()),
        Some("deps" | "examples")
    );
    Ok(match (nested, dir.parent()) {
        (true, Some(up)) => up.to_path_buf(),
        _ => dir.to_path_buf(),
    })
}

/// A directory holding only the IPv4 iptables tools (symlinks to those on `PATH`), for a
/// `PATH` on which the Go portmap's CHECK finds no `ip6tables`: Go 1.1.1's CHECK compares a
/// container's rules of one family in both families' tables (so it fails on any layout, its
/// own included); without `ip6tables` it checks the IPv4 table alone.
///
/// # Errors
/// When a tool is not on `PATH` or the directory cannot be made.
pub fn ipv4_iptables_tools() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for tool in ["iptables", "iptables-save", "iptables-restore"] {
        std::os::unix::fs::symlink(on_path(tool)?, dir.path().join(tool))?;
    }
    Ok(dir)
}

/// A directory of the legacy (x_tables) iptables tools under the usual names (`iptables`,
/// `iptables-save`, `iptables-restore` and the `ip6tables` ones, symlinks to the
/// `*-legacy` tools on `PATH`), to put first on a plugin's `PATH`: it then runs, and tells,
/// legacy iptables on a machine whose default is `iptables-nft`.
///
/// # Errors
/// When a legacy tool is not on `PATH` or the directory cannot be made.
pub fn legacy_iptables_tools() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for family in ["iptables", "ip6tables"] {
        for suffix in ["", "-save", "-restore"] {
            std::os::unix::fs::symlink(
                on_path(&format!("{family}-legacy{suffix}"))?,
                dir.path().join(format!("{family}{suffix}")),
            )?;
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_dir_of_an_integration_test_is_above_deps() {
        assert_eq!(
            profile_dir_of(Path::new("/w/target/debug/deps/harness-0123abcd")).unwrap(),
            Path::new("/w/target/debug")
        );
        assert_eq!(
            profile_dir_of(Path::new("/w/target/release/examples/demo")).unwrap(),
            Path::new("/w/target/release")
        );
        assert_eq!(
            profile_dir_of(Path::new("/w/target/debug/portmap")).unwrap(),
            Path::new("/w/target/debug")
        );
    }

    #[test]
    fn a_missing_binary_is_reported_with_its_path_and_the_fix() {
        let err = require_executable(Path::new("/nonexistent/portmap"), "run cargo build")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/portmap"), "{err}");
        assert!(err.contains("run cargo build"), "{err}");
    }
}
