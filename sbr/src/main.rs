//! The `sbr` binary: see the crate docs of [`sbr`].

use std::process::ExitCode;

fn main() -> ExitCode {
    common::logging::init("sbr");
    common::skel::run(&sbr::Sbr)
}
