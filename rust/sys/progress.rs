//! The progress counter of a native call: a byte count that the call's worker threads
//! advance as they write, with no lock and no GIL, and that a Python thread reads to draw a
//! bar (`py::progress::ProgressCounter`). No call takes a parameter for it: it travels as a
//! thread-local of the thread that makes the call, and `pool::run` hands it to its workers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
        pub(crate) static PROGRESS: RefCell<Option<Arc<AtomicU64>>> = const { RefCell::new(None) };
        pub(super) static STREAMED: Cell<u64> = const { Cell::new(0) };
    }
}
pub(crate) use tls::PROGRESS;
use tls::STREAMED;

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

/// Bytes this thread's writes have added to its counter so far (see `pool::run`).
pub(crate) fn streamed() -> u64 {
    STREAMED.with(|s| s.get())
}

#[cfg(test)]
mod tests;
