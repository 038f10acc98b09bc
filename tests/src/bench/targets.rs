//! The speed targets the plugin issues set, in one table ([`TARGETS`]), and their verdicts on a
//! run's [`Results`]. The report derives its targets section from here; nothing is written by
//! hand.
//!
//! Three kinds of target:
//! - [`Measure::Ratio`]: ours / Go of the medians of one row (a case and verb of a suite).
//! - [`Measure::Memory`]: ours / Go of the peak RSS or of the median time of one plugin's row
//!   of the `memory` suite ([`super::memory::TARGETS`]).
//! - [`Measure::Time`]: our median of one row, in milliseconds.
//! - [`Measure::Growth`]: a scale series' median at N others over its median at 0 others, for
//!   one step. It is evaluated at exactly N, never at the nearest size run: the scale suites
//!   run 0 always and add N when the largest requested size reaches it
//!   ([`super::Options::scale_sizes`]); otherwise the verdict is "not measured".

use super::{OURS_IPTABLES, OURS_NFTABLES, Results, Samples, firewall, memory, portmap, sbr};

/// What a target limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Ours / Go of the medians of the row (`suite`, `case`, `step`).
    Ratio {
        /// The suite.
        suite: &'static str,
        /// The row's case.
        case: &'static str,
        /// The verb.
        step: &'static str,
    },
    /// Our median of the row (`suite`, `case`, `step`), in milliseconds.
    Time {
        /// The suite.
        suite: &'static str,
        /// The row's case.
        case: &'static str,
        /// The step.
        step: &'static str,
    },
    /// The median of `step` of scale series `series` at `others` others over that at 0.
    Growth {
        /// The suite.
        suite: &'static str,
        /// The scale series.
        series: &'static str,
        /// `ADD` or `DEL`.
        step: &'static str,
        /// Others installed.
        others: usize,
    },
    /// Ours / Go of `of` in the `memory` suite's row of `plugin`'s ADD with stdin `case`.
    Memory {
        /// The plugin.
        plugin: &'static str,
        /// The shape and size of stdin.
        case: &'static str,
        /// Peak RSS or time.
        of: Resource,
    },
}

/// What a [`Measure::Memory`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// The largest peak RSS of the execs.
    PeakRss,
    /// The median wall time.
    Time,
}

/// An upper bound on a measure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// What is measured.
    pub measure: Measure,
    /// The largest value that meets the target.
    pub limit: f64,
}

const fn ratio(suite: &'static str, case: &'static str, step: &'static str, limit: f64) -> Target {
    Target {
        measure: Measure::Ratio { suite, case, step },
        limit,
    }
}

const fn time(suite: &'static str, case: &'static str, step: &'static str, ms: f64) -> Target {
    Target {
        measure: Measure::Time { suite, case, step },
        limit: ms,
    }
}

const fn growth(
    suite: &'static str,
    series: &'static str,
    step: &'static str,
    others: usize,
    limit: f64,
) -> Target {
    Target {
        measure: Measure::Growth {
            suite,
            series,
            step,
            others,
        },
        limit,
    }
}

/// The targets of the plugin issues, in report order.
pub const TARGETS: &[Target] = &[
    ratio("tuning", super::tuning::CASE, "ADD", 0.35),
    ratio("tuning", super::tuning::CASE, "CHECK", 0.35),
    ratio("tuning", super::tuning::CASE, "DEL", 0.35),
    ratio("bandwidth", super::bandwidth::CASE, "ADD", 0.35),
    ratio("bandwidth", super::bandwidth::CASE, "CHECK", 0.35),
    // Issue 21: the kernel's IFB deletion dominates both DELs.
    ratio("bandwidth", super::bandwidth::CASE, "DEL", 1.0),
    ratio("sbr", sbr::CASE_MOVES, "ADD", 0.35),
    ratio("sbr", sbr::CASE_MOVES, "CHECK", 0.35),
    ratio("sbr", sbr::CASE_MOVES, "DEL", 0.35),
    ratio("sbr", sbr::CASE_RULE, "ADD", 0.35),
    ratio("sbr", sbr::CASE_RULE, "CHECK", 0.35),
    ratio("sbr", sbr::CASE_RULE, "DEL", 0.35),
    ratio("firewall", firewall::CASE_IPTABLES, "ADD", 0.2),
    ratio("firewall", firewall::CASE_IPTABLES, "CHECK", 0.2),
    // Issue 21: DEL returns when its work is done, at most 0.1x Go, both backends.
    ratio("firewall", firewall::CASE_IPTABLES, "DEL", 0.1),
    ratio("firewall", firewall::CASE_NFTABLES, "ADD", 0.07),
    ratio("firewall", firewall::CASE_NFTABLES, "CHECK", 0.07),
    ratio("firewall", firewall::CASE_NFTABLES, "DEL", 0.1),
    growth("firewall", OURS_IPTABLES, "ADD", 500, 1.3),
    growth("firewall", OURS_NFTABLES, "ADD", 500, 1.3),
    growth("firewall", OURS_IPTABLES, "DEL", 5000, 1.3),
    ratio("portmap", portmap::CASE_NFTABLES, "ADD", 0.05),
    ratio("portmap", portmap::CASE_NFTABLES, "CHECK", 0.05),
    // Issue 21: portmap DEL at most a tenth of Go's.
    ratio("portmap", portmap::CASE_NFTABLES, "DEL", 0.1),
    // Issue 20: the reference layout written natively, a twentieth of Go's.
    ratio("portmap", portmap::CASE_IPTABLES, "ADD", 0.05),
    ratio("portmap", portmap::CASE_IPTABLES, "CHECK", 0.05),
    ratio("portmap", portmap::CASE_IPTABLES, "DEL", 0.05),
    growth("portmap", OURS_NFTABLES, "ADD", 1000, 1.3),
    growth("portmap", OURS_NFTABLES, "DEL", 1000, 1.3),
    growth("portmap", OURS_IPTABLES, "ADD", 1000, 1.3),
    growth("portmap", OURS_IPTABLES, "DEL", 1000, 1.3),
    // Issue 22 #3: the listing paths at 16 000 elements.
    time("portmap", portmap::CASE_DEL_WITHOUT_STATE, "DEL", 100.0),
    time("portmap", portmap::CASE_GC, "GC", 100.0),
];

/// Every target: [`TARGETS`], then the memory suite's.
pub fn all() -> impl Iterator<Item = &'static Target> {
    TARGETS.iter().chain(memory::TARGETS.iter())
}

/// The sizes `suite`'s growth targets name.
#[must_use]
pub fn scale_sizes_of(suite: &str) -> Vec<usize> {
    TARGETS
        .iter()
        .filter_map(|t| match t.measure {
            Measure::Growth {
                suite: s, others, ..
            } if s == suite => Some(others),
            _ => None,
        })
        .collect()
}

impl Target {
    /// The suite the target belongs to.
    #[must_use]
    pub fn suite(&self) -> &'static str {
        match self.measure {
            Measure::Ratio { suite, .. }
            | Measure::Time { suite, .. }
            | Measure::Growth { suite, .. } => suite,
            Measure::Memory { .. } => memory::SUITE,
        }
    }

    /// The unit of the measure and its limit: `×` for a ratio, ` ms` for a time.
    #[must_use]
    pub fn unit(&self) -> &'static str {
        match self.measure {
            Measure::Time { .. } => " ms",
            _ => "×",
        }
    }

    /// What is measured, in words (`tuning ADD ours/Go (mac+mtu+…)`).
    #[must_use]
    pub fn describe(&self) -> String {
        match self.measure {
            Measure::Ratio { suite, case, step } => format!("{suite} {step}, ours/Go ({case})"),
            Measure::Time { suite, case, step } => format!("{suite} {step}, ours in ms ({case})"),
            Measure::Growth {
                suite,
                series,
                step,
                others,
            } => format!("{suite} {step}, {series}: {others} others / 0 others"),
            Measure::Memory { plugin, case, of } => {
                let what = match of {
                    Resource::PeakRss => "peak RSS",
                    Resource::Time => "time",
                };
                format!("{plugin} ADD {what}, ours/Go ({case})")
            }
        }
    }

    /// The measured value on `results`, or why there is none.
    ///
    /// # Errors
    /// A sentence saying what was not run.
    pub fn measure<'a>(&self, results: &'a Results) -> Result<f64, String> {
        match self.measure {
            Measure::Ratio { suite, case, step } => row(results, suite, case, step)?
                .ratio()
                .ok_or_else(|| "not measured: no Go timings".to_owned()),
            Measure::Time { suite, case, step } => {
                let row = row(results, suite, case, step)?;
                if row.ours.is_empty() {
                    return Err("not measured: no timings".to_owned());
                }
                Ok(row.ours.median().as_secs_f64() * 1e3)
            }
            Measure::Growth {
                suite,
                series,
                step,
                others,
            } => {
                let pick =
                    |add: &'a Samples, del: &'a Samples| if step == "DEL" { del } else { add };
                let point = |n: usize| {
                    results
                        .scale
                        .iter()
                        .find(|p| p.suite == suite && p.series == series && p.others == n)
                };
                let grown_point = point(others);
                // The base timed alongside the size, else the series' own point at 0.
                let base = grown_point
                    .and_then(|p| p.alongside.as_ref())
                    .map(|a| pick(&a.add, &a.del))
                    .or_else(|| point(0).map(|p| pick(&p.add, &p.del)));
                let (Some(base), Some(grown)) = (base, grown_point.map(|p| pick(&p.add, &p.del)))
                else {
                    return Err(format!(
                        "not measured: the {suite} series did not run 0 and {others} others \
                         (run --sizes with a size of at least {others})"
                    ));
                };
                super::ratio(grown, base).ok_or_else(|| "not measured: no timings".to_owned())
            }
            Measure::Memory { plugin, case, of } => {
                let step = memory::step_name(plugin);
                let row = results
                    .rows
                    .iter()
                    .find(|r| r.suite == memory::SUITE && r.case == case && r.step == step)
                    .ok_or_else(|| {
                        format!("not measured: no {step} with {case} (run --memory-sizes with it)")
                    })?;
                match of {
                    Resource::Time => row
                        .ratio()
                        .ok_or_else(|| "not measured: no Go timings".to_owned()),
                    Resource::PeakRss => {
                        match (row.ours.peak_rss_kib(), row.reference.peak_rss_kib()) {
                            #[allow(clippy::cast_precision_loss)]
                            (Some(ours), Some(go)) if go > 0 => Ok(ours as f64 / go as f64),
                            _ => Err("not measured: no peak RSS".to_owned()),
                        }
                    }
                }
            }
        }
    }
}

/// The row (`suite`, `case`, `step`) of `results`, or why there is none.
fn row<'a>(
    results: &'a Results,
    suite: &str,
    case: &str,
    step: &str,
) -> Result<&'a super::Row, String> {
    results
        .rows
        .iter()
        .find(|r| r.suite == suite && r.case == case && r.step == step)
        .ok_or_else(|| format!("not measured: suite {suite} not run"))
}

/// A target's outcome on one run.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The target.
    pub target: Target,
    /// The measured value, or why there is none.
    pub value: Result<f64, String>,
}

impl Verdict {
    /// Met (`Some(true)`), missed (`Some(false)`), or not measured (`None`).
    #[must_use]
    pub fn met(&self) -> Option<bool> {
        self.value.as_ref().ok().map(|v| *v <= self.target.limit)
    }

    /// `met`, `missed`, or the reason it was not measured.
    #[must_use]
    pub fn status(&self) -> String {
        match (&self.value, self.met()) {
            (Ok(_), Some(true)) => "met".to_owned(),
            (Ok(_), _) => "**missed**".to_owned(),
            (Err(why), _) => why.clone(),
        }
    }
}

/// The verdict of every target whose suite was run (`suites`).
#[must_use]
pub fn evaluate(results: &Results, suites: &[&str]) -> Vec<Verdict> {
    all()
        .filter(|t| suites.contains(&t.suite()))
        .map(|t| Verdict {
            target: *t,
            value: t.measure(results),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bench::{Install, Row, Sample, ScalePoint};

    fn ms(values: &[u64]) -> Samples {
        Samples(
            values
                .iter()
                .map(|&m| Sample {
                    elapsed: Duration::from_millis(m),
                    max_rss_kib: Some(1024),
                })
                .collect(),
        )
    }

    fn point(series: &str, others: usize, add: u64) -> ScalePoint {
        ScalePoint {
            suite: "firewall".into(),
            series: series.into(),
            reference: false,
            others,
            add: ms(&[add]),
            del: ms(&[1]),
            install: Install {
                by: series.into(),
                own: true,
                samples: Samples::default(),
            },
            alongside: None,
        }
    }

    #[test]
    fn targets_limit_known_verbs_and_name_their_scale_sizes() {
        for t in all() {
            let step = match t.measure {
                Measure::Ratio { step, .. }
                | Measure::Time { step, .. }
                | Measure::Growth { step, .. } => step,
                Measure::Memory { .. } => "ADD",
            };
            assert!(["ADD", "CHECK", "DEL", "GC"].contains(&step), "{t:?}");
            assert!(t.limit > 0.0, "{t:?}");
        }
        assert_eq!(scale_sizes_of("firewall"), [500, 500, 5000]);
        assert_eq!(scale_sizes_of("portmap"), [1000; 4]);
        assert!(scale_sizes_of("tuning").is_empty());
    }

    #[test]
    fn verdicts_compare_against_the_limit_and_say_what_was_not_run() {
        let results = Results {
            rows: vec![Row {
                suite: "tuning".into(),
                case: crate::bench::tuning::CASE.into(),
                step: "ADD".into(),
                ours: ms(&[1]),
                reference: ms(&[4]),
                reference_label: "Go tuning".into(),
            }],
            scale: vec![
                point(OURS_IPTABLES, 0, 10),
                point(OURS_IPTABLES, 500, 14),
                point(OURS_NFTABLES, 0, 10),
                point(OURS_NFTABLES, 500, 12),
            ],
            notes: Vec::new(),
        };
        let verdicts = evaluate(&results, &["tuning", "firewall"]);
        let find = |d: &str| {
            verdicts
                .iter()
                .find(|v| v.target.describe() == d)
                .unwrap()
                .clone()
        };
        let add = find("tuning ADD, ours/Go (mac+mtu+promisc+2 sysctls)");
        assert_eq!(add.value, Ok(0.25));
        assert_eq!(add.status(), "met");
        let check = find("tuning CHECK, ours/Go (mac+mtu+promisc+2 sysctls)");
        assert_eq!(check.met(), None);
        assert!(
            check.status().contains("not measured"),
            "{}",
            check.status()
        );
        let ipt = find("firewall ADD, ours iptables: 500 others / 0 others");
        assert_eq!(ipt.met(), Some(false));
        assert_eq!(ipt.status(), "**missed**");
        let nft = find("firewall ADD, ours nftables: 500 others / 0 others");
        assert_eq!(nft.met(), Some(true));
        assert!(verdicts.iter().all(|v| v.target.suite() != "portmap"));
    }

    #[test]
    fn growth_divides_by_the_base_timed_alongside_when_there_is_one() {
        let mut grown = point(OURS_IPTABLES, 500, 14);
        grown.alongside = Some(crate::bench::Alongside {
            add: ms(&[12]),
            del: ms(&[1]),
        });
        let results = Results {
            rows: Vec::new(),
            scale: vec![point(OURS_IPTABLES, 0, 10), grown],
            notes: Vec::new(),
        };
        let verdicts = evaluate(&results, &["firewall"]);
        let ipt = verdicts
            .iter()
            .find(|v| v.target.describe() == "firewall ADD, ours iptables: 500 others / 0 others")
            .unwrap();
        assert_eq!(ipt.value, Ok(14.0 / 12.0), "not 14/10 from the point at 0");
        assert_eq!(ipt.met(), Some(true));
    }
}
