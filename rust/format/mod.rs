//! Owns: the on-disk format without I/O: meta.json types, key <-> file names, the fast and the generic parsers, meta.json writing.
//! Uses: `error` only.

pub mod layout;
pub mod meta_parse;
