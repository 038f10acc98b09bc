//! The per-attachment state file: what ADD programmed, so DEL works without `runtimeConfig`
//! or `prevResult` and without listing whole maps.
//!
//! Files live under `/run/cni/portmap/net-<inode>/` (tmpfs: gone on reboot, like the kernel
//! state they describe), one directory per network namespace the plugin runs in, with the
//! iptables layout's host-port index beside them (the `ports` module's `PortIndex`).

use std::os::unix::fs::MetadataExt;

use host::store::StateStore;
use ipnet::IpNet;
use netfilter::iptables::native::Recorded;
use serde::{Deserialize, Serialize};

use crate::config::{
    Backend, BackendChoice, Conditions, Config, DEFAULT_MARK_MASQ_BIT, IpFamily, NftCondition,
    PortMapping,
};
use crate::error::PortmapError;
use crate::names;
use cni::Attachment;

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
    /// The iptables layout's `markMasqBit` and `externalSetMarkChain`, and its conditions
    /// (the entry rules' extra arguments), so that `portmap reconcile` can write the
    /// attachment's rules again as its ADD wrote them. Absent in records of earlier versions
    /// and of the nftables layout, whose objects do not depend on them: an iptables record
    /// without them is left alone by `reconcile`.
    #[serde(rename = "iptables", default, skip_serializing_if = "Option::is_none")]
    pub iptables: Option<IptablesMade>,
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

/// What an iptables ADD was made with beyond the mappings, `snat` and `masqAll`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IptablesMade {
    /// `markMasqBit`.
    #[serde(rename = "markMasqBit")]
    pub mark_masq_bit: u32,
    /// `externalSetMarkChain`.
    #[serde(
        rename = "externalSetMarkChain",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub external_set_mark_chain: Option<String>,
    /// iptables `conditionsV4`.
    #[serde(
        rename = "conditionsV4",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions_v4: Vec<String>,
    /// iptables `conditionsV6`.
    #[serde(
        rename = "conditionsV6",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions_v6: Vec<String>,
}

/// The owner's network namespace as ADD saw it ([`netlink::census::NetnsId`], shared with the
/// firewall plugin, whose records keep the same).
pub use netlink::census::NetnsId;

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
        let ipt = |c: &Conditions| match c {
            Conditions::Iptables(v) => v.clone(),
            _ => Vec::new(),
        };
        let iptables = (backend == Backend::Iptables).then(|| IptablesMade {
            mark_masq_bit: config.mark_masq_bit,
            external_set_mark_chain: config.external_set_mark_chain.clone(),
            conditions_v4: ipt(&config.conditions_v4),
            conditions_v6: ipt(&config.conditions_v6),
        });
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
            iptables,
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

    /// The configuration the attachment's ADD was made with, in full: for `portmap
    /// reconcile` to make its objects again. `None` for an iptables record of an earlier
    /// version, which does not say how its rules were made.
    pub fn made_with(&self) -> Option<Config> {
        let mut config = self.config();
        if self.backend == Backend::Nftables {
            return Some(config);
        }
        let made = self.iptables.as_ref()?;
        let conditions = |c: &[String]| {
            if c.is_empty() {
                Conditions::None
            } else {
                Conditions::Iptables(c.to_vec())
            }
        };
        config.mark_masq_bit = made.mark_masq_bit;
        config.external_set_mark_chain = made.external_set_mark_chain.clone();
        config.conditions_v4 = conditions(&made.conditions_v4);
        config.conditions_v6 = conditions(&made.conditions_v6);
        Some(config)
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
