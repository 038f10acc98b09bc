use std::process::ExitCode;

fn main() -> ExitCode {
    common::logging::init("firewall");
    common::skel::run(&firewall::Firewall)
}
