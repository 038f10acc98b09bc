//! The `bandwidth` CNI plugin binary.

#![no_main]

common::plugin_main!("bandwidth", bandwidth::Bandwidth);
