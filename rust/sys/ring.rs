//! The slot words of a ring of shared slabs (DataLoader batches, `share/ring.py`): one `u64`
//! per slot in a small shared header, changed only by compare-and-swap, so that a worker
//! process and the main process can hand a slot back and forth without a lock or a message.
//!
//! A word is `generation << 2 | state`. A worker takes a FREE slot (`acquire`: the generation
//! goes up by one, the state becomes HELD), fills it, and marks it SHARED when its batch is
//! pickled (held on both sides). Each side then drops its half when its last view of the
//! batch dies: the worker SHARED -> SENT or HELD -> FREE, the main process SENT -> FREE or
//! SHARED -> HELD (`share/ring.py`, `share/ring_receive.py`), so the slot is FREE only when
//! neither holds the batch. Every transition names the generation it expects, so a late
//! release of an old batch can never free a newer one.

use std::sync::atomic::{AtomicU64, Ordering};

/// The slot is free for the worker to fill.
pub const FREE: u64 = 0;
/// A worker is filling the slot, or holds its batch unsent.
pub const HELD: u64 = 1;
/// The slot's batch crossed to the main process and lives there only.
pub const SENT: u64 = 2;
/// The slot's batch crossed to the main process and the worker still holds it too (the
/// Python layer's state 3; the compare-and-swap takes any state).
pub const SHARED: u64 = 3;

/// The header words as atomics: `base` must be 8-byte aligned and span `count` words of memory
/// that stays mapped for `'a`.
///
/// # Safety
/// The caller guarantees the alignment, the length and the lifetime of the memory, and that it
/// is only ever accessed through atomics (by every process that maps it).
unsafe fn words<'a>(base: *mut u8, count: usize) -> &'a [AtomicU64] {
    // SAFETY: the caller's contract above; AtomicU64 has the size and alignment of u64.
    unsafe { std::slice::from_raw_parts(base.cast::<AtomicU64>(), count) }
}

/// Checks that `len` bytes at `base` hold `count` aligned words.
fn check(base: *mut u8, len: usize, count: usize) -> Result<(), String> {
    if (base as usize) % 8 != 0 {
        return Err("the ring header is not 8-byte aligned".into());
    }
    if count.checked_mul(8).is_none_or(|n| n > len) {
        return Err(format!("{count} slots do not fit a ring header of {len} bytes"));
    }
    Ok(())
}

/// Takes the first FREE slot among the first `count`: `(slot, generation)`, or None when every
/// slot is taken (the ring is dry).
///
/// # Safety
/// `base` must point at `len` bytes of memory that stays mapped for the call and is only ever
/// accessed through atomics (the header Buffer of a ring, in every process that maps it).
pub unsafe fn acquire(base: *mut u8, len: usize, count: usize) -> Result<Option<(usize, u64)>, String> {
    check(base, len, count)?;
    // SAFETY: alignment and length checked above; the caller keeps the memory mapped (the
    // function's contract).
    let slots = unsafe { words(base, count) };
    for (i, word) in slots.iter().enumerate() {
        let mut current = word.load(Ordering::Acquire);
        while current & 3 == FREE {
            let generation = (current >> 2).wrapping_add(1) & (u64::MAX >> 2);
            match word.compare_exchange(
                current,
                generation << 2 | HELD,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(Some((i, generation))),
                Err(seen) => current = seen,
            }
        }
    }
    Ok(None)
}

/// Moves slot `slot` from `(generation, from)` to `(generation, to)`; false when the word holds
/// anything else (another generation, another state).
///
/// # Safety
/// `base` must point at `len` bytes of memory that stays mapped for the call and is only ever
/// accessed through atomics (the header Buffer of a ring, in every process that maps it).
pub unsafe fn transition(
    base: *mut u8,
    len: usize,
    slot: usize,
    generation: u64,
    from: u64,
    to: u64,
) -> Result<bool, String> {
    check(base, len, slot + 1)?;
    if from > 3 || to > 3 {
        return Err(format!("invalid slot states {from} -> {to}"));
    }
    // SAFETY: alignment and length checked above; the caller keeps the memory mapped (the
    // function's contract).
    let word = &unsafe { words(base, slot + 1) }[slot];
    let expected = generation << 2 | from;
    Ok(word
        .compare_exchange(
            expected,
            generation << 2 | to,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok())
}

/// The word of slot `slot`: `(generation, state)`.
///
/// # Safety
/// `base` must point at `len` bytes of memory that stays mapped for the call and is only ever
/// accessed through atomics (the header Buffer of a ring, in every process that maps it).
pub unsafe fn state(base: *mut u8, len: usize, slot: usize) -> Result<(u64, u64), String> {
    check(base, len, slot + 1)?;
    // SAFETY: alignment and length checked above; the caller keeps the memory mapped (the
    // function's contract).
    let word = unsafe { words(base, slot + 1) }[slot].load(Ordering::Acquire);
    Ok((word >> 2, word & 3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_goes_round_and_old_generations_are_refused() {
        let mut memory = vec![0u64; 4];
        let base = memory.as_mut_ptr().cast::<u8>();
        // SAFETY: `memory` is 32 aligned bytes that outlive the test and are only touched
        // through these calls.
        unsafe {
            let (slot, generation) = acquire(base, 32, 4).unwrap().unwrap();
            assert_eq!((slot, generation), (0, 1));
            assert_eq!(acquire(base, 32, 4).unwrap(), Some((1, 1)));
            assert!(transition(base, 32, 0, 1, HELD, SENT).unwrap());
            // sent: the worker's late release does nothing
            assert!(!transition(base, 32, 0, 1, HELD, FREE).unwrap());
            assert!(transition(base, 32, 0, 1, SENT, FREE).unwrap());
            assert_eq!(acquire(base, 32, 4).unwrap(), Some((0, 2)));
            // a late release of generation 1 leaves generation 2 alone
            assert!(!transition(base, 32, 0, 1, SENT, FREE).unwrap());
            assert_eq!(state(base, 32, 0).unwrap(), (2, HELD));
            assert!(acquire(base, 32, 2).unwrap().is_none()); // dry
            assert!(acquire(base, 8, 2).is_err());
        }
    }
}
