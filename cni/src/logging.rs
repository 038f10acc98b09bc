//! Logging to stderr (and optionally a file): stdout belongs to the CNI result alone.
//!
//! The level comes from `CNI_LOG_LEVEL` (`error`, `warn`, `info`, `debug`, `trace`; default
//! `warn`, because runtimes often show a plugin's stderr to users). `CNI_LOG_FILE` names a file
//! to append to as well; if it cannot be opened, logging goes to stderr only.

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// Environment variable with the log level.
pub const LEVEL_ENV: &str = "CNI_LOG_LEVEL";
/// Environment variable with a file to append logs to.
pub const FILE_ENV: &str = "CNI_LOG_FILE";

#[derive(Debug)]
struct Logger {
    plugin: &'static str,
    level: LevelFilter,
    file: Option<Mutex<File>>,
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format_line(
            self.plugin,
            std::process::id(),
            record.level(),
            record.args(),
        );
        // A log line that cannot be written must not fail the plugin.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        if let Some(Ok(mut f)) = self.file.as_ref().map(Mutex::lock) {
            let _ = f.write_all(line.as_bytes());
        }
    }

    fn flush(&self) {}
}

fn format_line(plugin: &str, pid: u32, level: Level, args: &std::fmt::Arguments<'_>) -> String {
    format!("{plugin}[{pid}] {level}: {args}\n")
}

/// Parses a level name; unknown names give `None`.
pub fn parse_level(s: &str) -> Option<LevelFilter> {
    match s.trim().to_ascii_lowercase().as_str() {
        "off" | "none" => Some(LevelFilter::Off),
        "error" => Some(LevelFilter::Error),
        "warn" | "warning" => Some(LevelFilter::Warn),
        "info" => Some(LevelFilter::Info),
        "debug" => Some(LevelFilter::Debug),
        "trace" => Some(LevelFilter::Trace),
        _ => None,
    }
}

/// Installs the logger for `plugin`, configured from the environment. Call once from `main`.
pub fn init(plugin: &'static str) {
    let level = std::env::var(LEVEL_ENV)
        .ok()
        .and_then(|s| parse_level(&s))
        .unwrap_or(LevelFilter::Warn);
    let file = std::env::var_os(FILE_ENV).and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
            .map(Mutex::new)
    });
    let logger = Logger {
        plugin,
        level,
        file,
    };
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_names_parse_case_insensitively() {
        assert_eq!(parse_level("DEBUG"), Some(LevelFilter::Debug));
        assert_eq!(parse_level(" warn "), Some(LevelFilter::Warn));
        assert_eq!(parse_level("off"), Some(LevelFilter::Off));
        assert_eq!(parse_level("loud"), None);
    }

    #[test]
    fn lines_name_the_plugin_pid_and_level() {
        let line = format_line(
            "tuning",
            42,
            Level::Warn,
            &format_args!("sysctl {} missing", "x"),
        );
        assert_eq!(line, "tuning[42] WARN: sysctl x missing\n");
    }
}
