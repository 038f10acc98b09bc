//! The plugin skeleton: environment and stdin in, one JSON document and an exit status out.
//!
//! A plugin implements [`Plugin`]; its `main` calls [`run`]. Everything the process boundary
//! supplies (environment, stdin, stdout, stderr) is injected into [`run_with`], which is what
//! the tests drive in-process. The order of checks follows the reference's skel, so the same bad
//! input gets the same error:
//!
//! 1. `CNI_COMMAND` unset: print "about" text on stderr and exit 0.
//! 2. An unknown verb: code 4.
//! 3. Per-verb environment (SPEC.md "Parameters"): validators of the variables that are set run
//!    first (container ID and interface name rules, code 4), then every missing required
//!    variable is listed by name (code 4).
//! 4. stdin is read (code 5) and, except for VERSION, checked as the reference's skel checks it:
//!    JSON with a string `name` (code 6, `error unmarshall network config: …`), present and
//!    well-formed (code 7), and a string `cniVersion` (code 6, `decoding version from network
//!    config: …`). The rest of the configuration is the plugin's to decode ([`Call::conf`]).
//! 5. Version gating: ADD and DEL need a supported `cniVersion`, CHECK needs ≥ 0.4.0, STATUS and
//!    GC need ≥ 1.1.0 (code 1); an unparsable version is code 6.
//! 6. For ADD, CHECK and DEL, `CNI_NETNS` must not be the plugin's own namespace (code 8, unless
//!    `CNI_NETNS_OVERRIDE` is set). The reference checks this only after the plugin has run.
//!
//! stdout carries exactly one JSON document (a result, a VERSION reply or an error object) or
//! nothing (successful CHECK, DEL, STATUS, GC). Errors exit with status 1.

use std::fmt;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

use serde::de::DeserializeOwned;

use crate::args::CniArgs;
use crate::conf::{NetConf, decode_error};
use crate::decode::RawJson;
use crate::error::{CniError, ErrorCode};
use crate::operator::{Args, OperatorCommand, OperatorError};
use crate::types::CniResult;
use crate::version::{self, CniVersion};

/// A CNI verb (`CNI_COMMAND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// ADD: attach the container.
    Add,
    /// CHECK: verify the attachment.
    Check,
    /// DEL: detach, idempotently.
    Del,
    /// GC: remove resources of attachments not listed as valid.
    Gc,
    /// STATUS: report readiness.
    Status,
    /// VERSION: list the supported spec versions.
    Version,
}

impl Command {
    /// The verb as spelt in `CNI_COMMAND`.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Check => "CHECK",
            Command::Del => "DEL",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }

    /// The lowest config version that allows this verb.
    fn min_version(self) -> Option<CniVersion> {
        match self {
            Command::Check => Some(CniVersion::new(0, 4, 0)),
            Command::Gc | Command::Status => Some(CniVersion::new(1, 1, 0)),
            _ => None,
        }
    }

    /// True for the verbs that act on one container attachment.
    fn is_attachment_verb(self) -> bool {
        matches!(self, Command::Add | Command::Check | Command::Del)
    }
}

impl FromStr for Command {
    type Err = CniError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "ADD" => Command::Add,
            "CHECK" => Command::Check,
            "DEL" => Command::Del,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            _ => {
                return Err(CniError::new(
                    ErrorCode::InvalidEnv,
                    format!("unknown CNI_COMMAND: {s}"),
                ));
            }
        })
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One invocation, as the plugin sees it after the skel's checks.
#[derive(Debug, Clone)]
pub struct Call {
    /// The verb.
    pub command: Command,
    /// `CNI_CONTAINERID` ("" for GC and STATUS).
    pub container_id: String,
    /// `CNI_NETNS`, `None` when unset or empty (allowed for DEL).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME` ("" for GC and STATUS).
    pub ifname: String,
    /// `CNI_ARGS`, raw.
    pub args: String,
    /// `CNI_PATH`, split on `:`.
    pub path: Vec<PathBuf>,
    /// The config's `cniVersion` ("0.1.0" when it had none): results are printed in it.
    pub cni_version: String,
    /// The network configuration from stdin, checked once by the skel and kept as text (`null`
    /// for VERSION); plugins decode their keys from it through [`Call::conf`].
    pub config: RawJson,
}

impl Call {
    /// Decodes the network configuration with the plugin's keys in `T`.
    ///
    /// # Errors
    /// Code 6 naming the key that does not decode.
    pub fn conf<T: DeserializeOwned>(&self) -> Result<NetConf<T>, CniError> {
        NetConf::from_json(&self.config)
    }

    /// Parses `CNI_ARGS`.
    ///
    /// # Errors
    /// Code 4 for a malformed pair or `IgnoreUnknown` value.
    pub fn cni_args(&self) -> Result<CniArgs, CniError> {
        Ok(CniArgs::parse(&self.args)?)
    }

    /// `CNI_NETNS`, for a verb that needs it.
    ///
    /// # Errors
    /// Code 8 when it is unset.
    pub fn netns_path(&self) -> Result<&std::path::Path, CniError> {
        self.netns
            .as_deref()
            .ok_or_else(|| CniError::new(ErrorCode::InvalidNetns, "CNI_NETNS is not set"))
    }
}

/// What a plugin implements. Verbs the plugin has nothing to do for keep the default bodies.
///
/// The skel has checked the environment, the configuration's envelope and the version before
/// a verb runs; the verb decodes its own keys ([`Call::conf`]) and returns a result or a
/// [`CniError`], which the skel prints in the caller's `cniVersion`. A chained plugin that
/// passes the previous result on, driven in-process by [`run_with`] as a runtime would drive
/// the binary:
///
/// ```
/// use cni::conf::NetConf;
/// use cni::error::CniError;
/// use cni::skel::{self, Call, Plugin};
/// use cni::types::CniResult;
///
/// struct Echo;
///
/// impl Plugin for Echo {
///     fn name(&self) -> &'static str {
///         "echo"
///     }
///     fn supported_versions(&self) -> &'static [&'static str] {
///         cni::version::ALL
///     }
///     fn add(&self, call: &Call) -> Result<CniResult, CniError> {
///         let conf: NetConf<serde::de::IgnoredAny> = call.conf()?;
///         conf.prev_result()?
///             .ok_or_else(|| CniError::invalid_config("prevResult is missing"))
///     }
///     fn check(&self, _call: &Call) -> Result<(), CniError> {
///         Ok(())
///     }
///     fn del(&self, _call: &Call) -> Result<(), CniError> {
///         Ok(())
///     }
///     // It never enters CNI_NETNS, so the skel leaves the path alone.
///     fn uses_netns(&self) -> bool {
///         false
///     }
/// }
///
/// let env = |key: &str| {
///     let value = match key {
///         "CNI_COMMAND" => "ADD",
///         "CNI_CONTAINERID" => "c1",
///         "CNI_NETNS" => "/run/netns/c1",
///         "CNI_IFNAME" => "eth0",
///         _ => return None,
///     };
///     Some(value.to_owned())
/// };
/// let stdin = r#"{"cniVersion": "0.3.1", "name": "net", "type": "echo",
///     "prevResult": {"ips": [{"version": "4", "address": "10.0.0.2/24"}]}}"#;
/// let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
/// let status = skel::run_with(&Echo, &env, &mut stdin.as_bytes(), &mut stdout, &mut stderr);
/// assert_eq!(status, 0);
/// // The result in the configuration's version, printed as Go prints it.
/// assert_eq!(
///     String::from_utf8(stdout)?,
///     r#"{
///     "cniVersion": "0.3.1",
///     "ips": [
///         {
///             "version": "4",
///             "address": "10.0.0.2/24"
///         }
///     ],
///     "dns": {}
/// }"#
/// );
///
/// // DEL without a container ID and interface: code 4, in the reference's words; the
/// // environment is checked before stdin is read, so the error is in the newest version.
/// let env = |key: &str| (key == "CNI_COMMAND").then(|| "DEL".to_owned());
/// let mut stdout = Vec::new();
/// let status = skel::run_with(&Echo, &env, &mut stdin.as_bytes(), &mut stdout, &mut stderr);
/// assert_eq!(status, 1);
/// assert_eq!(
///     String::from_utf8(stdout)?,
///     r#"{
///     "cniVersion": "1.1.0",
///     "code": 4,
///     "msg": "required env variables [CNI_CONTAINERID,CNI_IFNAME] missing"
/// }"#
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Plugin {
    /// The plugin's type name (its binary name), used in the "about" text and logs.
    fn name(&self) -> &'static str;

    /// The exact `cniVersion` strings this plugin accepts, oldest first.
    fn supported_versions(&self) -> &'static [&'static str];

    /// ADD: set up the attachment and return the result to print.
    ///
    /// # Errors
    /// Any failure, as a CNI error.
    fn add(&self, call: &Call) -> Result<CniResult, CniError>;

    /// CHECK: verify the attachment without changing anything.
    ///
    /// # Errors
    /// The first drift found, as a CNI error.
    fn check(&self, call: &Call) -> Result<(), CniError>;

    /// DEL: remove the attachment; succeeds when there is nothing left to remove.
    ///
    /// # Errors
    /// Failures to remove what does exist.
    fn del(&self, call: &Call) -> Result<(), CniError>;

    /// STATUS: report whether the plugin can serve ADDs.
    ///
    /// # Errors
    /// Code 50 or 51 when it cannot.
    fn status(&self, _call: &Call) -> Result<(), CniError> {
        Ok(())
    }

    /// GC: remove resources of this network whose attachment is not in the valid list.
    ///
    /// # Errors
    /// Failures to remove stale resources.
    fn gc(&self, _call: &Call) -> Result<(), CniError> {
        Ok(())
    }

    /// Whether the plugin works inside `CNI_NETNS`. A plugin that never enters it (portmap and
    /// firewall work in their own namespace) says `false`, and the skel then does not touch the
    /// path at all, not even for its own-namespace check.
    fn uses_netns(&self) -> bool {
        true
    }

    /// The commands the plugin takes on its command line when an operator (or a unit) runs
    /// it with arguments ([`crate::operator`]); none by default. A runtime's call has no
    /// arguments and never reaches them.
    fn operator_commands(&self) -> &'static [OperatorCommand] {
        &[]
    }

    /// Runs `command`, one of [`Plugin::operator_commands`], with the arguments that follow it
    /// (none of them `--help`, which the skel answers), printing its report on `out`.
    ///
    /// # Errors
    /// What to print on stderr, with the exit status.
    fn operate(
        &self,
        command: &str,
        _args: &[String],
        _out: &mut dyn Write,
    ) -> Result<(), OperatorError> {
        Err(OperatorError::usage(format!(
            "{} takes no command {command:?}",
            self.name()
        )))
    }
}

/// Runs `plugin` against the real process environment and stdio.
pub fn run(plugin: &dyn Plugin) -> ExitCode {
    ExitCode::from(run_status(plugin))
}

/// Declares the C `main` of a plugin binary built with `#![no_main]`, running
/// [`main_entry`]: `cni::plugin_main!("tuning", tuning::Tuning);`.
///
/// Without Rust's own `main`, the standard library skips its start-up work, none of which a
/// plugin needs: reading `/proc/self/maps` to locate the main thread's stack guard, an
/// alternate signal stack with SIGSEGV/SIGBUS handlers that only print "stack overflow",
/// and a poll of the standard descriptors. That is 60–80 µs of every call on this machine,
/// where a whole CHECK takes under a millisecond.
///
/// It also installs the plugin's allocator ([`crate::arena::Arena`]): the binary must not
/// declare a `#[global_allocator]` of its own. The arena is made for a call that lives a
/// millisecond. A command line with arguments is an operator's command ([`crate::operator`]),
/// which may run for days (`reconcile --watch`): before anything is allocated, the arena then
/// hands every allocation to the system allocator ([`crate::arena::Arena::hand_over`]), whose
/// freed memory goes back to the system.
///
/// A whole plugin binary (`src/main.rs`; `examples/passthrough.rs` is a complete one):
///
/// ```
/// #![no_main]
///
/// use cni::error::CniError;
/// use cni::skel::{Call, Plugin};
/// use cni::types::CniResult;
///
/// struct Noop;
///
/// impl Plugin for Noop {
///     fn name(&self) -> &'static str {
///         "noop"
///     }
///     fn supported_versions(&self) -> &'static [&'static str] {
///         cni::version::ALL
///     }
///     fn add(&self, _call: &Call) -> Result<CniResult, CniError> {
///         Ok(CniResult::default())
///     }
///     fn check(&self, _call: &Call) -> Result<(), CniError> {
///         Ok(())
///     }
///     fn del(&self, _call: &Call) -> Result<(), CniError> {
///         Ok(())
///     }
/// }
///
/// cni::plugin_main!("noop", Noop);
/// ```
#[macro_export]
macro_rules! plugin_main {
    ($name:literal, $plugin:expr) => {
        /// The allocator of a short-lived plugin process (see [`cni::arena`]).
        #[global_allocator]
        static ALLOCATOR: $crate::arena::Arena = $crate::arena::Arena::new();

        /// The process entry point (see [`cni::plugin_main`]).
        // SAFETY: `main` is the one C entry point of this binary and no other symbol of the
        // program has that name; its signature is the one libc's start-up calls.
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        extern "C" fn main(
            argc: ::std::ffi::c_int,
            argv: *const *const ::std::ffi::c_char,
        ) -> ::std::ffi::c_int {
            // SAFETY: these are the arguments libc passes to `main`.
            let args = unsafe { $crate::operator::Args::from_main(argc, argv) };
            if !args.is_empty() {
                ALLOCATOR.hand_over();
            }
            $crate::skel::main_entry($name, &$plugin, args)
        }
    };
}

// Every plugin answers its command line through the operator module, which sees it only as
// this.
impl<T: Plugin + ?Sized> crate::operator::Operated for T {
    fn name(&self) -> &'static str {
        Plugin::name(self)
    }
    fn supported_versions(&self) -> &'static [&'static str] {
        Plugin::supported_versions(self)
    }
    fn operator_commands(&self) -> &'static [OperatorCommand] {
        Plugin::operator_commands(self)
    }
    fn operate(
        &self,
        command: &str,
        args: &[String],
        out: &mut dyn Write,
    ) -> Result<(), OperatorError> {
        Plugin::operate(self, command, args, out)
    }
}

/// The body of a plugin's `main` ([`plugin_main!`]): what Rust's start-up would have done
/// that matters here (SIGPIPE ignored, so a write to a closed pipe is an error, not death),
/// logging, then [`run`] when there are no `args` (a runtime's call) or the operator's command
/// line ([`crate::operator::run`]), and a flush of stdout and stderr, which nothing else
/// flushes when `main` returns to libc. Returns the exit status.
pub fn main_entry(name: &'static str, plugin: &dyn Plugin, args: Args) -> i32 {
    // SAFETY: installs no handler (SIG_IGN), so no code of ours runs on a signal; nothing
    // else in the process has touched SIGPIPE yet.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    crate::logging::init(name);
    let status = if args.is_empty() {
        run_status(plugin)
    } else {
        crate::operator::run(
            plugin,
            &args.to_vec(),
            &mut std::io::stdout(),
            &mut std::io::stderr(),
        )
    };
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    i32::from(status)
}

/// [`run`], returning the exit status (0 or 1).
///
/// The standard streams are passed unlocked: each write takes its stream's lock for that write
/// only. Holding a lock for the whole call would block every other thread that writes there —
/// a logger on the thread a STATUS probe or a netns helper runs, which the main thread then
/// waits for forever.
fn run_status(plugin: &dyn Plugin) -> u8 {
    use std::io::IsTerminal;
    let env = |key: &str| std::env::var_os(key).map(|v| v.to_string_lossy().into_owned());
    // VERSION needs no input: do not block on a terminal when someone runs it by hand.
    let interactive_version =
        env("CNI_COMMAND").as_deref() == Some("VERSION") && std::io::stdin().is_terminal();
    let mut stdin: Box<dyn Read> = if interactive_version {
        Box::new(std::io::empty())
    } else {
        Box::new(std::io::stdin())
    };
    run_with(
        plugin,
        &env,
        &mut stdin,
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    )
}

/// Runs `plugin` with injected environment and stdio, and returns the exit status (0 or 1).
pub fn run_with(
    plugin: &dyn Plugin,
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let (text, status) = match dispatch(plugin, env, stdin) {
        Outcome::About => {
            let about = format!(
                "CNI {} plugin {}\nCNI protocol versions supported: {}\n",
                plugin.name(),
                env!("CARGO_PKG_VERSION"),
                plugin.supported_versions().join(", ")
            );
            // Nothing useful can be done if stderr is closed.
            let _ = stderr.write_all(about.as_bytes());
            return 0;
        }
        Outcome::Print(text) => (text, 0),
        Outcome::Fail { version, error } => {
            log::debug!("{} failed: {error}", plugin.name());
            (error.to_json(&version), 1)
        }
    };
    if let Err(e) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        let _ = writeln!(stderr, "{}: failed to write to stdout: {e}", plugin.name());
        return 1;
    }
    status
}

enum Outcome {
    About,
    Print(String),
    Fail { version: String, error: CniError },
}

fn dispatch(
    plugin: &dyn Plugin,
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
) -> Outcome {
    let fail = |version: &str, error: CniError| Outcome::Fail {
        version: version.to_string(),
        error,
    };
    let var = |key: &str| env(key).unwrap_or_default();
    let command_text = var("CNI_COMMAND");
    if command_text.is_empty() {
        return Outcome::About;
    }
    let command = match command_text.parse::<Command>() {
        Ok(c) => c,
        Err(e) => return fail(version::LATEST, e),
    };
    let mut call = match read_env(command, &var) {
        Ok(call) => call,
        Err(e) => return fail(version::LATEST, e),
    };
    let mut input = Vec::new();
    if let Err(e) = stdin.read_to_end(&mut input) {
        return fail(
            version::LATEST,
            CniError::new(ErrorCode::Io, format!("error reading from stdin: {e}")),
        );
    }
    if command == Command::Version {
        return match version_input(&input).map(|asked| version_reply(plugin, asked.as_deref())) {
            Ok(text) => Outcome::Print(text),
            Err(e) => fail(version::LATEST, e),
        };
    }
    // Checked once here; plugins decode their keys from the text through `Call::conf`.
    call.config = match RawJson::parse(input) {
        Ok(json) => json,
        Err(e) => return fail(version::LATEST, decode_error(UNMARSHAL_LEAD, &e)),
    };
    let name = match call.config.decode::<SkelName>() {
        Ok(head) => head.name,
        Err(e) => return fail(version::LATEST, decode_error(UNMARSHAL_LEAD, &e)),
    };
    let cni_version = call.config.decode::<SkelVersion>().map(|v| v.cni_version);
    // From here on errors are reported in the caller's version, when it is a version at all.
    let reply_version = match &cni_version {
        Ok(v) if v.parse::<CniVersion>().is_ok() => v.clone(),
        _ => version::LATEST.to_string(),
    };
    if let Err(e) = validate_network_name(&name) {
        return fail(&reply_version, e);
    }
    let cni_version = match cni_version {
        Ok(v) => v,
        Err(e) => return fail(version::LATEST, decode_error(VERSION_LEAD, &e)),
    };
    call.cni_version = if cni_version.is_empty() {
        "0.1.0".to_string()
    } else {
        cni_version
    };
    if let Err(e) = gate_version(command, &call.cni_version, plugin.supported_versions()) {
        return fail(&reply_version, e);
    }
    if command.is_attachment_verb()
        && plugin.uses_netns()
        && !is_truthy(&var("CNI_NETNS_OVERRIDE"))
        && let Err(e) = refuse_own_netns(&call)
    {
        return fail(&reply_version, e);
    }
    log::debug!(
        "{} {} container={} ifname={} netns={:?}",
        plugin.name(),
        command,
        call.container_id,
        call.ifname,
        call.netns
    );
    let outcome = match command {
        Command::Add => plugin
            .add(&call)
            .and_then(|result| print_result(&result, &call.cni_version)),
        Command::Check => plugin.check(&call).map(|()| String::new()),
        Command::Del => plugin.del(&call).map(|()| String::new()),
        Command::Gc => plugin.gc(&call).map(|()| String::new()),
        Command::Status => plugin.status(&call).map(|()| String::new()),
        // Answered before the config checks above; kept here so the match stays exhaustive.
        Command::Version => Ok(version_reply(plugin, Some(&call.cni_version))),
    };
    match outcome {
        Ok(text) => Outcome::Print(text),
        Err(e) => fail(&reply_version, e),
    }
}

/// How the reference's skel leads a configuration that is not JSON or whose `name` is no
/// string.
const UNMARSHAL_LEAD: &str = "error unmarshall network config";

/// How the reference's skel leads a configuration whose `cniVersion` is no string.
const VERSION_LEAD: &str = "decoding version from network config";

/// What the reference's skel decodes first (`validateConfig`), as Go names the type.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, rename = "struct { Name string \"json:\\\"name\\\"\" }")]
struct SkelName {
    name: String,
}

/// What the reference's skel decodes next (`ConfigDecoder`), as Go names the type.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(
    default,
    rename = "struct { CNIVersion string \"json:\\\"cniVersion\\\"\" }"
)]
struct SkelVersion {
    #[serde(rename = "cniVersion")]
    cni_version: String,
}

/// The variables in the order the reference reads them, with the verbs that require them.
const VARS: &[(&str, &[Command])] = &[
    (
        "CNI_CONTAINERID",
        &[Command::Add, Command::Check, Command::Del],
    ),
    ("CNI_NETNS", &[Command::Add, Command::Check]),
    ("CNI_IFNAME", &[Command::Add, Command::Check, Command::Del]),
    ("CNI_ARGS", &[]),
    ("CNI_PATH", &[]),
];

fn read_env(command: Command, var: &dyn Fn(&str) -> String) -> Result<Call, CniError> {
    let mut missing = Vec::new();
    for (name, required_by) in VARS {
        let value = var(name);
        if value.is_empty() {
            if required_by.contains(&command) {
                missing.push(*name);
            }
            continue;
        }
        if command.is_attachment_verb() {
            match *name {
                "CNI_CONTAINERID" => validate_container_id(&value)?,
                "CNI_IFNAME" => validate_ifname(&value)?,
                _ => {}
            }
        }
    }
    if !missing.is_empty() {
        return Err(CniError::new(
            ErrorCode::InvalidEnv,
            format!("required env variables [{}] missing", missing.join(",")),
        ));
    }
    let netns = var("CNI_NETNS");
    Ok(Call {
        command,
        container_id: var("CNI_CONTAINERID"),
        netns: (!netns.is_empty()).then(|| PathBuf::from(netns)),
        ifname: var("CNI_IFNAME"),
        args: var("CNI_ARGS"),
        path: std::env::split_paths(&var("CNI_PATH"))
            .filter(|p| !p.as_os_str().is_empty())
            .collect(),
        cni_version: String::new(),
        config: RawJson::default(),
    })
}

/// True for `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, the spec's rule for container IDs and network names.
pub fn is_valid_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    match bytes.next() {
        Some(first) if first.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn validate_container_id(id: &str) -> Result<(), CniError> {
    if is_valid_name(id) {
        Ok(())
    } else {
        Err(
            CniError::new(ErrorCode::InvalidEnv, "invalid characters in containerID")
                .with_details(id),
        )
    }
}

/// Checks an interface name as the spec and the kernel require: at most 15 bytes, not `.` or
/// `..`, and no `/`, `:` or whitespace.
///
/// # Errors
/// Code 4 naming the rule broken, in the reference's words; `details` holds the name.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let err = |msg: &str| CniError::new(ErrorCode::InvalidEnv, msg).with_details(name);
    if name.is_empty() {
        return Err(err("interface name is empty"));
    }
    if name.len() > 15 {
        return Err(
            CniError::new(ErrorCode::InvalidEnv, "interface name is too long").with_details(
                format!(
                    "interface name should be less than 16 characters: {name:?} is {} bytes",
                    name.len()
                ),
            ),
        );
    }
    if name == "." || name == ".." {
        return Err(err("interface name is . or .."));
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(err(
            "interface name contains / or : or whitespace characters",
        ));
    }
    Ok(())
}

/// Checks the network name: present, and matching the container-ID pattern (code 7).
fn validate_network_name(name: &str) -> Result<(), CniError> {
    if name.is_empty() {
        return Err(CniError::invalid_config("missing network name"));
    }
    if !is_valid_name(name) {
        return Err(
            CniError::invalid_config("invalid characters found in network name").with_details(name),
        );
    }
    Ok(())
}

/// The reference's version gate: ADD and DEL need one of the plugin's versions, string for
/// string (so an unparsable one is code 1 as well); CHECK, STATUS and GC parse the version
/// first (code 6 when it is no version) and need their minimum.
fn gate_version(command: Command, config: &str, supported: &[&str]) -> Result<(), CniError> {
    if let Some(min) = command.min_version() {
        let parsed: CniVersion = config.parse().map_err(|e: version::VersionError| {
            CniError::new(
                ErrorCode::Decode,
                format!("invalid cniVersion in config: {e}"),
            )
        })?;
        if parsed < min {
            return Err(CniError::new(
                ErrorCode::IncompatibleVersion,
                format!("config version does not allow {command}"),
            )
            .with_details(format!(
                "config is {config:?}, {command} needs {min} or later"
            )));
        }
        let plugin_allows = supported
            .iter()
            .any(|v| v.parse::<CniVersion>().is_ok_and(|v| v >= min));
        if !plugin_allows {
            return Err(CniError::new(
                ErrorCode::IncompatibleVersion,
                format!("plugin version does not allow {command}"),
            ));
        }
    }
    if !supported.contains(&config) {
        let list: Vec<String> = supported.iter().map(|v| format!("{v:?}")).collect();
        return Err(
            CniError::new(ErrorCode::IncompatibleVersion, "incompatible CNI versions")
                .with_details(format!(
                    "config is {config:?}, plugin supports [{}]",
                    list.join(" ")
                )),
        );
    }
    Ok(())
}

fn refuse_own_netns(call: &Call) -> Result<(), CniError> {
    let Some(path) = &call.netns else {
        return Ok(());
    };
    // A path that is missing, or no network namespace, is the plugin's business (DEL must
    // survive it). `stat` opens nothing, so a FIFO cannot block it; a namespace's identity is
    // its nsfs device and inode, which a bind mount or a `/proc/<pid>/ns/net` path share.
    let identity = |p: &std::path::Path| {
        std::fs::metadata(p).map(|m| {
            use std::os::unix::fs::MetadataExt as _;
            (m.dev(), m.ino())
        })
    };
    let (Ok(target), Ok(own)) = (
        identity(path),
        identity("/proc/thread-self/ns/net".as_ref()),
    ) else {
        return Ok(());
    };
    if target == own {
        return Err(CniError::new(
            ErrorCode::InvalidNetns,
            "plugin's netns and netns from CNI_NETNS should not be the same",
        )
        .with_details(format!("CNI_NETNS={}", path.display())));
    }
    Ok(())
}

fn is_truthy(s: &str) -> bool {
    s == "1" || s.eq_ignore_ascii_case("true")
}

fn print_result(result: &CniResult, version: &str) -> Result<String, CniError> {
    result.to_json(version).map_err(|e| {
        CniError::internal(format!(
            "failed to print the result in version {version}: {e}"
        ))
    })
}

/// The `cniVersion` a VERSION caller gave on stdin, if any.
fn version_input(stdin: &[u8]) -> Result<Option<String>, CniError> {
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    #[derive(serde::Deserialize)]
    struct Asked {
        #[serde(rename = "cniVersion", default)]
        cni_version: Option<RawJson>,
    }
    let input = RawJson::parse(stdin.to_vec()).map_err(|e| {
        CniError::new(
            ErrorCode::Decode,
            format!("failed to decode VERSION input: {e}"),
        )
    })?;
    if !input.is_object() {
        return Ok(None);
    }
    // Anything but a non-empty string is no version: the reply then names the latest.
    let asked = input.decode::<Asked>().ok().and_then(|a| a.cni_version);
    Ok(asked
        .and_then(|v| v.decode::<String>().ok())
        .filter(|v| !v.is_empty()))
}

/// The VERSION reply: the caller's version (or the latest) and the plugin's list.
fn version_reply(plugin: &dyn Plugin, asked: Option<&str>) -> String {
    let reply = serde_json::json!({
        "cniVersion": asked.unwrap_or(version::LATEST),
        "supportedVersions": plugin.supported_versions(),
    });
    format!("{reply}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::os::fd::{AsFd, AsRawFd};

    /// Records the calls it gets and answers as configured.
    #[derive(Default)]
    struct Recorder {
        calls: RefCell<Vec<(Command, String)>>,
        fail_with: Option<CniError>,
        /// `Some(false)`: a plugin that never enters `CNI_NETNS`.
        uses_netns: Option<bool>,
    }

    impl Plugin for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn supported_versions(&self) -> &'static [&'static str] {
            version::ALL
        }
        fn add(&self, call: &Call) -> Result<CniResult, CniError> {
            self.calls
                .borrow_mut()
                .push((call.command, call.cni_version.clone()));
            if let Some(e) = &self.fail_with {
                return Err(e.clone());
            }
            let conf: NetConf<serde::de::IgnoredAny> = call.conf()?;
            Ok(conf.prev_result()?.unwrap_or_default())
        }
        fn check(&self, call: &Call) -> Result<(), CniError> {
            self.calls
                .borrow_mut()
                .push((call.command, call.cni_version.clone()));
            Ok(())
        }
        fn del(&self, call: &Call) -> Result<(), CniError> {
            self.calls
                .borrow_mut()
                .push((call.command, call.cni_version.clone()));
            self.fail_with.clone().map_or(Ok(()), Err)
        }
        fn gc(&self, call: &Call) -> Result<(), CniError> {
            self.calls
                .borrow_mut()
                .push((call.command, call.cni_version.clone()));
            Ok(())
        }
        fn status(&self, call: &Call) -> Result<(), CniError> {
            self.calls
                .borrow_mut()
                .push((call.command, call.cni_version.clone()));
            Ok(())
        }
        fn uses_netns(&self) -> bool {
            self.uses_netns.unwrap_or(true)
        }
    }

    struct Bandwidthish;
    impl Plugin for Bandwidthish {
        fn name(&self) -> &'static str {
            "bandwidthish"
        }
        fn supported_versions(&self) -> &'static [&'static str] {
            version::starting_from("0.3.0")
        }
        fn add(&self, _: &Call) -> Result<CniResult, CniError> {
            Ok(CniResult::default())
        }
        fn check(&self, _: &Call) -> Result<(), CniError> {
            Ok(())
        }
        fn del(&self, _: &Call) -> Result<(), CniError> {
            Ok(())
        }
    }

    struct Run {
        status: u8,
        stdout: String,
        stderr: String,
    }

    impl Run {
        fn error(&self) -> Value {
            assert_eq!(
                self.status, 1,
                "expected a failure, stdout: {}",
                self.stdout
            );
            serde_json::from_str(&self.stdout).expect("stdout is one JSON document")
        }
        fn code(&self) -> u64 {
            self.error()["code"].as_u64().unwrap()
        }
        fn msg(&self) -> String {
            self.error()["msg"].as_str().unwrap().to_string()
        }
    }

    fn env_of(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn invoke(plugin: &dyn Plugin, env: &HashMap<String, String>, stdin: &str) -> Run {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let lookup = |k: &str| env.get(k).cloned();
        let status = run_with(plugin, &lookup, &mut stdin.as_bytes(), &mut out, &mut err);
        Run {
            status,
            stdout: String::from_utf8(out).unwrap(),
            stderr: String::from_utf8(err).unwrap(),
        }
    }

    /// Environment of a well-formed call whose netns is a fresh namespace of its own.
    fn attach_env(command: &str, netns: &str) -> HashMap<String, String> {
        env_of(&[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "ctr-1"),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ])
    }

    /// A fresh network namespace, held open, and a path to it.
    fn other_netns() -> (std::fs::File, String) {
        let ns = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("a network namespace of our own needs root");
            std::fs::File::open("/proc/thread-self/ns/net").unwrap()
        })
        .join()
        .unwrap();
        // /proc/thread-self of a finished thread is gone; our fd keeps the namespace alive.
        let path = format!("/proc/self/fd/{}", ns.as_fd().as_raw_fd());
        (ns, path)
    }

    const CONF: &str = r#"{"cniVersion": "1.0.0", "name": "net1", "type": "recorder"}"#;

    #[test]
    fn no_command_prints_about_on_stderr_only() {
        let run = invoke(&Recorder::default(), &env_of(&[]), "");
        assert_eq!(run.status, 0);
        assert_eq!(run.stdout, "");
        assert!(
            run.stderr.starts_with("CNI recorder plugin"),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr
                .contains("0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0")
        );
    }

    #[test]
    fn version_lists_supported_versions_and_echoes_the_callers_version() {
        let p = Bandwidthish;
        let env = env_of(&[("CNI_COMMAND", "VERSION")]);
        let run = invoke(&p, &env, r#"{"cniVersion": "0.4.0"}"#);
        assert_eq!(run.status, 0);
        assert_eq!(
            run.stdout,
            "{\"cniVersion\":\"0.4.0\",\"supportedVersions\":[\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}\n"
        );
        let run = invoke(&p, &env, "");
        let reply: Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(reply["cniVersion"], "1.1.0");
        let run = invoke(&p, &env, "{not json");
        assert_eq!(run.code(), 6);
    }

    #[test]
    fn unknown_command_is_code_4() {
        let run = invoke(
            &Recorder::default(),
            &env_of(&[("CNI_COMMAND", "FROB")]),
            CONF,
        );
        assert_eq!(run.code(), 4);
        assert_eq!(run.msg(), "unknown CNI_COMMAND: FROB");
    }

    #[test]
    fn missing_variables_are_listed_by_name_per_verb() {
        let cases = [
            (
                "ADD",
                "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME] missing",
            ),
            (
                "CHECK",
                "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME] missing",
            ),
            (
                "DEL",
                "required env variables [CNI_CONTAINERID,CNI_IFNAME] missing",
            ),
        ];
        for (cmd, msg) in cases {
            let run = invoke(&Recorder::default(), &env_of(&[("CNI_COMMAND", cmd)]), CONF);
            assert_eq!(run.code(), 4, "{cmd}");
            assert_eq!(run.msg(), msg, "{cmd}");
        }
        // GC and STATUS need nothing but the command.
        let gc = r#"{"cniVersion": "1.1.0", "name": "net1"}"#;
        for cmd in ["GC", "STATUS"] {
            let run = invoke(&Recorder::default(), &env_of(&[("CNI_COMMAND", cmd)]), gc);
            assert_eq!(run.status, 0, "{cmd}: {}", run.stdout);
            assert_eq!(run.stdout, "");
        }
    }

    #[test]
    fn container_id_and_ifname_are_validated_before_missing_variables() {
        let cases = [
            (
                "CNI_CONTAINERID",
                "-bad",
                "invalid characters in containerID",
            ),
            (
                "CNI_CONTAINERID",
                "a/b",
                "invalid characters in containerID",
            ),
            ("CNI_IFNAME", "..", "interface name is . or .."),
            (
                "CNI_IFNAME",
                "eth 0",
                "interface name contains / or : or whitespace characters",
            ),
            (
                "CNI_IFNAME",
                "eth:0",
                "interface name contains / or : or whitespace characters",
            ),
        ];
        for (key, value, msg) in cases {
            let env = env_of(&[("CNI_COMMAND", "DEL"), (key, value)]);
            let run = invoke(&Recorder::default(), &env, CONF);
            assert_eq!(run.code(), 4, "{key}={value}");
            assert_eq!(run.msg(), msg, "{key}={value}");
            assert_eq!(run.error()["details"], value);
        }
        // The reference's msg and details, the name added to the details.
        let env = env_of(&[("CNI_COMMAND", "DEL"), ("CNI_IFNAME", "abcdefghijklmnop")]);
        let run = invoke(&Recorder::default(), &env, CONF);
        assert_eq!(run.code(), 4);
        assert_eq!(run.msg(), "interface name is too long");
        assert_eq!(
            run.error()["details"],
            "interface name should be less than 16 characters: \"abcdefghijklmnop\" is 16 bytes"
        );
        assert!(validate_ifname("abcdefghijklmno").is_ok());
    }

    #[test]
    fn bad_json_is_code_6_and_bad_names_are_code_7() {
        let env = env_of(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
        ]);
        let p = Recorder::default();
        // The reference's texts, as Debian's plugins print them.
        let cases = [
            (
                "{",
                "error unmarshall network config: unexpected end of JSON input",
            ),
            (
                "[1]",
                r#"error unmarshall network config: json: cannot unmarshal array into Go value of type struct { Name string "json:\"name\"" }"#,
            ),
            (
                r#"{"name": 3, "cniVersion": 5}"#,
                "error unmarshall network config: json: cannot unmarshal number into Go struct field .name of type string",
            ),
            (
                r#"{"name": "n", "cniVersion": 5}"#,
                "decoding version from network config: json: cannot unmarshal number into Go struct field .cniVersion of type string",
            ),
        ];
        for (stdin, msg) in cases {
            let run = invoke(&p, &env, stdin);
            assert_eq!((run.code(), run.msg()), (6, msg.to_string()), "{stdin}");
        }
        // The name is checked before the version is decoded, and the rest of the envelope is
        // the plugin's to decode.
        let run = invoke(&p, &env, r#"{"cniVersion": 5}"#);
        assert_eq!(
            (run.code(), run.msg().as_str()),
            (7, "missing network name")
        );
        let run = invoke(
            &Recorder::default(),
            &env,
            r#"{"name": "n", "capabilities": 5}"#,
        );
        assert_eq!(run.status, 0, "{}", run.stdout);
        let run = invoke(&p, &env, r#"{"cniVersion": "1.0.0"}"#);
        assert_eq!(
            (run.code(), run.msg()),
            (7, "missing network name".to_string())
        );
        let run = invoke(&p, &env, r#"{"cniVersion": "1.0.0", "name": "-x"}"#);
        assert_eq!(run.code(), 7);
        assert_eq!(run.error()["cniVersion"], "1.0.0");
        assert_eq!(run.msg(), "invalid characters found in network name");
        assert_eq!(run.error()["details"], "-x");
        assert!(p.calls.borrow().is_empty());
    }

    #[test]
    fn unsupported_versions_are_code_1_with_the_supported_list() {
        let env = env_of(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
        ]);
        let run = invoke(
            &Bandwidthish,
            &env,
            r#"{"cniVersion": "0.2.0", "name": "n"}"#,
        );
        assert_eq!(run.code(), 1);
        assert_eq!(run.msg(), "incompatible CNI versions");
        assert_eq!(
            run.error()["details"],
            r#"config is "0.2.0", plugin supports ["0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]"#
        );
        // The error is reported in the caller's version.
        assert_eq!(run.error()["cniVersion"], "0.2.0");
        // No cniVersion means 0.1.0.
        let run = invoke(&Bandwidthish, &env, r#"{"name": "n"}"#);
        assert_eq!(run.code(), 1);
        assert!(
            run.error()["details"]
                .as_str()
                .unwrap()
                .starts_with("config is \"0.1.0\"")
        );
        // ADD and DEL compare strings, as the reference: no version at all is code 1 too.
        for bad in ["one", "1.0.0.0"] {
            let run = invoke(
                &Bandwidthish,
                &env,
                &format!(r#"{{"cniVersion": "{bad}", "name": "n"}}"#),
            );
            assert_eq!(run.code(), 1, "{bad}");
            assert_eq!(run.msg(), "incompatible CNI versions");
            assert_eq!(
                run.error()["details"],
                format!(
                    r#"config is "{bad}", plugin supports ["0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]"#
                )
            );
        }
        let run = invoke(
            &Bandwidthish,
            &env,
            r#"{"cniVersion": "0.5.0", "name": "n"}"#,
        );
        assert_eq!(run.code(), 1);
    }

    #[test]
    fn check_needs_0_4_0_and_status_and_gc_need_1_1_0() {
        let check = env_of(&[
            ("CNI_COMMAND", "CHECK"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/nonexistent"),
        ]);
        let run = invoke(
            &Recorder::default(),
            &check,
            r#"{"cniVersion": "0.3.1", "name": "n"}"#,
        );
        assert_eq!(run.code(), 1);
        assert_eq!(run.msg(), "config version does not allow CHECK");
        for cmd in ["STATUS", "GC"] {
            let env = env_of(&[("CNI_COMMAND", cmd)]);
            let run = invoke(
                &Recorder::default(),
                &env,
                r#"{"cniVersion": "1.0.0", "name": "n"}"#,
            );
            assert_eq!(run.code(), 1, "{cmd}");
            assert_eq!(run.msg(), format!("config version does not allow {cmd}"));
        }
        // These parse the version first: no version at all is a decode error.
        let run = invoke(
            &Recorder::default(),
            &check,
            r#"{"cniVersion": "1.0.0.0", "name": "n"}"#,
        );
        assert_eq!(run.code(), 6);
        for cmd in ["STATUS", "GC"] {
            let env = env_of(&[("CNI_COMMAND", cmd)]);
            let run = invoke(
                &Recorder::default(),
                &env,
                r#"{"cniVersion": "1.1", "name": "n"}"#,
            );
            assert_eq!(
                run.code(),
                1,
                "{cmd}: 1.1 parses as 1.1.0 but is not listed"
            );
            let run = invoke(
                &Recorder::default(),
                &env,
                r#"{"cniVersion": "1.x", "name": "n"}"#,
            );
            assert_eq!(run.code(), 6, "{cmd}");
        }
    }

    #[test]
    fn add_prints_prev_result_in_the_config_version_and_nothing_else() {
        let (_ns, path) = other_netns();
        let p = Recorder::default();
        let conf = r#"{"cniVersion": "0.4.0", "name": "net1", "type": "recorder",
            "prevResult": {"cniVersion": "0.4.0",
              "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
              "ips": [{"version": "4", "interface": 0, "address": "10.1.0.5/24", "gateway": "10.1.0.1"}]}}"#;
        let run = invoke(&p, &attach_env("ADD", &path), conf);
        assert_eq!(run.status, 0, "{}", run.stdout);
        let out: Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(out["cniVersion"], "0.4.0");
        assert_eq!(out["ips"][0]["address"], "10.1.0.5/24");
        assert_eq!(out["ips"][0]["version"], "4");
        assert!(!run.stdout.ends_with('\n'));
        assert_eq!(
            p.calls.borrow().as_slice(),
            &[(Command::Add, "0.4.0".to_string())]
        );
    }

    #[test]
    fn check_del_gc_status_print_nothing_on_success() {
        let (_ns, path) = other_netns();
        let p = Recorder::default();
        for cmd in ["CHECK", "DEL"] {
            let run = invoke(&p, &attach_env(cmd, &path), CONF);
            assert_eq!((run.status, run.stdout.as_str()), (0, ""), "{cmd}");
        }
        let v11 = r#"{"cniVersion": "1.1.0", "name": "net1"}"#;
        for cmd in ["GC", "STATUS"] {
            let run = invoke(&p, &env_of(&[("CNI_COMMAND", cmd)]), v11);
            assert_eq!((run.status, run.stdout.as_str()), (0, ""), "{cmd}");
        }
        let verbs: Vec<Command> = p.calls.borrow().iter().map(|c| c.0).collect();
        assert_eq!(
            verbs,
            [Command::Check, Command::Del, Command::Gc, Command::Status]
        );
    }

    #[test]
    fn plugin_errors_are_printed_as_one_error_object_with_the_config_version() {
        let p = Recorder {
            fail_with: Some(CniError::new(ErrorCode::TryAgainLater, "lock held").with_details("x")),
            ..Recorder::default()
        };
        let env = env_of(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
        ]);
        let run = invoke(&p, &env, r#"{"cniVersion": "0.4.0", "name": "n"}"#);
        assert_eq!(
            run.error(),
            serde_json::json!({"cniVersion": "0.4.0", "code": 11, "msg": "lock held", "details": "x"})
        );
    }

    #[test]
    fn a_plugin_that_never_enters_the_netns_is_not_refused_its_own() {
        let p = Recorder {
            uses_netns: Some(false),
            ..Recorder::default()
        };
        for cmd in ["ADD", "CHECK", "DEL"] {
            let run = invoke(&p, &attach_env(cmd, "/proc/thread-self/ns/net"), CONF);
            assert_eq!(run.status, 0, "{cmd}: {}", run.stdout);
        }
        assert_eq!(p.calls.borrow().len(), 3);
    }

    #[test]
    fn a_fifo_as_cni_netns_blocks_no_verb() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let fifo = fifo.to_str().unwrap().to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        // Detached: a blocked open fails the test at the deadline instead of hanging it.
        std::thread::spawn(move || {
            let statuses: Vec<u8> = ["ADD", "CHECK", "DEL"]
                .into_iter()
                .map(|cmd| invoke(&Recorder::default(), &attach_env(cmd, &fifo), CONF).status)
                .collect();
            let _ = tx.send(statuses);
        });
        let statuses = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a verb blocked on the FIFO");
        // Not the plugin's own namespace: the (recording) plugin runs.
        assert_eq!(statuses, [0, 0, 0]);
    }

    #[test]
    fn cni_netns_of_the_plugins_own_namespace_is_refused_unless_overridden() {
        let p = Recorder::default();
        let run = invoke(&p, &attach_env("ADD", "/proc/thread-self/ns/net"), CONF);
        assert_eq!(run.code(), 8);
        assert!(p.calls.borrow().is_empty());
        let mut env = attach_env("DEL", "/proc/thread-self/ns/net");
        env.insert("CNI_NETNS_OVERRIDE".into(), "true".into());
        let run = invoke(&p, &env, CONF);
        assert_eq!(run.status, 0, "{}", run.stdout);
    }

    #[test]
    fn del_runs_without_a_netns_and_with_a_vanished_one() {
        let p = Recorder::default();
        // No CNI_PATH either: SPEC.md makes it optional (the Go skel requires it).
        let env = env_of(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
        ]);
        assert_eq!(invoke(&p, &env, CONF).status, 0);
        let run = invoke(&p, &attach_env("DEL", "/run/netns/gone-for-good"), CONF);
        assert_eq!(run.status, 0);
        assert_eq!(p.calls.borrow().len(), 2);
    }

    #[test]
    fn call_exposes_cni_args_and_path() {
        let mut env = attach_env("ADD", "/x");
        env.insert(
            "CNI_ARGS".into(),
            "IgnoreUnknown=1;MAC=02:00:00:00:00:01".into(),
        );
        env.insert("CNI_PATH".into(), "/opt/cni/bin:/usr/lib/cni".into());
        let lookup = |k: &str| env.get(k).cloned().unwrap_or_default();
        let call = read_env(Command::Add, &lookup).unwrap();
        assert_eq!(call.cni_args().unwrap().mac(), Some("02:00:00:00:00:01"));
        assert_eq!(
            call.path,
            [PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
        assert_eq!(call.netns, Some(PathBuf::from("/x")));
        assert_eq!(call.netns_path().unwrap(), std::path::Path::new("/x"));
    }

    #[test]
    fn names_follow_the_spec_pattern() {
        for ok in ["a", "net1", "my_net.v2-x", "0"] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in ["", "-a", "_a", ".a", "a b", "a/b", "ä"] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }
}
