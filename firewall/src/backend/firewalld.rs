//! firewalld over D-Bus (system bus, `$DBUS_SYSTEM_BUS_ADDRESS` honoured): each container IP
//! becomes a source (`<ip>/32` or `/128`) of the configured zone, in the runtime configuration.
//! The isolation rules of an ingress policy go to iptables, as the reference does, through
//! the one iptables writer.

use std::net::IpAddr;

use cni::conf::GcAttachment;
use cni::error::go_errno;
use netfilter::iptables::writer::{Part, Plan, Writer, absent_in};
use netfilter::iptables::{Family, Iptables as Tools};
use netfilter::nft::LazyNft;
use zbus::address::Transport;
use zbus::address::transport::UnixSocket;
use zbus::blocking::Connection;

use super::state::{AttachmentState, Made, State};
use super::{FirewallBackend, Missing, Recorded, Restored};
use crate::config::Config;
use crate::error::FirewallError;
use crate::names::{
    FILTER_TABLE, FIREWALLD_NAME, FIREWALLD_PATH, FIREWALLD_ZONE_IFACE, ZONE_ALREADY_SET,
};
use crate::plan::{Target, host_cidr, isolation_part};
use cni::Attachment;

const DBUS_NAME: &str = "org.freedesktop.DBus";
const DBUS_PATH: &str = "/org/freedesktop/DBus";

/// Answers that mean "nothing to remove": firewalld's own, or no firewalld (its runtime
/// configuration went with it).
const ALREADY_GONE: [&str; 4] = [
    "NOT_ENABLED",
    "UNKNOWN_SOURCE",
    "ServiceUnknown",
    "cannot connect to the system bus",
];

/// The system bus could not be reached.
#[derive(Debug)]
struct NoBus {
    /// The reference's words, where the failure is one its D-Bus library words the same way.
    go: Option<String>,
    /// Ours (zbus's account).
    ours: String,
}

impl NoBus {
    fn of(e: &zbus::Error) -> NoBus {
        NoBus {
            go: go_dial_error(e),
            ours: format!("cannot connect to the system bus: {e}"),
        }
    }
}

impl From<NoBus> for FirewallError {
    fn from(e: NoBus) -> FirewallError {
        FirewallError::NoBus {
            msg: e.go.unwrap_or_else(|| e.ours.clone()),
            details: e.ours,
        }
    }
}

/// How the reference's D-Bus library (godbus, which dials the socket with Go's `net`) reports
/// a socket it cannot connect to: `dial unix /run/dbus/system_bus_socket: connect: no such
/// file or directory`.
fn go_dial_error(e: &zbus::Error) -> Option<String> {
    let zbus::Error::Connection(io, address) = e else {
        return None;
    };
    let Transport::Unix(unix) = address.transport() else {
        return None;
    };
    let socket = match unix.path() {
        UnixSocket::File(path) => path.display().to_string(),
        UnixSocket::Abstract(name) => format!("@{}", name.to_string_lossy()),
        _ => return None,
    };
    Some(format!("dial unix {socket}: connect: {}", go_errno(io)))
}

/// Connects to the system bus.
fn connect() -> Result<Connection, NoBus> {
    Connection::system().map_err(|e| NoBus::of(&e))
}

/// Whether firewalld owns its name on the system bus (the reference's auto-detection).
#[must_use]
pub fn is_running() -> bool {
    connect().is_ok_and(|c| name_has_owner(&c).unwrap_or(false))
}

fn name_has_owner(conn: &Connection) -> Result<bool, String> {
    let reply = conn
        .call_method(
            Some(DBUS_NAME),
            DBUS_PATH,
            Some(DBUS_NAME),
            "NameHasOwner",
            &(FIREWALLD_NAME,),
        )
        .map_err(|e| e.to_string())?;
    reply
        .body()
        .deserialize::<bool>()
        .map_err(|e| e.to_string())
}

/// A failed D-Bus call: the error's name and its message. The reference's messages quote the
/// message alone (godbus' `Error()` is the reply's first string, e.g. `INVALID_ZONE: cni`).
#[derive(Debug)]
struct CallError {
    /// The D-Bus error name (`org.fedoraproject.FirewallD1.Exception`); empty for a failure
    /// that is not a method error (no bus, a broken connection).
    name: String,
    /// Its message.
    message: String,
}

impl CallError {
    /// The details of an error object about this failure of `method`.
    fn details(&self, method: &str) -> String {
        if self.name.is_empty() {
            format!("{FIREWALLD_ZONE_IFACE}.{method}: {}", self.message)
        } else {
            format!(
                "{FIREWALLD_ZONE_IFACE}.{method}: {}: {}",
                self.name, self.message
            )
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.name.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.name, self.message)
        }
    }
}

impl From<zbus::Error> for CallError {
    fn from(e: zbus::Error) -> CallError {
        match e {
            zbus::Error::MethodError(name, detail, _) => CallError {
                message: detail.unwrap_or_else(|| name.to_string()),
                name: name.to_string(),
            },
            other => CallError {
                name: String::new(),
                message: other.to_string(),
            },
        }
    }
}

/// The firewalld backend.
#[derive(Debug)]
pub struct Firewalld {
    config: Config,
    state: State,
    conn: Option<Connection>,
}

impl Firewalld {
    /// The backend for `config`; connects on first use.
    #[must_use]
    pub fn new(config: Config, state: State) -> Firewalld {
        Firewalld {
            config,
            state,
            conn: None,
        }
    }

    /// The connection to the system bus, made on first use.
    fn conn(&mut self) -> Result<&Connection, NoBus> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => connect()?,
        };
        Ok(self.conn.insert(conn))
    }

    /// Calls `zone.<method>(zone, source)` and returns the reply body's boolean when it has one.
    fn zone_call(&mut self, method: &str, ip: IpAddr) -> Result<Option<bool>, CallError> {
        let zone = self.config.zone.clone();
        let source = host_cidr(ip);
        let conn = self.conn().map_err(|e| CallError {
            name: String::new(),
            message: e.ours,
        })?;
        let reply = conn
            .call_method(
                Some(FIREWALLD_NAME),
                FIREWALLD_PATH,
                Some(FIREWALLD_ZONE_IFACE),
                method,
                &(zone.as_str(), source.as_str()),
            )
            .map_err(CallError::from)?;
        Ok(reply.body().deserialize::<bool>().ok())
    }

    /// The zone's sources (`getSources(zone)`), as firewalld spells them (`10.0.0.2/32`).
    fn sources(&mut self) -> Result<Vec<String>, FirewallError> {
        let zone = self.config.zone.clone();
        let failed = |reason: String| FirewallError::Firewalld {
            op: format!("getSources({zone})"),
            reason,
        };
        let conn = self.conn()?;
        let reply = conn
            .call_method(
                Some(FIREWALLD_NAME),
                FIREWALLD_PATH,
                Some(FIREWALLD_ZONE_IFACE),
                "getSources",
                &(zone.as_str(),),
            )
            .map_err(|e| failed(CallError::from(e).to_string()))?;
        reply
            .body()
            .deserialize::<Vec<String>>()
            .map_err(|e| failed(e.to_string()))
    }

    /// `addSource(zone, ip)`; firewalld's `ZONE_ALREADY_SET` is success.
    fn add_source(&mut self, ip: IpAddr) -> Result<bool, FirewallError> {
        match self.zone_call("addSource", ip) {
            Ok(_) => Ok(true),
            Err(e) if e.message.contains(ZONE_ALREADY_SET) => Ok(false),
            Err(e) => Err(FirewallError::FirewalldAdd {
                cidr: host_cidr(ip),
                zone: self.config.zone.clone(),
                details: e.details("addSource"),
                reason: e.message,
            }),
        }
    }

    /// `removeSource(zone, ip)`; a source or firewalld already gone is success.
    fn remove_source(&mut self, ip: IpAddr) -> Result<(), FirewallError> {
        match self.zone_call("removeSource", ip) {
            Ok(_) => Ok(()),
            Err(e)
                if ALREADY_GONE
                    .iter()
                    .any(|g| e.message.contains(g) || e.name.contains(g)) =>
            {
                Ok(())
            }
            Err(e) => Err(FirewallError::Firewalld {
                op: format!("removeSource({}, {})", self.config.zone, host_cidr(ip)),
                reason: e.to_string(),
            }),
        }
    }

    /// Adds the sources of `target` (noting in `added` those that were not there yet) and its
    /// bridge's isolation rules.
    fn add_sources(
        &mut self,
        target: &Target,
        added: &mut Vec<IpAddr>,
    ) -> Result<(), FirewallError> {
        for ip in &target.ips {
            if self.add_source(*ip)? {
                added.push(*ip);
            }
        }
        let parts: Vec<Part> = target
            .families()
            .into_iter()
            .filter_map(|family| isolation_part(family, &self.config, target))
            .collect();
        if !parts.is_empty() {
            let plan = Plan {
                table: FILTER_TABLE.to_owned(),
                parts,
                ..Plan::default()
            };
            let mut nft = LazyNft::new();
            Writer::for_plan(&mut nft, &plan).apply(&plan)?;
        }
        Ok(())
    }

    fn remove(&mut self, name: &str, ips: &[IpAddr]) -> Result<(), FirewallError> {
        let mut first_error = None;
        for ip in ips {
            if self.state.claimed_by_other(*ip, name)? {
                continue;
            }
            if let Err(e) = self.remove_source(*ip) {
                log::warn!("DEL {name}: {e}");
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        self.state.forget(name, ips)
    }
}

impl FirewallBackend for Firewalld {
    fn name(&self) -> &'static str {
        "firewalld"
    }

    fn add(&mut self, owner: &Attachment, target: &Target) -> Result<(), FirewallError> {
        // The reference connects before anything else, and fails with its library's words.
        self.conn()?;
        let _lock = self.state.lock()?;
        let name = crate::names::state_name(owner);
        let known = self.state.attachment(&name)?.is_some();
        // Recorded before firewalld changes anything: a call killed after a source was added
        // leaves a record through which a DEL without prevResult finds it.
        let made = Made::new(self.name(), &self.config, owner, target);
        self.state.record(
            &name,
            &AttachmentState {
                ips: target.ips.clone(),
                accepts: Vec::new(),
                made: Some(made),
            },
        )?;
        let mut added = Vec::new();
        let result = self.add_sources(target, &mut added);
        if result.is_err() {
            for ip in added {
                if let Err(e) = self.remove_source(ip) {
                    log::warn!(
                        "ADD rollback of {ip} in zone {} failed: {e}",
                        self.config.zone
                    );
                }
            }
            // A first ADD leaves no record behind; a repeated one keeps its record.
            if !known && let Err(f) = self.state.forget(&name, &target.ips) {
                log::warn!("ADD rollback of the state of {name} failed: {f}");
            }
        }
        result
    }

    fn check(&mut self, _owner: &Attachment, target: &Target) -> Result<(), FirewallError> {
        self.conn()?;
        for ip in &target.ips {
            let details = match self.zone_call("querySource", *ip) {
                Ok(Some(true)) => continue,
                Ok(answer) => format!("querySource answered {answer:?}, not Some(true)"),
                Err(e) => e.details("querySource"),
            };
            return Err(FirewallError::FirewalldQuery {
                cidr: host_cidr(*ip),
                zone: self.config.zone.clone(),
                details,
            });
        }
        Ok(())
    }

    fn del(&mut self, owner: &Attachment, target: Option<&Target>) -> Result<(), FirewallError> {
        let _lock = self.state.lock_for_teardown()?;
        let name = crate::names::state_name(owner);
        let ips = self.state.to_remove(&name, target)?.ips;
        self.remove(&name, &ips)
    }

    fn gc(&mut self, network: &str, valid: &[GcAttachment]) -> Result<(), FirewallError> {
        let _lock = self.state.lock_for_teardown()?;
        let mut first_error = None;
        for name in self.state.attachments_of(network)? {
            if valid.iter().any(|a| {
                crate::names::state_name(&Attachment::new(network, &a.container_id, &a.ifname))
                    == name
            }) {
                continue;
            }
            let ips = self.state.to_remove(&name, None)?.ips;
            if let Err(e) = self.remove(&name, &ips) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn missing(&mut self, attachments: &[Recorded]) -> Result<Missing, FirewallError> {
        let sources = self.sources()?;
        let mut dumps = Vec::new();
        if attachments.iter().any(|a| a.target.bridge.is_some()) {
            for family in Family::BOTH {
                if attachments
                    .iter()
                    .any(|a| a.target.ips_of(family).next().is_some())
                {
                    dumps.push((family, Tools::new(family).save(FILTER_TABLE)?));
                }
            }
        }
        let mut missing = Missing::default();
        for (i, a) in attachments.iter().enumerate() {
            let mut what: Vec<String> = a
                .target
                .ips
                .iter()
                .map(|ip| host_cidr(*ip))
                .filter(|cidr| !sources.contains(cidr))
                .map(|cidr| format!("source {cidr} of zone {}", self.config.zone))
                .collect();
            if let Some(bridge) = &a.target.bridge {
                for (family, dump) in &dumps {
                    let lacks = a.target.ips_of(*family).next().is_some()
                        && isolation_part(*family, &self.config, &a.target)
                            .is_some_and(|part| absent_in(dump, &part).is_some());
                    if lacks {
                        what.push(format!("{family} isolation of {bridge}"));
                    }
                }
            }
            if !what.is_empty() {
                missing.attachments.push((i, what));
            }
        }
        Ok(missing)
    }

    fn restore(
        &mut self,
        attachments: &[Recorded],
        missing: &Missing,
    ) -> Result<Restored, FirewallError> {
        // As ADD does: `ZONE_ALREADY_SET` is success, so a source there is not added twice.
        Ok(missing
            .attachments
            .iter()
            .filter_map(|(i, _)| Some((*i, attachments.get(*i)?)))
            .map(|(i, a)| {
                let added = self.add_sources(&a.target, &mut Vec::new());
                (i, added.err().map(|e| e.to_string()))
            })
            .collect())
    }

    fn status(&mut self) -> Result<(), FirewallError> {
        let unavailable = |reason| FirewallError::Unavailable {
            backend: "firewalld",
            reason,
        };
        let conn = connect().map_err(|e| unavailable(e.ours))?;
        match name_has_owner(&conn) {
            Ok(true) => Ok(()),
            Ok(false) => Err(unavailable(format!(
                "{FIREWALLD_NAME} has no owner on the system bus"
            ))),
            Err(e) => Err(unavailable(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nix::errno::Errno;

    use super::*;

    fn refused(address: &str, errno: i32) -> zbus::Error {
        zbus::Error::Connection(
            Arc::new(std::io::Error::from_raw_os_error(errno)),
            zbus::Address::try_from(address).unwrap(),
        )
    }

    #[test]
    fn a_socket_that_does_not_connect_is_worded_as_godbus_words_it() {
        let e = NoBus::of(&refused(
            "unix:path=/nonexistent/system_bus_socket",
            Errno::ENOENT as i32,
        ));
        assert_eq!(
            e.go.as_deref(),
            Some("dial unix /nonexistent/system_bus_socket: connect: no such file or directory")
        );
        assert!(
            e.ours.starts_with("cannot connect to the system bus: "),
            "{}",
            e.ours
        );
        let e = NoBus::of(&refused(
            "unix:abstract=/tmp/dbus-x",
            Errno::ECONNREFUSED as i32,
        ));
        assert_eq!(
            e.go.as_deref(),
            Some("dial unix @/tmp/dbus-x: connect: connection refused")
        );
        // Not a dial: ours only, in msg and details.
        let e: FirewallError = NoBus::of(&zbus::Error::Unsupported).into();
        let FirewallError::NoBus { msg, details } = e else {
            panic!("not NoBus");
        };
        assert_eq!(msg, details);
    }
}
