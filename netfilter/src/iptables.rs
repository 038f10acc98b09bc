//! A thin layer over the iptables tools: one read of a table (`iptables-save -t <table>`, or
//! for `iptables-nft` the chains wanted over nf_tables netlink, [`native`]), one
//! `iptables-restore --noflush` transaction to write, per family per call. Where the tools are
//! `iptables-nft`, [`native::NativeTables`] writes the same rules without them, one chain or
//! rule at a time.
//!
//! A tool started here dies with the thread that started it (`PR_SET_PDEATHSIG`), which waits
//! for it: a plugin killed mid-call leaves no `iptables-restore` behind to commit later.
//!
//! The iptables backends of `portmap` and `firewall` keep the reference's layout (so a node can
//! switch binaries with containers running) but never exec once per rule as go-iptables does:
//! they read the table once, compute the missing or stale lines, and commit them atomically.
//! Commands run in the network namespace of the calling thread.
//!
//! Two properties of `iptables-restore --noflush` shape the callers (both checked on this
//! machine's iptables 1.8.9, nf_tables and legacy): a `:CHAIN` line **flushes** an existing
//! chain, and `-N CHAIN` fails the whole transaction when the chain exists. So a caller declares
//! with `-N` only the chains the dump lacks, and serialises its read-modify-write with its own
//! [`crate::lock::FileLock`] (never `/run/xtables.lock`, which the legacy tools take themselves).

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod native;
pub mod writer;

/// How long the tools may wait for the legacy xtables lock (`-w`), by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// Extra time granted to a tool beyond its lock wait before it is killed.
const EXEC_GRACE: Duration = Duration::from_secs(10);

/// `iptables-restore`'s exit status for a resource problem, which includes a lock wait that
/// expired.
const RESOURCE_PROBLEM: i32 = 4;

/// IPv4 (`iptables`) or IPv6 (`ip6tables`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `iptables`.
    V4,
    /// `ip6tables`.
    V6,
}

impl Family {
    /// Both families, IPv4 first.
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    /// The family of an address.
    #[must_use]
    pub fn of(addr: &std::net::IpAddr) -> Family {
        if addr.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.prefix())
    }
}

/// A failed iptables tool run.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// The tool is not installed (or not in `PATH`).
    #[error("{program} is not available: {source}")]
    Missing {
        /// The tool.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The legacy xtables lock stayed held for the whole wait.
    #[error("{program}: the xtables lock is held by another process: {stderr}")]
    Locked {
        /// The tool.
        program: String,
        /// What it printed.
        stderr: String,
    },
    /// The tool ran and failed.
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        /// The tool and its main arguments.
        program: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The tool did not finish in time and was killed.
    #[error("{program} did not finish within {waited:?} and was killed")]
    Timeout {
        /// The tool.
        program: String,
        /// How long it ran.
        waited: Duration,
    },
    /// Starting, feeding or reaping the tool failed.
    #[error("failed to run {program}: {source}")]
    Io {
        /// The tool.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A rule argument cannot be written on one restore line.
    #[error("rule argument {arg:?} contains a newline or NUL")]
    BadArgument {
        /// The argument.
        arg: String,
    },
    /// `iptables-save` printed a line this parser does not understand.
    #[error("unexpected line in {program} output: {line:?}")]
    Parse {
        /// The tool.
        program: String,
        /// The line.
        line: String,
    },
}

impl IptablesError {
    /// Whether the tool is missing, i.e. the family's iptables is unusable on this host.
    #[must_use]
    pub fn is_missing(&self) -> bool {
        matches!(self, IptablesError::Missing { .. })
    }
}

/// One table as `iptables-save` printed it: chains in order, and each chain's rules as argument
/// lists without the leading `-A <chain>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableDump {
    chains: Vec<String>,
    rules: BTreeMap<String, Vec<Vec<String>>>,
}

impl TableDump {
    /// Parses `iptables-save -t <table>` output (one table).
    ///
    /// # Errors
    /// On a rule line that does not split, or a rule for an undeclared chain.
    pub fn parse(text: &str) -> Result<TableDump, String> {
        let mut dump = TableDump::default();
        for line in text.lines() {
            if let Some(decl) = line.strip_prefix(':') {
                let name = decl.split_whitespace().next().unwrap_or_default();
                dump.chains.push(name.to_owned());
                dump.rules.entry(name.to_owned()).or_default();
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let mut args = split_args(rule).ok_or_else(|| line.to_owned())?;
                if args.is_empty() {
                    return Err(line.to_owned());
                }
                let chain = args.remove(0);
                dump.rules
                    .get_mut(&chain)
                    .ok_or_else(|| line.to_owned())?
                    .push(args);
            }
        }
        Ok(dump)
    }

    /// Whether `chain` exists.
    #[must_use]
    pub fn has_chain(&self, chain: &str) -> bool {
        self.rules.contains_key(chain)
    }

    /// The chains, in `iptables-save` order.
    #[must_use]
    pub fn chains(&self) -> &[String] {
        &self.chains
    }

    /// The rules of `chain` (empty when it does not exist).
    #[must_use]
    pub fn rules(&self, chain: &str) -> &[Vec<String>] {
        self.rules.get(chain).map_or(&[], Vec::as_slice)
    }

    /// Whether `chain` holds a rule with exactly these arguments (in `iptables-save` form).
    #[must_use]
    pub fn has_rule<S: AsRef<str>>(&self, chain: &str, args: &[S]) -> bool {
        self.rules(chain).iter().any(|rule| {
            rule.len() == args.len() && rule.iter().zip(args).all(|(a, b)| a == b.as_ref())
        })
    }
}

/// Splits one `iptables-save` rule into arguments: whitespace separates, double quotes group,
/// and inside quotes a backslash escapes the next character (iptables' own quoting).
/// `None` on an unterminated quote.
#[must_use]
pub fn split_args(line: &str) -> Option<Vec<String>> {
    let mut args = Vec::new();
    let mut current = String::new();
    let mut in_arg = false;
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '\\' => current.push(chars.next()?),
                '"' => quoted = false,
                _ => current.push(c),
            }
        } else if c == '"' {
            quoted = true;
            in_arg = true;
        } else if c.is_whitespace() {
            if in_arg {
                args.push(std::mem::take(&mut current));
                in_arg = false;
            }
        } else {
            current.push(c);
            in_arg = true;
        }
    }
    if quoted {
        return None;
    }
    if in_arg {
        args.push(current);
    }
    Some(args)
}

/// Quotes one argument for an `iptables-restore` line, as `iptables-save` would print it.
fn quote(arg: &str) -> Result<String, IptablesError> {
    if arg.contains(['\n', '\r', '\0']) {
        return Err(IptablesError::BadArgument {
            arg: arg.to_owned(),
        });
    }
    if !arg.is_empty() && !arg.contains([' ', '\t', '"', '\\', '\'']) {
        return Ok(arg.to_owned());
    }
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('"');
    for c in arg.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

/// One line of an `iptables-restore` script: `op` (`-A`, `-I`, `-D`, `-N`, `-F`, `-X`) applied to
/// `chain` with `args`, each quoted as needed.
///
/// # Errors
/// When an argument contains a newline or NUL.
pub fn restore_line<S: AsRef<str>>(
    op: &str,
    chain: &str,
    args: &[S],
) -> Result<String, IptablesError> {
    let mut line = format!("{op} {}", quote(chain)?);
    for arg in args {
        line.push(' ');
        line.push_str(&quote(arg.as_ref())?);
    }
    Ok(line)
}

/// The iptables tools of one family.
#[derive(Debug, Clone)]
pub struct Iptables {
    family: Family,
    wait: Duration,
}

impl Iptables {
    /// The tools of `family`, waiting at most [`DEFAULT_WAIT`] for the legacy xtables lock.
    #[must_use]
    pub fn new(family: Family) -> Iptables {
        Iptables {
            family,
            wait: DEFAULT_WAIT,
        }
    }

    /// Sets the lock wait (rounded up to whole seconds, at least one).
    #[must_use]
    pub fn with_wait(mut self, wait: Duration) -> Iptables {
        self.wait = wait;
        self
    }

    /// The family.
    #[must_use]
    pub fn family(&self) -> Family {
        self.family
    }

    fn wait_secs(&self) -> String {
        self.wait.as_secs().max(1).to_string()
    }

    /// Reads one table with `iptables-save -t <table>`.
    ///
    /// # Errors
    /// When the tool is missing or fails, or prints something unparsable.
    pub fn save(&self, table: &str) -> Result<TableDump, IptablesError> {
        let program = format!("{}-save", self.family.prefix());
        let out = self.run(&program, &["-t", table], None)?;
        let text = String::from_utf8_lossy(&out.stdout);
        TableDump::parse(&text).map_err(|line| IptablesError::Parse { program, line })
    }

    /// The rules of `chains` in `table`, as [`Iptables::save`] reads them (a chain that does
    /// not exist is absent from the dump; the other chains of the table, and the rules a
    /// chain's [`native::Wanted`] leaves out, may be left out). Where the tools are
    /// `iptables-nft`, the chains are read over nf_tables netlink ([`native::snapshot`]),
    /// which neither starts a process nor decodes the rules no one asked about; otherwise, or
    /// when a rule read is in a form that read does not decode, with `iptables-save`.
    ///
    /// # Errors
    /// As [`Iptables::save`].
    pub fn snapshot(
        &self,
        table: &str,
        chains: &[(&str, native::Wanted<'_>)],
    ) -> Result<TableDump, IptablesError> {
        if native::writes_nf_tables(self.family) {
            match native::snapshot(self.family, table, chains) {
                Ok(Some(dump)) => return Ok(dump),
                Ok(None) => log::debug!("{}: reading {table} with save", self.family),
                Err(e) => log::debug!("{}: nf_tables read of {table}: {e}", self.family),
            }
        }
        self.save(table)
    }

    /// Commits `lines` to `table` in one `iptables-restore --noflush` transaction: all or
    /// nothing. Does nothing when `lines` is empty.
    ///
    /// # Errors
    /// When the tool is missing, the lock wait expires (see [`IptablesError::Locked`]), or any
    /// line fails (the transaction is then not applied).
    pub fn restore(&self, table: &str, lines: &[String]) -> Result<(), IptablesError> {
        if lines.is_empty() {
            return Ok(());
        }
        let program = format!("{}-restore", self.family.prefix());
        let wait = self.wait_secs();
        self.run(
            &program,
            &["--noflush", "-w", &wait],
            Some(script(table, lines).as_bytes()),
        )?;
        Ok(())
    }

    /// Whether this family's tools work here: `<family>-save -t filter` succeeds.
    ///
    /// # Errors
    /// The failure, when they do not.
    pub fn probe(&self) -> Result<(), IptablesError> {
        self.save("filter").map(|_| ())
    }

    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<Output, IptablesError> {
        let child = spawn(program, args, stdin.is_some())?;
        finish(
            Started {
                child,
                program: program.to_owned(),
                args: args.iter().map(|a| (*a).to_owned()).collect(),
                limit: self.wait + EXEC_GRACE,
            },
            stdin,
        )
    }
}

/// A tool process that has been started.
#[derive(Debug)]
struct Started {
    child: Child,
    program: String,
    args: Vec<String>,
    limit: Duration,
}

/// The `iptables-restore` input committing `lines` to `table`.
fn script(table: &str, lines: &[String]) -> String {
    let mut script = format!("*{table}\n");
    for line in lines {
        script.push_str(line);
        script.push('\n');
    }
    script.push_str("COMMIT\n");
    script
}

/// Starts `program`. The child is killed when the thread that starts it exits
/// (`PR_SET_PDEATHSIG`), so a plugin killed while its `iptables-restore` waits for the lock or
/// reads its script takes the transaction with it instead of leaving it to commit later. The
/// thread calling this waits for the child ([`finish`]) or kills it, so it outlives the child
/// in every normal path.
fn spawn(program: &str, args: &[&str], stdin: bool) -> Result<Child, IptablesError> {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    die_with_parent(&mut command);
    command.spawn().map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            IptablesError::Missing {
                program: program.to_owned(),
                source,
            }
        } else {
            IptablesError::Io {
                program: program.to_owned(),
                source,
            }
        }
    })
}

/// Makes the child of `command` receive SIGKILL when the thread spawning it exits, and exit at
/// once if its parent is already gone by the time it asks (the race between `fork` and
/// `prctl`).
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    let parent = std::process::id();
    let hook = move || {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(std::io::Error::from)?;
        if std::os::unix::process::parent_id() != parent {
            // The parent died before `prctl`: nothing will ever kill this child.
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook runs in the child between `fork` and `exec`; it makes two system calls
    // (`prctl`, `getppid`), both async-signal-safe, and allocates nothing (its errors are
    // bare errnos).
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(hook);
    }
}

/// Feeds `stdin` to a started tool and waits for it, at most its limit (then kills it).
fn finish(started: Started, stdin: Option<&[u8]>) -> Result<Output, IptablesError> {
    let Started {
        mut child,
        program,
        args,
        limit,
    } = started;
    let io = |source| IptablesError::Io {
        program: program.clone(),
        source,
    };
    let mut unread = None;
    if let Some(mut pipe) = child.stdin.take() {
        // Scripts are small; the pipe buffer takes them whole. Dropping the pipe sends EOF.
        match pipe.write_all(stdin.unwrap_or_default()) {
            Ok(()) => {}
            // A tool that exits without reading its script (one that cannot start, say)
            // closes the pipe first: its status and stderr tell why, so they are reported.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => unread = Some(e),
            Err(e) => return Err(io(e)),
        }
    }
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(limit) {
        Ok(out) => out.map_err(io)?,
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(IptablesError::Timeout {
                program,
                waited: limit,
            });
        }
    };
    if out.status.success() {
        return match unread {
            Some(e) => Err(io(e)),
            None => Ok(out),
        };
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if out.status.code() == Some(RESOURCE_PROBLEM) && stderr.contains("xtables lock") {
        return Err(IptablesError::Locked { program, stderr });
    }
    Err(IptablesError::Failed {
        program: format!("{program} {}", args.join(" ")),
        status: out.status.to_string(),
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = r#"# Generated by iptables-save v1.8.9 (nf_tables) on Sat Nov 21 21:45:52 2026
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net\" id: \"c1\"" -m multiport --dports 80,443 -j CNI-DN-1
COMMIT
# Completed on Sat Nov 21 21:45:52 2026
"#;

    #[test]
    fn save_output_parses_into_chains_and_quoted_rules() {
        let dump = TableDump::parse(SAVED).unwrap();
        assert_eq!(dump.chains(), ["PREROUTING", "OUTPUT", "CNI-HOSTPORT-DNAT"]);
        assert!(dump.has_chain("OUTPUT"));
        assert!(!dump.has_chain("CNI-DN-1"));
        assert!(dump.rules("OUTPUT").is_empty());
        assert!(dump.has_rule(
            "CNI-HOSTPORT-DNAT",
            &[
                "-p",
                "tcp",
                "-m",
                "comment",
                "--comment",
                r#"dnat name: "net" id: "c1""#,
                "-m",
                "multiport",
                "--dports",
                "80,443",
                "-j",
                "CNI-DN-1"
            ]
        ));
        assert!(!dump.has_rule("CNI-HOSTPORT-DNAT", &["-j", "CNI-DN-1"]));
    }

    #[test]
    fn a_tool_that_exits_without_reading_its_script_is_reported_by_its_own_words() {
        // More than a pipe buffer, so the write is still blocked when the tool exits.
        let script = vec![b'#'; 1 << 20];
        let run = |code: &str| {
            let args = ["-c", code];
            let child = spawn("sh", &args, true).unwrap();
            finish(
                Started {
                    child,
                    program: "sh".to_owned(),
                    args: args.iter().map(|a| (*a).to_owned()).collect(),
                    limit: Duration::from_secs(10),
                },
                Some(&script),
            )
        };
        match run("echo 'cannot start' >&2; exit 2") {
            Err(IptablesError::Failed { stderr, .. }) => assert_eq!(stderr, "cannot start"),
            other => panic!("{other:?}"),
        }
        // Exiting 0 with the script unread is no success.
        assert!(matches!(run("exit 0"), Err(IptablesError::Io { .. })));
    }

    #[test]
    fn a_tool_is_killed_when_the_thread_that_started_it_exits() {
        use std::os::unix::process::ExitStatusExt as _;
        let mut child = std::thread::spawn(|| spawn("sleep", &["30"], false).unwrap())
            .join()
            .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }

    #[test]
    fn a_rule_of_an_undeclared_chain_is_an_error() {
        assert_eq!(
            TableDump::parse("*nat\n-A NOPE -j RETURN\nCOMMIT\n"),
            Err("-A NOPE -j RETURN".to_owned())
        );
    }

    #[test]
    fn split_handles_quotes_escapes_and_empty_quoted_args() {
        assert_eq!(
            split_args(r#"-m comment --comment "a \"b\" \\ c" -j X"#).unwrap(),
            ["-m", "comment", "--comment", r#"a "b" \ c"#, "-j", "X"]
        );
        assert_eq!(split_args(r#"--comment """#).unwrap(), ["--comment", ""]);
        assert_eq!(split_args(r#"--comment "open"#), None);
    }

    #[test]
    fn restore_lines_quote_what_needs_it_and_round_trip() {
        let args = ["-m", "comment", "--comment", r#"dnat name: "n" id: "c\1""#];
        let line = restore_line("-A", "CNI-X", &args).unwrap();
        assert_eq!(
            line,
            r#"-A CNI-X -m comment --comment "dnat name: \"n\" id: \"c\\1\"""#
        );
        assert_eq!(split_args(&line).unwrap()[2..], args);
        assert!(matches!(
            restore_line("-A", "X", &["a\nb"]),
            Err(IptablesError::BadArgument { .. })
        ));
    }

    pub(in crate::iptables) fn in_new_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        host::netns::in_new_netns(f).expect("a fresh network namespace needs root")
    }

    #[test]
    fn restore_commits_atomically_and_save_reads_it_back() {
        in_new_netns(|| {
            for family in Family::BOTH {
                let ipt = Iptables::new(family);
                let comment = r#"owner "net" c1"#;
                let lines = vec![
                    restore_line::<&str>("-N", "CNI-TEST", &[]).unwrap(),
                    restore_line(
                        "-A",
                        "CNI-TEST",
                        &["-m", "comment", "--comment", comment, "-j", "RETURN"],
                    )
                    .unwrap(),
                    restore_line("-I", "OUTPUT", &["-j", "CNI-TEST"]).unwrap(),
                ];
                ipt.restore("nat", &lines).unwrap();
                let dump = ipt.save("nat").unwrap();
                assert!(dump.has_chain("CNI-TEST"), "{family}: {dump:?}");
                assert!(dump.has_rule(
                    "CNI-TEST",
                    &["-m", "comment", "--comment", comment, "-j", "RETURN"]
                ));
                assert!(dump.has_rule("OUTPUT", &["-j", "CNI-TEST"]));

                // -N of an existing chain fails the whole transaction: the rule before it is
                // not applied either.
                let err = ipt
                    .restore(
                        "nat",
                        &[
                            restore_line("-A", "CNI-TEST", &["-j", "ACCEPT"]).unwrap(),
                            restore_line::<&str>("-N", "CNI-TEST", &[]).unwrap(),
                        ],
                    )
                    .unwrap_err();
                assert!(matches!(err, IptablesError::Failed { .. }), "{err}");
                assert_eq!(ipt.save("nat").unwrap().rules("CNI-TEST").len(), 1);
                ipt.probe().unwrap();
            }
        });
    }

    /// The chains as `iptables-save` printed them, for comparison with a snapshot.
    /// The match of the firewall's conntrack accept for address `a`, without its `-j`.
    fn established_to(a: &str) -> Vec<&str> {
        vec![
            "-d",
            a,
            "-m",
            "conntrack",
            "--ctstate",
            "RELATED,ESTABLISHED",
        ]
    }

    fn only(dump: &TableDump, chains: &[&str]) -> TableDump {
        let mut only = TableDump::default();
        for chain in chains.iter().filter(|c| dump.has_chain(c)) {
            only.chains.push((*chain).to_owned());
            only.rules
                .insert((*chain).to_owned(), dump.rules(chain).to_vec());
        }
        only
    }

    #[test]
    fn the_nf_tables_snapshot_reads_what_save_prints() {
        assert!(
            native::writes_nf_tables(Family::V4),
            "this test needs iptables-nft as iptables"
        );
        in_new_netns(|| {
            let names = ["FORWARD", "CNI-FORWARD", "CNI-ADMIN", "ISO", "NOPE"];
            let chains: Vec<(&str, native::Wanted)> =
                names.iter().map(|c| (*c, native::Wanted::All)).collect();
            for (family, a, b) in [
                (Family::V4, "10.1.0.5/32", "192.168.7.1/32"),
                (Family::V6, "fd01::5/128", "2001:db8::1:0:0:1/128"),
            ] {
                let ipt = Iptables::new(family);
                let rules: Vec<(&str, Vec<String>)> = vec![
                    (
                        "FORWARD",
                        vec![
                            "-m",
                            "comment",
                            "--comment",
                            "CNI firewall plugin rules",
                            "-j",
                            "CNI-FORWARD",
                        ],
                    ),
                    (
                        "FORWARD",
                        vec![
                            "-o",
                            "docker0",
                            "-m",
                            "conntrack",
                            "--ctstate",
                            "RELATED,ESTABLISHED",
                            "-j",
                            "ACCEPT",
                        ],
                    ),
                    (
                        "FORWARD",
                        vec!["-i", "docker0", "!", "-o", "docker0", "-j", "ACCEPT"],
                    ),
                    (
                        "FORWARD",
                        vec![
                            "-m",
                            "conntrack",
                            "--ctstate",
                            "NEW",
                            "-m",
                            "comment",
                            "--comment",
                            "kubernetes service portals",
                            "-j",
                            "ISO",
                        ],
                    ),
                    ("FORWARD", vec!["-i", "cali+", "-g", "ISO"]),
                    (
                        "CNI-FORWARD",
                        vec![
                            "-m",
                            "comment",
                            "--comment",
                            "CNI firewall plugin admin overrides",
                            "-j",
                            "CNI-ADMIN",
                        ],
                    ),
                    (
                        "CNI-FORWARD",
                        established_to(a)
                            .into_iter()
                            .chain(["-j", "ACCEPT"])
                            .collect(),
                    ),
                    ("CNI-FORWARD", vec!["-s", a, "-j", "ACCEPT"]),
                    (
                        "CNI-FORWARD",
                        vec!["!", "-s", b, "-d", a, "-i", "br0", "-j", "DROP"],
                    ),
                    (
                        "CNI-FORWARD",
                        vec![
                            "-m",
                            "conntrack",
                            "!",
                            "--ctstate",
                            "INVALID,UNTRACKED,DNAT",
                        ],
                    ),
                    ("CNI-FORWARD", vec!["-s", a, "-p", "tcp", "-j", "ACCEPT"]),
                    ("CNI-FORWARD", vec!["!", "-p", "udp", "-j", "DROP"]),
                    (
                        "ISO",
                        vec![
                            "-m",
                            "comment",
                            "--comment",
                            r#"quote " and \ back"#,
                            "-j",
                            "RETURN",
                        ],
                    ),
                ]
                .into_iter()
                .map(|(c, r)| (c, r.into_iter().map(str::to_owned).collect()))
                .collect();
                let mut lines = vec![
                    restore_line::<&str>("-N", "CNI-FORWARD", &[]).unwrap(),
                    restore_line::<&str>("-N", "CNI-ADMIN", &[]).unwrap(),
                    restore_line::<&str>("-N", "ISO", &[]).unwrap(),
                ];
                for (chain, rule) in &rules {
                    lines.push(restore_line("-A", chain, rule).unwrap());
                }
                ipt.restore("filter", &lines).unwrap();
                let native = native::snapshot(family, "filter", &chains)
                    .unwrap()
                    .expect("every rule decodes");
                // Only the rules holding an address, and a chain's existence alone.
                let addr: std::net::IpAddr = a.split('/').next().unwrap().parse().unwrap();
                let needles = [crate::nft::addr_bytes(addr)];
                let some = native::snapshot(
                    family,
                    "filter",
                    &[
                        ("CNI-FORWARD", native::Wanted::Containing(&needles)),
                        ("CNI-ADMIN", native::Wanted::Containing(&[])),
                    ],
                )
                .unwrap()
                .unwrap();
                let holding: Vec<&Vec<String>> = native
                    .rules("CNI-FORWARD")
                    .iter()
                    .filter(|r| r.iter().any(|arg| arg == a))
                    .collect();
                assert_eq!(
                    some.rules("CNI-FORWARD").iter().collect::<Vec<_>>(),
                    holding
                );
                assert_eq!(holding.len(), 4, "{family}");
                assert!(some.has_chain("CNI-ADMIN") && !some.has_chain("FORWARD"));
                assert_eq!(
                    native,
                    only(&ipt.save("filter").unwrap(), &names),
                    "{family}"
                );
                assert_eq!(native.rules("CNI-FORWARD").len(), 7, "{family}");
                assert!(!native.has_chain("NOPE"));
                assert_eq!(ipt.snapshot("filter", &chains).unwrap(), native);

                // A form it does not decode gives up on the whole read.
                ipt.restore(
                    "filter",
                    &[restore_line(
                        "-A",
                        "ISO",
                        &["-p", "tcp", "-m", "tcp", "--sport", "80", "-j", "DROP"],
                    )
                    .unwrap()],
                )
                .unwrap();
                assert_eq!(native::snapshot(family, "filter", &chains).unwrap(), None);
                let saved = ipt.snapshot("filter", &chains).unwrap();
                assert_eq!(saved.rules("ISO").len(), 2, "{family}: falls back to save");
            }
        });
    }

    #[test]
    fn natively_appended_rules_equal_the_restore_s_in_the_kernel() {
        in_new_netns(|| {
            for (family, a) in [(Family::V4, "10.9.0.5/32"), (Family::V6, "fd09::5/128")] {
                let ipt = Iptables::new(family);
                assert!(
                    native::writes_nf_tables(family),
                    "{family}: needs iptables-nft"
                );
                let forms: Vec<Vec<String>> = [
                    established_to(a),
                    vec!["-s", a],
                    vec!["-s", a, "-d", a, "-m", "conntrack", "--ctstate", "INVALID"],
                    vec![],
                ]
                .into_iter()
                .zip(["ACCEPT", "ACCEPT", "DROP", "CNI-ADMIN"])
                .map(|(m, j)| m.into_iter().chain(["-j", j]).map(str::to_owned).collect())
                .collect();
                let mut lines = vec![
                    restore_line::<&str>("-N", "CNI-FORWARD", &[]).unwrap(),
                    restore_line::<&str>("-N", "CNI-ADMIN", &[]).unwrap(),
                ];
                for rule in &forms {
                    lines.push(restore_line("-A", "CNI-FORWARD", rule).unwrap());
                }
                ipt.restore("filter", &lines).unwrap();

                let table = native::nft_table(family, "filter");
                let mut batch = crate::nft::Batch::new();
                for rule in &forms {
                    let encoded = native::encode_rule(family, rule).expect("a known form");
                    batch.add_rule(&table, "CNI-FORWARD", &encoded);
                }
                let mut nft = crate::nft::Nft::new().unwrap();
                nft.apply(&batch).unwrap();

                // Expression for expression, the second half is the first.
                let listed = nft.rules(&table, "CNI-FORWARD").unwrap();
                let (theirs, ours) = listed.split_at(forms.len());
                for (t, o) in theirs.iter().zip(ours) {
                    assert_eq!((&t.exprs, &t.comment), (&o.exprs, &o.comment), "{family}");
                }
                // And the tools list them alike.
                let saved = ipt.save("filter").unwrap();
                let rules = saved.rules("CNI-FORWARD");
                assert_eq!(rules.len(), 2 * forms.len(), "{family}");
                assert_eq!(rules[..forms.len()], rules[forms.len()..], "{family}");
                assert_eq!(rules[..forms.len()], forms[..], "{family}");
            }
        });
    }
}
