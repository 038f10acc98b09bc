//! Real traffic between test namespaces: TCP, UDP and HTTP in-process, throughput with `iperf3`.
//!
//! Sockets are opened inside a namespace (with [`TestNetns::run`]) and used from ordinary
//! threads afterwards: a socket stays bound to the namespace it was created in. Every wait is
//! bounded; servers stop when dropped.

use std::io::{ErrorKind, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket,
};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::netns::TestNetns;
use crate::process;

/// Read/write timeout of a server's connection.
const SERVER_IO_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a server checks whether it was asked to stop.
const SERVER_POLL: Duration = Duration::from_millis(10);
/// Largest request a server reads.
const MAX_REQUEST: usize = 1 << 20;

/// What a [`TcpServer`] does with each connection.
#[derive(Debug, Clone)]
pub enum TcpReply {
    /// Writes these bytes, closes its sending side and drains the client's.
    Banner(Vec<u8>),
    /// Writes back everything it reads until the client closes its sending side.
    Echo,
    /// Reads an HTTP request head and answers `200 OK` with this body.
    Http(Vec<u8>),
}

/// Peers seen by a server, shared with its thread.
type Peers = Arc<Mutex<Vec<SocketAddr>>>;

/// The serving thread of a TCP or UDP server, the peers it saw and its stop flag.
#[derive(Debug)]
struct ServerThread {
    local_addr: SocketAddr,
    peers: Peers,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ServerThread {
    /// Runs `serve(peers, stop)` on a thread named `name`; it must return soon after `stop`.
    fn spawn(
        name: String,
        local_addr: SocketAddr,
        serve: impl FnOnce(&Peers, &AtomicBool) + Send + 'static,
    ) -> Result<ServerThread> {
        let peers = Peers::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (peers, stop) = (peers.clone(), stop.clone());
            std::thread::Builder::new()
                .name(name)
                .spawn(move || serve(&peers, &stop))?
        };
        Ok(ServerThread {
            local_addr,
            peers,
            stop,
            thread: Some(thread),
        })
    }

    fn peers(&self) -> Vec<SocketAddr> {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A TCP server listening inside a namespace, serving from a thread of the test; stops on drop.
#[derive(Debug)]
pub struct TcpServer(ServerThread);

impl TcpServer {
    /// Listens on `addr` (port 0 picks one) inside `ns` and serves each connection with `reply`.
    ///
    /// # Errors
    /// When the address cannot be bound in that namespace.
    pub fn start(ns: &TestNetns, addr: SocketAddr, reply: TcpReply) -> Result<TcpServer> {
        let listener = ns
            .run(|| TcpListener::bind(addr))?
            .with_context(|| format!("failed to listen on {addr} in netns {}", ns.name()))?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        ServerThread::spawn(
            format!("tcp-server-{local_addr}"),
            local_addr,
            move |peers, stop| {
                serve_tcp(&listener, &reply, peers, stop);
            },
        )
        .map(TcpServer)
    }

    /// A server that sends `banner` to every client.
    ///
    /// # Errors
    /// As [`TcpServer::start`].
    pub fn banner(ns: &TestNetns, addr: SocketAddr, banner: &str) -> Result<TcpServer> {
        TcpServer::start(ns, addr, TcpReply::Banner(banner.as_bytes().to_vec()))
    }

    /// A server that echoes what every client sends.
    ///
    /// # Errors
    /// As [`TcpServer::start`].
    pub fn echo(ns: &TestNetns, addr: SocketAddr) -> Result<TcpServer> {
        TcpServer::start(ns, addr, TcpReply::Echo)
    }

    /// A server that answers every HTTP request with `200 OK` and `body`.
    ///
    /// # Errors
    /// As [`TcpServer::start`].
    pub fn http(ns: &TestNetns, addr: SocketAddr, body: &str) -> Result<TcpServer> {
        TcpServer::start(ns, addr, TcpReply::Http(body.as_bytes().to_vec()))
    }

    /// The address it listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr
    }

    /// The source addresses of the connections accepted so far (to check SNAT/masquerade).
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.0.peers()
    }
}

fn serve_tcp(listener: &TcpListener, reply: &TcpReply, peers: &Peers, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                peers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(peer);
                let reply = reply.clone();
                // One thread per connection (bounded by the I/O timeouts), so that a client that
                // never sends cannot hold up the next one.
                std::thread::spawn(move || {
                    let _ = handle_tcp(stream, &reply);
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(SERVER_POLL),
            Err(_) => std::thread::sleep(SERVER_POLL),
        }
    }
}

fn handle_tcp(mut stream: TcpStream, reply: &TcpReply) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(SERVER_IO_TIMEOUT))?;
    stream.set_write_timeout(Some(SERVER_IO_TIMEOUT))?;
    match reply {
        TcpReply::Banner(banner) => {
            stream.write_all(banner)?;
            stream.shutdown(Shutdown::Write)?;
            // Drain before closing: unread data at close makes the kernel send a RST, which
            // could reach the client before it has read the banner.
            let _ = std::io::copy(
                &mut (&stream).take(MAX_REQUEST as u64),
                &mut std::io::sink(),
            );
        }
        TcpReply::Echo => {
            let mut buf = [0u8; 16 * 1024];
            loop {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                stream.write_all(&buf[..n])?;
            }
            stream.shutdown(Shutdown::Write)?;
        }
        TcpReply::Http(body) => {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                head.extend_from_slice(&buf[..n]);
            }
            let header = format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(header.as_bytes())?;
            stream.write_all(body)?;
            stream.shutdown(Shutdown::Write)?;
        }
    }
    Ok(())
}

/// Opens a TCP connection to `addr` from inside `ns`, with read and write timeouts of `timeout`.
///
/// # Errors
/// When the connection is refused, unreachable or not established within `timeout`.
pub fn tcp_connect(ns: &TestNetns, addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let stream = ns
        .run(|| TcpStream::connect_timeout(&addr, timeout))?
        .with_context(|| format!("TCP connect from netns {} to {addr}", ns.name()))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

/// Whether a TCP connection from `from` to `to` gets `banner` back within `wait`: the probe of
/// the firewall tests, whose servers ([`TcpServer::banner`]) answer every connection with it.
pub fn answers(from: &TestNetns, to: SocketAddr, banner: &[u8], wait: Duration) -> bool {
    tcp_request(from, to, b"", wait).is_ok_and(|reply| reply == banner)
}

/// Connects from `ns` to `addr`, sends `payload`, closes its sending side and returns all the
/// server sent until it closed (each step bounded by `timeout`).
///
/// # Errors
/// When connecting, sending or receiving fails or times out.
pub fn tcp_request(
    ns: &TestNetns,
    addr: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>> {
    let mut stream = tcp_connect(ns, addr, timeout)?;
    stream
        .write_all(payload)
        .with_context(|| format!("TCP send to {addr}"))?;
    stream.shutdown(Shutdown::Write)?;
    let mut received = Vec::new();
    stream
        .read_to_end(&mut received)
        .with_context(|| format!("TCP receive from {addr}"))?;
    Ok(received)
}

/// Retries connecting from `ns` to `addr` until it succeeds or `timeout` has passed.
///
/// # Errors
/// The last connection error, once `timeout` has passed.
pub fn wait_for_tcp(ns: &TestNetns, addr: SocketAddr, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = tcp_connect(
            ns,
            addr,
            left.clamp(Duration::from_millis(10), Duration::from_secs(1)),
        );
        match attempt {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!("{addr} not reachable within {timeout:?}")));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Waits until something listens on TCP `port` inside `ns`, without connecting to it (which
/// would use up a one-shot server such as `iperf3 -s -1`).
///
/// # Errors
/// When nothing listens within `timeout`.
pub fn wait_for_tcp_listener(ns: &TestNetns, port: u16, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        // /proc/thread-self/net is the reading thread's namespace (/proc/self/net would be the
        // main thread's).
        let tables = ns.run(|| {
            ["tcp", "tcp6"].map(|t| {
                std::fs::read_to_string(format!("/proc/thread-self/net/{t}")).unwrap_or_default()
            })
        })?;
        if tables.iter().any(|t| tcp_table_has_listener(t, port)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "nothing listens on TCP port {port} in netns {} after {timeout:?}",
                ns.name()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// True when a `/proc/net/tcp{,6}` table has a socket in state LISTEN (`0A`) on `port`.
fn tcp_table_has_listener(table: &str, port: u16) -> bool {
    let port_hex = format!(":{port:04X}");
    table.lines().skip(1).any(|line| {
        let mut fields = line.split_whitespace();
        let local = fields.nth(1).unwrap_or_default();
        let state = fields.nth(1).unwrap_or_default();
        local.ends_with(&port_hex) && state == "0A"
    })
}

/// What a [`UdpServer`] answers to each datagram.
#[derive(Debug, Clone)]
pub enum UdpReply {
    /// Sends these bytes back.
    Banner(Vec<u8>),
    /// Sends the datagram back.
    Echo,
}

/// A UDP server bound inside a namespace, answering from a thread of the test; stops on drop.
#[derive(Debug)]
pub struct UdpServer(ServerThread);

impl UdpServer {
    /// Binds `addr` (port 0 picks one) inside `ns` and answers every datagram with `reply`.
    ///
    /// # Errors
    /// When the address cannot be bound in that namespace.
    pub fn start(ns: &TestNetns, addr: SocketAddr, reply: UdpReply) -> Result<UdpServer> {
        let socket = ns
            .run(|| UdpSocket::bind(addr))?
            .with_context(|| format!("failed to bind UDP {addr} in netns {}", ns.name()))?;
        socket.set_read_timeout(Some(SERVER_POLL))?;
        let local_addr = socket.local_addr()?;
        ServerThread::spawn(
            format!("udp-server-{local_addr}"),
            local_addr,
            move |peers, stop| {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                        continue;
                    };
                    peers
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(peer);
                    let answer = match &reply {
                        UdpReply::Banner(b) => b.as_slice(),
                        UdpReply::Echo => &buf[..n],
                    };
                    let _ = socket.send_to(answer, peer);
                }
            },
        )
        .map(UdpServer)
    }

    /// A server that echoes every datagram.
    ///
    /// # Errors
    /// As [`UdpServer::start`].
    pub fn echo(ns: &TestNetns, addr: SocketAddr) -> Result<UdpServer> {
        UdpServer::start(ns, addr, UdpReply::Echo)
    }

    /// A server that answers every datagram with `banner`.
    ///
    /// # Errors
    /// As [`UdpServer::start`].
    pub fn banner(ns: &TestNetns, addr: SocketAddr, banner: &str) -> Result<UdpServer> {
        UdpServer::start(ns, addr, UdpReply::Banner(banner.as_bytes().to_vec()))
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr
    }

    /// The source addresses of the datagrams received so far.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.0.peers()
    }
}

/// Sends one datagram from `ns` (from an ephemeral port) to `addr` and returns the answer.
///
/// # Errors
/// When no answer arrives within `timeout` or the destination is unreachable.
pub fn udp_request(
    ns: &TestNetns,
    addr: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>> {
    let any: IpAddr = match addr {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    udp_request_from(ns, SocketAddr::new(any, 0), addr, payload, timeout)
}

/// As [`udp_request`] from the local address `local` (a fixed source port keeps the same
/// conntrack entry across calls).
///
/// # Errors
/// When `local` cannot be bound, or no answer arrives within `timeout`.
pub fn udp_request_from(
    ns: &TestNetns,
    local: SocketAddr,
    addr: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>> {
    let socket = ns
        .run(|| {
            let s = UdpSocket::bind(local)?;
            // Connected, so an ICMP unreachable comes back as an error rather than a timeout.
            s.connect(addr)?;
            Ok::<_, std::io::Error>(s)
        })?
        .with_context(|| format!("UDP socket {local} -> {addr} in netns {}", ns.name()))?;
    socket.set_read_timeout(Some(timeout))?;
    socket
        .send(payload)
        .with_context(|| format!("UDP send to {addr}"))?;
    let mut buf = vec![0u8; 65536];
    let n = socket.recv(&mut buf).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            anyhow!("no UDP answer from {addr} within {timeout:?}")
        }
        _ => anyhow::Error::new(e).context(format!("UDP receive from {addr}")),
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// An HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The headers, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

/// Sends `GET path` over HTTP/1.0 from `ns` to `addr` and reads the whole response.
///
/// # Errors
/// When the exchange fails or times out, or the response is not HTTP.
pub fn http_get(
    ns: &TestNetns,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<HttpResponse> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let raw = tcp_request(ns, addr, request.as_bytes(), timeout)?;
    parse_http_response(&raw)
}

fn parse_http_response(raw: &[u8]) -> Result<HttpResponse> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("not an HTTP response: {text:?}"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad HTTP status line {status_line:?}"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Ok(HttpResponse {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// Default `iperf3` port.
pub const IPERF3_PORT: u16 = 5201;

/// A one-shot `iperf3 -s -1` inside a namespace; killed on drop if still running.
#[derive(Debug)]
pub struct Iperf3Server {
    child: Child,
    addr: SocketAddr,
}

impl Iperf3Server {
    /// Starts `iperf3 -s -1 -B <addr.ip> -p <addr.port>` inside `ns` and waits until it listens.
    ///
    /// # Errors
    /// When `iperf3` cannot start or does not listen within a few seconds.
    pub fn start(ns: &TestNetns, addr: SocketAddr) -> Result<Iperf3Server> {
        let mut cmd = Command::new("iperf3");
        cmd.args([
            "-s",
            "-1",
            "-B",
            &addr.ip().to_string(),
            "-p",
            &addr.port().to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let child = ns.spawn(&mut cmd).context("is iperf3 installed?")?;
        let mut server = Iperf3Server { child, addr };
        if let Err(e) = wait_for_tcp_listener(ns, addr.port(), Duration::from_secs(5)) {
            let status = process::kill_and_reap(&mut server.child);
            return Err(e.context(format!("iperf3 server exited with {status:?}")));
        }
        Ok(server)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        process::kill_and_reap(&mut self.child);
    }
}

/// The outcome of an `iperf3` client run.
#[derive(Debug, Clone)]
pub struct Iperf3Report {
    /// Throughput measured at the receiver (`end.sum_received`, or `end.sum` for UDP).
    pub bits_per_second: f64,
    /// The full `-J` report.
    pub json: Value,
}

/// Runs `iperf3 -c <server> -t <secs> -J <extra_args>` inside `ns` (e.g. `-R` to send from
/// the server, `-u -b 10M` for UDP), killed if it runs 10 s past its duration.
///
/// # Errors
/// When `iperf3` fails, reports an error or times out.
pub fn iperf3_client(
    ns: &TestNetns,
    server: SocketAddr,
    secs: u32,
    extra_args: &[&str],
) -> Result<Iperf3Report> {
    let mut cmd = Command::new("iperf3");
    cmd.args([
        "-c",
        &server.ip().to_string(),
        "-p",
        &server.port().to_string(),
        "-t",
        &secs.to_string(),
        "-J",
        "--connect-timeout",
        "3000",
    ])
    .args(extra_args);
    let timeout = Duration::from_secs(u64::from(secs) + 10);
    let out = ns.output(&mut cmd, b"", timeout)?;
    let json: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "iperf3 client ({}) printed no JSON: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(err) = json["error"].as_str() {
        bail!("iperf3 client failed: {err}");
    }
    if !out.status.success() {
        bail!("iperf3 client exited with {}", out.status);
    }
    let end = &json["end"];
    let bits_per_second = end["sum_received"]["bits_per_second"]
        .as_f64()
        .or_else(|| end["sum"]["bits_per_second"].as_f64())
        .context("iperf3 report has no end.sum_received.bits_per_second")?;
    Ok(Iperf3Report {
        bits_per_second,
        json,
    })
}

/// Starts an `iperf3` server on `server_addr` in `server_ns`, runs a client for `secs` seconds
/// from `client_ns` to `client_target` (the server's address, or a DNAT'd one) and returns the
/// client's report.
///
/// # Errors
/// As [`Iperf3Server::start`] and [`iperf3_client`].
pub fn iperf3(
    server_ns: &TestNetns,
    server_addr: SocketAddr,
    client_ns: &TestNetns,
    client_target: SocketAddr,
    secs: u32,
    extra_args: &[&str],
) -> Result<Iperf3Report> {
    let _server = Iperf3Server::start(server_ns, server_addr)?;
    iperf3_client(client_ns, client_target, secs, extra_args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_are_found_in_proc_net_tcp_tables() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:9C40 0100007F:1451 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
";
        assert!(tcp_table_has_listener(table, 5201));
        // 0x9C40 = 40000 is an established socket, not a listener.
        assert!(!tcp_table_has_listener(table, 40000));
        assert!(!tcp_table_has_listener(table, 80));
    }

    #[test]
    fn http_responses_are_split_into_status_headers_and_body() {
        let r =
            parse_http_response(b"HTTP/1.0 404 Not Found\r\nContent-Length: 2\r\n\r\nno").unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.headers, vec![("Content-Length".into(), "2".into())]);
        assert_eq!(r.body, "no");
        assert!(parse_http_response(b"garbage").is_err());
    }
}
