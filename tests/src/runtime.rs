//! A small CNI runtime that drives plugin binaries the way libcni does.
//!
//! - ADD, CHECK, STATUS and GC call the plugins of a list in order, DEL in reverse.
//! - Each plugin's config gets the list's `name` and `cniVersion`, a `runtimeConfig` holding only
//!   the capability args it declares in `"capabilities"`, and a `prevResult`: the previous
//!   plugin's result on ADD, the cached result of the attachment on CHECK and DEL.
//! - A successful ADD is cached (in a tempdir owned by the [`Runtime`]) under (network name,
//!   container ID, ifname); CHECK and DEL read it, DEL removes it, GC takes the cached
//!   attachments as the valid ones unless told otherwise and first deletes cached attachments that
//!   are not valid.
//! - CHECK is refused below CNI 0.4.0 and skipped with `disableCheck`; STATUS and GC are sent to
//!   the plugins only from CNI 1.1.0 on, and GC not at all with `disableGC`.
//!
//! Plugins always run inside the runtime's "host" namespace (the runtime refuses the machine's
//! own), found by `type` in an ordered list of directories: ours first, then the Go reference
//! plugins. One of our five plugins missing from our directory is an error, never a silent
//! fallback to the Go one; [`Runtime::use_reference`] picks the Go one on purpose.
//!
//! One difference from libcni: DEL removes the cached result whatever the CNI version.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
pub use cni::conf::GcAttachment;
use host::netns::NetNs;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::bins;
use crate::netns::TestNetns;
use crate::process;

/// Deadline of one plugin execution unless set with [`Runtime::with_timeout`] or
/// [`PLUGIN_TIMEOUT_ENV`].
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Environment variable that replaces [`PLUGIN_TIMEOUT`] as the default deadline of one plugin
/// execution, in whole seconds (`CNI_TEST_PLUGIN_TIMEOUT=120`). For machines far slower than
/// CI's, where a correct plugin may take longer: `scripts/kernels-guest.sh` sets it, as its
/// guests emulate the CPU (TCG). Unset or empty, the default holds; CI leaves it unset. The
/// runtime removes it, as every `CNI_*` variable, from the plugins' environment.
pub const PLUGIN_TIMEOUT_ENV: &str = "CNI_TEST_PLUGIN_TIMEOUT";

/// The default deadline of one plugin execution: [`PLUGIN_TIMEOUT_ENV`]'s, else
/// [`PLUGIN_TIMEOUT`].
///
/// # Errors
/// When the variable is set to something other than a positive number of seconds.
pub fn plugin_timeout() -> anyhow::Result<Duration> {
    timeout_from(std::env::var_os(PLUGIN_TIMEOUT_ENV).as_deref())
}

/// [`plugin_timeout`] for the variable's value.
fn timeout_from(value: Option<&std::ffi::OsStr>) -> anyhow::Result<Duration> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(PLUGIN_TIMEOUT);
    };
    match value.to_str().map(|v| v.trim().parse::<u64>()) {
        Some(Ok(secs)) if secs > 0 => Ok(Duration::from_secs(secs)),
        _ => bail!("{PLUGIN_TIMEOUT_ENV}={value:?} is not a positive number of seconds"),
    }
}

/// The key under which GC receives the attachments that are still valid.
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";

/// A network configuration list (a `.conflist`).
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfigList {
    /// The network name, injected into every plugin's config.
    pub name: String,
    /// The CNI version, injected into every plugin's config.
    pub cni_version: String,
    /// The plugin configs (JSON objects with at least `type`), in chain order.
    pub plugins: Vec<Value>,
    /// Skip CHECK for this network.
    pub disable_check: bool,
    /// Skip GC for this network.
    pub disable_gc: bool,
}

impl NetworkConfigList {
    /// A list with the given plugins and both switches off.
    pub fn new(name: &str, cni_version: &str, plugins: Vec<Value>) -> NetworkConfigList {
        NetworkConfigList {
            name: name.to_owned(),
            cni_version: cni_version.to_owned(),
            plugins,
            disable_check: false,
            disable_gc: false,
        }
    }

    /// Parses a conflist JSON value, checking it the way libcni does on load.
    ///
    /// # Errors
    /// When `name` or `plugins` is missing, a plugin is not an object or has no `type`.
    pub fn from_value(conf: &Value) -> anyhow::Result<NetworkConfigList> {
        let name = conf["name"]
            .as_str()
            .context("conflist has no string `name`")?;
        let cni_version = conf["cniVersion"].as_str().unwrap_or_default();
        let plugins = conf["plugins"]
            .as_array()
            .filter(|p| !p.is_empty())
            .context("conflist has no `plugins` (or an empty list)")?;
        for (i, plugin) in plugins.iter().enumerate() {
            plugin_type(plugin).with_context(|| format!("conflist plugin #{i}"))?;
        }
        Ok(NetworkConfigList {
            name: name.to_owned(),
            cni_version: cni_version.to_owned(),
            plugins: plugins.clone(),
            disable_check: flag(&conf["disableCheck"])?,
            disable_gc: flag(&conf["disableGC"])?,
        })
    }

    /// Parses conflist JSON text.
    ///
    /// # Errors
    /// As [`NetworkConfigList::from_value`], or when the text is not JSON.
    pub fn from_json(text: &str) -> anyhow::Result<NetworkConfigList> {
        Self::from_value(&serde_json::from_str(text).context("conflist is not JSON")?)
    }

    /// The conflist as JSON.
    pub fn to_value(&self) -> Value {
        let mut conf = json!({
            "cniVersion": self.cni_version,
            "name": self.name,
            "plugins": self.plugins,
        });
        if self.disable_check {
            conf["disableCheck"] = Value::Bool(true);
        }
        if self.disable_gc {
            conf["disableGC"] = Value::Bool(true);
        }
        conf
    }
}

/// libcni accepts `true`/`false` as booleans or strings.
fn flag(v: &Value) -> anyhow::Result<bool> {
    match v {
        Value::Null => Ok(false),
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s.eq_ignore_ascii_case("true") => Ok(true),
        Value::String(s) if s.eq_ignore_ascii_case("false") => Ok(false),
        other => bail!("invalid boolean {other}"),
    }
}

/// The `type` of a plugin config.
///
/// # Errors
/// When the config is not an object with a non-empty string `type`.
pub fn plugin_type(plugin: &Value) -> anyhow::Result<&str> {
    plugin
        .as_object()
        .context("plugin config is not a JSON object")?
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .context("plugin config has no `type`")
}

/// What the runtime knows of one attachment besides the config (libcni's `RuntimeConf`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeConf {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`; may be empty for DEL.
    pub netns: PathBuf,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`, joined as `K=V;K=V`.
    pub args: Vec<(String, String)>,
    /// Capability args (`portMappings`, `bandwidth`, `mac`, …), passed in `runtimeConfig` to
    /// the plugins that declare them.
    pub capability_args: Map<String, Value>,
}

impl RuntimeConf {
    /// An attachment of `ifname` in `netns` for `container_id`, without args.
    pub fn new(container_id: &str, netns: impl Into<PathBuf>, ifname: &str) -> RuntimeConf {
        RuntimeConf {
            container_id: container_id.to_owned(),
            netns: netns.into(),
            ifname: ifname.to_owned(),
            ..RuntimeConf::default()
        }
    }

    /// Adds a `CNI_ARGS` pair.
    #[must_use]
    pub fn with_arg(mut self, key: &str, value: &str) -> RuntimeConf {
        self.args.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Sets a capability arg.
    #[must_use]
    pub fn with_capability(mut self, key: &str, value: Value) -> RuntimeConf {
        self.capability_args.insert(key.to_owned(), value);
        self
    }

    /// The value of `CNI_ARGS`.
    pub fn cni_args(&self) -> String {
        self.args
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";")
    }

    /// The attachment key GC uses.
    pub fn attachment(&self) -> GcAttachment {
        GcAttachment {
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone(),
        }
    }
}

/// An attachment found in the runtime's cache.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedAttachment {
    /// The network name.
    pub network: String,
    /// The runtime conf of the ADD.
    pub rt: RuntimeConf,
    /// The conflist of the ADD.
    pub config: Value,
    /// The final result of the ADD.
    pub result: Value,
}

/// The cache file of one attachment (field names after libcni's `cachedInfo`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheEntry {
    network_name: String,
    #[serde(flatten)]
    rt: RuntimeConf,
    config: Value,
    result: Value,
}

/// Builds the config one plugin receives on stdin: `plugin` with the list's `name` and
/// `cniVersion`, `prevResult` when given, and `runtimeConfig` with only the capability args the
/// plugin declares (`"capabilities": {key: true}`); no `runtimeConfig` key is added when none
/// applies.
///
/// # Errors
/// When `plugin` is not a JSON object.
pub fn build_plugin_config(
    list: &NetworkConfigList,
    plugin: &Value,
    prev_result: Option<&Value>,
    capability_args: &Map<String, Value>,
) -> anyhow::Result<Value> {
    let mut conf = plugin
        .as_object()
        .context("plugin config is not a JSON object")?
        .clone();
    conf.insert("name".into(), Value::String(list.name.clone()));
    conf.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
    if let Some(prev) = prev_result {
        conf.insert("prevResult".into(), prev.clone());
    }
    // Go's encoding/json matches the `capabilities` field name case-insensitively.
    let capabilities = conf
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("capabilities"))
        .and_then(|(_, v)| v.as_object());
    let runtime_config: Map<String, Value> = capabilities
        .into_iter()
        .flatten()
        .filter(|(_, enabled)| enabled.as_bool() == Some(true))
        .filter_map(|(cap, _)| capability_args.get(cap).map(|v| (cap.clone(), v.clone())))
        .collect();
    if !runtime_config.is_empty() {
        conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
    }
    Ok(Value::Object(conf))
}

/// The `code`, `msg` and `details` of a CNI error printed by a failing plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniErrorObject {
    /// The error code (spec §"Error"): 1–99 reserved, 100+ plugin-specific.
    pub code: u64,
    /// The short message.
    #[serde(default)]
    pub msg: String,
    /// Details, possibly empty.
    #[serde(default)]
    pub details: String,
}

impl CniErrorObject {
    /// Parses the error object from a plugin's stdout, if it holds one.
    pub fn parse(stdout: &[u8]) -> Option<CniErrorObject> {
        serde_json::from_slice(stdout).ok()
    }
}

/// A plugin that exited with a failure status.
#[derive(Debug, Clone)]
pub struct PluginFailure {
    /// The plugin's `type` (or path given to [`Runtime::exec_plugin`]).
    pub plugin_type: String,
    /// `CNI_COMMAND`.
    pub command: String,
    /// Its exit status.
    pub status: ExitStatus,
    /// The CNI error it printed on stdout, if it printed one.
    pub error: Option<CniErrorObject>,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl fmt::Display for PluginFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plugin {} failed ({}): {}",
            self.plugin_type, self.command, self.status
        )?;
        match &self.error {
            Some(e) => write!(f, ", code {}: {}", e.code, e.msg)?,
            None => write!(f, ", stdout {:?}", self.stdout.trim())?,
        }
        if let Some(e) = self.error.as_ref().filter(|e| !e.details.is_empty()) {
            write!(f, " ({})", e.details)?;
        }
        if !self.stderr.trim().is_empty() {
            write!(f, "; stderr: {}", self.stderr.trim())?;
        }
        Ok(())
    }
}

impl std::error::Error for PluginFailure {}

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A plugin exited with a failure status.
    #[error(transparent)]
    Plugin(Box<PluginFailure>),
    /// Several failures (GC keeps going past errors, as libcni does).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Multiple(Vec<RuntimeError>),
    /// The harness itself failed: binary missing, timeout, bad output, I/O.
    #[error(transparent)]
    Harness(#[from] anyhow::Error),
}

impl RuntimeError {
    /// The (first) plugin failure behind this error.
    pub fn plugin_failure(&self) -> Option<&PluginFailure> {
        match self {
            RuntimeError::Plugin(p) => Some(p),
            RuntimeError::Multiple(all) => all.iter().find_map(RuntimeError::plugin_failure),
            RuntimeError::Harness(_) => None,
        }
    }

    /// The CNI error code of the (first) plugin failure, if the plugin printed one.
    pub fn code(&self) -> Option<u64> {
        self.plugin_failure()
            .and_then(|p| p.error.as_ref())
            .map(|e| e.code)
    }
}

/// The raw outcome of one plugin execution.
#[derive(Debug, Clone)]
pub struct PluginOutput {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything printed on stdout.
    pub stdout: Vec<u8>,
    /// Everything printed on stderr.
    pub stderr: Vec<u8>,
}

impl PluginOutput {
    /// Stdout parsed as JSON.
    ///
    /// # Errors
    /// When stdout is not JSON.
    pub fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_slice(&self.stdout).with_context(|| {
            format!(
                "plugin stdout is not JSON: {:?}",
                String::from_utf8_lossy(&self.stdout)
            )
        })
    }

    /// The CNI error object on stdout, if any.
    pub fn error(&self) -> Option<CniErrorObject> {
        CniErrorObject::parse(&self.stdout)
    }

    fn into_failure(self, plugin_type: &str, command: &str) -> PluginFailure {
        PluginFailure {
            plugin_type: plugin_type.to_owned(),
            command: command.to_owned(),
            status: self.status,
            error: self.error(),
            stdout: String::from_utf8_lossy(&self.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&self.stderr).into_owned(),
        }
    }
}

/// A libcni-like runtime executing plugins inside one host namespace.
#[derive(Debug)]
pub struct Runtime {
    host: NetNs,
    our_dir: PathBuf,
    plugin_dirs: Vec<PathBuf>,
    overrides: BTreeMap<String, PathBuf>,
    cache: tempfile::TempDir,
    timeout: Duration,
    env: Vec<(String, String)>,
    root: Option<PathBuf>,
}

impl Runtime {
    /// A runtime running plugins in `host`, searching our bin dir then the reference dir.
    ///
    /// # Errors
    /// When `host` cannot be opened or the cache dir cannot be created.
    pub fn new(host: &TestNetns) -> anyhow::Result<Runtime> {
        Runtime::in_netns(host.netns()?)
    }

    /// As [`Runtime::new`] for any namespace other than the machine's own.
    ///
    /// # Errors
    /// When `host` is the namespace this process started in (`/proc/self/ns/net`, the main
    /// thread's) or pid 1's (when visible).
    pub fn in_netns(host: NetNs) -> anyhow::Result<Runtime> {
        let own =
            NetNs::open("/proc/self/ns/net").context("failed to open this process's netns")?;
        // pid 1 may be out of reach in a sandbox (EACCES); this process's own check suffices.
        let init = NetNs::open("/proc/1/ns/net").ok();
        if host.is_same(&own) || init.is_some_and(|init| host.is_same(&init)) {
            bail!(
                "refusing to run plugins in the machine's own network namespace ({:?})",
                host.path()
            );
        }
        let our_dir = bins::plugin_dir()?;
        Ok(Runtime {
            host,
            plugin_dirs: vec![our_dir.clone(), bins::reference_dir()],
            our_dir,
            overrides: BTreeMap::new(),
            cache: tempfile::Builder::new()
                .prefix("cni-runtime-cache")
                .tempdir()
                .context("failed to create the runtime's cache dir")?,
            timeout: plugin_timeout()?,
            env: Vec::new(),
            root: None,
        })
    }

    /// Replaces the ordered plugin search directories (also `CNI_PATH`); e.g. only the reference
    /// dir to run a chain entirely with the Go plugins.
    #[must_use]
    pub fn with_plugin_dirs(mut self, dirs: Vec<PathBuf>) -> Runtime {
        self.plugin_dirs = dirs;
        self
    }

    /// Replaces our bin dir (first search dir; where our five plugins must be found).
    #[must_use]
    pub fn with_bin_dir(mut self, dir: impl Into<PathBuf>) -> Runtime {
        let dir = dir.into();
        for d in &mut self.plugin_dirs {
            if *d == self.our_dir {
                d.clone_from(&dir);
            }
        }
        self.our_dir = dir;
        self
    }

    /// Runs the Go reference binary for `plugin_type` (for differential tests).
    #[must_use]
    pub fn use_reference(mut self, plugin_type: &str) -> Runtime {
        let path = bins::reference_dir().join(plugin_type);
        self.overrides.insert(plugin_type.to_owned(), path);
        self
    }

    /// Runs `path` whenever a config names `plugin_type` (e.g. a fake plugin script).
    #[must_use]
    pub fn use_binary(mut self, plugin_type: &str, path: impl Into<PathBuf>) -> Runtime {
        self.overrides.insert(plugin_type.to_owned(), path.into());
        self
    }

    /// Adds `key=value` to the environment of every plugin a list call runs (ADD, CHECK, DEL,
    /// STATUS, GC, VERSION), e.g. `DBUS_SYSTEM_BUS_ADDRESS`.
    #[must_use]
    pub fn with_env(mut self, key: &str, value: &str) -> Runtime {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Runs every plugin `chroot`ed into `root` (another userland, [`crate::userland`]): the
    /// search directories, `CNI_PATH` and overrides are paths inside it.
    #[must_use]
    pub fn in_root(mut self, root: impl Into<PathBuf>) -> Runtime {
        self.root = Some(root.into());
        self
    }

    /// Where `path` (a plugin's, as the plugins see it) is for this process.
    fn seen(&self, path: &Path) -> PathBuf {
        match &self.root {
            Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
            None => path.to_path_buf(),
        }
    }

    /// Sets the deadline of one plugin execution.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Runtime {
        self.timeout = timeout;
        self
    }

    /// The deadline of one plugin execution ([`plugin_timeout`] unless set otherwise).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The namespace plugins run in.
    pub fn host(&self) -> &NetNs {
        &self.host
    }

    /// The result cache directory (removed with the runtime).
    pub fn cache_dir(&self) -> &Path {
        self.cache.path()
    }

    /// The value of `CNI_PATH`: the search directories joined by `:`.
    pub fn cni_path(&self) -> OsString {
        std::env::join_paths(&self.plugin_dirs).unwrap_or_default()
    }

    /// The binary that runs for `plugin_type`: an override, else the first search dir holding
    /// it. One of [`bins::META_PLUGINS`] must be found in our bin dir when that dir is searched.
    ///
    /// # Errors
    /// When no binary is found, naming where it was looked for.
    pub fn find_plugin(&self, plugin_type: &str) -> anyhow::Result<PathBuf> {
        if let Some(path) = self.overrides.get(plugin_type) {
            bins::require_executable(&self.seen(path), "set by use_binary/use_reference")?;
            return Ok(path.clone());
        }
        if plugin_type.contains('/') {
            bail!("plugin type {plugin_type:?} contains '/'");
        }
        if bins::META_PLUGINS.contains(&plugin_type) && self.plugin_dirs.contains(&self.our_dir) {
            let path = self.our_dir.join(plugin_type);
            bins::require_executable(
                &self.seen(&path),
                "run `cargo build --workspace --bins` first (or use_reference for the Go one)",
            )?;
            return Ok(path);
        }
        for dir in &self.plugin_dirs {
            let path = dir.join(plugin_type);
            if bins::require_executable(&self.seen(&path), "").is_ok() {
                return Ok(path);
            }
        }
        bail!("plugin {plugin_type:?} not found in {:?}", self.plugin_dirs)
    }

    /// Runs ADD through the list and caches the final result, which it returns.
    ///
    /// # Errors
    /// The first plugin failure (later plugins are not run and nothing is cached).
    pub fn add(&self, list: &NetworkConfigList, rt: &RuntimeConf) -> Result<Value, RuntimeError> {
        let mut steps = self.add_steps(list, rt)?;
        Ok(steps.pop().map(|(_, result)| result).unwrap_or_default())
    }

    /// As [`Runtime::add`], returning each plugin's type and the result it printed, in chain
    /// order (the last one is the cached result): shows what each plugin changed.
    ///
    /// # Errors
    /// The first plugin failure (later plugins are not run and nothing is cached).
    pub fn add_steps(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeConf,
    ) -> Result<Vec<(String, Value)>, RuntimeError> {
        let mut steps: Vec<(String, Value)> = Vec::new();
        for plugin in &list.plugins {
            let prev = steps.last().map(|(_, result)| result);
            let conf = build_plugin_config(list, plugin, prev, &rt.capability_args)?;
            let stdout = self.invoke(plugin, "ADD", Some(rt), &conf)?;
            let plugin_type = plugin_type(plugin).unwrap_or_default().to_owned();
            let result: Value = serde_json::from_slice(&stdout).with_context(|| {
                format!(
                    "plugin {plugin_type} (ADD) printed no JSON result: {:?}",
                    String::from_utf8_lossy(&stdout)
                )
            })?;
            steps.push((plugin_type, result));
        }
        let (_, result) = steps
            .last()
            .ok_or_else(|| anyhow!("conflist {} has no plugins", list.name))?;
        self.cache_store(list, rt, result)?;
        Ok(steps)
    }

    /// Runs CHECK through the list with the cached result as `prevResult`.
    ///
    /// # Errors
    /// Refused below CNI 0.4.0; the first plugin failure.
    pub fn check(&self, list: &NetworkConfigList, rt: &RuntimeConf) -> Result<(), RuntimeError> {
        if !version_at_least(&list.cni_version, "0.4.0")? {
            return Err(anyhow!(
                "configuration version {:?} does not support the CHECK command",
                list.cni_version
            )
            .into());
        }
        if list.disable_check {
            return Ok(());
        }
        let cached = self.cached_result(&list.name, rt)?;
        for plugin in &list.plugins {
            let conf = build_plugin_config(list, plugin, cached.as_ref(), &rt.capability_args)?;
            self.invoke(plugin, "CHECK", Some(rt), &conf)?;
        }
        Ok(())
    }

    /// Runs DEL through the list in reverse with the cached result (from CNI 0.4.0) as
    /// `prevResult`, then forgets the cached result.
    ///
    /// # Errors
    /// The first plugin failure (earlier plugins are not run and the cache is kept).
    pub fn del(&self, list: &NetworkConfigList, rt: &RuntimeConf) -> Result<(), RuntimeError> {
        let cached = if version_at_least(&list.cni_version, "0.4.0")? {
            // An unreadable cache entry is dropped, as libcni does.
            self.cached_result(&list.name, rt).unwrap_or_default()
        } else {
            None
        };
        for plugin in list.plugins.iter().rev() {
            let conf = build_plugin_config(list, plugin, cached.as_ref(), &rt.capability_args)?;
            self.invoke(plugin, "DEL", Some(rt), &conf)?;
        }
        self.cache_remove(&list.name, rt)?;
        Ok(())
    }

    /// Runs STATUS on each plugin (from CNI 1.1.0; a no-op below, as in libcni).
    ///
    /// # Errors
    /// The first plugin failure.
    pub fn status(&self, list: &NetworkConfigList) -> Result<(), RuntimeError> {
        if !version_at_least(&list.cni_version, "1.1.0")? {
            return Ok(());
        }
        for plugin in &list.plugins {
            let conf = build_plugin_config(list, plugin, None, &Map::new())?;
            self.invoke(plugin, "STATUS", None, &conf)?;
        }
        Ok(())
    }

    /// Garbage-collects `list`: DEL for each cached attachment of this network that is not
    /// valid, then (from CNI 1.1.0) GC on each plugin with `cni.dev/valid-attachments`. The valid
    /// attachments are `valid`, or when `None` the attachments cached for this network.
    ///
    /// # Errors
    /// All failures together; it keeps going past each, as libcni does.
    pub fn gc(
        &self,
        list: &NetworkConfigList,
        valid: Option<&[GcAttachment]>,
    ) -> Result<(), RuntimeError> {
        if list.disable_gc {
            return Ok(());
        }
        let cached: Vec<CachedAttachment> = self
            .cached_attachments()?
            .into_iter()
            .filter(|a| a.network == list.name)
            .collect();
        let valid: Vec<GcAttachment> = match valid {
            Some(v) => v.to_vec(),
            None => cached.iter().map(|a| a.rt.attachment()).collect(),
        };
        let valid_set: HashSet<&GcAttachment> = valid.iter().collect();
        let mut errors = Vec::new();
        for stale in cached
            .iter()
            .filter(|a| !valid_set.contains(&a.rt.attachment()))
        {
            if let Err(e) = self.del(list, &stale.rt) {
                errors.push(e);
            }
        }
        if version_at_least(&list.cni_version, "1.1.0")? {
            for plugin in &list.plugins {
                let step = build_plugin_config(list, plugin, None, &Map::new())
                    .map_err(RuntimeError::from)
                    .and_then(|mut conf| {
                        conf[VALID_ATTACHMENTS_KEY] =
                            serde_json::to_value(&valid).map_err(anyhow::Error::from)?;
                        self.invoke(plugin, "GC", None, &conf)
                    });
                if let Err(e) = step {
                    errors.push(e);
                }
            }
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(RuntimeError::Multiple(errors)),
        }
    }

    /// Runs VERSION on `plugin_type` with `{"cniVersion": cni_version}` and returns its answer.
    ///
    /// # Errors
    /// When the plugin fails or prints something that is not JSON.
    pub fn version(&self, plugin_type: &str, cni_version: &str) -> Result<Value, RuntimeError> {
        let conf = json!({ "cniVersion": cni_version, "type": plugin_type });
        let stdout = self.invoke(
            &conf,
            "VERSION",
            None,
            &json!({ "cniVersion": cni_version }),
        )?;
        Ok(serde_json::from_slice(&stdout).context("VERSION printed no JSON")?)
    }

    /// Runs one plugin (a `type` looked up as for a list, or a path containing `/`) inside the
    /// host namespace with `stdin`, and returns whatever happened. The environment is this
    /// process's without any `CNI_*` variable, plus `CNI_COMMAND=command` when given, plus
    /// `env` (so a conformance test controls exactly which CNI variables exist).
    ///
    /// # Errors
    /// When the binary is not found, cannot start or times out; a failure exit is not an error.
    pub fn exec_plugin(
        &self,
        plugin: &str,
        command: Option<&str>,
        env: &[(&str, &str)],
        stdin: &[u8],
    ) -> anyhow::Result<PluginOutput> {
        self.exec_with_args(plugin, &[], command, env, stdin)
    }

    /// Runs `command` of `plugin` for the attachment (`id`, `eth0`) whose namespace is at
    /// `netns`, with `conf` on stdin: the direct exec of the scale fixtures, which make their
    /// attachments from synthetic prevResults ([`crate::result::synthetic_prev`]).
    ///
    /// # Errors
    /// As [`Runtime::exec_plugin`].
    pub fn exec_attachment(
        &self,
        plugin: &str,
        command: &str,
        id: &str,
        netns: &str,
        conf: &serde_json::Value,
    ) -> anyhow::Result<PluginOutput> {
        self.exec_plugin(
            plugin,
            Some(command),
            &[
                ("CNI_CONTAINERID", id),
                ("CNI_NETNS", netns),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/usr/lib/cni"),
            ],
            conf.to_string().as_bytes(),
        )
    }

    /// Runs one plugin as an operator would (`firewall reconcile`): with `args` on its
    /// command line, no `CNI_*` variable but those of `env`, and nothing on stdin, inside the
    /// host namespace (with the list calls' extra environment, [`Runtime::with_env`]).
    ///
    /// # Errors
    /// When the binary is not found, cannot start or times out; a failure exit is not an error.
    pub fn operate(
        &self,
        plugin: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<PluginOutput> {
        let mut all: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        all.extend_from_slice(env);
        self.exec_with_args(plugin, args, None, &all, b"")
    }

    /// The command that runs `plugin` (a name on the plugin path, or a path) with `args`,
    /// `CNI_COMMAND=command` when given and `env`, and no other `CNI_*` variable; and the
    /// binary's path.
    fn command(
        &self,
        plugin: &str,
        args: &[&str],
        command: Option<&str>,
        env: &[(&str, &str)],
    ) -> anyhow::Result<(Command, PathBuf)> {
        let path = if plugin.contains('/') {
            PathBuf::from(plugin)
        } else {
            self.find_plugin(plugin)?
        };
        let mut cmd = match &self.root {
            Some(root) => {
                let mut cmd = Command::new("/usr/sbin/chroot");
                cmd.arg(root).arg(&path);
                cmd
            }
            None => Command::new(&path),
        };
        cmd.args(args);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CNI_") {
                cmd.env_remove(key);
            }
        }
        if let Some(command) = command {
            cmd.env("CNI_COMMAND", command);
        }
        for (key, value) in env {
            cmd.env(key, value);
        }
        Ok((cmd, path))
    }

    /// Starts `plugin` with `args` as [`Runtime::operate`] runs it, but without waiting: for
    /// a long-running command (`reconcile --watch`), whose stdout and stderr go to `stdout`
    /// and `stderr`. The caller stops and reaps the child (see [`crate::watcher`]).
    ///
    /// # Errors
    /// When the binary is not found or cannot start.
    pub fn spawn_operator(
        &self,
        plugin: &str,
        args: &[&str],
        env: &[(&str, &str)],
        stdout: std::process::Stdio,
        stderr: std::process::Stdio,
    ) -> anyhow::Result<std::process::Child> {
        let mut all: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        all.extend_from_slice(env);
        let (mut cmd, path) = self.command(plugin, args, None, &all)?;
        cmd.stdin(std::process::Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        process::spawn_in(&self.host, &mut cmd)
            .with_context(|| format!("plugin {}", path.display()))
    }

    /// [`Runtime::exec_plugin`] with `args` on the command line.
    fn exec_with_args(
        &self,
        plugin: &str,
        args: &[&str],
        command: Option<&str>,
        env: &[(&str, &str)],
        stdin: &[u8],
    ) -> anyhow::Result<PluginOutput> {
        let (mut cmd, path) = self.command(plugin, args, command, env)?;
        let out = process::run_in(&self.host, &mut cmd, stdin, self.timeout)
            .with_context(|| format!("plugin {}", path.display()))?;
        Ok(PluginOutput {
            status: out.status,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    /// Runs `plugin` with `command` as libcni would; returns stdout on success.
    fn invoke(
        &self,
        plugin: &Value,
        command: &str,
        rt: Option<&RuntimeConf>,
        conf: &Value,
    ) -> Result<Vec<u8>, RuntimeError> {
        let plugin_type = plugin_type(plugin)?;
        let empty = RuntimeConf::default();
        let rt = rt.unwrap_or(&empty);
        let netns = rt.netns.to_string_lossy();
        let cni_path = self.cni_path();
        let cni_args = rt.cni_args();
        let stdin = serde_json::to_vec(conf).context("failed to serialize plugin config")?;
        let cni_path = cni_path.to_string_lossy();
        let mut env: Vec<(&str, &str)> = vec![
            ("CNI_CONTAINERID", &rt.container_id),
            ("CNI_NETNS", &netns),
            ("CNI_IFNAME", &rt.ifname),
            ("CNI_ARGS", &cni_args),
            ("CNI_PATH", &cni_path),
        ];
        env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let out = self.exec_plugin(plugin_type, Some(command), &env, &stdin)?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(RuntimeError::Plugin(Box::new(
                out.into_failure(plugin_type, command),
            )))
        }
    }

    fn cache_file(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<PathBuf> {
        if network.is_empty() || rt.container_id.is_empty() || rt.ifname.is_empty() {
            bail!(
                "cache file path requires network name ({network:?}), container ID ({:?}), and interface name ({:?})",
                rt.container_id,
                rt.ifname
            );
        }
        Ok(self
            .cache
            .path()
            .join("results")
            .join(format!("{network}-{}-{}", rt.container_id, rt.ifname)))
    }

    fn cache_store(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeConf,
        result: &Value,
    ) -> anyhow::Result<()> {
        let path = self.cache_file(&list.name, rt)?;
        let entry = CacheEntry {
            network_name: list.name.clone(),
            rt: rt.clone(),
            config: list.to_value(),
            result: result.clone(),
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, serde_json::to_vec_pretty(&entry)?)
            .with_context(|| format!("failed to write {}", path.display()))
    }

    fn cache_remove(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<()> {
        let Ok(path) = self.cache_file(network, rt) else {
            return Ok(());
        };
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("failed to remove {}", path.display()))
            }
            _ => Ok(()),
        }
    }

    /// The result cached by the last successful ADD of this attachment, if any.
    ///
    /// # Errors
    /// When the attachment is incompletely named or its cache file is corrupt.
    pub fn cached_result(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<Option<Value>> {
        let path = self.cache_file(network, rt)?;
        let Ok(bytes) = std::fs::read(&path) else {
            return Ok(None);
        };
        let entry: CacheEntry = serde_json::from_slice(&bytes)
            .with_context(|| format!("corrupt cache file {}", path.display()))?;
        Ok(Some(entry.result))
    }

    /// All attachments in the cache, sorted by file name.
    ///
    /// # Errors
    /// When the cache dir cannot be read.
    pub fn cached_attachments(&self) -> anyhow::Result<Vec<CachedAttachment>> {
        let dir = self.cache.path().join("results");
        let mut paths: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(entries) => entries.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("failed to read {}", dir.display())),
        };
        paths.sort();
        Ok(paths
            .iter()
            .filter_map(|p| std::fs::read(p).ok())
            .filter_map(|bytes| serde_json::from_slice::<CacheEntry>(&bytes).ok())
            .map(|e| CachedAttachment {
                network: e.network_name,
                rt: e.rt,
                config: e.config,
                result: e.result,
            })
            .collect())
    }
}

/// Compares dotted CNI versions numerically (`"0.10.0" >= "0.4.0"`).
///
/// # Errors
/// When either is not of the form `major[.minor[.patch]]`.
pub fn version_at_least(version: &str, min: &str) -> anyhow::Result<bool> {
    Ok(parse_version(version)? >= parse_version(min)?)
}

fn parse_version(v: &str) -> anyhow::Result<[u64; 3]> {
    let mut out = [0u64; 3];
    let parts: Vec<&str> = v.split('.').collect();
    if parts.is_empty() || parts.len() > 3 {
        bail!("invalid version {v:?}");
    }
    for (slot, part) in out.iter_mut().zip(&parts) {
        *slot = part
            .parse()
            .with_context(|| format!("invalid version {v:?}"))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_deadline_is_30_s_unless_the_environment_sets_whole_seconds() {
        use std::ffi::OsStr;
        assert_eq!(timeout_from(None).unwrap(), PLUGIN_TIMEOUT);
        assert_eq!(timeout_from(Some(OsStr::new(""))).unwrap(), PLUGIN_TIMEOUT);
        assert_eq!(
            timeout_from(Some(OsStr::new("300"))).unwrap(),
            Duration::from_secs(300)
        );
        for bad in ["0", "-5", "1.5", "30s", "soon"] {
            let err = timeout_from(Some(OsStr::new(bad))).unwrap_err().to_string();
            assert!(
                err.contains(PLUGIN_TIMEOUT_ENV) && err.contains(bad),
                "{err}"
            );
        }
    }

    fn list() -> NetworkConfigList {
        NetworkConfigList::new(
            "testnet",
            "1.0.0",
            vec![
                json!({"type": "bridge", "bridge": "cni0"}),
                json!({"type": "portmap", "capabilities": {"portMappings": true}}),
            ],
        )
    }

    fn capability_args() -> Map<String, Value> {
        let mut caps = Map::new();
        caps.insert(
            "portMappings".into(),
            json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
        );
        caps.insert("bandwidth".into(), json!({"ingressRate": 1000}));
        caps
    }

    #[test]
    fn runtime_config_holds_only_the_declared_capabilities() {
        let l = list();
        let conf = build_plugin_config(&l, &l.plugins[1], None, &capability_args()).unwrap();
        assert_eq!(
            conf["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
        );
    }

    #[test]
    fn no_runtime_config_key_when_no_capability_applies() {
        let l = list();
        let conf = build_plugin_config(&l, &l.plugins[0], None, &capability_args()).unwrap();
        assert!(conf.get("runtimeConfig").is_none(), "{conf}");
        let disabled = json!({"type": "x", "capabilities": {"portMappings": false}});
        let conf = build_plugin_config(&l, &disabled, None, &capability_args()).unwrap();
        assert!(conf.get("runtimeConfig").is_none(), "{conf}");
        let unknown = json!({"type": "x", "capabilities": {"ipRanges": true}});
        let conf = build_plugin_config(&l, &unknown, None, &capability_args()).unwrap();
        assert!(conf.get("runtimeConfig").is_none(), "{conf}");
    }

    #[test]
    fn name_and_version_come_from_the_list_and_prev_result_is_injected() {
        let l = list();
        let plugin = json!({"type": "portmap", "name": "other", "cniVersion": "0.3.1"});
        let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]});
        let conf = build_plugin_config(&l, &plugin, Some(&prev), &Map::new()).unwrap();
        assert_eq!(conf["name"], "testnet");
        assert_eq!(conf["cniVersion"], "1.0.0");
        assert_eq!(conf["prevResult"], prev);
        assert_eq!(conf["type"], "portmap");
        let first = build_plugin_config(&l, &l.plugins[0], None, &Map::new()).unwrap();
        assert!(first.get("prevResult").is_none());
    }

    #[test]
    fn conflists_parse_like_libcni() {
        let l = NetworkConfigList::from_json(
            r#"{"cniVersion":"1.0.0","name":"n","disableCheck":"true",
                "plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        assert!(l.disable_check);
        assert!(!l.disable_gc);
        assert_eq!(NetworkConfigList::from_value(&l.to_value()).unwrap(), l);
        for bad in [
            r#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#,
            r#"{"name":"n","plugins":[]}"#,
            r#"{"name":"n","plugins":[{"bridge":"x"}]}"#,
            r#"{"name":"n","plugins":[3]}"#,
        ] {
            assert!(NetworkConfigList::from_json(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cni_args_are_joined_with_semicolons() {
        let rt = RuntimeConf::new("c1", "/run/netns/x", "eth0")
            .with_arg("IgnoreUnknown", "1")
            .with_arg("K8S_POD_NAME", "web");
        assert_eq!(rt.cni_args(), "IgnoreUnknown=1;K8S_POD_NAME=web");
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(version_at_least("0.4.0", "0.4.0").unwrap());
        assert!(version_at_least("1.0.0", "0.4.0").unwrap());
        assert!(!version_at_least("0.3.1", "0.4.0").unwrap());
        assert!(version_at_least("0.10.0", "0.4.0").unwrap());
        assert!(!version_at_least("1.0.0", "1.1.0").unwrap());
        assert!(version_at_least("x", "1.0.0").is_err());
    }

    #[test]
    fn attachments_serialize_with_the_spec_field_names() {
        let a = RuntimeConf::new("abc", "", "eth0").attachment();
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            json!({"containerID": "abc", "ifname": "eth0"})
        );
    }

    #[test]
    fn plugin_failures_show_code_message_and_stderr() {
        use std::os::unix::process::ExitStatusExt;
        let out = PluginOutput {
            status: ExitStatus::from_raw(1 << 8),
            stdout:
                br#"{"cniVersion":"1.0.0","code":7,"msg":"invalid config","details":"bad port"}"#
                    .to_vec(),
            stderr: b"oops\n".to_vec(),
        };
        let failure = out.into_failure("portmap", "ADD");
        assert_eq!(failure.error.as_ref().unwrap().code, 7);
        let err = RuntimeError::Plugin(Box::new(failure));
        assert_eq!(err.code(), Some(7));
        let text = err.to_string();
        assert!(text.contains("portmap"), "{text}");
        assert!(text.contains("code 7: invalid config (bad port)"), "{text}");
        assert!(text.contains("stderr: oops"), "{text}");
    }
}
