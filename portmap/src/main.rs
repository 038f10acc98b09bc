//! The `portmap` binary: see the library for what it does.

#![no_main]

cni::plugin_main!("portmap", portmap::Portmap);
