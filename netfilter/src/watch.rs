//! The loop of a plugin's `reconcile --watch`: a long-running operator command that puts back
//! what other programs delete of the plugin's kernel objects, soon after they do.
//!
//! The plugin gives [`Watch`] what counts as its objects (a test of an nf_tables
//! [`Event`]) and its reconcile; the loop:
//!
//! 1. is handed a [`Monitor`] already subscribed to the namespace's nf_tables events (and the
//!    plugin's other sources, [`Nudger`]s, already subscribed), so that nothing deleted from
//!    then on is missed;
//! 2. runs a full reconcile, which repairs whatever went missing before;
//! 3. waits for a transaction of another program that deletes an object of the plugin, for
//!    [`Report::Lost`] (the kernel dropped events: anything may have changed), or for a nudge
//!    of another source (firewalld's reload), and reconciles once the burst has settled
//!    ([`Debounce`]: [`QUIET`] without a new one, at most [`MAX_DELAY`] after the first);
//! 4. stops, with success, on SIGTERM or SIGINT ([`Stop`]).
//!
//! ## Whose transactions are ignored
//!
//! - Its own: the kernel names the netlink socket that committed each transaction (its port
//!   id, [`Transaction::port_id`]), and every socket this process commits on is noted
//!   ([`committers`]); a thread id would not do, since the kernel gives it in the host's pid
//!   namespace, which a watcher in a container does not see.
//! - The plugin's own calls (ADD, DEL, GC, a one-shot reconcile): transactions committed by a
//!   thread of the watcher's own program name ([`Transaction::process`], the kernel's `comm`),
//!   which is the plugin binary's (`portmap`, `firewall`) since the watcher is that binary.
//!   A DEL deletes the attachment's objects; reconciling after each would be useless work.
//!   Should the iptables writer fall back to exec'ing `iptables-restore` (a rule it cannot
//!   encode), that program's transactions count as another's: the reconcile they start finds
//!   nothing missing and writes nothing.
//!
//! What the legacy iptables tools change is not nf_tables and makes no event: with them the
//! watcher repairs only after a table of ours in nf_tables goes, lost events, and the other
//! sources; the one-shot units (`deploy/systemd`) cover the firewall services' restarts.
//!
//! ## Costs
//!
//! One thread, asleep in `poll` between events; nothing grows per event (each transaction is
//! dropped once classified, a burst keeps its first cause and a count, and the noted sockets
//! are those of the latest reconcile). It never starts a process of its own.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::nft::NftError;
use crate::nft::committers;
use crate::nft::monitor::{Debounce, Event, Monitor, Report, Transaction};

/// How long no new deletion must come before a burst is repaired.
pub const QUIET: Duration = Duration::from_millis(100);
/// The longest a repair waits after the first deletion of a burst.
pub const MAX_DELAY: Duration = Duration::from_millis(500);
/// The wait before a failed reconcile is tried again; doubled after each failure.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between tries of a reconcile that keeps failing.
pub const RETRY_MAX: Duration = Duration::from_secs(300);
/// The most reports read from the monitor in one go before the loop looks at its other
/// sources and its clock again.
const DRAIN_MAX: usize = 4096;

/// The log's line before each reconcile: `watch: reconciling (why)`; what the reconcile
/// restored and its summary follow, then [`DONE`] or [`FAILED`].
pub const RECONCILING: &str = "watch: reconciling (";
/// The start of the log's line after a reconcile that succeeded: `watch: done in 1.2 ms`.
pub const DONE: &str = "watch: done in ";
/// The start of the log's line after a reconcile that failed (its reasons before it).
pub const FAILED: &str = "watch: failed in ";

/// A failure that ends the watch.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// SIGTERM and SIGINT could not be blocked and read from a descriptor.
    #[error("cannot catch SIGTERM and SIGINT: {0}")]
    Signals(#[source] nix::Error),
    /// The pipe the other sources wake the loop through could not be made.
    #[error("cannot make the watcher's pipe: {0}")]
    Pipe(#[source] io::Error),
    /// The nf_tables events could not be read.
    #[error("cannot read nf_tables events: {0}")]
    Monitor(#[source] NftError),
    /// Waiting for events failed.
    #[error("cannot wait for events: {0}")]
    Poll(#[source] nix::Error),
    /// Another source failed ([`Nudge::Failed`]).
    #[error("{0}")]
    Source(String),
}

/// SIGTERM and SIGINT, blocked and read from a descriptor, so that the loop sees them between
/// events and ends cleanly.
#[derive(Debug)]
pub struct Stop(SignalFd);

impl Stop {
    /// Blocks SIGTERM and SIGINT in the calling thread and opens a descriptor they can be read
    /// from. Threads started afterwards inherit the mask, so call this before starting any
    /// (the signal then waits for the loop instead of killing the process). Processes a
    /// thread of this one starts do not inherit it: the standard library resets the mask
    /// before exec.
    ///
    /// # Errors
    /// [`WatchError::Signals`].
    pub fn on_signals() -> Result<Stop, WatchError> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGTERM);
        set.add(Signal::SIGINT);
        set.thread_block().map_err(WatchError::Signals)?;
        SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map(Stop)
            .map_err(WatchError::Signals)
    }

    /// The signal received, if one is waiting.
    fn received(&self) -> Option<String> {
        let info = self.0.read_signal().ok().flatten()?;
        let signal = i32::try_from(info.ssi_signo).ok()?;
        Some(
            Signal::try_from(signal).map_or_else(|_| format!("signal {signal}"), |s| s.to_string()),
        )
    }
}

/// What another source (firewalld's signals) tells the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Nudge {
    /// Reconcile: something that removes our objects happened (why, for the log).
    Repair(String),
    /// The source failed and cannot go on: the watch ends with this failure.
    Failed(String),
}

/// The sending end of [`nudges`], for a source's own thread.
#[derive(Debug, Clone)]
pub struct Nudger {
    sender: mpsc::Sender<Nudge>,
    wake: Arc<io::PipeWriter>,
}

impl Nudger {
    /// Tells the loop; `false` when the loop has gone (the source may stop).
    pub fn send(&self, nudge: Nudge) -> bool {
        self.sender.send(nudge).is_ok() && (&*self.wake).write_all(&[1]).is_ok()
    }
}

/// The receiving end of [`nudges`], handed to [`Watch::run`].
#[derive(Debug)]
pub struct Nudges {
    receiver: mpsc::Receiver<Nudge>,
    wake: io::PipeReader,
}

/// A channel for other sources' nudges, with a pipe that wakes the loop's `poll`.
///
/// # Errors
/// [`WatchError::Pipe`].
pub fn nudges() -> Result<(Nudger, Nudges), WatchError> {
    let (reader, writer) = io::pipe().map_err(WatchError::Pipe)?;
    let (sender, receiver) = mpsc::channel();
    Ok((
        Nudger {
            sender,
            wake: Arc::new(writer),
        },
        Nudges {
            receiver,
            wake: reader,
        },
    ))
}

/// What a reconcile returns: its summary line, or why it failed.
pub type Outcome = Result<String, String>;

/// The watcher of one plugin: which objects are its, and how soon it repairs.
pub struct Watch<'a> {
    /// Whether an event is about an object of the plugin.
    pub ours: &'a dyn Fn(&Event) -> bool,
    /// The settling of a burst of deletions: [`QUIET`] and [`MAX_DELAY`] by default.
    pub debounce: Debounce,
}

impl std::fmt::Debug for Watch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("debounce", &self.debounce)
            .finish_non_exhaustive()
    }
}

/// The causes of the repair to come: the first, and how many more.
#[derive(Debug, Default)]
struct Causes {
    first: Option<String>,
    more: usize,
}

impl Causes {
    fn add(&mut self, cause: impl FnOnce() -> String) {
        if self.first.is_none() {
            self.first = Some(cause());
        } else {
            self.more += 1;
        }
    }

    /// The causes for the log, forgotten here.
    fn take(&mut self) -> String {
        let text = match (self.first.take(), self.more) {
            (None, _) => "retry".to_string(),
            (Some(first), 0) => first,
            (Some(first), more) => format!("{first}, and {more} more"),
        };
        self.more = 0;
        text
    }
}

/// Whether `revents` says the descriptor can be read (or has an error to read).
fn readable(fd: &PollFd<'_>) -> bool {
    fd.revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLERR | PollFlags::POLLHUP))
}

/// The name the kernel gives this process's main thread (`comm`), which every plugin call
/// of the same binary has too.
fn own_name() -> Option<String> {
    std::fs::read_to_string("/proc/self/comm")
        .ok()
        .map(|s| s.trim_end_matches('\n').to_owned())
        .filter(|s| !s.is_empty())
}

/// The first deletion of an object of ours in `tx`, described for the log, when another
/// program made it: `None` for a transaction committed on one of `own_ports` (this
/// process's sockets) or by a thread named `own_name` (the plugin's own calls), and for one
/// that deletes nothing of ours.
#[must_use]
pub fn trigger(
    tx: &Transaction,
    own_ports: &[u32],
    own_name: Option<&str>,
    ours: &dyn Fn(&Event) -> bool,
) -> Option<String> {
    if tx.port_id.is_some_and(|p| own_ports.contains(&p)) {
        return None;
    }
    if own_name.is_some_and(|n| tx.process.as_deref() == Some(n)) {
        return None;
    }
    let event = tx.deletions().find(|e| ours(e))?;
    let by = match (&tx.process, tx.pid) {
        (Some(process), Some(pid)) => format!("{process} (pid {pid})"),
        (Some(process), None) => process.clone(),
        _ => "an unknown program (its transaction's end was lost)".to_string(),
    };
    Some(format!("{} deleted by {by}", event.describe()))
}

impl<'a> Watch<'a> {
    /// A watcher of the objects `ours` accepts, with the default debounce.
    pub fn new(ours: &'a dyn Fn(&Event) -> bool) -> Watch<'a> {
        Watch {
            ours,
            debounce: Debounce::new(QUIET, MAX_DELAY),
        }
    }

    /// Runs the loop (module docs) until SIGTERM or SIGINT: a full reconcile at once, then one
    /// after each settled burst of others' deletions of our objects, lost events, or nudges.
    /// `reconcile` writes what it restored to the writer it is given (`log`) and returns its
    /// summary; the loop logs why and how long each took. A reconcile that fails is logged
    /// and tried again after [`RETRY_FIRST`], doubled up to [`RETRY_MAX`] while it fails.
    ///
    /// # Errors
    /// The monitor cannot be read, `poll` fails, or a source sends [`Nudge::Failed`].
    pub fn run(
        &self,
        mut monitor: Monitor,
        stop: &Stop,
        nudges: Option<&Nudges>,
        reconcile: &mut dyn FnMut(&mut dyn Write) -> Outcome,
        log: &mut dyn Write,
    ) -> Result<(), WatchError> {
        let own_name = own_name();
        committers::start();
        // Sockets noted before now committed nothing this watcher must ignore.
        let _ = committers::take();
        let mut own_ports: Vec<u32> = Vec::new();
        let mut debounce = self.debounce;
        let mut causes = Causes::default();
        causes.add(|| "start".to_string());
        // (when, the wait that led to it) of the next try of a failed reconcile.
        let mut retry: Option<(Instant, Duration)> = Some((Instant::now(), Duration::ZERO));
        let mut wake = [0u8; 64];
        loop {
            let now = Instant::now();
            let retry_due = retry.is_some_and(|(at, _)| at <= now);
            if debounce.fire(now) || retry_due {
                // What is queued was done before this reconcile reads anything, the last
                // one's own commits among it: read it first, with the sockets that made them.
                let mut queued = Causes::default();
                self.drain(
                    &mut monitor,
                    &own_ports,
                    own_name.as_deref(),
                    &mut queued,
                    &mut debounce,
                )?;
                if let Some(first) = queued.first.take() {
                    causes.add(|| first);
                    causes.more += queued.more;
                }
                debounce = Debounce::new(self.debounce.quiet, self.debounce.max_delay);
                let why = causes.take();
                let _ = writeln!(log, "{RECONCILING}{why})");
                let started = Instant::now();
                let outcome = reconcile(log);
                own_ports = committers::take();
                let took = started.elapsed().as_secs_f64() * 1000.0;
                match outcome {
                    Ok(summary) => {
                        let _ = writeln!(log, "{summary}\n{DONE}{took:.1} ms");
                        retry = None;
                    }
                    Err(e) => {
                        let wait = retry
                            .map_or(RETRY_FIRST, |(_, w)| (w * 2).clamp(RETRY_FIRST, RETRY_MAX));
                        let _ = writeln!(
                            log,
                            "{e}\n{FAILED}{took:.1} ms; trying again in {} s",
                            wait.as_secs()
                        );
                        retry = Some((Instant::now() + wait, wait));
                    }
                }
                let _ = log.flush();
                continue;
            }
            let wait = [
                debounce.wait(now),
                retry.map(|(at, _)| at.saturating_duration_since(now)),
            ]
            .into_iter()
            .flatten()
            .min();
            // Rounded up to a millisecond, so that a wait of less is not a busy loop.
            let timeout = match wait {
                None => PollTimeout::NONE,
                Some(w) => PollTimeout::try_from(w.as_millis().saturating_add(1))
                    .unwrap_or(PollTimeout::MAX),
            };
            let (stop_ready, nudged, events) = {
                let mut fds = vec![
                    PollFd::new(stop.0.as_fd(), PollFlags::POLLIN),
                    PollFd::new(monitor.as_fd(), PollFlags::POLLIN),
                ];
                if let Some(n) = nudges {
                    fds.push(PollFd::new(n.wake.as_fd(), PollFlags::POLLIN));
                }
                match poll(&mut fds, timeout) {
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(WatchError::Poll(e)),
                }
                (
                    readable(&fds[0]),
                    fds.get(2).is_some_and(readable),
                    readable(&fds[1]),
                )
            };
            if stop_ready && let Some(signal) = stop.received() {
                let _ = writeln!(log, "watch: stopping on {signal}");
                let _ = log.flush();
                return Ok(());
            }
            if nudged && let Some(n) = nudges {
                // At least one byte is there: this read does not block.
                let _ = (&n.wake).read(&mut wake);
                for nudge in n.receiver.try_iter() {
                    match nudge {
                        Nudge::Repair(why) => {
                            debounce.note(Instant::now());
                            causes.add(|| why);
                        }
                        Nudge::Failed(why) => return Err(WatchError::Source(why)),
                    }
                }
            }
            if events {
                self.drain(
                    &mut monitor,
                    &own_ports,
                    own_name.as_deref(),
                    &mut causes,
                    &mut debounce,
                )?;
            }
        }
    }

    /// Reads what the monitor has queued (up to [`DRAIN_MAX`] reports), noting others'
    /// deletions of our objects and lost events in `debounce` and `causes`.
    fn drain(
        &self,
        monitor: &mut Monitor,
        own_ports: &[u32],
        own_name: Option<&str>,
        causes: &mut Causes,
        debounce: &mut Debounce,
    ) -> Result<(), WatchError> {
        for _ in 0..DRAIN_MAX {
            match monitor
                .next(Some(Duration::ZERO))
                .map_err(WatchError::Monitor)?
            {
                None => break,
                Some(Report::Lost) => {
                    debounce.note(Instant::now());
                    causes.add(|| "nf_tables events lost (the receive buffer overran)".to_string());
                }
                Some(Report::Transaction(tx)) => {
                    if let Some(why) = trigger(&tx, own_ports, own_name, self.ours) {
                        debounce.note(tx.received);
                        causes.add(|| why);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::monitor::{Change, ObjectKind};

    fn tx(process: &str, port: u32, events: Vec<Event>) -> Transaction {
        Transaction {
            generation: Some(7),
            pid: Some(4321),
            process: Some(process.to_string()),
            port_id: Some(port),
            events,
            received: Instant::now(),
        }
    }

    fn chain(change: Change, table: &str, name: &str) -> Event {
        Event::new(ObjectKind::Chain, change, 2, table, Some(name), None)
    }

    fn ours(e: &Event) -> bool {
        e.table == "filter" && e.chain.as_deref().is_some_and(|c| c.starts_with("CNI-"))
    }

    #[test]
    fn only_others_deletions_of_our_objects_trigger_a_repair() {
        let deleted = || vec![chain(Change::Deleted, "filter", "CNI-FORWARD")];
        assert_eq!(
            trigger(&tx("iptables", 9, deleted()), &[5], Some("firewall"), &ours).as_deref(),
            Some("chain ip filter CNI-FORWARD deleted by iptables (pid 4321)")
        );
        // Committed on a socket of ours, or by the plugin's own calls.
        assert_eq!(
            trigger(&tx("firewall", 9, deleted()), &[5], Some("firewall"), &ours),
            None
        );
        assert_eq!(
            trigger(&tx("iptables", 5, deleted()), &[5], Some("firewall"), &ours),
            None
        );
        // Added, not deleted; deleted, but not ours.
        let added = vec![chain(Change::New, "filter", "CNI-FORWARD")];
        assert_eq!(trigger(&tx("nft", 9, added), &[], None, &ours), None);
        let foreign = vec![chain(Change::Deleted, "filter", "KUBE-FORWARD")];
        assert_eq!(trigger(&tx("nft", 9, foreign), &[], None, &ours), None);
        // Of a transaction whose end was lost, nobody is known.
        let mut lost = tx("x", 9, deleted());
        (lost.process, lost.pid, lost.port_id) = (None, None, None);
        assert_eq!(
            trigger(&lost, &[9], Some("firewall"), &ours).as_deref(),
            Some(
                "chain ip filter CNI-FORWARD deleted by an unknown program (its transaction's \
                 end was lost)"
            )
        );
    }

    #[test]
    fn causes_keep_the_first_and_count_the_rest() {
        let mut causes = Causes::default();
        assert_eq!(causes.take(), "retry");
        causes.add(|| "a".into());
        assert_eq!(causes.take(), "a");
        for c in ["b", "c", "d"] {
            causes.add(|| c.into());
        }
        assert_eq!(causes.take(), "b, and 2 more");
        assert_eq!(causes.first, None);
    }

    #[test]
    fn a_nudge_wakes_the_pipe_and_fails_once_the_loop_is_gone() {
        let (nudger, nudges) = nudges().unwrap();
        assert!(nudger.send(Nudge::Repair("firewalld reloaded".into())));
        let mut byte = [0u8; 8];
        assert_eq!((&nudges.wake).read(&mut byte).unwrap(), 1);
        assert_eq!(
            nudges.receiver.try_iter().collect::<Vec<_>>(),
            [Nudge::Repair("firewalld reloaded".into())]
        );
        drop(nudges);
        assert!(!nudger.send(Nudge::Repair("again".into())));
    }
}
