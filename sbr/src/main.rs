//! The `sbr` binary: see the crate docs of [`sbr`].

#![no_main]

common::plugin_main!("sbr", sbr::Sbr);
