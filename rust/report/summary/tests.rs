use super::*;
use crate::sys::storage;
use crate::tree::save::{write_tree, EntrySpec, LeafSpec, NodeSpec, SaveOptions};

#[test]
fn summarizes_without_data_files() {
    let p = std::env::temp_dir().join(format!("tdrs-summary-{}", storage::random_suffix()));
    let data = [0u8; 24];
    let leaves = vec![LeafSpec {
        nested: None,
        dtype: "torch.float32".into(),
        shape: vec![3, 2],
        device: "cpu".into(),
        data: Some(&data),
        nbytes: 24,
        same_file: None,
    }];
    let child = NodeSpec {
        class: None,
        batch: vec![3],
        entries: vec![("x".into(), EntrySpec::Leaf(0))],
    };
    let root = NodeSpec {
        class: None,
        batch: vec![3],
        entries: vec![
            ("sub".into(), EntrySpec::Node(child)),
            ("s".into(), EntrySpec::NonTensor(Value::from("hi"))),
        ],
    };
    let opts = SaveOptions {
        existsok: true,
        ..Default::default()
    };
    write_tree(&p, &root, &leaves, opts).unwrap();
    // A missing data file does not stop a summary (verify reports it).
    std::fs::remove_file(p.join("sub/x.memmap")).unwrap();
    let s = summarize(&p).unwrap();
    assert_eq!(s.batch, vec![3]);
    assert_eq!(s.format_version, Some(format::FORMAT_VERSION));
    let SummaryEntry::Node(sub) = &s.entries[0].1 else {
        panic!()
    };
    let SummaryEntry::Leaf { dtype, shape, nbytes } = &sub.entries[0].1 else {
        panic!()
    };
    assert_eq!(
        (*dtype, shape.as_slice(), *nbytes),
        ("torch.float32", &[3u64, 2][..], 24)
    );
    assert!(matches!(&s.entries[1].1, SummaryEntry::NonTensor(v) if v == "hi"));
    std::fs::remove_dir_all(p.join("sub")).unwrap();
    assert!(summarize(&p).unwrap_err().to_string().contains("sub-directory"));
    std::fs::remove_dir_all(&p).unwrap();
}

/// The summary refuses a symlinked sub-directory or meta.json as the loader does: same
/// error (a `SymlinkError` naming the path), through the same opener (`tree::read`).
#[cfg(unix)]
#[test]
fn symlinks_are_refused_as_the_loader_refuses_them() {
    let p = std::env::temp_dir().join(format!("tdrs-summary-{}", storage::random_suffix()));
    let root = NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![(
            "sub".into(),
            EntrySpec::Node(NodeSpec {
                class: None,
                batch: vec![],
                entries: vec![("s".into(), EntrySpec::NonTensor(Value::from(1)))],
            }),
        )],
    };
    write_tree(&p, &root, &[], SaveOptions::default()).unwrap();
    let moved = p.with_extension("sub");
    std::fs::rename(p.join("sub"), &moved).unwrap();
    std::os::unix::fs::symlink(&moved, p.join("sub")).unwrap();
    let summary = summarize(&p).unwrap_err();
    let load = crate::tree::load::load_tree(&p).unwrap_err();
    assert!(matches!(summary, Error::Symlink { .. }), "{summary}");
    assert_eq!(summary.to_string(), load.to_string());
    std::fs::remove_file(p.join("sub")).unwrap();
    std::fs::rename(&moved, p.join("sub")).unwrap();
    let meta = p.with_extension("json");
    std::fs::rename(p.join("meta.json"), &meta).unwrap();
    std::os::unix::fs::symlink(&meta, p.join("meta.json")).unwrap();
    let summary = summarize(&p).unwrap_err();
    let load = crate::tree::load::load_tree(&p).unwrap_err();
    assert!(matches!(summary, Error::Symlink { .. }), "{summary}");
    assert_eq!(summary.to_string(), load.to_string());
    std::fs::remove_dir_all(&p).unwrap();
    std::fs::remove_file(&meta).unwrap();
}
