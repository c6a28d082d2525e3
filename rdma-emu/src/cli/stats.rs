//! Latency statistics as perftest prints them, and the process's peak memory.

/// min, typical (median), max, average, standard deviation, 99% and 99.9%
/// percentiles of a set of latencies in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LatStats {
    pub(crate) min: f64,
    pub(crate) typical: f64,
    pub(crate) max: f64,
    pub(crate) avg: f64,
    pub(crate) stdev: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
}

impl LatStats {
    /// The statistics of `samples` (sorted in place); all zero when empty.
    pub(crate) fn of(samples: &mut [f64]) -> LatStats {
        if samples.is_empty() {
            return LatStats::default();
        }
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let avg = samples.iter().sum::<f64>() / n as f64;
        let var = samples.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        let pct = |p: f64| samples[(((n as f64) * p).ceil() as usize).clamp(1, n) - 1];
        LatStats {
            min: samples[0],
            typical: samples[n / 2],
            max: samples[n - 1],
            avg,
            stdev: var.sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
        }
    }
}

/// The process's peak resident set (VmHWM) in KiB, where /proc has it.
pub(crate) fn peak_rss_kib() -> Option<u64> {
    proc_status_kib("VmHWM:")
}

/// The process's resident set now (VmRSS) in KiB.
pub(crate) fn rss_kib() -> Option<u64> {
    proc_status_kib("VmRSS:")
}

fn proc_status_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_one_to_a_thousand() {
        let mut v: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let s = LatStats::of(&mut v);
        assert_eq!((s.min, s.max, s.typical), (1.0, 1000.0, 501.0));
        assert_eq!((s.p99, s.p999), (990.0, 999.0));
        assert!((s.avg - 500.5).abs() < 1e-9);
        assert!((s.stdev - 288.674_990_7).abs() < 1e-6);
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(LatStats::of(&mut []), LatStats::default());
    }

    #[test]
    fn rss_is_readable_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(peak_rss_kib().unwrap() >= rss_kib().unwrap() / 2);
        }
    }
}
