//! The reference portmap's iptables layout in `iptables-save`'s words, for the tests and the
//! bench of `netfilter::iptables::native`: the shared chains and their rules (snat, mark bit 13),
//! as portmap's iptables backend computes them (the one fixture, `netfilter::iptables::fixtures`); every form the codec writes, and the check
//! that a release's tools read ours as their own ([`forms_read_alike`]).

use std::process::Output;
use std::time::Duration;

use anyhow::{Result, ensure};
use netfilter::iptables::Family;

use crate::netns::TestNetns;

pub use netfilter::iptables::fixtures::{DNAT, MASQ, SETMARK, SHARED_CHAINS, skeleton, words};

/// Every form of portmap's layout and of the conditions the codec takes, for `family`, in
/// the words a caller may give them (not necessarily `iptables-save`'s).
#[must_use]
pub fn nat_forms(family: Family) -> Vec<String> {
    let ports: Vec<String> = (1..=15).map(|p| (8000 + p).to_string()).collect();
    let ports = ports.join(",");
    let (cidr, host, other, wide, to, to_bare) = match family {
        Family::V4 => (
            "10.0.0.2/24",
            "10.1.1.1",
            "192.168.0.0/16",
            "10.9.1.2/20",
            "10.0.0.2:80",
            "10.0.0.3",
        ),
        Family::V6 => (
            "fd00::2/64",
            "fd01::1",
            "fd02::/48",
            "fd09::1/60",
            "[fd00::2]:80",
            "fd00::3",
        ),
    };
    let mut forms = vec![
        format!(
            r#"-m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000"#
        ),
        "-m mark --mark 0x2000/0x2000 -j MASQUERADE".to_owned(),
        format!(r#"-m comment --comment "CNI portfwd requiring masquerade" -j {MASQ}"#),
        format!("-m addrtype --dst-type LOCAL -j {DNAT}"),
        format!("-s {cidr} -p tcp -m tcp --dport 8080 -j {SETMARK}"),
        format!("-s {host} -d {host}/32 -p udp -m udp --dport 53 -j {SETMARK}"),
        format!("-p tcp -m tcp --dport 8080 -j DNAT --to-destination {to}"),
        format!("-d {host} -p sctp -m sctp --dport 9 -j DNAT --to-destination {to}"),
        format!("-j DNAT --to-destination {to_bare}"),
        format!(
            r#"-p tcp -m comment --comment "dnat name: \"net\" id: \"c1\"" -m multiport --dports {ports} -j CNI-DN-0123456789abcdef01234"#
        ),
        format!(
            "-m comment --comment x -m multiport -p udp --destination-ports 53,5353 ! -s {wide} \
             -d {other} -i eth0 ! -o br+ -m mark ! --mark 1 -m mark --mark 0x10/0x30 \
             -m addrtype ! --src-type LOCAL -j CNI-DN-0123456789abcdef01234"
        ),
        format!("-m conntrack ! --ctstate NEW,INVALID -g {MASQ}"),
        "-p udp -m udp ! --dport 1 -m addrtype --src-type UNICAST --dst-type LOCAL -j RETURN"
            .to_owned(),
        "-p tcp --dport 443 -m mark --mark 0x1 -j ACCEPT".to_owned(),
        "! -p udp -j RETURN".to_owned(),
        "-p tcp --dport 8080 -m multiport --dports 80,443 -j RETURN".to_owned(),
    ];
    if family == Family::V4 {
        forms.push(format!(
            "-s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j {SETMARK}"
        ));
    }
    forms
}

/// Runs a tool of the iptables under test (`iptables-restore`, `ip6tables-save`, …) with
/// `args` and `stdin` in a namespace: this machine's, or another userland's.
pub type Tools<'a> = dyn Fn(&TestNetns, &str, &[&str], &[u8]) -> Result<Output> + 'a;

/// This machine's tools.
///
/// # Errors
/// When the tool cannot be run.
pub fn host_tools(ns: &TestNetns, program: &str, args: &[&str], stdin: &[u8]) -> Result<Output> {
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    crate::process::run_in(&ns.netns()?, &mut cmd, stdin, Duration::from_secs(30))
}

fn ok(out: Output, what: &str) -> Result<String> {
    ensure!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every form of [`nat_forms`], both families, written in an empty `nat` table of `ns` by
/// `tools`' `iptables-restore` and by our encoder (`netfilter::iptables::native::encode`), and
/// read: `tools`' `iptables-save` prints each of ours as the line it prints for its own
/// (`iptables-save`'s canonical form of the words, `canonical`), its `iptables -C` finds each
/// of ours, and our decoder reads each of its rules as that line. With `same_expressions`
/// (the release whose encoding we write), each of ours is its rule expression for
/// expression.
///
/// # Errors
/// The first form that is not read alike, naming it.
pub fn forms_read_alike(ns: &TestNetns, tools: &Tools<'_>, same_expressions: bool) -> Result<()> {
    use netfilter::iptables::native::{canonical, decode, encode, nft_table};
    use netfilter::iptables::{TableDump, restore_line};
    for family in Family::BOTH {
        let tool = family.to_string();
        let forms: Vec<Vec<String>> = nat_forms(family).iter().map(|f| words(f)).collect();
        let mut script = String::from("*nat\n");
        for chain in ["T", SETMARK, MASQ, DNAT, "CNI-DN-0123456789abcdef01234"] {
            script.push_str(&restore_line::<&str>("-N", chain, &[])?);
            script.push('\n');
        }
        for form in &forms {
            script.push_str(&restore_line("-A", "T", form)?);
            script.push('\n');
        }
        script.push_str("COMMIT\n");
        let restore = format!("{tool}-restore");
        ok(
            tools(ns, &restore, &["--noflush"], script.as_bytes())?,
            &restore,
        )?;
        let table = nft_table(family, "nat");
        let listed = ns.run(|| -> Result<Vec<netfilter::nft::ListedRule>> {
            let mut batch = netfilter::nft::Batch::new();
            for form in &forms {
                let rule = encode(family, form).map_err(|e| anyhow::anyhow!("{e}"))?;
                batch.add_rule(&table, "T", &rule);
            }
            let mut nft = netfilter::nft::Nft::new()?;
            nft.apply(&batch)?;
            Ok(nft.rules(&table, "T")?)
        })??;
        ensure!(
            listed.len() == 2 * forms.len(),
            "{family}: {} rules",
            listed.len()
        );
        let (theirs, ours) = listed.split_at(forms.len());
        let save = format!("{tool}-save");
        let saved = ok(tools(ns, &save, &["-t", "nat"], b"")?, &save)?;
        let dump = TableDump::parse(&saved).map_err(|line| anyhow::anyhow!("{save}: {line}"))?;
        let rules = dump.rules("T");
        for (i, form) in forms.iter().enumerate() {
            let want = canonical(family, form).map_err(|e| anyhow::anyhow!("{e}"))?;
            let line = form.join(" ");
            ensure!(
                rules[i] == want,
                "{family}: the tool's line for {line:?} is {:?}",
                rules[i].join(" ")
            );
            ensure!(
                rules[forms.len() + i] == want,
                "{family}: the tool reads ours for {line:?} as {:?}",
                rules[forms.len() + i].join(" ")
            );
            ensure!(
                decode(family, &theirs[i].exprs).as_ref() == Some(&want),
                "{family}: we read the tool's {line:?} as {:?}",
                decode(family, &theirs[i].exprs)
            );
            if same_expressions {
                ensure!(
                    theirs[i].exprs == ours[i].exprs,
                    "{family}: {line:?}: the tool's {:?}, ours {:?}",
                    theirs[i].exprs,
                    ours[i].exprs
                );
            }
            let mut check = vec!["-t", "nat", "-C", "T"];
            check.extend(form.iter().map(String::as_str));
            // The tool's -C finds the first of equal rules: take its own away first.
            let mut delete = check.clone();
            delete[2] = "-D";
            ok(
                tools(ns, &tool, &delete, b"")?,
                &format!("{tool} -D {line}"),
            )?;
            ok(
                tools(ns, &tool, &check, b"")?,
                &format!("{tool} -C finds no rule of ours for {line}"),
            )?;
        }
    }
    Ok(())
}
