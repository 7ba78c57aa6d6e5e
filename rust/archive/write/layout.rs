//! The entries of a new `.tdz` archive and their bytes: listed in tensordict's order, laid out
//! (offsets, the alignment padding of STORED leaves), their local headers, the central
//! directory and the end records (zip64 ones where Python's `zipfile` writes them). No pyo3 here.

use super::BIG_LEAF;
use crate::archive::zip::{
    crc32, put16, put32, put64, ALIGNMENT, CENTRAL_LEN, CENTRAL_SIG, EOCD_SIG, EXTERNAL_ATTR, FLAG_UTF8,
    LOCAL_LEN, LOCAL_SIG, MADE_BY, PAD_EXTRA_ID, STORED, VERSION, ZIP64_EOCD_SIG, ZIP64_EXTRA_ID,
    ZIP64_LIMIT, ZIP64_LOCAL_EXTRA, ZIP64_LOCATOR_SIG,
};
use crate::error::{Error, Result};
use crate::format::{self, EntryMeta};
use crate::tree::save::{EntrySpec, LeafSpec, NodeSpec};

pub(super) enum Body {
    Meta(Vec<u8>),
    /// A stored leaf, written from its source (or zeros).
    Leaf(usize),
    /// A compressed leaf, already deflated.
    Deflated(Vec<u8>),
}

pub(super) struct Planned {
    pub(super) name: String,
    pub(super) body: Body,
    pub(super) size: u64,
    pub(super) csize: u64,
    pub(super) method: u16,
    /// Padding bytes of the alignment block; None when the entry has no such block.
    pub(super) pad: Option<u16>,
    pub(super) crc: u32,
    pub(super) header: u64,
    pub(super) data: u64,
    /// The leaf this entry holds (for the returned views).
    pub(super) leaf: Option<usize>,
}

impl Planned {
    fn extra_len(&self) -> u64 {
        self.pad.map_or(0, |p| 4 + u64::from(p)) + ZIP64_LOCAL_EXTRA
    }

    fn flags(&self) -> u16 {
        if self.name.is_ascii() {
            0
        } else {
            FLAG_UTF8
        }
    }

    pub(super) fn is_big(&self) -> bool {
        matches!(self.body, Body::Leaf(_)) && self.size >= BIG_LEAF
    }

    pub(super) fn local_header(&self, out: &mut Vec<u8>) {
        put32(out, LOCAL_SIG);
        put16(out, VERSION);
        put16(out, self.flags());
        put16(out, self.method);
        out.extend_from_slice(&[0; 4]); // time and date, patched by the caller
        put32(out, self.crc);
        put32(out, u32::MAX);
        put32(out, u32::MAX);
        put16(out, self.name.len() as u16);
        put16(out, self.extra_len() as u16);
        out.extend_from_slice(self.name.as_bytes());
        if let Some(pad) = self.pad {
            put16(out, PAD_EXTRA_ID);
            put16(out, pad);
            out.resize(out.len() + usize::from(pad), 0);
        }
        put16(out, ZIP64_EXTRA_ID);
        put16(out, 16);
        put64(out, self.size);
        put64(out, self.csize);
    }
}

/// Lists the entries of `node` (its directory in the archive is `dir`, "" or ending in "/"):
/// a tensorclass node is its meta.json, then its TensorDict in `_tensordict/`.
pub(super) fn plan_node(dir: &str, node: &NodeSpec, leaves: &[LeafSpec<'_>], out: &mut Vec<Planned>) {
    match &node.class {
        Some(class) => {
            out.push(meta_entry(
                format!("{dir}{}", format::META_FILE),
                class.meta.clone(),
            ));
            plan_fields(&format!("{dir}{}/", format::TENSORCLASS_DIR), node, leaves, out);
        }
        None => plan_fields(dir, node, leaves, out),
    }
}

/// Lists the entries of the TensorDict `node` at `dir`.
fn plan_fields(dir: &str, node: &NodeSpec, leaves: &[LeafSpec<'_>], out: &mut Vec<Planned>) {
    let mut metas = Vec::with_capacity(node.entries.len());
    let mut files: Vec<(String, usize)> = Vec::new();
    let mut tables: Vec<(String, &[u8])> = Vec::new();
    let mut dirs: Vec<(String, &EntrySpec)> = Vec::new();
    for (key, entry) in &node.entries {
        match entry {
            EntrySpec::Leaf(i) => {
                let leaf = &leaves[*i];
                if leaf.nbytes > 0 {
                    files.push((format::portable_leaf_file(key), *i));
                }
                if let Some(nested) = &leaf.nested {
                    tables.push((
                        format::shape_file(&format::portable_leaf_file(key)),
                        &nested.table,
                    ));
                }
                metas.push((key.as_str(), leaf.entry_meta()));
            }
            EntrySpec::Node(child) => {
                dirs.push((format::portable_key(key), entry));
                metas.push((
                    key.as_str(),
                    match &child.class {
                        Some(class) => EntryMeta::TensorClass(&class.name),
                        None => EntryMeta::TensorDict,
                    },
                ));
            }
            EntrySpec::NonTensor(_) => {
                dirs.push((format::portable_key(key), entry));
                metas.push((key.as_str(), EntryMeta::NonTensorData));
            }
            EntrySpec::Stack(_) => {
                dirs.push((format::portable_key(key), entry));
                metas.push((key.as_str(), EntryMeta::NonTensorStack));
            }
        }
    }
    out.push(meta_entry(
        format!("{dir}{}", format::META_FILE),
        format::tensordict_meta(metas, &node.batch),
    ));
    // data files and shape tables in one name order, as tensordict lists a directory's files
    let mut named: Vec<(String, std::result::Result<usize, &[u8]>)> =
        files.into_iter().map(|(n, i)| (n, Ok(i))).collect();
    named.extend(tables.into_iter().map(|(n, t)| (n, Err(t))));
    named.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, body) in named {
        match body {
            Ok(i) => out.push(Planned {
                name: format!("{dir}{name}"),
                body: Body::Leaf(i),
                size: leaves[i].nbytes as u64,
                csize: leaves[i].nbytes as u64,
                method: STORED,
                pad: Some(0),
                crc: 0,
                header: 0,
                data: 0,
                leaf: Some(i),
            }),
            // aligned as a data file, as tensordict writes it (it is one of its memmap files)
            Err(table) => out.push(Planned {
                pad: Some(0),
                ..meta_entry(format!("{dir}{name}"), table.to_vec())
            }),
        }
    }
    dirs.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, entry) in dirs {
        match entry {
            EntrySpec::Node(child) => plan_node(&format!("{dir}{name}/"), child, leaves, out),
            EntrySpec::NonTensor(value) => out.push(meta_entry(
                format!("{dir}{name}/{}", format::META_FILE),
                format::non_tensor_meta(value),
            )),
            EntrySpec::Stack(bytes) => out.push(meta_entry(
                format!("{dir}{name}/{}", format::META_FILE),
                bytes.clone(),
            )),
            EntrySpec::Leaf(_) => {}
        }
    }
}

fn meta_entry(name: String, bytes: Vec<u8>) -> Planned {
    Planned {
        name,
        size: bytes.len() as u64,
        csize: bytes.len() as u64,
        method: STORED,
        pad: None,
        crc: crc32(&bytes),
        header: 0,
        data: 0,
        leaf: None,
        body: Body::Meta(bytes),
    }
}

/// Gives every entry its offsets (alignment padding included); returns where the central
/// directory starts.
pub(super) fn lay_out(entries: &mut [Planned]) -> Result<u64> {
    let mut at: u64 = 0;
    for e in entries.iter_mut() {
        if e.name.len() > usize::from(u16::MAX) {
            return Err(Error::tree(
                &e.name,
                "the entry name is too long for a zip archive",
            ));
        }
        e.header = at;
        if e.pad.is_some() {
            let unpadded = at + LOCAL_LEN + e.name.len() as u64 + 4 + ZIP64_LOCAL_EXTRA;
            e.pad = Some(((ALIGNMENT - unpadded % ALIGNMENT) % ALIGNMENT) as u16);
        }
        e.data = at + LOCAL_LEN + e.name.len() as u64 + e.extra_len();
        at = e
            .data
            .checked_add(e.csize)
            .ok_or_else(|| Error::tree(&e.name, "the archive would be too large"))?;
    }
    Ok(at)
}

/// The central directory and end records for entries starting at `cd_start`.
pub(super) fn central_directory(entries: &[Planned], cd_start: u64, time: u16, date: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * (CENTRAL_LEN + 64) + 128);
    for e in entries {
        let mut zip64 = Vec::new();
        let (mut size32, mut csize32, mut off32) = (e.size as u32, e.csize as u32, e.header as u32);
        if e.size > ZIP64_LIMIT || e.csize > ZIP64_LIMIT {
            zip64.extend([e.size, e.csize]);
            size32 = u32::MAX;
            csize32 = u32::MAX;
        }
        if e.header > ZIP64_LIMIT {
            zip64.push(e.header);
            off32 = u32::MAX;
        }
        let pad_len = e.pad.map_or(0, |p| 4 + usize::from(p));
        let zip64_len = if zip64.is_empty() { 0 } else { 4 + 8 * zip64.len() };
        put32(&mut out, CENTRAL_SIG);
        put16(&mut out, MADE_BY);
        put16(&mut out, VERSION);
        put16(&mut out, e.flags());
        put16(&mut out, e.method);
        put16(&mut out, time);
        put16(&mut out, date);
        put32(&mut out, e.crc);
        put32(&mut out, csize32);
        put32(&mut out, size32);
        put16(&mut out, e.name.len() as u16);
        put16(&mut out, (zip64_len + pad_len) as u16);
        put16(&mut out, 0); // comment
        put16(&mut out, 0); // disk
        put16(&mut out, 0); // internal attributes
        put32(&mut out, EXTERNAL_ATTR);
        put32(&mut out, off32);
        out.extend_from_slice(e.name.as_bytes());
        if !zip64.is_empty() {
            put16(&mut out, ZIP64_EXTRA_ID);
            put16(&mut out, (8 * zip64.len()) as u16);
            for v in zip64 {
                put64(&mut out, v);
            }
        }
        if let Some(pad) = e.pad {
            put16(&mut out, PAD_EXTRA_ID);
            put16(&mut out, pad);
            out.resize(out.len() + usize::from(pad), 0);
        }
    }
    let cd_size = out.len() as u64;
    let count = entries.len() as u64;
    let cd_end = cd_start + cd_size;
    if count > 0xFFFF || cd_start > ZIP64_LIMIT || cd_size > ZIP64_LIMIT {
        put32(&mut out, ZIP64_EOCD_SIG);
        put64(&mut out, 44);
        put16(&mut out, VERSION);
        put16(&mut out, VERSION);
        put32(&mut out, 0);
        put32(&mut out, 0);
        put64(&mut out, count);
        put64(&mut out, count);
        put64(&mut out, cd_size);
        put64(&mut out, cd_start);
        put32(&mut out, ZIP64_LOCATOR_SIG);
        put32(&mut out, 0);
        put64(&mut out, cd_end);
        put32(&mut out, 1);
    }
    put32(&mut out, EOCD_SIG);
    put16(&mut out, 0);
    put16(&mut out, 0);
    put16(&mut out, count.min(0xFFFF) as u16);
    put16(&mut out, count.min(0xFFFF) as u16);
    put32(&mut out, cd_size.min(0xFFFF_FFFF) as u32);
    put32(&mut out, cd_start.min(0xFFFF_FFFF) as u32);
    put16(&mut out, 0);
    out
}
