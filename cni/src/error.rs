//! The CNI error object (`{cniVersion, code, msg, details}`) and its well-known codes.

use std::fmt;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// The error codes of the CNI spec (SPEC.md "Error"), plus the plugin-specific range (100+).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 1: incompatible CNI version.
    IncompatibleVersion,
    /// 2: unsupported field in the network configuration.
    UnsupportedField,
    /// 3: container unknown or does not exist.
    UnknownContainer,
    /// 4: invalid necessary environment variables.
    InvalidEnv,
    /// 5: I/O failure (reading stdin, for example).
    Io,
    /// 6: failed to decode content.
    Decode,
    /// 7: invalid network configuration.
    InvalidConfig,
    /// 8: invalid network namespace.
    InvalidNetns,
    /// 11: try again later (a transient condition such as a held lock).
    TryAgainLater,
    /// 50: the plugin is not available (STATUS).
    PluginNotAvailable,
    /// 51: the plugin is available but with limited connectivity (STATUS).
    LimitedConnectivity,
    /// 999: internal error.
    Internal,
    /// A plugin-specific code (100 and up).
    Plugin(u32),
}

impl ErrorCode {
    /// The numeric code printed in the error object.
    pub fn as_u32(self) -> u32 {
        match self {
            ErrorCode::IncompatibleVersion => 1,
            ErrorCode::UnsupportedField => 2,
            ErrorCode::UnknownContainer => 3,
            ErrorCode::InvalidEnv => 4,
            ErrorCode::Io => 5,
            ErrorCode::Decode => 6,
            ErrorCode::InvalidConfig => 7,
            ErrorCode::InvalidNetns => 8,
            ErrorCode::TryAgainLater => 11,
            ErrorCode::PluginNotAvailable => 50,
            ErrorCode::LimitedConnectivity => 51,
            ErrorCode::Internal => 999,
            ErrorCode::Plugin(n) => n,
        }
    }
}

/// An error as a CNI plugin reports it: a code, a short message and optional details.
///
/// `msg` is the short account (the reference plugin's words where there is one, so that
/// tools matching on them keep working), `details` everything else; the skel prints it as the
/// spec's error object in the caller's `cniVersion`:
///
/// ```
/// use cni::error::{CniError, ErrorCode};
///
/// let err = CniError::invalid_config("invalid MTU").with_details("mtu 70000 is above 65535");
/// assert_eq!(err.code.as_u32(), 7);
/// assert_eq!(
///     err.to_json("1.0.0"),
///     r#"{
///     "cniVersion": "1.0.0",
///     "code": 7,
///     "msg": "invalid MTU",
///     "details": "mtu 70000 is above 65535"
/// }"#
/// );
///
/// // Any error type, with its chain of causes in the details.
/// let io = std::io::Error::other("disk full");
/// let err = CniError::from_error(ErrorCode::Io, &io);
/// assert_eq!((err.code, err.msg.as_str()), (ErrorCode::Io, "disk full"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct CniError {
    /// The spec code.
    pub code: ErrorCode,
    /// A short message naming what failed.
    pub msg: String,
    /// Longer details (the cause chain); empty when there are none.
    pub details: String,
}

impl CniError {
    /// An error with a code and a message.
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Adds details to the error.
    #[must_use]
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// An error whose message is `err`'s text and whose details are the chain of its causes.
    pub fn from_error(code: ErrorCode, err: &dyn std::error::Error) -> Self {
        let mut causes = Vec::new();
        let mut source = err.source();
        while let Some(cause) = source {
            causes.push(cause.to_string());
            source = cause.source();
        }
        CniError::new(code, err.to_string()).with_details(causes.join(": "))
    }

    /// Shorthand for an invalid-configuration (7) error.
    pub fn invalid_config(msg: impl Into<String>) -> Self {
        CniError::new(ErrorCode::InvalidConfig, msg)
    }

    /// Shorthand for an internal (999) error.
    pub fn internal(msg: impl Into<String>) -> Self {
        CniError::new(ErrorCode::Internal, msg)
    }

    /// The error object in the spec's shape, for `cni_version`, printed as Go prints it.
    pub fn to_json(&self, cni_version: &str) -> String {
        let wire = ErrorObject {
            cni_version,
            error: self,
        };
        // Serialising strings and integers cannot fail; keep a minimal object if it ever does.
        crate::json::to_go_string(&wire)
            .unwrap_or_else(|_| format!("{{\"code\": {}}}", self.code.as_u32()))
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.msg)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

struct ErrorObject<'a> {
    cni_version: &'a str,
    error: &'a CniError,
}

impl Serialize for ErrorObject<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("cniVersion", self.cni_version)?;
        map.serialize_entry("code", &self.error.code.as_u32())?;
        map.serialize_entry("msg", &self.error.msg)?;
        if !self.error.details.is_empty() {
            map.serialize_entry("details", &self.error.details)?;
        }
        map.end()
    }
}

impl CniError {
    /// This error — `msg` our account, `details` its causes — worded as the reference words
    /// the same condition: `msg` becomes `reference`, and ours moves to `details`. `None`, a
    /// condition only we refuse, leaves it as it is.
    #[must_use]
    pub fn reworded_as(self, reference: Option<String>) -> CniError {
        match reference {
            Some(msg) if msg != self.msg => {
                let details = if self.details.is_empty() {
                    self.msg
                } else {
                    format!("{}: {}", self.msg, self.details)
                };
                CniError::new(self.code, msg).with_details(details)
            }
            _ => self,
        }
    }
}

impl CniError {
    /// This error with `lead` and `: ` before its message: the reference wraps some errors of
    /// its library once more (bandwidth's and portmap's
    /// `could not parse prevResult: could not parse prevResult: …`).
    #[must_use]
    pub fn led_by(mut self, lead: &str) -> CniError {
        self.msg = format!("{lead}: {}", self.msg);
        self
    }
}

/// The lead of the shared configuration decoder's messages (code 6).
pub const DECODE_LEAD: &str = "failed to decode network configuration";

impl CniError {
    /// A configuration decode error (code 6) of the shared decoder, led by `lead` instead of
    /// [`DECODE_LEAD`]: the plugin's own wording for it in the reference (tuning's
    /// `failed to load netconf`, sbr's `failed to parse network configuration`). Other errors
    /// (a prevResult that does not parse has its own reference wording) are returned as they
    /// are.
    #[must_use]
    pub fn with_decode_lead(mut self, lead: &str) -> CniError {
        if self.code != ErrorCode::Decode {
            return self;
        }
        if let Some(rest) = self
            .msg
            .strip_prefix(DECODE_LEAD)
            .and_then(|r| r.strip_prefix(": "))
        {
            self.msg = format!("{lead}: {rest}");
        }
        self
    }
}

pub use gostr::{go_errno, go_quote};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_object_has_the_spec_keys_in_order_and_omits_empty_details() {
        let e = CniError::new(
            ErrorCode::InvalidEnv,
            "required env variables [CNI_NETNS] missing",
        );
        assert_eq!(
            e.to_json("1.1.0"),
            "{\n    \"cniVersion\": \"1.1.0\",\n    \"code\": 4,\n    \"msg\": \"required env variables [CNI_NETNS] missing\"\n}"
        );
        let e = e.with_details("more");
        assert!(e.to_json("0.4.0").ends_with("\"details\": \"more\"\n}"));
        // Go's escaping applies to messages too.
        let e = CniError::invalid_config("bad hostIP <x> & more");
        assert!(
            e.to_json("1.1.0")
                .contains("bad hostIP \\u003cx\\u003e \\u0026 more")
        );
    }

    #[test]
    fn codes_match_the_spec_numbers() {
        let table = [
            (ErrorCode::IncompatibleVersion, 1),
            (ErrorCode::UnsupportedField, 2),
            (ErrorCode::UnknownContainer, 3),
            (ErrorCode::InvalidEnv, 4),
            (ErrorCode::Io, 5),
            (ErrorCode::Decode, 6),
            (ErrorCode::InvalidConfig, 7),
            (ErrorCode::InvalidNetns, 8),
            (ErrorCode::TryAgainLater, 11),
            (ErrorCode::PluginNotAvailable, 50),
            (ErrorCode::LimitedConnectivity, 51),
            (ErrorCode::Internal, 999),
            (ErrorCode::Plugin(120), 120),
        ];
        for (code, n) in table {
            assert_eq!(code.as_u32(), n);
        }
    }

    #[test]
    fn a_reference_wording_takes_msg_and_ours_moves_to_details() {
        let ours = CniError::internal("ours").with_details("cause");
        let e = ours.clone().reworded_as(Some("theirs".into()));
        assert_eq!(
            (e.code, e.msg.as_str(), e.details.as_str()),
            (ErrorCode::Internal, "theirs", "ours: cause")
        );
        let e = CniError::internal("ours").reworded_as(Some("theirs".into()));
        assert_eq!(e.details, "ours");
        assert_eq!(ours.clone().reworded_as(None), ours);
        assert_eq!(ours.clone().reworded_as(Some("ours".into())), ours);
    }

    #[test]
    fn decode_errors_take_the_plugins_own_lead() {
        let shared = CniError::new(
            ErrorCode::Decode,
            "failed to decode network configuration: mtu: invalid type",
        );
        assert_eq!(
            shared
                .clone()
                .with_decode_lead("failed to load netconf")
                .msg,
            "failed to load netconf: mtu: invalid type"
        );
        let other = CniError::new(ErrorCode::Decode, "could not parse prevResult: x");
        assert_eq!(
            other.clone().with_decode_lead("failed to load netconf"),
            other
        );
        let not_decode = CniError::invalid_config("x");
        assert_eq!(not_decode.clone().with_decode_lead("lead"), not_decode);
    }

    #[test]
    fn a_lead_goes_before_the_message_only() {
        let e = CniError::new(ErrorCode::Decode, "could not parse prevResult: x").with_details("d");
        let led = e.led_by("could not parse prevResult");
        assert_eq!(
            (led.code, led.msg.as_str(), led.details.as_str()),
            (
                ErrorCode::Decode,
                "could not parse prevResult: could not parse prevResult: x",
                "d"
            )
        );
    }

    #[test]
    fn from_error_keeps_the_cause_chain_in_details() {
        #[derive(Debug, thiserror::Error)]
        #[error("failed to open netns \"/nonexistent/netns\"")]
        struct Open(#[source] std::io::Error);
        let err = Open(std::io::Error::from_raw_os_error(libc::ENOENT));
        let cni = CniError::from_error(ErrorCode::InvalidNetns, &err);
        assert_eq!(cni.code, ErrorCode::InvalidNetns);
        assert!(cni.msg.contains("/nonexistent/netns"), "{}", cni.msg);
        assert!(cni.details.contains("No such file"), "{}", cni.details);
    }
}
