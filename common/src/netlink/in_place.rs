//! Opening a netlink socket in another network namespace without a helper thread.
//!
//! [`Netlink::open_in`] enters the namespace on a throwaway thread, so the caller never moves.
//! Starting and joining that thread costs two scheduler hand-offs, which on a busy node add
//! milliseconds to a plugin call. [`Netlink::open_in_place`] instead moves the calling thread
//! into the namespace for the two system calls that create the socket, and back.

use std::os::fd::AsFd;

use nix::sched::{CloneFlags, setns};

use super::{Netlink, OpenError};
use crate::netns::{NetNs, NetnsError};

impl Netlink {
    /// Opens a handle inside `ns` from the calling thread: it enters `ns`, opens the socket
    /// (which stays bound to `ns`) and returns to the namespace it was in. Meant for a plugin's
    /// single-threaded main path; nothing else runs on the thread meanwhile.
    ///
    /// # Errors
    /// [`OpenError`] when the namespace cannot be entered or the socket opened; the thread is
    /// back in its own namespace then.
    ///
    /// # Panics
    /// When the thread cannot return to its own namespace (setns on a namespace it was just in,
    /// held open, does not fail in practice): going on there would program the wrong namespace.
    pub fn open_in_place(ns: &NetNs) -> Result<Netlink, OpenError> {
        let home = NetNs::current()?;
        if ns.is_same(&home) {
            return Ok(Netlink::new()?);
        }
        setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|errno| NetnsError::Enter {
            path: ns.path().to_path_buf(),
            source: errno.into(),
        })?;
        let opened = Netlink::new();
        if let Err(errno) = setns(home.as_fd(), CloneFlags::CLONE_NEWNET) {
            // Documented above: continuing in the wrong namespace is worse than stopping.
            #[allow(clippy::panic)]
            {
                panic!("cannot return to the plugin's network namespace: {errno}");
            }
        }
        Ok(opened?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_in_place_binds_the_socket_there_and_the_thread_comes_back() {
        crate::netns::in_new_netns(|| {
            let home = NetNs::current().unwrap();
            let other = crate::netns::in_new_netns(|| {
                // A link only the other namespace has.
                Netlink::new()
                    .unwrap()
                    .add_ifb("inplace0", 1500, None, "test")
                    .unwrap();
                NetNs::current().unwrap()
            })
            .unwrap();
            let mut there = Netlink::open_in_place(&other).unwrap();
            assert!(NetNs::current().unwrap().is_same(&home));
            assert!(there.link_by_name("inplace0").is_ok());
            assert!(
                Netlink::new()
                    .unwrap()
                    .link_by_name("inplace0")
                    .unwrap_err()
                    .is_not_found()
            );
        })
        .unwrap();
    }
}
