//! Opening a netlink socket in another network namespace without a helper thread.

use super::{Netlink, OpenError};
use host::netns::NetNs;

impl Netlink {
    /// Opens a handle inside `ns` from the calling thread ([`NetNs::run_in_place`]): the
    /// socket stays bound to `ns`, the thread returns to its own namespace. [`Netlink::open_in`]
    /// does the same on a throwaway thread, which costs two scheduler hand-offs.
    ///
    /// # Errors
    /// [`OpenError`] when the namespace cannot be entered or the socket opened.
    pub fn open_in_place(ns: &NetNs) -> Result<Netlink, OpenError> {
        Ok(ns.run_in_place(Netlink::new)??)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_in_place_binds_the_socket_there_and_the_thread_comes_back() {
        host::netns::in_new_netns(|| {
            let home = NetNs::current().unwrap();
            let other = host::netns::in_new_netns(|| {
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
