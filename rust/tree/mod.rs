//! Owns: saved directory trees: save (validate, plan, fresh prefix, single files), commit (staging, journal, recovery), load and verify.
//! Uses: `error`, `sys`, `format`.

pub mod commit;
pub mod load;
pub mod read;
pub mod save;
#[cfg(all(test, windows))]
mod windows_tests;
