//! Several requests in one datagram: what nfnetlink batches (and bulk conntrack deletes) need.
//!
//! The kernel handles a netlink datagram synchronously inside `sendmsg`, so every answer is
//! queued on our socket by the time the send returns. Callers ask for an ACK only on the
//! messages they need confirmed (usually the last one): errors are reported for every failing
//! message regardless, and one ACK per message would only fill the receive buffer.

use std::io;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable,
};

use super::NetlinkSocket;

/// A message of a batch that the kernel refused.
#[derive(Debug)]
pub struct BatchFailure {
    /// Position of the message in the batch, from 0.
    pub index: usize,
    /// The kernel's errno.
    pub error: io::Error,
}

impl NetlinkSocket {
    /// Sends `messages` (payload and extra `NLM_F_*` flags each) in one datagram with
    /// consecutive sequence numbers and returns the messages the kernel refused, in order.
    ///
    /// It reads until every message sent with `NLM_F_ACK` is answered. A refused batch header
    /// aborts the whole batch, so the ACKs asked for may never come: then the queue is read
    /// until empty and the refusals returned.
    ///
    /// # Errors
    /// An I/O error, or `InvalidData` when an ACK the caller asked for never came although
    /// nothing was refused.
    pub fn send_batch<I>(&mut self, messages: Vec<(I, u16)>) -> io::Result<Vec<BatchFailure>>
    where
        I: NetlinkSerializable + NetlinkDeserializable,
    {
        let first = self.seq.wrapping_add(1);
        let count = messages.len();
        let mut wants_ack = Vec::with_capacity(count);
        let mut out = Vec::new();
        for (payload, flags) in messages {
            self.seq = self.seq.wrapping_add(1);
            let mut header = NetlinkHeader::default();
            header.flags = NLM_F_REQUEST | flags;
            header.sequence_number = self.seq;
            wants_ack.push(flags & NLM_F_ACK != 0);
            let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
            msg.finalize();
            let start = out.len();
            // Every message starts 4-byte aligned inside the datagram.
            out.resize(start + ((msg.buffer_len() + 3) & !3), 0);
            msg.serialize(&mut out[start..]);
        }
        self.socket.send(&out, 0)?;

        let mut pending = wants_ack.iter().filter(|w| **w).count();
        let mut failures = Vec::new();
        while pending > 0 {
            self.buf.clear();
            // Nothing can still be in flight (see the module doc): never block.
            let n = match self
                .socket
                .recv(&mut self.buf, libc::MSG_DONTWAIT | libc::MSG_TRUNC)
            {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !failures.is_empty() => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("netlink: {pending} acknowledgement(s) of a batch never came"),
                    ));
                }
                Err(e) => return Err(e),
            };
            if n > self.buf.len() {
                return Err(io::Error::other(format!(
                    "netlink reply of {n} bytes truncated to {}",
                    self.buf.len()
                )));
            }
            let mut offset = 0;
            while offset < self.buf.len() {
                let reply = NetlinkMessage::<I>::deserialize(&self.buf[offset..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = reply.header.length as usize;
                if len == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "netlink message of length 0",
                    ));
                }
                offset += (len + 3) & !3;
                let index = reply.header.sequence_number.wrapping_sub(first) as usize;
                if index >= count {
                    continue;
                }
                if let NetlinkPayload::Error(err) = reply.payload {
                    if wants_ack[index] {
                        pending -= 1;
                    }
                    if err.code.is_some() {
                        failures.push(BatchFailure {
                            index,
                            error: err.to_io(),
                        });
                    }
                }
            }
        }
        failures.sort_by_key(|f| f.index);
        Ok(failures)
    }
}

impl NetlinkSocket {
    /// `NETLINK_CAP_ACK`: refusals carry only the refused message's header, not its payload,
    /// so a large refused batch cannot overflow the receive buffer.
    ///
    /// # Errors
    /// The `setsockopt` errno.
    pub fn set_cap_ack(&self, on: bool) -> io::Result<()> {
        self.socket.set_cap_ack(on)
    }
}
