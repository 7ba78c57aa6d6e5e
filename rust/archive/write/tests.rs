use super::*;
use crate::archive::tests::{opts, tmp};

/// Contentless leaves (`memmap_like`) are not written, but their blocks are reserved: a
/// writable map of them cannot meet a hole on a full disk.
#[cfg(target_os = "linux")]
#[test]
fn contentless_leaves_are_reserved_not_holes() {
    use crate::tree::save::{EntrySpec, LeafSpec, NodeSpec};
    use std::os::unix::fs::MetadataExt;
    let n = 8 << 20;
    let leaves = vec![LeafSpec {
        nested: None,
        dtype: "torch.uint8".into(),
        shape: vec![n as u64],
        device: "cpu".into(),
        data: None,
        nbytes: n,
        same_file: None,
    }];
    let root = NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![("a".into(), EntrySpec::Leaf(0))],
    };
    let path = tmp("zeros.tdz");
    write_archive(&path, &root, &leaves, opts(Compression::Stored)).unwrap();
    let md = std::fs::metadata(&path).unwrap();
    assert!(
        md.blocks() * 512 >= n as u64,
        "{} blocks for {n} bytes",
        md.blocks()
    );
    assert!(crate::archive::verify_archive(&path).is_empty());
}
