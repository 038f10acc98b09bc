//! The `tuning` CNI plugin binary.

#![no_main]

common::plugin_main!("tuning", tuning::Tuning);
