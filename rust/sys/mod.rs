//! Owns: the operating system: directories and their identity, memory maps, anonymous memory, the thread pools and the progress counter, raw copies (where pointer `unsafe` lives).
//! Uses: `error` only.

pub mod anon;
pub mod dir;
pub mod gather;
pub mod identity;
pub mod pool;
pub mod progress;
pub mod storage;
