//! firewalld's announcements that it has rebuilt the firewall, for a watcher that puts back
//! what the rebuild removed.
//!
//! `firewall-cmd --reload` (and `--complete-reload`) makes firewalld flush the firewall it
//! manages and load its permanent configuration, then emit the D-Bus signal `Reloaded`
//! (interface and path `org.fedoraproject.FirewallD1`): the zone sources the firewalld backend
//! added in the runtime configuration are gone, and with firewalld's iptables backend so are
//! other programs' rules in the tables it flushes (firewalld/firewalld#779). A start or
//! restart of firewalld rebuilds the same way without that signal; it shows as firewalld
//! taking its bus name (`NameOwnerChanged` from the bus).
//!
//! [`FirewalldSignals`] subscribes to both on a connection of its own, blocking: a watcher
//! waits on it in a thread of its own, with a timeout so that it can also stop.

use std::time::{Duration, Instant};

use futures_lite::StreamExt;
use zbus::blocking::Connection;
use zbus::message::Type;
use zbus::{MatchRule, MessageStream};

use crate::names::{FIREWALLD_NAME, FIREWALLD_PATH};

const DBUS_NAME: &str = "org.freedesktop.DBus";
/// The signals queued per subscription before the oldest are dropped (they are rare, and
/// one is as good as many).
const QUEUE: usize = 16;

/// What firewalld announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirewalldEvent {
    /// firewalld reloaded its configuration (`Reloaded`).
    Reloaded,
    /// firewalld took its bus name: it started (or restarted) and built its firewall anew.
    Started,
}

/// A failure to listen for firewalld's signals.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// The bus could not be reached.
    #[error("cannot connect to the D-Bus bus {bus}: {source}")]
    Connect {
        /// The bus: `system`, or the address given.
        bus: String,
        /// zbus's account.
        #[source]
        source: Box<zbus::Error>,
    },
    /// The bus refused the subscription (`AddMatch`).
    #[error("cannot subscribe to firewalld's signals: {0}")]
    Subscribe(#[source] Box<zbus::Error>),
    /// The connection to the bus ended (the bus daemon stopped).
    #[error("the D-Bus connection closed")]
    Closed,
    /// A message could not be read.
    #[error("cannot read firewalld's signals: {0}")]
    Receive(#[source] Box<zbus::Error>),
}

/// A subscription to firewalld's `Reloaded` signal and to its taking its bus name, made
/// when created: a signal sent after [`FirewalldSignals::system`] returns is never missed.
#[derive(Debug)]
pub struct FirewalldSignals {
    /// The connection (its executor thread reads the socket); dropped after the streams.
    _conn: Connection,
    /// Always `Some` but in `drop`, which takes them to unsubscribe.
    streams: Option<(MessageStream, MessageStream)>,
}

impl FirewalldSignals {
    /// Subscribes on the system bus (`$DBUS_SYSTEM_BUS_ADDRESS` honoured).
    ///
    /// # Errors
    /// [`SignalError::Connect`] or [`SignalError::Subscribe`].
    pub fn system() -> Result<FirewalldSignals, SignalError> {
        let conn = Connection::system().map_err(|source| SignalError::Connect {
            bus: "system".to_string(),
            source: Box::new(source),
        })?;
        FirewalldSignals::subscribe(conn)
    }

    /// Subscribes on the bus at `address` (`unix:path=…`).
    ///
    /// # Errors
    /// [`SignalError::Connect`] or [`SignalError::Subscribe`].
    pub fn at(address: &str) -> Result<FirewalldSignals, SignalError> {
        let connect_err = |source| SignalError::Connect {
            bus: address.to_string(),
            source: Box::new(source),
        };
        let conn = zbus::blocking::connection::Builder::address(address)
            .and_then(zbus::blocking::connection::Builder::build)
            .map_err(connect_err)?;
        FirewalldSignals::subscribe(conn)
    }

    fn subscribe(conn: Connection) -> Result<FirewalldSignals, SignalError> {
        let rules = || -> zbus::Result<(MatchRule<'static>, MatchRule<'static>)> {
            let reloaded = MatchRule::builder()
                .msg_type(Type::Signal)
                .sender(FIREWALLD_NAME)?
                .interface(FIREWALLD_NAME)?
                .path(FIREWALLD_PATH)?
                .member("Reloaded")?
                .build();
            let owner = MatchRule::builder()
                .msg_type(Type::Signal)
                .sender(DBUS_NAME)?
                .interface(DBUS_NAME)?
                .member("NameOwnerChanged")?
                .add_arg(FIREWALLD_NAME)?
                .build();
            Ok((reloaded, owner))
        };
        let (reloaded, owner) = rules().map_err(|e| SignalError::Subscribe(Box::new(e)))?;
        let streams = async_io::block_on(async {
            let reloaded = MessageStream::for_match_rule(reloaded, conn.inner(), Some(QUEUE));
            let owner = MessageStream::for_match_rule(owner, conn.inner(), Some(QUEUE));
            Ok::<_, zbus::Error>((reloaded.await?, owner.await?))
        })
        .map_err(|e| SignalError::Subscribe(Box::new(e)))?;
        Ok(FirewalldSignals {
            _conn: conn,
            streams: Some(streams),
        })
    }

    /// Waits for the next announcement, or for `timeout` to pass (`Ok(None)`).
    ///
    /// # Errors
    /// [`SignalError::Closed`] when the bus connection ends, [`SignalError::Receive`] when a
    /// message cannot be read.
    pub fn wait(&mut self, timeout: Duration) -> Result<Option<FirewalldEvent>, SignalError> {
        let Some((reloaded, owner)) = self.streams.as_mut() else {
            return Err(SignalError::Closed);
        };
        let deadline = Instant::now() + timeout;
        async_io::block_on(async {
            loop {
                let next = futures_lite::future::or(
                    async { Some((FirewalldEvent::Reloaded, reloaded.next().await)) },
                    futures_lite::future::or(
                        async { Some((FirewalldEvent::Started, owner.next().await)) },
                        async {
                            async_io::Timer::at(deadline).await;
                            None
                        },
                    ),
                );
                let Some((event, message)) = next.await else {
                    return Ok(None);
                };
                let message = message.ok_or(SignalError::Closed)?;
                let message = message.map_err(|e| SignalError::Receive(Box::new(e)))?;
                if event == FirewalldEvent::Reloaded || took_name(&message) {
                    return Ok(Some(event));
                }
            }
        })
    }
}

impl Drop for FirewalldSignals {
    fn drop(&mut self) {
        // Unsubscribe (`RemoveMatch`) before the connection goes, as zbus's blocking iterator
        // does.
        if let Some((reloaded, owner)) = self.streams.take() {
            async_io::block_on(async {
                zbus::AsyncDrop::async_drop(reloaded).await;
                zbus::AsyncDrop::async_drop(owner).await;
            });
        }
    }
}

/// Whether a `NameOwnerChanged(name, old, new)` gives the name a new owner (not: loses it).
fn took_name(message: &zbus::Message) -> bool {
    message
        .body()
        .deserialize::<(String, String, String)>()
        .is_ok_and(|(name, _, new)| name == FIREWALLD_NAME && !new.is_empty())
}
