//! `common::nft` end to end: a DNAT map rule made over netlink forwards real TCP connections
//! between namespaces, and stops when its element is deleted.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::nft::{
    Batch, Chain, ChainHook, ChainType, DataType as T, Element, Family, L4Proto, NfProto, Nft,
    Rule, Selector::*, Set, Table, Value, priority,
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
    let mut batch = Batch::new();
    batch
        .add_table(&t)
        .add_set(
            &t,
            &Set::map(
                "hostip_ports",
                &[T::Ipv4Addr, T::InetProto, T::InetService],
                &[T::Ipv4Addr, T::InetService],
            ),
        )
        .add_set(
            &t,
            &Set::map(
                "ports",
                &[T::InetProto, T::InetService],
                &[T::Ipv4Addr, T::InetService],
            ),
        )
        .add_chain(&t, &Chain::regular("hostports"))
        .add_chain(
            &t,
            &Chain::base(
                "prerouting",
                ChainType::Nat,
                ChainHook::Prerouting,
                priority::DSTNAT,
            ),
        )
        .add_rule(
            &t,
            "prerouting",
            &Rule::new().fib_daddr_local().jump("hostports"),
        )
        .add_rule(
            &t,
            "hostports",
            &Rule::new().dnat_map(
                NfProto::Ipv4,
                &[IpDaddr, MetaL4proto, ThDport],
                "hostip_ports",
            ),
        )
        .add_rule(
            &t,
            "hostports",
            &Rule::new().dnat_map(NfProto::Ipv4, &[MetaL4proto, ThDport], "ports"),
        )
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
