//! Tests of the end-to-end harness itself: namespace fixtures, the libcni-like runtime (with the
//! Go `bridge` + `host-local` plugins and with fake plugin scripts) and the traffic helpers.
//!
//! They need root and fail without it: run them as root (`.ci/run` does).
//!
//! The modules are `#[cfg(test)]` (always true here) so that the workspace lints treat them as
//! test code (`tests_outside_test_module`, `unwrap_used`).

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod runtime;
#[cfg(test)]
mod traffic;
