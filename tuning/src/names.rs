//! Every path and name another program (the Go plugin, an operator) can see, in one place.

/// Where backup files live unless the config sets `dataDir` (the reference's default).
pub const DEFAULT_DATA_DIR: &str = "/run/cni/tuning";

/// The operator's sysctl allowlist; when it exists every sysctl key must match one of its lines.
pub const ALLOWLIST_PATH: &str = "/etc/cni/tuning/allowlist.conf";

/// The placeholder in a sysctl key that stands for `CNI_IFNAME` (first occurrence only).
pub const IFNAME_PLACEHOLDER: &str = "IFNAME";

/// The lock file in the data dir that serialises backup reads and writes.
pub const LOCK_FILE: &str = ".lock";

/// The backup file of one attachment, `<containerID>_<ifname>.json`, as the Go plugin names it,
/// so either binary finds the other's file.
pub fn backup_file_name(container_id: &str, ifname: &str) -> String {
    format!("{container_id}_{ifname}.json")
}

/// The backup file of an attachment whose reference name ([`backup_file_name`]) holds the
/// backup of another one: `:<containerID>:<ifname>.json` ([`host::store::attachment_name`]
/// with no network), which no two attachments share and no reference name is (those hold no
/// `:`). Only we read it.
pub fn own_backup_file_name(container_id: &str, ifname: &str) -> String {
    let mut name = host::store::attachment_name("", container_id, ifname);
    name.push_str(".json");
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_file_name_is_the_references() {
        assert_eq!(backup_file_name("dummy", "dummy0"), "dummy_dummy0.json");
        assert_eq!(backup_file_name("abc_1", "eth0.100"), "abc_1_eth0.100.json");
        assert_eq!(own_backup_file_name("abc_1", "eth0"), ":abc_1:eth0.json");
        assert_ne!(
            own_backup_file_name("a_b", "c"),
            own_backup_file_name("a", "b_c")
        );
    }
}
