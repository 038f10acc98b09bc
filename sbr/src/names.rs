//! Kernel-visible numbers sbr uses, in one place.

use std::net::IpAddr;

use ipnet::IpNet;

/// The first table id tried when no `table` is configured (as the reference).
pub const FIRST_TABLE: u32 = 100;

/// Tables sbr never allocates, moves routes into or removes: `default` (253), `main` (254) and
/// `local` (255).
pub const RESERVED_TABLES: [u32; 3] = [
    netlink::TABLE_DEFAULT,
    netlink::TABLE_MAIN,
    netlink::TABLE_LOCAL,
];

/// The `from` selector of an address's rule: the address alone, `/32` or `/128` (a wider mask
/// would capture the whole subnet's traffic).
pub fn host_net(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_sources_are_host_prefixes() {
        assert_eq!(
            host_net("10.1.2.3".parse().unwrap()).to_string(),
            "10.1.2.3/32"
        );
        assert_eq!(
            host_net("fd00::5".parse().unwrap()).to_string(),
            "fd00::5/128"
        );
    }
}
