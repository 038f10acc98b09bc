//! Traffic control over route netlink: qdiscs (`tbf`, `ingress`), u32 filters with a mirred
//! redirect, and the token-bucket arithmetic of iproute2's `tc`.
//!
//! - [`Psched`] reads `/proc/net/psched` and converts microseconds to the kernel's scheduler
//!   ticks exactly as `tc` does (`tc_core_init`, `tc_core_time2tick`).
//! - [`Tbf`] holds the parameters of a token bucket in the kernel's units; [`Tbf::compute`]
//!   derives them from a rate, a burst and a latency the way `tc qdisc add … tbf rate R burst B
//!   latency L` does.
//! - [`tbf_options`] encodes them as the raw `TCA_OPTIONS` attributes (`netlink-packet-route`
//!   has no typed TBF); [`TbfOptions::parse`] reads a dumped qdisc's back.
//! - The `impl Netlink` block adds the qdisc and filter requests (`tc qdisc add|replace|del`,
//!   `tc qdisc show`, `tc filter add … u32 … action mirred egress redirect`, `tc filter show`,
//!   `tc filter del`).
//!
//! Two encoding traps are handled here so callers cannot fall into them: the filter protocol
//! travels in network byte order (`htons(ETH_P_ALL)`, else `tc` shows `protocol [768]` and the
//! filter matches nothing), and qdisc dumps are not filtered by interface without strict
//! checking, so [`Netlink::qdiscs`] filters on our side.

use std::io;

use netlink_packet_core::{
    DefaultNla, Emitable, NLA_TYPE_MASK, NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL, NLM_F_REPLACE, Nla,
    NlasIterator,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionGeneric, TcActionMirrorOption, TcActionOption,
    TcActionType, TcAttribute, TcFilterU32Option, TcHandle, TcMessage, TcMirror,
    TcMirrorActionType, TcOption, TcU32Key, TcU32Selector, TcU32SelectorFlags,
};

use super::{Netlink, NetlinkError};

/// `TIME_UNITS_PER_SEC` of iproute2: `tc` works in microseconds.
pub const TIME_UNITS_PER_SEC: f64 = 1_000_000.0;

/// Where the kernel publishes its packet-scheduler clock parameters.
pub const PSCHED_PATH: &str = "/proc/net/psched";

/// `ETH_P_ALL` in network byte order, as the `protocol` of a filter matching every frame.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub const PROTOCOL_ALL: u16 = (libc::ETH_P_ALL as u16).to_be();

/// The `TCA_TBF_*` attribute numbers of `<linux/pkt_sched.h>` that we send or read.
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_PRATE64: u16 = 5;
/// `TC_LINKLAYER_ETHERNET`: what `tc` puts in a rate spec.
const LINKLAYER_ETHERNET: u8 = 1;
/// `TCA_OPTIONS`, the nest a dumped qdisc's kind-specific attributes arrive in.
const TCA_OPTIONS: u16 = 2;
/// Size of `struct tc_ratespec`.
const RATESPEC_LEN: usize = 12;
/// Size of `struct tc_tbf_qopt`: two rate specs, then limit, buffer, mtu.
const TBF_QOPT_LEN: usize = 2 * RATESPEC_LEN + 12;

/// The packet scheduler's clock, from `/proc/net/psched`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Psched {
    /// Scheduler ticks per microsecond (15.625 on current kernels).
    pub tick_in_usec: f64,
}

impl Psched {
    /// Reads [`PSCHED_PATH`].
    ///
    /// # Errors
    /// When the file cannot be read or does not hold the expected hex words.
    pub fn read() -> io::Result<Psched> {
        let text = std::fs::read_to_string(PSCHED_PATH)?;
        Psched::parse(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Parses the file's text (`t2us us2t clock_res hz`, in hex) the way iproute2's
    /// `tc_core_init` does, including its compatibility rule for nanosecond clocks.
    ///
    /// # Errors
    /// A message naming the text when it has fewer than three hex words or a zero divisor.
    pub fn parse(text: &str) -> Result<Psched, String> {
        let words: Vec<u32> = text
            .split_whitespace()
            .take(3)
            .map(|w| u32::from_str_radix(w, 16))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("invalid {PSCHED_PATH} {text:?}: {e}"))?;
        let [mut t2us, us2t, clock_res] = words[..] else {
            return Err(format!(
                "invalid {PSCHED_PATH} {text:?}: fewer than 3 words"
            ));
        };
        if us2t == 0 || clock_res == 0 {
            return Err(format!("invalid {PSCHED_PATH} {text:?}: zero divisor"));
        }
        // Kernels with a nanosecond clock advertise a multiplier of 1000 for old binaries,
        // which iproute2 undoes this way.
        if clock_res == 1_000_000_000 {
            t2us = us2t;
        }
        let clock_factor = f64::from(clock_res) / TIME_UNITS_PER_SEC;
        Ok(Psched {
            tick_in_usec: f64::from(t2us) / f64::from(us2t) * clock_factor,
        })
    }

    /// `tc_core_time2tick`: microseconds to ticks, truncated.
    ///
    /// # Errors
    /// When the result does not fit the kernel's 32-bit tick fields.
    pub fn time_to_ticks(&self, usec: u32) -> Result<u32, TbfError> {
        let ticks = f64::from(usec) * self.tick_in_usec;
        to_u32(ticks).ok_or(TbfError::BufferOverflow)
    }

    /// `tc_core_tick2time`: ticks to whole microseconds (truncated, as `tc` prints them).
    pub fn ticks_to_time(&self, ticks: u32) -> u32 {
        to_u32(f64::from(ticks) / self.tick_in_usec).unwrap_or(u32::MAX)
    }

    /// `tc_calc_xmittime`: the ticks it takes to send `size` bytes at `rate` bytes/s.
    ///
    /// # Errors
    /// When the time does not fit 32 bits of microseconds or of ticks.
    pub fn xmit_ticks(&self, rate: u64, size: u32) -> Result<u32, TbfError> {
        #[allow(clippy::cast_precision_loss)]
        let usec = TIME_UNITS_PER_SEC * (f64::from(size) / rate as f64);
        self.time_to_ticks(to_u32(usec).ok_or(TbfError::BufferOverflow)?)
    }

    /// `tc_calc_xmitsize`: the bytes sent at `rate` bytes/s during `ticks`.
    pub fn xmit_size(&self, rate: u64, ticks: u32) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let rate = rate as f64;
        rate * f64::from(self.ticks_to_time(ticks)) / TIME_UNITS_PER_SEC
    }
}

/// A C-style truncating conversion that refuses values outside `u32`.
fn to_u32(v: f64) -> Option<u32> {
    // The range check makes the cast exact (truncation toward zero, as C does).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    (v.is_finite() && (0.0..=f64::from(u32::MAX)).contains(&v)).then_some(v as u32)
}

/// Why token-bucket parameters cannot be computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TbfError {
    /// The rate is zero bytes per second.
    #[error("rate is 0 bytes/s")]
    ZeroRate,
    /// The burst is zero bytes.
    #[error("burst is 0 bytes")]
    ZeroBurst,
    /// The burst takes longer to send than 32 bits of ticks hold.
    #[error("burst takes too long to send at this rate (more than 2^32 scheduler ticks)")]
    BufferOverflow,
    /// The queue limit (rate × latency + burst) exceeds 4 GiB.
    #[error("queue limit (rate × latency + burst) exceeds 4 GiB")]
    LimitOverflow,
}

/// Token-bucket parameters in the kernel's units (`struct tc_tbf_qopt` plus the 64-bit rate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    /// Rate in bytes per second.
    pub rate: u64,
    /// Bucket size in scheduler ticks (the time the burst takes at `rate`).
    pub buffer: u32,
    /// Bytes that may wait in the queue.
    pub limit: u32,
}

impl Tbf {
    /// The parameters `tc qdisc add … tbf rate <rate>bps burst <burst>b latency <latency_us>us`
    /// sends: `buffer = xmittime(rate, burst)` and `limit = rate × latency + burst`.
    ///
    /// # Errors
    /// A zero rate or burst, or values that overflow the kernel's 32-bit fields.
    pub fn compute(
        rate: u64,
        burst: u32,
        latency_us: u32,
        psched: &Psched,
    ) -> Result<Tbf, TbfError> {
        if rate == 0 {
            return Err(TbfError::ZeroRate);
        }
        if burst == 0 {
            return Err(TbfError::ZeroBurst);
        }
        let buffer = psched.xmit_ticks(rate, burst)?;
        #[allow(clippy::cast_precision_loss)]
        let limit = rate as f64 * f64::from(latency_us) / TIME_UNITS_PER_SEC + f64::from(burst);
        let limit = to_u32(limit).ok_or(TbfError::LimitOverflow)?;
        Ok(Tbf {
            rate,
            buffer,
            limit,
        })
    }

    /// The buffer as the Go reference computes it (`uint32(burst × 10^6 / rate)` µs, then
    /// ticks): it can differ from `tc`'s by the last bit of a float, so a CHECK of a qdisc the
    /// Go plugin made accepts either.
    pub fn reference_buffer(rate: u64, burst: u32, psched: &Psched) -> Option<u32> {
        #[allow(clippy::cast_precision_loss)]
        let usec = f64::from(burst) * TIME_UNITS_PER_SEC / rate as f64;
        psched.time_to_ticks(to_u32(usec)?).ok()
    }

    /// The burst in bytes that `buffer` ticks allow at this rate, as `tc` prints it.
    pub fn burst_bytes(&self, psched: &Psched) -> f64 {
        psched.xmit_size(self.rate, self.buffer)
    }
}

/// Encodes a rate spec (`struct tc_ratespec`): Ethernet link layer, no cell table, the rate
/// saturated to 32 bits as `tc` does (the full rate goes in `TCA_TBF_RATE64`).
fn ratespec(rate: u64) -> [u8; RATESPEC_LEN] {
    let mut out = [0u8; RATESPEC_LEN];
    if rate != 0 {
        out[1] = LINKLAYER_ETHERNET;
    }
    let rate32 = u32::try_from(rate).unwrap_or(u32::MAX);
    out[8..12].copy_from_slice(&rate32.to_ne_bytes());
    out
}

/// The `struct tc_tbf_qopt` of `tbf` (no peak rate, no MTU).
pub fn tbf_qopt(tbf: &Tbf) -> Vec<u8> {
    let mut out = Vec::with_capacity(TBF_QOPT_LEN);
    out.extend_from_slice(&ratespec(tbf.rate));
    out.extend_from_slice(&ratespec(0));
    out.extend_from_slice(&tbf.limit.to_ne_bytes());
    out.extend_from_slice(&tbf.buffer.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out
}

/// The `TCA_OPTIONS` attributes of a `tbf` qdisc: `TCA_TBF_PARMS`, plus `TCA_TBF_RATE64`
/// when the rate needs more than 32 bits.
///
/// No `TCA_TBF_BURST` is sent: with it the kernel re-derives the buffer with its own rounding,
/// and the buffer it reports back would no longer be the one computed here, which CHECK
/// compares exactly.
pub fn tbf_options(tbf: &Tbf) -> Vec<TcOption> {
    let mut options = vec![TcOption::Other(DefaultNla::new(
        TCA_TBF_PARMS,
        tbf_qopt(tbf),
    ))];
    if tbf.rate > u64::from(u32::MAX) {
        options.push(TcOption::Other(DefaultNla::new(
            TCA_TBF_RATE64,
            tbf.rate.to_ne_bytes().to_vec(),
        )));
    }
    options
}

/// The options of a dumped `tbf` qdisc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TbfOptions {
    /// Rate in bytes per second (the 64-bit attribute when present).
    pub rate: u64,
    /// Peak rate in bytes per second, 0 when unset.
    pub peakrate: u64,
    /// Queue limit in bytes.
    pub limit: u32,
    /// Bucket size in ticks.
    pub buffer: u32,
    /// Peak-rate bucket size in ticks.
    pub mtu: u32,
    /// The rate spec's link layer (`tc` sends 1, Ethernet; the Go plugin 0).
    pub linklayer: u8,
}

impl TbfOptions {
    /// Decodes the nested attributes of `TCA_OPTIONS` (its value, without its own header).
    ///
    /// # Errors
    /// A message when `TCA_TBF_PARMS` is missing or short.
    pub fn parse(nested: &[u8]) -> Result<TbfOptions, String> {
        let mut parms: Option<Vec<u8>> = None;
        let mut rate64 = None;
        let mut prate64 = None;
        for nla in NlasIterator::new(nested) {
            let nla = nla.map_err(|e| format!("invalid tbf options: {e}"))?;
            let value = nla.value();
            match nla.kind() {
                TCA_TBF_PARMS => parms = Some(value.to_vec()),
                TCA_TBF_RATE64 => rate64 = read_u64(value),
                TCA_TBF_PRATE64 => prate64 = read_u64(value),
                _ => {}
            }
        }
        let parms = parms.ok_or("tbf options without TCA_TBF_PARMS")?;
        if parms.len() < TBF_QOPT_LEN {
            return Err(format!("tbf parameters of {} bytes", parms.len()));
        }
        let word = |at: usize| read_u32(&parms[at..at + 4]).unwrap_or_default();
        Ok(TbfOptions {
            rate: rate64.unwrap_or_else(|| u64::from(word(8))),
            peakrate: prate64.unwrap_or_else(|| u64::from(word(RATESPEC_LEN + 8))),
            limit: word(2 * RATESPEC_LEN),
            buffer: word(2 * RATESPEC_LEN + 4),
            mtu: word(2 * RATESPEC_LEN + 8),
            linklayer: parms[1],
        })
    }

    /// True when rate, limit and buffer are the ones of `tbf` (what a CHECK compares).
    pub fn matches(&self, tbf: &Tbf) -> bool {
        self.rate == tbf.rate && self.limit == tbf.limit && self.buffer == tbf.buffer
    }
}

fn read_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(..4)?.try_into().ok()?))
}

fn read_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(..8)?.try_into().ok()?))
}

/// A qdisc as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    /// Interface index.
    pub ifindex: u32,
    /// Handle (`1:` is `0x0001_0000`).
    pub handle: u32,
    /// Parent handle ([`ROOT`] for a root qdisc, [`INGRESS`] for `ingress`/`clsact`).
    pub parent: u32,
    /// Kind (`tbf`, `ingress`, `noqueue`, …).
    pub kind: String,
    /// Parsed options when `kind` is `tbf`.
    pub tbf: Option<TbfOptions>,
}

impl Qdisc {
    fn from_message(ifindex: u32, msg: TcMessage) -> Result<Qdisc, String> {
        let mut qdisc = Qdisc {
            ifindex,
            handle: msg.header.handle.into(),
            parent: msg.header.parent.into(),
            kind: String::new(),
            tbf: None,
        };
        let mut options = None;
        for attr in msg.attributes {
            match attr {
                TcAttribute::Kind(kind) => qdisc.kind = kind,
                TcAttribute::Options(opts) => options = Some(opts),
                _ => {}
            }
        }
        if qdisc.kind == "tbf" {
            let nested = opaque_options(options.as_deref().unwrap_or_default());
            qdisc.tbf = Some(TbfOptions::parse(&nested)?);
        }
        Ok(qdisc)
    }
}

/// `TC_H_ROOT`: the parent of a root qdisc.
pub const ROOT: u32 = 0xffff_ffff;
/// `TC_H_INGRESS`: the parent of an `ingress` qdisc.
pub const INGRESS: u32 = 0xffff_fff1;
/// `ffff:`, the handle of an `ingress` qdisc and the parent of its filters.
pub const INGRESS_HANDLE: u32 = 0xffff_0000;

/// Builds a handle from its major and minor numbers (`TC_H_MAKE`).
pub const fn handle(major: u16, minor: u16) -> u32 {
    ((major as u32) << 16) | minor as u32
}

/// A filter as the kernel reports it (only what we read back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// The parent it is attached to.
    pub parent: u32,
    /// Its priority (`pref`).
    pub priority: u16,
    /// Its protocol, in network byte order as on the wire ([`PROTOCOL_ALL`] for `all`).
    pub protocol: u16,
    /// Its handle (`800::800` is `0x8000_0800`; 0 for the per-priority header entry).
    pub handle: u32,
    /// Kind (`u32`, `matchall`, …).
    pub kind: String,
    /// The flow id (`classid`) of a u32 filter.
    pub classid: Option<u32>,
    /// The mirred actions: direction/kind and target interface index.
    pub mirred: Vec<(TcMirrorActionType, u32)>,
}

/// `tcm_info` of a filter: priority in the upper half, protocol in the lower.
fn filter_info(priority: u16, protocol: u16) -> u32 {
    (u32::from(priority) << 16) | u32::from(protocol)
}

fn tc_message(ifindex: u32, parent: u32, handle: u32) -> Result<TcMessage, NetlinkError> {
    let index = i32::try_from(ifindex).map_err(|_| {
        NetlinkError::new(
            format!("address interface index {ifindex}"),
            io::Error::from_raw_os_error(libc::EINVAL),
        )
    })?;
    let mut msg = TcMessage::with_index(index);
    msg.header.parent = TcHandle::from(parent);
    msg.header.handle = TcHandle::from(handle);
    Ok(msg)
}

fn fmt_handle(h: u32) -> String {
    match h {
        ROOT => "root".into(),
        INGRESS => "ingress".into(),
        _ => format!("{:x}:{:x}", h >> 16, h & 0xffff),
    }
}

impl Netlink {
    /// Adds (`replace == false`, fails with EEXIST) or creates-or-replaces (`replace == true`)
    /// a root `tbf` qdisc with `handle` on `ifindex`:
    /// `tc qdisc add|replace dev X root handle H tbf …`.
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn add_root_tbf(
        &mut self,
        ifindex: u32,
        handle: u32,
        tbf: &Tbf,
        replace: bool,
    ) -> Result<(), NetlinkError> {
        let mut msg = tc_message(ifindex, ROOT, handle)?;
        msg.attributes.push(TcAttribute::Kind("tbf".into()));
        msg.attributes.push(TcAttribute::Options(tbf_options(tbf)));
        let flags = NLM_F_CREATE | if replace { NLM_F_REPLACE } else { NLM_F_EXCL };
        log::debug!(
            "tc qdisc {} dev {ifindex} root handle {} tbf {tbf:?}",
            if replace { "replace" } else { "add" },
            fmt_handle(handle)
        );
        self.request(
            format!("add tbf qdisc on interface {ifindex}"),
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            flags,
        )
        .map(drop)
    }

    /// Adds the `ingress` qdisc (`ffff:`) to `ifindex`: `tc qdisc add dev X ingress`.
    ///
    /// # Errors
    /// `is_exists()` when the interface already has one.
    pub fn add_ingress_qdisc(&mut self, ifindex: u32) -> Result<(), NetlinkError> {
        let mut msg = tc_message(ifindex, INGRESS, INGRESS_HANDLE)?;
        msg.attributes.push(TcAttribute::Kind("ingress".into()));
        log::debug!("tc qdisc add dev {ifindex} ingress");
        self.request(
            format!("add ingress qdisc on interface {ifindex}"),
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Deletes the qdisc under `parent` on `ifindex`: `tc qdisc del dev X root|ingress`.
    ///
    /// `handle` 0 deletes whatever qdisc sits there; a non-zero handle must match it.
    ///
    /// # Errors
    /// `is_not_found()` (ENOENT) when there is none and `handle` is 0; EINVAL when `handle` is
    /// not the handle of the qdisc there.
    pub fn del_qdisc(
        &mut self,
        ifindex: u32,
        parent: u32,
        handle: u32,
    ) -> Result<(), NetlinkError> {
        let msg = tc_message(ifindex, parent, handle)?;
        log::debug!("tc qdisc del dev {ifindex} {}", fmt_handle(parent));
        self.request(
            format!("delete {} qdisc of interface {ifindex}", fmt_handle(parent)),
            RouteNetlinkMessage::DelQueueDiscipline(msg),
            0,
        )
        .map(drop)
    }

    /// The qdisc attached at `parent` ([`ROOT`] or [`INGRESS`]) of `ifindex`, with one GET
    /// instead of a dump of every interface's qdiscs (`tc qdisc show dev X root|ingress`).
    /// A device without one reports its default (`noqueue`, `noop`, …) or nothing.
    ///
    /// # Errors
    /// The kernel's errno other than "none there" (ENOENT), or tbf options that do not decode.
    pub fn qdisc(&mut self, ifindex: u32, parent: u32) -> Result<Option<Qdisc>, NetlinkError> {
        let op = format!("get {} qdisc of interface {ifindex}", fmt_handle(parent));
        let msg = tc_message(ifindex, parent, 0)?;
        // The kernel answers a qdisc GET as a notification: only NLM_F_ECHO sends it back to us.
        let replies = match self.request(
            &op,
            RouteNetlinkMessage::GetQueueDiscipline(msg),
            NLM_F_ECHO,
        ) {
            Ok(replies) => replies,
            Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        for reply in replies {
            if let RouteNetlinkMessage::NewQueueDiscipline(msg) = reply {
                return Qdisc::from_message(ifindex, msg).map(Some).map_err(|e| {
                    NetlinkError::new(op, io::Error::new(io::ErrorKind::InvalidData, e))
                });
            }
        }
        Ok(None)
    }

    /// Lists the qdiscs of `ifindex` (`tc qdisc show dev X`); the dump covers every interface
    /// and is filtered here.
    ///
    /// # Errors
    /// The kernel's errno, or tbf options that do not decode.
    pub fn qdiscs(&mut self, ifindex: u32) -> Result<Vec<Qdisc>, NetlinkError> {
        let op = format!("list qdiscs of interface {ifindex}");
        let replies = self.dump(
            &op,
            RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()),
        )?;
        let mut out = Vec::new();
        for reply in replies {
            let RouteNetlinkMessage::NewQueueDiscipline(msg) = reply else {
                continue;
            };
            if u32::try_from(msg.header.index).ok() != Some(ifindex) {
                continue;
            }
            out.push(Qdisc::from_message(ifindex, msg).map_err(|e| {
                NetlinkError::new(op.clone(), io::Error::new(io::ErrorKind::InvalidData, e))
            })?);
        }
        Ok(out)
    }

    /// Adds a u32 filter matching every frame on `parent` of `ifindex` that redirects it to
    /// the egress of `target`:
    /// `tc filter add dev X parent P protocol all prio N u32 match u32 0 0 classid C
    /// action mirred egress redirect dev T action mirred egress redirect dev T pass`
    /// (the reference's two actions, see [`redirect_filter_options`]).
    ///
    /// # Errors
    /// The kernel's errno.
    pub fn add_redirect_filter(
        &mut self,
        ifindex: u32,
        parent: u32,
        priority: u16,
        classid: u32,
        target: u32,
    ) -> Result<(), NetlinkError> {
        let mut msg = tc_message(ifindex, parent, 0)?;
        msg.header.info = filter_info(priority, PROTOCOL_ALL);
        msg.attributes.push(TcAttribute::Kind("u32".into()));
        msg.attributes
            .push(TcAttribute::Options(redirect_filter_options(
                classid, target,
            )));
        log::debug!(
            "tc filter add dev {ifindex} parent {} protocol all prio {priority} u32 match-all \
             classid {} action mirred egress redirect dev {target}",
            fmt_handle(parent),
            fmt_handle(classid)
        );
        self.request(
            format!("add redirect filter on interface {ifindex}"),
            RouteNetlinkMessage::NewTrafficFilter(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Lists the filters under `parent` of `ifindex` (`tc filter show dev X parent P`).
    ///
    /// # Errors
    /// The kernel's errno (EINVAL when the interface has no such qdisc).
    pub fn filters(&mut self, ifindex: u32, parent: u32) -> Result<Vec<Filter>, NetlinkError> {
        let msg = tc_message(ifindex, parent, 0)?;
        let replies = self.dump(
            format!(
                "list filters of interface {ifindex} parent {}",
                fmt_handle(parent)
            ),
            RouteNetlinkMessage::GetTrafficFilter(msg),
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|reply| match reply {
                RouteNetlinkMessage::NewTrafficFilter(msg)
                    if u32::try_from(msg.header.index).ok() == Some(ifindex) =>
                {
                    Some(Filter::from_message(msg))
                }
                _ => None,
            })
            .collect())
    }

    /// Deletes every filter of `priority` and `protocol` under `parent` of `ifindex`
    /// (`tc filter del dev X parent P protocol all prio N`).
    ///
    /// # Errors
    /// `is_not_found()` when there is none.
    pub fn del_filters(
        &mut self,
        ifindex: u32,
        parent: u32,
        priority: u16,
        protocol: u16,
    ) -> Result<(), NetlinkError> {
        let mut msg = tc_message(ifindex, parent, 0)?;
        msg.header.info = filter_info(priority, protocol);
        log::debug!(
            "tc filter del dev {ifindex} parent {} prio {priority}",
            fmt_handle(parent)
        );
        self.request(
            format!("delete filters of priority {priority} on interface {ifindex}"),
            RouteNetlinkMessage::DelTrafficFilter(msg),
            0,
        )
        .map(drop)
    }
}

/// The options of the match-all u32 filter with a mirred egress redirect, as the reference's
/// netlink library sends them (`U32.RedirIndex` plus the same redirect in `U32.Actions`): two
/// mirred actions to `target`, the first with the control action `stolen` (what `tc` sets for a
/// redirect), the second with `pass`. The kernel stops at the first action that does not
/// return `pipe`, so the first one takes every packet and the second never runs; it is there so
/// that `tc filter show` reads the same as on a node running the Go plugin.
pub fn redirect_filter_options(classid: u32, target: u32) -> Vec<TcOption> {
    let mut selector = TcU32Selector::default();
    selector.flags = TcU32SelectorFlags::Terminal;
    selector.nkeys = 1;
    selector.keys = vec![TcU32Key::default()];
    let actions = [(1, TcActionType::Stolen), (2, TcActionType::Ok)]
        .into_iter()
        .map(|(tab, control)| {
            let mut generic = TcActionGeneric::default();
            generic.action = control;
            let mut mirror = TcMirror::default();
            mirror.generic = generic;
            mirror.eaction = TcMirrorActionType::EgressRedir;
            mirror.ifindex = target;
            let mut action = TcAction::default();
            action.tab = tab;
            action.attributes = vec![
                TcActionAttribute::Kind("mirred".into()),
                TcActionAttribute::Options(vec![TcActionOption::Mirror(
                    TcActionMirrorOption::Parms(mirror),
                )]),
            ];
            action
        })
        .collect();
    vec![
        TcOption::U32(TcFilterU32Option::ClassId(TcHandle::from(classid))),
        TcOption::U32(TcFilterU32Option::Selector(selector)),
        TcOption::U32(TcFilterU32Option::Action(actions)),
    ]
}

impl Filter {
    fn from_message(msg: TcMessage) -> Filter {
        #[allow(clippy::cast_possible_truncation)]
        let (priority, protocol) = ((msg.header.info >> 16) as u16, msg.header.info as u16);
        let mut filter = Filter {
            parent: msg.header.parent.into(),
            priority,
            protocol,
            handle: msg.header.handle.into(),
            kind: String::new(),
            classid: None,
            mirred: Vec::new(),
        };
        for attr in msg.attributes {
            match attr {
                TcAttribute::Kind(kind) => filter.kind = kind,
                TcAttribute::Options(options) => {
                    for option in options {
                        match option {
                            TcOption::U32(TcFilterU32Option::ClassId(c)) => {
                                filter.classid = Some(c.into());
                            }
                            TcOption::U32(TcFilterU32Option::Action(actions)) => {
                                filter.mirred.extend(actions.iter().flat_map(mirred_of));
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        filter
    }
}

fn mirred_of(action: &TcAction) -> Vec<(TcMirrorActionType, u32)> {
    action
        .attributes
        .iter()
        .filter_map(|a| match a {
            TcActionAttribute::Options(options) => Some(options),
            _ => None,
        })
        .flatten()
        .filter_map(|o| match o {
            TcActionOption::Mirror(TcActionMirrorOption::Parms(p)) => Some((p.eaction, p.ifindex)),
            _ => None,
        })
        .collect()
}

/// The raw nested attributes of a qdisc kind `netlink-packet-route` does not know: it hands
/// the whole `TCA_OPTIONS` over as one opaque attribute.
fn opaque_options(options: &[TcOption]) -> Vec<u8> {
    for option in options {
        if let TcOption::Other(nla) = option
            && nla.kind() & NLA_TYPE_MASK == TCA_OPTIONS
        {
            let mut value = vec![0u8; nla.value_len()];
            nla.emit_value(&mut value);
            return value;
        }
    }
    // Otherwise the options are already split: re-emit them as a nest body.
    let mut out = Vec::new();
    for option in options {
        let mut buf = vec![0u8; option.buffer_len()];
        option.emit(&mut buf);
        out.extend_from_slice(&buf);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Debian 12's kernel: 1 µs = 15.625 ticks.
    const PSCHED: &str = "000003e8 00000040 000f4240 3b9aca00\n";

    fn psched() -> Psched {
        Psched::parse(PSCHED).unwrap()
    }

    fn emit(options: &[TcOption]) -> Vec<u8> {
        let mut out = Vec::new();
        for o in options {
            let mut buf = vec![0u8; o.buffer_len()];
            o.emit(&mut buf);
            out.extend_from_slice(&buf);
        }
        out
    }

    #[test]
    fn psched_is_parsed_as_iproute2_does() {
        assert!((psched().tick_in_usec - 15.625).abs() < f64::EPSILON);
        // A nanosecond clock advertising the compatibility multiplier of 1000.
        let ns = Psched::parse("000003e8 00000001 3b9aca00 3b9aca00").unwrap();
        assert!((ns.tick_in_usec - 1000.0).abs() < f64::EPSILON);
        for bad in [
            "",
            "000003e8 00000040",
            "zz 1 1",
            "000003e8 00000000 000f4240",
        ] {
            assert!(Psched::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tbf_parameters_match_the_reference_vectors_and_tc() {
        let p = psched();
        // The Go plugin's test vectors (bits/8): rate, burst -> rate, limit.
        for (rate, burst, want_limit) in [(1, 1, 1), (2, 1, 1), (1000, 10, 35)] {
            let tbf = Tbf::compute(rate, burst, 25_000, &p).unwrap();
            assert_eq!((tbf.rate, tbf.limit), (rate, want_limit), "{rate}/{burst}");
        }
        // tc qdisc add … tbf rate 10mbit burst 12500 latency 25ms: 10 ms of burst.
        let tbf = Tbf::compute(1_250_000, 12_500, 25_000, &p).unwrap();
        assert_eq!(
            tbf,
            Tbf {
                rate: 1_250_000,
                buffer: 156_250,
                limit: 43_750
            }
        );
        assert!((tbf.burst_bytes(&p) - 12_500.0).abs() < 1e-6);
        assert_eq!(Tbf::reference_buffer(1_250_000, 12_500, &p), Some(156_250));
    }

    #[test]
    fn tbf_refuses_zero_and_overflowing_values() {
        let p = psched();
        assert_eq!(Tbf::compute(0, 1, 25_000, &p), Err(TbfError::ZeroRate));
        assert_eq!(Tbf::compute(1, 0, 25_000, &p), Err(TbfError::ZeroBurst));
        // 4 GB at 1 MB/s takes 4295 s: more than 2^32 ticks.
        assert_eq!(
            Tbf::compute(1_000_000, u32::MAX, 25_000, &p),
            Err(TbfError::BufferOverflow)
        );
        // 100 GB/s for 25 ms is 2.5 GB, plus a 2 GB burst.
        assert_eq!(
            Tbf::compute(100_000_000_000, 2_000_000_000, 25_000, &p),
            Err(TbfError::LimitOverflow)
        );
    }

    /// Golden bytes, laid out by hand from `<linux/pkt_sched.h>` (`struct tc_tbf_qopt`,
    /// `struct tc_ratespec`, `TCA_TBF_PARMS` = 1, `TCA_TBF_RATE64` = 4), little endian.
    #[test]
    fn tbf_attributes_have_the_golden_bytes() {
        let tbf = Tbf {
            rate: 1_250_000,
            buffer: 156_250,
            limit: 43_750,
        };
        #[rustfmt::skip]
        let want: Vec<u8> = vec![
            40, 0, 1, 0,                    // nla len 40, TCA_TBF_PARMS
            0, 1, 0, 0, 0, 0, 0, 0,         // rate: cell_log 0, linklayer ethernet, overhead, cell_align, mpu
            0xd0, 0x12, 0x13, 0x00,         //       rate 1250000 B/s
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // peakrate: none
            0xe6, 0xaa, 0x00, 0x00,         // limit 43750 B
            0x5a, 0x62, 0x02, 0x00,         // buffer 156250 ticks
            0, 0, 0, 0,                     // mtu
        ];
        assert_eq!(emit(&tbf_options(&tbf)), want);

        let fast = Tbf {
            rate: 5_000_000_000,
            buffer: 1,
            limit: 2,
        };
        let bytes = emit(&tbf_options(&fast));
        assert_eq!(bytes.len(), 40 + 12);
        assert_eq!(&bytes[12..16], &[0xff; 4], "32-bit rate saturates");
        #[rustfmt::skip]
        let rate64: [u8; 12] = [12, 0, 4, 0, 0x00, 0xf2, 0x05, 0x2a, 0x01, 0, 0, 0];
        assert_eq!(&bytes[40..], &rate64);
        // And they decode back.
        assert_eq!(
            TbfOptions::parse(&bytes).unwrap(),
            TbfOptions {
                rate: 5_000_000_000,
                peakrate: 0,
                limit: 2,
                buffer: 1,
                mtu: 0,
                linklayer: 1
            }
        );
    }

    #[test]
    fn the_redirect_filter_matches_everything_in_network_byte_order() {
        assert_eq!(PROTOCOL_ALL.to_ne_bytes(), [0x00, 0x03]);
        assert_eq!(
            filter_info(1, PROTOCOL_ALL),
            0x0001_0300_u32.to_le().to_le()
        );
        let bytes = emit(&redirect_filter_options(handle(1, 1), 7));
        // classid 1:1 first.
        assert_eq!(&bytes[..8], &[8, 0, 1, 0, 1, 0, 1, 0]);
        // The selector: terminal, one all-zero key.
        assert_eq!(&bytes[8..12], &[36, 0, 5, 0]);
        assert_eq!(&bytes[12..16], &[1, 0, 1, 0]);
        assert!(bytes[16..44].iter().all(|b| *b == 0));
    }

    #[test]
    fn the_redirect_filter_carries_the_references_two_redirects_the_first_stealing() {
        let options = redirect_filter_options(handle(1, 1), 7);
        let Some(TcOption::U32(TcFilterU32Option::Action(actions))) = options.last() else {
            panic!("no actions in {options:?}");
        };
        let seen: Vec<(u16, TcActionType, TcMirrorActionType, u32)> = actions
            .iter()
            .flat_map(|a| {
                a.attributes.iter().filter_map(move |attr| match attr {
                    TcActionAttribute::Options(o) => match o.as_slice() {
                        [TcActionOption::Mirror(TcActionMirrorOption::Parms(p))] => {
                            Some((a.tab, p.generic.action, p.eaction, p.ifindex))
                        }
                        _ => None,
                    },
                    _ => None,
                })
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                (1, TcActionType::Stolen, TcMirrorActionType::EgressRedir, 7),
                (2, TcActionType::Ok, TcMirrorActionType::EgressRedir, 7),
            ]
        );
    }

    // Kernel tests: each in a fresh network namespace, cross-checked with `tc -j`.

    fn in_fresh_netns<T: Send>(body: impl FnOnce() -> T + Send) -> T {
        host::netns::in_new_netns(body).expect("a fresh network namespace needs root")
    }

    fn run(cmd: &str, args: &str) -> String {
        let out = Command::new(cmd).args(args.split(' ')).output().unwrap();
        assert!(
            out.status.success(),
            "{cmd} {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn tc_json(args: &str) -> serde_json::Value {
        serde_json::from_str(&run("tc", &format!("-j {args}"))).unwrap()
    }

    #[test]
    fn tbf_read_back_over_netlink_equals_what_tc_reports() {
        in_fresh_netns(|| {
            run("ip", "link add veth-a type veth peer name veth-b");
            let mut nl = Netlink::new().unwrap();
            let a = nl.link_by_name("veth-a").unwrap().index;
            let p = Psched::read().unwrap();
            for (rate, burst) in [
                (1_250_000, 12_500),
                (125_000, 1_514),
                (2_500_000_000, 64_000),
            ] {
                let tbf = Tbf::compute(rate, burst, 25_000, &p).unwrap();
                nl.add_root_tbf(a, handle(1, 0), &tbf, true).unwrap();
                let qdiscs = nl.qdiscs(a).unwrap();
                let root: Vec<&Qdisc> = qdiscs.iter().filter(|q| q.parent == ROOT).collect();
                assert_eq!(root.len(), 1, "{qdiscs:?}");
                assert_eq!(
                    (root[0].kind.as_str(), root[0].handle),
                    ("tbf", handle(1, 0))
                );
                assert_eq!(nl.qdisc(a, ROOT).unwrap().as_ref(), Some(root[0]));
                let read = root[0].tbf.unwrap();
                assert!(read.matches(&tbf), "{read:?} vs {tbf:?}");
                // tc derives burst and latency from the same three numbers.
                let shown = &tc_json("-s qdisc show dev veth-a root")[0];
                assert_eq!(shown["kind"], "tbf");
                assert_eq!(shown["handle"], "1:");
                assert_eq!(shown["options"]["rate"].as_u64(), Some(read.rate));
                let burst = shown["options"]["burst"].as_f64().unwrap();
                assert!(
                    (burst - tbf.burst_bytes(&p)).abs() <= 1.0,
                    "{burst} {shown}"
                );
                let lat = shown["options"]["lat"].as_f64().unwrap();
                #[allow(clippy::cast_precision_loss)]
                let want_lat = TIME_UNITS_PER_SEC * (f64::from(read.limit) / read.rate as f64)
                    - f64::from(p.ticks_to_time(read.buffer));
                assert!((lat - want_lat).abs() <= 1.0, "{lat} vs {want_lat}");
            }
            // Without replace, a second add is refused; del removes it.
            let tbf = Tbf::compute(1_000, 10, 25_000, &p).unwrap();
            let err = nl.add_root_tbf(a, handle(1, 0), &tbf, false).unwrap_err();
            assert!(err.is_exists(), "{err}");
            nl.del_qdisc(a, ROOT, 0).unwrap();
            assert!(nl.qdiscs(a).unwrap().iter().all(|q| q.kind != "tbf"));
            assert!(nl.del_qdisc(a, ROOT, 0).is_err());
        });
    }

    #[test]
    fn ifb_ingress_and_redirect_filter_read_back_as_tc_shows_them() {
        in_fresh_netns(|| {
            run("ip", "link add veth-a type veth peer name veth-b");
            let mut nl = Netlink::new().unwrap();
            let a = nl.link_by_name("veth-a").unwrap().index;
            let ifb = nl.add_ifb("bwptest0", 1400, None, "owner:x:y").unwrap();
            assert_eq!(
                (ifb.mtu, ifb.up, ifb.kind.as_deref()),
                (1400, true, Some("ifb"))
            );
            let err = nl.add_ifb("bwptest0", 1400, None, "o").unwrap_err();
            assert!(err.is_exists(), "{err}");
            let shown = &serde_json::from_str::<serde_json::Value>(&run(
                "ip",
                "-j -d link show dev bwptest0",
            ))
            .unwrap()[0];
            assert_eq!(shown["ifalias"], "owner:x:y");
            assert_eq!(shown["linkinfo"]["info_kind"], "ifb");
            assert!(
                shown["flags"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|f| f == "UP")),
                "{shown}"
            );
            // An alias the kernel would refuse: nothing is created.
            let err = nl
                .add_ifb("bwptest1", 1400, None, &"x".repeat(256))
                .unwrap_err();
            assert_eq!(err.errno(), Some(libc::EINVAL), "{err}");
            assert!(nl.link_by_name("bwptest1").unwrap_err().is_not_found());
            let with_alias = nl.link_alias_by_name("bwptest0").unwrap();
            assert_eq!(with_alias.alias.as_deref(), Some("owner:x:y"));
            assert!(
                nl.ifbs_with_aliases()
                    .unwrap()
                    .iter()
                    .any(|l| l.link.name == "bwptest0" && l.alias.is_some())
            );

            nl.add_ingress_qdisc(a).unwrap();
            assert!(nl.add_ingress_qdisc(a).unwrap_err().is_exists());
            let ingress: Vec<Qdisc> = nl
                .qdiscs(a)
                .unwrap()
                .into_iter()
                .filter(|q| q.parent == INGRESS)
                .collect();
            assert_eq!(ingress.len(), 1);
            assert_eq!(nl.qdisc(a, INGRESS).unwrap().as_ref(), Some(&ingress[0]));
            assert_eq!(
                (ingress[0].kind.as_str(), ingress[0].handle),
                ("ingress", INGRESS_HANDLE)
            );

            nl.add_redirect_filter(a, INGRESS_HANDLE, 1, handle(1, 1), ifb.index)
                .unwrap();
            let filters = nl.filters(a, INGRESS_HANDLE).unwrap();
            let ours: Vec<&Filter> = filters.iter().filter(|f| !f.mirred.is_empty()).collect();
            assert_eq!(ours.len(), 1, "{filters:?}");
            assert_eq!(ours[0].priority, 1);
            assert_eq!(ours[0].protocol, PROTOCOL_ALL);
            assert_eq!(ours[0].kind, "u32");
            assert_eq!(ours[0].classid, Some(handle(1, 1)));
            assert_eq!(
                ours[0].mirred,
                vec![(TcMirrorActionType::EgressRedir, ifb.index); 2]
            );

            let shown = tc_json("filter show dev veth-a ingress");
            let entry = shown
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["options"]["actions"].is_array())
                .unwrap();
            assert_eq!(entry["protocol"], "all");
            assert_eq!(entry["pref"], 1);
            assert_eq!(entry["options"]["flowid"], "1:1");
            let actions = entry["options"]["actions"].as_array().unwrap();
            assert_eq!(actions.len(), 2, "{actions:?}");
            for (action, control) in actions.iter().zip(["stolen", "pass"]) {
                assert_eq!(action["kind"], "mirred");
                assert_eq!(action["mirred_action"], "redirect");
                assert_eq!(action["direction"], "egress");
                assert_eq!(action["to_dev"], "bwptest0");
                assert_eq!(action["control_action"]["type"], control);
            }

            nl.del_filters(a, INGRESS_HANDLE, 1, PROTOCOL_ALL).unwrap();
            assert!(nl.filters(a, INGRESS_HANDLE).unwrap().is_empty());
            nl.del_qdisc(a, INGRESS, INGRESS_HANDLE).unwrap();
            assert!(nl.qdiscs(a).unwrap().iter().all(|q| q.kind != "ingress"));
            assert!(nl.del_qdisc(a, INGRESS, 0).unwrap_err().is_not_found());
        });
    }
}
