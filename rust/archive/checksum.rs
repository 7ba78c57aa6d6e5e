//! CRC-32 of many entries at once, a big entry in ranges across the pool's threads (CRC-32s of
//! consecutive ranges combine into the whole's: `crc32fast::Hasher::combine`). No pyo3.
//!
//! One big STORED entry (a dataset's observations) was checksummed by one thread, whatever
//! the pool had; `verify` also went through the entries one after another.

use std::ops::Range;

use crate::error::Result;
use crate::sys::pool;

/// Entries at least this large are split into ranges (one per worker, at most); smaller
/// ones are one job each. A range below ~16 MiB gains less than a thread costs to start.
pub const RANGE_BYTES: usize = 16 << 20;

/// One piece of work: bytes `range` of entry number `entry` of the list given.
struct Piece {
    entry: usize,
    range: Range<usize>,
}

/// The pieces of `lens` for `workers` threads: an entry of at least [`RANGE_BYTES`] is cut
/// into up to `workers` ranges of whole pages (the last takes the rest).
fn pieces(lens: &[usize], workers: usize) -> Vec<Piece> {
    let mut out = Vec::new();
    for (entry, &len) in lens.iter().enumerate() {
        let parts = if len >= RANGE_BYTES {
            workers.clamp(1, len / (RANGE_BYTES / 2))
        } else {
            1
        };
        let step = (len / parts) & !4095;
        let mut from = 0;
        for i in 0..parts {
            let to = if i + 1 == parts { len } else { from + step };
            out.push(Piece {
                entry,
                range: from..to,
            });
            from = to;
        }
    }
    out
}

/// The CRC-32 of every slice of `datas`, computed on `num_threads` workers (0: one per CPU);
/// big slices in ranges, whose CRCs are combined in order.
pub fn crc32_all(datas: &[&[u8]], num_threads: usize) -> Result<Vec<u32>> {
    let lens: Vec<usize> = datas.iter().map(|d| d.len()).collect();
    crc32_ranges(&lens, num_threads, |entry, range| {
        let mut h = crc32fast::Hasher::new();
        h.update(&datas[entry][range]);
        Ok(h.finalize())
    })
}

/// The CRC-32 of entries of lengths `lens`, where `crc_of(entry, range)` gives the CRC-32 of
/// bytes `range` of entry number `entry` (read from memory, or with `pread` from a file that
/// may shrink meanwhile: its error then stops the whole); big entries in ranges across
/// `num_threads` workers (0: one per CPU), combined in order.
pub fn crc32_ranges<F>(lens: &[usize], num_threads: usize, crc_of: F) -> Result<Vec<u32>>
where
    F: Fn(usize, Range<usize>) -> Result<u32> + Sync,
{
    let total: usize = lens.iter().sum();
    let workers = pool::worker_count(num_threads, (total / RANGE_BYTES).max(lens.len()));
    let pieces = pieces(lens, workers);
    let crcs = pool::run(
        &pieces,
        workers,
        |p| p.range.len(),
        |p| crc_of(p.entry, p.range.clone()),
    )?;
    let mut whole: Vec<Option<crc32fast::Hasher>> = (0..lens.len()).map(|_| None).collect();
    for (p, crc) in pieces.iter().zip(crcs) {
        let part = crc32fast::Hasher::new_with_initial_len(crc, p.range.len() as u64);
        match &mut whole[p.entry] {
            Some(h) => h.combine(&part),
            slot => *slot = Some(part),
        }
    }
    Ok(whole
        .into_iter()
        .map(|h| h.map_or(0, crc32fast::Hasher::finalize))
        .collect())
}

#[cfg(test)]
mod tests;
