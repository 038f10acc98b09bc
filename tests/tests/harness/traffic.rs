//! Traffic helpers between two namespaces joined by a veth.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Result;
use tests::traffic::{
    IPERF3_PORT, TcpServer, UdpServer, http_get, iperf3, tcp_connect, tcp_request, udp_request,
    udp_request_from, wait_for_tcp,
};
use tests::{TestNetns, veth_pair};

const TIMEOUT: Duration = Duration::from_secs(3);

/// Two namespaces, `a` (10.97.0.1, fd97::1) and `b` (10.97.0.2, fd97::2).
fn pair() -> Result<(TestNetns, TestNetns)> {
    let a = TestNetns::new("tr-a")?;
    let b = TestNetns::new("tr-b")?;
    veth_pair(
        &a,
        "veth-a",
        &["10.97.0.1/24", "fd97::1/64"],
        &b,
        "veth-b",
        &["10.97.0.2/24", "fd97::2/64"],
    )?;
    Ok((a, b))
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn tcp_banner_and_echo_cross_the_veth_in_both_families() -> Result<()> {
    let (a, b) = pair()?;
    let banner = TcpServer::banner(&b, addr("10.97.0.2:0"), "hello from b")?;
    assert_eq!(
        tcp_request(&a, banner.local_addr(), b"", TIMEOUT)?,
        b"hello from b"
    );
    assert_eq!(banner.peers(), [banner.peers()[0]]);
    assert_eq!(banner.peers()[0].ip().to_string(), "10.97.0.1");

    let _echo = TcpServer::echo(&b, addr("[::]:7007"))?;
    let got = tcp_request(&a, addr("[fd97::2]:7007"), b"ping over v6", TIMEOUT)?;
    assert_eq!(got, b"ping over v6");
    let got = tcp_request(&a, addr("10.97.0.2:7007"), b"ping over v4", TIMEOUT);
    // The v6 wildcard socket also accepts v4 (bindv6only=0).
    assert_eq!(got?, b"ping over v4");
    Ok(())
}

#[test]
fn tcp_to_a_closed_port_fails_quickly_and_wait_for_tcp_is_bounded() -> Result<()> {
    let (a, b) = pair()?;
    let start = Instant::now();
    assert!(tcp_connect(&a, addr("10.97.0.2:9"), TIMEOUT).is_err());
    assert!(
        start.elapsed() < TIMEOUT,
        "refused connection took {:?}",
        start.elapsed()
    );

    let start = Instant::now();
    let err = wait_for_tcp(&a, addr("10.97.0.2:9"), Duration::from_millis(300)).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(format!("{err:#}").contains("10.97.0.2:9"), "{err:#}");

    let _server = TcpServer::echo(&b, addr("10.97.0.2:9"))?;
    wait_for_tcp(&a, addr("10.97.0.2:9"), TIMEOUT)?;
    Ok(())
}

#[test]
fn udp_exchange_and_fixed_source_port() -> Result<()> {
    let (a, b) = pair()?;
    let server = UdpServer::echo(&b, addr("10.97.0.2:5353"))?;
    assert_eq!(
        udp_request(&a, server.local_addr(), b"dgram", TIMEOUT)?,
        b"dgram"
    );
    let got = udp_request_from(
        &a,
        addr("10.97.0.1:40001"),
        server.local_addr(),
        b"again",
        TIMEOUT,
    )?;
    assert_eq!(got, b"again");
    assert_eq!(
        server.peers().last().copied(),
        Some(addr("10.97.0.1:40001"))
    );

    let banner = UdpServer::banner(&b, addr("[fd97::2]:0"), "v6 answer")?;
    assert_eq!(
        udp_request(&a, banner.local_addr(), b"?", TIMEOUT)?,
        b"v6 answer"
    );

    // No server: an error, within the timeout.
    let start = Instant::now();
    assert!(udp_request(&a, addr("10.97.0.2:5454"), b"x", Duration::from_millis(500)).is_err());
    assert!(start.elapsed() < TIMEOUT);
    Ok(())
}

#[test]
fn http_get_reads_status_and_body() -> Result<()> {
    let (a, b) = pair()?;
    let server = TcpServer::http(&b, addr("10.97.0.2:8080"), "it works\n")?;
    let response = http_get(&a, server.local_addr(), "/index.html", TIMEOUT)?;
    assert_eq!(response.status, 200);
    assert_eq!(response.body, "it works\n");
    assert!(
        response
            .headers
            .iter()
            .any(|(k, v)| k == "Content-Length" && v == "9")
    );
    Ok(())
}

#[test]
fn iperf3_measures_a_positive_rate_between_namespaces() -> Result<()> {
    let (a, b) = pair()?;
    let target = SocketAddr::new("10.97.0.2".parse()?, IPERF3_PORT);
    let report = iperf3(&b, target, &a, target, 1, &[])?;
    assert!(report.bits_per_second > 0.0, "{}", report.json);
    Ok(())
}
