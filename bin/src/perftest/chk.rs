//! `--chk` for `write-bw` and `send-bw` over RC: a rocectl extension (perftest has no data
//! check), so that "all data verified" is a fact and not a hope.
//!
//! # What the two sides do
//!
//! - The client draws a 64-bit seed from the OS (`/dev/urandom`) and fills its send half with
//!   a *base* pattern of that seed (every 8-byte word a hash of the seed and the word's offset).
//! - Before each batch of requests is posted, it *stamps* the messages of the batch: the first
//!   8 bytes of every 64-byte line of a message become a hash of the seed, the request's
//!   iteration number and the line's offset. Messages that share a place in the buffer carry
//!   the stamp of the last request posted for that place, so the content of every place
//!   changes with every batch that writes it.
//! - After the traffic, the client sends the seed, the size, the iteration count and its
//!   offset rule (slots, step) over the out-of-band connection ([`Record`]); the server
//!   computes what its **whole** buffer must hold (each target place: the message of the last
//!   request that wrote it, from this seed; everything else: zeros, as registered) and
//!   compares byte for byte. The verdict ([`Verdict`]) goes back to the client; a mismatch
//!   makes both sides exit with status 1.
//!
//! # What it proves, and what not
//!
//! - Every byte of the final message at every target place arrived, in its place, from this
//!   client's request stream (a foreign writer would need this run's 64-bit seed), and it is
//!   the *last* request's data: a stale, late or duplicated earlier request applied after it
//!   shows another iteration's stamp in at least one line of every packet (packets are at
//!   least 256 bytes: 4 stamps). The server names the first bad line: never written (zeros),
//!   stale (an earlier iteration's stamp, with its number), or foreign/corrupted.
//! - Nothing else in the server's buffer changed: a misplaced write (wrong address, another
//!   pair's request) shows as a non-zero byte outside the target places.
//! - The requests before the last one at each place are checked only by the transport (ICRC,
//!   PSN order, every completion successful): a WRITE gives the server nothing to look at
//!   while the traffic runs, and a stamp per batch cannot tell two requests of one batch apart.
//! - `send-bw`: the server's receives all target one buffer, so the check covers the last
//!   message received and the rest of the buffer.

use std::io::Read;

use anyhow::{bail, Context};

/// The stamp granularity: one stamp at the start of every line of this many bytes.
pub(crate) const LINE: u64 = 64;
/// Bytes of a stamp.
const STAMP: u64 = 8;
/// The first bytes of both records.
const MAGIC: &[u8; 4] = b"RCHK";
/// Version of the record layout.
const VERSION: u8 = 1;
/// Bytes of a [`Record`] on the wire.
pub(crate) const RECORD_LEN: usize = 48;
/// Bytes of a [`Verdict`] on the wire.
pub(crate) const VERDICT_LEN: usize = 24;
/// The acknowledgement a server sends for a record, and the request a client sends for the
/// verdict.
pub(crate) const PING: [u8; 8] = *b"RCHK\0\0\0\0";

/// splitmix64's finaliser: a bijection on 64 bits with good avalanche.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The data of one run, from its seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pattern {
    seed: u64,
}

impl Pattern {
    /// A pattern of `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// A pattern from 64 random bits of the OS.
    ///
    /// # Errors
    /// `/dev/urandom` cannot be read.
    pub(crate) fn random() -> anyhow::Result<Self> {
        let mut b = [0u8; 8];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut b))
            .context("reading a --chk seed from /dev/urandom")?;
        Ok(Self::new(u64::from_le_bytes(b)))
    }

    /// The seed.
    pub(crate) fn seed(self) -> u64 {
        self.seed
    }

    fn base_word(self, word: u64) -> u64 {
        mix(self.seed ^ mix(word))
    }

    fn stamp_word(self, iter: u64, line: u64) -> u64 {
        mix(self.seed.rotate_left(29)
            ^ mix(iter ^ 0x5354_414D_5000_0000)
            ^ line.wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }

    /// Fills `buf`, which holds source offsets `start..start + buf.len()`, with the base
    /// pattern.
    pub(crate) fn fill_base(self, buf: &mut [u8], start: u64) {
        for (k, b) in buf.iter_mut().enumerate() {
            let p = start + k as u64;
            *b = self.base_word(p / 8).to_le_bytes()[(p % 8) as usize];
        }
    }

    /// Stamps `msg`, which holds the message of iteration `iter` from source offsets `off..`:
    /// the first [`STAMP`] bytes of every [`LINE`] it covers.
    pub(crate) fn stamp(self, msg: &mut [u8], off: u64, iter: u64) {
        let end = off + msg.len() as u64;
        let mut line = off / LINE;
        loop {
            let head = line * LINE;
            if head >= end {
                break;
            }
            let w = self.stamp_word(iter, line).to_le_bytes();
            for p in head.max(off)..(head + STAMP).min(end) {
                msg[(p - off) as usize] = w[(p - head) as usize];
            }
            line += 1;
        }
    }

    /// The message of iteration `iter`, `len` bytes from source offset `off`.
    pub(crate) fn message(self, off: u64, len: u64, iter: u64) -> Vec<u8> {
        let mut m = vec![0u8; len as usize];
        self.fill_base(&mut m, off);
        self.stamp(&mut m, off, iter);
        m
    }
}

/// Which test's buffer layout the server checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `write-bw`: message `i` lands at target offset `offset(i)` of the target half.
    Write,
    /// `send-bw`: every message lands at the start of the target half.
    Send,
}

/// What a client tells the server after the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// The test.
    pub(crate) kind: Kind,
    /// The pattern's seed.
    pub(crate) seed: u64,
    /// Message size.
    pub(crate) size: u64,
    /// Requests completed (iterations `0..iters`).
    pub(crate) iters: u64,
    /// Places in the buffer: message `i` is at `(i % slots) * step`.
    pub(crate) slots: u64,
    /// Distance between places.
    pub(crate) step: u64,
}

impl Record {
    /// The wire form.
    pub(crate) fn to_bytes(self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = match self.kind {
            Kind::Write => 0,
            Kind::Send => 1,
        };
        for (k, v) in [self.seed, self.size, self.iters, self.slots, self.step]
            .into_iter()
            .enumerate()
        {
            b[8 + 8 * k..16 + 8 * k].copy_from_slice(&v.to_be_bytes());
        }
        b
    }

    /// Parses the wire form.
    ///
    /// # Errors
    /// Not a record (the peer runs without `--chk`), another version, a bad kind.
    pub(crate) fn parse(b: &[u8; RECORD_LEN]) -> anyhow::Result<Self> {
        if &b[..4] != MAGIC {
            bail!("the client sent no --chk record: give --chk to both sides");
        }
        if b[4] != VERSION {
            bail!(
                "--chk record version {} (this rocectl speaks {VERSION})",
                b[4]
            );
        }
        let kind = match b[5] {
            0 => Kind::Write,
            1 => Kind::Send,
            k => bail!("--chk record of unknown kind {k}"),
        };
        let w = |k: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[8 + 8 * k..16 + 8 * k]);
            u64::from_be_bytes(x)
        };
        Ok(Self {
            kind,
            seed: w(0),
            size: w(1),
            iters: w(2),
            slots: w(3),
            step: w(4),
        })
    }

    /// The last iteration that wrote place `slot` (`slot < min(slots, iters)`).
    fn last_at(&self, slot: u64) -> u64 {
        slot + self.slots * ((self.iters - 1 - slot) / self.slots)
    }

    /// What the server's whole buffer (`region` bytes, the target half from `half`) must hold.
    ///
    /// # Errors
    /// A record that does not describe this buffer (places past its end, zero counts).
    pub(crate) fn expected(&self, region: usize, half: usize) -> anyhow::Result<Vec<u8>> {
        let bad = |why: &str| {
            anyhow::anyhow!("the client's --chk record does not fit this buffer: {why} ({self:?}, buffer {region} bytes, target half at {half})")
        };
        if self.iters == 0 || self.slots == 0 || self.size == 0 {
            return Err(bad("zero iterations, places or size"));
        }
        if self.slots > 1 && self.step < self.size {
            return Err(bad("places overlap"));
        }
        let room = region.saturating_sub(half) as u64;
        let used = self
            .step
            .checked_mul(self.slots.min(self.iters) - 1)
            .and_then(|x| x.checked_add(self.size));
        if used.is_none_or(|u| u > room) {
            return Err(bad("places past the end"));
        }
        let pat = Pattern::new(self.seed);
        let mut want = vec![0u8; region];
        let mut put = |target: u64, src: u64, iter: u64| {
            let t = half + target as usize;
            want[t..t + self.size as usize].copy_from_slice(&pat.message(src, self.size, iter));
        };
        match self.kind {
            Kind::Write => {
                for slot in 0..self.slots.min(self.iters) {
                    let off = slot * self.step;
                    put(off, off, self.last_at(slot));
                }
            }
            Kind::Send => {
                let last = self.iters - 1;
                put(0, (last % self.slots) * self.step, last);
            }
        }
        Ok(want)
    }

    /// Compares the server's buffer `got` with what it must hold.
    ///
    /// # Errors
    /// As [`Self::expected`].
    pub(crate) fn verify(&self, got: &[u8], half: usize) -> anyhow::Result<Verdict> {
        let want = self.expected(got.len(), half)?;
        let mut bad = 0u64;
        let mut first = None;
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            if g != w {
                bad += 1;
                first.get_or_insert(k);
            }
        }
        Ok(Verdict {
            bytes: got.len() as u64,
            bad,
            first_bad: first.map(|k| k as u64),
            detail: first.map(|k| self.explain(got, half, k)),
        })
    }

    /// Says what the line holding byte `k` of `got` holds instead.
    fn explain(&self, got: &[u8], half: usize, k: usize) -> String {
        let line_start = k - k % LINE as usize;
        let line = &got[line_start..(line_start + LINE as usize).min(got.len())];
        let zero = line.iter().all(|&b| b == 0);
        let Some(t) = k.checked_sub(half).map(|t| t as u64) else {
            return format!(
                "byte {k} is in the send half, which nothing may write{}",
                if zero { "" } else { " (it holds data)" }
            );
        };
        // The place and the source offset of the target byte.
        let (slot, src_base) = match self.kind {
            Kind::Write if self.step > 0 => (t / self.step, t - t % self.step),
            Kind::Write => (0, 0),
            Kind::Send => {
                let last = self.iters - 1;
                (last % self.slots, (last % self.slots) * self.step)
            }
        };
        let in_place = match self.kind {
            Kind::Write => slot < self.slots.min(self.iters) && t - slot * self.step < self.size,
            Kind::Send => t < self.size,
        };
        if !in_place {
            return format!(
                "target byte {t} is outside every place the test writes, yet holds {:#04x}",
                got[k]
            );
        }
        if zero {
            return format!("target byte {t}: its line was never written (zeros)");
        }
        let expect_iter = match self.kind {
            Kind::Write => self.last_at(slot),
            Kind::Send => self.iters - 1,
        };
        // Which iteration's data is it? Try those of this place, newest first (bounded).
        let pat = Pattern::new(self.seed);
        let off_in_msg = match self.kind {
            Kind::Write => t - src_base,
            Kind::Send => t,
        };
        let lo = (line_start - half) as u64 - (t - off_in_msg);
        let len = (line.len() as u64).min(self.size - lo.min(self.size));
        let mut iter = Some(expect_iter);
        for _ in 0..100_000 {
            let Some(i) = iter else { break };
            let m = pat.message(src_base + lo, len, i);
            if m[..] == line[..len as usize] && i != expect_iter {
                return format!(
                    "target byte {t}: stale data, iteration {i}'s where iteration {expect_iter}'s belongs"
                );
            }
            iter = i.checked_sub(self.slots.max(1));
        }
        format!("target byte {t}: not this run's data for iteration {expect_iter} (foreign or corrupted)")
    }
}

/// The server's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Bytes of the buffer compared.
    pub(crate) bytes: u64,
    /// Bytes that differ.
    pub(crate) bad: u64,
    /// Offset in the server's buffer of the first that differs.
    pub(crate) first_bad: Option<u64>,
    /// What the first bad line holds (server side only; not sent).
    pub(crate) detail: Option<String>,
}

impl Verdict {
    /// Whether every byte matched.
    pub(crate) fn ok(&self) -> bool {
        self.bad == 0
    }

    /// The wire form (without the detail).
    pub(crate) fn to_bytes(&self) -> [u8; VERDICT_LEN] {
        let mut b = [0u8; VERDICT_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = u8::from(self.ok());
        b[8..16].copy_from_slice(&self.bytes.to_be_bytes());
        b[16..24].copy_from_slice(&self.bad.to_be_bytes());
        b
    }

    /// Parses the wire form.
    ///
    /// # Errors
    /// Not a verdict.
    pub(crate) fn parse(b: &[u8; VERDICT_LEN]) -> anyhow::Result<Self> {
        if &b[..4] != MAGIC {
            bail!("the server sent no --chk verdict: give --chk to both sides");
        }
        let w = |k: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[k..k + 8]);
            u64::from_be_bytes(x)
        };
        let (bytes, bad) = (w(8), w(16));
        if (b[4] == 1) != (bad == 0) {
            bail!(
                "inconsistent --chk verdict ({bad} bad bytes, ok flag {})",
                b[4]
            );
        }
        Ok(Self {
            bytes,
            bad,
            first_bad: None,
            detail: None,
        })
    }
}

/// The client's side: its pattern, a mirror of its send half, and the offset rule.
#[derive(Debug)]
pub(crate) struct Filler {
    pat: Pattern,
    mirror: Vec<u8>,
    size: u64,
    slots: u64,
    step: u64,
}

impl Filler {
    /// A fresh pattern for messages of `size` bytes placed by `offset` (the session's rule:
    /// `slots` places `step` apart) in a send half of `half` bytes.
    ///
    /// # Errors
    /// No random seed.
    pub(crate) fn new(half: usize, size: u64, slots: u64, step: u64) -> anyhow::Result<Self> {
        let pat = Pattern::random()?;
        let mut mirror = vec![0u8; half];
        pat.fill_base(&mut mirror, 0);
        Ok(Self {
            pat,
            mirror,
            size,
            slots: slots.max(1),
            step,
        })
    }

    /// The whole send half, base pattern (write it into the region once).
    pub(crate) fn base(&self) -> &[u8] {
        &self.mirror
    }

    /// Stamps the messages of iterations `first..end` about to be posted: only the last one
    /// for each place (earlier ones in the batch would be overwritten at once). Returns
    /// `(offset, bytes)` to write into the region for each.
    pub(crate) fn batch(&mut self, first: u64, end: u64) -> Vec<(u64, &[u8])> {
        let from = first.max(end.saturating_sub(self.slots));
        let mut places = Vec::new();
        for i in from..end {
            let off = (i % self.slots) * self.step;
            let (o, n) = (off as usize, self.size as usize);
            self.pat.stamp(&mut self.mirror[o..o + n], off, i);
            places.push(off);
        }
        let (mirror, size) = (&self.mirror, self.size as usize);
        places
            .into_iter()
            .map(|o| (o, &mirror[o as usize..o as usize + size]))
            .collect()
    }

    /// The record of a run of `iters` requests.
    pub(crate) fn record(&self, kind: Kind, iters: u64) -> Record {
        Record {
            kind,
            seed: self.pat.seed(),
            size: self.size,
            iters,
            slots: self.slots,
            step: self.step,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plays a client of `iters` requests in batches of `batch` into a server buffer of
    /// `2 * half` bytes, as the transport would deliver them in order.
    fn run(
        kind: Kind,
        half: usize,
        size: u64,
        slots: u64,
        step: u64,
        iters: u64,
        batch: u64,
    ) -> (Filler, Vec<u8>) {
        let mut f = Filler::new(half, size, slots, step).unwrap();
        let mut server = vec![0u8; 2 * half];
        let mut i = 0;
        while i < iters {
            let end = (i + batch).min(iters);
            let _ = f.batch(i, end);
            // Every request of the batch carries what the source holds once the batch is
            // stamped (the engine reads it after the post).
            for j in i..end {
                let src = ((j % slots) * step) as usize;
                let dst = half
                    + match kind {
                        Kind::Write => src,
                        Kind::Send => 0,
                    };
                server[dst..dst + size as usize]
                    .copy_from_slice(&f.mirror[src..src + size as usize]);
            }
            i = end;
        }
        (f, server)
    }

    #[test]
    fn a_clean_run_verifies_and_the_record_round_trips() {
        for (kind, size, slots, step) in [
            (Kind::Write, 65_536, 1, 0),
            (Kind::Write, 100, 32, 128),
            (Kind::Write, 3, 64, 64),
            (Kind::Send, 4096, 1, 0),
            (Kind::Send, 200, 16, 256),
        ] {
            let (f, server) = run(kind, 65_536, size, slots, step, 1000, 128);
            let rec = f.record(kind, 1000);
            assert_eq!(Record::parse(&rec.to_bytes()).unwrap(), rec);
            let v = rec.verify(&server, 65_536).unwrap();
            assert!(v.ok(), "{kind:?} {size}: {v:?}");
            assert_eq!(v.bytes, 131_072);
            let back = Verdict::parse(&v.to_bytes()).unwrap();
            assert!(back.ok());
        }
    }

    #[test]
    fn a_corrupted_byte_is_found_and_named() {
        let (f, mut server) = run(Kind::Write, 65_536, 65_536, 1, 0, 500, 128);
        server[65_536 + 12_345] ^= 0x40;
        let v = f.record(Kind::Write, 500).verify(&server, 65_536).unwrap();
        assert_eq!((v.bad, v.first_bad), (1, Some(65_536 + 12_345)));
        let d = v.detail.clone().unwrap();
        assert!(
            d.contains("target byte 12345") && d.contains("foreign or corrupted"),
            "{d}"
        );
        let wire = Verdict::parse(&v.to_bytes()).unwrap();
        assert!(!wire.ok());
        assert_eq!(wire.bad, 1);
    }

    #[test]
    fn a_stale_message_is_seen_with_its_iteration() {
        // 8 places of 256 bytes; the last request at place 3 is 995 of 1000 (batch of 1).
        let (mut f, mut server) = run(Kind::Write, 4096, 256, 8, 256, 1000, 1);
        // Iteration 987 (same place) lands again after the last one: its stamps differ.
        let _ = f.batch(987, 988);
        let old = f.mirror[768..1024].to_vec();
        server[4096 + 768..4096 + 1024].copy_from_slice(&old);
        let v = f.record(Kind::Write, 1000).verify(&server, 4096).unwrap();
        assert!(!v.ok());
        // Four 8-byte stamps differ (a byte of one may match by chance), the base does not.
        assert!((20..=32).contains(&v.bad), "{v:?}");
        let d = v.detail.unwrap();
        assert!(
            d.contains("stale data, iteration 987's where iteration 995's belongs"),
            "{d}"
        );
    }

    #[test]
    fn another_runs_data_a_misplaced_write_and_a_missing_one_are_caught() {
        let (f, server) = run(Kind::Write, 4096, 1024, 2, 1024, 100, 10);
        let rec = f.record(Kind::Write, 100);
        // Another seed (another pair's stream, or an earlier run): every word differs.
        let (g, other) = run(Kind::Write, 4096, 1024, 2, 1024, 100, 10);
        assert_ne!(f.pat.seed(), g.pat.seed());
        let v = rec.verify(&other, 4096).unwrap();
        assert!(v.bad > 1900, "{v:?}");
        assert!(v.detail.unwrap().contains("foreign or corrupted"));
        // A byte written outside the places (a misplaced write), or into the send half.
        let mut s = server.clone();
        s[4096 + 3000] = 7;
        let d = rec.verify(&s, 4096).unwrap().detail.unwrap();
        assert!(d.contains("outside every place"), "{d}");
        let mut s = server.clone();
        s[10] = 1;
        let d = rec.verify(&s, 4096).unwrap().detail.unwrap();
        assert!(d.contains("send half"), "{d}");
        // The last message never arrived at place 1.
        let mut s = server;
        s[4096 + 1024..4096 + 2048].fill(0);
        let d = rec.verify(&s, 4096).unwrap().detail.unwrap();
        assert!(d.contains("never written"), "{d}");
    }

    #[test]
    fn a_record_that_does_not_fit_is_refused_and_garbage_is_not_a_record() {
        let rec = Record {
            kind: Kind::Write,
            seed: 1,
            size: 4096,
            iters: 10,
            slots: 2,
            step: 4096,
        };
        assert!(rec.verify(&[0u8; 8192], 4096).is_err());
        let mut b = rec.to_bytes();
        b[0] = b'0';
        assert!(Record::parse(&b)
            .unwrap_err()
            .to_string()
            .contains("--chk to both sides"));
        let mut b = rec.to_bytes();
        b[5] = 9;
        assert!(Record::parse(&b).is_err());
        let mut v = Verdict {
            bytes: 8,
            bad: 1,
            first_bad: None,
            detail: None,
        }
        .to_bytes();
        v[4] = 1;
        assert!(Verdict::parse(&v).is_err());
    }
}
