//! The host-port question, for both layouts: the key a mapping claims ([`PortKey`]), the
//! iptables layout's index of who claims each key ([`PortIndex`]), the records that tell what
//! became of a holder ([`Records`], [`Fate`]), who holds a host port (in our nftables maps:
//! [`in_maps`]; in the iptables layout: [`indexed_holders`], and in a table the writer read
//! whole: [`table_holders`]) and the refusal naming it.

use std::cell::{OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cni::Attachment;
use host::store::StateStore;
use ipnet::IpNet;
use netfilter::iptables::TableDump;
use netfilter::nft::{Nft, NftError, Table, Value};
use netlink::census::Census;

use crate::config::{Backend, Config, IpFamily, PortMapping, Proto};
use crate::error::PortmapError;
use crate::names;
use crate::state::{self, State};

/// A host port as the reference's iptables layout claims it: a family's table, a protocol, a
/// port, and the host address of `-d` (none: every local address). Two attachments whose
/// mappings have the same key DNAT the same packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortKey {
    /// The table's family.
    pub family: IpFamily,
    /// The protocol.
    pub proto: Proto,
    /// The host port.
    pub port: u16,
    /// The `-d` address, if any.
    pub host: Option<IpAddr>,
}

impl PortKey {
    /// The keys `mappings` claim in `family`'s table, each once, in mapping order.
    pub fn of(mappings: &[PortMapping], family: IpFamily) -> Vec<PortKey> {
        let mut seen = HashSet::new();
        mappings
            .iter()
            .filter(|m| m.host_ip.applies_to(family))
            .map(|m| PortKey {
                family,
                proto: m.proto,
                port: m.host_port,
                host: m.host_ip.addr(),
            })
            .filter(|k| seen.insert(*k))
            .collect()
    }

    /// Whether mapping `m` claims this key in its family.
    pub fn is_claimed_by(&self, m: &PortMapping) -> bool {
        m.host_ip.applies_to(self.family)
            && m.proto == self.proto
            && m.host_port == self.port
            && m.host_ip.addr() == self.host
    }
}

/// Whether `record` claims `key` in the iptables layout: made by the iptables backend, with a
/// container address of the key's family and a mapping of it.
pub fn claims(record: &State, key: &PortKey) -> bool {
    record.backend == Backend::Iptables
        && record.families().contains(&key.family)
        && record.mappings.iter().any(|m| key.is_claimed_by(m))
}

/// The host-port keys `record`'s mappings claim in the iptables layout, in each family of its
/// container addresses.
pub fn keys(record: &State) -> Vec<PortKey> {
    if record.backend != Backend::Iptables {
        return Vec::new();
    }
    record
        .families()
        .into_iter()
        .flat_map(|f| PortKey::of(&record.mappings, f))
        .collect()
}

/// The keys DEL releases for `att` without a record: those of `mappings` in both families.
pub fn unrecorded_keys(mappings: &[PortMapping]) -> Vec<PortKey> {
    IpFamily::BOTH
        .iter()
        .flat_map(|f| PortKey::of(mappings, *f))
        .collect()
}

/// The entry of the host-port index for `key`, in the state directory:
/// `.port-<v4|v6>-<proto>-<port>[-<host address>]`, a hard link to the record of the
/// attachment claiming it ([`PortIndex`]). The leading dot keeps it out of the records'
/// listing.
pub fn index_entry(key: &PortKey) -> String {
    let family = match key.family {
        IpFamily::V4 => "v4",
        IpFamily::V6 => "v6",
    };
    let mut name = format!(
        "{}{family}-{}-{}",
        names::PORT_INDEX_PREFIX,
        key.proto.name(),
        key.port
    );
    if let Some(host) = key.host {
        name.push_str(&format!("-{host}"));
    }
    name
}

/// What became of the attachment holding a host port another ADD asks for.
#[derive(Debug)]
pub enum Fate {
    /// Its network namespace is there, or it cannot be told (no record, made by the Go plugin
    /// or by an earlier version): it keeps its ports and the ADD is refused, naming it.
    Live,
    /// Its recorded network namespace is gone: these records (its attachments holding the
    /// port) are taken over, their mappings removed in the ADD's own transaction.
    Gone(Vec<State>),
}

/// The records of a store, telling what became of the holders of host ports.
#[derive(Debug)]
pub struct Records<'a> {
    store: &'a StateStore,
    index: PortIndex<'a>,
    /// The host's namespaces, taken at most once per call, when a holder's fate rests on it.
    census: OnceCell<Census>,
}

impl<'a> Records<'a> {
    /// The records of `store`.
    pub fn new(store: &'a StateStore) -> Records<'a> {
        Records {
            store,
            index: PortIndex::new(store),
            census: OnceCell::new(),
        }
    }

    /// Whether the record's owner is gone: it recorded its namespace, and that is proven gone.
    fn gone(&self, record: &State) -> bool {
        record
            .netns
            .as_ref()
            .is_some_and(|n| n.is_gone(&self.census))
    }
}

impl Records<'_> {
    /// What became of the attachment whose owner comment is `owner` (our map layout).
    pub fn by_owner(&self, owner: &str) -> Fate {
        let Some((network, id, ifname)) = names::parse_owner(owner) else {
            return Fate::Live;
        };
        let att = Attachment {
            network: network.to_string(),
            container_id: id.to_string(),
            ifname: ifname.to_string(),
        };
        match state::record_of(self.store, &att) {
            Some(record) if names::owner(&record.attachment()) == owner && self.gone(&record) => {
                Fate::Gone(vec![record])
            }
            _ => Fate::Live,
        }
    }

    /// What became of the attachments of `container_id` on `network`, whose chain the
    /// iptables layout shares.
    pub fn by_container(&self, network: &str, container_id: &str) -> Fate {
        let prefix = names::state_file_prefix(network, container_id);
        let legacy = names::legacy_state_file(network, container_id, "");
        let legacy = legacy.trim_end_matches(".json");
        let records: Vec<State> = self
            .store
            .list()
            .unwrap_or_default()
            .iter()
            .filter(|name| name.starts_with(&prefix) || name.starts_with(legacy))
            .filter_map(|name| state::read(self.store, name).ok()?.found())
            .filter(|r| r.network == network && r.container_id == container_id)
            .collect();
        if records.is_empty() || !records.iter().all(|r| self.gone(r)) {
            return Fate::Live;
        }
        Fate::Gone(records)
    }

    /// The attachment the host-port index names as holding `key` in the iptables layout,
    /// if it has an entry for it.
    pub fn indexed(&self, key: &PortKey) -> Option<Attachment> {
        self.index.holder(key)
    }

    /// The record of `att`, if it has a valid one.
    pub fn record(&self, att: &Attachment) -> Option<State> {
        state::record_of(self.store, att)
    }
}

/// The host-port index of the iptables layout, in the state directory: for each key an
/// attachment's mappings claim, `.port-<v4|v6>-<proto>-<port>[-<host address>]`, a hard link
/// to that attachment's record as it was when the key was claimed. It lets an iptables ADD
/// find the holder of a host port with one `open` instead of reading every attachment's
/// chain. Hard links, because they cost a directory entry and no inode: on an ext4 `/run`
/// an inode costs a millisecond where a link costs tens of microseconds. The ADD holding our
/// iptables lock is the only writer, and it points each key it claims at itself once its
/// conflict check has found no live holder (see [`PortIndex::claim`]). The linked record names
/// its attachment; whether that attachment still claims the key is read from its current
/// record.
#[derive(Debug)]
pub struct PortIndex<'s> {
    store: &'s StateStore,
    /// The attachment each linked inode names, read once per inode (one attachment may hold
    /// thousands of keys).
    owners: RefCell<HashMap<(u64, u64), Option<Attachment>>>,
}

impl<'s> PortIndex<'s> {
    /// The index of `store`.
    pub fn new(store: &'s StateStore) -> PortIndex<'s> {
        PortIndex {
            store,
            owners: RefCell::new(HashMap::new()),
        }
    }

    fn entry(&self, key: &PortKey) -> PathBuf {
        self.store.dir().join(index_entry(key))
    }

    /// The attachment the entry at `link` names, if it is one of ours.
    fn owner_at(&self, link: &Path) -> Option<Attachment> {
        // Never through a planted symlink, never waiting on a planted FIFO (with our iptables
        // lock held): anything but a regular file is no entry.
        let host::store::Regular::File(file) = host::store::open_regular(link).ok()? else {
            return None;
        };
        let meta = file.metadata().ok()?;
        let inode = (meta.dev(), meta.ino());
        if let Some(owner) = self.owners.borrow().get(&inode) {
            return owner.clone();
        }
        let state: Option<State> = serde_json::from_reader(std::io::BufReader::new(file)).ok();
        let owner = state.map(|s| s.attachment());
        self.owners.borrow_mut().insert(inode, owner.clone());
        owner
    }

    /// The attachment the index names for `key`, if it has an entry.
    pub fn holder(&self, key: &PortKey) -> Option<Attachment> {
        self.owner_at(&self.entry(key))
    }

    /// Points the index at `file` (the record of `state`, written) for each key its iptables
    /// mappings claim. The caller's ADD holds our iptables lock and has refused every live
    /// holder of its keys, so it holds them all now, and each entry is made to name it:
    /// entries naming an attachment that is gone, whose chain the kernel lost, or whose record
    /// no longer claims the key alike. Only an entry naming another attachment of the same
    /// container is left while that one's record claims the key: both map it through the
    /// container's one chain.
    ///
    /// # Errors
    /// The entries that cannot be made (the caller's ADD then fails and rolls back: an
    /// entry left naming another holder would let the next ADD of the key through).
    pub fn claim(&self, file: &str, state: &State) -> Result<(), PortmapError> {
        let target = self.store.path(file).map_err(PortmapError::Store)?;
        let att = state.attachment();
        for key in keys(state) {
            let link = self.entry(&key);
            match self.owner_at(&link) {
                Some(holder) if holder == att => continue,
                Some(holder)
                    if holder.network == att.network
                        && holder.container_id == att.container_id
                        && state::record_of(self.store, &holder)
                            .is_some_and(|h| claims(&h, &key)) =>
                {
                    continue;
                }
                _ => {}
            }
            remove_entry(&link)?;
            std::fs::hard_link(&target, &link)
                .map_err(|source| index_error("write", link, source))?;
        }
        Ok(())
    }

    /// Removes the entries of `keys` that name `att`.
    pub fn release(&self, att: &Attachment, keys: &[PortKey]) {
        for key in keys {
            let link = self.entry(key);
            if self.owner_at(&link).as_ref() == Some(att)
                && let Err(e) = remove_entry(&link)
            {
                log::warn!("{e}");
            }
        }
    }

    /// Removes the entries whose attachment has no record any more (GC): what a call killed
    /// between removing a record and its entries left.
    pub fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(self.store.dir()) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let is_entry = entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(names::PORT_INDEX_PREFIX));
            if !is_entry {
                continue;
            }
            let path = entry.path();
            let live = self.owner_at(&path).is_some_and(|att| {
                state::locate(self.store, &att)
                    .is_ok_and(|l| !matches!(l.record, state::Record::Absent))
            });
            if !live && let Err(e) = remove_entry(&path) {
                log::warn!("{e}");
            }
        }
    }
}

/// Removes an index entry; one already gone is not an error.
fn remove_entry(link: &Path) -> Result<(), PortmapError> {
    match std::fs::remove_file(link) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(index_error("remove", link.to_path_buf(), source)),
    }
}

fn index_error(op: &'static str, path: PathBuf, source: std::io::Error) -> PortmapError {
    PortmapError::Store(host::store::StoreError::Io { op, path, source })
}

/// Removes the records of attachments an ADD took host ports over from (their namespaces
/// are gone, and so are their mappings), logging each at warn.
pub fn forget_taken(store: &StateStore, taken: &[State]) {
    for record in taken {
        let path = record
            .netns
            .as_ref()
            .map_or_else(String::new, |n| n.path.display().to_string());
        log::warn!(
            "took over the host ports of {}: its network namespace {path} is gone",
            names::owner(&record.attachment())
        );
        let att = record.attachment();
        PortIndex::new(store).release(&att, &keys(record));
        if let Err(e) = state::remove_record(store, &att) {
            log::warn!(
                "failed to remove the record of {}: {e}",
                record.container_id
            );
        }
    }
}

/// Removes the index entries of `record`'s keys that name its attachment.
pub fn release(store: &StateStore, record: &State) {
    PortIndex::new(store).release(&record.attachment(), &keys(record));
}

/// The refusal of host port `what`, held by `owner`.
pub fn refusal(what: String, owner: String) -> PortmapError {
    PortmapError::Conflict { what, owner }
}

/// The refusal of mapping `m`, held by the iptables chain of `network`'s container `id`.
pub fn chain_refusal(m: &PortMapping, network: &str, id: &str) -> PortmapError {
    refusal(
        m.host_port_name(),
        format!(
            "{} (chain {})",
            names::ipt_entry_comment(network, id),
            names::dnat_chain(network, id)
        ),
    )
}

/// Who other than `owner` holds one of `mappings` in our nftables maps of `family`, by looking
/// up their keys (in the plain and the gated map): for the iptables layout's ADD, so that a
/// host port is never mapped by both layouts. The holder as the refusal names it.
///
/// # Errors
/// nf_tables failures other than "not found".
pub fn in_maps<'m>(
    nft: &mut Nft,
    family: IpFamily,
    owner: &str,
    mappings: &[&'m PortMapping],
) -> Result<Option<(&'m PortMapping, String)>, NftError> {
    let t = Table::new(family.into(), names::NFT_TABLE);
    for m in mappings {
        let mut key = Vec::new();
        let maps = match m.host_ip.addr() {
            Some(a) => {
                key.push(Value::from(a));
                [names::MAP_HOSTIP_PORTS, names::MAP_HOSTIP_GATED]
            }
            None => [names::MAP_PORTS, names::MAP_GATED],
        };
        key.push(m.proto.l4().into());
        key.push(Value::Port(m.host_port));
        for map in maps {
            let have = match nft.element(&t, map, &key) {
                Ok(have) => have,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(e),
            };
            // An element expiring is one a DEL removed.
            let Some(have) = have.filter(|e| !e.is_expiring()) else {
                continue;
            };
            let comment = have.comment.unwrap_or_default();
            if comment != owner {
                return Ok(Some((*m, format!("{comment} ({t} {map})"))));
            }
        }
    }
    Ok(None)
}

/// The attachments of the iptables layout that the host-port index names as holding one of
/// `config`'s host ports in `family` (of containers other than `att`'s, whose chain is
/// shared), each once, with the first of `config`'s mappings it holds: those whose current
/// record claims the port and whose chain exists (`chain_exists`, one lookup). A port the Go
/// plugin maps has no index entry.
///
/// # Errors
/// `chain_exists`' failure.
pub fn indexed_holders<E>(
    records: &Records<'_>,
    att: &Attachment,
    config: &Config,
    family: IpFamily,
    mut chain_exists: impl FnMut(&str) -> Result<bool, E>,
) -> Result<Vec<(State, PortMapping)>, E> {
    // The records the index names, each read once (one attachment may hold thousands).
    let mut read: HashMap<Attachment, Option<State>> = HashMap::new();
    let mut found: Vec<(State, PortMapping)> = Vec::new();
    for key in PortKey::of(&config.mappings, family) {
        let Some(holder) = records.indexed(&key).filter(|h| h != att) else {
            continue;
        };
        let record = read
            .entry(holder)
            .or_insert_with_key(|holder| records.record(holder));
        let Some(holder) = record.as_ref().filter(|r| claims(r, &key)) else {
            continue;
        };
        let same = |r: &State| r.network == holder.network && r.container_id == holder.container_id;
        if (holder.network == att.network && holder.container_id == att.container_id)
            || found.iter().any(|(r, _)| same(r))
        {
            continue;
        }
        // An entry whose chain is gone (a record the kernel lost) holds nothing.
        if !chain_exists(&names::dnat_chain(&holder.network, &holder.container_id))? {
            continue;
        }
        if let Some(m) = config.mappings.iter().find(|m| key.is_claimed_by(m)) {
            found.push((holder.clone(), *m));
        }
    }
    Ok(found)
}

/// The value after `opt` in a rule.
fn opt_value<'a>(rule: &'a [String], opt: &str) -> Option<&'a str> {
    let pos = rule.iter().position(|a| a == opt)?;
    rule.get(pos + 1).map(String::as_str)
}

/// The other attachments' `CNI-DN-` chains in a whole table that DNAT one of `config`'s host
/// ports in `family` (same protocol and port, same host address or both on every address),
/// each with the first such mapping: what a table read whole shows beyond the index (the Go
/// plugin's chains).
pub fn table_holders<'c>(
    dump: &TableDump,
    config: &'c Config,
    container_id: &str,
    family: IpFamily,
) -> Vec<(String, &'c PortMapping)> {
    let ours = names::dnat_chain(&config.network, container_id);
    // (proto, port, -d) of our mappings, as the DNAT rules of the dump spell them.
    let wanted: HashMap<(&str, String, Option<String>), &PortMapping> = config
        .mappings
        .iter()
        .filter(|m| m.host_ip.applies_to(family))
        .map(|m| {
            let dst = m.host_ip.addr().map(|a| IpNet::from(a).to_string());
            ((m.proto.name(), m.host_port.to_string(), dst), m)
        })
        .collect();
    let mut found = Vec::new();
    for chain in dump.chains() {
        if !chain.starts_with("CNI-DN-") || *chain == ours {
            continue;
        }
        let clash = dump.rules(chain).iter().find_map(|rule| {
            if opt_value(rule, "-j") != Some("DNAT") {
                return None;
            }
            let key = (
                opt_value(rule, "-p")?,
                opt_value(rule, "--dport")?.to_string(),
                opt_value(rule, "-d").map(str::to_string),
            );
            wanted.get(&key).copied()
        });
        if let Some(m) = clash {
            found.push((chain.clone(), m));
        }
    }
    found
}

/// The entry comment of `chain` in `CNI-HOSTPORT-DNAT` of a whole table, if it has one.
fn entry_comment<'d>(dump: &'d TableDump, chain: &str) -> Option<&'d str> {
    dump.rules(names::IPT_TOPLEVEL_DNAT)
        .iter()
        .find(|r| r.last().is_some_and(|c| c == chain))
        .and_then(|r| opt_value(r, "--comment"))
}

/// The (network, container ID) of `chain` in a whole table, from its entry comment
/// `dnat name: "<network>" id: "<id>"` (a comment cut to 256 characters does not parse), when
/// the chain is that container's.
pub fn table_owner(dump: &TableDump, chain: &str) -> Option<(String, String)> {
    let rest = entry_comment(dump, chain)?.strip_prefix("dnat name: \"")?;
    let (network, id) = rest.split_once("\" id: \"")?;
    let (network, id) = (network.to_string(), id.strip_suffix('"')?.to_string());
    (names::dnat_chain(&network, &id) == chain).then_some((network, id))
}

/// The refusal of mapping `m`, which `chain` of a whole table holds, naming the chain's owner.
pub fn table_refusal(dump: &TableDump, chain: &str, m: &PortMapping) -> PortmapError {
    refusal(
        m.host_port_name(),
        entry_comment(dump, chain).map_or_else(
            || format!("chain {chain}"),
            |c| format!("{c} (chain {chain})"),
        ),
    )
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{NetnsId, Record, file, locate, record_of, remove_record, write};

    /// Runs `f` in a network namespace of its own (where the ids `NetnsId::of` gives go).
    fn isolated(f: impl FnOnce() + Send) {
        host::netns::in_new_netns(f).expect("a network namespace of our own needs root");
    }

    #[test]
    fn records_tell_gone_holders_only_when_their_namespace_is_recorded_and_gone() {
        isolated(|| {
            let tmp = tempfile::tempdir().unwrap();
            let store = StateStore::new(tmp.path().join("net-1"));
            let config = crate::config::test_config(Vec::new());
            let att = |id: &str| Attachment {
                network: "n".into(),
                container_id: id.into(),
                ifname: "eth0".into(),
            };
            let live = NetnsId::of(Path::new("/proc/thread-self/ns/net")).unwrap();
            // An id no namespace has: what a gone one's id is.
            let gone = NetnsId {
                path: tmp.path().join("vanished"),
                nsid: Some(1_000_000),
                ..live.clone()
            };
            let with = State::new(Backend::Iptables, &config, &att("a"), &[], Some(gone));
            let alive = State::new(Backend::Iptables, &config, &att("l"), &[], Some(live));
            let without = State::new(Backend::Iptables, &config, &att("b"), &[], None);
            write(&store, &file(&att("a")), &with).unwrap();
            write(&store, &file(&att("l")), &alive).unwrap();
            write(&store, &file(&att("b")), &without).unwrap();
            let records = Records::new(&store);
            assert!(matches!(records.by_owner("n/a/eth0"), Fate::Gone(r) if r == [with.clone()]));
            assert!(matches!(records.by_container("n", "a"), Fate::Gone(r) if r == [with.clone()]));
            assert!(matches!(records.by_owner("n/l/eth0"), Fate::Live));
            assert!(matches!(records.by_container("n", "l"), Fate::Live));
            // No namespace recorded (an earlier version), no record (the Go plugin): live.
            assert!(matches!(records.by_owner("n/b/eth0"), Fate::Live));
            assert!(matches!(records.by_container("n", "b"), Fate::Live));
            assert!(matches!(records.by_owner("n/c/eth0"), Fate::Live));
            assert!(matches!(records.by_container("n", "c"), Fate::Live));
        });
    }

    fn tcp(port: u16) -> PortMapping {
        PortMapping {
            host_port: port,
            container_port: 80,
            proto: crate::config::Proto::Tcp,
            host_ip: crate::config::HostIp::All,
        }
    }

    fn att(network: &str, id: &str, ifname: &str) -> Attachment {
        Attachment {
            network: network.into(),
            container_id: id.into(),
            ifname: ifname.into(),
        }
    }

    fn iptables_record(att: &Attachment, ports: &[u16]) -> State {
        let config = crate::config::test_config(ports.iter().map(|p| tcp(*p)).collect());
        let ips: Vec<IpNet> = vec!["10.0.0.2/24".parse().unwrap()];
        State::new(Backend::Iptables, &config, att, &ips, None)
    }

    fn key(port: u16) -> PortKey {
        PortKey {
            family: IpFamily::V4,
            proto: crate::config::Proto::Tcp,
            port,
            host: None,
        }
    }

    #[test]
    fn the_port_index_names_the_last_claimant_but_a_sibling_attachment_keeps_its_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::new(tmp.path().join("net-1"));
        let (aa, ab) = (att("n", "a", "eth0"), att("n", "b", "eth0"));
        let (a, b) = (
            iptables_record(&aa, &[8080, 8081]),
            iptables_record(&ab, &[8080]),
        );
        let (fa, fb) = (file(&aa), file(&ab));
        write(&store, &fa, &a).unwrap();
        PortIndex::new(&store).claim(&fa, &a).unwrap();
        let records = Records::new(&store);
        assert_eq!(records.indexed(&key(8080)), Some(aa.clone()));
        assert_eq!(records.indexed(&key(9)), None);
        assert_eq!(records.record(&aa), Some(a.clone()));
        // A's record rewritten (a new inode): its entries still name it.
        write(&store, &fa, &a).unwrap();
        assert_eq!(PortIndex::new(&store).holder(&key(8081)), Some(aa.clone()));
        // B's ADD got past the conflict check (A's chain was gone): B holds 8080 now, and the
        // index says so although A's record still claims it (issue 26 item 2).
        write(&store, &fb, &b).unwrap();
        PortIndex::new(&store).claim(&fb, &b).unwrap();
        assert_eq!(PortIndex::new(&store).holder(&key(8080)), Some(ab.clone()));
        assert_eq!(PortIndex::new(&store).holder(&key(8081)), Some(aa.clone()));
        // Another interface of B's container (the same chain) leaves B's entry while B's
        // record claims the port.
        let ab1 = att("n", "b", "eth1");
        let b1 = iptables_record(&ab1, &[8080]);
        write(&store, &file(&ab1), &b1).unwrap();
        PortIndex::new(&store).claim(&file(&ab1), &b1).unwrap();
        assert_eq!(PortIndex::new(&store).holder(&key(8080)), Some(ab.clone()));
        // Release removes only entries naming the attachment; the sweep those of removed
        // records.
        PortIndex::new(&store).release(&ab, &keys(&a));
        assert_eq!(PortIndex::new(&store).holder(&key(8081)), Some(aa.clone()));
        assert_eq!(PortIndex::new(&store).holder(&key(8080)), None);
        remove_record(&store, &aa).unwrap();
        PortIndex::new(&store).sweep();
        assert_eq!(PortIndex::new(&store).holder(&key(8081)), None);
        remove_record(&store, &ab).unwrap();
        remove_record(&store, &ab1).unwrap();
        store.prune();
        assert!(!store.dir().exists(), "the index kept the directory");
        // An nftables record claims nothing in the iptables layout.
        let config = crate::config::test_config(vec![tcp(8080)]);
        let ips: Vec<IpNet> = vec!["10.0.0.2/24".parse().unwrap()];
        let nft = State::new(
            Backend::Nftables,
            &config,
            &att("n", "c", "eth0"),
            &ips,
            None,
        );
        assert!(keys(&nft).is_empty() && !claims(&nft, &key(8080)));
    }

    #[test]
    fn attachments_whose_old_names_meet_keep_their_own_records() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::new(tmp.path().join("net-1"));
        let (one, two) = (att("a_b", "c", "eth0"), att("a", "b_c", "eth0"));
        let (r1, r2) = (
            iptables_record(&one, &[8080]),
            iptables_record(&two, &[9090]),
        );
        write(&store, &file(&one), &r1).unwrap();
        write(&store, &file(&two), &r2).unwrap();
        assert_eq!(record_of(&store, &one), Some(r1.clone()));
        assert_eq!(record_of(&store, &two), Some(r2.clone()));
        remove_record(&store, &two).unwrap();
        assert_eq!(record_of(&store, &one), Some(r1.clone()));
        assert_eq!(record_of(&store, &two), None);
        let records = Records::new(&store);
        assert!(matches!(records.by_container("a", "b_c"), Fate::Live));
        remove_record(&store, &one).unwrap();
    }

    #[test]
    fn a_record_of_an_earlier_version_is_read_only_for_the_attachment_it_names() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::new(tmp.path().join("net-1"));
        let (one, two) = (att("a_b", "c", "eth0"), att("a", "b_c", "eth0"));
        let legacy = names::legacy_state_file("a_b", "c", "eth0");
        assert_eq!(legacy, names::legacy_state_file("a", "b_c", "eth0"));
        // What an earlier version wrote for `one`, and an index entry linked to it.
        let r1 = iptables_record(&one, &[8080]);
        write(&store, &legacy, &r1).unwrap();
        PortIndex::new(&store).claim(&legacy, &r1).unwrap();
        let found = locate(&store, &one).unwrap();
        assert_eq!(found.file, legacy);
        assert_eq!(found.record.found(), Some(r1.clone()));
        // Not `two`'s, whose name met it.
        let found = locate(&store, &two).unwrap();
        assert_eq!(found.file, file(&two));
        assert!(matches!(found.record, Record::Absent));
        assert!(remove_record(&store, &two).is_ok());
        assert!(
            store.path(&legacy).unwrap().exists(),
            "two's DEL removed one's record"
        );
        // The index still names `one`, whose record claims the port.
        let records = Records::new(&store);
        assert_eq!(records.indexed(&key(8080)), Some(one.clone()));
        assert_eq!(records.record(&one), Some(r1.clone()));
        assert!(matches!(records.by_container("a_b", "c"), Fate::Live));
        assert!(matches!(records.by_container("a", "b_c"), Fate::Live));
        PortIndex::new(&store).sweep();
        assert_eq!(records.indexed(&key(8080)), Some(one.clone()));
        // `one`'s DEL removes it.
        remove_record(&store, &one).unwrap();
        assert!(!store.path(&legacy).unwrap().exists());
        PortIndex::new(&store).sweep();
        assert_eq!(PortIndex::new(&store).holder(&key(8080)), None);
    }
}
