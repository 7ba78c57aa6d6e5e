//! Owns: the operating system: directories and file identity, memory maps and their files, anonymous memory, the threads and the progress counter, raw copies (where pointer `unsafe` lives).
//! Uses: `error` only.
//!
//! `dir` (directory handles that never follow a symlink; `dir/unix.rs`, `dir/windows.rs`),
//! `identity` (which file a handle or name is), `storage` (the `Region` every map is, file
//! maps, space reservation, positioned writes), `anon` (anonymous shared memory, every
//! platform), `pool` (every thread of the crate), `prealloc` (whether a new big file gets its
//! blocks before it is written, by file system), `progress` (the progress counter), `reclaim`
//! (the space of replaced files, freed in the background), `ring` (the slot words of a ring of
//! shared slabs), `staging` (the locked staging file beside a
//! one-file target, `.tdz` or `.safetensors`, and the sweep of killed writers' ones), `gather` (bulk copies between raw addresses), `seqcell` (a value shared
//! between processes under a sequence lock).

pub mod anon;
pub mod dir;
pub mod gather;
pub mod identity;
pub mod pool;
pub mod prealloc;
pub mod progress;
pub mod reclaim;
pub mod ring;
pub mod seqcell;
pub mod staging;
pub mod storage;
