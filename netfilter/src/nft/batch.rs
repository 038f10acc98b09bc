//! Atomic batches: every change of one plugin call in one nfnetlink transaction.

use netlink_packet_core::{
    DefaultNla, Emitable, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_ECHO, Nla,
};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, Hook, HookNumber, InetHookNumber, ListAttribute,
    NfTablesMessage, RuleAttribute, RuleMessage, SetAttribute, SetElementAttribute, SetElementList,
    SetElementMessage, SetFlags, SetMessage, TableAttribute, TableFlags, TableMessage,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

use super::expr::Verdict;
use super::raw::RawMsg;
use super::rule::{COMMENT_MAX, Rule};
use super::set::{DataType, Element, ElementData, NFT_DATA_VERDICT, Set, SetData, Value};
use super::{Family, Table, userdata};

/// The kind of a base chain (`type filter|nat|route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainType {
    /// `type filter`.
    Filter,
    /// `type nat`.
    Nat,
    /// `type route`.
    Route,
}

impl ChainType {
    fn name(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
            ChainType::Route => "route",
        }
    }
}

/// A netfilter hook of the `ip`, `ip6` and `inet` families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainHook {
    /// `hook prerouting`.
    Prerouting,
    /// `hook input`.
    Input,
    /// `hook forward`.
    Forward,
    /// `hook output`.
    Output,
    /// `hook postrouting`.
    Postrouting,
}

impl ChainHook {
    fn number(self) -> InetHookNumber {
        match self {
            ChainHook::Prerouting => InetHookNumber::PreRouting,
            ChainHook::Input => InetHookNumber::LocalIn,
            ChainHook::Forward => InetHookNumber::Forward,
            ChainHook::Output => InetHookNumber::LocalOut,
            ChainHook::Postrouting => InetHookNumber::PostRouting,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ChainHook::Prerouting => "prerouting",
            ChainHook::Input => "input",
            ChainHook::Forward => "forward",
            ChainHook::Output => "output",
            ChainHook::Postrouting => "postrouting",
        }
    }
}

/// Well-known base chain priorities (`priority dstnat` …).
pub mod priority {
    /// `priority dstnat` (-100): destination NAT in prerouting and output.
    pub const DSTNAT: i32 = -100;
    /// `priority filter` (0).
    pub const FILTER: i32 = 0;
    /// `priority srcnat` (100): source NAT in postrouting.
    pub const SRCNAT: i32 = 100;
}

/// The policy of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `policy accept`.
    Accept,
    /// `policy drop`.
    Drop,
}

/// The hook settings of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseChain {
    /// `type …`.
    pub kind: ChainType,
    /// `hook …`.
    pub hook: ChainHook,
    /// `priority …`.
    pub priority: i32,
    /// `policy …`.
    pub policy: Policy,
}

/// A chain: a regular one (only reached by `jump`/`goto`) or a base chain on a hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The name.
    pub name: String,
    /// The hook settings of a base chain.
    pub base: Option<BaseChain>,
}

impl Chain {
    /// `chain NAME { }`.
    pub fn regular(name: &str) -> Chain {
        Chain {
            name: name.to_string(),
            base: None,
        }
    }

    /// `chain NAME { type nat hook prerouting priority -100; policy accept; }`.
    pub fn base(name: &str, kind: ChainType, hook: ChainHook, priority: i32) -> Chain {
        Chain {
            name: name.to_string(),
            base: Some(BaseChain {
                kind,
                hook,
                priority,
                policy: Policy::Accept,
            }),
        }
    }

    /// The declaration as `nft` writes it.
    pub fn to_nft(&self) -> String {
        match &self.base {
            None => self.name.clone(),
            Some(b) => format!(
                "{} {{ type {} hook {} priority {}; policy {}; }}",
                self.name,
                b.kind.name(),
                b.hook.name(),
                b.priority,
                match b.policy {
                    Policy::Accept => "accept",
                    Policy::Drop => "drop",
                }
            ),
        }
    }

    /// `policy drop` (base chains only; the default is `accept`).
    #[must_use]
    pub fn policy(mut self, policy: Policy) -> Chain {
        if let Some(base) = &mut self.base {
            base.policy = policy;
        }
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    AddTable(Table),
    /// A table whose base chains hook nothing (`flags dormant`): for batches that are only
    /// checked, so that checking a base chain registers no hook.
    AddDormantTable(Table),
    DeleteTable(Table),
    AddChain(Table, Chain),
    FlushChain(Table, String),
    DeleteChain(Table, String),
    AddSet(Table, Set),
    FlushSet(Table, String),
    DeleteSet(Table, String),
    AddRule {
        table: Table,
        chain: String,
        rule: Rule,
        append: bool,
        echo: bool,
    },
    DeleteRule {
        table: Table,
        chain: String,
        handle: u64,
    },
    AddElements(Table, String, Vec<Element>),
    DeleteElements(Table, String, Vec<Vec<Value>>),
    ExpireElements(Table, String, Vec<Element>),
}

impl Op {
    /// An expiry made the deletion of the same keys; `None` for any other op.
    fn expiry_as_deletion(&self) -> Option<Op> {
        match self {
            Op::ExpireElements(t, s, e) => Some(Op::DeleteElements(
                t.clone(),
                s.clone(),
                e.iter().map(|e| e.key.clone()).collect(),
            )),
            _ => None,
        }
    }

    /// The operation as `nft` syntax, naming the object for error messages.
    fn describe(&self) -> String {
        match self {
            Op::AddTable(t) => format!("add table {t}"),
            Op::AddDormantTable(t) => format!("add table {t} {{ flags dormant; }}"),
            Op::DeleteTable(t) => format!("delete table {t}"),
            Op::AddChain(t, c) => format!("add chain {t} {}", c.to_nft()),
            Op::FlushChain(t, c) => format!("flush chain {t} {c}"),
            Op::DeleteChain(t, c) => format!("delete chain {t} {c}"),
            Op::AddSet(t, s) => format!("add {} to table {t}", s.to_nft()),
            Op::FlushSet(t, s) => format!("flush set {t} {s}"),
            Op::DeleteSet(t, s) => format!("delete set {t} {s}"),
            Op::AddRule {
                table,
                chain,
                rule,
                append,
                ..
            } => format!(
                "{} rule {table} {chain} {}",
                if *append { "add" } else { "insert" },
                rule.to_nft()
            ),
            Op::DeleteRule {
                table,
                chain,
                handle,
            } => format!("delete rule {table} {chain} handle {handle}"),
            Op::AddElements(t, s, e) => format!("add {} element(s) to {t} {s}", e.len()),
            Op::DeleteElements(t, s, k) => format!("delete {} element(s) from {t} {s}", k.len()),
            Op::ExpireElements(t, s, e) => {
                format!("expire {} element(s) of {t} {s} (timeout 1ms)", e.len())
            }
        }
    }
}

/// A list of changes applied as one atomic transaction by [`Nft::apply`](super::Nft::apply):
/// all of them or none.
///
/// Adding a table, chain or set that exists is not an error (`nft add`, not `nft create`), so
/// a plugin can declare its skeleton on every call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    ops: Vec<Op>,
}

/// An object of a batch that cannot be encoded, with its description and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EncodeError {
    pub object: String,
    pub reason: String,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// True when there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// `add table ip NAME`.
    pub fn add_table(&mut self, table: &Table) -> &mut Batch {
        self.ops.push(Op::AddTable(table.clone()));
        self
    }

    /// `add table ip NAME { flags dormant; }`: its base chains hook nothing.
    pub(crate) fn add_dormant_table(&mut self, table: &Table) -> &mut Batch {
        self.ops.push(Op::AddDormantTable(table.clone()));
        self
    }

    /// `delete table ip NAME`, with everything in it.
    pub fn delete_table(&mut self, table: &Table) -> &mut Batch {
        self.ops.push(Op::DeleteTable(table.clone()));
        self
    }

    /// `add chain ip TABLE NAME { … }`.
    pub fn add_chain(&mut self, table: &Table, chain: &Chain) -> &mut Batch {
        self.ops.push(Op::AddChain(table.clone(), chain.clone()));
        self
    }

    /// `flush chain ip TABLE NAME`: removes every rule of the chain.
    pub fn flush_chain(&mut self, table: &Table, chain: &str) -> &mut Batch {
        self.ops
            .push(Op::FlushChain(table.clone(), chain.to_string()));
        self
    }

    /// `delete chain ip TABLE NAME` (it must be empty and unreferenced).
    pub fn delete_chain(&mut self, table: &Table, chain: &str) -> &mut Batch {
        self.ops
            .push(Op::DeleteChain(table.clone(), chain.to_string()));
        self
    }

    /// `add map ip TABLE NAME { type … : …; }` (or `add set …`).
    pub fn add_set(&mut self, table: &Table, set: &Set) -> &mut Batch {
        self.ops.push(Op::AddSet(table.clone(), set.clone()));
        self
    }

    /// `flush set ip TABLE NAME` (or `flush map …`): removes every element.
    pub fn flush_set(&mut self, table: &Table, set: &str) -> &mut Batch {
        self.ops.push(Op::FlushSet(table.clone(), set.to_string()));
        self
    }

    /// `delete set ip TABLE NAME` (or `delete map …`).
    pub fn delete_set(&mut self, table: &Table, set: &str) -> &mut Batch {
        self.ops.push(Op::DeleteSet(table.clone(), set.to_string()));
        self
    }

    /// `add rule ip TABLE CHAIN …`: appends the rule.
    pub fn add_rule(&mut self, table: &Table, chain: &str, rule: &Rule) -> &mut Batch {
        self.push_rule(table, chain, rule, true, false)
    }

    /// `add rule ip TABLE CHAIN …` whose handle the kernel reports back when the batch
    /// commits ([`Nft::apply_echo`](super::Nft::apply_echo)), for deleting it later by handle
    /// without listing the chain.
    pub fn add_rule_echo(&mut self, table: &Table, chain: &str, rule: &Rule) -> &mut Batch {
        self.push_rule(table, chain, rule, true, true)
    }

    /// `insert rule ip TABLE CHAIN …`: puts the rule first in the chain.
    pub fn insert_rule(&mut self, table: &Table, chain: &str, rule: &Rule) -> &mut Batch {
        self.push_rule(table, chain, rule, false, false)
    }

    fn push_rule(
        &mut self,
        table: &Table,
        chain: &str,
        rule: &Rule,
        append: bool,
        echo: bool,
    ) -> &mut Batch {
        self.ops.push(Op::AddRule {
            table: table.clone(),
            chain: chain.to_string(),
            rule: rule.clone(),
            append,
            echo,
        });
        self
    }

    /// `delete rule ip TABLE CHAIN handle N`.
    pub fn delete_rule(&mut self, table: &Table, chain: &str, handle: u64) -> &mut Batch {
        self.ops.push(Op::DeleteRule {
            table: table.clone(),
            chain: chain.to_string(),
            handle,
        });
        self
    }

    /// `add element ip TABLE SET { k comment "c" : v, … }`; re-adding an identical element is
    /// not an error, one with the same key and other data is (EBUSY).
    pub fn add_elements(&mut self, table: &Table, set: &str, elements: &[Element]) -> &mut Batch {
        if !elements.is_empty() {
            self.ops.push(Op::AddElements(
                table.clone(),
                set.to_string(),
                elements.to_vec(),
            ));
        }
        self
    }

    /// `delete element ip TABLE SET { k, … }`; a missing key fails the batch (ENOENT).
    pub fn delete_elements(&mut self, table: &Table, set: &str, keys: &[Vec<Value>]) -> &mut Batch {
        if !keys.is_empty() {
            self.ops.push(Op::DeleteElements(
                table.clone(),
                set.to_string(),
                keys.to_vec(),
            ));
        }
        self
    }

    /// Removes elements without deleting them: `add element ip TABLE SET { k timeout 1ms : v }`
    /// over the existing elements (`NFT_MSG_NEWSETELEM` without `NLM_F_EXCL`), which updates
    /// their timeout. Each element is given with its key and, in a map, the data it has (other
    /// data is refused with EBUSY); comments are not sent (an update keeps the old one).
    ///
    /// Why: a transaction that deletes anything queues the frees of the deleted objects
    /// behind an RCU grace period, and the next close of an nf_tables socket of the namespace
    /// waits for them (the module docs); an element that times out is freed by the set's own
    /// garbage collection, and nothing waits. The element stays in effect until the timeout
    /// ends, one kernel tick at most (the kernel counts timeouts in ticks); listings and
    /// lookups skip it from then on, and its key can be added again (but not in the same
    /// transaction: adding an element that exists changes nothing, so the timeout would still
    /// remove it — delete a key that the transaction adds again).
    ///
    /// [`Nft::apply`](super::Nft::apply) deletes the elements instead where the set lacks
    /// `flags timeout` (sets made by `Set` without [`Set::with_timeout`]). After the commit it
    /// returns once the kernel no longer has them (it looks the last one up until its tick has
    /// passed), and deletes them in a second transaction when the kernel ignored the update
    /// (kernels before 6.5 accept it and change nothing).
    pub fn expire_elements(
        &mut self,
        table: &Table,
        set: &str,
        elements: &[Element],
    ) -> &mut Batch {
        if !elements.is_empty() {
            self.ops.push(Op::ExpireElements(
                table.clone(),
                set.to_string(),
                elements.to_vec(),
            ));
        }
        self
    }

    /// Whether the batch deletes a table or a set (whose successor may be declared otherwise).
    pub(crate) fn drops_sets(&self) -> bool {
        self.ops
            .iter()
            .any(|op| matches!(op, Op::DeleteTable(_) | Op::DeleteSet(..)))
    }

    /// The sets whose elements the batch expires: [`Nft::apply`](super::Nft::apply) deletes
    /// instead in those without `flags timeout`.
    pub(crate) fn expiring_sets(&self) -> impl Iterator<Item = (&Table, &str)> {
        self.ops.iter().filter_map(|op| match op {
            Op::ExpireElements(t, s, e) if !e.is_empty() => Some((t, s.as_str())),
            _ => None,
        })
    }

    /// The element the batch expires last, with its set: the commit gives it the latest
    /// expiry of the batch's (a commit that spans a tick gives its later elements one more).
    pub(crate) fn last_expiring(&self) -> Option<(&Table, &str, &Element)> {
        self.ops.iter().rev().find_map(|op| match op {
            Op::ExpireElements(t, s, e) => e.last().map(|last| (t, s.as_str(), last)),
            _ => None,
        })
    }

    /// The batch with the expiries of sets that `keep` refuses made deletions of the same
    /// keys; `None` when it changes nothing.
    pub(crate) fn deleting_expiries(&self, keep: &dyn Fn(&Table, &str) -> bool) -> Option<Batch> {
        let mut changed = false;
        let ops = self
            .ops
            .iter()
            .map(|op| match op {
                Op::ExpireElements(t, s, _) if !keep(t, s) => {
                    changed = true;
                    op.expiry_as_deletion().unwrap_or_else(|| op.clone())
                }
                other => other.clone(),
            })
            .collect();
        changed.then_some(Batch { ops })
    }

    /// A batch deleting every element this one expires.
    pub(crate) fn expiries_as_deletions(&self) -> Batch {
        Batch {
            ops: self.ops.iter().filter_map(Op::expiry_as_deletion).collect(),
        }
    }

    /// The nft-syntax description of operation `index`, for error messages.
    pub(crate) fn describe(&self, index: usize) -> String {
        self.ops
            .get(index)
            .map_or_else(|| format!("operation #{index}"), Op::describe)
    }

    /// The netlink messages, without the batch begin/end wrapper. An operation on elements
    /// becomes as many messages as its element list needs ([`split_elements`]); every
    /// attribute of every message is checked to fit its u16 length ([`check_fits`]).
    pub(crate) fn encode(&self) -> Result<Vec<Encoded>, EncodeError> {
        let mut set_id = 0u32;
        let mut out = Vec::with_capacity(self.ops.len());
        for (index, op) in self.ops.iter().enumerate() {
            let fail = |reason: String| EncodeError {
                object: op.describe(),
                reason,
            };
            let one = |msg| vec![msg];
            let (table, msgs, flags) = match op {
                Op::AddTable(t) | Op::AddDormantTable(t) => (
                    t,
                    one(NfTablesMessage::NewTable(TableMessage {
                        attributes: vec![
                            TableAttribute::Name(t.name.clone()),
                            TableAttribute::Flags(if matches!(op, Op::AddDormantTable(_)) {
                                TableFlags::Dormant
                            } else {
                                TableFlags::empty()
                            }),
                        ],
                    })),
                    NLM_F_CREATE,
                ),
                Op::DeleteTable(t) => (
                    t,
                    one(NfTablesMessage::DeleteTable(TableMessage {
                        attributes: vec![TableAttribute::Name(t.name.clone())],
                    })),
                    0,
                ),
                Op::AddChain(t, c) => (t, one(chain_message(t, c)), NLM_F_CREATE),
                Op::FlushChain(t, c) => (
                    t,
                    one(NfTablesMessage::DeleteRule(RuleMessage {
                        attributes: vec![
                            RuleAttribute::Table(t.name.clone()),
                            RuleAttribute::Chain(c.clone()),
                        ],
                    })),
                    0,
                ),
                Op::DeleteChain(t, c) => (
                    t,
                    one(NfTablesMessage::DeleteChain(ChainMessage {
                        attributes: vec![
                            ChainAttribute::Table(t.name.clone()),
                            ChainAttribute::Name(c.clone()),
                        ],
                    })),
                    0,
                ),
                Op::AddSet(t, s) => {
                    // The kernel wants a transaction-unique id for every new set.
                    set_id += 1;
                    (
                        t,
                        one(set_message(t, s, set_id).map_err(fail)?),
                        NLM_F_CREATE,
                    )
                }
                Op::FlushSet(t, s) => (
                    t,
                    one(NfTablesMessage::DeleteSetElement(SetElementMessage {
                        attributes: vec![
                            SetElementList::Table(t.name.clone()),
                            SetElementList::Set(s.clone()),
                        ],
                    })),
                    0,
                ),
                Op::DeleteSet(t, s) => (
                    t,
                    one(NfTablesMessage::DeleteSet(SetMessage {
                        attributes: vec![
                            SetAttribute::Table(t.name.clone()),
                            SetAttribute::Name(s.clone()),
                        ],
                    })),
                    0,
                ),
                Op::AddRule {
                    table,
                    chain,
                    rule,
                    append,
                    echo,
                } => (
                    table,
                    one(rule_message(table, chain, rule).map_err(fail)?),
                    NLM_F_CREATE
                        | if *append { NLM_F_APPEND } else { 0 }
                        | if *echo { NLM_F_ECHO } else { 0 },
                ),
                Op::DeleteRule {
                    table,
                    chain,
                    handle,
                } => (
                    table,
                    one(NfTablesMessage::DeleteRule(RuleMessage {
                        attributes: vec![
                            RuleAttribute::Table(table.name.clone()),
                            RuleAttribute::Chain(chain.clone()),
                            RuleAttribute::Handle(*handle),
                        ],
                    })),
                    0,
                ),
                Op::AddElements(t, s, elements) | Op::ExpireElements(t, s, elements) => {
                    let expire = matches!(op, Op::ExpireElements(..));
                    let mut list = Vec::with_capacity(elements.len());
                    for e in elements {
                        list.push(
                            if expire {
                                expiry_attributes(e)
                            } else {
                                element_attributes(e)
                            }
                            .map_err(fail)?,
                        );
                    }
                    (
                        t,
                        element_messages(NfTablesMessage::NewSetElement, t, s, list)
                            .map_err(fail)?,
                        // An expiry is an update: neither NLM_F_EXCL (which refuses an element
                        // that exists) nor NLM_F_CREATE.
                        if expire { 0 } else { NLM_F_CREATE },
                    )
                }
                Op::DeleteElements(t, s, keys) => {
                    let list = keys
                        .iter()
                        .map(|k| {
                            ListAttribute::Element(vec![SetElementAttribute::Key(
                                DataAttribute::Value(Value::concat(k)),
                            )])
                        })
                        .collect();
                    (
                        t,
                        element_messages(NfTablesMessage::DeleteSetElement, t, s, list)
                            .map_err(fail)?,
                        0,
                    )
                }
            };
            for msg in msgs {
                check_fits(&msg).map_err(fail)?;
                out.push(Encoded {
                    msg: RawMsg::encode(&nft_message(table.family, msg)),
                    flags,
                    op: index,
                });
            }
        }
        // One ACK, on the last message: it arrives after every refusal (see `send_batch`).
        if let Some(last) = out.last_mut() {
            last.flags |= NLM_F_ACK;
        }
        Ok(out)
    }
}

/// One message of an encoded [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Encoded {
    /// The message.
    pub msg: RawMsg,
    /// `NLM_F_*` flags besides `NLM_F_REQUEST`.
    pub flags: u16,
    /// The index of the operation it belongs to.
    pub op: usize,
}

/// The most a netlink attribute can hold, its 4-byte header included: its length is a u16.
pub(crate) const ATTR_MAX: usize = u16::MAX as usize;
/// A netlink attribute's header.
const NLA_HEADER: usize = 4;

/// Splits an element list into lists that each fit one `NFTA_SET_ELEM_LIST_ELEMENTS`
/// attribute, in order: a message per list. The kernel applies them in the same
/// transaction, so the split changes nothing else.
///
/// # Errors
/// An element that alone does not fit an attribute.
fn split_elements(
    list: Vec<ListAttribute<SetElementAttribute>>,
) -> Result<Vec<Vec<ListAttribute<SetElementAttribute>>>, String> {
    let mut parts = Vec::new();
    let mut part = Vec::new();
    let mut used = NLA_HEADER;
    for element in list {
        let len = element.buffer_len();
        if NLA_HEADER + len > ATTR_MAX {
            return Err(format!(
                "an element of {len} bytes does not fit a netlink attribute ({ATTR_MAX} bytes)"
            ));
        }
        if used + len > ATTR_MAX {
            parts.push(std::mem::take(&mut part));
            used = NLA_HEADER;
        }
        used += len;
        part.push(element);
    }
    if !part.is_empty() || parts.is_empty() {
        parts.push(part);
    }
    Ok(parts)
}

/// Fails when an attribute of `msg` is longer than a netlink attribute can say (its length is
/// a u16): `netlink-packet-core` would write a wrapped length, then panic. An attribute
/// nested in another is shorter than it, so the top level is enough.
fn check_fits(msg: &NfTablesMessage) -> Result<(), String> {
    fn fits<A: Nla>(attrs: &[A]) -> Result<(), String> {
        for attr in attrs {
            let len = NLA_HEADER + attr.value_len();
            if len > ATTR_MAX {
                return Err(format!(
                    "its netlink attribute {} of {len} bytes is longer than the {ATTR_MAX} bytes an attribute can hold",
                    attr.kind()
                ));
            }
        }
        Ok(())
    }
    match msg {
        NfTablesMessage::NewTable(m)
        | NfTablesMessage::GetTable(m)
        | NfTablesMessage::DeleteTable(m) => fits(&m.attributes),
        NfTablesMessage::NewChain(m)
        | NfTablesMessage::GetChain(m)
        | NfTablesMessage::DeleteChain(m) => fits(&m.attributes),
        NfTablesMessage::NewRule(m)
        | NfTablesMessage::GetRule(m)
        | NfTablesMessage::DeleteRule(m) => fits(&m.attributes),
        NfTablesMessage::NewSet(m) | NfTablesMessage::GetSet(m) | NfTablesMessage::DeleteSet(m) => {
            fits(&m.attributes)
        }
        NfTablesMessage::NewSetElement(m)
        | NfTablesMessage::GetSetElement(m)
        | NfTablesMessage::DeleteSetElement(m) => fits(&m.attributes),
        NfTablesMessage::Trace(a)
        | NfTablesMessage::NewObject(a)
        | NfTablesMessage::GetObject(a)
        | NfTablesMessage::DeleteObject(a)
        | NfTablesMessage::NewFlowTable(a)
        | NfTablesMessage::GetFlowTable(a)
        | NfTablesMessage::DeleteFlowTable(a)
        | NfTablesMessage::Other { attributes: a, .. } => fits(a),
        NfTablesMessage::NewGen(m) | NfTablesMessage::GetGen(m) => fits(&m.attributes),
        _ => Err("a message of a kind this encoder does not know".to_string()),
    }
}

/// Wraps an nf_tables message in its nfnetlink header.
pub(crate) fn nft_message(family: Family, msg: NfTablesMessage) -> NetfilterMessage {
    NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::from(family.code()), 0, 0),
        msg,
    )
}

fn chain_message(t: &Table, c: &Chain) -> NfTablesMessage {
    let mut attributes = vec![
        ChainAttribute::Table(t.name.clone()),
        ChainAttribute::Name(c.name.clone()),
    ];
    if let Some(base) = &c.base {
        attributes.push(ChainAttribute::Type(base.kind.name().to_string()));
        attributes.push(ChainAttribute::Policy(match base.policy {
            Policy::Drop => 0,
            Policy::Accept => 1,
        }));
        attributes.push(ChainAttribute::Hook(vec![
            Hook::Number(HookNumber::Inet(base.hook.number())),
            // The priority travels as a big-endian two's-complement s32.
            Hook::Priority(u32::from_ne_bytes(base.priority.to_ne_bytes())),
        ]));
    }
    NfTablesMessage::NewChain(ChainMessage { attributes })
}

fn set_message(t: &Table, s: &Set, id: u32) -> Result<NfTablesMessage, String> {
    let len = |types: &[DataType]| u32::try_from(DataType::total_len(types)).unwrap_or(u32::MAX);
    if s.key.is_empty() {
        return Err("a set needs a key type".to_string());
    }
    let mut attributes = vec![
        SetAttribute::Table(t.name.clone()),
        SetAttribute::Name(s.name.clone()),
        SetAttribute::Flags(
            match s.data {
                SetData::None => SetFlags::empty(),
                _ => SetFlags::Map,
            } | if s.timeout {
                SetFlags::Timeout
            } else {
                SetFlags::empty()
            },
        ),
        SetAttribute::KeyType(DataType::concat_id(&s.key)),
        SetAttribute::KeyLen(len(&s.key)),
    ];
    match &s.data {
        SetData::None => {}
        SetData::Values(data) if data.is_empty() => {
            return Err("a map needs a data type".to_string());
        }
        SetData::Values(data) => {
            attributes.push(SetAttribute::DataType(DataType::concat_id(data)));
            attributes.push(SetAttribute::DataLen(len(data)));
        }
        SetData::Verdict => {
            attributes.push(SetAttribute::DataType(NFT_DATA_VERDICT));
            attributes.push(SetAttribute::DataLen(0));
        }
    }
    attributes.push(SetAttribute::Id(id));
    Ok(NfTablesMessage::NewSet(SetMessage { attributes }))
}

pub(super) fn rule_message(t: &Table, chain: &str, rule: &Rule) -> Result<NfTablesMessage, String> {
    let exprs = rule.encode(t.family).map_err(|e| e.0)?;
    let mut attributes = vec![
        RuleAttribute::Table(t.name.clone()),
        RuleAttribute::Chain(chain.to_string()),
        RuleAttribute::Expressions(exprs.iter().map(super::expr::Expr::encode).collect()),
    ];
    if let Some((proto, negated)) = rule.compat_proto() {
        // NFTA_RULE_COMPAT_PROTO, NFTA_RULE_COMPAT_FLAGS (NFT_RULE_COMPAT_F_INV).
        let flags: u32 = if negated { 1 << 1 } else { 0 };
        attributes.push(RuleAttribute::Compat(vec![
            DefaultNla::new(1, proto.to_be_bytes().to_vec()),
            DefaultNla::new(2, flags.to_be_bytes().to_vec()),
        ]));
    }
    if let Some(c) = rule.comment_text() {
        attributes.push(RuleAttribute::UserData(userdata::comment(c)));
    }
    Ok(NfTablesMessage::NewRule(RuleMessage { attributes }))
}

/// The timeout [`Batch::expire_elements`] gives, in milliseconds: the least there is (the
/// kernel rounds it up to one tick; zero would mean "no timeout").
pub(crate) const EXPIRE_TIMEOUT_MS: u64 = 1;

/// An element of [`Batch::expire_elements`]: its key, its data, and the timeout.
fn expiry_attributes(e: &Element) -> Result<ListAttribute<SetElementAttribute>, String> {
    let without_comment = Element {
        comment: None,
        ..e.clone()
    };
    let mut attrs = element_nlas(&without_comment)?;
    attrs.push(SetElementAttribute::Timeout(EXPIRE_TIMEOUT_MS));
    Ok(ListAttribute::Element(attrs))
}

fn element_attributes(e: &Element) -> Result<ListAttribute<SetElementAttribute>, String> {
    element_nlas(e).map(ListAttribute::Element)
}

fn element_nlas(e: &Element) -> Result<Vec<SetElementAttribute>, String> {
    if e.key.is_empty() {
        return Err("an element needs a key".to_string());
    }
    let mut attrs = vec![SetElementAttribute::Key(DataAttribute::Value(
        Value::concat(&e.key),
    ))];
    match &e.data {
        None => {}
        Some(ElementData::Values(v)) => attrs.push(SetElementAttribute::Data(
            DataAttribute::Value(Value::concat(v)),
        )),
        Some(ElementData::Verdict(v)) => attrs.push(SetElementAttribute::Data(
            DataAttribute::Verdict(Verdict::to_attributes(v)),
        )),
    }
    if let Some(c) = &e.comment {
        if c.len() > COMMENT_MAX {
            return Err(format!(
                "comment of {} bytes is longer than {COMMENT_MAX}",
                c.len()
            ));
        }
        attrs.push(SetElementAttribute::UserData(userdata::comment(c)));
    }
    Ok(attrs)
}

/// The messages of an element list of `set`, as many as its attributes need
/// ([`split_elements`]).
fn element_messages(
    kind: fn(SetElementMessage) -> NfTablesMessage,
    t: &Table,
    set: &str,
    list: Vec<ListAttribute<SetElementAttribute>>,
) -> Result<Vec<NfTablesMessage>, String> {
    Ok(split_elements(list)?
        .into_iter()
        .map(|part| elements_message(kind, t, set, part))
        .collect())
}

fn elements_message(
    kind: fn(SetElementMessage) -> NfTablesMessage,
    t: &Table,
    set: &str,
    list: Vec<ListAttribute<SetElementAttribute>>,
) -> NfTablesMessage {
    kind(SetElementMessage {
        attributes: vec![
            SetElementList::Table(t.name.clone()),
            SetElementList::Set(set.to_string()),
            SetElementList::Elements(list),
        ],
    })
}
