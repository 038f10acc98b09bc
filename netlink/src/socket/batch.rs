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
    /// Where the refused attribute starts in the refused message, counted from its netlink
    /// header: the extended ACK's `NLMSGERR_ATTR_OFFS`, when the kernel gave one.
    pub bad_attr_offset: Option<usize>,
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
        I: NetlinkSerializable,
    {
        Ok(self.send_batch_as::<I, Ignored>(messages)?.failures)
    }

    /// [`NetlinkSocket::send_batch`] that also returns the other messages the kernel sent
    /// back for the batch before its acknowledgements (what it echoes for `NLM_F_ECHO`),
    /// decoded as `O`, each with the position of the batch message it answers.
    ///
    /// # Errors
    /// As [`NetlinkSocket::send_batch`].
    pub fn send_batch_as<I, O>(&mut self, messages: Vec<(I, u16)>) -> io::Result<BatchReplies<O>>
    where
        I: NetlinkSerializable,
        O: NetlinkDeserializable,
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
        let mut replies = Vec::new();
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
                let reply = NetlinkMessage::<O>::deserialize(&self.buf[offset..])
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
                match reply.payload {
                    NetlinkPayload::Error(err) => {
                        if wants_ack[index] {
                            pending -= 1;
                        }
                        if err.code.is_some() {
                            failures.push(BatchFailure {
                                index,
                                bad_attr_offset: bad_attr_offset(reply.header.flags, &err.header),
                                error: err.to_io(),
                            });
                        }
                    }
                    NetlinkPayload::InnerMessage(inner) => replies.push((index, inner)),
                    _ => {}
                }
            }
        }
        failures.sort_by_key(|f| f.index);
        Ok(BatchReplies {
            failures,
            messages: replies,
        })
    }
}

/// What the kernel answered to a batch ([`NetlinkSocket::send_batch_as`]).
#[derive(Debug)]
pub struct BatchReplies<O> {
    /// The refused messages, in batch order.
    pub failures: Vec<BatchFailure>,
    /// The other messages it sent back, with the position of the message each answers.
    pub messages: Vec<(usize, O)>,
}

/// A reply [`NetlinkSocket::send_batch`] has no use for.
struct Ignored;

impl NetlinkDeserializable for Ignored {
    type Error = io::Error;

    fn deserialize(_: &NetlinkHeader, _: &[u8]) -> Result<Self, Self::Error> {
        Ok(Ignored)
    }
}

/// The `NLMSGERR_ATTR_OFFS` of an error reply: `flags` are the reply's, `rest` what follows
/// the error code (the refused message, or only its header when `NLM_F_CAPPED`, then the
/// extended ACK's attributes when `NLM_F_ACK_TLVS`).
fn bad_attr_offset(flags: u16, rest: &[u8]) -> Option<usize> {
    const NLM_F_CAPPED: u16 = 0x100;
    const NLM_F_ACK_TLVS: u16 = 0x200;
    const NLMSG_HDRLEN: usize = 16;
    const NLMSGERR_ATTR_OFFS: u16 = 2;
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let refused = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        usize::try_from(u32::from_ne_bytes(rest.get(..4)?.try_into().ok()?)).ok()?
    };
    let mut tlvs = rest.get((refused + 3) & !3..)?;
    while let Some(header) = tlvs.get(..4) {
        let len = usize::from(u16::from_ne_bytes([header[0], header[1]]));
        let kind = u16::from_ne_bytes([header[2], header[3]]) & netlink_packet_core::NLA_TYPE_MASK;
        if len < 4 {
            return None;
        }
        if kind == NLMSGERR_ATTR_OFFS {
            let value = tlvs.get(4..8)?;
            return usize::try_from(u32::from_ne_bytes(value.try_into().ok()?)).ok();
        }
        tlvs = tlvs.get((len + 3) & !3..)?;
    }
    None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_of_the_refused_attribute_is_read_from_the_extended_ack() {
        // The refused message's header (capped), then NLMSGERR_ATTR_MSG and NLMSGERR_ATTR_OFFS.
        let mut rest = vec![0u8; 16];
        rest.extend_from_slice(&[8, 0, 1, 0, b'b', b'a', b'd', 0]);
        rest.extend_from_slice(&[8, 0, 2, 0]);
        rest.extend_from_slice(&52u32.to_ne_bytes());
        assert_eq!(bad_attr_offset(0x100 | 0x200, &rest), Some(52));
        // Without NLM_F_ACK_TLVS there are no attributes to read.
        assert_eq!(bad_attr_offset(0x100, &rest), None);
        // Uncapped: the whole refused message (its length first) comes before them.
        let mut whole = 20u32.to_ne_bytes().to_vec();
        whole.extend_from_slice(&[0; 16]);
        whole.extend_from_slice(&[8, 0, 2, 0]);
        whole.extend_from_slice(&36u32.to_ne_bytes());
        assert_eq!(bad_attr_offset(0x200, &whole), Some(36));
        assert_eq!(bad_attr_offset(0x200, &[0; 3]), None);
    }
}
