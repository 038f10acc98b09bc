//! Namespace fixtures: creation, isolation, commands inside, and removal on drop, delete and
//! panic.

use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Result;
use host::netns::NetNs;
use tests::netns::{CLIENT_V4, HOST_UPLINK_IF, HOST_UPLINK_V4, NETNS_RUN_DIR};
use tests::{TestNetns, Topology, veth_pair};

#[test]
fn namespaces_are_named_under_run_netns_and_distinct_from_the_caller() -> Result<()> {
    let host = TestNetns::new("fx-host")?;
    let ctr = TestNetns::new("fx-ctr")?;
    for ns in [&host, &ctr] {
        assert!(ns.path().starts_with(NETNS_RUN_DIR), "{:?}", ns.path());
        assert!(ns.path().exists());
        assert_eq!(ns.path().file_name().unwrap(), ns.name());
        assert!(ns.name().contains(&std::process::id().to_string()));
        assert!(!ns.netns()?.is_same(&NetNs::current()?));
    }
    assert_ne!(host.name(), ctr.name());
    assert!(!host.netns()?.is_same(&ctr.netns()?));
    let listed = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()?;
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains(host.name()), "{listed}");
    Ok(())
}

#[test]
fn a_new_namespace_has_only_loopback_and_it_is_up() -> Result<()> {
    let ns = TestNetns::new("fx-lo")?;
    assert_eq!(ns.link_names()?, vec!["lo".to_owned()]);
    let lo = ns.ip_json(&["link", "show", "lo"])?;
    let flags = lo[0]["flags"].as_array().unwrap();
    assert!(flags.iter().any(|f| f == "UP"), "{lo}");
    Ok(())
}

#[test]
fn drop_removes_the_namespace() -> Result<()> {
    let ns = TestNetns::new("fx-drop")?;
    let path = ns.path().to_owned();
    assert!(path.exists());
    drop(ns);
    assert!(!path.exists(), "{path:?} left behind");
    Ok(())
}

#[test]
fn a_panic_inside_a_test_still_removes_its_namespaces() {
    let seen: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let caught = std::panic::catch_unwind(|| {
        let ns = TestNetns::new("fx-panic").unwrap();
        seen.lock().unwrap().push(ns.path().to_owned());
        // A panic inside a closure run in the namespace propagates to the test's thread.
        ns.run(|| panic!("boom inside the namespace")).unwrap();
    });
    assert!(caught.is_err());
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 1);
    assert!(!seen[0].exists(), "{:?} left behind after a panic", seen[0]);
}

#[test]
fn delete_removes_the_namespace_early_and_later_calls_fail() -> Result<()> {
    let mut ns = TestNetns::new("fx-del")?;
    let path = ns.path().to_owned();
    ns.delete()?;
    assert!(!path.exists());
    assert!(NetNs::open(&path).unwrap_err().is_not_found());
    assert!(ns.netns().is_err());
    assert!(ns.exec("true", &[] as &[&str]).is_err());
    ns.delete()?;
    Ok(())
}

#[test]
fn commands_run_inside_the_namespace() -> Result<()> {
    let ns = TestNetns::new("fx-exec")?;
    let link = ns.exec_ok("readlink", &["/proc/self/ns/net"])?;
    let inside = ns.run(|| std::fs::read_link("/proc/thread-self/ns/net"))??;
    assert_eq!(link.trim(), inside.to_string_lossy());
    let here = std::fs::read_link("/proc/thread-self/ns/net")?;
    assert_ne!(link.trim(), here.to_string_lossy());
    // A failing command is reported with its stderr.
    let err = ns
        .ip(&["link", "show", "nosuchlink0"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("nosuchlink0"), "{err}");
    Ok(())
}

#[test]
fn sysctls_are_read_and_written_in_the_namespace() -> Result<()> {
    let ns = TestNetns::new("fx-sysctl")?;
    assert_eq!(ns.sysctl("net.ipv4.ip_forward")?, "0");
    ns.set_sysctl("net.ipv4.ip_forward", "1")?;
    assert_eq!(ns.sysctl("net/ipv4/ip_forward")?, "1");
    // A second namespace keeps its own value.
    assert_eq!(
        TestNetns::new("fx-sysctl2")?.sysctl("net.ipv4.ip_forward")?,
        "0"
    );
    Ok(())
}

#[test]
fn veth_pairs_join_two_namespaces() -> Result<()> {
    let a = TestNetns::new("fx-va")?;
    let b = TestNetns::new("fx-vb")?;
    veth_pair(&a, "va0", &["10.97.1.1/24"], &b, "vb0", &["10.97.1.2/24"])?;
    assert!(a.has_link("va0")? && !a.has_link("vb0")?);
    assert!(b.has_link("vb0")? && !b.has_link("va0")?);
    let addrs = b.ip_json(&["addr", "show", "vb0"])?;
    assert_eq!(addrs[0]["addr_info"][0]["local"], "10.97.1.2", "{addrs}");
    Ok(())
}

#[test]
fn topology_links_client_to_host_and_enables_forwarding() -> Result<()> {
    let topo = Topology::new("fx-topo")?;
    assert!(topo.host.has_link(HOST_UPLINK_IF)?);
    assert_eq!(topo.host.sysctl("net.ipv4.ip_forward")?, "1");
    assert_eq!(topo.host.sysctl("net.ipv6.conf.all.forwarding")?, "1");
    assert_eq!(topo.container.link_names()?, vec!["lo".to_owned()]);
    let server = tests::traffic::TcpServer::banner(
        &topo.host,
        format!("{HOST_UPLINK_V4}:0").parse()?,
        "host",
    )?;
    let got = tests::traffic::tcp_request(
        &topo.client,
        server.local_addr(),
        b"",
        std::time::Duration::from_secs(3),
    )?;
    assert_eq!(got, b"host");
    assert_eq!(server.peers()[0].ip().to_string(), CLIENT_V4);
    Ok(())
}
