//! Owns: saved directory trees: save (validate, plan, fresh prefix, single files), commit (staging, journal, recovery), load and verify, and the reader of a tree's parts they share.
//! Uses: `error`, `sys`, `format`.
//!
//! `save` writes a tree into a directory that stays the user's, through `commit` (staging,
//! the journal, recovery, locks); `load` maps and verifies one; `read` is the meta.json reader
//! and child-directory opener that loads, verification and `report` share; `stack_dir` a
//! NonTensorStack saved on its own.

pub mod commit;
pub mod grow;
pub mod load;
pub mod read;
pub mod save;
pub mod stack_dir;
#[cfg(all(test, windows))]
mod windows_tests;
