//! The `bandwidth` CNI plugin binary.

#![no_main]

cni::plugin_main!("bandwidth", bandwidth::Bandwidth);
