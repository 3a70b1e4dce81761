//! nccl-tests 2.19.6's output, character for character (`src/util.cu`): the table header,
//! the line preamble `size count type redop root`, the bodies `time algbw busbw #wrong` for
//! out of place and in place (plus `i_min i_max i_p99 i_cv%` with `-I 1`), the footer, and
//! its JSON document (version 3, the same keys in the same order).

use serde::Serialize;

/// C's `%g` (6 significant digits, trailing zeros removed).
pub(crate) fn fmt_g(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if !v.is_finite() {
        return if v.is_nan() {
            "nan".into()
        } else if v > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    const P: i32 = 6;
    let e = format!("{:.*e}", (P - 1) as usize, v);
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let x: i32 = exp.parse().unwrap_or(0);
    if (-4..P).contains(&x) {
        let prec = (P - 1 - x).max(0) as usize;
        let s = format!("{v:.prec$}");
        strip_zeros(&s)
    } else {
        let m = strip_zeros(mant);
        let sign = if x < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", x.abs())
    }
}

fn strip_zeros(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s.to_string()
    }
}

/// C's `%*.<p>e` with a two-digit exponent at least.
fn fmt_e(v: f64, prec: usize) -> String {
    let e = format!("{v:.prec$e}");
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let x: i32 = exp.parse().unwrap_or(0);
    let sign = if x < 0 { '-' } else { '+' };
    format!("{mant}e{sign}{:02}", x.abs())
}

/// nccl-tests' `getFloatStr`: the value in `width` characters, with 2, 1 or 0 decimals, or
/// in exponent form when even those do not fit.
pub(crate) fn float_str(v: f64, width: usize) -> String {
    for p in [2usize, 1, 0] {
        let s = format!("{v:>width$.p$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = fmt_e(v, if width >= 7 { 1 } else { 0 });
    let s = format!("{s:>width$}");
    s.chars().take(width).collect()
}

/// `size count type redop root`.
pub(crate) fn preamble(bytes: usize, count: usize, ty: &str, op: &str, root: i64) -> String {
    let root = format!("{root:>6}");
    format!("{bytes:>12}  {count:>12}  {ty:>8}  {op:>6}  {root:>6}")
}

/// `time algbw busbw #wrong` (wrong `None`: not checked, `N/A`).
pub(crate) fn body(time_us: f64, algbw: f64, busbw: f64, wrong: Option<u64>) -> String {
    let (t, a, b) = (
        float_str(time_us, 7),
        float_str(algbw, 6),
        float_str(busbw, 6),
    );
    match wrong {
        Some(w) => format!("  {t:>7}  {a:>6}  {b:>6}  {:>6}", fmt_g(w as f64)),
        None => format!("  {t:>7}  {a:>6}  {b:>6}    N/A"),
    }
}

/// Per-iteration statistics (`-I 1`), in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct IterStats {
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) avg: f64,
    pub(crate) p50: f64,
    pub(crate) p95: f64,
    pub(crate) p99: f64,
    pub(crate) stdev: f64,
}

/// nccl-tests' `computeIterStats` (nearest-rank percentiles).
pub(crate) fn iter_stats(times: &[f64]) -> IterStats {
    let mut s = times.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len().max(1);
    let pct = |p: usize| {
        s.get(((n * p).div_ceil(100)).saturating_sub(1).min(n - 1))
            .copied()
            .unwrap_or(0.0)
    };
    let avg = s.iter().sum::<f64>() / n as f64;
    let var = s.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
    IterStats {
        min: s.first().copied().unwrap_or(0.0),
        max: s.last().copied().unwrap_or(0.0),
        avg,
        p50: s.get(n / 2).copied().unwrap_or(0.0),
        p95: pct(95),
        p99: pct(99),
        stdev: var.sqrt(),
    }
}

/// `i_min i_max i_p99 i_cv%`.
pub(crate) fn per_iter(st: &IterStats) -> String {
    let cv = if st.avg > 0.0 {
        st.stdev / st.avg * 100.0
    } else {
        0.0
    };
    format!(
        "  {:>7}  {:>7}  {:>7}  {:>7}",
        float_str(st.min * 1e6, 7),
        float_str(st.max * 1e6, 7),
        float_str(st.p99 * 1e6, 7),
        float_str(cv, 7)
    )
}

/// The table header (`writeResultHeader`), three lines after a `#` line.
pub(crate) fn header(cputime: bool, timestamps: bool, per_iter: bool) -> String {
    let (ts_lbl, ts_pad, ts_fmt) = if timestamps {
        ("timestamp", 19, "%Y-%m-%d %H:%M:%S")
    } else {
        ("", 0, "")
    };
    let t = if cputime { "cputime" } else { "time" };
    let e = "";
    let mut s = String::from("#\n");
    if per_iter {
        s += &format!("# {e:>10}  {e:>12}  {e:>8}  {e:>6}  {e:>6}              out-of-place (+ per-iteration)                                in-place (+ per-iteration)\n");
        s += &format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {t:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7}  {t:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7} {ts_lbl:>ts_pad$}\n",
            "size", "count", "type", "redop", "root", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%",
            "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%"
        );
        s += &format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7} {ts_fmt:>ts_pad$}\n",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)",
            "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)"
        );
    } else {
        s += &format!("# {e:>10}  {e:>12}  {e:>8}  {e:>6}  {e:>6}           out-of-place                       in-place          \n");
        s += &format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {t:>7}  {:>6}  {:>6}  {:>6}  {t:>7}  {:>6}  {:>6}  {:>6} {ts_lbl:>ts_pad$}\n",
            "size", "count", "type", "redop", "root", "algbw", "busbw", "#wrong", "algbw", "busbw", "#wrong"
        );
        s += &format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} {ts_fmt:>ts_pad$}\n",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
    }
    s
}

/// The footer (`writeResultFooter`, `finalizeFooter`, `writeErrors` with no error).
pub(crate) fn footer(errors: u64, avg_bw: f64, check_avg_bw: Option<f64>, program: &str) -> String {
    let bw_verdict = match check_avg_bw {
        None => "",
        Some(c) if avg_bw < c * 0.9 => "FAILED",
        Some(_) => "OK",
    };
    format!(
        "# {:<20} : {errors} {}\n# {:<20} : {} {bw_verdict}\n#\n# Collective test concluded: {program}\n#\n\n",
        "Out of bounds values",
        if errors > 0 { "FAILED" } else { "OK" },
        "Avg bus bandwidth",
        fmt_g(avg_bw),
    )
}

/// A time as nccl-tests prints it (`%Y-%m-%d %H:%M:%S`), in UTC.
pub(crate) fn now_string() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// JSON: one rank's device.
#[derive(Debug, Serialize)]
pub(crate) struct JsonDevice {
    pub(crate) rank: usize,
    pub(crate) group: usize,
    pub(crate) pid: u32,
    pub(crate) hostname: String,
    pub(crate) device: usize,
    pub(crate) device_hex: String,
    pub(crate) device_info: String,
}

/// JSON: the run's parameters.
#[derive(Debug, Serialize)]
pub(crate) struct JsonConfig {
    pub(crate) nthreads: u32,
    pub(crate) ngpus: u32,
    pub(crate) minimum_bytes: u64,
    pub(crate) maximum_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) step_factor: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) step_bytes: Option<u64>,
    pub(crate) warmup_iters: u32,
    pub(crate) iterations: u32,
    pub(crate) aggregated_iterations: u32,
    pub(crate) validation: u32,
    pub(crate) graph: i32,
    /// nccl-tests writes its booleans as the strings "true"/"false".
    pub(crate) blocking_collectives: &'static str,
    pub(crate) per_iter_timing: &'static str,
    pub(crate) per_iter_skip: u32,
    pub(crate) parallel_init: &'static str,
    pub(crate) devices: Vec<JsonDevice>,
}

/// JSON: `time alg_bw bus_bw nwrong` of one placement.
#[derive(Debug, Serialize)]
pub(crate) struct JsonBody {
    /// `time`, or `cpu_time` with `-C 1`.
    #[serde(flatten)]
    pub(crate) time: JsonTime,
    pub(crate) alg_bw: f64,
    pub(crate) bus_bw: f64,
    pub(crate) nwrong: Option<f64>,
}

/// The time key of a body.
#[derive(Debug, Serialize)]
pub(crate) enum JsonTime {
    /// Wall time per operation, µs.
    #[serde(rename = "time")]
    Time(f64),
    /// The same with `-C 1`.
    #[serde(rename = "cpu_time")]
    CpuTime(f64),
}

/// JSON: `-I 1` statistics of one placement.
#[derive(Debug, Serialize)]
pub(crate) struct JsonPerIter {
    pub(crate) skipped_iterations: u32,
    pub(crate) min_us: f64,
    pub(crate) max_us: f64,
    pub(crate) avg_us: f64,
    pub(crate) p50_us: f64,
    pub(crate) p95_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) stdev_us: f64,
    pub(crate) cv_pct: f64,
    pub(crate) times_us: Vec<f64>,
}

impl JsonPerIter {
    pub(crate) fn new(st: &IterStats, times: &[f64], skipped: u32) -> Self {
        Self {
            skipped_iterations: skipped,
            min_us: st.min * 1e6,
            max_us: st.max * 1e6,
            avg_us: st.avg * 1e6,
            p50_us: st.p50 * 1e6,
            p95_us: st.p95 * 1e6,
            p99_us: st.p99 * 1e6,
            stdev_us: st.stdev * 1e6,
            cv_pct: if st.avg > 0.0 {
                st.stdev / st.avg * 100.0
            } else {
                0.0
            },
            times_us: times.iter().map(|t| t * 1e6).collect(),
        }
    }
}

/// JSON: one line of the table.
#[derive(Debug, Serialize)]
pub(crate) struct JsonResult {
    pub(crate) size: usize,
    pub(crate) count: usize,
    #[serde(rename = "type")]
    pub(crate) ty: String,
    pub(crate) redop: String,
    /// As printed, `%6i`.
    pub(crate) root: String,
    pub(crate) out_of_place: Option<JsonBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) out_of_place_per_iter: Option<JsonPerIter>,
    pub(crate) in_place: Option<JsonBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) in_place_per_iter: Option<JsonPerIter>,
    pub(crate) actual_iterations: u32,
    pub(crate) experiment_name: String,
}

/// JSON: `out_of_bounds`.
#[derive(Debug, Serialize)]
pub(crate) struct JsonBounds {
    pub(crate) count: u64,
    pub(crate) okay: &'static str,
}

/// JSON: `average_bus_bandwidth`.
#[derive(Debug, Serialize)]
pub(crate) struct JsonAvg {
    pub(crate) bandwidth: f64,
    pub(crate) okay: &'static str,
}

/// The whole JSON document (`-J file.json`).
#[derive(Debug, Serialize)]
pub(crate) struct JsonReport {
    pub(crate) version: u32,
    pub(crate) start_time: String,
    pub(crate) args: Vec<String>,
    /// Only the variables that shape the run (launchers', rocectl's, NCCL's), not the whole
    /// environment nccl-tests writes: a results file should not carry unrelated secrets.
    pub(crate) env: Vec<String>,
    /// 0: not NCCL; `rocectl_version` says what ran.
    pub(crate) nccl_version: i64,
    pub(crate) rocectl_version: &'static str,
    pub(crate) config: Option<JsonConfig>,
    pub(crate) results: Vec<JsonResult>,
    pub(crate) out_of_bounds: Option<JsonBounds>,
    pub(crate) average_bus_bandwidth: Option<JsonAvg>,
    pub(crate) errors: Vec<String>,
    pub(crate) end_time: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_print_as_nccl_tests_prints_them() {
        assert_eq!(float_str(12.345, 7), "  12.35");
        assert_eq!(float_str(123456.7, 7), " 123457");
        assert_eq!(float_str(1234567.0, 7), "1234567");
        assert_eq!(float_str(12345678.0, 7), "1.2e+07");
        assert_eq!(float_str(0.004, 6), "  0.00");
        assert_eq!(float_str(1234.5, 6), "1234.5");
        assert_eq!(float_str(123456.0, 6), "123456");
        assert_eq!(float_str(1234567.0, 6), " 1e+06");
        assert_eq!(fmt_g(0.0), "0");
        assert_eq!(fmt_g(3.0), "3");
        assert_eq!(fmt_g(1048576.0), "1.04858e+06");
        assert_eq!(fmt_g(0.594231), "0.594231");
        assert_eq!(fmt_g(1.25), "1.25");
        assert_eq!(fmt_g(0.00001234), "1.234e-05");
        assert_eq!(fmt_g(123456.0), "123456");
    }

    #[test]
    fn a_line_lines_up_under_the_header() {
        // A line from nccl-tests' README.
        let line = preamble(8, 2, "float", "sum", -1)
            + &body(7.67, 0.0, 0.0, Some(0))
            + &body(7.54, 0.0, 0.0, Some(0));
        assert_eq!(
            line,
            "           8             2     float     sum      -1     7.67    0.00    0.00       0     7.54    0.00    0.00       0"
        );
        let h = header(false, false, false);
        let lines: Vec<&str> = h.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[2],
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong "
        );
        assert_eq!(
            lines[3],
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         "
        );
        // Every column of a line ends where the header's does.
        assert_eq!(line.len() + 1, lines[2].len());
        assert_eq!(
            body(1.0, 2.0, 3.0, None),
            "     1.00    2.00    3.00    N/A"
        );
        let with_iter = header(false, true, true);
        assert!(with_iter.contains("i_cv%") && with_iter.contains("timestamp"));
    }

    #[test]
    fn footer_and_stats() {
        assert_eq!(
            footer(0, 1.5, None, "all_reduce_perf"),
            "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1.5 \n#\n# Collective test concluded: all_reduce_perf\n#\n\n"
        );
        assert!(footer(2, 1.5, Some(2.0), "x")
            .contains(": 2 FAILED\n# Avg bus bandwidth    : 1.5 FAILED"));
        let st = iter_stats(&[3.0, 1.0, 2.0, 4.0]);
        assert_eq!(
            (st.min, st.max, st.p50, st.p99, st.avg),
            (1.0, 4.0, 3.0, 4.0, 2.5)
        );
        assert_eq!(now_string().len(), 19);
    }
}
