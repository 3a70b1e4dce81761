//! What the perftest tools print: the test information block, the address lines, the result
//! tables (`print_report_bw`, `print_report_lat` of perftest 6.06, same columns, widths and
//! tabs as `shared/captures/ib_*.txt`), and the one-line JSON summary the bench runner reads
//! (`benches/ours.cmds`).
//!
//! Units as perftest's: MB/sec is 2^20 bytes per second (`--report_gbits`: 10^9 bits), Mpps is
//! 10^6 messages per second, latency is in µs. A latency *sample* is the time between two
//! consecutive posts of the same side: one round trip; perftest prints half of it for SEND and
//! WRITE (`rtt_factor` 2, one-way latency) and all of it for READ and atomics. The JSON always
//! carries the round trip.

use std::fmt::Write as _;

use roce_transport::Gid;

use crate::oob::perftest::{BwReport, PerftestDest};

/// perftest's `RESULT_LINE`.
pub(crate) const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// The bandwidth table header (`RESULT_FMT`, `RESULT_FMT_G`).
pub(crate) fn bw_header(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}

/// The latency table header (`RESULT_FMT_LAT`).
pub(crate) const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  \
     t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% \
     percentile[usec] ";

/// One bandwidth line (`REPORT_FMT`): `" %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t   %-7.6lf"`.
pub(crate) fn bw_line(r: &BwReport) -> String {
    format!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate_avg
    )
}

/// Bandwidth results of one side, in bytes and seconds; [`Self::report`] turns them into
/// perftest's units.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct BwResult {
    /// Message size.
    pub(crate) size: u64,
    /// Messages counted (per QP with `-q`, as perftest prints them).
    pub(crate) iters: u64,
    /// Queue pairs that each carried `iters` messages (`-q`; 0 counts as 1).
    pub(crate) qps: u64,
    /// From the first post (or the first receive) to the last completion.
    pub(crate) seconds: f64,
    /// The best rate over any run of consecutive messages, bytes/s (0: not measured).
    pub(crate) peak_bytes_per_s: f64,
}

impl BwResult {
    /// Messages on all QPs.
    pub(crate) fn messages(&self) -> u64 {
        self.iters * self.qps.max(1)
    }

    /// Payload bytes per second, one direction, all QPs.
    pub(crate) fn bytes_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            (self.size * self.messages()) as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Messages per second, all QPs.
    pub(crate) fn ops_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.messages() as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// The BW report words in perftest's units (MB/sec or Gb/sec, Mpps).
    pub(crate) fn report(&self, gbits: bool) -> BwReport {
        let unit = |bytes_per_s: f64| {
            if gbits {
                bytes_per_s * 8.0 / 1e9
            } else {
                bytes_per_s / f64::from(1u32 << 20)
            }
        };
        BwReport {
            size: self.size,
            iters: self.iters,
            bw_peak: unit(self.peak_bytes_per_s),
            bw_avg: unit(self.bytes_per_s()),
            msg_rate_avg: self.ops_per_s() / 1e6,
        }
    }
}

/// The peak bandwidth as perftest computes it: over every run of messages `i..=j` that ends at
/// a signalled completion, the least time per message,
/// `(tcompleted[j] - tposted[i]) / (j - i + 1)`. `posted[i]` is when message `i` was posted
/// and `completed` lists `(j, time)` for each completion seen (ns on any common clock). The
/// double loop is bounded to about 2·10^7 steps by sampling the start index.
pub(crate) fn peak_bytes_per_s(size: u64, posted: &[u64], completed: &[(usize, u64)]) -> f64 {
    let n = posted.len();
    if n == 0 || completed.is_empty() {
        return 0.0;
    }
    let work = n as u64 * completed.len() as u64;
    let stride = usize::try_from(work.div_ceil(20_000_000))
        .unwrap_or(usize::MAX)
        .max(1);
    let mut best = f64::INFINITY;
    for &(j, tc) in completed {
        let j = j.min(n - 1);
        let mut i = 0;
        while i <= j {
            let t = tc.saturating_sub(posted[i]) as f64 / (j - i + 1) as f64;
            if t > 0.0 && t < best {
                best = t;
            }
            i += stride;
        }
    }
    if best.is_finite() {
        size as f64 * 1e9 / best
    } else {
        0.0
    }
}

/// Latency statistics over round-trip samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LatStats {
    /// Message size.
    pub(crate) size: u64,
    /// Iterations run (samples + 1).
    pub(crate) iters: u64,
    /// Samples.
    pub(crate) samples: usize,
    /// Round trip, µs: least.
    pub(crate) min_us: f64,
    /// Greatest.
    pub(crate) max_us: f64,
    /// Median (perftest's "typical").
    pub(crate) median_us: f64,
    /// Mean.
    pub(crate) avg_us: f64,
    /// Standard deviation.
    pub(crate) stdev_us: f64,
    /// 99th percentile.
    pub(crate) p99_us: f64,
    /// 99.9th percentile.
    pub(crate) p999_us: f64,
}

impl LatStats {
    /// Statistics of `posted` (post times, ns): sample `i` is `posted[i + 1] - posted[i]`.
    pub(crate) fn from_posts(size: u64, posted: &[u64]) -> Self {
        let mut d: Vec<u64> = posted
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
            .collect();
        let mut s = Self::from_samples(size, &mut d);
        s.iters = posted.len() as u64;
        s
    }

    /// Statistics of round-trip samples in ns (sorted in place).
    pub(crate) fn from_samples(size: u64, d: &mut [u64]) -> Self {
        let n = d.len();
        if n == 0 {
            return Self {
                size,
                ..Self::default()
            };
        }
        d.sort_unstable();
        let us = |ns: u64| ns as f64 / 1e3;
        let median = if n % 2 == 0 {
            (us(d[n / 2 - 1]) + us(d[n / 2])) / 2.0
        } else {
            us(d[n / 2])
        };
        let avg = d.iter().map(|&x| us(x)).sum::<f64>() / n as f64;
        let var = d.iter().map(|&x| (us(x) - avg).powi(2)).sum::<f64>() / n as f64;
        let pct = |p: f64| {
            let k = ((n as f64 * p).ceil() as usize).clamp(1, n);
            us(d[k - 1])
        };
        Self {
            size,
            iters: n as u64 + 1,
            samples: n,
            min_us: us(d[0]),
            max_us: us(d[n - 1]),
            median_us: median,
            avg_us: avg,
            stdev_us: var.sqrt(),
            p99_us: pct(0.99),
            p999_us: pct(0.999),
        }
    }

    /// One latency line (`REPORT_FMT_LAT`), every time divided by `rtt_factor` (2: one-way).
    pub(crate) fn line(&self, rtt_factor: f64) -> String {
        let f = |x: f64| x / rtt_factor;
        format!(
            " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
            self.size,
            self.iters,
            f(self.min_us),
            f(self.max_us),
            f(self.median_us),
            f(self.avg_us),
            f(self.stdev_us),
            f(self.p99_us),
            f(self.p999_us)
        )
    }
}

/// C's `%#0Nx`: `0x` and zero-padded hex to a total width of `width`, except that 0 has no
/// prefix (`LID 0000`).
pub(crate) fn c_hex(value: u64, width: usize) -> String {
    if value == 0 {
        format!("{:0width$x}", 0)
    } else {
        format!("{value:#0width$x}")
    }
}

/// What the address lines show besides LID, QPN and PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AddrStyle {
    /// SEND and atomic tests: `LID QPN PSN`.
    Plain,
    /// WRITE tests: `... RKey VAddr`.
    Rdma,
    /// READ tests: `... OUT RKey VAddr`.
    Read,
}

/// `ctx_print_pingpong_data`: the address line and the GID line (decimal bytes).
pub(crate) fn address_lines(label: &str, d: &PerftestDest, style: AddrStyle) -> String {
    let mut s = format!(
        " {label} address: LID {} QPN {} PSN {}",
        c_hex(u64::from(d.lid), 4),
        c_hex(u64::from(d.qpn.value()), 6),
        c_hex(u64::from(d.psn.value()), 6)
    );
    if style == AddrStyle::Read {
        let _ = write!(s, " OUT {}", c_hex(u64::from(d.out_reads), 4));
    }
    if style != AddrStyle::Plain {
        let _ = write!(
            s,
            " RKey {} VAddr {}",
            c_hex(u64::from(d.rkey.value()), 8),
            c_hex(d.vaddr, 16)
        );
    }
    s.push('\n');
    s.push_str(&gid_line(d.gid));
    s
}

/// ` GID: 00:00:...:255:255:10:77:00:01` (each byte as `%02d`).
pub(crate) fn gid_line(gid: Gid) -> String {
    let bytes: Vec<String> = gid.0.iter().map(|b| format!("{b:02}")).collect();
    format!(" GID: {}", bytes.join(":"))
}

/// A flat JSON object of string and number fields, written by hand (one line, no spaces).
#[derive(Debug, Default)]
pub(crate) struct Json {
    text: String,
}

impl Json {
    /// An empty object.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn key(&mut self, k: &str) {
        self.text.push(if self.text.is_empty() { '{' } else { ',' });
        let _ = write!(self.text, "\"{k}\":");
    }

    /// Adds a string field (the value must not need escaping beyond quotes and backslashes).
    pub(crate) fn str(mut self, k: &str, v: &str) -> Self {
        self.key(k);
        self.text.push('"');
        for c in v.chars() {
            match c {
                '"' | '\\' => {
                    self.text.push('\\');
                    self.text.push(c);
                }
                c if c.is_control() => {}
                c => self.text.push(c),
            }
        }
        self.text.push('"');
        self
    }

    /// Adds a number field (non-finite numbers become 0).
    pub(crate) fn num(mut self, k: &str, v: f64) -> Self {
        self.key(k);
        let v = if v.is_finite() { v } else { 0.0 };
        if v.fract() == 0.0 && v.abs() < 1e15 {
            let _ = write!(self.text, "{}", v as i64);
        } else {
            let _ = write!(self.text, "{v}");
        }
        self
    }

    /// Adds the device's counters that say how the transfer went (packets, retransmissions,
    /// NAKs, drops), each under its own name, then `engines` (how many the device runs) and
    /// `engines_used` (how many of them both sent and received).
    pub(crate) fn counters(mut self, dev: &roce_transport::Device) -> Self {
        for (k, v) in dev.counters().iter() {
            self = self.num(k, v as f64);
        }
        for (k, v) in dev.device_counters().iter() {
            self = self.num(&format!("dev_{k}"), v as f64);
        }
        // The engines the device runs, and how many of them both sent and received (each
        // QP's packets go through its own engine).
        let used = dev
            .engine_counters()
            .iter()
            .filter(|c| c.tx_packets > 0 && c.rx_delivered > 0)
            .count();
        self.num("engines", dev.engines() as f64)
            .num("engines_used", used as f64)
    }

    /// The object's text.
    pub(crate) fn finish(mut self) -> String {
        if self.text.is_empty() {
            self.text.push('{');
        }
        self.text.push('}');
        self.text
    }
}

#[cfg(test)]
mod tests {
    use roce_transport::{Psn, Qpn, RKey};

    use super::*;

    #[test]
    fn bw_line_matches_the_capture() {
        // shared/captures/ib_write_bw.txt
        let r = BwReport {
            size: 3000,
            iters: 10,
            bw_peak: 14.58,
            bw_avg: 12.05,
            msg_rate_avg: 0.004213,
        };
        assert_eq!(
            bw_line(&r),
            " 3000       10               14.58              12.05  \t\t   0.004213"
        );
    }

    #[test]
    fn lat_line_matches_the_capture() {
        // shared/captures/ib_send_lat.txt, server: the numbers are one-way, so double them.
        let s = LatStats {
            size: 64,
            iters: 10,
            samples: 9,
            min_us: 2.0 * 106.64,
            max_us: 2.0 * 220.37,
            median_us: 2.0 * 137.15,
            avg_us: 2.0 * 142.63,
            stdev_us: 2.0 * 28.00,
            p99_us: 2.0 * 220.37,
            p999_us: 2.0 * 220.37,
        };
        assert_eq!(
            s.line(2.0),
            " 64      10          106.64         220.37       137.15   \t       142.63      \t28.00  \t\t220.37  \t\t220.37 "
        );
    }

    #[test]
    fn headers_match_the_captures() {
        assert_eq!(
            LAT_HEADER,
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    \
             t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
        );
        assert_eq!(RESULT_LINE.len(), 87);
    }

    #[test]
    fn address_lines_match_the_captures() {
        // shared/captures/ib_read_bw.txt (server's local address) and ib_read_lat.txt.
        let d = PerftestDest {
            lid: 0,
            out_reads: 0x80,
            qpn: Qpn::new(0x19),
            psn: Psn::new(0x62efd0),
            rkey: RKey::new(0x9e8),
            vaddr: 0x55a4_5bcb_6000,
            gid: Gid::from_ip("10.77.0.1".parse().unwrap()),
            srqn: 0,
        };
        assert_eq!(
            address_lines("local", &d, AddrStyle::Read),
            " local address: LID 0000 QPN 0x0019 PSN 0x62efd0 OUT 0x80 RKey 0x0009e8 VAddr \
             0x0055a45bcb6000\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:01"
        );
        let short_psn = PerftestDest {
            psn: Psn::new(0xac4cb),
            ..d
        };
        assert!(address_lines("local", &short_psn, AddrStyle::Plain)
            .starts_with(" local address: LID 0000 QPN 0x0019 PSN 0xac4cb\n"));
        assert_eq!(c_hex(0, 6), "000000");
    }

    #[test]
    fn latency_percentiles() {
        let posted: Vec<u64> = (0..=1000).map(|i| i * 1000 + (i % 7) * 10).collect();
        let s = LatStats::from_posts(64, &posted);
        assert_eq!(s.iters, 1001);
        assert_eq!(s.samples, 1000);
        assert!(s.min_us >= 0.93 && s.max_us <= 1.07, "{s:?}");
        assert!((s.avg_us - 1.0).abs() < 0.01, "{s:?}");
        assert!(s.p99_us >= s.median_us && s.p999_us >= s.p99_us);
        // Ten samples: both percentiles are the largest (as in the captures).
        let mut d = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10];
        let s = LatStats::from_samples(2, &mut d);
        assert_eq!((s.p99_us, s.p999_us), (0.010, 0.010));
        assert!((s.median_us - 0.0055).abs() < 1e-12);
    }

    #[test]
    fn peak_is_the_best_window() {
        // 4 messages of 1000 bytes: the first took 10 us alone, the next three 1 us each.
        let posted = [0, 10_000, 11_000, 12_000];
        let completed = [(0, 10_000), (3, 13_000)];
        let p = peak_bytes_per_s(1000, &posted, &completed);
        assert!((p - 1e9).abs() < 1.0, "{p}");
        let r = BwResult {
            size: 1000,
            iters: 4,
            qps: 1,
            seconds: 13e-6,
            peak_bytes_per_s: p,
        };
        let rep = r.report(false);
        assert!((rep.bw_peak - 1e9 / 1_048_576.0).abs() < 1e-6);
        assert!((r.report(true).bw_peak - 8.0).abs() < 1e-9);
    }

    #[test]
    fn several_qps_add_up() {
        // -q 3: 100 messages of 4096 bytes on each QP in 1 ms.
        let r = BwResult {
            size: 4096,
            iters: 100,
            qps: 3,
            seconds: 1e-3,
            peak_bytes_per_s: 0.0,
        };
        assert_eq!(r.messages(), 300);
        assert!((r.bytes_per_s() - 300.0 * 4096.0 / 1e-3).abs() < 1e-3);
        assert!((r.ops_per_s() - 300_000.0).abs() < 1e-6);
        let rep = r.report(false);
        assert_eq!(rep.iters, 100, "the table prints messages per QP");
        assert!((rep.msg_rate_avg - 0.3).abs() < 1e-12);
        // 0 QPs (a default) counts as one.
        assert_eq!(BwResult { qps: 0, ..r }.messages(), 100);
    }

    #[test]
    fn json_is_one_flat_object() {
        let j = Json::new()
            .str("tool", "write-bw")
            .num("bytes", 65_536.0)
            .num("bytes_per_s", 1.5e9)
            .num("x", f64::NAN)
            .finish();
        assert_eq!(
            j,
            r#"{"tool":"write-bw","bytes":65536,"bytes_per_s":1500000000,"x":0}"#
        );
    }
}
