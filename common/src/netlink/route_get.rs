//! Route lookups (`ip route get ADDR`): which interface the kernel would send a packet on.

use std::net::IpAddr;

use netlink_packet_route::AddressFamily;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};

use super::{Netlink, NetlinkError};

impl Netlink {
    /// The index of the output interface of the route to `dst` (`ip route get DST`), or `None`
    /// when the kernel's answer names none.
    ///
    /// # Errors
    /// The kernel's errno (ENETUNREACH when there is no route).
    pub fn route_get_oif(&mut self, dst: IpAddr) -> Result<Option<u32>, NetlinkError> {
        let mut msg = RouteMessage::default();
        match dst {
            IpAddr::V4(a) => {
                msg.header.address_family = AddressFamily::Inet;
                msg.header.destination_prefix_length = 32;
                msg.attributes
                    .push(RouteAttribute::Destination(RouteAddress::Inet(a)));
            }
            IpAddr::V6(a) => {
                msg.header.address_family = AddressFamily::Inet6;
                msg.header.destination_prefix_length = 128;
                msg.attributes
                    .push(RouteAttribute::Destination(RouteAddress::Inet6(a)));
            }
        }
        let replies = self.request(
            format!("get route to {dst}"),
            RouteNetlinkMessage::GetRoute(msg),
            0,
        )?;
        Ok(replies.into_iter().find_map(|r| match r {
            RouteNetlinkMessage::NewRoute(m) => m.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            }),
            _ => None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_get_names_the_interface_of_a_connected_route() {
        // A fresh namespace of our own: only its loopback, which routes 127.0.0.0/8.
        let oif = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let mut nl = Netlink::new().unwrap();
            let lo = nl.link_by_name("lo").unwrap();
            nl.set_link(
                lo.index,
                &crate::netlink::LinkChange {
                    up: Some(true),
                    ..Default::default()
                },
            )
            .unwrap();
            let oif = nl.route_get_oif("127.0.0.1".parse().unwrap()).unwrap();
            let unreachable = nl.route_get_oif("192.0.2.1".parse().unwrap());
            (oif, lo.index, unreachable.is_err())
        })
        .join()
        .unwrap();
        assert_eq!(oif.0, Some(oif.1));
        assert!(oif.2, "no route to 192.0.2.1 in an empty namespace");
    }
}
