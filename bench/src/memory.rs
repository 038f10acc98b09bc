//! `memory`: memory and time in proportion to the input. Every plugin's ADD with 1, 4 and 16 MB
//! of stdin (`--memory-sizes`) of three shapes, ours against the Go binary, peak RSS and time
//! side by side, cniVersion 1.0.0:
//!
//! - `unknown array`: the plugin's config with a key no plugin reads holding one array of small
//!   objects (`{"a":0,"b":"x"}`, …);
//! - `deep nesting`: the same key holding an array of objects nested 9 990 deep (Go's decoder
//!   takes 10 000 levels, the config's own object and the array counted);
//! - `prevResult routes`: `prevResult.routes` holding as many `/32` routes as fit.
//!
//! Each plugin's config works on its own (a veth between a host and a container namespace, the
//! container's address in `prevResult`): tuning sets the MTU, bandwidth shapes ingress, firewall
//! and portmap (one mapping) use their iptables backend as Go does, sbr adds its rule for table
//! 100. Each timed ADD is followed, untimed, by a DEL with the plain config, and Go's leftover
//! host qdisc of bandwidth is removed as in the `bandwidth` suite, so every ADD starts from the
//! same state. The stdin comes from a file and the plugin's output is cut to its first 64 KiB, so
//! the spawner, whose peak RSS is the floor of every figure, stays small; a 16 MB routes
//! prevResult comes back as a result of some 40 MB.
//!
//! The targets ([`TARGETS`]): for each plugin, shape and size, ours/Go of the peak RSS at most
//! 2 and of the median time at most 1. `bench/tests/memory.rs` asserts the RSS bound at 16 MB.

use std::fmt::Write as _;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use harness::bins::{plugin_binary, reference_binary};
use harness::netns::{StateDirs, TestNetns, veth_pair};
use host::netns::NetNs;
use serde_json::{Value, json};

use crate::targets::{Measure, Resource, Target};
use crate::{Exec, Options, Results, Row, Samples, time_exec};

/// The suite's name.
pub const SUITE: &str = "memory";

/// The plugins, in report order.
pub const PLUGINS: [&str; 5] = ["portmap", "tuning", "bandwidth", "firewall", "sbr"];

/// The default stdin sizes, in KiB: 1, 4 and 16 MB.
pub const DEFAULT_SIZES_KIB: [usize; 3] = [1 << 10, 4 << 10, 16 << 10];

/// Timed ADDs per case at most: Go's take up to a second each at 16 MB.
pub const MEMORY_ITERATIONS: usize = 5;

/// How much of a plugin's stdout and stderr the spawner keeps.
const OUTPUT_LIMIT: usize = 64 << 10;

/// The depth of each nest of objects in [`Shape::DeepNesting`]: with the config's object and
/// the array around the nests, 9 992 of Go's 10 000 levels.
pub const NEST_DEPTH: usize = 9_990;

/// What fills the stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One array of small objects in a key no plugin reads.
    UnknownArray,
    /// Objects nested [`NEST_DEPTH`] deep, in an array in a key no plugin reads.
    DeepNesting,
    /// `prevResult.routes`.
    Routes,
}

impl Shape {
    /// Every shape, in report order.
    pub const ALL: [Shape; 3] = [Shape::UnknownArray, Shape::DeepNesting, Shape::Routes];

    /// The shape as `--memory-shapes` names it.
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            Shape::UnknownArray => "array",
            Shape::DeepNesting => "nesting",
            Shape::Routes => "routes",
        }
    }

    /// The shape `--memory-shapes` names `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|s| s.key() == key)
    }

    /// The shape as the report names it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Shape::UnknownArray => "unknown array",
            Shape::DeepNesting => "deep nesting",
            Shape::Routes => "prevResult routes",
        }
    }

    /// Where in the config the filler goes (a JSON pointer).
    fn pointer(self) -> &'static str {
        match self {
            Shape::UnknownArray | Shape::DeepNesting => "/bench-filler",
            Shape::Routes => "/prevResult/routes",
        }
    }

    /// Writes the `i`th element of the filler array into `out`.
    fn element(self, i: usize, room: usize, out: &mut String) {
        out.clear();
        match self {
            Shape::UnknownArray => {
                let _ = write!(out, r#"{{"a":{i},"b":"x"}}"#);
            }
            Shape::DeepNesting => {
                // Each level is `{"a":` and `}`; a smaller nest where a whole one does not fit.
                let depth = NEST_DEPTH.min(room.saturating_sub(1) / 6).max(1);
                out.reserve(depth * 6 + 1);
                for _ in 0..depth {
                    out.push_str(r#"{"a":"#);
                }
                out.push('0');
                for _ in 0..depth {
                    out.push('}');
                }
            }
            Shape::Routes => {
                let _ = write!(
                    out,
                    r#"{{"dst":"10.{}.{}.{}/32","gw":"{CTR_GATEWAY}"}}"#,
                    (i >> 16) & 0xff,
                    (i >> 8) & 0xff,
                    i & 0xff
                );
            }
        }
    }
}

/// The case a shape and size make, as rows and targets name it: `unknown array, 16 MB`.
#[must_use]
pub fn case_name(shape: Shape, size_kib: usize) -> String {
    if size_kib.is_multiple_of(1024) {
        format!("{}, {} MB", shape.name(), size_kib / 1024)
    } else {
        format!("{}, {} KB", shape.name(), size_kib)
    }
}

/// The cases of [`DEFAULT_SIZES_KIB`], as [`case_name`] names them.
pub const CASES: [&str; 9] = [
    "unknown array, 1 MB",
    "unknown array, 4 MB",
    "unknown array, 16 MB",
    "deep nesting, 1 MB",
    "deep nesting, 4 MB",
    "deep nesting, 16 MB",
    "prevResult routes, 1 MB",
    "prevResult routes, 4 MB",
    "prevResult routes, 16 MB",
];

/// The step of a plugin's row: `tuning ADD`.
#[must_use]
pub fn step_name(plugin: &str) -> String {
    format!("{plugin} ADD")
}

/// Ours/Go of the peak RSS at most 2, of the median time at most 1, for every plugin and case.
pub const TARGETS: [Target; 90] = targets();

const fn targets() -> [Target; 90] {
    let placeholder = Target {
        measure: Measure::Memory {
            plugin: "",
            case: "",
            of: Resource::PeakRss,
        },
        limit: 0.0,
    };
    let mut out = [placeholder; 90];
    let mut i = 0;
    let mut p = 0;
    while p < PLUGINS.len() {
        let mut c = 0;
        while c < CASES.len() {
            let (plugin, case) = (PLUGINS[p], CASES[c]);
            out[i] = Target {
                measure: Measure::Memory {
                    plugin,
                    case,
                    of: Resource::PeakRss,
                },
                limit: 2.0,
            };
            out[i + 1] = Target {
                measure: Measure::Memory {
                    plugin,
                    case,
                    of: Resource::Time,
                },
                limit: 1.0,
            };
            i += 2;
            c += 1;
        }
        p += 1;
    }
    out
}

/// Where Go's `tbf` is left (its DEL keeps it), and the host side of the veth.
const HOST_VETH: &str = "veth-mem0";
const HOST_ADDRESS: &str = "10.95.0.1/24";
const CTR_ADDRESS: &str = "10.95.0.2/24";
const CTR_GATEWAY: &str = "10.95.0.1";
const CONTAINER_ID: &str = "bench-memory";

/// A host and a container namespace joined by a veth, the plugins' state directories of the
/// host, and tuning's data directory: what every plugin's ADD of this suite runs in.
#[derive(Debug)]
pub struct Fixture {
    host: TestNetns,
    container: TestNetns,
    _state: StateDirs,
    data_dir: tempfile::TempDir,
}

impl Fixture {
    /// Makes the namespaces and the veth.
    ///
    /// # Errors
    /// When a namespace or the veth cannot be made.
    pub fn new() -> Result<Fixture> {
        let host = TestNetns::new("benchmem-h")?;
        let state = StateDirs::of(&host)?;
        let container = TestNetns::new("benchmem-c")?;
        veth_pair(
            &host,
            HOST_VETH,
            &[HOST_ADDRESS],
            &container,
            "eth0",
            &[CTR_ADDRESS],
        )?;
        Ok(Fixture {
            host,
            container,
            _state: state,
            data_dir: tempfile::tempdir()?,
        })
    }

    /// The host namespace, where the plugins run.
    ///
    /// # Errors
    /// When it cannot be opened.
    pub fn host(&self) -> Result<NetNs> {
        self.host.netns()
    }

    /// `CNI_NETNS`.
    #[must_use]
    pub fn container_path(&self) -> &Path {
        self.container.path()
    }

    /// The plain config of `plugin` (one of [`PLUGINS`]).
    ///
    /// # Errors
    /// For a plugin this suite does not know.
    pub fn config(&self, plugin: &str) -> Result<Value> {
        let mut config = json!({
            "cniVersion": "1.0.0",
            "name": "bench-memory",
            "type": plugin,
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": HOST_VETH},
                    {"name": "eth0", "sandbox": self.container_path()},
                ],
                "ips": [{"address": CTR_ADDRESS, "interface": 1}],
                "routes": [],
            },
        });
        let keys = match plugin {
            "portmap" => json!({
                "capabilities": {"portMappings": true},
                "runtimeConfig": {"portMappings": [
                    {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"},
                ]},
            }),
            "tuning" => json!({"dataDir": self.data_dir.path(), "mtu": 1400}),
            "bandwidth" => json!({"ingressRate": 8_000_000, "ingressBurst": 80_000}),
            "firewall" => json!({"backend": "iptables"}),
            "sbr" => json!({"table": 100}),
            other => anyhow::bail!("the memory suite has no config for {other}"),
        };
        if let (Some(config), Value::Object(keys)) = (config.as_object_mut(), keys) {
            config.extend(keys);
        }
        Ok(config)
    }

    /// An exec of `binary` (`command`) with `config`.
    #[must_use]
    pub fn exec(&self, binary: &Path, command: &str, config: &Value) -> Exec {
        Exec::plugin(
            binary,
            command,
            CONTAINER_ID,
            self.container_path(),
            "eth0",
            config,
        )
    }

    /// Removes what a Go DEL of `plugin` leaves behind: bandwidth's host `tbf`.
    pub fn settle(&self, plugin: &str) {
        if plugin == "bandwidth" {
            // Absent, `tc` fails: that is the clean state wanted.
            let _ = self
                .host
                .exec("tc", &["qdisc", "del", "dev", HOST_VETH, "root"]);
        }
    }
}

/// Writes `config` with `shape` filling it to about `bytes` bytes of JSON into `out`, made as
/// it is written (never whole in memory).
///
/// # Errors
/// When writing fails.
pub fn write_stdin(config: &Value, shape: Shape, bytes: usize, out: impl Write) -> io::Result<()> {
    const MARK: &str = "\u{0}bench-filler\u{0}";
    let mut marked = config.clone();
    if let Some(slot) = marked.pointer_mut(shape.pointer()) {
        *slot = json!(MARK);
    } else if let Some(object) = marked.as_object_mut() {
        object.insert(
            shape.pointer().trim_start_matches('/').to_owned(),
            json!(MARK),
        );
    }
    let text = marked.to_string();
    let quoted = serde_json::to_string(MARK).map_err(io::Error::other)?;
    let (head, tail) = text
        .split_once(&quoted)
        .ok_or_else(|| io::Error::other(format!("no {} in the config", shape.pointer())))?;
    let mut out = BufWriter::with_capacity(1 << 16, out);
    out.write_all(head.as_bytes())?;
    let mut room = bytes.saturating_sub(head.len() + tail.len() + 2);
    out.write_all(b"[")?;
    let mut element = String::new();
    for i in 0.. {
        shape.element(i, room.saturating_sub(usize::from(i > 0)), &mut element);
        let needed = element.len() + usize::from(i > 0);
        if needed > room {
            break;
        }
        if i > 0 {
            out.write_all(b",")?;
        }
        out.write_all(element.as_bytes())?;
        room -= needed;
    }
    out.write_all(b"]")?;
    out.write_all(tail.as_bytes())?;
    out.flush()
}

/// Runs the suite.
///
/// # Errors
/// When the namespaces cannot be made or a plugin exec fails.
pub fn run(options: &Options) -> Result<Results> {
    let fixture = Fixture::new()?;
    let host = fixture.host()?;
    let iterations = options.iterations.clamp(1, MEMORY_ITERATIONS);
    let stdin_dir = tempfile::tempdir()?;
    let stdin_path: PathBuf = stdin_dir.path().join("stdin.json");
    let mut rows = Vec::new();
    for plugin in PLUGINS {
        let binaries = [plugin_binary(plugin)?, reference_binary(plugin)?];
        let config = fixture.config(plugin)?;
        let cycle = |binary: &Path, add: &Exec| -> Result<crate::Sample> {
            let sample = time_exec(&host, add)
                .with_context(|| format!("{plugin} ADD"))?
                .sample();
            time_exec(&host, &fixture.exec(binary, "DEL", &config))
                .with_context(|| format!("{plugin} DEL"))?;
            fixture.settle(plugin);
            Ok(sample)
        };
        for binary in &binaries {
            cycle(binary, &fixture.exec(binary, "ADD", &config))?;
        }
        for &shape in &options.memory_shapes {
            for &size_kib in &options.memory_sizes_kib {
                write_stdin(
                    &config,
                    shape,
                    size_kib << 10,
                    std::fs::File::create(&stdin_path)?,
                )?;
                let add = |binary: &Path| Exec {
                    stdin: Vec::new(),
                    stdin_file: Some(stdin_path.clone()),
                    output_limit: Some(OUTPUT_LIMIT),
                    ..fixture.exec(binary, "ADD", &config)
                };
                let mut samples = [Samples::default(), Samples::default()];
                for i in 0..iterations {
                    let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
                    for which in order {
                        let binary = &binaries[which];
                        samples[which].push(cycle(binary, &add(binary))?);
                    }
                }
                let [ours, reference] = samples;
                rows.push(Row {
                    suite: SUITE.to_owned(),
                    case: case_name(shape, size_kib),
                    step: step_name(plugin),
                    ours,
                    reference,
                    reference_label: format!("Go {plugin}"),
                });
            }
        }
    }
    Ok(rows.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cases_of_the_targets_are_those_of_the_default_sizes() {
        let made: Vec<String> = Shape::ALL
            .iter()
            .flat_map(|&s| DEFAULT_SIZES_KIB.iter().map(move |&k| case_name(s, k)))
            .collect();
        assert_eq!(made, CASES);
        assert_eq!(case_name(Shape::Routes, 16), "prevResult routes, 16 KB");
        assert!(TARGETS.iter().all(|t| t.limit > 0.0));
    }

    #[test]
    fn stdin_of_each_shape_is_the_config_with_the_filler_at_about_the_size() {
        let config = json!({"name": "n", "prevResult": {"routes": [], "ips": []}});
        for shape in Shape::ALL {
            for size in [1 << 10, 100 << 10, 1 << 20] {
                let mut text = Vec::new();
                write_stdin(&config, shape, size, &mut text).unwrap();
                assert!(text.len() <= size, "{shape:?} {size}: {}", text.len());
                assert!(
                    text.len() + 60_000 > size,
                    "{shape:?} {size}: {}",
                    text.len()
                );
                let value: Value = serde_json::from_slice(&text).unwrap_or_else(|e| {
                    // serde_json stops at 128 levels; the nests are deeper by design.
                    assert_eq!(shape, Shape::DeepNesting, "{e}");
                    Value::Null
                });
                if shape == Shape::DeepNesting {
                    continue;
                }
                assert_eq!(value["name"], "n");
                let filler = value.pointer(shape.pointer()).unwrap();
                assert!(
                    filler.as_array().is_some_and(|a| !a.is_empty()),
                    "{shape:?}"
                );
            }
        }
        let mut text = Vec::new();
        write_stdin(&config, Shape::DeepNesting, 200_000, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains(&format!("{}0}}", r#"{"a":"#.repeat(NEST_DEPTH))));
        assert!(!text.contains(&r#"{"a":"#.repeat(NEST_DEPTH + 1)));
    }
}
