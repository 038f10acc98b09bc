//! The `portmap` binary: see the library for what it does.

use std::process::ExitCode;

fn main() -> ExitCode {
    common::logging::init("portmap");
    common::skel::run(&portmap::Portmap)
}
