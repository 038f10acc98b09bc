//! The reference's iptables layout in the `filter` table, written with one
//! `iptables-restore --noflush` transaction per family per call after one `iptables-save`.

use std::net::IpAddr;

use common::conf::Attachment;
use common::iptables::{Family, Iptables as Tools};

use super::state::State;
use super::{FirewallBackend, Owner};
use crate::config::Config;
use crate::error::FirewallError;
use crate::names::{CNI_FORWARD_CHAIN, FILTER_TABLE};
use crate::plan::{Target, iptables_add, iptables_del, iptables_missing};

/// The iptables backend.
#[derive(Debug)]
pub struct Iptables {
    config: Config,
    state: State,
}

impl Iptables {
    /// The backend for `config`, keeping its state in `state`.
    #[must_use]
    pub fn new(config: Config, state: State) -> Iptables {
        Iptables { config, state }
    }

    /// Deletes the accepts of `ips` (those no other attachment claims) in every family they
    /// belong to, and forgets the attachment.
    fn remove(&self, name: &str, ips: &[IpAddr]) -> Result<(), FirewallError> {
        let mut mine = Vec::new();
        for ip in ips {
            if !self.state.claimed_by_other(*ip, name)? {
                mine.push(*ip);
            }
        }
        let mut first_error = None;
        for family in Family::BOTH {
            if !mine.iter().any(|ip| Family::of(ip) == family) {
                continue;
            }
            let result = (|| {
                let tools = Tools::new(family);
                let dump = tools.save(FILTER_TABLE)?;
                tools.restore(FILTER_TABLE, &iptables_del(&dump, family, &mine)?)
            })();
            if let Err(e) = result {
                log::warn!("DEL {name}: {family}: {e}");
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e.into());
        }
        self.state.forget(name, ips)
    }
}

impl FirewallBackend for Iptables {
    fn name(&self) -> &'static str {
        "iptables"
    }

    fn add(&mut self, owner: &Owner, target: &Target) -> Result<(), FirewallError> {
        let _lock = self.state.lock()?;
        let mut done: Vec<(Family, Vec<String>)> = Vec::new();
        for family in target.families() {
            let result = (|| {
                let tools = Tools::new(family);
                let dump = tools.save(FILTER_TABLE)?;
                if done.is_empty() && !dump.has_chain(CNI_FORWARD_CHAIN) {
                    // A namespace without our skeleton has no attachments of ours: state under
                    // its inode number is a dead namespace's.
                    self.state.reset()?;
                }
                let lines = iptables_add(&dump, family, &self.config, target)?;
                tools.restore(FILTER_TABLE, &lines)?;
                Ok::<_, FirewallError>(lines)
            })();
            match result {
                Ok(lines) => done.push((family, lines)),
                Err(e) => {
                    // Undo this attachment's accepts in the families already done; the
                    // skeleton and isolation rules are shared and may stay.
                    for (family, lines) in done {
                        let undo: Vec<String> = lines
                            .iter()
                            .filter_map(|l| l.strip_prefix("-A CNI-FORWARD "))
                            .map(|rest| format!("-D CNI-FORWARD {rest}"))
                            .collect();
                        if let Err(u) = Tools::new(family).restore(FILTER_TABLE, &undo) {
                            log::warn!("ADD rollback in {family} failed: {u}");
                        }
                    }
                    return Err(e);
                }
            }
        }
        self.state.record(&owner.state_name(), &target.ips)
    }

    fn check(&mut self, _owner: &Owner, target: &Target) -> Result<(), FirewallError> {
        for family in target.families() {
            let dump = Tools::new(family).save(FILTER_TABLE)?;
            if let Some((chain, rule)) = iptables_missing(&dump, family, &self.config, target) {
                let what = if rule.is_empty() {
                    format!("{family} chain {chain}")
                } else {
                    format!("{family} rule -A {chain} {}", rule.join(" "))
                };
                return Err(FirewallError::Missing { what });
            }
        }
        Ok(())
    }

    fn del(&mut self, owner: &Owner, target: Option<&Target>) -> Result<(), FirewallError> {
        let _lock = self.state.lock()?;
        let name = owner.state_name();
        let mut ips = self
            .state
            .attachment(&name)?
            .map(|s| s.ips)
            .unwrap_or_default();
        for ip in target.map(|t| t.ips.as_slice()).unwrap_or_default() {
            if !ips.contains(ip) {
                ips.push(*ip);
            }
        }
        self.remove(&name, &ips)
    }

    fn gc(&mut self, network: &str, valid: &[Attachment]) -> Result<(), FirewallError> {
        let _lock = self.state.lock()?;
        let mut first_error = None;
        for name in self.state.attachments_of(network)? {
            let live = valid
                .iter()
                .any(|a| crate::names::state_name(network, &a.container_id, &a.ifname) == name);
            if live {
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
        // IPv4 must work; IPv6 is needed only by dual-stack attachments, so its absence is
        // logged, not fatal (the reference refuses to start without both).
        Tools::new(Family::V4)
            .probe()
            .map_err(|e| FirewallError::Unavailable {
                backend: "iptables",
                reason: e.to_string(),
            })?;
        if let Err(e) = Tools::new(Family::V6).probe() {
            log::warn!("ip6tables is not usable: {e}");
        }
        Ok(())
    }
}
