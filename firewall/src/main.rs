//! The `firewall` CNI plugin binary.

#![no_main]

common::plugin_main!("firewall", firewall::Firewall);
