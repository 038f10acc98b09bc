//! The `sbr` binary: see the crate docs of [`sbr`].

#![no_main]

cni::plugin_main!("sbr", sbr::Sbr);
