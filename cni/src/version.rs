//! CNI spec versions: parsing, ordering, the supported lists and the result "era" of each.

use std::fmt;
use std::str::FromStr;

/// Every spec version a plugin can speak, oldest first (the reference's `version.All`).
pub const ALL: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The newest spec version, used where the caller gave none (error objects, VERSION replies).
pub const LATEST: &str = "1.1.0";

/// The versions of [`ALL`] from `min` on, like Go's `version.PluginSupports(VersionsStartingFrom(min))`.
pub fn starting_from(min: &str) -> &'static [&'static str] {
    let start = ALL.iter().position(|v| *v == min).unwrap_or(ALL.len());
    &ALL[start..]
}

/// A parsed version: one to three dot-separated integers, missing parts zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CniVersion {
    /// Major part.
    pub major: u32,
    /// Minor part.
    pub minor: u32,
    /// Patch part.
    pub patch: u32,
}

impl CniVersion {
    /// Builds a version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        CniVersion {
            major,
            minor,
            patch,
        }
    }
}

/// A version string that is not one to three dot-separated integers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid version {0:?}: expected up to three dot-separated integers")]
pub struct VersionError(pub String);

impl FromStr for CniVersion {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || VersionError(s.to_string());
        let parts: Vec<&str> = s.split('.').collect();
        if s.is_empty() || parts.len() > 3 {
            return Err(bad());
        }
        let mut nums = [0u32; 3];
        for (slot, part) in nums.iter_mut().zip(&parts) {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            *slot = part.parse().map_err(|_| bad())?;
        }
        Ok(CniVersion::new(nums[0], nums[1], nums[2]))
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The result family a version belongs to; results convert freely inside a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 0.1.0 and 0.2.0 (and an empty version): `ip4`/`ip6` blocks.
    V020,
    /// 0.3.0, 0.3.1 and 0.4.0: `interfaces` and `ips` with a `version` field.
    V040,
    /// 1.0.0 and 1.1.0: `ips` without `version`, interface `mtu`, `socketPath`, `pciID`.
    V100,
}

impl Era {
    /// The era of a version string, or `None` for a version no result type exists for.
    pub fn of(version: &str) -> Option<Era> {
        match version {
            "" | "0.1.0" | "0.2.0" => Some(Era::V020),
            "0.3.0" | "0.3.1" | "0.4.0" => Some(Era::V040),
            "1.0.0" | "1.1.0" => Some(Era::V100),
            _ => None,
        }
    }

    /// The versions of this era, as Go lists them in its error messages.
    pub fn versions(self) -> &'static [&'static str] {
        match self {
            Era::V020 => &["", "0.1.0", "0.2.0"],
            Era::V040 => &["0.3.0", "0.3.1", "0.4.0"],
            Era::V100 => &["1.0.0", "1.1.0"],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_one_to_three_parts_with_missing_parts_zero() {
        assert_eq!("1".parse::<CniVersion>().unwrap(), CniVersion::new(1, 0, 0));
        assert_eq!(
            "0.4".parse::<CniVersion>().unwrap(),
            CniVersion::new(0, 4, 0)
        );
        assert_eq!(
            "0.3.1".parse::<CniVersion>().unwrap(),
            CniVersion::new(0, 3, 1)
        );
        for bad in ["", "1.2.3.4", "a.b", "1..2", "1.-2", "v1.0.0", " 1.0"] {
            assert!(bad.parse::<CniVersion>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn versions_order_numerically() {
        let v = |s: &str| s.parse::<CniVersion>().unwrap();
        assert!(v("0.10.0") > v("0.4.0"));
        assert!(v("1.1.0") > v("1.0.0"));
        assert!(v("0.4.0") >= v("0.4"));
    }

    #[test]
    fn starting_from_matches_the_reference_lists() {
        assert_eq!(
            starting_from("0.3.0"),
            &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
        );
        assert_eq!(starting_from("0.4.0"), &["0.4.0", "1.0.0", "1.1.0"]);
        assert_eq!(starting_from("0.1.0"), ALL);
    }

    #[test]
    fn every_supported_version_has_an_era() {
        for v in ALL {
            assert!(Era::of(v).is_some(), "{v}");
        }
        assert_eq!(Era::of("0.5.0"), None);
    }
}
