//! Per-attachment state of the iptables and firewalld backends, whose kernel objects carry no
//! owner: the IPs each attachment was given (so DEL works without prevResult and GC finds
//! stale attachments), and which attachment last claimed each IP (so a stale DEL never removes
//! the accepts of a newer container that reuses the address).
//!
//! Every backend records how ADD made each attachment ([`Made`]: the backend, its keys, the
//! bridge, and the owner's network namespace as [`NetnsId`]), so that `firewall reconcile`
//! can put back what something else removed, and tell a dead attachment from a live one.
//!
//! Layout: `/run/cni-firewall/<netns inode>/attachments/<network>:<containerID>:<ifname>` and
//! `…/ips/<ip>`, JSON, written atomically; plus `…/lock`, serialising our read-modify-write
//! of the rules within one network namespace.

use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use std::cell::OnceCell;

use cni::Attachment;
use host::lock::FileLock;
use host::store::StateStore;
use netlink::census::NetnsId;
use serde::{Deserialize, Serialize};

use crate::config::{BackendChoice, Config, IngressPolicy};
use crate::error::FirewallError;
use crate::names::{DEFAULT_ADMIN_CHAIN, DEFAULT_ZONE, LOCK_WAIT, RUN_DIR};
use crate::plan::Target;

/// What one attachment was given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentState {
    /// Its addresses.
    pub ips: Vec<IpAddr>,
    /// The accepts its ADD appended to `CNI-FORWARD` over nf_tables, by handle, so that DEL
    /// finds them without listing the chain. Empty when the tools wrote them (legacy iptables,
    /// a fallback) and in the records of earlier versions: DEL then looks them up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepts: Vec<Accept>,
    /// How ADD made it. Absent in the records of earlier versions, which `reconcile` leaves
    /// alone: it neither puts their objects back nor drops them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<Made>,
}

/// How ADD made an attachment: what putting its objects back needs, and its owner's network
/// namespace, to tell whether the attachment is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Made {
    /// The backend that made it: `iptables`, `nftables` or `firewalld` (text, so that a
    /// backend of a later version reads as one this version does not know, not as garbage).
    pub backend: String,
    /// The network name.
    pub network: String,
    /// The container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name.
    pub ifname: String,
    /// `ingressPolicy`.
    #[serde(rename = "ingressPolicy")]
    pub ingress: IngressPolicy,
    /// The bridge its isolation rules are for, under an ingress policy other than `open`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<String>,
    /// `iptablesAdminChainName`, for the iptables backend.
    #[serde(
        rename = "adminChain",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub admin_chain: Option<String>,
    /// `firewalldZone`, for the firewalld backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The owner's network namespace as ADD saw it; absent when `CNI_NETNS` could not be
    /// identified then (the attachment then never counts as gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<NetnsId>,
}

impl Made {
    /// What an ADD of `owner` with `target` by `backend` under `config` records.
    #[must_use]
    pub fn new(backend: &str, config: &Config, owner: &Attachment, target: &Target) -> Made {
        Made {
            backend: backend.to_owned(),
            network: owner.network.clone(),
            container_id: owner.container_id.clone(),
            ifname: owner.ifname.clone(),
            ingress: config.ingress,
            bridge: target.bridge.clone(),
            admin_chain: (backend == "iptables").then(|| config.admin_chain.clone()),
            zone: (backend == "firewalld").then(|| config.zone.clone()),
            netns: target.netns.clone(),
        }
    }

    /// The configuration to make it again with; `None` for a backend this version does not
    /// know.
    #[must_use]
    pub fn config(&self) -> Option<Config> {
        let backend = match self.backend.as_str() {
            "iptables" => BackendChoice::Iptables,
            "nftables" => BackendChoice::Nftables,
            "firewalld" => BackendChoice::Firewalld,
            _ => return None,
        };
        Some(Config {
            backend,
            admin_chain: self
                .admin_chain
                .clone()
                .unwrap_or_else(|| DEFAULT_ADMIN_CHAIN.to_owned()),
            zone: self.zone.clone().unwrap_or_else(|| DEFAULT_ZONE.to_owned()),
            ingress: self.ingress,
        })
    }

    /// The attachment.
    #[must_use]
    pub fn owner(&self) -> Attachment {
        Attachment::new(&self.network, &self.container_id, &self.ifname)
    }

    /// What it needs opened, for the addresses `ips`.
    #[must_use]
    pub fn target(&self, ips: Vec<IpAddr>) -> Target {
        Target {
            ips,
            bridge: self.bridge.clone(),
            netns: self.netns.clone(),
        }
    }
}

/// An accept rule an ADD appended: the address it is for, its nf_tables handle in
/// `CNI-FORWARD` of the address family's `filter` table, and that table's handle then. A table
/// never reuses a rule handle, and a namespace never reuses a table handle: while the table
/// has that handle, the rule handle names this accept, or nothing once it is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accept {
    /// The address.
    pub ip: IpAddr,
    /// The rule's handle.
    pub handle: u64,
    /// The handle of the table the rule is in.
    pub table: u64,
}

/// The state directory of the calling thread's network namespace.
#[derive(Debug)]
pub struct State {
    dir: PathBuf,
    attachments: StateStore,
    ips: StateStore,
    /// The caller holds the namespace's lock for as long as this value lives
    /// ([`State::under`]): [`State::lock`] then takes nothing.
    held: bool,
}

impl State {
    /// The state of the namespace the plugin runs in.
    ///
    /// # Errors
    /// When the namespace cannot be identified.
    pub fn for_current_netns() -> Result<State, FirewallError> {
        let ino = std::fs::metadata("/proc/thread-self/ns/net")
            .map_err(FirewallError::Netns)?
            .ino();
        Ok(State::in_dir(PathBuf::from(RUN_DIR).join(ino.to_string())))
    }

    /// The state under `dir`.
    #[must_use]
    pub fn in_dir(dir: PathBuf) -> State {
        State {
            attachments: StateStore::new(dir.join("attachments")),
            ips: StateStore::new(dir.join("ips")),
            dir,
            held: false,
        }
    }

    /// The same state for a backend working while the caller holds the namespace's lock
    /// (`_lock`, from this state's [`State::lock`]): `reconcile` takes it once and has the
    /// backends do their ADD and DEL under it. The lock is `flock`, which a second open of the
    /// file in the same process would wait for.
    #[must_use]
    pub fn under(&self, _lock: &FileLock) -> State {
        State {
            held: true,
            ..State::in_dir(self.dir.clone())
        }
    }

    /// Takes the namespace's lock (code 11 after [`LOCK_WAIT`]); none when the caller holds
    /// it already ([`State::under`]).
    ///
    /// # Errors
    /// [`FirewallError::Lock`].
    pub fn lock(&self) -> Result<Option<FileLock>, FirewallError> {
        if self.held {
            return Ok(None);
        }
        Ok(Some(FileLock::acquire(self.dir.join("lock"), LOCK_WAIT)?))
    }

    /// The lock for a DEL or GC, which must clean the kernel up even when the state
    /// directory is read-only or full ([`FileLock::acquire_for_teardown`]: the lock file
    /// locked read-only, or none where it cannot exist).
    ///
    /// # Errors
    /// [`FirewallError::Lock`]: a timeout, or a lock file that cannot be opened otherwise.
    pub fn lock_for_teardown(&self) -> Result<Option<FileLock>, FirewallError> {
        if self.held {
            return Ok(None);
        }
        Ok(FileLock::acquire_for_teardown(
            self.dir.join("lock"),
            LOCK_WAIT,
        )?)
    }

    /// Forgets the attachments that cannot be live ones of this namespace: the caller found
    /// the namespace without our skeleton, which is a new namespace that got the inode number
    /// of an earlier one (whose records are here), or this one after something flushed its
    /// firewall (a reload, `iptables -F; -X`), whose live attachments `reconcile` must still
    /// find. So it keeps the records whose owner's namespace is not proven gone
    /// ([`NetnsId::is_gone`], asked here: the ids an earlier namespace gave are none of this
    /// one's), and drops the others and the records of earlier versions, which tell nothing
    /// of how they were made (as those versions did: they forgot every attachment here).
    ///
    /// # Errors
    /// A record that cannot be read or removed.
    pub fn reset(&self) -> Result<(), FirewallError> {
        let census = OnceCell::new();
        let mut kept = 0;
        for name in self.attachments.list()? {
            let record = self.attachment(&name)?;
            let live = record
                .as_ref()
                .and_then(|r| r.made.as_ref())
                .is_some_and(|m| !m.netns.as_ref().is_some_and(|n| n.is_gone(&census)));
            if live {
                kept += 1;
                continue;
            }
            let ips = match record {
                Some(record) => record.ips,
                None => self.claimed_by(&name)?,
            };
            self.forget(&name, &ips)?;
        }
        if kept == 0 {
            // Claims no record names (a crash between the two writes) go too.
            match std::fs::remove_dir_all(self.ips.dir()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(FirewallError::Netns(e)),
            }
        } else {
            log::info!("kept the records of {kept} attachment(s) whose namespace lives");
        }
        Ok(())
    }

    /// The names of every recorded attachment, sorted.
    ///
    /// # Errors
    /// An unreadable state directory.
    pub fn names(&self) -> Result<Vec<String>, FirewallError> {
        Ok(self.attachments.list()?)
    }

    /// The recorded IPs of an attachment; none when its record does not parse (logged, and
    /// removed: a crash or garbage must not wedge the attachment's DEL or a new ADD).
    ///
    /// # Errors
    /// A state file that cannot be read.
    pub fn attachment(&self, name: &str) -> Result<Option<AttachmentState>, FirewallError> {
        Ok(self.attachments.read_or_discard(name)?)
    }

    /// What a DEL of attachment `name` removes: the IPs recorded at ADD and those of
    /// prevResult (`target`) when the runtime passed it, with the accepts recorded.
    ///
    /// # Errors
    /// An unreadable state file.
    pub fn to_remove(
        &self,
        name: &str,
        target: Option<&crate::backend::Target>,
    ) -> Result<AttachmentState, FirewallError> {
        let existed = self.attachments.has_any(name);
        let mut record = match self.attachment(name)? {
            Some(record) => record,
            // There was a record, but it did not parse (a crash, garbage; now removed): the
            // claims name its addresses. A rare path, so a scan of the claims is fine.
            None if existed => AttachmentState {
                ips: self.claimed_by(name)?,
                ..AttachmentState::default()
            },
            None => AttachmentState::default(),
        };
        for ip in target.map(|t| t.ips.as_slice()).unwrap_or_default() {
            if !record.ips.contains(ip) {
                record.ips.push(*ip);
            }
        }
        Ok(record)
    }

    /// Records an attachment, and claims its IPs.
    ///
    /// # Errors
    /// An unwritable state file.
    pub fn record(&self, name: &str, record: &AttachmentState) -> Result<(), FirewallError> {
        self.rewrite(name, record)?;
        for ip in &record.ips {
            self.ips.write(&ip.to_string(), &name)?;
        }
        Ok(())
    }

    /// Rewrites an attachment's record (with the accepts now known, say; its IPs already
    /// claimed).
    ///
    /// # Errors
    /// An unwritable state file.
    pub fn rewrite(&self, name: &str, record: &AttachmentState) -> Result<(), FirewallError> {
        self.attachments.write(name, record)?;
        Ok(())
    }

    /// Whether an attachment claims one of `ips`.
    ///
    /// # Errors
    /// An unreadable state file.
    pub fn claims_any(&self, ips: &[IpAddr]) -> Result<bool, FirewallError> {
        for ip in ips {
            if self
                .ips
                .read_or_discard::<String>(&ip.to_string())?
                .is_some()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The attachment that claims `ip`, if one does.
    ///
    /// # Errors
    /// An unreadable state file.
    pub fn claimant(&self, ip: IpAddr) -> Result<Option<String>, FirewallError> {
        Ok(self.ips.read_or_discard(&ip.to_string())?)
    }

    /// Whether `ip` is claimed by an attachment other than `name`.
    ///
    /// # Errors
    /// An unreadable state file.
    pub fn claimed_by_other(&self, ip: IpAddr, name: &str) -> Result<bool, FirewallError> {
        let owner: Option<String> = self.ips.read_or_discard(&ip.to_string())?;
        Ok(owner.is_some_and(|o| o != name))
    }

    /// The IPs whose claim names attachment `name` (reads every claim).
    ///
    /// # Errors
    /// An unreadable state directory.
    pub fn claimed_by(&self, name: &str) -> Result<Vec<IpAddr>, FirewallError> {
        let mut ips = Vec::new();
        for ip in self.ips.list()? {
            let owner: Option<String> = self.ips.read_or_discard(&ip)?;
            if owner.as_deref() == Some(name)
                && let Ok(ip) = ip.parse()
            {
                ips.push(ip);
            }
        }
        Ok(ips)
    }

    /// Forgets an attachment and releases the IPs it still claims.
    ///
    /// # Errors
    /// A state file that cannot be removed.
    pub fn forget(&self, name: &str, ips: &[IpAddr]) -> Result<(), FirewallError> {
        for ip in ips {
            if !self.claimed_by_other(*ip, name)? {
                self.ips.remove(&ip.to_string())?;
            }
        }
        self.attachments.remove(name)?;
        Ok(())
    }

    /// The recorded attachments of `network`.
    ///
    /// # Errors
    /// An unreadable state directory.
    pub fn attachments_of(&self, network: &str) -> Result<Vec<String>, FirewallError> {
        let prefix = host::store::attachment_prefix(network, None);
        Ok(self
            .attachments
            .list()?
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ips: &[IpAddr], accepts: &[Accept]) -> AttachmentState {
        AttachmentState {
            ips: ips.to_vec(),
            accepts: accepts.to_vec(),
            made: None,
        }
    }

    #[test]
    fn claims_follow_the_latest_attachment_and_forget_releases_only_own_claims() {
        let dir = tempfile::tempdir().unwrap();
        let state = State::in_dir(dir.path().to_path_buf());
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        state.record("net:old:eth0", &rec(&[ip], &[])).unwrap();
        let accepts = [Accept {
            ip,
            handle: 7,
            table: 3,
        }];
        state.record("net:new:eth0", &rec(&[ip], &accepts)).unwrap();
        assert!(state.claimed_by_other(ip, "net:old:eth0").unwrap());
        assert!(!state.claimed_by_other(ip, "net:new:eth0").unwrap());
        state.forget("net:old:eth0", &[ip]).unwrap();
        assert!(state.claimed_by_other(ip, "net:old:eth0").unwrap());
        assert_eq!(state.attachments_of("net").unwrap(), ["net:new:eth0"]);
        assert_eq!(
            state.attachment("net:new:eth0").unwrap(),
            Some(rec(&[ip], &accepts))
        );
        state.forget("net:new:eth0", &[ip]).unwrap();
        assert!(!state.claimed_by_other(ip, "x").unwrap());
        assert!(state.attachments_of("net").unwrap().is_empty());
        state.record("net:stale:eth0", &rec(&[ip], &[])).unwrap();
        state.reset().unwrap();
        assert!(!state.claimed_by_other(ip, "x").unwrap());
        assert!(state.attachments_of("net").unwrap().is_empty());
        let _lock = state.lock().unwrap();
    }

    #[test]
    fn an_unparsable_record_is_absent_and_its_claims_name_its_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let state = State::in_dir(dir.path().to_path_buf());
        let ips: [IpAddr; 2] = ["10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        state.record("net:a:eth0", &rec(&ips, &[])).unwrap();
        state
            .record("net:b:eth0", &rec(&["10.0.0.3".parse().unwrap()], &[]))
            .unwrap();
        for garbage in ["", "{\"ips\": [", "\u{0}\u{1}garbage"] {
            let path = dir.path().join("attachments/net:a:eth0");
            std::fs::write(&path, garbage).unwrap();
            let record = state.to_remove("net:a:eth0", None).unwrap();
            assert_eq!(record.ips, ips, "{garbage:?}");
            assert!(!path.exists(), "the garbage stays");
            assert_eq!(state.attachment("net:a:eth0").unwrap(), None);
            state.record("net:a:eth0", &rec(&ips, &[])).unwrap();
        }
        // A claim that does not parse is no claim.
        std::fs::write(dir.path().join("ips/10.0.0.3"), "garbage").unwrap();
        assert!(
            !state
                .claimed_by_other("10.0.0.3".parse().unwrap(), "x")
                .unwrap()
        );
        assert_eq!(state.attachments_of("net").unwrap().len(), 2);
    }

    fn made(owner: &Attachment, netns: Option<NetnsId>) -> Made {
        let config = Config {
            backend: BackendChoice::Iptables,
            admin_chain: "MY-ADMIN".into(),
            zone: "trusted".into(),
            ingress: IngressPolicy::SameBridge,
        };
        let target = Target {
            ips: vec!["10.0.0.2".parse().unwrap()],
            bridge: Some("br0".into()),
            netns,
        };
        Made::new("iptables", &config, owner, &target)
    }

    #[test]
    fn a_record_says_how_its_attachment_was_made_and_gives_it_back() {
        let owner = Attachment::new("net", "ctr", "eth0");
        let m = made(&owner, None);
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "backend": "iptables", "network": "net", "containerID": "ctr", "ifname": "eth0",
                "ingressPolicy": "same-bridge", "bridge": "br0", "adminChain": "MY-ADMIN",
            })
        );
        assert_eq!(serde_json::from_value::<Made>(json).unwrap(), m);
        assert_eq!(m.owner(), owner);
        let config = m.config().unwrap();
        assert_eq!(
            (config.backend, config.admin_chain.as_str(), config.ingress),
            (
                BackendChoice::Iptables,
                "MY-ADMIN",
                IngressPolicy::SameBridge
            )
        );
        let target = m.target(vec!["10.0.0.3".parse().unwrap()]);
        assert_eq!(target.bridge.as_deref(), Some("br0"));
        // A backend of a later version is one this version does not know, not garbage.
        let later = Made {
            backend: "ebpf".into(),
            ..m
        };
        assert!(later.config().is_none());
        let dir = tempfile::tempdir().unwrap();
        let state = State::in_dir(dir.path().to_path_buf());
        let record = AttachmentState {
            made: Some(later),
            ..rec(&["10.0.0.2".parse().unwrap()], &[])
        };
        state.record("net:ctr:eth0", &record).unwrap();
        assert_eq!(state.attachment("net:ctr:eth0").unwrap(), Some(record));
    }

    #[test]
    fn a_reset_keeps_the_records_of_owners_whose_namespace_lives() {
        host::netns::in_new_netns(|| {
            let dir = tempfile::tempdir().unwrap();
            let state = State::in_dir(dir.path().to_path_buf());
            let live = NetnsId::of(std::path::Path::new("/proc/thread-self/ns/net")).unwrap();
            // An id no namespace has: what a gone one's id is.
            let gone = NetnsId {
                nsid: Some(1_000_000),
                ..live.clone()
            };
            let record = |owner: &str, ip: &str, netns: Option<NetnsId>| {
                let owner = Attachment::new("net", owner, "eth0");
                let record = AttachmentState {
                    made: Some(made(&owner, netns)),
                    ..rec(&[ip.parse().unwrap()], &[])
                };
                state
                    .record(&crate::names::state_name(&owner), &record)
                    .unwrap();
            };
            record("live", "10.0.0.2", Some(live));
            record("gone", "10.0.0.3", Some(gone));
            record("unknown", "10.0.0.4", None);
            state
                .record("net:old:eth0", &rec(&["10.0.0.5".parse().unwrap()], &[]))
                .unwrap();
            let _lock = state.lock().unwrap();
            state.reset().unwrap();
            // One that recorded no namespace is never taken for gone.
            assert_eq!(
                state.names().unwrap(),
                ["net:live:eth0", "net:unknown:eth0"]
            );
            assert!(state.claims_any(&["10.0.0.2".parse().unwrap()]).unwrap());
            assert!(state.claims_any(&["10.0.0.4".parse().unwrap()]).unwrap());
            for ip in ["10.0.0.3", "10.0.0.5"] {
                assert!(!state.claims_any(&[ip.parse().unwrap()]).unwrap(), "{ip}");
            }
        })
        .expect("a network namespace of our own needs root");
    }

    #[test]
    fn a_state_under_a_held_lock_takes_none_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let state = State::in_dir(dir.path().to_path_buf());
        let lock = state.lock().unwrap().unwrap();
        let under = state.under(&lock);
        assert!(under.lock().unwrap().is_none());
        assert!(under.lock_for_teardown().unwrap().is_none());
    }

    #[test]
    fn records_of_earlier_versions_read_without_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let state = State::in_dir(dir.path().to_path_buf());
        std::fs::create_dir_all(dir.path().join("attachments")).unwrap();
        std::fs::write(
            dir.path().join("attachments/net:old:eth0"),
            r#"{"ips":["10.0.0.2","fd00::2"]}"#,
        )
        .unwrap();
        let record = state.attachment("net:old:eth0").unwrap().unwrap();
        assert_eq!(record.ips.len(), 2);
        assert!(record.accepts.is_empty());
    }
}
