//! `subreaper COMMAND [ARG…]`: runs COMMAND as the child of a child subreaper (this process,
//! `PR_SET_CHILD_SUBREAPER`), with this process's stdin, stdout and stderr, and reports on
//! stderr every process COMMAND left behind (`subreaper: left <pid> <state> <comm>`), running
//! or exited but unreaped: its orphans are reparented here before its own exit is reported, and
//! this process reaps nothing but COMMAND, so none of them can slip by. It then kills and
//! reaps them, and exits with COMMAND's status (125 when COMMAND could not be run).
//!
//! A runtime that is a subreaper collects whatever a plugin leaves: the tests use this to show
//! that a plugin leaves nothing.

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next().filter(|a| a != "--help") else {
        eprintln!("usage: subreaper COMMAND [ARG...]");
        return ExitCode::from(125);
    };
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("subreaper: cannot become a child subreaper: {e}");
        return ExitCode::from(125);
    }
    let status = match Command::new(&program).args(args).status() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("subreaper: cannot run {}: {e}", program.to_string_lossy());
            return ExitCode::from(125);
        }
    };
    for (pid, state, comm) in children() {
        eprintln!("subreaper: left {pid} {state} {comm}");
        let pid = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
    }
    match status.code() {
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::from(1),
    }
}

/// This process's children: (pid, state, comm), from `/proc/<pid>/stat`.
fn children() -> Vec<(i32, String, String)> {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
            let (head, tail) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1.to_owned();
            let mut fields = tail.split_whitespace();
            let state = fields.next()?.to_owned();
            (fields.next()? == me).then_some((pid, state, comm))
        })
        .collect()
}
