//! A synchronous netlink request loop, generic over the protocol's message type.
//!
//! One request at a time: send it with a fresh sequence number, then read replies until the
//! kernel acknowledges it (plain requests, sent with `NLM_F_ACK`) or ends the dump
//! (`NLMSG_DONE`). A NACK becomes an [`std::io::Error`] carrying the errno. The socket belongs
//! to the network namespace of the thread that created it, for its whole life.

use std::io;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable,
};
use netlink_sys::{Socket, SocketAddr};

mod batch;
pub use batch::{BatchFailure, BatchReplies};

/// Receive buffer size: large enough for any single datagram a dump sends.
const RECV_BUF: usize = 64 * 1024;
/// Receive buffer of [`NetlinkSocket::dump_until`]. The kernel sizes each datagram of a dump
/// after the largest read so far (up to 32 KiB) and builds the next one as soon as a read
/// takes the last: reading 8 KiB at a time (libmnl's size, which `nft` and `iptables-nft`
/// read with) keeps what is built past the wanted reply to a few kilobytes.
const DUMP_UNTIL_BUF: usize = 8 * 1024;

/// A netlink socket of one protocol (`NETLINK_ROUTE`, `NETLINK_NETFILTER`, …).
#[derive(Debug)]
pub struct NetlinkSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl std::os::fd::AsFd for NetlinkSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl NetlinkSocket {
    /// Opens and binds a socket of `protocol` in the calling thread's network namespace.
    ///
    /// # Errors
    /// The `socket`/`bind` errno.
    pub fn open(protocol: isize) -> io::Result<NetlinkSocket> {
        let mut socket = Socket::new(protocol)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // Extended ACKs make the kernel explain EINVAL-style failures; best effort.
        let _ = socket.set_ext_ack(true);
        Ok(NetlinkSocket {
            socket,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF),
        })
    }

    /// Sends `payload` as a request (adding `NLM_F_REQUEST | NLM_F_ACK`) and waits for the ACK,
    /// returning any messages the kernel sent before it.
    ///
    /// # Errors
    /// The kernel's errno for a NACK, or an I/O error.
    pub fn request<I>(&mut self, payload: I, flags: u16) -> io::Result<Vec<I>>
    where
        I: NetlinkSerializable + NetlinkDeserializable,
    {
        self.exchange(payload, NLM_F_REQUEST | NLM_F_ACK | flags)
    }

    /// [`NetlinkSocket::request`] with the replies decoded as `O` rather than as the request's
    /// type (see [`NetlinkSocket::dump_as`]).
    ///
    /// # Errors
    /// The kernel's errno for a NACK, or an I/O error.
    pub fn request_as<I, O>(&mut self, payload: I, flags: u16) -> io::Result<Vec<O>>
    where
        I: NetlinkSerializable,
        O: NetlinkDeserializable,
    {
        self.exchange(payload, NLM_F_REQUEST | NLM_F_ACK | flags)
    }

    /// Sends `payload` as a dump request and returns every message of the dump.
    ///
    /// # Errors
    /// The kernel's errno for a NACK, or an I/O error.
    pub fn dump<I>(&mut self, payload: I) -> io::Result<Vec<I>>
    where
        I: NetlinkSerializable + NetlinkDeserializable,
    {
        self.exchange(payload, NLM_F_REQUEST | NLM_F_DUMP)
    }

    /// [`NetlinkSocket::dump`] with the replies decoded as `O` rather than as the request's
    /// type: for a caller with a leaner decoder of the replies it reads in bulk.
    ///
    /// # Errors
    /// The kernel's errno for a NACK, or an I/O error.
    pub fn dump_as<I, O>(&mut self, payload: I) -> io::Result<Vec<O>>
    where
        I: NetlinkSerializable,
        O: NetlinkDeserializable,
    {
        self.exchange(payload, NLM_F_REQUEST | NLM_F_DUMP)
    }

    /// [`NetlinkSocket::dump_as`] that stops reading at the first reply for which `stop` is
    /// true (returned last), so that the kernel does not even build the rest of a long dump:
    /// it fills one datagram per read. Consumes the socket, as the rest of the dump would
    /// still be queued on it.
    ///
    /// # Errors
    /// As [`NetlinkSocket::dump_as`].
    pub fn dump_until<I, O>(
        mut self,
        payload: I,
        stop: impl FnMut(&O) -> bool,
    ) -> io::Result<Vec<O>>
    where
        I: NetlinkSerializable,
        O: NetlinkDeserializable,
    {
        self.buf = Vec::with_capacity(DUMP_UNTIL_BUF);
        self.exchange_until(payload, NLM_F_REQUEST | NLM_F_DUMP, stop)
    }

    fn exchange<I, O>(&mut self, payload: I, flags: u16) -> io::Result<Vec<O>>
    where
        I: NetlinkSerializable,
        O: NetlinkDeserializable,
    {
        self.exchange_until(payload, flags, |_| false)
    }

    fn exchange_until<I, O>(
        &mut self,
        payload: I,
        flags: u16,
        mut stop: impl FnMut(&O) -> bool,
    ) -> io::Result<Vec<O>>
    where
        I: NetlinkSerializable,
        O: NetlinkDeserializable,
    {
        self.seq = self.seq.wrapping_add(1).max(1);
        let seq = self.seq;
        self.socket.send(&serialize(payload, flags, seq), 0)?;

        let want_ack = flags & NLM_F_ACK != 0;
        let mut replies = Vec::new();
        loop {
            self.buf.clear();
            let n = self.socket.recv(&mut self.buf, libc::MSG_TRUNC)?;
            if n > self.buf.len() {
                return Err(io::Error::other(format!(
                    "netlink reply of {n} bytes truncated to {}",
                    self.buf.len()
                )));
            }
            let mut offset = 0;
            while offset < self.buf.len() {
                let reply = NetlinkMessage::<O>::deserialize(&self.buf[offset..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = reply.header.length as usize;
                if len == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "netlink message of length 0",
                    ));
                }
                // Netlink messages are 4-byte aligned inside a datagram.
                offset += (len + 3) & !3;
                if reply.header.sequence_number != seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::Error(err) if err.code.is_some() => return Err(err.to_io()),
                    NetlinkPayload::Error(_) if want_ack => return Ok(replies),
                    NetlinkPayload::Done(done) if done.code != 0 => {
                        return Err(io::Error::from_raw_os_error(done.code.abs()));
                    }
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::InnerMessage(inner) => {
                        let last = stop(&inner);
                        replies.push(inner);
                        if last {
                            return Ok(replies);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

fn serialize<I: NetlinkSerializable>(payload: I, flags: u16, seq: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
    msg.finalize();
    let mut out = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut out);
    out
}
