//! The generated tier of the differential tests: configurations made from a seed, played on
//! Debian's Go plugin and on ours, and compared as `tests::differential` compares a step.
//!
//! # What is generated
//!
//! A [`Schema`] describes a plugin's configuration as Go declares it (1.1.1's struct: its keys,
//! their Go types) with a valid value for each key, starting from a configuration that works
//! on the plugin's differential stage ([`Plan::base`]). Each generated configuration is that
//! object with what exercises a JSON decoder:
//!
//! - keys in another spelling (Go matches them case-insensitively, with `K` for `k` and `ſ`
//!   for `s`), written with `\u` escapes, left out, or written twice or three times, with
//!   `null` between (which resets a Go pointer, slice or map and leaves a value alone) and
//!   objects that merge;
//! - values of another JSON type, numbers out of range, fractional, negative, `-0`, `1e400`,
//!   empty strings, `null` elements, unknown keys holding anything;
//! - a `prevResult` with the same, in the config's version or another of its era.
//!
//! # How it runs
//!
//! The **decode tier** plays every configuration as ADD, both sides in namespaces of their
//! own, with an environment under which no kernel work follows the decoding for most plugins
//! ([`Plan::env`]: a `CNI_NETNS` that does not exist, an interface no address is on): where
//! the decoding is what is tested, a call costs an exec. It compares success, and `msg` and
//! the skel's codes of failures, and the result printed ([`differential::compare_outcomes`]).
//! A difference that a row of the README's differences tables allows ([`Known`]) is counted
//! under that row; any other fails the run, listing each configuration with both outcomes.
//!
//! The **kernel tier** plays the first configurations both sides decoded alike and went past
//! the decoding with ([`Plan::kernel`]) as cases of the plugin's [`Suite`]: in fresh stages,
//! ADD and DEL, with the kernel objects compared after each. It leaves to the decode tier the
//! configurations whose kernel work differs as a README row says ([`Plan::kernel_fits`], and
//! a prevResult IP whose `version` is not its address's).
//!
//! The seed is fixed (so CI runs the same configurations every time) unless `DIFF_SEED` sets
//! it; `DIFF_GENERATED` sets how many configurations a plugin's decode tier plays. A failing
//! run prints its seed.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use proptest::prelude::RngExt;
use proptest::test_runner::{RngAlgorithm, TestRng};
use serde_json::Value;

use crate::differential::{
    Case, DifferenceRows, Impl, Outcome, Stage, Step, Suite, Why, as_head_prints, compare_outcomes,
};
use crate::netns::TestNetns;
use crate::runtime::{PluginOutput, Runtime};

/// The seed of a run unless [`SEED_ENV`] sets another.
pub const DEFAULT_SEED: u64 = 0x2026_0026;

/// Sets the seed (decimal or `0x` hex).
pub const SEED_ENV: &str = "DIFF_SEED";

/// Sets how many configurations each plugin's decode tier plays.
pub const COUNT_ENV: &str = "DIFF_GENERATED";

/// A deterministic source of choices.
#[derive(Debug)]
pub struct Gen {
    rng: TestRng,
}

impl Gen {
    /// The choices of `seed`.
    pub fn new(seed: u64) -> Gen {
        let mut bytes = [0u8; 32];
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            let word = seed.rotate_left(u32::try_from(i * 17).unwrap_or(0)) ^ (i as u64);
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        Gen {
            rng: TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
        }
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        self.rng.random_range(0..n)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u32) -> bool {
        self.rng.random_range(0..100) < percent
    }

    /// One of `items`.
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: i64, hi: i64) -> i64 {
        self.rng.random_range(lo..=hi)
    }
}

/// A JSON value that may hold a key twice, written as given.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number, as its literal.
    Num(String),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object, its entries in order (keys as written, escapes included).
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// A string value.
    pub fn str(s: &str) -> Json {
        Json::Str(s.to_owned())
    }

    /// A number value.
    pub fn num(n: impl std::fmt::Display) -> Json {
        Json::Num(n.to_string())
    }

    /// The value of `value` (objects keep their order).
    pub fn from_value(value: &Value) -> Json {
        match value {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Number(n) => Json::Num(n.to_string()),
            Value::String(s) => Json::Str(s.clone()),
            Value::Array(items) => Json::Arr(items.iter().map(Json::from_value).collect()),
            Value::Object(map) => Json::Obj(
                map.iter()
                    .map(|(k, v)| (quote(k), Json::from_value(v)))
                    .collect(),
            ),
        }
    }

    /// The JSON text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(n) => out.push_str(n),
            Json::Str(s) => out.push_str(&quote(s)),
            Json::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Json::Obj(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(key);
                    out.push_str(": ");
                    value.write(out);
                }
                out.push('}');
            }
        }
    }
}

/// `s` as a JSON string.
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// A Go type of a configuration field, with the valid values generated for it.
#[derive(Debug, Clone, Copy)]
pub enum Go {
    /// `string`, one of these when valid.
    Str(&'static [&'static str]),
    /// `bool`.
    Bool,
    /// `int` (or `int64`), in this range when valid.
    Int(i64, i64),
    /// `uint64`, in this range when valid.
    Uint(i64, i64),
    /// A pointer to.
    Ptr(&'static Go),
    /// A slice of.
    Slice(&'static Go),
    /// `map[string]` of, its keys one of these when valid.
    Map(&'static [&'static str], &'static Go),
    /// A struct of these fields.
    Struct(&'static [Field]),
    /// Any JSON value (`interface {}`).
    Any,
}

/// A field of a struct: its JSON key and Go type.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The key as Go declares it.
    pub key: &'static str,
    /// Its type.
    pub go: Go,
}

/// A plugin's configuration as Go declares it.
#[derive(Debug, Clone, Copy)]
pub struct Schema {
    /// The plugin's own fields (the envelope's are added: [`ENVELOPE`]).
    pub fields: &'static [Field],
}

/// `types.NetConf` of Debian's cni library (v1.0.1), which every plugin struct embeds; the
/// keys the generator leaves to [`Plan::base`] (`cniVersion`, `name`, `type`, `prevResult`)
/// are mutated there.
pub const ENVELOPE: &[Field] = &[
    Field {
        key: "capabilities",
        go: Go::Map(&["portMappings", "bandwidth", "mac"], &Go::Bool),
    },
    Field {
        key: "ipam",
        go: Go::Struct(&[Field {
            key: "type",
            go: Go::Str(&["", "host-local"]),
        }]),
    },
    Field {
        key: "dns",
        go: Go::Struct(&[
            Field {
                key: "nameservers",
                go: Go::Slice(&Go::Str(&["10.0.0.10", "fd00::10"])),
            },
            Field {
                key: "domain",
                go: Go::Str(&["", "cluster.local"]),
            },
            Field {
                key: "search",
                go: Go::Slice(&Go::Str(&["svc.cluster.local"])),
            },
            Field {
                key: "options",
                go: Go::Slice(&Go::Str(&["ndots:5"])),
            },
        ]),
    },
];

/// Keys no plugin reads.
const UNKNOWN_KEYS: [&str; 6] = ["foo", "kubernetes.io/pod", "x-extra", "vendorData", "0", ""];

/// Numbers that no Go integer or float decodes as a valid port, rate, bit or MTU alike.
const ODD_NUMBERS: [&str; 12] = [
    "0",
    "-1",
    "-0",
    "1.5",
    "1e3",
    "70000",
    "4294967296",
    "18446744073709551616",
    "99999999999999999999999",
    "1e400",
    "-1e400",
    "0.0",
];

/// A key as a configuration may write it: Go's spelling, or another that folds to it.
fn spell(key: &str, rng: &mut Gen) -> String {
    match rng.below(12) {
        0 => quote(&key.to_ascii_uppercase()),
        1 => quote(&key.to_ascii_lowercase()),
        2 => {
            let flipped: String = key
                .chars()
                .map(|c| {
                    if rng.chance(50) {
                        c.to_ascii_uppercase()
                    } else {
                        c.to_ascii_lowercase()
                    }
                })
                .collect();
            quote(&flipped)
        }
        3 => {
            // Go folds the Kelvin sign to `k` and the long s to `s`.
            let folded: String = key
                .chars()
                .map(|c| match c {
                    'k' | 'K' if rng.chance(70) => '\u{212a}',
                    's' | 'S' if rng.chance(70) => '\u{17f}',
                    c => c,
                })
                .collect();
            quote(&folded)
        }
        4 => {
            // A letter written as an escape.
            let mut text = String::from("\"");
            for (i, c) in key.chars().enumerate() {
                if i == 0 && c.is_ascii_alphabetic() {
                    let _ = write!(text, "\\u{:04x}", u32::from(c));
                } else {
                    text.push_str(&quote(&c.to_string())[1..2]);
                }
            }
            text.push('"');
            text
        }
        _ => quote(key),
    }
}

/// A value of `go` that is valid for it.
fn valid(go: Go, rng: &mut Gen, depth: usize) -> Json {
    match go {
        Go::Str(choices) => Json::str(rng.pick(choices)),
        Go::Bool => Json::Bool(rng.chance(50)),
        Go::Int(lo, hi) | Go::Uint(lo, hi) => Json::num(rng.between(lo, hi)),
        Go::Ptr(inner) => valid(*inner, rng, depth),
        Go::Slice(inner) => Json::Arr(
            (0..rng.below(3))
                .map(|_| value(*inner, rng, depth + 1))
                .collect(),
        ),
        Go::Map(keys, inner) => Json::Obj(
            (0..rng.below(3))
                .map(|_| (quote(rng.pick(keys)), value(*inner, rng, depth + 1)))
                .collect(),
        ),
        Go::Struct(fields) => object(fields, &[], rng, depth + 1),
        Go::Any => junk(rng, depth + 1),
    }
}

/// Any value: what an unknown key holds.
fn junk(rng: &mut Gen, depth: usize) -> Json {
    match rng.below(if depth > 3 { 5 } else { 7 }) {
        0 => Json::Null,
        1 => Json::Bool(rng.chance(50)),
        2 => Json::Num(rng.pick(&ODD_NUMBERS).to_owned()),
        3 => Json::str(rng.pick(&["", "x", "é", "\u{0}", "1.0.0"])),
        4 => Json::num(rng.between(-5, 100_000)),
        5 => Json::Arr((0..rng.below(3)).map(|_| junk(rng, depth + 1)).collect()),
        _ => Json::Obj(
            (0..rng.below(3))
                .map(|_| (quote(rng.pick(&UNKNOWN_KEYS)), junk(rng, depth + 1)))
                .collect(),
        ),
    }
}

/// A value of `go`: valid mostly; else `null`, a value of another JSON type, or an odd one.
fn value(go: Go, rng: &mut Gen, depth: usize) -> Json {
    if !rng.chance(15) {
        return valid(go, rng, depth);
    }
    match rng.below(5) {
        0 => Json::Null,
        1 => Json::Num(rng.pick(&ODD_NUMBERS).to_owned()),
        2 => Json::str(rng.pick(&["", "x", "1", "true"])),
        3 => Json::Bool(rng.chance(50)),
        _ => match rng.below(3) {
            0 => Json::Arr(vec![valid(go, rng, depth + 1)]),
            1 => Json::Obj(Vec::new()),
            _ => Json::Arr(vec![Json::Null]),
        },
    }
}

/// An object of `fields`: `base`'s entries (given as valid), then the fields generated, in
/// some order, some spelled otherwise, some written twice, with unknown keys among them.
fn object(fields: &[Field], base: &[(String, Json)], rng: &mut Gen, depth: usize) -> Json {
    let mut entries: Vec<(String, Json)> = Vec::new();
    for (key, value) in base {
        entries.push((quote(key), value.clone()));
    }
    if depth > 4 {
        return Json::Obj(entries);
    }
    for field in fields {
        if !rng.chance(40) {
            continue;
        }
        let times = match rng.below(10) {
            0 => 2,
            1 => 3,
            _ => 1,
        };
        for _ in 0..times {
            let v = if times > 1 && rng.chance(25) {
                Json::Null
            } else {
                value(field.go, rng, depth)
            };
            entries.push((spell(field.key, rng), v));
        }
    }
    if rng.chance(20) {
        entries.push((quote(rng.pick(&UNKNOWN_KEYS)), junk(rng, depth)));
    }
    mix(&mut entries, rng);
    Json::Obj(entries)
}

/// Moves a few entries elsewhere (the order of keys decides which occurrence Go keeps).
fn mix(entries: &mut [(String, Json)], rng: &mut Gen) {
    if entries.is_empty() {
        return;
    }
    for _ in 0..rng.below(3) {
        let (a, b) = (rng.below(entries.len()), rng.below(entries.len()));
        entries.swap(a, b);
    }
}

/// Mutates a base object (a prevResult, runtimeConfig): keys respelled or written twice
/// (as a merge of two objects, or a value and a `null`), values replaced, elements nulled,
/// unknown keys added; nested objects and arrays likewise, less often.
pub fn mutate(value: &Json, rng: &mut Gen, depth: usize) -> Json {
    match value {
        Json::Obj(entries) => {
            let mut out: Vec<(String, Json)> = Vec::new();
            for (key, v) in entries {
                let name: String = serde_json::from_str(key).unwrap_or_default();
                let roll = rng.below(100);
                if roll < 4 {
                    continue;
                }
                let spelled = if rng.chance(15) {
                    spell(&name, rng)
                } else {
                    key.clone()
                };
                if roll < 8 {
                    // Written twice: a null or junk first, or the object split in two.
                    match (v, rng.below(3)) {
                        (Json::Obj(inner), 0) if inner.len() > 1 => {
                            let cut = rng.below(inner.len());
                            out.push((spelled.clone(), Json::Obj(inner[..cut].to_vec())));
                            out.push((spell(&name, rng), Json::Obj(inner[cut..].to_vec())));
                        }
                        (_, 1) => {
                            out.push((spelled.clone(), Json::Null));
                            out.push((spell(&name, rng), mutate(v, rng, depth + 1)));
                        }
                        _ => {
                            out.push((spelled.clone(), junk(rng, depth + 1)));
                            out.push((spell(&name, rng), mutate(v, rng, depth + 1)));
                        }
                    }
                    continue;
                }
                let new = if roll < 11 {
                    junk(rng, depth + 1)
                } else if depth < 6 && rng.chance(50) {
                    mutate(v, rng, depth + 1)
                } else {
                    v.clone()
                };
                out.push((spelled, new));
            }
            if rng.chance(8) {
                out.push((quote(rng.pick(&UNKNOWN_KEYS)), junk(rng, depth + 1)));
            }
            mix(&mut out, rng);
            Json::Obj(out)
        }
        Json::Arr(items) => {
            let mut out: Vec<Json> = items
                .iter()
                .map(|item| {
                    if rng.chance(4) {
                        Json::Null
                    } else if depth < 6 && rng.chance(50) {
                        mutate(item, rng, depth + 1)
                    } else {
                        item.clone()
                    }
                })
                .collect();
            if rng.chance(5) {
                out.clear();
            }
            Json::Arr(out)
        }
        Json::Num(_) if rng.chance(5) => Json::Num(rng.pick(&ODD_NUMBERS).to_owned()),
        Json::Str(_) if rng.chance(3) => Json::str(rng.pick(&["", "x", "10.0.0.1", "::/0"])),
        other => other.clone(),
    }
}

/// The versions a configuration's `cniVersion` is drawn from (both sides list all but the
/// odd ones).
const VERSIONS: [&str; 9] = [
    "1.0.0", "1.0.0", "1.0.0", "0.4.0", "0.3.1", "0.3.0", "0.2.0", "1.0.0.0", "",
];

/// One generated configuration.
#[derive(Debug, Clone)]
pub struct Generated {
    /// Its number in the run.
    pub index: usize,
    /// The text of stdin.
    pub stdin: String,
}

/// A configuration of `plan`'s plugin: the base with the schema's fields generated, its
/// `cniVersion` drawn, and its prevResult converted to that version's era and mutated.
pub fn generate(plan: &Plan, rng: &mut Gen) -> String {
    let version = rng.pick(&VERSIONS);
    let base = (plan.base)(version);
    let mut entries: Vec<(String, Json)> = Vec::new();
    let mut prev = None;
    if let Value::Object(map) = &base {
        for (key, value) in map {
            if key == "prevResult" {
                prev = Some(value.clone());
                continue;
            }
            entries.push((key.clone(), Json::from_value(value)));
        }
    }
    let mut fields: Vec<Field> = ENVELOPE.to_vec();
    fields.extend_from_slice(plan.schema.fields);
    let Json::Obj(mut conf) = object(&fields, &entries, rng, 0) else {
        return base.to_string();
    };
    // The envelope's own keys, sometimes odd.
    for (key, value) in &mut conf {
        let name: String = serde_json::from_str(key).unwrap_or_default();
        if matches!(name.as_str(), "name" | "type") && rng.chance(4) {
            *value = mutate(value, rng, 5);
        }
    }
    if let Some(prev) = prev {
        let prev = Json::from_value(&prev);
        let prev = if rng.chance(70) {
            mutate(&prev, rng, 0)
        } else {
            prev
        };
        if !rng.chance(3) {
            conf.push((spell("prevResult", rng), prev));
        }
    }
    mix(&mut conf, rng);
    Json::Obj(conf).text()
}

/// A difference that is allowed, and when an outcome pair is that difference: a row of the
/// README's differences tables ([`Why::Readme`]), or what HEAD does where Debian's 1.1.1 does
/// not ([`Why::Head`]).
#[derive(Clone, Copy)]
pub struct Known {
    /// Why it is allowed.
    pub why: Why,
    /// Whether `go` and `ours`, for configuration `stdin`, differ as the row says.
    pub applies: fn(stdin: &str, go: &Outcome, ours: &Outcome) -> bool,
}

impl std::fmt::Debug for Known {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Known").field("why", &self.why).finish()
    }
}

/// A plugin's generated tier.
pub struct Plan {
    /// The plugin.
    pub plugin: &'static str,
    /// Its configuration as Go declares it.
    pub schema: Schema,
    /// A configuration that works on the plugin's stage in `cniVersion` (its prevResult in
    /// that version, written for the stage).
    pub base: fn(version: &str) -> Value,
    /// The environment of the decode tier's calls (`CNI_COMMAND` aside).
    pub env: Vec<(&'static str, String)>,
    /// The differences of this plugin the README allows (the decoding's shared ones,
    /// [`shared_known`], are added).
    pub known: Vec<Known>,
    /// Whether both outcomes of a decode-tier call went past the decoding alike (both
    /// succeeded, or both failed only at the netns): such configurations make the kernel
    /// tier.
    pub decoded: fn(go: &Outcome, ours: &Outcome) -> bool,
    /// Whether a configuration that went past the decoding alike suits the kernel tier (one
    /// whose kernel work differs as a README row says is left to the plugin's own cases).
    pub kernel_fits: fn(stdin: &str) -> bool,
    /// How many configurations the decode tier plays by default.
    pub count: usize,
    /// How many the kernel tier plays.
    pub kernel: usize,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("plugin", &self.plugin)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

/// What one configuration gave.
#[derive(Debug)]
struct Played {
    generated: Generated,
    problems: Vec<String>,
    known: Option<Why>,
    decoded: bool,
}

/// The seed of this run.
pub fn seed() -> u64 {
    std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s.parse().ok(),
        })
        .unwrap_or(DEFAULT_SEED)
}

/// The kernel tier's case of a configuration: ADD then DEL (made by `del` from the plain
/// step), the kernel objects compared after each.
pub fn add_then_del<S: Stage>(
    name: String,
    stdin: &str,
    del: impl FnOnce(Step) -> Step,
) -> Case<S> {
    Case::new(name)
        .step(Step::raw(Some("ADD"), stdin).snap())
        .step(del(Step::raw(Some("DEL"), stdin).snap()))
}

/// Plays `plan`: its decode tier, then its kernel tier through `suite`, each configuration a
/// case `kernel_case` makes (the plugin's known kernel differences allowed there).
///
/// # Errors
/// Any difference no README row allows, a row cited that the README lacks, or a harness
/// failure; the message lists each differing configuration and the seed.
pub fn run<S: Stage>(
    plan: &Plan,
    suite: &Suite<S>,
    kernel_case: impl Fn(String, &str) -> Case<S>,
) -> Result<()> {
    let rows = DifferenceRows::of(plan.plugin)?;
    let known: Vec<Known> = plan.known.iter().copied().chain(shared_known()).collect();
    for known in &known {
        if let Why::Readme(row) = known.why
            && !rows.has(row)
        {
            bail!(
                "{}: a known difference cites a row the READMEs lack: {row:?}",
                plan.plugin
            );
        }
    }
    let seed = seed();
    let count = std::env::var(COUNT_ENV)
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(plan.count);
    let mut rng = Gen::new(seed ^ plugin_salt(plan.plugin));
    let configs: Vec<Generated> = (0..count)
        .map(|index| Generated {
            index,
            stdin: generate(plan, &mut rng),
        })
        .collect();
    let started = Instant::now();
    let played = decode_tier(plan, &known, &configs)?;
    let decode_seconds = started.elapsed().as_secs_f64();
    let mut known: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    let mut failing = Vec::new();
    for p in &played {
        if let Some(why) = p.known {
            let why = match why {
                Why::Readme(row) => format!("README: {row}"),
                Why::Head(text) => format!("HEAD: {text}"),
            };
            *known.entry(why).or_default() += 1;
        } else if !p.problems.is_empty() {
            failing.push(p);
        }
    }
    let kernel: Vec<&Generated> = played
        .iter()
        .filter(|p| p.decoded && (p.problems.is_empty() || p.known.is_some()))
        .filter(|p| (plan.kernel_fits)(&p.generated.stdin) && versions_fit(&p.generated.stdin))
        .map(|p| &p.generated)
        .take(plan.kernel)
        .collect();
    let started = Instant::now();
    let cases: Vec<Case<S>> = kernel
        .iter()
        .map(|g| kernel_case(format!("generated {seed:#x} #{}", g.index), &g.stdin))
        .collect();
    let kernel_result = suite.run(cases);
    let kernel_seconds = started.elapsed().as_secs_f64();
    let same = played.len() - failing.len() - known.values().sum::<usize>();
    eprintln!(
        "generated {}: seed {seed:#x}, {} configurations: {same} alike, {} differ as the README says, {} differ; decode tier {decode_seconds:.1}s; kernel tier {} configurations, {kernel_seconds:.1}s",
        plan.plugin,
        played.len(),
        known.values().sum::<usize>(),
        failing.len(),
        kernel.len(),
    );
    for (row, n) in &known {
        eprintln!("generated {}:   {n:>4} × {row}", plan.plugin);
    }
    if !failing.is_empty() {
        let mut text = format!(
            "{} of {} generated {} configurations (seed {seed:#x}, {SEED_ENV}={seed}) differ from Go, and no README row allows it:\n",
            failing.len(),
            played.len(),
            plan.plugin
        );
        for p in failing.iter().take(25) {
            let _ = writeln!(text, "\n=== #{}: {}", p.generated.index, p.generated.stdin);
            for problem in &p.problems {
                let _ = writeln!(text, "  * {problem}");
            }
        }
        bail!("{text}");
    }
    kernel_result.with_context(|| {
        let mut text = format!("the kernel tier of seed {seed:#x} ({SEED_ENV}={seed}), of:");
        for g in &kernel {
            let _ = write!(text, "\n#{}: {}", g.index, g.stdin);
        }
        text
    })
}

/// A different stream per plugin from one seed.
fn plugin_salt(plugin: &str) -> u64 {
    plugin.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Workers of the decode tier (each runs its two sides at the same time).
const WORKERS: usize = 2;

/// Plays every configuration on both sides, `WORKERS` at a time, each worker with a host
/// namespace per side.
fn decode_tier(plan: &Plan, known: &[Known], configs: &[Generated]) -> Result<Vec<Played>> {
    let next = AtomicUsize::new(0);
    let played: Mutex<Vec<Played>> = Mutex::new(Vec::new());
    let failure: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                let result = (|| -> Result<()> {
                    let go_host = TestNetns::new("rng-go")?;
                    let our_host = TestNetns::new("rng-ours")?;
                    let go = Runtime::new(&go_host)?;
                    let ours = Runtime::new(&our_host)?;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(config) = configs.get(i) else {
                            return Ok(());
                        };
                        let p = play(plan, known, config, &go, &ours)?;
                        played.lock().map_err(|_| anyhow!("poisoned"))?.push(p);
                    }
                })();
                if let Err(e) = result
                    && let Ok(mut f) = failure.lock()
                {
                    f.get_or_insert(e);
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().map_err(|_| anyhow!("poisoned"))? {
        return Err(e);
    }
    let mut played = played.into_inner().map_err(|_| anyhow!("poisoned"))?;
    played.sort_by_key(|p| p.generated.index);
    Ok(played)
}

/// Plays one configuration on both sides and compares.
fn play(
    plan: &Plan,
    known: &[Known],
    config: &Generated,
    go: &Runtime,
    ours: &Runtime,
) -> Result<Played> {
    let env: Vec<(&str, &str)> = plan.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (go_out, our_out) = std::thread::scope(|scope| {
        let g = scope.spawn(|| {
            let bin = Impl::Go.binary(plan.plugin)?;
            go.exec_plugin(
                &bin.to_string_lossy(),
                Some("ADD"),
                &env,
                config.stdin.as_bytes(),
            )
        });
        let o = Impl::Ours.binary(plan.plugin).and_then(|bin| {
            ours.exec_plugin(
                &bin.to_string_lossy(),
                Some("ADD"),
                &env,
                config.stdin.as_bytes(),
            )
        });
        (g.join(), o)
    });
    let go_out = outcome(
        Impl::Go,
        &go_out.map_err(|_| anyhow!("the Go side panicked"))??,
    );
    let our_out = outcome(Impl::Ours, &our_out?);
    let mut problems = compare_outcomes(&go_out, &our_out, false);
    problems.extend(rust_names(&our_out));
    let known = if problems.is_empty() {
        None
    } else {
        known
            .iter()
            .find(|k| (k.applies)(&config.stdin, &go_out, &our_out))
            .map(|k| k.why)
    };
    Ok(Played {
        generated: config.clone(),
        decoded: (plan.decoded)(&go_out, &our_out),
        problems,
        known,
    })
}

/// An outcome as `differential` compares them.
fn outcome(by: Impl, out: &PluginOutput) -> Outcome {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut json = serde_json::from_str::<Value>(&stdout).ok();
    if by == Impl::Go {
        json = json.as_ref().map(as_head_prints);
    }
    Outcome {
        by,
        exit: out.status.code(),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        json,
    }
}

/// Words of Rust's in our error's `msg` or `details`, which no user may see: serde's names of
/// values and Rust's names of types (Go's are `uint16`, `main.PortMapEntry`, `struct { … }`).
fn rust_names(ours: &Outcome) -> Vec<String> {
    const PHRASES: [&str; 8] = [
        "expected struct [A-Z]",
        "expected enum",
        "unit value",
        "a sequence",
        "a map",
        "integer `",
        "floating point `",
        "expected a boolean",
    ];
    const WORDS: [&str; 16] = [
        "u8", "u16", "u32", "u64", "u128", "i8", "i16", "i32", "i64", "usize", "isize", "f32",
        "f64", "Option", "Vec", "HashMap",
    ];
    let Some(err) = ours.error() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for text in [&err.msg, &err.details] {
        let words: Vec<&str> = text
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .collect();
        for phrase in PHRASES {
            let named = match phrase.strip_suffix(" [A-Z]") {
                // A Rust struct's name, not Go's anonymous `struct { … }`.
                Some(lead) => text.match_indices(lead).any(|(i, _)| {
                    text[i + lead.len()..].starts_with(' ')
                        && text[i + lead.len() + 1..].starts_with(|c: char| c.is_ascii_uppercase())
                }),
                None => text.contains(phrase),
            };
            if named {
                found.push(format!("ours names a Rust type ({phrase:?}): {text:?}"));
            }
        }
        for word in WORDS {
            if words.contains(&word) {
                found.push(format!("ours names a Rust type ({word:?}): {text:?}"));
            }
        }
    }
    found
}

/// Whether an outcome is the Go runtime's crash (a panic: no error object, exit 2).
pub fn go_crashed(go: &Outcome) -> bool {
    go.exit == Some(2) && go.stderr.contains("panic:")
}

/// Whether an outcome is a failure whose `msg` contains `text`.
pub fn fails_with(outcome: &Outcome, text: &str) -> bool {
    !outcome.success() && outcome.error().is_some_and(|e| e.msg.contains(text))
}

/// Whether an outcome failed opening a `CNI_NETNS` that does not exist (the decode tier's).
pub fn failed_at_netns(outcome: &Outcome) -> bool {
    fails_with(outcome, "no such file or directory")
        && outcome
            .error()
            .is_some_and(|e| e.msg.contains(MISSING_NETNS))
}

/// The `CNI_NETNS` of the decode tier of plugins that enter it: no kernel work follows. Under
/// a directory that does not exist, where no plugin can leave a file (Go's `sbr` leaves an
/// empty one at a `CNI_NETNS` that is gone).
pub const MISSING_NETNS: &str = "/nonexistent-cni-generated/netns";

/// `conf` (a 1.0.0 config working on the stage) in `version`, its prevResult converted to
/// that version's era (a version that is none keeps the 1.0.0 one).
pub fn base_in(conf: &Value, version: &str) -> Value {
    let mut conf = crate::differential::in_version(conf, version)
        .or_else(|_| crate::differential::in_version(conf, "1.0.0"))
        .unwrap_or_else(|_| conf.clone());
    conf["cniVersion"] = Value::String(version.to_owned());
    conf
}

/// Both sides went past the decoding alike: both succeeded, or both failed only at the
/// decode tier's missing `CNI_NETNS`.
pub fn past_decoding(go: &Outcome, ours: &Outcome) -> bool {
    (go.success() && ours.success()) || (failed_at_netns(go) && failed_at_netns(ours))
}

/// The decode tier's environment: attachment `id` on `ifname`, in a `CNI_NETNS` that does not
/// exist.
pub fn decode_env(id: &str, ifname: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_CONTAINERID", id.to_owned()),
        ("CNI_IFNAME", ifname.to_owned()),
        ("CNI_NETNS", MISSING_NETNS.to_owned()),
        ("CNI_PATH", "/usr/lib/cni".to_owned()),
    ]
}

/// The top-level README's row of a prevResult value of the wrong JSON type.
pub const PREV_TYPES: &str = "a prevResult value of the wrong JSON type";
/// The top-level README's row of a `null` element in a prevResult.
pub const PREV_NULL: &str = "a `null` element in a prevResult's `interfaces`, `ips` or `routes`";
/// The top-level README's row of a 0.3.x/0.4.0 IP `version`.
pub const IP_VERSION: &str = "a 0.3.x/0.4.0 prevResult whose IP `version` is missing";
/// The top-level README's row of an empty string for an optional key.
pub const EMPTY_STRING: &str = "`\"\"` for an optional number, bool, slice or struct key";
/// The top-level README's row of a negative interface index.
pub const NEGATIVE_INDEX: &str = "an IP's negative `interface` index is kept";
/// HEAD's 1.x result type (1.1.1 supports 1.0.0 only).
pub const HEAD_PREV_FAMILY: &str = "reference-behaviour.md §1.7: HEAD's 1.x result type supports [1.0.0 1.1.0]; 1.1.1's only [1.0.0]";

/// The `msg` of a failure, or nothing.
pub fn msg(outcome: &Outcome) -> String {
    if outcome.success() {
        return String::new();
    }
    outcome.error().map(|e| e.msg).unwrap_or_default()
}

/// The Go field a `cannot unmarshal … into Go struct field S.a.b of type T` names, as the
/// last segment of its path (`b`).
fn go_field(go_msg: &str) -> Option<&str> {
    let rest = go_msg.split("Go struct field ").nth(1)?;
    let path = rest.split(" of type ").next()?;
    path.rsplit('.').next()
}

/// `stdin` with its `\u00XX` escapes of ASCII letters undone, lower-cased: what keys look
/// like to Go's case-insensitive matching.
pub fn folded(stdin: &str) -> String {
    let mut out = String::with_capacity(stdin.len());
    let mut rest = stdin;
    while let Some(i) = rest.find("\\u00") {
        out.push_str(&rest[..i]);
        let hex = rest.get(i + 2..i + 6).unwrap_or_default();
        match u32::from_str_radix(hex, 16).ok().and_then(char::from_u32) {
            Some(c) if c.is_ascii_alphanumeric() => {
                out.push(c);
                rest = &rest[i + 6..];
            }
            _ => {
                out.push_str(&rest[i..i + 2]);
                rest = &rest[i + 2..];
            }
        }
    }
    out.push_str(rest);
    out.to_ascii_lowercase()
        .replace('\u{17f}', "s")
        .replace('\u{212a}', "k")
}

/// Whether every IP of `stdin`'s prevResult that has a `version` has its address's: Go prints
/// a wrong one back where a plugin passes the prevResult on, ours the address's (the
/// top-level README's row, [`IP_VERSION`]), so the kernel tier leaves such configurations to
/// the decode tier.
fn versions_fit(stdin: &str) -> bool {
    let Ok(conf) = serde_json::from_str::<Value>(stdin) else {
        return true;
    };
    let ips = go_values(&conf, "prevResult")
        .into_iter()
        .flat_map(|prev| go_values(prev, "ips"))
        .filter_map(Value::as_array)
        .flatten();
    ips.into_iter().all(|ip| {
        let family = go_values(ip, "address")
            .into_iter()
            .filter_map(Value::as_str)
            .filter_map(|a| a.split('/').next()?.parse::<std::net::IpAddr>().ok())
            .map(|a| if a.is_ipv4() { "4" } else { "6" })
            .next_back();
        go_values(ip, "version")
            .into_iter()
            .all(|v| v.is_null() || family.is_some_and(|f| v == f))
    })
}

/// Any configuration suits the kernel tier ([`Plan::kernel_fits`]).
pub fn any(_stdin: &str) -> bool {
    true
}

/// The value of `object`'s key `name`, in its exact spelling or else in any Go matches
/// (case folded): near enough to pick configurations for the kernel tier.
pub fn go_key<'v>(object: &'v Value, name: &str) -> Option<&'v Value> {
    let object = object.as_object()?;
    object.get(name).or_else(|| {
        object
            .iter()
            .find(|(k, _)| folded(k) == name.to_ascii_lowercase())
            .map(|(_, v)| v)
    })
}

/// The values of every key of `object` Go matches to `name` (case folded), each spelling's
/// last (`serde_json` keeps the last of exact duplicates).
pub fn go_values<'v>(object: &'v Value, name: &str) -> Vec<&'v Value> {
    object.as_object().map_or_else(Vec::new, |object| {
        object
            .iter()
            .filter(|(k, _)| folded(k) == name.to_ascii_lowercase())
            .map(|(_, v)| v)
            .collect()
    })
}

/// The differences of the decoding every plugin shares (the top-level README's table).
pub fn shared_known() -> Vec<Known> {
    vec![
        Known {
            why: Why::Readme(PREV_TYPES),
            applies: |_, go, ours| {
                let (g, o) = (msg(go), msg(ours));
                g.contains("could not parse prevResult: json: cannot unmarshal")
                    && o.contains("could not parse prevResult: ")
                    && !o.contains("json: cannot unmarshal")
            },
        },
        Known {
            why: Why::Readme(PREV_NULL),
            applies: |_, _, ours| {
                let o = msg(ours);
                (o.contains("could not parse prevResult: element ") && o.ends_with(" is null"))
                    || o.contains("could not parse prevResult: missing field `")
            },
        },
        Known {
            why: Why::Readme(NEGATIVE_INDEX),
            applies: |_, _, ours| msg(ours).contains("negative interface index"),
        },
        Known {
            why: Why::Readme(IP_VERSION),
            applies: |_, go, ours| match (&go.json, &ours.json) {
                (Some(g), Some(o)) if go.success() && ours.success() => {
                    without_ip_versions(g) == without_ip_versions(o)
                }
                _ => false,
            },
        },
        Known {
            why: Why::Head(HEAD_PREV_FAMILY),
            applies: |_, go, ours| {
                msg(go).contains("result type supports [1.0.0] but")
                    && msg(ours).contains("result type supports [1.0.0 1.1.0] but")
            },
        },
        Known {
            why: Why::Readme(EMPTY_STRING),
            applies: |stdin, go, _| {
                let g = msg(go);
                let empty = |field: &str| {
                    folded(stdin).contains(&format!("\"{}\": \"\"", field.to_ascii_lowercase()))
                };
                (g.contains("cannot unmarshal") && go_field(&g).is_some_and(empty))
                    // A prevResult's error names the outer field (README's PREV_TYPES row).
                    || (g.contains("cannot unmarshal string into Go struct field Result.")
                        && ["interface", "table", "scope", "routes", "ips", "interfaces", "dns"]
                            .into_iter()
                            .any(empty))
                    || ((g.contains("Cannot specify externalSetMarkChain and markMasqBit")
                        || g.contains("Invalid target name (too short)"))
                        && empty("externalSetMarkChain"))
            },
        },
    ]
}

/// A result without the `version` of its IPs.
fn without_ip_versions(result: &Value) -> Value {
    let mut result = result.clone();
    if let Some(ips) = result.get_mut("ips").and_then(Value::as_array_mut) {
        for ip in ips {
            if let Some(o) = ip.as_object_mut() {
                o.remove("version");
            }
        }
    }
    result
}
