//! The per-attachment state file: what ADD programmed, so DEL works without `runtimeConfig`
//! or `prevResult` and without listing whole maps.
//!
//! Files live under `/run/cni/portmap/net-<inode>/` (tmpfs: gone on reboot, like the kernel
//! state they describe), one directory per network namespace the plugin runs in, with the
//! iptables layout's host-port index beside them ([`PortIndex`]).

use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use host::netns::NetNs;
use host::netns::NsIdentity;
use host::store::StateStore;
use ipnet::IpNet;
use netfilter::iptables::native::Recorded;
use netlink::census::{Census, Presence, Remembered};
use serde::{Deserialize, Serialize};

use crate::backend::{Fate, Holders};
use crate::config::{
    Backend, BackendChoice, Conditions, Config, DEFAULT_MARK_MASQ_BIT, IpFamily, NftCondition,
    PortMapping,
};
use crate::error::PortmapError;
use crate::names;
use crate::plan::{Attachment, PortKey};

/// What ADD recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// The backend that programmed the attachment.
    pub backend: Backend,
    /// Network name.
    pub network: String,
    /// Container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
    /// The container addresses mapped to.
    pub ips: Vec<IpNet>,
    /// The mappings.
    pub mappings: Vec<PortMapping>,
    /// `snat`.
    pub snat: bool,
    /// `masqAll`.
    #[serde(rename = "masqAll")]
    pub masq_all: bool,
    /// nftables `conditionsV4`.
    #[serde(rename = "conditionsV4", default)]
    pub conditions_v4: Vec<NftCondition>,
    /// nftables `conditionsV6`.
    #[serde(rename = "conditionsV6", default)]
    pub conditions_v6: Vec<NftCondition>,
    /// The owner's network namespace as ADD saw it, to tell later whether the owner is gone.
    /// Absent in records of earlier versions (their owners are never taken over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<NetnsId>,
    /// iptables layout written natively: the handles of its entry rules in
    /// `CNI-HOSTPORT-DNAT`, per family, for DEL and CHECK to find them by lookup instead of
    /// listing a chain that holds every attachment's. Absent where they are not known (the
    /// restore path, records of earlier versions): then the jumps are looked up by listing.
    #[serde(
        rename = "iptablesRules",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub iptables_rules: Vec<Recorded>,
}

/// The owner's network namespace as ADD saw it: the `CNI_NETNS` path, and what identifies the
/// namespace whatever becomes of the path ([`Remembered`]: its nsfs device and inode, its
/// cookie, the id the plugin's namespace gives it). Whether it is gone is told from the
/// kernel's accounts of these, never from the path alone ([`netlink::census`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetnsId {
    /// `CNI_NETNS`.
    pub path: PathBuf,
    /// `st_dev` of the namespace's nsfs file.
    pub dev: u64,
    /// `st_ino` of the namespace's nsfs file: its inode number.
    pub ino: u64,
    /// The namespace's cookie (Linux 5.14 and later). Absent in records of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<u64>,
    /// The id the plugin's namespace gives it (`ip netns list-id`). Absent in records of
    /// earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nsid: Option<i32>,
}

impl NetnsId {
    /// The identity of the namespace at `path`, when it is one that can be opened (with the
    /// plugin's namespace giving it an id if it had none).
    pub fn of(path: &Path) -> Option<NetnsId> {
        let ns = NetNs::open(path)
            .inspect_err(|e| log::debug!("not recording the owner's namespace: {e}"))
            .ok()?;
        let remembered = Remembered::of(&ns)
            .inspect_err(|e| log::debug!("cannot identify {}: {e}", path.display()))
            .ok()?;
        Some(NetnsId {
            path: path.to_path_buf(),
            dev: remembered.identity.dev,
            ino: remembered.identity.ino,
            cookie: remembered.cookie,
            nsid: remembered.nsid,
        })
    }

    fn remembered(&self) -> Remembered {
        Remembered {
            identity: NsIdentity {
                dev: self.dev,
                ino: self.ino,
            },
            cookie: self.cookie,
            nsid: self.nsid,
        }
    }

    /// Whether the namespace is gone, proven by the kernel ([`Remembered::presence`]); the
    /// census is taken, once, only when the id and path do not tell. A namespace that cannot
    /// be proven gone counts as live: a live owner must never lose its ports.
    pub fn is_gone(&self, census: &OnceCell<Census>) -> bool {
        let presence = self
            .remembered()
            .presence(&self.path, || census.get_or_init(Census::take));
        match presence {
            Presence::Gone(proof) => {
                log::info!("network namespace {} is gone: {proof}", self.path.display());
                true
            }
            Presence::Referenced(at) => {
                log::debug!("network namespace {} lives: {at}", self.path.display());
                false
            }
            Presence::Unknown(why) => {
                log::info!(
                    "network namespace {} counts as live: {why}",
                    self.path.display()
                );
                false
            }
        }
    }
}

impl State {
    /// The record of an ADD.
    pub fn new(
        backend: Backend,
        config: &Config,
        att: &Attachment,
        ips: &[IpNet],
        netns: Option<NetnsId>,
    ) -> State {
        let nft = |c: &Conditions| match c {
            Conditions::Nftables(v) => v.clone(),
            _ => Vec::new(),
        };
        State {
            backend,
            network: att.network.clone(),
            container_id: att.container_id.clone(),
            ifname: att.ifname.clone(),
            ips: ips.to_vec(),
            mappings: config.mappings.clone(),
            snat: config.snat,
            masq_all: config.masq_all,
            conditions_v4: nft(&config.conditions_v4),
            conditions_v6: nft(&config.conditions_v6),
            netns,
            iptables_rules: Vec::new(),
        }
    }

    /// The configuration the record was made with, as far as removing it needs: the
    /// mappings, `snat`, `masqAll` and the nftables conditions (a DEL is planned from the
    /// record alone, whatever the DEL's own config says).
    pub fn config(&self) -> Config {
        let conditions = |c: &[NftCondition]| {
            if c.is_empty() {
                Conditions::None
            } else {
                Conditions::Nftables(c.to_vec())
            }
        };
        Config {
            network: self.network.clone(),
            backend: BackendChoice::Fixed(self.backend),
            snat: self.snat,
            masq_all: self.masq_all,
            mark_masq_bit: DEFAULT_MARK_MASQ_BIT,
            external_set_mark_chain: None,
            conditions_v4: conditions(&self.conditions_v4),
            conditions_v6: conditions(&self.conditions_v6),
            mappings: self.mappings.clone(),
        }
    }

    /// Whether `other` records the same mappings of the same attachment, made the same way
    /// (what the kernel recorded for it aside): a re-ADD of it changes nothing.
    pub fn same_as(&self, other: &State) -> bool {
        State {
            iptables_rules: Vec::new(),
            ..self.clone()
        } == State {
            iptables_rules: Vec::new(),
            ..other.clone()
        }
    }

    /// Whether the record claims `key` in the iptables layout: made by the iptables backend,
    /// with a container address of the key's family and a mapping of it.
    pub fn claims(&self, key: &PortKey) -> bool {
        self.backend == Backend::Iptables
            && self.families().contains(&key.family)
            && self.mappings.iter().any(|m| key.is_claimed_by(m))
    }

    /// The host-port keys the record's mappings claim in the iptables layout, in each family
    /// of its container addresses.
    pub fn port_keys(&self) -> Vec<PortKey> {
        if self.backend != Backend::Iptables {
            return Vec::new();
        }
        self.families()
            .into_iter()
            .flat_map(|f| PortKey::of(&self.mappings, f))
            .collect()
    }

    /// The recorded entry rules of `family`, if any.
    pub fn recorded(&self, family: IpFamily) -> Option<&Recorded> {
        let family = netfilter::iptables::Family::from(family);
        self.iptables_rules.iter().find(|r| r.family == family)
    }

    /// The families of the recorded container addresses.
    pub fn families(&self) -> Vec<IpFamily> {
        self.ips.iter().map(|ip| IpFamily::of(ip.addr())).collect()
    }

    /// The attachment it belongs to.
    pub fn attachment(&self) -> Attachment {
        Attachment {
            network: self.network.clone(),
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone(),
        }
    }
}

/// What an attachment's state file gave.
#[derive(Debug)]
pub enum Record {
    /// No file.
    Absent,
    /// The record.
    Found(Box<State>),
    /// A file that did not parse (empty, truncated by a crash, garbage), or only what a writer
    /// killed before its rename left: it was logged and removed, and the attachment's objects
    /// must be found from the kernel's owner comments.
    Discarded,
}

impl Record {
    /// The record, if there was a valid one.
    pub fn found(self) -> Option<State> {
        match self {
            Record::Found(s) => Some(*s),
            Record::Absent | Record::Discarded => None,
        }
    }
}

/// Reads the state file `name`: a file that does not parse counts as absent (it would
/// otherwise fail every DEL and re-ADD of the attachment for good), and is removed
/// ([`StateStore::read_or_discard`]).
///
/// # Errors
/// When the file exists but cannot be read.
pub fn read(store: &StateStore, name: &str) -> Result<Record, PortmapError> {
    if !store.has_any(name) {
        return Ok(Record::Absent);
    }
    match store.read_or_discard::<State>(name) {
        Ok(Some(s)) => Ok(Record::Found(Box::new(s))),
        Ok(None) => Ok(Record::Discarded),
        Err(e) => Err(PortmapError::Store(e)),
    }
}

/// An attachment's record and the file it is in.
#[derive(Debug)]
pub struct Located {
    /// The file: the attachment's ([`file`]), or the one an earlier version named it
    /// ([`names::legacy_state_file`]) when only that holds its record.
    pub file: String,
    /// What the file gave.
    pub record: Record,
}

/// Finds the record of `att`: in its file, else in the file an earlier version named it, when
/// the record there names `att` (under that name two attachments can meet: the record of the
/// other one is none of `att`'s, and is left alone).
///
/// # Errors
/// When a file exists but cannot be read.
pub fn locate(store: &StateStore, att: &Attachment) -> Result<Located, PortmapError> {
    let file = file(att);
    if store.has_any(&file) {
        let record = read(store, &file)?;
        return Ok(Located { file, record });
    }
    let legacy = names::legacy_state_file(&att.network, &att.container_id, &att.ifname);
    if legacy == file {
        return Ok(Located {
            file,
            record: Record::Absent,
        });
    }
    match read(store, &legacy)? {
        Record::Found(s) if s.attachment() == *att => Ok(Located {
            file: legacy,
            record: Record::Found(s),
        }),
        // Another attachment's record, or none.
        Record::Found(_) | Record::Absent => Ok(Located {
            file,
            record: Record::Absent,
        }),
        // Whose it was cannot be told; the kernel's owner comments tell what is ours.
        Record::Discarded => Ok(Located {
            file: legacy,
            record: Record::Discarded,
        }),
    }
}

/// The record of `att`, if it has a valid one.
pub fn record_of(store: &StateStore, att: &Attachment) -> Option<State> {
    locate(store, att).ok()?.record.found()
}

/// Removes the record of `att`: its file, and the file of an earlier version where that holds
/// `att`'s record (never another attachment's).
///
/// # Errors
/// The store's failure.
pub fn remove_record(store: &StateStore, att: &Attachment) -> Result<(), PortmapError> {
    let own = file(att);
    store.remove(&own).map_err(PortmapError::Store)?;
    let Located { file: found, .. } = locate(store, att)?;
    if found != own {
        store.remove(&found).map_err(PortmapError::Store)?;
    }
    Ok(())
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

impl Holders for Records<'_> {
    fn by_owner(&self, owner: &str) -> Fate {
        let Some((network, id, ifname)) = names::parse_owner(owner) else {
            return Fate::Live;
        };
        let att = Attachment {
            network: network.to_string(),
            container_id: id.to_string(),
            ifname: ifname.to_string(),
        };
        match record_of(self.store, &att) {
            Some(record) if record.attachment().owner() == owner && self.gone(&record) => {
                Fate::Gone(vec![record])
            }
            _ => Fate::Live,
        }
    }

    fn by_container(&self, network: &str, container_id: &str) -> Fate {
        let prefix = names::state_file_prefix(network, container_id);
        let legacy = names::legacy_state_file(network, container_id, "");
        let legacy = legacy.trim_end_matches(".json");
        let records: Vec<State> = self
            .store
            .list()
            .unwrap_or_default()
            .iter()
            .filter(|name| name.starts_with(&prefix) || name.starts_with(legacy))
            .filter_map(|name| read(self.store, name).ok()?.found())
            .filter(|r| r.network == network && r.container_id == container_id)
            .collect();
        if records.is_empty() || !records.iter().all(|r| self.gone(r)) {
            return Fate::Live;
        }
        Fate::Gone(records)
    }

    fn indexed(&self, key: &PortKey) -> Option<Attachment> {
        self.index.holder(key)
    }

    fn record(&self, att: &Attachment) -> Option<State> {
        record_of(self.store, att)
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
        self.store.dir().join(names::port_index_entry(key))
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
        for key in state.port_keys() {
            let link = self.entry(&key);
            match self.owner_at(&link) {
                Some(holder) if holder == att => continue,
                Some(holder)
                    if holder.network == att.network
                        && holder.container_id == att.container_id
                        && record_of(self.store, &holder).is_some_and(|h| h.claims(&key)) =>
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
                locate(self.store, &att).is_ok_and(|l| !matches!(l.record, Record::Absent))
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
            record.attachment().owner()
        );
        let att = record.attachment();
        PortIndex::new(store).release(&att, &record.port_keys());
        if let Err(e) = remove_record(store, &att) {
            log::warn!(
                "failed to remove the record of {}: {e}",
                record.container_id
            );
        }
    }
}

/// The store of the namespace this process runs in.
///
/// # Errors
/// When the namespace cannot be identified.
pub fn store() -> Result<StateStore, PortmapError> {
    let ino = std::fs::metadata("/proc/self/ns/net")
        .map_err(|e| {
            PortmapError::Store(host::store::StoreError::Io {
                op: "identify the network namespace of",
                path: "/proc/self/ns/net".into(),
                source: e,
            })
        })?
        .ino();
    Ok(StateStore::new(
        std::path::Path::new(names::STATE_DIR).join(format!("net-{ino}")),
    ))
}

/// The file name of an attachment's state ([`names::state_file`]).
pub fn file(att: &Attachment) -> String {
    names::state_file(&att.network, &att.container_id, &att.ifname)
}

/// Writes `state` to `name` ([`StateStore::write`]: atomic, not fsynced, never through a
/// planted file). A failed write leaves no directory it made behind.
///
/// # Errors
/// The store's failure.
pub fn write(store: &StateStore, name: &str, state: &State) -> Result<(), PortmapError> {
    store.write(name, state).map_err(|e| {
        store.prune();
        PortmapError::Store(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_prune_removes_only_an_empty_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::new(tmp.path().join("net-1"));
        store.write("a.json", &1).unwrap();
        let att = Attachment {
            network: "n".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
        };
        let config = crate::config::test_config(Vec::new());
        let st = State::new(Backend::Nftables, &config, &att, &[], None);
        write(&store, "b.json", &st).unwrap();
        assert_eq!(store.read::<State>("b.json").unwrap(), Some(st));
        assert_eq!(store.list().unwrap(), ["a.json", "b.json"]);
        store.remove("b.json").unwrap();
        store.prune();
        assert!(store.dir().exists(), "a directory with state must stay");
        store.remove("a.json").unwrap();
        store.prune();
        assert!(!store.dir().exists());
        store.prune();
    }

    /// Runs `f` in a network namespace of its own (where the ids `NetnsId::of` gives go).
    fn isolated(f: impl FnOnce() + Send) {
        host::netns::in_new_netns(f).expect("a network namespace of our own needs root");
    }

    /// Whether `id` is gone, once the kernel has settled (a namespace whose last holder let
    /// go is destroyed by a kernel worker).
    fn settles_gone(id: &NetnsId) -> bool {
        (0..400).any(|_| {
            let gone = id.is_gone(&OnceCell::new());
            if !gone {
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            gone
        })
    }

    #[test]
    fn an_owner_is_gone_only_once_its_namespace_is_not_once_its_path_is() {
        isolated(|| {
            // A namespace X, and a process in it whose path ADD records.
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let (ready, got) = std::sync::mpsc::channel();
            let inside = std::thread::spawn(move || {
                host::netns::in_new_netns(move || {
                    let child = std::process::Command::new("sleep")
                        .arg("1000")
                        .spawn()
                        .unwrap();
                    ready.send(child).unwrap();
                    // This thread keeps X while it waits.
                    let _ = rx.recv();
                })
                .unwrap();
            });
            let mut child = got.recv().unwrap();
            let path = PathBuf::from(format!("/proc/{}/ns/net", child.id()));
            let id = NetnsId::of(&path).unwrap();
            assert!(id.nsid.is_some(), "{id:?}");
            assert!(!id.is_gone(&OnceCell::new()));
            // The process exits: its path is gone, the namespace is not (issue 26 item 3).
            child.kill().unwrap();
            child.wait().unwrap();
            assert!(!path.exists());
            let census = OnceCell::new();
            assert!(!id.is_gone(&census), "taken for gone with a thread in it");
            // Nothing holds it any more.
            drop(tx);
            inside.join().unwrap();
            assert!(settles_gone(&id));
            // An earlier version's record tells only the path and inode: never proven gone.
            let earlier = NetnsId {
                cookie: None,
                nsid: None,
                ..id
            };
            assert!(!earlier.is_gone(&OnceCell::new()));
            // Something that is no namespace is not recorded.
            let tmp = tempfile::tempdir().unwrap();
            std::fs::write(tmp.path().join("ns"), "").unwrap();
            assert_eq!(NetnsId::of(&tmp.path().join("ns")), None);
        });
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
        PortIndex::new(&store).release(&ab, &a.port_keys());
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
        assert!(nft.port_keys().is_empty() && !nft.claims(&key(8080)));
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

    #[test]
    fn a_failed_write_leaves_no_directory_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let store = StateStore::new(tmp.path().join("net-1"));
        let att = Attachment {
            network: "n".into(),
            container_id: "c".repeat(300),
            ifname: "eth0".into(),
        };
        let config = crate::config::test_config(Vec::new());
        let st = State::new(Backend::Nftables, &config, &att, &[], None);
        // Longer than a file name may be (NAME_MAX, 255 bytes).
        let err = write(&store, &file(&att), &st).unwrap_err();
        assert!(err.to_string().contains("failed to write"), "{err}");
        assert!(
            !store.dir().exists(),
            "{} left behind",
            store.dir().display()
        );
    }
}
