//! A kernel without nf_tables, as a plugin sees it, in two forms:
//!
//! - [`without_nf_tables`] (and [`deny_nf_tables`] for one child): no nfnetlink at all. A seccomp
//!   filter fails `socket(AF_NETLINK, _, NETLINK_NETFILTER)` with EPROTONOSUPPORT, the errno of
//!   a kernel built without nfnetlink. Every other system call, other netlink sockets included,
//!   goes through.
//! - [`without_nf_tables_subsystem`]: nfnetlink without nf_tables, as on a kernel whose
//!   `nf_tables.ko` is removed or not built (Debian's kernels have it as a module). The
//!   sockets open, and the kernel itself answers every nf_tables message as it does there:
//!   EINVAL to a request, EOPNOTSUPP to a batch (see that function).
//!
//! A filter stays on the thread that installs it and on every thread and process that thread
//! starts, across `exec`, and cannot be removed: both install it on a thread of its own, so that
//! a test runs a plugin (through [`crate::Runtime`], whose namespace threads and children
//! inherit it) or our own code without nf_tables, and the rest of the test process keeps it.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// `A = seccomp_data[k]` (a 32-bit word).
fn load(k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: u16::try_from(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS).unwrap_or_default(),
        jt: 0,
        jf: 0,
        k,
    }
}

/// `A == k`: skip `jt` instructions if so, else `jf`.
fn jump_if_equal(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: u16::try_from(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K).unwrap_or_default(),
        jt,
        jf,
        k,
    }
}

/// The filter's verdict `k`.
fn ret(k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: u16::try_from(libc::BPF_RET | libc::BPF_K).unwrap_or_default(),
        jt: 0,
        jf: 0,
        k,
    }
}

/// A system call number as the filter compares it.
fn nr(call: libc::c_long) -> u32 {
    u32::try_from(call).unwrap_or_default()
}

/// The BPF program: `socket(AF_NETLINK, *, NETLINK_NETFILTER)` fails with EPROTONOSUPPORT.
fn program() -> Vec<libc::sock_filter> {
    let errno = u32::try_from(libc::EPROTONOSUPPORT).unwrap_or_default();
    // Equal: go on with the next instruction; else skip to "allow".
    vec![
        load(ARCH),
        jump_if_equal(AUDIT_ARCH, 0, 7),
        load(NR),
        jump_if_equal(nr(libc::SYS_socket), 0, 5),
        load(ARG0),
        jump_if_equal(u32::try_from(libc::AF_NETLINK).unwrap_or_default(), 0, 3),
        load(ARG2),
        jump_if_equal(NETLINK_NETFILTER, 0, 1),
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

/// nfnetlink's subsystem of nf_tables (`NFNL_SUBSYS_NFTABLES`).
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// The subsystem an nf_tables request goes to instead: one beyond `NFNL_SUBSYS_COUNT` (13 in
/// 6.12), for which `nfnetlink_get_subsys` finds nothing, as it finds no nf_tables where the
/// module is missing. (Subsystem 0 would not do for requests: its message types below 16 are
/// netlink's own control messages, which the kernel acknowledges without looking.)
const REQUEST_SUBSYS_INSTEAD: u16 = 0xff;
/// The subsystem an nf_tables batch is for instead: `NFNL_SUBSYS_NONE`, which nothing
/// registers (`nfnetlink_rcv_batch` refuses a number beyond the count with EINVAL, before it
/// looks for the subsystem; it answers EOPNOTSUPP only for one in range that is missing).
const BATCH_SUBSYS_INSTEAD: u16 = 0;
/// `NFNL_MSG_BATCH_BEGIN`.
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
/// `sizeof(struct nlmsghdr)`.
const NLMSG_HDRLEN: usize = 16;
/// The most iovecs one `sendmsg` may have (`UIO_MAXIOV`).
const UIO_MAXIOV: usize = 1024;

/// The BPF program of [`without_nf_tables_subsystem`]: `sendto` and `sendmsg` go to its
/// supervisor (`SECCOMP_RET_USER_NOTIF`), every other call through.
fn notify_program() -> Vec<libc::sock_filter> {
    vec![
        load(ARCH),
        jump_if_equal(AUDIT_ARCH, 0, 3),
        load(NR),
        jump_if_equal(nr(libc::SYS_sendto), 2, 0),
        jump_if_equal(nr(libc::SYS_sendmsg), 1, 0),
        ret(libc::SECCOMP_RET_ALLOW),
        ret(libc::SECCOMP_RET_USER_NOTIF),
    ]
}

/// Installs `program` on the calling thread and returns the descriptor its notifications
/// arrive on.
fn install_listener(program: &[libc::sock_filter]) -> io::Result<OwnedFd> {
    let prog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: as in `install`.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel copies the
    // filter and returns a new descriptor, which nothing else owns.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &raw const prog,
        )
    };
    let fd = i32::try_from(fd).map_err(|_| io::Error::last_os_error())?;
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Rewrites the nf_tables messages of one datagram as [`without_nf_tables_subsystem`] sends
/// them: a request's subsystem becomes [`REQUEST_SUBSYS_INSTEAD`], a batch's (the `res_id` of
/// its begin message, in network order or in the host order old `nft` used)
/// [`BATCH_SUBSYS_INSTEAD`]. Other messages (conntrack's subsystem 1, netlink's control
/// messages) stay. Returns whether anything changed.
fn hide_nf_tables(datagram: &mut [u8]) -> bool {
    let mut changed = false;
    let mut at = 0;
    while let Some(header) = datagram.get(at..at + NLMSG_HDRLEN) {
        let len = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]);
        let Ok(len) = usize::try_from(len) else { break };
        if len < NLMSG_HDRLEN {
            break;
        }
        let kind = u16::from_ne_bytes([header[4], header[5]]);
        if kind == NFNL_MSG_BATCH_BEGIN {
            // struct nfgenmsg { u8 family; u8 version; be16 res_id; } follows the header.
            if let Some(res_id) = datagram.get_mut(at + NLMSG_HDRLEN + 2..at + NLMSG_HDRLEN + 4) {
                let id = [res_id[0], res_id[1]];
                if u16::from_be_bytes(id) == NFNL_SUBSYS_NFTABLES
                    || u16::from_ne_bytes(id) == NFNL_SUBSYS_NFTABLES
                {
                    res_id.copy_from_slice(&BATCH_SUBSYS_INSTEAD.to_be_bytes());
                    changed = true;
                }
            }
        } else if kind >> 8 == NFNL_SUBSYS_NFTABLES {
            let hidden = (REQUEST_SUBSYS_INSTEAD << 8) | (kind & 0xff);
            datagram[at + 4..at + 6].copy_from_slice(&hidden.to_ne_bytes());
            changed = true;
        }
        at += (len + 3) & !3;
    }
    changed
}

/// The thread group (process) of thread `tid`, from `/proc/TID/status`.
fn tgid_of(tid: u32) -> io::Result<i32> {
    std::fs::read_to_string(format!("/proc/{tid}/status"))?
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other(format!("no Tgid in /proc/{tid}/status")))
}

/// Whether descriptor `fd` of thread `tid`'s process is a `NETLINK_NETFILTER` socket: a copy of
/// it taken with `pidfd_getfd` is asked.
fn is_netfilter_socket(tid: u32, fd: i32) -> io::Result<bool> {
    let tgid = tgid_of(tid)?;
    // SAFETY: integer arguments; the result is a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, tgid, 0) };
    let pidfd = i32::try_from(pidfd).unwrap_or(-1);
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just returned by the kernel, owned by nothing else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    // SAFETY: integer arguments; the result is a new descriptor or -1.
    let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let copy = i32::try_from(copy).unwrap_or(-1);
    if copy < 0 {
        let e = io::Error::last_os_error();
        // Not an open descriptor: the call fails on its own.
        return if e.raw_os_error() == Some(libc::EBADF) {
            Ok(false)
        } else {
            Err(e)
        };
    }
    // SAFETY: just returned by the kernel, owned by nothing else.
    let copy = unsafe { OwnedFd::from_raw_fd(copy) };
    let option = |name| -> Option<libc::c_int> {
        let mut value: libc::c_int = 0;
        let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).ok()?;
        // SAFETY: `value` and `len` are valid for writes of an int and its size.
        let got = unsafe {
            libc::getsockopt(
                copy.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                (&raw mut value).cast(),
                &raw mut len,
            )
        };
        (got == 0).then_some(value)
    };
    Ok(option(libc::SO_DOMAIN) == Some(libc::AF_NETLINK)
        && option(libc::SO_PROTOCOL) == libc::c_int::try_from(NETLINK_NETFILTER).ok())
}

/// `len` bytes at `addr` in thread `tid`'s memory.
fn read_memory(tid: u32, addr: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: usize::try_from(addr).unwrap_or_default() as *mut libc::c_void,
        iov_len: len,
    };
    let pid = libc::pid_t::try_from(tid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: `local` covers `buf`, valid for `len` bytes; the remote side is the kernel's to
    // check.
    let n = unsafe { libc::process_vm_readv(pid, &raw const local, 1, &raw const remote, 1, 0) };
    if usize::try_from(n).ok() != Some(len) {
        return Err(io::Error::last_os_error());
    }
    Ok(buf)
}

/// Writes `bytes` at `addr` in thread `tid`'s memory.
fn write_memory(tid: u32, addr: u64, bytes: &[u8]) -> io::Result<()> {
    let local = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let remote = libc::iovec {
        iov_base: usize::try_from(addr).unwrap_or_default() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let pid = libc::pid_t::try_from(tid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: `local` covers `bytes`, only read; the remote side is the kernel's to check.
    let n = unsafe { libc::process_vm_writev(pid, &raw const local, 1, &raw const remote, 1, 0) };
    if usize::try_from(n).ok() != Some(bytes.len()) {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The buffers (address, length) a `sendmsg` of thread `tid` sends: its `msghdr`'s iovecs, read
/// as the kernel reads them on a 64-bit architecture (`struct user_msghdr`: the iovec array's
/// address at byte 16, its length at 24, both 64 bits; an iovec is two 64-bit words), whatever
/// the C library's own `msghdr` looks like.
fn message_buffers(tid: u32, msghdr: u64) -> io::Result<Vec<(u64, usize)>> {
    let word = |bytes: &[u8], at: usize| -> io::Result<u64> {
        bytes
            .get(at..at + 8)
            .and_then(|w| w.try_into().ok())
            .map(u64::from_ne_bytes)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
    };
    let header = read_memory(tid, msghdr, 32)?;
    let (iov, count) = (word(&header, 16)?, word(&header, 24)?);
    let count = usize::try_from(count)
        .ok()
        .filter(|c| *c <= UIO_MAXIOV)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EMSGSIZE))?;
    let vectors = read_memory(tid, iov, count * 16)?;
    (0..count)
        .map(|i| {
            let len = usize::try_from(word(&vectors, i * 16 + 8)?)
                .map_err(|_| io::Error::from_raw_os_error(libc::EMSGSIZE))?;
            Ok((word(&vectors, i * 16)?, len))
        })
        .collect()
}

/// Hides nf_tables from the call of `notif` ([`hide_nf_tables`]) when it sends on a
/// `NETLINK_NETFILTER` socket: in the caller's memory, before the kernel reads it, while the
/// caller waits in the call.
fn hide_in_call(notif: &libc::seccomp_notif, listener: &OwnedFd) -> io::Result<()> {
    let tid = notif.pid;
    let args = notif.data.args;
    let Ok(fd) = i32::try_from(args[0]) else {
        return Ok(());
    };
    if !is_netfilter_socket(tid, fd)? {
        return Ok(());
    }
    let call = libc::c_long::from(notif.data.nr);
    let buffers = if call == libc::SYS_sendto {
        let len =
            usize::try_from(args[2]).map_err(|_| io::Error::from_raw_os_error(libc::EMSGSIZE))?;
        vec![(args[1], len)]
    } else if call == libc::SYS_sendmsg {
        message_buffers(tid, args[1])?
    } else {
        return Ok(());
    };
    let mut datagram = Vec::new();
    for (addr, len) in &buffers {
        datagram.extend(read_memory(tid, *addr, *len)?);
    }
    if !hide_nf_tables(&mut datagram) {
        return Ok(());
    }
    // Still the same call of the same task (else the memory read may be another's).
    let mut id = notif.id;
    // SAFETY: the ioctl reads the u64 `id`.
    if unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &raw mut id,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    let mut at = 0;
    for (addr, len) in &buffers {
        write_memory(tid, *addr, &datagram[at..at + len])?;
        at += len;
    }
    Ok(())
}

/// Answers the notifications of `listener` until no task has the filter any more (or `stop`
/// is set and none comes): each call goes on, with nf_tables hidden from it; one whose
/// message could not be rewritten fails with its errno instead of reaching nf_tables.
fn supervise(listener: &OwnedFd, stop: &AtomicBool) {
    loop {
        let mut poll = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&raw mut poll, 1, 50) };
        if ready < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if ready == 0 {
            if stop.load(Ordering::Acquire) {
                return;
            }
            continue;
        }
        if poll.revents & libc::POLLIN == 0 {
            // POLLHUP: the filter has no task left, and none can get it again.
            return;
        }
        // SAFETY: all-zero is a valid seccomp_notif, as the kernel requires it to be.
        let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: the ioctl fills `notif`.
        if unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_RECV,
                &raw mut notif,
            )
        } != 0
        {
            // The caller was killed meanwhile, or a signal came.
            continue;
        }
        let mut response = libc::seccomp_notif_resp {
            id: notif.id,
            val: 0,
            error: 0,
            flags: u32::try_from(libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE).unwrap_or_default(),
        };
        if let Err(e) = hide_in_call(&notif, listener) {
            log::error!(
                "seccomp stand-in: a send of task {} goes unanswered: {e}",
                notif.pid
            );
            response.error = -e.raw_os_error().unwrap_or(libc::EIO);
            response.flags = 0;
        }
        // SAFETY: the ioctl reads `response`; it fails (ENOENT) when the caller is gone.
        unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_SEND,
                &raw mut response,
            )
        };
    }
}

/// Runs `f` as [`without_nf_tables`] does, on a kernel that has nfnetlink but no nf_tables
/// subsystem, as one whose `nf_tables.ko` was removed: the netfilter sockets open, and the
/// kernel itself answers each nf_tables message there as it does on such a kernel. After it
/// fails to load the subsystem's module (`request_module("nfnetlink-subsys-N")`), it answers
/// a request EINVAL (`nfnetlink_rcv_msg`) and a batch EOPNOTSUPP at its begin message
/// (`nfnetlink_rcv_batch`): the same code paths, 5.10 to 6.12.
///
/// How: a seccomp filter hands every `sendto` and `sendmsg` of the thread (and of every thread
/// and process it starts) to a supervisor thread of the test (`SECCOMP_RET_USER_NOTIF`). On a
/// `NETLINK_NETFILTER` socket it rewrites, in the sender's memory before the kernel reads it,
/// the subsystem of each nf_tables message to one the kernel has not got
/// ([`hide_nf_tables`]), and lets the call go on. Only that number differs from a kernel
/// lacking nf_tables. Conntrack's messages (subsystem 1) and every other socket are left alone.
/// Our code, `nft` and `iptables-nft` all see the same kernel. Needs Linux 5.6
/// (`pidfd_getfd`).
///
/// # Errors
/// When a thread cannot be started or the filter installed. A panic in `f` is propagated.
pub fn without_nf_tables_subsystem<T, F>(f: F) -> io::Result<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let program = notify_program();
    let stop = AtomicBool::new(false);
    let stop = &stop;
    let (give, take) = std::sync::mpsc::channel::<OwnedFd>();
    std::thread::scope(|scope| {
        let supervisor = std::thread::Builder::new()
            .name("nf-tables-gone".into())
            .spawn_scoped(scope, move || {
                if let Ok(listener) = take.recv() {
                    supervise(&listener, stop);
                }
            })?;
        let worker = std::thread::Builder::new()
            .name("no-nf-tables".into())
            .spawn_scoped(scope, move || -> io::Result<T> {
                let listener = install_listener(&program)?;
                give.send(listener)
                    .map_err(|_| io::Error::other("the seccomp supervisor is gone"))?;
                Ok(f())
            });
        let joined = worker.map(std::thread::ScopedJoinHandle::join);
        stop.store(true, Ordering::Release);
        if supervisor.join().is_err() {
            return Err(io::Error::other("the seccomp supervisor panicked"));
        }
        match joined {
            Ok(Ok(result)) => result,
            Ok(Err(payload)) => std::panic::resume_unwind(payload),
            Err(e) => Err(e),
        }
    })
}

/// The two ways a kernel lacks nf_tables, as the stand-ins show them to a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lacking {
    /// No nfnetlink: the socket is refused ([`without_nf_tables`]).
    Nfnetlink,
    /// nfnetlink without nf_tables: each request and batch is refused
    /// ([`without_nf_tables_subsystem`]).
    NfTables,
}

impl Lacking {
    /// Both.
    pub const BOTH: [Lacking; 2] = [Lacking::Nfnetlink, Lacking::NfTables];

    /// Runs `f` on a thread of its own that sees such a kernel (as do the threads and
    /// processes it starts).
    ///
    /// # Errors
    /// As the stand-in's function. A panic in `f` is propagated.
    pub fn run<T, F>(self, f: F) -> io::Result<T>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        match self {
            Lacking::Nfnetlink => without_nf_tables(f),
            Lacking::NfTables => without_nf_tables_subsystem(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_netfilter_netlink_sockets_are_refused_and_only_on_the_filtered_thread() {
        let (nft, route) = without_nf_tables(|| {
            (
                netfilter::nft::Nft::new().map(drop),
                netlink::Netlink::new().map(drop),
            )
        })
        .unwrap();
        let err = nft.unwrap_err();
        assert_eq!(err.errno(), Some(libc::EPROTONOSUPPORT), "{err}");
        assert!(err.is_unsupported(), "{err}");
        route.unwrap();
        // The calling thread is not filtered.
        netfilter::nft::Nft::new().unwrap();
    }

    #[test]
    fn a_child_of_a_filtered_command_cannot_reach_nf_tables() {
        let out = host::netns::in_new_netns(|| {
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

    /// A netlink message of `kind` with an nfgenmsg whose `res_id` is `res_id` (big endian).
    fn message(kind: u16, res_id: u16) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&20u32.to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&[2, 0]);
        m.extend_from_slice(&res_id.to_be_bytes());
        m
    }

    #[test]
    fn only_nf_tables_messages_are_sent_to_subsystems_the_kernel_lacks() {
        let kind_at = |d: &[u8], i: usize| u16::from_ne_bytes([d[20 * i + 4], d[20 * i + 5]]);
        let res_id_at = |d: &[u8], i: usize| u16::from_be_bytes([d[20 * i + 18], d[20 * i + 19]]);
        // A batch: begin (for subsystem 10), NEWTABLE (10 << 8 | 0), NEWRULE (10 << 8 | 6), end.
        let mut batch = [
            message(0x10, 10),
            message(0x0a00, 0),
            message(0x0a06, 0),
            message(0x11, 10),
        ]
        .concat();
        assert!(hide_nf_tables(&mut batch));
        assert_eq!(res_id_at(&batch, 0), 0);
        assert_eq!(kind_at(&batch, 0), 0x10);
        assert_eq!(kind_at(&batch, 1), 0xff00);
        assert_eq!(kind_at(&batch, 2), 0xff06);
        // The end is left as it is: the kernel stops at the begin.
        assert_eq!((kind_at(&batch, 3), res_id_at(&batch, 3)), (0x11, 10));
        // A begin in old nft's host order.
        let mut old = message(0x10, 10u16.swap_bytes());
        assert!(hide_nf_tables(&mut old));
        assert_eq!(res_id_at(&old, 0), 0);
        // GETGEN (10 << 8 | 16).
        let mut request = message(0x0a10, 0);
        assert!(hide_nf_tables(&mut request));
        assert_eq!(kind_at(&request, 0), 0xff10);
        // Conntrack (subsystem 1), a batch of another subsystem, netlink's own messages.
        let mut others = [message(0x0101, 0), message(0x10, 1), message(0x3, 0)].concat();
        let before = others.clone();
        assert!(!hide_nf_tables(&mut others));
        assert_eq!(others, before);
        // A header claiming less than itself ends the walk.
        let mut short = message(0x0a00, 0);
        short[..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(!hide_nf_tables(&mut short));
    }

    /// The kernel's own answers, through the stand-in: a request EINVAL, a batch EOPNOTSUPP
    /// (`Absent` both, the generation refused too), for our code and `nft` alike; route and
    /// conntrack netlink (the same socket protocol) answer as ever, and so does nf_tables
    /// outside the filtered thread.
    #[test]
    fn without_the_subsystem_the_kernel_refuses_nf_tables_itself_and_nothing_else() {
        use netfilter::nft::{Batch, Family, Feature, Nft, Table};
        let t = Table::new(Family::Inet, "standin");
        host::netns::in_new_netns(|| {
            let (lookup, batch, available, probe, route, conntrack, nft_cli) =
                without_nf_tables_subsystem(|| {
                    let mut nft = Nft::new().unwrap();
                    let lookup = nft.table_exists(&t).map(drop);
                    let mut b = Batch::new();
                    b.add_table(&t);
                    let batch = nft.apply(&b);
                    let available = nft.is_available().unwrap();
                    let probe = nft.missing_features(Family::Ip, &[Feature::Fib]).map(drop);
                    let route = netlink::Netlink::new()
                        .and_then(|mut nl| nl.link_by_name("lo"))
                        .map(drop);
                    let conntrack = netfilter::conntrack::Conntrack::new()
                        .and_then(|mut ct| ct.flows(netfilter::nft::NfProto::Ipv4))
                        .map(drop);
                    let nft_cli = Command::new("nft")
                        .args(["add", "table", "inet", "standin"])
                        .output()
                        .unwrap();
                    (lookup, batch, available, probe, route, conntrack, nft_cli)
                })
                .unwrap();
            let err = lookup.unwrap_err();
            assert_eq!(err.errno(), Some(libc::EINVAL), "{err}");
            assert!(err.is_absent(), "{err:?}");
            let err = batch.unwrap_err();
            assert_eq!(err.errno(), Some(libc::EOPNOTSUPP), "{err}");
            assert!(err.is_absent(), "{err:?}");
            assert!(!available);
            let err = probe.unwrap_err();
            assert!(err.is_absent(), "{err:?}");
            route.unwrap();
            conntrack.unwrap();
            assert!(!nft_cli.status.success());
            let stderr = String::from_utf8_lossy(&nft_cli.stderr);
            assert!(stderr.contains("Operation not supported"), "{stderr}");
            // This thread was not filtered: nf_tables is there, and nothing was made.
            let mut nft = Nft::new().unwrap();
            assert!(nft.is_available().unwrap());
            assert!(!nft.table_exists(&t).unwrap());
        })
        .unwrap();
    }
}
