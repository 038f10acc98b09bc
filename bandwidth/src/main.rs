//! The `bandwidth` CNI plugin binary.

fn main() -> std::process::ExitCode {
    common::logging::init("bandwidth");
    common::skel::run(&bandwidth::Bandwidth)
}
