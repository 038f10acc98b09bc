//! Our own `inet cni_firewall` table, programmed over netlink in one batch per call:
//!
//! ```text
//! table inet cni_firewall {
//!   chain forward { type filter hook forward priority filter; policy accept;
//!     jump admin; jump isolation; jump attachments }
//!   chain admin { }                                  # the operator's, never touched
//!   chain isolation { iifname "br1" oifname "br1" drop    # isolated (inserted first)
//!                     iifname "br0" oifname "br0" return  # same-bridge (inserted first)
//!                     iifname "br0" jump isolation-out }
//!   chain isolation-out { oifname "br0" drop }
//!   chain attachments { jump att-<fnv64 of owner> comment "<net>/<ctr>/<if>" … }
//!   chain att-<fnv64> {
//!     ip daddr 10.0.0.2 ct state established,related accept comment "<owner>"
//!     ip saddr 10.0.0.2 accept comment "<owner>" }
//! }
//! ```
//!
//! Each attachment has a chain of its own, so ADD finds out with one lookup whether it is
//! already installed (then its chain is flushed and refilled in the same batch) and never
//! lists the other attachments: its cost does not grow with their number.

use common::conf::Attachment;
use common::nft::{
    Batch, Chain, ChainHook, ChainType, CtStateFlags, Family, ListedRule, Nft, NftError, Rule,
    Table,
};

use super::{FirewallBackend, Owner};
use crate::config::IngressPolicy;
use crate::error::FirewallError;
use crate::names::{
    NFT_ADMIN_CHAIN, NFT_ATTACHMENTS_CHAIN, NFT_FORWARD_CHAIN, NFT_FORWARD_PRIORITY,
    NFT_ISOLATION_CHAIN, NFT_ISOLATION_OUT_CHAIN, NFT_TABLE, isolation_comment,
};
use crate::plan::Target;

/// The table.
#[must_use]
pub fn table() -> Table {
    Table::new(Family::Inet, NFT_TABLE)
}

/// The chain of one attachment, named by a digest of its owner comment.
#[must_use]
pub fn attachment_chain(comment: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in comment.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("att-{hash:016x}")
}

/// The base chain's rules, in order.
fn skeleton() -> [Rule; 3] {
    [
        Rule::new().jump(NFT_ADMIN_CHAIN),
        Rule::new().jump(NFT_ISOLATION_CHAIN),
        Rule::new().jump(NFT_ATTACHMENTS_CHAIN),
    ]
}

/// The accepts of one attachment.
#[must_use]
pub fn attachment_rules(comment: &str, target: &Target) -> Vec<Rule> {
    let mut rules = Vec::new();
    for ip in &target.ips {
        rules.push(
            Rule::new()
                .daddr(*ip)
                .ct_state(CtStateFlags::ESTABLISHED | CtStateFlags::RELATED)
                .accept()
                .comment(comment),
        );
        rules.push(Rule::new().saddr(*ip).accept().comment(comment));
    }
    rules
}

/// The isolation rules of a bridge: `(chain, insert first?, rule)`.
#[must_use]
pub fn isolation_rules(bridge: &str, policy: IngressPolicy) -> Vec<(&'static str, bool, Rule)> {
    let comment = isolation_comment(policy.name());
    let own = Rule::new().iifname(bridge).oifname(bridge);
    let own = match policy {
        IngressPolicy::Isolated => own.drop(),
        _ => own.ret(),
    };
    vec![
        (NFT_ISOLATION_CHAIN, true, own.comment(&comment)),
        (
            NFT_ISOLATION_CHAIN,
            false,
            Rule::new()
                .iifname(bridge)
                .jump(NFT_ISOLATION_OUT_CHAIN)
                .comment(&comment),
        ),
        (
            NFT_ISOLATION_OUT_CHAIN,
            false,
            Rule::new().oifname(bridge).drop().comment(&comment),
        ),
    ]
}

/// The rules of a chain, or none when it (or the table) does not exist.
fn rules_or_none(
    nft: &mut Nft,
    table: &Table,
    chain: &str,
) -> Result<Option<Vec<ListedRule>>, NftError> {
    match nft.rules(table, chain) {
        Ok(rules) => Ok(Some(rules)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The nftables backend.
#[derive(Debug)]
pub struct Nftables {
    nft: Nft,
    policy: IngressPolicy,
}

impl Nftables {
    /// Opens netlink in the calling thread's namespace.
    ///
    /// # Errors
    /// When the socket cannot be opened.
    pub fn new(policy: IngressPolicy) -> Result<Nftables, FirewallError> {
        Ok(Nftables {
            nft: Nft::new()?,
            policy,
        })
    }

    /// Adds to `batch` what makes the table's skeleton complete.
    fn ensure_skeleton(&mut self, batch: &mut Batch) -> Result<(), FirewallError> {
        let t = table();
        let base = Chain::base(
            NFT_FORWARD_CHAIN,
            ChainType::Filter,
            ChainHook::Forward,
            NFT_FORWARD_PRIORITY,
        );
        let current = rules_or_none(&mut self.nft, &t, NFT_FORWARD_CHAIN)?;
        let want = skeleton();
        let intact = current.as_ref().is_some_and(|rules| {
            rules.len() == want.len()
                && rules
                    .iter()
                    .zip(&want)
                    .all(|(have, want)| have.is(want, Family::Inet))
        });
        if intact {
            // The jumps reference admin, isolation and attachments, so those exist too
            // (the kernel refuses to delete a chain that is jumped to); isolation-out is
            // declared by the isolation rules that need it. Re-adding the base chain would
            // cost a hook update (~10 ms) on every call.
            return Ok(());
        }
        batch.add_table(&t);
        for chain in [
            NFT_ADMIN_CHAIN,
            NFT_ISOLATION_CHAIN,
            NFT_ISOLATION_OUT_CHAIN,
            NFT_ATTACHMENTS_CHAIN,
        ] {
            batch.add_chain(&t, &Chain::regular(chain));
        }
        batch.add_chain(&t, &base);
        // Not intact: rebuilt whole, so the jumps are never duplicated or out of order.
        if current.is_some() {
            batch.flush_chain(&t, NFT_FORWARD_CHAIN);
        }
        for rule in &want {
            batch.add_rule(&t, NFT_FORWARD_CHAIN, rule);
        }
        Ok(())
    }

    /// Adds to `batch` the bridge's isolation rules that are missing.
    fn ensure_isolation(&mut self, batch: &mut Batch, bridge: &str) -> Result<(), FirewallError> {
        let t = table();
        let stage1 = rules_or_none(&mut self.nft, &t, NFT_ISOLATION_CHAIN)?.unwrap_or_default();
        let stage2 = rules_or_none(&mut self.nft, &t, NFT_ISOLATION_OUT_CHAIN)?.unwrap_or_default();
        batch.add_chain(&t, &Chain::regular(NFT_ISOLATION_OUT_CHAIN));
        for (chain, first, rule) in isolation_rules(bridge, self.policy) {
            let present = if chain == NFT_ISOLATION_CHAIN {
                &stage1
            } else {
                &stage2
            };
            if present.iter().any(|r| r.is(&rule, Family::Inet)) {
                continue;
            }
            if first {
                batch.insert_rule(&t, chain, &rule);
            } else {
                batch.add_rule(&t, chain, &rule);
            }
        }
        Ok(())
    }

    /// Adds to `batch` the removal of the attachments whose jump `select` picks.
    fn remove_where(
        &mut self,
        batch: &mut Batch,
        select: &dyn Fn(&str) -> bool,
    ) -> Result<(), FirewallError> {
        let t = table();
        let Some(jumps) = rules_or_none(&mut self.nft, &t, NFT_ATTACHMENTS_CHAIN)? else {
            return Ok(());
        };
        for jump in jumps {
            let Some(comment) = jump.comment.as_deref() else {
                continue;
            };
            if !select(comment) {
                continue;
            }
            batch.delete_rule(&t, NFT_ATTACHMENTS_CHAIN, jump.handle);
            let chain = attachment_chain(comment);
            if self.nft.chain_exists(&t, &chain)? {
                batch.flush_chain(&t, &chain).delete_chain(&t, &chain);
            }
        }
        Ok(())
    }
}

impl FirewallBackend for Nftables {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn add(&mut self, owner: &Owner, target: &Target) -> Result<(), FirewallError> {
        let t = table();
        let comment = owner.comment();
        let chain = attachment_chain(&comment);
        let mut batch = Batch::new();
        self.ensure_skeleton(&mut batch)?;
        if let Some(bridge) = &target.bridge {
            self.ensure_isolation(&mut batch, bridge)?;
        }
        if self.nft.chain_exists(&t, &chain)? {
            // Installed before (a repeated ADD): refill, keeping the one jump to it.
            batch.flush_chain(&t, &chain);
        } else {
            batch.add_chain(&t, &Chain::regular(&chain)).add_rule(
                &t,
                NFT_ATTACHMENTS_CHAIN,
                &Rule::new().jump(&chain).comment(&comment),
            );
        }
        for rule in attachment_rules(&comment, target) {
            batch.add_rule(&t, &chain, &rule);
        }
        self.nft.apply(&batch)?;
        Ok(())
    }

    fn check(&mut self, owner: &Owner, target: &Target) -> Result<(), FirewallError> {
        let t = table();
        let missing = |what: String| FirewallError::Missing { what };
        let base = rules_or_none(&mut self.nft, &t, NFT_FORWARD_CHAIN)?
            .ok_or_else(|| missing(format!("chain {t} {NFT_FORWARD_CHAIN}")))?;
        for rule in skeleton() {
            if !base.iter().any(|r| r.is(&rule, Family::Inet)) {
                return Err(missing(format!(
                    "rule {t} {NFT_FORWARD_CHAIN} {}",
                    rule.to_nft()
                )));
            }
        }
        if !self.nft.chain_exists(&t, NFT_ADMIN_CHAIN)? {
            return Err(missing(format!("chain {t} {NFT_ADMIN_CHAIN}")));
        }
        let comment = owner.comment();
        let chain = attachment_chain(&comment);
        let jump = Rule::new().jump(&chain).comment(&comment);
        let jumps = rules_or_none(&mut self.nft, &t, NFT_ATTACHMENTS_CHAIN)?.unwrap_or_default();
        if !jumps.iter().any(|r| r.is(&jump, Family::Inet)) {
            return Err(missing(format!(
                "rule {t} {NFT_ATTACHMENTS_CHAIN} {}",
                jump.to_nft()
            )));
        }
        let have = rules_or_none(&mut self.nft, &t, &chain)?
            .ok_or_else(|| missing(format!("chain {t} {chain}")))?;
        let want = attachment_rules(&comment, target);
        if have.len() != want.len() || !have.iter().zip(&want).all(|(h, w)| h.is(w, Family::Inet)) {
            let what = want.iter().map(Rule::to_nft).collect::<Vec<_>>().join("; ");
            return Err(missing(format!("exactly [{what}] in chain {t} {chain}")));
        }
        if let Some(bridge) = &target.bridge {
            for (chain, _, rule) in isolation_rules(bridge, self.policy) {
                let rules = rules_or_none(&mut self.nft, &t, chain)?.unwrap_or_default();
                if !rules.iter().any(|r| r.is(&rule, Family::Inet)) {
                    return Err(missing(format!("rule {t} {chain} {}", rule.to_nft())));
                }
            }
        }
        Ok(())
    }

    fn del(&mut self, owner: &Owner, _target: Option<&Target>) -> Result<(), FirewallError> {
        let comment = owner.comment();
        let mut batch = Batch::new();
        self.remove_where(&mut batch, &|c| c == comment)?;
        self.nft.apply(&batch)?;
        Ok(())
    }

    fn gc(&mut self, network: &str, valid: &[Attachment]) -> Result<(), FirewallError> {
        let live: Vec<String> = valid
            .iter()
            .map(|a| crate::names::owner_comment(network, &a.container_id, &a.ifname))
            .collect();
        let mut batch = Batch::new();
        self.remove_where(&mut batch, &|c| {
            crate::names::owned_by_network(c, network) && !live.iter().any(|l| l == c)
        })?;
        self.nft.apply(&batch)?;
        Ok(())
    }

    fn status(&mut self) -> Result<(), FirewallError> {
        self.nft
            .table_exists(&table())
            .map(|_| ())
            .map_err(|e| FirewallError::Unavailable {
                backend: "nftables",
                reason: e.to_string(),
            })
    }
}
