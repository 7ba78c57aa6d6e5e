//! Every thread of the crate, in two kinds, with one policy for how many (one per CPU, at
//! most [`MAX_THREADS`]):
//!
//! - [`run`]: a scoped pool for file jobs (a save's files, a load's maps, an archive's
//!   entries). Its threads are spawned per call, which costs tens of microseconds against the
//!   milliseconds of file work, and gives what file jobs need: results in order, the first
//!   error stops the rest, a panic reaches the caller, the caller's progress counter, any
//!   requested number of threads, and it works the same in a forked child.
//! - [`Helpers`]: persistent threads for memory copies (`sys::gather`), where a batch of a few
//!   MiB copies in a few hundred microseconds and a spawn or a wake-up per call would eat the
//!   gain: they spin for [`SPIN`] after each job, claim pieces of posted [`Work`] beside the
//!   caller, and never touch memory once a job is done.
//!
//! - [`background`]: one detached thread for work nobody waits on (freeing the space of
//!   the files a save replaced, `sys::reclaim`).
//!
//! Why not one kind: file jobs on the persistent threads would lose them in a forked child
//! (threads do not survive `fork`: a DataLoader worker would load on one thread), to any
//! copy posted meanwhile from another thread (one slot), and a panic would need catching;
//! copies on scoped threads would pay a spawn per batch. Why not rayon's pool: its idle
//! threads fall asleep within microseconds, so a batch copied no faster on 2 threads than on
//! one (measured 421 us against 416 us for a W4 batch, where these helpers take 280 us), and
//! it hangs a forked child that hands it work.
//!
//! Jobs of [`run`] are claimed from a shared counter, largest first, so that a few big files
//! spread over the workers. Thousands of small jobs are claimed in runs of consecutive jobs,
//! so that the workers mostly create files in different directories (creates in one
//! directory serialize on its lock) and do not contend on the counter.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::sys::progress::{self, PROGRESS};

/// At most this many threads (the caller included) work on one call of either kind.
pub const MAX_THREADS: usize = 8;

/// The CPUs this process may use (1 when unknown).
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

// ---------------------------------------------------------------------------------------------
// Scoped workers for file jobs

/// Runs one job and credits the counter with what its writes did not count of `size`.
fn counted_job<J, R>(job: &J, size: usize, f: &(impl Fn(&J) -> Result<R> + ?Sized)) -> Result<R> {
    let before = progress::streamed();
    let out = f(job);
    if out.is_ok() {
        progress::advance((size as u64).saturating_sub(progress::streamed().wrapping_sub(before)));
    }
    out
}

/// Worker count: `requested` if non-zero, else one per CPU (at most [`MAX_THREADS`]), never
/// more than jobs.
pub fn worker_count(requested: usize, jobs: usize) -> usize {
    let auto = cpus().min(MAX_THREADS);
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
    let counter = progress::progress();
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
    // One worker's loop: claims runs of jobs until none is left or one failed.
    let claim = |counted: bool| -> Vec<(usize, R)> {
        let mut out = Vec::new();
        'claim: while !failed.load(Ordering::Relaxed) {
            let start = next.fetch_add(run_len, Ordering::Relaxed);
            if start >= order.len() {
                break;
            }
            for &i in &order[start..(start + run_len).min(order.len())] {
                let result = if counted {
                    counted_job(&jobs[i], sizes[i], &f)
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
    };
    // The caller is one of the workers: it claims first, so the largest job (one big file)
    // is written by the calling thread. Measured on tmpfs in a VM: one 1 GiB pwrite from a
    // freshly spawned thread took 0.69-0.71 s in 3 rounds of 10 and 0.39 s otherwise, from
    // the thread that had just freed the previous file's pages 0.38-0.42 s in every round
    // (the freed pages are at hand on its CPU).
    let done: Vec<Vec<(usize, R)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (1..workers)
            .map(|_| {
                let counter = counter.clone();
                let claim = &claim;
                scope.spawn(move || {
                    let counted = counter.is_some();
                    let _counting = PROGRESS.with(|p| p.replace(counter));
                    claim(counted)
                })
            })
            .collect();
        let mut done = vec![claim(counter.is_some())];
        done.extend(handles.into_iter().map(|h| h.join().expect("worker panicked")));
        done
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    for (i, r) in done.into_iter().flatten() {
        slots[i] = Some(r);
    }
    Ok(slots.into_iter().map(|r| r.expect("every job ran")).collect())
}

// ---------------------------------------------------------------------------------------------
// Persistent helpers for memory copies

/// Work that the helper threads can take part in: pieces claimed one at a time by whoever
/// comes (the poster and the helpers), until none is left.
///
/// Calling [`Work::work`] must be sound at any time, also after the poster returned: work
/// whose pieces are all claimed touches nothing (the poster returns only once every claimed
/// piece is finished).
pub trait Work: Send + Sync {
    /// Claims and runs pieces until none is left.
    fn work(&self);
    /// Whether the helpers spin for the next post afterwards (see [`SPIN`]) or sleep at once.
    fn linger(&self) -> bool;
}

/// How long a helper keeps looking for the next job before it sleeps: long enough that
/// batches asked for back to back (or announced by [`prepare`] while Python builds the
/// batch) find it awake, short enough that an idle process does not burn a core.
const SPIN: Duration = Duration::from_micros(200);

/// The copy helpers: threads of this module that sleep on `wake` until work is posted. They
/// spin for [`SPIN`] after each job and after [`prepare`], so that the next one finds them
/// running (see the module documentation for why not rayon's pool).
pub struct Helpers {
    /// The process that made them: threads do not survive `fork`, so a forked child (a
    /// DataLoader worker, say) copies on its own thread instead of posting to nobody.
    owner: u32,
    threads: usize,
    /// Bumped for every post (a job or a wake-up); helpers compare it with the last seen.
    generation: AtomicU64,
    slot: Mutex<(u64, Option<Arc<dyn Work>>)>,
    wake: Condvar,
}

static HELPERS: OnceLock<Helpers> = OnceLock::new();

/// Makes the helpers' description (no threads yet). The pyo3 layer calls it with the GIL held
/// before releasing it for a copy: a `fork` (which needs the GIL in Python) can then never
/// catch this initialisation half done, which would leave the child waiting on it forever.
pub fn init() {
    describe();
}

fn describe() -> &'static Helpers {
    HELPERS.get_or_init(|| {
        // RAYON_NUM_THREADS: the variable rayon's pool read when it did this work, still
        // honoured (the documentation names it).
        let threads = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(cpus)
            .min(MAX_THREADS);
        Helpers {
            owner: std::process::id(),
            threads,
            generation: AtomicU64::new(0),
            slot: Mutex::new((0, None)),
            wake: Condvar::new(),
        }
    })
}

/// The started helpers, or None where there are none to post to: a forked child (their
/// threads stayed in the parent) or a single CPU.
pub fn helpers() -> Option<&'static Helpers> {
    let h = describe();
    if h.owner != std::process::id() || h.threads < 2 {
        return None;
    }
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        for i in 1..h.threads {
            let spawned = std::thread::Builder::new()
                .name(format!("tdrs-copy-{i}"))
                .spawn(move || helper_loop(h));
            if spawned.is_err() {
                break; // fewer helpers: the caller copies the rest itself
            }
        }
    });
    Some(h)
}

impl Helpers {
    /// Posts `job` (or, with None, only wakes the helpers so that they spin for [`SPIN`]).
    /// A job posted while the helpers are busy replaces the one they have not taken yet: its
    /// poster works through it alone, as every poster takes part in its own work.
    pub fn post(&self, job: Option<Arc<dyn Work>>) {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.0 += 1;
        slot.1 = job;
        self.generation.store(slot.0, Ordering::Release);
        drop(slot);
        self.wake.notify_all();
    }
}

fn helper_loop(h: &'static Helpers) {
    let mut seen = 0;
    let mut linger = true;
    loop {
        // Spin for the next post (unless the last job said not to), then sleep until one comes.
        let start = Instant::now();
        let mut spins = 0u32;
        while h.generation.load(Ordering::Acquire) == seen {
            std::hint::spin_loop();
            spins += 1;
            if !linger || spins % 64 == 0 && start.elapsed() > SPIN {
                let mut slot = h.slot.lock().unwrap_or_else(|e| e.into_inner());
                while slot.0 == seen {
                    slot = h.wake.wait(slot).unwrap_or_else(|e| e.into_inner());
                }
                break;
            }
        }
        let job = {
            let slot = h.slot.lock().unwrap_or_else(|e| e.into_inner());
            seen = slot.0;
            slot.1.clone()
        };
        linger = job.as_ref().is_none_or(|j| j.linger());
        if let Some(job) = job {
            job.work();
        }
    }
}

/// Wakes the copy helpers ahead of a job that is about to come (a batch whose output is
/// being allocated), so that their wake-up overlaps that work. Cheap when they are awake.
pub fn prepare() {
    if let Some(h) = helpers() {
        h.post(None);
    }
}

// ---------------------------------------------------------------------------------------------
// Background work

/// Runs `f` on a new detached thread named `name`; gives `f` back when no thread can be made
/// (the caller then runs it itself).
pub fn background<F>(name: &str, f: F) -> std::result::Result<(), F>
where
    F: FnOnce() + Send + 'static,
{
    // The closure goes through a slot so that it comes back when the spawn fails.
    let slot = Arc::new(Mutex::new(Some(f)));
    let theirs = Arc::clone(&slot);
    let spawned = std::thread::Builder::new().name(name.to_string()).spawn(move || {
        let f = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(f) = f {
            f();
        }
    });
    match spawned {
        Ok(_) => Ok(()),
        Err(_) => match slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(f) => Err(f),
            None => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests;
