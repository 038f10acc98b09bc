//! The `bandwidth` CNI plugin binary (and, started by its own DEL, the IFB reaper).

fn main() -> std::process::ExitCode {
    common::logging::init("bandwidth");
    if let Some(code) = bandwidth::reaper::run_if_requested() {
        return code;
    }
    common::skel::run(&bandwidth::Bandwidth)
}
