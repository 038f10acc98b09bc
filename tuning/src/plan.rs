//! What to change, save, compare or restore, decided from the config and what the kernel shows
//! (pure).

use cni::Attachment;
use host::sysctl::SysctlKey;
use netlink::{LinkChange, format_mac};

use crate::backup::{Backup, SavedSysctl};
use crate::config::{Config, SysctlSetting, parse_mac};
use crate::error::TuningError;

/// The attributes of `CNI_IFNAME` as the kernel reports them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LinkState {
    /// Interface index.
    pub index: u32,
    /// Hardware address.
    pub mac: Option<Vec<u8>>,
    /// MTU.
    pub mtu: u32,
    /// The device's smallest MTU (`IFLA_MIN_MTU`), when reported.
    pub min_mtu: Option<u32>,
    /// The device's largest MTU (`IFLA_MAX_MTU`; 0 means no limit), when reported.
    pub max_mtu: Option<u32>,
    /// Transmit queue length.
    pub txqlen: u32,
    /// `IFF_PROMISC`.
    pub promisc: bool,
    /// `IFF_ALLMULTI`.
    pub allmulti: bool,
}

/// What one ADD does, in order: save `backup`, write `sysctls`, apply `link`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddPlan {
    /// The backup file to write before changing anything: the existing one's originals kept,
    /// the ones first changed by this ADD added.
    pub backup: Backup,
    /// What this ADD alone replaced: the rollback target if a later step fails.
    pub undo: Backup,
    /// Sysctl writes, in config order.
    pub sysctls: Vec<(SysctlKey, String)>,
    /// The link change (only attributes that differ from the live ones).
    pub link: LinkChange,
}

/// Plans an ADD. `link` is the live interface (needed when the config changes a link
/// attribute), `originals` the live value of each configured sysctl (`None` for a write-only
/// key, which cannot be restored), `existing` the backup of an earlier ADD of this attachment.
///
/// # Errors
/// [`TuningError::InvalidValue`] when the MTU is outside the device's range, or the MAC is not
/// as long as the device's hardware addresses.
pub fn add(
    config: &Config,
    who: &Attachment,
    link: Option<&LinkState>,
    originals: &[Option<String>],
    existing: Option<Backup>,
) -> Result<AddPlan, TuningError> {
    let mut undo = Backup::default();
    let mut change = LinkChange::default();
    if let Some(link) = link {
        if let Some(mtu) = config.mtu {
            let min = link.min_mtu.unwrap_or(0);
            let max = link.max_mtu.filter(|m| *m > 0).unwrap_or(u32::MAX);
            if mtu < min || mtu > max {
                return Err(TuningError::InvalidMtu {
                    key: "mtu".into(),
                    value: mtu.to_string(),
                    reason: format!("{} accepts MTUs from {min} to {max}", who.ifname),
                });
            }
            undo.mtu = Some(link.mtu);
            change.mtu = (mtu != link.mtu).then_some(mtu);
        }
        if let Some(mac) = &config.mac {
            // The kernel takes a longer address and silently keeps its first bytes (an 8- or
            // 20-octet MAC on an Ethernet device), so the length is checked here.
            if let Some(live) = &link.mac
                && live.len() != mac.bytes.len()
            {
                return Err(TuningError::InvalidValue {
                    key: mac.origin.into(),
                    value: mac.text.clone(),
                    reason: format!(
                        "{} has {}-byte hardware addresses, this one has {}",
                        who.ifname,
                        live.len(),
                        mac.bytes.len()
                    ),
                });
            }
            undo.mac = link.mac.as_deref().map(format_mac);
            change.mac = (link.mac.as_ref() != Some(&mac.bytes)).then(|| mac.bytes.clone());
        }
        if config.promisc {
            undo.promisc = Some(link.promisc);
            change.promisc = (!link.promisc).then_some(true);
        }
        if let Some(on) = config.allmulti {
            undo.allmulti = Some(link.allmulti);
            change.allmulti = (link.allmulti != on).then_some(on);
        }
        if let Some(q) = config.txqlen {
            undo.txqlen = Some(link.txqlen);
            change.txqlen = (link.txqlen != q).then_some(q);
        }
    }
    for (setting, original) in config.sysctls.iter().zip(originals) {
        let key = setting.key.as_path();
        if let Some(value) = original
            && !undo.sysctls.iter().any(|s| s.key == key)
        {
            undo.sysctls.push(SavedSysctl {
                key: key.to_string(),
                value: value.clone(),
            });
        }
    }

    // An earlier ADD's originals win: this ADD sees values that ADD already changed.
    let mut backup = existing.unwrap_or_default();
    backup.mac = backup.mac.or_else(|| undo.mac.clone());
    backup.mtu = backup.mtu.or(undo.mtu);
    backup.promisc = backup.promisc.or(undo.promisc);
    backup.allmulti = backup.allmulti.or(undo.allmulti);
    backup.txqlen = backup.txqlen.or(undo.txqlen);
    for saved in &undo.sysctls {
        if !backup.sysctls.iter().any(|s| s.key == saved.key) {
            backup.sysctls.push(saved.clone());
        }
    }
    backup.network = Some(who.network.to_string());
    backup.container_id = Some(who.container_id.to_string());
    backup.ifname = Some(who.ifname.to_string());

    Ok(AddPlan {
        backup,
        undo,
        sysctls: config
            .sysctls
            .iter()
            .map(|s| (s.key.clone(), s.value.clone()))
            .collect(),
        link: change,
    })
}

/// What a DEL (or a rollback) does, in order: the link changes one attribute at a time (MTU,
/// MAC, promisc, allmulti, txqueuelen, the reference's order), then the sysctls in reverse.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RestorePlan {
    /// One change per attribute that differs from its saved value, each with its name.
    pub link: Vec<(&'static str, LinkChange)>,
    /// Sysctl writes, last set first.
    pub sysctls: Vec<(SysctlKey, String)>,
    /// Saved values that cannot be restored (a malformed MAC, a key outside `net/`).
    pub invalid: Vec<String>,
}

/// Plans restoring `backup`; link attributes only when the interface still exists.
pub fn restore(backup: &Backup, link: Option<&LinkState>) -> RestorePlan {
    let mut plan = RestorePlan::default();
    if let Some(link) = link {
        if let Some(mtu) = backup.mtu.filter(|m| *m != link.mtu) {
            plan.link.push((
                "mtu",
                LinkChange {
                    mtu: Some(mtu),
                    ..LinkChange::default()
                },
            ));
        }
        if let Some(text) = &backup.mac {
            match parse_mac(text) {
                Some(mac) if link.mac.as_ref() != Some(&mac) => plan.link.push((
                    "mac",
                    LinkChange {
                        mac: Some(mac),
                        ..LinkChange::default()
                    },
                )),
                Some(_) => {}
                None => plan
                    .invalid
                    .push(format!("saved mac {text:?} is not a MAC address")),
            }
        }
        if let Some(on) = backup.promisc.filter(|p| *p != link.promisc) {
            plan.link.push((
                "promisc",
                LinkChange {
                    promisc: Some(on),
                    ..LinkChange::default()
                },
            ));
        }
        if let Some(on) = backup.allmulti.filter(|a| *a != link.allmulti) {
            plan.link.push((
                "allmulti",
                LinkChange {
                    allmulti: Some(on),
                    ..LinkChange::default()
                },
            ));
        }
        if let Some(q) = backup.txqlen.filter(|q| *q != link.txqlen) {
            plan.link.push((
                "txqueuelen",
                LinkChange {
                    txqlen: Some(q),
                    ..LinkChange::default()
                },
            ));
        }
    }
    for saved in backup.sysctls.iter().rev() {
        // The file is outside our control: a key must still be a network sysctl.
        match SysctlKey::parse(&saved.key) {
            Ok(key) => plan.sysctls.push((key, saved.value.clone())),
            Err(e) => plan.invalid.push(format!("saved sysctl: {e}")),
        }
    }
    plan
}

/// CHECK of one sysctl: the live value must equal the configured one (whitespace runs compare
/// equal, so `"32768 60999"` matches the kernel's `"32768\t60999"`).
///
/// # Errors
/// [`TuningError::Drift`] naming the key, the configured and the live value.
pub fn check_sysctl(setting: &SysctlSetting, live: &str) -> Result<(), TuningError> {
    if setting.value.split_whitespace().eq(live.split_whitespace()) {
        return Ok(());
    }
    Err(TuningError::Drift {
        reference: format!(
            "Error: Tuning configured value of /proc/sys/{} is {}, current value is {live}",
            setting.key.as_path(),
            setting.value
        ),
        ours: format!(
            "sysctl {} is {live:?}, configured {:?} ({} key {:?})",
            setting.key, setting.value, setting.origin, setting.raw
        ),
    })
}

/// CHECK of the link attributes the config sets, in the reference's order (MAC, promisc, MTU,
/// all-multicast, transmit queue length); MACs compared as bytes, so case and separators do
/// not matter.
///
/// # Errors
/// [`TuningError::Drift`] naming the first attribute that differs.
pub fn check_link(config: &Config, ifname: &str, link: &LinkState) -> Result<(), TuningError> {
    let drift = |reference: String, what: &str, want: String, have: String| {
        Err(TuningError::Drift {
            reference,
            ours: format!("{ifname} {what} is {have}, configured {want}"),
        })
    };
    if let Some(mac) = &config.mac
        && link.mac.as_ref() != Some(&mac.bytes)
    {
        let have = link
            .mac
            .as_deref()
            .map_or_else(|| "none".into(), format_mac);
        return drift(
            format!(
                "Error: Tuning configured Ethernet of {ifname} is {}, current value is {have}",
                mac.text
            ),
            "mac",
            format!("{} ({})", mac.text, mac.origin),
            have,
        );
    }
    if config.promisc && !link.promisc {
        return drift(
            format!("Error: Tuning link {ifname} configured promisc is true, current value is 0"),
            "promisc",
            "on".into(),
            "off".into(),
        );
    }
    if let Some(mtu) = config.mtu
        && mtu != link.mtu
    {
        return drift(
            format!(
                "Error: Tuning configured MTU of {ifname} is {mtu}, current value is {}",
                link.mtu
            ),
            "mtu",
            mtu.to_string(),
            link.mtu.to_string(),
        );
    }
    if let Some(on) = config.allmulti
        && on != link.allmulti
    {
        let word = |b: bool| if b { "on" } else { "off" }.to_string();
        return drift(
            format!(
                "Error: Tuning configured all-multicast mode of {ifname} is {on}, current value \
                 is {}",
                link.allmulti
            ),
            "allmulti",
            word(on),
            word(link.allmulti),
        );
    }
    if let Some(q) = config.txqlen
        && q != link.txqlen
    {
        return drift(
            format!(
                "Error: Tuning configured Transmit Queue Length of {ifname} is {q}, current \
                 value is {}",
                link.txqlen
            ),
            "txqueuelen",
            q.to_string(),
            link.txqlen.to_string(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{MacSetting, resolve_sysctl};
    use std::path::PathBuf;

    fn who() -> Attachment {
        Attachment::new("net1", "c1", "eth0")
    }

    fn live() -> LinkState {
        LinkState {
            index: 3,
            mac: Some(vec![0x42, 0xf7, 0x63, 0x74, 0x5e, 0]),
            mtu: 1500,
            min_mtu: Some(68),
            max_mtu: Some(65535),
            txqlen: 1000,
            promisc: false,
            allmulti: false,
        }
    }

    fn sysctl(raw: &str, value: &str) -> SysctlSetting {
        SysctlSetting {
            origin: "sysctl",
            raw: raw.into(),
            key: resolve_sysctl(raw, "eth0").unwrap(),
            value: value.into(),
        }
    }

    fn config() -> Config {
        Config {
            data_dir: PathBuf::from("/run/cni/tuning"),
            sysctls: vec![
                sysctl("net.ipv4.conf.IFNAME.rp_filter", "2"),
                sysctl("net.ipv4.conf.IFNAME.arp_ignore", "1"),
            ],
            mac: Some(MacSetting {
                origin: "mac",
                text: "02:11:22:33:44:55".into(),
                bytes: vec![2, 0x11, 0x22, 0x33, 0x44, 0x55],
            }),
            mtu: Some(1400),
            promisc: true,
            allmulti: Some(true),
            txqlen: Some(500),
        }
    }

    #[test]
    fn add_saves_what_it_changes_and_changes_only_what_differs() {
        let originals = [Some("1".to_string()), Some("0".to_string())];
        let plan = add(&config(), &who(), Some(&live()), &originals, None).unwrap();
        assert_eq!(
            plan.link,
            LinkChange {
                mtu: Some(1400),
                mac: Some(vec![2, 0x11, 0x22, 0x33, 0x44, 0x55]),
                txqlen: Some(500),
                promisc: Some(true),
                allmulti: Some(true),
                up: None,
            }
        );
        assert_eq!(plan.backup.mac.as_deref(), Some("42:f7:63:74:5e:00"));
        assert_eq!(
            (
                plan.backup.mtu,
                plan.backup.promisc,
                plan.backup.allmulti,
                plan.backup.txqlen
            ),
            (Some(1500), Some(false), Some(false), Some(1000))
        );
        assert_eq!(
            plan.backup.sysctls,
            [
                SavedSysctl {
                    key: "net/ipv4/conf/eth0/rp_filter".into(),
                    value: "1".into()
                },
                SavedSysctl {
                    key: "net/ipv4/conf/eth0/arp_ignore".into(),
                    value: "0".into()
                },
            ]
        );
        assert_eq!(plan.backup.network.as_deref(), Some("net1"));
        assert_eq!(plan.undo.sysctls, plan.backup.sysctls);
        assert_eq!(plan.sysctls.len(), 2);

        let mut same = live();
        same.mtu = 1400;
        same.promisc = true;
        let plan = add(&config(), &who(), Some(&same), &originals, None).unwrap();
        assert_eq!((plan.link.mtu, plan.link.promisc), (None, None));
        assert_eq!(plan.backup.mtu, Some(1400), "the live value is still saved");
    }

    #[test]
    fn a_mac_longer_or_shorter_than_the_devices_is_code_7_before_any_change() {
        for bytes in [
            vec![2, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77],
            vec![0; 20],
        ] {
            let mut c = config();
            c.mac = Some(MacSetting {
                origin: "args.cni.mac",
                text: "02:11:22:33:44:55:66:77".into(),
                bytes,
            });
            let err = add(&c, &who(), Some(&live()), &[None, None], None).unwrap_err();
            assert!(
                err.to_string().starts_with(
                    "invalid args.cni.mac 02:11:22:33:44:55:66:77: eth0 has 6-byte hardware addresses"
                ),
                "{err}"
            );
            assert_eq!(
                cni::error::CniError::from(err).code,
                cni::error::ErrorCode::InvalidConfig
            );
        }
    }

    #[test]
    fn a_repeated_add_keeps_the_first_originals() {
        let first = add(
            &config(),
            &who(),
            Some(&live()),
            &[Some("1".into()), Some("0".into())],
            None,
        )
        .unwrap();
        let mut changed = live();
        changed.mtu = 1400;
        changed.mac = Some(vec![2, 0x11, 0x22, 0x33, 0x44, 0x55]);
        let second = add(
            &config(),
            &who(),
            Some(&changed),
            &[Some("2".into()), Some("1".into())],
            Some(first.backup.clone()),
        )
        .unwrap();
        assert_eq!(second.backup, first.backup);
        assert_eq!(
            second.undo.mtu,
            Some(1400),
            "a rollback returns to the live state"
        );
    }

    #[test]
    fn write_only_sysctls_are_set_but_not_saved() {
        let plan = add(
            &config(),
            &who(),
            Some(&live()),
            &[None, Some("0".into())],
            None,
        )
        .unwrap();
        assert_eq!(plan.backup.sysctls.len(), 1);
        assert_eq!(plan.sysctls.len(), 2);
    }

    #[test]
    fn an_mtu_outside_the_devices_range_is_code_7() {
        let mut link = live();
        link.max_mtu = Some(1300);
        let err = add(&config(), &who(), Some(&link), &[None, None], None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid mtu 1400: eth0 accepts MTUs from 68 to 1300"
        );
        link.max_mtu = Some(0);
        assert!(
            add(&config(), &who(), Some(&link), &[None, None], None).is_ok(),
            "0 is no limit"
        );
    }

    #[test]
    fn restore_undoes_in_the_references_order_and_skips_what_is_already_right() {
        let plan = add(
            &config(),
            &who(),
            Some(&live()),
            &[Some("1".into()), Some("0".into())],
            None,
        )
        .unwrap();
        let mut now = live();
        now.mtu = 1400;
        now.mac = Some(vec![2, 0x11, 0x22, 0x33, 0x44, 0x55]);
        now.promisc = true;
        now.allmulti = true;
        now.txqlen = 500;
        let r = restore(&plan.backup, Some(&now));
        let names: Vec<&str> = r.link.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["mtu", "mac", "promisc", "allmulti", "txqueuelen"]);
        assert_eq!(r.link[1].1.mac, Some(vec![0x42, 0xf7, 0x63, 0x74, 0x5e, 0]));
        assert_eq!(r.link[2].1.promisc, Some(false));
        let keys: Vec<&str> = r.sysctls.iter().map(|(k, _)| k.as_path()).collect();
        assert_eq!(
            keys,
            [
                "net/ipv4/conf/eth0/arp_ignore",
                "net/ipv4/conf/eth0/rp_filter"
            ]
        );
        assert!(r.invalid.is_empty());

        let nothing = restore(&plan.backup, Some(&live()));
        assert!(nothing.link.is_empty());
        let gone = restore(&plan.backup, None);
        assert!(gone.link.is_empty());
        assert_eq!(
            gone.sysctls.len(),
            2,
            "sysctls are restored without the link"
        );
    }

    #[test]
    fn restore_refuses_tampered_values() {
        let backup = Backup {
            mac: Some("not-a-mac".into()),
            sysctls: vec![SavedSysctl {
                key: "kernel/panic".into(),
                value: "0".into(),
            }],
            ..Backup::default()
        };
        let r = restore(&backup, Some(&live()));
        assert!(r.link.is_empty() && r.sysctls.is_empty());
        assert_eq!(r.invalid.len(), 2, "{:?}", r.invalid);
    }

    #[test]
    fn check_compares_sysctls_with_whitespace_runs_equal() {
        let s = sysctl("net.ipv4.ip_local_port_range", "32768 60999");
        assert!(check_sysctl(&s, "32768\t60999").is_ok());
        let err = check_sysctl(&s, "1024\t65535").unwrap_err();
        assert!(
            err.to_string().contains("net.ipv4.ip_local_port_range"),
            "{err}"
        );
        assert!(err.to_string().contains("32768 60999"), "{err}");
        assert_eq!(
            cni::error::CniError::from(err).msg,
            "Error: Tuning configured value of /proc/sys/net/ipv4/ip_local_port_range is 32768 \
             60999, current value is 1024\t65535"
        );
    }

    #[test]
    fn check_compares_macs_as_bytes_and_names_the_first_drift() {
        let mut c = config();
        c.mac = Some(MacSetting {
            origin: "mac",
            text: "02-11-22-33-44-55".into(),
            bytes: vec![2, 0x11, 0x22, 0x33, 0x44, 0x55],
        });
        let mut link = live();
        link.mac = Some(vec![2, 0x11, 0x22, 0x33, 0x44, 0x55]);
        link.mtu = 1400;
        link.promisc = true;
        link.allmulti = true;
        link.txqlen = 500;
        assert!(check_link(&c, "eth0", &link).is_ok());
        type Drift = fn(&mut LinkState);
        // (drift, our text, the reference's message: Debian's Go 1.1.1 CHECK printed these,
        // except allmulti, where it printed a pointer, and txQLen, which it did not have)
        let cases: [(Drift, &str, &str); 5] = [
            (
                |l| l.mac = Some(vec![2, 0, 0, 0, 0, 1]),
                "eth0 mac is 02:00:00:00:00:01",
                "Error: Tuning configured Ethernet of eth0 is 02-11-22-33-44-55, current value \
                 is 02:00:00:00:00:01",
            ),
            (
                |l| l.mtu = 1500,
                "eth0 mtu is 1500, configured 1400",
                "Error: Tuning configured MTU of eth0 is 1400, current value is 1500",
            ),
            (
                |l| l.promisc = false,
                "eth0 promisc is off, configured on",
                "Error: Tuning link eth0 configured promisc is true, current value is 0",
            ),
            (
                |l| l.allmulti = false,
                "eth0 allmulti is off, configured on",
                "Error: Tuning configured all-multicast mode of eth0 is true, current value is \
                 false",
            ),
            (
                |l| l.txqlen = 1000,
                "eth0 txqueuelen is 1000, configured 500",
                "Error: Tuning configured Transmit Queue Length of eth0 is 500, current value \
                 is 1000",
            ),
        ];
        for (drift, ours, reference) in cases {
            let mut l = link.clone();
            drift(&mut l);
            let err = check_link(&c, "eth0", &l).unwrap_err();
            assert!(err.to_string().starts_with(ours), "{err}");
            let cni = cni::error::CniError::from(err);
            assert_eq!(cni.msg, reference);
            assert!(cni.details.starts_with(ours), "{}", cni.details);
        }
        // The reference's order: promisc before the MTU.
        let mut l = link.clone();
        l.mtu = 1500;
        l.promisc = false;
        assert!(
            check_link(&c, "eth0", &l)
                .unwrap_err()
                .to_string()
                .contains("promisc")
        );
        // promisc false is not configured: CHECK does not demand it off (the reference does).
        c.promisc = false;
        let mut l = link.clone();
        l.promisc = true;
        assert!(check_link(&c, "eth0", &l).is_ok());
    }
}
