//! The kernel side: reading and changing the interface and sysctls inside the container netns,
//! and the backup file around it. The only code of the crate that changes anything.
//!
//! Each verb runs on one thread inside `CNI_NETNS` (netlink socket and `/proc/sys/net` files are
//! opened there, so they are the container's); the backup file lives in the host's mount
//! namespace, which that thread shares.

use std::io;

use host::netns::NetNs;
use host::sysctl::{Sysctl, SysctlError};
use netlink::Netlink;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};

use crate::backup::{Backup, BackupStore};
use crate::config::{Config, SysctlSetting};
use crate::error::{SysctlProblem, TuningError};
use cni::Attachment;

use crate::plan::{self, LinkState};

/// Reads `ifname` (`ip -d link show dev IFNAME`); `None` when it does not exist.
///
/// # Errors
/// [`TuningError::Netlink`] for failures other than "no such device".
pub fn observe_link(nl: &mut Netlink, ifname: &str) -> Result<Option<LinkState>, TuningError> {
    let mut msg = LinkMessage::default();
    msg.attributes
        .push(LinkAttribute::IfName(ifname.to_string()));
    let replies = match nl.request(
        format!("get link {ifname:?}"),
        RouteNetlinkMessage::GetLink(msg),
        0,
    ) {
        Ok(r) => r,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(replies.into_iter().find_map(|reply| match reply {
        RouteNetlinkMessage::NewLink(m) => Some(link_state(m)),
        _ => None,
    }))
}

fn link_state(msg: LinkMessage) -> LinkState {
    let mut state = LinkState {
        index: msg.header.index,
        promisc: msg.header.flags.contains(LinkFlags::Promisc),
        allmulti: msg.header.flags.contains(LinkFlags::Allmulti),
        ..LinkState::default()
    };
    for attr in msg.attributes {
        match attr {
            LinkAttribute::Address(a) => state.mac = Some(a),
            LinkAttribute::Mtu(m) => state.mtu = m,
            LinkAttribute::MinMtu(m) => state.min_mtu = Some(m),
            LinkAttribute::MaxMtu(m) => state.max_mtu = Some(m),
            LinkAttribute::TxQueueLen(q) => state.txqlen = q,
            _ => {}
        }
    }
    state
}

/// The live value of a configured sysctl: `None` for a write-only key (such as
/// `net.ipv4.route.flush`), which can be set but not restored.
fn read_original(sysctl: &Sysctl, setting: &SysctlSetting) -> Result<Option<String>, TuningError> {
    match sysctl.read(&setting.key) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Err(TuningError::SysctlMissing {
            origin: setting.origin,
            key: setting.raw.clone(),
            value: setting.value.clone(),
            path: setting.key.as_path().to_string(),
        }),
        Err(e) if e.source.kind() == io::ErrorKind::PermissionDenied => Ok(None),
        // `net.ipv4.conf.eth0`: a key of the config, not a failure of the kernel.
        Err(e) if e.source.raw_os_error() == Some(libc::EISDIR) => {
            Err(TuningError::InvalidSysctl {
                origin: setting.origin,
                key: setting.raw.clone(),
                value: setting.value.clone(),
                problem: SysctlProblem::Directory {
                    path: setting.key.as_path().to_string(),
                },
            })
        }
        Err(e) => Err(e.into()),
    }
}

fn write_sysctl(sysctl: &Sysctl, setting: &SysctlSetting) -> Result<(), TuningError> {
    sysctl
        .write(&setting.key, &setting.value)
        .map_err(|e| match e.source.raw_os_error() {
            // The kernel's answer to a value it does not take: a config error.
            Some(libc::EINVAL | libc::ERANGE) => TuningError::InvalidSysctl {
                origin: setting.origin,
                key: setting.raw.clone(),
                value: setting.value.clone(),
                problem: SysctlProblem::Refused {
                    path: setting.key.as_path().to_string(),
                    source: e.source,
                },
            },
            _ => e.into(),
        })
}

/// ADD: reads the live values, saves them to the backup file, then writes the sysctls and
/// changes the link. A failure after the backup is written puts back everything this ADD
/// changed and the backup file as it was.
///
/// # Errors
/// Validation against the live interface (code 7), netlink, sysctl and backup failures.
pub fn add(
    ns: &NetNs,
    config: &Config,
    who: &Attachment,
    store: &BackupStore,
) -> Result<(), TuningError> {
    ns.run_in_place(|| add_inside(config, who, store))?
}

fn add_inside(config: &Config, who: &Attachment, store: &BackupStore) -> Result<(), TuningError> {
    let sysctl = Sysctl::default();
    let mut nl = if config.changes_link() {
        Some(Netlink::new()?)
    } else {
        None
    };
    let link = match nl.as_mut() {
        Some(nl) => {
            Some(
                observe_link(nl, &who.ifname)?.ok_or_else(|| TuningError::LinkNotFound {
                    ifname: who.ifname.to_string(),
                })?,
            )
        }
        None => None,
    };
    let originals = config
        .sysctls
        .iter()
        .map(|s| read_original(&sysctl, s))
        .collect::<Result<Vec<_>, _>>()?;

    let _lock = store.lock()?;
    let path = store.file_of(&who.container_id, &who.ifname);
    let existing = match store.read(&path) {
        Ok(b) => b,
        // Unreadable as a backup, it can never be restored: start afresh rather than fail.
        Err(e @ TuningError::BackupCorrupt { .. }) => {
            log::warn!("replacing {e}");
            None
        }
        Err(e) => return Err(e),
    };
    let plan = plan::add(config, who, link.as_ref(), &originals, existing.clone())?;
    store.write(&path, &plan.backup)?;

    let applied = (|| {
        for setting in &config.sysctls {
            write_sysctl(&sysctl, setting)?;
        }
        if let (Some(nl), Some(link)) = (nl.as_mut(), link.as_ref())
            && !plan.link.is_empty()
        {
            log::debug!("ip link set dev {} {:?}", who.ifname, plan.link);
            nl.set_link(link.index, &plan.link)?;
        }
        Ok::<(), TuningError>(())
    })();
    let Err(cause) = applied else {
        return Ok(());
    };

    let mut failures = restore_inside(&sysctl, nl.as_mut(), &who.ifname, &plan.undo);
    let file = match &existing {
        Some(previous) => store.write(&path, previous),
        None => store.remove(&path),
    };
    if let Err(e) = file {
        failures.push(e.to_string());
    }
    if failures.is_empty() {
        Err(cause)
    } else {
        Err(TuningError::RollbackFailed {
            cause: Box::new(cause),
            rollback: failures,
        })
    }
}

/// Puts `backup` back (link attributes if the link still exists, then sysctls) and returns
/// what failed. Keys that no longer exist count as done.
fn restore_inside(
    sysctl: &Sysctl,
    nl: Option<&mut Netlink>,
    ifname: &str,
    backup: &Backup,
) -> Vec<String> {
    let mut failures = Vec::new();
    let mut own;
    let nl = match nl {
        Some(nl) => Some(nl),
        None if backup.is_empty() || !has_link_attrs(backup) => None,
        None => match Netlink::new() {
            Ok(n) => {
                own = n;
                Some(&mut own)
            }
            Err(e) => {
                failures.push(e.to_string());
                None
            }
        },
    };
    let link = match nl {
        Some(nl) => match observe_link(nl, ifname) {
            Ok(link) => link.map(|l| (nl, l)),
            Err(e) => {
                failures.push(e.to_string());
                None
            }
        },
        None => None,
    };
    let plan = plan::restore(backup, link.as_ref().map(|(_, l)| l));
    failures.extend(plan.invalid.iter().cloned());
    if let Some((nl, live)) = link {
        for (what, change) in &plan.link {
            if let Err(e) = nl.set_link(live.index, change) {
                failures.push(format!("{what}: {e}"));
            }
        }
    }
    for (key, value) in &plan.sysctls {
        match sysctl.write(key, value) {
            Ok(()) => {}
            // The interface (or the whole feature) went away: nothing left to restore.
            Err(e) if e.is_not_found() => {}
            Err(e) => failures.push(e.to_string()),
        }
    }
    failures
}

fn has_link_attrs(backup: &Backup) -> bool {
    backup.mac.is_some()
        || backup.mtu.is_some()
        || backup.promisc.is_some()
        || backup.allmulti.is_some()
        || backup.txqlen.is_some()
}

/// How a DEL went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// There was no backup file.
    NothingSaved,
    /// Everything saved was put back (or its interface/netns is gone) and the file removed.
    Done,
}

/// DEL: restores the backup file of the attachment inside `ns` (`None` when the netns is gone)
/// and removes the file once everything is back. Missing file, netns or interface all count as
/// done. A data dir that cannot be written (read-only, full) does not stop the restore: DEL
/// then fails only on removing the file, which a retry removes.
///
/// # Errors
/// [`TuningError::Restore`] listing what could not be put back (the file is kept for a retry),
/// [`TuningError::Backup`] when the file cannot be read or removed, and lock failures.
pub fn del(
    ns: Option<&NetNs>,
    who: &Attachment,
    store: &BackupStore,
) -> Result<Restored, TuningError> {
    if !store.may_hold(&who.container_id, &who.ifname) {
        return Ok(Restored::NothingSaved);
    }
    let _lock = store.lock_for_del()?;
    let name = store.file_of(&who.container_id, &who.ifname);
    if !store.has_any(&name) {
        return Ok(Restored::NothingSaved);
    }
    let backup = match store.read(&name) {
        Ok(Some(b)) => b,
        Ok(None) => {
            // Only the temporary file of an ADD killed before its rename: that ADD had
            // changed nothing yet.
            store.remove(&name)?;
            return Ok(Restored::NothingSaved);
        }
        Err(e @ TuningError::BackupCorrupt { .. }) => {
            // Nothing in it can be restored; keeping it would only leak it.
            log::warn!("removing {e}");
            store.remove(&name)?;
            return Ok(Restored::Done);
        }
        Err(e) => return Err(e),
    };
    let failures = match ns {
        Some(ns) => {
            ns.run_in_place(|| restore_inside(&Sysctl::default(), None, &who.ifname, &backup))?
        }
        None => Vec::new(),
    };
    if !failures.is_empty() {
        return Err(TuningError::Restore {
            ifname: who.ifname.to_string(),
            errors: failures,
        });
    }
    store.remove(&name)?;
    Ok(Restored::Done)
}

/// CHECK: every configured sysctl and link attribute must have its configured value.
///
/// # Errors
/// [`TuningError::Drift`] naming the first difference, [`TuningError::LinkNotFound`] when the
/// interface is gone, and read failures.
pub fn check(ns: &NetNs, config: &Config, ifname: &str) -> Result<(), TuningError> {
    ns.run_in_place(|| {
        let sysctl = Sysctl::default();
        for setting in &config.sysctls {
            match sysctl.read(&setting.key) {
                Ok(live) => plan::check_sysctl(setting, &live)?,
                // A write-only key has no value to compare.
                Err(e) if e.source.kind() == io::ErrorKind::PermissionDenied => {}
                Err(e) => return Err(missing_or(e, setting)),
            }
        }
        if config.changes_link() {
            let mut nl = Netlink::new()?;
            let link =
                observe_link(&mut nl, ifname)?.ok_or_else(|| TuningError::CheckLinkNotFound {
                    ifname: ifname.to_string(),
                })?;
            plan::check_link(config, ifname, &link)?;
        }
        Ok(())
    })?
}

fn missing_or(e: SysctlError, setting: &SysctlSetting) -> TuningError {
    if e.is_not_found() {
        TuningError::Drift {
            reference: format!(
                "open /proc/sys/{}: no such file or directory",
                setting.key.as_path()
            ),
            ours: format!(
                "sysctl {} ({} key {:?}) does not exist",
                setting.key, setting.origin, setting.raw
            ),
        }
    } else {
        e.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::resolve_sysctl;
    use cni::error::{CniError, ErrorCode};

    #[test]
    fn a_sysctl_key_naming_a_directory_is_code_7() {
        // Only reads this process's /proc/sys/net/ipv4/conf/lo.
        let setting = SysctlSetting {
            origin: "sysctl",
            raw: "net.ipv4.conf.IFNAME".into(),
            key: resolve_sysctl("net.ipv4.conf.IFNAME", "lo").unwrap(),
            value: "1".into(),
        };
        let err = read_original(&Sysctl::default(), &setting).unwrap_err();
        assert!(
            err.to_string().contains("is a directory of sysctls"),
            "{err}"
        );
        assert_eq!(CniError::from(err).code, ErrorCode::InvalidConfig);
    }
}
