//! Configs of the Go main plugins (`bridge`, `ptp` with `host-local` IPAM) that chain tests put
//! first in a conflist. IPAM state always goes to the given `data_dir` (a tempdir of the test),
//! never to `/var/lib/cni`.

use std::path::Path;

use serde_json::{Value, json};

/// `host-local` IPAM with one range per subnet and a default route for each family present.
pub fn host_local(subnets: &[&str], data_dir: &Path) -> Value {
    let ranges: Vec<Value> = subnets.iter().map(|s| json!([{ "subnet": s }])).collect();
    let mut routes = Vec::new();
    if subnets.iter().any(|s| !s.contains(':')) {
        routes.push(json!({ "dst": "0.0.0.0/0" }));
    }
    if subnets.iter().any(|s| s.contains(':')) {
        routes.push(json!({ "dst": "::/0" }));
    }
    json!({
        "type": "host-local",
        "ranges": ranges,
        "routes": routes,
        "dataDir": data_dir,
    })
}

/// `bridge` named `bridge` acting as the containers' gateway, without masquerade, with
/// hairpin mode (so a container can reach itself through a host port), and `host-local` IPAM
/// over `subnets` (IPv4 and/or IPv6 CIDRs).
pub fn bridge(bridge: &str, subnets: &[&str], data_dir: &Path) -> Value {
    json!({
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "ipMasq": false,
        "hairpinMode": true,
        "ipam": host_local(subnets, data_dir),
    })
}

/// `ptp` (a veth per container, routed by the host) with `host-local` IPAM over `subnets`.
pub fn ptp(subnets: &[&str], data_dir: &Path) -> Value {
    json!({
        "type": "ptp",
        "ipMasq": false,
        "ipam": host_local(subnets, data_dir),
    })
}
