//! A small scoped worker pool for file jobs. No pyo3 here.
//!
//! Jobs are claimed from a shared counter, largest first, so that a few big files spread over
//! the workers. Thousands of small jobs are claimed in runs of consecutive jobs, so that the
//! workers mostly create files in different directories (creates in one directory serialize
//! on its lock) and do not contend on the counter.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::Result;

// PROGRESS: the progress counter of the call this thread works for (see `counting`).
// STREAMED: bytes this thread has added to its counter, so that `run` credits a job only the
// part of its size that its writes did not already count.
mod tls {
    // Clippy 1.96 for the Windows target flags these `const` initializers as missing `const`
    // (its std expands thread_local! differently there); a module attribute reaches the
    // expansion, an attribute on the macro call does not.
    #![cfg_attr(windows, allow(clippy::missing_const_for_thread_local))]
    use std::cell::{Cell, RefCell};
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    thread_local! {
        pub(super) static PROGRESS: RefCell<Option<Arc<AtomicU64>>> = const { RefCell::new(None) };
        pub(super) static STREAMED: Cell<u64> = const { Cell::new(0) };
    }
}
use tls::{PROGRESS, STREAMED};

/// Counted writes go out in pieces of this size: an update every few milliseconds at GB/s,
/// still several a second on a 30 MB/s disk, for one more `pwrite` per 4 MiB.
pub const PROGRESS_CHUNK: usize = 4 << 20;

/// Runs `f` with `counter` as this thread's progress counter: the jobs of every `run` inside
/// advance it by their size as they finish (and `storage::write_all_at` by the bytes it
/// writes, as it writes them), from the worker threads, with no lock and no GIL. This is how a
/// progress bar follows a save, a load or an archive write without any of them taking a
/// parameter for it. The previous counter is put back afterwards.
pub fn counting<R>(counter: Option<Arc<AtomicU64>>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<AtomicU64>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            PROGRESS.with(|p| *p.borrow_mut() = previous);
        }
    }
    let _restore = Restore(PROGRESS.with(|p| p.replace(counter)));
    f()
}

/// Sets (or with None, clears) this thread's counter until changed again: the scope of a
/// Python `with` block, where `counting`'s closure cannot reach.
pub fn set_progress(counter: Option<Arc<AtomicU64>>) {
    PROGRESS.with(|p| *p.borrow_mut() = counter);
}

/// The counter of this thread's call, if it is counted.
pub fn progress() -> Option<Arc<AtomicU64>> {
    PROGRESS.with(|p| p.borrow().clone())
}

/// Whether this thread's work is counted (one thread-local read).
pub fn counted() -> bool {
    PROGRESS.with(|p| p.borrow().is_some())
}

/// Adds `n` bytes to this thread's counter, if any.
pub fn advance(n: u64) {
    PROGRESS.with(|p| {
        if let Some(counter) = p.borrow().as_ref() {
            counter.fetch_add(n, Ordering::Relaxed);
            STREAMED.with(|s| s.set(s.get().wrapping_add(n)));
        }
    });
}

fn streamed() -> u64 {
    STREAMED.with(|s| s.get())
}

/// Runs one job and credits the counter with what its writes did not count of `size`.
fn counted_job<J, R>(job: &J, size: usize, f: &(impl Fn(&J) -> Result<R> + ?Sized)) -> Result<R> {
    let before = streamed();
    let out = f(job);
    if out.is_ok() {
        advance((size as u64).saturating_sub(streamed().wrapping_sub(before)));
    }
    out
}

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
    let counter = progress();
    if workers <= 1 || jobs.len() <= 1 {
        if counter.is_some() {
            return jobs.iter().map(|j| counted_job(j, size(j), &f)).collect();
        }
        return jobs.iter().map(&f).collect();
    }
    let sizes: Vec<usize> = jobs.iter().map(&size).collect();
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
    let run_len = if jobs.len() >= workers * 256 { 32 } else { 1 };
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    let mut slots: Vec<Option<R>> = std::iter::repeat_with(|| None).take(jobs.len()).collect();
    let done: Vec<Vec<(usize, R)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let counter = counter.clone();
                let (f, sizes, order) = (&f, &sizes, &order);
                let (next, failed, first_error) = (&next, &failed, &first_error);
                scope.spawn(move || {
                    let counted = counter.is_some();
                    let _counting = PROGRESS.with(|p| p.replace(counter));
                    let mut out = Vec::new();
                    'claim: while !failed.load(Ordering::Relaxed) {
                        let start = next.fetch_add(run_len, Ordering::Relaxed);
                        if start >= order.len() {
                            break;
                        }
                        for &i in &order[start..(start + run_len).min(order.len())] {
                            let result = if counted {
                                counted_job(&jobs[i], sizes[i], f)
                            } else {
                                f(&jobs[i])
                            };
                            match result {
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
    fn counted_runs_credit_every_job_once() {
        let counter = Arc::new(AtomicU64::new(0));
        let jobs: Vec<usize> = (1..=300).collect();
        for workers in [1, 4] {
            counter.store(0, Ordering::Relaxed);
            // Half the jobs count some of their bytes themselves (as counted writes do).
            let out = counting(Some(counter.clone()), || {
                run(
                    &jobs,
                    workers,
                    |&j| j,
                    |&j| {
                        if j % 2 == 0 {
                            advance(j as u64 / 2);
                        }
                        Ok(j)
                    },
                )
            })
            .unwrap();
            assert_eq!(out, jobs);
            assert_eq!(counter.load(Ordering::Relaxed), jobs.iter().sum::<usize>() as u64);
        }
        assert!(!counted(), "the counter is taken off the thread afterwards");
        run(&jobs, 4, |&j| j, |&j| Ok(j)).unwrap();
        assert_eq!(counter.load(Ordering::Relaxed), jobs.iter().sum::<usize>() as u64);
    }

    #[test]
    fn counted_writes_advance_in_pieces() {
        let counter = Arc::new(AtomicU64::new(0));
        let path =
            std::env::temp_dir().join(format!("tdrs-progress-{}", crate::sys::storage::random_suffix()));
        let file = std::fs::File::create(&path).unwrap();
        let data = vec![7u8; PROGRESS_CHUNK * 2 + 5];
        let seen = counting(Some(counter.clone()), || {
            crate::sys::storage::write_all_at(&file, &data, 3).unwrap();
            counter.load(Ordering::Relaxed)
        });
        assert_eq!(seen, data.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap()[3..], data[..]);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn counts_workers() {
        assert_eq!(worker_count(3, 10), 3);
        assert_eq!(worker_count(5, 2), 2);
        assert!(worker_count(0, 100) >= 1);
        assert_eq!(worker_count(0, 0), 1);
    }
}
