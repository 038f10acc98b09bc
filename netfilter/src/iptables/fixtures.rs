//! Test support (compiled for this crate's tests and with the `fixtures` feature): the
//! reference portmap's shared iptables layout in `nat` (snat, mark bit 13) in
//! `iptables-save`'s words, written once for every test that needs it (this crate's kernel
//! tests, portmap's, the tests crate's and the bench). Not for production use.

use super::native::RuleSpec;

/// The shared mark chain.
pub const SETMARK: &str = "CNI-HOSTPORT-SETMARK";
/// The shared masquerade chain.
pub const MASQ: &str = "CNI-HOSTPORT-MASQ";
/// The shared DNAT dispatch chain, holding every attachment's entry rules.
pub const DNAT: &str = "CNI-HOSTPORT-DNAT";
/// The shared regular chains.
pub const SHARED_CHAINS: [&str; 3] = [SETMARK, MASQ, DNAT];

/// A rule's arguments from one line in the tools' words (double quotes group).
#[must_use]
pub fn words(line: &str) -> Vec<String> {
    super::split_args(line).unwrap_or_default()
}

/// The shared chains' rules and the jumps into them from the built-in chains, in the order
/// the reference makes them.
#[must_use]
pub fn skeleton() -> Vec<RuleSpec> {
    vec![
        RuleSpec::append(
            SETMARK,
            &words(
                r#"-m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000"#,
            ),
        ),
        RuleSpec::append(MASQ, &words("-m mark --mark 0x2000/0x2000 -j MASQUERADE")),
        RuleSpec::insert(
            "POSTROUTING",
            &words(&format!(
                r#"-m comment --comment "CNI portfwd requiring masquerade" -j {MASQ}"#
            )),
        ),
        RuleSpec::append(
            "PREROUTING",
            &words(&format!("-m addrtype --dst-type LOCAL -j {DNAT}")),
        ),
        RuleSpec::append(
            "OUTPUT",
            &words(&format!("-m addrtype --dst-type LOCAL -j {DNAT}")),
        ),
    ]
}
