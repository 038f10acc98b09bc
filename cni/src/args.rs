//! `CNI_ARGS`: the runtime's `K=V;K=V` string of extra per-call arguments.
//!
//! The keys real runtimes send are `IgnoreUnknown` (`1` from containerd/CRI-O/podman, `true` from
//! Multus), `K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_INFRA_CONTAINER_ID`, `K8S_POD_UID`,
//! `MAC` and `IP`. Like Go's `types.LoadArgs`, keys are case-sensitive and an unknown key is an
//! error unless `IgnoreUnknown` is true; unlike it, empty segments (a trailing `;`) are skipped
//! and a value may contain `=` (the pair splits at the first one).

/// The keys every plugin understands; plugins may accept more through [`CniArgs::check_known`].
pub const WELL_KNOWN: &[&str] = &[
    "IgnoreUnknown",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
    "MAC",
    "IP",
];

/// A problem in `CNI_ARGS`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A segment without `=` or with an empty key.
    #[error("CNI_ARGS: invalid pair {0:?}")]
    InvalidPair(String),
    /// `IgnoreUnknown` with a value other than 1/0/true/false.
    #[error("CNI_ARGS: invalid value {0:?} for IgnoreUnknown (want 1, 0, true or false)")]
    IgnoreUnknownValue(String),
    /// Pairs (`K=V`) whose keys nobody understands, without `IgnoreUnknown`.
    #[error("CNI_ARGS: unknown args {0:?}")]
    Unknown(Vec<String>),
}

/// Parsed `CNI_ARGS`, pairs in their original order ([`crate::skel::Call::cni_args`] parses
/// the call's):
///
/// ```
/// use cni::args::CniArgs;
///
/// let args = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=app-0;X=1")?;
/// assert_eq!(args.k8s_pod().as_deref(), Some("web/app-0"));
/// assert_eq!(args.get("X"), Some("1"));
/// assert!(args.check_known(&[]).is_ok()); // IgnoreUnknown: X is let through
///
/// let strict = CniArgs::parse("X=1")?;
/// let err = strict.check_known(&[]).unwrap_err();
/// assert_eq!(err.to_string(), r#"CNI_ARGS: unknown args ["X=1"]"#);
/// # Ok::<(), cni::args::ArgsError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
    ignore_unknown: bool,
}

impl CniArgs {
    /// Parses the raw `CNI_ARGS` value.
    ///
    /// # Errors
    /// [`ArgsError::InvalidPair`] for a segment that is not `K=V`,
    /// [`ArgsError::IgnoreUnknownValue`] for a bad `IgnoreUnknown`.
    pub fn parse(raw: &str) -> Result<CniArgs, ArgsError> {
        let mut args = CniArgs::default();
        for segment in raw.split(';').filter(|s| !s.trim().is_empty()) {
            let Some((key, value)) = segment.split_once('=') else {
                return Err(ArgsError::InvalidPair(segment.to_string()));
            };
            if key.is_empty() {
                return Err(ArgsError::InvalidPair(segment.to_string()));
            }
            if key == "IgnoreUnknown" {
                args.ignore_unknown = match value.to_ascii_lowercase().as_str() {
                    "1" | "true" => true,
                    "0" | "false" => false,
                    _ => return Err(ArgsError::IgnoreUnknownValue(value.to_string())),
                };
            }
            args.pairs.push((key.to_string(), value.to_string()));
        }
        Ok(args)
    }

    /// The value of `key` (the last one when repeated).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// True when `IgnoreUnknown` was `1` or `true`.
    pub fn ignore_unknown(&self) -> bool {
        self.ignore_unknown
    }

    /// All pairs in order.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// `MAC`, the MAC address a runtime asks for (podman, CRI-O, nerdctl).
    pub fn mac(&self) -> Option<&str> {
        self.get("MAC").filter(|v| !v.is_empty())
    }

    /// `IP`, a static IP a runtime asks for.
    pub fn ip(&self) -> Option<&str> {
        self.get("IP").filter(|v| !v.is_empty())
    }

    /// `K8S_POD_NAMESPACE`/`K8S_POD_NAME` as `namespace/name`, when the runtime is Kubernetes.
    pub fn k8s_pod(&self) -> Option<String> {
        match (self.get("K8S_POD_NAMESPACE"), self.get("K8S_POD_NAME")) {
            (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
            (None, Some(name)) => Some(name.to_string()),
            _ => None,
        }
    }

    /// Fails on keys outside [`WELL_KNOWN`] and `extra`, unless `IgnoreUnknown` is set.
    ///
    /// # Errors
    /// [`ArgsError::Unknown`] listing the pairs of the unknown keys.
    pub fn check_known(&self, extra: &[&str]) -> Result<(), ArgsError> {
        if self.ignore_unknown {
            return Ok(());
        }
        let unknown: Vec<String> = self
            .pairs
            .iter()
            .filter(|(k, _)| !WELL_KNOWN.contains(&k.as_str()) && !extra.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(ArgsError::Unknown(unknown))
        }
    }
}

impl ArgsError {
    /// The reference's message for the same problem (Go's `types.LoadArgs`).
    pub fn reference_msg(&self) -> String {
        use crate::error::go_quote;
        match self {
            ArgsError::InvalidPair(pair) => format!("ARGS: invalid pair {}", go_quote(pair)),
            ArgsError::IgnoreUnknownValue(value) => format!(
                "ARGS: error parsing value of pair {}: boolean unmarshal error: invalid input {value}",
                go_quote(&format!("IgnoreUnknown={value}"))
            ),
            ArgsError::Unknown(pairs) => {
                let quoted: Vec<String> = pairs.iter().map(|p| go_quote(p)).collect();
                format!("ARGS: unknown args [{}]", quoted.join(" "))
            }
        }
    }
}

impl From<ArgsError> for crate::error::CniError {
    fn from(err: ArgsError) -> Self {
        crate::error::CniError::new(crate::error::ErrorCode::InvalidEnv, err.reference_msg())
            .with_details(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_podman_and_containerd_send() {
        let a = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;\
             K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1;MAC=02:42:ac:11:00:02;IP=10.88.0.5",
        )
        .unwrap();
        assert!(a.ignore_unknown());
        assert_eq!(a.mac(), Some("02:42:ac:11:00:02"));
        assert_eq!(a.ip(), Some("10.88.0.5"));
        assert_eq!(a.k8s_pod().as_deref(), Some("default/web"));
        assert_eq!(a.get("K8S_POD_UID"), Some("u-1"));
        assert!(a.check_known(&[]).is_ok());
    }

    #[test]
    fn ignore_unknown_accepts_one_and_true_in_any_case() {
        for v in ["1", "true", "TRUE", "True"] {
            let a = CniArgs::parse(&format!("IgnoreUnknown={v};FOO=bar")).unwrap();
            assert!(a.ignore_unknown(), "{v}");
            assert!(a.check_known(&[]).is_ok());
        }
        for v in ["0", "false"] {
            assert!(
                !CniArgs::parse(&format!("IgnoreUnknown={v}"))
                    .unwrap()
                    .ignore_unknown()
            );
        }
        assert_eq!(
            CniArgs::parse("IgnoreUnknown=yes"),
            Err(ArgsError::IgnoreUnknownValue("yes".into()))
        );
    }

    #[test]
    fn unknown_keys_fail_only_without_ignore_unknown() {
        let a = CniArgs::parse("FOO=1;MAC=x;BAR=2").unwrap();
        assert_eq!(
            a.check_known(&[]),
            Err(ArgsError::Unknown(vec!["FOO=1".into(), "BAR=2".into()]))
        );
        assert_eq!(
            a.check_known(&["FOO"]),
            Err(ArgsError::Unknown(vec!["BAR=2".into()]))
        );
        assert!(a.check_known(&["FOO", "BAR"]).is_ok());
    }

    #[test]
    fn errors_carry_the_references_words_as_msg() {
        // What Debian's Go tuning (1.1.1) prints for each.
        let cases = [
            (
                CniArgs::parse("FOO=bar")
                    .unwrap()
                    .check_known(&[])
                    .unwrap_err(),
                r#"ARGS: unknown args ["FOO=bar"]"#,
            ),
            (
                CniArgs::parse("FOO").unwrap_err(),
                r#"ARGS: invalid pair "FOO""#,
            ),
            (
                CniArgs::parse("IgnoreUnknown=maybe").unwrap_err(),
                r#"ARGS: error parsing value of pair "IgnoreUnknown=maybe": boolean unmarshal error: invalid input maybe"#,
            ),
        ];
        for (err, want) in cases {
            let cni = crate::error::CniError::from(err.clone());
            assert_eq!(cni.code, crate::error::ErrorCode::InvalidEnv);
            assert_eq!(cni.msg, want);
            assert_eq!(cni.details, err.to_string());
        }
        let two = CniArgs::parse("A=1;B=2")
            .unwrap()
            .check_known(&[])
            .unwrap_err();
        assert_eq!(two.reference_msg(), r#"ARGS: unknown args ["A=1" "B=2"]"#);
    }

    #[test]
    fn malformed_pairs_are_errors_but_empty_segments_are_skipped() {
        assert_eq!(
            CniArgs::parse("MAC"),
            Err(ArgsError::InvalidPair("MAC".into()))
        );
        assert_eq!(
            CniArgs::parse("=x"),
            Err(ArgsError::InvalidPair("=x".into()))
        );
        let a = CniArgs::parse("MAC=a;;IP=b;").unwrap();
        assert_eq!(a.pairs().len(), 2);
        let a = CniArgs::parse("TOKEN=a=b").unwrap();
        assert_eq!(a.get("TOKEN"), Some("a=b"));
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
    }

    #[test]
    fn the_last_repeated_key_wins_and_keys_are_case_sensitive() {
        let a = CniArgs::parse("MAC=a;MAC=b;mac=c").unwrap();
        assert_eq!(a.mac(), Some("b"));
        assert!(a.check_known(&[]).is_err());
    }
}
