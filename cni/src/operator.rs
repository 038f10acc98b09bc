//! Operator commands: a plugin binary run by a person or a systemd unit with arguments
//! (`firewall reconcile`, `portmap --help`), as opposed to a call by a CNI runtime, which execs
//! a plugin with no argument at all and `CNI_COMMAND` set (libcni's `Args` is the plugin's path
//! alone). So the first argument decides: none, and the binary is a CNI plugin exactly as
//! before ([`crate::skel`]); any, and it is a command-line tool whose commands the plugin lists
//! in [`Plugin::operator_commands`] and runs in [`Plugin::operate`].
//!
//! A plugin that lists no command still answers `--help` (its usage as a CNI plugin) and
//! refuses anything else with status 2, the usual status of a usage error.
//!
//! [`Args`] reads the C `main`'s `argv` itself: the binaries have no Rust `main`
//! ([`crate::plugin_main!`]), and the standard library fills `std::env::args` before `main`
//! only on glibc, not on musl, which the release binaries link.

use std::ffi::{CStr, OsString, c_char, c_int};
use std::io::Write;
use std::os::unix::ffi::OsStrExt as _;

/// Exit status of a command that failed.
pub const FAILED: u8 = 1;

/// Exit status of a command line that names no command of the plugin, or an option the
/// command does not take.
pub const USAGE: u8 = 2;

/// One command a plugin takes on its command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperatorCommand {
    /// The command, as typed: `reconcile`.
    pub name: &'static str,
    /// What follows the command, for the usage line: `[--watch]`.
    pub options: &'static str,
    /// One line for the plugin's `--help`.
    pub summary: &'static str,
    /// The command's own `--help`: what it does, its options, its exit status.
    pub help: &'static str,
}

/// A command that did not succeed: what to print on stderr, and the exit status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OperatorError {
    /// The message (one or more lines, without the program's name).
    pub message: String,
    /// The exit status: [`FAILED`], or [`USAGE`] for a command line the command refuses.
    pub status: u8,
}

impl OperatorError {
    /// The command failed: status [`FAILED`].
    pub fn failed(message: impl Into<String>) -> OperatorError {
        OperatorError {
            message: message.into(),
            status: FAILED,
        }
    }

    /// The command line is wrong: status [`USAGE`].
    pub fn usage(message: impl Into<String>) -> OperatorError {
        OperatorError {
            message: message.into(),
            status: USAGE,
        }
    }
}

/// The arguments of the process after its name, read from the C `main`'s `argv` without
/// allocating (so that the allocator can be chosen by whether there are any: see
/// [`crate::arena::Arena::hand_over`]).
#[derive(Debug, Clone, Copy)]
pub struct Args {
    argc: usize,
    argv: *const *const c_char,
}

impl Args {
    /// No arguments (as in the tests, or a `main` that has none to give).
    #[must_use]
    pub fn none() -> Args {
        Args {
            argc: 0,
            argv: std::ptr::null(),
        }
    }

    /// The arguments libc passed to `main`.
    ///
    /// # Safety
    /// `argv` must hold `argc` pointers to NUL-terminated strings that stay valid and
    /// unchanged for the life of the process, as those libc passes to `main` do.
    #[allow(unsafe_code)]
    #[must_use]
    pub unsafe fn from_main(argc: c_int, argv: *const *const c_char) -> Args {
        Args {
            argc: if argv.is_null() {
                0
            } else {
                usize::try_from(argc).unwrap_or(0)
            },
            argv,
        }
    }

    /// Whether there is none besides the program's name: the runtime's call.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.argc <= 1
    }

    /// The arguments after the program's name.
    #[must_use]
    pub fn to_vec(&self) -> Vec<OsString> {
        (1..self.argc)
            .map(|i| {
                // SAFETY: `from_main`'s contract: `argv` holds `argc` valid C strings.
                #[allow(unsafe_code)]
                let arg = unsafe { CStr::from_ptr(*self.argv.add(i)) };
                std::ffi::OsStr::from_bytes(arg.to_bytes()).to_owned()
            })
            .collect()
    }
}

/// What the command line needs of a plugin: the skel gives it for every
/// [`crate::skel::Plugin`], so that this module knows nothing of the skel.
pub trait Operated {
    /// The plugin's type name.
    fn name(&self) -> &'static str;
    /// The CNI versions it speaks, for its `--help`.
    fn supported_versions(&self) -> &'static [&'static str];
    /// Its commands.
    fn operator_commands(&self) -> &'static [OperatorCommand];
    /// Runs one of its commands.
    ///
    /// # Errors
    /// What the command reports.
    fn operate(
        &self,
        command: &str,
        args: &[String],
        out: &mut dyn Write,
    ) -> Result<(), OperatorError>;
}

/// The plugin's `--help`: how a runtime runs it, and its commands.
fn usage<P: Operated + ?Sized>(plugin: &P) -> String {
    let name = plugin.name();
    let mut text = format!(
        "CNI {name} plugin {}\nCNI protocol versions supported: {}\n\n\
         As a CNI plugin, a container runtime runs it with no arguments, CNI_COMMAND and the\n\
         other CNI_* variables set and the network configuration on stdin (see the CNI\n\
         specification).\n",
        env!("CARGO_PKG_VERSION"),
        plugin.supported_versions().join(", ")
    );
    let commands = plugin.operator_commands();
    if commands.is_empty() {
        text.push_str(&format!(
            "\nUsage: {name} --help\n\n{name} takes no command on its command line.\n"
        ));
        return text;
    }
    text.push_str(&format!(
        "\nUsage: {name} <command> [options]\n       {name} <command> --help\n\nCommands:\n"
    ));
    let width = commands
        .iter()
        .map(|c| command_line(c).len())
        .max()
        .unwrap_or(0);
    for command in commands {
        text.push_str(&format!(
            "  {:width$}  {}\n",
            command_line(command),
            command.summary
        ));
    }
    text
}

fn command_line(command: &OperatorCommand) -> String {
    if command.options.is_empty() {
        command.name.to_owned()
    } else {
        format!("{} {}", command.name, command.options)
    }
}

/// A command's `--help`.
fn command_usage<P: Operated + ?Sized>(plugin: &P, command: &OperatorCommand) -> String {
    format!(
        "Usage: {} {}\n\n{}\n",
        plugin.name(),
        command_line(command),
        command.help.trim_end()
    )
}

fn is_help(arg: &str) -> bool {
    matches!(arg, "-h" | "--help" | "help")
}

/// Runs the command line `args` (the arguments after the program's name; at least one) and
/// returns the exit status: the usage on `--help` (0), the command's outcome (0, or its status
/// with its message on `stderr`), or [`USAGE`] for anything the plugin does not take.
pub fn run<P: Operated + ?Sized>(
    plugin: &P,
    args: &[OsString],
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let name = plugin.name();
    let mut text = Vec::with_capacity(args.len());
    for arg in args {
        match arg.to_str() {
            Some(arg) => text.push(arg.to_owned()),
            None => {
                let _ = writeln!(stderr, "{name}: argument {arg:?} is not UTF-8");
                return USAGE;
            }
        }
    }
    let Some((first, rest)) = text.split_first() else {
        return print(stdout, stderr, name, &usage(plugin));
    };
    if is_help(first) {
        return print(stdout, stderr, name, &usage(plugin));
    }
    let Some(command) = plugin.operator_commands().iter().find(|c| c.name == first) else {
        let _ = writeln!(
            stderr,
            "{name}: unknown command {first:?}; `{name} --help` lists the commands"
        );
        return USAGE;
    };
    if rest.iter().any(|a| is_help(a)) {
        return print(stdout, stderr, name, &command_usage(plugin, command));
    }
    let outcome = plugin.operate(command.name, rest, stdout);
    let _ = stdout.flush();
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(stderr, "{name} {}: {}", command.name, e.message);
            if e.status == USAGE {
                let _ = writeln!(
                    stderr,
                    "{name} {} --help describes the command",
                    command.name
                );
            }
            e.status.max(FAILED)
        }
    }
}

fn print(stdout: &mut dyn Write, stderr: &mut dyn Write, name: &str, text: &str) -> u8 {
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(stderr, "{name}: failed to write to stdout: {e}");
            FAILED
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CniError;
    use crate::skel::{Call, Plugin};
    use crate::types::CniResult;
    use std::cell::RefCell;

    /// A plugin with one command, `sweep [--twice]`, which fails on `--fail` and refuses any
    /// other option.
    #[derive(Default)]
    struct Tool {
        runs: RefCell<Vec<Vec<String>>>,
    }

    const SWEEP: OperatorCommand = OperatorCommand {
        name: "sweep",
        options: "[--twice]",
        summary: "sweeps the floor",
        help: "Sweeps the floor, twice with --twice.\n\nExit status: 0 when swept.",
    };

    impl Plugin for Tool {
        fn name(&self) -> &'static str {
            "tool"
        }
        fn supported_versions(&self) -> &'static [&'static str] {
            &["1.0.0", "1.1.0"]
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
        fn operator_commands(&self) -> &'static [OperatorCommand] {
            &[SWEEP]
        }
        fn operate(
            &self,
            command: &str,
            args: &[String],
            out: &mut dyn Write,
        ) -> Result<(), OperatorError> {
            assert_eq!(command, "sweep");
            self.runs.borrow_mut().push(args.to_vec());
            match args {
                [] => writeln!(out, "swept").map_err(|e| OperatorError::failed(e.to_string())),
                [twice] if twice == "--twice" => {
                    writeln!(out, "swept\nswept").map_err(|e| OperatorError::failed(e.to_string()))
                }
                [fail] if fail == "--fail" => Err(OperatorError::failed("the broom broke")),
                [other, ..] => Err(OperatorError::usage(format!("unknown option {other:?}"))),
            }
        }
    }

    /// A plugin without commands.
    struct Plain;

    impl Plugin for Plain {
        fn name(&self) -> &'static str {
            "plain"
        }
        fn supported_versions(&self) -> &'static [&'static str] {
            &["1.1.0"]
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

    fn run_args(plugin: &dyn Plugin, args: &[&str]) -> (u8, String, String) {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let status = run(plugin, &args, &mut out, &mut err);
        (
            status,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn help_lists_the_commands_and_says_how_a_runtime_runs_the_plugin() {
        for help in ["--help", "-h", "help"] {
            let (status, out, err) = run_args(&Tool::default(), &[help]);
            assert_eq!((status, err.as_str()), (0, ""));
            assert!(out.starts_with("CNI tool plugin "), "{out}");
            assert!(out.contains("versions supported: 1.0.0, 1.1.0"), "{out}");
            assert!(out.contains("CNI_COMMAND"), "{out}");
            assert!(
                out.contains("  sweep [--twice]  sweeps the floor\n"),
                "{out}"
            );
        }
        let (status, out, _) = run_args(&Plain, &["--help"]);
        assert_eq!(status, 0);
        assert!(out.contains("plain takes no command"), "{out}");
    }

    #[test]
    fn a_command_runs_with_what_follows_it_and_its_help_is_its_own() {
        let tool = Tool::default();
        assert_eq!(
            run_args(&tool, &["sweep"]),
            (0, "swept\n".into(), "".into())
        );
        assert_eq!(
            run_args(&tool, &["sweep", "--twice"]),
            (0, "swept\nswept\n".into(), "".into())
        );
        let (status, out, _) = run_args(&tool, &["sweep", "--help"]);
        assert_eq!(status, 0);
        assert_eq!(
            out,
            "Usage: tool sweep [--twice]\n\nSweeps the floor, twice with --twice.\n\n\
             Exit status: 0 when swept.\n"
        );
        assert_eq!(
            *tool.runs.borrow(),
            [Vec::<String>::new(), vec!["--twice".to_owned()]],
            "--help ran the command"
        );
    }

    #[test]
    fn failures_go_to_stderr_with_their_status() {
        let tool = Tool::default();
        let (status, out, err) = run_args(&tool, &["sweep", "--fail"]);
        assert_eq!((status, out.as_str()), (FAILED, ""));
        assert_eq!(err, "tool sweep: the broom broke\n");
        let (status, _, err) = run_args(&tool, &["sweep", "--wet"]);
        assert_eq!(status, USAGE);
        assert!(
            err.starts_with("tool sweep: unknown option \"--wet\"\n"),
            "{err}"
        );
        assert!(err.contains("tool sweep --help"), "{err}");
        let (status, out, err) = run_args(&tool, &["mop"]);
        assert_eq!((status, out.as_str()), (USAGE, ""));
        assert!(err.contains("unknown command \"mop\""), "{err}");
        assert!(err.contains("tool --help"), "{err}");
        let (status, _, err) = run_args(&Plain, &["reconcile"]);
        assert_eq!(status, USAGE);
        assert!(err.contains("unknown command \"reconcile\""), "{err}");
        // Not UTF-8: refused before anything runs.
        use std::os::unix::ffi::OsStringExt as _;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let bad = [OsString::from_vec(vec![b's', 0xff])];
        assert_eq!(run(&tool, &bad, &mut out, &mut err), USAGE);
        assert!(tool.runs.borrow().len() == 2);
    }

    #[test]
    fn args_read_from_main_skip_the_program_name() {
        let strings = [c"/opt/cni/bin/tool", c"sweep", c"--twice"];
        let argv: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        // SAFETY: three C strings that live to the end of the test.
        #[allow(unsafe_code)]
        let args = unsafe { Args::from_main(3, argv.as_ptr()) };
        assert!(!args.is_empty());
        assert_eq!(args.to_vec(), [OsString::from("sweep"), "--twice".into()]);
        // SAFETY: as above; only the name.
        #[allow(unsafe_code)]
        let alone = unsafe { Args::from_main(1, argv.as_ptr()) };
        assert!(alone.is_empty() && alone.to_vec().is_empty());
        // SAFETY: a null argv is taken for none.
        #[allow(unsafe_code)]
        let null = unsafe { Args::from_main(2, std::ptr::null()) };
        assert!(null.is_empty());
        assert!(Args::none().is_empty());
    }
}
