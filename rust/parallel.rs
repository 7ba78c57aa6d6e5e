//! A small scoped worker pool for file jobs. No pyo3 here.
//!
//! Jobs are claimed from a shared counter, largest first, so that a few big files spread over
//! the workers. Thousands of small jobs are claimed in runs of consecutive jobs, so that the
//! workers mostly create files in different directories (creates in one directory serialize
//! on its lock) and do not contend on the counter.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::Result;

/// Worker count: `requested` if non-zero, else one per CPU (at most 8), never more than jobs.
pub fn worker_count(requested: usize, jobs: usize) -> usize {
    let auto = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8);
    let n = if requested == 0 { auto } else { requested };
    n.clamp(1, jobs.max(1))
}

/// Runs `f` on every job with `workers` threads and returns the results in job order.
/// `size` orders the claiming (largest first). The first error stops the remaining jobs.
pub fn run<J, R, F, S>(jobs: &[J], workers: usize, size: S, f: F) -> Result<Vec<R>>
where
    J: Sync,
    R: Send,
    F: Fn(&J) -> Result<R> + Sync,
    S: Fn(&J) -> usize,
{
    if workers <= 1 || jobs.len() <= 1 {
        return jobs.iter().map(&f).collect();
    }
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(size(&jobs[i])));
    let run_len = if jobs.len() >= workers * 256 { 32 } else { 1 };
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    let mut slots: Vec<Option<R>> = std::iter::repeat_with(|| None).take(jobs.len()).collect();
    let done: Vec<Vec<(usize, R)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    'claim: while !failed.load(Ordering::Relaxed) {
                        let start = next.fetch_add(run_len, Ordering::Relaxed);
                        if start >= order.len() {
                            break;
                        }
                        for &i in &order[start..(start + run_len).min(order.len())] {
                            match f(&jobs[i]) {
                                Ok(r) => out.push((i, r)),
                                Err(e) => {
                                    failed.store(true, Ordering::Relaxed);
                                    first_error
                                        .lock()
                                        .unwrap_or_else(|p| p.into_inner())
                                        .get_or_insert(e);
                                    break 'claim;
                                }
                            }
                        }
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    for (i, r) in done.into_iter().flatten() {
        slots[i] = Some(r);
    }
    Ok(slots.into_iter().map(|r| r.expect("every job ran")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn keeps_job_order() {
        let jobs: Vec<usize> = (0..5000).collect();
        let out = run(&jobs, 4, |&j| j % 7, |&j| Ok(j * 2)).unwrap();
        assert_eq!(out, jobs.iter().map(|j| j * 2).collect::<Vec<_>>());
    }

    #[test]
    fn returns_an_error() {
        let jobs: Vec<usize> = (0..100).collect();
        let err = run(
            &jobs,
            3,
            |_| 1,
            |&j| {
                if j == 50 {
                    Err(Error::tree("x", "boom"))
                } else {
                    Ok(j)
                }
            },
        );
        assert!(err.unwrap_err().to_string().contains("boom"));
    }

    #[test]
    fn counts_workers() {
        assert_eq!(worker_count(3, 10), 3);
        assert_eq!(worker_count(5, 2), 2);
        assert!(worker_count(0, 100) >= 1);
        assert_eq!(worker_count(0, 0), 1);
    }
}
