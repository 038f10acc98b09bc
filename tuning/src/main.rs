use std::process::ExitCode;

fn main() -> ExitCode {
    common::logging::init("tuning");
    common::skel::run(&tuning::Tuning)
}
