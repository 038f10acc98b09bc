//! firewalld over D-Bus (system bus, `$DBUS_SYSTEM_BUS_ADDRESS` honoured): each container IP
//! becomes a source (`<ip>/32` or `/128`) of the configured zone, in the runtime configuration.
//! The isolation rules of an ingress policy go to iptables, as the reference does.

use std::net::IpAddr;

use common::conf::Attachment;
use common::iptables::Iptables as Tools;
use zbus::blocking::Connection;

use super::state::State;
use super::{FirewallBackend, Owner};
use crate::config::Config;
use crate::error::FirewallError;
use crate::names::{
    FILTER_TABLE, FIREWALLD_NAME, FIREWALLD_PATH, FIREWALLD_ZONE_IFACE, ZONE_ALREADY_SET,
};
use crate::plan::{Target, host_cidr, iptables_isolation};

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

/// Connects to the system bus.
fn connect() -> Result<Connection, String> {
    Connection::system().map_err(|e| format!("cannot connect to the system bus: {e}"))
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

    fn conn(&mut self, op: &str) -> Result<&Connection, FirewallError> {
        if self.conn.is_none() {
            self.conn = Some(connect().map_err(|reason| FirewallError::Firewalld {
                op: op.to_owned(),
                reason,
            })?);
        }
        self.conn.as_ref().ok_or_else(|| FirewallError::Firewalld {
            op: op.to_owned(),
            reason: "no connection".to_owned(),
        })
    }

    /// Calls `zone.<method>(zone, source)` and returns the reply body's boolean when it has one.
    fn zone_call(&mut self, method: &str, ip: IpAddr) -> Result<Option<bool>, FirewallError> {
        let zone = self.config.zone.clone();
        let source = host_cidr(ip);
        let op = format!("{method}({zone}, {source})");
        let conn = self.conn(&op)?;
        let reply = conn
            .call_method(
                Some(FIREWALLD_NAME),
                FIREWALLD_PATH,
                Some(FIREWALLD_ZONE_IFACE),
                method,
                &(zone.as_str(), source.as_str()),
            )
            .map_err(|e| FirewallError::Firewalld {
                op: op.clone(),
                reason: e.to_string(),
            })?;
        Ok(reply.body().deserialize::<bool>().ok())
    }

    fn remove(&mut self, name: &str, ips: &[IpAddr]) -> Result<(), FirewallError> {
        let mut first_error = None;
        for ip in ips {
            if self.state.claimed_by_other(*ip, name)? {
                continue;
            }
            match self.zone_call("removeSource", *ip) {
                Ok(_) => {}
                Err(FirewallError::Firewalld { reason, .. })
                    if ALREADY_GONE.iter().any(|g| reason.contains(g)) => {}
                Err(e) => {
                    log::warn!("DEL {name}: {e}");
                    first_error.get_or_insert(e);
                }
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

    fn add(&mut self, owner: &Owner, target: &Target) -> Result<(), FirewallError> {
        let _lock = self.state.lock()?;
        let mut added = Vec::new();
        for ip in &target.ips {
            match self.zone_call("addSource", *ip) {
                Ok(_) => added.push(*ip),
                Err(FirewallError::Firewalld { reason, .. })
                    if reason.contains(ZONE_ALREADY_SET) => {}
                Err(e) => {
                    for ip in added {
                        let _ = self.zone_call("removeSource", ip);
                    }
                    return Err(e);
                }
            }
        }
        if let Some(bridge) = &target.bridge {
            for family in target.families() {
                let tools = Tools::new(family);
                let dump = tools.save(FILTER_TABLE)?;
                tools.restore(
                    FILTER_TABLE,
                    &iptables_isolation(&dump, self.config.ingress, bridge)?,
                )?;
            }
        }
        self.state.record(&owner.state_name(), &target.ips)
    }

    fn check(&mut self, _owner: &Owner, target: &Target) -> Result<(), FirewallError> {
        for ip in &target.ips {
            if self.zone_call("querySource", *ip)? != Some(true) {
                return Err(FirewallError::Missing {
                    what: format!(
                        "source {} in firewalld zone {}",
                        host_cidr(*ip),
                        self.config.zone
                    ),
                });
            }
        }
        Ok(())
    }

    fn del(&mut self, owner: &Owner, target: Option<&Target>) -> Result<(), FirewallError> {
        let _lock = self.state.lock()?;
        let name = owner.state_name();
        let ips = self.state.ips_to_remove(&name, target)?;
        self.remove(&name, &ips)
    }

    fn gc(&mut self, network: &str, valid: &[Attachment]) -> Result<(), FirewallError> {
        let _lock = self.state.lock()?;
        let mut first_error = None;
        for name in self.state.attachments_of(network)? {
            if valid
                .iter()
                .any(|a| crate::names::state_name(network, &a.container_id, &a.ifname) == name)
            {
                continue;
            }
            let ips = self
                .state
                .attachment(&name)?
                .map(|s| s.ips)
                .unwrap_or_default();
            if let Err(e) = self.remove(&name, &ips) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn status(&mut self) -> Result<(), FirewallError> {
        let unavailable = |reason| FirewallError::Unavailable {
            backend: "firewalld",
            reason,
        };
        let conn = connect().map_err(unavailable)?;
        match name_has_owner(&conn) {
            Ok(true) => Ok(()),
            Ok(false) => Err(unavailable(format!(
                "{FIREWALLD_NAME} has no owner on the system bus"
            ))),
            Err(e) => Err(unavailable(e)),
        }
    }
}
