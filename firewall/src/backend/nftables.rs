//! Our own `inet cni_firewall` table, programmed over netlink in one batch per call:
//!
//! ```text
//! table inet cni_firewall {
//!   set containers4 { type ipv4_addr; elements = { 10.0.0.2 comment "<net>/<ctr>/<if>" } }
//!   set containers6 { type ipv6_addr; elements = { fd00::2 comment "<net>/<ctr>/<if>" } }
//!   chain forward { type filter hook forward priority filter; policy accept;
//!     jump admin; jump isolation; jump attachments }
//!   chain admin { }                                  # the operator's, never touched
//!   chain isolation { iifname "br1" oifname "br1" drop    # isolated (inserted first)
//!                     iifname "br0" oifname "br0" return  # same-bridge (inserted first)
//!                     iifname "br0" jump isolation-out }
//!   chain isolation-out { oifname "br0" drop }
//!   chain attachments {
//!     ip daddr @containers4 ct state established,related accept
//!     ip saddr @containers4 accept
//!     ip6 daddr @containers6 ct state established,related accept
//!     ip6 saddr @containers6 accept }
//! }
//! ```
//!
//! The rules are shared and created once with the skeleton; an attachment is only its set
//! elements, which carry its owner comment. So ADD, DEL and GC only add or delete elements,
//! ADD and DEL with prevResult look up their own addresses instead of listing the others, and
//! no call's cost grows with the number of containers but GC's and DEL's without prevResult.
//! Each call uses one nf_tables socket: whatever a transaction deletes is freed after an RCU
//! grace period, and closing a socket of the namespace waits for that. So DEL and GC do not
//! delete elements but expire them (the sets have `flags timeout`; a 1 ms timeout, after
//! which lookups and listings skip them and the kernel's set garbage collection frees them,
//! within a second), and fall back to deleting, last and closing once at exit, in a table an
//! earlier version made without the flag (see README).

use std::collections::HashMap;
use std::net::IpAddr;

use cni::conf::GcAttachment;
use netfilter::nft::{
    Batch, Chain, ChainHook, ChainType, CtStateFlags, DataType, Element, Family, LazyNft,
    ListedRule, NfProto, Nft, NftError, Rule, Selector, Set, Table, Value,
};

use super::state::{AttachmentState, Made, State};
use super::{FirewallBackend, Missing, Recorded, Restored};
use crate::config::{BackendChoice, Config, IngressPolicy};
use crate::error::FirewallError;
use crate::names::{
    DEFAULT_ADMIN_CHAIN, DEFAULT_ZONE, NFT_ADMIN_CHAIN, NFT_ATTACHMENTS_CHAIN, NFT_FORWARD_CHAIN,
    NFT_FORWARD_PRIORITY, NFT_ISOLATION_CHAIN, NFT_ISOLATION_OUT_CHAIN, NFT_SET_V4, NFT_SET_V6,
    NFT_TABLE, isolation_comment,
};
use crate::plan::Target;
use cni::Attachment;

/// The table.
#[must_use]
pub fn table() -> Table {
    Table::new(Family::Inet, NFT_TABLE)
}

/// The set holding addresses of `ip`'s version.
#[must_use]
pub fn set_of(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { NFT_SET_V4 } else { NFT_SET_V6 }
}

/// Both sets, with their key types. `flags timeout`: DEL and GC remove elements by expiring
/// them ([`Batch::expire_elements`]), which spares the call the wait a deletion costs at the
/// socket's close; none of the elements added has a timeout.
fn sets() -> [Set; 2] {
    [
        Set::new(NFT_SET_V4, &[DataType::Ipv4Addr]).with_timeout(),
        Set::new(NFT_SET_V6, &[DataType::Ipv6Addr]).with_timeout(),
    ]
}

/// The element key of an address.
fn key(ip: IpAddr) -> Vec<Value> {
    vec![Value::from(ip)]
}

/// The element of an attachment's address: `10.0.0.2 comment "<owner>"`.
#[must_use]
pub fn element(ip: IpAddr, comment: &str) -> Element {
    Element::new(key(ip)).comment(comment)
}

/// The base chain's rules, in order.
fn skeleton() -> [Rule; 3] {
    [
        Rule::new().jump(NFT_ADMIN_CHAIN),
        Rule::new().jump(NFT_ISOLATION_CHAIN),
        Rule::new().jump(NFT_ATTACHMENTS_CHAIN),
    ]
}

/// The shared accepts of `attachments`, in order: the reference's two per-address rules,
/// matching the sets instead of one address.
#[must_use]
pub fn shared_accepts() -> Vec<Rule> {
    let mut rules = Vec::new();
    for (version, set) in [(NfProto::Ipv4, NFT_SET_V4), (NfProto::Ipv6, NFT_SET_V6)] {
        rules.push(
            Rule::new()
                .in_set(&[Selector::daddr(version)], set)
                .ct_state(CtStateFlags::ESTABLISHED | CtStateFlags::RELATED)
                .accept(),
        );
        rules.push(
            Rule::new()
                .in_set(&[Selector::saddr(version)], set)
                .accept(),
        );
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

/// Whether `have` is exactly `want`, in order.
fn exactly(have: Option<&Vec<ListedRule>>, want: &[Rule]) -> bool {
    have.is_some_and(|rules| {
        rules.len() == want.len()
            && rules
                .iter()
                .zip(want)
                .all(|(have, want)| have.is(want, Family::Inet))
    })
}

/// The error of the backend's ADD and CHECK: one naming nf_tables where the kernel has none.
fn named(err: FirewallError) -> FirewallError {
    match err {
        FirewallError::Nft(e) if e.is_absent() => FirewallError::NoNfTables(e),
        other => other,
    }
}

/// The outcome of a DEL or GC: where the kernel has no nf_tables (no nfnetlink, or nfnetlink
/// without nf_tables), nothing of ours can be there, so there is nothing to remove.
fn nothing_where_absent(result: Result<(), FirewallError>) -> Result<(), FirewallError> {
    match result {
        Err(FirewallError::Nft(e)) if e.is_absent() => {
            log::debug!("the kernel has no nf_tables, so it holds nothing of ours: {e}");
            Ok(())
        }
        other => other,
    }
}

/// The nftables backend.
#[derive(Debug)]
pub struct Nftables {
    /// The call's one nf_tables socket, opened in the calling thread's namespace on first use:
    /// where it cannot be opened (a kernel without nfnetlink), DEL and GC still succeed.
    nft: LazyNft,
    policy: IngressPolicy,
    state: State,
}

impl Nftables {
    /// The backend in the calling thread's namespace; `state` provides the namespace's lock.
    #[must_use]
    pub fn new(policy: IngressPolicy, state: State) -> Nftables {
        Nftables {
            nft: LazyNft::new(),
            policy,
            state,
        }
    }

    /// The configuration it works with (only the ingress policy matters to it).
    fn config(&self) -> Config {
        Config {
            backend: BackendChoice::Nftables,
            admin_chain: DEFAULT_ADMIN_CHAIN.to_owned(),
            zone: DEFAULT_ZONE.to_owned(),
            ingress: self.policy,
        }
    }

    /// The call's socket, opened now if it is not yet.
    fn nft(&mut self) -> Result<&mut Nft, NftError> {
        self.nft.get()
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
        let forward = rules_or_none(self.nft()?, &t, NFT_FORWARD_CHAIN)?;
        let accepts = rules_or_none(self.nft()?, &t, NFT_ATTACHMENTS_CHAIN)?;
        let jumps = skeleton();
        let shared = shared_accepts();
        if exactly(forward.as_ref(), &jumps) && exactly(accepts.as_ref(), &shared) {
            // The jumps reference admin and isolation, the accepts both sets, so those exist
            // too (the kernel refuses to delete what is referenced); isolation-out is declared
            // by the isolation rules that need it. Re-adding the base chain would cost a hook
            // update (~10 ms) on every call.
            return Ok(());
        }
        batch.add_table(&t);
        for set in sets() {
            // One that exists stays as it is: declared again with other flags (a table of an
            // earlier version, without `flags timeout`), the kernel would refuse it.
            if !self.nft()?.set_exists(&t, &set.name)? {
                batch.add_set(&t, &set);
            }
        }
        for chain in [
            NFT_ADMIN_CHAIN,
            NFT_ISOLATION_CHAIN,
            NFT_ISOLATION_OUT_CHAIN,
            NFT_ATTACHMENTS_CHAIN,
        ] {
            batch.add_chain(&t, &Chain::regular(chain));
        }
        batch.add_chain(&t, &base);
        // Not intact: both chains are rebuilt whole, so no rule is duplicated or out of order.
        // The sets and their elements stay.
        if forward.is_some() {
            batch.flush_chain(&t, NFT_FORWARD_CHAIN);
        }
        for rule in &jumps {
            batch.add_rule(&t, NFT_FORWARD_CHAIN, rule);
        }
        if accepts.is_some() {
            batch.flush_chain(&t, NFT_ATTACHMENTS_CHAIN);
        }
        for rule in &shared {
            batch.add_rule(&t, NFT_ATTACHMENTS_CHAIN, rule);
        }
        Ok(())
    }

    /// Adds to `batch` the bridge's isolation rules that are missing.
    fn ensure_isolation(&mut self, batch: &mut Batch, bridge: &str) -> Result<(), FirewallError> {
        let t = table();
        let stage1 = rules_or_none(self.nft()?, &t, NFT_ISOLATION_CHAIN)?.unwrap_or_default();
        // Declared only when missing: re-adding a chain that exists is an update the kernel
        // frees after an RCU grace period, which the socket's close would then wait for.
        let stage2 = match rules_or_none(self.nft()?, &t, NFT_ISOLATION_OUT_CHAIN)? {
            Some(rules) => rules,
            None => {
                batch.add_chain(&t, &Chain::regular(NFT_ISOLATION_OUT_CHAIN));
                Vec::new()
            }
        };
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

    /// The element of `ip`, or none when it, its set or the table does not exist, or a DEL
    /// expired it. Before an ADD (`settle`), such an element is waited out
    /// ([`Nft::element_settled`]: a kernel tick at most, after a DEL killed before its own
    /// wait ended).
    fn lookup(&mut self, ip: IpAddr, settle: bool) -> Result<Option<Element>, NftError> {
        let nft = self.nft()?;
        let found = if settle {
            nft.element_settled(&table(), set_of(ip), &key(ip))
        } else {
            nft.element(&table(), set_of(ip), &key(ip))
        };
        match found {
            Ok(Some(e)) if e.is_expiring() => Ok(None),
            Ok(found) => Ok(found),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every element of both sets (none when the table does not exist).
    fn list(&mut self) -> Result<Vec<Element>, NftError> {
        let mut all = Vec::new();
        for set in [NFT_SET_V4, NFT_SET_V6] {
            match self.nft()?.elements(&table(), set) {
                // Those expiring are removed already.
                Ok(elements) => all.extend(elements.into_iter().filter(|e| !e.is_expiring())),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(all)
    }

    /// Removes the elements `select` picks by comment, in one batch: they expire (a 1 ms
    /// timeout; no deletion, so the socket's close has no frees to wait for), or are deleted
    /// where the table was made without `flags timeout` (by an earlier version) or the kernel
    /// cannot update a timeout ([`Batch::expire_elements`]).
    fn remove_where(
        &mut self,
        elements: Vec<Element>,
        select: &dyn Fn(&str) -> bool,
    ) -> Result<(), FirewallError> {
        let t = table();
        let mut doomed: [Vec<Element>; 2] = [Vec::new(), Vec::new()];
        for e in elements {
            if !e.comment.as_deref().is_some_and(select) {
                continue;
            }
            match e.key.first() {
                Some(Value::Ipv4(_)) => doomed[0].push(e),
                Some(Value::Ipv6(_)) => doomed[1].push(e),
                _ => {}
            }
        }
        let mut batch = Batch::new();
        for (set, elements) in [NFT_SET_V4, NFT_SET_V6].into_iter().zip(&doomed) {
            batch.expire_elements(&t, set, elements);
        }
        if batch.is_empty() {
            return Ok(());
        }
        // Where the elements are deleted instead, the socket's close waits for the kernel to
        // free them (an RCU grace period, ~10 ms here): this is the call's last use of its one
        // socket, so what the call still does (its lock, its exit) overlaps that wait.
        self.nft()?.apply(&batch)?;
        Ok(())
    }

    /// ADD: the skeleton and isolation rules the table lacks, and the attachment's elements;
    /// the attachment recorded first (for `reconcile`; its elements' comments name it for DEL
    /// and GC).
    fn add_elements(&mut self, owner: &Attachment, target: &Target) -> Result<(), FirewallError> {
        // Look-up and change of an address's owner must not interleave with another call's.
        let _lock = self.state.lock()?;
        let name = crate::names::state_name(owner);
        let known = self.state.attachment(&name)?.is_some();
        self.state.record(
            &name,
            &AttachmentState {
                ips: target.ips.clone(),
                accepts: Vec::new(),
                made: Some(Made::new(self.name(), &self.config(), owner, target)),
            },
        )?;
        let added = self.put_elements(owner, target);
        if added.is_err()
            && !known
            && let Err(f) = self.state.forget(&name, &target.ips)
        {
            log::warn!("ADD rollback of the state of {name} failed: {f}");
        }
        added
    }

    /// What ADD commits: the skeleton and isolation rules the table lacks, and the
    /// attachment's elements, in one batch.
    fn put_elements(&mut self, owner: &Attachment, target: &Target) -> Result<(), FirewallError> {
        let t = table();
        let comment = crate::names::owner_comment(owner);
        let mut batch = Batch::new();
        self.ensure_skeleton(&mut batch)?;
        if let Some(bridge) = &target.bridge {
            self.ensure_isolation(&mut batch, bridge)?;
        }
        for ip in &target.ips {
            let set = set_of(*ip);
            match self.lookup(*ip, true)? {
                Some(e) if e.comment.as_deref() == Some(comment.as_str()) => continue,
                // The address belongs to another attachment (an IP reused before its DEL):
                // the newest owner wins, as in the iptables backend, so a late DEL of the older
                // one finds the address no longer its own and leaves it.
                Some(_) => {
                    batch.delete_elements(&t, set, &[key(*ip)]);
                }
                None => {}
            }
            batch.add_elements(&t, set, &[element(*ip, &comment)]);
        }
        self.nft()?.apply(&batch)?;
        Ok(())
    }

    /// `reconcile`'s look: the skeleton, then the elements of both sets and the isolation
    /// chains, each listed once for all of `attachments`.
    fn missing_of(&mut self, attachments: &[Recorded]) -> Result<Missing, FirewallError> {
        let t = table();
        let mut missing = Missing::default();
        if !self.nft()?.table_exists(&t)? {
            missing.shared.push(format!("table {t}"));
        } else {
            let forward = rules_or_none(self.nft()?, &t, NFT_FORWARD_CHAIN)?;
            if !exactly(forward.as_ref(), &skeleton()) {
                missing
                    .shared
                    .push(format!("chain {t} {NFT_FORWARD_CHAIN}"));
            }
            let accepts = rules_or_none(self.nft()?, &t, NFT_ATTACHMENTS_CHAIN)?;
            if !exactly(accepts.as_ref(), &shared_accepts()) {
                missing
                    .shared
                    .push(format!("chain {t} {NFT_ATTACHMENTS_CHAIN}"));
            }
        }
        let owners: HashMap<IpAddr, Option<String>> = self
            .list()?
            .into_iter()
            .filter_map(|e| {
                let ip = match e.key.first()? {
                    Value::Ipv4(a) => IpAddr::V4(*a),
                    Value::Ipv6(a) => IpAddr::V6(*a),
                    _ => return None,
                };
                Some((ip, e.comment))
            })
            .collect();
        let mut chains: HashMap<&str, Vec<ListedRule>> = HashMap::new();
        if attachments.iter().any(|a| a.target.bridge.is_some()) {
            for chain in [NFT_ISOLATION_CHAIN, NFT_ISOLATION_OUT_CHAIN] {
                let rules = rules_or_none(self.nft()?, &t, chain)?.unwrap_or_default();
                chains.insert(chain, rules);
            }
        }
        for (i, a) in attachments.iter().enumerate() {
            let comment = crate::names::owner_comment(&a.owner);
            let mut what = Vec::new();
            for ip in &a.target.ips {
                match owners.get(ip) {
                    None => what.push(format!("element {ip}")),
                    Some(Some(c)) if *c == comment => {}
                    // Another attachment's now (an address reused): not this one's to put back.
                    Some(other) => log::info!(
                        "{ip} of {comment} is {}'s in {t}",
                        other.as_deref().unwrap_or("no one")
                    ),
                }
            }
            if let Some(bridge) = &a.target.bridge {
                let complete = isolation_rules(bridge, self.policy)
                    .iter()
                    .all(|(c, _, r)| {
                        chains
                            .get(c)
                            .is_some_and(|rules| rules.iter().any(|have| have.is(r, Family::Inet)))
                    });
                if !complete {
                    what.push(format!("isolation of {bridge}"));
                }
            }
            if !what.is_empty() {
                missing.attachments.push((i, what));
            }
        }
        Ok(missing)
    }

    /// `reconcile`'s repair, in one batch: the skeleton, the isolation rules and the elements
    /// that `missing` found missing (each looked up again, and any a DEL left expiring waited
    /// out, as ADD does).
    fn restore_elements(
        &mut self,
        attachments: &[Recorded],
        missing: &Missing,
    ) -> Result<Restored, FirewallError> {
        let t = table();
        let mut batch = Batch::new();
        self.ensure_skeleton(&mut batch)?;
        let mut bridges: Vec<&str> = Vec::new();
        let mut restored = Vec::new();
        for (i, _) in &missing.attachments {
            let Some(a) = attachments.get(*i) else {
                continue;
            };
            if let Some(bridge) = a.target.bridge.as_deref()
                && !bridges.contains(&bridge)
            {
                self.ensure_isolation(&mut batch, bridge)?;
                bridges.push(bridge);
            }
            let comment = crate::names::owner_comment(&a.owner);
            for ip in &a.target.ips {
                if self.lookup(*ip, true)?.is_none() {
                    batch.add_elements(&t, set_of(*ip), &[element(*ip, &comment)]);
                }
            }
            restored.push((*i, None));
        }
        self.nft()?.apply(&batch)?;
        Ok(restored)
    }

    /// CHECK: the skeleton, the attachment's elements and its bridge's isolation rules.
    fn check_elements(&mut self, owner: &Attachment, target: &Target) -> Result<(), FirewallError> {
        let t = table();
        let missing = |what: String| FirewallError::Missing {
            msg: format!("expected {what} not found"),
            details: format!("nft list table {t}"),
        };
        let base = rules_or_none(self.nft()?, &t, NFT_FORWARD_CHAIN)?
            .ok_or_else(|| missing(format!("chain {t} {NFT_FORWARD_CHAIN}")))?;
        for rule in skeleton() {
            if !base.iter().any(|r| r.is(&rule, Family::Inet)) {
                return Err(missing(format!(
                    "rule {t} {NFT_FORWARD_CHAIN} {}",
                    rule.to_nft()
                )));
            }
        }
        if !self.nft()?.chain_exists(&t, NFT_ADMIN_CHAIN)? {
            return Err(missing(format!("chain {t} {NFT_ADMIN_CHAIN}")));
        }
        let accepts = rules_or_none(self.nft()?, &t, NFT_ATTACHMENTS_CHAIN)?
            .ok_or_else(|| missing(format!("chain {t} {NFT_ATTACHMENTS_CHAIN}")))?;
        for rule in shared_accepts() {
            if !accepts.iter().any(|r| r.is(&rule, Family::Inet)) {
                return Err(missing(format!(
                    "rule {t} {NFT_ATTACHMENTS_CHAIN} {}",
                    rule.to_nft()
                )));
            }
        }
        let comment = crate::names::owner_comment(owner);
        for ip in &target.ips {
            let found = self.lookup(*ip, false)?;
            if found.and_then(|e| e.comment).as_deref() != Some(comment.as_str()) {
                return Err(missing(format!(
                    "element {t} {} {{ {ip} comment {comment:?} }}",
                    set_of(*ip)
                )));
            }
        }
        if let Some(bridge) = &target.bridge {
            for (chain, _, rule) in isolation_rules(bridge, self.policy) {
                let rules = rules_or_none(self.nft()?, &t, chain)?.unwrap_or_default();
                if !rules.iter().any(|r| r.is(&rule, Family::Inet)) {
                    return Err(missing(format!("rule {t} {chain} {}", rule.to_nft())));
                }
            }
        }
        Ok(())
    }

    /// DEL: the attachment's elements, looked up by prevResult's addresses or listed.
    fn del_elements(
        &mut self,
        owner: &Attachment,
        target: Option<&Target>,
    ) -> Result<(), FirewallError> {
        let _lock = self.state.lock_for_teardown()?;
        let comment = crate::names::owner_comment(owner);
        let name = crate::names::state_name(owner);
        // The addresses of prevResult and of the record (none in an earlier version's table).
        let ips = self.state.to_remove(&name, target)?.ips;
        let elements = if ips.is_empty() {
            // Find this attachment's elements by their owner comment.
            self.list()?
        } else {
            // Look up only those.
            let mut found = Vec::new();
            for ip in &ips {
                found.extend(self.lookup(*ip, false)?);
            }
            found
        };
        self.remove_where(elements, &|c| c == comment)?;
        self.state.forget(&name, &ips)
    }

    /// GC: the elements of `network` whose attachment is not in `valid`.
    fn gc_elements(&mut self, network: &str, valid: &[GcAttachment]) -> Result<(), FirewallError> {
        let _lock = self.state.lock_for_teardown()?;
        let live: Vec<String> = valid
            .iter()
            .map(|a| {
                crate::names::owner_comment(&Attachment::new(network, &a.container_id, &a.ifname))
            })
            .collect();
        let elements = self.list()?;
        self.remove_where(elements, &|c| {
            crate::names::owned_by_network(c, network) && !live.iter().any(|l| l == c)
        })?;
        for name in self.state.attachments_of(network)? {
            let valid = valid.iter().any(|a| {
                crate::names::state_name(&Attachment::new(network, &a.container_id, &a.ifname))
                    == name
            });
            if !valid {
                let ips = self.state.to_remove(&name, None)?.ips;
                self.state.forget(&name, &ips)?;
            }
        }
        Ok(())
    }
}

impl FirewallBackend for Nftables {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn add(&mut self, owner: &Attachment, target: &Target) -> Result<(), FirewallError> {
        self.add_elements(owner, target).map_err(named)
    }

    fn check(&mut self, owner: &Attachment, target: &Target) -> Result<(), FirewallError> {
        self.check_elements(owner, target).map_err(named)
    }

    fn del(&mut self, owner: &Attachment, target: Option<&Target>) -> Result<(), FirewallError> {
        nothing_where_absent(self.del_elements(owner, target))
    }

    fn gc(&mut self, network: &str, valid: &[GcAttachment]) -> Result<(), FirewallError> {
        nothing_where_absent(self.gc_elements(network, valid))
    }

    fn missing(&mut self, attachments: &[Recorded]) -> Result<Missing, FirewallError> {
        self.missing_of(attachments).map_err(named)
    }

    fn restore(
        &mut self,
        attachments: &[Recorded],
        missing: &Missing,
    ) -> Result<Restored, FirewallError> {
        self.restore_elements(attachments, missing).map_err(named)
    }

    fn status(&mut self) -> Result<(), FirewallError> {
        self.nft()
            .and_then(|nft| nft.table_exists(&table()))
            .map(|_| ())
            .map_err(|e| FirewallError::Unavailable {
                backend: "nftables",
                reason: if e.is_absent() {
                    format!("the kernel has no nf_tables ({e})")
                } else {
                    e.to_string()
                },
            })
    }
}
