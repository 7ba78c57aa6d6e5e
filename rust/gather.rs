//! Bulk copies between many leaves and few buffers, in parallel: the rows of a batch
//! (`td[idx]`), and a whole tree packed into one message or scattered out of one. No pyo3 here.
//!
//! The work is a list of [`Copy`]s between raw addresses that the pyo3 layer received from
//! Python (tensors' `data_ptr()`). [`check`] proves that no destination overlaps a source or
//! another destination before anything runs in parallel; [`run`] then splits the bytes into
//! pieces of about [`PIECE`] and copies them on rayon's persistent pool (a per-call thread
//! spawn costs tens of microseconds, which a DataLoader batch of a few MiB cannot afford).
//! Small jobs stay on the calling thread.

use rayon::prelude::*;

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
/// The size of the pieces that threads claim.
pub const PIECE: usize = 128 << 10;

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
    if row_bytes == 0 {
        return index
            .iter()
            .try_for_each(|&i| resolve(i, rows).map(|_| ()).ok_or(i));
    }
    let mut k = 0;
    while k < index.len() {
        let first = resolve(index[k], rows).ok_or(index[k])?;
        let mut run = 1;
        while k + run < index.len() {
            match resolve(index[k + run], rows) {
                Some(r) if r == first + run => run += 1,
                Some(_) => break,
                None => return Err(index[k + run]),
            }
        }
        out.push(Copy {
            src: src + first * row_bytes,
            dst: dst + k * row_bytes,
            len: run * row_bytes,
        });
        k += run;
    }
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

/// The process that first used rayon's pool. Its threads do not survive `fork`: a forked
/// child (a DataLoader worker, say) that handed work to the inherited pool would wait forever,
/// so children of that process copy on their own thread instead.
static POOL_OWNER: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Whether this process may hand work to rayon's pool (see [`POOL_OWNER`]).
fn pool_usable() -> bool {
    *POOL_OWNER.get_or_init(std::process::id) == std::process::id()
}

/// Runs every copy; in parallel when `parallel` and the job is large enough.
///
/// # Safety
/// Every `src..src+len` must be readable and every `dst..dst+len` writable for the whole call,
/// and no destination may overlap a source. With `parallel`, no two destinations may overlap
/// either (see [`check`]).
pub unsafe fn run(copies: &[Copy], parallel: bool) {
    let total: usize = copies.iter().map(|c| c.len).sum();
    let one = |c: &Copy| {
        if c.len > 0 {
            // SAFETY: the caller guarantees both ranges are valid and disjoint (see above).
            unsafe { std::ptr::copy_nonoverlapping(c.src as *const u8, c.dst as *mut u8, c.len) }
        }
    };
    if !parallel || total < PARALLEL_MIN || !pool_usable() || rayon::current_num_threads() < 2 {
        copies.iter().for_each(one);
        return;
    }
    let work = pieces(copies, PIECE);
    // Claim runs of small copies together: one task per ~PIECE bytes.
    let mut tasks: Vec<&[Copy]> = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, c) in work.iter().enumerate() {
        bytes += c.len;
        if bytes >= PIECE {
            tasks.push(&work[start..=i]);
            start = i + 1;
            bytes = 0;
        }
    }
    if start < work.len() {
        tasks.push(&work[start..]);
    }
    tasks.par_iter().for_each(|task| task.iter().for_each(one));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(v: &[u8]) -> usize {
        v.as_ptr() as usize
    }

    #[test]
    fn gathers_rows_in_runs() {
        let src: Vec<u8> = (0..40).collect(); // 10 rows of 4 bytes
        let mut dst = vec![0u8; 6 * 4];
        let mut copies = Vec::new();
        let d = dst.as_mut_ptr() as usize;
        row_copies(&[2, 3, 4, -1, 0, 0], 10, 4, addr(&src), d, &mut copies).unwrap();
        assert_eq!(copies.len(), 4, "2,3,4 is one run; 0,0 are two copies");
        // SAFETY: src and dst live for the call and do not overlap.
        unsafe { run(&copies, true) };
        let rows: Vec<u8> = [2, 3, 4, 9, 0, 0]
            .iter()
            .flat_map(|&r| r * 4..r * 4 + 4)
            .collect();
        assert_eq!(dst, rows);
    }

    #[test]
    fn refuses_out_of_range_rows() {
        let mut copies = Vec::new();
        assert_eq!(row_copies(&[0, 10], 10, 4, 0, 0, &mut copies), Err(10));
        assert_eq!(row_copies(&[-11], 10, 4, 0, 0, &mut copies), Err(-11));
        assert_eq!(row_copies(&[i64::MIN], 10, 0, 0, 0, &mut copies), Err(i64::MIN));
    }

    #[test]
    fn parallel_copies_match() {
        let src: Vec<u8> = (0..(3 << 20)).map(|i| (i * 7 % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let s = addr(&src);
        let d = dst.as_mut_ptr() as usize;
        let copies: Vec<Copy> = (0..3)
            .map(|k| Copy {
                src: s + (k << 20),
                dst: d + ((2 - k) << 20),
                len: 1 << 20,
            })
            .collect();
        // SAFETY: both vectors live for the call and do not overlap.
        unsafe { run(&copies, true) };
        for k in 0..3 {
            assert_eq!(dst[(2 - k) << 20..(3 - k) << 20], src[k << 20..(k + 1) << 20]);
        }
    }

    #[test]
    fn classifies_overlaps() {
        assert_eq!(check(&[(0, 10), (10, 5)], &[(100, 50)]), Overlap::None);
        assert_eq!(check(&[(0, 10), (9, 5)], &[(100, 50)]), Overlap::Destinations);
        assert_eq!(
            check(&[(0, 10)], &[(100, 50), (5, 1)]),
            Overlap::SourceAndDestination
        );
        assert_eq!(check(&[(0, 10)], &[(10, 5), (12, 100)]), Overlap::None);
        assert_eq!(
            check(&[(5, 0), (5, 10)], &[(5, 0)]),
            Overlap::None,
            "empty ranges never overlap"
        );
    }

    #[test]
    fn splits_into_pieces() {
        let p = pieces(
            &[Copy {
                src: 0,
                dst: 1000,
                len: 10,
            }],
            4,
        );
        assert_eq!(p.iter().map(|c| c.len).collect::<Vec<_>>(), vec![4, 4, 2]);
        assert_eq!(
            p[2],
            Copy {
                src: 8,
                dst: 1008,
                len: 2
            }
        );
    }
}
