//! The netlink port ids of the sockets on which this process commits nf_tables transactions,
//! noted on request: a watcher that repairs what others delete ([`crate::watch`]) tells its own
//! transactions from theirs by the port id the kernel gives each transaction's closing event
//! ([`super::monitor::Transaction::port_id`]), which holds in any pid namespace, unlike the
//! committing thread's id.
//!
//! Nothing is noted until [`start`]; a plugin call never starts it, so its commits pay only
//! a relaxed atomic load. [`take`] returns what was noted since the last take and forgets it,
//! so a long-running watcher keeps only the sockets of its latest repair. (Tested with the
//! monitor: `nft::monitor::tests`.)

use std::os::fd::AsFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

static NOTING: AtomicBool = AtomicBool::new(false);
static PORTS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Notes from now on the port id of every socket this process commits a transaction on.
pub fn start() {
    NOTING.store(true, Ordering::Relaxed);
}

/// The port ids noted since [`start`] or the last take (each once), forgotten here.
pub fn take() -> Vec<u32> {
    match PORTS.lock() {
        Ok(mut ports) => std::mem::take(&mut *ports),
        Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
    }
}

/// Notes `socket`'s port id if noting is on (a socket whose name cannot be read is skipped:
/// its transactions then look like another program's, which costs a watcher one repair that
/// finds nothing missing).
pub(crate) fn note(socket: &impl AsFd) {
    if !NOTING.load(Ordering::Relaxed) {
        return;
    }
    let Ok(port) = super::monitor::port_id(socket) else {
        return;
    };
    let mut ports = match PORTS.lock() {
        Ok(ports) => ports,
        Err(poisoned) => poisoned.into_inner(),
    };
    if !ports.contains(&port) {
        ports.push(port);
    }
}
