//! The `firewall` CNI plugin binary.

#![no_main]

cni::plugin_main!("firewall", firewall::Firewall);
