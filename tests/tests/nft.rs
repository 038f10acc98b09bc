//! `netfilter::nft` end to end: a DNAT map rule made over netlink forwards real TCP connections
//! between namespaces, and stops when its element is deleted; transactions far larger than a
//! netlink attribute and than a socket's default send buffer apply whole, or not at all.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use netfilter::nft::{
    Batch, DataType as T, Element, Family, L4Proto, Nft, NftError, Set, Table, Value,
};
use tests::netns::{HOST_UPLINK_V4, Topology, veth_pair};
use tests::traffic::{TcpServer, tcp_request};

const TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn a_dnat_map_rule_forwards_tcp_to_the_mapped_container_until_its_element_is_deleted() {
    let v4 = |s: &str| s.parse::<Ipv4Addr>().unwrap();
    let topo = Topology::new("nftdnat").unwrap();
    veth_pair(
        &topo.host,
        "vh0",
        &["10.77.0.1/24"],
        &topo.container,
        "eth0",
        &["10.77.0.2/24"],
    )
    .unwrap();
    topo.container
        .ip(&["route", "add", "default", "via", "10.77.0.1"])
        .unwrap();
    let ctr: SocketAddr = "10.77.0.2:80".parse().unwrap();
    let server = TcpServer::banner(&topo.container, ctr, "hello from the container").unwrap();

    let t = Table::new(Family::Ip, "cni_nft_test");
    let by_port = Element::new([L4Proto::Tcp.into(), Value::Port(8080)])
        .to([v4("10.77.0.2").into(), Value::Port(80)])
        .comment("net/ctr/eth0");
    let host_ip: IpAddr = HOST_UPLINK_V4.parse().unwrap();
    let by_host_ip = Element::new([host_ip.into(), L4Proto::Tcp.into(), Value::Port(9090)])
        .to([v4("10.77.0.2").into(), Value::Port(80)])
        .comment("net/ctr/eth0");
    let mut batch = netfilter::nft::fixtures::hostport_table(&t);
    batch
        .add_elements(&t, "ports", std::slice::from_ref(&by_port))
        .add_elements(&t, "hostip_ports", std::slice::from_ref(&by_host_ip));
    let mut nft = Nft::open_in(&topo.host.netns().unwrap()).unwrap();
    nft.apply(&batch).unwrap();

    for port in [8080, 9090] {
        let to = SocketAddr::new(host_ip, port);
        let got = tcp_request(&topo.client, to, b"", TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to {to}: {e:#}"));
        assert_eq!(got, b"hello from the container", "via port {port}");
    }
    // DNAT only: the container saw the client's own address.
    let peers = server.peers();
    assert_eq!(peers.len(), 2);
    assert!(
        peers
            .iter()
            .all(|p| p.ip() == "10.98.0.2".parse::<IpAddr>().unwrap())
    );
    assert_eq!(
        nft.elements(&t, "ports").unwrap(),
        std::slice::from_ref(&by_port)
    );

    // Without its element the port maps nowhere: the host itself refuses the connection.
    let mut del = Batch::new();
    del.delete_elements(&t, "ports", std::slice::from_ref(&by_port.key));
    nft.apply(&del).unwrap();
    let to = SocketAddr::new(host_ip, 8080);
    assert!(tcp_request(&topo.client, to, b"", TIMEOUT).is_err());
    assert_eq!(server.peers().len(), 2);
    // The other mapping still works.
    let got = tcp_request(&topo.client, SocketAddr::new(host_ip, 9090), b"", TIMEOUT).unwrap();
    assert_eq!(got, b"hello from the container");
}

/// The map of [`ten_thousand_mappings_go_in_one_transaction_and_a_listing_deletes_them_in_one`].
fn ports_map(t: &Table) -> Batch {
    let mut b = Batch::new();
    b.add_table(t).add_set(
        t,
        &Set::map(
            "ports",
            &[T::InetProto, T::InetService],
            &[T::Ipv4Addr, T::InetService],
        ),
    );
    b
}

/// A mapping of host port `port` with a portmap-sized owner comment.
fn mapping(port: u16, owner: &str) -> Element {
    Element::new([L4Proto::Tcp.into(), Value::Port(port)])
        .to([Ipv4Addr::new(10, 77, 0, 2).into(), Value::Port(80)])
        .comment(&format!("{owner}/{:064x}/eth0", u64::from(port)))
}

/// The number of elements of map `ports` as `nft -j` lists it.
fn nft_count(t: &Table) -> anyhow::Result<usize> {
    let out = std::process::Command::new("nft")
        .args(["-j", "list", "map", t.family.name(), &t.name, "ports"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "nft: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let map = json["nftables"]
        .as_array()
        .and_then(|objects| objects.iter().find_map(|o| o.get("map")))
        .ok_or_else(|| anyhow::anyhow!("no map in {json}"))?;
    Ok(map
        .get("elem")
        .and_then(serde_json::Value::as_array)
        .map_or(0, Vec::len))
}

#[test]
fn ten_thousand_mappings_go_in_one_transaction_and_a_listing_deletes_them_in_one() {
    const N: u16 = 12_000;
    host::netns::in_new_netns(|| {
        let t = Table::new(Family::Ip, "cni_nft_big");
        let mut nft = Nft::new().unwrap();
        nft.apply(&ports_map(&t)).unwrap();

        // About 2 MB in one transaction: ten times the default send buffer, and element lists
        // far longer than a netlink attribute holds.
        let elements: Vec<Element> = (1..=N).map(|p| mapping(p, "gc")).collect();
        let mut add = Batch::new();
        add.add_elements(&t, "ports", &elements);
        nft.apply(&add).unwrap();
        assert_eq!(nft_count(&t).unwrap(), usize::from(N));
        let mut listed = nft.elements(&t, "ports").unwrap();
        listed.sort_by_key(|e| match e.key[1] {
            Value::Port(p) => p,
            _ => 0,
        });
        assert_eq!(listed, elements);
        assert_eq!(
            nft.element(&t, "ports", &elements[4321].key)
                .unwrap()
                .as_ref(),
            Some(&elements[4321])
        );

        // Still one transaction: a refusal at its last element leaves none of the others (a
        // new table and its thousands of elements, sent in many messages).
        let fresh = Table::new(Family::Ip, "cni_nft_big2");
        let mut all_or_nothing = ports_map(&fresh);
        all_or_nothing
            .add_elements(&fresh, "ports", &elements)
            .add_elements(
                &t,
                "ports",
                &[mapping(1, "gc").to([Ipv4Addr::new(10, 77, 0, 3).into(), Value::Port(80)])],
            );
        let err = nft.apply(&all_or_nothing).unwrap_err();
        assert!(
            matches!(err, NftError::Rejected { index: Some(3), .. }),
            "{err:?}"
        );
        assert!(!nft.table_exists(&fresh).unwrap());
        assert_eq!(nft.elements(&t, "ports").unwrap().len(), usize::from(N));

        // What GC and a DEL without state do: list, pick by owner, delete in one batch (some
        // 250 KB of keys: more than an attribute and more than the default send buffer).
        let doomed: Vec<Vec<Value>> = nft
            .elements(&t, "ports")
            .unwrap()
            .into_iter()
            .filter(|e| e.comment.as_deref().is_some_and(|c| c.starts_with("gc/")))
            .map(|e| e.key)
            .collect();
        assert_eq!(doomed.len(), usize::from(N));
        let mut del = Batch::new();
        del.delete_elements(&t, "ports", &doomed);
        nft.apply(&del).unwrap();
        assert!(nft.elements(&t, "ports").unwrap().is_empty());
        assert_eq!(nft_count(&t).unwrap(), 0);
    })
    .unwrap();
}
