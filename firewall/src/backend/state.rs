//! Per-attachment state of the iptables and firewalld backends, whose kernel objects carry no
//! owner: the IPs each attachment was given (so DEL works without prevResult and GC finds
//! stale attachments), and which attachment last claimed each IP (so a stale DEL never removes
//! the accepts of a newer container that reuses the address).
//!
//! Layout: `/run/cni-firewall/<netns inode>/attachments/<network>:<containerID>:<ifname>` and
//! `…/ips/<ip>`, JSON, written atomically; plus `…/lock`, serialising our read-modify-write
//! of the rules within one network namespace.

use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use host::lock::FileLock;
use host::store::StateStore;
use serde::{Deserialize, Serialize};

use crate::error::FirewallError;
use crate::names::{LOCK_WAIT, RUN_DIR};

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
        }
    }

    /// Takes the namespace's lock (code 11 after [`LOCK_WAIT`]).
    ///
    /// # Errors
    /// [`FirewallError::Lock`].
    pub fn lock(&self) -> Result<FileLock, FirewallError> {
        Ok(FileLock::acquire(self.dir.join("lock"), LOCK_WAIT)?)
    }

    /// The lock for a DEL or GC, which must clean the kernel up even when the state
    /// directory is read-only or full ([`FileLock::acquire_for_teardown`]: the lock file
    /// locked read-only, or none where it cannot exist).
    ///
    /// # Errors
    /// [`FirewallError::Lock`]: a timeout, or a lock file that cannot be opened otherwise.
    pub fn lock_for_teardown(&self) -> Result<Option<FileLock>, FirewallError> {
        Ok(FileLock::acquire_for_teardown(
            self.dir.join("lock"),
            LOCK_WAIT,
        )?)
    }

    /// Forgets every attachment: the caller found the namespace without our skeleton, so any
    /// state here belongs to an earlier namespace that had the same inode number.
    ///
    /// # Errors
    /// A directory that cannot be removed.
    pub fn reset(&self) -> Result<(), FirewallError> {
        for dir in [self.attachments.dir(), self.ips.dir()] {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(FirewallError::Netns(e)),
            }
        }
        Ok(())
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
                accepts: Vec::new(),
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

    /// Records an attachment with the accepts known to be its own, and claims its IPs.
    ///
    /// # Errors
    /// An unwritable state file.
    pub fn record(
        &self,
        name: &str,
        ips: &[IpAddr],
        accepts: &[Accept],
    ) -> Result<(), FirewallError> {
        self.record_accepts(name, ips, accepts)?;
        for ip in ips {
            self.ips.write(&ip.to_string(), &name)?;
        }
        Ok(())
    }

    /// Rewrites an attachment's record with `accepts` (its IPs already claimed).
    ///
    /// # Errors
    /// An unwritable state file.
    pub fn record_accepts(
        &self,
        name: &str,
        ips: &[IpAddr],
        accepts: &[Accept],
    ) -> Result<(), FirewallError> {
        self.attachments.write(
            name,
            &AttachmentState {
                ips: ips.to_vec(),
                accepts: accepts.to_vec(),
            },
        )?;
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

    #[test]
    fn claims_follow_the_latest_attachment_and_forget_releases_only_own_claims() {
        let dir = tempfile::tempdir().unwrap();
        let state = State::in_dir(dir.path().to_path_buf());
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        state.record("net:old:eth0", &[ip], &[]).unwrap();
        let accepts = [Accept {
            ip,
            handle: 7,
            table: 3,
        }];
        state.record("net:new:eth0", &[ip], &accepts).unwrap();
        assert!(state.claimed_by_other(ip, "net:old:eth0").unwrap());
        assert!(!state.claimed_by_other(ip, "net:new:eth0").unwrap());
        state.forget("net:old:eth0", &[ip]).unwrap();
        assert!(state.claimed_by_other(ip, "net:old:eth0").unwrap());
        assert_eq!(state.attachments_of("net").unwrap(), ["net:new:eth0"]);
        assert_eq!(
            state.attachment("net:new:eth0").unwrap(),
            Some(AttachmentState {
                ips: vec![ip],
                accepts: accepts.to_vec()
            })
        );
        state.forget("net:new:eth0", &[ip]).unwrap();
        assert!(!state.claimed_by_other(ip, "x").unwrap());
        assert!(state.attachments_of("net").unwrap().is_empty());
        state.record("net:stale:eth0", &[ip], &[]).unwrap();
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
        state.record("net:a:eth0", &ips, &[]).unwrap();
        state
            .record("net:b:eth0", &["10.0.0.3".parse().unwrap()], &[])
            .unwrap();
        for garbage in ["", "{\"ips\": [", "\u{0}\u{1}garbage"] {
            let path = dir.path().join("attachments/net:a:eth0");
            std::fs::write(&path, garbage).unwrap();
            let record = state.to_remove("net:a:eth0", None).unwrap();
            assert_eq!(record.ips, ips, "{garbage:?}");
            assert!(!path.exists(), "the garbage stays");
            assert_eq!(state.attachment("net:a:eth0").unwrap(), None);
            state.record("net:a:eth0", &ips, &[]).unwrap();
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
