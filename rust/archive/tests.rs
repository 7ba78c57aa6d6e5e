use super::*;
use crate::sys::storage::{self, MapMode};
use crate::tree::save::{EntrySpec, LeafSpec, NodeSpec};
use serde_json::json;
use std::path::PathBuf;

pub(crate) fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tdrs-archive-{}-{}",
        std::process::id(),
        storage::random_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

pub(crate) fn opts(compression: Compression) -> ArchiveOptions {
    ArchiveOptions {
        existsok: true,
        durable: false,
        num_threads: 2,
        compression,
        mode: MapMode::CopyOnWrite,
        dos_time: 0,
        dos_date: 33,
    }
}

pub(crate) fn sample(data: &[Vec<u8>]) -> (NodeSpec, Vec<LeafSpec<'_>>) {
    let leaves = vec![
        LeafSpec {
            nested: None,
            dtype: "torch.float32".into(),
            shape: vec![3],
            device: "cpu".into(),
            data: Some(&data[0]),
            nbytes: 12,
            same_file: None,
        },
        LeafSpec {
            nested: None,
            dtype: "torch.uint8".into(),
            shape: vec![3, data[1].len() as u64 / 3],
            device: "cpu".into(),
            data: Some(&data[1]),
            nbytes: data[1].len(),
            same_file: None,
        },
        LeafSpec {
            nested: None,
            dtype: "torch.int64".into(),
            shape: vec![3, 0],
            device: "cpu".into(),
            data: Some(&[]),
            nbytes: 0,
            same_file: None,
        },
    ];
    let nested = NodeSpec {
        class: None,
        batch: vec![3],
        entries: vec![("b".into(), EntrySpec::Leaf(1)), ("e".into(), EntrySpec::Leaf(2))],
    };
    let root = NodeSpec {
        class: None,
        batch: vec![3],
        entries: vec![
            ("z".into(), EntrySpec::Leaf(0)),
            ("nested".into(), EntrySpec::Node(nested)),
            ("s".into(), EntrySpec::NonTensor(json!("hello"))),
        ],
    };
    (root, leaves)
}

fn view(loaded: &Loaded, i: usize) -> &[u8] {
    match loaded.leaves[i].as_ref().unwrap() {
        // SAFETY: the region outlives the borrow of `loaded`; offset + len is inside it.
        LeafData::View { offset, len } => unsafe {
            std::slice::from_raw_parts(loaded.region.as_ptr().add(*offset), *len)
        },
        // SAFETY: the copy's map spans its len and lives as long as `loaded`.
        LeafData::Copy(r) => unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) },
    }
}

#[test]
fn round_trip_stored_and_deflated() {
    let data = vec![
        vec![1u8; 12],
        (0..3 * 700_000).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
    ];
    for compression in [Compression::Stored, Compression::Deflate(6)] {
        let (root, leaves) = sample(&data);
        let path = tmp("a.tdz");
        let written = write_archive(&path, &root, &leaves, opts(compression)).unwrap();
        assert_eq!(view(&written, 0), &data[0][..]);
        assert_eq!(view(&written, 1), &data[1][..]);
        assert!(written.leaves[2].is_none());
        let (node, loaded) = load_archive_tree(&path, MapMode::CopyOnWrite).unwrap();
        assert_eq!(node.batch, vec![3]);
        assert_eq!(view(&loaded, 0), &data[0][..]);
        assert_eq!(view(&loaded, 1), &data[1][..]);
        assert_eq!(
            loaded.copied.len(),
            if compression == Compression::Stored { 0 } else { 2 }
        );
        assert!(verify_archive(&path).is_empty(), "{:?}", verify_archive(&path));
        assert!(is_archive(&path));
    }
}

#[test]
fn entries_follow_the_reference_order_and_alignment() {
    let data = vec![vec![1u8; 12], vec![2u8; 6]];
    let (root, leaves) = sample(&data);
    let path = tmp("order.tdz");
    write_archive(&path, &root, &leaves, opts(Compression::Stored)).unwrap();
    let ar = Archive::open(&path, MapMode::ReadOnly).unwrap();
    let names: Vec<&str> = ar.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "meta.json",
            "z.memmap",
            "nested/meta.json",
            "nested/b.memmap",
            "s/meta.json"
        ]
    );
    for e in ar.entries.iter().filter(|e| e.name.ends_with(".memmap")) {
        assert_eq!(e.data % ALIGNMENT, 0, "{}", e.name);
    }
}

#[test]
fn zeros_and_big_leaves_get_right_crcs() {
    let big = (0..(3 << 20) + 5)
        .map(|i| (i * 7 % 256) as u8)
        .collect::<Vec<u8>>();
    fn leaf(data: Option<&[u8]>, n: usize) -> LeafSpec<'_> {
        LeafSpec {
            nested: None,
            dtype: "torch.uint8".into(),
            shape: vec![n as u64],
            device: "cpu".into(),
            data,
            nbytes: n,
            same_file: None,
        }
    }
    let leaves = vec![leaf(Some(&big), big.len()), leaf(None, big.len())];
    let root = NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![("a".into(), EntrySpec::Leaf(0)), ("b".into(), EntrySpec::Leaf(1))],
    };
    let path = tmp("big.tdz");
    write_archive(&path, &root, &leaves, opts(Compression::Stored)).unwrap();
    assert!(verify_archive(&path).is_empty(), "{:?}", verify_archive(&path));
}

#[test]
fn stale_crcs_load_and_refresh() {
    let data = vec![vec![1u8; 12], vec![2u8; 6]];
    let (root, leaves) = sample(&data);
    let path = tmp("crc.tdz");
    let mut o = opts(Compression::Stored);
    o.mode = MapMode::Shared;
    let written = write_archive(&path, &root, &leaves, o).unwrap();
    let LeafData::View { offset, .. } = written.leaves[0].as_ref().unwrap() else {
        panic!()
    };
    // SAFETY: a shared writable map of the archive; the offset is the leaf's.
    unsafe { *written.region.as_ptr().add(*offset) = 9 };
    written.region.flush().unwrap();
    assert_eq!(verify_archive(&path).len(), 1);
    assert!(load_archive(&path, MapMode::CopyOnWrite).is_ok());
    assert_eq!(refresh_checksums(&path, 0).unwrap(), ["z.memmap"]);
    assert!(verify_archive(&path).is_empty());
}
