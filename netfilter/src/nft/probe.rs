//! Which nf_tables features the kernel has: a batch the kernel checks and then aborts.
//!
//! A kernel may have nf_tables without some of its modules (`nft_fib`, `nft_nat`,
//! `nft_chain_nat`…), because they were not built or cannot be loaded. The kernel then
//! refuses a rule using one with ENOENT (it looks the expression type up by name; the chain
//! type likewise). [`Nft::missing_features`] asks for each feature in one batch that has no
//! end, so the kernel processes every message, answers each refusal, and aborts: nothing is
//! created. The abort waits for an RCU grace period (5–20 ms on the 6.18 development VM).
//! A plugin asks once where it has to choose (an `auto` backend, STATUS); elsewhere the
//! refusal of the real batch says the same ([`NftError::missing_feature`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::expr::Expr;
use super::{
    Batch, Chain, ChainHook, ChainType, CtStateFlags, Family, Nft, NftError, Rule, Table, priority,
};

/// Something of nf_tables a ruleset needs that a kernel may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// `fib daddr type local` (`nft_fib`, and `nft_fib_ipv4`/`_ipv6`/`_inet` per family).
    Fib,
    /// `dnat to …`/`snat to …` (`nft_nat`).
    Nat,
    /// `masquerade` (`nft_masq`).
    Masquerade,
    /// `ct state …`, `ct status …`, `ct mark …` (`nft_ct`).
    Ct,
    /// `counter` (`nft_counter`).
    Counter,
    /// Base chains of `type nat` (`nft_chain_nat`).
    NatChain,
    /// An expression by its kernel name (`fib`, `lookup`, `queue`…), sent without attributes:
    /// the kernel has it unless it answers ENOENT (it refuses the missing attributes
    /// otherwise).
    Expression(&'static str),
}

impl Feature {
    /// What the kernel lacks when it lacks this, for error messages: `expression "fib"`,
    /// `chain type "nat"` (the form of [`NftError::missing_feature`]).
    pub fn describe(self) -> String {
        let expression = |name: &str| format!("expression {name:?}");
        match self {
            Feature::Fib => expression("fib"),
            Feature::Nat => expression("nat"),
            Feature::Masquerade => expression("masq"),
            Feature::Ct => expression("ct"),
            Feature::Counter => expression("counter"),
            Feature::NatChain => "chain type \"nat\"".to_string(),
            Feature::Expression(name) => expression(name),
        }
    }
}

/// The table a probe declares (never committed).
const PROBE_TABLE: &str = "cni_probe";
/// Its regular chain, which holds one rule per feature: rules of a chain no base chain jumps
/// to are not checked against hooks, so a NAT statement is judged on its own.
const PROBE_CHAIN: &str = "probe";
/// Its `type nat` base chain, for [`Feature::NatChain`].
const PROBE_NAT_CHAIN: &str = "probe_nat";

impl Nft {
    /// The features of `features` the kernel does not have for tables of `family`, in the
    /// given order; empty when it has them all. Nothing is created: the kernel checks one batch
    /// (a dormant table, a chain, one rule per feature) and aborts it, which costs an RCU grace
    /// period (module docs of [`probe`](self)).
    ///
    /// # Errors
    /// When the kernel has no nf_tables at all ([`NftError::is_absent`]: every feature is
    /// missing), or refuses the probe for another reason.
    pub fn missing_features(
        &mut self,
        family: Family,
        features: &[Feature],
    ) -> Result<Vec<Feature>, NftError> {
        let table = Table::new(family, PROBE_TABLE);
        let mut batch = Batch::new();
        batch
            .add_dormant_table(&table)
            .add_chain(&table, &Chain::regular(PROBE_CHAIN));
        // The operation index of each feature's probe.
        let mut probes = Vec::with_capacity(features.len());
        for feature in features {
            probes.push((batch.len(), *feature));
            match feature {
                Feature::NatChain => batch.add_chain(
                    &table,
                    &Chain::base(
                        PROBE_NAT_CHAIN,
                        ChainType::Nat,
                        ChainHook::Prerouting,
                        priority::DSTNAT,
                    ),
                ),
                _ => batch.add_rule(&table, PROBE_CHAIN, &probe_rule(*feature, family)),
            };
        }
        let (encoded, replies) = self.send(&batch, false)?;
        let mut missing = Vec::new();
        for failure in replies.failures {
            let errno = failure.error.raw_os_error();
            let op = failure
                .index
                .checked_sub(1)
                .and_then(|i| encoded.get(i))
                .map(|e| e.op);
            let probed = op.and_then(|op| probes.iter().find(|(at, _)| *at == op));
            let absent = match probed {
                Some((_, Feature::Expression(_))) => errno == Some(libc::ENOENT),
                Some(_) => matches!(errno, Some(libc::ENOENT | libc::EOPNOTSUPP)),
                None => false,
            };
            match probed {
                Some((_, feature)) if absent => missing.push(*feature),
                // A bare expression the kernel knows is refused for its missing attributes.
                Some((_, Feature::Expression(_))) => {}
                _ => return Err(self.classify(super::rejected(&batch, &encoded, failure, false))),
            }
        }
        missing.sort_by_key(|m| features.iter().position(|f| f == m));
        missing.dedup();
        Ok(missing)
    }
}

/// A rule that needs `feature` and nothing else of note.
fn probe_rule(feature: Feature, family: Family) -> Rule {
    let addr = match family {
        Family::Ip6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
        Family::Ip | Family::Inet => IpAddr::V4(Ipv4Addr::LOCALHOST),
    };
    match feature {
        Feature::Fib => Rule::new().fib_daddr_local().accept(),
        Feature::Nat => Rule::new().dnat_to(addr, None),
        Feature::Masquerade => Rule::new().masquerade(),
        Feature::Ct => Rule::new().ct_state(CtStateFlags::ESTABLISHED).accept(),
        Feature::Counter | Feature::NatChain => Rule::new().counter(),
        Feature::Expression(name) => Rule::new().expr(Expr::Other(name.to_string())),
    }
}
