//! A kernel without nf_tables, as a plugin sees it: a seccomp filter that fails
//! `socket(AF_NETLINK, _, NETLINK_NETFILTER)` with EPROTONOSUPPORT, the errno of a kernel built
//! without nfnetlink. Every other system call, other netlink sockets included, goes through.
//!
//! A filter stays on the thread that installs it and on every thread and process that thread
//! starts, across `exec`, and cannot be removed: [`without_nf_tables`] installs it on a thread of
//! its own, so that a test runs a plugin (through [`crate::Runtime`], whose namespace threads and
//! children inherit it) or our own code without nf_tables, and the rest of the test process
//! keeps it; [`deny_nf_tables`] gives it to one child only.

#![allow(unsafe_code)]

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::Command;

/// `AUDIT_ARCH_*` of the architecture the filter is for: other ABIs are let through.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Offsets in `struct seccomp_data`: the syscall number, the architecture, and the low 32 bits
/// of the first and third arguments (little endian).
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0: u32 = 16;
const ARG2: u32 = 32;
/// `NETLINK_NETFILTER`.
const NETLINK_NETFILTER: u32 = 12;

/// The BPF program: `socket(AF_NETLINK, *, NETLINK_NETFILTER)` fails with EPROTONOSUPPORT.
fn program() -> Vec<libc::sock_filter> {
    let load = |k| libc::sock_filter {
        code: u16::try_from(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS).unwrap_or_default(),
        jt: 0,
        jf: 0,
        k,
    };
    // Equal: go on with the next instruction; else skip `jf` instructions (to "allow").
    let equal_or_skip = |k, jf| libc::sock_filter {
        code: u16::try_from(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K).unwrap_or_default(),
        jt: 0,
        jf,
        k,
    };
    let ret = |k| libc::sock_filter {
        code: u16::try_from(libc::BPF_RET | libc::BPF_K).unwrap_or_default(),
        jt: 0,
        jf: 0,
        k,
    };
    let errno = u32::try_from(libc::EPROTONOSUPPORT).unwrap_or_default();
    vec![
        load(ARCH),
        equal_or_skip(AUDIT_ARCH, 7),
        load(NR),
        equal_or_skip(u32::try_from(libc::SYS_socket).unwrap_or_default(), 5),
        load(ARG0),
        equal_or_skip(u32::try_from(libc::AF_NETLINK).unwrap_or_default(), 3),
        load(ARG2),
        equal_or_skip(NETLINK_NETFILTER, 1),
        ret(libc::SECCOMP_RET_ERRNO | (errno & libc::SECCOMP_RET_DATA)),
        ret(libc::SECCOMP_RET_ALLOW),
    ]
}

/// Installs `program` on the calling thread. Only system calls: safe between `fork` and `exec`.
fn install(program: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only. It lets a process without
    // CAP_SYS_ADMIN install a filter, and changes nothing for a root test.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel copies the
    // filter and keeps no pointer to it.
    let installed = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &raw const prog,
            0,
            0,
        )
    };
    if installed != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a thread of its own that cannot open a netfilter netlink socket, nor can any
/// thread or process it starts: our code and the plugins it runs see a kernel without
/// nf_tables (and without conntrack netlink). The calling thread is not affected.
///
/// # Errors
/// When the thread cannot be started or the filter installed. A panic in `f` is propagated.
pub fn without_nf_tables<T, F>(f: F) -> io::Result<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let program = program();
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("no-nf-tables".into())
            .spawn_scoped(scope, || install(&program).map(|()| f()))?;
        match handle.join() {
            Ok(result) => result,
            Err(payload) => std::panic::resume_unwind(payload),
        }
    })
}

/// Makes the child of `cmd` unable to open a netfilter netlink socket (see
/// [`without_nf_tables`]); the filter is installed between `fork` and `exec`.
pub fn deny_nf_tables(cmd: &mut Command) -> &mut Command {
    let program = program();
    // SAFETY: the closure only makes the two `prctl` calls of `install` on a program built
    // before the fork: no allocation, no lock, as a child of a threaded process requires.
    unsafe { cmd.pre_exec(move || install(&program)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_netfilter_netlink_sockets_are_refused_and_only_on_the_filtered_thread() {
        let (nft, route) = without_nf_tables(|| {
            (
                common::nft::Nft::new().map(drop),
                common::netlink::Netlink::new().map(drop),
            )
        })
        .unwrap();
        let err = nft.unwrap_err();
        assert_eq!(err.errno(), Some(libc::EPROTONOSUPPORT), "{err}");
        assert!(err.is_unsupported(), "{err}");
        route.unwrap();
        // The calling thread is not filtered.
        common::nft::Nft::new().unwrap();
    }

    #[test]
    fn a_child_of_a_filtered_command_cannot_reach_nf_tables() {
        let out = common::netns::in_new_netns(|| {
            let mut cmd = Command::new("nft");
            cmd.args(["list", "tables"]);
            deny_nf_tables(&mut cmd).output()
        })
        .unwrap()
        .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("Protocol not supported"), "{stderr}");
    }
}
