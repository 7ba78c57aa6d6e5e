//! Bulk copies between many leaves and few buffers, in parallel: the rows of a batch
//! (`td[idx]`), and a whole tree packed into one message or scattered out of one. No pyo3 here.
//!
//! The work is a list of [`Copy`]s between raw addresses that the pyo3 layer received from
//! Python (tensors' `data_ptr()`). [`check`] proves that no destination overlaps a source or
//! another destination before anything runs in parallel; [`run`] then splits the bytes into
//! pieces of about [`PIECE`] that the calling thread and the persistent copy helpers of
//! `sys::pool` claim (a per-call thread spawn costs tens of microseconds, which a DataLoader
//! batch of a few MiB cannot afford). Small jobs stay on the calling thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::sys::pool::{self, Work};

/// One copy of `len` bytes from address `src` to address `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

/// A byte range `[start, start + len)` of memory.
pub type Range = (usize, usize);

/// Below this many bytes in all, one thread copies (waking the pool costs more than it saves).
pub const PARALLEL_MIN: usize = 256 << 10;
/// Only copies of at least this many bytes count towards [`PARALLEL_MIN`]: many small rows
/// (64-256 bytes) copy no faster on two threads (each row is a cache miss on either side, and
/// the lines of the output move between cores), while rows of 1 KiB and more copy 1.3-1.6x
/// faster (measured with 256 KiB-4 MiB batches on 2 CPUs).
pub const BULK_MIN: usize = 512;
/// The size of the pieces that threads claim.
pub const PIECE: usize = 64 << 10;

/// What [`check`] found about the ranges of a job.
#[derive(Debug, PartialEq, Eq)]
pub enum Overlap {
    /// Every destination is disjoint from every source and every other destination.
    None,
    /// Two destinations share bytes (the same tensor twice in a tree): copy in order, on one
    /// thread, so that the last write wins as it would leaf by leaf.
    Destinations,
    /// A destination shares bytes with a source: refused (the result would depend on order).
    SourceAndDestination,
}

fn end(r: Range) -> usize {
    r.0.saturating_add(r.1)
}

/// True when some two of `ranges` (sorted by start, empty ones dropped) share a byte.
fn any_overlap(sorted: &[Range]) -> bool {
    sorted.windows(2).any(|w| end(w[0]) > w[1].0)
}

fn sorted_nonempty(ranges: &[Range]) -> Vec<Range> {
    let mut v: Vec<Range> = ranges.iter().copied().filter(|r| r.1 > 0).collect();
    v.sort_unstable();
    v
}

/// Classifies the destination ranges against each other and against the source ranges.
pub fn check(dsts: &[Range], srcs: &[Range]) -> Overlap {
    let dsts = sorted_nonempty(dsts);
    let srcs = sorted_nonempty(srcs);
    // Merge the sources into disjoint spans, then look each destination up.
    let mut spans: Vec<Range> = Vec::with_capacity(srcs.len());
    for r in srcs {
        match spans.last_mut() {
            Some(last) if end(*last) >= r.0 => last.1 = end(*last).max(end(r)) - last.0,
            _ => spans.push(r),
        }
    }
    for d in &dsts {
        let i = spans.partition_point(|s| end(*s) <= d.0);
        if i < spans.len() && spans[i].0 < end(*d) {
            return Overlap::SourceAndDestination;
        }
    }
    if any_overlap(&dsts) {
        Overlap::Destinations
    } else {
        Overlap::None
    }
}

/// A run of consecutive rows of a batch: source row `first` and the `len` rows after it go to
/// rows `at..at + len` of the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub first: usize,
    pub at: usize,
    pub len: usize,
}

/// The runs of consecutive rows of `index` into a dim of `rows` rows (negative indices count
/// from the end). Returns the first out-of-range index on error. Computed once per batch and
/// shared by every leaf with that many rows.
pub fn row_runs(index: &[i64], rows: usize) -> Result<Vec<Run>, i64> {
    let mut out = Vec::new();
    let mut k = 0;
    while k < index.len() {
        let first = resolve(index[k], rows).ok_or(index[k])?;
        let mut len = 1;
        while k + len < index.len() {
            match resolve(index[k + len], rows) {
                Some(r) if r == first + len => len += 1,
                Some(_) => break,
                None => return Err(index[k + len]),
            }
        }
        out.push(Run { first, at: k, len });
        k += len;
    }
    Ok(out)
}

/// The copies of `runs` for a leaf of `row_bytes` bytes per row from `src` to `dst`.
pub fn run_copies(runs: &[Run], row_bytes: usize, src: usize, dst: usize, out: &mut Vec<Copy>) {
    if row_bytes == 0 {
        return;
    }
    out.extend(runs.iter().map(|r| Copy {
        src: src + r.first * row_bytes,
        dst: dst + r.at * row_bytes,
        len: r.len * row_bytes,
    }));
}

/// The copies of a row gather: row `index[k]` of a leaf of `rows` rows of `row_bytes` bytes at
/// `src` goes to row `k` at `dst`. Runs of consecutive indices become one copy each.
/// Negative indices count from the end. Returns the first out-of-range index on error.
pub fn row_copies(
    index: &[i64],
    rows: usize,
    row_bytes: usize,
    src: usize,
    dst: usize,
    out: &mut Vec<Copy>,
) -> Result<(), i64> {
    let runs = row_runs(index, rows)?;
    run_copies(&runs, row_bytes, src, dst, out);
    Ok(())
}

fn resolve(i: i64, rows: usize) -> Option<usize> {
    let rows_i = i64::try_from(rows).ok()?;
    let r = if i < 0 { i.checked_add(rows_i)? } else { i };
    (0..rows_i).contains(&r).then_some(r as usize)
}

/// Splits copies longer than `piece` into pieces, so that threads share big leaves too.
fn pieces(copies: &[Copy], piece: usize) -> Vec<Copy> {
    let mut out = Vec::with_capacity(copies.len());
    for c in copies {
        let mut done = 0;
        while done < c.len {
            let len = piece.min(c.len - done);
            out.push(Copy {
                src: c.src + done,
                dst: c.dst + done,
                len,
            });
            done += len;
        }
    }
    out
}

/// One parallel job of [`run`]: tasks (ranges of `work`) that the calling thread and the
/// helpers claim one at a time, and how many of them are finished.
///
/// Made only by [`run_job`], under the contract of [`run`], which returns once every task is
/// finished: a task is only ever claimed while its ranges are valid, and once all are claimed
/// [`Work::work`] touches nothing (what [`Work`] asks of posted work).
struct Job {
    work: Vec<Copy>,
    /// Whether the helpers spin for the next job afterwards (see [`run_quiet`]).
    linger: bool,
    tasks: Vec<(usize, usize)>,
    next: AtomicUsize,
    done: AtomicUsize,
}

impl Work for Job {
    fn work(&self) {
        loop {
            let t = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&(a, b)) = self.tasks.get(t) else {
                return;
            };
            // SAFETY: a task is claimed before the caller of `run` can see every task done
            // (it waits for `done`), so the ranges are still valid (the contract of `run`,
            // under which every Job is made); each task runs once.
            self.work[a..b].iter().for_each(|c| unsafe { copy_one(c) });
            self.done.fetch_add(1, Ordering::Release);
        }
    }

    fn linger(&self) -> bool {
        self.linger
    }
}

/// # Safety
/// `c.src..+len` readable, `c.dst..+len` writable, disjoint.
unsafe fn copy_one(c: &Copy) {
    if c.len > 0 {
        // SAFETY: the caller guarantees both ranges are valid and disjoint.
        unsafe { std::ptr::copy_nonoverlapping(c.src as *const u8, c.dst as *mut u8, c.len) }
    }
}

/// Runs every copy; in parallel when `parallel` and the job holds at least [`PARALLEL_MIN`]
/// bytes in copies of at least [`BULK_MIN`] bytes.
///
/// The calling thread copies too: it and the helpers ([`pool::Helpers`]) claim tasks of about
/// [`PIECE`] bytes from one counter, and the call returns once every task is finished. A
/// helper that wakes late (a busy machine, another job) finds nothing left and touches no
/// memory, so the call never waits for a helper to start: it is never slower than copying on
/// one thread by more than the cost of posting the job.
///
/// # Safety
/// Every `src..src+len` must be readable and every `dst..dst+len` writable for the whole call,
/// and no destination may overlap a source. With `parallel`, no two destinations may overlap
/// either (see [`check`]).
pub unsafe fn run(copies: &[Copy], parallel: bool) {
    // SAFETY: the caller's contract (above).
    unsafe { run_job(copies, parallel, true) }
}

/// As [`run`], but the helpers go back to sleep as soon as the job is done instead of spinning
/// for the next one: for copies that run beside other busy threads (a transport's, whose
/// socket copies want every core), where a spinning helper only takes a core from them.
/// Measured on 2 CPUs with a gloo sender and receiver on the same machine: the 200 µs spins
/// after each piece of a 10 MiB message were 11% of all CPU time.
///
/// # Safety
/// As for [`run`].
pub unsafe fn run_quiet(copies: &[Copy], parallel: bool) {
    // SAFETY: the caller's contract (above).
    unsafe { run_job(copies, parallel, false) }
}

/// # Safety
/// As for [`run`].
unsafe fn run_job(copies: &[Copy], parallel: bool, linger: bool) {
    let bulk: usize = copies.iter().filter(|c| c.len >= BULK_MIN).map(|c| c.len).sum();
    let pool = if parallel && bulk >= PARALLEL_MIN {
        pool::helpers()
    } else {
        None
    };
    let Some(pool) = pool else {
        // SAFETY: the caller's contract (above).
        copies.iter().for_each(|c| unsafe { copy_one(c) });
        return;
    };
    let work = pieces(copies, PIECE);
    // Claim runs of small copies together: one task per ~PIECE bytes.
    let mut tasks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, c) in work.iter().enumerate() {
        bytes += c.len;
        if bytes >= PIECE {
            tasks.push((start, i + 1));
            start = i + 1;
            bytes = 0;
        }
    }
    if start < work.len() {
        tasks.push((start, work.len()));
    }
    let n = tasks.len();
    let job = Arc::new(Job {
        work,
        linger,
        tasks,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
    });
    if n > 1 {
        pool.post(Some(Arc::clone(&job) as Arc<dyn Work>));
    }
    job.work();
    // Every task is claimed; wait for the helpers' last ones (a piece each, microseconds).
    let mut spins = 0u32;
    while job.done.load(Ordering::Acquire) < n {
        if spins < 1 << 12 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests;
