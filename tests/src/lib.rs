//! End-to-end harness for the CNI meta plugins.
//!
//! - [`netns`]: named network namespaces at `/run/netns/<name>` removed on drop, veth links, and
//!   the usual host/container/client [`netns::Topology`].
//! - [`bins`]: where our plugin binaries (cargo's target dir) and the Go reference plugins
//!   (`/usr/lib/cni`) are.
//! - [`runtime`]: a libcni-like runtime running plugin chains inside a host namespace
//!   (capabilities → `runtimeConfig`, `prevResult` chaining, DEL in reverse, a result cache,
//!   CHECK/STATUS/GC) plus raw execution for conformance tests.
//! - [`chain`]: a conflist driven plugin by plugin as the runtime does, retrying code 11 and
//!   optionally measuring each execution's peak RSS, for the concurrency and soak tests.
//! - [`main_plugin`]: configs of the Go `bridge`/`ptp` + `host-local` that start a chain.
//! - [`traffic`]: TCP/UDP/HTTP servers and clients in namespaces, and `iperf3` runs.
//! - [`result`]: lookups in a CNI result (an address of a family, the host veth).
//! - [`process`]: child processes spawned inside a namespace and waited for with a deadline.
//! - [`mounts`]: private mount namespaces for tests that change mounts.
//! - [`seccomp`]: a kernel without nf_tables, as a plugin sees it (seccomp filters): without
//!   nfnetlink, or with nfnetlink but without the nf_tables subsystem.
//! - [`cleanup`]: what a harness binary made, removed on a signal or a panic as well.
//! - [`iptables_layout`]: the reference portmap's shared iptables chains and rules, for the
//!   tests and bench of `netfilter::iptables::native`.
//! - [`snapshot`]: normalised snapshots of the kernel objects and files plugins leave behind.
//! - [`firewall_state`]: the firewall plugin's records of a namespace's attachments.
//! - [`differential`]: the same calls to a Go reference plugin and to ours, compared.
//! - [`watcher`]: a plugin's `reconcile --watch` started in a runtime's host namespace as its
//!   service would be, its log read while it runs, stopped with SIGTERM.
//! - [`userland`]: Debian 11, 12 and 13 root filesystems (their own iptables, nft and Go
//!   plugins), cached outside the checkout, and nodes made of them that run our plugins.
//!
//! Everything needs root and fails (never skips) without it. Nothing here touches the machine's
//! own network namespace: namespaces are created on throwaway threads, commands and plugins are
//! spawned from threads inside test namespaces, and the runtime refuses pid 1's namespace.
//! Our plugin binaries, and the `cni` crate's example plugin `passthrough` the conformance suite
//! runs, must be built first: `cargo build --workspace --bins --examples`.

pub mod bins;
pub mod chain;
pub mod cleanup;
pub mod differential;
pub mod firewall_state;
pub mod generated;
pub mod iptables_layout;
pub mod main_plugin;
pub mod mounts;
pub mod netns;
pub mod portmap_state;
pub mod process;
pub mod result;
pub mod runtime;
pub mod seccomp;
pub mod snapshot;
pub mod traffic;
pub mod userland;
pub mod watcher;

pub use netns::{TestNetns, Topology, veth_pair};
pub use runtime::{
    CniErrorObject, GcAttachment, NetworkConfigList, PluginFailure, PluginOutput, Runtime,
    RuntimeConf, RuntimeError,
};

/// Whether `nft get element FAMILY TABLE SET { KEY }` finds the element in `ns` (a lookup by
/// key; an expired element is not found).
///
/// # Errors
/// When `nft` cannot be run.
pub fn nft_has_element(
    ns: &TestNetns,
    (family, table, set): (&str, &str, &str),
    key: &str,
) -> anyhow::Result<bool> {
    let out = ns.exec(
        "nft",
        &[
            "get",
            "element",
            family,
            table,
            set,
            &format!("{{ {key} }}"),
        ],
    )?;
    Ok(out.status.success())
}
