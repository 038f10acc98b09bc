//! The `tuning` CNI plugin binary.

#![no_main]

cni::plugin_main!("tuning", tuning::Tuning);
