//! Named sets and maps, their data types, and their elements.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use super::expr::Verdict;

/// A protocol above IP (`inet_proto`), as in `meta l4proto tcp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum L4Proto {
    /// `tcp` (6).
    Tcp,
    /// `udp` (17).
    Udp,
    /// `sctp` (132).
    Sctp,
    /// Any other IP protocol number.
    Other(u8),
}

impl L4Proto {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4Proto::Tcp => 6,
            L4Proto::Udp => 17,
            L4Proto::Sctp => 132,
            L4Proto::Other(n) => n,
        }
    }

    /// The protocol with this number.
    pub fn from_number(n: u8) -> L4Proto {
        match n {
            6 => L4Proto::Tcp,
            17 => L4Proto::Udp,
            132 => L4Proto::Sctp,
            n => L4Proto::Other(n),
        }
    }
}

/// The data types of set keys and map values (nft's datatype names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `ipv4_addr`.
    Ipv4Addr,
    /// `ipv6_addr`.
    Ipv6Addr,
    /// `inet_proto`.
    InetProto,
    /// `inet_service` (a port).
    InetService,
    /// `mark`.
    Mark,
    /// `ifname`.
    IfName,
}

/// The set data type of a verdict map (`NFT_DATA_VERDICT`).
pub(crate) const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
/// Bits per component of a concatenated type id (nft's `TYPE_BITS`).
const TYPE_BITS: u32 = 6;

impl DataType {
    /// nft's numeric datatype id, as stored in `NFTA_SET_KEY_TYPE`.
    pub fn id(self) -> u32 {
        match self {
            DataType::Ipv4Addr => 7,
            DataType::Ipv6Addr => 8,
            DataType::InetProto => 12,
            DataType::InetService => 13,
            DataType::Mark => 19,
            DataType::IfName => 41,
        }
    }

    fn from_id(id: u32) -> Option<DataType> {
        [
            DataType::Ipv4Addr,
            DataType::Ipv6Addr,
            DataType::InetProto,
            DataType::InetService,
            DataType::Mark,
            DataType::IfName,
        ]
        .into_iter()
        .find(|t| t.id() == id)
    }

    /// Bytes of one value of this type.
    pub fn byte_len(self) -> usize {
        match self {
            DataType::Ipv4Addr | DataType::Mark => 4,
            DataType::Ipv6Addr | DataType::IfName => 16,
            DataType::InetProto => 1,
            DataType::InetService => 2,
        }
    }

    /// nft's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Ipv4Addr => "ipv4_addr",
            DataType::Ipv6Addr => "ipv6_addr",
            DataType::InetProto => "inet_proto",
            DataType::InetService => "inet_service",
            DataType::Mark => "mark",
            DataType::IfName => "ifname",
        }
    }

    /// The id of a concatenation (`ipv4_addr . inet_service`), as nft folds it.
    pub(crate) fn concat_id(types: &[DataType]) -> u32 {
        types.iter().fold(0, |acc, t| (acc << TYPE_BITS) | t.id())
    }

    /// Splits a concatenated id back into its types; `None` for types not modelled here.
    pub(crate) fn split_id(mut id: u32) -> Option<Vec<DataType>> {
        let mut types = Vec::new();
        while id != 0 {
            types.push(DataType::from_id(id & ((1 << TYPE_BITS) - 1))?);
            id >>= TYPE_BITS;
        }
        types.reverse();
        (!types.is_empty()).then_some(types)
    }

    /// The key or data length of a (possibly concatenated) type: components of a
    /// concatenation each take whole 32-bit registers.
    pub(crate) fn total_len(types: &[DataType]) -> usize {
        match types {
            [one] => one.byte_len(),
            many => many.iter().map(|t| padded(t.byte_len())).sum(),
        }
    }
}

fn padded(len: usize) -> usize {
    (len + 3) & !3
}

/// One value of a set key or map data component.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Value {
    /// An `ipv4_addr`.
    Ipv4(Ipv4Addr),
    /// An `ipv6_addr`.
    Ipv6(Ipv6Addr),
    /// An `inet_proto`.
    Proto(L4Proto),
    /// An `inet_service`.
    Port(u16),
    /// A `mark`.
    Mark(u32),
    /// An `ifname`.
    IfName(String),
}

impl From<Ipv4Addr> for Value {
    fn from(a: Ipv4Addr) -> Value {
        Value::Ipv4(a)
    }
}

impl From<Ipv6Addr> for Value {
    fn from(a: Ipv6Addr) -> Value {
        Value::Ipv6(a)
    }
}

impl From<IpAddr> for Value {
    fn from(a: IpAddr) -> Value {
        match a {
            IpAddr::V4(a) => Value::Ipv4(a),
            IpAddr::V6(a) => Value::Ipv6(a),
        }
    }
}

impl From<L4Proto> for Value {
    fn from(p: L4Proto) -> Value {
        Value::Proto(p)
    }
}

impl Value {
    /// The type of this value.
    pub fn data_type(&self) -> DataType {
        match self {
            Value::Ipv4(_) => DataType::Ipv4Addr,
            Value::Ipv6(_) => DataType::Ipv6Addr,
            Value::Proto(_) => DataType::InetProto,
            Value::Port(_) => DataType::InetService,
            Value::Mark(_) => DataType::Mark,
            Value::IfName(_) => DataType::IfName,
        }
    }

    /// The value in register byte order (network order, except host-order marks).
    pub(crate) fn bytes(&self) -> Vec<u8> {
        match self {
            Value::Ipv4(a) => a.octets().to_vec(),
            Value::Ipv6(a) => a.octets().to_vec(),
            Value::Proto(p) => vec![p.number()],
            Value::Port(p) => p.to_be_bytes().to_vec(),
            Value::Mark(m) => m.to_ne_bytes().to_vec(),
            Value::IfName(n) => {
                let mut b = n.as_bytes().to_vec();
                b.resize(DataType::IfName.byte_len(), 0);
                b
            }
        }
    }

    fn parse(t: DataType, b: &[u8]) -> Option<Value> {
        Some(match t {
            DataType::Ipv4Addr => Value::Ipv4(Ipv4Addr::from(<[u8; 4]>::try_from(b).ok()?)),
            DataType::Ipv6Addr => Value::Ipv6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?)),
            DataType::InetProto => Value::Proto(L4Proto::from_number(*b.first()?)),
            DataType::InetService => Value::Port(u16::from_be_bytes(b.try_into().ok()?)),
            DataType::Mark => Value::Mark(u32::from_ne_bytes(b.try_into().ok()?)),
            DataType::IfName => Value::IfName(
                String::from_utf8_lossy(b.split(|c| *c == 0).next().unwrap_or_default())
                    .into_owned(),
            ),
        })
    }

    /// Encodes a (possibly concatenated) key or data: components of a concatenation are each
    /// padded to whole 32-bit registers, as the kernel lays them out.
    pub(crate) fn concat(values: &[Value]) -> Vec<u8> {
        if let [one] = values {
            return one.bytes();
        }
        let mut out = Vec::new();
        for v in values {
            let mut b = v.bytes();
            b.resize(padded(b.len()), 0);
            out.extend(b);
        }
        out
    }

    /// Decodes a (possibly concatenated) key or data of `types`.
    pub(crate) fn split(types: &[DataType], bytes: &[u8]) -> Option<Vec<Value>> {
        if let [one] = types {
            return Some(vec![Value::parse(*one, bytes.get(..one.byte_len())?)?]);
        }
        let mut out = Vec::new();
        let mut at = 0;
        for t in types {
            out.push(Value::parse(*t, bytes.get(at..at + t.byte_len())?)?);
            at += padded(t.byte_len());
        }
        Some(out)
    }
}

/// What a set holds besides its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetData {
    /// A plain set: keys only.
    None,
    /// A map to values of these (possibly concatenated) types.
    Values(Vec<DataType>),
    /// A verdict map.
    Verdict,
}

/// A named set or map of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    /// The name.
    pub name: String,
    /// The key's (possibly concatenated) types.
    pub key: Vec<DataType>,
    /// What the elements map to.
    pub data: SetData,
    /// `flags timeout`: its elements can be given a timeout, which is how
    /// [`Batch::expire_elements`](super::Batch::expire_elements) removes them without a
    /// deletion.
    pub timeout: bool,
}

impl Set {
    /// A set: `set NAME { type ipv4_addr . ipv4_addr; }`.
    pub fn new(name: &str, key: &[DataType]) -> Set {
        Set {
            name: name.to_string(),
            key: key.to_vec(),
            data: SetData::None,
            timeout: false,
        }
    }

    /// A map: `map NAME { type inet_proto . inet_service : ipv4_addr . inet_service; }`.
    pub fn map(name: &str, key: &[DataType], data: &[DataType]) -> Set {
        Set {
            name: name.to_string(),
            key: key.to_vec(),
            data: SetData::Values(data.to_vec()),
            timeout: false,
        }
    }

    /// A verdict map: `map NAME { type inet_proto : verdict; }`.
    pub fn verdict_map(name: &str, key: &[DataType]) -> Set {
        Set {
            name: name.to_string(),
            key: key.to_vec(),
            data: SetData::Verdict,
            timeout: false,
        }
    }

    /// `flags timeout;`: elements can be given a timeout (none of ours is, but a removal by
    /// [`Batch::expire_elements`](super::Batch::expire_elements) needs the flag).
    #[must_use]
    pub fn with_timeout(mut self) -> Set {
        self.timeout = true;
        self
    }

    /// The declaration as `nft` prints it, e.g. `map m { type inet_proto : verdict; }`.
    pub fn to_nft(&self) -> String {
        let names = |types: &[DataType]| {
            types
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(" . ")
        };
        let flags = if self.timeout { " flags timeout;" } else { "" };
        match &self.data {
            SetData::None => format!("set {} {{ type {};{flags} }}", self.name, names(&self.key)),
            SetData::Values(data) => format!(
                "map {} {{ type {} : {};{flags} }}",
                self.name,
                names(&self.key),
                names(data)
            ),
            SetData::Verdict => {
                format!(
                    "map {} {{ type {} : verdict;{flags} }}",
                    self.name,
                    names(&self.key)
                )
            }
        }
    }
}

/// What an element maps to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElementData {
    /// Map data: `: 10.0.0.2 . 80`.
    Values(Vec<Value>),
    /// Verdict map data: `: jump chain`.
    Verdict(Verdict),
}

/// An element of a set or map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// The (possibly concatenated) key.
    pub key: Vec<Value>,
    /// The data, for maps.
    pub data: Option<ElementData>,
    /// The comment (nftables element userdata).
    pub comment: Option<String>,
    /// The time left before the kernel's timeout removes it, as a listing or lookup reports
    /// it; `None` for an element without timeout (all that we add). An element
    /// [`Batch::expire_elements`](super::Batch::expire_elements) removed stays in effect
    /// until its timeout ends (at most one kernel tick): [`Element::is_expiring`].
    pub expires: Option<Duration>,
}

impl Element {
    /// A set element: `{ 10.0.0.1 . 10.0.0.1 }`.
    pub fn new(key: impl IntoIterator<Item = Value>) -> Element {
        Element {
            key: key.into_iter().collect(),
            data: None,
            comment: None,
            expires: None,
        }
    }

    /// Whether a timeout will remove the element: for our sets, whose elements have none, one
    /// that a removal expired, still in effect for at most [`Element::expires`]. A caller that
    /// adds the same key again waits that out first
    /// ([`Nft::element_settled`](super::Nft::element_settled)): adding an element that exists
    /// changes nothing, so the timeout would still remove it.
    pub fn is_expiring(&self) -> bool {
        self.expires.is_some()
    }

    /// Map data: `{ tcp . 8080 : 10.0.0.2 . 80 }`.
    #[must_use]
    pub fn to(mut self, data: impl IntoIterator<Item = Value>) -> Element {
        self.data = Some(ElementData::Values(data.into_iter().collect()));
        self
    }

    /// Verdict map data: `{ tcp : jump tcp_chain }`.
    #[must_use]
    pub fn to_verdict(mut self, verdict: Verdict) -> Element {
        self.data = Some(ElementData::Verdict(verdict));
        self
    }

    /// The element's comment: `{ tcp . 8080 comment "owner" : 10.0.0.2 . 80 }`.
    #[must_use]
    pub fn comment(mut self, comment: &str) -> Element {
        self.comment = Some(comment.to_string());
        self
    }
}
