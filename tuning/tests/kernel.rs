//! Kernel tests: ADD, CHECK and DEL of the library against real links and sysctls, each test in
//! a fresh network namespace of its own (`unshare(CLONE_NEWNET)` on a dedicated thread). Kernel
//! state is read back with `ip -j` and `/proc/sys`, never through the code under test.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]
// Helpers outside #[test] fns panic on setup failures, as the tests themselves do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use cni::Attachment;
use cni::args::CniArgs;
use cni::conf::NetConf;
use host::netns::NetNs;
use serde_json::{Value, json};
use tuning::apply::{self, Restored};
use tuning::backup::BackupStore;
use tuning::config::{Config, TuningKeys};
use tuning::error::TuningError;

/// Runs `body` on a thread in a fresh network namespace of its own.
fn in_fresh_netns<T: Send>(body: impl FnOnce() -> T + Send) -> T {
    host::netns::in_new_netns(body).expect("a fresh network namespace needs root")
}

/// `ip` in the calling thread's namespace (children inherit the thread's netns).
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn link(name: &str) -> Value {
    let out = Command::new("ip")
        .args(["-j", "-d", "link", "show", "dev", name])
        .output()
        .unwrap();
    assert!(out.status.success(), "ip link show {name}");
    serde_json::from_slice::<Value>(&out.stdout).unwrap()[0].clone()
}

fn has_flag(link: &Value, flag: &str) -> bool {
    link["flags"].as_array().unwrap().iter().any(|f| f == flag)
}

fn sysctl(path: &str) -> String {
    std::fs::read_to_string(Path::new("/proc/sys").join(path))
        .unwrap()
        .trim()
        .to_string()
}

/// A veth `name` (peer `name-p` truncated) with a known MAC, MTU 1500, down.
fn veth(name: &str) {
    let peer: String = format!("p{name}").chars().take(15).collect();
    ip(&[
        "link",
        "add",
        name,
        "address",
        "02:00:00:00:00:aa",
        "type",
        "veth",
        "peer",
        "name",
        &peer,
    ]);
}

fn config(keys: Value, ifname: &str, data_dir: &Path) -> Config {
    let mut conf = keys;
    conf["cniVersion"] = json!("1.0.0");
    conf["name"] = json!("net1");
    conf["dataDir"] = json!(data_dir);
    let conf: NetConf<TuningKeys> = NetConf::from_value(conf).unwrap();
    Config::load(&conf, &CniArgs::default(), ifname).unwrap()
}

fn who(ifname: &str) -> Attachment {
    Attachment::new("net1", "c1", ifname)
}

struct Stage {
    ns: NetNs,
    store: BackupStore,
    _dir: tempfile::TempDir,
}

impl Stage {
    fn new() -> Stage {
        let dir = tempfile::tempdir().unwrap();
        Stage {
            ns: NetNs::current().unwrap(),
            store: BackupStore::new(dir.path().join("tuning")),
            _dir: dir,
        }
    }

    fn config(&self, keys: Value, ifname: &str) -> Config {
        config(keys, ifname, self.store.dir())
    }

    fn add(&self, c: &Config, ifname: &str) -> Result<(), TuningError> {
        apply::add(&self.ns, c, &who(ifname), &self.store)
    }

    fn check(&self, c: &Config, ifname: &str) -> Result<(), TuningError> {
        apply::check(&self.ns, c, ifname)
    }

    fn del(&self, ifname: &str) -> Restored {
        apply::del(Some(&self.ns), &who(ifname), &self.store).unwrap()
    }

    fn backup_exists(&self, ifname: &str) -> bool {
        self.store.path(&self.store.name("c1", ifname)).exists()
    }
}

#[test]
fn each_link_attribute_is_set_checked_and_restored() {
    in_fresh_netns(|| {
        let stage = Stage::new();
        veth("eth0");
        let cases: [(Value, &str); 5] = [
            (json!({"mac": "02:11:22:33:44:55"}), "mac"),
            (json!({"mtu": 1400}), "mtu"),
            (json!({"promisc": true}), "promisc"),
            (json!({"allmulti": true}), "allmulti"),
            (json!({"txQLen": 77}), "txqlen"),
        ];
        for (keys, what) in cases {
            let before = link("eth0");
            let c = stage.config(keys, "eth0");
            stage.add(&c, "eth0").unwrap();
            let after = link("eth0");
            match what {
                "mac" => assert_eq!(after["address"], "02:11:22:33:44:55"),
                "mtu" => assert_eq!(after["mtu"], 1400),
                "promisc" => assert!(has_flag(&after, "PROMISC")),
                "allmulti" => assert!(has_flag(&after, "ALLMULTI")),
                _ => assert_eq!(after["txqlen"], 77),
            }
            assert!(stage.backup_exists("eth0"), "{what}");
            stage.check(&c, "eth0").unwrap();
            assert_eq!(stage.del("eth0"), Restored::Done, "{what}");
            let restored = link("eth0");
            for key in ["address", "mtu", "txqlen", "flags"] {
                assert_eq!(restored[key], before[key], "{what}: {key} not restored");
            }
            assert!(!stage.backup_exists("eth0"), "{what}: backup left behind");
        }
    });
}

#[test]
fn allmulti_false_turns_it_off_and_del_turns_it_back_on() {
    in_fresh_netns(|| {
        let stage = Stage::new();
        veth("eth0");
        ip(&["link", "set", "eth0", "allmulticast", "on"]);
        let c = stage.config(json!({"allmulti": false}), "eth0");
        stage.add(&c, "eth0").unwrap();
        assert!(!has_flag(&link("eth0"), "ALLMULTI"));
        stage.check(&c, "eth0").unwrap();
        stage.del("eth0");
        assert!(has_flag(&link("eth0"), "ALLMULTI"));
    });
}

#[test]
fn check_names_the_first_drift_and_never_writes() {
    in_fresh_netns(|| {
        let stage = Stage::new();
        veth("eth0");
        let c = stage.config(
            json!({"mac": "02:11:22:33:44:55", "mtu": 1400,
                   "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2"}}),
            "eth0",
        );
        stage.add(&c, "eth0").unwrap();
        stage.check(&c, "eth0").unwrap();
        ip(&["link", "set", "eth0", "mtu", "1300"]);
        let err = stage.check(&c, "eth0").unwrap_err().to_string();
        assert_eq!(err, "eth0 mtu is 1300, configured 1400");
        assert_eq!(link("eth0")["mtu"], 1300, "CHECK must not repair");
        ip(&["link", "set", "eth0", "mtu", "1400"]);
        std::fs::write("/proc/sys/net/ipv4/conf/eth0/rp_filter", "1").unwrap();
        let err = stage.check(&c, "eth0").unwrap_err().to_string();
        assert!(
            err.starts_with("sysctl net.ipv4.conf.eth0.rp_filter is \"1\", configured \"2\""),
            "{err}"
        );
        // An upper-case MAC in the config still matches the kernel's lower-case form.
        let upper = stage.config(json!({"mac": "02:11:22:33:44:55".to_uppercase()}), "eth0");
        stage.check(&upper, "eth0").unwrap();
        ip(&["link", "del", "eth0"]);
        let err = stage.check(&c, "eth0").unwrap_err();
        assert!(
            err.to_string().contains("does not exist") || err.to_string().contains("not found"),
            "{err}"
        );
    });
}

#[test]
fn sysctls_are_set_and_restored_including_interface_names_with_dots() {
    in_fresh_netns(|| {
        let stage = Stage::new();
        veth("eth0");
        // A VLAN-style name (this kernel has no vlan module; the name is what matters).
        veth("eth0.100");
        let keys = json!({"sysctl": {
            "net.ipv4.conf.IFNAME.rp_filter": "2",
            "net/ipv4/conf/eth0.100/arp_ignore": "1",
            "net.ipv6.conf.IFNAME.accept_ra": "0",
            "net.ipv4.ip_forward": "1",
        }});
        let c = stage.config(keys, "eth0.100");
        let before: Vec<String> = [
            "net/ipv4/conf/eth0.100/rp_filter",
            "net/ipv4/conf/eth0.100/arp_ignore",
            "net/ipv6/conf/eth0.100/accept_ra",
            "net/ipv4/ip_forward",
        ]
        .iter()
        .map(|k| sysctl(k))
        .collect();
        assert_eq!(before, ["0", "0", "1", "0"]);
        stage.add(&c, "eth0.100").unwrap();
        assert_eq!(sysctl("net/ipv4/conf/eth0.100/rp_filter"), "2");
        assert_eq!(sysctl("net/ipv4/conf/eth0.100/arp_ignore"), "1");
        assert_eq!(sysctl("net/ipv6/conf/eth0.100/accept_ra"), "0");
        assert_eq!(sysctl("net/ipv4/ip_forward"), "1");
        assert_eq!(
            sysctl("net/ipv4/conf/eth0/rp_filter"),
            "0",
            "the parent is untouched"
        );
        stage.check(&c, "eth0.100").unwrap();
        let file =
            std::fs::read_to_string(stage.store.path(&stage.store.name("c1", "eth0.100"))).unwrap();
        assert!(
            file.contains("\"net/ipv4/conf/eth0.100/rp_filter\""),
            "{file}"
        );
        stage.del("eth0.100");
        assert_eq!(sysctl("net/ipv4/conf/eth0.100/rp_filter"), "0");
        assert_eq!(sysctl("net/ipv4/conf/eth0.100/arp_ignore"), "0");
        assert_eq!(sysctl("net/ipv6/conf/eth0.100/accept_ra"), "1");
        assert_eq!(sysctl("net/ipv4/ip_forward"), "0");
        assert!(!stage.backup_exists("eth0.100"));
    });
}

#[test]
fn a_repeated_add_keeps_the_original_values_for_del() {
    in_fresh_netns(|| {
        let stage = Stage::new();
        veth("eth0");
        let c = stage.config(
            json!({"mtu": 1400, "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2"}}),
            "eth0",
        );
        stage.add(&c, "eth0").unwrap();
        stage.add(&c, "eth0").unwrap();
        let c2 = stage.config(json!({"mtu": 1300, "txQLen": 9}), "eth0");
        stage.add(&c2, "eth0").unwrap();
        stage.del("eth0");
        let l = link("eth0");
        assert_eq!(
            (l["mtu"].clone(), l["txqlen"].clone()),
            (json!(1500), json!(1000))
        );
        assert_eq!(sysctl("net/ipv4/conf/eth0/rp_filter"), "0");
    });
}

#[test]
fn a_failing_add_rolls_back_sysctls_link_and_backup_file() {
    in_fresh_netns(|| {
        let stage = Stage::new();
        veth("eth0");
        let before = link("eth0");
        // The sysctls go in, then the kernel refuses a multicast MAC: everything must be undone.
        let c = stage.config(
            json!({"mtu": 1400, "mac": "01:00:5e:00:00:01",
                   "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2", "net.ipv4.conf.IFNAME.arp_ignore": "1"}}),
            "eth0",
        );
        let err = stage.add(&c, "eth0").unwrap_err();
        assert!(matches!(err, TuningError::Netlink(_)), "{err}");
        assert_eq!(sysctl("net/ipv4/conf/eth0/rp_filter"), "0");
        assert_eq!(sysctl("net/ipv4/conf/eth0/arp_ignore"), "0");
        let after = link("eth0");
        for key in ["address", "mtu", "txqlen", "flags"] {
            assert_eq!(after[key], before[key], "{key}");
        }
        assert!(!stage.backup_exists("eth0"), "a new backup file must go");

        // A value the kernel refuses half-way through the sysctls, with an earlier ADD's
        // backup in place: the first sysctl is undone and the earlier backup kept as it was.
        let first = stage.config(json!({"txQLen": 5}), "eth0");
        stage.add(&first, "eth0").unwrap();
        let saved = std::fs::read(stage.store.path(&stage.store.name("c1", "eth0"))).unwrap();
        let bad = stage.config(
            json!({"sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2", "net.ipv4.conf.IFNAME.arp_ignore": "banana"}}),
            "eth0",
        );
        let err = stage.add(&bad, "eth0").unwrap_err();
        assert!(matches!(err, TuningError::InvalidSysctl { .. }), "{err}");
        assert!(err.to_string().contains("banana"), "{err}");
        assert_eq!(sysctl("net/ipv4/conf/eth0/rp_filter"), "0");
        assert_eq!(
            std::fs::read(stage.store.path(&stage.store.name("c1", "eth0"))).unwrap(),
            saved
        );
        stage.del("eth0");
        assert_eq!(link("eth0")["txqlen"], 1000);
    });
}

#[test]
fn validation_against_the_live_interface_changes_nothing() {
    in_fresh_netns(|| {
        let stage = Stage::new();
        veth("eth0");
        // A sysctl that does not exist in this namespace.
        let c = stage.config(
            json!({"mtu": 1400, "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2", "net.ipv4.conf.IFNAME.no_such_key": "1"}}),
            "eth0",
        );
        let err = stage.add(&c, "eth0").unwrap_err();
        assert!(matches!(err, TuningError::SysctlMissing { .. }), "{err}");
        assert!(err.to_string().contains("no_such_key"), "{err}");
        // A missing interface.
        let c = stage.config(json!({"mtu": 1400}), "nosuch0");
        assert!(matches!(
            stage.add(&c, "nosuch0").unwrap_err(),
            TuningError::LinkNotFound { .. }
        ));
        assert_eq!(link("eth0")["mtu"], 1500);
        assert_eq!(sysctl("net/ipv4/conf/eth0/rp_filter"), "0");
        assert!(!stage.backup_exists("eth0"));
    });
}

#[test]
fn write_only_sysctls_are_written_but_not_saved() {
    in_fresh_netns(|| {
        let stage = Stage::new();
        let c = stage.config(
            json!({"sysctl": {"net.ipv4.route.flush": "1", "net.ipv4.ip_forward": "1"}}),
            "eth0",
        );
        stage.add(&c, "eth0").unwrap();
        let file =
            std::fs::read_to_string(stage.store.path(&stage.store.name("c1", "eth0"))).unwrap();
        assert!(
            !file.contains("flush") && file.contains("net/ipv4/ip_forward"),
            "{file}"
        );
        stage.check(&c, "eth0").unwrap();
        stage.del("eth0");
        assert_eq!(sysctl("net/ipv4/ip_forward"), "0");
    });
}

#[test]
fn del_succeeds_without_file_interface_or_netns_and_removes_what_cannot_be_used() {
    in_fresh_netns(|| {
        let stage = Stage::new();
        assert_eq!(stage.del("eth0"), Restored::NothingSaved);
        veth("eth0");
        let c = stage.config(
            json!({"mtu": 1400, "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2"}}),
            "eth0",
        );
        stage.add(&c, "eth0").unwrap();
        ip(&["link", "del", "eth0"]);
        assert_eq!(stage.del("eth0"), Restored::Done, "the interface is gone");
        assert!(!stage.backup_exists("eth0"));

        veth("eth0");
        stage.add(&c, "eth0").unwrap();
        assert_eq!(
            apply::del(None, &who("eth0"), &stage.store).unwrap(),
            Restored::Done,
            "the netns is gone"
        );
        assert!(!stage.backup_exists("eth0"));

        std::fs::create_dir_all(stage.store.dir()).unwrap();
        std::fs::write(
            stage.store.path(&stage.store.name("c1", "eth0")),
            "{truncated",
        )
        .unwrap();
        assert_eq!(stage.del("eth0"), Restored::Done, "a corrupt file");
        assert!(!stage.backup_exists("eth0"));
    });
}
