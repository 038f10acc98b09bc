//! The nftables backend: one long-lived table per family, map elements per attachment.
//!
//! ```text
//! table ip cni_portmap {
//!   map hostip_ports       { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service }
//!   map ports              { type inet_proto . inet_service : ipv4_addr . inet_service }
//!   map gated_hostip_ports { type ipv4_addr . inet_proto . inet_service : verdict }
//!   map gated_ports        { type inet_proto . inet_service : verdict }
//!   set hairpin   { type ipv4_addr . ipv4_addr }
//!   set localhost { type ipv4_addr }
//!   set masq_all  { type ipv4_addr }
//!   chain prerouting  { type nat hook prerouting priority dstnat;  fib daddr type local jump hostports }
//!   chain output      { type nat hook output priority dstnat;      fib daddr type local jump hostports }
//!   chain hostports {
//!     ip daddr . meta l4proto . th dport vmap @gated_hostip_ports
//!     dnat ip to ip daddr . meta l4proto . th dport map @hostip_ports
//!     meta l4proto . th dport vmap @gated_ports
//!     dnat ip to meta l4proto . th dport map @ports
//!   }
//!   chain postrouting { type nat hook postrouting priority srcnat;
//!     ip saddr . ip daddr @hairpin masquerade
//!     ip saddr 127.0.0.1 ip daddr @localhost masquerade
//!     ct status dnat ip daddr @masq_all masquerade
//!   }
//!   chain gate_<hash> { <conditions> tcp dport 8080 dnat ip to 10.0.0.2:80 comment "owner" }
//! }
//! ```
//!
//! The skeleton is created once (under a lock, so two first ADDs do not both add its rules)
//! and never flushed. ADD and DEL look up and change only their own keys: what to change is
//! planned from what those lookups find ([`layout::nft_add`], [`layout::nft_del`]).

pub mod layout;
mod reconcile;

pub use reconcile::NftLacking;

use std::net::{IpAddr, Ipv4Addr};

use cni::conf::GcAttachment as Valid;
use ipnet::IpNet;
use netfilter::nft::{
    Batch, Chain, ChainHook, ChainType, CtStatusFlags, DataType, Element, ElementData, Feature,
    LazyNft, Nft, NftError, Rule, Selector, Set, Table, Value, Verdict, priority,
};

use cni::Attachment;
use netfilter::iptables::writer::{WriteError, Writer};

use super::{Add, PortmapBackend, Unrecorded};
use crate::config::{Backend, Config, IpFamily, PortMapping};
use crate::error::{PortmapError, write_error};
use crate::names;
use crate::ports::{self, Fate, Records};
use crate::state::{self, State};
use layout::{NftOp, NftPlan, Observed};

/// An nf_tables failure as the plugin's error; where the kernel has no nf_tables at all
/// (no nfnetlink, or nfnetlink without nf_tables), saying so: the ADD's message names it, and
/// DEL and GC take it for nothing of ours being there ([`nothing_where_absent`]).
fn nft_err(e: NftError) -> PortmapError {
    if e.is_absent() {
        PortmapError::NftUnusable(format!("the kernel has no nf_tables ({e})"))
    } else {
        PortmapError::Nft(e)
    }
}

/// Our table of `family`.
pub fn table(family: IpFamily) -> Table {
    Table::new(family.into(), names::NFT_TABLE)
}

/// The skeleton of one family's table: declared on the first ADD of a boot only.
pub fn skeleton(batch: &mut Batch, family: IpFamily) {
    let t = table(family);
    batch.add_table(&t);
    for set in skeleton_sets(family) {
        batch.add_set(&t, &set);
    }
    for chain in skeleton_chains() {
        batch.add_chain(&t, &chain);
    }
    for (chain, rule) in skeleton_rules(family) {
        batch.add_rule(&t, chain, &rule);
    }
}

/// The maps and sets of the skeleton of `family`.
fn skeleton_sets(family: IpFamily) -> Vec<Set> {
    use DataType::{InetProto, InetService};
    let addr = DataType::from(family);
    let mut sets = vec![
        Set::map(
            names::MAP_HOSTIP_PORTS,
            &[addr, InetProto, InetService],
            &[addr, InetService],
        )
        .with_timeout(),
        Set::map(
            names::MAP_PORTS,
            &[InetProto, InetService],
            &[addr, InetService],
        )
        .with_timeout(),
        Set::verdict_map(names::MAP_HOSTIP_GATED, &[addr, InetProto, InetService]).with_timeout(),
        Set::verdict_map(names::MAP_GATED, &[InetProto, InetService]).with_timeout(),
        Set::new(names::SET_HAIRPIN, &[addr, addr]).with_timeout(),
        Set::new(names::SET_MASQ_ALL, &[addr]).with_timeout(),
    ];
    if family == IpFamily::V4 {
        sets.push(Set::new(names::SET_LOCALHOST, &[addr]).with_timeout());
    }
    sets
}

/// The chains of the skeleton.
fn skeleton_chains() -> Vec<Chain> {
    vec![
        Chain::regular(names::CHAIN_HOSTPORTS),
        Chain::base(
            names::CHAIN_PREROUTING,
            ChainType::Nat,
            ChainHook::Prerouting,
            priority::DSTNAT,
        ),
        Chain::base(
            names::CHAIN_OUTPUT,
            ChainType::Nat,
            ChainHook::Output,
            priority::DSTNAT,
        ),
        Chain::base(
            names::CHAIN_POSTROUTING,
            ChainType::Nat,
            ChainHook::Postrouting,
            priority::SRCNAT,
        ),
    ]
}

/// The rules of the skeleton of `family`, chain by chain in order.
fn skeleton_rules(family: IpFamily) -> Vec<(&'static str, Rule)> {
    use Selector::{MetaL4proto, ThDport};
    let v = family.into();
    let (saddr, daddr) = (Selector::saddr(v), Selector::daddr(v));
    let mut rules = Vec::new();
    for chain in [names::CHAIN_PREROUTING, names::CHAIN_OUTPUT] {
        rules.push((
            chain,
            Rule::new().fib_daddr_local().jump(names::CHAIN_HOSTPORTS),
        ));
    }
    rules.extend([
        (
            names::CHAIN_HOSTPORTS,
            Rule::new().vmap(&[daddr, MetaL4proto, ThDport], names::MAP_HOSTIP_GATED),
        ),
        (
            names::CHAIN_HOSTPORTS,
            Rule::new().dnat_map(v, &[daddr, MetaL4proto, ThDport], names::MAP_HOSTIP_PORTS),
        ),
        (
            names::CHAIN_HOSTPORTS,
            Rule::new().vmap(&[MetaL4proto, ThDport], names::MAP_GATED),
        ),
        (
            names::CHAIN_HOSTPORTS,
            Rule::new().dnat_map(v, &[MetaL4proto, ThDport], names::MAP_PORTS),
        ),
        (
            names::CHAIN_POSTROUTING,
            Rule::new()
                .in_set(&[saddr, daddr], names::SET_HAIRPIN)
                .masquerade(),
        ),
    ]);
    if family == IpFamily::V4 {
        rules.push((
            names::CHAIN_POSTROUTING,
            Rule::new()
                .saddr(IpAddr::V4(Ipv4Addr::LOCALHOST))
                .in_set(&[daddr], names::SET_LOCALHOST)
                .masquerade(),
        ));
    }
    rules.push((
        names::CHAIN_POSTROUTING,
        Rule::new()
            .ct_status(CtStatusFlags::DNAT)
            .in_set(&[daddr], names::SET_MASQ_ALL)
            .masquerade(),
    ));
    rules
}

/// The plans of an attachment for each of its container addresses.
fn plans(
    config: &Config,
    att: &Attachment,
    ips: &[IpNet],
) -> Result<Vec<(IpFamily, NftPlan)>, PortmapError> {
    ips.iter()
        .map(|ip| Ok((IpFamily::of(ip.addr()), layout::nft_plan(config, att, *ip)?)))
        .filter(|p| p.as_ref().map_or(true, |(_, p)| !p.claims.is_empty()))
        .collect()
}

/// The plans of what `record` says its ADD made.
fn plans_of(record: &State) -> Result<Vec<(IpFamily, NftPlan)>, PortmapError> {
    plans(&record.config(), &record.attachment(), &record.ips)
}

/// The batch making `ops`. Removals are expiries where [`layout::removal_expires`] allows
/// (and the set has `flags timeout`: [`Batch::expire_elements`] deletes otherwise).
fn batch(ops: &[NftOp]) -> Batch {
    let mut batch = Batch::new();
    add_ops(&mut batch, ops);
    batch
}

/// Adds `ops` to `batch` ([`batch`]).
fn add_ops(batch: &mut Batch, ops: &[NftOp]) {
    for op in ops {
        match op {
            NftOp::DelElement {
                family,
                set,
                element,
            } => {
                let t = table(*family);
                if layout::removal_expires(ops, *family, set, element) {
                    batch.expire_elements(&t, set, std::slice::from_ref(element));
                } else {
                    batch.delete_elements(&t, set, std::slice::from_ref(&element.key));
                }
            }
            NftOp::DelChain { family, chain } => {
                batch
                    .flush_chain(&table(*family), chain)
                    .delete_chain(&table(*family), chain);
            }
            NftOp::PutChain {
                family,
                chain,
                rules,
            } => {
                let t = table(*family);
                batch
                    .add_chain(&t, &Chain::regular(chain))
                    .flush_chain(&t, chain);
                for rule in rules {
                    batch.add_rule(&t, chain, rule);
                }
            }
            NftOp::AddElement {
                family,
                set,
                element,
            } => {
                batch.add_elements(&table(*family), set, std::slice::from_ref(element));
            }
        }
    }
}

/// What nf_tables offers our map layout here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftSupport {
    /// Every expression and chain type the layout uses.
    Usable,
    /// nf_tables without some of them: what it lacks (`expression "fib"`).
    Lacks(String),
    /// No nf_tables at all (or not for us): why.
    Absent(String),
}

impl NftSupport {
    /// Why the layout cannot work here, if it cannot.
    pub fn unusable(&self) -> Option<String> {
        match self {
            NftSupport::Usable => None,
            NftSupport::Lacks(what) => Some(format!("the kernel has no nf_tables {what}")),
            NftSupport::Absent(why) => Some(format!("the kernel has no nf_tables ({why})")),
        }
    }
}

/// The nf_tables features our map layout needs (the skeleton's expressions and chain type).
const NFT_FEATURES: [Feature; 5] = [
    Feature::NatChain,
    Feature::Fib,
    Feature::Nat,
    Feature::Masquerade,
    Feature::Ct,
];

/// What nf_tables offers our map layout here, asked on the call's socket: where our table
/// exists, the kernel had every feature when it was made (one lookup); otherwise the kernel
/// checks a batch that uses each feature and is never committed ([`Nft::missing_features`],
/// an RCU grace period, 5–20 ms): the rare path of the first ADD on a node that auto sends
/// to nftables, and of STATUS.
pub fn nft_support(nft: &mut LazyNft) -> NftSupport {
    let nft = match nft.get() {
        Ok(nft) => nft,
        Err(e) => return NftSupport::Absent(e.to_string()),
    };
    match nft.table_exists(&table(IpFamily::V4)) {
        Ok(true) => return NftSupport::Usable,
        Ok(false) => {}
        Err(e) => return NftSupport::Absent(e.to_string()),
    }
    match nft.missing_features(netfilter::nft::Family::Ip, &NFT_FEATURES) {
        Ok(missing) if missing.is_empty() => NftSupport::Usable,
        Ok(missing) => {
            let what: Vec<String> = missing.iter().map(|f| f.describe()).collect();
            NftSupport::Lacks(what.join(", "))
        }
        Err(e) => NftSupport::Absent(e.to_string()),
    }
}

/// Every map and set of our tables, for the listing paths (DEL without state, GC).
const ALL_SETS: [&str; 7] = [
    names::MAP_HOSTIP_PORTS,
    names::MAP_PORTS,
    names::MAP_HOSTIP_GATED,
    names::MAP_GATED,
    names::SET_HAIRPIN,
    names::SET_LOCALHOST,
    names::SET_MASQ_ALL,
];

/// Our map layout, over the call's nf_tables socket.
#[derive(Debug)]
pub struct Nftables {
    nft: LazyNft,
}

impl Nftables {
    /// The backend, owning the call's socket.
    pub fn new(nft: LazyNft) -> Nftables {
        Nftables { nft }
    }

    fn nft(&mut self) -> Result<&mut Nft, PortmapError> {
        self.nft.get().map_err(nft_err)
    }

    /// What the kernel holds at the keys and gate chains of `plans`; a table, map or chain
    /// that does not exist holds nothing, nor does a key whose element a DEL expired. Before
    /// an ADD (`settle`), such an element is waited out ([`Nft::element_settled`]: a kernel
    /// tick at most, after a DEL killed before its own wait ended).
    fn observe(
        &mut self,
        plans: &[(IpFamily, NftPlan)],
        settle: bool,
    ) -> Result<Observed, PortmapError> {
        let nft = self.nft()?;
        let mut seen = Observed::default();
        for (family, p) in plans {
            let t = table(*family);
            for (set, key) in layout::lookups(p) {
                if seen.element(*family, set, key).is_some() {
                    continue;
                }
                let found = if settle {
                    nft.element_settled(&t, set, key)
                } else {
                    nft.element(&t, set, key)
                };
                match found {
                    Ok(Some(e)) if e.is_expiring() => {}
                    Ok(Some(e)) => seen.elements.push((*family, set, e)),
                    Ok(None) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(nft_err(e)),
                }
            }
            if let Some((chain, _)) = &p.gate {
                match nft.chain_exists(&t, chain) {
                    Ok(true) => seen.chains.push((*family, chain.clone())),
                    Ok(false) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(nft_err(e)),
                }
            }
        }
        Ok(seen)
    }

    fn commit(&mut self, ops: &[NftOp]) -> Result<(), PortmapError> {
        self.nft()?.apply(&batch(ops)).map_err(nft_err)
    }

    /// Declares the skeleton of the families that lack it, under our lock so that two first
    /// ADDs racing do not both append the shared rules.
    /// The write of an ADD: refuses a host port another owner holds in our maps or in the
    /// iptables layout, takes over those whose namespace is gone, and commits. Returns the
    /// records taken over.
    fn write(
        &mut self,
        store: &host::store::StateStore,
        att: &Attachment,
        config: &Config,
        ips: &[IpNet],
    ) -> Result<Vec<State>, PortmapError> {
        let records = Records::new(store);
        let plans = plans(config, att, ips)?;
        if plans.is_empty() {
            return Ok(Vec::new());
        }
        let families: Vec<IpFamily> = plans.iter().map(|(f, _)| *f).collect();
        self.ensure_skeletons(&families)?;
        let owner = names::owner(att);
        let mut seen = self.observe(&plans, true)?;
        // Holders whose namespace is gone give their ports up: all their objects go.
        let mut taken: Vec<State> = Vec::new();
        let mut gone = Vec::new();
        for holder in layout::foreign_owners(&owner, &plans, &seen) {
            let Fate::Gone(gone_records) = records.by_owner(&holder) else {
                continue;
            };
            for record in gone_records
                .into_iter()
                .filter(|r| r.backend == Backend::Nftables)
            {
                let their = plans_of(&record)?;
                let their_seen = self.observe(&their, true)?;
                seen.elements.extend(their_seen.elements);
                seen.chains.extend(their_seen.chains);
                gone.push((names::owner(&record.attachment()), their));
                taken.push(record);
            }
        }
        let ops = layout::nft_add(&owner, &plans, &seen, &gone)?;
        // Nor may the reference's layout hold one of the ports: our iptables ADDs index them.
        for family in families {
            let mut writer = Writer::choose(&mut self.nft, names::IPT_NAT, &[family.into()], &[]);
            // Where the table cannot be read, the holder's record alone tells.
            let exists = |chain: &str| match writer.chain_exists(family.into(), chain) {
                Ok(exists) => Ok(exists),
                Err(WriteError::Tools(e)) => {
                    log::debug!("taking the record for the chain: {e}");
                    Ok(true)
                }
                Err(e) => Err(write_error(e)),
            };
            let found = ports::indexed_holders(&records, att, config, family, exists)?;
            if let Some((holder, m)) = found.first() {
                return Err(ports::chain_refusal(
                    m,
                    &holder.network,
                    &holder.container_id,
                ));
            }
        }
        self.commit(&ops)?;
        Ok(taken)
    }

    fn ensure_skeletons(&mut self, families: &[IpFamily]) -> Result<(), PortmapError> {
        let nft = self.nft()?;
        let mut missing = Vec::new();
        for f in families {
            if !nft.table_exists(&table(*f)).map_err(nft_err)? {
                missing.push(*f);
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let _lock = host::lock::FileLock::acquire(
            std::path::Path::new(names::STATE_DIR).join("nft-skeleton.lock"),
            host::lock::DEFAULT_WAIT,
        )?;
        let mut batch = Batch::new();
        for f in missing {
            if !nft.table_exists(&table(f)).map_err(nft_err)? {
                skeleton(&mut batch, f);
            }
        }
        nft.apply(&batch).map_err(nft_err)
    }

    /// Verifies that every rule of the skeleton is in its chain: without them the
    /// attachment's elements forward nothing.
    fn check_skeleton(&mut self, family: IpFamily) -> Result<(), PortmapError> {
        let nft = self.nft()?;
        let t = table(family);
        let mut listed: Vec<(&str, Vec<netfilter::nft::ListedRule>)> = Vec::new();
        for (chain, rule) in skeleton_rules(family) {
            if !listed.iter().any(|(c, _)| *c == chain) {
                let rules = nft
                    .rules(&t, chain)
                    .map_err(|e| missing_chain(&t, chain, e))?;
                listed.push((chain, rules));
            }
            let have = listed
                .iter()
                .find(|(c, _)| *c == chain)
                .map(|(_, r)| r.as_slice())
                .unwrap_or_default();
            if !have.iter().any(|r| r.is(&rule, t.family)) {
                return Err(PortmapError::Check(format!(
                    "rule {t} {chain} {} not found",
                    rule.to_nft()
                )));
            }
        }
        Ok(())
    }

    /// Removes the attachment's elements at the keys of `mappings`, without its record: the
    /// DNAT elements are looked up at their keys (which do not depend on the container
    /// address), and an element of ours there gives the container address, and so the keys of
    /// its masquerade elements (hairpin, localhost and `masqAll` alike: only the owner's are
    /// removed). One lookup per key, whatever the size of the maps. `Ok(false)` when an
    /// element of ours leads to a gate chain: its address is in the chain's rules, and the
    /// caller lists instead.
    fn del_at_keys(
        &mut self,
        att: &Attachment,
        mappings: &[PortMapping],
    ) -> Result<bool, PortmapError> {
        let owner = names::owner(att);
        let config = Config::for_removal(&att.network, mappings, false);
        let masq_all = Config::for_removal(&att.network, mappings, true);
        let mut plans = Vec::new();
        for family in IpFamily::BOTH {
            let anywhere = match family {
                IpFamily::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpFamily::V6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            };
            // A DEL's mappings that the ADD would have refused hold nothing of ours.
            let Ok(probe) = layout::nft_plan(&config, att, IpNet::from(anywhere)) else {
                continue;
            };
            if probe.claims.is_empty() {
                continue;
            }
            let seen = self.observe(&[(family, probe.clone())], false)?;
            let ours = probe.claims.iter().find_map(|c| {
                [c.map, c.twin].into_iter().find_map(|map| {
                    seen.element(family, map, &c.element.key)
                        .filter(|e| e.comment.as_deref() == Some(owner.as_str()))
                })
            });
            let Some(element) = ours else { continue };
            let Some(addr) = container_addr(element) else {
                return Ok(false);
            };
            let ip = IpNet::from(addr);
            let mut full = layout::nft_plan(&config, att, ip)?;
            for masq in layout::nft_plan(&masq_all, att, ip)?.masq {
                if !full.masq.contains(&masq) {
                    full.masq.push(masq);
                }
            }
            plans.push((family, full));
        }
        let seen = self.observe(&plans, false)?;
        self.commit(&layout::nft_del(&owner, &plans, &seen))?;
        Ok(true)
    }

    /// Removes every element (and gate chain) whose owner `doomed` accepts, by listing our
    /// tables: the rare path of a DEL without state, and GC.
    ///
    /// # Errors
    /// nftables failures other than "not found".
    pub fn del_listed(&mut self, doomed: &dyn Fn(&str) -> bool) -> Result<usize, PortmapError> {
        let nft = self.nft()?;
        let mut batch = Batch::new();
        let mut chains = Vec::new();
        for family in IpFamily::BOTH {
            let t = table(family);
            if !nft.table_exists(&t).map_err(nft_err)? {
                continue;
            }
            for set in ALL_SETS {
                let elements = match nft.elements(&t, set) {
                    Ok(e) => e,
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(nft_err(e)),
                };
                // Elements expiring are removed already.
                let doomed: Vec<Element> = elements
                    .into_iter()
                    .filter(|e| !e.is_expiring() && e.comment.as_deref().is_some_and(doomed))
                    .collect();
                let (to_chains, expired): (Vec<Element>, Vec<Element>) =
                    doomed.into_iter().partition(layout::jumps_to_chain);
                for e in &to_chains {
                    if let Some(ElementData::Verdict(Verdict::Goto(c))) = &e.data
                        && !chains.contains(&(family, c.clone()))
                    {
                        chains.push((family, c.clone()));
                    }
                }
                // What jumps to a chain is deleted with the chain; the rest expires.
                let keys: Vec<Vec<Value>> = to_chains.into_iter().map(|e| e.key).collect();
                batch
                    .delete_elements(&t, set, &keys)
                    .expire_elements(&t, set, &expired);
            }
        }
        for (family, chain) in &chains {
            batch
                .flush_chain(&table(*family), chain)
                .delete_chain(&table(*family), chain);
        }
        let n = batch.len();
        nft.apply(&batch).map_err(nft_err)?;
        Ok(n)
    }
}

/// The container address of an element of ours: the address of its DNAT data.
fn container_addr(element: &Element) -> Option<IpAddr> {
    match &element.data {
        Some(ElementData::Values(values)) => match values.first()? {
            Value::Ipv4(a) => Some(IpAddr::V4(*a)),
            Value::Ipv6(a) => Some(IpAddr::V6(*a)),
            _ => None,
        },
        _ => None,
    }
}

/// A removal's outcome where nf_tables is absent or refuses what our objects are made of:
/// then nothing of ours can be there.
fn nothing_where_absent(result: Result<(), PortmapError>) -> Result<(), PortmapError> {
    match result {
        Err(PortmapError::Nft(e)) if e.is_unsupported() => {
            log::debug!("nf_tables refuses us, so it holds nothing of ours: {e}");
            Ok(())
        }
        Err(PortmapError::NftUnusable(why)) => {
            log::debug!("{why}: nothing of ours can be there");
            Ok(())
        }
        other => other,
    }
}

/// A chain CHECK needs that cannot be listed: "not found" names it.
fn missing_chain(t: &Table, chain: &str, e: NftError) -> PortmapError {
    if e.is_not_found() {
        PortmapError::Check(format!("chain {t} {chain} not found"))
    } else {
        nft_err(e)
    }
}

impl PortmapBackend for Nftables {
    fn kind(&self) -> Backend {
        Backend::Nftables
    }

    /// Writes the record first (our map layout is found by its record before it is made; its
    /// owner comments tell the rest), then the attachment's elements for each container
    /// address, in one transaction for both families with the removal of the attachments it
    /// takes ports over from; a failure after it removes them again.
    fn add(&mut self, add: Add<'_>) -> Result<(), PortmapError> {
        let Add {
            store,
            att,
            config,
            ips,
            record,
            ..
        } = add;
        let file = state::file(att);
        state::write(store, &file, record)?;
        // Whether the kernel objects were made, and must be removed when what follows fails.
        let mut made = false;
        let result = self
            .write(store, att, config, ips)
            .inspect(|_| made = true)
            .and_then(|taken| {
                (add.then)()?;
                ports::forget_taken(store, &taken);
                Ok(())
            });
        if let Err(e) = result {
            if made && let Err(e) = self.del(record) {
                log::warn!("rollback after a failed ADD failed: {e}");
            }
            super::forget(store, att);
            return Err(e);
        }
        super::forget_earlier(store, &add.earlier.file, &file);
        Ok(())
    }

    fn check(
        &mut self,
        att: &Attachment,
        config: &Config,
        ips: &[IpNet],
        _record: Option<&State>,
    ) -> Result<(), PortmapError> {
        let owner = names::owner(att);
        for ip in ips {
            let family = IpFamily::of(ip.addr());
            let p = layout::nft_plan(config, att, *ip)?;
            if p.claims.is_empty() {
                continue;
            }
            let t = table(family);
            if !self.nft()?.table_exists(&t).map_err(nft_err)? {
                return Err(PortmapError::Check(format!("table {t} not found")));
            }
            self.check_skeleton(family)?;
            let nft = self.nft()?;
            for claim in &p.claims {
                let have = nft
                    .element(&t, claim.map, &claim.element.key)
                    .map_err(nft_err)?
                    .filter(|e| !e.is_expiring());
                match have {
                    Some(e) if e == claim.element => {}
                    Some(e) => {
                        return Err(PortmapError::Check(format!(
                            "host port {} in {t} {} is {:?} owned by {:?}, expected {:?} owned by {owner:?}",
                            claim.what, claim.map, e.data, e.comment, claim.element.data
                        )));
                    }
                    None => {
                        return Err(PortmapError::Check(format!(
                            "host port {} not found in {t} {}",
                            claim.what, claim.map
                        )));
                    }
                }
            }
            for (set, element) in &p.masq {
                let have = nft
                    .element(&t, set, &element.key)
                    .map_err(nft_err)?
                    .filter(|e| !e.is_expiring());
                if have.as_ref().and_then(|e| e.comment.as_deref()) != Some(owner.as_str()) {
                    return Err(PortmapError::Check(format!(
                        "masquerade element for {} not found in {t} {set}",
                        ip.addr()
                    )));
                }
            }
            if let Some((chain, rules)) = &p.gate {
                let have = nft
                    .rules(&t, chain)
                    .map_err(|e| missing_chain(&t, chain, e))?;
                if have.len() != rules.len()
                    || !have.iter().zip(rules).all(|(h, r)| h.is(r, t.family))
                {
                    return Err(PortmapError::Check(format!(
                        "rules of chain {t} {chain} differ from the configured conditions"
                    )));
                }
            }
        }
        Ok(())
    }

    fn del(&mut self, record: &State) -> Result<(), PortmapError> {
        let plans = plans_of(record)?;
        let removed = self.observe(&plans, false).and_then(|seen| {
            let ops = layout::nft_del(&names::owner(&record.attachment()), &plans, &seen);
            self.commit(&ops)
        });
        nothing_where_absent(removed)
    }

    /// At the DEL's keys, looked up (the list of every map only for a record that did not
    /// parse, or where an element found leads to a gate chain, whose container address no
    /// key tells).
    fn del_unrecorded(
        &mut self,
        att: &Attachment,
        found: Unrecorded<'_>,
    ) -> Result<(), PortmapError> {
        let owner = names::owner(att);
        let removed = match found {
            Unrecorded::Nowhere => Ok(()),
            Unrecorded::Keys(mappings) => match self.del_at_keys(att, mappings) {
                Ok(true) => Ok(()),
                Ok(false) => self.del_listed(&|c| c == owner).map(|_| ()),
                Err(e) => Err(e),
            },
            Unrecorded::Listing => self.del_listed(&|c| c == owner).map(|_| ()),
        };
        nothing_where_absent(removed)
    }

    fn gc(&mut self, network: &str, valid: &[Valid]) -> Result<(), PortmapError> {
        let doomed = |comment: &str| {
            names::parse_owner(comment).is_some_and(|(net, id, ifname)| {
                net == network
                    && !valid
                        .iter()
                        .any(|a| a.container_id == id && a.ifname == ifname)
            })
        };
        nothing_where_absent(self.del_listed(&doomed).map(|_| ()))
    }

    /// nf_tables has what the layout needs ([`nft_support`]).
    fn status(&mut self) -> Result<(), PortmapError> {
        match nft_support(&mut self.nft).unusable() {
            None => Ok(()),
            Some(why) => Err(PortmapError::NftUnusable(why)),
        }
    }

    fn into_socket(self: Box<Self>) -> LazyNft {
        self.nft
    }
}
