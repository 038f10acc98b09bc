//! Configuration: the wire keys (decoded as Go does) → a validated [`Config`] (pure).

use std::net::IpAddr;

use cni::conf::NetConf;
use cni::error::CniError;
use cni::types::CniResult;
use ipnet::IpNet;
use netfilter::nft::L4Proto;
use serde::Deserialize;

use crate::error::PortmapError;

/// The plugin's own keys, as sent (the serde name is the reference's Go type, which Go's decode
/// errors name).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename = "PortMapConf")]
pub struct PortmapKeys {
    // Go pointers (a later null resets them), but `masqAll`, a bool.
    #[serde(deserialize_with = "cni::decode::nullable")]
    backend: Option<String>,
    #[serde(deserialize_with = "cni::decode::nullable")]
    snat: Option<bool>,
    #[serde(rename = "masqAll")]
    masq_all: Option<bool>,
    #[serde(rename = "markMasqBit", deserialize_with = "cni::decode::nullable")]
    mark_masq_bit: Option<i64>,
    #[serde(
        rename = "externalSetMarkChain",
        deserialize_with = "cni::decode::nullable"
    )]
    external_set_mark_chain: Option<String>,
    #[serde(rename = "conditionsV4", deserialize_with = "cni::decode::nullable")]
    conditions_v4: Option<Vec<String>>,
    #[serde(rename = "conditionsV6", deserialize_with = "cni::decode::nullable")]
    conditions_v6: Option<Vec<String>>,
    /// Decoded with the rest, as Go decodes its struct: of two values of the wrong type, one
    /// here and one elsewhere, the first in the document is the one reported.
    #[serde(rename = "runtimeConfig")]
    runtime_config: RuntimeConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(
    default,
    rename = "struct { PortMaps []main.PortMapEntry \"json:\\\"portMappings,omitempty\\\"\" }"
)]
struct RuntimeConfig {
    // A Go slice: a `null` resets it.
    #[serde(rename = "portMappings", deserialize_with = "cni::decode::nullable")]
    port_mappings: Option<Vec<WireMapping>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename = "main.PortMapEntry")]
struct WireMapping {
    #[serde(rename = "hostPort")]
    host_port: i64,
    #[serde(rename = "containerPort")]
    container_port: i64,
    protocol: String,
    #[serde(rename = "hostIP")]
    host_ip: Option<String>,
}

/// The default `markMasqBit`.
pub const DEFAULT_MARK_MASQ_BIT: u32 = 13;

/// Which mechanism programs the mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Native nftables maps over netlink.
    Nftables,
    /// The reference's iptables layout through `iptables-restore`.
    Iptables,
}

/// The backend as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// Named in the config.
    Fixed(Backend),
    /// Absent, `null` or `""`: the reference's rule (iptables when its tools are usable,
    /// else nftables), unless options of one backend are set.
    Auto,
}

/// A transport protocol of a mapping.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// `tcp`.
    Tcp,
    /// `udp`.
    Udp,
    /// `sctp`.
    Sctp,
}

impl Proto {
    /// The name iptables and nft use.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }

    /// The nftables protocol value.
    pub fn l4(self) -> L4Proto {
        match self {
            Proto::Tcp => L4Proto::Tcp,
            Proto::Udp => L4Proto::Udp,
            Proto::Sctp => L4Proto::Sctp,
        }
    }
}

/// Which host addresses a mapping listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum HostIp {
    /// No `hostIP`: every local address of both families.
    All,
    /// `0.0.0.0` or `::`: every local address of that family only.
    Any(IpFamily),
    /// One host address.
    Addr(IpAddr),
}

/// An IP family.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpFamily {
    /// Both families, IPv4 first.
    pub const BOTH: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    /// The family of `addr`.
    pub fn of(addr: IpAddr) -> IpFamily {
        if addr.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }
}

/// The nf_tables table family holding a family's mappings (`ip`, `ip6`).
impl From<IpFamily> for netfilter::nft::Family {
    fn from(family: IpFamily) -> Self {
        match family {
            IpFamily::V4 => netfilter::nft::Family::Ip,
            IpFamily::V6 => netfilter::nft::Family::Ip6,
        }
    }
}

/// The IP version of rule expressions and NAT statements.
impl From<IpFamily> for netfilter::nft::NfProto {
    fn from(family: IpFamily) -> Self {
        match family {
            IpFamily::V4 => netfilter::nft::NfProto::Ipv4,
            IpFamily::V6 => netfilter::nft::NfProto::Ipv6,
        }
    }
}

/// The address type of a family's keys (`ipv4_addr`, `ipv6_addr`).
impl From<IpFamily> for netfilter::nft::DataType {
    fn from(family: IpFamily) -> Self {
        match family {
            IpFamily::V4 => netfilter::nft::DataType::Ipv4Addr,
            IpFamily::V6 => netfilter::nft::DataType::Ipv6Addr,
        }
    }
}

/// The iptables tools of a family (`iptables`, `ip6tables`).
impl From<IpFamily> for netfilter::iptables::Family {
    fn from(family: IpFamily) -> Self {
        match family {
            IpFamily::V4 => netfilter::iptables::Family::V4,
            IpFamily::V6 => netfilter::iptables::Family::V6,
        }
    }
}

impl From<netfilter::iptables::Family> for IpFamily {
    fn from(family: netfilter::iptables::Family) -> Self {
        match family {
            netfilter::iptables::Family::V4 => IpFamily::V4,
            netfilter::iptables::Family::V6 => IpFamily::V6,
        }
    }
}

impl HostIp {
    /// Whether the mapping applies to a container address of `family`.
    pub fn applies_to(self, family: IpFamily) -> bool {
        match self {
            HostIp::All => true,
            HostIp::Any(f) => f == family,
            HostIp::Addr(a) => IpFamily::of(a) == family,
        }
    }

    /// The specific address, if any.
    pub fn addr(self) -> Option<IpAddr> {
        match self {
            HostIp::Addr(a) => Some(a),
            _ => None,
        }
    }
}

/// One validated port mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PortMapping {
    /// The host port.
    pub host_port: u16,
    /// The container port.
    pub container_port: u16,
    /// The protocol.
    pub proto: Proto,
    /// The host addresses.
    pub host_ip: HostIp,
}

impl PortMapping {
    /// The host port it claims, as messages name it: `tcp/8080` or `10.1.1.1 tcp/8080`.
    pub fn host_port_name(&self) -> String {
        match self.host_ip.addr() {
            Some(a) => format!("{a} {}/{}", self.proto.name(), self.host_port),
            None => format!("{}/{}", self.proto.name(), self.host_port),
        }
    }
}

/// One nftables condition of the supported subset.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NftCondition {
    /// `ip saddr 10.0.0.0/8`, `ip6 saddr fd00::/8`.
    Saddr(IpNet),
    /// `ip daddr …`, `ip6 daddr …`.
    Daddr(IpNet),
    /// `iifname "eth0"`.
    IifName(String),
    /// `oifname "eth0"`.
    OifName(String),
    /// `meta mark 0x10` (or `mark 0x10`).
    Mark(u32),
}

/// The extra match conditions of one family.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Conditions {
    /// None.
    #[default]
    None,
    /// iptables arguments, appended to the entry rules.
    Iptables(Vec<String>),
    /// nftables matches, gating this attachment's mappings.
    Nftables(Vec<NftCondition>),
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The network name.
    pub network: String,
    /// The backend as configured.
    pub backend: BackendChoice,
    /// Masquerade hairpin and localhost traffic (and set `route_localnet`).
    pub snat: bool,
    /// Masquerade every source of mapped traffic.
    pub masq_all: bool,
    /// The iptables masquerade mark bit.
    pub mark_masq_bit: u32,
    /// The iptables chain to jump to instead of `CNI-HOSTPORT-SETMARK`.
    pub external_set_mark_chain: Option<String>,
    /// `conditionsV4`.
    pub conditions_v4: Conditions,
    /// `conditionsV6`.
    pub conditions_v6: Conditions,
    /// `runtimeConfig.portMappings`.
    pub mappings: Vec<PortMapping>,
}

impl Config {
    /// Whether an option only the iptables layout has is set: `externalSetMarkChain`, or
    /// iptables conditions.
    pub fn iptables_only(&self) -> bool {
        self.external_set_mark_chain.is_some()
            || matches!(self.conditions_v4, Conditions::Iptables(_))
            || matches!(self.conditions_v6, Conditions::Iptables(_))
    }

    /// Whether an option only the nftables layout has is set: nftables conditions.
    pub fn nftables_only(&self) -> bool {
        matches!(self.conditions_v4, Conditions::Nftables(_))
            || matches!(self.conditions_v6, Conditions::Nftables(_))
    }

    /// A configuration of `network` with `mappings` and the defaults (`snat`), with
    /// `masq_all` as given: what a DEL without a record plans its lookups from.
    pub fn for_removal(network: &str, mappings: &[PortMapping], masq_all: bool) -> Config {
        Config {
            network: network.to_string(),
            backend: BackendChoice::Fixed(Backend::Nftables),
            snat: true,
            masq_all,
            mark_masq_bit: DEFAULT_MARK_MASQ_BIT,
            external_set_mark_chain: None,
            conditions_v4: Conditions::None,
            conditions_v6: Conditions::None,
            mappings: mappings.to_vec(),
        }
    }

    /// The mappings that apply to a container address of `family`.
    pub fn mappings_for(&self, family: IpFamily) -> Vec<&PortMapping> {
        self.mappings
            .iter()
            .filter(|m| m.host_ip.applies_to(family))
            .collect()
    }

    /// The conditions of `family`.
    pub fn conditions(&self, family: IpFamily) -> &Conditions {
        match family {
            IpFamily::V4 => &self.conditions_v4,
            IpFamily::V6 => &self.conditions_v6,
        }
    }
}

/// A configuration of network `net` with the reference's defaults and `mappings`, for the
/// unit tests of the modules that plan from one.
#[cfg(test)]
pub(crate) fn test_config(mappings: Vec<PortMapping>) -> Config {
    Config {
        network: "net".into(),
        backend: BackendChoice::Auto,
        snat: true,
        masq_all: false,
        mark_masq_bit: DEFAULT_MARK_MASQ_BIT,
        external_set_mark_chain: None,
        conditions_v4: Conditions::None,
        conditions_v6: Conditions::None,
        mappings,
    }
}

/// A configuration error: `msg` as the reference words it where it refuses the same input,
/// `details` naming the field and value.
fn invalid(msg: impl Into<String>, details: impl Into<String>) -> PortmapError {
    PortmapError::Config {
        msg: msg.into(),
        details: details.into(),
    }
}

/// Classifies a raw conditions list as the reference does: by its first token.
fn classify(raw: &Option<Vec<String>>) -> Option<Backend> {
    let first = raw.as_ref()?.first()?;
    if first.is_empty() {
        return None;
    }
    if first.starts_with('-') || first.starts_with('!') {
        Some(Backend::Iptables)
    } else {
        Some(Backend::Nftables)
    }
}

/// Validates the decoded configuration.
///
/// # Errors
/// Code 7 with the reference's message where it has one, naming the offending key or mapping
/// entry in the details.
pub fn parse(conf: &NetConf<PortmapKeys>) -> Result<Config, CniError> {
    let rc = &conf.plugin.runtime_config;
    let mappings = rc.port_mappings.as_deref().unwrap_or_default();
    Ok(validate(&conf.name, &conf.plugin, mappings)?)
}

/// `prevResult`, parsed as the reference's `parseConfig` does, whose failure it words
/// `could not parse prevResult: ` around the library's own `could not parse prevResult: …`.
///
/// # Errors
/// Code 6.
pub fn prev_result<T>(conf: &NetConf<T>) -> Result<Option<CniResult>, CniError> {
    conf.prev_result()
        .map_err(|e| e.led_by("could not parse prevResult"))
}

/// A configuration that does not decode, led as the reference's `parseConfig` leads it
/// (`failed to parse network configuration: json: cannot unmarshal …`); the decoder already
/// words the rest as Go does, our path in details.
#[must_use]
pub fn decode_error(err: CniError) -> CniError {
    err.with_decode_lead("failed to parse network configuration")
}

/// The mappings of a DEL's `runtimeConfig`, leniently: an entry that does not decode or
/// validate is left out, and nothing else of the configuration is read. A DEL must work for a
/// container whatever was wrong with the config it is sent.
pub fn del_mappings<T>(conf: &NetConf<T>) -> Vec<PortMapping> {
    /// `runtimeConfig` with each mapping kept as text, to decode them one by one.
    #[derive(Default, Deserialize)]
    #[serde(default)]
    struct Entries {
        #[serde(rename = "portMappings")]
        port_mappings: Vec<cni::decode::RawJson>,
    }
    let entries = conf
        .runtime_config
        .as_ref()
        .and_then(|raw| raw.decode::<Entries>().ok())
        .unwrap_or_default();
    entries
        .port_mappings
        .iter()
        .enumerate()
        .filter_map(|(i, raw)| {
            let wire: WireMapping = raw.decode().ok()?;
            validate_mapping(i, &wire).ok()
        })
        .collect()
}

fn validate(
    network: &str,
    keys: &PortmapKeys,
    wire: &[WireMapping],
) -> Result<Config, PortmapError> {
    if let (Some(bit), Some(chain)) = (keys.mark_masq_bit, &keys.external_set_mark_chain) {
        return Err(invalid(
            "Cannot specify externalSetMarkChain and markMasqBit",
            format!("markMasqBit {bit} and externalSetMarkChain {chain:?} are both set"),
        ));
    }
    let mark_masq_bit = match keys.mark_masq_bit {
        None => DEFAULT_MARK_MASQ_BIT,
        Some(b) => u32::try_from(b).ok().filter(|b| *b <= 31).ok_or_else(|| {
            invalid(
                "MasqMarkBit must be between 0 and 31",
                format!("markMasqBit is {b}"),
            )
        })?,
    };
    let v4_kind = classify(&keys.conditions_v4);
    let v6_kind = classify(&keys.conditions_v6);
    let mut ipt_only = Vec::new();
    let mut nft_only = Vec::new();
    if keys.external_set_mark_chain.is_some() {
        ipt_only.push("externalSetMarkChain");
    }
    for (key, kind) in [("conditionsV4", v4_kind), ("conditionsV6", v6_kind)] {
        match kind {
            Some(Backend::Iptables) => ipt_only.push(key),
            Some(Backend::Nftables) => nft_only.push(key),
            None => {}
        }
    }
    let list = |v: &[&str]| format!("[{}]", v.join(" "));
    let backend = match keys.backend.as_deref() {
        None => {
            if !ipt_only.is_empty() && !nft_only.is_empty() {
                return Err(invalid(
                    "configuration mixes iptables-specific and nftables-specific options",
                    format!(
                        "iptables-specific: {}, nftables-specific: {}",
                        list(&ipt_only),
                        list(&nft_only)
                    ),
                ));
            }
            BackendChoice::Auto
        }
        Some("nftables") => BackendChoice::Fixed(Backend::Nftables),
        Some("iptables") => BackendChoice::Fixed(Backend::Iptables),
        Some(other) => {
            return Err(invalid(
                format!("unrecognized backend {other:?}"),
                "backend must be \"iptables\", \"nftables\", or absent for auto",
            ));
        }
    };
    match backend {
        BackendChoice::Fixed(Backend::Iptables) if !nft_only.is_empty() => {
            return Err(invalid(
                format!(
                    "iptables backend was requested but configuration contains nftables-specific options {}",
                    list(&nft_only)
                ),
                "",
            ));
        }
        BackendChoice::Fixed(Backend::Nftables) if !ipt_only.is_empty() => {
            return Err(invalid(
                format!(
                    "nftables backend was requested but configuration contains iptables-specific options {}",
                    list(&ipt_only)
                ),
                "",
            ));
        }
        _ => {}
    }
    let conditions = |key: &str, raw: &Option<Vec<String>>, kind, family| match kind {
        None => Ok(Conditions::None),
        Some(Backend::Iptables) => Ok(Conditions::Iptables(raw.clone().unwrap_or_default())),
        Some(Backend::Nftables) => {
            parse_nft_conditions(key, raw.as_deref().unwrap_or_default(), family)
                .map(Conditions::Nftables)
        }
    };
    let conditions_v4 = conditions("conditionsV4", &keys.conditions_v4, v4_kind, IpFamily::V4)?;
    let conditions_v6 = conditions("conditionsV6", &keys.conditions_v6, v6_kind, IpFamily::V6)?;
    // The reference's own checks of every entry first, so its message wins where it refuses.
    for (i, m) in wire.iter().enumerate() {
        reference_port_checks(i, m)?;
    }
    // The reference hands iptables conditions to iptables as arguments, which refuses an
    // empty one (when there is work for the family, after the chains were made); nftables
    // conditions are text, where it is nothing. A list led by an empty entry is no backend's:
    // the reference passes it on as iptables arguments.
    for (key, raw, kind) in [
        ("conditionsV4", &keys.conditions_v4, v4_kind),
        ("conditionsV6", &keys.conditions_v6, v6_kind),
    ] {
        if kind == Some(Backend::Nftables) {
            continue;
        }
        if let Some(i) = raw.iter().flatten().position(String::is_empty) {
            return Err(invalid(
                format!("empty iptables condition in {key}"),
                format!("{key}[{i}] is \"\": iptables refuses an empty argument"),
            ));
        }
    }
    let mappings = wire
        .iter()
        .enumerate()
        .map(|(i, m)| validate_mapping(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Config {
        network: network.to_string(),
        backend,
        snat: keys.snat.unwrap_or(true),
        masq_all: keys.masq_all.unwrap_or(false),
        mark_masq_bit,
        external_set_mark_chain: keys.external_set_mark_chain.clone(),
        conditions_v4,
        conditions_v6,
        mappings,
    })
}

/// The reference's checks of an entry: the container port, then the host port, positive.
fn reference_port_checks(i: usize, m: &WireMapping) -> Result<(), PortmapError> {
    if m.container_port <= 0 {
        return Err(invalid(
            format!("Invalid container port number: {}", m.container_port),
            format!("runtimeConfig.portMappings[{i}].containerPort must be 1-65535"),
        ));
    }
    if m.host_port <= 0 {
        return Err(invalid(
            format!("Invalid host port number: {}", m.host_port),
            format!("runtimeConfig.portMappings[{i}].hostPort must be 1-65535"),
        ));
    }
    Ok(())
}

/// One entry, validated: the reference's checks and ours (ports up to 65535, the protocol,
/// the host address).
fn validate_mapping(i: usize, m: &WireMapping) -> Result<PortMapping, PortmapError> {
    reference_port_checks(i, m)?;
    let port = |n: i64, key: &str, what: &str| {
        u16::try_from(n).map_err(|_| {
            invalid(
                format!("{what} port number {n} is out of range"),
                format!("runtimeConfig.portMappings[{i}].{key} must be 1-65535"),
            )
        })
    };
    let container_port = port(m.container_port, "containerPort", "container")?;
    let host_port = port(m.host_port, "hostPort", "host")?;
    let proto = match m.protocol.to_ascii_lowercase().as_str() {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        "sctp" => Proto::Sctp,
        _ => {
            return Err(invalid(
                format!("unsupported protocol {:?}", m.protocol),
                format!("runtimeConfig.portMappings[{i}].protocol must be tcp, udp or sctp"),
            ));
        }
    };
    let host_ip = match m.host_ip.as_deref() {
        None => HostIp::All,
        // An IPv4-mapped IPv6 address is the IPv4 address, as Go's net.ParseIP reads it.
        Some(s) => match s.parse::<IpAddr>().map(|a| a.to_canonical()) {
            Ok(a) if a.is_unspecified() => HostIp::Any(IpFamily::of(a)),
            Ok(a) => HostIp::Addr(a),
            Err(_) => {
                return Err(invalid(
                    format!("invalid hostIP {s:?}"),
                    format!(
                        "runtimeConfig.portMappings[{i}].hostIP must be an IPv4 or IPv6 address without zone"
                    ),
                ));
            }
        },
    };
    Ok(PortMapping {
        host_port,
        container_port,
        proto,
        host_ip,
    })
}

/// Parses nftables conditions: the entries are joined with spaces and read as a sequence of
/// `ip|ip6 saddr|daddr ADDR[/LEN]`, `iifname NAME`, `oifname NAME`, `[meta] mark VALUE`.
fn parse_nft_conditions(
    key: &str,
    raw: &[String],
    family: IpFamily,
) -> Result<Vec<NftCondition>, PortmapError> {
    let text = raw.join(" ");
    let mut tokens = text.split_whitespace().peekable();
    let mut out = Vec::new();
    let bad = |token: &str, why: &str| {
        invalid(
            format!("unsupported nftables condition {token:?} in {key}"),
            format!(
                "{why}; supported: ip/ip6 saddr/daddr ADDR[/LEN], iifname NAME, oifname NAME, meta mark VALUE"
            ),
        )
    };
    while let Some(token) = tokens.next() {
        match token {
            "ip" | "ip6" => {
                let want = if token == "ip" {
                    IpFamily::V4
                } else {
                    IpFamily::V6
                };
                if want != family {
                    return Err(bad(token, "wrong address family for this list"));
                }
                let dir = tokens
                    .next()
                    .ok_or_else(|| bad(token, "missing saddr/daddr"))?;
                let value = tokens.next().ok_or_else(|| bad(dir, "missing address"))?;
                if value == "!=" {
                    return Err(bad(value, "negation is not supported"));
                }
                let net = parse_net(value, family)
                    .ok_or_else(|| bad(value, "not an address or prefix of this family"))?;
                out.push(match dir {
                    "saddr" => NftCondition::Saddr(net),
                    "daddr" => NftCondition::Daddr(net),
                    _ => return Err(bad(dir, "expected saddr or daddr")),
                });
            }
            "iifname" | "oifname" => {
                let value = tokens
                    .next()
                    .ok_or_else(|| bad(token, "missing interface name"))?;
                let name = value.trim_matches('"');
                if value == "!=" || name.is_empty() || name.len() > 15 || name.contains('*') {
                    return Err(bad(value, "expected an exact interface name of 1-15 bytes"));
                }
                out.push(if token == "iifname" {
                    NftCondition::IifName(name.to_string())
                } else {
                    NftCondition::OifName(name.to_string())
                });
            }
            "meta" | "mark" => {
                if token == "meta" && tokens.next_if_eq(&"mark").is_none() {
                    return Err(bad(token, "only meta mark is supported"));
                }
                let value = tokens
                    .next()
                    .ok_or_else(|| bad(token, "missing mark value"))?;
                let mark = parse_u32(value).ok_or_else(|| bad(value, "expected a mark number"))?;
                out.push(NftCondition::Mark(mark));
            }
            other => return Err(bad(other, "unknown token")),
        }
    }
    Ok(out)
}

fn parse_net(s: &str, family: IpFamily) -> Option<IpNet> {
    let net = s
        .parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))?;
    (IpFamily::of(net.addr()) == family).then_some(net)
}

fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The container's addresses (with prefix) picked from `prevResult` as the reference does:
/// the first IPv4 and the first IPv6 whose interface, when its index is valid, is `ifname`
/// inside a sandbox.
pub fn container_ips(prev: &CniResult, ifname: &str) -> (Option<IpNet>, Option<IpNet>) {
    let mut v4 = None;
    let mut v6 = None;
    for ip in &prev.ips {
        if let Some(iface) = ip.interface.and_then(|i| prev.interfaces.get(i)) {
            let in_sandbox = iface.sandbox.as_deref().is_some_and(|s| !s.is_empty());
            if iface.name != ifname || !in_sandbox {
                continue;
            }
        }
        let slot = if ip.address.addr().is_ipv4() {
            &mut v4
        } else {
            &mut v6
        };
        if slot.is_none() {
            *slot = Some(ip.address);
        }
    }
    (v4, v6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(v: serde_json::Value) -> Result<Config, CniError> {
        let mut v = v;
        v["name"] = json!("net");
        v["cniVersion"] = json!("1.0.0");
        v["type"] = json!("portmap");
        let conf: NetConf<PortmapKeys> = NetConf::from_value(v)?;
        parse(&conf)
    }

    fn err(v: serde_json::Value) -> String {
        err_details(v).0
    }

    /// The error's (msg, details).
    fn err_details(v: serde_json::Value) -> (String, String) {
        let e = conf(v).expect_err("must fail");
        assert_eq!(e.code.as_u32(), 7, "{}", e.msg);
        (e.msg, e.details)
    }

    #[test]
    fn defaults_match_the_reference() {
        let c = conf(json!({})).unwrap();
        assert!(c.snat);
        assert!(!c.masq_all);
        assert_eq!(c.mark_masq_bit, 13);
        assert_eq!(c.backend, BackendChoice::Auto);
        assert!(c.mappings.is_empty());
    }

    #[test]
    fn keys_match_case_insensitively_and_protocols_in_any_case() {
        let c = conf(json!({"SNAT": false, "runtimeConfig": {"portMappings": [
            {"HostPort": 8080, "ContainerPort": 80, "Protocol": "TCP", "HostIP": "10.1.1.1"}
        ]}}))
        .unwrap();
        assert!(!c.snat);
        assert_eq!(
            c.mappings,
            vec![PortMapping {
                host_port: 8080,
                container_port: 80,
                proto: Proto::Tcp,
                host_ip: HostIp::Addr("10.1.1.1".parse().unwrap()),
            }]
        );
    }

    #[test]
    fn wildcard_host_ips_bind_their_own_family_only() {
        let c = conf(json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 1, "containerPort": 1, "protocol": "udp", "hostIP": "0.0.0.0"},
            {"hostPort": 2, "containerPort": 1, "protocol": "udp", "hostIP": "::"},
            {"hostPort": 3, "containerPort": 1, "protocol": "udp", "hostIP": ""}
        ]}}))
        .unwrap();
        assert!(c.mappings[0].host_ip.applies_to(IpFamily::V4));
        assert!(!c.mappings[0].host_ip.applies_to(IpFamily::V6));
        assert!(c.mappings[1].host_ip.applies_to(IpFamily::V6));
        assert!(!c.mappings[1].host_ip.applies_to(IpFamily::V4));
        assert_eq!(c.mappings[2].host_ip, HostIp::All);
    }

    #[test]
    fn an_ipv4_mapped_host_ip_is_the_ipv4_address_as_in_go() {
        let c = conf(json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 1, "containerPort": 1, "protocol": "tcp", "hostIP": "::ffff:1.2.3.4"},
            {"hostPort": 2, "containerPort": 1, "protocol": "tcp", "hostIP": "::ffff:0.0.0.0"}
        ]}}))
        .unwrap();
        assert_eq!(
            c.mappings[0].host_ip,
            HostIp::Addr("1.2.3.4".parse().unwrap())
        );
        assert_eq!(c.mappings[1].host_ip, HostIp::Any(IpFamily::V4));
    }

    #[test]
    fn port_errors_are_the_references_messages_with_the_entry_in_details() {
        let cases = [
            (
                json!({"hostPort": 0, "containerPort": 80, "protocol": "tcp"}),
                "Invalid host port number: 0",
                "runtimeConfig.portMappings[1].hostPort must be 1-65535",
            ),
            (
                json!({"hostPort": 80, "containerPort": -1, "protocol": "tcp"}),
                "Invalid container port number: -1",
                "runtimeConfig.portMappings[1].containerPort must be 1-65535",
            ),
            // The reference checks the container port first.
            (
                json!({"hostPort": -5, "containerPort": 0, "protocol": "tcp"}),
                "Invalid container port number: 0",
                "runtimeConfig.portMappings[1].containerPort must be 1-65535",
            ),
        ];
        for (mapping, msg, details) in cases {
            let ok = json!({"hostPort": 1, "containerPort": 1, "protocol": "tcp"});
            let got = err_details(json!({"runtimeConfig": {"portMappings": [ok, mapping]}}));
            assert_eq!(got, (msg.to_string(), details.to_string()));
        }
        // Its message wins over ours when an earlier entry is refused only by us.
        let got = err(json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 1, "containerPort": 1, "protocol": "icmp"},
            {"hostPort": 0, "containerPort": 1, "protocol": "tcp"}
        ]}}));
        assert_eq!(got, "Invalid host port number: 0");
    }

    #[test]
    fn what_only_we_refuse_has_our_own_message_naming_the_entry() {
        let cases = [
            (
                json!({"hostPort": 70000, "containerPort": 80, "protocol": "tcp"}),
                "host port number 70000 is out of range",
                "runtimeConfig.portMappings[0].hostPort must be 1-65535",
            ),
            (
                json!({"hostPort": 80, "containerPort": 65536, "protocol": "tcp"}),
                "container port number 65536 is out of range",
                "runtimeConfig.portMappings[0].containerPort must be 1-65535",
            ),
            (
                json!({"hostPort": 80, "containerPort": 80, "protocol": "icmp"}),
                "unsupported protocol \"icmp\"",
                "runtimeConfig.portMappings[0].protocol must be tcp, udp or sctp",
            ),
            (
                json!({"hostPort": 80, "containerPort": 80, "protocol": "tcp", "hostIP": "fe80::1%eth0"}),
                "invalid hostIP \"fe80::1%eth0\"",
                "runtimeConfig.portMappings[0].hostIP must be an IPv4 or IPv6 address without zone",
            ),
        ];
        for (mapping, msg, details) in cases {
            let got = err_details(json!({"runtimeConfig": {"portMappings": [mapping]}}));
            assert_eq!(got, (msg.to_string(), details.to_string()));
        }
    }

    #[test]
    fn mark_bit_errors_are_the_references_messages() {
        assert_eq!(
            err_details(json!({"markMasqBit": 32})),
            (
                "MasqMarkBit must be between 0 and 31".to_string(),
                "markMasqBit is 32".to_string()
            )
        );
        assert_eq!(
            err(json!({"markMasqBit": -1})),
            "MasqMarkBit must be between 0 and 31"
        );
        // Both set, even to the default bit.
        assert_eq!(
            err(json!({"markMasqBit": 13, "externalSetMarkChain": "KUBE-MARK-MASQ"})),
            "Cannot specify externalSetMarkChain and markMasqBit"
        );
        assert_eq!(conf(json!({"markMasqBit": 5})).unwrap().mark_masq_bit, 5);
    }

    #[test]
    fn options_of_the_other_backend_are_rejected_with_the_reference_messages() {
        assert_eq!(
            err(json!({"backend": "iptables", "conditionsV4": ["ip", "saddr", "1.2.3.4"]})),
            "iptables backend was requested but configuration contains nftables-specific options [conditionsV4]"
        );
        assert_eq!(
            err(
                json!({"backend": "nftables", "externalSetMarkChain": "X", "conditionsV6": ["!", "-s", "::1"]})
            ),
            "nftables backend was requested but configuration contains iptables-specific options [externalSetMarkChain conditionsV6]"
        );
        assert_eq!(err(json!({"backend": "pf"})), "unrecognized backend \"pf\"");
    }

    #[test]
    fn del_reads_only_the_mappings_that_validate_and_nothing_else() {
        let raw = json!({"name": "net", "cniVersion": "1.0.0", "backend": "bogus",
        "markMasqBit": 99,
        "runtimeConfig": {"PortMappings": [
            {"hostPort": 70000, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 80, "containerPort": 80, "protocol": "icmp"},
            {"hostPort": 80, "containerPort": 80, "protocol": "tcp", "hostIP": "fe80::1%eth0"},
            {"hostPort": "x"},
            {"hostPort": 53, "containerPort": 53, "protocol": "udp"}
        ]}});
        let conf: NetConf<serde::de::IgnoredAny> = NetConf::from_value(raw).unwrap();
        assert_eq!(
            del_mappings(&conf),
            vec![PortMapping {
                host_port: 53,
                container_port: 53,
                proto: Proto::Udp,
                host_ip: HostIp::All,
            }]
        );
    }

    #[test]
    fn empty_backend_means_auto_and_is_resolved_by_options() {
        let c = conf(json!({"backend": "", "conditionsV4": ["-s", "1.2.3.4"]})).unwrap();
        assert_eq!(c.backend, BackendChoice::Auto);
        assert_eq!(
            c.conditions_v4,
            Conditions::Iptables(vec!["-s".into(), "1.2.3.4".into()])
        );
    }

    #[test]
    fn an_empty_iptables_condition_is_refused_as_iptables_refuses_it() {
        // `null` decodes as "" (Go's zero string), as in the reference.
        for conditions in [
            json!(["-s", ""]),
            json!([""]),
            json!([null, "-s", "1.2.3.4"]),
        ] {
            let err = conf(json!({"conditionsV6": conditions})).unwrap_err();
            assert_eq!(err.code.as_u32(), 7, "{conditions}");
            assert_eq!(err.msg, "empty iptables condition in conditionsV6");
        }
        // Whitespace in nftables text.
        let c = conf(json!({"conditionsV4": ["ip saddr 10.0.0.0/8", ""]})).unwrap();
        assert!(matches!(c.conditions_v4, Conditions::Nftables(_)));
    }

    #[test]
    fn nft_conditions_parse_the_documented_subset_and_name_bad_tokens() {
        let c = conf(
            json!({"conditionsV4": ["ip saddr 10.0.0.0/8", "iifname \"eth0\"", "meta mark 0x10"],
                            "conditionsV6": ["ip6", "daddr", "fd00::1"]}),
        )
        .unwrap();
        assert_eq!(
            c.conditions_v4,
            Conditions::Nftables(vec![
                NftCondition::Saddr("10.0.0.0/8".parse().unwrap()),
                NftCondition::IifName("eth0".into()),
                NftCondition::Mark(0x10),
            ])
        );
        assert_eq!(
            c.conditions_v6,
            Conditions::Nftables(vec![NftCondition::Daddr("fd00::1/128".parse().unwrap())])
        );
        let msg = err(json!({"conditionsV4": ["ip saddr 10.0.0.0/8 tcp dport 22"]}));
        assert!(
            msg.contains("conditionsV4") && msg.contains("\"tcp\""),
            "{msg}"
        );
        let msg = err(json!({"conditionsV4": ["ip6 saddr fd00::/8"]}));
        assert!(msg.contains("\"ip6\""), "{msg}");
    }

    #[test]
    fn container_ips_follow_the_sandbox_and_ifname_rule() {
        let prev = CniResult::from_prev_result(
            &json!({"cniVersion": "1.0.0",
            "interfaces": [{"name": "host0"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
            "ips": [
                {"interface": 0, "address": "192.168.0.1/24"},
                {"interface": 1, "address": "10.0.0.2/24"},
                {"address": "fd00::2/64"},
                {"interface": 1, "address": "10.0.0.3/24"}
            ]}),
            "1.0.0",
        )
        .unwrap();
        let (v4, v6) = container_ips(&prev, "eth0");
        assert_eq!(v4, Some("10.0.0.2/24".parse().unwrap()));
        assert_eq!(v6, Some("fd00::2/64".parse().unwrap()));
    }
}
