//! `portmap reconcile`: puts back what something else removed of the live attachments'
//! mappings (`firewall-cmd --reload`, `systemctl restart nftables`, `nft flush ruleset`,
//! `iptables -t nat -F`, an `iptables-restore` of an older save), from the records every ADD
//! keeps ([`crate::state`]).

use std::io::Write;

use cni::operator::{OperatorCommand, OperatorError};
pub use cni::reconcile::Report;

use crate::error::PortmapError;

/// The command, as `portmap --help` lists it.
pub const COMMAND: OperatorCommand = OperatorCommand {
    name: "reconcile",
    options: "",
    summary: "put back what is missing of every live attachment's port mappings",
    help: "Puts back what something else removed of the port mappings of the live \
attachments of this network namespace.",
};

/// Runs `portmap reconcile` with the arguments after the command.
///
/// # Errors
/// An option it does not take; a failure to read the records or the tables; attachments it
/// could not restore.
pub fn command(args: &[String], out: &mut dyn Write) -> Result<(), OperatorError> {
    if let Some(arg) = args.first() {
        return Err(OperatorError::usage(format!("unknown argument {arg:?}")));
    }
    let report = reconcile(out).map_err(|e| OperatorError::failed(e.to_string()))?;
    cni::reconcile::finish(&report, out)
}

/// Reconciles the calling thread's namespace, printing a line per attachment restored or
/// removed on `out`.
///
/// # Errors
/// When the records cannot be read. Attachments that cannot be restored or removed are in
/// the report's failures.
pub fn reconcile(out: &mut dyn Write) -> Result<Report, PortmapError> {
    let _ = out;
    Err(PortmapError::Unavailable(
        "portmap reconcile is being written".into(),
    ))
}
