//! Owns: the on-disk format without I/O: meta.json types, key <-> file names, the fast and the generic parsers, meta.json writing.
//! Uses: `error` only.
//!
//! `meta` holds the constants, the dtype table and the validated types that both parsers
//! produce; `keys` the file names of keys; `write` the meta.json writer; `parse` the generic
//! parser, which defines what a meta.json means and words every error; `fast` the typed fast
//! path, which gives up (to the generic parser) on anything unusual. Everything public is
//! re-exported here: callers write `format::META_FILE`, `format::encode_key`, ...

use std::path::Path;

use crate::error::Result;

pub mod fast;
pub mod keys;
pub mod meta;
pub mod parse;
pub mod stack;
pub mod write;

pub use keys::{
    encode_key, fold_case, leaf_file, legacy_name, portable_key, portable_leaf_file, shape_file,
    windows_safe_name,
};
pub use meta::{
    dtype, nbytes, nested_nbytes, DType, Entry, Layout, LeafMeta, NestedMeta, NodeMeta, TensorDictMeta,
    DTYPES, FORMAT_VERSION, JAGGED, LEAF_SUFFIX, MAX_DEPTH, META_FILE, META_LIMIT, RESERVED_KEYS,
    SHAPE_SUFFIX, STRIDED, TENSORCLASS_DIR, VALUE_META_LIMIT,
};
pub use parse::parse_meta_generic;
pub use stack::StackMeta;
pub use write::{non_tensor_meta, tensordict_meta, to_json_bytes, EntryMeta};

/// Parses and validates a meta.json read from `path`: the typed fast path (`fast`) for the
/// files it fully understands, else the generic parser (`parse`), which words every error.
pub fn parse_meta(bytes: &[u8], path: &Path) -> Result<NodeMeta> {
    match fast::parse(bytes) {
        Some(meta) => Ok(meta),
        None => parse_meta_generic(bytes, path),
    }
}

#[cfg(test)]
mod tests;
