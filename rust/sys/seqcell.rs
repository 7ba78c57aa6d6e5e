//! A value shared between processes in a region of shared memory: a sequence lock (a version
//! counter, odd while a writer is in the middle of a write) and the value's bytes.
//!
//! Layout (every field little-endian, the region 8-byte aligned):
//! `[0, 8)` the version, `[8, 16)` the length of the value, `[16, 64)` reserved, `[64, ...)`
//! the value (capacity: the rest of the region, a multiple of 8). Readers never block a
//! writer: they copy the bytes and retry when the version moved meanwhile. Writers take the
//! version from even to odd with a compare-exchange, so two writers (in any processes)
//! never interleave. Every access to the shared bytes is atomic (relaxed 8-byte words, ordered
//! by the version's acquire/release), so a reader racing a writer reads stale or torn words
//! that it then throws away, never undefined behaviour.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes before the value.
pub const HEADER: usize = 64;

/// How long a reader or a writer waits for a write in progress before giving up (a process
/// killed in the middle of a write leaves the version odd for ever).
const PATIENCE: Duration = Duration::from_secs(10);

/// Why a cell could not be used.
#[derive(Debug)]
pub enum CellError {
    /// The region is too small, not 8-byte aligned or its capacity not a multiple of 8.
    Layout(String),
    /// The value does not fit the capacity.
    TooLarge { needed: usize, capacity: usize },
    /// A write stayed in progress longer than `PATIENCE`.
    Stuck,
    /// The length field is larger than the capacity (the memory was overwritten).
    Corrupt { length: u64, capacity: usize },
}

impl std::fmt::Display for CellError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CellError::Layout(why) => write!(f, "not a shared value cell: {why}"),
            CellError::TooLarge { needed, capacity } => write!(
                f,
                "the new value takes {needed} bytes; this shared value holds at most {capacity}"
            ),
            CellError::Stuck => write!(
                f,
                "a write to this shared value has been in progress for {}s: a process was \
                 stopped in the middle of a write",
                PATIENCE.as_secs()
            ),
            CellError::Corrupt { length, capacity } => write!(
                f,
                "the shared value says it holds {length} bytes, more than its capacity \
                 {capacity}: the memory was overwritten"
            ),
        }
    }
}

/// A cell over `len` bytes of shared memory at `base`.
pub struct SeqCell {
    base: *mut u8,
    words: usize,
}

impl SeqCell {
    /// A cell over the region `[base, base + len)`.
    ///
    /// # Safety
    /// `base` points to `len` bytes of writable memory that stay mapped while the cell is
    /// used; every other process or thread touches them only through a `SeqCell`.
    pub unsafe fn new(base: *mut u8, len: usize) -> Result<Self, CellError> {
        if (base as usize) % 8 != 0 {
            return Err(CellError::Layout("the region is not 8-byte aligned".into()));
        }
        if len < HEADER + 8 || len % 8 != 0 {
            return Err(CellError::Layout(format!(
                "{len} bytes: a cell is at least {} bytes, a multiple of 8",
                HEADER + 8
            )));
        }
        Ok(SeqCell {
            base,
            words: (len - HEADER) / 8,
        })
    }

    /// The most bytes a value can take.
    pub fn capacity(&self) -> usize {
        self.words * 8
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is a word index below HEADER / 8 + words (callers' loops), the region
        // is 8-aligned and mapped for the cell's life (contract of `new`), and AtomicU64 has
        // the layout of u64.
        unsafe { &*(self.base.add(at * 8) as *const AtomicU64) }
    }

    /// The version now (even: no write in progress). A new version means a new value.
    pub fn version(&self) -> u64 {
        self.word(0).load(Ordering::Acquire)
    }

    /// Takes the write lock (the version goes odd; readers wait), waiting for another
    /// writer at most `PATIENCE`. Returns the version before; `unlock` must follow.
    pub fn lock(&self) -> Result<u64, CellError> {
        let start = Instant::now();
        let version = self.word(0);
        loop {
            let now = version.load(Ordering::Relaxed);
            if now % 2 == 0
                && version
                    .compare_exchange_weak(now, now + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                fence(Ordering::Release);
                return Ok(now);
            }
            wait(start)?;
        }
    }

    /// The value, read under the lock (no writer can change it meanwhile).
    pub fn locked_value(&self) -> Result<Vec<u8>, CellError> {
        let length = self.word(1).load(Ordering::Relaxed);
        let capacity = self.capacity();
        let n = usize::try_from(length)
            .ok()
            .filter(|&n| n <= capacity)
            .ok_or(CellError::Corrupt { length, capacity })?;
        Ok(self.copy_out(n))
    }

    /// Stores `bytes` under the lock (the value is unchanged when they do not fit).
    pub fn locked_store(&self, bytes: &[u8]) -> Result<(), CellError> {
        if bytes.len() > self.capacity() {
            return Err(CellError::TooLarge {
                needed: bytes.len(),
                capacity: self.capacity(),
            });
        }
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.word(HEADER / 8 + i)
                .store(u64::from_le_bytes(word), Ordering::Relaxed);
        }
        self.word(1).store(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Releases the lock taken at version `before`; returns the new version.
    pub fn unlock(&self, before: u64) -> u64 {
        self.word(0).store(before + 2, Ordering::Release);
        before + 2
    }

    /// Replaces the value by `bytes` (lock, store, unlock); returns the new version.
    pub fn write(&self, bytes: &[u8]) -> Result<u64, CellError> {
        if bytes.len() > self.capacity() {
            return Err(CellError::TooLarge {
                needed: bytes.len(),
                capacity: self.capacity(),
            });
        }
        let before = self.lock()?;
        let stored = self.locked_store(bytes);
        let version = self.unlock(before);
        stored.map(|()| version)
    }

    /// Replaces the value by `bytes` only if the version is still `expected` (the version a
    /// `read` returned): the second half of an optimistic read-modify-write, which holds the
    /// lock only for the store (a process killed while it computes the new value leaves the
    /// cell usable). Returns the new version, or None when another write came in between (or
    /// is in progress): read again and retry.
    pub fn write_if(&self, expected: u64, bytes: &[u8]) -> Result<Option<u64>, CellError> {
        if bytes.len() > self.capacity() {
            return Err(CellError::TooLarge {
                needed: bytes.len(),
                capacity: self.capacity(),
            });
        }
        if expected % 2 == 1
            || self
                .word(0)
                .compare_exchange(expected, expected + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return Ok(None);
        }
        fence(Ordering::Release);
        let stored = self.locked_store(bytes);
        let version = self.unlock(expected);
        stored.map(|()| Some(version))
    }

    fn copy_out(&self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n.div_ceil(8) * 8);
        for i in 0..n.div_ceil(8) {
            out.extend_from_slice(&self.word(HEADER / 8 + i).load(Ordering::Relaxed).to_le_bytes());
        }
        out.truncate(n);
        out
    }

    /// The value and its version.
    pub fn read(&self) -> Result<(u64, Vec<u8>), CellError> {
        let start = Instant::now();
        loop {
            let before = self.word(0).load(Ordering::Acquire);
            if before % 2 == 1 {
                wait(start)?;
                continue;
            }
            let length = self.word(1).load(Ordering::Relaxed);
            let capacity = self.capacity();
            let n = match usize::try_from(length) {
                Ok(n) if n <= capacity => n,
                _ => {
                    fence(Ordering::Acquire);
                    if self.word(0).load(Ordering::Relaxed) != before {
                        continue; // a torn read of a value being written
                    }
                    return Err(CellError::Corrupt { length, capacity });
                }
            };
            let out = self.copy_out(n);
            fence(Ordering::Acquire);
            if self.word(0).load(Ordering::Relaxed) == before {
                return Ok((before, out));
            }
        }
    }
}

/// One wait for a write in progress: a yield at first, then sleeps growing to a millisecond
/// (the writer may be a process the scheduler put aside: spinning would keep it off the CPU).
fn wait(start: Instant) -> Result<(), CellError> {
    let waited = start.elapsed();
    if waited > PATIENCE {
        return Err(CellError::Stuck);
    }
    if waited < Duration::from_micros(50) {
        std::thread::yield_now();
    } else {
        std::thread::sleep((waited / 4).min(Duration::from_millis(1)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(words: &mut [u64]) -> SeqCell {
        // SAFETY: the slice outlives the cell in each test and is only used through it.
        unsafe { SeqCell::new(words.as_mut_ptr() as *mut u8, words.len() * 8) }.unwrap()
    }

    #[test]
    fn round_trip_and_versions() {
        let mut words = vec![0u64; 8 + 4];
        let c = cell(&mut words);
        assert_eq!(c.capacity(), 32);
        assert_eq!(c.read().unwrap(), (0, vec![]));
        assert_eq!(c.write(b"\"hello\"").unwrap(), 2);
        assert_eq!(c.read().unwrap(), (2, b"\"hello\"".to_vec()));
        assert_eq!(c.write(b"1").unwrap(), 4);
        assert_eq!(c.read().unwrap(), (4, b"1".to_vec()));
        assert!(matches!(
            c.write(&[b'x'; 33]),
            Err(CellError::TooLarge {
                needed: 33,
                capacity: 32
            })
        ));
        assert_eq!(c.read().unwrap(), (4, b"1".to_vec()));
        let before = c.lock().unwrap();
        assert_eq!(before, 4);
        assert_eq!(c.locked_value().unwrap(), b"1".to_vec());
        c.locked_store(b"[1,2]").unwrap();
        assert_eq!(c.unlock(before), 6);
        assert_eq!(c.read().unwrap(), (6, b"[1,2]".to_vec()));
    }

    #[test]
    fn write_if_stores_only_over_the_version_read() {
        let mut words = vec![0u64; 8 + 4];
        let c = cell(&mut words);
        let (version, _) = c.read().unwrap();
        assert_eq!(c.write_if(version, b"1").unwrap(), Some(version + 2));
        // a stale version (another write came in between): nothing stored
        assert_eq!(c.write_if(version, b"2").unwrap(), None);
        assert_eq!(c.read().unwrap(), (version + 2, b"1".to_vec()));
        // a write in progress: nothing stored, and the writer's unlock still works
        let held = c.lock().unwrap();
        assert_eq!(c.write_if(held, b"3").unwrap(), None);
        assert_eq!(c.write_if(held + 1, b"3").unwrap(), None);
        c.unlock(held);
        assert!(matches!(
            c.write_if(held + 2, &[b'x'; 33]),
            Err(CellError::TooLarge { .. })
        ));
        assert_eq!(c.read().unwrap(), (held + 2, b"1".to_vec()));
    }

    #[test]
    fn optimistic_increments_from_many_threads_are_never_lost() {
        let mut words = vec![0u64; 8 + 4];
        let base = words.as_mut_ptr() as usize;
        let len = words.len() * 8;
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(move || {
                    // SAFETY: the vector outlives the scope; every thread uses a SeqCell.
                    let c = unsafe { SeqCell::new(base as *mut u8, len) }.unwrap();
                    for _ in 0..500 {
                        loop {
                            let (version, bytes) = c.read().unwrap();
                            let n: u64 = std::str::from_utf8(&bytes).unwrap().parse().unwrap_or(0);
                            if c.write_if(version, (n + 1).to_string().as_bytes())
                                .unwrap()
                                .is_some()
                            {
                                break;
                            }
                        }
                    }
                });
            }
        });
        // SAFETY: as above; the threads are done.
        let c = unsafe { SeqCell::new(base as *mut u8, len) }.unwrap();
        assert_eq!(c.read().unwrap().1, b"2000".to_vec());
    }

    #[test]
    fn corrupt_length_refused() {
        let mut words = vec![0u64; 8 + 1];
        words[1] = 1000;
        assert!(matches!(
            cell(&mut words).read(),
            Err(CellError::Corrupt { length: 1000, .. })
        ));
    }

    #[test]
    fn bad_layouts_refused() {
        let mut words = vec![0u64; 8];
        // SAFETY: in bounds of the vector, never used past the test.
        let short = unsafe { SeqCell::new(words.as_mut_ptr() as *mut u8, 64) };
        assert!(matches!(short, Err(CellError::Layout(_))));
        // SAFETY: as above (one byte in, so misaligned).
        let odd = unsafe { SeqCell::new((words.as_mut_ptr() as *mut u8).add(1), 56) };
        assert!(matches!(odd, Err(CellError::Layout(_))));
    }

    #[test]
    fn concurrent_writers_and_readers_never_see_a_torn_value() {
        let mut words = vec![0u64; 8 + 64];
        let base = words.as_mut_ptr() as usize;
        let len = words.len() * 8;
        let values: Vec<Vec<u8>> = (0..4u8).map(|i| vec![b'a' + i; 100 + 50 * i as usize]).collect();
        std::thread::scope(|s| {
            for v in &values {
                s.spawn(move || {
                    // SAFETY: the vector outlives the scope; every thread uses a SeqCell.
                    let c = unsafe { SeqCell::new(base as *mut u8, len) }.unwrap();
                    for _ in 0..500 {
                        c.write(v).unwrap();
                    }
                });
            }
            s.spawn(|| {
                // SAFETY: as above.
                let c = unsafe { SeqCell::new(base as *mut u8, len) }.unwrap();
                for _ in 0..2000 {
                    let (version, bytes) = c.read().unwrap();
                    assert_eq!(version % 2, 0);
                    assert!(bytes.is_empty() || values.contains(&bytes), "torn read");
                }
            });
        });
    }
}
