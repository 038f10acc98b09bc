//! JSON pieces every result era shares, restated from Go's `pkg/types`: the `IPNet` and `net.IP`
//! string forms, `types.Route` and `types.DNS`.
//!
//! Addresses parse as Go's `types.ParseCIDR` does: the host bits stay (`10.0.0.2/24`), a zone or a
//! malformed prefix is an error, and an IPv4-mapped IPv6 address becomes plain IPv4 because Go's
//! `net.IP` cannot tell them apart (`::ffff:10.0.0.2/120` prints as `10.0.0.2/24`).

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use super::{Dns, Route};

/// Parses `addr/prefix` like Go's `types.ParseCIDR`, keeping the host bits.
pub(crate) fn parse_cidr(s: &str) -> Option<IpNet> {
    let (addr, prefix) = s.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    // Go's dtoi: decimal digits only, leading zeros allowed, no sign.
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix = prefix.bytes().fold(0u32, |n, b| {
        n.saturating_mul(10).saturating_add(u32::from(b - b'0'))
    });
    let bits = if addr.is_ipv4() { 32 } else { 128 };
    if prefix > bits {
        return None;
    }
    let prefix = u8::try_from(prefix).ok()?;
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            // Go keeps only the last four mask bytes for a 4-in-6 address.
            Some(v4) => Ipv4Net::new(v4, prefix.saturating_sub(96))
                .ok()
                .map(IpNet::V4),
            None => IpNet::new(addr, prefix).ok(),
        },
        IpAddr::V4(_) => IpNet::new(addr, prefix).ok(),
    }
}

/// Parses an address like Go's `net.ParseIP` (no zone; 4-in-6 becomes IPv4).
pub(crate) fn parse_ip(s: &str) -> Option<IpAddr> {
    s.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// An address with its prefix in Go's `types.IPNet` JSON form, `"10.0.0.2/24"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct GoIpNet(pub(crate) IpNet);

impl Serialize for GoIpNet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for GoIpNet {
    /// Go's `types.IPNet` decodes itself (`UnmarshalJSON`): every occurrence of its key goes
    /// through that, `null` too (`invalid CIDR address: `).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::decode::each::<D, Cidr>(deserializer).map(|c| c.0)
    }
}

/// The [`GoIpNet`] fields of the result types: Go hands a `null` of theirs to
/// `IPNet.UnmarshalJSON` (`invalid CIDR address: `), where a missing one is left zero.
pub(crate) const NULL_DECODED: &[(&str, &str)] = &[
    ("types020.IPConfig", "ip"),
    ("types040.IPConfig", "address"),
    ("types100.IPConfig", "address"),
    ("types.Route", "dst"),
];

/// One occurrence of a [`GoIpNet`].
struct Cidr(GoIpNet);

impl<'de> Deserialize<'de> for Cidr {
    /// Go's `IPNet.UnmarshalJSON` decodes a string, which `null` leaves empty.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = Option::<String>::deserialize(deserializer)?.unwrap_or_default();
        parse_cidr(&s)
            .map(|net| Cidr(GoIpNet(net)))
            .ok_or_else(|| de::Error::custom(format!("invalid CIDR address: {s}")))
    }
}

/// A plain address in Go's `net.IP` JSON form, `"10.0.0.1"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GoIp(pub(crate) IpAddr);

impl Serialize for GoIp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for GoIp {
    /// Go's `net.IP` decodes itself from text (`UnmarshalText`): every occurrence of its key
    /// goes through that (a `null` resets the field instead: it is a `nullable` one).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::decode::each::<D, Ip>(deserializer).map(|ip| ip.0)
    }
}

/// One occurrence of a [`GoIp`].
struct Ip(GoIp);

impl<'de> Deserialize<'de> for Ip {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        parse_ip(&s)
            .map(|ip| Ip(GoIp(ip)))
            .ok_or_else(|| de::Error::custom(format!("invalid IP address: {s}")))
    }
}

/// An IP's `interface`, Go's `*int`: `null` resets it, `-0` and `1.0` are 0 and 1 in a
/// prevResult (its numbers went through a float), a negative index is refused (Go keeps it;
/// the top-level README lists this).
pub(crate) fn interface_index<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<usize>, D::Error> {
    match crate::decode::nullable::<D, i64>(deserializer)? {
        None => Ok(None),
        Some(index) => usize::try_from(index)
            .map(Some)
            .map_err(|_| de::Error::custom(format!("negative interface index {index}"))),
    }
}

/// A result's `interfaces`, Go's `[]*T`: a `null` element is a nil pointer there, which Go
/// prints back as `null` where a plugin passes the result on untouched and crashes on where
/// one reads it. Our model has no nil element: such a result is refused, naming the element
/// (the top-level README lists this).
pub(crate) fn pointers<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Element<T>(Option<T>);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Element<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            crate::decode::nullable(deserializer).map(Element)
        }
    }

    // A slice: a later `null` resets it, after its earlier occurrences decoded.
    crate::decode::nullable::<D, Vec<Element<T>>>(deserializer)?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, element)| {
            element
                .0
                .ok_or_else(|| de::Error::custom(format!("element {i} is null")))
        })
        .collect()
}

/// A value of a Go type that decodes itself (`UnmarshalJSON`: `types.Route` and each era's
/// `IPConfig`), building the value afresh from each occurrence: of several (keys differing in
/// case, or the same element of several arrays) each is decoded and the last is the value,
/// where a plain struct would merge them.
struct Whole<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Whole<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::decode::each(deserializer).map(Whole)
    }
}

/// A result's `ips` or `routes`, Go's `[]*T` of a type that decodes itself ([`Whole`]);
/// otherwise as [`pointers`].
pub(crate) fn whole_pointers<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    pointers::<D, Whole<T>>(deserializer).map(|v| v.into_iter().map(|w| w.0).collect())
}

/// A 0.2.0 block's `routes`, Go's `[]types.Route` ([`Whole`] elements; a `null` one is a
/// zero route, which our model refuses: it has no `dst`).
pub(crate) fn wholes<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    crate::decode::nullable::<D, Vec<Whole<T>>>(deserializer)
        .map(|v| v.unwrap_or_default().into_iter().map(|w| w.0).collect())
}

/// A 0.2.0 result's `ip4` or `ip6`, Go's `*IPConfig` ([`Whole`]): `null` resets it.
pub(crate) fn whole_pointer<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    crate::decode::nullable::<D, Whole<T>>(deserializer).map(|o| o.map(|w| w.0))
}

pub(crate) fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Go's omitempty for a string: an empty one is left out as if unset.
pub(crate) fn non_empty(s: &Option<String>) -> Option<String> {
    s.as_ref().filter(|s| !s.is_empty()).cloned()
}

/// Go's `types.Route` on the wire; the int fields are omitted when zero, `table` and `scope`
/// are pointers and print even when zero.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename = "types.Route")]
pub(crate) struct RouteWire {
    pub(crate) dst: GoIpNet,
    // Go's `net.IP`, a slice: a null resets it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::decode::nullable"
    )]
    pub(crate) gw: Option<GoIp>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) mtu: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) advmss: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) priority: u32,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::decode::nullable"
    )]
    pub(crate) table: Option<u32>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::decode::nullable"
    )]
    pub(crate) scope: Option<i32>,
}

impl From<RouteWire> for Route {
    fn from(w: RouteWire) -> Self {
        let set = |n: u32| (n != 0).then_some(n);
        Route {
            dst: w.dst.0,
            gw: w.gw.map(|g| g.0),
            mtu: set(w.mtu),
            advmss: set(w.advmss),
            priority: set(w.priority),
            table: w.table,
            scope: w.scope,
        }
    }
}

impl From<&Route> for RouteWire {
    fn from(r: &Route) -> Self {
        RouteWire {
            dst: GoIpNet(r.dst),
            gw: r.gw.map(GoIp),
            mtu: r.mtu.unwrap_or(0),
            advmss: r.advmss.unwrap_or(0),
            priority: r.priority.unwrap_or(0),
            table: r.table,
            scope: r.scope,
        }
    }
}

/// Go's `types.DNS` on the wire, every key omitted when empty.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename = "types.DNS")]
pub(crate) struct DnsWire {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) nameservers: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) domain: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) search: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) options: Vec<String>,
}

impl DnsWire {
    /// Go's `DNS.IsEmpty`: 1.x results leave out a `dns` for which this holds.
    pub(crate) fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

impl From<DnsWire> for Dns {
    fn from(w: DnsWire) -> Self {
        Dns {
            nameservers: w.nameservers,
            domain: w.domain,
            search: w.search,
            options: w.options,
        }
    }
}

impl From<&Dns> for DnsWire {
    fn from(d: &Dns) -> Self {
        DnsWire {
            nameservers: d.nameservers.clone(),
            domain: non_empty(&d.domain),
            search: d.search.clone(),
            options: d.options.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_like_go_and_keep_their_host_bits() {
        let cases = [
            ("10.0.0.2/24", Some("10.0.0.2/24")),
            ("10.0.0.2/024", Some("10.0.0.2/24")),
            ("0.0.0.0/0", Some("0.0.0.0/0")),
            ("fd00::2/64", Some("fd00::2/64")),
            ("FD00:0:0::2/64", Some("fd00::2/64")),
            ("::ffff:10.0.0.2/120", Some("10.0.0.2/24")),
            ("::ffff:10.0.0.2/64", Some("10.0.0.2/0")),
            ("10.0.0.2", None),
            ("10.0.0.2/", None),
            ("10.0.0.2/33", None),
            ("10.0.0.2/+24", None),
            ("10.0.0.2/24/1", None),
            ("10.0.0.256/24", None),
            ("010.0.0.2/24", None),
            ("fd00::2/129", None),
            ("fe80::1%eth0/64", None),
            ("/24", None),
            ("", None),
        ];
        for (input, want) in cases {
            let got = parse_cidr(input).map(|n| n.to_string());
            assert_eq!(got.as_deref(), want, "{input:?}");
        }
    }

    #[test]
    fn ips_parse_like_go_with_four_in_six_folded_to_ipv4() {
        let cases = [
            ("10.0.0.1", Some("10.0.0.1")),
            ("fd00::1", Some("fd00::1")),
            ("::ffff:192.0.2.1", Some("192.0.2.1")),
            ("fe80::1%eth0", None),
            ("10.0.0.1/24", None),
            ("010.0.0.1", None),
            ("host", None),
        ];
        for (input, want) in cases {
            let got = parse_ip(input).map(|ip| ip.to_string());
            assert_eq!(got.as_deref(), want, "{input:?}");
        }
    }

    #[test]
    fn route_int_fields_mean_unset_when_zero_but_table_and_scope_keep_zero() {
        let wire: RouteWire = crate::decode::from_value(serde_json::json!({
            "dst": "10.0.0.0/8", "mtu": 0, "advmss": 0, "priority": 0, "table": 0, "scope": 0
        }))
        .unwrap();
        let route = Route::from(wire);
        assert_eq!(
            (route.mtu, route.advmss, route.priority),
            (None, None, None)
        );
        assert_eq!((route.table, route.scope), (Some(0), Some(0)));
        let back = serde_json::to_value(RouteWire::from(&route)).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"dst": "10.0.0.0/8", "table": 0, "scope": 0})
        );
    }

    #[test]
    fn an_empty_domain_is_left_out_like_go_omitempty() {
        let dns = Dns {
            domain: Some(String::new()),
            ..Dns::default()
        };
        assert!(DnsWire::from(&dns).is_empty());
    }
}
