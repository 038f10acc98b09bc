//! What a plugin's `reconcile` command reports, the same for every plugin that has one
//! (`portmap reconcile`, `firewall reconcile`): the counts of one run ([`Report`]), its last
//! line ([`Report::summary`]), how its lines name an attachment ([`who`]), and how the command
//! ends ([`finish`]: the summary on stdout, status 1 with the failures on stderr).

use std::io::Write;

use crate::Attachment;
use crate::operator::OperatorError;

/// What one reconcile did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// The attachments restored.
    pub restored: usize,
    /// The attachments removed because their namespace is gone.
    pub dropped: usize,
    /// The attachments found complete.
    pub in_place: usize,
    /// The records of earlier versions, left alone.
    pub unknown: usize,
    /// Whether a shared object was restored.
    pub shared: bool,
    /// What could not be restored or removed, one line each.
    pub failed: Vec<String>,
}

impl Report {
    /// Whether the run changed nothing (and nothing failed).
    #[must_use]
    pub fn is_quiet(&self) -> bool {
        self.restored == 0 && self.dropped == 0 && !self.shared && self.failed.is_empty()
    }

    /// The last line printed.
    #[must_use]
    pub fn summary(&self) -> String {
        let mut text = if self.is_quiet() {
            format!(
                "reconcile: nothing missing; {} attachment(s) in place",
                self.in_place
            )
        } else {
            format!(
                "reconcile: {} attachment(s) restored, {} removed (namespace gone), {} in place",
                self.restored, self.dropped, self.in_place
            )
        };
        if !self.failed.is_empty() {
            text.push_str(&format!(", {} failed", self.failed.len()));
        }
        if self.unknown > 0 {
            text.push_str(&format!(
                "; {} recorded by an earlier version left alone",
                self.unknown
            ));
        }
        text
    }
}

impl Report {
    /// The run as a watcher logs it: its summary, or the summary and the failures, one a line.
    ///
    /// # Errors
    /// The summary and the failures, when something could not be restored or removed.
    pub fn outcome(&self) -> Result<String, String> {
        if self.failed.is_empty() {
            Ok(self.summary())
        } else {
            Err(format!("{}:\n{}", self.summary(), self.failed.join("\n")))
        }
    }
}

/// `network/containerID/ifname`, as the lines name an attachment.
#[must_use]
pub fn who(owner: &Attachment) -> String {
    format!("{}/{}/{}", owner.network, owner.container_id, owner.ifname)
}

/// Ends a `reconcile` command: its summary on `out`; status 1 naming the failures when some
/// attachment could not be restored or removed.
///
/// # Errors
/// The failures of the run; a failure to write to `out`.
pub fn finish(report: &Report, out: &mut dyn Write) -> Result<(), OperatorError> {
    let written = writeln!(out, "{}", report.summary());
    if !report.failed.is_empty() {
        return Err(OperatorError::failed(format!(
            "{} attachment(s) not restored:\n{}",
            report.failed.len(),
            report.failed.join("\n")
        )));
    }
    written.map_err(|e| OperatorError::failed(format!("failed to write to stdout: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_nothing_was_restored_when_nothing_was_missing() {
        let quiet = Report {
            in_place: 3,
            ..Report::default()
        };
        assert_eq!(
            quiet.summary(),
            "reconcile: nothing missing; 3 attachment(s) in place"
        );
        let busy = Report {
            restored: 2,
            dropped: 1,
            in_place: 3,
            unknown: 1,
            shared: true,
            failed: vec!["x".into()],
        };
        let failed = Report {
            in_place: 3,
            failed: vec!["x".into()],
            ..Report::default()
        };
        assert_eq!(
            failed.summary(),
            "reconcile: 0 attachment(s) restored, 0 removed (namespace gone), 3 in place, 1 failed"
        );
        assert_eq!(
            busy.summary(),
            "reconcile: 2 attachment(s) restored, 1 removed (namespace gone), 3 in place, \
             1 failed; 1 recorded by an earlier version left alone"
        );
    }

    #[test]
    fn a_run_with_failures_ends_with_status_1_after_its_summary() {
        let mut out = Vec::new();
        let report = Report {
            restored: 1,
            failed: vec!["n/c/eth0 (iptables): refused".into()],
            ..Report::default()
        };
        let err = finish(&report, &mut out).unwrap_err();
        assert_eq!(err.status, crate::operator::FAILED);
        assert_eq!(
            err.message,
            "1 attachment(s) not restored:\nn/c/eth0 (iptables): refused"
        );
        assert!(String::from_utf8(out).unwrap().ends_with(", 1 failed\n"));
        let mut out = Vec::new();
        finish(&Report::default(), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "reconcile: nothing missing; 0 attachment(s) in place\n"
        );
        assert_eq!(who(&Attachment::new("n", "c", "eth0")), "n/c/eth0");
        assert_eq!(
            report.outcome(),
            Err(
                "reconcile: 1 attachment(s) restored, 0 removed (namespace gone), 0 in place, \
                 1 failed:\nn/c/eth0 (iptables): refused"
                    .to_owned()
            )
        );
        assert_eq!(
            Report::default().outcome(),
            Ok("reconcile: nothing missing; 0 attachment(s) in place".to_owned())
        );
    }
}
