//! Owns: `.tdz` archives: the zip format, reading, writing, whole-archive checks.
//! Uses: `error`, `sys`, `format`, `tree`.
//!
//! `.tdz` archives: tensordict's one-file form of a saved tree. No pyo3 here.
//!
//! An archive is a zip file whose entries are the files of the directory form, in the order
//! tensordict writes them (at each level `meta.json`, then the leaf files sorted by name, then
//! the sub-directories sorted by name). Leaf payloads are STORED and start on a 64-byte
//! boundary, padded by an extra block (id `0x6474`, "td") in the local header, followed by the
//! zip64 block that Python's `zipfile` writes with `force_zip64=True`. A whole tree is written
//! in one pass into a file beside the target, then renamed over it, so a crash leaves the old
//! archive or the new one. Reading maps the whole file once; every aligned STORED leaf is a
//! view of that map; compressed (deflate) or unaligned leaves are copied, with bounded sizes.
//! Everything parsed or copied is read with `pread`, never through the map, so an archive
//! rewritten in place while it is read gives an error, not SIGBUS.
//!
//! The reader is a validator: end of central directory, zip64 records, every central record
//! and local header, names that could escape (`..`, absolute, backslashes, NUL), sizes and
//! offsets inside the file, overlapping entries, and the CRC-32 of every meta.json and every
//! compressed entry. The CRCs of STORED leaves are not checked on load, as in tensordict:
//! in-place writes through a shared map (`mode="r+"`, `memmap_like`) leave them stale until
//! `refresh_checksums`; `verify` reports them.
//!
//! The work is split by responsibility: `zip` holds the zip format's constants and parses and
//! validates the zip structures, `read` builds the tree and the leaves from the entries,
//! `write` writes (through a staging file, `sys::staging`), `verify` checks a whole archive and
//! refreshes its checksums (`checksum`: the CRC-32s of many entries, big ones in ranges
//! across threads), `reopen` maps an archive again for pickled leaves. The public
//! names are re-exported here.

pub mod checksum;
pub mod read;
pub mod reopen;
pub mod verify;
pub mod write;
pub mod zip;

pub use read::{load_archive, load_archive_tree, LeafData, Loaded};
pub use reopen::reopen;
pub use verify::{is_archive, refresh_checksums, verify_archive};
pub use write::{write_archive, ArchiveOptions, Compression};
pub use zip::{Archive, ZipEntry, ALIGNMENT};

#[cfg(test)]
pub(crate) mod tests;
